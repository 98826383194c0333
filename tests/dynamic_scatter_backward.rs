//! DynamicScatterBackward against the contract (docs/CONTRACT.md §2): a naive reference
//! written here from the contract text, the MLU-OPS golden case, the seed scale, one test per
//! error rule, and property tests over random index tensors. Accuracy class: exact, so every
//! comparison is bit-for-bit.

use onnxruntime_ep_mlu::error::Error;
use onnxruntime_ep_mlu::ops::dynamic_scatter::backward::DynamicScatterBackward;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use proptest::prelude::*;
use std::collections::HashMap;
mod common;
#[path = "reference/dynamic_scatter_backward.rs"]
mod reference;
use common::Rng;
use reference::{Case, reference, violated};

// ---------------------------------------------------------------------------------------
// Test data (the case, its reference and error rules: tests/reference/)
// ---------------------------------------------------------------------------------------

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// A feature value drawn so that ties, signed zeros and NaN are frequent.
fn tie_prone(rng: &mut Rng) -> f32 {
    match rng.below(10) {
        0 => -0.0,
        1 => 0.0,
        2 => f32::NAN,
        3 => f32::INFINITY,
        _ => (rng.below(5) as f32) - 2.0,
    }
}

/// The forward max reduction of mmcv's dynamic_scatter (only for building realistic
/// voxel_feats): per voxel and channel the largest feature of its points. NaN features are
/// skipped unless every feature is NaN.
fn forward_max(feats: &[f32], map: &[i32], m: usize, c: usize, fill: f32) -> Vec<f32> {
    let mut out = vec![f32::NEG_INFINITY; m * c];
    let mut seen = vec![false; m * c];
    for (i, &v) in map.iter().enumerate() {
        if v < 0 || v as usize >= m {
            continue;
        }
        for ch in 0..c {
            let x = feats[i * c + ch];
            let slot = v as usize * c + ch;
            if !seen[slot] || x > out[slot] || out[slot].is_nan() {
                out[slot] = x;
            }
            seen[slot] = true;
        }
    }
    for (o, s) in out.iter_mut().zip(&seen) {
        if !s {
            *o = fill;
        }
    }
    out
}

/// A valid random case. `v` rows are valid, rows >= v hold garbage; `drop` is the chance a
/// point is dropped; `perturb` the chance a voxel feature is replaced by a non-matching value.
fn random_case(
    rng: &mut Rng,
    n: usize,
    m: usize,
    c: usize,
    v: Option<usize>,
    drop: f64,
    perturb: f64,
) -> Case {
    let valid = v.unwrap_or(m);
    let map: Vec<i32> = (0..n)
        .map(|_| if valid == 0 || rng.chance(drop) { -1 } else { rng.below(valid) as i32 })
        .collect();
    let feats: Vec<f32> = (0..n * c).map(|_| tie_prone(rng)).collect();
    let mut voxel_feats = forward_max(&feats, &map, m, c, 7.0);
    for x in voxel_feats.iter_mut() {
        if rng.chance(perturb) {
            *x = tie_prone(rng) + 0.5;
        }
    }
    let mut grad_voxel_feats: Vec<f32> = (0..m * c)
        .map(|_| if rng.chance(0.05) { -0.0 } else { rng.uniform(-100.0, 100.0) })
        .collect();
    let mut count = vec![0i32; m];
    for &p in &map {
        if p >= 0 {
            count[p as usize] += 1;
        }
    }
    // Counts as given need not be the true counts: only their use in `mean` matters.
    for x in count.iter_mut() {
        if *x == 0 {
            *x = rng.below(3) as i32 - 1;
        }
    }
    // Garbage in the rows >= V, which must never be read.
    for row in valid..m {
        count[row] = -5;
        for ch in 0..c {
            grad_voxel_feats[row * c + ch] = f32::NAN;
            voxel_feats[row * c + ch] = f32::from_bits(0x7fc0_dead);
        }
    }
    Case {
        n,
        m,
        c,
        grad_voxel_feats,
        feats,
        voxel_feats,
        map,
        count,
        voxel_num: v.map(|v| v as i32),
    }
}

// ---------------------------------------------------------------------------------------
// Running the operator
// ---------------------------------------------------------------------------------------

