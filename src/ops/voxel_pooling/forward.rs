//! VoxelPoolingForward (docs/CONTRACT.md §5; BEVDepth voxel pooling).
//!
//! Every point whose (x, y, z) lies inside the voxel grid adds its feature row to BEV cell
//! (b, y, x); `pos_memo` records (b, y, x) or (-1, -1, -1).
//!
//! Determinism: the result must be bit-identical across runs and thread counts. Each
//! batch's points are cut into point chunks, a number that depends on the shapes only
//! (two when a single batch has enough work, else one): each chunk adds into a grid of its
//! own, in point order, and the grids are summed in chunk order. Each output cell of a grid
//! is owned by exactly one task, so how the cells are split among tasks never changes a bit
//! of the result; it only decides speed.
//!
//! Speed: the op streams B*N*C features once. Scanning the points in order and scattering
//! into the (cache-sized) output of the task beats gathering each cell's points, whose
//! 4*C-byte rows would be read in random order, so tasks own a contiguous cell range of one
//! grid and scan that chunk's points in order. Cutting one batch's cells between cores
//! makes each stream all its features (the hardware prefetcher fetches the other core's
//! rows too), so one batch is instead cut into point chunks, each row read once
//! (docs/BENCHMARKS.md has the measurements).
//! Extra memory: one scratch grid per extra chunk (5.2 MB for B = 1 at seed scale, at most
//! 256 MiB), plus B * ny * nx counts when a grid is cut among several tasks.
//! Both the feature rows (non-temporally, so they do not evict the grid) and the output
//! rows of points a few places ahead are prefetched: the output grid is larger than L2,
//! and without the second prefetch every point waited for its row's latency (1.2-1.4x
//! slower at seed scale).
//!
//! Passes:
//! 1. `pos_memo` (parallel over point chunks; no division per point).
//! 2. output and scratch grid rows (parallel over cell ranges): zero, then add the rows of
//!    the chunk's in-range points; then the scratch grids into the output.

use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::parallel::{Parallel, balanced_cuts, for_each_chunk_mut, for_each_part_mut, pieces};
use crate::schema::Attrs;
use crate::scratch;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

/// Points per `pos_memo` task: ~48K int32 written per task, coarse enough to amortise
/// scheduling and fine enough to balance.
const POS_CHUNK_POINTS: usize = 1 << 14;
/// Minimum work (feature elements added or zeroed) of a summation task.
const SUM_GRAIN: usize = 1 << 16;
/// How far ahead of the summation the feature and output rows are prefetched, in points.
const PREFETCH_AHEAD: usize = 8;
/// Each task of a grid rescans its chunk's pos_memo; past this many tasks the rescans
/// cost more than the extra cores bring.
const MAX_TASKS_PER_BATCH: usize = 16;
/// Batches are cut into point chunks until there are this many grids to sum in parallel
/// (see `point_chunks`).
const MIN_GRIDS: usize = 2;
/// Feature elements per point chunk, at least (4 MiB): smaller batches stay whole.
const MIN_CHUNK_ELEMS: usize = 1 << 20;
/// Scratch grids of point chunks take at most this much memory, else batches stay whole.
const MAX_SCRATCH_BYTES: usize = 256 << 20;

/// Descriptor: the validated voxel grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoxelPoolingForward {
    /// num_voxel_x, num_voxel_y, num_voxel_z (each >= 1).
    pub nx: usize,
    pub ny: usize,
    pub nz: usize,
    /// ny * nx, checked not to overflow.
    pub(super) cells: usize,
}

/// Sizes validated by the shape rules: `batches` x `points` points of `channels` features.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub(super) batches: usize,
    pub(super) points: usize,
    pub(super) channels: usize,
}

