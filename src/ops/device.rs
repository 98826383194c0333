//! The operators' side of an MLU card: [`MluOperator`] (what an operator with BANG kernels
//! implements), the type-erased [`MluKernel`] the execution provider holds per node, the
//! static-shape checks behind its declines, and [`run_on_device`], the host-tensor driver
//! the tests use. The device runtime (`crate::mlu`) knows nothing of this.
//!
//! Queue synchronisation, the one rule: `mlu_compute` enqueues and returns without waiting,
//! except where the contract makes an output's size depend on data (GetIndicePairs reads
//! its site count); scratch memory comes from [`DeviceOutputs::workspace`] and lives until
//! the caller has synchronised the queue, which the caller does once per node.

use crate::error::{Error, Result};
use crate::mlu::{Buffer, Device, DeviceInfo, Queue};
use crate::ops::Operator;
use crate::tensor::{Data, Inputs, OutputSpec, OwnedData, Tensor, TensorRef};
use std::ffi::c_void;
use std::sync::Arc;

/// Where a device operator's outputs go (device memory the host allocates).
pub trait DeviceOutputs {
    fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void>;
    /// Device scratch of `bytes` bytes that lives until the caller has synchronised the
    /// queue (null for 0 bytes).
    fn workspace(&mut self, bytes: usize) -> Result<*mut c_void>;
}

/// An operator with BANG kernels.
pub trait MluOperator: Operator {
    /// `Ok` when the MLU kernels support this configuration, else the reason (the EP
    /// declines such nodes, they run on CPU).
    fn mlu_supported(&self) -> std::result::Result<(), String>;

    /// `Ok` unless the input shapes known before running (static dims) already exceed a
    /// size limit of the kernels (int32 offsets, NRAM rows); else the reason.
    fn mlu_supported_shapes(&self, _info: &DeviceInfo, shapes: &StaticShapes) -> std::result::Result<(), String> {
        int32_inputs(shapes)
    }