fn attrs(reduce: Option<&str>) -> HashMap<String, AttrValue> {
    let mut a = HashMap::new();
    if let Some(r) = reduce {
        a.insert("reduce_type".to_string(), AttrValue::String(r.to_string()));
    }
    a
}

fn op(reduce: &str) -> DynamicScatterBackward {
    descriptor::<DynamicScatterBackward>(&attrs(Some(reduce))).expect("valid reduce_type")
}

fn run_tensors(reduce: &str, tensors: &[Tensor], par: &dyn Parallel) -> Result<Tensor, Error> {
    let inputs: Vec<Option<&Tensor>> = tensors.iter().map(Some).collect();
    let mut out = run(&op(reduce), &inputs, par)?;
    assert_eq!(out.len(), 1, "one output");
    Ok(out.remove(0))
}

fn run_case(case: &Case, reduce: &str, par: &dyn Parallel) -> Result<Vec<f32>, Error> {
    let out = run_tensors(reduce, &case.tensors(), par)?;
    assert_eq!(out.shape, vec![case.n, case.c], "grad_feats shape");
    Ok(out.data.f32().expect("float32 output").to_vec())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Bit-exact comparison with a readable first difference.
fn assert_exact(got: &[f32], want: &[f32], c: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(k) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!(
            "{what}: grad_feats[{}, {}] = {:?}, expected {:?}",
            k / c.max(1),
            k % c.max(1),
            got[k],
            want[k]
        );
    }
}

fn check_against_reference(case: &Case, reduce: &str) {
    assert!(violated(case, reduce).is_empty(), "test case must be valid");
    let want = reference(case, reduce);
    for par in [&Threads(2) as &dyn Parallel, &Serial] {
        let got = run_case(case, reduce, par).expect("valid case runs");
        assert_exact(
            &got,
            &want,
            case.c,
            &format!("{reduce} n={} m={} c={}", case.n, case.m, case.c),
        );
    }
}

fn expect_error(case: &Case, reduce: &str, tensor: &str) -> String {
    let err = run_case(case, reduce, &Threads(2)).expect_err("contract says error");
    let msg = err.to_string();
    assert_eq!(err.code(), ort_sys::OrtErrorCode::ORT_INVALID_ARGUMENT, "{msg}");
    assert!(msg.contains(&format!("'{tensor}'")), "message should name {tensor}: {msg}");
    msg
}

// ---------------------------------------------------------------------------------------
// Golden case and seed scale
// ---------------------------------------------------------------------------------------

fn json_f32(v: &serde_json::Value) -> Vec<f32> {
    v["data"]
        .as_array()
        .expect("data array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn json_i32(v: &serde_json::Value) -> Vec<i32> {
    v["data"]
        .as_array()
        .expect("data array")
        .iter()
        .map(|x| x.as_i64().expect("integer") as i32)
        .collect()
}

fn json_shape(v: &serde_json::Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|x| x.as_u64().expect("dim") as usize)
        .collect()
}

#[test]
fn golden_mluops_case_1_bit_exact() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/mluops/dynamic_scatter_backward_case_1.json"
    );
    let text = std::fs::read_to_string(path).expect("golden file");
    let g: serde_json::Value = serde_json::from_str(&text).expect("json");
    let reduce = g["attributes"]["reduce_type"].as_str().expect("reduce_type");
    let i = &g["inputs"];
    let [m, c] = json_shape(&i["grad_voxel_feats"])[..] else { panic!("rank") };
    let n = json_shape(&i["feats"])[0];
    let case = Case {
        n,
        m,
        c,
        grad_voxel_feats: json_f32(&i["grad_voxel_feats"]),
        feats: json_f32(&i["feats"]),
        voxel_feats: json_f32(&i["voxel_feats"]),
        map: json_i32(&i["point2voxel_map"]),
        count: json_i32(&i["voxel_points_count"]),
        voxel_num: Some(json_i32(&i["voxel_num"])[0]),
    };
    let want = json_f32(&g["outputs"]["grad_feats"]);
    assert_eq!(json_shape(&g["outputs"]["grad_feats"]), vec![n, c]);
    let got = run_case(&case, reduce, &Threads(2)).expect("golden case runs");
    assert_exact(&got, &want, c, "golden case_1");
    // Rows >= voxel_num are ignored: garbage there changes nothing.
    let mut garbage = case.clone();
    let v = garbage.voxel_num.unwrap_or(0) as usize;
    for x in &mut garbage.grad_voxel_feats[v * c..] {
        *x = f32::NAN;
    }
    for x in &mut garbage.voxel_feats[v * c..] {
        *x = 1e30;
    }
    let got = run_case(&garbage, reduce, &Serial).expect("golden case with garbage rows runs");
    assert_exact(&got, &want, c, "golden case_1 with garbage rows >= V");
}

