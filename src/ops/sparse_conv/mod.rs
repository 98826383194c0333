//! The sparse convolution family (spconv v1 / mmcv): GetIndicePairs, the rulebook (CPU, BANG
//! kernels and MLU-OPS), and IndiceConv, the convolution that consumes it (CPU and MLU-OPS).

pub mod get_indice_pairs;
pub mod indice_conv;

crate::mlu::kernel_abi!("sparse_conv");

pub use get_indice_pairs::GetIndicePairs;
pub use indice_conv::IndiceConv;
