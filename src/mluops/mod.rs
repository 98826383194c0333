//! Cambricon's MLU-OPS library (`libmluops.so`), the preferred card backend: opened at run
//! time with libloading (never linked), its version checked against the API these bindings
//! were written from, handles pooled per library, tensor and sparse-convolution descriptors
//! owned by Rust values, every `mluOpStatus_t` turned into an [`Error`] naming the call and
//! the status. Like `crate::mlu` this is a runtime binding: what each operator calls, and
//! when, is the operator's (`ops/<family>/mluops.rs`).
//!
//! Every declaration below was read from `mlu_op.h` of Cambricon/mlu-ops at tag v1.4.0 (the
//! last that builds for MLU370) and compared with v1.9.1 (identical); the line of each is in
//! docs/MLUOPS_BINDING.md. Nothing of the header is copied: the types are written from those
//! facts.

use crate::error::{Error, Result};
use crate::mlu::{Device, Queue, QueuePtr};
use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

/// A C enum of the header as the Rust side uses it: its name and the (C name, value) of each
/// value used (tests/mluops_header.rs static_asserts them against `mlu_op.h`).
#[derive(Debug, Clone, Copy)]
pub struct CEnum {
    pub name: &'static str,
    pub values: &'static [(&'static str, i32)],
}

/// `mluOpStatus_t` (mlu_op.h v1.4.0:64-94).
pub type Status = c_int;
pub const SUCCESS: Status = 0;
/// A parameter the library's checks reject (the emulated library's descriptor mismatches).
pub const BAD_PARAM: Status = 3;
/// A failure inside the library (the emulated library's caught panics).
pub const INTERNAL_ERROR: Status = 4;
/// A kernel that failed (the emulated library's index values out of range).
pub const EXECUTION_FAILED: Status = 6;
/// A scale limitation the library reports from its parameter checks.
pub const NOT_SUPPORTED: Status = 7;

/// Every `mluOpStatus_t` value, by its C name.
pub const STATUS: CEnum = CEnum {
    name: "mluOpStatus_t",
    values: &[
        ("MLUOP_STATUS_SUCCESS", SUCCESS),
        ("MLUOP_STATUS_NOT_INITIALIZED", 1),
        ("MLUOP_STATUS_ALLOC_FAILED", 2),
        ("MLUOP_STATUS_BAD_PARAM", BAD_PARAM),
        ("MLUOP_STATUS_INTERNAL_ERROR", INTERNAL_ERROR),
        ("MLUOP_STATUS_ARCH_MISMATCH", 5),
        ("MLUOP_STATUS_EXECUTION_FAILED", EXECUTION_FAILED),
        ("MLUOP_STATUS_NOT_SUPPORTED", NOT_SUPPORTED),
        ("MLUOP_STATUS_NUMERICAL_OVERFLOW", 8),
    ],
};

/// A Rust enum passed by value where the header has the C enum `$c`: each variant names its
/// C value; `$name::C` lists them.
macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident = $c:literal { $($v:ident = $cv:ident = $n:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(i32)]
        pub enum $name {
            $($v = $n,)*
        }

        impl $name {
            pub const C: CEnum = CEnum { name: $c, values: &[$((stringify!($cv), $name::$v as i32)),*] };
        }

        impl CAbi for $name {
            type C = c_int;
        }
    };
}

c_enum! {
    /// `mluOpDataType_t` values (mlu_op.h v1.4.0:170-178).
    DType = "mluOpDataType_t" {
        Half = MLUOP_DTYPE_HALF = 1,
        Float = MLUOP_DTYPE_FLOAT = 2,
        Int32 = MLUOP_DTYPE_INT32 = 6,
    }
}

c_enum! {
    /// `mluOpTensorLayout_t` values (mlu_op.h v1.4.0:116-140).
    Layout = "mluOpTensorLayout_t" {
        Nhwc = MLUOP_LAYOUT_NHWC = 1,
        Array = MLUOP_LAYOUT_ARRAY = 4,
    }
}

c_enum! {
    /// `mluOpReduceMode_t` values (mlu_op.h v1.4.0:362-365).
    ReduceMode = "mluOpReduceMode_t" {
        Max = MLUOP_REDUCE_DMAX = 2,
    }
}

