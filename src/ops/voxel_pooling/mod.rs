//! The voxel pooling family (BEVDepth's view transform): VoxelPoolingForward (CPU and BANG
//! kernels).

pub mod bang;
pub mod forward;
pub mod mluops;

crate::mlu::kernel_abi!("voxel_pooling");

pub use forward::VoxelPoolingForward;
