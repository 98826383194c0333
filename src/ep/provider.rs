//! One `MLUExecutionProvider` instance (per session): partitioning (`GetCapability`) and
//! the queues its kernels launch on.

use super::factory::Factory;
use super::{EP_NAME, INFO, WARNING, ep_api, version, Logger};
use crate::error::Result;
use crate::mlu::{Device, Queue};
use crate::ops;
use crate::ort::ep_ffi::{OrtEp, OrtEpGraphSupportInfo, OrtKernelDef, OrtKernelRegistry};
use crate::ort::{api, check, cstring, guard, status};
use crate::schema::{self, AttrKind, AttrValue, AttributeSource, Attrs};
use ort_sys::{OrtErrorCode, OrtGraph, OrtNode, OrtOpAttr, OrtOpAttrType, OrtStatusPtr, OrtValueInfo};
use std::ffi::{CStr, CString, c_char, c_void};
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
    fn decline_reason(&self, node: *const OrtNode, op_type: &str) -> Option<String> {
        let Some(entry) = ops::entry(op_type) else {
            return Some("not an operator of this library".into());
        };
        let Some(create_mlu) = entry.create_mlu else {
            return Some("no MLU kernel for this operator (its CPU kernel runs it)".into());
        };
        let source = NodeAttributes { node };
        match create_mlu(&Attrs::new(ops::schema(op_type), &source)) {
            Err(e) => Some(format!("invalid attributes ({e}); the CPU kernel reports the error")),
            Ok(kernel) => kernel.supported().err().or_else(|| match input_shapes(node) {
                Ok(shapes) => kernel.supported_shapes(&self.device.info, &shapes).err(),
                Err(m) => Some(format!("its input shapes cannot be read: {m}")),
            }),
        }
    }
}

/// The node's input shapes as the graph declares them.
fn input_shapes(node: *const OrtNode) -> std::result::Result<Vec<Option<Vec<Option<usize>>>>, String> {
    let api = api();
    let mut n = 0usize;
    // SAFETY: node is live during GetCapability; valid out pointers throughout.
    check(unsafe { (api.Node_GetNumInputs)(node, &mut n) })?;
    let mut inputs: Vec<*const OrtValueInfo> = vec![std::ptr::null(); n];
    // SAFETY: `inputs` holds n slots.
    check(unsafe { (api.Node_GetInputs)(node, inputs.as_mut_ptr(), n) })?;
    let mut shapes = Vec::with_capacity(n);
    for v in inputs {
        if v.is_null() {
            shapes.push(None);
            continue;
        }
        let mut type_info = std::ptr::null();
        let mut tensor = std::ptr::null();
        let mut rank = 0usize;
        // SAFETY: v is a live value info of the node; the type info it returns is owned by
        // the graph.
        unsafe {
            check((api.GetValueInfoTypeInfo)(v, &mut type_info))?;
            check((api.CastTypeInfoToTensorInfo)(type_info, &mut tensor))?;
        }
        if tensor.is_null() {
            shapes.push(None);
            continue;
        }
        // SAFETY: tensor is a live shape info.
        check(unsafe { (api.GetDimensionsCount)(tensor, &mut rank) })?;
        let mut dims = vec![0i64; rank];
        // SAFETY: dims holds rank values.
        check(unsafe { (api.GetDimensions)(tensor, dims.as_mut_ptr(), rank) })?;
        shapes.push(Some(dims.into_iter().map(|d| usize::try_from(d).ok()).collect()));
    }
    Ok(shapes)
}

unsafe extern "system" fn get_name(ep: *const OrtEp) -> *const c_char {
    this(ep).name.as_ptr()
}

