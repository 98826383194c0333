//! The operators' side of a card, and card backends as a concept. A node the provider
//! claims runs on one of the card backends ([`Backend`]: Cambricon's MLU-OPS library, our
//! BANG kernels), tried in the provider's order, else on the host CPU. Each backend is a
//! [`CardPath`] with a trait operators implement ([`MluOpsOperator`] in
//! `ops/<family>/mluops.rs`, [`MluOperator`] in `ops/<family>/mlu.rs`); a node holds its paths
//! type-erased ([`CardNode`]) and [`CardNode::run`] is the one node runner, for the provider
//! and for the tests' driver ([`run_node_on_device`]) alike. The device runtime (`crate::mlu`)
//! and the MLU-OPS binding (`crate::mluops`) know nothing of this.
//!
//! A node on the card, in order: the shape rules on the host (shapes, dtypes and the size
//! inputs' few bytes); the int32 check of every input and the path's size limits (a node
//! beyond them tries the next path, then runs its CPU kernel, decided before anything is
//! launched); one check kernel per value rule (kernels/check), each writing a 4-byte record;
//! the path's work: BANG kernels that address memory with input values gated on the records
//! on the card, library calls only after the host read the records (MLU-OPS does not check
//! index values); one queue synchronisation; the records read back and the first broken rule
//! reported in the CPU path's words.
//!
//! Queue synchronisation: the driver synchronises once per node after everything is
//! enqueued (and once before a host-gated path's calls). A path's work only enqueues, except
//! where the contract makes an output's size depend on data (GetIndicePairs waits once for
//! its site count). Scratch memory comes from [`DeviceOutputs::workspace`] and lives until
//! the node's outputs are dropped, after that synchronisation.

use super::rules::{Broken, Check, RowValues, Rules, SIZE_INPUT_BYTES, ValueRule};
use super::{Kernel, OwnedOutputs};
use crate::error::{Error, Result};
use crate::mlu::abi::{CheckKernels, IntBounds};
use crate::mlu::{Buffer, Device, DeviceInfo, Direction, NRAM_BUDGET, Queue, TASK_UNION1};
use crate::mluops::Library;
use crate::parallel::Serial;
use crate::schema::Attrs;
use crate::tensor::{CardTensor, DType, Data, Inputs, OutputSpec, OwnedData, Tensor, TensorRef};
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
    /// The records were read and no rule was broken: they are not read again.
    verified: std::cell::Cell<bool>,
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
    /// error (reads 4 bytes per rule, and the broken row; once per node).
    pub fn verify(&self) -> Result<()> {
        if !self.verified.get() {
            (self.verify)()?;
            self.verified.set(true);
        }
        Ok(())
    }
}

/// The card backends. `auto` tries them in this order: Cambricon's library where it supports
/// the node (tested by the vendor on cards), then our BANG kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Cambricon's MLU-OPS library (`crate::mluops`, `ops/<family>/mluops.rs`).
    MluOps,
    /// Our BANG kernels (kernels/, `ops/<family>/mlu.rs`).
    Bang,
}

impl Backend {
    /// The name the option `mlu_backend`, the log and the traffic report use.
    pub fn name(self) -> &'static str {
        match self {
            Backend::MluOps => "mluops",
            Backend::Bang => "bang",
        }
    }

    /// The backends `mlu_backend` = `value` allows, in the order they are tried.
    pub fn order(value: &str) -> Result<&'static [Backend]> {
        match value.trim() {
            "auto" => Ok(&[Backend::MluOps, Backend::Bang]),
            "mluops" => Ok(&[Backend::MluOps]),
            "bang" => Ok(&[Backend::Bang]),
            other => Err(Error::Argument(format!("'{other}' is not one of auto, mluops, bang"))),
        }
    }
}

/// The card backends a provider runs nodes with: their order, and the MLU-OPS library or
/// why there is none.
#[derive(Debug, Clone)]
pub struct CardBackends {
    pub order: &'static [Backend],
    pub mluops: Result<Arc<Library>>,
}

