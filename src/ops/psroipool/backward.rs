//! PsRoiPoolBackward (docs/CONTRACT.md §6; R-FCN position-sensitive RoI pooling, NHWC).
//!
//! Each (roi r, bin (i, j), o) spreads top_grad[r, i, j, o] / bin_area over the bin's
//! pixels in channel mapping_channel[r, i, j, o] of bottom_grad[b].
//!
//! Determinism without atomics: tasks own contiguous ranges of output rows (b, h) and each
//! walks the rois of its batches in roi order, adding only to its own rows. Every output
//! element therefore receives its contributions in (r, i, j, o) order whatever the split.
//!
//! Cost: the bin edges depend on i alone (rows) or j alone (columns), so a roi needs
//! ph + pw edge computations, not ph * pw * output_dim. The inner loop runs over o for one
//! pixel, i.e. inside one pixel's channel vector (cache-resident).

use super::{Dims, MIN_ROI_EXTENT};
use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::rules::{Broken, Check, RowValues, ValueRule};
use crate::parallel::{Parallel, balanced_cuts, for_each_part_mut, pieces};
use crate::schema::Attrs;
use crate::scratch;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

/// Work units (output elements zeroed or updated) per task.
const GRAIN: f64 = 32768.0;
/// The input `bottom_shape`.
const BOTTOM_SHAPE: usize = 3;
/// Upper bound on tasks: each task re-scans the rois of its batches.
const MAX_TASKS: usize = 256;

/// Descriptor: validated attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct PsRoiPoolBackward {
    /// pooled_height == pooled_width.
    pub pooled: usize,
    pub spatial_scale: f32,
    pub output_dim: usize,
    /// pooled * pooled * output_dim: the required channel count of bottom_grad.
    pub channels: usize,
}

/// A half-open pixel range of one bin edge pair, already clamped to the map.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Span {
    pub(super) start: usize,
    pub(super) end: usize,
}

impl Span {
    pub(super) fn len(self) -> usize {
        self.end.saturating_sub(self.start)
    }
}

impl PsRoiPoolBackward {
    pub fn new(
        pooled_height: i64,
        pooled_width: i64,
        spatial_scale: f32,
        output_dim: i64,
    ) -> Result<Self> {
        if pooled_height < 1 {
            return Err(Error::attribute(
                "pooled_height",
                format!("must be >= 1, got {pooled_height}"),
            ));
        }
        if pooled_width != pooled_height {
            return Err(Error::attribute(
                "pooled_width",
                format!("must equal pooled_height ({pooled_height}), got {pooled_width}"),
            ));
        }
        if output_dim < 1 {
            return Err(Error::attribute("output_dim", format!("must be >= 1, got {output_dim}")));
        }
        if !(spatial_scale.is_finite() && spatial_scale > 0.0) {
            return Err(Error::attribute(
                "spatial_scale",
                format!("must be finite and > 0, got {spatial_scale}"),
            ));
        }
        let too_big = || {
            Error::attribute(
                "output_dim",
                format!(
                    "pooled_height * pooled_width * output_dim = {pooled_height} * {pooled_width} * {output_dim} overflows"
                ),
            )
        };
        let pooled = usize::try_from(pooled_height).map_err(|_| too_big())?;
        let od = usize::try_from(output_dim).map_err(|_| too_big())?;
        let channels =
            pooled.checked_mul(pooled).and_then(|n| n.checked_mul(od)).ok_or_else(too_big)?;
        Ok(PsRoiPoolBackward { pooled, spatial_scale, output_dim: od, channels })
    }

    /// The roi's batch if all five values are finite (then it must be checked against
    /// `batches`), `None` for a roi that contributes nothing.
    pub(super) fn finite_batch(roi: &[f32]) -> Option<f32> {
        roi.iter().all(|v| v.is_finite()).then(|| roi[0].trunc())
    }

