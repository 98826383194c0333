//! ThreeInterpolateBackward: shapes, m, dtype, indices (some outside [0, m)) and values
//! from the fuzzer's bytes; every path against the CPU kernel, the CPU kernel against the
//! suite's float64 reference (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, attrs, check, common, judge, outcome, widened};

#[path = "../../tests/reference/three_interpolate_backward.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Case, Ty, reference, representable};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let ty = if u.one_in(3) { Ty::F16 } else { Ty::F32 };
    let (b, c, n) = (u.below(3), u.below(6), u.below(9));
    let m = u.below(12) as i64 - i64::from(u.one_in(16));
    let grad_output =
        u.floats(b * c * n).into_iter().map(|x| representable(ty, f64::from(x))).collect();
    let mut indices: Vec<i32> = (0..b * n * 3).map(|_| u.below(m.max(0) as usize) as i32).collect();
    if u.one_in(4) && !indices.is_empty() {
        let at = u.below(indices.len());
        indices[at] = if u.one_in(2) { -1 } else { m as i32 };
    }
    let weights =
        u.floats(b * n * 3).into_iter().map(|x| representable(ty, f64::from(x))).collect();
    let case = Case { b, c, n, m, ty, grad_output, indices, weights };
    let inputs: Vec<_> = case.tensors().into_iter().map(Some).collect();
    // grad_features adds grad_output x weight per point and neighbour: the kernel on
    // |grad_output| and |weight| (indices as they are) adds the terms' magnitudes.
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect();
    let magnitudes =
        Case { grad_output: abs(&case.grad_output), weights: abs(&case.weights), ..case.clone() };
    let magnitudes: Vec<_> = magnitudes.tensors().into_iter().map(Some).collect();
    let valid = m >= 0 && case.indices.iter().all(|&j| j >= 0 && i64::from(j) < m);
    let result = check(
        "ThreeInterpolateBackward",
        &attrs(&[("m", AttrValue::Int(m))]),
        &inputs,
        Class::Accumulating(&magnitudes),
    );
    if let Some(out) = outcome(result, valid) {
        let got: Vec<f32> =
            widened(&out[0]).expect("float output").iter().map(|&x| x as f32).collect();
        let elem_rel = if ty == Ty::F16 { common::ELEM_REL_F16 } else { common::ELEM_REL };
        judge(&got, &reference(&case), elem_rel, "grad_features against the reference");
    }
});
