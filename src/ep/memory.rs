//! Device memory as ONNX Runtime sees it: one `OrtMemoryInfo` per card (NPU, vendor
//! 0xCABC, device id), an `OrtAllocator` handing out card memory, and the data transfer
//! ONNX Runtime uses for the copies it inserts between CPU nodes and MLU nodes.

use super::VENDOR_ID;
use crate::error::{Error, Result};
use crate::ffi::device::{self as ort_device, MemoryDevice};
use crate::ffi::ep_abi::{OrtDataTransferImpl, OrtMemoryDevice};
use crate::ffi::kernel::Value;
use crate::ffi::{guard, version};
use crate::mlu::{Buffer, Device, Direction};
use ort_sys::{
    OrtAllocator, OrtDeviceMemoryType, OrtMemoryInfo, OrtMemoryInfoDeviceType, OrtStatusPtr,
    OrtSyncStream, OrtValue,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Alignment of every device allocation (the kernels' 64-byte GDRAM alignment).
pub const ALIGNMENT: usize = 64;

/// The memory info of card `id`, kept alive by the factory (ONNX Runtime does not copy it).
pub fn memory_info(id: u32) -> Result<*mut OrtMemoryInfo> {
    ort_device::memory_info(&format!("MLU:{id}"), VENDOR_ID, id, ALIGNMENT)
}

/// Card memory for ONNX Runtime. `base` comes first so the `OrtAllocator*` casts back.
#[repr(C)]
pub struct Allocator {
    base: OrtAllocator,
    info: *const OrtMemoryInfo,
    device: Arc<Device>,
    live: Mutex<HashMap<usize, Buffer>>,
}

fn allocator<'a>(this: *const OrtAllocator) -> &'a Allocator {
    // SAFETY: every OrtAllocator we hand out is the first field of a boxed Allocator that
    // lives until ReleaseAllocator.
    unsafe { &*(this as *const Allocator) }
}

unsafe extern "system" fn alloc(this: *mut OrtAllocator, size: usize) -> *mut c_void {
    let a = allocator(this);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match a.device.alloc(size.max(1)) {
        Ok(buf) => {
            let p = buf.ptr::<c_void>();
            a.live.lock().unwrap_or_else(|e| e.into_inner()).insert(p as usize, buf);
            p
        }
        Err(e) => {
            log::error!("MLU allocation of {size} bytes failed: {e}");
            std::ptr::null_mut()
        }
    }))
    .unwrap_or(std::ptr::null_mut())
}

unsafe extern "system" fn free(this: *mut OrtAllocator, p: *mut c_void) {
    let a = allocator(this);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let buf = a.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&(p as usize));
        if buf.is_none() && !p.is_null() {
            log::error!("MLU allocator: free of an address it never allocated");
        }
    }));
}

unsafe extern "system" fn memory_info_of(this: *const OrtAllocator) -> *const OrtMemoryInfo {
    allocator(this).info
}

unsafe extern "system" fn reserve(this: *const OrtAllocator, size: usize) -> *mut c_void {
    // SAFETY: same allocator; Reserve is Alloc outside any arena.
    unsafe { alloc(this.cast_mut(), size) }
}

impl Allocator {
    pub fn new(info: *const OrtMemoryInfo, device: Arc<Device>) -> Box<Self> {
        // SAFETY: OrtAllocator::default only fills in null members and the version.
        let mut base = unsafe { OrtAllocator::default() };
        base.version = version();
        base.Alloc = Some(alloc);
        base.Free = Some(free);
        base.Info = Some(memory_info_of);
        base.Reserve = Some(reserve);
        Box::new(Allocator { base, info, device, live: Mutex::new(HashMap::new()) })
    }

    pub fn into_raw(self: Box<Self>) -> *mut OrtAllocator {
        Box::into_raw(self).cast()
    }

    /// # Safety
    /// `p` came from [`Allocator::into_raw`] and is released once.
    pub unsafe fn release(p: *mut OrtAllocator) {
        // SAFETY: caller contract.
        drop(unsafe { Box::from_raw(p as *mut Allocator) });
    }
}

/// The copies between card memory and CPU memory. Owned by the factory; ONNX Runtime's
/// Release is a no-op.
#[repr(C)]
pub struct Transfer {
    base: OrtDataTransferImpl,
    cards: Vec<(u32, Arc<Device>)>,
}