impl CardBackends {
    /// The MLU-OPS library in use, or why none is (for the log and the session summary).
    pub fn mluops_state(&self) -> String {
        match &self.mluops {
            Ok(lib) => format!("{lib:?}"),
            Err(why) => format!("not in use: {why}"),
        }
    }
}

/// One backend's way of running one operator's nodes (candle's per-backend methods, as a
/// type per backend): what it supports, its size limits, and the enqueueing of its calls.
pub trait CardPath<O: Rules>: Send + Sync + 'static {
    const BACKEND: Backend;
    /// True when the backend's calls cannot read the value checks' records (a library's
    /// functions): the driver then waits for the checks, and reports a broken rule, before
    /// anything of the backend is enqueued.
    const HOST_GATE: bool;
    /// `Ok` when this configuration (attributes) is supported, else the reason.
    fn supported(&self, op: &O) -> Result<()>;
    /// The kernel families of kernels/ this path launches: a card whose kernel library
    /// lacks one declines the path (`DeviceInfo::has_families`).
    fn families(&self) -> &'static [&'static str];
    /// `Ok` unless the static input shapes already exceed a limit (the int32 check of every
    /// input is the driver's and cannot be dropped).
    fn supported_shapes(&self, op: &O, info: &DeviceInfo, shapes: &StaticShapes) -> Result<()>;
    /// What the run-time sizes need of the backend (its launch arguments, narrowed), or why
    /// they exceed it: decided before anything is launched. Only [`Error::Declined`] passes
    /// the node to the next path or the CPU; any other error fails the node.
    type Fit;
    fn fits(&self, op: &O, info: &DeviceInfo, dims: &O::Dims) -> Result<Self::Fit>;
    /// Allocates the outputs and enqueues the backend's work for sizes that fit.
    fn enqueue(
        &self,
        op: &O,
        dims: &O::Dims,
        fit: &Self::Fit,
        card: &Card<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// An operator with BANG kernels (the [`Bang`] path).
pub trait MluOperator: Rules {
    /// The kernels' arguments for one node's run-time sizes: every size narrowed to the
    /// int32 the kernels' ABI takes and the tiling chosen ([`MluOperator::mlu_launch`]), so
    /// that enqueueing meets no size limit.
    type Launch;

    /// The kernel families its BANG path launches: `check` (the value checks) and its own.
    const BANG_FAMILIES: &'static [&'static str];

    /// `Ok` when the BANG kernels support this configuration, else the reason.
    fn mlu_supported(&self) -> Result<()> {
        Ok(())
    }

    /// `Ok` unless the static input shapes exceed a size limit of the kernels beyond the
    /// driver's int32 element check (int32 products, NRAM rows); else the reason.
    fn mlu_supported_shapes(&self, _info: &DeviceInfo, _shapes: &StaticShapes) -> Result<()> {
        Ok(())
    }

    /// The launch arguments for the run-time sizes, or why the kernels cannot take them
    /// (the node goes to the next path, nothing launched).
    fn mlu_launch(&self, info: &DeviceInfo, dims: &Self::Dims) -> Result<Self::Launch>;

    /// Allocates the outputs and enqueues the kernels with `launch`. Kernels that address
    /// memory with input values take `card.gate()`.
    fn mlu_compute(
        &self,
        dims: &Self::Dims,
        launch: &Self::Launch,
        card: &Card<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// An operator Cambricon's MLU-OPS library runs (the [`MluOps`] path).
pub trait MluOpsOperator: Rules {
    /// The kernel families of ours its MLU-OPS path launches around the library's calls:
    /// the value checks, and whatever its pre-call steps need.
    const PRE_CALL_FAMILIES: &'static [&'static str] = &["check"];
    /// `Ok` when MLU-OPS supports this configuration and its documented semantics give the
    /// contract's answer (docs/MLUOPS_BINDING.md), else the reason.
    fn mluops_supported(&self) -> Result<()>;
    /// `Ok` unless the static shapes exceed a documented scale limitation on this card:
    /// decided when the node is claimed, so that a node the library cannot take is never
    /// claimed for it and then declined at every run.
    fn mluops_supported_shapes(&self, _info: &DeviceInfo, _shapes: &StaticShapes) -> Result<()> {
        Ok(())
    }
    /// `Ok` unless the run-time sizes exceed a documented scale limitation.
    fn mluops_fits(&self, dims: &Self::Dims) -> Result<()>;
    /// Allocates the outputs and calls the library on the card's queue, after the value
    /// checks passed.
    fn mluops_compute(
        &self,
        dims: &Self::Dims,
        lib: &Library,
        card: &Card<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// Our BANG kernels.
pub struct Bang;

impl<O: MluOperator> CardPath<O> for Bang {
    const BACKEND: Backend = Backend::Bang;
    const HOST_GATE: bool = false;
    fn supported(&self, op: &O) -> Result<()> {
        op.mlu_supported()
    }
    fn families(&self) -> &'static [&'static str] {
        O::BANG_FAMILIES
    }
    fn supported_shapes(&self, op: &O, info: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        op.mlu_supported_shapes(info, shapes)
    }
    type Fit = O::Launch;
    fn fits(&self, op: &O, info: &DeviceInfo, dims: &O::Dims) -> Result<O::Launch> {
        op.mlu_launch(info, dims)
    }
    fn enqueue(
        &self,
        op: &O,
        dims: &O::Dims,
        launch: &O::Launch,
        card: &Card<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        op.mlu_compute(dims, launch, card, outputs)
    }
}

/// Cambricon's MLU-OPS library, or why the provider has none.
pub struct MluOps(pub Result<Arc<Library>>);

impl<O: MluOpsOperator> CardPath<O> for MluOps {
    const BACKEND: Backend = Backend::MluOps;
    const HOST_GATE: bool = true;
    fn supported(&self, op: &O) -> Result<()> {
        self.0.as_ref().map_err(Clone::clone)?;
        op.mluops_supported()
    }
    fn families(&self) -> &'static [&'static str] {
        O::PRE_CALL_FAMILIES
    }
    fn supported_shapes(&self, op: &O, info: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        op.mluops_supported_shapes(info, shapes)
    }
    type Fit = ();
    fn fits(&self, op: &O, _: &DeviceInfo, dims: &O::Dims) -> Result<()> {
        op.mluops_fits(dims)
    }
    fn enqueue(
        &self,
        op: &O,
        dims: &O::Dims,
        _: &(),
        card: &Card<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let lib =
            self.0.as_ref().map_err(|why| Error::Runtime(format!("no MLU-OPS library: {why}")))?;
        card.device.bind_thread()?;
        op.mluops_compute(dims, lib, card, outputs)
    }
}

/// One card path of one node, type-erased: what a [`CardNode`] tries in order.
pub trait CardKernel: Send + Sync {
    fn backend(&self) -> Backend;
    /// As [`CardPath::supported`].
    fn supported(&self) -> Result<()>;
    /// As [`CardPath::families`].
    fn families(&self) -> &'static [&'static str];
    /// The driver's int32 check of every static input, then [`CardPath::supported_shapes`].
    fn supported_shapes(&self, info: &DeviceInfo, shapes: &StaticShapes) -> Result<()>;
    /// Runs the node on the card: `inputs` are the host's view (shapes, dtypes, the size
    /// inputs' values), `device_inputs` the tensors in card memory. Synchronises `queue`.
    /// An [`Error::Declined`] comes before anything is launched, except where a library's
    /// known defect is found after its call (the next path then rewrites the outputs).
    fn run(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        inputs: &Inputs<'_>,
        device_inputs: &[*const c_void],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// Operator `O`'s nodes on path `P`.
pub struct OnCard<O, P> {
    op: Arc<O>,
    path: P,
}

impl<O: Rules, P: CardPath<O>> CardKernel for OnCard<O, P> {
    fn backend(&self) -> Backend {
        P::BACKEND
    }
    fn supported(&self) -> Result<()> {
        self.path.supported(&self.op)
    }
    fn families(&self) -> &'static [&'static str] {
        self.path.families()
    }
    fn supported_shapes(&self, info: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        int32_inputs(shapes)?;
        self.path.supported_shapes(&self.op, info, shapes)
    }
    fn run(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        inputs: &Inputs<'_>,
        device_inputs: &[*const c_void],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let op = &*self.op;
        let dims = op.shape_rules(inputs)?;
        for i in 0..device_inputs.len() {
            if let Some(n) = inputs.numel(i).filter(|&n| n > i32::MAX as usize) {
                return Err(Error::declined(format!(
                    "input '{}' has {n} elements, beyond int32 offsets",
                    inputs.name(i)
                )));
            }
        }
        let fit = self.path.fits(op, &device.info, &dims)?;
        let rules = op.value_rules(&dims);
        let records: *mut i32 = outputs.workspace(rules.len() * 4)?.cast();
        let verify = || {
            let broken = read_records(device, inputs, &rules, records, device_inputs)?;
            broken.map_or(Ok(()), |b| Err(op.describe(inputs, &dims, &b)))
        };
        let card = Card {
            device,
            queue,
            inputs: device_inputs,
            records,
            rules: rules.len(),
            verify: &verify,
            verified: std::cell::Cell::new(false),
        };
        let mut enqueue = || {
            for (k, rule) in rules.iter().enumerate() {
                let part = rule.elements(inputs.numel(rule.input).unwrap_or(0));
                let data = match device_inputs.get(rule.input).copied() {
                    // SAFETY: `part` lies inside the input's elements, 4 bytes each.
                    Some(p) if !p.is_null() => {
                        unsafe { p.cast::<u8>().add(part.start * 4) }.cast::<c_void>()
                    }
                    _ => std::ptr::null(),
                };
                // SAFETY: `records` holds one int32 per rule.
                let record = unsafe { records.add(k) };
                launch_check(device, queue, rule, data, part.len(), record, outputs)?;
            }
            if P::HOST_GATE && !rules.is_empty() {
                queue.sync()?;
                card.verify()?;
            }
            self.path.enqueue(op, &dims, &fit, &card, outputs)
        };
        let enqueued = enqueue();
        // The node's one wait (two on a host-gated path), on every path once anything may be
        // enqueued: the workspace must not be freed under a kernel.
        let synced = queue.sync();
        enqueued?;
        synced?;
        card.verify()
    }
}

/// A node's card side: its CPU kernel (the host fallback) and its card paths in the
/// provider's order.
pub struct CardNode {
    pub op: &'static str,
    pub cpu: Arc<dyn Kernel>,
    pub paths: Vec<Box<dyn CardKernel>>,
    pub size_inputs: &'static [usize],
}

/// A path constructor: operator `O` on one backend, given the provider's backends.
pub type PathOf<O> = fn(&Arc<O>, &CardBackends) -> (Backend, Box<dyn CardKernel>);

/// `O` on our BANG kernels.
pub fn bang<O: MluOperator>(op: &Arc<O>, _: &CardBackends) -> (Backend, Box<dyn CardKernel>) {
    (Backend::Bang, Box::new(OnCard { op: Arc::clone(op), path: Bang }))
}

/// `O` on Cambricon's MLU-OPS library.
pub fn mluops<O: MluOpsOperator>(op: &Arc<O>, b: &CardBackends) -> (Backend, Box<dyn CardKernel>) {
    (Backend::MluOps, Box::new(OnCard { op: Arc::clone(op), path: MluOps(b.mluops.clone()) }))
}

/// Builds a node of `O` with the paths of `paths` the provider allows, in its order.
pub fn card_node<O: Rules>(
    attrs: &Attrs<'_>,
    backends: &CardBackends,
    paths: &[PathOf<O>],
) -> Result<CardNode> {
    let op = Arc::new(O::from_attributes(attrs)?);
    let mut all: Vec<(Backend, Box<dyn CardKernel>)> =
        paths.iter().map(|p| p(&op, backends)).collect();
    // The provider's order; a backend the operator has no path for is skipped.
    all.sort_by_key(|(b, _)| backends.order.iter().position(|x| x == b).unwrap_or(usize::MAX));
    let paths =
        all.into_iter().filter(|(b, _)| backends.order.contains(b)).map(|(_, k)| k).collect();
    let cpu: Arc<dyn Kernel> = op;
    Ok(CardNode { op: O::NAME, cpu, paths, size_inputs: O::SIZE_INPUTS })
}

/// Where a node ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// On this card backend, after the earlier paths that declined the run-time sizes (each
    /// with its reason, in order).
    Card(Backend, Vec<(Backend, String)>),
    /// On the host CPU after every card path declined its run-time sizes: the reasons.
    Host(String),
}

