//! PsRoiPool (R-FCN position-sensitive RoI pooling forward, NHWC) against its contract, the
//! `doc` of schemas/psroipool/psroipool.json, whose bin rules are those of PsRoiPoolBackward
//! (docs/CONTRACT.md §6.2), through the Rust API.
//!
//! The reference below is written from the contract text alone (one loop per output element,
//! bins computed in float32 as the contract spells out); it shares no code with the kernel.
//! output is accumulating (checked against a float64 reference) and, since the contract fixes
//! the summation order ("rows then columns ascending, in float32"), also compared with a
//! float32 sum in that order; mapping_channel is exact. A last group of tests checks the
//! forward op against PsRoiPoolBackward through the adjoint identity.

use onnxruntime_ep_mlu::ops::psroipool::PsRoiPool;
use onnxruntime_ep_mlu::ops::psroipool::backward::PsRoiPoolBackward;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::tensor::Tensor;
use proptest::prelude::*;
mod common;
#[path = "reference/psroipool.rs"]
mod reference;
use common::psroi::Attrs;
use common::{Rng, assert_accumulating, canon};
use reference::{Case, reference, reference_bin};

// ---------------------------------------------------------------- helpers

impl Case {
    fn run(&self, a: Attrs, par: &dyn Parallel) -> Result<(Vec<f32>, Vec<i32>), String> {
        let op: PsRoiPool = descriptor(&a.map()).map_err(|e| format!("{e}"))?;
        let (x, r) = self.tensors();
        let out = run(&op, &[Some(&x), Some(&r)], par).map_err(|e| format!("{e}"))?;
        assert_eq!(out.len(), 2, "two outputs");
        let shape = vec![self.r, a.ph as usize, a.pw as usize, a.od as usize];
        assert_eq!(out[0].shape, shape, "output shape");
        assert_eq!(out[1].shape, shape, "mapping_channel shape");
        Ok((
            out[0].data.f32().expect("output is float32").to_vec(),
            out[1].data.i32().expect("mapping_channel is int32").to_vec(),
        ))
    }
}

