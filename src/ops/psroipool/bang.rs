//! PsRoiPoolBackward on the MLU: host policy for kernels/psroipool.
//!
//! UNION1 over the card's cores, the R * ph * pw bins split evenly. NRAM
//! holds three tiles of T elements (top_grad, mapping_channel, values) and the bins' spans:
//! case (a) when one bin's output_dim vector fits, T = bins_per_load * output_dim;
//! case (b) otherwise, one bin in chunks of `deal` elements. The host computes every bin's
//! batch and pixel spans (`bin_spans`): the kernel does no float geometry.

use super::Dims;
use super::backward::{PsRoiPoolBackward, Span};
use crate::error::{Error, Result};
use crate::mlu::{self, Direction, NRAM_BUDGET, TASK_UNION1};
use crate::ops::device::{self, BangOperator, CardRun, DeviceOutputs};
use crate::ops::operator::Operator;
use crate::scratch;
use std::ffi::c_void;

/// Tiles carved (each rounded up to 64 bytes).
const TILES: usize = 4;
/// Int32 per bin in the spans the kernel reads: batch, hstart, hend, wstart, wend.
const SPAN_INTS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub task_dim: u32,
    pub bins_per_load: usize,
    pub deal: usize,
}

impl Policy {
    pub fn new(info: &mlu::DeviceInfo, output_dim: usize, bins: usize) -> Self {
        // Per bin: top_grad and value (f32) and mapping_channel (int32) of output_dim
        // elements, and its spans.
        let room = NRAM_BUDGET - TILES * 64;
        let span = SPAN_INTS * 4;
        let task_dim = mlu::union1_tasks(info, bins);
        let per_task = bins.div_ceil(task_dim as usize).max(1);
        if output_dim * 12 + span <= room {
            Policy {
                task_dim,
                bins_per_load: (room / (output_dim * 12 + span)).min(per_task),
                deal: output_dim,
            }
        } else {
            Policy { task_dim, bins_per_load: 1, deal: (room - span) / 12 / 32 * 32 }
        }
    }
}

impl PsRoiPoolBackward {
    /// Every bin's (batch, hstart, hend, wstart, wend) from the contract's float32 geometry
    /// (the CPU kernel's `roi_spans`), batch -1 for a roi that contributes nothing. So the
    /// card's division and rounding never decide a bin edge (docs/CONTRACT.md §6.5).
    fn bin_spans(&self, rois: &[f32], dims: &Dims) -> Result<Vec<i32>> {
        let p = self.pooled;
        let mut spans = scratch::filled(dims.rois * p * p * SPAN_INTS, 0i32, "the bins' spans")?;
        let mut rows = scratch::filled(p, Span::default(), "a roi's row spans")?;
        let mut cols = scratch::filled(p, Span::default(), "a roi's column spans")?;
        for (roi, bins) in rois.chunks_exact(5).zip(spans.chunks_exact_mut(p * p * SPAN_INTS)) {
            let contributes = Self::finite_batch(roi).filter(|_| {
                self.roi_spans(roi, dims.height, dims.width, &mut rows, &mut cols).is_some()
            });
            // A batch outside [0, batches) closes the value-check gate: the kernel never
            // reads it. Spans lie in [0, height] / [0, width], below 2^31 (bang_launch).
            let batch = contributes.map_or(-1, |b| b as i32);
            for (k, bin) in bins.chunks_exact_mut(SPAN_INTS).enumerate() {
                let (r, c) = if batch < 0 {
                    (Span::default(), Span::default())
                } else {
                    (rows[k / p], cols[k % p])
                };
                bin.copy_from_slice(&[
                    batch,
                    r.start as i32,
                    r.end as i32,
                    c.start as i32,
                    c.end as i32,
                ]);
            }
        }
        Ok(spans)
    }
}

/// The kernel's arguments (`bang_launch`).
pub struct Launch {
    policy: Policy,
    rois: i32,
    pooled: i32,
    output_dim: i32,
    height: i32,
    width: i32,
    channels: i32,
    bins_per_load: i32,
    deal: i32,
}