    /// Validates `inputs` (host views of the node's inputs) as the CPU path does, then
    /// enqueues the kernels on `queue` reading `device_inputs` (the same tensors on the
    /// device; null for absent or empty ones) and writing outputs allocated from `outputs`.
    /// The caller synchronises the queue (the module's rule).
    fn mlu_compute(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        inputs: &Inputs<'_>,
        device_inputs: &[*const c_void],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// A configured node whose kernels run on an MLU card: [`MluOperator`] with the type erased,
/// what the execution provider holds per node.
pub trait MluKernel: Send + Sync {
    /// `Ok` when the BANG kernels support this node's configuration, else the reason.
    fn supported(&self) -> std::result::Result<(), String>;
    /// As [`MluOperator::mlu_supported_shapes`].
    fn supported_shapes(&self, info: &DeviceInfo, shapes: &StaticShapes) -> std::result::Result<(), String>;
    /// As [`MluOperator::mlu_compute`].
    fn compute(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        inputs: &Inputs<'_>,
        device_inputs: &[*const c_void],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

impl<O: MluOperator> MluKernel for O {
    fn supported(&self) -> std::result::Result<(), String> {
        self.mlu_supported()
    }
    fn supported_shapes(&self, info: &DeviceInfo, shapes: &StaticShapes) -> std::result::Result<(), String> {
        self.mlu_supported_shapes(info, shapes)
    }
    fn compute(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        inputs: &Inputs<'_>,
        device_inputs: &[*const c_void],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        self.mlu_compute(device, queue, inputs, device_inputs, outputs)
    }
}

/// The input shapes of a node as the graph declares them: `None` for an absent input,
/// `None` for a symbolic dimension.
pub type StaticShapes = [Option<Vec<Option<usize>>>];

/// The element count of a fully static shape.
pub fn static_numel(shape: &[Option<usize>]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| d.map(|d| a.saturating_mul(d)))
}

/// Declines an output of (static dims `axes` of input `input`) x `times` elements beyond
/// the kernels' int32 element offsets; `what` names the product in the reason. Unknown
/// (symbolic) dims are checked at run time instead.
pub fn int32_output(
    shapes: &StaticShapes,
    input: usize,
    axes: [usize; 2],
    times: usize,
    what: &str,
) -> std::result::Result<(), String> {
    let dims = shapes.get(input).and_then(|s| s.as_ref());
    if let Some([Some(a), Some(b)]) = dims.map(|d| axes.map(|i| d.get(i).copied().flatten())) {
        let n = a.saturating_mul(b).saturating_mul(times);
        if n > i32::MAX as usize {
            return Err(format!("the output's {what} = {n} elements exceed the MLU kernel's int32 offsets"));
        }
    }
    Ok(())
}

/// Every statically known input fits the kernels' int32 element offsets.
pub fn int32_inputs(shapes: &StaticShapes) -> std::result::Result<(), String> {
    for (i, s) in shapes.iter().enumerate() {
        if let Some(n) = s.as_deref().and_then(static_numel).filter(|&n| n > i32::MAX as usize) {
            return Err(format!("input {i} has {n} elements, beyond the MLU kernels' int32 offsets"));
        }
    }
    Ok(())
}

/// Host-tensor driver: uploads the inputs, runs `op` on `device`, downloads the outputs.
pub fn run_on_device<O: MluOperator>(device: &Arc<Device>, op: &O, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
    op.mlu_supported().map_err(|why| Error::Runtime(format!("{}: not supported by the MLU kernels: {why}", O::NAME)))?;
    let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| t.map(Tensor::view)).collect();
    let views = Inputs::new(O::schema().input_names(), refs)?;
    let mut uploaded = Vec::new();
    for t in inputs {
        uploaded.push(match t {
            None => None,
            Some(t) => Some(match t.view().data {
                Data::F32(d) => device.upload(d)?,
                Data::F16(d) => device.upload(d)?,
                Data::I32(d) => device.upload(d)?,
                Data::I64(d) => device.upload(d)?,
            }),
        });
    }
    let ptrs: Vec<*const c_void> =
        uploaded.iter().map(|b| b.as_ref().map_or(std::ptr::null(), |b| b.ptr::<c_void>().cast_const())).collect();
    struct Outs {
        device: Arc<Device>,
        bufs: Vec<Option<(OutputSpec, Buffer)>>,
        scratch: Vec<Buffer>,
    }
    impl DeviceOutputs for Outs {
        fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void> {
            let buf = self.device.alloc(spec.bytes())?;
            let ptr = buf.ptr();
            if self.bufs.len() <= index {
                self.bufs.resize_with(index + 1, || None);
            }
            self.bufs[index] = Some((spec.clone(), buf));
            Ok(ptr)
        }
        fn workspace(&mut self, bytes: usize) -> Result<*mut c_void> {
            self.device.alloc_kept(bytes, &mut self.scratch)
        }
    }
    // `outs` (the scratch) is declared first so it outlives the queue, and the queue is
    // synchronised on every path before either goes (the module's rule).
    let mut outs = Outs { device: Arc::clone(device), bufs: Vec::new(), scratch: Vec::new() };
    let queue = device.queue()?;
    let computed = op.mlu_compute(device, &queue, &views, &ptrs, &mut outs);
    let synced = queue.sync();
    computed?;
    synced?;
    let mut result = Vec::new();
    for (i, slot) in outs.bufs.into_iter().enumerate() {
        let (spec, buf) = slot.ok_or_else(|| Error::Runtime(format!("{}: output {i} was never allocated", O::NAME)))?;
        let mut data = OwnedData::poisoned(&spec, &format!("host copy of output {i}"))?;
        match &mut data {
            OwnedData::F32(v) => device.download(&buf, v)?,
            OwnedData::F16(v) => device.download(&buf, v)?,
            OwnedData::I32(v) => device.download(&buf, v)?,
            OwnedData::I64(v) => device.download(&buf, v)?,
        }
        result.push(Tensor { shape: spec.shape, data });
    }
    Ok(result)
}

/// Converts a size the policy guarantees small into the kernels' int32.
pub fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::MluLimit(format!("MLU kernel argument {what} = {v} exceeds int32")))
}
