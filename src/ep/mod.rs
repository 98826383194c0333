//! `MLUExecutionProvider`: the plugin execution provider. ONNX Runtime calls
//! `CreateEpFactories` (src/lib.rs) and gets one [`factory::Factory`], which reports the
//! MLU cards (real ones through libcnrt, or the emulated card when `MLU_EP_EMULATE=1`) as
//! NPU hardware devices and creates [`provider::Ep`] instances. Each EP claims the `mluops`
//! nodes whose configuration the BANG kernels support (`GetCapability`) and runs them
//! through a kernel registry ([`kernel`]) on the card, with device memory, an allocator and
//! a data transfer ([`memory`]) so that tensors stay on the card between MLU nodes.

pub mod factory;
pub mod kernel;
pub mod memory;
pub mod provider;

use crate::ort::ep_ffi::OrtEpApi;
use crate::ort::{API_VERSION, api, check, cstring};
use ort_sys::{OrtLogger, OrtLoggingLevel};
use std::ffi::CStr;
use std::sync::OnceLock;

pub const EP_NAME: &str = "MLUExecutionProvider";
pub const VENDOR: &str = "Cambricon";
/// Cambricon's PCI vendor id.
pub const VENDOR_ID: u32 = 0xCABC;
/// Prefix of this EP's options in the session configuration (ONNX Runtime stores the
/// options given with a provider as `ep.<lowercased ep name>.<key>`).
pub const OPTION_PREFIX: &str = "ep.mluexecutionprovider.";

static EP_API: OnceLock<&'static OrtEpApi> = OnceLock::new();
static VERSION: OnceLock<u32> = OnceLock::new();

/// The host's `OrtEpApi` table (set by `CreateEpFactories`).
pub fn ep_api() -> &'static OrtEpApi {
    EP_API.get().expect("OrtEpApi requested before CreateEpFactories")
}

/// The version written into every `ort_version_supported`: the lower of the layout these
/// bindings declare (API 24) and the host's minor version.
pub fn version() -> u32 {
    *VERSION.get().unwrap_or(&API_VERSION)
}

/// Fetches `OrtEpApi` and negotiates the struct version with the host.
///
/// # Safety
/// `host_version` is the host's version string; the API table was already obtained.
pub unsafe fn init(host_version: &CStr) -> Result<(), String> {
    let minor = host_version
        .to_str()
        .ok()
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(API_VERSION);
    VERSION.get_or_init(|| minor.min(API_VERSION));
    // SAFETY: GetEpApi is a member of every API table >= 1.22 and returns a static table.
    let table = unsafe { (api().GetEpApi)() };
    if table.is_null() {
        return Err("ONNX Runtime returned no OrtEpApi".into());
    }
    // SAFETY: non-null, static for the life of the ONNX Runtime library; the host is
    // >= 1.24 (checked by ort::init), so every member declared in OrtEpApi exists.
    EP_API.get_or_init(|| unsafe { &*table.cast::<OrtEpApi>() });
    Ok(())
}

/// An ONNX Runtime logger (the factory's default logger or a session's), or none.
#[derive(Clone, Copy)]
pub struct Logger(*const OrtLogger);

// SAFETY: ONNX Runtime loggers are thread-safe and only used through `Logger_LogMessage`.
unsafe impl Send for Logger {}
// SAFETY: as above.
unsafe impl Sync for Logger {}

impl Logger {
    /// # Safety
    /// `logger` is null or a live ONNX Runtime logger that outlives every copy of the result
    /// (ORT's default logger lives as long as the environment, a session logger as long as the
    /// EP created with it).
    pub unsafe fn new(logger: *const OrtLogger) -> Self {
        Logger(logger)
    }

    /// Writes one line (nothing when there is no logger).
    pub fn log(self, level: OrtLoggingLevel, msg: &str) {
        if self.0.is_null() {
            return;
        }
        let text = cstring(msg);
        // SAFETY: a live ORT logger (the contract of `Logger::new`); the strings are
        // NUL-terminated and outlive the call.
        let s = unsafe {
            (api().Logger_LogMessage)(self.0, level, text.as_ptr(), c"onnxruntime-ep-mlu".as_ptr(), 0, c"MLUExecutionProvider".as_ptr())
        };
        let _ = check(s);
    }
}

pub use ort_sys::OrtLoggingLevel::{ORT_LOGGING_LEVEL_INFO as INFO, ORT_LOGGING_LEVEL_WARNING as WARNING};