impl CardNode {
    /// The backend that will be tried first, with the reasons of the backends passed over
    /// before it ("backend: reason" each), or why no path runs this configuration.
    pub fn static_choice(
        &self,
        info: &DeviceInfo,
        shapes: Option<&StaticShapes>,
    ) -> Result<(Backend, Vec<String>)> {
        let mut why = Vec::new();
        for p in &self.paths {
            let verdict = info
                .has_families(p.families())
                .and_then(|()| p.supported())
                .and_then(|()| shapes.map_or(Ok(()), |s| p.supported_shapes(info, s)));
            match verdict {
                Ok(()) => return Ok((p.backend(), why)),
                Err(r) => why.push(format!("{}: {r}", p.backend().name())),
            }
        }
        if self.paths.is_empty() {
            why.push("no card backend of this provider has kernels for it".into());
        }
        Err(Error::declined(why.join("; ")))
    }

    /// The one node runner, for the provider and the tests alike: the size inputs read
    /// from the card, then each path this configuration supports in order until one takes
    /// the run-time sizes, else the CPU kernel on host copies of the inputs, its outputs
    /// copied to the card. Returns where the node ran (`None` when it failed before any path
    /// was chosen) and how: a node's error is reported with the path that raised it, so that a
    /// failed run is logged and counted like a successful one.
    pub fn run(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        names: Vec<String>,
        tensors: &[Option<CardTensor>],
        outputs: &mut dyn DeviceOutputs,
    ) -> (Option<Ran>, Result<()>) {
        let described: Vec<Option<(DType, Vec<i64>)>> =
            tensors.iter().map(|d| d.as_ref().map(|d| (d.dtype, d.shape.clone()))).collect();
        let ptrs: Vec<*const c_void> = tensors
            .iter()
            .map(|d| d.as_ref().map_or(std::ptr::null(), |d| d.data.cast_const()))
            .collect();
        let sizes = match read_sizes(device, self.size_inputs, &described, &ptrs) {
            Err(e) => return (None, Err(e)),
            Ok(Ok(sizes)) => sizes,
            Ok(Err(i)) => {
                let why = format!(
                    "size input '{}' holds more than the {SIZE_INPUT_BYTES} bytes the card path reads",
                    names[i]
                );
                let result = self.run_on_host(device, names, tensors, outputs);
                return (Some(Ran::Host(why)), result);
            }
        };
        let inputs = match card_inputs(names.clone(), &described, &sizes) {
            Ok(inputs) => inputs,
            Err(e) => return (None, Err(e)),
        };
        let mut declined = Vec::new();
        let usable = |p: &dyn CardKernel| {
            device.info.has_families(p.families()).and_then(|()| p.supported()).is_ok()
        };
        for p in self.paths.iter().filter(|p| usable(p.as_ref())) {
            match p.run(device, queue, &inputs, &ptrs, outputs) {
                Err(Error::Declined(why)) => declined.push((p.backend(), why)),
                result => return (Some(Ran::Card(p.backend(), declined)), result),
            }
        }
        let why = if declined.is_empty() {
            "no card path supports this configuration".into()
        } else {
            reasons(&declined)
        };
        let result = self.run_on_host(device, names, tensors, outputs);
        (Some(Ran::Host(why)), result)
    }

