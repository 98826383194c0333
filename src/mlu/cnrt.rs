//! A real Cambricon card through the Cambricon runtime (`libcnrt.so`) and the kernel
//! library cncc built from kernels/ (build.rs, when NEUWARE_HOME has cncc). Both are
//! opened with libloading at run time; an absent library means no device, never a failure.
//!
//! No MLU hardware is reachable from this project's machines: this path compiles and is
//! reviewed against the Cambricon runtime's documented C API, but has never run.

use super::{Copy, Device, DeviceInfo, Kernels, QueuePtr, Runtime};
use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::Arc;

type Ret = c_int;

struct Cnrt {
    // Keeps the function pointers below valid.
    _lib: Library,
    device: c_int,
    get_error_str: unsafe extern "C" fn(Ret) -> *const c_char,
    set_device: unsafe extern "C" fn(c_int) -> Ret,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Ret,
    free: unsafe extern "C" fn(*mut c_void) -> Ret,
    memcpy: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> Ret,
    memset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> Ret,
    queue_create: unsafe extern "C" fn(*mut QueuePtr) -> Ret,
    queue_sync: unsafe extern "C" fn(QueuePtr) -> Ret,
    queue_destroy: unsafe extern "C" fn(QueuePtr) -> Ret,
}

/// The runtime library; `None` (with the reason) when it cannot be opened.
fn open_runtime() -> std::result::Result<Library, String> {
    // SAFETY: loading the vendor runtime runs its initialisers; that is its documented use.
    unsafe { Library::new("libcnrt.so") }.map_err(|e| e.to_string())
}

fn sym<T: std::marker::Copy>(lib: &Library, name: &str) -> Result<T> {
    // SAFETY: each name is a cnrt entry point whose C signature is the field type it fills.
    let s = unsafe { lib.get::<T>(name.as_bytes()) };
    s.map(|s| *s).map_err(|e| Error::Runtime(format!("libcnrt.so lacks {name}: {e}")))
}

impl Cnrt {
    fn new(lib: Library, device: c_int) -> Result<Self> {
        Ok(Cnrt {
            device,
            get_error_str: sym(&lib, "cnrtGetErrorStr\0")?,
            set_device: sym(&lib, "cnrtSetDevice\0")?,
            malloc: sym(&lib, "cnrtMalloc\0")?,
            free: sym(&lib, "cnrtFree\0")?,
            memcpy: sym(&lib, "cnrtMemcpy\0")?,
            memset: sym(&lib, "cnrtMemset\0")?,
            queue_create: sym(&lib, "cnrtQueueCreate\0")?,
            queue_sync: sym(&lib, "cnrtQueueSync\0")?,
            queue_destroy: sym(&lib, "cnrtQueueDestroy\0")?,
            _lib: lib,
        })
    }

    fn check(&self, what: &str, ret: Ret) -> Result<()> {
        if ret == 0 {
            return Ok(());
        }
        // SAFETY: cnrtGetErrorStr returns a static NUL-terminated string.
        let msg = unsafe { CStr::from_ptr((self.get_error_str)(ret)) }.to_string_lossy().into_owned();
        Err(Error::Runtime(format!("cnrt {what} failed ({ret}): {msg}")))
    }

    /// Every call binds the card first: the runtime's current device is per thread.
    fn bind(&self) -> Result<()> {
        // SAFETY: plain call with a device index that cnrtGetDeviceCount reported.
        self.check("cnrtSetDevice", unsafe { (self.set_device)(self.device) })
    }
}