/// Seed network scale: N 17176, M 13743, C 128, max. Every voxel holds at least one point
/// (voxels are the occupied cells of the forward pass), a few points are dropped, features
/// are ReLU-like (many exact zeros, hence many ties), voxel_feats is the forward max.
#[test]
fn seed_scale_max() {
    let (n, m, c) = (17176, 13743, 128);
    let mut rng = Rng(0x5eed);
    let mut map = vec![-1i32; n];
    let mut points: Vec<usize> = (0..n).collect();
    for k in (1..n).rev() {
        points.swap(k, rng.below(k + 1));
    }
    for (k, &p) in points.iter().enumerate() {
        map[p] = if k < m {
            k as i32
        } else if rng.chance(0.2) {
            -1
        } else {
            rng.below(m) as i32
        };
    }
    let feats: Vec<f32> = (0..n * c).map(|_| rng.uniform(-1.0, 1.0).max(0.0)).collect();
    let voxel_feats = forward_max(&feats, &map, m, c, 0.0);
    let mut count = vec![0i32; m];
    for &p in &map {
        if p >= 0 {
            count[p as usize] += 1;
        }
    }
    let grad_voxel_feats: Vec<f32> = (0..m * c).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let case = Case { n, m, c, grad_voxel_feats, feats, voxel_feats, map, count, voxel_num: None };
    let want = reference(&case, "max");
    let got = run_case(&case, "max", &Threads(2)).expect("seed case runs");
    assert_exact(&got, &want, c, "seed scale max");
    // Every (voxel, channel) found its point: the gradient is conserved exactly.
    let nonzero = got.iter().filter(|x| **x != 0.0).count();
    let expected_nonzero = case.grad_voxel_feats.iter().filter(|x| **x != 0.0).count();
    assert_eq!(nonzero, expected_nonzero);
    for reduce in ["sum", "mean"] {
        let got = run_case(&case, reduce, &Threads(2)).expect("seed case runs");
        assert_exact(&got, &reference(&case, reduce), c, reduce);
    }
}

// ---------------------------------------------------------------------------------------
// Semantics
// ---------------------------------------------------------------------------------------

#[test]
fn random_shapes_every_reduce_mode() {
    let mut rng = Rng(1);
    let shapes: &[(usize, usize, usize)] = &[
        (0, 0, 0),
        (0, 5, 3),
        (5, 0, 3),
        (5, 4, 0),
        (0, 0, 7),
        (1, 1, 1),
        (7, 3, 5),
        (64, 16, 63),
        (64, 16, 64),
        (65, 20, 65),
        (300, 40, 130),
        (2000, 700, 33),
        (3000, 25, 70),
    ];
    for &(n, m, c) in shapes {
        for reduce in ["max", "mean", "sum"] {
            for v in [None, Some(m), Some(m / 2), Some(0)] {
                let mut case = random_case(&mut rng, n, m, c, v, 0.1, 0.05);
                if reduce == "mean" {
                    // Mean needs a positive count on every voxel a point maps to.
                    for x in case.count.iter_mut().take(v.unwrap_or(m)) {
                        if *x <= 0 {
                            *x = 1 + rng.below(4) as i32;
                        }
                    }
                }
                check_against_reference(&case, reduce);
            }
        }
    }
}

