//! The sparse convolution family (spconv v1 / mmcv): GetIndicePairs, the rulebook (CPU and
//! BANG kernels), and IndiceConv, the convolution that consumes it (CPU).

pub mod get_indice_pairs;
pub mod indice_conv;


pub use get_indice_pairs::GetIndicePairs;
pub use indice_conv::IndiceConv;