    /// Row and column spans of every bin of one roi, or `None` when the roi contributes
    /// nothing (non-finite start or bin size). Float32, each operation rounded (Rust never
    /// fuses), floor/ceil, then clamped to the map before conversion.
    pub(super) fn roi_spans(
        &self,
        roi: &[f32],
        height: usize,
        width: usize,
        rows: &mut [Span],
        cols: &mut [Span],
    ) -> Option<()> {
        let scale = self.spatial_scale;
        // f32::round rounds half away from zero.
        let start_w = roi[1].round() * scale;
        let start_h = roi[2].round() * scale;
        let end_w = (roi[3].round() + 1.0) * scale;
        let end_h = (roi[4].round() + 1.0) * scale;
        let bin_w = (end_w - start_w).max(MIN_ROI_EXTENT) / self.pooled as f32;
        let bin_h = (end_h - start_h).max(MIN_ROI_EXTENT) / self.pooled as f32;
        if ![start_w, start_h, bin_w, bin_h].iter().all(|v| v.is_finite()) {
            return None;
        }
        let edges = |spans: &mut [Span], bin: f32, start: f32, limit: usize| {
            for (k, s) in spans.iter_mut().enumerate() {
                let lo = k as f32 * bin + start;
                let hi = (k + 1) as f32 * bin + start;
                *s = Span { start: floor_clamped(lo, limit), end: ceil_clamped(hi, limit) };
            }
        };
        edges(rows, bin_h, start_h, height);
        edges(cols, bin_w, start_w, width);
        Some(())
    }
}

/// Largest limit that is exact in f32, so that clamping in f32 equals clamping in f64.
const EXACT_F32_LIMIT: usize = 1 << 24;

/// `v` clamped to [0, limit] in f32 (NaN gives 0), without branches: the edges of random
/// rois mispredicted about once each. `limit` must be at most `EXACT_F32_LIMIT`.
fn clamp_f32(v: f32, limit: usize) -> f32 {
    // NaN compares false, so it becomes 0 (the selects compile to maxss/minss).
    let v = if v > 0.0 { v } else { 0.0 };
    let l = limit as f32;
    if v < l { v } else { l }
}

/// `floor(v)` clamped to [0, limit] and converted, without a libm call per bin edge: floor
/// and the clamp commute, and on [0, limit] floor is the
/// truncation. NaN gives 0; comparisons with a large `limit` are done in f64, where both
/// sides are exact.
fn floor_clamped(v: f32, limit: usize) -> usize {
    if limit <= EXACT_F32_LIMIT {
        return clamp_f32(v, limit) as u32 as usize;
    }
    if v.is_nan() || v <= 0.0 {
        0
    } else if f64::from(v) >= limit as f64 {
        limit
    } else {
        v as usize
    }
}

/// `ceil(v)` clamped to [0, limit] and converted, as `floor_clamped`: the truncation, plus
/// one where it dropped a fraction (then ceil(v) <= limit, since limit is an integer).
fn ceil_clamped(v: f32, limit: usize) -> usize {
    if limit <= EXACT_F32_LIMIT {
        // Everything below 2^24 + 1 is exact in f32 and u32.
        let v = clamp_f32(v, limit);
        let t = v as u32;
        return (t + u32::from((t as f32) < v)) as usize;
    }
    let v = if v.is_nan() || v <= 0.0 {
        0.0
    } else if f64::from(v) >= limit as f64 {
        return limit;
    } else {
        v
    };
    // t and (for v >= 2^24) v itself are exact in f64.
    let t = v as usize;
    t + usize::from((t as f64) < f64::from(v))
}

/// The batch rule on `rois` (input `index`, [R, 5]): a truncated batch id in [0, batches)
/// in every roi whose five values are finite.
pub(super) fn batch_rule(index: usize, batches: usize) -> ValueRule {
    let (above, below) = batch_bounds(batches);
    ValueRule::whole(index, Check::GuardedFloat { cols: 5, col: 0, above, below })
}

/// trunc(x) in [0, batches) exactly when above < x < below: x > -1 truncates to >= 0 (to
/// -0 on (-1, 0), which is 0) and, for batches >= 1, trunc(x) < batches exactly when
/// x < batches; no x qualifies when batches = 0.
fn batch_bounds(batches: usize) -> (f32, f32) {
    if batches == 0 { (-1.0, -1.0) } else { (-1.0, Check::float_below(batches)) }
}

pub(super) fn batch_error(
    inputs: &Inputs<'_>,
    index: usize,
    k: usize,
    roi: &[f32],
    batches: usize,
) -> Error {
    let id = roi.first().copied().unwrap_or(f32::NAN);
    inputs.error(
        index,
        format!("roi {k}: batch_id {id} (truncated {}) outside [0, {batches})", id.trunc()),
    )
}

