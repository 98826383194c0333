//! The MLU runtime: device memory, queues and the BANG kernels' launch entries, behind one
//! code path for the two kinds of card:
//! - a real Cambricon card, through `libcnrt.so` and the cncc-built kernel library, both
//!   opened with libloading ([`cnrt`]); no MLU hardware has ever run this path;
//! - the emulated card: the same kernel sources compiled for the host against
//!   kernels/emulator ([`emulator`]).
//!
//! This is the device runtime only: it knows no operator (the operators' side of the card,
//! `BangOperator`, is `crate::ops::device`); the kernels' launch entries are its ABI table.

pub mod cnrt;
pub mod emulator;
mod traffic;

use traffic::Counters;
pub use traffic::Traffic;

use crate::error::{Error, Result};

use std::ffi::c_void;
use std::sync::Arc;

/// An opaque runtime queue handle (cnrtQueue_t / MluEmuQueue*).
pub type QueuePtr = *mut c_void;

/// Direction of a host/device copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// What the kernels' host policy needs to know about a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub arch: String,
    pub emulated: bool,
    pub clusters: u32,
    pub cores_per_cluster: u32,
    pub nram_bytes: u64,
    pub nram_reserved_bytes: u64,
    /// The kernel families this card cannot launch, each with why (cncc failed on it when
    /// the kernel library was built, or the library lacks an entry of it): the card paths
    /// that need one decline (src/ops/device/, `NodePath::families`).
    pub missing_families: Vec<(String, String)>,
}

impl DeviceInfo {
    pub fn cores(&self) -> u32 {
        self.clusters * self.cores_per_cluster
    }

    /// NRAM per core a kernel may use: the card's less what its runtime keeps for the stack
    /// (MLU-OPS's `MAX_NRAM_SIZE`, see [`NRAM_RESERVED_BYTES`]).
    pub fn kernel_nram(&self) -> usize {
        usize::try_from(self.nram_bytes.saturating_sub(self.nram_reserved_bytes))
            .unwrap_or(usize::MAX)
    }

    /// `Ok` when this card can launch every kernel family of `families`, else the decline.
    pub fn has_families(&self, families: &[&str]) -> Result<()> {
        for f in families {
            if let Some((_, why)) = self.missing_families.iter().find(|(m, _)| m == f) {
                return Err(Error::declined(format!(
                    "needs the BANG kernel family {f}, which this card's kernel library lacks: {why}"
                )));
            }
        }
        Ok(())
    }
}

/// NRAM per core that cncc keeps for the stack: REM_FOR_STACK of mlu-ops kernels/kernel.h:67
/// (tag v1.4.0). MLU-OPS subtracts it from the card's NRAM (`MAX_NRAM_SIZE`, same file;
/// core/context.cpp:279 for the host-side bounds), and so does torch_mlu's getDeviceAttr
/// from cnrtAttrNramSizePerMcore (torch_mlu/csrc/framework/core/device.cpp, branch
/// r1.22_pt2.1.0, commit d578002: `rem_for_stack = 128 * 1024`).
pub const NRAM_RESERVED_BYTES: u64 = 128 * 1024;

/// The NRAM budget every kernel of kernels/ is built for (kernels/common/kernel.h:
/// BANG_NRAM_BUDGET; a test pins the two together): a 768 KiB core less the stack.
pub const NRAM_BUDGET: usize = 768 * 1024 - NRAM_RESERVED_BYTES as usize;

/// BANG task types (cnrtFunctionType_t values of CNRT 6.x cnrt.h).
pub const TASK_BLOCK: i32 = 1;
pub const TASK_UNION1: i32 = 4;
pub const TASK_UNION2: i32 = 8;

