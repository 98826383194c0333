//! The C boundary with ONNX Runtime: the only module that calls the `OrtApi` / `OrtEpApi`
//! tables. Everything above it (the crate root, the custom-op domain's kernels, the EP's
//! policy in src/ep/) goes through the small wrappers here:
//! - this file: the tables, statuses, the panic guard, strings, logging;
//! - [`ep_abi`]: the hand-written plugin-EP structs (API 24 layout, pinned by tests);
//! - [`custom_op`]: the schema-derived `mluops` custom-op domain and its CPU kernels;
//! - [`attributes`]: the one attribute reader, for kernel infos and graph nodes;
//! - [`kernel`]: kernel infos, kernel contexts (inputs, outputs, the intra-op pool), values;
//! - [`graph`]: graph reads for `GetCapability` and claiming nodes;
//! - [`registry`]: the EP's kernel registry and kernel definitions;
//! - [`device`]: hardware and EP devices, memory infos and devices, key/value pairs,
//!   session configuration entries.

pub mod attributes;
pub mod custom_op;
pub mod device;
pub mod ep_abi;
pub mod graph;
pub mod kernel;
pub mod registry;

use crate::error::{Error, Result};
use ep_abi::OrtEpApi;
use ort_sys::{
    OrtApi, OrtApiBase, OrtErrorCode, OrtLogger, OrtLoggingLevel, OrtStatus, OrtStatusPtr,
};
use std::ffi::{CStr, CString, c_char};
use std::marker::PhantomData;
use std::sync::OnceLock;

/// An object ONNX Runtime lends for the call in progress (a graph, a node, a kernel info or
/// context, a tensor): its pointer and the lifetime of the loan. The wrappers of each kind
/// are inherent methods (`Graph`, `Node`, `KernelInfo`, ...).
pub struct Handle<'a, T> {
    ptr: *mut T,
    life: PhantomData<&'a T>,
}

impl<T> Clone for Handle<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<'_, T> {}

impl<T> Handle<'_, T> {
    /// # Safety
    /// `ptr` is an object ONNX Runtime lends for the call in progress, live for the handle's
    /// lifetime.
    pub unsafe fn from_raw(ptr: *const T) -> Self {
        Handle { ptr: ptr.cast_mut(), life: PhantomData }
    }
}

/// The C API version this library is built against and requires (ONNX Runtime 1.24).
pub const API_VERSION: u32 = ort_sys::ORT_API_VERSION;

static API: OnceLock<&'static OrtApi> = OnceLock::new();

/// The API table of the host, once a C entry point has obtained it.
pub fn api() -> &'static OrtApi {
    API.get().expect("ONNX Runtime API requested before any entry point received it")
}

/// Obtains `OrtApi` version [`API_VERSION`] from the host. When the host is too old, returns
/// the status to hand back (created through the version-1 table every host serves).
///
/// # Safety
/// `base` must be the `OrtApiBase` pointer ONNX Runtime passed to an entry point.
pub unsafe fn init(base: *const OrtApiBase) -> Result<&'static OrtApi, OrtStatusPtr> {
    if let Some(api) = API.get() {
        return Ok(api);
    }
    if base.is_null() {
        return Err(OrtStatusPtr(std::ptr::null_mut()));
    }
    // SAFETY: `base` is the host's OrtApiBase (caller contract), valid for the process.
    let base = unsafe { &*base };
    // SAFETY: GetApi accepts any version number and returns null when unsupported.
    let table = unsafe { (base.GetApi)(API_VERSION) };
    if table.is_null() {
        // SAFETY: GetVersionString returns a static NUL-terminated string.
        let host =
            unsafe { CStr::from_ptr((base.GetVersionString)()) }.to_string_lossy().into_owned();
        let msg = format!(
            "libonnxruntime_ep_mlu needs ONNX Runtime >= 1.24 (C API version {API_VERSION}); this host is ONNX Runtime {host}"
        );
        // SAFETY: every host serves version 1, whose first member is CreateStatus; only that
        // member is read through the (larger) struct type.
        let v1 = unsafe { (base.GetApi)(1) };
        if v1.is_null() {
            return Err(OrtStatusPtr(std::ptr::null_mut()));
        }
        // SAFETY: as above; reading the first field of a valid version-1 table.
        let create_status = unsafe { std::ptr::addr_of!((*v1).CreateStatus).read() };
        let c = cstring(&msg);
        // SAFETY: CreateStatus copies the message.
        return Err(unsafe { create_status(OrtErrorCode::ORT_NOT_IMPLEMENTED, c.as_ptr()) });
    }
    // SAFETY: a non-null table from GetApi lives as long as the ONNX Runtime library.
    let api: &'static OrtApi = unsafe { &*table };
    Ok(*API.get_or_init(|| api))
}

/// A C string; interior NULs (never produced by our messages) are replaced.
pub fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "?")).unwrap_or_default()
}

/// A new ONNX Runtime status with the given code and message.
fn status(code: OrtErrorCode, msg: &str) -> OrtStatusPtr {
    let c = cstring(msg);
    // SAFETY: CreateStatus copies the message; `c` outlives the call.
    unsafe { (api().CreateStatus)(code, c.as_ptr()) }
}

