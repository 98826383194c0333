//! The EP's kernel registry: one kernel per `mluops` operator a card backend runs, running
//! the node through `ops::device`'s node runner on the EP's card with the EP's backends.
//! Inputs and outputs live in card memory and stay there: the host reads shapes, the few
//! bytes of the size inputs and the value checks' records. Only a node whose run-time sizes
//! every backend declines copies its inputs to the host, to run its CPU kernel; that is
//! logged through ONNX Runtime's logger and counted ([`super::provider::Counts`]).

use super::EP_NAME;
use super::provider::Ep;
use super::traffic;
use crate::error::{Error, Result};
use crate::ffi::ep_abi::{OrtKernelCreateFunc, OrtKernelImpl};
use crate::ffi::kernel::{KernelContext, KernelInfo};
use crate::ffi::registry::{HostSide, KernelRegistry};
use crate::ffi::{WARNING, guard, version};
use crate::mlu::{Buffer, Device, Direction};
use crate::ops::device::{CardNode, DeviceOutputs, Ran, reasons};
use crate::ops::{ALL, OpEntry};
use crate::schema::{self, Attrs, Schema};
use crate::tensor::OutputSpec;
use ort_sys::{OrtKernelContext, OrtKernelInfo, OrtStatusPtr};
use std::ffi::c_void;
use std::sync::Arc;

