//! The card backends as one table ([`backends!`]: each backend's name, its place in the order
//! `mlu_backend` = `auto` tries them, its counters' slot and its report key), what a backend
//! is to an operator ([`CardPath`]) and the provider's backends ([`CardBackends`]). Each
//! backend's path and the trait operators implement for it are its own file (`bang.rs`,
//! `mluops.rs`).

use super::{CardRun, DeviceOutputs, NodePath, OpPath, StaticShapes};
use crate::error::{Error, Result};
use crate::mlu::DeviceInfo;
use crate::mluops::Library;
use crate::ops::operator::Operator;
use std::sync::Arc;

/// Declares [`Backend`] from one row per backend, in the order `auto` tries them: its
/// variant and its name (the option `mlu_backend`, the log and the reports).
macro_rules! backends {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)+) => {
        /// The card backends (one row each in this file's table).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Backend {
            $($(#[$doc])* $variant,)+
        }

        impl Backend {
            /// Every backend, in the order `auto` tries them; a backend's position is its
            /// counters' slot ([`Backend::index`]).
            pub const ALL: &'static [Backend] = &[$(Backend::$variant),+];
            const NAMES: &'static [&'static str] = &[$($name),+];
        }
    };
}

backends! {
    /// Cambricon's MLU-OPS library where it supports the node (tested by the vendor on cards):
    /// `crate::mluops`, `ops/<family>/mluops.rs`, the path `device/mluops.rs`.
    MluOps = "mluops",
    /// Our BANG kernels: kernels/, `ops/<family>/bang.rs`, the path `device/bang.rs`.
    Bang = "bang",
}

impl Backend {
    /// How many backends there are: the length of the per-backend counters.
    pub const COUNT: usize = Backend::ALL.len();

    /// Its position in [`Backend::ALL`] (the variants are declared in that order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name the option `mlu_backend`, the log and the traffic report use.
    pub fn name(self) -> &'static str {
        Backend::NAMES[self.index()]
    }

    /// The values `mlu_backend` takes: `auto`, then each backend's name.
    pub fn values() -> String {
        std::iter::once("auto").chain(Backend::NAMES.iter().copied()).collect::<Vec<_>>().join(", ")
    }

    /// The backends `mlu_backend` = `value` allows, in the order they are tried: all of them
    /// for `auto`, else the one named.
    pub fn order(value: &str) -> Result<&'static [Backend]> {
        match value.trim() {
            "auto" => Ok(Backend::ALL),
            other => match Backend::NAMES.iter().position(|n| *n == other) {
                Some(i) => Ok(&Backend::ALL[i..=i]),
                None => {
                    Err(Error::Argument(format!("'{other}' is not one of {}", Backend::values())))
                }
            },
        }
    }
}

/// The card backends a provider runs nodes with: their order, and the MLU-OPS library or
/// why there is none (the one backend with state of its own). Built by [`CardBackends::new`]
/// and the `with_` method of each backend with state, so that such a backend adds its field
/// here and its opening where it is opened, and no other builder changes.
#[derive(Debug, Clone)]
pub struct CardBackends {
    pub(crate) order: &'static [Backend],
    pub(crate) mluops: Result<Arc<Library>>,
}

impl CardBackends {
    /// The backends of `order`, with the state of none opened: a backend with state declines
    /// every node until its `with_` method gives it.
    pub fn new(order: &'static [Backend]) -> Self {
        CardBackends { order, mluops: Err(Error::declined("the MLU-OPS library is not opened")) }
    }

    /// Our BANG kernels only (the tests' and benches' host-tensor drivers).
    pub fn bang() -> Self {
        CardBackends::new(&[Backend::Bang])
    }

    /// With the MLU-OPS library, or why there is none.
    pub fn with_mluops(self, mluops: Result<Arc<Library>>) -> Self {
        CardBackends { mluops, ..self }
    }

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
pub trait CardPath<O: Operator>: Send + Sync + Sized + 'static {
    const BACKEND: Backend;
    /// True when the backend's calls cannot read the value checks' records (a library's
    /// functions): the driver then waits for the checks, and reports a broken rule, before
    /// anything of the backend is enqueued.
    const HOST_GATE: bool;
    /// The path with what the provider's backends hold for it (a library, or nothing).
    fn new(backends: &CardBackends) -> Self;
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
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()>;
}

/// A path constructor: operator `O` on one backend, given the provider's backends.
pub type PathOf<O> = fn(&Arc<O>, &CardBackends) -> Box<dyn NodePath>;

/// `O` on the backend of path `P` (the registry's `card!` lists these).
pub fn path<O: Operator, P: CardPath<O>>(
    op: &Arc<O>,
    backends: &CardBackends,
) -> Box<dyn NodePath> {
    Box::new(OpPath { op: Arc::clone(op), path: P::new(backends) })
}
