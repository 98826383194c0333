//! What the EP factory asks of ONNX Runtime: hardware devices for the cards, EP devices with
//! their memory info, memory infos and memory devices, key/value pairs, and session
//! configuration entries.

use super::ep_abi::{OrtEpFactory, OrtMemoryDevice};
use super::{api, check, checked, cstring, ep_api, read_string};
use crate::error::Result;
use ort_sys::{
    OrtAllocatorType, OrtDeviceMemoryType, OrtEpDevice, OrtHardwareDevice, OrtHardwareDeviceType,
    OrtKeyValuePairs, OrtMemoryInfo, OrtMemoryInfoDeviceType, OrtSessionOptions,
};

/// Key/value pairs for device and EP metadata, released on drop.
pub struct Pairs(*mut OrtKeyValuePairs);

impl Pairs {
    pub fn new(entries: &[(&str, String)]) -> Self {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        unsafe { (api().CreateKeyValuePairs)(&mut p) };
        for (k, v) in entries {
            let (k, v) = (cstring(k), cstring(v));
            // SAFETY: p is live; ORT copies the strings.
            unsafe { (api().AddKeyValuePair)(p, k.as_ptr(), v.as_ptr()) };
        }
        Pairs(p)
    }
}

impl Drop for Pairs {
    fn drop(&mut self) {
        // SAFETY: created by CreateKeyValuePairs, released once.
        unsafe { (api().ReleaseKeyValuePairs)(self.0) };
    }
}

/// A new NPU hardware device (ONNX Runtime's own discovery does not find MLU cards), kept
/// by the caller until the factory is released.
pub fn hardware_device(
    vendor_id: u32,
    device_id: u32,
    vendor: &str,
    metadata: &Pairs,
) -> Result<*mut OrtHardwareDevice> {
    let vendor = cstring(vendor);
    let mut hardware = std::ptr::null_mut();
    // SAFETY: valid strings and out pointer; ORT copies the metadata.
    checked("CreateHardwareDevice", unsafe {
        (ep_api().CreateHardwareDevice)(
            OrtHardwareDeviceType::OrtHardwareDeviceType_NPU,
            vendor_id,
            device_id,
            vendor.as_ptr(),
            metadata.0,
            &mut hardware,
        )
    })?;
    Ok(hardware)
}

/// # Safety
/// `hardware` came from [`hardware_device`], was never handed to ONNX Runtime, and is
/// released once.
pub unsafe fn release_hardware_device(hardware: *mut OrtHardwareDevice) {
    // SAFETY: caller contract.
    unsafe { (ep_api().ReleaseHardwareDevice)(hardware) };
}

/// A new EP device of `factory` on `hardware`, whose memory is `memory_info`.
///
/// # Safety
/// `factory` is the factory ONNX Runtime is asking, `hardware` a live hardware device and
/// `memory_info` a memory info that outlives the EP device.
pub unsafe fn ep_device(
    factory: *mut OrtEpFactory,
    hardware: *const OrtHardwareDevice,
    metadata: &Pairs,
    memory_info: *const OrtMemoryInfo,
) -> Result<*mut OrtEpDevice> {
    let ep = ep_api();
    let mut device = std::ptr::null_mut();
    // SAFETY: caller contract; ORT copies the metadata.
    checked("CreateEpDevice", unsafe {
        (ep.CreateEpDevice)(factory, hardware, metadata.0, std::ptr::null(), &mut device)
    })?;
    // SAFETY: device was just created; the memory info outlives it (caller contract).
    if let Err(e) = checked("EpDevice_AddAllocatorInfo", unsafe {
        (ep.EpDevice_AddAllocatorInfo)(device, memory_info)
    }) {
        // SAFETY: not handed to ORT yet.
        unsafe { (ep.ReleaseEpDevice)(device) };
        return Err(e);
    }
    Ok(device)
}

/// The memory info `name` of an NPU (`vendor_id`, `device_id`) whose allocations are aligned
/// to `alignment` bytes; ONNX Runtime does not copy it, so the caller keeps it alive.
pub fn memory_info(
    name: &str,
    vendor_id: u32,
    device_id: u32,
    alignment: usize,
) -> Result<*mut OrtMemoryInfo> {
    let name = cstring(name);
    let mut info = std::ptr::null_mut();
    // SAFETY: name is a valid C string, `info` a valid out pointer.
    checked("CreateMemoryInfo_V2", unsafe {
        (api().CreateMemoryInfo_V2)(
            name.as_ptr(),
            OrtMemoryInfoDeviceType::OrtMemoryInfoDeviceType_NPU,
            vendor_id,
            device_id as i32,
            OrtDeviceMemoryType::OrtDeviceMemoryType_DEFAULT,
            alignment,
            OrtAllocatorType::OrtDeviceAllocator,
            &mut info,
        )
    })?;
    Ok(info)
}

/// Whether two memory infos describe the same memory device.
///
/// # Safety
/// Both are live memory infos.
pub unsafe fn same_memory_device(a: *const OrtMemoryInfo, b: *const OrtMemoryInfo) -> bool {
    let ep = ep_api();
    // SAFETY: caller contract; the memory devices belong to the infos.
    unsafe {
        (ep.MemoryDevice_AreEqual)(
            (ep.MemoryInfo_GetMemoryDevice)(a),
            (ep.MemoryInfo_GetMemoryDevice)(b),
        )
    }
}

/// What a memory device is: its kind, memory type, vendor and device id.
pub struct MemoryDevice {
    pub kind: OrtMemoryInfoDeviceType,
    pub memory: OrtDeviceMemoryType,
    pub vendor_id: u32,
    pub device_id: u32,
}

impl MemoryDevice {
    /// # Safety
    /// `d` is a live, non-null memory device ONNX Runtime passed in or returned.
    pub unsafe fn read(d: *const OrtMemoryDevice) -> Self {
        let ep = ep_api();
        // SAFETY: caller contract.
        unsafe {
            MemoryDevice {
                kind: (ep.MemoryDevice_GetDeviceType)(d),
                memory: (ep.MemoryDevice_GetMemoryType)(d),
                vendor_id: (ep.MemoryDevice_GetVendorId)(d),
                device_id: (ep.MemoryDevice_GetDeviceId)(d),
            }
        }
    }
}

/// A session configuration entry (`None` when unset or when there are no options).
///
/// # Safety
/// `options` is null or live session options.
pub unsafe fn session_entry(
    options: *const OrtSessionOptions,
    key: &str,
) -> Result<Option<String>> {
    if options.is_null() {
        return Ok(None);
    }
    let k = cstring(key);
    let mut has = 0;
    // SAFETY: options is live (caller contract); valid out pointer.
    check(unsafe { (api().HasSessionConfigEntry)(options, k.as_ptr(), &mut has) })?;
    if has == 0 {
        return Ok(None);
    }
    read_string(|buf, size| {
        // SAFETY: as above; buf is null or holds *size bytes.
        unsafe { (api().GetSessionConfigEntry)(options, k.as_ptr(), buf, size) }
    })
    .map(Some)
}
