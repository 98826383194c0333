//! The family on the MLU: host policies for kernels/dynamic_scatter.
//!
//! DynamicScatterBackward (max mode only, as the seed design; the EP declines mean and sum):
//! UNION1 over the card's cores for the three kernels (fill, index, scatter). Workspace:
//! reduce_from, V * C int32. NRAM: kernel1 takes 8 + 12 * Cp bytes per point of its tile
//! (Cp = C padded to 32; map and owned-voxel entries, feats, voxel_feats and index rows,
//! the two float tiles reused for mask and candidates) and one Cp row, kernel2 8 * C bytes
//! per voxel of its tile.
//!
//! DynamicScatter (max, mean, sum): see [`ForwardLaunch`]; the voxels are the set bits of a
//! bitmap over the kept coordinates' box, ranked by kernels/sparse_conv's mark and rank.

use super::Reduce;
use super::backward::{Dims, DynamicScatterBackward};
use super::forward::{self, DynamicScatter};
use crate::error::{Error, Result};
use crate::mlu::{self, Direction, NRAM_BUDGET, TASK_UNION1};
use crate::ops::device::{self, BangOperator, CardRun, DeviceOutputs};
use crate::ops::operator::Operator;
use crate::ops::sparse_conv::STREAM_TILE;
use crate::ops::sparse_conv::rank::BitmapRank;

/// int32 per fill copy (a multiple of 32).
const FILL_TILE: usize = 16 * 1024;
/// Tiles carved from the budget by kernel1 and kernel2, each rounded up to 64 bytes.
const TILES_INDEX: usize = 6;
const TILES_SCATTER: usize = 2;

