//! The sparse convolution family (spconv v1 / mmcv): GetIndicePairs, the rulebook (CPU, BANG
//! kernels and MLU-OPS), and IndiceConv, the convolution that consumes it (CPU and MLU-OPS).

pub mod get_indice_pairs;
pub mod indice_conv;
pub(crate) mod rank;

crate::mlu::kernel_abi!("sparse_conv");

/// Entries per tile of the family's streaming BANG kernels (mark, rank, out, pairs; int32,
/// a multiple of 32).
pub(crate) const STREAM_TILE: usize = 16 * 1024;

pub use get_indice_pairs::GetIndicePairs;
pub use indice_conv::IndiceConv;