impl BangOperator for PsRoiPoolBackward {
    type Launch = Launch;
    const BANG_FAMILIES: &'static [&'static str] = &["check", "psroipool"];

    fn bang_launch(&self, info: &mlu::DeviceInfo, dims: &Dims) -> Result<Launch> {
        let out_len = self.output_specs(dims)[0].numel();
        let top = dims.rois * self.pooled * self.pooled * self.output_dim;
        let spans = dims.rois * self.pooled * self.pooled * SPAN_INTS;
        if out_len > i32::MAX as usize || top > i32::MAX as usize || spans > i32::MAX as usize {
            return Err(Error::declined(format!(
                "{out_len} output, {top} top_grad or {spans} bin-span elements exceed the MLU kernel's int32 offsets"
            )));
        }
        let policy = Policy::new(info, self.output_dim, dims.rois * self.pooled * self.pooled);
        let n = device::narrow;
        Ok(Launch {
            policy,
            rois: n("R", dims.rois)?,
            pooled: n("pooled", self.pooled)?,
            output_dim: n("output_dim", self.output_dim)?,
            height: n("height", dims.height)?,
            width: n("width", dims.width)?,
            channels: n("channels", self.channels)?,
            bins_per_load: n("bins_per_load", policy.bins_per_load)?,
            deal: n("deal", policy.deal)?,
        })
    }

    fn bang_compute(
        &self,
        dims: &Dims,
        l: &Launch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let spec = &self.output_specs(dims)[0];
        let out = outputs.allocate(0, spec)?;
        // SAFETY: `out` was just allocated for the spec's bytes.
        unsafe { card.device.zero_raw(out, spec.bytes())? };
        let bins = dims.rois * self.pooled * self.pooled;
        if spec.numel() == 0 || bins * self.output_dim == 0 {
            return Ok(());
        }
        let mut rois = scratch::filled(dims.rois * 5, 0f32, "the host copy of rois")?;
        // SAFETY: `rois` holds R*5 floats; input 1 is the [R, 5] rois on the card.
        unsafe {
            card.device.copy_raw(
                rois.as_mut_ptr().cast(),
                card.input::<c_void>(1),
                rois.len() * 4,
                Direction::DeviceToHost,
            )?
        };
        let spans = self.bin_spans(&rois, dims)?;
        let spans_card = outputs.workspace(spans.len() * 4)?;
        // SAFETY: `spans_card` holds as many int32 of card memory as `spans` on the host.
        unsafe {
            card.device.copy_raw(
                spans_card,
                spans.as_ptr().cast(),
                spans.len() * 4,
                Direction::HostToDevice,
            )?
        };
        let (gate, gates) = card.gate();
        let k = card.device.kernels::<super::abi::PsroipoolKernels>()?;
        // SAFETY: device buffers of the validated shapes; the batch ids and channels are
        // used only behind the value-check gate; the launch only enqueues.
        card.queue.launch("bang_psroipool_backward", |q| unsafe {
            (k.bang_psroipool_backward)(
                q,
                l.policy.task_dim,
                TASK_UNION1,
                l.rois,
                l.pooled,
                l.output_dim,
                l.height,
                l.width,
                l.channels,
                l.bins_per_load,
                l.deal,
                card.input(0),
                spans_card.cast_const().cast(),
                card.input(2),
                out.cast(),
                gate,
                gates,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spans' layout the kernel reads: per bin (r, i, j) in the CPU's order, the batch,
    /// then rows i's and columns j's clamped spans; batch -1 and empty spans for a roi that
    /// contributes nothing. A 4 x 6 roi at scale 1 in 2 x 2 bins has integer edges.
    #[test]
    fn spans_are_batch_then_row_then_column_per_bin() {
        let op = PsRoiPoolBackward::new(2, 2, 1.0, 1).expect("valid attributes");
        let dims = Dims { rois: 2, batches: 2, height: 5, width: 8 };
        // Roi 0: batch 1.7 -> 1, x 0..3 (4 wide: bins of 2), y 0..5 (6 high: bins of 3,
        // the second clamped to height 5). Roi 1: a NaN coordinate.
        let rois = [1.7, 0.0, 0.0, 3.0, 5.0, 0.0, f32::NAN, 0.0, 1.0, 1.0];
        let spans = op.bin_spans(&rois, &dims).expect("small");
        #[rustfmt::skip]
        let want = [
            1, 0, 3, 0, 2,   1, 0, 3, 2, 4,   1, 3, 5, 0, 2,   1, 3, 5, 2, 4,
            -1, 0, 0, 0, 0,  -1, 0, 0, 0, 0,  -1, 0, 0, 0, 0,  -1, 0, 0, 0, 0,
        ];
        assert_eq!(spans, want);
    }
}