    /// Copies the inputs to the host, runs the CPU kernel on them, then copies its outputs
    /// into the node's card outputs.
    fn run_on_host(
        &self,
        device: &Device,
        names: Vec<String>,
        tensors: &[Option<CardTensor>],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let mut staged = Vec::with_capacity(tensors.len());
        for (name, input) in names.iter().zip(tensors) {
            staged.push(match input {
                None => None,
                Some(d) => {
                    let spec = d.spec()?;
                    let mut data =
                        OwnedData::poisoned(&spec, &format!("the host copy of input '{name}'"))?;
                    // SAFETY: `data` holds spec.bytes() bytes; d.data is the card tensor of as many.
                    unsafe {
                        device.copy_raw(
                            data.as_mut_ptr(),
                            d.data,
                            spec.bytes(),
                            Direction::DeviceToHost,
                        )?
                    };
                    Some(Tensor { shape: spec.shape, data })
                }
            });
        }
        let refs: Vec<Option<TensorRef<'_>>> =
            staged.iter().map(|t| t.as_ref().map(Tensor::view)).collect();
        let inputs = Inputs::new(names, refs)?;
        let mut host = OwnedOutputs::named(self.cpu_output_names());
        self.cpu.compute(&inputs, &mut host, &Serial)?;
        for (i, (spec, data)) in host.specs.iter().zip(&host.data).enumerate() {
            let dst = outputs.allocate(i, spec)?;
            // SAFETY: `dst` is the card output just allocated for `spec`, `data` the host
            // buffer of the same spec: both hold spec.bytes() bytes.
            unsafe { device.copy_raw(dst, data.as_ptr(), spec.bytes(), Direction::HostToDevice)? };
        }
        Ok(())
    }

