//! The position-sensitive RoI pooling family (R-FCN, NHWC): PsRoiPool, the forward partner
//! (CPU), and PsRoiPoolBackward (CPU and BANG kernels).

pub mod backward;
pub mod forward;
pub mod mlu;
pub mod mluops;

crate::mlu::kernel_abi!("psroipool");

pub use backward::PsRoiPoolBackward;
pub use forward::PsRoiPool;
