//! PsRoiPoolBackward on Cambricon's MLU-OPS library (`mluOpPsRoiPoolBackward`). The library
//! converts roi coordinates with a `_rd` intrinsic whose rounding is not confirmed (round
//! down by its name, half away from zero in mlu-ops' own CPU reference), converts bin edges
//! to int before clamping, and truncates non-finite batch ids (docs/MLUOPS_BINDING.md §3.7).
//! So the rois go to the library as a card copy prepared on the host: coordinates rounded
//! as the contract rounds (integers, which every rounding keeps), and the batch id -1 (a
//! roi the library skips) for a roi the contract makes contribute nothing. A node with a
//! bin edge beyond the int range goes to the next path.

use super::backward::{PsRoiPlan, PsRoiPoolBackward};
use crate::error::{Error, Result};
use crate::mlu::Direction;
use crate::mluops::{DType, Layout, Library};
use crate::ops::device::{Card, DeviceOutputs, MluOpsOperator};
use crate::scratch;
use std::ffi::c_void;

/// The library's tensors stay below 2^31 bytes (psroipool.cpp:204-219 at v1.4.0).
const MAX_BYTES: usize = (1 << 31) - 1;
/// Coordinates and bin edges beyond this magnitude could leave the int range the library
/// converts them to (it converts each coordinate, then each bin edge).
const EDGE_LIMIT: f32 = (1u32 << 30) as f32;
/// The contract's least roi extent (R-FCN's 0.1).
const MIN_ROI_EXTENT: f32 = 0.1;

impl PsRoiPoolBackward {
    /// One roi as the library is given it: rounded coordinates, or batch -1 when the contract
    /// makes it contribute nothing; `None` when a bin edge leaves the int range.
    fn library_roi(&self, roi: &[f32]) -> Option<[f32; 5]> {
        let r = [roi[0], roi[1].round(), roi[2].round(), roi[3].round(), roi[4].round()];
        let scale = self.spatial_scale;
        let (start_w, start_h) = (r[1] * scale, r[2] * scale);
        let (end_w, end_h) = ((r[3] + 1.0) * scale, (r[4] + 1.0) * scale);
        let bin_w = (end_w - start_w).max(MIN_ROI_EXTENT) / self.pooled as f32;
        let bin_h = (end_h - start_h).max(MIN_ROI_EXTENT) / self.pooled as f32;
        if !roi.iter().all(|v| v.is_finite()) || ![start_w, start_h, bin_w, bin_h].iter().all(|v| v.is_finite()) {
            return Some([-1.0, 0.0, 0.0, 0.0, 0.0]);
        }
        let far = |start: f32, bin: f32| start.abs().max((self.pooled as f32 * bin + start).abs());
        let coordinates = r[1..].iter().all(|v| v.abs() < EDGE_LIMIT);
        (coordinates && far(start_w, bin_w) < EDGE_LIMIT && far(start_h, bin_h) < EDGE_LIMIT).then_some(r)
    }
}

impl MluOpsOperator for PsRoiPoolBackward {
    fn mluops_supported(&self) -> std::result::Result<(), String> {
        if self.pooled > i32::MAX as usize || self.output_dim > i32::MAX as usize {
            return Err("pooled sizes or output_dim beyond the library's int arguments".into());
        }
        Ok(())
    }

    fn mluops_fits(&self, plan: &PsRoiPlan) -> std::result::Result<(), String> {
        let bottom = [plan.batches, plan.height, plan.width, self.channels, 4].iter().fold(1usize, |a, &d| a.saturating_mul(d));
        let top = [plan.rois, self.channels, 4].iter().fold(1usize, |a, &d| a.saturating_mul(d));
        if bottom > MAX_BYTES || top > MAX_BYTES {
            return Err("a tensor of 2^31 bytes or more: MLU-OPS's PsRoiPool takes less".into());
        }
        Ok(())
    }

    fn mluops_compute(&self, plan: &PsRoiPlan, lib: &Library, card: &Card<'_>, outputs: &mut dyn DeviceOutputs) -> Result<()> {
        let spec = self.output_spec(plan);
        let out = outputs.allocate(0, &spec)?;
        // SAFETY: `out` was just allocated for the spec's bytes.
        unsafe { card.device.zero_raw(out, spec.bytes())? };
        // R = 0 is BAD_PARAM there and the contract's all-zero output here.
        if spec.numel() == 0 || plan.rois == 0 {
            return Ok(());
        }
        let r = plan.rois;
        let mut rois = scratch::filled(r * 5, 0f32, "the host copy of rois")?;
        // SAFETY: `rois` holds R*5 floats; input 1 is the [R, 5] rois on the card.
        unsafe { card.device.copy_raw(rois.as_mut_ptr().cast(), card.input::<c_void>(1), r * 20, Direction::DeviceToHost)? };
        for row in rois.chunks_exact_mut(5) {
            let adapted = self.library_roi(row).ok_or_else(|| {
                Error::MluLimit(format!("roi {row:?}: a coordinate or bin edge beyond the int range MLU-OPS converts to"))
            })?;
            row.copy_from_slice(&adapted);
        }
        let prepared = outputs.workspace(r * 20)?;
        // SAFETY: `prepared` holds R*5 floats of card memory; `rois` as many on the host.
        unsafe { card.device.copy_raw(prepared, rois.as_ptr().cast(), r * 20, Direction::HostToDevice)? };
        let (p, o) = (self.pooled, self.output_dim);
        let top = lib.tensor(Layout::Nhwc, DType::Float, &[r, p, p, o])?;
        let rois_d = lib.tensor(Layout::Array, DType::Float, &[r, 5])?;
        let map = lib.tensor(Layout::Nhwc, DType::Int32, &[r, p, p, o])?;
        let bottom = lib.tensor(Layout::Nhwc, DType::Float, &[plan.batches, plan.height, plan.width, self.channels])?;
        lib.with_handle(card.queue, |h| {
            // SAFETY: descriptors of the node's tensors; card memory of those sizes; the int
            // arguments bounded by mluops_supported.
            let s = unsafe {
                (lib.f.mluOpPsRoiPoolBackward)(
                    h, p as i32, p as i32, self.spatial_scale, o as i32, top.ptr, card.input::<c_void>(0), rois_d.ptr,
                    prepared.cast_const(), map.ptr, card.input::<c_void>(2), bottom.ptr, out,
                )
            };
            lib.check("mluOpPsRoiPoolBackward", s)
        })
    }
}