fn check(case: &Case, a: Attrs, par: &dyn Parallel) -> (Vec<f32>, Vec<i32>) {
    let (out, mapping) = case.run(a, par).expect("valid case runs");
    let r = reference(case, a);
    assert_eq!(mapping, r.mapping, "mapping_channel exact");
    assert_eq!(canon(&out), canon(&r.out32), "output: float32 sum in the contract's order / area");
    // Where the float32 sum overflows the contract's result is inf; elsewhere float64.
    let want: Vec<f64> = r
        .out64
        .iter()
        .zip(&r.out32)
        .map(|(&w, &v)| if v.is_finite() { w } else { v as f64 })
        .collect();
    assert_accumulating(&out, &want, "output");
    (out, mapping)
}

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Random input in [-1, 1) and rois inside an image of `img` pixels (the map is img * scale,
/// here slightly larger so some rois stick out), fractional batch ids.
fn random_case(
    rng: &mut Rng,
    r: usize,
    a: Attrs,
    [batches, height, width]: [usize; 3],
    img: f32,
) -> Case {
    let shape = [batches, height, width, a.channels()];
    let input = (0..shape.iter().product::<usize>()).map(|_| rng.unit() * 2.0 - 1.0).collect();
    let mut rois = Vec::with_capacity(r * 5);
    for _ in 0..r {
        let b = rng.below(batches as u64) as f32 + rng.unit() * 0.99;
        let (x1, y1) = (rng.unit() * img * 1.1 - 1.0, rng.unit() * img * 1.1 - 1.0);
        let (x2, y2) =
            (x1 + rng.unit() * (img - x1).max(1.0), y1 + rng.unit() * (img - y1).max(1.0));
        rois.extend([b, x1, y1, x2, y2]);
    }
    Case { shape, input, r, rois }
}

fn expect_err(case: &Case, a: Attrs, names: &[&str]) -> String {
    match case.run(a, &Serial) {
        Ok(_) => panic!("expected an error naming one of {names:?}"),
        Err(e) => {
            assert!(names.iter().any(|n| e.contains(n)), "error should name one of {names:?}: {e}");
            e
        }
    }
}

/// A small valid case: 3 rois on a [2, 6, 6, 2*2*3] map, scale 0.5.
fn small() -> (Case, Attrs) {
    let a = Attrs::square(2, 0.5, 3);
    (random_case(&mut Rng(5), 3, a, [2, 6, 6], 12.0), a)
}

fn expected_mapping(r: usize, a: Attrs) -> Vec<i32> {
    let (p, q, od) = (a.ph as usize, a.pw as usize, a.od as usize);
    let mut m = Vec::new();
    for _ in 0..r {
        for i in 0..p {
            for j in 0..q {
                for o in 0..od {
                    m.push(((o * p + i) * q + j) as i32);
                }
            }
        }
    }
    m
}

// ---------------------------------------------------------------- semantics

#[test]
fn hand_computed_example() {
    // pooled 2, output_dim 1, scale 1; one 4x4 map of 4 channels, channel c of pixel (h, w)
    // holds 100*c + 10*h + w. roi (0, 0, 0, 3, 3): start 0, end 4, bins of 2x2 pixels.
    let a = Attrs::square(2, 1.0, 1);
    let mut input = Vec::new();
    for h in 0..4 {
        for w in 0..4 {
            for c in 0..4 {
                input.push((100 * c + 10 * h + w) as f32);
            }
        }
    }
    let case = Case { shape: [1, 4, 4, 4], input, r: 1, rois: vec![0.0, 0.0, 0.0, 3.0, 3.0] };
    let (out, mapping) = check(&case, a, &Serial);
    // Bin (i, j) reads channel i*2 + j over rows 2i..2i+2, columns 2j..2j+2: mean
    // 100*c + 10*(2i + 0.5) + (2j + 0.5).
    assert_eq!(mapping, vec![0, 1, 2, 3]);
    assert_eq!(out, vec![5.5, 107.5, 225.5, 327.5]);
}

#[test]
fn random_cases_several_sizes() {
    let mut rng = Rng(11);
    // (R, pooled, output_dim, scale, [batches, height, width], image size in roi units)
    let cases: [(usize, i64, i64, f32, [usize; 3], f32); 9] = [
        (1, 1, 1, 1.0, [1, 1, 1], 1.0),
        // Enough rois for several tasks.
        (400, 7, 8, 1.0, [2, 14, 14], 14.0),
        (5, 2, 3, 0.5, [2, 6, 6], 12.0),
        (9, 3, 4, 1.0, [3, 7, 5], 6.0),
        (20, 7, 8, 1.0, [2, 14, 14], 14.0),
        (40, 3, 21, 0.0625, [4, 14, 14], 224.0),
        (16, 4, 2, 1.3, [1, 11, 17], 13.0),
        (7, 5, 1, 2.0, [2, 3, 30], 15.0),
        (64, 2, 5, 0.25, [3, 9, 9], 36.0),
    ];
    for (r, p, od, scale, dims, img) in cases {
        let a = Attrs::square(p, scale, od);
        let case = random_case(&mut rng, r, a, dims, img);
        let (serial, _) = check(&case, a, &Serial);
        for par in [&Threads(2) as &dyn Parallel, &Threads(3)] {
            let (out, _) = check(&case, a, par);
            assert_eq!(canon(&out), canon(&serial), "same result with threads");
        }
    }
}

#[test]
fn backward_seed_shapes_reduced() {
    // The backward seed cases' shapes: pooled 7, od 8, scale 1 on [2, 14, 14, 392] (R cut to
    // 100), and pooled 3, od 21, scale 1/16 on [8, 14, 14, 189] (R cut to 150).
    let mut rng = Rng(320);
    let a = Attrs::square(7, 1.0, 8);
    check(&random_case(&mut rng, 100, a, [2, 14, 14], 14.0), a, &Threads(2));
    let a = Attrs::square(3, 0.0625, 21);
    check(&random_case(&mut rng, 150, a, [8, 14, 14], 224.0), a, &Threads(2));
}

#[test]
fn mapping_channel_is_always_o_ph_plus_i_pw_plus_j() {
    let a = Attrs::square(3, 1.0, 4);
    let mut case = random_case(&mut Rng(2), 4, a, [1, 5, 5], 5.0);
    // Roi 1 non-finite, roi 2 outside the map: mapping_channel still c.
    case.rois[5..10].copy_from_slice(&[0.0, f32::NAN, 0.0, 1.0, 1.0]);
    case.rois[10..15].copy_from_slice(&[0.0, 100.0, 100.0, 120.0, 120.0]);
    let (out, mapping) = check(&case, a, &Threads(2));
    assert_eq!(mapping, expected_mapping(4, a));
    let per = a.channels();
    assert!(out[per..3 * per].iter().all(|&v| v == 0.0));
}

#[test]
fn zero_rois_give_empty_outputs() {
    let a = Attrs::square(2, 0.5, 3);
    for dims in [[2, 6, 6], [0, 6, 6], [1, 0, 0]] {
        let case = random_case(&mut Rng(3), 0, a, dims, 12.0);
        let (out, mapping) = check(&case, a, &Threads(2));
        assert!(out.is_empty() && mapping.is_empty());
    }
}

#[test]
fn empty_map_gives_zero_outputs() {
    // height 0 or width 0: every bin is clamped empty.
    let a = Attrs::square(2, 1.0, 2);
    for dims in [[1, 0, 5], [2, 5, 0], [1, 0, 0]] {
        let mut case = random_case(&mut Rng(4), 3, a, dims, 5.0);
        for r in 0..3 {
            case.rois[r * 5] = 0.0;
        }
        let (out, mapping) = check(&case, a, &Serial);
        assert!(out.iter().all(|&v| v == 0.0));
        assert_eq!(mapping, expected_mapping(3, a));
    }
}

#[test]
fn empty_bins_give_zero() {
    // Roi columns -6..6 on a width-4 map with pooled 3, scale 1: start -6, end 7, bin 13/3;
    // column bins [-6, -1) (empty after clamping), [-2, 3), [2, 4)...; rows likewise.
    let a = Attrs::square(3, 1.0, 1);
    let mut rng = Rng(6);
    let mut case = random_case(&mut rng, 2, a, [1, 4, 4], 4.0);
    case.rois = vec![0.0, -6.0, -6.0, 6.0, 6.0, 0.0, 10.0, 1.0, 12.0, 2.0];
    let (out, _) = check(&case, a, &Threads(2));
    let r = reference(&case, a);
    // Some bins of roi 0 are empty (0), others not; roi 1 is right of the map (all 0).
    let empty: Vec<bool> = (0..9)
        .map(|k| {
            reference_bin(a, &case.rois[..5], k / 3, k % 3, 4, 4)
                .is_some_and(|[hs, he, ws, we]| he <= hs || we <= ws)
        })
        .collect();
    assert!(empty.iter().any(|&e| e) && !empty.iter().all(|&e| e), "{empty:?}");
    for k in 0..9 {
        if empty[k] {
            assert_eq!(out[k], 0.0, "empty bin {k}");
        } else {
            assert_ne!(r.out64[k], 0.0);
        }
    }
    assert!(out[9..].iter().all(|&v| v == 0.0));
}

#[test]
fn non_finite_rois_give_zero_outputs() {
    let a = Attrs::square(2, 1.0, 1);
    let case0 = random_case(&mut Rng(7), 1, a, [1, 6, 6], 6.0);
    for k in 0..5 {
        for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut case = case0.clone();
            case.rois = vec![0.0, 1.0, 1.0, 4.0, 4.0];
            case.rois[k] = s;
            let (out, mapping) = check(&case, a, &Serial);
            assert_eq!(out, vec![0.0; 4], "roi value {k} = {s}");
            assert_eq!(mapping, vec![0, 1, 2, 3]);
        }
    }
}