/// A type of the `functions!` table as C passes it: the type itself, but `int` for an enum
/// (a C library takes any `int` where the header has an enum, which no Rust enum can hold).
/// [`exports`] spells each function's type with it.
pub trait CAbi {
    type C;
}

/// The types of the `functions!` table that C passes as they are.
macro_rules! c_abi_as_is {
    ($($t:ty),*) => {
        $(impl CAbi for $t {
            type C = $t;
        })*
    };
}

c_abi_as_is!(c_int, *mut c_int, *const c_int, f32, i64, *const i64, usize, *mut usize);
c_abi_as_is!(*const c_char, *const c_void, *mut c_void, *mut *mut c_void);

/// The enums above with their C names and values.
pub const ENUMS: &[CEnum] = &[STATUS, DType::C, Layout::C, ReduceMode::C];

/// `mluOpHandle_t`, `mluOpTensorDescriptor_t`, `mluOpSparseConvolutionDescriptor_t`:
/// pointers to structs the library defines (mlu_op.h v1.4.0:404, 889, 1161).
pub type HandlePtr = *mut c_void;
pub type TensorDescPtr = *mut c_void;
pub type SparseConvDescPtr = *mut c_void;

/// The first and last MLU-OPS versions whose declarations of every function below these
/// bindings were checked against (docs/MLUOPS_BINDING.md): 1.4.0 and 1.9.1.
pub const OLDEST: (i32, i32, i32) = (1, 4, 0);
pub const NEWEST: (i32, i32) = (1, 9);

/// The C spelling of each Rust type the `functions!` table may use, as the table spells it
/// (aliases kept: `HandlePtr` and `TensorDescPtr` are both `*mut c_void` to Rust, not to C).
/// A type missing here stops the build (`c_type`); "" is no return value.
pub const C_TYPES: &[(&str, &str)] = &[
    ("", "void"),
    ("Status", "mluOpStatus_t"),
    ("DType", "mluOpDataType_t"),
    ("Layout", "mluOpTensorLayout_t"),
    ("ReduceMode", "mluOpReduceMode_t"),
    ("HandlePtr", "mluOpHandle_t"),
    ("*mut HandlePtr", "mluOpHandle_t*"),
    ("TensorDescPtr", "mluOpTensorDescriptor_t"),
    ("*mut TensorDescPtr", "mluOpTensorDescriptor_t*"),
    ("SparseConvDescPtr", "mluOpSparseConvolutionDescriptor_t"),
    ("*mut SparseConvDescPtr", "mluOpSparseConvolutionDescriptor_t*"),
    ("QueuePtr", "cnrtQueue_t"),
    ("c_int", "int"),
    ("*mut c_int", "int*"),
    ("*const c_int", "const int*"),
    ("f32", "float"),
    ("i64", "int64_t"),
    ("*const i64", "const int64_t*"),
    ("usize", "size_t"),
    ("*mut usize", "size_t*"),
    ("*const c_char", "const char*"),
    ("*const c_void", "const void*"),
    ("*mut c_void", "void*"),
];

/// The C spelling of the Rust type spelled `rust` (see [`C_TYPES`]); evaluated at compile
/// time for the `functions!` table, so a type without one is a build error.
pub const fn c_type(rust: &str) -> &'static str {
    let mut i = 0;
    while i < C_TYPES.len() {
        if C_TYPES[i].0.len() == rust.len() {
            let (a, b) = (C_TYPES[i].0.as_bytes(), rust.as_bytes());
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return C_TYPES[i].1;
            }
        }
        i += 1;
    }
    panic!("a type of the mluops functions! table has no C spelling in mluops::C_TYPES")
}

/// A parameter or return type of a bound function: the Rust type as declared, its C
/// spelling and its size in bytes (0 for no return value).
#[derive(Debug, Clone, Copy)]
pub struct CType {
    pub rust: &'static str,
    pub c: &'static str,
    pub size: usize,
}

impl CType {
    const fn of(rust: &'static str, size: usize) -> CType {
        CType { rust, c: c_type(rust), size }
    }
}

