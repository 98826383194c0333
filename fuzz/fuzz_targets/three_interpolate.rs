//! ThreeInterpolate: shapes, dtype, indices (some outside [0, m)) and values from the
//! fuzzer's bytes; every path against the CPU kernel, the CPU kernel bit for bit against the
//! suite's float32 evaluation of the contract (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, attrs, bits, check, outcome};

#[path = "../../tests/reference/three_interpolate.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Case, Ty, reference_bits, representable};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let ty = if u.one_in(3) { Ty::F16 } else { Ty::F32 };
    let (b, c, m, n) = (u.below(3), u.below(6), u.below(12), u.below(9));
    let features = u.floats(b * c * m).into_iter().map(|x| representable(ty, x)).collect();
    let mut indices: Vec<i32> = (0..b * n * 3).map(|_| u.below(m) as i32).collect();
    if u.one_in(4) && !indices.is_empty() {
        let at = u.below(indices.len());
        indices[at] = if u.one_in(2) { -1 } else { m as i32 };
    }
    let weights = u.floats(b * n * 3).into_iter().map(|x| representable(ty, x)).collect();
    let case = Case { b, c, m, n, ty, features, indices, weights };
    let inputs: Vec<_> = case.tensors().into_iter().map(Some).collect();
    let valid = !case.index_error();
    if let Some(out) = outcome(check("ThreeInterpolate", &attrs(&[]), &inputs, Class::Exact), valid)
    {
        let nan = |x: u32| match ty {
            Ty::F32 => f32::from_bits(x).is_nan(),
            Ty::F16 => half::f16::from_bits(x as u16).is_nan(),
        };
        let want: Vec<u64> = reference_bits(&case)
            .into_iter()
            .map(|x| if nan(x) { 1 << 32 } else { u64::from(x) })
            .collect();
        assert_eq!(bits(&out[0]), want, "output against the contract's float32 evaluation");
    }
});
