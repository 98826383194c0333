//! VoxelPoolingForward (OPERATORS.md section 4; BEVDepth voxel pooling).
//!
//! Every point whose (x, y, z) lies inside the voxel grid adds its feature row to BEV cell
//! (b, y, x); `pos_memo` records (b, y, x) or (-1, -1, -1).
//!
//! Determinism: the result must be bit-identical across runs and thread counts, so each
//! output cell is owned by exactly one task, which adds the cell's points in point order
//! (the order of a serial loop). How the cells are split among tasks therefore never
//! changes a bit of the result; it only decides speed.
//!
//! Speed: the op streams B*N*C features once. Gathering each cell's points (a counting
//! sort by cell) reads 4*C-byte rows in random order and measured 2-3x slower than
//! scanning the points in order and scattering into the (cache-sized) output of the task,
//! so tasks own a contiguous cell range of one batch and scan that batch's points in
//! order. Extra memory: none when each batch is one task, else B * ny * nx counts.
//! Both the feature rows (non-temporally, so they do not evict the grid) and the output
//! rows of points a few places ahead are prefetched: the output grid is larger than L2,
//! and without the second prefetch every point waited for its row's latency (1.2-1.4x
//! slower at seed scale).
//!
//! Passes:
//! 1. `pos_memo` (parallel over point chunks; no division per point).
//! 2. output rows (parallel over cell ranges): zero, then add the in-range points' rows.

pub mod mlu;

use crate::error::{Error, Result};
use crate::parallel::{Parallel, for_each_chunk_mut, for_each_part_mut, pieces};
use crate::schema::Attrs;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

