//! The EP's kernel registry: one kernel per `mluops` operator, running the operator's BANG
//! kernels on the EP's card. Inputs and outputs live in card memory and stay there: the
//! host reads shapes, the few bytes of the size inputs and the value checks' records
//! (`ops::device`). Only a node whose sizes exceed the kernels' limits copies its inputs to
//! the host, to run its CPU kernel.

use super::provider::Ep;
use super::{EP_NAME, ep_api, version};
use crate::error::{Error, NodeError, Result};
use crate::mlu::{Buffer, Device, Direction};
use crate::ops::device::{DeviceOutputs, MluKernel, card_inputs, read_sizes};
use crate::ops::{ALL, Kernel, OpEntry, OwnedOutputs};
use crate::parallel::Serial;
use crate::ort::custom_op::InfoAttributes;
use crate::ort::ep_ffi::{OrtEp, OrtKernelCreateFunc, OrtKernelDefBuilder, OrtKernelImpl, OrtKernelRegistry};
use crate::ort::kernel::{dtype_of, not_allocated};
use crate::ort::{api, check, cstring, guard, node_status, read_string};
use crate::schema::{self, Attrs, Schema};
use crate::tensor::{DType, Inputs, OutputSpec, OwnedData, Tensor, TensorRef};
use ort_sys::{ONNXTensorElementDataType as Ty, OrtKernelContext, OrtKernelInfo, OrtMemType, OrtStatusPtr, OrtValue};
use std::ffi::c_void;
use std::sync::Arc;

/// The registry ONNX Runtime asks every EP instance for; built once per factory.
pub struct Registry(pub *mut OrtKernelRegistry);

// SAFETY: built once, then only read by ONNX Runtime.
unsafe impl Send for Registry {}
// SAFETY: as above.
unsafe impl Sync for Registry {}

impl Drop for Registry {
    fn drop(&mut self) {
        // SAFETY: created by CreateKernelRegistry and released once.
        unsafe { (ep_api().ReleaseKernelRegistry)(self.0) };
    }
}

struct Builder(*mut OrtKernelDefBuilder);

impl Drop for Builder {
    fn drop(&mut self) {
        // SAFETY: created by CreateKernelDefBuilder and released once.
        unsafe { (ep_api().ReleaseKernelDefBuilder)(self.0) };
    }
}

fn ort(what: &str) -> impl FnOnce(String) -> Error + '_ {
    move |m| Error::Runtime(format!("{what}: {m}"))
}

/// Where a kernel wants one of its tensors in host memory.
enum HostSide {
    None,
    Input0,
    Output0,
}

/// Adds one kernel (opset 1 and later, EP `MLUExecutionProvider`) to the registry.
fn add_kernel(
    registry: &Registry,
    op: &str,
    domain: &str,
    host: HostSide,
    create: OrtKernelCreateFunc,
    state: *mut c_void,
) -> Result<()> {
    let ep = ep_api();
    let mut b = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check(unsafe { (ep.CreateKernelDefBuilder)(&mut b) }).map_err(ort("CreateKernelDefBuilder"))?;
    let builder = Builder(b);
    let (op, domain, ep_name) = (cstring(op), cstring(domain), cstring(EP_NAME));
    let mut def = std::ptr::null_mut();
    // SAFETY: the builder is live; the strings outlive the calls (ORT copies them).
    unsafe {
        check((ep.KernelDefBuilder_SetOperatorType)(builder.0, op.as_ptr())).map_err(ort("SetOperatorType"))?;
        check((ep.KernelDefBuilder_SetDomain)(builder.0, domain.as_ptr())).map_err(ort("SetDomain"))?;
        check((ep.KernelDefBuilder_SetSinceVersion)(builder.0, schema::OPSET_VERSION, i32::MAX))
            .map_err(ort("SetSinceVersion"))?;
        check((ep.KernelDefBuilder_SetExecutionProvider)(builder.0, ep_name.as_ptr())).map_err(ort("SetExecutionProvider"))?;
        match host {
            HostSide::None => {}
            HostSide::Input0 => check((ep.KernelDefBuilder_SetInputMemType)(builder.0, 0, OrtMemType::OrtMemTypeCPUInput))
                .map_err(ort("SetInputMemType"))?,
            HostSide::Output0 => check((ep.KernelDefBuilder_SetOutputMemType)(builder.0, 0, OrtMemType::OrtMemTypeCPUOutput))
                .map_err(ort("SetOutputMemType"))?,
        }
        check((ep.KernelDefBuilder_Build)(builder.0, &mut def)).map_err(ort("KernelDefBuilder_Build"))?;
    }
    // SAFETY: registry and def are live; `state` outlives the registry.
    let added = check(unsafe { (ep.KernelRegistry_AddKernel)(registry.0, def, create, state) });
    // SAFETY: the registry keeps its own reference to the definition.
    unsafe { (ep.ReleaseKernelDef)(def) };
    added.map_err(ort("KernelRegistry_AddKernel"))
}