/// The calls a card's runtime offers. Every pointer is a device address of that runtime.
pub trait Runtime: Send + Sync {
    fn malloc(&self, bytes: usize) -> Result<*mut c_void>;
    /// # Safety
    /// `ptr` came from `malloc` of this runtime and is not used afterwards.
    unsafe fn free(&self, ptr: *mut c_void) -> Result<()>;
    /// # Safety
    /// Host pointers are valid for `bytes`; device pointers belong to this runtime.
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        dir: Direction,
    ) -> Result<()>;
    /// # Safety
    /// `dst` is a device pointer of this runtime, valid for `bytes`.
    unsafe fn memset(&self, dst: *mut c_void, value: u8, bytes: usize) -> Result<()>;
    fn queue_create(&self) -> Result<QueuePtr>;
    /// # Safety
    /// `q` came from `queue_create` and was not destroyed.
    unsafe fn queue_sync(&self, q: QueuePtr) -> Result<()>;
    /// # Safety
    /// `q` came from `queue_create` and is not used afterwards.
    unsafe fn queue_destroy(&self, q: QueuePtr) -> Result<()>;
    /// The message of a failed launch's return code.
    fn launch_error(&self, code: i32) -> String;
    /// Makes this card the calling thread's current device (before a kernel launch).
    fn bind_thread(&self) -> Result<()>;
    /// GDRAM bytes (read, written) by kernels so far, where the runtime can see them.
    fn kernel_traffic(&self) -> Option<(u64, u64)> {
        None
    }
}

/// The launch entries of one kernel family's header kernels/<family>/<family>.h, as a table of
/// function pointers generated from that header by build.rs (build_support/abi.rs).
pub trait KernelTable: Sized {
    /// The host builds linked into this library (the emulated card).
    fn linked() -> Self;
    /// The cncc builds, from the device kernel library.
    fn load(lib: &libloading::Library) -> Result<Self>;
}

/// The symbol `name` of a loaded library (`library` names it in the error), as `F`: the
/// one lookup of the runtime, the kernel library and MLU-OPS.
///
/// # Safety
/// `F` is the symbol's C type (a function pointer type of its C signature), or a data pointer
/// that is only compared.
pub(crate) unsafe fn symbol<F: Copy>(
    lib: &libloading::Library,
    library: &str,
    name: &str,
) -> Result<F> {
    // SAFETY: the caller's contract: `F` is the symbol's type.
    let sym = unsafe { lib.get::<F>(name.as_bytes()) };
    sym.map(|s| *s).map_err(|e| {
        Error::Runtime(format!("{library} lacks {}: {e}", name.trim_end_matches('\0')))
    })
}

/// The name the kernel library's errors give it.
pub(crate) const KERNEL_LIBRARY: &str = "MLU kernel library";

/// Whether the kernel library exports `name` (its launch entries are checked at load).
pub(crate) fn has_entry(lib: &libloading::Library, name: &str) -> Result<()> {
    // SAFETY: the symbol is only looked up, its address read as a data pointer and dropped.
    unsafe { symbol::<*const c_void>(lib, KERNEL_LIBRARY, name) }.map(drop)
}

/// A family's generated ABI (structs and `KernelTable`) as the module `abi`, in the family's
/// folder: `crate::mlu::kernel_abi!("sparse_conv");`.
macro_rules! kernel_abi {
    ($family:literal) => {
        /// The C ABI of this family's kernels/<family>/<family>.h, generated by build.rs.
        pub mod abi {
            include!(concat!(env!("OUT_DIR"), "/kernels/", $family, ".rs"));
        }
    };
}
pub(crate) use kernel_abi;

// The value checks' kernels serve every operator: kernels/check/check.h.
kernel_abi!("check");

include!(concat!(env!("OUT_DIR"), "/kernels/entries.rs"));

/// Where a card's launch entries are.
#[derive(Clone, Copy)]
pub enum KernelCode {
    /// Linked into this library (the emulated card).
    Linked,
    /// The cncc-built library, loaded for the life of the process.
    Library(&'static libloading::Library),
}

unsafe extern "C" {
    fn bang_nram_budget() -> u64;
}

/// The kernel library's NRAM budget (what kernels/common/kernel.h was built with).
pub fn kernel_nram_budget() -> usize {
    // SAFETY: a constant getter without arguments.
    unsafe { bang_nram_budget() as usize }
}

/// One card: its runtime, description and kernels.
pub struct Device {
    runtime: Box<dyn Runtime>,
    pub info: DeviceInfo,
    code: KernelCode,
    counters: Counters,
    /// Unique in this process for the process's life (never reused, unlike an address).
    pub id: u64,
}

impl Device {
    pub fn new(runtime: Box<dyn Runtime>, info: DeviceInfo, code: KernelCode) -> Arc<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(Device { runtime, info, code, counters: Counters::default(), id })
    }

