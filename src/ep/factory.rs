//! The EP factory: finds the cards, describes them to ONNX Runtime as NPU hardware devices
//! (vendor 0xCABC) with their memory info, creates EP instances, allocators and the data
//! transfer, and serves the `mluops` custom-op domain (the schemas and CPU kernels).

use super::doctor;
use super::kernel;
use super::memory::{self, Allocator, Transfer};
use super::provider::Ep;
use super::{EP_NAME, OPTION_PREFIX, VENDOR, VENDOR_ID};
use crate::error::{Error, Result};
use crate::ffi::device::{self as ort_device, Pairs};
use crate::ffi::ep_abi::{
    OrtDataTransferImpl, OrtEp, OrtEpFactory, OrtKernelRegistry, OrtMemoryDevice, OrtSyncStreamImpl,
};
use crate::ffi::registry::KernelRegistry;
use crate::ffi::{INFO, Logger, WARNING, cstring, custom_op, guard, version};
use crate::mlu::Device;
use crate::mluops;
use crate::ops::device::{Backend, CardBackends};
use ort_sys::{
    OrtAllocator, OrtCustomOpDomain, OrtEpDevice, OrtHardwareDevice, OrtKeyValuePairs, OrtLogger,
    OrtMemoryInfo, OrtSessionOptions, OrtStatusPtr,
};
use std::ffi::{CString, c_char};
use std::sync::{Arc, Mutex, OnceLock};

/// One card as ONNX Runtime sees it.
struct CardEntry {
    id: u32,
    device: Arc<Device>,
    hardware: *mut OrtHardwareDevice,
    memory_info: *mut OrtMemoryInfo,
}

/// `base` comes first so ONNX Runtime's `OrtEpFactory*` casts back.
#[repr(C)]
pub struct Factory {
    base: OrtEpFactory,
    name: CString,
    vendor: CString,
    version: CString,
    cards: Vec<CardEntry>,
    transfer: Box<Transfer>,
    registry: OnceLock<KernelRegistry>,
    /// Serialises registry creation (OnceLock::get_or_try_init is unstable).
    registry_lock: Mutex<()>,
    lifetime: Mutex<Lifetime>,
}

/// ONNX Runtime releases the factory when the library is unregistered, even while sessions
/// still hold EPs and allocators it made (and will call its function table to release
/// them), and session options made before may still name its devices. A released factory
/// is therefore never freed (the library is never unmapped either): it keeps serving what
/// exists and refuses to make anything new.
#[derive(Default)]
struct Lifetime {
    released: bool,
}

/// Whether a factory of this library exists (released ones excluded): the library serves
/// one registration per process.
static REGISTERED: Mutex<Option<String>> = Mutex::new(None);

/// The released factories' addresses (see [`Lifetime`]).
static RETIRED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn this<'a>(f: *const OrtEpFactory) -> &'a Factory {
    // SAFETY: the only OrtEpFactory we hand out is the first field of a boxed Factory that
    // lives until ReleaseEpFactory.
    unsafe { &*(f as *const Factory) }
}

/// The cards this process can use ([`doctor::discover`]), with why there are none of a
/// kind, and the doctor's report, in the log.
fn discover(logger: Logger) -> Vec<(u32, Arc<Device>)> {
    let found = doctor::discover();
    if let Some(why) = &found.no_real_card {
        logger.log(INFO, &format!("{EP_NAME}: no Cambricon MLU card in use: {why}"));
    }
    if let Some(e) = &found.emulator_failed {
        logger.log(WARNING, &format!("{EP_NAME}: the emulated MLU card failed to start: {e}"));
    }
    if found.cards.is_empty() {
        logger.log(WARNING, &format!("{EP_NAME}: no MLU device (no libcnrt card, MLU_EP_EMULATE is not 1); the provider offers no device"));
    }
    logger.log(INFO, &doctor::report(&found));
    found.cards
}

