//! The MLU runtime: device memory, queues and the BANG kernels' launch entries, behind one
//! code path for the two kinds of card:
//! - a real Cambricon card, through `libcnrt.so` and the cncc-built kernel library, both
//!   opened with libloading ([`cnrt`]); no MLU hardware has ever run this path;
//! - the emulated card: the same kernel sources compiled for the host against
//!   kernels/emulator ([`emulator`]).
//!
//! This is the device runtime only: it knows no operator (the operators' side of the card,
//! `MluOperator`, is `crate::ops::device`); the kernels' launch entries are its ABI table.

pub mod cnrt;
pub mod emulator;
mod traffic;

pub use traffic::Traffic;
use traffic::Counters;

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
}

impl DeviceInfo {
    pub fn cores(&self) -> u32 {
        self.clusters * self.cores_per_cluster
    }
}

/// The NRAM budget every kernel of kernels/ is built for (kernels/common/kernel.h:
/// MLUOPS_NRAM_BUDGET; a test pins the two together).
pub const NRAM_BUDGET: usize = 768 * 1024 - 128 * 1024;

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
    unsafe fn memcpy(&self, dst: *mut c_void, src: *const c_void, bytes: usize, dir: Direction) -> Result<()>;
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

macro_rules! kernels {
    ($($name:ident ( $($arg:ident : $ty:ty),* );)*) => {
        /// Each launch entry's parameters as declared below, (name, Rust type) in order with
        /// the queue first: tests/kernel_abi.rs checks them against kernels/*/*.h.
        pub const KERNEL_SIGNATURES: &[(&str, &[(&str, &str)])] = &[
            $((stringify!($name), &[("queue", "QueuePtr"), $((stringify!($arg), stringify!($ty))),*]),)*
        ];

        /// The launch entries of kernels/, one per BANG kernel sequence: each enqueues on
        /// `queue` and returns 0 or a runtime error code.
        #[derive(Clone, Copy)]
        pub struct Kernels {
            $(pub $name: unsafe extern "C" fn(queue: QueuePtr, $($arg: $ty),*) -> i32,)*
        }

        mod linked {
            use super::QueuePtr;
            unsafe extern "C" {
                $(pub fn $name(queue: QueuePtr, $($arg: $ty),*) -> i32;)*
            }
        }

        impl Kernels {
            /// The host builds linked into this library (the emulated card).
            pub fn emulated() -> Self {
                Kernels { $($name: linked::$name,)* }
            }

            /// The cncc builds, from the device kernel library.
            pub fn load(lib: &libloading::Library) -> Result<Self> {
                Ok(Kernels {
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: the symbol is the launch entry of the same source
                        // compiled by cncc; its C signature is the one declared here.
                        let sym = unsafe { lib.get::<unsafe extern "C" fn(QueuePtr, $($ty),*) -> i32>(name.as_bytes()) };
                        *sym.map_err(|e| Error::Runtime(format!("MLU kernel library lacks {}: {e}", stringify!($name))))?
                    },)*
                })
            }
        }
    };
}

kernels! {
    mluops_voxel_pooling_forward(task_dim: u32, task_type: i32, batches: i32, points: i32, channels: i32,
        nx: i32, ny: i32, nz: i32, tile_points: i32, tile_channels: i32,
        geom: *const i32, feats: *const f32, out: *mut f32, pos_memo: *mut i32);
    mluops_three_interpolate_backward_f32(task_dim: u32, task_type: i32, batches: i32, channels: i32, n_points: i32,
        m_points: i32, mo: i32, no: i32, co: i32,
        grad_output: *const f32, indices: *const i32, weights: *const f32, grad_features: *mut f32);
    mluops_three_interpolate_backward_f16(task_dim: u32, task_type: i32, batches: i32, channels: i32, n_points: i32,
        m_points: i32, mo: i32, no: i32, co: i32,
        grad_output: *const u16, indices: *const i32, weights: *const u16, grad_features: *mut u16);
    mluops_get_indice_pairs_expand(task_dim: u32, task_type: i32,
        geometry: *const crate::mlu::GipGeometry, rows: i32, tile_rows: i32,
        indices: *const i32, expand: *mut i32, site: *mut i32, gate: *const i32, gates: i32);
    mluops_get_indice_pairs_mark(task_dim: u32, task_type: i32, count: i32, words: i32, tile: i32,
        src: *const i32, bitmap: *mut i32);
    mluops_get_indice_pairs_rank(task_dim: u32, task_type: i32, words: i32, tile_words: i32,
        bitmap: *const i32, word_rank: *mut i32, core_totals: *mut i32, total: *mut i32);
    mluops_get_indice_pairs_out(task_dim: u32, task_type: i32,
        geometry: *const crate::mlu::GipGeometry, rows: i32, words: i32, tile: i32,
        bitmap: *const i32, word_rank: *const i32, site: *const i32, out_indices: *mut i32, perm: *mut i32);
    mluops_get_indice_pairs_pairs(task_dim: u32, task_type: i32, kernel_volume: i32, rows: i32, subm: i32,
        tile: i32, expand: *const i32, bitmap: *const i32, word_rank: *const i32, perm: *const i32,
        pairs: *mut i32, indice_num: *mut i32);
    mluops_psroipool_backward(task_dim: u32, task_type: i32, rois_num: i32, pooled: i32, output_dim: i32,
        height: i32, width: i32, channels: i32, bins_per_load: i32, deal: i32,
        top_grad: *const f32, spans: *const i32, mapping_channel: *const i32, bottom_grad: *mut f32,
        gate: *const i32, gates: i32);
    mluops_dynamic_scatter_backward_max(task_dim: u32, task_type: i32, points: i32, voxels: i32, channels: i32,
        padded: i32, tile_points: i32, tile_voxels: i32, fill_tile: i32,
        grad_voxel_feats: *const f32, feats: *const f32, voxel_feats: *const f32, point2voxel_map: *const i32,
        reduce_from: *mut i32, grad_feats: *mut f32, gate: *const i32, gates: i32);
    mluops_indice_conv_bias(task_dim: u32, task_type: i32, rows: i32, cols: i32, tile_rows: i32,
        bias: *const f32, out: *mut f32);
    mluops_check_int_rows(task_dim: u32, task_type: i32, data: *const i32, rows: i32, cols: i32,
        bounds: *const crate::mlu::IntBounds, tile_rows: i32, task_first: *mut i32, record: *mut i32);
    mluops_check_float_rows(task_dim: u32, task_type: i32, data: *const f32, rows: i32, cols: i32, col: i32,
        above: f32, below: f32, tile_rows: i32, task_first: *mut i32, record: *mut i32);
}

