//! The operators: the five of docs/CONTRACT.md and their forward partners, and the registry
//! [`ALL`] (one row per operator, with the card backends that run it). Each family module
//! owns its descriptor (built from the node's attributes, with every attribute rule of
//! docs/CONTRACT.md checked), its input checks, and its CPU kernel; hosts drive them through
//! [`Operator`] (`operator.rs`), outside ONNX Runtime with the buffers of `host.rs`.

pub mod device;
pub mod dynamic_scatter;
pub mod host;
pub mod operator;
pub mod psroipool;
pub mod radix;
pub mod rules;
pub mod sparse_conv;
pub mod three_interpolate;
pub mod voxel_pooling;

pub use host::{LineAlignedOutputs, OwnedOutputs};
pub use operator::{Kernel, Operator, check_i32_range, descriptor, run};

use crate::error::Result;
use crate::schema::{self, Attrs, Schema};
use device::{Bang, CardBackends, CardNode, CardPath, MluOps, PathOf, card_node, path};

/// Builds a node's card side (its CPU kernel and card paths) for a provider's backends.
pub type CreateCard = fn(&Attrs<'_>, &CardBackends) -> Result<CardNode>;

/// Registry entry: how to build a node's kernel from its attributes, for the CPU path and
/// for the card.
pub struct OpEntry {
    pub name: &'static str,
    /// The schema file's text (parsed once, by [`schema::embedded`]).
    pub schema: &'static str,
    pub create: fn(&Attrs<'_>) -> Result<Box<dyn Kernel>>,
    pub create_card: CreateCard,
    /// The card backends that have a path for it, in `card!`'s order (the provider's order
    /// decides which is tried first).
    pub card_backends: &'static [device::Backend],
}

fn create<O: Operator>(attrs: &Attrs<'_>) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(O::from_attributes(attrs)?))
}

/// An operator and the card backends that run it: each name is a backend's path type
/// ([`MluOps`], [`Bang`]: [`CardPath`]), which names its backend.
macro_rules! card {
    ($t:ty, [$($path:ident),+]) => {
        OpEntry {
            name: <$t>::NAME,
            schema: <$t>::SCHEMA,
            create: create::<$t>,
            create_card: |attrs, backends| {
                const PATHS: &[PathOf<$t>] = &[$(path::<$t, $path>),+];
                card_node::<$t>(attrs, backends, PATHS)
            },
            card_backends: &[$(<$path as CardPath<$t>>::BACKEND),+],
        }
    };
}

/// Every operator of the domain: the five of docs/CONTRACT.md (§2-§6) in its order, then the forward
/// partners the models need (three of them on MLU-OPS: docs/MLUOPS_BINDING.md §4).
pub const ALL: &[OpEntry] = &[
    card!(dynamic_scatter::DynamicScatterBackward, [MluOps, Bang]),
    card!(three_interpolate::ThreeInterpolateBackward, [MluOps, Bang]),
    card!(sparse_conv::GetIndicePairs, [MluOps, Bang]),
    card!(voxel_pooling::VoxelPoolingForward, [MluOps, Bang]),
    card!(psroipool::PsRoiPoolBackward, [MluOps, Bang]),
    card!(dynamic_scatter::DynamicScatter, [Bang]),
    card!(sparse_conv::IndiceConv, [MluOps]),
    card!(three_interpolate::ThreeInterpolate, [MluOps]),
    card!(psroipool::PsRoiPool, [MluOps]),
];

pub fn entry(name: &str) -> Option<&'static OpEntry> {
    ALL.iter().find(|e| e.name == name)
}

/// Every operator's schema, in [`ALL`]'s order, each parsed once.
pub fn schemas() -> impl Iterator<Item = &'static Schema> {
    ALL.iter().map(|e| schema::embedded(e.name, e.schema))
}

/// The schema of operator `op_type` (one of [`ALL`]).
pub fn schema(op_type: &str) -> &'static Schema {
    entry(op_type)
        .map(|e| schema::embedded(e.name, e.schema))
        .unwrap_or_else(|| panic!("no schema for {op_type}"))
}
