//! The operators: the five of docs/CONTRACT.md and their forward partners. Each module owns its descriptor (built from the node's attributes,
//! with every attribute rule of docs/CONTRACT.md checked), its input checks, and its CPU kernel.
//! Hosts drive them through [`Operator`]: `from_attributes` once per node, then per run
//! `plan` (validate everything, compute output shapes; nothing is written) and `execute`.

pub mod device;
pub mod dynamic_scatter;
pub mod psroipool;
pub mod radix;
pub mod rules;
pub mod sparse_conv;
pub mod three_interpolate;
pub mod voxel_pooling;

use crate::error::{Error, Result};
use crate::parallel::Parallel;
use crate::schema::{AttrValue, Attrs, Schema};
use crate::tensor::{
    Inputs, OutData, OutputHost, OutputSpec, Outputs, OwnedData, Tensor, TensorRef,
};
use device::{CardBackends, CardNode, PathOf, bang, card_node, mluops};
use std::collections::HashMap;
use std::sync::OnceLock;

pub trait Operator: Sized + Send + Sync + 'static {
    /// The ONNX op_type in domain `mluops`; also the schema's name.
    const NAME: &'static str;
    /// The operator's schema file (`schemas/<family>/<op>.json`), embedded.
    const SCHEMA: &'static str;
    /// Whatever `plan` learns that `execute` needs (validated sizes, sorted indices...).
    type Plan: Send;

    /// Builds the descriptor, checking every attribute rule.
    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self>;

    /// Checks the inputs against the contract and returns the output specs. Writes nothing.
    /// `par` is the node's thread pool, for operators whose output shapes take real work to
    /// find (GetIndicePairs' unique output sites).
    fn plan(
        &self,
        inputs: &Inputs<'_>,
        par: &dyn Parallel,
    ) -> Result<(Vec<OutputSpec>, Self::Plan)>;

    /// Fills the outputs allocated with the planned specs.
    fn execute(
        &self,
        plan: Self::Plan,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()>;

    fn schema() -> &'static Schema {
        schema(Self::NAME)
    }
}

/// A type-erased configured node: what the ONNX Runtime glue holds per node.
pub trait Kernel: Send + Sync {
    fn compute(
        &self,
        inputs: &Inputs<'_>,
        host: &mut dyn OutputHost,
        par: &dyn Parallel,
    ) -> Result<()>;
}

impl<O: Operator> Kernel for O {
    fn compute(
        &self,
        inputs: &Inputs<'_>,
        host: &mut dyn OutputHost,
        par: &dyn Parallel,
    ) -> Result<()> {
        let (specs, plan) = self.plan(inputs, par)?;
        let mut outputs = host.allocate(&specs)?;
        self.execute(plan, inputs, &mut outputs, par)
    }
}

