//! The BANG backend: our kernels (kernels/), the path [`Bang`] and the trait
//! [`BangOperator`] an operator with BANG kernels implements (`ops/<family>/bang.rs`).

use super::{Backend, CardBackends, CardPath, CardRun, DeviceOutputs, StaticShapes};
use crate::error::Result;
use crate::mlu::DeviceInfo;
use crate::ops::operator::Operator;

/// An operator with BANG kernels (the [`Bang`] path).
pub trait BangOperator: Operator {
    /// The kernels' arguments for one node's run-time sizes: every size narrowed to the
    /// int32 the kernels' ABI takes and the tiling chosen ([`BangOperator::bang_launch`]), so
    /// that enqueueing meets no size limit.
    type Launch;

    /// The kernel families its BANG path launches: `check` (the value checks) and its own.
    const BANG_FAMILIES: &'static [&'static str];

    /// `Ok` when the BANG kernels support this configuration, else the reason.
    fn bang_supported(&self) -> Result<()> {
        Ok(())
    }

    /// `Ok` unless the static input shapes exceed a size limit of the kernels beyond the
    /// driver's int32 element check (int32 products, NRAM rows); else the reason.
    fn bang_supported_shapes(&self, _info: &DeviceInfo, _shapes: &StaticShapes) -> Result<()> {
        Ok(())
    }

    /// The launch arguments for the run-time sizes, or why the kernels cannot take them
    /// (the node goes to the next path, nothing launched).
    fn bang_launch(&self, info: &DeviceInfo, dims: &Self::Dims) -> Result<Self::Launch>;

    /// Allocates the outputs and enqueues the kernels with `launch`. Kernels that address
    /// memory with input values take `card.gate()`.
    fn bang_compute(
        &self,
        dims: &Self::Dims,
        launch: &Self::Launch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// Our BANG kernels.
pub struct Bang;

impl<O: BangOperator> CardPath<O> for Bang {
    const BACKEND: Backend = Backend::Bang;
    const HOST_GATE: bool = false;
    fn new(_: &CardBackends) -> Self {
        Bang
    }
    fn supported(&self, op: &O) -> Result<()> {
        op.bang_supported()
    }
    fn families(&self) -> &'static [&'static str] {
        O::BANG_FAMILIES
    }
    fn supported_shapes(&self, op: &O, info: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        op.bang_supported_shapes(info, shapes)
    }
    type Fit = O::Launch;
    fn fits(&self, op: &O, info: &DeviceInfo, dims: &O::Dims) -> Result<O::Launch> {
        op.bang_launch(info, dims)
    }
    fn enqueue(
        &self,
        op: &O,
        dims: &O::Dims,
        launch: &O::Launch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        op.bang_compute(dims, launch, card, outputs)
    }
}
