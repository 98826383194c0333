//! DynamicScatter (mmcv dynamic_point_to_voxel forward) against its contract, the `doc` of
//! schemas/dynamic_scatter/dynamic_scatter.json, through the Rust API.
//!
//! The reference below is written from the contract text alone (a BTreeMap of coordinate
//! rows, serial loops); it shares no code with the kernel. Index outputs and `max` are exact;
//! `sum` and `mean` are accumulating (checked against a float64 reference) and, since the
//! contract fixes the order ("float32 sum of the points' rows in ascending point order",
//! "divided in float32 by the count"), also compared with a float32 sum in that order.
//! Every result must be bit-identical across runs and thread counts.

use onnxruntime_ep_mlu::ops::dynamic_scatter::DynamicScatter;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use proptest::prelude::*;
use std::collections::HashMap;
mod common;
#[path = "reference/dynamic_scatter.rs"]
mod reference;
use common::{Rng, assert_accumulating, canon};
use reference::{Case, reference};

// ---------------------------------------------------------------- helpers

const REDUCES: [&str; 3] = ["max", "mean", "sum"];

fn attrs(reduce: &str) -> HashMap<String, AttrValue> {
    HashMap::from([("reduce_type".to_string(), AttrValue::String(reduce.to_string()))])
}

fn op(reduce: &str) -> DynamicScatter {
    descriptor(&attrs(reduce)).expect("valid reduce_type")
}

/// The five outputs.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    voxel_feats: Vec<f32>,
    voxel_coors: Vec<i32>,
    map: Vec<i32>,
    count: Vec<i32>,
    voxel_num: Vec<i32>,
    shapes: Vec<Vec<usize>>,
}

