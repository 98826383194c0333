//! onnxruntime-ep-mlu: MLU-OPS's point-cloud operators for ONNX Runtime (the list is
//! [`ops::ALL`]), in the custom-op domain `mluops` (see schemas/ and docs/CONTRACT.md), and
//! the `MLUExecutionProvider` plugin EP. The crate root holds only the C entry points;
//! everything else lives in the modules below.

pub mod cache;
pub mod ep;
pub mod error;
pub mod ffi;
pub mod mlu;
pub mod mluops;
pub mod ops;
pub mod parallel;
pub mod schema;
pub mod scratch;
pub mod tensor;
#[cfg(test)]
mod test_rng;

use ep::factory;
use ffi::ep_abi::OrtEpFactory;
use ort_sys::{OrtApiBase, OrtLogger, OrtSessionOptions, OrtStatusPtr};
use std::ffi::{CString, c_char};
use std::sync::OnceLock;

/// Classic custom-op entry: registers the `mluops` domain (CPU kernels) with the session
/// options. Called by `SessionOptions.register_custom_ops_library` and its C/Rust twins.
///
/// # Safety
/// Called by ONNX Runtime with its live session options and API base.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RegisterCustomOps(
    options: *mut OrtSessionOptions,
    api_base: *const OrtApiBase,
) -> OrtStatusPtr {
    let init = std::panic::catch_unwind(|| {
        // SAFETY: api_base is the pointer ONNX Runtime passed to this entry point.
        unsafe { ffi::init(api_base) }
    });
    match init {
        Ok(Ok(_)) => {
            ffi::install_log();
            // SAFETY: options is the session options ONNX Runtime passed to this entry point.
            ffi::guard("RegisterCustomOps", || unsafe { ffi::custom_op::register(options) })
        }
        Ok(Err(status)) => status,
        // Without an API table no status can be built; null is the only answer left.
        Err(_) => OrtStatusPtr(std::ptr::null_mut()),
    }
}

/// Plugin-EP entry: creates the `MLUExecutionProvider` factory. Called by
/// `register_execution_provider_library` and its C/Rust twins.
///
/// # Safety
/// Called by ONNX Runtime with its API base, default logger and output array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn CreateEpFactories(
    registered_name: *const c_char,
    api_base: *const OrtApiBase,
    default_logger: *const OrtLogger,
    factories: *mut *mut OrtEpFactory,
    max_factories: usize,
    num_factories: *mut usize,
) -> OrtStatusPtr {
    if !num_factories.is_null() {
        // No factory until one is made, whichever way this call fails (a host that passes
        // no API table cannot even be given an error status).
        // SAFETY: a non-null num_factories is ONNX Runtime's output count.
        unsafe { *num_factories = 0 };
    }
    let init = std::panic::catch_unwind(|| {
        // SAFETY: api_base is the pointer ONNX Runtime passed to this entry point.
        unsafe { ffi::init(api_base) }
    });
    match init {
        Ok(Ok(_)) => ffi::guard("CreateEpFactories", || {
            // SAFETY: api_base is ONNX Runtime's, and the API table was obtained from it above.
            unsafe { ffi::init_ep(api_base) }?;
            let name = if registered_name.is_null() {
                String::new()
            } else {
                // SAFETY: ONNX Runtime passes the registration name, NUL-terminated.
                unsafe { std::ffi::CStr::from_ptr(registered_name) }.to_string_lossy().into_owned()
            };
            // SAFETY: the output arguments are ONNX Runtime's.
            unsafe {
                factory::create(&name, default_logger, factories, max_factories, num_factories)
            }
        }),
        Ok(Err(status)) => status,
        Err(_) => OrtStatusPtr(std::ptr::null_mut()),
    }
}

/// Plugin-EP entry: releases a factory made by [`CreateEpFactories`].
///
/// # Safety
/// `factory` came from `CreateEpFactories` and is released once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ReleaseEpFactory(factory: *mut OrtEpFactory) -> OrtStatusPtr {
    if factory.is_null() {
        return OrtStatusPtr(std::ptr::null_mut());
    }
    ffi::guard("ReleaseEpFactory", || {
        // SAFETY: caller contract.
        unsafe { factory::Factory::release(factory) };
        Ok(())
    })
}

/// A string made once per process by `make` and kept as long as the library, for the
/// exports below that scripts read (no ONNX Runtime involved); null if `make` panicked, so
/// that no panic crosses the C boundary.
fn exported(
    cell: &'static OnceLock<Option<CString>>,
    make: impl FnOnce() -> String + std::panic::UnwindSafe,
) -> *const c_char {
    let made = cell.get_or_init(|| std::panic::catch_unwind(|| ffi::cstring(&make())).ok());
    made.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
}

/// The provider's report on itself (`ep::doctor`), for `python -m onnxruntime_ep_mlu.doctor`:
/// a JSON object with `text` (the report ONNX Runtime's log gets when the factory is created),
/// `real_cards` (Cambricon cards in use) and `no_real_card` (why none, or null). Made once
/// per process; the string lives as long as the library. Null if making it panicked.
#[unsafe(no_mangle)]
pub extern "C" fn MluEpDoctorReport() -> *const c_char {
    static REPORT: OnceLock<Option<CString>> = OnceLock::new();
    exported(&REPORT, || {
        let found = ep::doctor::discover();
        serde_json::json!({
            "text": ep::doctor::report(&found),
            "real_cards": found.real_cards(),
            "no_real_card": found.no_real_card,
        })
        .to_string()
    })
}

/// The registry (`ops::ALL`) for scripts and tests, so that none lists the operators itself:
/// a JSON array, in the registry's order, of `{"op": name, "backends": [card backends]}`, for
/// `onnxruntime_ep_mlu.operators()`. Made once per process; the string lives as long as the
/// library. Null if making it panicked.
#[unsafe(no_mangle)]
pub extern "C" fn MluEpOperators() -> *const c_char {
    static LIST: OnceLock<Option<CString>> = OnceLock::new();
    exported(&LIST, || {
        let rows: Vec<_> = ops::ALL
            .iter()
            .map(|e| {
                let backends: Vec<&str> = e.card_backends.iter().map(|b| b.name()).collect();
                serde_json::json!({"op": e.name, "backends": backends})
            })
            .collect();
        serde_json::Value::from(rows).to_string()
    })
}

/// The backend table (`Backend::ALL`) for scripts and tests, so that none lists the backends
/// itself: a JSON array of their names (`mlu_backend`'s values besides `auto`, the traffic
/// report's keys) in the order `auto` tries them, for `onnxruntime_ep_mlu.backends()`. Made
/// once per process; the string lives as long as the library. Null if making it panicked.
#[unsafe(no_mangle)]
pub extern "C" fn MluEpBackends() -> *const c_char {
    static LIST: OnceLock<Option<CString>> = OnceLock::new();
    exported(&LIST, || {
        let names: Vec<&str> = ops::device::Backend::ALL.iter().map(|b| b.name()).collect();
        serde_json::Value::from(names).to_string()
    })
}