impl Factory {
    pub fn new(logger: Logger) -> Result<Box<Self>> {
        let mut cards = Vec::new();
        for (id, device) in discover(logger) {
            let d = &device.info;
            let metadata = Pairs::new(&[
                ("architecture", d.arch.clone()),
                ("emulated", d.emulated.to_string()),
                ("nram_bytes", d.nram_bytes.to_string()),
                ("clusters", d.clusters.to_string()),
                ("cores_per_cluster", d.cores_per_cluster.to_string()),
                (
                    "Description",
                    if d.emulated {
                        "Cambricon MLU (emulated on the host)".into()
                    } else {
                        format!("Cambricon MLU {}", d.arch)
                    },
                ),
            ]);
            let hardware = ort_device::hardware_device(VENDOR_ID, id, VENDOR, &metadata)?;
            let memory_info = match memory::memory_info(id) {
                Ok(m) => m,
                Err(e) => {
                    // SAFETY: created just above, not handed out.
                    unsafe { ort_device::release_hardware_device(hardware) };
                    return Err(e);
                }
            };
            cards.push(CardEntry { id, device, hardware, memory_info });
        }
        let transfer = Transfer::new(cards.iter().map(|c| (c.id, Arc::clone(&c.device))).collect());
        let base = OrtEpFactory {
            ort_version_supported: version(),
            GetName: Some(get_name),
            GetVendor: Some(get_vendor),
            GetSupportedDevices: Some(get_supported_devices),
            CreateEp: Some(create_ep),
            ReleaseEp: Some(release_ep),
            GetVendorId: Some(get_vendor_id),
            GetVersion: Some(get_version),
            ValidateCompiledModelCompatibilityInfo: None,
            CreateAllocator: Some(create_allocator),
            ReleaseAllocator: Some(release_allocator),
            CreateDataTransfer: Some(create_data_transfer),
            IsStreamAware: Some(is_stream_aware),
            CreateSyncStreamForDevice: Some(create_sync_stream),
            GetHardwareDeviceIncompatibilityDetails: None,
            CreateExternalResourceImporterForDevice: None,
            GetNumCustomOpDomains: Some(get_num_domains),
            GetCustomOpDomains: Some(get_domains),
        };
        Ok(Box::new(Factory {
            base,
            name: cstring(EP_NAME),
            vendor: cstring(VENDOR),
            version: cstring(env!("CARGO_PKG_VERSION")),
            cards,
            transfer,
            registry: OnceLock::new(),
            registry_lock: Mutex::new(()),
            lifetime: Mutex::new(Lifetime::default()),
        }))
    }

    pub fn into_raw(self: Box<Self>) -> *mut OrtEpFactory {
        Box::into_raw(self).cast()
    }

    /// ONNX Runtime's release of the factory (see [`Lifetime`]): from now on it only
    /// refuses new EPs and allocators, and the library may be registered again.
    ///
    /// # Safety
    /// `p` came from [`Factory::into_raw`] and is released once.
    pub unsafe fn release(p: *mut OrtEpFactory) {
        // SAFETY: null stops the routing to the default logger the factory held.
        unsafe { crate::ffi::route_log(std::ptr::null()) };
        *REGISTERED.lock().unwrap_or_else(|e| e.into_inner()) = None;
        this(p).lifetime.lock().unwrap_or_else(|e| e.into_inner()).released = true;
        // Kept on purpose for the life of the process (not a leak of a session).
        RETIRED.lock().unwrap_or_else(|e| e.into_inner()).push(p as usize);
    }

    /// The error for a request to a released factory (session options made before an
    /// unregistration).
    fn refuse_if_released(&self) -> Result<()> {
        if self.lifetime.lock().unwrap_or_else(|e| e.into_inner()).released {
            return Err(Error::Runtime(format!(
                "{EP_NAME}: this registration of the library was unregistered; build the session options again from the current devices"
            )));
        }
        Ok(())
    }