/// Declares a `#[repr(C)]` struct passed to a launch entry, plus `FIELDS`, its fields as
/// (name, Rust type) in declaration order, which tests/kernel_abi.rs checks against the C
/// struct of kernels/*/*.h.
macro_rules! c_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl $name {
            pub const FIELDS: &[(&str, &str)] = &[$((stringify!($field), stringify!($ty))),*];
        }
    };
}

c_struct! {
    /// GetIndicePairs' geometry argument (kernels/sparse_conv/sparse_conv.h:
    /// MluopsGipGeometry).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct GipGeometry {
        pub in_space: [i32; 3],
        pub out_space: [i32; 3],
        pub kernel: [i32; 3],
        pub stride: [i32; 3],
        pub pad: [i32; 3],
        pub dilation: [i32; 3],
        pub subm: i32,
    }
}

c_struct! {
    /// The value checks' inclusive bounds per column of an int32 row (kernels/check/check.h:
    /// MluopsIntBounds).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct IntBounds {
        pub lo: [i32; 4],
        pub hi: [i32; 4],
    }
}

unsafe extern "C" {
    fn mluops_nram_budget() -> u64;
}

/// The kernel library's NRAM budget (what kernels/common/kernel.h was built with).
pub fn kernel_nram_budget() -> usize {
    // SAFETY: a constant getter without arguments.
    unsafe { mluops_nram_budget() as usize }
}

/// One card: its runtime, description and kernels.
pub struct Device {
    runtime: Box<dyn Runtime>,
    pub info: DeviceInfo,
    pub kernels: Kernels,
    counters: Counters,
    /// Unique in this process for the process's life (never reused, unlike an address).
    pub id: u64,
}

impl Device {
    pub fn new(runtime: Box<dyn Runtime>, info: DeviceInfo, kernels: Kernels) -> Arc<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(Device { runtime, info, kernels, counters: Counters::default(), id })
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
    pub fn alloc_kept(self: &Arc<Self>, bytes: usize, keep: &mut Vec<Buffer>) -> Result<*mut c_void> {
        let buf = self.alloc(bytes)?;
        let ptr = buf.ptr();
        keep.push(buf);
        Ok(ptr)
    }

    pub fn upload<T: Copy>(self: &Arc<Self>, data: &[T]) -> Result<Buffer> {
        let buf = self.alloc(size_of_val(data))?;
        if buf.bytes > 0 {
            // SAFETY: `data` is valid for its byte size; `buf` is a fresh device buffer of it.
            unsafe { self.memcpy(buf.ptr, data.as_ptr().cast(), buf.bytes, Direction::HostToDevice)? };
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
            unsafe { self.memcpy(out.as_mut_ptr().cast(), buf.ptr, buf.bytes, Direction::DeviceToHost)? };
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
    pub unsafe fn copy_raw(&self, dst: *mut c_void, src: *const c_void, bytes: usize, dir: Direction) -> Result<()> {
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
    unsafe fn memcpy(&self, dst: *mut c_void, src: *const c_void, bytes: usize, dir: Direction) -> Result<()> {
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
