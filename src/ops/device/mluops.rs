//! The MLU-OPS backend: Cambricon's library (`crate::mluops`), the path [`MluOps`] and the
//! trait [`MluOpsOperator`] an operator the library runs implements (`ops/<family>/mluops.rs`).

use super::{Backend, CardBackends, CardPath, CardRun, DeviceOutputs, StaticShapes};
use crate::error::{Error, Result};
use crate::mlu::DeviceInfo;
use crate::mluops::Library;
use crate::ops::operator::Operator;
use std::sync::Arc;

/// An operator Cambricon's MLU-OPS library runs (the [`MluOps`] path).
pub trait MluOpsOperator: Operator {
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
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// Cambricon's MLU-OPS library, or why the provider has none.
pub struct MluOps(pub Result<Arc<Library>>);

impl<O: MluOpsOperator> CardPath<O> for MluOps {
    const BACKEND: Backend = Backend::MluOps;
    const HOST_GATE: bool = true;
    fn new(backends: &CardBackends) -> Self {
        MluOps(backends.mluops.clone())
    }
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
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let lib =
            self.0.as_ref().map_err(|why| Error::Runtime(format!("no MLU-OPS library: {why}")))?;
        card.device.bind_thread()?;
        op.mluops_compute(dims, lib, card, outputs)
    }
}
