//! PsRoiPoolBackward: attributes, bottom_shape, rois (non-finite values, batch ids outside
//! the batch), mapping (some outside the channels) and gradients from the fuzzer's bytes;
//! every path against the CPU kernel, the CPU kernel against the suite's reference
//! (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, check, common, judge_terms, outcome};

mod psroi;
#[path = "../../tests/reference/psroipool_backward.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Case, reference};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let (a, attrs_valid) = psroi::attrs(&mut u);
    let (batches, height, width) = (1 + u.below(2), 1 + u.below(6), 1 + u.below(6));
    let channels = (a.ph * a.ph * a.od) as usize + usize::from(u.one_in(16));
    let r = u.below(5);
    let (rois, rois_valid) = psroi::rois(&mut u, r, batches);
    let per_roi = (a.ph * a.ph * a.od) as usize;
    let mut mapping: Vec<i32> = (0..r * per_roi).map(|_| u.below(channels) as i32).collect();
    let mut mapping_valid = true;
    if u.one_in(8) && !mapping.is_empty() {
        let at = u.below(mapping.len());
        mapping[at] = if u.one_in(2) { -1 } else { channels as i32 };
        mapping_valid = false;
    }
    let top = u.floats(r * per_roi);
    let bottom_shape = vec![batches as i64, height as i64, width as i64, channels as i64];
    let case = Case { r, top, rois, mapping, bottom_shape };
    let valid = attrs_valid && rois_valid && mapping_valid && channels == a.channels();
    let inputs: Vec<_> = case.tensors(a).into_iter().map(Some).collect();
    // bottom_grad adds top_diff / bin area over the bins that cover each cell: weights
    // positive, so the kernel on |top_diff| (rois and mapping as they are) adds the terms'
    // magnitudes.
    let abs = Case { top: case.top.iter().map(|x| x.abs()).collect(), ..case.clone() };
    let magnitudes: Vec<_> = abs.tensors(a).into_iter().map(Some).collect();
    let class = Class::Accumulating(&magnitudes);
    if let Some(out) = outcome(check("PsRoiPoolBackward", &a.map(), &inputs, class), valid) {
        let got = out[0].data.f32().expect("float32 bottom_grad");
        // Its terms can cancel too (found: -2.4e-7 in float32 against 4.4e-16 in float64, each
        // the rounding of its own top_diff / area): each element against their magnitude.
        judge_terms(
            got,
            &reference(&case, a),
            &reference(&abs, a),
            common::ELEM_REL,
            "bottom_grad against the reference",
        );
    }
});