/// Outputs of 4 MiB or more are written with streaming stores (`cache::STREAM_MIN_BYTES`).
/// With C = 33 the output rows alternate between 16-byte aligned (streamed) and unaligned
/// (plain stores): every mode must still give the reference's bits, dropped points and
/// garbage rows >= V included.
#[test]
fn streamed_output_with_odd_channels() {
    let mut rng = Rng(33);
    let (n, m, c) = (40_000, 20_000, 33);
    assert!(
        n * c * 4 >= onnxruntime_ep_mlu::cache::STREAM_MIN_BYTES,
        "the case must take the streaming path"
    );
    for reduce in ["max", "mean", "sum"] {
        let mut case = random_case(&mut rng, n, m, c, Some(m - 7), 0.05, 0.05);
        if reduce == "mean" {
            for x in case.count.iter_mut().take(m - 7) {
                *x = (*x).max(1);
            }
        }
        check_against_reference(&case, reduce);
    }
}

#[test]
fn default_reduce_type_is_max() {
    let op = descriptor::<DynamicScatterBackward>(&attrs(None)).expect("default");
    assert_eq!(
        op,
        DynamicScatterBackward { reduce: onnxruntime_ep_mlu::ops::dynamic_scatter::Reduce::Max }
    );
}

#[test]
fn max_ties_lowest_index_wins() {
    // Points 1, 3 and 4 of voxel 0 all equal the max in channel 0; points 3 and 4 in
    // channel 1; the point order in the map is not the CSR order.
    let case = Case {
        n: 5,
        m: 2,
        c: 2,
        grad_voxel_feats: vec![10.0, 20.0, 30.0, 40.0],
        feats: vec![
            1.0, 1.0, // point 0 -> voxel 1
            5.0, 2.0, // point 1 -> voxel 0
            1.0, 1.0, // point 2 -> voxel 1
            5.0, 7.0, // point 3 -> voxel 0
            5.0, 7.0, // point 4 -> voxel 0
        ],
        voxel_feats: vec![5.0, 7.0, 1.0, 1.0],
        map: vec![1, 0, 1, 0, 0],
        count: vec![3, 2],
        voxel_num: None,
    };
    let got = run_case(&case, "max", &Threads(2)).expect("runs");
    assert_eq!(got, vec![30.0, 40.0, 10.0, 0.0, 0.0, 0.0, 0.0, 20.0, 0.0, 0.0]);
    check_against_reference(&case, "max");
}

#[test]
fn max_many_points_per_voxel_ties_across_tasks() {
    // Few voxels with hundreds of points each, so voxels span parallel pieces and ties are
    // everywhere (features in a 5-value set).
    let mut rng = Rng(7);
    for &(n, m, c) in &[(5000, 3, 70), (4000, 1, 128), (20000, 40, 9)] {
        let case = random_case(&mut rng, n, m, c, None, 0.05, 0.0);
        check_against_reference(&case, "max");
    }
}