#[test]
fn overflowing_scaled_values_give_zero_outputs() {
    // start overflows (3e38 * 2), or the roi size does (end - start = inf).
    let a = Attrs::square(2, 2.0, 1);
    let case0 = random_case(&mut Rng(8), 1, a, [1, 5, 5], 5.0);
    for roi in [
        [0.0, 3.0e38, 0.0, 3.0e38, 1.0],
        [0.0, 0.0, -3.0e38, 1.0, 1.0],
        [0.0, -3.0e38, 0.0, 3.0e38, 1.0],
    ] {
        let mut case = case0.clone();
        case.rois = roi.to_vec();
        assert!(reference(&case, a).out64.iter().all(|&v| v == 0.0), "reference agrees: {roi:?}");
        let (out, _) = check(&case, a, &Serial);
        assert_eq!(out, vec![0.0; 4], "{roi:?}");
    }
}

#[test]
fn huge_finite_coordinates_are_clamped() {
    let a = Attrs::square(3, 1.0, 2);
    let mut case = random_case(&mut Rng(9), 5, a, [1, 4, 5], 5.0);
    case.rois = [
        [0.0, -1.0e30, -1.0e30, 1.0e30, 1.0e30],
        [0.0, -1.0e30, 2.0, 3.0, 1.0e30],
        [0.0, 1.0e20, 1.0e20, 2.0e20, 2.0e20],
        [0.0, -1.0e20, -1.0e20, -5.0e19, -5.0e19],
        [0.0, 1.0e38, -1.0e38, 1.0e38, 1.0e38],
    ]
    .concat();
    check(&case, a, &Threads(2));
    assert!(reference(&case, a).out64.iter().any(|&v| v != 0.0), "some roi covers the map");
}

