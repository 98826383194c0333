//! The operators' side of an MLU card: [`MluOperator`] (what an operator with BANG kernels
//! implements), the type-erased [`MluKernel`] the execution provider holds per node, the
//! one driver of a node on the card ([`MluKernel::run_on_card`]), the static-shape checks behind
//! the provider's declines, and [`run_on_device`], the host-tensor driver the tests use.
//! The device runtime (`crate::mlu`) knows nothing of this.
//!
//! A node on the card, in order: the shape rules on the host (shapes, dtypes and the size
//! inputs' few bytes); the kernels' size limits (a node beyond them runs its CPU kernel,
//! decided before anything is launched); one check kernel per value rule (kernels/check),
//! each writing a 4-byte record; the operator's kernels, those that address memory with
//! input values gated on the records; one queue synchronisation; the records read back
//! and the first broken rule reported in the CPU path's words.
//!
//! Queue synchronisation, the one rule: the driver synchronises once per node, after
//! everything is enqueued. An operator's `mlu_compute` only enqueues, except where the
//! contract makes an output's size depend on data (GetIndicePairs waits once for its site
//! count). Scratch memory comes from [`DeviceOutputs::workspace`] and lives until the
//! node's outputs are dropped, after that synchronisation.

use super::rules::{Broken, Check, Rules, RowValues, SIZE_INPUT_BYTES, ValueRule};
use crate::error::{Error, Result};
use crate::mlu::{Buffer, Device, DeviceInfo, Direction, IntBounds, NRAM_BUDGET, Queue, TASK_UNION1};
use crate::tensor::{DType, Data, Inputs, OutputSpec, OwnedData, Tensor, TensorRef};
use std::ffi::c_void;
use std::sync::Arc;

/// Where a device operator's outputs go (device memory the host allocates).
pub trait DeviceOutputs {
    fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void>;
    /// Device scratch of `bytes` bytes that lives until the node's queue is synchronised
    /// (null for 0 bytes).
    fn workspace(&mut self, bytes: usize) -> Result<*mut c_void>;
}

/// What an operator's kernels run with: the card, the node's queue, its inputs in card
/// memory (null for absent or empty ones) and the value checks' records.
pub struct Card<'a> {
    pub device: &'a Arc<Device>,
    pub queue: &'a Queue,
    inputs: &'a [*const c_void],
    records: *const i32,
    rules: usize,
    verify: &'a dyn Fn() -> Result<()>,
}

impl Card<'_> {
    /// Input `i` in card memory.
    pub fn input<T>(&self, i: usize) -> *const T {
        self.inputs.get(i).map_or(std::ptr::null(), |p| p.cast())
    }

    /// The gate kernels that address memory with input values take: the records and their
    /// count (kernels/common/kernel.h, `mluops_gate_closed`).
    pub fn gate(&self) -> (*const i32, i32) {
        (self.records, self.rules as i32)
    }

    /// After a synchronisation of the queue: the first broken value rule, as the contract
    /// error (reads 4 bytes per rule, and the broken row).
    pub fn verify(&self) -> Result<()> {
        (self.verify)()
    }
}

/// An operator with BANG kernels.
pub trait MluOperator: Rules {
    /// `Ok` when the MLU kernels support this configuration, else the reason (the EP
    /// declines such nodes, they run on CPU).
    fn mlu_supported(&self) -> std::result::Result<(), String>;

    /// `Ok` unless the input shapes known before running (static dims) already exceed a
    /// size limit of the kernels (int32 offsets, NRAM rows); else the reason.
    fn mlu_supported_shapes(&self, _info: &DeviceInfo, shapes: &StaticShapes) -> std::result::Result<(), String> {
        int32_inputs(shapes)
    }

