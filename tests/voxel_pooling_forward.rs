//! VoxelPoolingForward against docs/CONTRACT.md §5, through the Rust API.
//!
//! The reference below is written from the contract alone (a serial loop with float64
//! sums); it shares no code with the kernel.

use onnxruntime_ep_mlu::ops::voxel_pooling::forward::VoxelPoolingForward;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use proptest::prelude::*;
use std::collections::HashMap;
mod common;
#[path = "reference/voxel_pooling_forward.rs"]
mod reference;
use common::{Rng, assert_accumulating};
use reference::{Case, reference};

// ---------------------------------------------------------------- helpers

fn attrs(voxel_num: &[i64]) -> HashMap<String, AttrValue> {
    HashMap::from([("voxel_num".to_string(), AttrValue::Ints(voxel_num.to_vec()))])
}

fn op(voxel_num: [i64; 3]) -> VoxelPoolingForward {
    descriptor(&attrs(&voxel_num)).expect("valid voxel_num")
}

impl Case {
    fn run(
        &self,
        op: &VoxelPoolingForward,
        par: &dyn Parallel,
    ) -> (Vec<f32>, Vec<i32>, Vec<usize>) {
        let (g, f) = self.tensors();
        let out = run(op, &[Some(&g), Some(&f)], par).expect("valid case runs");
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].shape, vec![self.b, self.n, 3], "pos_memo shape");
        let feats = out[0].data.f32().expect("output_features is float32").to_vec();
        let memo = out[1].data.i32().expect("pos_memo is int32").to_vec();
        (feats, memo, out[0].shape.clone())
    }
}

fn check(case: &Case, voxel_num: [i64; 3], par: &dyn Parallel) {
    let op = op(voxel_num);
    let (feats, memo, shape) = case.run(&op, par);
    let [nx, ny, _] = voxel_num;
    assert_eq!(shape, vec![case.b, ny as usize, nx as usize, case.c], "output_features shape");
    let (want, want_memo) = reference(case, voxel_num);
    assert_eq!(memo, want_memo, "pos_memo is exact");
    assert_accumulating(&feats, &want, "output_features");
}

impl Rng {
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo) as u64) as i64
    }
    fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random points: mostly inside, some outside on each axis (negative and too large).