/// Reads a C string ONNX Runtime returned through an out pointer.
fn ort_str(call: impl FnOnce(*mut *const c_char) -> OrtStatusPtr) -> std::result::Result<String, String> {
    let mut p: *const c_char = std::ptr::null();
    check(call(&mut p))?;
    if p.is_null() {
        return Ok(String::new());
    }
    // SAFETY: ORT returned a NUL-terminated string that lives as long as the graph.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn capability(ep: &Ep, graph: *const OrtGraph, info: *mut OrtEpGraphSupportInfo) -> std::result::Result<(), String> {
    let api = api();
    let mut n = 0usize;
    // SAFETY: graph is live for the call; valid out pointer.
    check(unsafe { (api.Graph_GetNumNodes)(graph, &mut n) })?;
    let mut nodes: Vec<*const OrtNode> = vec![std::ptr::null(); n];
    // SAFETY: `nodes` holds n slots.
    check(unsafe { (api.Graph_GetNodes)(graph, nodes.as_mut_ptr(), n) })?;
    for node in nodes {
        // SAFETY (the three string reads): node is a live node of the graph.
        let domain = ort_str(|p| unsafe { (api.Node_GetDomain)(node, p) })?;
        if domain != schema::DOMAIN {
            continue;
        }
        let op_type = ort_str(|p| unsafe { (api.Node_GetOperatorType)(node, p) })?;
        let name = ort_str(|p| unsafe { (api.Node_GetName)(node, p) })?;
        let mut def: *const OrtKernelDef = std::ptr::null();
        // SAFETY: info and node are live; valid out pointer.
        check(unsafe { (ep_api().EpGraphSupportInfo_LookUpKernel)(info, node, &mut def) })?;
        let reason = if def.is_null() { Some("no MLU kernel is registered for it".into()) } else { ep.decline_reason(node, &op_type) };
        match reason {
            None => {
                // SAFETY: info and node are live.
                check(unsafe { (ep_api().EpGraphSupportInfo_AddSingleNode)(info, node) })?;
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
    guard("MLUExecutionProvider GetCapability", || match capability(ep, graph, info) {
        Ok(()) => OrtStatusPtr(std::ptr::null_mut()),
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
                OrtStatusPtr(std::ptr::null_mut())
            }
            Err(e) => status(OrtErrorCode::ORT_FAIL, &format!("{EP_NAME}: kernel registry: {e}")),
        }
    })
}

unsafe extern "system" fn is_concurrent_run_supported(_: *mut OrtEp, out: *mut bool) -> OrtStatusPtr {
    // SAFETY: ORT's out pointer. Every kernel call takes its own queue.
    unsafe { *out = true };
    OrtStatusPtr(std::ptr::null_mut())
}

/// A node's attributes, read through the graph API during partitioning.
struct NodeAttributes {
    node: *const OrtNode,
}

impl NodeAttributes {
    fn find(&self, name: &str) -> std::result::Result<Option<*const OrtOpAttr>, String> {
        let api = api();
        let mut n = 0usize;
        // SAFETY: node is live during GetCapability; valid out pointer.
        check(unsafe { (api.Node_GetNumAttributes)(self.node, &mut n) })?;
        let mut attrs: Vec<*const OrtOpAttr> = vec![std::ptr::null(); n];
        // SAFETY: `attrs` holds n slots.
        check(unsafe { (api.Node_GetAttributes)(self.node, attrs.as_mut_ptr(), n) })?;
        for a in attrs {
            // SAFETY: a is a live attribute of the node.
            if ort_str(|p| unsafe { (api.OpAttr_GetName)(a, p) })? == name {
                return Ok(Some(a));
            }
        }
        Ok(None)
    }
}

/// Reads the raw bytes of an attribute's value. Scalars are read into a buffer of their
/// size; lists and strings ask `ReadOpAttr` for the size first. A scalar whose value field
/// is absent from the protobuf (writers may omit a 0) reads as 0, as through the kernel
/// info API.
fn read_attr(a: *const OrtOpAttr, ty: OrtOpAttrType) -> std::result::Result<Vec<u8>, String> {
    let api = api();
    let scalar = match ty {
        OrtOpAttrType::ORT_OP_ATTR_INT => Some(8),
        OrtOpAttrType::ORT_OP_ATTR_FLOAT => Some(4),
        _ => None,
    };
    let needed = match scalar {
        Some(n) => n,
        None => {
            let mut needed = 0usize;
            // SAFETY: size query; ORT writes the required size (the status says the empty
            // buffer is too small and is dropped).
            let _ = check(unsafe { (api.ReadOpAttr)(a, ty, std::ptr::null_mut(), 0, &mut needed) });
            needed
        }
    };
    if needed == 0 {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; needed];
    let mut got = 0usize;
    // SAFETY: buf holds `needed` bytes.
    match check(unsafe { (api.ReadOpAttr)(a, ty, buf.as_mut_ptr().cast::<c_void>(), needed, &mut got) }) {
        Ok(()) => {
            buf.truncate(got);
            Ok(buf)
        }
        Err(m) if scalar.is_some() && m.contains("has no") => Ok(vec![0u8; needed]),
        Err(m) => Err(m),
    }
}

impl AttributeSource for NodeAttributes {
    fn get(&self, name: &str, kind: AttrKind) -> std::result::Result<Option<AttrValue>, String> {
        let Some(a) = self.find(name)? else { return Ok(None) };
        let mut ty = OrtOpAttrType::ORT_OP_ATTR_UNDEFINED;
        // SAFETY: a is a live attribute; valid out pointer.
        check(unsafe { (api().OpAttr_GetType)(a, &mut ty) })?;
        let want = match kind {
            AttrKind::Int => OrtOpAttrType::ORT_OP_ATTR_INT,
            AttrKind::Ints => OrtOpAttrType::ORT_OP_ATTR_INTS,
            AttrKind::Float => OrtOpAttrType::ORT_OP_ATTR_FLOAT,
            AttrKind::String => OrtOpAttrType::ORT_OP_ATTR_STRING,
        };
        if ty != want {
            return Err(format!("expected type {kind:?}, the node has {ty:?}"));
        }
        let bytes = read_attr(a, ty)?;
        let ints = || bytes.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect::<Vec<_>>();
        Ok(Some(match kind {
            AttrKind::Int => AttrValue::Int(*ints().first().ok_or("empty int attribute")?),
            AttrKind::Ints => AttrValue::Ints(ints()),
            AttrKind::Float => {
                AttrValue::Float(f32::from_ne_bytes(bytes.get(..4).ok_or("empty float attribute")?.try_into().expect("4 bytes")))
            }
            AttrKind::String => AttrValue::String(crate::ort::attribute_text(bytes)?),
        }))
    }
}