    /// `Ok` unless the run-time sizes exceed what the kernels take; the node then runs its
    /// CPU kernel. Decided from the shape rules, before anything is launched.
    fn mlu_fits(&self, _dims: &Self::Dims) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Allocates the outputs and enqueues the kernels for sizes the shape rules validated.
    /// Kernels that address memory with input values take `card.gate()`.
    fn mlu_compute(&self, dims: &Self::Dims, card: &Card<'_>, outputs: &mut dyn DeviceOutputs) -> Result<()>;
}

/// A configured node whose kernels run on an MLU card: [`MluOperator`] with the type erased,
/// what the execution provider holds per node. The same object is the node's CPU kernel
/// ([`super::Kernel`]), which runs it when its sizes exceed the MLU kernels' limits.
pub trait MluKernel: super::Kernel {
    /// `Ok` when the BANG kernels support this node's configuration, else the reason.
    fn supported(&self) -> std::result::Result<(), String>;
    /// As [`MluOperator::mlu_supported_shapes`].
    fn supported_shapes(&self, info: &DeviceInfo, shapes: &StaticShapes) -> std::result::Result<(), String>;
    /// As [`Rules::SIZE_INPUTS`].
    fn size_inputs(&self) -> &'static [usize];
    /// Runs the node on the card: `inputs` are the host's view of the node's inputs
    /// (shapes, dtypes, and the values of the size inputs only), `device_inputs` the same
    /// tensors in card memory. Synchronises `queue` once (the module's rule). An
    /// [`Error::MluLimit`] comes before anything is launched.
    fn run_on_card(
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
    fn size_inputs(&self) -> &'static [usize] {
        O::SIZE_INPUTS
    }
    fn run_on_card(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        inputs: &Inputs<'_>,
        device_inputs: &[*const c_void],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let dims = self.shape_rules(inputs)?;
        let limit = |why: String| Error::MluLimit(format!("{}: {why}", O::NAME));
        for i in 0..device_inputs.len() {
            if let Some(n) = inputs.numel(i).filter(|&n| n > i32::MAX as usize) {
                return Err(limit(format!("input '{}' has {n} elements, beyond the kernels' int32 offsets", inputs.name(i))));
            }
        }
        self.mlu_fits(&dims).map_err(limit)?;
        let rules = self.value_rules(&dims);
        let records: *mut i32 = outputs.workspace(rules.len() * 4)?.cast();
        let verify = || {
            let broken = read_records(device, &rules, records, device_inputs)?;
            broken.map_or(Ok(()), |b| Err(self.describe(inputs, &dims, &b)))
        };
        let card = Card { device, queue, inputs: device_inputs, records, rules: rules.len(), verify: &verify };
        let mut enqueue = || {
            for (k, rule) in rules.iter().enumerate() {
                let data = device_inputs.get(rule.input).copied().unwrap_or(std::ptr::null());
                // SAFETY: `records` holds one int32 per rule.
                let record = unsafe { records.add(k) };
                launch_check(device, queue, rule, data, inputs.numel(rule.input).unwrap_or(0), record, outputs)?;
            }
            self.mlu_compute(&dims, &card, outputs)
        };
        let enqueued = enqueue();
        // The node's one wait, on every path once anything may be enqueued: the workspace
        // must not be freed under a kernel.
        let synced = queue.sync();
        enqueued?;
        synced?;
        card.verify()
    }
}

/// Enqueues kernels/check for `rule` over `numel` elements at `data`, writing `record`.
fn launch_check(
    device: &Arc<Device>,
    queue: &Queue,
    rule: &ValueRule,
    data: *const c_void,
    numel: usize,
    record: *mut i32,
    outputs: &mut dyn DeviceOutputs,
) -> Result<()> {
    // One cluster: the check's __sync_all_ipu reaches the cores of one cluster only.
    let tasks = device.info.cores_per_cluster;
    let task_first: *mut i32 = outputs.workspace(tasks as usize * 4)?.cast();
    let cols = rule.check.cols();
    // NRAM: the tasks' slots and one tile of rows, each rounded up to 64 bytes.
    let tile_rows = ((NRAM_BUDGET - 2 * 64 - tasks as usize * 4) / (cols * 4)).min(i32::MAX as usize);
    let (rows, cols, tile_rows) = (i32_of("rows", numel / cols)?, i32_of("cols", cols)?, i32_of("tile_rows", tile_rows)?);
    let k = &device.kernels;
    match rule.check {
        Check::Int { bounds, .. } => {
            let b = IntBounds { lo: bounds.map(|b| b.0), hi: bounds.map(|b| b.1) };
            // SAFETY: `data` is the rule's input, `rows * cols` int32 in card memory (or
            // null for none); `task_first` and `record` are card scratch of the sizes the
            // kernel writes; the launch only enqueues.
            queue.launch("mluops_check_int_rows", |q| unsafe {
                (k.mluops_check_int_rows)(q, tasks, TASK_UNION1, data.cast(), rows, cols, &b, tile_rows, task_first, record)
            })
        }
        Check::GuardedFloat { col, above, below, .. } => {
            let col = i32_of("col", col)?;
            // SAFETY: as above, for float32 rows.
            queue.launch("mluops_check_float_rows", |q| unsafe {
                (k.mluops_check_float_rows)(
                    q, tasks, TASK_UNION1, data.cast(), rows, cols, col, above, below, tile_rows, task_first, record,
                )
            })
        }
    }
}

/// After the queue's synchronisation: the first broken rule, with its row read from the card.
fn read_records(
    device: &Device,
    rules: &[ValueRule],
    records: *const i32,
    device_inputs: &[*const c_void],
) -> Result<Option<Broken>> {
    if rules.is_empty() {
        return Ok(None);
    }
    let mut found = [0i32; SIZE_INPUT_BYTES / 4];
    let found = &mut found[..rules.len().min(SIZE_INPUT_BYTES / 4)];
    // SAFETY: `records` holds one int32 per rule, written by the check kernels.
    unsafe { device.copy_raw(found.as_mut_ptr().cast(), records.cast(), found.len() * 4, Direction::DeviceToHost)? };
    let Some((rule, row)) = found.iter().enumerate().find_map(|(k, &r)| usize::try_from(r).ok().map(|row| (k, row))) else {
        return Ok(None);
    };
    let cols = rules[rule].check.cols();
    let src = device_inputs[rules[rule].input].cast::<u8>();
    // SAFETY: the check kernel found row `row` inside the input, `cols` 4-byte values each.
    let src = unsafe { src.add(row * cols * 4) }.cast::<c_void>();
    let values = match rules[rule].check {
        Check::Int { .. } => {
            let mut v = vec![0i32; cols];
            // SAFETY: `v` holds `cols` int32; `src` is that row in card memory.
            unsafe { device.copy_raw(v.as_mut_ptr().cast(), src, cols * 4, Direction::DeviceToHost)? };
            RowValues::I32(v)
        }
        Check::GuardedFloat { .. } => {
            let mut v = vec![0f32; cols];
            // SAFETY: as above, float32.
            unsafe { device.copy_raw(v.as_mut_ptr().cast(), src, cols * 4, Direction::DeviceToHost)? };
            RowValues::F32(v)
        }
    };
    Ok(Some(Broken { rule, row, values }))
}

/// The host's view of a node's inputs on the MLU path: dtype and shape of each (`None` for
/// an absent one) with the values left on the card, except those of the size inputs
/// (`sizes[i]`, read by the caller).
pub fn card_inputs<'a>(
    names: Vec<String>,
    inputs: &[Option<(DType, Vec<i64>)>],
    sizes: &'a [Option<OwnedData>],
) -> Result<Inputs<'a>> {
    let tensors = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_ref().map(|(dtype, shape)| {
                let data = match sizes.get(i).and_then(Option::as_ref) {
                    Some(values) => values.as_data(),
                    None => Data::OnCard {
                        dtype: *dtype,
                        len: shape.iter().try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?)).unwrap_or(usize::MAX),
                    },
                };
                TensorRef { shape: shape.clone(), data }
            })
        })
        .collect();
    Inputs::new(names, tensors)
}