/// Builds the registry: the operators that have BANG kernels (domain `mluops`) and the copies ONNX Runtime
/// inserts between CPU nodes and MLU nodes, which run as this EP's `MemcpyFromHost` /
/// `MemcpyToHost` kernels (ONNX domain; host side declared as CPU memory). No type
/// constraints are added: the `mluops` schemas already fix each input's element type, every
/// type they allow has a BANG kernel (ThreeInterpolateBackward: float and float16), and the
/// copies move bytes of any type.
pub fn registry() -> Result<Registry> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check(unsafe { (ep_api().CreateKernelRegistry)(&mut raw) }).map_err(ort("CreateKernelRegistry"))?;
    let registry = Registry(raw);
    for entry in ALL.iter().filter(|e| e.create_mlu.is_some()) {
        let state = (entry as *const OpEntry).cast_mut().cast::<c_void>();
        add_kernel(&registry, entry.name, schema::DOMAIN, HostSide::None, create_kernel, state)?;
    }
    let to_device = (&TO_DEVICE as *const Direction).cast_mut().cast::<c_void>();
    add_kernel(&registry, "MemcpyFromHost", "", HostSide::Input0, create_memcpy, to_device)?;
    let to_host = (&TO_HOST as *const Direction).cast_mut().cast::<c_void>();
    add_kernel(&registry, "MemcpyToHost", "", HostSide::Output0, create_memcpy, to_host)?;
    Ok(registry)
}

static TO_DEVICE: Direction = Direction::HostToDevice;
static TO_HOST: Direction = Direction::DeviceToHost;

/// A MemcpyFromHost / MemcpyToHost node.
#[repr(C)]
struct MemcpyKernel {
    base: OrtKernelImpl,
    dir: Direction,
    ep: *const Ep,
}

/// The EP a kernel is created for.
fn kernel_ep(info: *const OrtKernelInfo) -> Result<*const Ep> {
    let mut ep: *const OrtEp = std::ptr::null();
    // SAFETY: info is live during kernel creation; `ep` is a valid out pointer.
    check(unsafe { (ep_api().KernelInfo_GetEp)(info, &mut ep) }).map_err(ort("KernelInfo_GetEp"))?;
    if ep.is_null() {
        return Err(Error::Runtime("KernelInfo_GetEp returned no EP".into()));
    }
    // Only kernels of this registry's EP type reach here: the OrtEp is an Ep.
    Ok(ep.cast())
}

unsafe extern "system" fn create_memcpy(state: *mut c_void, info: *const OrtKernelInfo, out: *mut *mut OrtKernelImpl) -> OrtStatusPtr {
    // SAFETY: `state` is TO_DEVICE or TO_HOST.
    let dir = unsafe { *(state as *const Direction) };
    guard("MLUExecutionProvider Memcpy", || match kernel_ep(info) {
        Ok(ep) => {
            let k = Box::new(MemcpyKernel { base: kernel_impl(memcpy_compute, memcpy_release), dir, ep });
            // SAFETY: ORT's out pointer; freed by memcpy_release.
            unsafe { *out = Box::into_raw(k).cast() };
            OrtStatusPtr(std::ptr::null_mut())
        }
        Err(e) => crate::ort::status(ort_sys::OrtErrorCode::ORT_FAIL, &format!("{EP_NAME} Memcpy: {e}")),
    })
}

unsafe extern "system" fn memcpy_release(this: *mut OrtKernelImpl) {
    if !this.is_null() {
        // SAFETY: from Box::into_raw in create_memcpy; released once.
        drop(unsafe { Box::from_raw(this as *mut MemcpyKernel) });
    }
}

