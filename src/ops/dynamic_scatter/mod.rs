//! The dynamic scatter family (mmcv dynamic_point_to_voxel): DynamicScatter, the forward
//! partner (CPU), and DynamicScatterBackward (CPU and BANG kernels).

pub mod backward;
pub mod bang;
pub mod forward;
pub mod mluops;

crate::mlu::kernel_abi!("dynamic_scatter");

pub use backward::DynamicScatterBackward;
pub use forward::DynamicScatter;

use crate::error::{Error, Result};
use crate::schema::Attrs;

/// The reduction of the forward pass (attribute `reduce_type` of both operators).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Max,
    Mean,
    Sum,
}

impl Reduce {
    /// Parses the `reduce_type` attribute value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "max" => Some(Reduce::Max),
            "mean" => Some(Reduce::Mean),
            "sum" => Some(Reduce::Sum),
            _ => None,
        }
    }

    /// The node's `reduce_type`, or the attribute error.
    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        let s = attrs.string("reduce_type")?;
        Reduce::parse(&s).ok_or_else(|| {
            Error::attribute(
                "reduce_type",
                format!("must be one of \"max\", \"mean\", \"sum\", got {s:?}"),
            )
        })
    }
}