impl VoxelPoolingForward {
    pub fn new(voxel_num: [i64; 3]) -> Result<Self> {
        let mut dims = [0usize; 3];
        for (d, &v) in dims.iter_mut().zip(&voxel_num) {
            *d = usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| {
                Error::attribute("voxel_num", format!("each value must be > 0, got {voxel_num:?}"))
            })?;
        }
        let [nx, ny, nz] = dims;
        let cells = ny.checked_mul(nx).ok_or_else(|| {
            Error::attribute(
                "voxel_num",
                format!("num_voxel_y * num_voxel_x overflows: {voxel_num:?}"),
            )
        })?;
        Ok(VoxelPoolingForward { nx, ny, nz, cells })
    }

    /// Index of the cell (y * nx + x) of a point inside the grid, `None` outside.
    #[inline]
    fn cell_of(&self, p: &[i32]) -> Option<(usize, usize)> {
        let (x, y, z) =
            (usize::try_from(p[0]).ok()?, usize::try_from(p[1]).ok()?, usize::try_from(p[2]).ok()?);
        (x < self.nx && y < self.ny && z < self.nz).then_some((y, x))
    }
}

/// No value rules: a point outside the grid is skipped, never an error.
impl Operator for VoxelPoolingForward {
    const NAME: &'static str = "VoxelPoolingForward";
    const SCHEMA: &'static str =
        include_str!("../../../schemas/voxel_pooling/voxel_pooling_forward.json");
    type Dims = Dims;
    type Found = ();

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        Self::new(attrs.ints_n::<3>("voxel_num")?)
    }

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        let geom = inputs.shaped::<i32>(0, &[None, None, Some(3)], "[B, N, 3]")?;
        let (batches, points) = (geom[0], geom[1]);
        let feats = inputs.shaped::<f32>(
            1,
            &[Some(batches), Some(points), None],
            "[B, N, C] (B, N of geom_xyz)",
        )?;
        let channels = feats[2];
        let out_len = batches
            .checked_mul(self.cells)
            .and_then(|n| n.checked_mul(channels))
            .filter(|&n| n <= isize::MAX as usize / size_of::<f32>());
        if out_len.is_none() {
            return Err(Error::output(
                "output_features",
                format!(
                    "size B * ny * nx * C = {batches} * {} * {} * {channels} overflows",
                    self.ny, self.nx
                ),
            ));
        }
        // pos_memo stores the batch index as int32.
        if points > 0 {
            crate::ops::operator::check_i32_range(
                || {
                    Error::output(
                        "pos_memo",
                        format!("batch index up to {batches} does not fit int32"),
                    )
                },
                batches,
            )?;
        }
        Ok(Dims { batches, points, channels })
    }

    /// output_features [B, ny, nx, C] and pos_memo [B, N, 3].
    fn output_specs(&self, dims: &Dims) -> Vec<OutputSpec> {
        vec![
            OutputSpec::new(DType::F32, [dims.batches, self.ny, self.nx, dims.channels]),
            OutputSpec::new(DType::I32, [dims.batches, dims.points, 3]),
        ]
    }

    fn find(&self, _: &Inputs<'_>, _: &Dims, _: &dyn Parallel) -> Result<()> {
        Ok(())
    }

    fn execute(
        &self,
        dims: Dims,
        (): (),
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        let geom = inputs.get::<i32>(0)?.data;
        let feats = inputs.get::<f32>(1)?.data;
        let out = outputs.take::<f32>(0)?;
        let pos_memo = outputs.take::<i32>(1)?;
        let Dims { batches, points, channels } = dims;
        if geom.len() != batches * points * 3
            || feats.len() != batches * points * channels
            || out.len() != batches * self.cells * channels
            || pos_memo.len() != batches * points * 3
        {
            return Err(Error::Runtime(
                "VoxelPoolingForward: buffers do not match the plan".into(),
            ));
        }
        self.write_pos_memo(geom, points, pos_memo, par);
        if !out.is_empty() {
            self.sum_cells(pos_memo, feats, points, channels, out, par)?;
        }
        // The planted fault of `scripts/fuzz.sh --self-test` (never in a normal build): one
        // wrong element, the first nonzero sum zeroed, which the fuzz corpus must catch.
        #[cfg(feature = "planted-fault")]
        if let Some(v) = out.iter_mut().find(|v| **v != 0.0) {
            *v = 0.0;
        }
        Ok(())
    }
}