fn transfer<'a>(this: *const OrtDataTransferImpl) -> &'a Transfer {
    // SAFETY: the only OrtDataTransferImpl we hand out is the first field of the factory's
    // Transfer, alive until the factory is released.
    unsafe { &*(this as *const Transfer) }
}

/// Where a tensor lives, from this transfer's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Host,
    Card(usize),
    Other,
}

impl Transfer {
    pub fn new(cards: Vec<(u32, Arc<Device>)>) -> Box<Self> {
        Box::new(Transfer {
            base: OrtDataTransferImpl {
                ort_version_supported: version(),
                Release: Some(release_transfer),
                CanCopy: Some(can_copy),
                CopyTensors: Some(copy_tensors),
            },
            cards,
        })
    }

    pub fn as_raw(&self) -> *mut OrtDataTransferImpl {
        (&self.base as *const OrtDataTransferImpl).cast_mut()
    }

    fn side(&self, d: *const OrtMemoryDevice) -> Side {
        if d.is_null() {
            return Side::Host;
        }
        // SAFETY: d is a non-null memory device ONNX Runtime passed in or returned.
        let MemoryDevice { kind, memory, vendor_id, device_id } = unsafe { MemoryDevice::read(d) };
        if kind == OrtMemoryInfoDeviceType::OrtMemoryInfoDeviceType_CPU
            || memory == OrtDeviceMemoryType::OrtDeviceMemoryType_HOST_ACCESSIBLE
        {
            return Side::Host;
        }
        if kind == OrtMemoryInfoDeviceType::OrtMemoryInfoDeviceType_NPU
            && vendor_id == VENDOR_ID
            && let Some(i) = self.cards.iter().position(|(cid, _)| *cid == device_id)
        {
            return Side::Card(i);
        }
        Side::Other
    }

    fn copy(&self, src: Value<'_>, dst: Value<'_>) -> Result<()> {
        let (from, to) = (self.side(src.memory_device()), self.side(dst.memory_device()));
        let (bytes, dst_bytes) = (src.size_in_bytes()?, dst.size_in_bytes()?);
        let (s, d) = (src.data()?, dst.data()?);
        if bytes != dst_bytes {
            return Err(Error::Runtime(format!(
                "MLU copy: source has {bytes} bytes, destination {dst_bytes}"
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let (card, dir) = match (from, to) {
            (Side::Card(i), Side::Card(j)) if i == j => (i, Direction::DeviceToDevice),
            (Side::Card(i), Side::Host) => (i, Direction::DeviceToHost),
            (Side::Host, Side::Card(j)) => (j, Direction::HostToDevice),
            (Side::Host, Side::Host) => {
                // SAFETY: two host tensors of `bytes` bytes each, distinct allocations.
                unsafe { std::ptr::copy_nonoverlapping(s.cast::<u8>(), d.cast::<u8>(), bytes) };
                return Ok(());
            }
            other => {
                return Err(Error::Runtime(format!(
                    "MLU data transfer cannot copy {:?} -> {:?}",
                    other.0, other.1
                )));
            }
        };
        // SAFETY: both pointers are tensor buffers of `bytes` bytes on the sides `dir` names.
        unsafe { self.cards[card].1.copy_raw(d, s, bytes, dir) }
    }
}

unsafe extern "system" fn release_transfer(_: *mut OrtDataTransferImpl) {}

unsafe extern "system" fn can_copy(
    this: *const OrtDataTransferImpl,
    src: *const OrtMemoryDevice,
    dst: *const OrtMemoryDevice,
) -> bool {
    let t = transfer(this);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        matches!(
            (t.side(src), t.side(dst)),
            (Side::Card(_), Side::Host) | (Side::Host, Side::Card(_))
        ) || matches!((t.side(src), t.side(dst)), (Side::Card(i), Side::Card(j)) if i == j)
    }))
    .unwrap_or(false)
}

unsafe extern "system" fn copy_tensors(
    this: *mut OrtDataTransferImpl,
    src: *const *const OrtValue,
    dst: *const *mut OrtValue,
    _streams: *const *mut OrtSyncStream,
    count: usize,
) -> OrtStatusPtr {
    let t = transfer(this);
    guard("MLUExecutionProvider data transfer", || {
        for i in 0..count {
            // SAFETY: ONNX Runtime passes `count` source and destination tensors, live for
            // this call.
            let (s, d) = unsafe { (Value::from_raw(*src.add(i)), Value::from_raw(*dst.add(i))) };
            t.copy(s, d).map_err(|e| Error::Runtime(format!("MLUExecutionProvider: {e}")))?;
        }
        Ok(())
    })
}
