//! DynamicScatterBackward on the MLU: host policy for kernels/dynamic_scatter
//! (max mode only, as the seed design; the EP declines mean and sum).
//!
//! UNION1 over the card's cores for the three kernels (fill, index, scatter). Workspace:
//! reduce_from, V * C int32. NRAM: kernel1 takes 8 + 12 * Cp bytes per point of its tile
//! (Cp = C padded to 32; map and owned-voxel entries, feats, voxel_feats and index rows,
//! the two float tiles reused for mask and candidates) and one Cp row, kernel2 8 * C bytes
//! per voxel of its tile.

use super::Reduce;
use super::backward::{Dims, DynamicScatterBackward};
use crate::error::{Error, Result};
use crate::mlu::{self, NRAM_BUDGET, TASK_UNION1};
use crate::ops::device::{self, BangOperator, Card, DeviceOutputs};
use crate::ops::rules::Rules;

/// int32 per fill copy (a multiple of 32).
const FILL_TILE: usize = 16 * 1024;
/// Tiles carved from the budget by kernel1 and kernel2, each rounded up to 64 bytes.
const TILES_INDEX: usize = 6;
const TILES_SCATTER: usize = 2;

/// The kernels' arguments (`mlu_launch`).
pub struct Launch {
    policy: Policy,
    points: i32,
    voxels: i32,
    channels: i32,
    padded: i32,
    tile_points: i32,
    tile_voxels: i32,
    fill_tile: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub task_dim: u32,
    pub padded: usize,
    pub tile_points: usize,
    pub tile_voxels: usize,
}

impl Policy {
    /// `None` when one point's row does not fit in NRAM.
    pub fn new(info: &mlu::DeviceInfo, c: usize) -> Option<Self> {
        let (padded, tile_points, tile_voxels) = Self::tiles(c)?;
        Some(Policy { task_dim: info.cores(), padded, tile_points, tile_voxels })
    }

    /// (Cp, points per kernel1 tile, voxels per kernel2 tile), `None` when one point's row
    /// does not fit in NRAM.
    fn tiles(c: usize) -> Option<(usize, usize, usize)> {
        let padded = c.next_multiple_of(32);
        let tile_points =
            NRAM_BUDGET.saturating_sub(TILES_INDEX * 64 + 4 * padded) / (8 + 12 * padded);
        let tile_voxels = (NRAM_BUDGET - TILES_SCATTER * 64) / (8 * c.max(1));
        (tile_points > 0 && tile_voxels > 0).then_some((padded, tile_points, tile_voxels))
    }
}

impl BangOperator for DynamicScatterBackward {
    type Launch = Launch;
    const BANG_FAMILIES: &'static [&'static str] = &["check", "dynamic_scatter"];

    fn mlu_supported(&self) -> Result<()> {
        match self.reduce {
            Reduce::Max => Ok(()),
            _ => Err(Error::declined(
                "reduce_type mean/sum: the MLU kernels implement max only (as the seed design)",
            )),
        }
    }

    fn mlu_supported_shapes(
        &self,
        _: &mlu::DeviceInfo,
        shapes: &device::StaticShapes,
    ) -> Result<()> {
        // feats [N, C]: one point's rows must fit a kernel1 tile.
        match device::static_dim(shapes, 1, 1) {
            Some(c) if c > 0 && Policy::tiles(c).is_none() => Err(Error::declined(format!(
                "C = {c} channels: one point's rows do not fit the MLU kernel's NRAM tile"
            ))),
            _ => Ok(()),
        }
    }

    fn mlu_launch(&self, info: &mlu::DeviceInfo, d: &Dims) -> Result<Launch> {
        let too_big = d.n >= i32::MAX as usize
            || d.n * d.c > i32::MAX as usize
            || d.v * d.c > i32::MAX as usize;
        let policy = Policy::new(info, d.c).filter(|_| !too_big).ok_or_else(|| {
            Error::declined(format!(
                "N = {}, V = {}, C = {} exceed the MLU kernel's int32 offsets or NRAM rows",
                d.n, d.v, d.c
            ))
        })?;
        let n = device::narrow;
        Ok(Launch {
            policy,
            points: n("N", d.n)?,
            voxels: n("V", d.v)?,
            channels: n("C", d.c)?,
            padded: n("Cp", policy.padded)?,
            tile_points: n("tile_points", policy.tile_points)?,
            tile_voxels: n("tile_voxels", policy.tile_voxels)?,
            fill_tile: n("fill_tile", FILL_TILE)?,
        })
    }

    fn mlu_compute(
        &self,
        d: &Dims,
        l: &Launch,
        card: &Card<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let out = outputs.allocate(0, &self.output_specs(d)[0])?;
        // SAFETY: `out` was just allocated for N * C floats.
        unsafe { card.device.zero_raw(out, d.n * d.c * 4)? };
        if d.n * d.c == 0 || d.v == 0 {
            return Ok(());
        }
        let reduce_from: *mut i32 = outputs.workspace(d.v * d.c * 4)?.cast();
        let (gate, gates) = card.gate();
        let k = card.device.kernels::<super::abi::DynamicScatterKernels>()?;
        // SAFETY: device buffers of the validated shapes and the workspace above; the
        // launches only enqueue (the node's driver synchronises before the workspace is
        // freed); the map is read only behind the value-check gate.
        card.queue.launch("mluops_dynamic_scatter_backward_max", |q| unsafe {
            (k.mluops_dynamic_scatter_backward_max)(
                q,
                l.policy.task_dim,
                TASK_UNION1,
                l.points,
                l.voxels,
                l.channels,
                l.padded,
                l.tile_points,
                l.tile_voxels,
                l.fill_tile,
                card.input(0),
                card.input(1),
                card.input(2),
                card.input(3),
                reduce_from,
                out.cast(),
                gate,
                gates,
            )
        })
    }
}
