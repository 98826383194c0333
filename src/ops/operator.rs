//! What an operator is to its hosts: [`Operator`], the one trait every operator implements
//! (`from_attributes` once per node; per run its rules, which the CPU path and every card
//! path share, then the CPU path's `plan` and `execute`), its type-erased [`Kernel`], and
//! the Rust API's drivers over owned tensors.

use super::host::OwnedOutputs;
use super::rules::{Broken, ValueRule, check_values};
use crate::error::{Error, Result};
use crate::parallel::Parallel;
use crate::schema::{self, AttrValue, Attrs, Schema};
use crate::tensor::{Inputs, OutputHost, OutputSpec, Outputs, Tensor, TensorRef};
use std::collections::HashMap;

pub trait Operator: Sized + Send + Sync + 'static {
    /// The ONNX op_type in domain `mluops`; also the schema's name.
    const NAME: &'static str;
    /// The operator's schema file (`schemas/<family>/<op>.json`), embedded.
    const SCHEMA: &'static str;
    /// Inputs whose values the shape rules read: sizes of at most
    /// [`SIZE_INPUT_BYTES`](super::rules::SIZE_INPUT_BYTES) each
    /// (the card path copies these, and only these, to the host).
    const SIZE_INPUTS: &'static [usize] = &[];
    /// What the shape rules learn: the sizes every later step, on every path, works from.
    type Dims: Clone + Send + Sync + std::fmt::Debug;
    /// What the CPU kernel needs beyond `Dims` that only the data gives, found by
    /// [`Operator::find`]: DynamicScatter's voxels, DynamicScatterBackward's points grouped by
    /// voxel, GetIndicePairs' and IndiceConv's rulebooks; `()` for the rest.
    type Found: Send;

    /// Builds the descriptor, checking every attribute rule.
    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self>;

    /// The shape rules: reads shapes, dtypes and the [`Self::SIZE_INPUTS`] values only.
    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Self::Dims>;

    /// The outputs' dtypes and shapes for `dims`: declared once, so that the CPU path and
    /// every card backend allocate the same outputs. DynamicScatter's outputs with a row per
    /// voxel and GetIndicePairs' out_indices with a row per output site are the exceptions:
    /// counts only the data gives ([`Operator::found_specs`]).
    fn output_specs(&self, dims: &Self::Dims) -> Vec<OutputSpec>;

    /// The value rules, in the order they are reported.
    fn value_rules(&self, _dims: &Self::Dims) -> Vec<ValueRule> {
        Vec::new()
    }

    /// The contract error of a broken value rule (operators with value rules say it in
    /// the contract's words).
    fn describe(&self, inputs: &Inputs<'_>, dims: &Self::Dims, broken: &Broken) -> Error {
        let input = self.value_rules(dims).get(broken.rule).map_or(0, |r| r.input);
        inputs.error(input, format!("row {} = {:?} breaks a value rule", broken.row, broken.values))
    }

    /// Finds [`Self::Found`] from the data once the rules hold. `par` is the node's thread
    /// pool, for operators whose output shapes take real work to find (GetIndicePairs'
    /// unique output sites).
    fn find(
        &self,
        inputs: &Inputs<'_>,
        dims: &Self::Dims,
        par: &dyn Parallel,
    ) -> Result<Self::Found>;

    /// The outputs the CPU path allocates: [`Operator::output_specs`] unless the data sizes
    /// an output.
    fn found_specs(&self, dims: &Self::Dims, _found: &Self::Found) -> Vec<OutputSpec> {
        self.output_specs(dims)
    }

    /// The CPU path's checks and the output specs; writes nothing: the shape rules, the
    /// value rules on the host, then [`Operator::find`].
    fn plan(
        &self,
        inputs: &Inputs<'_>,
        par: &dyn Parallel,
    ) -> Result<(Vec<OutputSpec>, Self::Dims, Self::Found)> {
        let dims = self.shape_rules(inputs)?;
        check_values(self, inputs, &dims)?;
        let found = self.find(inputs, &dims, par)?;
        Ok((self.found_specs(&dims, &found), dims, found))
    }

    /// The CPU kernel: fills the outputs allocated with the planned specs.
    fn execute(
        &self,
        dims: Self::Dims,
        found: Self::Found,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()>;

    fn schema() -> &'static Schema {
        schema::embedded(Self::NAME, Self::SCHEMA)
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
        let (specs, dims, found) = self.plan(inputs, par)?;
        let mut outputs = host.allocate(&specs)?;
        self.execute(dims, found, inputs, &mut outputs, par)
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
