//! PsRoiPoolBackward (OPERATORS.md section 5; R-FCN position-sensitive RoI pooling, NHWC).
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

pub mod mlu;

use crate::error::{Error, Result};
use crate::parallel::{Parallel, for_each_part_mut, pieces};
use crate::schema::Attrs;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

/// Work units (output elements zeroed or updated) per task.
const GRAIN: f64 = 32768.0;
/// Upper bound on tasks: each task re-scans the rois of its batches.
const MAX_TASKS: usize = 256;
/// Minimum roi extent, as in the R-FCN kernel (avoids zero-size rois).
const MIN_ROI_EXTENT: f32 = 0.1;

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

/// Output geometry validated by `plan`.
#[derive(Debug, Clone, Copy)]
pub struct PsRoiPlan {
    rois: usize,
    batches: usize,
    height: usize,
    width: usize,
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
    pub fn new(pooled_height: i64, pooled_width: i64, spatial_scale: f32, output_dim: i64) -> Result<Self> {
        if pooled_height < 1 {
            return Err(Error::attribute("pooled_height", format!("must be >= 1, got {pooled_height}")));
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
            return Err(Error::attribute("spatial_scale", format!("must be finite and > 0, got {spatial_scale}")));
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
        let channels = pooled.checked_mul(pooled).and_then(|n| n.checked_mul(od)).ok_or_else(too_big)?;
        Ok(PsRoiPoolBackward { pooled, spatial_scale, output_dim: od, channels })
    }

    /// The roi's batch if all five values are finite (then it must be checked against
    /// `batches`), `None` for a roi that contributes nothing.
    pub(super) fn finite_batch(roi: &[f32]) -> Option<f32> {
        roi.iter().all(|v| v.is_finite()).then(|| roi[0].trunc())
    }

    /// Every roi with finite values must name a batch in [0, batches) (input `index`).
    pub(super) fn check_batches(inputs: &Inputs<'_>, index: usize, rois: &[f32], batches: usize) -> Result<()> {
        for (k, roi) in rois.chunks_exact(5).enumerate() {
            if let Some(b) = Self::finite_batch(roi) {
                // Compared in f64: exact for every f32 and every realistic batch count.
                if !(b >= 0.0 && f64::from(b) < batches as f64) {
                    return Err(
                        inputs.error(index, format!("roi {k}: batch_id {} (truncated {b}) outside [0, {batches})", roi[0]))
                    );
                }
            }
        }
        Ok(())
    }

    /// Row and column spans of every bin of one roi, or `None` when the roi contributes
    /// nothing (non-finite start or bin size). Float32, each operation rounded (Rust never
    /// fuses), floor/ceil, then clamped to the map before conversion.
    pub(super) fn roi_spans(&self, roi: &[f32], height: usize, width: usize, rows: &mut [Span], cols: &mut [Span]) -> Option<()> {
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
                let lo = (k as f32 * bin + start).floor();
                let hi = ((k + 1) as f32 * bin + start).ceil();
                *s = Span { start: clamp_to(lo, limit), end: clamp_to(hi, limit) };
            }
        };
        edges(rows, bin_h, start_h, height);
        edges(cols, bin_w, start_w, width);
        Some(())
    }
}

/// An integral float (possibly +-inf) clamped to [0, limit] and converted. The comparison
/// is done in f64, where both the value and `limit` are exact.
fn clamp_to(v: f32, limit: usize) -> usize {
    if v.is_nan() || v <= 0.0 {
        0
    } else if f64::from(v) >= limit as f64 {
        limit
    } else {
        // 0 < v < limit, integral: exact.
        (v as usize).min(limit)
    }
}