/// The kernels' arguments (`bang_launch`).
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

    fn bang_supported(&self) -> Result<()> {
        match self.reduce {
            Reduce::Max => Ok(()),
            _ => Err(Error::declined(
                "reduce_type mean/sum: the MLU kernels implement max only (as the seed design)",
            )),
        }
    }

    fn bang_supported_shapes(
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

    fn bang_launch(&self, info: &mlu::DeviceInfo, d: &Dims) -> Result<Launch> {
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

    fn bang_compute(
        &self,
        d: &Dims,
        l: &Launch,
        card: &CardRun<'_>,
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
        card.queue.launch("bang_dynamic_scatter_backward_max", |q| unsafe {
            (k.bang_dynamic_scatter_backward_max)(
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

/// Cells of the kept coordinates' box the forward kernels' bitmap covers at most: 2^28 bits,
/// 32 MiB of bitmap and as much of word ranks (PointPillars' grid, batch x 496 x 432 pillars,
/// is far below). A larger box declines the run (the node runs on the next path or the CPU).
pub const BOX_CELLS: u64 = 1 << 28;
/// Tiles carved by the forward's widest kernels (each rounded up to 64 bytes) and the
/// reduce kernel's two vector paddings.
const TILES_FORWARD: usize = 5;
const PADDING: usize = 2 * 128;

/// DynamicScatter's kernel arguments (`bang_launch`): UNION1 over the card's cores (rank: one
/// cluster). Workspace: partial task_dim * 2D, box 2D, lin N, bitmap and word ranks 2 *
/// ceil(cells / 32) int32. NRAM: bounds and linear take 4D + 4 bytes per point of their tile,
/// reduce one half of the budget for P points (8 + 4 Cr bytes each) and the other for Vt
/// voxels (4 Cr + 4 bytes each), Cr = max(C, 1).
pub struct ForwardLaunch {
    task_dim: u32,
    points: i32,
    channels: i32,
    dims: i32,
    row_tile: i32,
    tile_points: i32,
    tile_voxels: i32,
}

/// (points per bounds/linear tile, points and voxels per reduce tile), `None` when a row
/// does not fit in NRAM.
fn forward_tiles(c: usize, d: usize) -> Option<(usize, usize, usize)> {
    let avail = NRAM_BUDGET - TILES_FORWARD * 64 - PADDING;
    let row_tile = avail.saturating_sub(8 * d) / (4 * d + 4);
    let cr = c.max(1);
    let tile_points = (avail / 2) / (8 + 4 * cr);
    let tile_voxels = (avail / 2) / (4 * cr + 4);
    (row_tile > 0 && tile_points > 0 && tile_voxels > 0).then_some((
        row_tile,
        tile_points,
        tile_voxels,
    ))
}

impl BangOperator for DynamicScatter {
    type Launch = ForwardLaunch;
    const BANG_FAMILIES: &'static [&'static str] = &["check", "dynamic_scatter", "sparse_conv"];

    fn bang_supported_shapes(
        &self,
        _: &mlu::DeviceInfo,
        shapes: &device::StaticShapes,
    ) -> Result<()> {
        // feats [N, C], coors [N, D]: a static C or D whose rows do not fit the NRAM tiles.
        let (c, d) = (device::static_dim(shapes, 0, 1), device::static_dim(shapes, 1, 1));
        if forward_tiles(c.unwrap_or(0), d.unwrap_or(1)).is_none() {
            return Err(Error::declined(format!(
                "C = {c:?}, D = {d:?}: a point's row does not fit the MLU kernels' NRAM tiles"
            )));
        }
        Ok(())
    }

    fn bang_launch(&self, info: &mlu::DeviceInfo, d: &forward::Dims) -> Result<ForwardLaunch> {
        let (row_tile, tile_points, tile_voxels) = forward_tiles(d.c, d.d).ok_or_else(|| {
            Error::declined(format!(
                "C = {}, D = {}: a point's row does not fit the MLU kernels' NRAM tiles",
                d.c, d.d
            ))
        })?;
        let n = device::narrow;
        Ok(ForwardLaunch {
            task_dim: info.cores(),
            points: n("N", d.n)?,
            channels: n("C", d.c)?,
            dims: n("D", d.d)?,
            row_tile: n("row_tile", row_tile)?,
            tile_points: n("tile_points", tile_points)?,
            tile_voxels: n("tile_voxels", tile_voxels)?,
        })
    }

    fn bang_compute(
        &self,
        d: &forward::Dims,
        l: &ForwardLaunch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let (device, queue) = (card.device, card.queue);
        let ints = |outputs: &mut dyn DeviceOutputs, n: usize| -> Result<*mut i32> {
            Ok(outputs.workspace(n * 4)?.cast())
        };
        let (coors, feats) = (card.input::<i32>(1), card.input::<f32>(0));
        let k = device.kernels::<super::abi::DynamicScatterKernels>()?;
        if d.n == 0 {
            // No point, no voxel: empty outputs and voxel_num = 0.
            for (i, spec) in d.specs(0).iter().enumerate() {
                let p = outputs.allocate(i, spec)?;
                if i == 4 {
                    // SAFETY: voxel_num's one int32, just allocated.
                    unsafe {
                        device.copy_raw(p, [0i32].as_ptr().cast(), 4, Direction::HostToDevice)?
                    };
                }
            }
            return Ok(());
        }
        let bx = self.coordinate_box(d, l, card, outputs)?;
        let box_ = ints(outputs, 2 * d.d)?;
        let host: Vec<i32> = bx.lo.iter().chain(&bx.stride).copied().collect();
        // SAFETY: `box_` was just allocated for 2D int32, `host` holds as many.
        unsafe {
            device.copy_raw(box_.cast(), host.as_ptr().cast(), 8 * d.d, Direction::HostToDevice)?
        };
        let lin = ints(outputs, d.n)?;
        // SAFETY (all launches): device buffers of the sizes computed here and the node's
        // inputs; each launch only enqueues, and the node's driver synchronises the queue
        // before the workspace is freed. Every kept row lies in the box (bounds), so
        // every lin is below its cell count and every rank below M.
        queue.launch("bang_dynamic_scatter_linear", |q| unsafe {
            (k.bang_dynamic_scatter_linear)(
                q,
                l.task_dim,
                TASK_UNION1,
                l.points,
                l.dims,
                l.row_tile,
                coors,
                box_,
                lin,
            )
        })?;
        let words = bx.cells.div_ceil(32) as usize;
        let bitmap = ints(outputs, words)?;
        // SAFETY: `bitmap` was just allocated for `words` int32.
        unsafe { device.zero_raw(bitmap.cast(), words * 4)? };
        let total = ints(outputs, 1)?;
        let (nwords, tile) =
            (device::narrow("words", words)?, device::narrow("tile", STREAM_TILE)?);
        let rank = BitmapRank::new(card, outputs, words)?;
        // SAFETY: as above: `lin` holds N cells of the box, each below its cell count.
        unsafe { rank.mark_and_rank(card, l.task_dim, l.points, lin, bitmap, total)? };
        // The second wait: the outputs' size is the voxel count.
        queue.sync()?;
        let m = read_int(card, total)?;
        let specs = d.specs(m);
        let out: Vec<*mut std::ffi::c_void> =
            (0..specs.len()).map(|i| outputs.allocate(i, &specs[i])).collect::<Result<_>>()?;
        // SAFETY: `out[4]` is voxel_num's one int32, `total` holds M.
        unsafe { device.copy_raw(out[4], total.cast(), 4, Direction::DeviceToDevice)? };
        // SAFETY: as above; the map [N] and voxel_coors [M, D] just allocated.
        queue.launch("bang_dynamic_scatter_index", |q| unsafe {
            (k.bang_dynamic_scatter_index)(
                q,
                l.task_dim,
                TASK_UNION1,
                l.points,
                l.dims,
                nwords,
                tile,
                lin,
                box_,
                bitmap,
                rank.word_rank,
                out[2].cast(),
                out[1].cast(),
            )
        })?;
        if m > 0 {
            let (mode, init) = match self.reduce {
                Reduce::Max => (0, f32::NEG_INFINITY),
                Reduce::Sum => (1, 0.0),
                Reduce::Mean => (2, 0.0),
            };
            let voxels = device::narrow("M", m)?;
            // SAFETY: as above; voxel_feats [M, C] and voxel_points_count [M] just
            // allocated, the map written by the index kernel before it on the queue.
            queue.launch("bang_dynamic_scatter_reduce", |q| unsafe {
                (k.bang_dynamic_scatter_reduce)(
                    q,
                    l.task_dim,
                    TASK_UNION1,
                    l.points,
                    voxels,
                    l.channels,
                    mode,
                    init,
                    l.tile_points,
                    l.tile_voxels,
                    feats,
                    out[2].cast(),
                    out[0].cast(),
                    out[3].cast(),
                )
            })?;
        }
        Ok(())
    }
}

/// The kept rows' coordinate box: per column its least value and row-major stride, and its
/// cell count (1 when no row is kept).
struct CoordinateBox {
    lo: Vec<i32>,
    stride: Vec<i32>,
    cells: u64,
}

/// One int32 the queue's kernels wrote, after its synchronisation.
fn read_int(card: &CardRun<'_>, src: *const i32) -> Result<usize> {
    let mut value = [0i32];
    // SAFETY: `src` holds one int32; `value` has room for it.
    unsafe {
        card.device.copy_raw(value.as_mut_ptr().cast(), src.cast(), 4, Direction::DeviceToHost)?
    };
    usize::try_from(value[0]).map_err(|_| {
        Error::Runtime(format!("DynamicScatter on the MLU: negative voxel count {}", value[0]))
    })
}

impl DynamicScatter {
    /// Runs the bounds kernel, waits, and reduces its per-task boxes on the host; a box of
    /// more than [`BOX_CELLS`] cells declines the run.
    fn coordinate_box(
        &self,
        d: &forward::Dims,
        l: &ForwardLaunch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<CoordinateBox> {
        let tasks = l.task_dim as usize;
        let partial: *mut i32 = outputs.workspace(tasks * 2 * d.d * 4)?.cast();
        let k = card.device.kernels::<super::abi::DynamicScatterKernels>()?;
        // SAFETY: `partial` holds 2D int32 per task, the input coors N * D; the launch only
        // enqueues, the sync below waits for it.
        card.queue.launch("bang_dynamic_scatter_bounds", |q| unsafe {
            (k.bang_dynamic_scatter_bounds)(
                q,
                l.task_dim,
                TASK_UNION1,
                l.points,
                l.dims,
                l.row_tile,
                card.input(1),
                partial,
            )
        })?;
        // The first wait: the bitmap's size is the box's.
        card.queue.sync()?;
        let mut host = crate::scratch::filled(tasks * 2 * d.d, 0i32, "the coordinate boxes")?;
        // SAFETY: `host` holds as many int32 as `partial`.
        unsafe {
            card.device.copy_raw(
                host.as_mut_ptr().cast(),
                partial.cast_const().cast(),
                host.len() * 4,
                Direction::DeviceToHost,
            )?
        };
        let dd = d.d;
        let mut lo = vec![i32::MAX; dd];
        let mut hi = vec![-1i32; dd];
        for part in host.chunks_exact(2 * dd) {
            for j in 0..dd {
                lo[j] = lo[j].min(part[j]);
                hi[j] = hi[j].max(part[dd + j]);
            }
        }
        if hi.iter().any(|&h| h < 0) {
            // No kept row: one empty cell, nothing marked.
            return Ok(CoordinateBox { lo: vec![0; dd], stride: vec![0; dd], cells: 1 });
        }
        let extents: Vec<u64> = lo.iter().zip(&hi).map(|(&a, &b)| (b - a) as u64 + 1).collect();
        let cells =
            extents.iter().try_fold(1u64, |acc, &e| acc.checked_mul(e).filter(|&v| v <= BOX_CELLS));
        let Some(cells) = cells else {
            return Err(Error::declined(format!(
                "the kept coordinates' box {lo:?}..={hi:?} has more than the MLU kernels' {BOX_CELLS} bitmap cells"
            )));
        };
        let mut stride = vec![1i32; dd];
        for j in (0..dd.saturating_sub(1)).rev() {
            // Below BOX_CELLS < 2^31.
            stride[j] = stride[j + 1] * extents[j + 1] as i32;
        }
        Ok(CoordinateBox { lo, stride, cells })
    }
}
