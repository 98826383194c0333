//! DynamicScatterBackward (docs/CONTRACT.md §2): the gradient of mmcv's
//! dynamic_point_to_voxel with respect to the point features.
//!
//! `sum` and `mean` are a row gather, parallel over blocks of points.
//!
//! `max` gives each (voxel, channel) gradient to the lowest-index point whose feature equals
//! the voxel's (IEEE `==`). It runs in linear time, without atomics and without a
//! per-(voxel, channel) index array:
//! 1. `plan` validates the map and counting-sorts the points by voxel (stable, so each voxel's
//!    points stay in ascending index order) into a CSR layout.
//! 2. `execute` zeroes the rows of dropped points, then hands out blocks of voxels (about
//!    `GRAIN` output elements each) as tasks. A voxel walks its points in ascending order
//!    with one "taken" lane mask per channel: a point writes `grad_voxel_feats[v, c]` where
//!    it matches and the channel is not taken yet (then it is), and +0 elsewhere.
//!
//! Each large tensor is touched once: voxel_feats and grad_voxel_feats are read in order,
//! the feats rows of a voxel's points are gathered (prefetched a few points ahead, so
//! several rows load at once) and its grad_feats rows written at their scattered places
//! (built in L1, then copied out; an output of `cache::STREAM_MIN_BYTES` or more goes with
//! non-temporal stores, without the read-for-ownership a plain store to an uncached row
//! pays, which was the largest single cost at seed scale). Tasks own their scattered
//! output rows through a CSR-ordered vector of row slices, so no unsafe code is needed.

use super::Reduce;
use crate::cache;
use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::rules::{Broken, Check, RowValues, ValueRule};
use crate::parallel::{Parallel, for_each_chunk_mut, for_each_part_mut, pieces};
use crate::schema::Attrs;
use crate::scratch;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};
use std::ops::Range;

const GRAD_VOXEL_FEATS: usize = 0;
const FEATS: usize = 1;
const VOXEL_FEATS: usize = 2;
const MAP: usize = 3;
const COUNT: usize = 4;
const VOXEL_NUM: usize = 5;

/// Elements per parallel task: below this the thread-pool overhead dominates.
const GRAIN: usize = 32 * 1024;

/// The configured node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicScatterBackward {
    pub reduce: Reduce,
}

/// Validated sizes: N points, M voxel rows, C channels, V valid voxel rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub(super) n: usize,
    pub(super) m: usize,
    pub(super) c: usize,
    pub(super) v: usize,
}

/// Points grouped by voxel, each group in ascending point order: what `execute` needs for
/// `max` beyond the sizes.
#[derive(Debug)]
pub struct Csr {
    /// `offsets[v]..offsets[v + 1]` are voxel v's CSR positions; length V + 1.
    offsets: Vec<usize>,
    /// The point at each CSR position.
    order: Vec<usize>,
    /// The CSR position of each point (unused for dropped points).
    pos: Vec<usize>,
}

/// The typed input data after the shape checks.
struct Views<'a> {
    dims: Dims,
    grad_voxel_feats: &'a [f32],
    feats: &'a [f32],
    voxel_feats: &'a [f32],
    map: &'a [i32],
    count: &'a [i32],
}

/// The shape rules: every dtype and shape, and V from `voxel_num`.
fn dims(inputs: &Inputs<'_>) -> Result<Dims> {
    let gvf = inputs.shaped::<f32>(GRAD_VOXEL_FEATS, &[None, None], "[M, C]")?;
    let (m, c) = (gvf[0], gvf[1]);
    let n = inputs.shaped::<f32>(
        FEATS,
        &[None, Some(c)],
        &format!("[N, C] with C = {c} (from grad_voxel_feats)"),
    )?[0];
    inputs.shaped::<f32>(
        VOXEL_FEATS,
        &[Some(m), Some(c)],
        &format!("[M, C] = [{m}, {c}] (the shape of grad_voxel_feats)"),
    )?;
    inputs.shaped::<i32>(MAP, &[Some(n)], &format!("[N] with N = {n} (from feats)"))?;
    inputs.shaped::<i32>(
        COUNT,
        &[Some(m)],
        &format!("[M] with M = {m} (from grad_voxel_feats)"),
    )?;
    let v = if inputs.is_present(VOXEL_NUM) {
        inputs.shaped::<i32>(VOXEL_NUM, &[Some(1)], "[1]")?;
        let value = inputs.get::<i32>(VOXEL_NUM)?.data[0];
        match usize::try_from(value) {
            Ok(v) if v <= m => v,
            _ => {
                return Err(inputs.error(
                    VOXEL_NUM,
                    format!("voxel_num = {value} is outside [0, M] with M = {m} (the rows of grad_voxel_feats)"),
                ));
            }
        }
    } else {
        m
    };
    Ok(Dims { n, m, c, v })
}