impl Case {
    fn run(&self, op: &DynamicScatter, par: &dyn Parallel) -> Out {
        let (f, c) = self.tensors();
        let out = run(op, &[Some(&f), Some(&c)], par).expect("valid case runs");
        assert_eq!(out.len(), 5, "five outputs");
        Out {
            voxel_feats: out[0].data.f32().expect("voxel_feats is float32").to_vec(),
            voxel_coors: out[1].data.i32().expect("voxel_coors is int32").to_vec(),
            map: out[2].data.i32().expect("point2voxel_map is int32").to_vec(),
            count: out[3].data.i32().expect("voxel_points_count is int32").to_vec(),
            voxel_num: out[4].data.i32().expect("voxel_num is int32").to_vec(),
            shapes: out.iter().map(|t| t.shape.clone()).collect(),
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The float64 reference, except where the contract's float32 sum overflows (or meets
/// inf - inf): there the float32 result is what the contract prescribes.
fn accumulating_reference(r64: &[f64], r32: &[f32]) -> Vec<f64> {
    r64.iter().zip(r32).map(|(&w, &v)| if v.is_finite() { w } else { v as f64 }).collect()
}

/// Checks one run against the reference, and the contract's structural properties.
fn check(case: &Case, reduce: &str, par: &dyn Parallel) -> Out {
    check_with(case, reduce, par, true)
}

/// `accumulating`: also apply the accumulating metric (not meaningful for inputs built to
/// cancel catastrophically in float32).
fn check_with(case: &Case, reduce: &str, par: &dyn Parallel, accumulating: bool) -> Out {
    let out = case.run(&op(reduce), par);
    let r = reference(case);
    let (n, c, d, m) = (case.n, case.c, case.d, r.m);
    assert_eq!(
        out.shapes,
        vec![vec![m, c], vec![m, d], vec![n], vec![m], vec![1]],
        "output shapes"
    );
    assert_eq!(out.voxel_num, vec![m as i32], "voxel_num = [M]");
    assert_eq!(out.voxel_coors, r.voxel_coors, "voxel_coors exact");
    assert_eq!(out.map, r.map, "point2voxel_map exact");
    assert_eq!(out.count, r.count, "voxel_points_count exact");
    // Properties the contract states, checked on the output itself.
    for w in out.voxel_coors.chunks(d.max(1)).collect::<Vec<_>>().windows(2) {
        assert!(w[0] < w[1], "voxel_coors strictly ascending: {:?} then {:?}", w[0], w[1]);
    }
    let mut counted = vec![0i32; m];
    for (i, &v) in out.map.iter().enumerate() {
        let row = &case.coors[i * d..(i + 1) * d];
        if v < 0 {
            assert_eq!(v, -1, "point {i}");
            assert!(row.iter().any(|&x| x < 0), "point {i} {row:?} kept but mapped to -1");
        } else {
            counted[v as usize] += 1;
            assert_eq!(
                &out.voxel_coors[v as usize * d..(v as usize + 1) * d],
                row,
                "point {i}: its voxel's row"
            );
        }
    }
    assert_eq!(counted, out.count, "counts match the map");
    assert!(out.count.iter().all(|&k| k >= 1), "every voxel has >= 1 point");
    match reduce {
        "max" => assert_eq!(canon(&out.voxel_feats), canon(&r.max), "max exact"),
        "sum" => {
            if accumulating {
                assert_accumulating(
                    &out.voxel_feats,
                    &accumulating_reference(&r.sum64, &r.sum32),
                    "sum",
                );
            }
            assert_eq!(
                canon(&out.voxel_feats),
                canon(&r.sum32),
                "sum: float32 in ascending point order"
            );
        }
        "mean" => {
            if accumulating {
                assert_accumulating(
                    &out.voxel_feats,
                    &accumulating_reference(&r.mean64, &r.mean32),
                    "mean",
                );
            }
            assert_eq!(canon(&out.voxel_feats), canon(&r.mean32), "mean: float32 sum / count");
        }
        _ => unreachable!(),
    }
    out
}

impl Rng {
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo) as u64) as i64
    }
    fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random points: coordinates in [-1, extent) so voxels repeat, with about 1 in `drop_one_in`
/// points dropped by a negative coordinate.
fn random_case(rng: &mut Rng, n: usize, c: usize, d: usize, extent: i64) -> Case {
    let mut coors = Vec::with_capacity(n * d);
    for _ in 0..n {
        let drop = rng.int(0, 10) == 0;
        let neg_at = rng.int(0, d.max(1) as i64) as usize;
        for k in 0..d {
            let v = if drop && k == neg_at { -rng.int(1, 1000) } else { rng.int(0, extent) };
            coors.push(v as i32);
        }
    }
    let feats = (0..n * c).map(|_| rng.float() * 10.0).collect();
    Case { n, c, d, feats, coors }
}

fn err_text(reduce: &str, feats: Tensor, coors: Tensor) -> String {
    let op: DynamicScatter = match descriptor(&attrs(reduce)) {
        Ok(op) => op,
        Err(e) => return format!("{e}"),
    };
    match run(&op, &[Some(&feats), Some(&coors)], &Serial) {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e}"),
    }
}

