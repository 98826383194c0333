//! Fuzzing the index inputs (proptest): random sites and indices, some out of range, on
//! the card and on the CPU, which must agree (the same outputs or the same error).

use super::*;
use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;
use onnxruntime_ep_mlu::ops::three_interpolate::backward::ThreeInterpolateBackward;
use proptest::prelude::*;

/// CPU and MLU agree: the same outputs, or the same error.
fn agree<O: BangOperator + Clone>(op: &O, inputs: &[Option<&Tensor>], exact: bool) {
    let cpu = run(op, inputs, &Threads(2));
    let mlu = run_on_device(&device(), op, inputs);
    match (cpu, mlu) {
        (Ok(c), Ok(m)) => {
            for (a, b) in c.iter().zip(&m) {
                assert_eq!(a.shape, b.shape);
                if exact { assert_exact(a, b, "fuzz") } else { assert_close(a, b, "fuzz") }
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (c, m) => panic!("CPU {:?} vs MLU {:?}", c.err(), m.err()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn get_indice_pairs_random_sites(
        seed in any::<u64>(), l in 0usize..60, k in 1i64..4, s in 1i64..3, subm in any::<bool>(), spill in 0u64..3,
    ) {
        let spatial = [4i64, 5, 6];
        let p = if subm { (k - 1) / 2 } else { 1 };
        let k = if subm { 2 * p + 1 } else { k };
        let s = if subm { 1 } else { s };
        let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
        let op: GetIndicePairs = descriptor(&HashMap::from([
            ("batch_size".to_string(), AttrValue::Int(2)),
            ("spatial_shape".to_string(), ints(&spatial)),
            ("kernel_size".to_string(), ints(&[k; 3])),
            ("stride".to_string(), ints(&[s; 3])),
            ("padding".to_string(), ints(&[p; 3])),
            ("subm".to_string(), AttrValue::Int(subm as i64)),
        ])).unwrap();
        let mut rng = Rng(seed);
        // Coordinates sometimes one past the shape or negative; duplicates happen.
        let lim = [2i64, 4, 5, 6];
        let rows: Vec<i32> = (0..l * 4)
            .map(|i| rng.int(-(spill as i64 / 2), lim[i % 4] - 1 + (spill == 2) as i64) as i32)
            .collect();
        agree(&op, &[Some(&Tensor::i32([l, 4], rows))], true);
    }

    #[test]
    fn three_interpolate_backward_random_indices(seed in any::<u64>(), n in 0usize..40, m in 0usize..20, bad in any::<bool>()) {
        let op: ThreeInterpolateBackward = descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(m as i64))])).unwrap();
        let mut rng = Rng(seed);
        let hi = m as i64 - 1 + bad as i64;
        let idx: Vec<i32> = (0..2 * n * 3).map(|_| rng.int(-(bad as i64), hi.max(0)) as i32).collect();
        let go = Tensor::f32([2, 3, n], rng.f32s(6 * n));
        let w = Tensor::f32([2, n, 3], rng.f32s(6 * n));
        agree(&op, &[Some(&go), Some(&Tensor::i32([2, n, 3], idx)), Some(&w)], false);
    }
}
