//! PsRoiPoolBackward's case and contract reference, shared by its suite
//! (tests/psroipool_backward.rs) and its fuzz target (fuzz/fuzz_targets/).

use crate::common::psroi::Attrs;
use onnxruntime_ep_mlu::tensor::Tensor;

/// Inputs in the contract's order.
#[derive(Debug, Clone)]
pub struct Case {
    pub r: usize,
    pub top: Vec<f32>,
    pub rois: Vec<f32>,
    pub mapping: Vec<i32>,
    pub bottom_shape: Vec<i64>,
}

impl Case {
    pub fn tensors(&self, a: Attrs) -> [Tensor; 4] {
        let (p, q, od) = (a.ph as usize, a.pw as usize, a.od as usize);
        [
            Tensor::f32([self.r, p, q, od], self.top.clone()),
            Tensor::f32([self.r, 5], self.rois.clone()),
            Tensor::i32([self.r, p, q, od], self.mapping.clone()),
            Tensor::i64([self.bottom_shape.len()], self.bottom_shape.clone()),
        ]
    }
}

/// Bin edges of the contract, float32 with every operation rounded (Rust never fuses):
/// returns None when the roi contributes nothing, else per bin (hstart, hend, wstart, wend).
pub fn reference_bin(
    a: Attrs,
    roi: &[f32],
    i: usize,
    j: usize,
    height: usize,
    width: usize,
) -> Option<[usize; 4]> {
    if roi.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let s = a.scale;
    // f32::round is round half away from zero.
    let round = f32::round;
    let start_w = round(roi[1]) * s;
    let start_h = round(roi[2]) * s;
    let end_w = (round(roi[3]) + 1.0) * s;
    let end_h = (round(roi[4]) + 1.0) * s;
    let roi_w = f32::max(end_w - start_w, 0.1);
    let roi_h = f32::max(end_h - start_h, 0.1);
    let bin_w = roi_w / a.pw as f32;
    let bin_h = roi_h / a.ph as f32;
    if !(start_w.is_finite() && start_h.is_finite() && bin_w.is_finite() && bin_h.is_finite()) {
        return None;
    }
    let clamp = |v: f32, hi: usize| -> usize {
        let v = v.max(0.0).min(hi as f32);
        v as usize
    };
    let hs = clamp((i as f32 * bin_h + start_h).floor(), height);
    let he = clamp(((i + 1) as f32 * bin_h + start_h).ceil(), height);
    let ws = clamp((j as f32 * bin_w + start_w).floor(), width);
    let we = clamp(((j + 1) as f32 * bin_w + start_w).ceil(), width);
    Some([hs, he, ws, we])
}

/// One loop per top_grad element, float64 accumulation.
pub fn reference(case: &Case, a: Attrs) -> Vec<f64> {
    let [_, height, width, channels] = [0, 1, 2, 3].map(|k| case.bottom_shape[k] as usize);
    let (p, q, od) = (a.ph as usize, a.pw as usize, a.od as usize);
    let mut out = vec![0f64; case.bottom_shape.iter().product::<i64>() as usize];
    for r in 0..case.r {
        let roi = &case.rois[r * 5..r * 5 + 5];
        for i in 0..p {
            for j in 0..q {
                let Some([hs, he, ws, we]) = reference_bin(a, roi, i, j, height, width) else {
                    continue;
                };
                if he <= hs || we <= ws {
                    continue;
                }
                let b = roi[0].trunc() as usize;
                let area = ((he - hs) * (we - ws)) as f64;
                for o in 0..od {
                    let k = ((r * p + i) * q + j) * od + o;
                    let v = case.top[k] as f64 / area;
                    let c = case.mapping[k] as usize;
                    for h in hs..he {
                        for w in ws..we {
                            out[((b * height + h) * width + w) * channels + c] += v;
                        }
                    }
                }
            }
        }
    }
    out
}