    fn cpu_output_names(&self) -> Vec<String> {
        super::schema(self.op).output_names()
    }
}

/// Backends' run-time declines as the log and the traffic report word them:
/// "backend: reason; backend: reason".
pub fn reasons(declined: &[(Backend, String)]) -> String {
    declined.iter().map(|(b, why)| format!("{}: {why}", b.name())).collect::<Vec<_>>().join("; ")
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
    let tile_rows =
        ((NRAM_BUDGET - 2 * 64 - tasks as usize * 4) / (cols * 4)).min(i32::MAX as usize);
    let (rows, cols, tile_rows) =
        (bounded("rows", numel / cols)?, bounded("cols", cols)?, bounded("tile_rows", tile_rows)?);
    let k = device.kernels::<CheckKernels>()?;
    match rule.check {
        Check::Int { bounds, .. } => {
            let b = IntBounds { lo: bounds.map(|b| b.0), hi: bounds.map(|b| b.1) };
            // SAFETY: `data` is the rule's input, `rows * cols` int32 in card memory (or
            // null for none); `task_first` and `record` are card scratch of the sizes the
            // kernel writes; the launch only enqueues.
            queue.launch("mluops_check_int_rows", |q| unsafe {
                (k.mluops_check_int_rows)(
                    q,
                    tasks,
                    TASK_UNION1,
                    data.cast(),
                    rows,
                    cols,
                    &b,
                    tile_rows,
                    task_first,
                    record,
                )
            })
        }
        Check::GuardedFloat { col, above, below, .. } => {
            let col = bounded("col", col)?;
            // SAFETY: as above, for float32 rows.
            queue.launch("mluops_check_float_rows", |q| unsafe {
                (k.mluops_check_float_rows)(
                    q,
                    tasks,
                    TASK_UNION1,
                    data.cast(),
                    rows,
                    cols,
                    col,
                    above,
                    below,
                    tile_rows,
                    task_first,
                    record,
                )
            })
        }
    }
}

