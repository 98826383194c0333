//! One `MLUExecutionProvider` instance (per session): partitioning (`GetCapability`) and
//! the queues its kernels launch on.

use super::EP_NAME;
use super::factory::Factory;
use crate::error::Result;
use crate::ffi::ep_abi::{OrtEp, OrtEpGraphSupportInfo, OrtKernelRegistry};
use crate::ffi::graph::{Graph, Node, SupportInfo};
use crate::ffi::{INFO, Logger, WARNING, cstring, guard, ok, status, version};
use crate::mlu::{Device, Queue};
use crate::ops;
use crate::schema::{self, Attrs};
use ort_sys::{OrtErrorCode, OrtGraph, OrtStatusPtr};
use std::ffi::{CString, c_char};
use std::sync::{Arc, Mutex};

/// `base` comes first so ONNX Runtime's `OrtEp*` casts back.
#[repr(C)]
pub struct Ep {
    base: OrtEp,
    name: CString,
    factory: *const Factory,
    device: Arc<Device>,
    card: u32,
    logger: Logger,
    queues: Mutex<Vec<Queue>>,
}

// SAFETY: the raw pointer is the factory, which outlives the EP
// and are only read; the queues are behind a mutex.
unsafe impl Send for Ep {}
// SAFETY: as above.
unsafe impl Sync for Ep {}

fn this<'a>(ep: *const OrtEp) -> &'a Ep {
    // SAFETY: every OrtEp we hand out is the first field of a boxed Ep that lives until
    // the factory's ReleaseEp.
    unsafe { &*(ep as *const Ep) }
}

impl Ep {
    pub fn new(factory: *const Factory, device: Arc<Device>, card: u32, logger: Logger) -> Box<Self> {
        let base = OrtEp {
            ort_version_supported: version(),
            GetName: Some(get_name),
            GetCapability: Some(get_capability),
            Compile: None,
            ReleaseNodeComputeInfos: None,
            GetPreferredDataLayout: None,
            ShouldConvertDataLayoutForOp: None,
            SetDynamicOptions: None,
            OnRunStart: None,
            OnRunEnd: None,
            CreateAllocator: None,
            CreateSyncStreamForDevice: None,
            GetCompiledModelCompatibilityInfo: None,
            GetKernelRegistry: Some(get_kernel_registry),
            IsConcurrentRunSupported: Some(is_concurrent_run_supported),
        };
        let ep = Box::new(Ep { base, name: cstring(EP_NAME), factory, device, card, logger, queues: Mutex::new(Vec::new()) });
        let d = &ep.device.info;
        logger.log(
            INFO,
            &format!(
                "{EP_NAME} created on card {card}: {} ({}), {} clusters x {} cores",
                d.arch,
                if d.emulated { "emulated on the host, no MLU hardware" } else { "Cambricon runtime" },
                d.clusters,
                d.cores_per_cluster
            ),
        );
        ep
    }

    pub fn into_raw(self: Box<Self>) -> *mut OrtEp {
        Box::into_raw(self).cast()
    }

    /// # Safety
    /// `p` came from [`Ep::into_raw`] and is released once.
    pub unsafe fn release(p: *mut OrtEp) {
        // SAFETY: caller contract.
        drop(unsafe { Box::from_raw(p as *mut Ep) });
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn card(&self) -> u32 {
        self.card
    }

    /// A queue for one kernel call: an idle one, or a new one.
    pub fn queue(&self) -> Result<Queue> {
        let idle = self.queues.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(q) => Ok(q),
            None => self.device.queue(),
        }
    }

    /// Returns a synchronised queue to the idle list.
    pub fn recycle(&self, q: Queue) {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).push(q);
    }

    /// Why the MLU declines `node`, or `None` when it takes it.
    fn decline_reason(&self, node: Node<'_>, op_type: &str) -> Option<String> {
        let Some(entry) = ops::entry(op_type) else {
            return Some("not an operator of this library".into());
        };
        let Some(create_mlu) = entry.create_mlu else {
            return Some("no MLU kernel for this operator (its CPU kernel runs it)".into());
        };
        match create_mlu(&Attrs::new(ops::schema(op_type), &node.attributes())) {
            Err(e) => Some(format!("invalid attributes ({e}); the CPU kernel reports the error")),
            Ok(kernel) => kernel.supported().err().or_else(|| match node.input_shapes() {
                Ok(shapes) => kernel.supported_shapes(&self.device.info, &shapes).err(),
                Err(m) => Some(format!("its input shapes cannot be read: {m}")),
            }),
        }
    }
}

unsafe extern "system" fn get_name(ep: *const OrtEp) -> *const c_char {
    this(ep).name.as_ptr()
}

fn capability(ep: &Ep, graph: Graph<'_>, info: SupportInfo<'_>) -> std::result::Result<(), String> {
    for node in graph.nodes()? {
        if node.domain()? != schema::DOMAIN {
            continue;
        }
        let op_type = node.op_type()?;
        let name = node.name()?;
        let reason =
            if info.has_kernel(node)? { ep.decline_reason(node, &op_type) } else { Some("no MLU kernel is registered for it".into()) };
        match reason {
            None => {
                info.claim(node)?;
                ep.logger.log(INFO, &format!("{EP_NAME}: mluops.{op_type} node '{name}' runs on MLU card {}", ep.card));
            }
            Some(why) => ep.logger.log(
                WARNING,
                &format!("{EP_NAME} declines mluops.{op_type} node '{name}' (it runs on CPU): {why}"),
            ),
        }
    }
    Ok(())
}

unsafe extern "system" fn get_capability(ep: *mut OrtEp, graph: *const OrtGraph, info: *mut OrtEpGraphSupportInfo) -> OrtStatusPtr {
    let ep = this(ep);
    // SAFETY: ORT's graph and support info, live for this call.
    let (graph, info) = unsafe { (Graph::from_raw(graph), SupportInfo::from_raw(info)) };
    guard("MLUExecutionProvider GetCapability", || match capability(ep, graph, info) {
        Ok(()) => ok(),
        Err(m) => status(OrtErrorCode::ORT_FAIL, &format!("{EP_NAME} GetCapability: {m}")),
    })
}

unsafe extern "system" fn get_kernel_registry(ep: *mut OrtEp, out: *mut *const OrtKernelRegistry) -> OrtStatusPtr {
    let ep = this(ep);
    guard("MLUExecutionProvider GetKernelRegistry", || {
        // SAFETY: the factory outlives the EPs it creates.
        match unsafe { &*ep.factory }.registry() {
            Ok(r) => {
                // SAFETY: ORT's out pointer.
                unsafe { *out = r };
                ok()
            }
            Err(e) => status(OrtErrorCode::ORT_FAIL, &format!("{EP_NAME}: kernel registry: {e}")),
        }
    })
}

unsafe extern "system" fn is_concurrent_run_supported(_: *mut OrtEp, out: *mut bool) -> OrtStatusPtr {
    // SAFETY: ORT's out pointer. Every kernel call takes its own queue.
    unsafe { *out = true };
    ok()
}
