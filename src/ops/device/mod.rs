//! The operators' side of a card, and card backends as a concept. A node the provider
//! claims runs on one of the card backends ([`Backend`]: Cambricon's MLU-OPS library, our
//! BANG kernels), tried in the provider's order, else on the host CPU. Each backend is a
//! [`CardPath`] with a trait operators implement ([`MluOpsOperator`] in
//! `ops/<family>/mluops.rs`, [`BangOperator`] in `ops/<family>/bang.rs`); a node holds its paths
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
//! its site count, DynamicScatter twice: its coordinate box, then its voxel count). Scratch memory comes from [`DeviceOutputs::workspace`] and lives until
//! the node's outputs are dropped, after that synchronisation.

mod backends;
mod bang;
mod checks;
mod drivers;
mod mluops;

pub use backends::{Backend, CardBackends, CardPath, PathOf, path};
pub use bang::{Bang, BangOperator};
pub use checks::{
    StaticShapes, bounded, int32_inputs, int32_output, narrow, static_dim, static_numel,
};
pub use drivers::{run_node_on_device, run_on_device};
pub use mluops::{MluOps, MluOpsOperator};

use super::host::OwnedOutputs;
use super::operator::{Kernel, Operator};
use super::rules::SIZE_INPUT_BYTES;
use crate::error::{Error, Result};
use crate::mlu::{Device, DeviceInfo, Direction, Queue};
use crate::parallel::Serial;
use crate::schema::{Attrs, Schema};
use crate::tensor::{CardTensor, DType, Data, Inputs, OutputSpec, OwnedData, Tensor, TensorRef};
use checks::{launch_check, read_records};
use std::ffi::c_void;
use std::sync::Arc;

/// Where a device operator's outputs go (device memory the host allocates).
pub trait DeviceOutputs {
    fn allocate(&mut self, index: usize, spec: &OutputSpec) -> Result<*mut c_void>;
    /// Device scratch of `bytes` bytes that lives until the node's queue is synchronised
    /// (null for 0 bytes).
    fn workspace(&mut self, bytes: usize) -> Result<*mut c_void>;
}

/// One node's run on the card, what its path's work runs with: the card, the node's queue,
/// its inputs in card memory (null for absent or empty ones) and the value checks' records.
pub struct CardRun<'a> {
    pub device: &'a Arc<Device>,
    pub queue: &'a Queue,
    inputs: &'a [*const c_void],
    records: *const i32,
    rules: usize,
    verify: &'a dyn Fn() -> Result<()>,
    /// The records were read and no rule was broken: they are not read again.
    verified: std::cell::Cell<bool>,
}

impl CardRun<'_> {
    /// Input `i` in card memory.
    pub fn input<T>(&self, i: usize) -> *const T {
        self.inputs.get(i).map_or(std::ptr::null(), |p| p.cast())
    }

    /// The gate kernels that address memory with input values take: the records and their
    /// count (kernels/common/kernel.h, `bang_gate_closed`).
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

/// One card path of one node, type-erased: what a [`CardNode`] tries in order.
pub trait NodePath: Send + Sync {
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
    /// known defect is found after its call (the next path then rewrites the outputs) or a
    /// size the data gives is measured on the card first (DynamicScatter's coordinate box,
    /// before any output is allocated).
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
pub struct OpPath<O, P> {
    op: Arc<O>,
    path: P,
}

impl<O: Operator, P: CardPath<O>> NodePath for OpPath<O, P> {
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
        let card = CardRun {
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
    /// `op`'s schema (its inputs' and outputs' names).
    pub schema: &'static Schema,
    pub cpu: Arc<dyn Kernel>,
    pub paths: Vec<Box<dyn NodePath>>,
    /// The operator's card backends the provider leaves out (its `mlu_backend`), named in
    /// the decline when no path is left.
    pub elsewhere: Vec<Backend>,
    pub size_inputs: &'static [usize],
}

/// Builds a node of `O` with the paths of `paths` the provider allows, in its order.
pub fn card_node<O: Operator>(
    attrs: &Attrs<'_>,
    backends: &CardBackends,
    paths: &[PathOf<O>],
) -> Result<CardNode> {
    let op = Arc::new(O::from_attributes(attrs)?);
    // The provider's order; a backend the provider does not use is left out.
    let (mut paths, left_out): (Vec<Box<dyn NodePath>>, Vec<_>) =
        paths.iter().map(|p| p(&op, backends)).partition(|k| backends.order.contains(&k.backend()));
    paths.sort_by_key(|k| backends.order.iter().position(|x| *x == k.backend()));
    let elsewhere = left_out.iter().map(|k| k.backend()).collect();
    let cpu: Arc<dyn Kernel> = op;
    Ok(CardNode {
        op: O::NAME,
        schema: O::schema(),
        cpu,
        paths,
        elsewhere,
        size_inputs: O::SIZE_INPUTS,
    })
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
            // Every registry row names a backend, so `card_node` always fills `elsewhere`;
            // a node built by hand with neither still gets a sentence that says so.
            let names: Vec<_> = self.elsewhere.iter().map(|b| b.name()).collect();
            why.push(if names.is_empty() {
                format!("{} has no card path in this provider", self.op)
            } else {
                format!(
                    "{} runs on the card only on {}, which this provider's mlu_backend leaves \
                     out (docs/MLUOPS_BINDING.md §4)",
                    self.op,
                    names.join(" or ")
                )
            });
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
        let usable = |p: &dyn NodePath| {
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
        self.schema.output_names()
    }
}

/// Backends' run-time declines as the log and the traffic report word them:
/// "backend: reason; backend: reason".
pub fn reasons(declined: &[(Backend, String)]) -> String {
    declined.iter().map(|(b, why)| format!("{}: {why}", b.name())).collect::<Vec<_>>().join("; ")
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