impl MemcpyKernel {
    fn run(&self, ctx: *mut OrtKernelContext) -> Result<()> {
        let api = api();
        let mut input: *const OrtValue = std::ptr::null();
        // SAFETY: ctx is live; valid out pointers throughout; the shape reference lives as
        // long as the input.
        unsafe {
            check((api.KernelContext_GetInput)(ctx, 0, &mut input)).map_err(ort("KernelContext_GetInput"))?;
            let (mut ty, mut dims, mut rank) = (Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, std::ptr::null(), 0usize);
            check((api.GetTensorElementTypeAndShapeDataReference)(input, &mut ty, &mut dims, &mut rank))
                .map_err(ort("GetTensorElementTypeAndShapeDataReference"))?;
            let mut output: *mut OrtValue = std::ptr::null_mut();
            check((api.KernelContext_GetOutput)(ctx, 0, dims, rank, &mut output)).map_err(ort("KernelContext_GetOutput"))?;
            let (mut bytes, mut src, mut dst) = (0usize, std::ptr::null(), std::ptr::null_mut());
            check((api.GetTensorSizeInBytes)(input, &mut bytes)).map_err(ort("GetTensorSizeInBytes"))?;
            check((api.GetTensorData)(input, &mut src)).map_err(ort("GetTensorData"))?;
            check((api.GetTensorMutableData)(output, &mut dst)).map_err(ort("GetTensorMutableData"))?;
            // SAFETY: same shape and type on both sides, `bytes` bytes each, on the sides
            // the kernel definition declares.
            (*self.ep).device().copy_raw(dst, src, bytes, self.dir)
        }
    }
}

unsafe extern "system" fn memcpy_compute(this: *mut OrtKernelImpl, ctx: *mut OrtKernelContext) -> OrtStatusPtr {
    // SAFETY: `this` is a MemcpyKernel made by create_memcpy.
    let k = unsafe { &*(this as *const MemcpyKernel) };
    guard("MLUExecutionProvider Memcpy", || match k.run(ctx) {
        Ok(()) => OrtStatusPtr(std::ptr::null_mut()),
        Err(e) => crate::ort::status(ort_sys::OrtErrorCode::ORT_FAIL, &format!("{EP_NAME} {:?}: {e}", k.dir)),
    })
}

fn kernel_impl(
    compute: unsafe extern "system" fn(*mut OrtKernelImpl, *mut OrtKernelContext) -> OrtStatusPtr,
    release: unsafe extern "system" fn(*mut OrtKernelImpl),
) -> OrtKernelImpl {
    OrtKernelImpl {
        ort_version_supported: version(),
        flags: 0,
        Compute: Some(compute),
        Release: Some(release),
        PrePackWeight: None,
        SetSharedPrePackedWeight: None,
    }
}

/// One node's kernel. `base` comes first so ONNX Runtime's `OrtKernelImpl*` casts back.
#[repr(C)]
struct NodeKernel {
    base: OrtKernelImpl,
    op: &'static str,
    node: String,
    schema: &'static Schema,
    kernel: Box<dyn MluKernel>,
    /// The node's CPU kernel: runs a node whose run-time sizes exceed the MLU kernels'
    /// limits ([`Error::MluLimit`]).
    host: Box<dyn Kernel>,
    ep: *const Ep,
}

unsafe extern "system" fn create_kernel(state: *mut c_void, info: *const OrtKernelInfo, out: *mut *mut OrtKernelImpl) -> OrtStatusPtr {
    // SAFETY: `state` is the 'static OpEntry registered with this function.
    let entry = unsafe { &*(state as *const OpEntry) };
    guard(entry.name, || {
        let node = read_string(|buf, size| {
            // SAFETY: info is live during kernel creation; buf is null or holds *size bytes.
            unsafe { (api().KernelInfo_GetNodeName)(info, buf, size) }
        })
        .unwrap_or_default();
        let fail = |error| node_status(&NodeError { op: entry.name, node: node.clone(), error });
        let ep = match kernel_ep(info) {
            Ok(ep) => ep,
            Err(e) => return fail(e),
        };
        let schema = crate::ops::schema(entry.name);
        let Some(create_mlu) = entry.create_mlu else {
            return fail(Error::Runtime("no MLU kernel for this operator".into()));
        };
        let source = InfoAttributes { info };
        let attrs = Attrs::new(schema, &source);
        match create_mlu(&attrs).and_then(|kernel| Ok((kernel, (entry.create)(&attrs)?))) {
            Ok((kernel, host)) => {
                let k = Box::new(NodeKernel {
                    base: kernel_impl(compute, release),
                    op: entry.name,
                    node: node.clone(),
                    schema,
                    kernel,
                    host,
                    ep,
                });
                // SAFETY: ORT's out pointer; the box is freed by `release`.
                unsafe { *out = Box::into_raw(k).cast() };
                OrtStatusPtr(std::ptr::null_mut())
            }
            Err(error) => fail(error),
        }
    })
}