/// A bound function's C type as the Rust side declares it.
#[derive(Debug, Clone, Copy)]
pub struct Signature {
    pub name: &'static str,
    pub ret: CType,
    pub params: &'static [CType],
}

macro_rules! functions {
    ($($name:ident ( $($ty:ty),* ) $(-> $ret:ty)?;)*) => {
        /// Each function below with its C type, from the same declarations:
        /// tests/mluops_header.rs static_asserts them against `mlu_op.h`.
        pub const SIGNATURES: &[Signature] = &[
            $(Signature {
                name: stringify!($name),
                ret: CType::of(concat!("" $(, stringify!($ret))?), 0 $(+ size_of::<$ret>())?),
                params: &[$(CType::of(stringify!($ty), size_of::<$ty>())),*],
            },)*
        ];

        /// Each function's type as the library exports it, its enums as C's `int`
        /// ([`CAbi`]): the emulated library (mluops_emulated/) asserts each of its exports
        /// has it, so that these declarations are the one source of its signatures.
        #[allow(non_camel_case_types)]
        pub mod exports {
            use super::*;
            $(pub type $name = unsafe extern "C" fn($(<$ty as CAbi>::C),*) $(-> <$ret as CAbi>::C)?;)*
        }

        /// The library's functions, each resolved once when the library is opened.
        #[allow(non_snake_case)]
        pub struct Functions {
            $(pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl Functions {
            fn load(lib: &libloading::Library) -> Result<Self> {
                Ok(Functions {
                    $($name: {
                        // SAFETY: the symbol's C type is the one declared here, from the
                        // header of the versions accepted (checked after loading).
                        unsafe {
                            crate::mlu::symbol::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(lib, "it", concat!(stringify!($name), "\0"))
                        }?
                    },)*
                })
            }
        }
    };
}

functions! {
    mluOpGetLibVersion(*mut c_int, *mut c_int, *mut c_int);
    mluOpGetErrorString(Status) -> *const c_char;
    mluOpCreate(*mut HandlePtr) -> Status;
    mluOpDestroy(HandlePtr) -> Status;
    mluOpSetQueue(HandlePtr, QueuePtr) -> Status;
    mluOpCreateTensorDescriptor(*mut TensorDescPtr) -> Status;
    mluOpSetTensorDescriptor(TensorDescPtr, Layout, DType, c_int, *const c_int) -> Status;
    mluOpDestroyTensorDescriptor(TensorDescPtr) -> Status;
    mluOpCreateSparseConvolutionDescriptor(*mut SparseConvDescPtr) -> Status;
    mluOpSetSparseConvolutionDescriptor(SparseConvDescPtr, c_int, c_int, *const c_int, *const c_int, *const c_int,
        *const c_int, *const c_int, *const c_int, c_int, c_int, c_int) -> Status;
    mluOpGetSparseConvolutionNumActOut(SparseConvDescPtr, *mut c_int) -> Status;
    mluOpDestroySparseConvolutionDescriptor(SparseConvDescPtr) -> Status;
    mluOpGetDynamicPointToVoxelBackwardWorkspaceSize(HandlePtr, ReduceMode, TensorDescPtr, TensorDescPtr, TensorDescPtr,
        TensorDescPtr, TensorDescPtr, TensorDescPtr, *mut usize) -> Status;
    mluOpDynamicPointToVoxelBackward(HandlePtr, ReduceMode, TensorDescPtr, *const c_void, TensorDescPtr, *const c_void,
        TensorDescPtr, *const c_void, TensorDescPtr, *const c_void, TensorDescPtr, *const c_void, TensorDescPtr,
        *const c_void, *mut c_void, usize, TensorDescPtr, *mut c_void) -> Status;
    mluOpThreeInterpolateForward(HandlePtr, TensorDescPtr, *const c_void, TensorDescPtr, *const c_void,
        TensorDescPtr, *const c_void, TensorDescPtr, *mut c_void) -> Status;
    mluOpThreeInterpolateBackward(HandlePtr, TensorDescPtr, *const c_void, TensorDescPtr, *const c_void,
        TensorDescPtr, *const c_void, TensorDescPtr, *mut c_void) -> Status;
    mluOpGetIndicePairsWorkspaceSize(HandlePtr, SparseConvDescPtr, TensorDescPtr, TensorDescPtr, TensorDescPtr,
        TensorDescPtr, *mut usize) -> Status;
    mluOpGetIndicePairs(HandlePtr, SparseConvDescPtr, TensorDescPtr, *const c_void, *mut c_void, usize,
        TensorDescPtr, *mut c_void, TensorDescPtr, *mut c_void, TensorDescPtr, *mut c_void) -> Status;
    mluOpGetIndiceConvolutionForwardWorkspaceSize(HandlePtr, TensorDescPtr, TensorDescPtr, TensorDescPtr, TensorDescPtr,
        *const i64, i64, i64, i64, *mut usize) -> Status;
    mluOpIndiceConvolutionForward(HandlePtr, TensorDescPtr, *const c_void, TensorDescPtr, *const c_void, TensorDescPtr,
        *const c_void, *const i64, i64, i64, i64, *mut c_void, usize, TensorDescPtr, *mut c_void) -> Status;
    mluOpVoxelPoolingForward(HandlePtr, c_int, c_int, c_int, c_int, c_int, c_int, TensorDescPtr, *const c_void,
        TensorDescPtr, *const c_void, TensorDescPtr, *mut c_void, TensorDescPtr, *mut c_void) -> Status;
    mluOpPsRoiPoolForward(HandlePtr, c_int, c_int, f32, c_int, c_int, TensorDescPtr, *const c_void, TensorDescPtr,
        *const c_void, TensorDescPtr, *mut c_void, TensorDescPtr, *mut c_void) -> Status;
    mluOpPsRoiPoolBackward(HandlePtr, c_int, c_int, f32, c_int, TensorDescPtr, *const c_void, TensorDescPtr,
        *const c_void, TensorDescPtr, *const c_void, TensorDescPtr, *mut c_void) -> Status;
}

/// One opened MLU-OPS library of an accepted version, and its idle handles.
pub struct Library {
    pub f: Functions,
    pub path: String,
    pub version: (i32, i32, i32),
    /// Handles not in use, per card (keyed by the card's `Device::id`: `mluOpCreate` binds a
    /// handle to the thread's current card). A handle must not be used by two threads at
    /// once (MLU-OPS docs/user_guide thread_safety.rst): each call takes one and gives it back.
    idle: Mutex<Vec<(u64, Handle)>>,
    /// Each card's probe ([`Library::probe`]): `Ok` or why this library cannot serve it.
    probes: Mutex<HashMap<u64, Result<()>>>,
    _lib: libloading::Library,
}

/// An `mluOpHandle_t` of one library.
struct Handle(HandlePtr);

// SAFETY: a handle is used by one thread at a time (taken from the idle list by one call).
unsafe impl Send for Handle {}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MLU-OPS {}.{}.{} ({})",
            self.version.0, self.version.1, self.version.2, self.path
        )
    }
}

