//! What an operator is to its hosts: [`Operator`] (`from_attributes` once per node, then per
//! run `plan`, validating everything and computing output shapes, and `execute`), its
//! type-erased [`Kernel`], and the Rust API's drivers over owned tensors.

use super::host::OwnedOutputs;
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
    /// Whatever `plan` learns that `execute` needs: the shape rules' `Dims` itself, or
    /// those sizes with the work found from the data (a sorted map, a rulebook).
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
        let (specs, plan) = self.plan(inputs, par)?;
        let mut outputs = host.allocate(&specs)?;
        self.execute(plan, inputs, &mut outputs, par)
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