unsafe extern "system" fn release(this: *mut OrtKernelImpl) {
    if this.is_null() {
        return;
    }
    // SAFETY: `this` came from Box::into_raw in create_kernel; ORT releases it once.
    let k = unsafe { Box::from_raw(this as *mut NodeKernel) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(k)));
}

/// One input as ONNX Runtime holds it: shape, element type and card address.
struct DeviceInput {
    shape: Vec<i64>,
    dtype: DType,
    ptr: *mut c_void,
}

/// # Safety
/// `ctx` is the live kernel context of the current compute call.
unsafe fn device_input(ctx: *const OrtKernelContext, i: usize) -> Result<Option<DeviceInput>> {
    let api = api();
    let mut value: *const OrtValue = std::ptr::null();
    // SAFETY: ctx is live; valid out pointer.
    check(unsafe { (api.KernelContext_GetInput)(ctx, i, &mut value) }).map_err(ort("KernelContext_GetInput"))?;
    if value.is_null() {
        return Ok(None);
    }
    let (mut ty, mut dims, mut rank) = (Ty::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, std::ptr::null(), 0usize);
    // SAFETY: value is a live tensor; out pointers valid; the dims stay valid for the call.
    check(unsafe { (api.GetTensorElementTypeAndShapeDataReference)(value, &mut ty, &mut dims, &mut rank) })
        .map_err(ort("GetTensorElementTypeAndShapeDataReference"))?;
    let shape = if rank == 0 {
        Vec::new()
    } else {
        // SAFETY: ORT returned `rank` dims at `dims`.
        unsafe { std::slice::from_raw_parts(dims, rank) }.to_vec()
    };
    let mut ptr = std::ptr::null_mut();
    // SAFETY: value is a live tensor; we only read through the pointer.
    check(unsafe { (api.GetTensorMutableData)(value.cast_mut(), &mut ptr) }).map_err(ort("GetTensorMutableData"))?;
    let dtype = dtype_of(ty).ok_or_else(|| Error::Runtime(format!("input {i} has unsupported element type {ty:?}")))?;
    Ok(Some(DeviceInput { shape, dtype, ptr }))
}

/// Outputs allocated in card memory through the kernel context, and the node's scratch
/// card memory, freed when this is dropped (after the queue's synchronisation).
struct ContextOutputs {
    ctx: *mut OrtKernelContext,
    schema: &'static Schema,
    device: Arc<Device>,
    scratch: Vec<Buffer>,
}

impl DeviceOutputs for ContextOutputs {
    fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void> {
        let api = api();
        let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
        let mut value: *mut OrtValue = std::ptr::null_mut();
        // SAFETY: ctx is the live context of this compute call; dims has dims.len() values.
        check(unsafe { (api.KernelContext_GetOutput)(self.ctx, index, dims.as_ptr(), dims.len(), &mut value) })
            .map_err(ort("KernelContext_GetOutput"))?;
        let mut data = std::ptr::null_mut();
        if !value.is_null() {
            // SAFETY: value is the output just allocated.
            check(unsafe { (api.GetTensorMutableData)(value, &mut data) }).map_err(ort("GetTensorMutableData"))?;
        }
        if spec.numel() > 0 && data.is_null() {
            let name = self.schema.outputs.get(index).map_or_else(|| format!("#{index}"), |f| f.name.clone());
            return Err(Error::Runtime(format!("output '{name}': {}", not_allocated(spec, "card"))));
        }
        Ok(data)
    }

    fn workspace(&mut self, bytes: usize) -> Result<*mut c_void> {
        self.device.alloc_kept(bytes, &mut self.scratch)
    }
}