/// The values of the size inputs `which` (each at most [`SIZE_INPUT_BYTES`]; a larger one
/// stays on the card and its shape rule reports it), copied from the card.
pub fn read_sizes(
    device: &Device,
    which: &[usize],
    inputs: &[Option<(DType, Vec<i64>)>],
    device_inputs: &[*const c_void],
) -> Result<Vec<Option<OwnedData>>> {
    let mut sizes = vec![None; inputs.len()];
    for &i in which {
        let Some(Some((dtype, shape))) = inputs.get(i) else { continue };
        let Ok(dims) = shape.iter().map(|&d| usize::try_from(d)).collect::<std::result::Result<Vec<_>, _>>() else {
            continue;
        };
        let spec = OutputSpec::new(*dtype, dims);
        if spec.bytes() > SIZE_INPUT_BYTES || spec.bytes() == 0 {
            continue;
        }
        let mut data = OwnedData::poisoned(&spec, "a size input")?;
        // SAFETY: `data` holds spec.bytes() bytes; the card tensor as many.
        unsafe { device.copy_raw(data.as_mut_ptr(), device_inputs[i], spec.bytes(), Direction::DeviceToHost)? };
        sizes[i] = Some(data);
    }
    Ok(sizes)
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

/// Host-tensor driver: uploads the inputs, runs `op` on `device` as the provider does,
/// downloads the outputs.
pub fn run_on_device<O: MluOperator>(device: &Arc<Device>, op: &O, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
    op.mlu_supported().map_err(|why| Error::Runtime(format!("{}: not supported by the MLU kernels: {why}", O::NAME)))?;
    let mut uploaded = Vec::new();
    for t in inputs {
        uploaded.push(match t {
            None => None,
            Some(t) => Some(match &t.data {
                OwnedData::F32(d) => device.upload(d)?,
                OwnedData::F16(d) => device.upload(d)?,
                OwnedData::I32(d) => device.upload(d)?,
                OwnedData::I64(d) => device.upload(d)?,
            }),
        });
    }
    let ptrs: Vec<*const c_void> =
        uploaded.iter().map(|b| b.as_ref().map_or(std::ptr::null(), |b| b.ptr::<c_void>().cast_const())).collect();
    let described: Vec<Option<(DType, Vec<i64>)>> = inputs
        .iter()
        .map(|t| t.map(|t| (t.data.as_data().dtype(), t.shape.iter().map(|&d| d as i64).collect())))
        .collect();
    let sizes = read_sizes(device, O::SIZE_INPUTS, &described, &ptrs)?;
    let views = card_inputs(O::schema().input_names(), &described, &sizes)?;
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
    let mut outs = Outs { device: Arc::clone(device), bufs: Vec::new(), scratch: Vec::new() };
    let queue = device.queue()?;
    MluKernel::run_on_card(op, device, &queue, &views, &ptrs, &mut outs)?;
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
