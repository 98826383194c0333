//! A real Cambricon card through the Cambricon runtime (`libcnrt.so`) and the kernel
//! library cncc built from kernels/ (build.rs, when NEUWARE_HOME has cncc). Both are
//! opened with libloading at run time; an absent library means no device, never a failure.
//!
//! No MLU hardware is reachable from this project's machines: this path compiles and is
//! reviewed against the Cambricon runtime's documented C API, but has never run.

use super::{
    Device, DeviceInfo, Direction, KERNEL_FAMILIES, KernelCode, NRAM_BUDGET, NRAM_RESERVED_BYTES,
    QueuePtr, Runtime, has_entry,
};
use crate::error::{Error, Result};
use libloading::Library;
use libloading::os::unix::{Library as UnixLibrary, RTLD_GLOBAL, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{CStr, OsStr, OsString, c_char, c_int, c_uint, c_void};
use std::sync::Arc;

type Ret = c_int;

/// cnrtDeviceAttr_t values of the card's topology: cnrt.h of CNRT 6.0.2, where
/// `cnrtRet_t cnrtDeviceGetAttribute(int *pValue, cnrtDeviceAttr_t attr, int device)` reads
/// them (NRAM in bytes). Cambricon queries the same three in torch_mlu,
/// torch_mlu/csrc/framework/core/device.cpp (branch r1.22_pt2.1.0, commit d578002):
/// `cnrtDeviceGetAttribute(&value, cnrtAttrClusterCount, device_index)`.
const ATTR_CLUSTER_COUNT: c_int = 0x205;
const ATTR_MCORE_PER_CLUSTER: c_int = 0x206;
const ATTR_NRAM_SIZE_PER_MCORE: c_int = 0x302;

struct Cnrt {
    // Keeps the function pointers below valid.
    _lib: Library,
    device: c_int,
    get_error_str: unsafe extern "C" fn(Ret) -> *const c_char,
    set_device: unsafe extern "C" fn(c_int) -> Ret,
    get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> Ret,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Ret,
    free: unsafe extern "C" fn(*mut c_void) -> Ret,
    memcpy: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> Ret,
    memset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> Ret,
    queue_create: unsafe extern "C" fn(*mut QueuePtr) -> Ret,
    queue_sync: unsafe extern "C" fn(QueuePtr) -> Ret,
    queue_destroy: unsafe extern "C" fn(QueuePtr) -> Ret,
}

/// Opens the Cambricon runtime as [`devices`] does with `open_global(runtime_path())`:
/// RTLD_NOW | RTLD_GLOBAL.
///
/// Global: the kernel library calls CNRT (kernels/common/kernel.h's BANG_LAUNCH:
/// cnrtGetLastError, the `<<<>>>` launch, cnrtPeekAtLastError). It is linked with -lcnrt
/// (build_support/cncc.rs), and the loader satisfies that dependency with the copy opened
/// here (same file, same soname). A kernel library without that dependency (one given
/// through MLU_EP_KERNEL_LIBRARY, or linked with --as-needed) finds the runtime's symbols
/// only in the global scope: libloading's default, RTLD_LOCAL, would hide them. Either way
/// the kernels' calls reach this very runtime instance (one set of contexts, queues and
/// registered kernels). The load order is tested below with stand-in libraries.
///
/// Now: a symbol the runtime itself lacks fails this open, with a reason, instead of aborting
/// the host process at the first call (a failed lazy binding is fatal, not an error).
fn open_global(path: impl AsRef<OsStr>) -> Result<Library> {
    // SAFETY: loading the vendor runtime runs its initialisers; that is its documented use.
    unsafe { UnixLibrary::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map(Library::from)
        .map_err(|e| Error::Runtime(e.to_string()))
}

/// Opens the kernel library, after the runtime: RTLD_NOW, so that a CNRT symbol it cannot
/// resolve fails the open (no device, with the reason) rather than the process at the first
/// launch; RTLD_LOCAL, as nothing else needs its symbols.
fn open_kernels(path: impl AsRef<OsStr>) -> Result<Library> {
    // SAFETY: the kernel library is our own cncc build of kernels/; it has no initialisers
    // beyond the toolkit's kernel registration.
    unsafe { UnixLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
        .map(Library::from)
        .map_err(|e| Error::Runtime(e.to_string()))
}

fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T> {
    // SAFETY: each name is a cnrt entry point whose C signature is the field type it fills.
    unsafe { super::symbol(lib, "libcnrt.so", name) }
}

impl Cnrt {
    fn new(lib: Library, device: c_int) -> Result<Self> {
        Ok(Cnrt {
            device,
            get_error_str: sym(&lib, "cnrtGetErrorStr\0")?,
            set_device: sym(&lib, "cnrtSetDevice\0")?,
            get_attribute: sym(&lib, "cnrtDeviceGetAttribute\0")?,
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
        let msg =
            unsafe { CStr::from_ptr((self.get_error_str)(ret)) }.to_string_lossy().into_owned();
        Err(Error::Runtime(format!("cnrt {what} failed ({ret}): {msg}")))
    }

    /// Every call binds the card first: the runtime's current device is per thread.
    fn bind(&self) -> Result<()> {
        // SAFETY: plain call with a device index that cnrtGetDeviceCount reported.
        self.check("cnrtSetDevice", unsafe { (self.set_device)(self.device) })
    }

    /// One positive attribute of this card.
    fn attribute(&self, name: &str, attr: c_int) -> Result<u32> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer; `attr` is a cnrtDeviceAttr_t value and the
        // device an index that cnrtGetDeviceCount reported.
        self.check(name, unsafe { (self.get_attribute)(&mut value, attr, self.device) })?;
        u32::try_from(value).ok().filter(|&v| v > 0).ok_or_else(|| {
            Error::Runtime(format!("cnrtDeviceGetAttribute({name}) reports {value}"))
        })
    }

    /// The card's topology as the runtime reports it. The launch policies (mlu::union1_tasks)
    /// get the real cluster count from here, no longer a fixed one cluster of four cores.
    fn info(&self) -> Result<DeviceInfo> {
        let clusters = self.attribute("cnrtAttrClusterCount", ATTR_CLUSTER_COUNT)?;
        let cores_per_cluster =
            self.attribute("cnrtAttrMcorePerCluster", ATTR_MCORE_PER_CLUSTER)?;
        let nram_bytes =
            u64::from(self.attribute("cnrtAttrNramSizePerMcore", ATTR_NRAM_SIZE_PER_MCORE)?);
        // The kernels carve a fixed NRAM budget (kernels/common/kernel.h): a smaller core
        // would overrun it.
        if nram_bytes < NRAM_BUDGET as u64 + NRAM_RESERVED_BYTES {
            return Err(Error::Runtime(format!(
                "{nram_bytes} bytes of NRAM per core, below the kernels' {NRAM_BUDGET} plus {NRAM_RESERVED_BYTES} of stack"
            )));
        }
        Ok(DeviceInfo {
            arch: "MLU (cnrt)".to_owned(),
            emulated: false,
            clusters,
            cores_per_cluster,
            nram_bytes,
            nram_reserved_bytes: NRAM_RESERVED_BYTES,
            missing_families: Vec::new(),
        })
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
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        dir: Direction,
    ) -> Result<()> {
        self.bind()?;
        // cnrtMemTransDir_t: HostToDev 0, DevToDev 1, DevToHost 2.
        let kind = match dir {
            Direction::HostToDevice => 0,
            Direction::DeviceToDevice => 1,
            Direction::DeviceToHost => 2,
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
    fn launch_error(&self, code: i32) -> String {
        // SAFETY: cnrtGetErrorStr takes any code.
        let text = unsafe { (self.get_error_str)(code) };
        if text.is_null() {
            return format!("cnrt error {code}");
        }
        // SAFETY: a non-null cnrtGetErrorStr result is a static NUL-terminated string.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }
    fn bind_thread(&self) -> Result<()> {
        self.bind()
    }
}

// CNCC_FAILED: the kernel families cncc failed on in this build (build.rs).
include!(concat!(env!("OUT_DIR"), "/kernels/cncc_failed.rs"));

/// The device kernel library built by cncc (empty when this build had no toolkit);
/// `MLU_EP_KERNEL_LIBRARY` overrides it.
pub(crate) fn kernel_library_path() -> Option<String> {
    std::env::var("MLU_EP_KERNEL_LIBRARY")
        .ok()
        .or_else(|| Some(env!("BANG_DEVICE_KERNELS").to_owned()))
        .filter(|p| !p.is_empty())
}

/// The Cambricon runtime to open: `$NEUWARE_HOME/lib64/libcnrt.so` when NEUWARE_HOME is set
/// and has it (the toolkit layout build_support/cncc.rs links against), else the bare name,
/// which the dynamic loader looks up through LD_LIBRARY_PATH and /etc/ld.so.cache (where the
/// Neuware packages and environment script put it).
pub(crate) fn runtime_path() -> OsString {
    runtime_path_in(std::env::var_os("NEUWARE_HOME").as_deref())
}

fn runtime_path_in(neuware_home: Option<&OsStr>) -> OsString {
    neuware_home
        .map(|home| std::path::Path::new(home).join("lib64/libcnrt.so"))
        .filter(|p| p.is_file())
        .map_or_else(|| OsString::from("libcnrt.so"), OsString::from)
}

/// The runtime [`devices`] opens, and its version from `cnrtGetLibVersion(int *major, int
/// *minor, int *patch)` (mlu-ops calls it so: core/context.cpp:83 at v1.4.0), or why it
/// cannot be read.
pub fn runtime_version() -> (String, Result<String>) {
    let path = runtime_path();
    let version = open_global(&path).and_then(|lib| {
        let get: unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int) -> Ret =
            sym(&lib, "cnrtGetLibVersion\0")?;
        let (mut major, mut minor, mut patch) = (0, 0, 0);
        // SAFETY: three valid out-pointers.
        match unsafe { get(&mut major, &mut minor, &mut patch) } {
            0 => Ok(format!("{major}.{minor}.{patch}")),
            ret => Err(Error::Runtime(format!("cnrtGetLibVersion failed ({ret})"))),
        }
    });
    (path.to_string_lossy().into_owned(), version)
}

/// The kernel families the kernel library at `path` cannot launch, each with why: an entry
/// it lacks, or, for a family cncc failed on in this build, the compiler's output. Logged
/// once: those families' nodes run on the other backends (src/ops/device/).
fn missing_families(klib: &Library, path: &str) -> Vec<(String, String)> {
    let mut missing = Vec::new();
    for (family, entries) in KERNEL_FAMILIES {
        let Some(lacks) = entries.iter().find_map(|name| has_entry(klib, name).err()) else {
            continue;
        };
        let why = CNCC_FAILED.iter().find(|(f, _)| f == family).map_or_else(
            || lacks.to_string(),
            |(_, output)| format!("cncc failed on it when this library was built: {output}"),
        );
        log::warn!(
            "{path}: BANG kernel family {family} unavailable; the card paths that launch it decline (the others run): {why}"
        );
        missing.push((family.to_string(), why));
    }
    missing
}

/// The real cards, or the reason there are none (absent runtime, no card, no kernels, or no
/// card whose topology could be read; such a card is left out with a warning). A kernel
/// family the kernel library lacks refuses no card: its nodes go to the other backends.
pub fn devices() -> Result<Vec<Arc<Device>>> {
    let runtime = runtime_path();
    let lib = open_global(&runtime).map_err(|e| {
        Error::Runtime(format!(
            "Cambricon runtime {} not loadable ({e}): no real MLU. To use a card, set NEUWARE_HOME to the Neuware \
             toolkit (its lib64/libcnrt.so is opened) or add the directory holding libcnrt.so to LD_LIBRARY_PATH",
            runtime.to_string_lossy()
        ))
    })?;
    let count_fn: unsafe extern "C" fn(*mut c_uint) -> Ret = sym(&lib, "cnrtGetDeviceCount\0")?;
    let mut count: c_uint = 0;
    // SAFETY: `count` is a valid out-pointer.
    if unsafe { count_fn(&mut count) } != 0 || count == 0 {
        return Err(Error::Runtime("the Cambricon runtime reports no MLU card".to_owned()));
    }
    let kernels_path = kernel_library_path().ok_or_else(|| {
        Error::Runtime("this build has no cncc-compiled kernels (build with NEUWARE_HOME set, or set MLU_EP_KERNEL_LIBRARY)".into())
    })?;
    let klib =
        open_kernels(&kernels_path).map_err(|e| Error::Runtime(format!("{kernels_path}: {e}")))?;
    // Every launch entry resolves now, not at a node's first launch.
    let missing = missing_families(&klib, &kernels_path);
    log::info!(
        "{count} MLU card(s) through the Cambricon runtime {}; BANG kernels from {kernels_path}",
        runtime.to_string_lossy()
    );
    // The kernel entries must outlive every device, and the runtime they call with them:
    // both libraries stay loaded.
    let kernels = KernelCode::Library(Box::leak(Box::new(klib)));
    std::mem::forget(lib);
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for d in 0..count as c_int {
        let card = open_global(&runtime).and_then(|lib| Cnrt::new(lib, d)).and_then(|rt| {
            rt.info().map(|info| (rt, DeviceInfo { missing_families: missing.clone(), ..info }))
        });
        match card {
            Ok((rt, info)) => out.push(Device::new(Box::new(rt), info, kernels)),
            Err(why) => failed.push(format!("MLU card {d}: {why}")),
        }
    }
    if out.is_empty() {
        return Err(Error::Runtime(failed.join("; ")));
    }
    for why in failed {
        log::warn!("{why}; that card is not used");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{open_global, open_kernels, runtime_path_in};
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
    use std::ffi::c_int;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// Compiles C `source` into the shared library `dir/name` with the system `cc`.
    fn shared_library(dir: &Path, name: &str, source: &str) -> PathBuf {
        let c = dir.join(name).with_extension("c");
        std::fs::write(&c, source).unwrap();
        let lib = dir.join(name);
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&c)
            .output()
            .expect("cc runs");
        assert!(out.status.success(), "cc {name}: {}", String::from_utf8_lossy(&out.stderr));
        lib
    }

    /// The load order of `devices` without Cambricon: a stand-in runtime exporting one
    /// function, and a stand-in kernel library that calls it but is not linked against it.
    #[test]
    fn the_kernel_library_resolves_runtime_symbols_through_the_global_runtime() {
        let dir =
            std::env::temp_dir().join(format!("mlu-ep-cnrt-load-order-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runtime = shared_library(
            &dir,
            "libmluep_fake_cnrt.so",
            "int mluep_fake_cnrt_call(int x) { return x + 40; }\n",
        );
        let kernels = shared_library(
            &dir,
            "libmluep_fake_kernels.so",
            "int mluep_fake_cnrt_call(int);\nint mluep_fake_launch(int x) { return mluep_fake_cnrt_call(x) * 2; }\n",
        );

        // Control: the runtime opened RTLD_LOCAL (libloading's default scope) leaves the
        // kernel library's reference unresolved, so its RTLD_NOW open fails.
        {
            // SAFETY: a library of this test with no initialisers.
            let _local =
                unsafe { UnixLibrary::open(Some(&runtime), RTLD_NOW | RTLD_LOCAL) }.unwrap();
            let err = open_kernels(&kernels)
                .expect_err("an RTLD_LOCAL runtime does not serve the kernel library")
                .to_string();
            assert!(err.contains("mluep_fake_cnrt_call"), "{err}");
        }

        let _runtime = open_global(&runtime).unwrap();
        let lib = open_kernels(&kernels).unwrap();
        // SAFETY: the symbol is the C function defined above with this signature.
        let launch =
            unsafe { lib.get::<unsafe extern "C" fn(c_int) -> c_int>(b"mluep_fake_launch\0") }
                .unwrap();
        // SAFETY: a plain C function of an int.
        assert_eq!(unsafe { launch(1) }, 82);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_runtime_is_taken_from_neuware_home_when_it_has_one() {
        let home = std::env::temp_dir().join(format!("mlu-ep-neuware-home-{}", std::process::id()));
        std::fs::create_dir_all(home.join("lib64")).unwrap();
        // Without the library there, the loader's search (LD_LIBRARY_PATH, ld.so.cache).
        assert_eq!(runtime_path_in(Some(home.as_os_str())), "libcnrt.so");
        assert_eq!(runtime_path_in(None), "libcnrt.so");
        std::fs::write(home.join("lib64/libcnrt.so"), b"").unwrap();
        assert_eq!(
            runtime_path_in(Some(home.as_os_str())),
            home.join("lib64/libcnrt.so").as_os_str()
        );
        let _ = std::fs::remove_dir_all(&home);
    }
}
