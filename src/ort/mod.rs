//! The C boundary with ONNX Runtime's classic custom-op API: the `OrtApi` table handed to
//! us by the host, statuses, and the `mluops` custom-op domain (src/ort/custom_op.rs) whose
//! kernels run the CPU operators of src/ops/.

pub mod custom_op;
pub mod ep_ffi;
pub mod kernel;

use crate::error::NodeError;
use ort_sys::{OrtApi, OrtApiBase, OrtErrorCode, OrtStatus, OrtStatusPtr};
use std::ffi::{CStr, CString, c_char};
use std::sync::OnceLock;

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
        let host = unsafe { CStr::from_ptr((base.GetVersionString)()) }.to_string_lossy().into_owned();
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
pub fn status(code: OrtErrorCode, msg: &str) -> OrtStatusPtr {
    let c = cstring(msg);
    // SAFETY: CreateStatus copies the message; `c` outlives the call.
    unsafe { (api().CreateStatus)(code, c.as_ptr()) }
}

/// The status for an operator error: INVALID_ARGUMENT for contract violations.
pub fn node_status(e: &NodeError) -> OrtStatusPtr {
    let code = if e.error.is_invalid_argument() {
        OrtErrorCode::ORT_INVALID_ARGUMENT
    } else {
        OrtErrorCode::ORT_FAIL
    };
    status(code, &e.to_string())
}

/// Turns a status returned by an OrtApi call into `Err(message)`, releasing it.
pub fn check(s: OrtStatusPtr) -> Result<(), String> {
    if s.0.is_null() {
        return Ok(());
    }
    let api = api();
    // SAFETY: `s` is a status the API returned; it is read then released exactly once.
    let msg = unsafe { CStr::from_ptr((api.GetErrorMessage)(s.0 as *const OrtStatus)) }.to_string_lossy().into_owned();
    // SAFETY: as above.
    unsafe { (api.ReleaseStatus)(s.0) };
    Err(msg)
}

/// Runs `f`, turning a panic into an ONNX Runtime status: no unwinding crosses the boundary.
pub fn guard(what: &str, f: impl FnOnce() -> OrtStatusPtr) -> OrtStatusPtr {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(s) => s,
        Err(p) => status(OrtErrorCode::ORT_FAIL, &format!("{what}: internal error (panic): {}", panic_message(&p))),
    }
}

pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Reads a string through the two-call (size query, then fill) pattern of the C API.
pub fn read_string(mut call: impl FnMut(*mut c_char, *mut usize) -> OrtStatusPtr) -> Result<String, String> {
    let mut size = 0usize;
    check(call(std::ptr::null_mut(), &mut size))?;
    let mut buf = vec![0u8; size.max(1)];
    check(call(buf.as_mut_ptr().cast(), &mut size))?;
    buf.truncate(size);
    attribute_text(buf)
}

/// An attribute string's bytes (one terminating NUL allowed) as text. A NUL before the end
/// is an error: cutting the string there would accept a value the attribute does not hold.
pub fn attribute_text(mut bytes: Vec<u8>) -> Result<String, String> {
    if bytes.last() == Some(&0) {
        bytes.pop();
    }
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(format!("the string holds a NUL byte at offset {at} of {}", bytes.len()));
    }
    String::from_utf8(bytes).map_err(|e| format!("the string is not UTF-8: {e}"))
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
        assert!(attribute_text(b"mean\0junk\0".to_vec()).unwrap_err().contains("NUL byte at offset 4"));
        assert!(attribute_text(b"mean\0\0".to_vec()).is_err());
        assert!(attribute_text(vec![0xff, 0]).unwrap_err().contains("UTF-8"));
    }

    /// A host older than the floor: serves only version 1 of the API, whose one member
    /// used here (CreateStatus) records the message.
    static MESSAGE: Mutex<String> = Mutex::new(String::new());
    static mut V1_TABLE: MaybeUninit<OrtApi> = MaybeUninit::uninit();

    unsafe extern "system" fn create_status(code: OrtErrorCode, msg: *const c_char) -> OrtStatusPtr {
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
        assert!(msg.contains("needs ONNX Runtime >= 1.24") && msg.contains("this host is ONNX Runtime 1.23.2"), "{msg}");
        assert!(API.get().is_none(), "a refused host must not be remembered");
    }
}
