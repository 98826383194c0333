//! The card backends ([`Backend`]: their names and the order `mlu_backend` tries them),
//! what a backend is to an operator ([`CardPath`], with the per-backend traits operators
//! implement: [`MluOperator`], [`MluOpsOperator`]) and the two paths ([`Bang`], [`MluOps`]).

use super::{Card, DeviceOutputs, StaticShapes};
use crate::error::{Error, Result};
use crate::mlu::DeviceInfo;
use crate::mluops::Library;
use crate::ops::rules::Rules;
use std::sync::Arc;

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