/// The last MLU-OPS minor version whose default build compiles for each card architecture
/// (`mtp_` name), from Cambricon/mlu-ops CMakeLists.txt `--bang-mlu-arch`: mtp_372 is listed
/// at v1.5.2 (:142) and no longer at v1.6.0 (:142-143 name mtp_592 and mtp_613 only).
pub const NEWEST_FOR_ARCH: &[(&str, (i32, i32))] = &[("mtp_372", (1, 5))];

/// The card's architecture as an `mtp_` name: the one its description names (the emulated
/// MLU370), else, for a card of the Cambricon runtime, the one this build's kernel library
/// was compiled for (build.rs `--bang-mlu-arch`; the runtime does not report it to us, and a
/// card of another architecture cannot run that library). `None` when neither is known.
pub fn card_arch(info: &crate::mlu::DeviceInfo) -> Option<String> {
    if let Some(at) = info.arch.find("mtp_") {
        let digits = info.arch[at + 4..].chars().take_while(char::is_ascii_digit).count();
        return Some(info.arch[at..at + 4 + digits].to_owned());
    }
    Some(env!("BANG_DEVICE_ARCH").to_owned()).filter(|a| !info.emulated && !a.is_empty())
}

/// Where the library is looked for, in order: `explicit` (the provider option
/// `mluops_library` or `MLU_EP_MLUOPS_LIBRARY`) alone when given; else `$MLUOPS_HOME/lib64`,
/// `$MLUOPS_HOME/build/lib` (a source build's output, mlu-ops CMakeLists.txt:6 at v1.4.0),
/// `$NEUWARE_HOME/lib64` (where the MLU-OPS deb installs it:
/// installer/independent/debian/install:1), then the system's library path; in each, the
/// development name `libmluops.so`, then the soname `libmluops.so.1` (CMakeLists.txt:242-246,
/// `SOVERSION` the major version), which a runtime-only install has alone.
pub fn candidates(explicit: Option<&str>) -> Vec<String> {
    if let Some(p) = explicit.filter(|p| !p.is_empty()) {
        return vec![p.to_owned()];
    }
    let home = |v: &str| std::env::var(v).ok().filter(|h| !h.is_empty());
    let mut dirs = Vec::new();
    if let Some(h) = home("MLUOPS_HOME") {
        dirs.push(format!("{h}/lib64/"));
        dirs.push(format!("{h}/build/lib/"));
    }
    if let Some(h) = home("NEUWARE_HOME") {
        dirs.push(format!("{h}/lib64/"));
    }
    dirs.push(String::new());
    dirs.iter().flat_map(|d| [format!("{d}libmluops.so"), format!("{d}libmluops.so.1")]).collect()
}

