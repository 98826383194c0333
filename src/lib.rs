//! onnxruntime-ep-mlu: five MLU-OPS operators for ONNX Runtime, in the custom-op domain
//! `mluops` (see schemas/ and OPERATORS.md). The crate root holds only the C entry points;
//! everything else lives in the modules below.

pub mod error;
pub mod ops;
pub mod parallel;
pub mod schema;
pub mod tensor;