/// After the queue's synchronisation: the first broken rule, with its row read from the card.
fn read_records(
    device: &Device,
    inputs: &Inputs<'_>,
    rules: &[ValueRule],
    records: *const i32,
    device_inputs: &[*const c_void],
) -> Result<Option<Broken>> {
    if rules.is_empty() {
        return Ok(None);
    }
    let mut found = crate::scratch::filled(rules.len(), -1i32, "the value checks' records")?;
    // SAFETY: `records` holds one int32 per rule, written by the check kernels.
    unsafe {
        device.copy_raw(
            found.as_mut_ptr().cast(),
            records.cast(),
            found.len() * 4,
            Direction::DeviceToHost,
        )?
    };
    let Some((rule, row)) =
        found.iter().enumerate().find_map(|(k, &r)| usize::try_from(r).ok().map(|row| (k, row)))
    else {
        return Ok(None);
    };
    let cols = rules[rule].check.cols();
    let first = rules[rule].elements(inputs.numel(rules[rule].input).unwrap_or(0)).start;
    let src = device_inputs[rules[rule].input].cast::<u8>();
    // SAFETY: the check kernel found row `row` inside the rule's part of the input, `cols`
    // 4-byte values each.
    let src = unsafe { src.add((first + row * cols) * 4) }.cast::<c_void>();
    let values = match rules[rule].check {
        Check::Int { .. } => {
            let mut v = vec![0i32; cols];
            // SAFETY: `v` holds `cols` int32; `src` is that row in card memory.
            unsafe {
                device.copy_raw(v.as_mut_ptr().cast(), src, cols * 4, Direction::DeviceToHost)?
            };
            RowValues::I32(v)
        }
        Check::GuardedFloat { .. } => {
            let mut v = vec![0f32; cols];
            // SAFETY: as above, float32.
            unsafe {
                device.copy_raw(v.as_mut_ptr().cast(), src, cols * 4, Direction::DeviceToHost)?
            };
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
                        len: shape
                            .iter()
                            .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?))
                            .unwrap_or(usize::MAX),
                    },
                };
                TensorRef { shape: shape.clone(), data }
            })
        })
        .collect();
    Inputs::new(names, tensors)
}