impl VoxelPoolingForward {
    /// Pass 1: pos_memo for every point, in parallel chunks.
    fn write_pos_memo(
        &self,
        geom: &[i32],
        points: usize,
        pos_memo: &mut [i32],
        par: &dyn Parallel,
    ) {
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

    /// Pass 2: output_features.
    ///
    /// Each batch's points are cut into `point_chunks` consecutive chunks (a function of the
    /// shapes only). Chunk 0 adds into the output, every other chunk into a scratch grid of
    /// its own, and the grids are then summed into the output in chunk order. A grid is cut
    /// into cell ranges, one task each: the task zeroes its rows, then scans its chunk's
    /// points in order and adds the rows of those in its range. A cell's value is thus
    /// (0 + its chunk-0 points in point order) + (0 + its chunk-1 points ...) + ..., the
    /// same bits whatever the cell ranges, the thread count or the machine.
    fn sum_cells(
        &self,
        pos_memo: &[i32],
        feats: &[f32],
        points: usize,
        channels: usize,
        out: &mut [f32],
        par: &dyn Parallel,
    ) -> Result<()> {
        let (cells, batches) = (self.cells, out.len() / (self.cells * channels));
        let chunks = self.point_chunks(batches, points, channels);
        // Cell ranges per grid: enough tasks to occupy the machine's cores. Each task scans
        // its chunk's pos_memo, and more tasks make each one's feature reads sparser, so no
        // more than that (and coarse).
        let work = (points.div_ceil(chunks) + cells) * channels;
        let ranges = cores()
            .div_ceil(batches * chunks)
            .min(MAX_TASKS_PER_BATCH)
            .min(pieces(work, SUM_GRAIN));
        self.sum_grids(pos_memo, feats, points, channels, out, [chunks, ranges], par)
    }

    /// `sum_cells` with `chunks` point chunks per batch and up to `ranges` cell ranges per grid.
    #[allow(clippy::too_many_arguments)]
    fn sum_grids(
        &self,
        pos_memo: &[i32],
        feats: &[f32],
        points: usize,
        channels: usize,
        out: &mut [f32],
        [chunks, ranges]: [usize; 2],
        par: &dyn Parallel,
    ) -> Result<()> {
        let (cells, grid) = (self.cells, self.cells * channels);
        let batches = out.len() / grid;
        let chunks = chunks.clamp(1, points.max(1));
        let chunk_len = points.div_ceil(chunks);
        let ranges = ranges.clamp(1, cells);
        let cuts: Vec<Vec<usize>> = if ranges == 1 {
            vec![vec![0, cells]; batches]
        } else {
            self.balanced_cuts(pos_memo, points, batches, ranges, par)?
        };
        let mut scratch = scratch::filled(
            (chunks - 1) * batches * grid,
            0f32,
            "the grids of the extra point chunks",
        )?;
        // (batch, chunk, grid) of every grid: the output's, then the scratch grids.
        let grids = out.chunks_mut(grid).enumerate().map(|(b, g)| (b, 0, g));
        let grids = grids.chain(
            scratch
                .chunks_mut(grid)
                .enumerate()
                .map(|(i, g)| (i / (chunks - 1).max(1), 1 + i % (chunks - 1).max(1), g)),
        );
        let mut parts = Vec::new();
        for (b, chunk, mut rest) in grids {
            for w in cuts[b].windows(2) {
                let (rows, tail) = rest.split_at_mut((w[1] - w[0]) * channels);
                let points = chunk * chunk_len..((chunk + 1) * chunk_len).min(points);
                // Scratch grids start zeroed; the output's rows hold whatever was there.
                parts.push(Part { batch: b, points, first_cell: w[0], zeroed: chunk > 0, rows });
                rest = tail;
            }
        }
        for_each_chunk_mut(par, &mut parts, 1, |_, part| {
            if let [part] = part {
                let b = part.batch;
                self.add_points(
                    part,
                    &pos_memo[b * points * 3..(b + 1) * points * 3],
                    &feats[b * points * channels..(b + 1) * points * channels],
                    channels,
                );
            }
        });
        if chunks > 1 {
            // out += scratch grids of the same batch, in chunk order; pieces never straddle batches.
            let piece = SUM_GRAIN.min(grid);
            let mut bounds = scratch::collect(
                (0..batches).flat_map(|b| (0..grid).step_by(piece).map(move |o| b * grid + o)),
                "the bounds of the grid sums",
            )?;
            scratch::push(&mut bounds, out.len(), "the bounds of the grid sums")?;
            for_each_part_mut(par, out, &bounds, |t, dst| {
                let (b, offset, len) = (bounds[t] / grid, bounds[t] % grid, dst.len());
                for k in 0..chunks - 1 {
                    let start = (b * (chunks - 1) + k) * grid + offset;
                    for (d, &s) in dst.iter_mut().zip(&scratch[start..start + len]) {
                        *d += s;
                    }
                }
            });
        }
        Ok(())
    }

    /// Number of point chunks per batch: up to MIN_GRIDS grids in all when batches are
    /// fewer, chunks of at least MIN_CHUNK_ELEMS feature elements, and scratch grids of at
    /// most MAX_SCRATCH_BYTES. From the shapes alone, so the result never depends on the
    /// machine.
    fn point_chunks(&self, batches: usize, points: usize, channels: usize) -> usize {
        let chunks = MIN_GRIDS
            .div_ceil(batches.max(1))
            .min((points.saturating_mul(channels) / MIN_CHUNK_ELEMS).max(1));
        let scratch = (chunks - 1)
            .saturating_mul(batches)
            .saturating_mul(self.cells)
            .saturating_mul(channels);
        if scratch.saturating_mul(size_of::<f32>()) > MAX_SCRATCH_BYTES { 1 } else { chunks }
    }

    /// Zeroes `part.rows` (unless they already are) and adds to them the rows of its points
    /// that fall in its cells. `memo` and `feats` are the batch's.
    fn add_points(&self, part: &mut Part<'_>, memo: &[i32], feats: &[f32], channels: usize) {
        let rows = &mut *part.rows;
        if !part.zeroed {
            rows.fill(0.0);
        }
        let (lo, hi) = (part.first_cell, part.first_cell + rows.len() / channels.max(1));
        // pos_memo is (b, y, x) with y < ny, x < nx, or -1 for invalid points.
        let cell_of = |i: usize| {
            let m = memo.get(i * 3..i * 3 + 3)?;
            let cell = (m[0] >= 0).then(|| m[1] as usize * self.nx + m[2] as usize)?;
            (lo..hi).contains(&cell).then(|| cell - lo)
        };
        let end = part.points.end;
        for i in part.points.clone() {
            // The rows of the point PREFETCH_AHEAD places on, if it is this task's: its
            // feature row (streamed, so it does not evict the grid) and its output row,
            // whose cell is random in a grid larger than L2. Without this each point
            // waits for both rows' latency.
            if let Some(cell) =
                (i + PREFETCH_AHEAD < end).then(|| cell_of(i + PREFETCH_AHEAD)).flatten()
            {
                let ahead = (i + PREFETCH_AHEAD) * channels;
                crate::cache::prefetch_stream(feats.get(ahead..).unwrap_or(&[]), channels);
                crate::cache::prefetch_read(
                    rows.get(cell * channels..(cell + 1) * channels).unwrap_or(&[]),
                );
            }
            let Some(cell) = cell_of(i) else { continue };
            let (Some(row), Some(f)) = (
                rows.get_mut(cell * channels..(cell + 1) * channels),
                feats.get(i * channels..(i + 1) * channels),
            ) else {
                continue;
            };
            for (o, &x) in row.iter_mut().zip(f) {
                *o += x;
            }
        }
    }

    /// Cuts each batch's cells into `per_batch` contiguous ranges of about equal work
    /// (one row zeroed plus one row added per point), using a per-cell point count.
    /// Returns each batch's cut positions, from 0 to the cell count.
    /// The counts are u32 (saturating: they only weigh the cut), a quarter of the output
    /// for C = 1 and less for more channels.
    fn balanced_cuts(
        &self,
        pos_memo: &[i32],
        points: usize,
        batches: usize,
        per_batch: usize,
        par: &dyn Parallel,
    ) -> Result<Vec<Vec<usize>>> {
        let cells = self.cells;
        let mut counts = scratch::filled(batches * cells, 0u32, "the per-cell point counts")?;
        for_each_chunk_mut(par, &mut counts, cells, |b, counts| {
            for m in pos_memo[b * points * 3..(b + 1) * points * 3].chunks_exact(3) {
                if m[0] >= 0 {
                    let n = &mut counts[m[1] as usize * self.nx + m[2] as usize];
                    *n = n.saturating_add(1);
                }
            }
        });
        Ok(counts
            .chunks_exact(cells)
            .map(|counts| balanced_cuts(counts.iter().map(|&n| u64::from(n) + 1), per_batch))
            .collect())
    }
}

/// One summation task: cells `first_cell..` (as many as `rows` holds) of one grid of
/// `batch`, and the points of the batch it adds.
struct Part<'a> {
    batch: usize,
    pub(super) points: std::ops::Range<usize>,
    first_cell: usize,
    /// `rows` are all +0 already (a fresh scratch grid).
    zeroed: bool,
    rows: &'a mut [f32],
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