#[test]
fn round_half_away_from_zero() {
    // One row of 4 pixels, channel 0 = column index + 1.
    let a = Attrs::square(1, 1.0, 1);
    let input = vec![1.0, 2.0, 3.0, 4.0];
    // x1 = 0.5 -> 1, x2 = 1.5 -> 2: columns 1..3, mean (2 + 3) / 2.
    let case = Case {
        shape: [1, 1, 4, 1],
        input: input.clone(),
        r: 1,
        rois: vec![0.0, 0.5, 0.0, 1.5, 0.0],
    };
    assert_eq!(check(&case, a, &Serial).0, vec![2.5]);
    // x1 = -0.5 -> -1: columns -1..3 clamped to 0..3, area 3: (1 + 2 + 3) / 3.
    let case = Case { shape: [1, 1, 4, 1], input, r: 1, rois: vec![0.0, -0.5, 0.0, 1.5, 0.0] };
    assert_eq!(check(&case, a, &Serial).0, vec![2.0]);
}

#[test]
fn min_roi_extent_is_a_tenth() {
    // x2 < x1: width 0.1, w: floor(2) = 2, ceil(2.1) = 3; h: rows 1..2.
    let a = Attrs::square(1, 1.0, 1);
    let input: Vec<f32> = (0..12).map(|k| k as f32).collect();
    let case = Case { shape: [1, 3, 4, 1], input, r: 1, rois: vec![0.0, 2.0, 1.0, -4.0, 1.0] };
    assert_eq!(check(&case, a, &Serial).0, vec![6.0]);
}

#[test]
fn fractional_batch_ids_truncate_toward_zero() {
    let a = Attrs::square(1, 1.0, 1);
    // Batch b holds the constant 10 * (b + 1).
    let input = vec![10.0, 20.0, 30.0];
    for (batch_id, want) in
        [(1.9f32, 20.0f32), (0.5, 10.0), (2.999, 30.0), (0.0, 10.0), (-0.0, 10.0)]
    {
        let case = Case {
            shape: [3, 1, 1, 1],
            input: input.clone(),
            r: 1,
            rois: vec![batch_id, 0.0, 0.0, 0.0, 0.0],
        };
        assert_eq!(check(&case, a, &Serial).0, vec![want], "batch_id {batch_id}");
    }
}

