//! The `mluops` custom-op domain: one `OrtCustomOp` per operator and type binding, all
//! derived from schemas/<family>/*.json, each creating a kernel from src/ops/ per node. The ops are
//! CPU-typed (no execution-provider type), so the same domain serves `RegisterCustomOps`
//! and, later, the MLU execution provider's factory.

use super::kernel::{ContextOutputs, KernelContext, KernelInfo, onnx_type};
use super::{api, check, cstring, guard};
use crate::error::{Error, Result};
use crate::ops::{Kernel, OpEntry};
use crate::schema::{self, Attrs, Schema};
use ort_sys::{
    ONNXTensorElementDataType as Ty, OrtApi, OrtCustomOp, OrtCustomOpDomain,
    OrtCustomOpInputOutputCharacteristic as Characteristic, OrtKernelContext, OrtKernelInfo,
    OrtMemType, OrtStatusPtr,
};
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::OnceLock;

/// One registered operator. `base` comes first so ONNX Runtime's `const OrtCustomOp*`
/// can be cast back to the whole struct.
#[repr(C)]
struct CustomOp {
    base: OrtCustomOp,
    entry: &'static OpEntry,
    schema: &'static Schema,
    name: CString,
    input_types: Vec<Ty>,
    output_types: Vec<Ty>,
}

/// The kernel of one node.
struct CustomKernel {
    op: &'static str,
    node: String,
    schema: &'static Schema,
    kernel: Box<dyn Kernel>,
}

fn this(op: *const OrtCustomOp) -> &'static CustomOp {
    // SAFETY: every OrtCustomOp we hand out is the first field of a leaked, never-freed
    // `CustomOp` (repr(C)), so the cast recovers it and it lives for the process.
    unsafe { &*(op as *const CustomOp) }
}