/// The typed input data after the shape rules.
fn views<'a>(inputs: &'a Inputs<'_>, dims: Dims) -> Result<Views<'a>> {
    Ok(Views {
        dims,
        grad_voxel_feats: inputs.get::<f32>(GRAD_VOXEL_FEATS)?.data,
        feats: inputs.get::<f32>(FEATS)?.data,
        voxel_feats: inputs.get::<f32>(VOXEL_FEATS)?.data,
        map: inputs.get::<i32>(MAP)?.data,
        count: inputs.get::<i32>(COUNT)?.data,
    })
}

/// Checks every map value (and, for `mean`, the count of every voxel a point maps to);
/// for `max`, also groups the points by voxel.
fn scan_map(inputs: &Inputs<'_>, x: &Views<'_>, reduce: Reduce) -> Result<Option<Csr>> {
    let Dims { n, c, v, .. } = x.dims;
    // The CSR is needed only when `max` has output to fill.
    let want_csr = reduce == Reduce::Max && n > 0 && c > 0;
    // Histogram in `offsets[row + 1]`.
    let mut offsets =
        if want_csr { scratch::filled(v + 1, 0usize, "the voxel offsets")? } else { Vec::new() };
    for (i, &value) in x.map.iter().enumerate() {
        // Every value is in [-1, V) (the value rule, checked before).
        let Ok(row) = usize::try_from(value) else { continue };
        if reduce == Reduce::Mean {
            // row < V <= M = count.len(), checked by `views`.
            let cnt = x.count.get(row).copied().unwrap_or(0);
            if cnt <= 0 {
                return Err(inputs.error(
                    COUNT,
                    format!(
                        "voxel_points_count[{row}] = {cnt} must be > 0 in mean mode (point {i} maps to voxel {row})"
                    ),
                ));
            }
        }
        if let Some(slot) = offsets.get_mut(row + 1) {
            *slot += 1;
        }
    }
    if !want_csr {
        return Ok(None);
    }
    for r in 1..offsets.len() {
        offsets[r] += offsets[r - 1];
    }
    let total = offsets.last().copied().unwrap_or(0);
    let mut order = scratch::filled(total, 0usize, "the points in voxel order")?;
    let mut pos = scratch::filled(n, usize::MAX, "each point's place in voxel order")?;
    // Next free position of each voxel; filling in point order keeps each group ascending.
    let mut cursor = scratch::filled(offsets.len(), 0usize, "the voxel cursors")?;
    cursor.copy_from_slice(&offsets);
    for (i, &value) in x.map.iter().enumerate() {
        let Ok(row) = usize::try_from(value) else { continue };
        if let Some(cur) = cursor.get_mut(row) {
            let p = *cur;
            *cur += 1;
            if let (Some(o), Some(q)) = (order.get_mut(p), pos.get_mut(i)) {
                *o = i;
                *q = p;
            }
        }
    }
    Ok(Some(Csr { offsets, order, pos }))
}

