//! The dynamic scatter family (mmcv dynamic_point_to_voxel): DynamicScatter, the forward
//! partner (CPU), and DynamicScatterBackward (CPU and BANG kernels).

pub mod backward;
pub mod forward;
pub mod mlu;

pub use backward::DynamicScatterBackward;
pub use forward::DynamicScatter;
