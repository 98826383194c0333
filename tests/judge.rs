//! The accumulating judge (`common::judge_accumulating`, which the suites and the fuzz
//! oracle share): its per-element bound rejects single wrong elements that diff1 and diff2
//! alone pass, at network scale.

use onnxruntime_ep_mlu::ops::voxel_pooling::forward::VoxelPoolingForward;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::Threads;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use std::collections::HashMap;
mod common;
use common::{ELEM_REL, ELEM_REL_F16, Rng, assert_rejects_planted, judge_accumulating};

impl Rng {
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// The failure must be the per-element bound's, not diff1's or diff2's.
fn per_element(e: String) {
    assert!(e.contains("|a-b| / (|b| + rms"), "not the per-element bound: {e}");
}

#[test]
fn one_large_element_does_not_hide_ten_zeroed_small_ones() {
    // rms 31.6: ten of 0.01 zeroed give diff1 9.9e-5 and diff2 3.2e-5 (both pass) and a
    // ratio of 0.01 / 31.6 = 3.2e-4 per element.
    let mut want = vec![0.01f64; 1000];
    want[0] = 1000.0;
    let got: Vec<f32> = want.iter().map(|&b| b as f32).collect();
    judge_accumulating(&got, &want, ELEM_REL).expect("the exact result passes");
    let mut bad = got.clone();
    for i in 1..=10 {
        bad[i * 97] = 0.0;
    }
    per_element(judge_accumulating(&bad, &want, ELEM_REL).expect_err("ten zeroed elements"));
}

/// VoxelPoolingForward's output at the seed's grid (2 x 128 x 128 x 80 = 2.6M), from the CPU
/// kernel on 60,000 points per batch (mlu_kernels' reduced network scale).
fn voxel_pooling_output() -> Vec<f32> {
    let grid = [128i64, 128, 1];
    let (b, n, c) = (2, 60_000, 80);
    let op: VoxelPoolingForward =
        descriptor(&HashMap::from([("voxel_num".to_string(), AttrValue::Ints(grid.to_vec()))]))
            .expect("valid attributes");
    let mut rng = Rng(46);
    let geom: Vec<i32> =
        (0..b * n * 3).map(|i| (rng.next() % (grid[i % 3] as u64 + 8)) as i32 - 1).collect();
    let feats: Vec<f32> = (0..b * n * c).map(|_| rng.f32()).collect();
    let (g, f) = (Tensor::i32([b, n, 3], geom), Tensor::f32([b, n, c], feats));
    let out = run(&op, &[Some(&g), Some(&f)], &Threads(2)).expect("the CPU kernel runs");
    out[0].data.f32().expect("float32 output_features").to_vec()
}

#[test]
fn twenty_zeroed_of_a_network_scale_voxel_pooling_output_fail() {
    let got = voxel_pooling_output();
    assert_eq!(got.len(), 2 * 128 * 128 * 80);
    let want: Vec<f64> = got.iter().map(|&x| f64::from(x)).collect();
    let nonzero: Vec<usize> = (0..got.len()).filter(|&i| got[i] != 0.0).collect();
    // A ninth of the points land in the one-cell z range: about 30% of the output is nonzero.
    assert!(nonzero.len() > 500_000, "{} nonzero", nonzero.len());
    let mut bad = got.clone();
    for k in 0..20 {
        bad[nonzero[k * nonzero.len() / 20]] = 0.0;
    }
    per_element(judge_accumulating(&bad, &want, ELEM_REL).expect_err("20 zeroed elements"));
    assert_rejects_planted(&got, &want, ELEM_REL, "VoxelPoolingForward output_features");
}

#[test]
fn non_finite_elements_must_match_in_place_and_kind() {
    let want = [1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 2.0];
    let got = [1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 2.0];
    judge_accumulating(&got, &want, ELEM_REL).expect("the same non-finite places pass");
    for (at, value) in [(1, 0.0), (2, f32::NEG_INFINITY), (3, f32::NAN), (4, f32::NAN)] {
        let mut bad = got;
        bad[at] = value;
        judge_accumulating(&bad, &want, ELEM_REL).expect_err("a non-finite mismatch");
    }
}

#[test]
fn float16_bound_admits_float16_steps_and_rejects_a_1_percent_error() {
    // 1,000 float16 values in [1, 2) (step 2^-10); rms about 1.5.
    let want: Vec<f64> = (0..1000).map(|i| 1.0 + f64::from(i) / 1024.0).collect();
    let mut got: Vec<f32> = want.iter().map(|&b| b as f32).collect();
    got[999] = (want[999] + 2.0 / 1024.0) as f32;
    judge_accumulating(&got, &want, ELEM_REL_F16).expect("two float16 steps pass");
    per_element(judge_accumulating(&got, &want, ELEM_REL).expect_err("not under float32's E"));
    got[999] = (want[999] * 1.01) as f32;
    per_element(judge_accumulating(&got, &want, ELEM_REL_F16).expect_err("1% off"));
}