/// The library for `card`: the first candidate that loads (RTLD_NOW: a symbol it needs from
/// CNNL or CNRT that is missing fails here, never the process at a first call), exports
/// every function, has a version in [`OLDEST`]..[`NEWEST`], supports the card's
/// architecture, and creates a handle on the card ([`Library::probe`]). Every candidate is
/// tried in order; the error lists each one's failure.
pub fn open(explicit: Option<&str>, card: &Device) -> Result<Arc<Library>> {
    static OPEN: OnceLock<Mutex<HashMap<String, Arc<Library>>>> = OnceLock::new();
    let mut open = OPEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let mut tried = Vec::new();
    for path in candidates(explicit) {
        let lib = match open.get(&path) {
            Some(lib) => Ok(Arc::clone(lib)),
            None => load(&path).map(|lib| {
                let lib = Arc::new(lib);
                open.insert(path.clone(), Arc::clone(&lib));
                lib
            }),
        };
        match lib.and_then(|lib| lib.probe(card).map(|()| lib)) {
            Ok(lib) => {
                if !tried.is_empty() {
                    log::info!(
                        "{lib:?} serves MLU card {}; passed over: {}",
                        card.id,
                        tried.join("; ")
                    );
                }
                return Ok(lib);
            }
            Err(e) => tried.push(format!("{path}: {e}")),
        }
    }
    Err(Error::Runtime(format!(
        "no usable MLU-OPS library (tried, in order: {}; set MLUOPS_HOME or NEUWARE_HOME, or name the file with the provider option mluops_library)",
        tried.join("; ")
    )))
}