unsafe extern "system" fn get_name(op: *const OrtCustomOp) -> *const c_char {
    this(op).name.as_ptr()
}
unsafe extern "system" fn get_ep_type(_: *const OrtCustomOp) -> *const c_char {
    std::ptr::null()
}
unsafe extern "system" fn input_type(op: *const OrtCustomOp, i: usize) -> Ty {
    this(op).input_types.get(i).copied().unwrap_or(Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
}
unsafe extern "system" fn input_count(op: *const OrtCustomOp) -> usize {
    this(op).input_types.len()
}
unsafe extern "system" fn output_type(op: *const OrtCustomOp, i: usize) -> Ty {
    this(op).output_types.get(i).copied().unwrap_or(Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
}
unsafe extern "system" fn output_count(op: *const OrtCustomOp) -> usize {
    this(op).output_types.len()
}
unsafe extern "system" fn input_characteristic(op: *const OrtCustomOp, i: usize) -> Characteristic {
    match this(op).schema.inputs.get(i) {
        Some(f) if f.optional => Characteristic::INPUT_OUTPUT_OPTIONAL,
        _ => Characteristic::INPUT_OUTPUT_REQUIRED,
    }
}
unsafe extern "system" fn output_characteristic(
    op: *const OrtCustomOp,
    i: usize,
) -> Characteristic {
    match this(op).schema.outputs.get(i) {
        Some(f) if f.optional => Characteristic::INPUT_OUTPUT_OPTIONAL,
        _ => Characteristic::INPUT_OUTPUT_REQUIRED,
    }
}
unsafe extern "system" fn input_memory_type(_: *const OrtCustomOp, _: usize) -> OrtMemType {
    OrtMemType::OrtMemTypeDefault
}
unsafe extern "system" fn variadic_min_arity(_: *const OrtCustomOp) -> c_int {
    1
}
unsafe extern "system" fn variadic_homogeneity(_: *const OrtCustomOp) -> c_int {
    1
}
unsafe extern "system" fn start_version(_: *const OrtCustomOp) -> c_int {
    schema::OPSET_VERSION
}
unsafe extern "system" fn end_version(_: *const OrtCustomOp) -> c_int {
    c_int::MAX
}

unsafe extern "system" fn create_kernel(
    op: *const OrtCustomOp,
    _api: *const OrtApi,
    info: *const OrtKernelInfo,
    kernel: *mut *mut c_void,
) -> OrtStatusPtr {
    let op = this(op);
    // SAFETY: info is live during CreateKernelV2.
    let info = unsafe { KernelInfo::from_raw(info) };
    guard(op.entry.name, || {
        let node = info.node_name();
        let k = (op.entry.create)(&Attrs::new(op.schema, &info.attributes()))
            .map_err(|e| e.at(op.entry.name, &node))?;
        let boxed =
            Box::new(CustomKernel { op: op.entry.name, node, schema: op.schema, kernel: k });
        // SAFETY: `kernel` is ORT's out pointer; ORT hands the value back to compute and to
        // destroy, which frees it.
        unsafe { *kernel = Box::into_raw(boxed).cast() };
        Ok(())
    })
}

unsafe extern "system" fn compute(kernel: *mut c_void, ctx: *mut OrtKernelContext) -> OrtStatusPtr {
    // SAFETY: `kernel` is the CustomKernel create_kernel made; ORT may call compute from
    // several threads at once, which only needs shared access (Kernel: Sync).
    let k = unsafe { &*(kernel as *const CustomKernel) };
    // SAFETY: ctx is the live context of this call; nothing read through it outlives the call.
    let ctx = unsafe { KernelContext::from_raw(ctx) };
    guard(k.op, || {
        ctx.host_inputs(k.schema.input_names())
            .and_then(|inputs| {
                let mut host = ContextOutputs { ctx, names: k.schema.output_names() };
                k.kernel.compute(&inputs, &mut host, &ctx.pool())
            })
            .map_err(|e| e.at(k.op, &k.node))
    })
}

unsafe extern "system" fn destroy(kernel: *mut c_void) {
    if kernel.is_null() {
        return;
    }
    // SAFETY: `kernel` came from Box::into_raw in create_kernel and ORT destroys it once.
    let boxed = unsafe { Box::from_raw(kernel as *mut CustomKernel) };
    // Dropping runs no user code that can panic, but never let it unwind into ORT.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(boxed)));
}

fn custom_op(entry: &'static OpEntry, binding: Option<(String, crate::tensor::DType)>) -> CustomOp {
    let schema = crate::ops::schema(entry.name);
    let base = OrtCustomOp {
        version: super::API_VERSION,
        CreateKernel: None,
        GetName: Some(get_name),
        GetExecutionProviderType: Some(get_ep_type),
        GetInputType: Some(input_type),
        GetInputTypeCount: Some(input_count),
        GetOutputType: Some(output_type),
        GetOutputTypeCount: Some(output_count),
        KernelCompute: None,
        KernelDestroy: Some(destroy),
        GetInputCharacteristic: Some(input_characteristic),
        GetOutputCharacteristic: Some(output_characteristic),
        GetInputMemoryType: Some(input_memory_type),
        GetVariadicInputMinArity: Some(variadic_min_arity),
        GetVariadicInputHomogeneity: Some(variadic_homogeneity),
        GetVariadicOutputMinArity: Some(variadic_min_arity),
        GetVariadicOutputHomogeneity: Some(variadic_homogeneity),
        CreateKernelV2: Some(create_kernel),
        KernelComputeV2: Some(compute),
        InferOutputShapeFn: None,
        GetStartVersion: Some(start_version),
        GetEndVersion: Some(end_version),
        GetMayInplace: None,
        ReleaseMayInplace: None,
        GetAliasMap: None,
        ReleaseAliasMap: None,
    };
    CustomOp {
        base,
        entry,
        schema,
        name: cstring(entry.name),
        input_types: schema.inputs.iter().map(|f| onnx_type(schema.dtype(f, &binding))).collect(),
        output_types: schema.outputs.iter().map(|f| onnx_type(schema.dtype(f, &binding))).collect(),
    }
}

/// Every registered `OrtCustomOp`: one per operator and type binding, built once and kept
/// for the life of the process (ONNX Runtime holds raw pointers to them).
fn custom_ops() -> &'static [CustomOp] {
    static OPS: OnceLock<Vec<CustomOp>> = OnceLock::new();
    OPS.get_or_init(|| {
        crate::ops::ALL
            .iter()
            .flat_map(|e| {
                crate::ops::schema(e.name).bindings().into_iter().map(move |b| custom_op(e, b))
            })
            .collect()
    })
}

struct Domain(*mut OrtCustomOpDomain);
// SAFETY: the domain is built once and afterwards only read by ONNX Runtime.
unsafe impl Send for Domain {}
// SAFETY: as above.
unsafe impl Sync for Domain {}

/// The `mluops` domain, created once and shared by every registration (ONNX Runtime does
/// not take ownership; the domain lives as long as the process, like the ops it lists).
pub fn domain() -> Result<*mut OrtCustomOpDomain> {
    static DOMAIN: OnceLock<Domain> = OnceLock::new();
    if let Some(d) = DOMAIN.get() {
        return Ok(d.0);
    }
    let api = api();
    let name = cstring(schema::DOMAIN);
    let mut d: *mut OrtCustomOpDomain = std::ptr::null_mut();
    // SAFETY: name is a valid C string; `d` a valid out pointer.
    check(unsafe { (api.CreateCustomOpDomain)(name.as_ptr(), &mut d) })?;
    for op in custom_ops() {
        // SAFETY: `d` was just created; `op.base` lives for the process.
        if let Err(e) = check(unsafe { (api.CustomOpDomain_Add)(d, &op.base) }) {
            // SAFETY: `d` is ours and not registered anywhere yet.
            unsafe { (api.ReleaseCustomOpDomain)(d) };
            return Err(e);
        }
    }
    let stored = DOMAIN.get_or_init(|| Domain(d));
    if stored.0 != d {
        // Another thread won the race: drop our copy, keep the one already shared.
        // SAFETY: `d` is ours and was never handed to ONNX Runtime.
        unsafe { (api.ReleaseCustomOpDomain)(d) };
    }
    Ok(stored.0)
}

/// Adds the `mluops` domain to session options (the body of `RegisterCustomOps`).
///
/// # Safety
/// `options` must be null or the host's live session options.
pub unsafe fn register(options: *mut ort_sys::OrtSessionOptions) -> Result<()> {
    if options.is_null() {
        return Err(Error::Argument("RegisterCustomOps: session options are null".into()));
    }
    let d = domain()?;
    // SAFETY: options is the host's live session options; the domain outlives it.
    check(unsafe { (api().AddCustomOpDomain)(options, d) })
}