fn small_inputs() -> (Tensor, Tensor) {
    (
        Tensor::f32([3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        Tensor::i32([3, 3], vec![0, 0, 1, 0, 0, 1, 1, 0, 0]),
    )
}

// ---------------------------------------------------------------- semantics

#[test]
fn hand_computed_example() {
    // Points: 0 -> (1,0,0), 1 -> (0,2,1), 2 -> dropped, 3 -> (1,0,0), 4 -> (0,0,5).
    // Sorted voxels: (0,0,5), (0,2,1), (1,0,0).
    let case = Case {
        n: 5,
        c: 2,
        d: 3,
        feats: vec![1.0, -2.0, 4.0, 4.0, 100.0, 100.0, 3.0, -8.0, 0.5, 0.25],
        coors: vec![1, 0, 0, 0, 2, 1, 0, -1, 0, 1, 0, 0, 0, 0, 5],
    };
    for reduce in REDUCES {
        let out = check(&case, reduce, &Serial);
        assert_eq!(out.voxel_coors, vec![0, 0, 5, 0, 2, 1, 1, 0, 0]);
        assert_eq!(out.map, vec![2, 1, -1, 2, 0]);
        assert_eq!(out.count, vec![1, 1, 2]);
        assert_eq!(out.voxel_num, vec![3]);
        let want = match reduce {
            "max" => vec![0.5, 0.25, 4.0, 4.0, 3.0, -2.0],
            "sum" => vec![0.5, 0.25, 4.0, 4.0, 4.0, -10.0],
            _ => vec![0.5, 0.25, 4.0, 4.0, 2.0, -5.0],
        };
        assert_eq!(out.voxel_feats, want, "{reduce}");
    }
}

#[test]
fn default_reduce_type_is_max() {
    let op: DynamicScatter = descriptor(&HashMap::new()).expect("reduce_type is optional");
    let case = random_case(&mut Rng(1), 100, 3, 3, 3);
    let got = case.run(&op, &Serial);
    assert_eq!(got, case.run(&self::op("max"), &Serial));
    assert_eq!(canon(&got.voxel_feats), canon(&reference(&case).max));
}

#[test]
fn random_cases_all_reductions() {
    let mut rng = Rng(42);
    // (N, C, D, extent): sizes with and without collisions, D = 1, 2, 3, 4, 5.
    let shapes = [
        (1, 1, 1, 1),
        (7, 2, 1, 3),
        (50, 4, 1, 10),
        (64, 3, 2, 4),
        (200, 5, 3, 3),
        (500, 7, 4, 3),
        (333, 1, 5, 2),
        (3000, 16, 3, 12),
        (1000, 33, 4, 2),
    ];
    for (n, c, d, extent) in shapes {
        let case = random_case(&mut rng, n, c, d, extent);
        for reduce in REDUCES {
            check(&case, reduce, &Serial);
            check(&case, reduce, &Threads(2));
            check(&case, reduce, &Threads(3));
        }
    }
}

#[test]
fn zero_size_dimensions() {
    let mut rng = Rng(3);
    // N = 0 gives M = 0 (for any C and D >= 1); C = 0 gives [M, 0] feats with index outputs.
    for (n, c, d) in [(0, 3, 3), (0, 0, 1), (0, 5, 4), (6, 0, 3), (40, 0, 1), (1, 0, 4)] {
        let case = random_case(&mut rng, n, c, d, 3);
        for reduce in REDUCES {
            let out = check(&case, reduce, &Threads(2));
            if n == 0 {
                assert_eq!(out.voxel_num, vec![0]);
                assert_eq!(out.shapes[0], vec![0, c]);
                assert_eq!(out.shapes[1], vec![0, d]);
            }
        }
    }
}

#[test]
fn all_points_dropped_gives_no_voxel() {
    let case = Case {
        n: 4,
        c: 2,
        d: 3,
        feats: vec![1.0; 8],
        coors: vec![-1, 0, 0, 0, -1, 0, 0, 0, -1, i32::MIN, -5, -7],
    };
    for reduce in REDUCES {
        let out = check(&case, reduce, &Serial);
        assert_eq!(out.voxel_num, vec![0]);
        assert_eq!(out.map, vec![-1; 4]);
        assert!(out.voxel_feats.is_empty() && out.voxel_coors.is_empty() && out.count.is_empty());
    }
}

#[test]
fn negative_coordinate_in_any_column_drops_the_point() {
    // D = 4: a negative value in each column drops; zeros and i32::MAX are kept.
    let rows: Vec<[i32; 4]> = vec![
        [-1, 0, 0, 0],
        [0, -1, 0, 0],
        [0, 0, -1, 0],
        [0, 0, 0, -1],
        [0, 0, 0, i32::MIN],
        [0, 0, 0, 0],
        [i32::MAX, i32::MAX, i32::MAX, i32::MAX],
        [0, 0, 0, 0],
    ];
    let n = rows.len();
    let case =
        Case { n, c: 1, d: 4, feats: (0..n).map(|i| i as f32).collect(), coors: rows.concat() };
    for reduce in REDUCES {
        let out = check(&case, reduce, &Threads(2));
        assert_eq!(out.map, vec![-1, -1, -1, -1, -1, 0, 1, 0]);
        assert_eq!(out.count, vec![2, 1]);
    }
}

#[test]
fn voxel_coors_sorted_lexicographically_first_coordinate_most_significant() {
    // Rows chosen so that any other ordering (column-reversed, sum, ...) differs.
    let rows: Vec<[i32; 3]> =
        vec![[2, 0, 0], [0, 0, 9], [1, 5, 0], [0, 1, 0], [1, 0, 7], [0, 0, 10], [0, 1, 0]];
    let n = rows.len();
    let case = Case { n, c: 1, d: 3, feats: vec![1.0; n], coors: rows.concat() };
    let out = check(&case, "sum", &Serial);
    assert_eq!(out.voxel_coors, vec![0, 0, 9, 0, 0, 10, 0, 1, 0, 1, 0, 7, 1, 5, 0, 2, 0, 0]);
    assert_eq!(out.map, vec![5, 0, 4, 2, 3, 1, 2]);
}

#[test]
fn dimensions_one_three_four() {
    let mut rng = Rng(77);
    for d in [1, 3, 4] {
        let case = random_case(&mut rng, 400, 6, d, 4);
        for reduce in REDUCES {
            check(&case, reduce, &Threads(3));
        }
    }
    // D = 1 by hand: coordinates 3, 1, 3, -2, 0 -> voxels 0, 1, 3.
    let case = Case {
        n: 5,
        c: 1,
        d: 1,
        feats: vec![1.0, 2.0, 3.0, 4.0, 5.0],
        coors: vec![3, 1, 3, -2, 0],
    };
    let out = check(&case, "mean", &Serial);
    assert_eq!(out.voxel_coors, vec![0, 1, 3]);
    assert_eq!(out.voxel_feats, vec![5.0, 2.0, 2.0]);
}

#[test]
fn max_nan_never_wins_and_all_nan_gives_minus_infinity() {
    // Voxel 0 (coordinate 0): channel 0 NaN then 1 then NaN -> 1; channel 1 all NaN -> -inf;
    // channel 2 -inf and NaN -> -inf; channel 3 +inf among NaN -> +inf.
    // Voxel 1 (coordinate 1): a single NaN point -> -inf in every channel.
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let case = Case {
        n: 4,
        c: 4,
        d: 1,
        feats: vec![
            nan, nan, -inf, nan, 1.0, nan, nan, inf, nan, nan, nan, -3.0, nan, nan, nan, nan,
        ],
        coors: vec![0, 0, 0, 1],
    };
    let out = check(&case, "max", &Threads(2));
    assert_eq!(bits(&out.voxel_feats), bits(&[1.0, -inf, -inf, inf, -inf, -inf, -inf, -inf]));
    // sum and mean propagate NaN.
    let sum = check(&case, "sum", &Serial);
    assert!(sum.voxel_feats.iter().all(|x| x.is_nan()));
}

#[test]
fn max_with_negative_values_and_infinities() {
    // All values negative: the max is the largest of them, never the 0 or -inf start.
    let case = Case {
        n: 3,
        c: 2,
        d: 2,
        feats: vec![-5.0, -1e30, -2.0, -f32::INFINITY, -7.0, -1e-30],
        coors: vec![1; 6],
    };
    let out = check(&case, "max", &Serial);
    assert_eq!(out.voxel_feats, vec![-2.0, -1e-30]);
}

#[test]
fn sum_and_mean_are_float32_in_ascending_point_order() {
    // 1e8 + 1 + ... in float32: order matters. Points 0..5 in one voxel, interleaved with
    // points of another voxel.
    let vals = [1.0e8f32, 1.0, 1.0, -1.0e8, 3.0, 1.0];
    let mut feats = Vec::new();
    let mut coors = Vec::new();
    for (k, &v) in vals.iter().enumerate() {
        feats.push(v);
        coors.push(7);
        feats.push(k as f32);
        coors.push(2);
    }
    let case = Case { n: 12, c: 1, d: 1, feats, coors };
    let out = check_with(&case, "sum", &Threads(2), false);
    // ((((1e8 + 1) + 1) - 1e8) + 3) + 1 in float32 = 4 (the two 1s are lost).
    assert_eq!(out.voxel_feats, vec![15.0, 4.0]);
    let out = check_with(&case, "mean", &Threads(2), false);
    assert_eq!(out.voxel_feats, vec![2.5, 4.0 / 6.0]);
}

#[test]
fn bit_identical_across_thread_counts_and_runs() {
    let mut rng = Rng(2024);
    // The last two: output rows streamed (M * C * 4 bytes over 4 MiB; C 128 keeps every row
    // aligned, C 130 most not), and coordinates too wide to pack into 64 bits (3 x 31 bits).
    for (n, c, d, extent) in [
        (20000, 16, 4, 6),
        (30000, 9, 3, 40),
        (5000, 70, 1, 3000),
        (10000, 128, 3, 1 << 17),
        (9000, 130, 3, 1 << 30),
    ] {
        let mut case = random_case(&mut rng, n, c, d, extent);
        // Mixed magnitudes so that any change of summation order shows up.
        for (k, v) in case.feats.iter_mut().enumerate() {
            *v *= [1.0, 1e-4, 1e5, 3.3, 1e-7][k % 5];
        }
        for reduce in REDUCES {
            let op = op(reduce);
            let first = check(&case, reduce, &Serial);
            let pars: [&dyn Parallel; 4] = [&Serial, &Threads(2), &Threads(3), &Threads(2)];
            for par in pars {
                let again = case.run(&op, par);
                assert_eq!(
                    bits(&again.voxel_feats),
                    bits(&first.voxel_feats),
                    "{reduce} N {n} C {c} D {d}"
                );
                assert_eq!(
                    (&again.voxel_coors, &again.map, &again.count),
                    (&first.voxel_coors, &first.map, &first.count)
                );
            }
        }
    }
}

// ---------------------------------------------------------------- errors (one per rule)

#[test]
fn reduce_type_not_max_mean_sum_is_error() {
    for bad in ["min", "", "MAX", "mean ", "avg"] {
        let e = descriptor::<DynamicScatter>(&attrs(bad))
            .expect_err("reduce_type must be max, mean or sum");
        let text = format!("{e}");
        assert!(text.contains("reduce_type"), "{text}");
    }
    let wrong = HashMap::from([("reduce_type".to_string(), AttrValue::Int(0))]);
    let e = descriptor::<DynamicScatter>(&wrong).expect_err("reduce_type must be a string");
    assert!(format!("{e}").contains("reduce_type"), "{e}");
}

#[test]
fn coors_without_columns_is_error() {
    // D = 0: a coors row with no column.
    for n in [1, 4] {
        for reduce in REDUCES {
            let e = err_text(
                reduce,
                Tensor::f32([n, 2], vec![1.0; 2 * n]),
                Tensor::i32([n, 0], vec![]),
            );
            assert!(e.contains("'coors'") && e.contains("D"), "{e}");
        }
    }
}

#[test]
fn feats_shape_mismatch_is_error() {
    let (_, c) = small_inputs();
    for f in [
        Tensor::f32([6], vec![0.0; 6]),
        Tensor::f32([3, 2, 1], vec![0.0; 6]),
        Tensor::f32([1, 3, 2], vec![0.0; 6]),
    ] {
        let e = err_text("max", f, c.clone());
        assert!(e.contains("'feats'") && e.contains("shape"), "{e}");
    }
}

#[test]
fn coors_shape_mismatch_is_error() {
    let (f, _) = small_inputs();
    // N differs from feats' N (both ways), rank 1, rank 3.
    for c in [
        Tensor::i32([2, 3], vec![0; 6]),
        Tensor::i32([4, 3], vec![0; 12]),
        Tensor::i32([3], vec![0; 3]),
        Tensor::i32([3, 3, 1], vec![0; 9]),
    ] {
        let e = err_text("sum", f.clone(), c);
        assert!(e.contains("'coors'") && e.contains("shape"), "{e}");
    }
}

#[test]
fn feats_dtype_mismatch_is_error() {
    let (_, c) = small_inputs();
    for f in [
        Tensor::i32([3, 2], vec![0; 6]),
        Tensor::f16([3, 2], vec![half::f16::ZERO; 6]),
        Tensor::i64([3, 2], vec![0; 6]),
    ] {
        let e = err_text("mean", f, c.clone());
        assert!(e.contains("'feats'") && e.contains("dtype"), "{e}");
    }
}

#[test]
fn coors_dtype_mismatch_is_error() {
    let (f, _) = small_inputs();
    for c in [Tensor::i64([3, 3], vec![0; 9]), Tensor::f32([3, 3], vec![0.0; 9])] {
        let e = err_text("max", f.clone(), c);
        assert!(e.contains("'coors'") && e.contains("dtype"), "{e}");
    }
}

#[test]
fn missing_input_is_error() {
    let (f, c) = small_inputs();
    let op = op("max");
    let e = run(&op, &[Some(&f), None], &Serial).expect_err("coors is required");
    assert!(format!("{e}").contains("'coors'"), "{e}");
    let e = run(&op, &[None, Some(&c)], &Serial).expect_err("feats is required");
    assert!(format!("{e}").contains("'feats'"), "{e}");
}

// The contract's "N beyond int32" rule is not tested: it needs coors with more than 2^31
// rows (D >= 1), i.e. more than 8 GiB of input.

// ---------------------------------------------------------------- properties

fn coordinate() -> impl Strategy<Value = i32> {
    prop_oneof![
        12 => -2i32..4,
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
        1 => Just(-1i32),
        1 => any::<i32>(),
    ]
}

fn feature() -> impl Strategy<Value = f32> {
    prop_oneof![
        12 => -100.0f32..100.0,
        1 => Just(0.0f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(3.0e38f32),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Random coors (negatives, extremes, collisions), D 1..5, any reduction: never a panic,
    /// always a result equal to the reference (these inputs are all valid).
    #[test]
    fn random_coors_follow_the_contract(
        reduce in prop::sample::select(REDUCES.to_vec()),
        n in 0usize..40,
        c in 0usize..4,
        d in 1usize..5,
        coors in prop::collection::vec(coordinate(), 40 * 4),
        values in prop::collection::vec(feature(), 40 * 3),
        threads in 1usize..4,
    ) {
        let case = Case { n, c, d, feats: values[..n * c].to_vec(), coors: coors[..n * d].to_vec() };
        let (f, t) = case.tensors();
        let result = run(&op(reduce), &[Some(&f), Some(&t)], &Threads(threads));
        prop_assert!(result.is_ok(), "valid input rejected: {:?}", result.err());
        let out = check(&case, reduce, &Threads(threads));
        let serial = case.run(&op(reduce), &Serial);
        prop_assert_eq!(bits(&out.voxel_feats), bits(&serial.voxel_feats));
    }

    /// D = 0 or a coors N differing from feats' N: always an error naming coors.
    #[test]
    fn bad_coors_shapes_are_errors(n in 0usize..5, c in 0usize..3, rows in 0usize..5, d in 0usize..3) {
        prop_assume!(d == 0 && rows > 0 || rows != n);
        let f = Tensor::f32([n, c], vec![1.0; n * c]);
        let t = Tensor::i32([rows, d], vec![0; rows * d]);
        let e = run(&op("max"), &[Some(&f), Some(&t)], &Serial).err();
        let text = e.map(|e| format!("{e}")).unwrap_or_default();
        prop_assert!(text.contains("'coors'"), "got {:?}", text);
    }
}
