//! VoxelPoolingForward (OPERATORS.md section 4; BEVDepth voxel pooling).
//!
//! Every point whose (x, y, z) lies inside the voxel grid adds its feature row to BEV cell
//! (b, y, x); `pos_memo` records (b, y, x) or (-1, -1, -1).
//!
//! Determinism: the result must be bit-identical across runs and thread counts, so each
//! output cell is summed by exactly one task, over its points in point order (the order a
//! serial loop over the points would use). To find a cell's points without scanning all of
//! them, the valid points of each batch are counting-sorted by cell (stable, so point order
//! survives inside a cell). Extra memory: B * (cells + 2 + N) indices.
//!
//! Passes:
//! 1. `pos_memo` (parallel over point chunks; no division per point).
//! 2. counting sort per batch (one task per batch).
//! 3. output cells in contiguous ranges balanced by point count (parallel); each cell row
//!    is zeroed, then its points' feature rows are added in order.

use crate::error::{Error, Result};
use crate::parallel::{Parallel, for_each_chunk_mut, for_each_part_mut, pieces};
use crate::schema::Attrs;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

/// Points per `pos_memo` task: ~48K int32 written per task, coarse enough to amortise
/// scheduling and fine enough to balance.
const POS_CHUNK_POINTS: usize = 1 << 14;
/// Work units (feature elements added or zeroed) per summation task.
const SUM_GRAIN: usize = 1 << 16;
/// Upper bound on summation tasks: more only adds scheduling and boundary scans.
const MAX_SUM_TASKS: usize = 1024;

/// Descriptor: the validated voxel grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoxelPoolingForward {
    /// num_voxel_x, num_voxel_y, num_voxel_z (each >= 1).
    pub nx: usize,
    pub ny: usize,
    pub nz: usize,
    /// ny * nx, checked not to overflow.
    cells: usize,
}

/// Sizes validated by `plan`.
#[derive(Debug, Clone, Copy)]
pub struct VoxelPlan {
    batches: usize,
    points: usize,
    channels: usize,
}

impl VoxelPoolingForward {
    pub fn new(voxel_num: [i64; 3]) -> Result<Self> {
        let mut dims = [0usize; 3];
        for (d, &v) in dims.iter_mut().zip(&voxel_num) {
            *d = usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| Error::attribute("voxel_num", format!("each value must be > 0, got {voxel_num:?}")))?;
        }
        let [nx, ny, nz] = dims;
        let cells = ny.checked_mul(nx).ok_or_else(|| {
            Error::attribute("voxel_num", format!("num_voxel_y * num_voxel_x overflows: {voxel_num:?}"))
        })?;
        Ok(VoxelPoolingForward { nx, ny, nz, cells })
    }

    /// Index of the cell (y * nx + x) of a point inside the grid, `None` outside.
    #[inline]
    fn cell_of(&self, p: &[i32]) -> Option<(usize, usize)> {
        let (x, y, z) = (usize::try_from(p[0]).ok()?, usize::try_from(p[1]).ok()?, usize::try_from(p[2]).ok()?);
        (x < self.nx && y < self.ny && z < self.nz).then_some((y, x))
    }
}

impl super::Operator for VoxelPoolingForward {
    const NAME: &'static str = "VoxelPoolingForward";
    type Plan = VoxelPlan;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        Self::new(attrs.ints_n::<3>("voxel_num")?)
    }

    fn plan(&self, inputs: &Inputs<'_>) -> Result<(Vec<OutputSpec>, VoxelPlan)> {
        let geom = inputs.get_shaped::<i32>(0, &[None, None, Some(3)], "[B, N, 3]")?;
        let (batches, points) = (geom.shape[0], geom.shape[1]);
        let feats = inputs.get_shaped::<f32>(1, &[Some(batches), Some(points), None], "[B, N, C] (B, N of geom_xyz)")?;
        let channels = feats.shape[2];
        let out_len = batches
            .checked_mul(self.cells)
            .and_then(|n| n.checked_mul(channels))
            .filter(|&n| n <= isize::MAX as usize / size_of::<f32>());
        if out_len.is_none() {
            return Err(Error::output(
                "output_features",
                format!("size B * ny * nx * C = {batches} * {} * {} * {channels} overflows", self.ny, self.nx),
            ));
        }
        // pos_memo stores the batch index as int32.
        if points > 0 {
            super::check_i32_range(
                || Error::output("pos_memo", format!("batch index up to {batches} does not fit int32")),
                batches,
            )?;
        }
        let specs = vec![
            OutputSpec::new(DType::F32, [batches, self.ny, self.nx, channels]),
            OutputSpec::new(DType::I32, [batches, points, 3]),
        ];
        Ok((specs, VoxelPlan { batches, points, channels }))
    }

    fn execute(&self, plan: VoxelPlan, inputs: &Inputs<'_>, outputs: &mut Outputs<'_>, par: &dyn Parallel) -> Result<()> {
        let geom = inputs.get::<i32>(0)?.data;
        let feats = inputs.get::<f32>(1)?.data;
        let out = outputs.take::<f32>(0)?;
        let pos_memo = outputs.take::<i32>(1)?;
        let VoxelPlan { batches, points, channels } = plan;
        if geom.len() != batches * points * 3
            || feats.len() != batches * points * channels
            || out.len() != batches * self.cells * channels
            || pos_memo.len() != batches * points * 3
        {
            return Err(Error::Runtime("VoxelPoolingForward: buffers do not match the plan".into()));
        }

        self.write_pos_memo(geom, points, pos_memo, par);
        let pos_memo: &[i32] = pos_memo;
        if out.is_empty() {
            return Ok(());
        }
        // Per batch: [cell bounds: cells + 2 | sorted global point indices: N].
        let seg_len = self.cells + 2 + points;
        let mut scratch = vec![0usize; batches * seg_len];
        for_each_chunk_mut(par, &mut scratch, seg_len, |b, seg| {
            let (bounds, order) = seg.split_at_mut(self.cells + 2);
            let memo = &pos_memo[b * points * 3..(b + 1) * points * 3];
            self.sort_batch(memo, b * points, bounds, order);
        });
        self.sum_cells(&scratch, seg_len, feats, channels, out, par);
        Ok(())
    }
}