/// Opens `path` and checks its functions and version (the card-independent part of [`open`]).
fn load(path: &str) -> Result<Library> {
    // SAFETY: loading runs the library's initialisers; MLU-OPS (or its stand-in) is a
    // plain shared library of C functions.
    let lib = unsafe { UnixLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
        .map(libloading::Library::from)
        .map_err(|e| Error::Runtime(e.to_string()))?;
    let f = Functions::load(&lib)?;
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    unsafe { (f.mluOpGetLibVersion)(&mut major, &mut minor, &mut patch) };
    if (major, minor, patch) < OLDEST || (major, minor) > NEWEST {
        return Err(Error::Runtime(format!(
            "it is MLU-OPS {major}.{minor}.{patch}; this provider is bound to the API of {}.{}.{} to {}.{}.x",
            OLDEST.0, OLDEST.1, OLDEST.2, NEWEST.0, NEWEST.1
        )));
    }
    Ok(Library {
        f,
        path: path.to_owned(),
        version: (major, minor, patch),
        idle: Mutex::new(Vec::new()),
        probes: Mutex::new(HashMap::new()),
        _lib: lib,
    })
}

impl Library {
    /// `Err` naming `call` and the status unless `s` is success.
    pub fn check(&self, call: &str, s: Status) -> Result<()> {
        if s == SUCCESS {
            return Ok(());
        }
        // SAFETY: mluOpGetErrorString takes any status and returns a static string or null.
        let text = unsafe { (self.f.mluOpGetErrorString)(s) };
        let text = if text.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null result is a static NUL-terminated string.
            format!(": {}", unsafe { CStr::from_ptr(text) }.to_string_lossy())
        };
        let message = format!("MLU-OPS {call} returned {} ({s}){text}", status_name(s));
        // A scale limitation the binding does not model: the library refuses before it
        // enqueues anything (its parameter checks come first), so the next path runs the node.
        if s == NOT_SUPPORTED {
            Err(Error::Declined(message))
        } else {
            Err(Error::Runtime(message))
        }
    }

    /// Whether this library serves `card`, decided once per card: the card's architecture
    /// within the versions that build for it ([`NEWEST_FOR_ARCH`]), then `mluOpCreate` on the
    /// card (it returns NOT_INITIALIZED when its CNRT/CNDRV version check fails: mlu-ops
    /// core/context.cpp:161-167 at v1.4.0); the handle made is kept for the card's calls.
    pub fn probe(&self, card: &Device) -> Result<()> {
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        let result = probes.entry(card.id).or_insert_with(|| self.probe_card(card));
        result.clone()
    }

    fn probe_card(&self, card: &Device) -> Result<()> {
        let (major, minor, patch) = self.version;
        let arch = card_arch(&card.info).ok_or_else(|| {
            Error::Runtime(format!("the architecture of card '{}' is unknown, so MLU-OPS {major}.{minor}.{patch} cannot be checked to support it", card.info.arch))
        })?;
        if let Some((_, newest)) = NEWEST_FOR_ARCH.iter().find(|(a, _)| *a == arch)
            && (major, minor) > *newest
        {
            return Err(Error::Runtime(format!(
                "MLU-OPS {major}.{minor}.{patch} does not build for the card's architecture {arch} ({}); {arch} needs MLU-OPS {}.{}.x or older",
                card.info.arch, newest.0, newest.1
            )));
        }
        card.bind_thread()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer; the thread is bound to the card.
        self.check("mluOpCreate", unsafe { (self.f.mluOpCreate)(&mut h) })
            .map_err(|e| Error::Runtime(format!("{e} on card {arch} ({})", card.info.arch)))?;
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push((card.id, Handle(h)));
        Ok(())
    }

    /// Runs `f` with a handle of this library bound to `queue` (the caller's thread must be
    /// bound to the card: `mluOpCreate` takes the thread's current device).
    pub fn with_handle<T>(
        &self,
        queue: &Queue,
        f: impl FnOnce(HandlePtr) -> Result<T>,
    ) -> Result<T> {
        let card = queue.device().id;
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.iter().position(|(c, _)| *c == card).map(|i| idle.swap_remove(i).1)
        };
        let handle = match idle {
            Some(h) => h,
            None => {
                let mut h = std::ptr::null_mut();
                // SAFETY: `h` is a valid out-pointer.
                self.check("mluOpCreate", unsafe { (self.f.mluOpCreate)(&mut h) })?;
                Handle(h)
            }
        };
        // SAFETY: a live handle of this library and the caller's live queue.
        let result = self
            .check("mluOpSetQueue", unsafe { (self.f.mluOpSetQueue)(handle.0, queue.ptr()) })
            .and_then(|()| f(handle.0));
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push((card, handle));
        result
    }

    /// A tensor descriptor of `dims` (each < 2^31: the callers' limits check that first).
    pub fn tensor(&self, layout: Layout, dtype: DType, dims: &[usize]) -> Result<TensorDesc<'_>> {
        let dims: Vec<c_int> = dims
            .iter()
            .map(|&d| {
                c_int::try_from(d).map_err(|_| {
                    Error::Runtime(format!("MLU-OPS tensor dimension {d} exceeds int32"))
                })
            })
            .collect::<Result<_>>()?;
        let mut d = std::ptr::null_mut();
        // SAFETY: `d` is a valid out-pointer.
        self.check("mluOpCreateTensorDescriptor", unsafe {
            (self.f.mluOpCreateTensorDescriptor)(&mut d)
        })?;
        let desc = TensorDesc { lib: self, ptr: d };
        // SAFETY: a descriptor just created; `dims` holds dims.len() ints.
        let s = unsafe {
            (self.f.mluOpSetTensorDescriptor)(d, layout, dtype, dims.len() as c_int, dims.as_ptr())
        };
        self.check("mluOpSetTensorDescriptor", s)?;
        Ok(desc)
    }

    /// A sparse-convolution descriptor (3-D: `dimNb` 5).
    pub fn sparse_conv(&self, p: &SparseConvParams) -> Result<SparseConvDesc<'_>> {
        let mut d = std::ptr::null_mut();
        // SAFETY: `d` is a valid out-pointer.
        self.check("mluOpCreateSparseConvolutionDescriptor", unsafe {
            (self.f.mluOpCreateSparseConvolutionDescriptor)(&mut d)
        })?;
        let desc = SparseConvDesc { lib: self, ptr: d };
        // SAFETY: a descriptor just created; every array holds the three ints of a 3-D
        // convolution.
        let s = unsafe {
            (self.f.mluOpSetSparseConvolutionDescriptor)(
                d,
                5,
                p.batch,
                p.pad.as_ptr(),
                p.stride.as_ptr(),
                p.dilation.as_ptr(),
                p.input.as_ptr(),
                p.filter.as_ptr(),
                p.output.as_ptr(),
                p.sub_m,
                p.transpose,
                p.inverse,
            )
        };
        self.check("mluOpSetSparseConvolutionDescriptor", s)?;
        Ok(desc)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        for (_, h) in self.idle.get_mut().unwrap_or_else(|e| e.into_inner()).drain(..) {
            // SAFETY: a handle of this library, no longer used.
            unsafe { (self.f.mluOpDestroy)(h.0) };
        }
    }
}