#[test]
fn nan_and_inf_in_input_propagate() {
    let a = Attrs::square(2, 1.0, 2);
    let mut case = random_case(&mut Rng(10), 6, a, [2, 5, 5], 5.0);
    case.input[0] = f32::NAN;
    case.input[9] = f32::INFINITY;
    case.input[17] = f32::NEG_INFINITY;
    case.input[8 * 7 + 1] = f32::NAN;
    case.rois[..5].copy_from_slice(&[0.0, 0.0, 0.0, 4.0, 4.0]);
    let r = reference(&case, a);
    assert!(r.out64.iter().any(|v| !v.is_finite()), "case reaches the special values");
    check(&case, a, &Threads(2));
}

#[test]
fn summation_order_rows_then_columns_in_float32() {
    // One bin of 2x2 pixels: 1e8, 1, 1, -1e8 in row-major order. Rows then columns in
    // float32: ((1e8 + 1) + 1) - 1e8 = 0; another order could give 2.
    let a = Attrs::square(1, 1.0, 1);
    let case = Case {
        shape: [1, 2, 2, 1],
        input: vec![1.0e8, 1.0, 1.0, -1.0e8],
        r: 1,
        rois: vec![0.0, 0.0, 0.0, 1.0, 1.0],
    };
    let (out, _) = case.run(a, &Threads(2)).expect("runs");
    assert_eq!(out, vec![0.0]);
}

// ---------------------------------------------------------------- adjoint with PsRoiPoolBackward

fn backward(a: Attrs, top: &[f32], case: &Case, mapping: &[i32], par: &dyn Parallel) -> Vec<f32> {
    let op: PsRoiPoolBackward = descriptor(&a.map()).expect("valid attributes");
    let shape = [case.r, a.ph as usize, a.pw as usize, a.od as usize];
    let t = Tensor::f32(shape, top.to_vec());
    let rois = Tensor::f32([case.r, 5], case.rois.clone());
    let m = Tensor::i32(shape, mapping.to_vec());
    let bs = Tensor::i64([4], case.shape.iter().map(|&d| d as i64).collect());
    let out = run(&op, &[Some(&t), Some(&rois), Some(&m), Some(&bs)], par).expect("backward runs");
    assert_eq!(out[0].shape, case.shape.to_vec());
    out[0].data.f32().expect("float32").to_vec()
}

/// <top_grad, forward(x)> == <backward(top_grad), x>, within the accumulating tolerance
/// relative to the sum of the absolute terms.
fn check_adjoint(case: &Case, a: Attrs, rng: &mut Rng, par: &dyn Parallel) {
    let (y, mapping) = check(case, a, par);
    let top: Vec<f32> = (0..y.len()).map(|_| rng.unit() * 2.0 - 1.0).collect();
    let grad = backward(a, &top, case, &mapping, par);
    let lhs: f64 = top.iter().zip(&y).map(|(&g, &v)| g as f64 * v as f64).sum();
    let rhs: f64 = grad.iter().zip(&case.input).map(|(&g, &x)| g as f64 * x as f64).sum();
    let scale_l: f64 = top.iter().zip(&y).map(|(&g, &v)| (g as f64 * v as f64).abs()).sum();
    let scale_r: f64 =
        grad.iter().zip(&case.input).map(|(&g, &x)| (g as f64 * x as f64).abs()).sum();
    let scale = scale_l.max(scale_r);
    assert!(
        (lhs - rhs).abs() <= 3e-3 * scale,
        "adjoint: <g, Ax> = {lhs}, <A^T g, x> = {rhs}, scale {scale}"
    );
    if y.iter().any(|&v| v != 0.0) {
        assert!(scale > 0.0);
    }
}