impl Runtime for Cnrt {
    fn malloc(&self, bytes: usize) -> Result<*mut c_void> {
        self.bind()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        self.check("cnrtMalloc", unsafe { (self.malloc)(&mut p, bytes) })?;
        Ok(p)
    }
    unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        self.check("cnrtFree", unsafe { (self.free)(ptr) })
    }
    unsafe fn memcpy(&self, dst: *mut c_void, src: *const c_void, bytes: usize, dir: Copy) -> Result<()> {
        self.bind()?;
        // cnrtMemTransDir_t: HostToDev 0, DevToDev 1, DevToHost 2.
        let kind = match dir {
            Copy::HostToDevice => 0,
            Copy::DeviceToDevice => 1,
            Copy::DeviceToHost => 2,
        };
        // SAFETY: forwarded contract.
        self.check("cnrtMemcpy", unsafe { (self.memcpy)(dst, src.cast_mut(), bytes, kind) })
    }
    unsafe fn memset(&self, dst: *mut c_void, value: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        self.check("cnrtMemset", unsafe { (self.memset)(dst, c_int::from(value), bytes) })
    }
    fn queue_create(&self) -> Result<QueuePtr> {
        self.bind()?;
        let mut q = std::ptr::null_mut();
        // SAFETY: `q` is a valid out-pointer.
        self.check("cnrtQueueCreate", unsafe { (self.queue_create)(&mut q) })?;
        Ok(q)
    }
    unsafe fn queue_sync(&self, q: QueuePtr) -> Result<()> {
        // SAFETY: forwarded contract.
        self.check("cnrtQueueSync", unsafe { (self.queue_sync)(q) })
    }
    unsafe fn queue_destroy(&self, q: QueuePtr) -> Result<()> {
        // SAFETY: forwarded contract.
        self.check("cnrtQueueDestroy", unsafe { (self.queue_destroy)(q) })
    }
    fn last_error(&self) -> String {
        "see the Cambricon runtime log".to_owned()
    }
}

/// The device kernel library built by cncc (empty when this build had no toolkit);
/// `MLU_EP_KERNEL_LIBRARY` overrides it.
fn kernel_library_path() -> Option<String> {
    std::env::var("MLU_EP_KERNEL_LIBRARY")
        .ok()
        .or_else(|| Some(env!("MLUOPS_DEVICE_KERNELS").to_owned()))
        .filter(|p| !p.is_empty())
}

/// The real cards, or the reason there are none (absent runtime, no card, no kernels).
pub fn devices() -> std::result::Result<Vec<Arc<Device>>, String> {
    let lib = open_runtime().map_err(|e| format!("Cambricon runtime libcnrt.so not loadable ({e}): no real MLU"))?;
    let count_fn: unsafe extern "C" fn(*mut c_uint) -> Ret =
        sym(&lib, "cnrtGetDeviceCount\0").map_err(|e| e.to_string())?;
    let mut count: c_uint = 0;
    // SAFETY: `count` is a valid out-pointer.
    if unsafe { count_fn(&mut count) } != 0 || count == 0 {
        return Err("the Cambricon runtime reports no MLU card".to_owned());
    }
    let kernels_path = kernel_library_path()
        .ok_or("this build has no cncc-compiled kernels (build with NEUWARE_HOME set, or set MLU_EP_KERNEL_LIBRARY)")?;
    // SAFETY: the kernel library is our own cncc build of kernels/; it has no initialisers
    // beyond the toolkit's kernel registration.
    let klib = unsafe { Library::new(&kernels_path) }.map_err(|e| format!("{kernels_path}: {e}"))?;
    let kernels = Kernels::load(&klib).map_err(|e| e.to_string())?;
    // The kernel entries must outlive every device: the library stays loaded.
    std::mem::forget(klib);
    let mut out = Vec::new();
    for d in 0..count as c_int {
        let lib = open_runtime()?;
        let rt = Cnrt::new(lib, d).map_err(|e| e.to_string())?;
        // Conservative shape: one cluster of four cores exists on every MLU3xx card; the
        // UNION1 launches then never exceed the card.
        let info = DeviceInfo {
            arch: "MLU (cnrt)".to_owned(),
            emulated: false,
            clusters: 1,
            cores_per_cluster: 4,
            nram_bytes: 768 * 1024,
            nram_reserved_bytes: 128 * 1024,
        };
        out.push(Device::new(Box::new(rt), info, kernels));
    }
    Ok(out)
}
