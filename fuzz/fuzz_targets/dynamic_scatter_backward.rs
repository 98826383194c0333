//! DynamicScatterBackward: reduce type, sizes, voxel_num, point->voxel map (some entries
//! breaking its rule), counts and values (ties, signed zeros, NaN) from the fuzzer's bytes;
//! every path against the CPU kernel, the CPU kernel exactly against the suite's reference
//! (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, attrs, check, common, outcome};

#[path = "../../tests/reference/dynamic_scatter_backward.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Case, reference, violated};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let reduce = ["max", "sum", "mean"][u.below(3)];
    let (n, m, c) = (u.below(10), u.below(6), u.below(5));
    let voxel_num =
        if u.one_in(3) { Some(u.below(m + 2) as i32 - i32::from(u.one_in(8))) } else { None };
    let v = voxel_num.map_or(m, |v| v.clamp(0, m as i32) as usize);
    let mut map: Vec<i32> = (0..n).map(|_| u.below(v + 1) as i32 - 1).collect();
    if u.one_in(6) && n > 0 {
        let at = u.below(n);
        map[at] = if u.one_in(2) { -2 } else { v as i32 };
    }
    let count: Vec<i32> = (0..m).map(|_| u.below(4) as i32 - i32::from(u.one_in(8))).collect();
    let feats = u.floats(n * c);
    // Max needs voxel values that equal some of their points' features.
    let mut voxel_feats = u.floats(m * c);
    for (i, &p) in map.iter().enumerate() {
        if p >= 0 && (p as usize) < m && u.one_in(2) {
            let ch = u.below(c);
            if c > 0 {
                voxel_feats[p as usize * c + ch] = feats[i * c + ch];
            }
        }
    }
    let grad_voxel_feats = u.floats(m * c);
    let case = Case { n, m, c, grad_voxel_feats, feats, voxel_feats, map, count, voxel_num };
    let inputs: Vec<_> = case.tensors().into_iter().map(Some).collect();
    let valid = violated(&case, reduce).is_empty();
    let result = check(
        "DynamicScatterBackward",
        &attrs(&[("reduce_type", AttrValue::String(reduce.into()))]),
        &inputs,
        Class::Exact,
    );
    if let Some(out) = outcome(result, valid) {
        let got = out[0].data.f32().expect("float32 grad_feats");
        assert_eq!(
            common::canon(got),
            common::canon(&reference(&case, reduce)),
            "grad_feats against the reference ({reduce})"
        );
    }
});