/// Builds a node's card side (its CPU kernel and card paths) for a provider's backends.
pub type CreateCard = fn(&Attrs<'_>, &CardBackends) -> Result<CardNode>;

/// Registry entry: how to build a node's kernel from its attributes, for the CPU path and,
/// for the operators a card backend runs, for the card.
pub struct OpEntry {
    pub name: &'static str,
    /// The schema file's text (parsed once by [`schemas`]).
    pub schema: &'static str,
    pub create: fn(&Attrs<'_>) -> Result<Box<dyn Kernel>>,
    /// `None`: no card backend runs it; the EP declines the operator's nodes, which run on CPU.
    pub create_card: Option<CreateCard>,
    /// The card backends that have a path for it, in `card!`'s order (the provider's order
    /// decides which is tried first).
    pub card_backends: &'static [device::Backend],
}

fn create<O: Operator>(attrs: &Attrs<'_>) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(O::from_attributes(attrs)?))
}

/// An operator and the card backends that run it: each name is a function of `device`
/// building that backend's path ([`device::mluops`], [`device::bang`]).
macro_rules! card {
    (@backend mluops) => { device::Backend::MluOps };
    (@backend bang) => { device::Backend::Bang };
    ($t:ty, [$($path:ident),+]) => {
        OpEntry {
            name: <$t>::NAME,
            schema: <$t>::SCHEMA,
            create: create::<$t>,
            create_card: Some(|attrs, backends| {
                const PATHS: &[PathOf<$t>] = &[$($path::<$t>),+];
                card_node::<$t>(attrs, backends, PATHS)
            }),
            card_backends: &[$(card!(@backend $path)),+],
        }
    };
}

macro_rules! cpu_only {
    ($t:ty) => {
        OpEntry {
            name: <$t>::NAME,
            schema: <$t>::SCHEMA,
            create: create::<$t>,
            create_card: None,
            card_backends: &[],
        }
    };
}

/// Every operator of the domain: the five of docs/CONTRACT.md (§2-§6) in its order, then the forward
/// partners the models need (three of them on MLU-OPS: docs/MLUOPS_BINDING.md §4).
pub const ALL: &[OpEntry] = &[
    card!(dynamic_scatter::DynamicScatterBackward, [mluops, bang]),
    card!(three_interpolate::ThreeInterpolateBackward, [mluops, bang]),
    card!(sparse_conv::GetIndicePairs, [mluops, bang]),
    card!(voxel_pooling::VoxelPoolingForward, [mluops, bang]),
    card!(psroipool::PsRoiPoolBackward, [mluops, bang]),
    cpu_only!(dynamic_scatter::DynamicScatter),
    card!(sparse_conv::IndiceConv, [mluops]),
    card!(three_interpolate::ThreeInterpolate, [mluops]),
    card!(psroipool::PsRoiPool, [mluops]),
];

pub fn entry(name: &str) -> Option<&'static OpEntry> {
    ALL.iter().find(|e| e.name == name)
}

/// Every operator's schema, in [`ALL`]'s order, parsed once.
pub fn schemas() -> &'static [Schema] {
    static SCHEMAS: OnceLock<Vec<Schema>> = OnceLock::new();
    SCHEMAS.get_or_init(|| ALL.iter().map(|e| Schema::parse(e.name, e.schema)).collect())
}

/// The schema of operator `op_type` (one of [`ALL`]).
pub fn schema(op_type: &str) -> &'static Schema {
    schemas()
        .iter()
        .find(|s| s.op_type == op_type)
        .unwrap_or_else(|| panic!("no schema for {op_type}"))
}

/// Owned buffers for hosts outside ONNX Runtime. New buffers are poisoned (see
/// [`OwnedData::poisoned`]); a host that runs the same shapes again reuses its buffers
/// as they are, as ONNX Runtime's arena does.
#[derive(Default)]
pub struct OwnedOutputs {
    /// The outputs' names, for errors (may be empty).
    pub names: Vec<String>,
    pub specs: Vec<OutputSpec>,
    pub data: Vec<OwnedData>,
}

impl OutputHost for OwnedOutputs {
    fn allocate(&mut self, specs: &[OutputSpec]) -> Result<Outputs<'_>> {
        if self.specs != specs || self.data.len() != specs.len() {
            self.data = Vec::new();
            for (i, spec) in specs.iter().enumerate() {
                let name = self.names.get(i).map_or_else(|| i.to_string(), |n| format!("'{n}'"));
                self.data.push(OwnedData::poisoned(
                    spec,
                    &format!("output {name} ({:?} {:?})", spec.dtype, spec.shape),
                )?);
            }
            self.specs = specs.to_vec();
        }
        Ok(Outputs::new(self.names.clone(), self.data.iter_mut().map(OwnedData::as_out).collect()))
    }
}

impl OwnedOutputs {
    pub fn named(names: Vec<String>) -> Self {
        OwnedOutputs { names, ..Default::default() }
    }
    pub fn into_tensors(self) -> Vec<Tensor> {
        self.specs
            .into_iter()
            .zip(self.data)
            .map(|(s, data)| Tensor { shape: s.shape, data })
            .collect()
    }
}