/// The name of an `mluOpStatus_t` value.
pub fn status_name(s: Status) -> &'static str {
    STATUS.values.iter().find(|v| v.1 == s).map_or("an unknown mluOpStatus_t", |v| v.0)
}

/// An `mluOpTensorDescriptor_t`, destroyed on drop.
pub struct TensorDesc<'a> {
    lib: &'a Library,
    pub ptr: TensorDescPtr,
}

impl Drop for TensorDesc<'_> {
    fn drop(&mut self) {
        // SAFETY: created by this library, destroyed once.
        unsafe { (self.lib.f.mluOpDestroyTensorDescriptor)(self.ptr) };
    }
}

/// The 3-D sparse convolution `mluOpSetSparseConvolutionDescriptor` describes (arrays in
/// (D, H, W) order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseConvParams {
    pub batch: c_int,
    pub pad: [c_int; 3],
    pub stride: [c_int; 3],
    pub dilation: [c_int; 3],
    pub input: [c_int; 3],
    pub filter: [c_int; 3],
    pub output: [c_int; 3],
    pub sub_m: c_int,
    pub transpose: c_int,
    pub inverse: c_int,
}

/// An `mluOpSparseConvolutionDescriptor_t`, destroyed on drop.
pub struct SparseConvDesc<'a> {
    lib: &'a Library,
    pub ptr: SparseConvDescPtr,
}

impl SparseConvDesc<'_> {
    /// The output site count `mluOpGetIndicePairs` stored in the descriptor.
    pub fn num_act_out(&self) -> Result<usize> {
        let mut n: c_int = -1;
        // SAFETY: a live descriptor and a valid out-pointer.
        self.lib.check("mluOpGetSparseConvolutionNumActOut", unsafe {
            (self.lib.f.mluOpGetSparseConvolutionNumActOut)(self.ptr, &mut n)
        })?;
        usize::try_from(n)
            .map_err(|_| Error::Runtime(format!("MLU-OPS reported num_act_out = {n}")))
    }
}

impl Drop for SparseConvDesc<'_> {
    fn drop(&mut self) {
        // SAFETY: created by this library, destroyed once.
        unsafe { (self.lib.f.mluOpDestroySparseConvolutionDescriptor)(self.ptr) };
    }
}