/// Points per `pos_memo` task: ~48K int32 written per task, coarse enough to amortise
/// scheduling and fine enough to balance.
const POS_CHUNK_POINTS: usize = 1 << 14;
/// Minimum work (feature elements added or zeroed) of a summation task.
const SUM_GRAIN: usize = 1 << 16;
/// How far ahead of the summation the feature and output rows are prefetched, in points.
const PREFETCH_AHEAD: usize = 8;
/// Each task of a batch rescans the batch's pos_memo; past this many tasks the rescans
/// cost more than the extra cores bring.
const MAX_TASKS_PER_BATCH: usize = 16;

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
        let feats =
            inputs.get_shaped::<f32>(1, &[Some(batches), Some(points), None], "[B, N, C] (B, N of geom_xyz)")?;
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

    fn execute(
        &self,
        plan: VoxelPlan,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
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
        if !out.is_empty() {
            // Tasks per batch: enough to occupy the machine's cores when batches are few.
            // Each task scans its whole batch's pos_memo, and more tasks make each one's
            // feature reads sparser, so no more than that (and coarse).
            let work = (points + self.cells) * channels;
            let per_batch = cores().div_ceil(batches).min(MAX_TASKS_PER_BATCH).min(pieces(work, SUM_GRAIN));
            self.sum_cells(pos_memo, feats, points, channels, out, per_batch, par);
        }
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

    /// Pass 2: output_features. Tasks own contiguous cell ranges of one batch; each zeroes
    /// its rows, then scans the batch's points in order and adds the rows of the points
    /// that fall in its range. A cell's sum is thus 0 + its points in point order, whatever
    /// the split, and the features are read in ascending address order (streamed).
    #[allow(clippy::too_many_arguments)]
    fn sum_cells(
        &self,
        pos_memo: &[i32],
        feats: &[f32],
        points: usize,
        channels: usize,
        out: &mut [f32],
        per_batch: usize,
        par: &dyn Parallel,
    ) {
        let cells = self.cells;
        let batches = out.len() / (cells * channels);
        let per_batch = per_batch.clamp(1, cells);
        let cuts = if per_batch == 1 {
            (0..=batches).map(|b| b * cells * channels).collect()
        } else {
            self.balanced_cuts(pos_memo, points, batches, per_batch, channels, par)
        };
        for_each_part_mut(par, out, &cuts, |t, part| {
            part.fill(0.0);
            let first_cell = cuts[t] / channels;
            let b = first_cell / cells;
            let (lo, hi) = (first_cell - b * cells, first_cell - b * cells + part.len() / channels);
            let memo = &pos_memo[b * points * 3..(b + 1) * points * 3];
            let feats = &feats[b * points * channels..(b + 1) * points * channels];
            // pos_memo is (b, y, x) with y < ny, x < nx, or -1 for invalid points.
            let cell_of = |m: &[i32]| (m[0] >= 0).then(|| m[1] as usize * self.nx + m[2] as usize);
            for (i, (m, f)) in memo.chunks_exact(3).zip(feats.chunks_exact(channels)).enumerate() {
                // The rows of the point PREFETCH_AHEAD places on, if it is this task's: its
                // feature row (streamed, so it does not evict the grid) and its output row,
                // whose cell is random in a grid larger than L2. Without this each point
                // waits for both rows' latency.
                if let Some(cell) = memo.get((i + PREFETCH_AHEAD) * 3..(i + PREFETCH_AHEAD + 1) * 3).and_then(cell_of)
                    && (lo..hi).contains(&cell)
                {
                    let ahead = (i + PREFETCH_AHEAD) * channels;
                    crate::cache::prefetch_stream(feats.get(ahead..).unwrap_or(&[]), channels);
                    crate::cache::prefetch_read(part.get((cell - lo) * channels..(cell - lo + 1) * channels).unwrap_or(&[]));
                }
                let Some(cell) = cell_of(m) else { continue };
                if (lo..hi).contains(&cell) {
                    let row = &mut part[(cell - lo) * channels..(cell - lo + 1) * channels];
                    for (o, &x) in row.iter_mut().zip(f) {
                        *o += x;
                    }
                }
            }
        });
    }

    /// Cuts each batch's cells into `per_batch` contiguous ranges of about equal work
    /// (one row zeroed plus one row added per point), using a per-cell point count.
    /// Returns the cut positions in output elements.
    fn balanced_cuts(
        &self,
        pos_memo: &[i32],
        points: usize,
        batches: usize,
        per_batch: usize,
        channels: usize,
        par: &dyn Parallel,
    ) -> Vec<usize> {
        let cells = self.cells;
        let mut counts = vec![0usize; batches * cells];
        for_each_chunk_mut(par, &mut counts, cells, |b, counts| {
            for m in pos_memo[b * points * 3..(b + 1) * points * 3].chunks_exact(3) {
                if m[0] >= 0 {
                    counts[m[1] as usize * self.nx + m[2] as usize] += 1;
                }
            }
        });
        let mut cuts = vec![0];
        for (b, counts) in counts.chunks_exact(cells).enumerate() {
            let total: usize = counts.iter().sum::<usize>() + cells;
            let mut done = 0usize;
            let mut next = 1;
            for (c, &n) in counts.iter().enumerate() {
                done += n + 1;
                // Cut after the cell whose cumulative work reaches the next k / per_batch.
                if next < per_batch && done as u128 * per_batch as u128 >= total as u128 * next as u128 {
                    cuts.push((b * cells + c + 1) * channels);
                    next += 1;
                }
            }
            cuts.push((b + 1) * cells * channels);
        }
        cuts.dedup();
        cuts
    }
}

/// The machine's core count, read once (the partition only affects speed, never results).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::{Serial, Threads};

    /// The split of cells among tasks must not change a bit of the result.
    #[test]
    fn any_split_gives_the_same_bits() {
        let op = VoxelPoolingForward::new([5, 4, 2]).expect("valid grid");
        let (batches, points, channels) = (2usize, 300usize, 3usize);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let geom: Vec<i32> = (0..batches * points * 3).map(|_| (next() % 8) as i32 - 1).collect();
        let feats: Vec<f32> =
            (0..batches * points * channels).map(|_| (next() % 2001) as f32 * 1.37e-3 - 1.0).collect();
        let mut memo = vec![0i32; batches * points * 3];
        op.write_pos_memo(&geom, points, &mut memo, &Threads(3));
        let mut first: Option<Vec<u32>> = None;
        for per_batch in [1, 2, 3, 7, 20, 1000] {
            for par in [&Serial as &dyn Parallel, &Threads(2), &Threads(5)] {
                let mut out = vec![f32::NAN; batches * op.cells * channels];
                op.sum_cells(&memo, &feats, points, channels, &mut out, per_batch, par);
                let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                match &first {
                    None => first = Some(bits),
                    Some(f) => assert_eq!(f, &bits, "per_batch {per_batch}"),
                }
            }
        }
    }
}
