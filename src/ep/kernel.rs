//! The EP's kernel registry: one kernel per `mluops` operator, running the operator's BANG
//! kernels on the EP's card. Inputs and outputs live in card memory and stay there: the
//! host reads shapes, the few bytes of the size inputs and the value checks' records
//! (`ops::device`). Only a node whose sizes exceed the kernels' limits copies its inputs to
//! the host, to run its CPU kernel.

use super::EP_NAME;
use super::provider::Ep;
use super::traffic;
use crate::error::{Error, NodeError, Result};
use crate::ffi::ep_abi::{OrtKernelCreateFunc, OrtKernelImpl};
use crate::ffi::kernel::{ContextTensor, KernelContext, KernelInfo};
use crate::ffi::registry::{HostSide, KernelRegistry};
use crate::ffi::{guard, node_status, ok, status, version};
use crate::mlu::{Buffer, Device, Direction};
use crate::ops::device::{DeviceOutputs, MluKernel, card_inputs, read_sizes};
use crate::ops::{ALL, Kernel, OpEntry, OwnedOutputs};
use crate::parallel::Serial;
use crate::schema::{self, Attrs, Schema};
use crate::tensor::{DType, Inputs, OutputSpec, OwnedData, Tensor, TensorRef};
use ort_sys::{OrtErrorCode, OrtKernelContext, OrtKernelInfo, OrtStatusPtr};
use std::ffi::c_void;
use std::sync::Arc;