/// A failed OrtApi call's status as [`Error::Ort`] (its code and message; the status is
/// released).
pub fn check(s: OrtStatusPtr) -> Result<()> {
    if s.0.is_null() {
        return Ok(());
    }
    let api = api();
    let status = s.0 as *const OrtStatus;
    // SAFETY: `s` is a status the API returned; it is read then released exactly once.
    let (code, message) = unsafe {
        (
            (api.GetErrorCode)(status),
            CStr::from_ptr((api.GetErrorMessage)(status)).to_string_lossy().into_owned(),
        )
    };
    // SAFETY: as above.
    unsafe { (api.ReleaseStatus)(s.0) };
    Err(Error::Ort { code, message })
}

/// As [`check`], for the operator layer: a runtime error naming the call.
pub fn checked(call: &str, s: OrtStatusPtr) -> Result<()> {
    check(s).map_err(|m| Error::Runtime(format!("{call}: {m}")))
}

/// The one trampoline of every ONNX Runtime callback: runs `f`, its error as a status with
/// the error's code (the one place an [`Error`] becomes an `OrtStatus`), a panic as
/// ORT_FAIL naming `what`: no unwinding crosses the boundary.
pub fn guard(what: &str, f: impl FnOnce() -> Result<()>) -> OrtStatusPtr {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => OrtStatusPtr(std::ptr::null_mut()),
        Ok(Err(e)) => status(e.code(), &e.to_string()),
        Err(p) => status(
            OrtErrorCode::ORT_FAIL,
            &format!("{what}: internal error (panic): {}", panic_message(&p)),
        ),
    }
}

pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Reads a string through the two-call (size query, then fill) pattern of the C API.
pub fn read_string(call: impl FnMut(*mut c_char, *mut usize) -> OrtStatusPtr) -> Result<String> {
    attribute_text(read_bytes(call)?)
}

/// The bytes of a string read through the two-call pattern (terminating NUL included).
pub fn read_bytes(
    mut call: impl FnMut(*mut c_char, *mut usize) -> OrtStatusPtr,
) -> Result<Vec<u8>> {
    let mut size = 0usize;
    check(call(std::ptr::null_mut(), &mut size))?;
    let mut buf = vec![0u8; size.max(1)];
    check(call(buf.as_mut_ptr().cast(), &mut size))?;
    buf.truncate(size);
    Ok(buf)
}

/// An attribute string's bytes (one terminating NUL allowed) as text. A NUL before the end
/// is an error: cutting the string there would accept a value the attribute does not hold.
pub fn attribute_text(mut bytes: Vec<u8>) -> Result<String> {
    if bytes.last() == Some(&0) {
        bytes.pop();
    }
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(Error::Runtime(format!(
            "the string holds a NUL byte at offset {at} of {}",
            bytes.len()
        )));
    }
    String::from_utf8(bytes).map_err(|e| Error::Runtime(format!("the string is not UTF-8: {e}")))
}

/// Reads a C string ONNX Runtime returned through an out pointer (empty for null).
pub(crate) fn out_str(call: impl FnOnce(*mut *const c_char) -> OrtStatusPtr) -> Result<String> {
    let mut p: *const c_char = std::ptr::null();
    check(call(&mut p))?;
    if p.is_null() {
        return Ok(String::new());
    }
    // SAFETY: ORT returned a NUL-terminated string that outlives this call (it belongs to
    // the graph or node it was read from).
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

static EP_API: OnceLock<&'static OrtEpApi> = OnceLock::new();
static VERSION: OnceLock<u32> = OnceLock::new();

/// The host's `OrtEpApi` table (set by [`init_ep`]).
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
/// `base` is the `OrtApiBase` ONNX Runtime passed to `CreateEpFactories`, and [`init`]
/// succeeded with it.
pub unsafe fn init_ep(base: *const OrtApiBase) -> Result<()> {
    // SAFETY: a host that served API >= 24 (caller contract) has a valid version string.
    let host = unsafe { CStr::from_ptr(((*base).GetVersionString)()) };
    let minor = host
        .to_str()
        .ok()
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(API_VERSION);
    VERSION.get_or_init(|| minor.min(API_VERSION));
    // SAFETY: GetEpApi is a member of every API table >= 1.22 and returns a static table.
    let table = unsafe { (api().GetEpApi)() };
    if table.is_null() {
        return Err(Error::Runtime("ONNX Runtime returned no OrtEpApi".into()));
    }
    // SAFETY: non-null, static for the life of the ONNX Runtime library; the host is
    // >= 1.24 (checked by init), so every member declared in OrtEpApi exists.
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
            (api().Logger_LogMessage)(
                self.0,
                level,
                text.as_ptr(),
                c"onnxruntime-ep-mlu".as_ptr(),
                0,
                c"MLUExecutionProvider".as_ptr(),
            )
        };
        let _ = check(s);
    }
}