fn random_case(rng: &mut Rng, b: usize, n: usize, c: usize, voxel_num: [i64; 3]) -> Case {
    let [nx, ny, nz] = voxel_num;
    let geom = (0..b * n)
        .flat_map(|_| {
            let slack = |v: i64| v / 16 + 2;
            [
                rng.int(-slack(nx), nx + slack(nx)),
                rng.int(-slack(ny), ny + slack(ny)),
                rng.int(-slack(nz), nz + slack(nz)),
            ]
        })
        .map(|v| v as i32)
        .collect();
    let feats = (0..b * n * c).map(|_| rng.float() * 10.0).collect();
    Case { b, n, c, geom, feats }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn err_text(voxel_num: &[i64], geom: Tensor, feats: Tensor) -> String {
    let op: VoxelPoolingForward = match descriptor(&attrs(voxel_num)) {
        Ok(op) => op,
        Err(e) => return e.to_string(),
    };
    match run(&op, &[Some(&geom), Some(&feats)], &Serial) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn small_inputs() -> (Tensor, Tensor) {
    (
        Tensor::i32([1, 2, 3], vec![0, 0, 0, 1, 1, 0]),
        Tensor::f32([1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]),
    )
}

// ---------------------------------------------------------------- semantics

#[test]
fn hand_computed_example() {
    // Grid nx 3, ny 2, nz 1; two points share cell (y 1, x 2), one is outside in z.
    let case = Case {
        b: 1,
        n: 4,
        c: 2,
        geom: vec![2, 1, 0, 0, 0, 0, 2, 1, 0, 1, 1, 1],
        feats: vec![1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 5.0, 5.0],
    };
    let (feats, memo, _) = case.run(&op([3, 2, 1]), &Serial);
    let mut want = vec![0f32; 2 * 3 * 2];
    let cell = 3 + 2; // (y 1, x 2) in a 3-wide row
    want[cell * 2..cell * 2 + 2].copy_from_slice(&[101.0, 202.0]);
    want[0..2].copy_from_slice(&[10.0, 20.0]);
    assert_eq!(feats, want);
    assert_eq!(memo, vec![0, 1, 2, 0, 0, 0, 0, 1, 2, -1, -1, -1]);
}

#[test]
fn points_out_of_range_on_every_axis_are_dropped() {
    let voxel_num = [4, 3, 2];
    // Each point is outside on exactly one axis (below 0 or at/after the end), plus extremes.
    let outside: Vec<[i32; 3]> = vec![
        [-1, 0, 0],
        [4, 0, 0],
        [0, -1, 0],
        [0, 3, 0],
        [0, 0, -1],
        [0, 0, 2],
        [i32::MIN, 0, 0],
        [0, i32::MAX, 0],
        [0, 0, i32::MIN],
        [i32::MAX, i32::MAX, i32::MAX],
    ];
    let inside = [[3, 2, 1], [0, 0, 0]];
    let pts: Vec<[i32; 3]> = outside.iter().chain(&inside).copied().collect();
    let case = Case {
        b: 2,
        n: pts.len(),
        c: 1,
        geom: pts.iter().chain(&pts).flatten().copied().collect(),
        feats: (0..2 * pts.len()).map(|i| i as f32 + 1.0).collect(),
    };
    check(&case, voxel_num, &Threads(2));
    let (_, memo, _) = case.run(&op(voxel_num), &Serial);
    for (i, m) in memo.chunks(3).enumerate() {
        let valid = i % pts.len() >= outside.len();
        assert_eq!(m[0] >= 0, valid, "point {i}: pos_memo {m:?}");
    }
}

#[test]
fn empty_dimensions() {
    let mut rng = Rng(7);
    for (b, n, c) in [(0, 5, 3), (2, 0, 3), (2, 5, 0), (0, 0, 0), (1, 0, 0)] {
        let case = random_case(&mut rng, b, n, c, [3, 2, 2]);
        check(&case, [3, 2, 2], &Threads(2));
    }
    // N = 0 with C > 0: every cell is 0 (the host buffer may hold garbage; the owned one
    // starts at 0, so also check the shape).
    let case = Case { b: 2, n: 0, c: 4, geom: vec![], feats: vec![] };
    let (feats, memo, shape) = case.run(&op([3, 2, 1]), &Serial);
    assert_eq!(shape, vec![2, 2, 3, 4]);
    assert!(feats.iter().all(|&v| v == 0.0) && memo.is_empty());
}

#[test]
fn nan_and_inf_propagate() {
    let mut rng = Rng(11);
    let voxel_num = [4, 4, 1];
    let mut case = random_case(&mut rng, 2, 60, 5, voxel_num);
    // Row y = 0 of batch 0 is reserved for the special points below.
    for p in 0..60 {
        if case.geom[p * 3 + 1] == 0 {
            case.geom[p * 3 + 1] = 1;
        }
    }
    // (point, x, value): NaN, +inf, -inf alone in a cell, and +inf + -inf = NaN.
    let specials = [
        (0, 0, f32::NAN),
        (1, 1, f32::INFINITY),
        (2, 2, f32::NEG_INFINITY),
        (3, 3, f32::INFINITY),
        (4, 3, f32::NEG_INFINITY),
    ];
    for (p, x, v) in specials {
        case.geom[p * 3..p * 3 + 3].copy_from_slice(&[x, 0, 0]);
        case.feats[p * 5 + 2] = v;
    }
    let (want, _) = reference(&case, voxel_num);
    let at = |x: usize| want[x * 5 + 2];
    assert!(
        at(0).is_nan() && at(1) == f64::INFINITY && at(2) == f64::NEG_INFINITY && at(3).is_nan()
    );
    check(&case, voxel_num, &Threads(2));
    // NaN on an invalid point changes nothing.
    let case = Case { b: 1, n: 2, c: 1, geom: vec![-1, 0, 0, 0, 0, 0], feats: vec![f32::NAN, 1.5] };
    let (feats, _, _) = case.run(&op([1, 1, 1]), &Serial);
    assert_eq!(feats, vec![1.5]);
}

#[test]
fn bit_identical_across_thread_counts_and_runs() {
    let mut rng = Rng(99);
    // Features with mixed magnitudes so that any change of summation order shows up.
    let voxel_num = [16, 8, 2];
    // (1, 20000, 64): one batch with enough work to be cut into point chunks.
    for (b, n, c) in [(2, 5000, 7), (1, 20000, 8), (3, 1000, 33), (1, 20000, 64)] {
        let mut case = random_case(&mut rng, b, n, c, voxel_num);
        for (k, v) in case.feats.iter_mut().enumerate() {
            *v *= [1.0, 1e-4, 1e4, 3.3][k % 4];
        }
        let op = op(voxel_num);
        let (first, memo, _) = case.run(&op, &Serial);
        let pars: [&dyn Parallel; 5] =
            [&Serial, &Threads(1), &Threads(2), &Threads(7), &Threads(2)];
        for par in pars {
            for _ in 0..2 {
                let (again, memo2, _) = case.run(&op, par);
                assert_eq!(bits(&again), bits(&first), "B {b} N {n} C {c}");
                assert_eq!(memo2, memo);
            }
        }
    }
}

#[test]
fn seed_scale_reduced() {
    // The seed network shape with N cut to 20000 (see seed_scale_full for 473088).
    let mut rng = Rng(2024);
    let voxel_num = [128, 128, 1];
    let case = random_case(&mut rng, 2, 20000, 80, voxel_num);
    check(&case, voxel_num, &Threads(2));
}

#[test]
fn one_batch_in_point_chunks() {
    // One batch (BEVDepth inference) with enough work to be cut into point chunks that add
    // into grids of their own, summed at the end.
    let mut rng = Rng(2025);
    let voxel_num = [32, 32, 1];
    let case = random_case(&mut rng, 1, 40000, 48, voxel_num);
    check(&case, voxel_num, &Threads(2));
    check(&case, voxel_num, &Serial);
}

#[test]
fn seed_scale_full() {
    if std::env::var("MLU_EP_FULL_SCALE").as_deref() != Ok("1") {
        eprintln!("seed_scale_full: set MLU_EP_FULL_SCALE=1 to run B 2, N 473088, C 80");
        return;
    }
    let mut rng = Rng(473088);
    let voxel_num = [128, 128, 1];
    let case = random_case(&mut rng, 2, 473088, 80, voxel_num);
    let op = op(voxel_num);
    let (serial, _, _) = case.run(&op, &Serial);
    check(&case, voxel_num, &Threads::all());
    let (threaded, _, _) = case.run(&op, &Threads::all());
    assert_eq!(bits(&serial), bits(&threaded));
}

// ---------------------------------------------------------------- errors (one per rule)

#[test]
fn voxel_num_value_zero_is_error() {
    for v in [[0, 4, 1], [4, 0, 1], [4, 4, 0]] {
        let e = descriptor::<VoxelPoolingForward>(&attrs(&v)).expect_err("voxel_num 0 is an error");
        assert!(e.to_string().contains("voxel_num"), "{e}");
    }
}

#[test]
fn voxel_num_value_negative_is_error() {
    for v in [[-1, 4, 1], [4, -3, 1], [4, 4, i64::MIN]] {
        let e = descriptor::<VoxelPoolingForward>(&attrs(&v))
            .expect_err("negative voxel_num is an error");
        assert!(e.to_string().contains("voxel_num"), "{e}");
    }
}

#[test]
fn voxel_num_not_three_values_is_error() {
    for v in [&[][..], &[4, 4][..], &[4, 4, 1, 1][..]] {
        let e = descriptor::<VoxelPoolingForward>(&attrs(v)).expect_err("voxel_num needs 3 values");
        assert!(e.to_string().contains("voxel_num"), "{e}");
    }
}

#[test]
fn voxel_num_missing_is_error() {
    let e = descriptor::<VoxelPoolingForward>(&HashMap::new()).expect_err("voxel_num is required");
    assert!(e.to_string().contains("voxel_num"), "{e}");
}

#[test]
fn voxel_num_wrong_type_is_error() {
    let a = HashMap::from([("voxel_num".to_string(), AttrValue::Int(4))]);
    let e = descriptor::<VoxelPoolingForward>(&a).expect_err("voxel_num must be ints");
    assert!(e.to_string().contains("voxel_num"), "{e}");
}

#[test]
fn voxel_num_grid_overflow_is_error() {
    let e = descriptor::<VoxelPoolingForward>(&attrs(&[i64::MAX, i64::MAX, 1]))
        .expect_err("ny * nx overflows");
    assert!(e.to_string().contains("voxel_num"), "{e}");
}

#[test]
fn output_features_size_overflow_is_error() {
    // No data at all (N = 0), but B * ny * nx * C does not fit.
    let big = 1usize << 40;
    let e = err_text(
        &[1 << 20, 1 << 20, 1],
        Tensor::i32([1, 0, 3], vec![]),
        Tensor::f32([1, 0, big], vec![]),
    );
    assert!(e.contains("output_features"), "{e}");
}

#[test]
fn geom_xyz_shape_mismatch_is_error() {
    let (_, f) = small_inputs();
    for g in [
        Tensor::i32([1, 2, 2], vec![0; 4]),
        Tensor::i32([2, 3], vec![0; 6]),
        Tensor::i32([1, 2, 3, 1], vec![0; 6]),
    ] {
        let e = err_text(&[2, 2, 1], g, f.clone());
        assert!(e.contains("geom_xyz"), "{e}");
    }
}

#[test]
fn input_features_shape_mismatch_is_error() {
    let (g, _) = small_inputs();
    // B differs, N differs, rank differs.
    for f in [
        Tensor::f32([2, 2, 2], vec![0.0; 8]),
        Tensor::f32([1, 3, 2], vec![0.0; 6]),
        Tensor::f32([1, 4], vec![0.0; 4]),
    ] {
        let e = err_text(&[2, 2, 1], g.clone(), f);
        assert!(e.contains("input_features"), "{e}");
    }
}

#[test]
fn geom_xyz_dtype_mismatch_is_error() {
    let (_, f) = small_inputs();
    let e = err_text(&[2, 2, 1], Tensor::f32([1, 2, 3], vec![0.0; 6]), f);
    assert!(e.contains("geom_xyz"), "{e}");
}

#[test]
fn input_features_dtype_mismatch_is_error() {
    let (g, _) = small_inputs();
    let e = err_text(&[2, 2, 1], g, Tensor::i32([1, 2, 2], vec![0; 4]));
    assert!(e.contains("input_features"), "{e}");
}

#[test]
fn missing_input_is_error() {
    let (g, f) = small_inputs();
    let op = op([2, 2, 1]);
    let e = run(&op, &[Some(&g), None], &Serial).expect_err("input_features is required");
    assert!(e.to_string().contains("input_features"), "{e}");
    let e = run(&op, &[None, Some(&f)], &Serial).expect_err("geom_xyz is required");
    assert!(e.to_string().contains("geom_xyz"), "{e}");
}

// ---------------------------------------------------------------- properties

fn coordinate() -> impl Strategy<Value = i32> {
    prop_oneof![8 => -3i32..9, 1 => Just(i32::MIN), 1 => Just(i32::MAX), 1 => any::<i32>()]
}

fn feature() -> impl Strategy<Value = f32> {
    prop_oneof![10 => -100.0f32..100.0, 1 => Just(0.0f32), 1 => Just(-0.0f32)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Random voxel_num (valid or not), shapes and coordinates: never a panic, Err exactly
    /// when a voxel_num value is <= 0, otherwise agreement with the reference.
    #[test]
    fn random_inputs_follow_the_contract(
        voxel_num in prop::array::uniform3(-1i64..6),
        b in 0usize..3,
        n in 0usize..40,
        c in 0usize..5,
        coords in prop::collection::vec(coordinate(), 3 * 2 * 40),
        values in prop::collection::vec(feature(), 2 * 40 * 4),
    ) {
        let case = Case {
            b, n, c,
            geom: coords[..b * n * 3].to_vec(),
            feats: values.iter().copied().cycle().take(b * n * c).collect(),
        };
        let expect_ok = voxel_num.iter().all(|&v| v > 0);
        let (g, f) = case.tensors();
        let result = descriptor::<VoxelPoolingForward>(&attrs(&voxel_num))
            .and_then(|op| run(&op, &[Some(&g), Some(&f)], &Threads(2)));
        prop_assert_eq!(result.is_ok(), expect_ok, "voxel_num {:?}: {:?}", voxel_num, result.as_ref().err());
        if expect_ok {
            check(&case, voxel_num, &Threads(2));
        }
    }

    /// Random shape mismatches between the two inputs are errors naming an input.
    #[test]
    fn mismatched_shapes_are_errors(
        (b1, n1, b2, n2, last) in (0usize..3, 0usize..4, 0usize..3, 0usize..4, 0usize..5),
        c in 0usize..3,
    ) {
        prop_assume!(b1 != b2 || n1 != n2 || last != 3);
        let g = Tensor::i32([b1, n1, last], vec![0; b1 * n1 * last]);
        let f = Tensor::f32([b2, n2, c], vec![1.0; b2 * n2 * c]);
        let e = run(&op([2, 2, 2]), &[Some(&g), Some(&f)], &Serial).err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        prop_assert!(text.contains("geom_xyz") || text.contains("input_features"), "got {:?}", text);
    }
}