impl VoxelPoolingForward {
    /// Pass 1: pos_memo for every point, in parallel chunks.
    fn write_pos_memo(&self, geom: &[i32], points: usize, pos_memo: &mut [i32], par: &dyn Parallel) {
        if points == 0 {
            return;
        }
        for_each_chunk_mut(par, pos_memo, POS_CHUNK_POINTS * 3, |t, chunk| {
            let first = t * POS_CHUNK_POINTS;
            let geom = &geom[first * 3..first * 3 + chunk.len()];
            // Batch of the chunk's first point, then advanced by counting: no division per point.
            let (mut b, mut n) = (first / points, first % points);
            for (m, g) in chunk.chunks_exact_mut(3).zip(geom.chunks_exact(3)) {
                match self.cell_of(g) {
                    // b < B fits int32 (checked in plan); y, x come from int32 values.
                    Some((y, x)) => m.copy_from_slice(&[b as i32, y as i32, x as i32]),
                    None => m.copy_from_slice(&[-1, -1, -1]),
                }
                n += 1;
                if n == points {
                    (b, n) = (b + 1, 0);
                }
            }
        });
    }

    /// Pass 2, one batch: stable counting sort of the valid points by cell. On return cell
    /// c's points (global indices `first + n`, ascending) are `order[bounds[c]..bounds[c+1]]`.
    fn sort_batch(&self, memo: &[i32], first: usize, bounds: &mut [usize], order: &mut [usize]) {
        let nx = self.nx;
        // pos_memo holds (b, y, x) with 0 <= y < ny, 0 <= x < nx, or -1 for invalid points.
        let cell = |m: &[i32]| (m[0] >= 0).then(|| m[1] as usize * nx + m[2] as usize);
        // Counts land two slots up so that, after the prefix sum and the scatter that
        // advances bounds[c + 1], bounds[c]..bounds[c + 1] is exactly cell c's range.
        for m in memo.chunks_exact(3) {
            if let Some(c) = cell(m) {
                bounds[c + 2] += 1;
            }
        }
        for c in 1..bounds.len() {
            bounds[c] += bounds[c - 1];
        }
        for (n, m) in memo.chunks_exact(3).enumerate() {
            if let Some(c) = cell(m) {
                order[bounds[c + 1]] = first + n;
                bounds[c + 1] += 1;
            }
        }
    }

    /// Pass 3: every output cell row = 0 + its points' feature rows in point order. Tasks
    /// own contiguous cell ranges (balanced by work), so no cell is shared.
    fn sum_cells(&self, scratch: &[usize], seg_len: usize, feats: &[f32], channels: usize, out: &mut [f32], par: &dyn Parallel) {
        let cells = self.cells;
        let total_cells = out.len() / channels;
        let count = |g: usize| {
            let bounds = &scratch[(g / cells) * seg_len..];
            bounds[g % cells + 1] - bounds[g % cells]
        };
        // Work of a cell: zeroing its row plus one row addition per point.
        let total_work: usize = (0..total_cells).map(|g| (count(g) + 1) * channels).sum();
        let tasks = pieces(total_work, SUM_GRAIN).min(MAX_SUM_TASKS).min(total_cells);
        let mut cuts = Vec::with_capacity(tasks + 1);
        cuts.push(0);
        let mut done = 0usize;
        for g in 0..total_cells {
            done += (count(g) + 1) * channels;
            // Cut after the cell whose cumulative work reaches the next k/tasks fraction.
            if cuts.len() < tasks && done as u128 * tasks as u128 >= total_work as u128 * cuts.len() as u128 {
                cuts.push((g + 1) * channels);
            }
        }
        cuts.push(out.len());
        cuts.dedup();

        for_each_part_mut(par, out, &cuts, |t, part| {
            let first_cell = cuts[t] / channels;
            for (k, row) in part.chunks_exact_mut(channels).enumerate() {
                let g = first_cell + k;
                let seg = &scratch[(g / cells) * seg_len..(g / cells + 1) * seg_len];
                let (bounds, order) = seg.split_at(cells + 2);
                let c = g % cells;
                row.fill(0.0);
                add_rows(row, &order[bounds[c]..bounds[c + 1]], feats, channels);
            }
        });
    }
}

/// row += feats[p] for each point p in `pts`, in order. Two points per sweep keep the row
/// in registers longer; ((row + a) + b) is the same rounding sequence as two sweeps.
#[inline]
fn add_rows(row: &mut [f32], pts: &[usize], feats: &[f32], channels: usize) {
    let feature = |p: usize| &feats[p * channels..(p + 1) * channels];
    let mut pairs = pts.chunks_exact(2);
    for pair in &mut pairs {
        let (a, b) = (feature(pair[0]), feature(pair[1]));
        for ((o, &x), &y) in row.iter_mut().zip(a).zip(b) {
            *o = (*o + x) + y;
        }
    }
    for &p in pairs.remainder() {
        for (o, &x) in row.iter_mut().zip(feature(p)) {
            *o += x;
        }
    }
}
