//! DynamicScatterBackward on the MLU: host policy for kernels/dynamic_scatter_backward
//! (max mode only, as the seed design; the EP declines mean and sum).
//!
//! UNION1 over the card's cores for the three kernels (fill, index, scatter). Workspace:
//! reduce_from, V * C int32. NRAM: kernel1 takes 8 + 12 * Cp bytes per point of its tile
//! (Cp = C padded to 32; map and owned-voxel entries, feats, voxel_feats and index rows,
//! the two float tiles reused for mask and candidates) and one Cp row, kernel2 8 * C bytes
//! per voxel of its tile.

use super::backward::{DynamicScatterBackward, Reduce};
use crate::error::{Error, Result};
use crate::ops::device::{self, DeviceOutputs, MluOperator};
use crate::mlu::{self, Device, NRAM_BUDGET, Queue, TASK_UNION1};
use crate::ops::Operator;
use crate::tensor::Inputs;
use std::ffi::c_void;
use std::sync::Arc;

/// int32 per fill copy (a multiple of 32).
const FILL_TILE: usize = 16 * 1024;
/// Tiles carved from the budget by kernel1 and kernel2, each rounded up to 64 bytes.
const TILES_INDEX: usize = 6;
const TILES_SCATTER: usize = 2;

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
        let padded = c.next_multiple_of(32);
        let tile_points = NRAM_BUDGET.saturating_sub(TILES_INDEX * 64 + 4 * padded) / (8 + 12 * padded);
        let tile_voxels = (NRAM_BUDGET - TILES_SCATTER * 64) / (8 * c);
        (tile_points > 0 && tile_voxels > 0).then_some(Policy {
            task_dim: info.cores(),
            padded,
            tile_points,
            tile_voxels,
        })
    }
}

impl MluOperator for DynamicScatterBackward {
    fn mlu_supported(&self) -> std::result::Result<(), String> {
        match self.reduce {
            Reduce::Max => Ok(()),
            _ => Err("reduce_type mean/sum: the MLU kernels implement max only (as the seed design)".into()),
        }
    }

    fn mlu_supported_shapes(&self, info: &mlu::DeviceInfo, shapes: &device::StaticShapes) -> std::result::Result<(), String> {
        device::int32_inputs(shapes)?;
        // feats [N, C]: one point's rows must fit a kernel1 tile.
        match shapes.get(1).and_then(|s| s.as_ref()).and_then(|s| s.get(1).copied().flatten()) {
            Some(c) if c > 0 && Policy::new(info, c).is_none() => {
                Err(format!("C = {c} channels: one point's rows do not fit the MLU kernel's NRAM tile"))
            }
            _ => Ok(()),
        }
    }

    fn mlu_compute(
        &self,
        device: &Arc<Device>,
        queue: &Queue,
        inputs: &Inputs<'_>,
        device_inputs: &[*const c_void],
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        self.mlu_supported().map_err(|why| Error::Runtime(format!("{} on the MLU: {why}", Self::NAME)))?;
        // The host part of the MLU path runs on the calling thread.
        let (specs, plan) = self.plan(inputs, &crate::parallel::Serial)?;
        let d = plan.dims;
        let out = outputs.allocate(0, &specs[0])?;
        // SAFETY: `out` was just allocated for N * C floats.
        unsafe { device.zero_raw(out, d.n * d.c * 4)? };
        if d.n * d.c == 0 || d.v == 0 {
            return Ok(());
        }
        let too_big = d.n >= i32::MAX as usize || d.n * d.c > i32::MAX as usize || d.v * d.c > i32::MAX as usize;
        let policy = Policy::new(&device.info, d.c);
        let Some(p) = policy.filter(|_| !too_big) else {
            return Err(Error::MluLimit(format!(
                "{}: N = {}, V = {}, C = {} exceed the MLU kernel's int32 offsets or NRAM rows",
                Self::NAME,
                d.n,
                d.v,
                d.c
            )));
        };
        let reduce_from: *mut i32 = outputs.workspace(d.v * d.c * 4)?.cast();
        let i = device::i32_of;
        let points = i("N", d.n)?;
        let voxels = i("V", d.v)?;
        let channels = i("C", d.c)?;
        let padded = i("Cp", p.padded)?;
        let tile_points = i("tile_points", p.tile_points)?;
        let tile_voxels = i("tile_voxels", p.tile_voxels)?;
        let fill_tile = i("fill_tile", FILL_TILE)?;
        // SAFETY: device buffers of the validated shapes and the workspace above; the
        // launches only enqueue, and the caller synchronises the queue before the workspace
        // is freed.
        queue.launch("mluops_dynamic_scatter_backward_max", |q| unsafe {
            (device.kernels.mluops_dynamic_scatter_backward_max)(
                q,
                p.task_dim,
                TASK_UNION1,
                points,
                voxels,
                channels,
                padded,
                tile_points,
                tile_voxels,
                fill_tile,
                device_inputs[0].cast(),
                device_inputs[1].cast(),
                device_inputs[2].cast(),
                device_inputs[3].cast(),
                reduce_from,
                out.cast(),
            )
        })
    }
}