/// The values of the size inputs `which`, copied from the card; `Err(i)` when input i holds
/// more than [`SIZE_INPUT_BYTES`] (not read: the node then runs its CPU kernel).
pub fn read_sizes(
    device: &Device,
    which: &[usize],
    inputs: &[Option<(DType, Vec<i64>)>],
    device_inputs: &[*const c_void],
) -> Result<std::result::Result<Vec<Option<OwnedData>>, usize>> {
    let mut sizes = vec![None; inputs.len()];
    for &i in which {
        let Some(Some((dtype, shape))) = inputs.get(i) else { continue };
        let Ok(dims) =
            shape.iter().map(|&d| usize::try_from(d)).collect::<std::result::Result<Vec<_>, _>>()
        else {
            continue;
        };
        let spec = OutputSpec::new(*dtype, dims);
        if spec.bytes() > SIZE_INPUT_BYTES {
            return Ok(Err(i));
        }
        let mut data = OwnedData::poisoned(&spec, "a size input")?;
        if spec.bytes() == 0 {
            sizes[i] = Some(data);
            continue;
        }
        // SAFETY: `data` holds spec.bytes() bytes; the card tensor as many.
        unsafe {
            device.copy_raw(
                data.as_mut_ptr(),
                device_inputs[i],
                spec.bytes(),
                Direction::DeviceToHost,
            )?
        };
        sizes[i] = Some(data);
    }
    Ok(Ok(sizes))
}

/// The input shapes of a node as the graph declares them: `None` for an absent input,
/// `None` for a symbolic dimension.
pub type StaticShapes = [Option<Vec<Option<usize>>>];

/// Dimension `axis` of input `input` when it is static.
pub fn static_dim(shapes: &StaticShapes, input: usize, axis: usize) -> Option<usize> {
    shapes.get(input)?.as_ref()?.get(axis).copied().flatten()
}

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
) -> Result<()> {
    let dims = shapes.get(input).and_then(|s| s.as_ref());
    if let Some([Some(a), Some(b)]) = dims.map(|d| axes.map(|i| d.get(i).copied().flatten())) {
        let n = a.saturating_mul(b).saturating_mul(times);
        if n > i32::MAX as usize {
            return Err(Error::declined(format!(
                "the output's {what} = {n} elements exceed the MLU kernel's int32 offsets"
            )));
        }
    }
    Ok(())
}