/// Builds the registry: the operators that have BANG kernels (domain `mluops`) and the copies ONNX Runtime
/// inserts between CPU nodes and MLU nodes, which run as this EP's `MemcpyFromHost` /
/// `MemcpyToHost` kernels (ONNX domain; host side declared as CPU memory). No type
/// constraints are added: the `mluops` schemas already fix each input's element type, every
/// type they allow has a BANG kernel (ThreeInterpolateBackward: float and float16), and the
/// copies move bytes of any type.
pub fn registry() -> Result<KernelRegistry> {
    let registry = KernelRegistry::new()?;
    let add = |op: &str, domain: &str, host: HostSide, create: OrtKernelCreateFunc, state: *const c_void| {
        // SAFETY: each `create` below takes the state it is registered with, a 'static
        // OpEntry or Direction.
        unsafe { registry.add(op, domain, EP_NAME, host, create, state.cast_mut()) }
    };
    for entry in ALL.iter().filter(|e| e.create_mlu.is_some()) {
        add(entry.name, schema::DOMAIN, HostSide::None, create_kernel, (entry as *const OpEntry).cast())?;
    }
    add("MemcpyFromHost", "", HostSide::Input0, create_memcpy, (&TO_DEVICE as *const Direction).cast())?;
    add("MemcpyToHost", "", HostSide::Output0, create_memcpy, (&TO_HOST as *const Direction).cast())?;
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
fn kernel_ep(info: KernelInfo<'_>) -> Result<*const Ep> {
    // Only kernels of this registry's EP type reach here: the OrtEp is an Ep.
    Ok(info.ep()?.cast())
}

unsafe extern "system" fn create_memcpy(state: *mut c_void, info: *const OrtKernelInfo, out: *mut *mut OrtKernelImpl) -> OrtStatusPtr {
    // SAFETY: `state` is TO_DEVICE or TO_HOST.
    let dir = unsafe { *(state as *const Direction) };
    // SAFETY: info is live during kernel creation.
    let info = unsafe { KernelInfo::from_raw(info) };
    guard("MLUExecutionProvider Memcpy", || match kernel_ep(info) {
        Ok(ep) => {
            let k = Box::new(MemcpyKernel { base: kernel_impl(memcpy_compute, memcpy_release), dir, ep });
            // SAFETY: ORT's out pointer; freed by memcpy_release.
            unsafe { *out = Box::into_raw(k).cast() };
            ok()
        }
        Err(e) => status(OrtErrorCode::ORT_FAIL, &format!("{EP_NAME} Memcpy: {e}")),
    })
}

unsafe extern "system" fn memcpy_release(this: *mut OrtKernelImpl) {
    if !this.is_null() {
        // SAFETY: from Box::into_raw in create_memcpy; released once.
        drop(unsafe { Box::from_raw(this as *mut MemcpyKernel) });
    }
}

impl MemcpyKernel {
    fn run(&self, ctx: KernelContext<'_>) -> Result<()> {
        let input = ctx.input(0)?.ok_or_else(|| Error::Runtime("Memcpy without an input".into()))?;
        let (_, dims) = input.type_and_shape()?;
        let output = ctx.output(0, dims)?;
        let bytes = input.size_in_bytes()?;
        let (src, dst) = (input.data()?, output.data()?);
        // SAFETY: the EP outlives the kernels of its sessions. Same shape and type on both
        // sides, `bytes` bytes each, on the sides the kernel definition declares.
        unsafe { (*self.ep).device().copy_raw(dst, src, bytes, self.dir) }
    }
}

unsafe extern "system" fn memcpy_compute(this: *mut OrtKernelImpl, ctx: *mut OrtKernelContext) -> OrtStatusPtr {
    // SAFETY: `this` is a MemcpyKernel made by create_memcpy.
    let k = unsafe { &*(this as *const MemcpyKernel) };
    // SAFETY: ctx is the live context of this call.
    let ctx = unsafe { KernelContext::from_raw(ctx) };
    guard("MLUExecutionProvider Memcpy", || match k.run(ctx) {
        Ok(()) => ok(),
        Err(e) => status(OrtErrorCode::ORT_FAIL, &format!("{EP_NAME} {:?}: {e}", k.dir)),
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
    /// The node's descriptor, built once: its MLU kernels, and its CPU kernel for a node
    /// whose run-time sizes exceed the MLU kernels' limits ([`Error::MluLimit`]).
    kernel: Box<dyn MluKernel>,
    ep: *const Ep,
}

unsafe extern "system" fn create_kernel(state: *mut c_void, info: *const OrtKernelInfo, out: *mut *mut OrtKernelImpl) -> OrtStatusPtr {
    // SAFETY: `state` is the 'static OpEntry registered with this function.
    let entry = unsafe { &*(state as *const OpEntry) };
    // SAFETY: info is live during kernel creation.
    let info = unsafe { KernelInfo::from_raw(info) };
    guard(entry.name, || {
        let node = info.node_name();
        let fail = |error| node_status(&NodeError { op: entry.name, node: node.clone(), error });
        let ep = match kernel_ep(info) {
            Ok(ep) => ep,
            Err(e) => return fail(e),
        };
        let schema = crate::ops::schema(entry.name);
        let Some(create_mlu) = entry.create_mlu else {
            return fail(Error::Runtime("no MLU kernel for this operator".into()));
        };
        let source = info.attributes();
        let attrs = Attrs::new(schema, &source);
        match create_mlu(&attrs) {
            Ok(kernel) => {
                let k = Box::new(NodeKernel {
                    base: kernel_impl(compute, release),
                    op: entry.name,
                    node: node.clone(),
                    schema,
                    kernel,
                    ep,
                });
                // SAFETY: ORT's out pointer; the box is freed by `release`.
                unsafe { *out = Box::into_raw(k).cast() };
                ok()
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

/// Outputs allocated in card memory through the kernel context, and the node's scratch
/// card memory, freed when this is dropped (after the queue's synchronisation).
struct ContextOutputs<'a> {
    ctx: KernelContext<'a>,
    schema: &'static Schema,
    device: Arc<Device>,
    scratch: Vec<Buffer>,
    /// Bytes of the outputs allocated so far (for the traffic report).
    output_bytes: usize,
}

impl DeviceOutputs for ContextOutputs<'_> {
    fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void> {
        let name = self.schema.outputs.get(index).map_or_else(|| format!("#{index}"), |f| f.name.clone());
        self.output_bytes = self.output_bytes.saturating_add(spec.bytes());
        self.ctx.allocate(index, spec, &name, "card")
    }

    fn workspace(&mut self, bytes: usize) -> Result<*mut c_void> {
        self.device.alloc_kept(bytes, &mut self.scratch)
    }
}

impl NodeKernel {
    fn run(&self, ctx: KernelContext<'_>) -> Result<()> {
        // SAFETY: the EP outlives the kernels of its sessions.
        let ep = unsafe { &*self.ep };
        let device = ep.device();
        let before = traffic::enabled().then(|| device.traffic());
        let names = self.schema.input_names();
        let on_device = ctx.tensors(names.len())?;
        let described: Vec<Option<(DType, Vec<i64>)>> =
            on_device.iter().map(|d| d.as_ref().map(|d| (d.dtype, d.shape.clone()))).collect();
        let ptrs: Vec<*const c_void> =
            on_device.iter().map(|d| d.as_ref().map_or(std::ptr::null(), |d| d.data.cast_const())).collect();
        let sizes = read_sizes(device, self.kernel.size_inputs(), &described, &ptrs)?;
        let inputs = card_inputs(names.clone(), &described, &sizes)?;
        let queue = ep.queue()?;
        let mut card =
            ContextOutputs { ctx, schema: self.schema, device: Arc::clone(device), scratch: Vec::new(), output_bytes: 0 };
        // Synchronises the queue once, on every path (ops::device's rule).
        let result = self.kernel.run_on_card(device, &queue, &inputs, &ptrs, &mut card);
        ep.recycle(queue);
        let result = match result {
            Err(Error::MluLimit(why)) => {
                log::warn!("{} node '{}' runs on the host CPU: {why}", self.op, self.node);
                self.run_on_host(device, names, &on_device, &mut card)
            }
            other => other,
        };
        if let Some(before) = before {
            let inputs: usize = described
                .iter()
                .flatten()
                .map(|(dtype, shape)| shape.iter().map(|&d| d.max(0) as usize).product::<usize>() * dtype.size())
                .sum();
            traffic::record(self.op, &self.node, &device.traffic().since(&before), inputs + card.output_bytes);
        }
        result
    }

    /// Copies the inputs to the host, runs the CPU kernel on them, then copies its outputs
    /// into the node's card outputs.
    fn run_on_host(
        &self,
        device: &Device,
        names: Vec<String>,
        on_device: &[Option<ContextTensor>],
        card: &mut ContextOutputs<'_>,
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
                    // SAFETY: `data` holds spec.bytes() bytes; d.data is the card tensor of as many.
                    unsafe { device.copy_raw(data.as_mut_ptr(), d.data, spec.bytes(), Direction::DeviceToHost)? };
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
    // SAFETY: ctx is the live context of this call.
    let ctx = unsafe { KernelContext::from_raw(ctx) };
    guard(k.op, || match k.run(ctx) {
        Ok(()) => ok(),
        Err(error) => node_status(&NodeError { op: k.op, node: k.node.clone(), error }),
    })
}