    /// One family's launch entries on this card.
    pub fn kernels<T: KernelTable>(&self) -> Result<T> {
        match self.code {
            KernelCode::Linked => Ok(T::linked()),
            KernelCode::Library(lib) => T::load(lib),
        }
    }

    /// The emulated card (kernels/ compiled for the host).
    pub fn emulated() -> Result<Arc<Self>> {
        emulator::device()
    }

    /// Device memory of `bytes` bytes (no allocation for 0 bytes: a null buffer).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<Buffer> {
        let ptr = if bytes == 0 { std::ptr::null_mut() } else { self.runtime.malloc(bytes)? };
        Ok(Buffer { ptr, bytes, device: Arc::clone(self) })
    }

    /// As [`Self::alloc`], the buffer kept in `keep` (freed with it); its address.
    pub fn alloc_kept(
        self: &Arc<Self>,
        bytes: usize,
        keep: &mut Vec<Buffer>,
    ) -> Result<*mut c_void> {
        let buf = self.alloc(bytes)?;
        let ptr = buf.ptr();
        keep.push(buf);
        Ok(ptr)
    }

    pub fn upload<T: Copy>(self: &Arc<Self>, data: &[T]) -> Result<Buffer> {
        let buf = self.alloc(size_of_val(data))?;
        if buf.bytes > 0 {
            // SAFETY: `data` is valid for its byte size; `buf` is a fresh device buffer of it.
            unsafe {
                self.memcpy(buf.ptr, data.as_ptr().cast(), buf.bytes, Direction::HostToDevice)?
            };
        }
        Ok(buf)
    }

    /// Copies the whole buffer into `out` (whose byte size must match).
    pub fn download<T: Copy>(&self, buf: &Buffer, out: &mut [T]) -> Result<()> {
        if size_of_val(out) != buf.bytes {
            return Err(Error::Runtime(format!(
                "MLU download: buffer of {} bytes into host memory of {}",
                buf.bytes,
                size_of_val(out)
            )));
        }
        if buf.bytes > 0 {
            // SAFETY: `out` is valid for `buf.bytes` bytes, `buf` is a live device buffer.
            unsafe {
                self.memcpy(out.as_mut_ptr().cast(), buf.ptr, buf.bytes, Direction::DeviceToHost)?
            };
        }
        Ok(())
    }

    /// Zeroes `bytes` bytes at device address `ptr`.
    ///
    /// # Safety
    /// `ptr` is device memory of this card valid for `bytes` bytes.
    pub unsafe fn zero_raw(&self, ptr: *mut c_void, bytes: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.fill_raw(ptr, 0, bytes) }
    }

    /// Sets each of `bytes` bytes at device address `ptr` to `value`.
    ///
    /// # Safety
    /// `ptr` is device memory of this card valid for `bytes` bytes.
    pub unsafe fn fill_raw(&self, ptr: *mut c_void, value: u8, bytes: usize) -> Result<()> {
        if bytes > 0 {
            Counters::add(&self.counters.memset, bytes);
            // SAFETY: forwarded contract.
            unsafe { self.runtime.memset(ptr, value, bytes)? };
        }
        Ok(())
    }

    /// Copies `bytes` bytes between host and device memory of this card.
    ///
    /// # Safety
    /// Both pointers are valid for `bytes` bytes on the sides `dir` names.
    pub unsafe fn copy_raw(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        dir: Direction,
    ) -> Result<()> {
        if bytes > 0 {
            // SAFETY: forwarded contract.
            unsafe { self.memcpy(dst, src, bytes, dir)? };
        }
        Ok(())
    }

    /// The card's traffic counters now ([`Traffic::since`] gives a span's).
    pub fn traffic(&self) -> Traffic {
        self.counters.snapshot(self.runtime.kernel_traffic())
    }

    /// Every copy goes through here, to be counted.
    ///
    /// # Safety
    /// As [`Runtime::memcpy`].
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        dir: Direction,
    ) -> Result<()> {
        let c = &self.counters;
        let counter = match dir {
            Direction::HostToDevice => &c.host_to_card,
            Direction::DeviceToHost => &c.card_to_host,
            Direction::DeviceToDevice => &c.card_to_card,
        };
        Counters::add(counter, bytes);
        // SAFETY: forwarded contract.
        unsafe { self.runtime.memcpy(dst, src, bytes, dir) }
    }

    /// Makes this card the calling thread's current device (before a library call that
    /// takes it, such as `mluOpCreate`).
    pub fn bind_thread(&self) -> Result<()> {
        self.runtime.bind_thread()
    }

    pub fn queue(self: &Arc<Self>) -> Result<Queue> {
        Ok(Queue { ptr: self.runtime.queue_create()?, device: Arc::clone(self) })
    }
}