impl super::Operator for PsRoiPoolBackward {
    const NAME: &'static str = "PsRoiPoolBackward";
    type Plan = PsRoiPlan;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        Self::new(
            attrs.int("pooled_height")?,
            attrs.int("pooled_width")?,
            attrs.float("spatial_scale")?,
            attrs.int("output_dim")?,
        )
    }

    fn plan(&self, inputs: &Inputs<'_>) -> Result<(Vec<OutputSpec>, PsRoiPlan)> {
        let (p, od) = (Some(self.pooled), Some(self.output_dim));
        let top = inputs.get_shaped::<f32>(0, &[None, p, p, od], "[R, pooled_height, pooled_width, output_dim]")?;
        let r = top.shape[0];
        let rois = inputs.get_shaped::<f32>(1, &[Some(r), Some(5)], "[R, 5] (R of top_grad)")?;
        inputs.get_shaped::<i32>(
            2,
            &[Some(r), p, p, od],
            "[R, pooled_height, pooled_width, output_dim] (R of top_grad)",
        )?;
        let mapping = inputs.get::<i32>(2)?.data;
        let shape = inputs.get::<i64>(3)?;
        let &[batches, height, width, channels] = shape.data else {
            return Err(inputs.error(
                3,
                format!("must hold 4 values (batches, height, width, channels), got shape {:?}", shape.shape),
            ));
        };
        if shape.shape.len() != 1 {
            return Err(inputs.error(3, format!("must be a 1-D tensor of 4 values, got shape {:?}", shape.shape)));
        }
        let dims: Vec<usize> = shape
            .data
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| inputs.error(3, format!("values must be >= 0, got {:?}", shape.data)))?;
        if dims[3] != self.channels {
            return Err(inputs.error(
                3,
                format!(
                    "channels ({channels}) must equal pooled_height * pooled_width * output_dim = {}",
                    self.channels
                ),
            ));
        }
        let numel = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.is_none_or(|n| n > isize::MAX as usize / size_of::<f32>()) {
            return Err(
                inputs.error(3, format!("bottom_grad size {batches} * {height} * {width} * {channels} overflows"))
            );
        }
        let (batches, height, width) = (dims[0], dims[1], dims[2]);
        Self::check_batches(inputs, 1, rois.data, batches)?;
        // min/max first (vectorises); the offending position only on failure.
        let (lo, hi) = mapping.iter().fold((i32::MAX, i32::MIN), |(lo, hi), &c| (lo.min(c), hi.max(c)));
        if !mapping.is_empty() && (lo < 0 || hi as usize >= self.channels) {
            let k = mapping.iter().position(|&c| c < 0 || c as usize >= self.channels).unwrap_or(0);
            return Err(inputs.error(
                2,
                format!("value {} at flat index {k} outside [0, channels = {})", mapping[k], self.channels),
            ));
        }
        let specs = vec![OutputSpec::new(DType::F32, [batches, height, width, self.channels])];
        Ok((specs, PsRoiPlan { rois: r, batches, height, width }))
    }

    fn execute(
        &self,
        plan: PsRoiPlan,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        let top = inputs.get::<f32>(0)?.data;
        let rois = inputs.get::<f32>(1)?.data;
        let mapping = inputs.get::<i32>(2)?.data;
        let out = outputs.take::<f32>(0)?;
        let PsRoiPlan { rois: r_count, batches, height, width } = plan;
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
        let mut rows = vec![Span::default(); r_count * p];
        let mut cols = vec![Span::default(); r_count * p];
        let mut batch_of = vec![usize::MAX; r_count];
        let mut batch_start = vec![0usize; batches + 1];
        for (r, roi) in rois.chunks_exact(5).enumerate() {
            let Some(b) = Self::finite_batch(roi) else { continue };
            let spans =
                self.roi_spans(roi, height, width, &mut rows[r * p..(r + 1) * p], &mut cols[r * p..(r + 1) * p]);
            // plan checked 0 <= b < batches for every finite roi.
            if spans.is_some() && b >= 0.0 && (b as usize) < batches {
                batch_of[r] = b as usize;
                batch_start[b as usize + 1] += 1;
            }
        }
        for b in 0..batches {
            batch_start[b + 1] += batch_start[b];
        }
        let mut cursor = batch_start.clone();
        let mut by_batch = vec![0usize; batch_start[batches]];
        for (r, &b) in batch_of.iter().enumerate() {
            if b != usize::MAX {
                by_batch[cursor[b]] = r;
                cursor[b] += 1;
            }
        }

        // Work per output row (zeroing + updates), for balanced contiguous row ranges.
        let total_rows = batches * height;
        let mut diff = vec![0f64; total_rows + 1];
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
        let weights: Vec<f64> = diff[..total_rows]
            .iter()
            .map(|d| {
                acc += d;
                acc + row_len as f64
            })
            .collect();
        let total: f64 = weights.iter().sum();
        let tasks = pieces((total / GRAIN).ceil() as usize, 1).min(MAX_TASKS).min(total_rows);
        let mut cuts = vec![0usize];
        let mut done = 0.0;
        for (g, w) in weights.iter().enumerate() {
            done += w;
            if cuts.len() < tasks && done * tasks as f64 >= total * cuts.len() as f64 {
                cuts.push((g + 1) * row_len);
            }
        }
        cuts.push(out.len());
        cuts.dedup();

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
    height: usize,
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
                            let mut pixels = row[cs.start * channels..cs.end * channels].chunks_exact_mut(channels);
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