/// Every statically known input fits the kernels' int32 element offsets.
pub fn int32_inputs(shapes: &StaticShapes) -> Result<()> {
    for (i, s) in shapes.iter().enumerate() {
        if let Some(n) = s.as_deref().and_then(static_numel).filter(|&n| n > i32::MAX as usize) {
            return Err(Error::declined(format!(
                "input {i} has {n} elements, beyond the MLU kernels' int32 offsets"
            )));
        }
    }
    Ok(())
}

/// Host-tensor driver: uploads the inputs, runs `node` on `device` through the one node
/// runner the provider uses ([`CardNode::run`]), downloads the outputs; and where it ran.
pub fn run_node_on_device(
    device: &Arc<Device>,
    node: &CardNode,
    inputs: &[Option<&Tensor>],
) -> Result<(Vec<Tensor>, Ran)> {
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
    let tensors: Vec<Option<CardTensor>> = inputs
        .iter()
        .zip(&uploaded)
        .map(|(t, b)| {
            t.zip(b.as_ref()).map(|(t, b)| CardTensor {
                dtype: t.data.as_data().dtype(),
                shape: t.shape.iter().map(|&d| d as i64).collect(),
                data: b.ptr(),
            })
        })
        .collect();
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
    let names = super::schema(node.op).input_names();
    let (ran, result) = node.run(device, &queue, names, &tensors, &mut outs);
    result?;
    let ran = ran.ok_or_else(|| Error::Runtime(format!("{}: ran on no path", node.op)))?;
    let mut result = Vec::new();
    for (i, slot) in outs.bufs.into_iter().enumerate() {
        let (spec, buf) = slot.ok_or_else(|| {
            Error::Runtime(format!("{}: output {i} was never allocated", node.op))
        })?;
        let mut data = OwnedData::poisoned(&spec, &format!("host copy of output {i}"))?;
        match &mut data {
            OwnedData::F32(v) => device.download(&buf, v)?,
            OwnedData::F16(v) => device.download(&buf, v)?,
            OwnedData::I32(v) => device.download(&buf, v)?,
            OwnedData::I64(v) => device.download(&buf, v)?,
        }
        result.push(Tensor { shape: spec.shape, data });
    }
    Ok((result, ran))
}

/// Runs `op` on our BANG kernels on `device` (the tests' driver): an error unless the node
/// ran on the card.
pub fn run_on_device<O: MluOperator + Clone>(
    device: &Arc<Device>,
    op: &O,
    inputs: &[Option<&Tensor>],
) -> Result<Vec<Tensor>> {
    let backends =
        CardBackends { order: &[Backend::Bang], mluops: Err(Error::declined("not used")) };
    let op = Arc::new(op.clone());
    let (_, path) = bang(&op, &backends);
    let cpu: Arc<dyn Kernel> = op;
    let node = CardNode { op: O::NAME, cpu, paths: vec![path], size_inputs: O::SIZE_INPUTS };
    node.paths[0].supported().map_err(|why| {
        Error::Runtime(format!("{}: not supported by the BANG kernels: {why}", O::NAME))
    })?;
    match run_node_on_device(device, &node, inputs)? {
        (outputs, Ran::Card(..)) => Ok(outputs),
        (_, Ran::Host(why)) => {
            Err(Error::Runtime(format!("{}: ran on the host, not the card: {why}", O::NAME)))
        }
    }
}

/// A run-time size narrowed to the kernels' int32, or the reason it cannot be (for a
/// path's fit: the node then goes to the next path before anything is launched).
pub fn narrow(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::declined(format!("MLU kernel argument {what} = {v} exceeds int32")))
}

/// A size the checks before it have bounded, as the kernels' int32: beyond int32 is a bug
/// (a runtime error), never a decline.
pub fn bounded(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::Runtime(format!("{what} = {v} beyond int32 after its limits were checked"))
    })
}
