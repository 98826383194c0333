//! PsRoiPoolBackward on the MLU: host policy for kernels/psroipool.
//!
//! UNION1 over the card's cores, the R * ph * pw bins split evenly. NRAM
//! holds three tiles of T elements (top_grad, mapping_channel, values) and the roi:
//! case (a) when one bin's output_dim vector fits, T = bins_per_load * output_dim;
//! case (b) otherwise, one bin in chunks of `deal` elements.

use super::backward::{PsRoiPlan, PsRoiPoolBackward};
use crate::error::Result;
use crate::mlu::{self, NRAM_BUDGET, TASK_UNION1};
use crate::ops::device::{self, Card, DeviceOutputs, MluOperator};

/// Tiles carved (each rounded up to 64 bytes) and the roi tile's bytes.
const TILES: usize = 4;
const ROI_BYTES: usize = 32 * 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub task_dim: u32,
    pub bins_per_load: usize,
    pub deal: usize,
}

impl Policy {
    pub fn new(info: &mlu::DeviceInfo, output_dim: usize, bins: usize) -> Self {
        // Elements of the three tiles: top_grad and value (f32), mapping_channel (int32).
        let elements = (NRAM_BUDGET - TILES * 64 - ROI_BYTES) / 12 / 32 * 32;
        let task_dim = mlu::union1_tasks(info, bins);
        let per_task = bins.div_ceil(task_dim as usize).max(1);
        if output_dim <= elements {
            Policy { task_dim, bins_per_load: (elements / output_dim).min(per_task), deal: output_dim }
        } else {
            Policy { task_dim, bins_per_load: 1, deal: elements }
        }
    }
}

impl MluOperator for PsRoiPoolBackward {
    fn mlu_supported(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn mlu_fits(&self, plan: &PsRoiPlan) -> std::result::Result<(), String> {
        let out_len = self.output_spec(plan).numel();
        let top = plan.rois * self.pooled * self.pooled * self.output_dim;
        if out_len > i32::MAX as usize || top > i32::MAX as usize {
            return Err(format!("{out_len} output or {top} top_grad elements exceed the MLU kernel's int32 offsets"));
        }
        Ok(())
    }

    fn mlu_compute(&self, plan: &PsRoiPlan, card: &Card<'_>, outputs: &mut dyn DeviceOutputs) -> Result<()> {
        let spec = self.output_spec(plan);
        let out = outputs.allocate(0, &spec)?;
        // SAFETY: `out` was just allocated for the spec's bytes.
        unsafe { card.device.zero_raw(out, spec.bytes())? };
        let bins = plan.rois * self.pooled * self.pooled;
        if spec.numel() == 0 || bins * self.output_dim == 0 {
            return Ok(());
        }
        let p = Policy::new(&card.device.info, self.output_dim, bins);
        let i = device::i32_of;
        let rois = i("R", plan.rois)?;
        let pooled = i("pooled", self.pooled)?;
        let output_dim = i("output_dim", self.output_dim)?;
        let height = i("height", plan.height)?;
        let width = i("width", plan.width)?;
        let channels = i("channels", self.channels)?;
        let bins_per_load = i("bins_per_load", p.bins_per_load)?;
        let deal = i("deal", p.deal)?;
        let (gate, gates) = card.gate();
        let k = &card.device.kernels;
        // SAFETY: device buffers of the validated shapes; the batch ids and channels are
        // used only behind the value-check gate; the launch only enqueues.
        card.queue.launch("mluops_psroipool_backward", |q| unsafe {
            (k.mluops_psroipool_backward)(
                q, p.task_dim, TASK_UNION1, rois, pooled, output_dim, height, width, channels, self.spatial_scale,
                bins_per_load, deal, card.input(0), card.input(1), card.input(2), out.cast(), gate, gates,
            )
        })
    }
}