#[test]
fn adjoint_identity_with_backward() {
    let mut rng = Rng(21);
    let cases: [(usize, i64, i64, f32, [usize; 3], f32); 6] = [
        (1, 1, 1, 1.0, [1, 3, 3], 3.0),
        (6, 2, 3, 0.5, [2, 6, 6], 12.0),
        (12, 3, 4, 1.0, [3, 7, 5], 6.0),
        (30, 7, 8, 1.0, [2, 14, 14], 14.0),
        (25, 3, 21, 0.0625, [4, 14, 14], 224.0),
        (10, 4, 2, 1.3, [1, 11, 17], 13.0),
    ];
    for (r, p, od, scale, dims, img) in cases {
        let a = Attrs::square(p, scale, od);
        let mut case = random_case(&mut rng, r, a, dims, img);
        // Some rois that contribute nothing, and overlapping ones.
        if r >= 6 {
            case.rois[5..10].copy_from_slice(&[0.0, f32::NAN, 1.0, 2.0, 3.0]);
            case.rois[10..15].copy_from_slice(&[0.0, -1.0e30, -1.0e30, 1.0e30, 1.0e30]);
        }
        check_adjoint(&case, a, &mut rng, &Serial);
        check_adjoint(&case, a, &mut rng, &Threads(2));
    }
}

// ---------------------------------------------------------------- errors (one per rule)

#[test]
fn pooled_height_not_equal_pooled_width_is_error() {
    let (case, _) = small();
    for (ph, pw) in [(2, 3), (3, 2), (2, 1)] {
        expect_err(&case, Attrs { ph, pw, scale: 0.5, od: 3 }, &["pooled_width", "pooled_height"]);
    }
}

#[test]
fn pooled_height_below_one_is_error() {
    let (case, _) = small();
    for p in [0, -1, i64::MIN] {
        expect_err(&case, Attrs::square(p, 0.5, 3), &["pooled_height"]);
    }
}

#[test]
fn output_dim_below_one_is_error() {
    let (case, _) = small();
    for od in [0, -2, i64::MIN] {
        expect_err(&case, Attrs::square(2, 0.5, od), &["output_dim"]);
    }
}

#[test]
fn spatial_scale_not_positive_or_not_finite_is_error() {
    let (case, _) = small();
    for s in [0.0, -0.0, -1.0, -f32::MIN_POSITIVE, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        expect_err(&case, Attrs::square(2, s, 3), &["spatial_scale"]);
    }
}

#[test]
fn missing_attribute_is_error() {
    for name in ["pooled_height", "pooled_width", "spatial_scale", "output_dim"] {
        let mut m = Attrs::square(2, 0.5, 3).map();
        m.remove(name);
        let e = descriptor::<PsRoiPool>(&m).expect_err("all four attributes are required");
        assert!(format!("{e}").contains(name), "{e}");
    }
}

#[test]
fn channels_not_pooled_area_times_output_dim_is_error() {
    let (case, a) = small();
    for ch in [11, 13, 0, 36] {
        let mut c = case.clone();
        c.shape[3] = ch;
        c.input = vec![0.5; c.shape.iter().product()];
        let e = expect_err(&c, a, &["'input'"]);
        assert!(e.contains("channels"), "{e}");
    }
}

#[test]
fn finite_batch_id_outside_batches_is_error() {
    let (case, a) = small(); // batches = 2
    for b in [2.0, 2.5, 5.0, -1.0, -3.5, 1.0e30, -1.0e30, f32::MAX] {
        let mut c = case.clone();
        c.rois[5] = b; // roi 1
        let e = expect_err(&c, a, &["'rois'"]);
        assert!(e.contains("batch"), "{e}");
    }
    // batches = 0: every finite roi is outside.
    let mut c = case.clone();
    c.shape[0] = 0;
    c.input.clear();
    c.rois[0] = 0.0;
    expect_err(&c, a, &["'rois'"]);
}

#[test]
fn non_finite_batch_id_is_not_an_error() {
    // Not a finite batch_id: the roi has a non-finite value and gives 0 outputs.
    let (case, a) = small();
    for b in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut c = case.clone();
        c.rois[5] = b;
        let (out, _) = check(&c, a, &Serial);
        let per = a.channels();
        assert!(out[per..2 * per].iter().all(|&v| v == 0.0));
    }
}