impl Operator for DynamicScatterBackward {
    const NAME: &'static str = "DynamicScatterBackward";
    const SCHEMA: &'static str =
        include_str!("../../../schemas/dynamic_scatter/dynamic_scatter_backward.json");
    const SIZE_INPUTS: &'static [usize] = &[VOXEL_NUM];
    type Dims = Dims;
    /// Built for `max` only, and only when there is something to compute.
    type Found = Option<Csr>;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        Ok(DynamicScatterBackward { reduce: Reduce::from_attributes(attrs)? })
    }

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        dims(inputs)
    }

    /// grad_feats [N, C].
    fn output_specs(&self, d: &Dims) -> Vec<OutputSpec> {
        vec![OutputSpec::new(DType::F32, [d.n, d.c])]
    }

    /// Every map value in [-1, V). The `mean` rule on counts reads the count a value points
    /// at, so it is no row rule: `scan_map` checks it (the MLU kernels run `max` only).
    fn value_rules(&self, d: &Dims) -> Vec<ValueRule> {
        let (_, hi) = Check::half_open(-1, d.v);
        vec![ValueRule::whole(MAP, Check::int_range(-1, hi))]
    }

    fn describe(&self, inputs: &Inputs<'_>, d: &Dims, broken: &Broken) -> Error {
        let (i, v) = (broken.row, d.v);
        let value = match &broken.values {
            RowValues::I32(x) => x.first().copied().unwrap_or(0),
            RowValues::F32(_) => 0,
        };
        if value < -1 {
            inputs.error(
                MAP,
                format!(
                    "point2voxel_map[{i}] = {value} is below -1 (only -1 marks a dropped point)"
                ),
            )
        } else {
            inputs.error(
                MAP,
                format!("point2voxel_map[{i}] = {value} must be < voxel_num V = {v} (rows >= V are not valid voxels)"),
            )
        }
    }

    fn find(&self, inputs: &Inputs<'_>, d: &Dims, _: &dyn Parallel) -> Result<Option<Csr>> {
        scan_map(inputs, &views(inputs, *d)?, self.reduce)
    }

    fn execute(
        &self,
        dims: Dims,
        csr: Option<Csr>,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        let x = views(inputs, self::dims(inputs)?)?;
        if x.dims != dims {
            return Err(Error::Runtime(format!(
                "{}: inputs changed between plan and execute ({:?} vs {:?})",
                Self::NAME,
                dims,
                x.dims
            )));
        }
        let out = outputs.take::<f32>(0)?;
        if out.len() != x.dims.n * x.dims.c {
            return Err(Error::output(
                "grad_feats",
                format!("buffer holds {} elements, expected N*C", out.len()),
            ));
        }
        if out.is_empty() {
            return Ok(());
        }
        match (self.reduce, csr) {
            (Reduce::Max, Some(csr)) => max(&x, &csr, out, par)?,
            (Reduce::Max, None) => out.fill(0.0),
            (reduce, _) => sum_or_mean(&x, reduce == Reduce::Mean, out, par),
        }
        Ok(())
    }
}

/// Output rows per task so that a task covers about `GRAIN` elements.
fn rows_per_task(c: usize) -> usize {
    GRAIN.div_ceil(c.max(1))
}

/// The row of a voxel (or point) `row` in a [rows, c] tensor.
fn row_of(data: &[f32], row: usize, c: usize) -> Option<&[f32]> {
    data.get(row.checked_mul(c)?..)?.get(..c)
}

/// `sum` and `mean`: each point copies (or divides) its voxel's gradient row.
fn sum_or_mean(x: &Views<'_>, mean: bool, out: &mut [f32], par: &dyn Parallel) {
    let c = x.dims.c;
    let stream = cache::worth_streaming(size_of_val(out));
    let rows = rows_per_task(c);
    for_each_chunk_mut(par, out, rows * c, |t, chunk| {
        let mut quotient = vec![0f32; if mean { c } else { 0 }];
        for (r, dst) in chunk.chunks_exact_mut(c).enumerate() {
            let i = t * rows + r;
            let row = x.map.get(i).and_then(|&value| usize::try_from(value).ok());
            let src = row.and_then(|row| row_of(x.grad_voxel_feats, row, c));
            // Output rows are written once, in order: streamed past the cache when large.
            match (row, src) {
                (Some(row), Some(src)) if mean => {
                    // Divide (not multiply by a reciprocal): the contract's float32 division.
                    let d = x.count.get(row).copied().unwrap_or(0) as f32;
                    for (o, &g) in quotient.iter_mut().zip(src) {
                        *o = g / d;
                    }
                    cache::copy_out(dst, &quotient, stream);
                }
                (_, Some(src)) => cache::copy_out(dst, src, stream),
                _ => dst.fill(0.0),
            }
        }
        cache::stream_fence();
    });
}

