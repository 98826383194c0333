//! The three-interpolate family (PointNet++ feature propagation): ThreeInterpolate, the
//! forward partner (CPU), and ThreeInterpolateBackward (CPU and BANG kernels).

pub mod backward;
pub mod forward;
pub mod mlu;

pub use backward::ThreeInterpolateBackward;
pub use forward::ThreeInterpolate;
