//! The position-sensitive RoI pooling family (R-FCN, NHWC): PsRoiPool, the forward partner
//! (CPU), and PsRoiPoolBackward (CPU and BANG kernels).

pub mod backward;
pub mod bang;
pub mod forward;
pub mod mluops;

crate::mlu::kernel_abi!("psroipool");

pub use backward::PsRoiPoolBackward;
pub use forward::PsRoiPool;

/// Minimum roi extent, as in the R-FCN kernel (avoids zero-size rois): the contract's, which
/// the CPU bins and the rois handed to MLU-OPS both apply.
const MIN_ROI_EXTENT: f32 = 0.1;

/// Sizes validated by the shape rules, the same for both operators: `rois` rois over
/// `batches` maps of `height` x `width`.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    rois: usize,
    batches: usize,
    height: usize,
    width: usize,
}