#[test]
fn max_nan_voxels_drop_their_gradient() {
    let case = Case {
        n: 3,
        m: 2,
        c: 2,
        grad_voxel_feats: vec![1.0, 2.0, 3.0, 4.0],
        feats: vec![f32::NAN, 1.0, f32::NAN, 1.0, f32::NAN, f32::NAN],
        voxel_feats: vec![f32::NAN, 1.0, f32::NAN, f32::NAN],
        map: vec![0, 0, 1],
        count: vec![2, 1],
        voxel_num: None,
    };
    let got = run_case(&case, "max", &Threads(2)).expect("runs");
    assert_eq!(got, vec![0.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
    check_against_reference(&case, "max");
}

#[test]
fn max_signed_zeros_are_equal() {
    // -0 == +0 under IEEE equality, in either direction; a -0 gradient is copied as is.
    let case = Case {
        n: 3,
        m: 1,
        c: 3,
        grad_voxel_feats: vec![-0.0, 5.0, 6.0],
        feats: vec![-0.0, 0.0, -1.0, 0.0, -0.0, -0.0, 9.0, 9.0, 9.0],
        voxel_feats: vec![0.0, -0.0, 0.0],
        map: vec![0, 0, -1],
        count: vec![2],
        voxel_num: None,
    };
    let got = run_case(&case, "max", &Threads(2)).expect("runs");
    assert_eq!(bits(&got), bits(&[-0.0, 5.0, 0.0, 0.0, 0.0, 6.0, 0.0, 0.0, 0.0]));
    check_against_reference(&case, "max");
}

#[test]
fn dropped_points_get_zero() {
    let mut rng = Rng(3);
    for reduce in ["max", "mean", "sum"] {
        let mut case = random_case(&mut rng, 50, 6, 5, None, 0.5, 0.0);
        for x in case.count.iter_mut() {
            *x = (*x).max(1);
        }
        let got = run_case(&case, reduce, &Threads(2)).expect("runs");
        for (i, &p) in case.map.iter().enumerate() {
            if p == -1 {
                assert!(
                    got[i * 5..(i + 1) * 5].iter().all(|x| x.to_bits() == 0),
                    "{reduce}: row {i}"
                );
            }
        }
        check_against_reference(&case, reduce);
    }
}

#[test]
fn voxel_num_below_m_ignores_garbage_rows() {
    let mut rng = Rng(11);
    for reduce in ["max", "mean", "sum"] {
        // random_case writes NaN gradients and counts of -5 into rows >= V.
        let mut case = random_case(&mut rng, 200, 30, 17, Some(12), 0.1, 0.1);
        for x in case.count.iter_mut().take(12) {
            *x = (*x).max(2);
        }
        check_against_reference(&case, reduce);
        let got = run_case(&case, reduce, &Serial).expect("runs");
        assert!(got.iter().all(|x| !x.is_nan()), "{reduce}: a row >= V was read");
    }
}

#[test]
fn mean_divides_in_float32_by_the_given_count() {
    let case = Case {
        n: 2,
        m: 2,
        c: 2,
        grad_voxel_feats: vec![1.0, 10.0, 7.0, -0.0],
        feats: vec![0.0; 4],
        voxel_feats: vec![0.0; 4],
        map: vec![0, 1],
        count: vec![3, 16_777_217],
        voxel_num: None,
    };
    let got = run_case(&case, "mean", &Serial).expect("runs");
    let want = [1.0f32 / 3.0, 10.0f32 / 3.0, 7.0f32 / 16_777_216.0, -0.0f32 / 16_777_216.0];
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn sum_ignores_counts() {
    let mut rng = Rng(5);
    let mut case = random_case(&mut rng, 40, 5, 4, None, 0.1, 0.0);
    case.count = vec![0, -3, 0, -1, 0];
    check_against_reference(&case, "sum");
    check_against_reference(&case, "max");
}

#[test]
fn mean_zero_count_on_an_unused_voxel_is_fine() {
    let case = Case {
        n: 2,
        m: 3,
        c: 1,
        grad_voxel_feats: vec![4.0, 9.0, 8.0],
        feats: vec![0.0; 2],
        voxel_feats: vec![0.0; 3],
        map: vec![0, 2],
        count: vec![2, 0, 4],
        voxel_num: None,
    };
    check_against_reference(&case, "mean");
}

#[test]
fn result_does_not_depend_on_thread_count() {
    let mut rng = Rng(21);
    let case = random_case(&mut rng, 6000, 900, 77, Some(800), 0.1, 0.1);
    let base = run_case(&case, "max", &Serial).expect("runs");
    for t in [1, 2, 3, 8] {
        let got = run_case(&case, "max", &Threads(t)).expect("runs");
        assert_eq!(bits(&got), bits(&base), "threads {t}");
    }
}

// ---------------------------------------------------------------------------------------
// Errors: one test per rule of the contract
// ---------------------------------------------------------------------------------------

fn small_valid() -> Case {
    let mut rng = Rng(99);
    let mut case = random_case(&mut rng, 6, 4, 3, None, 0.0, 0.0);
    case.count = vec![1, 2, 1, 1];
    case
}

#[test]
fn error_map_below_minus_one() {
    let mut case = small_valid();
    case.map[4] = -2;
    let msg = expect_error(&case, "max", "point2voxel_map");
    assert!(msg.contains("[4]") && msg.contains("-2"), "{msg}");
    case.map[4] = i32::MIN;
    expect_error(&case, "sum", "point2voxel_map");
}

#[test]
fn error_map_not_below_voxel_num() {
    let mut case = small_valid();
    case.map[2] = 4; // == M, default V = M
    let msg = expect_error(&case, "max", "point2voxel_map");
    assert!(msg.contains("[2]"), "{msg}");
    case.map[2] = i32::MAX;
    expect_error(&case, "sum", "point2voxel_map");
    // With voxel_num = 2, the existing rows 2 and 3 are out of range too.
    let mut case = small_valid();
    case.voxel_num = Some(2);
    case.map = vec![0, 1, 2, -1, 0, 1];
    let msg = expect_error(&case, "mean", "point2voxel_map");
    assert!(msg.contains("[2]"), "{msg}");
}

#[test]
fn error_mean_count_not_positive() {
    for bad in [0, -1, i32::MIN] {
        let mut case = small_valid();
        case.map = vec![0, 1, 1, -1, 3, 3];
        case.count[3] = bad;
        let msg = expect_error(&case, "mean", "voxel_points_count");
        assert!(msg.contains("[3]"), "{msg}");
        // The same counts are fine for max and sum.
        check_against_reference(&case, "max");
        check_against_reference(&case, "sum");
    }
}

#[test]
fn error_voxel_num_outside_zero_to_m() {
    for bad in [-1, 5, i32::MIN, i32::MAX] {
        let mut case = small_valid();
        case.map = vec![-1; 6];
        case.voxel_num = Some(bad);
        expect_error(&case, "max", "voxel_num");
    }
    // The bounds themselves are fine.
    for ok in [0, 4] {
        let mut case = small_valid();
        case.map = vec![-1; 6];
        case.voxel_num = Some(ok);
        check_against_reference(&case, "max");
    }
}

#[test]
fn error_shape_mismatch() {
    let case = small_valid();
    let base = case.tensors();
    let mut cases: Vec<(usize, Tensor, &str)> = vec![
        (0, Tensor::f32([4, 3, 1], case.grad_voxel_feats.clone()), "grad_voxel_feats"),
        (0, Tensor::f32([12], case.grad_voxel_feats.clone()), "grad_voxel_feats"),
        (1, Tensor::f32([9, 2], vec![0.0; 18]), "feats"),
        (1, Tensor::f32([18], vec![0.0; 18]), "feats"),
        (2, Tensor::f32([3, 3], vec![0.0; 9]), "voxel_feats"),
        (2, Tensor::f32([4, 4], vec![0.0; 16]), "voxel_feats"),
        (3, Tensor::i32([5], vec![0; 5]), "point2voxel_map"),
        (3, Tensor::i32([6, 1], vec![0; 6]), "point2voxel_map"),
        (4, Tensor::i32([5], vec![1; 5]), "voxel_points_count"),
        (4, Tensor::i32([0usize; 0], vec![1]), "voxel_points_count"),
    ];
    cases.push((5, Tensor::i32([2], vec![1, 1]), "voxel_num"));
    cases.push((5, Tensor::i32([0usize; 0], vec![1]), "voxel_num"));
    cases.push((5, Tensor::i32([1, 1], vec![1]), "voxel_num"));
    cases.push((5, Tensor::i32([0], vec![]), "voxel_num"));
    for (slot, bad, name) in cases {
        let mut t = base.clone();
        if slot == t.len() {
            t.push(bad);
        } else {
            t[slot] = bad;
        }
        for reduce in ["max", "mean", "sum"] {
            let err = run_tensors(reduce, &t, &Threads(2)).expect_err("shape mismatch");
            assert!(err.to_string().contains(&format!("'{name}'")), "{reduce}: {err}");
        }
    }
}

#[test]
fn error_dtype_mismatch() {
    let case = small_valid();
    let base = case.tensors();
    let bad: Vec<(usize, Tensor, &str)> = vec![
        (0, Tensor::i32([4, 3], vec![0; 12]), "grad_voxel_feats"),
        (0, Tensor::f16([4, 3], vec![half::f16::ZERO; 12]), "grad_voxel_feats"),
        (1, Tensor::i32([6, 3], vec![0; 18]), "feats"),
        (2, Tensor::f16([4, 3], vec![half::f16::ZERO; 12]), "voxel_feats"),
        (3, Tensor::f32([6], vec![0.0; 6]), "point2voxel_map"),
        (3, Tensor::i64([6], vec![0; 6]), "point2voxel_map"),
        (4, Tensor::f32([4], vec![1.0; 4]), "voxel_points_count"),
        (5, Tensor::i64([1], vec![4]), "voxel_num"),
        (5, Tensor::f32([1], vec![4.0]), "voxel_num"),
    ];
    for (slot, t, name) in bad {
        let mut ts = base.clone();
        if slot == ts.len() {
            ts.push(t);
        } else {
            ts[slot] = t;
        }
        let err = run_tensors("max", &ts, &Threads(2)).expect_err("dtype mismatch");
        assert!(err.to_string().contains(&format!("'{name}'")), "{err}");
    }
}

#[test]
fn error_missing_required_input() {
    let case = small_valid();
    let t = case.tensors();
    let inputs: Vec<Option<&Tensor>> =
        vec![Some(&t[0]), Some(&t[1]), None, Some(&t[3]), Some(&t[4])];
    let err = run(&op("max"), &inputs, &Serial).expect_err("missing voxel_feats");
    assert!(err.to_string().contains("'voxel_feats'"), "{err}");
}

#[test]
fn error_reduce_type_unknown() {
    for bad in ["min", "MAX", "", "mean "] {
        let err = descriptor::<DynamicScatterBackward>(&attrs(Some(bad)))
            .expect_err("unknown reduce_type");
        assert!(matches!(err, Error::Attribute { .. }), "{err}");
        assert!(err.to_string().contains("'reduce_type'"), "{err}");
    }
    let mut a = HashMap::new();
    a.insert("reduce_type".to_string(), AttrValue::Int(0));
    let err = descriptor::<DynamicScatterBackward>(&a).expect_err("wrong attribute type");
    assert!(err.to_string().contains("'reduce_type'"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------

fn feature_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => (-2i32..3).prop_map(|x| x as f32),
        1 => Just(-0.0f32),
        1 => Just(f32::NAN),
        1 => any::<f32>(),
    ]
}

/// Random cases: map values mostly valid, sometimes anywhere in -3..M+3; random voxel_num
/// (sometimes out of range); random counts in -1..4; voxel_feats either the forward max
/// (many matches) or random values.
fn any_case() -> impl Strategy<Value = (Case, &'static str)> {
    let sizes = (0usize..12, 0usize..7, prop_oneof![3 => 0usize..5, 1 => 60usize..70]);
    let reduce = prop_oneof![Just("max"), Just("mean"), Just("sum")];
    (sizes, reduce)
        .prop_flat_map(|((n, m, c), reduce)| {
            let mi = m as i32;
            let map_value = prop_oneof![6 => -1i32..mi.max(0), 1 => -3i32..mi + 3];
            let voxel_num =
                prop_oneof![2 => Just(None), 2 => (0..=mi).prop_map(Some), 1 => (-2..mi + 3).prop_map(Some)];
            (
                Just((n, m, c, reduce)),
                prop::collection::vec(map_value, n),
                prop::collection::vec(-1i32..4, m),
                voxel_num,
                prop::collection::vec(feature_value(), n * c),
                prop::collection::vec(feature_value(), m * c),
                prop::collection::vec(feature_value(), m * c),
                any::<bool>(),
            )
        })
        .prop_map(|((n, m, c, reduce), map, count, voxel_num, feats, grad_voxel_feats, random_vf, use_forward)| {
            let voxel_feats = if use_forward { forward_max(&feats, &map, m, c, 1.5) } else { random_vf };
            (Case { n, m, c, grad_voxel_feats, feats, voxel_feats, map, count, voxel_num }, reduce)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn prop_matches_contract((case, reduce) in any_case()) {
        let expected = violated(&case, reduce);
        let result = run_case(&case, reduce, &Threads(2));
        match result {
            Ok(got) => {
                prop_assert!(expected.is_empty(), "accepted a case violating {:?}", expected);
                let want = reference(&case, reduce);
                prop_assert_eq!(bits(&got), bits(&want));
            }
            Err(err) => {
                prop_assert!(!expected.is_empty(), "rejected a valid case: {}", err);
                let msg = err.to_string();
                prop_assert!(
                    expected.iter().any(|name| msg.contains(&format!("'{name}'"))),
                    "message {} names none of {:?}", msg, expected
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Timing (release): cargo test --release --test dynamic_scatter_backward -- --ignored --nocapture
// ---------------------------------------------------------------------------------------