/// `max`, in one pass over the voxels: each voxel walks its points in ascending order and
/// writes each point's whole output row, giving every channel's gradient to the first point
/// that matches there.
fn max(x: &Views<'_>, csr: &Csr, out: &mut [f32], par: &dyn Parallel) -> Result<()> {
    let Dims { c, v, .. } = x.dims;
    let stream = cache::worth_streaming(size_of_val(out));
    let total = csr.order.len();

    // Dropped points (map -1) get zero rows; every other row is written by the voxel pass.
    let rows = rows_per_task(c);
    let zeros = vec![0f32; c];
    for_each_chunk_mut(par, out, rows * c, |t, chunk| {
        for (r, dst) in chunk.chunks_exact_mut(c).enumerate() {
            if csr.pos.get(t * rows + r).is_none_or(|&p| p >= total) {
                cache::copy_out(dst, &zeros, stream);
            }
        }
        cache::stream_fence();
    });

    // The output rows in CSR order: then the rows of a block of voxels form one contiguous
    // run of `slots`, which `for_each_part_mut` hands to one task, so each task owns its
    // (scattered) rows without any shared mutable state.
    let mut slots: Vec<Option<&mut [f32]>> =
        scratch::with_capacity(total, "the output rows in voxel order")?;
    slots.resize_with(total, || None);
    for (row, &p) in out.chunks_exact_mut(c).zip(&csr.pos) {
        if let Some(slot) = slots.get_mut(p) {
            *slot = Some(row);
        }
    }

    // Blocks of voxels with about GRAIN output elements each. The split depends on the data
    // only, and each voxel is handled whole, so the result is schedule-independent.
    let tasks = pieces(total * c, GRAIN);
    let mut first_voxel = Vec::with_capacity(tasks + 1);
    first_voxel.push(0);
    for t in 1..tasks {
        let target = (t as u128 * total as u128 / tasks as u128) as usize;
        let vx = csr.offsets.partition_point(|&o| o < target).min(v);
        first_voxel.push(vx.max(first_voxel[t - 1]));
    }
    first_voxel.push(v);
    let bounds: Vec<usize> =
        first_voxel.iter().map(|&vx| csr.offsets.get(vx).copied().unwrap_or(total)).collect();
    for_each_part_mut(par, &mut slots, &bounds, |t, part| {
        voxel_block(x, csr, first_voxel[t]..first_voxel[t + 1], part, stream);
    });
    Ok(())
}

/// Points ahead whose feature rows are prefetched, with the non-temporal hint: each row is
/// read once.
const AHEAD: usize = 4;

/// Writes the output rows of the points of `voxels`; `part` holds those rows in CSR order.
/// `stream`: write them with non-temporal stores.
fn voxel_block(
    x: &Views<'_>,
    csr: &Csr,
    voxels: Range<usize>,
    part: &mut [Option<&mut [f32]>],
    stream: bool,
) {
    let c = x.dims.c;
    let (Some(&base), Some(&end)) = (csr.offsets.get(voxels.start), csr.offsets.get(voxels.end))
    else {
        return;
    };
    let feats_row = |p: usize| csr.order.get(p).and_then(|&i| row_of(x.feats, i, c));
    // Per channel, all ones once an earlier point of the current voxel took the gradient.
    let mut taken = vec![0u32; c];
    let mut row = vec![0f32; c];
    let mut vx = voxels.start;
    let (mut vrow, mut grow): (&[f32], &[f32]) = (&[], &[]);
    let prefetch = |p: usize| {
        if let Some(src) = feats_row(p) {
            cache::prefetch_stream(src, src.len());
        }
    };
    (base..end.min(base + AHEAD)).for_each(prefetch);
    for p in base..end {
        // The points of a voxel are scattered over feats: the row AHEAD positions on starts
        // loading now, so several rows' loads are in flight instead of one.
        if p + AHEAD < end {
            prefetch(p + AHEAD);
        }
        // Move to the voxel owning position p (skipping empty voxels); its first point
        // starts with no channel taken.
        while csr.offsets.get(vx + 1).is_some_and(|&next| next <= p) {
            vx += 1;
        }
        if csr.offsets.get(vx) == Some(&p) {
            taken.fill(0);
            vrow = row_of(x.voxel_feats, vx, c).unwrap_or(&[]);
            grow = row_of(x.grad_voxel_feats, vx, c).unwrap_or(&[]);
        }
        if let (Some(Some(dst)), Some(frow)) = (part.get_mut(p - base), feats_row(p)) {
            // Built in L1, then copied out (streamed when large: these rows are never read).
            first_matches(&mut row, &mut taken, frow, vrow, grow);
            cache::copy_out(dst, &row, stream);
        }
    }
    cache::stream_fence();
}

/// For one point: `dst[k] = g[k]` where `f[k] == v[k]` and channel k is not taken yet (then
/// it is), else +0.
fn first_matches(dst: &mut [f32], taken: &mut [u32], f: &[f32], v: &[f32], g: &[f32]) {
    let n = dst.len();
    if taken.len() != n || f.len() != n || v.len() != n || g.len() != n {
        // Only reachable if the plan does not match the inputs.
        dst.fill(0.0);
        return;
    }
    for ((o, t), ((f, v), g)) in dst.iter_mut().zip(taken).zip(f.iter().zip(v).zip(g)) {
        // IEEE equality (+0 == -0, NaN never matches) as an all-ones/all-zeros lane mask.
        let fresh = u32::from(f == v).wrapping_neg() & !*t;
        *t |= fresh;
        // All bits of g (NaN and -0 included) or none.
        *o = f32::from_bits(g.to_bits() & fresh);
    }
}