/// [`OwnedOutputs`] whose outputs start on a 64-byte line, as onnxruntime's CPU allocator
/// hands them out (a plain Vec starts wherever the allocator puts it, often 16 bytes into
/// one): kernels write whole lines with non-temporal stores only where rows start on a
/// line, so benches and tests called directly take the paths sessions take.
#[derive(Default)]
pub struct LineAlignedOutputs {
    owned: OwnedOutputs,
    /// Where each output starts in its buffer, in elements.
    starts: Vec<usize>,
}

impl OutputHost for LineAlignedOutputs {
    fn allocate(&mut self, specs: &[OutputSpec]) -> Result<Outputs<'_>> {
        if self.owned.specs != specs {
            // 64 elements of at least a byte reach the next line from anywhere.
            let padded: Vec<OutputSpec> = specs
                .iter()
                .map(|s| OutputSpec::new(s.dtype, [s.numel().saturating_add(64)]))
                .collect();
            self.owned.allocate(&padded)?;
            self.starts = self
                .owned
                .data
                .iter()
                .zip(specs)
                .map(|(d, s)| d.as_ptr().cast::<u8>().align_offset(64) / s.dtype.size())
                .collect();
            self.owned.specs = specs.to_vec();
        }
        let parts = self.owned.data.iter_mut().zip(&self.starts).zip(specs).map(|((d, &at), s)| {
            let part = at..at + s.numel();
            match d {
                OwnedData::F32(v) => OutData::F32(&mut v[part]),
                OwnedData::F16(v) => OutData::F16(&mut v[part]),
                OwnedData::I32(v) => OutData::I32(&mut v[part]),
                OwnedData::I64(v) => OutData::I64(&mut v[part]),
            }
        });
        Ok(Outputs::new(self.owned.names.clone(), parts.collect()))
    }
}

impl LineAlignedOutputs {
    /// The outputs of the last run, their buffers cut to them (in place).
    pub fn into_tensors(self) -> Vec<Tensor> {
        fn cut<T>(mut v: Vec<T>, at: usize, len: usize) -> Vec<T> {
            v.drain(..at);
            v.truncate(len);
            v
        }
        let parts = self.owned.data.into_iter().zip(self.starts).zip(self.owned.specs).map(
            |((d, at), s)| {
                let len = s.numel();
                let data = match d {
                    OwnedData::F32(v) => OwnedData::F32(cut(v, at, len)),
                    OwnedData::F16(v) => OwnedData::F16(cut(v, at, len)),
                    OwnedData::I32(v) => OwnedData::I32(cut(v, at, len)),
                    OwnedData::I64(v) => OwnedData::I64(cut(v, at, len)),
                };
                Tensor { shape: s.shape, data }
            },
        );
        parts.collect()
    }
}

/// Builds operator `O`'s descriptor from an attribute map (the Rust API and tests).
pub fn descriptor<O: Operator>(attrs: &HashMap<String, AttrValue>) -> Result<O> {
    O::from_attributes(&Attrs::new(O::schema(), attrs))
}

/// Runs a configured operator on owned inputs (`None` = absent optional input).
pub fn run<O: Operator>(
    op: &O,
    inputs: &[Option<&Tensor>],
    par: &dyn Parallel,
) -> Result<Vec<Tensor>> {
    let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| t.map(Tensor::view)).collect();
    let inputs = Inputs::new(O::schema().input_names(), refs)?;
    let mut host = OwnedOutputs::named(O::schema().output_names());
    Kernel::compute(op, &inputs, &mut host, par)?;
    Ok(host.into_tensors())
}

/// Checks an element count fits the `i32` indices the contract's index tensors use.
pub fn check_i32_range(what: impl FnOnce() -> Error, n: usize) -> Result<()> {
    if n > i32::MAX as usize { Err(what()) } else { Ok(()) }
}
