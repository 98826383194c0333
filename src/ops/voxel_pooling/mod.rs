//! The voxel pooling family (BEVDepth's view transform): VoxelPoolingForward (CPU and BANG
//! kernels).

pub mod forward;
pub mod mlu;
pub mod mluops;

pub use forward::VoxelPoolingForward;
