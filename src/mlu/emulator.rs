//! The emulated card: kernels/emulator's runtime surface (kernels/emulator/emu_runtime.h),
//! linked into this library by build.rs together with the host builds of the kernels.

use super::{Device, DeviceInfo, Direction, KernelCode, QueuePtr, Runtime};
use crate::error::{Error, Result};
use std::ffi::{CStr, c_char, c_void};
use std::sync::Arc;

#[repr(C)]
struct MluEmuDeviceInfo {
    arch: [c_char; 32],
    clusters: i32,
    cores_per_cluster: i32,
    nram_bytes: u64,
    nram_reserved_bytes: u64,
    sram_bytes: u64,
    wram_bytes: u64,
}

unsafe extern "C" {
    fn mlu_emu_device_info(device: i32, info: *mut MluEmuDeviceInfo) -> i32;
    fn mlu_emu_malloc(ptr: *mut *mut c_void, bytes: usize) -> i32;
    fn mlu_emu_free(ptr: *mut c_void) -> i32;
    fn mlu_emu_memcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: i32) -> i32;
    fn mlu_emu_memset(dst: *mut c_void, value: i32, bytes: usize) -> i32;
    fn mlu_emu_queue_create(queue: *mut QueuePtr) -> i32;
    fn mlu_emu_queue_sync(queue: QueuePtr) -> i32;
    fn mlu_emu_queue_destroy(queue: QueuePtr) -> i32;
    fn mlu_emu_last_error() -> *const c_char;
    fn mlu_emu_traffic(gdram_read: *mut u64, gdram_written: *mut u64);
}

struct Emulator;

fn check(what: &str, code: i32) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Runtime(format!("MLU emulator {what} failed (code {code}): {}", last_error())))
    }
}

fn last_error() -> String {
    // SAFETY: the emulator returns a NUL-terminated thread-local string that lives until
    // the next failing call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(mlu_emu_last_error()) }.to_string_lossy().into_owned()
}

impl Runtime for Emulator {
    fn malloc(&self, bytes: usize) -> Result<*mut c_void> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        check("malloc", unsafe { mlu_emu_malloc(&mut p, bytes) })?;
        Ok(p)
    }
    unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: forwarded contract (a live allocation of this runtime).
        check("free", unsafe { mlu_emu_free(ptr) })
    }
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        dir: Direction,
    ) -> Result<()> {
        let kind = match dir {
            Direction::HostToDevice => 1,
            Direction::DeviceToHost => 2,
            Direction::DeviceToDevice => 3,
        };
        // SAFETY: forwarded contract; the emulator checks the device side's range.
        check("memcpy", unsafe { mlu_emu_memcpy(dst, src, bytes, kind) })
    }
    unsafe fn memset(&self, dst: *mut c_void, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded contract; the emulator checks the range.
        check("memset", unsafe { mlu_emu_memset(dst, i32::from(value), bytes) })
    }
    fn queue_create(&self) -> Result<QueuePtr> {
        let mut q = std::ptr::null_mut();
        // SAFETY: `q` is a valid out-pointer.
        check("queue create", unsafe { mlu_emu_queue_create(&mut q) })?;
        Ok(q)
    }
    unsafe fn queue_sync(&self, q: QueuePtr) -> Result<()> {
        // SAFETY: forwarded contract (a live queue).
        let code = unsafe { mlu_emu_queue_sync(q) };
        if code == 0 {
            Ok(())
        } else {
            Err(Error::Runtime(format!("MLU emulator: {}", last_error())))
        }
    }
    unsafe fn queue_destroy(&self, q: QueuePtr) -> Result<()> {
        // SAFETY: forwarded contract (a live queue, not used afterwards).
        check("queue destroy", unsafe { mlu_emu_queue_destroy(q) })
    }
    fn launch_error(&self, _code: i32) -> String {
        last_error()
    }
    fn bind_thread(&self) -> Result<()> {
        // One emulated card, reachable from every thread.
        Ok(())
    }
    fn kernel_traffic(&self) -> Option<(u64, u64)> {
        let (mut read, mut written) = (0u64, 0u64);
        // SAFETY: two valid out pointers.
        unsafe { mlu_emu_traffic(&mut read, &mut written) };
        Some((read, written))
    }
}

/// The emulated card's description, as the emulator reports it.
pub fn info() -> Result<DeviceInfo> {
    let mut raw = MluEmuDeviceInfo {
        arch: [0; 32],
        clusters: 0,
        cores_per_cluster: 0,
        nram_bytes: 0,
        nram_reserved_bytes: 0,
        sram_bytes: 0,
        wram_bytes: 0,
    };
    // SAFETY: `raw` is a valid out-pointer of the C layout above.
    check("device info", unsafe { mlu_emu_device_info(0, &mut raw) })?;
    // SAFETY: the emulator writes a NUL-terminated string into the 32 bytes.
    let arch = unsafe { CStr::from_ptr(raw.arch.as_ptr()) }.to_string_lossy().into_owned();
    Ok(DeviceInfo {
        arch,
        emulated: true,
        clusters: raw.clusters as u32,
        cores_per_cluster: raw.cores_per_cluster as u32,
        nram_bytes: raw.nram_bytes,
        nram_reserved_bytes: raw.nram_reserved_bytes,
        missing_families: Vec::new(),
    })
}

pub fn device() -> Result<Arc<Device>> {
    Ok(Device::new(Box::new(Emulator), info()?, KernelCode::Linked))
}