impl Operator for PsRoiPoolBackward {
    const NAME: &'static str = "PsRoiPoolBackward";
    const SCHEMA: &'static str = include_str!("../../../schemas/psroipool/psroipool_backward.json");
    const SIZE_INPUTS: &'static [usize] = &[BOTTOM_SHAPE];
    type Dims = Dims;
    type Found = ();

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        Self::new(
            attrs.int("pooled_height")?,
            attrs.int("pooled_width")?,
            attrs.float("spatial_scale")?,
            attrs.int("output_dim")?,
        )
    }

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        let (p, od) = (Some(self.pooled), Some(self.output_dim));
        let top = inputs.shaped::<f32>(
            0,
            &[None, p, p, od],
            "[R, pooled_height, pooled_width, output_dim]",
        )?;
        let r = top[0];
        inputs.shaped::<f32>(1, &[Some(r), Some(5)], "[R, 5] (R of top_grad)")?;
        inputs.shaped::<i32>(
            2,
            &[Some(r), p, p, od],
            "[R, pooled_height, pooled_width, output_dim] (R of top_grad)",
        )?;
        let shape = inputs.shape_of::<i64>(BOTTOM_SHAPE)?;
        if inputs.numel(BOTTOM_SHAPE) != Some(4) {
            return Err(inputs.error(
                BOTTOM_SHAPE,
                format!(
                    "must hold 4 values (batches, height, width, channels), got shape {shape:?}"
                ),
            ));
        }
        if shape.len() != 1 {
            return Err(inputs.error(
                BOTTOM_SHAPE,
                format!("must be a 1-D tensor of 4 values, got shape {shape:?}"),
            ));
        }
        let values = inputs.get::<i64>(BOTTOM_SHAPE)?.data;
        let &[batches, height, width, channels] = values else {
            return Err(inputs.error(BOTTOM_SHAPE, format!("must hold 4 values, got {values:?}")));
        };
        let dims: Vec<usize> = values
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                inputs.error(BOTTOM_SHAPE, format!("values must be >= 0, got {values:?}"))
            })?;
        if dims[3] != self.channels {
            return Err(inputs.error(
                BOTTOM_SHAPE,
                format!(
                    "channels ({channels}) must equal pooled_height * pooled_width * output_dim = {}",
                    self.channels
                ),
            ));
        }
        let numel = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.is_none_or(|n| n > isize::MAX as usize / size_of::<f32>()) {
            return Err(inputs.error(
                BOTTOM_SHAPE,
                format!("bottom_grad size {batches} * {height} * {width} * {channels} overflows"),
            ));
        }
        Ok(Dims { rois: r, batches: dims[0], height: dims[1], width: dims[2] })
    }

    /// grad_input [batches, height, width, channels].
    fn output_specs(&self, dims: &Dims) -> Vec<OutputSpec> {
        vec![OutputSpec::new(DType::F32, [dims.batches, dims.height, dims.width, self.channels])]
    }

    /// The batch rule, then `mapping_channel` in [0, channels) everywhere.
    fn value_rules(&self, dims: &Dims) -> Vec<ValueRule> {
        let (lo, hi) = Check::half_open(0, self.channels);
        vec![batch_rule(1, dims.batches), ValueRule::whole(2, Check::int_range(lo, hi))]
    }

    fn describe(&self, inputs: &Inputs<'_>, dims: &Dims, broken: &Broken) -> Error {
        match (&broken.values, broken.rule) {
            (RowValues::F32(roi), 0) => batch_error(inputs, 1, broken.row, roi, dims.batches),
            (RowValues::I32(v), _) => inputs.error(
                2,
                format!(
                    "value {} at flat index {} outside [0, channels = {})",
                    v.first().copied().unwrap_or(0),
                    broken.row,
                    self.channels
                ),
            ),
            (values, rule) => {
                Error::Runtime(format!("PsRoiPoolBackward: value rule {rule} reported {values:?}"))
            }
        }
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
        let top = inputs.get::<f32>(0)?.data;
        let rois = inputs.get::<f32>(1)?.data;
        let mapping = inputs.get::<i32>(2)?.data;
        let out = outputs.take::<f32>(0)?;
        let Dims { rois: r_count, batches, height, width } = dims;
        let (p, od, channels) = (self.pooled, self.output_dim, self.channels);
        let bin_len = p * p * od;
        let row_len = width * channels;
        if out.len() != batches * height * row_len
            || rois.len() != r_count * 5
            || top.len() != r_count * bin_len
            || mapping.len() != top.len()
        {
            return Err(Error::Runtime("PsRoiPoolBackward: buffers do not match the plan".into()));
        }
        if out.is_empty() {
            return Ok(());
        }

        // Bin spans of every contributing roi, and the rois of each batch in roi order
        // (a stable counting sort by batch).
        let mut rows = scratch::filled(r_count * p, Span::default(), "the rois' row spans")?;
        let mut cols = scratch::filled(r_count * p, Span::default(), "the rois' column spans")?;
        let mut batch_of = scratch::filled(r_count, usize::MAX, "the rois' batches")?;
        let mut batch_start = scratch::filled(batches + 1, 0usize, "the batches' first rois")?;
        for (r, roi) in rois.chunks_exact(5).enumerate() {
            let Some(b) = Self::finite_batch(roi) else { continue };
            let spans = self.roi_spans(
                roi,
                height,
                width,
                &mut rows[r * p..(r + 1) * p],
                &mut cols[r * p..(r + 1) * p],
            );
            // plan checked 0 <= b < batches for every finite roi.
            if spans.is_some() && b >= 0.0 && (b as usize) < batches {
                batch_of[r] = b as usize;
                batch_start[b as usize + 1] += 1;
            }
        }
        for b in 0..batches {
            batch_start[b + 1] += batch_start[b];
        }
        let mut cursor = scratch::filled(batches + 1, 0usize, "the batch cursors")?;
        cursor.copy_from_slice(&batch_start);
        let mut by_batch = scratch::filled(batch_start[batches], 0usize, "the rois by batch")?;
        for (r, &b) in batch_of.iter().enumerate() {
            if b != usize::MAX {
                by_batch[cursor[b]] = r;
                cursor[b] += 1;
            }
        }

        // Work per output row (zeroing + updates), for balanced contiguous row ranges.
        let total_rows = batches * height;
        let mut diff = scratch::filled(total_rows + 1, 0f64, "the work per output row")?;
        for (r, &b) in batch_of.iter().enumerate() {
            if b == usize::MAX {
                continue;
            }
            let covered: usize = cols[r * p..(r + 1) * p].iter().map(|s| s.len()).sum();
            for s in &rows[r * p..(r + 1) * p] {
                if s.len() > 0 {
                    diff[b * height + s.start] += (covered * od) as f64;
                    diff[b * height + s.end] -= (covered * od) as f64;
                }
            }
        }
        let mut acc = 0.0;
        let weights = scratch::collect(
            diff[..total_rows].iter().map(|d| {
                acc += d;
                acc + row_len as f64
            }),
            "the weights of the output rows",
        )?;
        let total: f64 = weights.iter().sum();
        let tasks = pieces((total / GRAIN).ceil() as usize, 1).min(MAX_TASKS).min(total_rows);
        // The weights are whole numbers below 2^53, exact in f64 and u64.
        let cuts: Vec<usize> = balanced_cuts(weights.iter().map(|&w| w as u64), tasks)
            .iter()
            .map(|&g| g * row_len)
            .collect();

        let ctx = Ctx {
            op: self,
            top,
            mapping,
            rows: &rows,
            cols: &cols,
            by_batch: &by_batch,
            batch_start: &batch_start,
            height,
            row_len,
        };
        for_each_part_mut(par, out, &cuts, |t, part| ctx.fill_rows(cuts[t] / row_len, part));
        Ok(())
    }
}

