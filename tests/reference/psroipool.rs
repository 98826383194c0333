//! PsRoiPool's case and contract references, shared by its suite (tests/psroipool.rs) and
//! its fuzz target (fuzz/fuzz_targets/).

use crate::common::psroi::Attrs;
use onnxruntime_ep_mlu::tensor::Tensor;

/// Inputs: input [batches, height, width, channels] (NHWC), rois [R, 5].
#[derive(Debug, Clone)]
pub struct Case {
    pub shape: [usize; 4],
    pub input: Vec<f32>,
    pub r: usize,
    pub rois: Vec<f32>,
}

impl Case {
    pub fn tensors(&self) -> (Tensor, Tensor) {
        (Tensor::f32(self.shape, self.input.clone()), Tensor::f32([self.r, 5], self.rois.clone()))
    }
}

/// The bin of the contract: (hstart, hend, wstart, wend) clamped, or None when the roi has a
/// non-finite value or its scaled start / bin size is not finite. float32, every operation
/// rounded separately (Rust never fuses).
pub fn reference_bin(
    a: Attrs,
    roi: &[f32],
    i: usize,
    j: usize,
    height: usize,
    width: usize,
) -> Option<[usize; 4]> {
    if !roi.iter().all(|v| v.is_finite()) {
        return None;
    }
    let s = a.scale;
    let start_w = roi[1].round() * s; // f32::round: half away from zero
    let start_h = roi[2].round() * s;
    let end_w = (roi[3].round() + 1.0) * s;
    let end_h = (roi[4].round() + 1.0) * s;
    let roi_w = if end_w - start_w > 0.1 { end_w - start_w } else { 0.1 };
    let roi_h = if end_h - start_h > 0.1 { end_h - start_h } else { 0.1 };
    let bin_w = roi_w / a.pw as f32;
    let bin_h = roi_h / a.ph as f32;
    if !(start_w.is_finite() && start_h.is_finite() && bin_w.is_finite() && bin_h.is_finite()) {
        return None;
    }
    // Clamp to [0, limit] in floating point (f64 holds every f32 and limit exactly).
    let clamp = |v: f32, limit: usize| -> usize {
        let v = v as f64;
        if v.is_nan() || v <= 0.0 {
            0
        } else if v >= limit as f64 {
            limit
        } else {
            v as usize
        }
    };
    let hs = clamp((i as f32 * bin_h + start_h).floor(), height);
    let he = clamp(((i + 1) as f32 * bin_h + start_h).ceil(), height);
    let ws = clamp((j as f32 * bin_w + start_w).floor(), width);
    let we = clamp(((j + 1) as f32 * bin_w + start_w).ceil(), width);
    Some([hs, he, ws, we])
}

pub struct Reference {
    pub out64: Vec<f64>,
    /// float32 sum, rows then columns ascending, divided by the area in float32.
    pub out32: Vec<f32>,
    pub mapping: Vec<i32>,
}

pub fn reference(case: &Case, a: Attrs) -> Reference {
    let [_, height, width, channels] = case.shape;
    let (p, q, od) = (a.ph as usize, a.pw as usize, a.od as usize);
    let n = case.r * p * q * od;
    let mut r = Reference { out64: vec![0.0; n], out32: vec![0.0; n], mapping: vec![0; n] };
    for ri in 0..case.r {
        let roi = &case.rois[ri * 5..ri * 5 + 5];
        for i in 0..p {
            for j in 0..q {
                let bin = reference_bin(a, roi, i, j, height, width);
                for o in 0..od {
                    let k = ((ri * p + i) * q + j) * od + o;
                    let c = (o * p + i) * q + j;
                    r.mapping[k] = c as i32;
                    let Some([hs, he, ws, we]) = bin else { continue };
                    if he <= hs || we <= ws {
                        continue;
                    }
                    let b = roi[0].trunc() as usize;
                    let (mut s64, mut s32) = (0f64, 0f32);
                    for h in hs..he {
                        for w in ws..we {
                            let x = case.input[((b * height + h) * width + w) * channels + c];
                            s64 += x as f64;
                            s32 += x;
                        }
                    }
                    let area = (he - hs) * (we - ws);
                    r.out64[k] = s64 / area as f64;
                    r.out32[k] = s32 / area as f32;
                }
            }
        }
    }
    r
}