/// Device memory, freed on drop.
pub struct Buffer {
    ptr: *mut c_void,
    bytes: usize,
    device: Arc<Device>,
}

// SAFETY: a device address is plain data; the runtimes are thread-safe.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn ptr<T>(&self) -> *mut T {
        self.ptr.cast()
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated by this device's runtime and dropped once.
            if let Err(e) = unsafe { self.device.runtime.free(self.ptr) } {
                log::error!("MLU free failed: {e}");
            }
        }
    }
}

/// A device queue, synchronised and destroyed on drop.
pub struct Queue {
    ptr: QueuePtr,
    device: Arc<Device>,
}

// SAFETY: runtime queues may be used from any thread, one at a time (we hold &self).
unsafe impl Send for Queue {}

impl Queue {
    pub fn ptr(&self) -> QueuePtr {
        self.ptr
    }

    /// The card this queue belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
    /// Waits for everything enqueued; a kernel failure (an emulator rule violation names
    /// kernel, task and source line) comes back here.
    pub fn sync(&self) -> Result<()> {
        Counters::add(&self.device.counters.syncs, 1);
        // SAFETY: a live queue of this device.
        unsafe { self.device.runtime.queue_sync(self.ptr) }
    }

    /// Launches on this queue from the calling thread: binds the card to the thread first
    /// (the runtime's current device is per thread), then `enqueue` calls a launch entry
    /// with the queue and returns its code.
    pub fn launch(&self, kernel: &str, enqueue: impl FnOnce(QueuePtr) -> i32) -> Result<()> {
        self.device.runtime.bind_thread()?;
        Counters::add(&self.device.counters.launches, 1);
        self.launched(kernel, enqueue(self.ptr))
    }

    /// Turns the return code of a launch on this queue into a result naming the kernel. On
    /// failure it first waits for the queue: kernels enqueued before may still use
    /// workspace buffers that the caller's early return is about to free.
    pub fn launched(&self, kernel: &str, code: i32) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let error = self.device.runtime.launch_error(code);
        let _ = self.sync();
        Err(Error::Runtime(format!("MLU launch of {kernel} failed (code {code}): {error}")))
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: created by this runtime, destroyed once.
        if let Err(e) = unsafe { self.device.runtime.queue_destroy(self.ptr) } {
            log::error!("MLU queue destroy failed: {e}");
        }
    }
}

/// A task dimension for `units` work items on a UNION1 launch: all cores of the card,
/// fewer clusters when there is too little work.
pub fn union1_tasks(info: &DeviceInfo, units: usize) -> u32 {
    let per = info.cores_per_cluster.max(1) as usize;
    let clusters = units.div_ceil(per).clamp(1, info.clusters.max(1) as usize);
    (clusters * per) as u32
}

#[cfg(test)]
mod tests {
    use super::DeviceInfo;
    use crate::error::Error;

    #[test]
    fn a_missing_kernel_family_declines_only_the_paths_that_need_it() {
        let info = DeviceInfo {
            arch: "MLU (cnrt)".into(),
            emulated: false,
            clusters: 2,
            cores_per_cluster: 4,
            nram_bytes: 768 * 1024,
            nram_reserved_bytes: super::NRAM_RESERVED_BYTES,
            missing_families: vec![(
                "family_b".into(),
                "cncc failed on it when this library was built: b.mlu:7:3: error: x".into(),
            )],
        };
        assert!(info.has_families(&["check", "family_a"]).is_ok());
        match info.has_families(&["check", "family_b"]) {
            Err(Error::Declined(why)) => assert!(
                why.contains("BANG kernel family family_b") && why.contains("b.mlu:7:3: error: x"),
                "{why}"
            ),
            other => panic!("expected a decline, got {other:?}"),
        }
    }
}