    /// The kernel registry, built on first use and shared by every EP of this factory.
    pub fn registry(&self) -> Result<*const OrtKernelRegistry> {
        if let Some(r) = self.registry.get() {
            return Ok(r.as_ptr());
        }
        let _guard = self.registry_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = self.registry.get() {
            return Ok(r.as_ptr());
        }
        let r = kernel::registry()?;
        Ok(self.registry.get_or_init(|| r).as_ptr())
    }

    /// The card an EP should use: the `device_id` option when given, else the selected
    /// hardware device, else the first card.
    fn pick(
        &self,
        devices: &[*const OrtHardwareDevice],
        options: *const OrtSessionOptions,
    ) -> Result<&CardEntry> {
        let key = format!("{OPTION_PREFIX}device_id");
        // SAFETY: options is null or the live session options of CreateEp.
        if let Some(v) = unsafe { ort_device::session_entry(options, &key) }? {
            let id: u32 = v.trim().parse().map_err(|_| {
                Error::attribute(
                    format!("{EP_NAME} option device_id"),
                    format!("'{v}' is not a device number"),
                )
            })?;
            return self.cards.iter().find(|c| c.id == id).ok_or_else(|| {
                let ids: Vec<u32> = self.cards.iter().map(|c| c.id).collect();
                Error::attribute(
                    format!("{EP_NAME} option device_id"),
                    format!("no MLU card {id}; this process has cards {ids:?}"),
                )
            });
        }
        let selected =
            devices.iter().find_map(|&h| self.cards.iter().find(|c| c.hardware.cast_const() == h));
        selected
            .or(self.cards.first())
            .ok_or_else(|| Error::Runtime(format!("{EP_NAME}: no MLU device")))
    }
}

unsafe extern "system" fn get_name(f: *const OrtEpFactory) -> *const c_char {
    this(f).name.as_ptr()
}
unsafe extern "system" fn get_vendor(f: *const OrtEpFactory) -> *const c_char {
    this(f).vendor.as_ptr()
}
unsafe extern "system" fn get_vendor_id(_: *const OrtEpFactory) -> u32 {
    VENDOR_ID
}
unsafe extern "system" fn get_version(f: *const OrtEpFactory) -> *const c_char {
    this(f).version.as_ptr()
}

unsafe extern "system" fn get_supported_devices(
    f: *mut OrtEpFactory,
    _devices: *const *const OrtHardwareDevice,
    _num_devices: usize,
    ep_devices: *mut *mut OrtEpDevice,
    max_ep_devices: usize,
    num_ep_devices: *mut usize,
) -> OrtStatusPtr {
    let factory = this(f);
    guard("MLUExecutionProvider GetSupportedDevices", || {
        let mut n = 0usize;
        // ORT's own device discovery does not find MLU cards: the factory reports the
        // hardware devices it created for them.
        for card in factory.cards.iter().take(max_ep_devices) {
            let metadata = Pairs::new(&[("card", card.id.to_string())]);
            // SAFETY: f is this factory, card.hardware a live hardware device, and the memory
            // info lives as long as the factory.
            let device =
                unsafe { ort_device::ep_device(f, card.hardware, &metadata, card.memory_info) }
                    .map_err(|e| Error::Runtime(format!("{EP_NAME}: {e}")))?;
            // SAFETY: ep_devices has max_ep_devices slots and n < max_ep_devices.
            unsafe { *ep_devices.add(n) = device };
            n += 1;
        }
        // SAFETY: ORT's out pointer.
        unsafe { *num_ep_devices = n };
        Ok(())
    })
}