#[test]
fn input_shape_mismatch_is_error() {
    let (case, a) = small();
    let (_, rois) = case.tensors();
    for shape in [vec![2, 6, 72], vec![2, 6, 6, 12, 1], vec![432]] {
        let x = Tensor::f32(shape, vec![0.0; 432]);
        let e = run(&a.op::<PsRoiPool>(), &[Some(&x), Some(&rois)], &Serial)
            .expect_err("bad input rank");
        let text = format!("{e}");
        assert!(text.contains("'input'") && text.contains("shape"), "{text}");
    }
}

#[test]
fn rois_shape_mismatch_is_error() {
    let (case, a) = small();
    let (x, _) = case.tensors();
    for (shape, len) in
        [(vec![3, 4], 12), (vec![3, 6], 18), (vec![15], 15), (vec![3, 5, 1], 15), (vec![5, 3], 15)]
    {
        let rois = Tensor::f32(shape, vec![0.0; len]);
        let e = run(&a.op::<PsRoiPool>(), &[Some(&x), Some(&rois)], &Serial)
            .expect_err("bad rois shape");
        let text = format!("{e}");
        assert!(text.contains("'rois'") && text.contains("shape"), "{text}");
    }
}

#[test]
fn dtype_mismatch_is_error() {
    let (case, a) = small();
    let (x, rois) = case.tensors();
    let n = x.shape.iter().product::<usize>();
    let bad_inputs = [
        (Tensor::i32(x.shape.clone(), vec![0; n]), rois.clone(), "'input'"),
        (Tensor::f16(x.shape.clone(), vec![half::f16::ZERO; n]), rois.clone(), "'input'"),
        (x.clone(), Tensor::i32([3, 5], vec![0; 15]), "'rois'"),
        (x.clone(), Tensor::i64([3, 5], vec![0; 15]), "'rois'"),
        (x.clone(), Tensor::f16([3, 5], vec![half::f16::ZERO; 15]), "'rois'"),
    ];
    for (x, r, name) in bad_inputs {
        let e =
            run(&a.op::<PsRoiPool>(), &[Some(&x), Some(&r)], &Serial).expect_err("dtype mismatch");
        let text = format!("{e}");
        assert!(text.contains(name) && text.contains("dtype"), "{text}");
    }
}

#[test]
fn missing_input_is_error() {
    let (case, a) = small();
    let (x, r) = case.tensors();
    let e = run(&a.op::<PsRoiPool>(), &[Some(&x), None], &Serial).expect_err("rois required");
    assert!(format!("{e}").contains("'rois'"), "{e}");
    let e = run(&a.op::<PsRoiPool>(), &[None, Some(&r)], &Serial).expect_err("input required");
    assert!(format!("{e}").contains("'input'"), "{e}");
}

// ---------------------------------------------------------------- properties