pub use ort_sys::OrtLoggingLevel::{
    ORT_LOGGING_LEVEL_ERROR as ERROR, ORT_LOGGING_LEVEL_INFO as INFO,
    ORT_LOGGING_LEVEL_WARNING as WARNING,
};

/// ONNX Runtime's default logger while a factory holds it, else null. Held for reading
/// across each use, so that `route_log(null)` returns only when no record is using it.
static ROUTED: std::sync::RwLock<Routed> = std::sync::RwLock::new(Routed(std::ptr::null()));

struct Routed(*const OrtLogger);

// SAFETY: an ORT logger may be used from any thread (ORT's loggers are thread-safe); the
// lock orders its uses before its release.
unsafe impl Send for Routed {}
// SAFETY: as above.
unsafe impl Sync for Routed {}

/// The crate's `log` records (allocation failures, frees, a ParallelFor fallback, ...) go
/// to ONNX Runtime's default logger while a factory holds it, else to stderr: never to
/// nowhere. Installed only when the process has no `log` logger yet (a host application
/// that installed its own receives them instead).
struct Forward;

static FORWARD: Forward = Forward;

impl log::Log for Forward {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let routed = ROUTED.read().unwrap_or_else(|e| e.into_inner());
        let msg = format!("onnxruntime-ep-mlu: {}", r.args());
        if routed.0.is_null() {
            eprintln!("[{}] {msg}", r.level());
            return;
        }
        let level = match r.level() {
            log::Level::Error => ERROR,
            log::Level::Warn => WARNING,
            _ => INFO,
        };
        Logger(routed.0.cast_mut()).log(level, &msg);
    }

    fn flush(&self) {}
}

/// Routes the crate's `log` records to `logger` (ONNX Runtime's default logger, or null to
/// stop when the factory holding it is released), installing the forwarder if the process
/// has no `log` logger.
///
/// # Safety
/// `logger` is null or a live ONNX Runtime logger until the next call of this function.
pub unsafe fn route_log(logger: *const OrtLogger) {
    ROUTED.write().unwrap_or_else(|e| e.into_inner()).0 = logger;
    install_log();
}

/// Installs the forwarder of the crate's `log` records if the process has no `log` logger.
pub fn install_log() {
    if log::set_logger(&FORWARD).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;
    use std::sync::Mutex;

    #[test]
    fn attribute_text_takes_one_terminating_nul_and_rejects_inner_ones() {
        assert_eq!(attribute_text(b"mean\0".to_vec()), Ok("mean".to_string()));
        assert_eq!(attribute_text(b"mean".to_vec()), Ok("mean".to_string()));
        assert_eq!(attribute_text(Vec::new()), Ok(String::new()));
        assert!(
            attribute_text(b"mean\0junk\0".to_vec())
                .unwrap_err()
                .to_string()
                .contains("NUL byte at offset 4")
        );
        assert!(attribute_text(b"mean\0\0".to_vec()).is_err());
        assert!(attribute_text(vec![0xff, 0]).unwrap_err().to_string().contains("UTF-8"));
    }

    /// A host older than the floor: serves only version 1 of the API, whose one member
    /// used here (CreateStatus) records the message.
    static MESSAGE: Mutex<String> = Mutex::new(String::new());
    static mut V1_TABLE: MaybeUninit<OrtApi> = MaybeUninit::uninit();

    unsafe extern "system" fn create_status(
        code: OrtErrorCode,
        msg: *const c_char,
    ) -> OrtStatusPtr {
        // SAFETY: init passes a valid NUL-terminated message.
        let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned();
        *MESSAGE.lock().unwrap() = format!("{code:?}: {text}");
        // Any non-null pointer: the test only checks that a status came back.
        OrtStatusPtr(std::ptr::NonNull::dangling().as_ptr())
    }

    unsafe extern "system" fn get_api(version: u32) -> *const OrtApi {
        if version == 1 { &raw const V1_TABLE as *const OrtApi } else { std::ptr::null() }
    }

    unsafe extern "system" fn version_string() -> *const c_char {
        c"1.23.2".as_ptr()
    }

    #[test]
    fn a_host_older_than_the_api_floor_gets_a_clear_error() {
        // SAFETY: only the first member of the table is written and later read (through a
        // raw pointer in init); the rest stays uninitialised and is never touched.
        unsafe {
            let table = &raw mut V1_TABLE;
            std::ptr::addr_of_mut!((*(*table).as_mut_ptr()).CreateStatus).write(create_status);
        }
        let base = OrtApiBase { GetApi: get_api, GetVersionString: version_string };
        // SAFETY: `base` is a valid OrtApiBase for the duration of the call.
        let result = unsafe { init(&base) };
        assert!(matches!(result, Err(s) if !s.0.is_null()), "init must fail with a status");
        let msg = MESSAGE.lock().unwrap().clone();
        assert!(msg.starts_with("ORT_NOT_IMPLEMENTED"), "{msg}");
        assert!(
            msg.contains("needs ONNX Runtime >= 1.24")
                && msg.contains("this host is ONNX Runtime 1.23.2"),
            "{msg}"
        );
        assert!(API.get().is_none(), "a refused host must not be remembered");
    }
}
