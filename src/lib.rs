//! onnxruntime-ep-mlu: five MLU-OPS operators for ONNX Runtime, in the custom-op domain
//! `mluops` (see schemas/ and OPERATORS.md). The crate root holds only the C entry points;
//! everything else lives in the modules below.

pub mod cache;
pub mod error;
pub mod ops;
pub mod parallel;
pub mod schema;
pub mod tensor;
pub mod mlu;
pub mod ort;

use ort_sys::{OrtApiBase, OrtSessionOptions, OrtStatusPtr};

/// Classic custom-op entry: registers the `mluops` domain (CPU kernels) with the session
/// options. Called by `SessionOptions.register_custom_ops_library` and its C/Rust twins.
///
/// # Safety
/// Called by ONNX Runtime with its live session options and API base.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RegisterCustomOps(options: *mut OrtSessionOptions, api_base: *const OrtApiBase) -> OrtStatusPtr {
    let init = std::panic::catch_unwind(|| {
        // SAFETY: api_base is the pointer ONNX Runtime passed to this entry point.
        unsafe { ort::init(api_base) }
    });
    match init {
        // SAFETY: options is the session options ONNX Runtime passed to this entry point.
        Ok(Ok(_)) => ort::guard("RegisterCustomOps", || unsafe { ort::custom_op::register(options) }),
        Ok(Err(status)) => status,
        // Without an API table no status can be built; null is the only answer left.
        Err(_) => OrtStatusPtr(std::ptr::null_mut()),
    }
}