    /// The split of cells among tasks must not change a bit of the result, and with point
    /// chunks every cell is (0 + chunk 0's points) + (0 + chunk 1's points) + ..., each
    /// chunk's in point order.
    #[test]
    fn any_split_gives_the_same_bits() {
        let op = VoxelPoolingForward::new([5, 4, 2]).expect("valid grid");
        let (batches, points, channels) = (2usize, 300usize, 3usize);
        let mut next = crate::test_rng::xorshift(0x2545_f491_4f6c_dd1d);
        let geom: Vec<i32> = (0..batches * points * 3).map(|_| (next() % 8) as i32 - 1).collect();
        // Mixed magnitudes, so that any other order of the sums changes bits.
        let feats: Vec<f32> = (0..batches * points * channels)
            .map(|k| ((next() % 2001) as f32 * 1.37e-3 - 1.0) * [1.0, 1e-4, 1e4, 3.3][k % 4])
            .collect();
        let mut memo = vec![0i32; batches * points * 3];
        op.write_pos_memo(&geom, points, &mut memo, &Threads(3));
        for chunks in [1, 2, 3, 7] {
            // The order the contract fixes, computed one point at a time.
            let chunk_len = points.div_ceil(chunks);
            let mut want = vec![0f32; batches * op.cells * channels];
            for b in 0..batches {
                let mut partial = vec![0f32; op.cells * channels];
                for chunk in 0..chunks {
                    partial.fill(0.0);
                    for i in chunk * chunk_len..((chunk + 1) * chunk_len).min(points) {
                        let m = &memo[(b * points + i) * 3..][..3];
                        if m[0] >= 0 {
                            let cell = m[1] as usize * op.nx + m[2] as usize;
                            for c in 0..channels {
                                partial[cell * channels + c] +=
                                    feats[(b * points + i) * channels + c];
                            }
                        }
                    }
                    let dst = &mut want[b * op.cells * channels..][..op.cells * channels];
                    for (d, p) in dst.iter_mut().zip(&partial) {
                        *d = if chunk == 0 { *p } else { *d + p };
                    }
                }
            }
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            for ranges in [1, 2, 3, 7, 20, 1000] {
                for par in [&Serial as &dyn Parallel, &Threads(2), &Threads(5)] {
                    let mut out = vec![f32::NAN; batches * op.cells * channels];
                    op.sum_grids(&memo, &feats, points, channels, &mut out, [chunks, ranges], par)
                        .unwrap();
                    let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(want, bits, "chunks {chunks}, ranges {ranges}");
                }
            }
        }
    }

    /// Point chunks come from the shapes alone: two grids at least when there is enough
    /// work, whole batches otherwise or when the scratch grids would be too large.
    #[test]
    fn point_chunks_follow_the_shapes() {
        let op = VoxelPoolingForward::new([128, 128, 1]).expect("valid grid");
        // BEVDepth inference (B 1) at the seed scale: two chunks; B 2: whole batches.
        assert_eq!(op.point_chunks(1, 473_088, 80), 2);
        assert_eq!(op.point_chunks(2, 473_088, 80), 1);
        // Too little work per chunk.
        assert_eq!(op.point_chunks(1, 1000, 80), 1);
        // A 2048 x 2048 grid of 80 channels needs a 1.3 GB scratch grid: no chunks.
        let big = VoxelPoolingForward::new([2048, 2048, 1]).expect("valid grid");
        assert_eq!(big.point_chunks(1, 473_088, 80), 1);
    }
}