unsafe extern "system" fn create_ep(
    f: *mut OrtEpFactory,
    devices: *const *const OrtHardwareDevice,
    _metadata: *const *const OrtKeyValuePairs,
    num_devices: usize,
    options: *const OrtSessionOptions,
    logger: *const OrtLogger,
    out: *mut *mut OrtEp,
) -> OrtStatusPtr {
    let factory = this(f);
    guard("MLUExecutionProvider CreateEp", || {
        let devices = if devices.is_null() || num_devices == 0 {
            &[][..]
        } else {
            // SAFETY: ORT passes num_devices hardware devices.
            unsafe { std::slice::from_raw_parts(devices, num_devices) }
        };
        factory.refuse_if_released()?;
        let card = factory.pick(devices, options)?;
        // SAFETY: ORT's session logger, valid for the life of the EP created here.
        let logger = unsafe { Logger::new(logger) };
        let backends =
            backends(options, &card.device).map_err(|e| Error::Argument(e.to_string()))?;
        let ep = Ep::new(factory, Arc::clone(&card.device), card.id, logger, backends);
        // SAFETY: ORT's out pointer; released by release_ep.
        unsafe { *out = ep.into_raw() };
        Ok(())
    })
}

/// The card backends a session asked for: the option `mlu_backend` (else the environment
/// variable `MLU_EP_BACKEND`, else `auto`), and the MLU-OPS library (the option
/// `mluops_library`, else `MLU_EP_MLUOPS_LIBRARY`, else the standard places), checked on
/// `card` (`mluops::open`). `auto` without a usable library runs our BANG kernels (the reason
/// is logged); `mluops` without one is an error.
fn backends(options: *const OrtSessionOptions, card: &Device) -> Result<CardBackends> {
    let option = |name: &str| -> Result<Option<String>> {
        let key = format!("{OPTION_PREFIX}{name}");
        // SAFETY: options is null or the live session options of CreateEp.
        unsafe { ort_device::session_entry(options, &key) }
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (value, from) = match option("mlu_backend")? {
        Some(v) => (v, "option mlu_backend"),
        None => match env("MLU_EP_BACKEND") {
            Some(v) => (v, "MLU_EP_BACKEND"),
            None => ("auto".to_owned(), "default"),
        },
    };
    let order = Backend::order(&value)
        .map_err(|why| Error::attribute(format!("{EP_NAME} {from}"), why.to_string()))?;
    if !order.contains(&Backend::MluOps) {
        return Ok(
            CardBackends::new(order).with_mluops(Err(Error::declined(format!("{from} = {value}"))))
        );
    }
    let explicit = option("mluops_library")?.or_else(|| env("MLU_EP_MLUOPS_LIBRARY"));
    let mluops = mluops::open(explicit.as_deref(), card);
    if let (Err(why), true) = (&mluops, order.iter().all(|b| *b == Backend::MluOps)) {
        return Err(Error::attribute(
            format!("{EP_NAME} {from}"),
            format!("{value} asks for MLU-OPS, which is not usable: {why}"),
        ));
    }
    Ok(CardBackends::new(order).with_mluops(mluops))
}

unsafe extern "system" fn release_ep(_: *mut OrtEpFactory, ep: *mut OrtEp) {
    if ep.is_null() {
        return;
    }
    // SAFETY: ep came from create_ep and ORT releases it once.
    let _ = std::panic::catch_unwind(|| unsafe { Ep::release(ep) });
}

unsafe extern "system" fn create_allocator(
    f: *mut OrtEpFactory,
    info: *const OrtMemoryInfo,
    _options: *const OrtKeyValuePairs,
    out: *mut *mut OrtAllocator,
) -> OrtStatusPtr {
    let factory = this(f);
    guard("MLUExecutionProvider CreateAllocator", || {
        let card = factory.cards.iter().find(|c| {
            // SAFETY: info is a live memory info ORT passed in; ours live with the factory.
            c.memory_info.cast_const() == info
                || unsafe { ort_device::same_memory_device(c.memory_info, info) }
        });
        let c = card.ok_or_else(|| {
            Error::Argument(format!(
                "{EP_NAME}: CreateAllocator for a memory info that is not an MLU card's"
            ))
        })?;
        factory.refuse_if_released().map_err(|e| Error::Runtime(e.to_string()))?;
        // SAFETY: ORT's out pointer; released by release_allocator.
        unsafe { *out = Allocator::new(c.memory_info, Arc::clone(&c.device)).into_raw() };
        Ok(())
    })
}

unsafe extern "system" fn release_allocator(_: *mut OrtEpFactory, allocator: *mut OrtAllocator) {
    if allocator.is_null() {
        return;
    }
    // SAFETY: allocator came from create_allocator and ORT releases it once.
    let _ = std::panic::catch_unwind(|| unsafe { Allocator::release(allocator) });
}

unsafe extern "system" fn create_data_transfer(
    f: *mut OrtEpFactory,
    out: *mut *mut OrtDataTransferImpl,
) -> OrtStatusPtr {
    guard("MLUExecutionProvider CreateDataTransfer", || {
        // SAFETY: ORT's out pointer; the transfer lives as long as the factory.
        unsafe { *out = this(f).transfer.as_raw() };
        Ok(())
    })
}

unsafe extern "system" fn is_stream_aware(_: *const OrtEpFactory) -> bool {
    false
}

unsafe extern "system" fn create_sync_stream(
    _: *mut OrtEpFactory,
    _: *const OrtMemoryDevice,
    _: *const OrtKeyValuePairs,
    out: *mut *mut OrtSyncStreamImpl,
) -> OrtStatusPtr {
    guard("MLUExecutionProvider CreateSyncStreamForDevice", || {
        // SAFETY: ORT's out pointer. No streams: every kernel synchronises its own queue.
        unsafe { *out = std::ptr::null_mut() };
        Ok(())
    })
}

unsafe extern "system" fn get_num_domains(_: *mut OrtEpFactory, count: *mut usize) -> OrtStatusPtr {
    guard("MLUExecutionProvider GetNumCustomOpDomains", || {
        // SAFETY: ORT's out pointer.
        unsafe { *count = 1 };
        Ok(())
    })
}

unsafe extern "system" fn get_domains(
    _: *mut OrtEpFactory,
    domains: *mut *mut OrtCustomOpDomain,
    count: usize,
) -> OrtStatusPtr {
    guard("MLUExecutionProvider GetCustomOpDomains", || {
        if count < 1 {
            return Err(Error::Argument("GetCustomOpDomains: room for 0 domains, 1 needed".into()));
        }
        let d = custom_op::domain()?;
        // SAFETY: ORT passes room for `count` >= 1 domains.
        unsafe { *domains = d };
        Ok(())
    })
}

/// The body of `CreateEpFactories`.
///
/// # Safety
/// Arguments as ONNX Runtime passes them to `CreateEpFactories`.
pub unsafe fn create(
    name: &str,
    logger: *const OrtLogger,
    factories: *mut *mut OrtEpFactory,
    max: usize,
    num: *mut usize,
) -> Result<()> {
    if factories.is_null() || num.is_null() {
        return Err(Error::Argument("CreateEpFactories: null output arguments".into()));
    }
    if max < 1 {
        return Err(Error::Argument("CreateEpFactories: room for 0 factories, 1 needed".into()));
    }
    // A second registration would list every card twice, under two names.
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(first) = registered.as_ref() {
        return Err(Error::Runtime(format!(
            "{EP_NAME}: this library is already registered in this process, as '{first}'; register it once (or unregister it first)"
        )));
    }
    let raw_logger = logger;
    // SAFETY: ORT's default logger, valid while the environment (and so this factory) lives.
    let logger = unsafe { Logger::new(logger) };
    let f = Factory::new(logger).map_err(|e| Error::Runtime(format!("{EP_NAME}: {e}")))?;
    // SAFETY: as above; unrouted when the factory is released (a factory that was never
    // made routes nothing).
    unsafe { crate::ffi::route_log(raw_logger) };
    *registered = Some(name.to_owned());
    // SAFETY: checked non-null; room for at least one factory.
    unsafe {
        *factories = f.into_raw();
        *num = 1;
    }
    Ok(())
}