/// Builds the registry: every operator (domain `mluops`; each has a card backend, MLU-OPS, our
/// BANG kernels or both) and the copies ONNX Runtime inserts between CPU nodes and MLU nodes,
/// which run as this EP's `MemcpyFromHost` / `MemcpyToHost` kernels (ONNX domain; host side
/// declared as CPU memory). No type constraints are added: the `mluops` schemas already fix
/// each input's element type, a backend declines a node of a type it does not run, with the
/// reason (MLU-OPS: ThreeInterpolate's and ThreeInterpolateBackward's float16, which our
/// BANG kernel of the backward runs), and the copies move bytes of any type.
pub fn registry() -> Result<KernelRegistry> {
    let registry = KernelRegistry::new()?;
    let add = |op: &str,
               domain: &str,
               host: HostSide,
               create: OrtKernelCreateFunc,
               state: *const c_void| {
        // SAFETY: each `create` below takes the state it is registered with, a 'static
        // OpEntry or Direction.
        unsafe { registry.add(op, domain, EP_NAME, host, create, state.cast_mut()) }
    };
    for entry in ALL {
        add(
            entry.name,
            schema::DOMAIN,
            HostSide::None,
            create_kernel,
            (entry as *const OpEntry).cast(),
        )?;
    }
    add(
        "MemcpyFromHost",
        "",
        HostSide::Input0,
        create_memcpy,
        (&TO_DEVICE as *const Direction).cast(),
    )?;
    add(
        "MemcpyToHost",
        "",
        HostSide::Output0,
        create_memcpy,
        (&TO_HOST as *const Direction).cast(),
    )?;
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

unsafe extern "system" fn create_memcpy(
    state: *mut c_void,
    info: *const OrtKernelInfo,
    out: *mut *mut OrtKernelImpl,
) -> OrtStatusPtr {
    // SAFETY: `state` is TO_DEVICE or TO_HOST.
    let dir = unsafe { *(state as *const Direction) };
    // SAFETY: info is live during kernel creation.
    let info = unsafe { KernelInfo::from_raw(info) };
    guard("MLUExecutionProvider Memcpy", || {
        let ep = kernel_ep(info).map_err(|e| Error::Runtime(format!("{EP_NAME} Memcpy: {e}")))?;
        let k =
            Box::new(MemcpyKernel { base: kernel_impl(memcpy_compute, memcpy_release), dir, ep });
        // SAFETY: ORT's out pointer; freed by memcpy_release.
        unsafe { *out = Box::into_raw(k).cast() };
        Ok(())
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
        let input =
            ctx.input(0)?.ok_or_else(|| Error::Runtime("Memcpy without an input".into()))?;
        let (_, dims) = input.type_and_shape()?;
        let output = ctx.output(0, dims)?;
        let bytes = input.size_in_bytes()?;
        let (src, dst) = (input.data()?, output.data()?);
        // SAFETY: the EP outlives the kernels of its sessions. Same shape and type on both
        // sides, `bytes` bytes each, on the sides the kernel definition declares.
        unsafe { (*self.ep).device().copy_raw(dst, src, bytes, self.dir) }
    }
}

unsafe extern "system" fn memcpy_compute(
    this: *mut OrtKernelImpl,
    ctx: *mut OrtKernelContext,
) -> OrtStatusPtr {
    // SAFETY: `this` is a MemcpyKernel made by create_memcpy.
    let k = unsafe { &*(this as *const MemcpyKernel) };
    // SAFETY: ctx is the live context of this call.
    let ctx = unsafe { KernelContext::from_raw(ctx) };
    guard("MLUExecutionProvider Memcpy", || {
        k.run(ctx).map_err(|e| Error::Runtime(format!("{EP_NAME} {:?}: {e}", k.dir)))
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
struct EpKernel {
    base: OrtKernelImpl,
    op: &'static str,
    node_name: String,
    schema: &'static Schema,
    /// The node's descriptor, built once: its card paths in the EP's backend order, and its
    /// CPU kernel for a node whose run-time sizes every path declines.
    node: CardNode,
    ep: *const Ep,
}

unsafe extern "system" fn create_kernel(
    state: *mut c_void,
    info: *const OrtKernelInfo,
    out: *mut *mut OrtKernelImpl,
) -> OrtStatusPtr {
    // SAFETY: `state` is the 'static OpEntry registered with this function.
    let entry = unsafe { &*(state as *const OpEntry) };
    // SAFETY: info is live during kernel creation.
    let info = unsafe { KernelInfo::from_raw(info) };
    guard(entry.name, || {
        let node_name = info.node_name();
        let schema = crate::ops::schema(entry.name);
        let node = || -> Result<(CardNode, *const Ep)> {
            let ep = kernel_ep(info)?;
            let source = info.attributes();
            // SAFETY: the EP outlives the kernels of its sessions.
            Ok(((entry.create_card)(&Attrs::new(schema, &source), unsafe { &*ep }.backends())?, ep))
        };
        let (node, ep) = node().map_err(|e| e.at(entry.name, &node_name))?;
        let k = Box::new(EpKernel {
            base: kernel_impl(compute, release),
            op: entry.name,
            node_name,
            schema,
            node,
            ep,
        });
        // SAFETY: ORT's out pointer; the box is freed by `release`.
        unsafe { *out = Box::into_raw(k).cast() };
        Ok(())
    })
}

unsafe extern "system" fn release(this: *mut OrtKernelImpl) {
    if this.is_null() {
        return;
    }
    // SAFETY: `this` came from Box::into_raw in create_kernel; ORT releases it once.
    let k = unsafe { Box::from_raw(this as *mut EpKernel) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(k)));
}

/// Outputs allocated in card memory through the kernel context, and the node's scratch
/// card memory, freed when this is dropped (after the queue's synchronisation).
struct ContextCardOutputs<'a> {
    ctx: KernelContext<'a>,
    schema: &'static Schema,
    device: Arc<Device>,
    scratch: Vec<Buffer>,
    /// Bytes of the outputs allocated so far (for the traffic report).
    output_bytes: usize,
}

impl DeviceOutputs for ContextCardOutputs<'_> {
    fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void> {
        let name =
            self.schema.outputs.get(index).map_or_else(|| format!("#{index}"), |f| f.name.clone());
        self.output_bytes = self.output_bytes.saturating_add(spec.bytes());
        self.ctx.allocate(index, spec, &name, "card")
    }

    fn workspace(&mut self, bytes: usize) -> Result<*mut c_void> {
        self.device.alloc_kept(bytes, &mut self.scratch)
    }
}

impl EpKernel {
    fn run(&self, ctx: KernelContext<'_>) -> Result<()> {
        // SAFETY: the EP outlives the kernels of its sessions.
        let ep = unsafe { &*self.ep };
        let device = ep.device();
        let before = traffic::enabled().then(|| device.traffic());
        let names = self.schema.input_names();
        let tensors = ctx.tensors(names.len())?;
        let queue = ep.queue()?;
        let mut card = ContextCardOutputs {
            ctx,
            schema: self.schema,
            device: Arc::clone(device),
            scratch: Vec::new(),
            output_bytes: 0,
        };
        // Synchronises the queue on every path (ops::device's rule).
        let (ran, result) = self.node.run(device, &queue, names, &tensors, &mut card);
        ep.recycle(queue);
        // A run that failed on a path is logged and counted as that path's run.
        let Some(ran) = ran else { return result };
        ep.counts().ran(&ran);
        let sizes = || {
            tensors
                .iter()
                .flatten()
                .map(|t| format!("{:?}", t.shape))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &ran {
            Ran::Host(why) => ep.logger().log(
                WARNING,
                &format!(
                    "{EP_NAME}: mluops.{} node '{}' ran on the host CPU (inputs {}): {why}",
                    self.op,
                    self.node_name,
                    sizes()
                ),
            ),
            Ran::Card(b, declined) if !declined.is_empty() => {
                ep.logger().log(
                    WARNING,
                    &format!(
                        "{EP_NAME}: mluops.{} node '{}' ran on backend {} after a run-time decline (inputs {}): {}",
                        self.op,
                        self.node_name,
                        b.name(),
                        sizes(),
                        reasons(declined)
                    ),
                );
            }
            Ran::Card(..) => {}
        }
        if let Some(before) = before {
            let inputs: usize =
                tensors.iter().flatten().filter_map(|t| t.spec().ok()).map(|s| s.bytes()).sum();
            // A card run after run-time declines names them: the report then counts them
            // per node, as the session line does per session.
            let (backend, why) = match &ran {
                Ran::Card(b, declined) => {
                    (b.name(), (!declined.is_empty()).then(|| reasons(declined)))
                }
                Ran::Host(why) => ("cpu", Some(why.clone())),
            };
            let spent = device.traffic().since(&before);
            traffic::record(
                self.op,
                &self.node_name,
                backend,
                why.as_deref(),
                result.is_err(),
                &spent,
                inputs + card.output_bytes,
            );
        }
        result
    }
}

unsafe extern "system" fn compute(
    this: *mut OrtKernelImpl,
    ctx: *mut OrtKernelContext,
) -> OrtStatusPtr {
    // SAFETY: `this` is a EpKernel made by create_kernel; compute only needs shared access.
    let k = unsafe { &*(this as *const EpKernel) };
    // SAFETY: ctx is the live context of this call.
    let ctx = unsafe { KernelContext::from_raw(ctx) };
    guard(k.op, || k.run(ctx).map_err(|e| e.at(k.op, &k.node_name)))
}