fn roi_coordinate() -> impl Strategy<Value = f32> {
    prop_oneof![
        10 => -8.0f32..20.0,
        3 => (-16i32..40).prop_map(|v| v as f32 * 0.5),
        1 => Just(-0.0f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(3.0e38f32),
        1 => Just(-3.0e38f32),
        1 => Just(f32::MAX),
        1 => Just(1.0e20f32),
        1 => Just(-1.0e20f32),
    ]
}

/// A batch id given (batches, u in [0, 1)).
fn batch_id() -> impl Strategy<Value = fn(f32, f32) -> f32> {
    let inside: fn(f32, f32) -> f32 = |b, u| (u * b).min(b - 0.01).max(0.0);
    let integer: fn(f32, f32) -> f32 = |b, u| (u * b).floor();
    let at_end: fn(f32, f32) -> f32 = |b, u| b + u * 0.9;
    let far: fn(f32, f32) -> f32 = |b, u| b + 1.0 + u * 1e6;
    let negative: fn(f32, f32) -> f32 = |_, u| -1.0 - u * 10.0;
    let small_negative: fn(f32, f32) -> f32 = |_, u| -0.99 * u;
    let neg_zero: fn(f32, f32) -> f32 = |_, _| -0.0;
    let nan: fn(f32, f32) -> f32 = |_, _| f32::NAN;
    let inf: fn(f32, f32) -> f32 = |_, _| f32::INFINITY;
    let neg_inf: fn(f32, f32) -> f32 = |_, _| f32::NEG_INFINITY;
    let huge: fn(f32, f32) -> f32 = |_, _| 3.0e38;
    prop_oneof![
        14 => Just(inside),
        6 => Just(integer),
        1 => Just(at_end),
        1 => Just(far),
        1 => Just(negative),
        1 => Just(small_negative),
        1 => Just(neg_zero),
        1 => Just(nan),
        1 => Just(inf),
        1 => Just(neg_inf),
        1 => Just(huge),
    ]
}

/// What the contract says of one roi's batch id: Ok, an error, or unclear (see below).
#[derive(Debug, PartialEq)]
enum Verdict {
    Ok,
    Error,
    Unclear,
}

fn batch_verdict(roi: &[f32], batches: usize) -> Verdict {
    let id = roi[0];
    if !id.is_finite() {
        return Verdict::Ok; // not a finite batch_id: the roi gives 0 outputs
    }
    let t = id.trunc();
    let in_range_truncated = t >= 0.0 && (t as f64) < batches as f64;
    let in_range_literal = id >= 0.0 && (id as f64) < batches as f64;
    let roi_finite = roi.iter().all(|v| v.is_finite());
    match (in_range_truncated, in_range_literal) {
        // A finite batch id in (-1, 0): outside [0, batches) as written, but it truncates to
        // batch 0 (PsRoiPoolBackward's tests read the rule on the truncated b).
        (true, false) => Verdict::Unclear,
        (true, true) => Verdict::Ok,
        // A finite batch_id outside [0, batches) on a roi with another non-finite value:
        // "a finite batch_id outside [0, batches)" is an error as written, but that roi also
        // "gives 0 outputs"; PsRoiPoolBackward's tests read the batch rule as applying to
        // rois whose five values are finite.
        (false, _) if !roi_finite => Verdict::Unclear,
        (false, _) => Verdict::Error,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// Random rois (NaN, inf, huge values, batch ids in and out of range): never a panic, an
    /// error naming rois exactly when the contract says, the reference otherwise.
    #[test]
    fn random_rois_follow_the_contract(
        (p, od) in (1i64..4, 1i64..3),
        scale in prop::sample::select(vec![0.0625f32, 0.25, 0.5, 1.0, 2.0, 1.3]),
        r in 0usize..6,
        (batches, height, width) in (prop_oneof![1 => Just(0usize), 6 => 1usize..4], 0usize..7, 0usize..7),
        batch_ids in prop::collection::vec((batch_id(), 0.0f32..1.0), 6),
        coords in prop::collection::vec(roi_coordinate(), 24),
        seed in any::<u64>(),
        threads in 1usize..4,
    ) {
        let a = Attrs::square(p, scale, od);
        let mut rng = Rng(seed);
        let shape = [batches, height, width, a.channels()];
        let input: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.unit() * 20.0 - 10.0).collect();
        let mut rois = Vec::new();
        for k in 0..r {
            let (id, u) = batch_ids[k];
            rois.push(id(batches as f32, u));
            rois.extend_from_slice(&coords[k * 4..k * 4 + 4]);
        }
        let case = Case { shape, input, r, rois };
        let verdicts: Vec<Verdict> = case.rois.chunks(5).map(|roi| batch_verdict(roi, batches)).collect();
        let must_fail = verdicts.contains(&Verdict::Error);
        let may_fail = must_fail || verdicts.contains(&Verdict::Unclear);
        match case.run(a, &Threads(threads)) {
            Ok((out, mapping)) => {
                prop_assert!(!must_fail, "accepted a finite batch_id outside [0, {}): {:?}", batches, case.rois);
                let want = reference(&case, a);
                prop_assert_eq!(&mapping, &want.mapping);
                prop_assert_eq!(canon(&out), canon(&want.out32), "rois {:?}", case.rois);
            }
            Err(e) => {
                prop_assert!(may_fail, "rejected valid rois {:?}: {}", case.rois, e);
                prop_assert!(e.contains("'rois'"), "{}", e);
            }
        }
    }
}