/// What every task reads.
struct Ctx<'a> {
    op: &'a PsRoiPoolBackward,
    top: &'a [f32],
    mapping: &'a [i32],
    rows: &'a [Span],
    cols: &'a [Span],
    by_batch: &'a [usize],
    batch_start: &'a [usize],
    pub(super) height: usize,
    row_len: usize,
}

impl Ctx<'_> {
    /// Zeroes and fills global rows first_row.. (row g = (b, h) with g = b * height + h)
    /// of bottom_grad, given as `part`.
    fn fill_rows(&self, first_row: usize, part: &mut [f32]) {
        part.fill(0.0);
        let (p, od, channels) = (self.op.pooled, self.op.output_dim, self.op.channels);
        let end_row = first_row + part.len() / self.row_len;
        let mut values = vec![0f32; od];
        let mut g = first_row;
        while g < end_row {
            let b = g / self.height;
            // Local rows [lo, hi) of batch b owned by this task.
            let lo = g - b * self.height;
            let hi = (end_row - b * self.height).min(self.height);
            for &r in &self.by_batch[self.batch_start[b]..self.batch_start[b + 1]] {
                for i in 0..p {
                    let rs = self.rows[r * p + i];
                    let (h0, h1) = (rs.start.max(lo), rs.end.min(hi));
                    if h0 >= h1 {
                        continue;
                    }
                    for j in 0..p {
                        let cs = self.cols[r * p + j];
                        if cs.len() == 0 {
                            continue;
                        }
                        let area = (rs.len() * cs.len()) as f32;
                        let k = ((r * p + i) * p + j) * od;
                        for (v, &t) in values.iter_mut().zip(&self.top[k..k + od]) {
                            *v = t / area;
                        }
                        let chans = &self.mapping[k..k + od];
                        for h in h0..h1 {
                            let row_off = (b * self.height + h - first_row) * self.row_len;
                            let row = &mut part[row_off..row_off + self.row_len];
                            // Two pixels per sweep over o share the loads of c and v; each
                            // pixel still receives its values in o order.
                            let mut pixels = row[cs.start * channels..cs.end * channels]
                                .chunks_exact_mut(channels);
                            while let Some(first) = pixels.next() {
                                match pixels.next() {
                                    Some(second) => {
                                        for (&c, &v) in chans.iter().zip(&values) {
                                            // plan checked 0 <= c < channels.
                                            first[c as usize] += v;
                                            second[c as usize] += v;
                                        }
                                    }
                                    None => {
                                        for (&c, &v) in chans.iter().zip(&values) {
                                            first[c as usize] += v;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            g = b * self.height + hi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ceil_clamped, floor_clamped};

    /// The contract's definition: floor/ceil in float32, then clamped in floating point.
    fn reference(v: f32, limit: usize) -> usize {
        if v.is_nan() || v <= 0.0 {
            0
        } else if f64::from(v) >= limit as f64 {
            limit
        } else {
            v as usize
        }
    }

    #[test]
    fn clamped_floor_and_ceil_match_libm_on_every_kind_of_value() {
        let mut values = vec![
            0.0f32,
            -0.0,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
            0.5,
            -0.5,
            0.999_999_94,
            1.0,
            1.000_000_1,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
            8_388_607.5,
            8_388_608.0,
            16_777_215.0,
            16_777_216.0,
            16_777_218.0,
            4e9,
        ];
        for limit in [0usize, 1, 2, 13, 14, 15, 1 << 23, 1 << 24, (1 << 24) + 1] {
            let l = limit as f32;
            for d in [-1.0f32, -0.5, 0.0, 0.25, 1.0] {
                values.extend([
                    l + d,
                    f32::from_bits((l + d).to_bits().wrapping_add(1)),
                    f32::from_bits((l + d).to_bits().wrapping_sub(1)),
                ]);
            }
        }
        // Random bit patterns, and random values in the usual range.
        let mut next = crate::test_rng::xorshift(0x2545_F491_4F6C_DD1D);
        for k in 0..200_000 {
            let bits = (next() >> 32) as u32;
            values.push(if k % 2 == 0 {
                f32::from_bits(bits)
            } else {
                (bits as f32 / u32::MAX as f32) * 40.0 - 10.0
            });
        }
        for &v in &values {
            for limit in [0usize, 1, 14, 360, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, usize::MAX] {
                assert_eq!(
                    floor_clamped(v, limit),
                    reference(v.floor(), limit),
                    "floor {v:e} ({:#x}) limit {limit}",
                    v.to_bits()
                );
                assert_eq!(
                    ceil_clamped(v, limit),
                    reference(v.ceil(), limit),
                    "ceil {v:e} ({:#x}) limit {limit}",
                    v.to_bits()
                );
            }
        }
    }
}