impl NodeKernel {
    fn run(&self, ctx: *mut OrtKernelContext) -> Result<()> {
        // SAFETY: the EP outlives the kernels of its sessions.
        let ep = unsafe { &*self.ep };
        let device = ep.device();
        let mut count = 0usize;
        // SAFETY: ctx is live.
        check(unsafe { (api().KernelContext_GetInputCount)(ctx, &mut count) }).map_err(ort("KernelContext_GetInputCount"))?;
        let names = self.schema.input_names();
        let mut on_device = Vec::with_capacity(names.len());
        for i in 0..names.len() {
            // SAFETY: ctx is live; indices past the node's inputs are absent optionals.
            on_device.push(if i < count { unsafe { device_input(ctx, i)? } } else { None });
        }
        let described: Vec<Option<(DType, Vec<i64>)>> =
            on_device.iter().map(|d| d.as_ref().map(|d| (d.dtype, d.shape.clone()))).collect();
        let ptrs: Vec<*const c_void> =
            on_device.iter().map(|d| d.as_ref().map_or(std::ptr::null(), |d| d.ptr.cast_const())).collect();
        let sizes = read_sizes(device, self.kernel.size_inputs(), &described, &ptrs)?;
        let inputs = card_inputs(names.clone(), &described, &sizes)?;
        let queue = ep.queue()?;
        let mut card = ContextOutputs { ctx, schema: self.schema, device: Arc::clone(device), scratch: Vec::new() };
        // Synchronises the queue once, on every path (ops::device's rule).
        let result = self.kernel.run_on_card(device, &queue, &inputs, &ptrs, &mut card);
        ep.recycle(queue);
        match result {
            Err(Error::MluLimit(why)) => {
                log::warn!("{} node '{}' runs on the host CPU: {why}", self.op, self.node);
                self.run_on_host(device, names, &on_device, &mut card)
            }
            other => other,
        }
    }

    /// Copies the inputs to the host, runs the CPU kernel on them, then copies its outputs
    /// into the node's card outputs.
    fn run_on_host(
        &self,
        device: &Device,
        names: Vec<String>,
        on_device: &[Option<DeviceInput>],
        card: &mut ContextOutputs,
    ) -> Result<()> {
        let mut staged = Vec::with_capacity(on_device.len());
        for (name, input) in names.iter().zip(on_device) {
            staged.push(match input {
                None => None,
                Some(d) => {
                    let dims = d
                        .shape
                        .iter()
                        .map(|&x| usize::try_from(x))
                        .collect::<std::result::Result<Vec<usize>, _>>()
                        .map_err(|_| Error::Runtime(format!("negative dimension in {:?}", d.shape)))?;
                    let spec = OutputSpec::new(d.dtype, dims);
                    let mut data = OwnedData::poisoned(&spec, &format!("the host copy of input '{name}'"))?;
                    // SAFETY: `data` holds spec.bytes() bytes; d.ptr is the card tensor of as many.
                    unsafe { device.copy_raw(data.as_mut_ptr(), d.ptr, spec.bytes(), Direction::DeviceToHost)? };
                    Some(Tensor { shape: spec.shape, data })
                }
            });
        }
        let refs: Vec<Option<TensorRef<'_>>> = staged.iter().map(|t| t.as_ref().map(Tensor::view)).collect();
        let inputs = Inputs::new(names, refs)?;
        let mut host = OwnedOutputs::named(self.schema.output_names());
        let cpu: &dyn Kernel = &*self.kernel;
        cpu.compute(&inputs, &mut host, &Serial)?;
        for (i, (spec, data)) in host.specs.iter().zip(&host.data).enumerate() {
            let dst = card.allocate(i, spec)?;
            let bytes = spec.bytes();
            if bytes > 0 {
                // SAFETY: `dst` is the card output just allocated for `spec`, `data` the host
                // buffer of the same spec: both hold `bytes` bytes.
                unsafe { device.copy_raw(dst, data.as_ptr(), bytes, Direction::HostToDevice)? };
            }
        }
        Ok(())
    }
}

unsafe extern "system" fn compute(this: *mut OrtKernelImpl, ctx: *mut OrtKernelContext) -> OrtStatusPtr {
    // SAFETY: `this` is a NodeKernel made by create_kernel; compute only needs shared access.
    let k = unsafe { &*(this as *const NodeKernel) };
    guard(k.op, || match k.run(ctx) {
        Ok(()) => OrtStatusPtr(std::ptr::null_mut()),
        Err(error) => node_status(&NodeError { op: k.op, node: k.node.clone(), error }),
    })
}
