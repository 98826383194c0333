//! VoxelPoolingForward on the MLU: host policy for kernels/voxel_pooling.
//!
//! UNION1 over all cores of the card, the B*N points split evenly. NRAM
//! per core: 13 int32 per point of the tile (geom 3, x/y/z 3, mask, tmp, batch, pos 3,
//! cell offset) plus one feature chunk of `tile_channels` floats.

use super::forward::{Dims, VoxelPoolingForward};
use crate::error::{Error, Result};
use crate::mlu::{self, NRAM_BUDGET, TASK_UNION1};
use crate::ops::device::{self, BangOperator, CardRun, DeviceOutputs};
use crate::ops::operator::Operator;

/// Largest feature chunk moved per __memcpy / atomic add.
const MAX_TILE_CHANNELS: usize = 8192;
const INTS_PER_POINT: usize = 13;
/// Tiles carved from the budget, each rounded up to 64 bytes.
const TILES: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub task_dim: u32,
    pub tile_points: usize,
    pub tile_channels: usize,
}

impl Policy {
    pub fn new(info: &mlu::DeviceInfo, dims: &Dims) -> Self {
        let tile_channels = dims.channels.clamp(1, MAX_TILE_CHANNELS);
        let free = NRAM_BUDGET - (tile_channels * 4).next_multiple_of(64) - TILES * 64;
        // Multiples of 32 points keep every int32 vector a whole number of 128-byte units.
        let tile_points = (free / (INTS_PER_POINT * 4)) / 32 * 32;
        let points = dims.batches * dims.points;
        let task_dim = mlu::union1_tasks(info, points.div_ceil(tile_points));
        Policy { task_dim, tile_points, tile_channels }
    }
}

/// The kernel's arguments (`bang_launch`).
pub struct Launch {
    task_dim: u32,
    /// B, N, C, nx, ny, nz, tile_points, tile_channels.
    sizes: [i32; 8],
}

impl BangOperator for VoxelPoolingForward {
    type Launch = Launch;
    const BANG_FAMILIES: &'static [&'static str] = &["check", "voxel_pooling"];

    fn bang_supported(&self) -> Result<()> {
        // The kernel takes the grid as int32 values.
        match [("x", self.nx), ("y", self.ny), ("z", self.nz)]
            .into_iter()
            .find(|&(_, n)| n > i32::MAX as usize)
        {
            Some((axis, n)) => Err(Error::declined(format!(
                "num_voxel_{axis} = {n} exceeds the MLU kernel's int32 grid sizes"
            ))),
            None => Ok(()),
        }
    }

    fn bang_supported_shapes(
        &self,
        _: &mlu::DeviceInfo,
        shapes: &device::StaticShapes,
    ) -> Result<()> {
        // features [B, N, C] -> output B * ny * nx * C.
        device::int32_output(shapes, 1, [0, 2], self.cells, "B*ny*nx*C")
    }

    fn bang_launch(&self, info: &mlu::DeviceInfo, dims: &Dims) -> Result<Launch> {
        // The kernel addresses cells and points with int32 offsets.
        let cells = dims.batches * self.cells * dims.channels;
        let coords = dims.batches * dims.points * 3;
        if cells > i32::MAX as usize
            || dims.batches * dims.points * dims.channels.max(1) > i32::MAX as usize
            || coords > i32::MAX as usize
        {
            return Err(Error::declined(format!(
                "the MLU kernel's int32 offsets cannot address B*ny*nx*C = {cells} output or B*N*C input elements"
            )));
        }
        let p = Policy::new(info, dims);
        let n = device::narrow;
        let sizes = [
            n("B", dims.batches)?,
            n("N", dims.points)?,
            n("C", dims.channels)?,
            n("nx", self.nx)?,
            n("ny", self.ny)?,
            n("nz", self.nz)?,
            n("tile_points", p.tile_points)?,
            n("tile_channels", p.tile_channels)?,
        ];
        Ok(Launch { task_dim: p.task_dim, sizes })
    }

    fn bang_compute(
        &self,
        dims: &Dims,
        l: &Launch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let specs = self.output_specs(dims);
        let out = outputs.allocate(0, &specs[0])?;
        let pos = outputs.allocate(1, &specs[1])?;
        // SAFETY: `out` was just allocated for the B*ny*nx*C floats of output 0.
        unsafe { card.device.zero_raw(out, specs[0].bytes())? };
        if dims.batches * dims.points == 0 {
            return Ok(());
        }
        let [batches, points, channels, nx, ny, nz, tile_points, tile_channels] = l.sizes;
        let (geom, feats) = (card.input::<i32>(0), card.input::<f32>(1));
        let k = card.device.kernels::<super::abi::VoxelPoolingKernels>()?;
        // SAFETY: the pointers are device buffers of the validated sizes (inputs checked by
        // the shape rules, outputs allocated above); the launch only enqueues.
        card.queue.launch("bang_voxel_pooling_forward", |q| unsafe {
            (k.bang_voxel_pooling_forward)(
                q,
                l.task_dim,
                TASK_UNION1,
                batches,
                points,
                channels,
                nx,
                ny,
                nz,
                tile_points,
                tile_channels,
                geom,
                feats,
                out.cast(),
                pos.cast(),
            )
        })
    }
}
