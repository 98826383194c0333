//! ThreeInterpolate (PointNet++ three_interpolate forward) against its contract, the `doc`
//! of schemas/three_interpolate/three_interpolate.json, through the Rust API.
//!
//! The contract fixes the arithmetic: `f[i0]*w0 + f[i1]*w1 + f[i2]*w2` left to right in
//! float32, each product and sum rounded separately; float16 inputs are widened, computed in
//! float32 and rounded once. So besides the accumulating check against a float64 reference,
//! every output is compared bit for bit with a float32 reference evaluated that way (rounded
//! to float16 for float16). Both references are written here from the contract text alone.

use half::f16;
use onnxruntime_ep_mlu::error::Error;
use onnxruntime_ep_mlu::ops::three_interpolate::ThreeInterpolate;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::tensor::{OwnedData, Tensor};
use proptest::prelude::*;
use std::collections::HashMap;
mod common;
#[path = "reference/three_interpolate.rs"]
mod reference;
use common::{
    ELEM_REL_F16, Rng, assert_accumulating, assert_accumulating_within, run_line_aligned,
};
use reference::{Case, Ty, reference_bits, reference64, representable, tensor};

// ---------------------------------------------------------------- test data

fn op() -> ThreeInterpolate {
    descriptor(&HashMap::new()).expect("no attributes")
}

fn run_tensors(t: &[Tensor], par: &dyn Parallel) -> Result<Tensor, Error> {
    let inputs: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
    let mut out = run(&op(), &inputs, par)?;
    assert_eq!(out.len(), 1, "one output");
    Ok(out.remove(0))
}

/// Runs the case; the output as f32 values plus its raw bits (f16 bits for float16).
fn run_case(case: &Case, par: &dyn Parallel) -> Result<(Vec<f32>, Vec<u32>), Error> {
    let out = run_tensors(&case.tensors(), par)?;
    assert_eq!(out.shape, vec![case.b, case.c, case.n], "output shape");
    Ok(match case.ty {
        Ty::F32 => {
            let v = out.data.f32().expect("float32 output for float32 inputs").to_vec();
            let bits = v.iter().map(|x| x.to_bits()).collect();
            (v, bits)
        }
        Ty::F16 => {
            let v = out.data.f16().expect("float16 output for float16 inputs");
            (v.iter().map(|x| x.to_f32()).collect(), v.iter().map(|x| x.to_bits() as u32).collect())
        }
    })
}

// ---------------------------------------------------------------- references (tests/reference/)

/// Bits with NaN payloads made alike.
fn canon(ty: Ty, bits: &[u32]) -> Vec<u32> {
    bits.iter()
        .map(|&x| {
            let nan = match ty {
                Ty::F32 => f32::from_bits(x).is_nan(),
                Ty::F16 => f16::from_bits(x as u16).is_nan(),
            };
            if nan { u32::MAX } else { x }
        })
        .collect()
}

fn check(case: &Case, par: &dyn Parallel) {
    let (got, got_bits) = run_case(case, par).expect("valid case runs");
    let what = format!("{:?} B {} C {} M {} N {}", case.ty, case.b, case.c, case.m, case.n);
    assert_eq!(
        canon(case.ty, &got_bits),
        canon(case.ty, &reference_bits(case)),
        "{what}: exact float32 evaluation"
    );
    if case.ty == Ty::F32 {
        assert_accumulating(&got, &reference64(case), &what);
    } else {
        // float16 output: compare with the float64 reference rounded to float16 is not the
        // contract's metric; the metric on the float16 values is (its ulp is 1e-3 relative).
        let want: Vec<f64> = reference64(case).iter().map(|&x| f16::from_f64(x).to_f64()).collect();
        assert_accumulating_within(&got, &want, ELEM_REL_F16, &what);
    }
}

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// Random valid inputs: features in [-1, 1), weights in [0, 1), indices in [0, M).
fn random_case(rng: &mut Rng, (b, c, m, n): (usize, usize, usize, usize), ty: Ty) -> Case {
    let features = (0..b * c * m).map(|_| representable(ty, rng.uniform(-1.0, 1.0))).collect();
    let indices = (0..b * n * 3).map(|_| rng.below(m) as i32).collect();
    let weights = (0..b * n * 3).map(|_| representable(ty, rng.uniform(0.0, 1.0))).collect();
    Case { b, c, m, n, ty, features, indices, weights }
}

fn expect_error(t: &[Tensor], name: &str) -> String {
    let err = run_tensors(t, &Threads(2)).expect_err("contract says error");
    let msg = format!("{err}");
    assert_eq!(err.code(), ort_sys::OrtErrorCode::ORT_INVALID_ARGUMENT, "{msg}");
    assert!(msg.contains(&format!("'{name}'")), "message should name {name}: {msg}");
    msg
}

// ---------------------------------------------------------------- semantics

#[test]
fn hand_computed_example() {
    // B 1, C 2, M 3, N 2.
    let case = Case {
        b: 1,
        c: 2,
        m: 3,
        n: 2,
        ty: Ty::F32,
        features: vec![1.0, 2.0, 4.0, -1.0, 0.5, 8.0],
        indices: vec![0, 1, 2, 2, 2, 0],
        weights: vec![0.5, 0.25, 0.25, 1.0, 2.0, 3.0],
    };
    let (got, _) = run_case(&case, &Serial).expect("runs");
    // row 0: 1*.5 + 2*.25 + 4*.25 = 2; 4*1 + 4*2 + 1*3 = 15
    // row 1: -1*.5 + .5*.25 + 8*.25 = 1.625; 8 + 16 - 3 = 21
    assert_eq!(got, vec![2.0, 15.0, 1.625, 21.0]);
    check(&case, &Serial);
}

#[test]
fn random_shapes_both_dtypes() {
    let mut rng = Rng(5);
    let shapes = [
        (1, 1, 1, 1),
        (1, 3, 2, 5),
        (2, 16, 7, 9),
        (2, 17, 300, 40),
        (3, 33, 40, 257),
        (1, 5, 1000, 2000),
        (4, 64, 16, 512),
        (2, 3, 20000, 7),
        (1, 1, 9, 40000),
        // Many channels, few points: several tasks per batch, the last one partial.
        (2, 3000, 7, 20),
    ];
    for shape in shapes {
        for ty in [Ty::F32, Ty::F16] {
            let case = random_case(&mut rng, shape, ty);
            check(&case, &Serial);
            check(&case, &Threads(2));
            check(&case, &Threads(3));
        }
    }
}

#[test]
fn zero_size_dimensions_give_empty_output() {
    let mut rng = Rng(9);
    // (B, C, M, N): B, C or N zero; M = 0 is fine when there is no index at all.
    for shape in
        [(0, 4, 5, 6), (2, 0, 5, 6), (2, 4, 5, 0), (0, 0, 0, 0), (3, 2, 0, 0), (2, 0, 0, 0)]
    {
        for ty in [Ty::F32, Ty::F16] {
            let mut case = random_case(&mut rng, shape, ty);
            if shape.2 == 0 {
                // No index can be valid; with B = 0 or N = 0 there is none.
                assert!(case.indices.is_empty());
                case.indices.clear();
            }
            let out =
                run_tensors(&case.tensors(), &Threads(2)).expect("empty output is not an error");
            assert_eq!(out.shape, vec![shape.0, shape.1, shape.3]);
            check(&case, &Serial);
        }
    }
    // C = 0 but indices present: still checked and still an empty output.
    let case = random_case(&mut rng, (2, 0, 4, 3), Ty::F32);
    assert_eq!(run_tensors(&case.tensors(), &Serial).expect("runs").shape, vec![2, 0, 3]);
}

#[test]
fn float16_computed_in_float32_and_rounded_once() {
    // 2048*1 + 1*1 + 1*1: float16 steps would give 2048 (2049 rounds to even 2048 twice);
    // float32 gives 2050, exactly representable in float16.
    let case = Case {
        b: 1,
        c: 1,
        m: 3,
        n: 1,
        ty: Ty::F16,
        features: vec![2048.0, 1.0, 1.0],
        indices: vec![0, 1, 2],
        weights: vec![1.0, 1.0, 1.0],
    };
    let (got, _) = run_case(&case, &Serial).expect("runs");
    assert_eq!(got, vec![2050.0]);
    // A product beyond the float16 range (60000*4) cancelled by the next term stays finite.
    let case = Case {
        b: 1,
        c: 1,
        m: 2,
        n: 1,
        ty: Ty::F16,
        features: vec![60000.0, -60000.0],
        indices: vec![0, 1, 1],
        weights: vec![4.0, 2.0, 1.0],
    };
    let (got, _) = run_case(&case, &Serial).expect("runs");
    assert_eq!(got, vec![60000.0]);
    // A result beyond the float16 range rounds to inf once at the end.
    let mut big = case.clone();
    big.indices = vec![0, 0, 0];
    let (got, _) = run_case(&big, &Serial).expect("runs");
    assert_eq!(got, vec![f32::INFINITY]);
}

#[test]
fn float32_left_to_right_each_operation_rounded() {
    // (1e8*1 + 1*1) + (-1e8)*1: left to right in float32 gives 0 (1e8 + 1 rounds to 1e8);
    // any other order or a wider accumulator gives 1.
    let case = Case {
        b: 1,
        c: 1,
        m: 3,
        n: 1,
        ty: Ty::F32,
        features: vec![1.0e8, 1.0, -1.0e8],
        indices: vec![0, 1, 2],
        weights: vec![1.0, 1.0, 1.0],
    };
    let (got, _) = run_case(&case, &Threads(2)).expect("runs");
    assert_eq!(got, vec![0.0]);
    // Products rounded separately: a fused multiply-add would keep the low bits of x*x.
    let x = 1.0f32 + f32::EPSILON;
    let case = Case {
        b: 1,
        c: 1,
        m: 2,
        n: 1,
        ty: Ty::F32,
        features: vec![x, -(x * x)],
        indices: vec![0, 1, 1],
        weights: vec![x, 1.0, 0.0],
    };
    let (got, _) = run_case(&case, &Serial).expect("runs");
    assert_eq!(got, vec![0.0]);
}

#[test]
fn repeated_indices_and_nan_inf_propagate() {
    let nan = f32::NAN;
    let case = Case {
        b: 1,
        c: 2,
        m: 3,
        n: 3,
        ty: Ty::F32,
        features: vec![nan, 1.0, f32::INFINITY, 2.0, 3.0, 4.0],
        indices: vec![1, 1, 1, 0, 1, 1, 2, 2, 1],
        weights: vec![1.0, 2.0, 3.0, 0.0, 1.0, 1.0, 1.0, -1.0, 0.0],
    };
    let (got, _) = run_case(&case, &Serial).expect("runs");
    // Row 0: [6, NaN (NaN*0), NaN (inf - inf)]; row 1: [18, 6, 0].
    assert_eq!(got[0], 6.0);
    assert!(got[1].is_nan() && got[2].is_nan(), "{got:?}");
    assert_eq!(&got[3..], &[18.0, 6.0, 0.0]);
    check(&case, &Threads(2));
}

#[test]
fn result_does_not_depend_on_thread_count() {
    let mut rng = Rng(12);
    for ty in [Ty::F32, Ty::F16] {
        let case = random_case(&mut rng, (3, 40, 100, 3000), ty);
        let base = run_tensors(&case.tensors(), &Serial).expect("runs");
        for t in [2, 3] {
            assert_eq!(
                run_tensors(&case.tensors(), &Threads(t)).expect("runs"),
                base,
                "threads {t}"
            );
        }
    }
}

/// Outputs of 4 MiB or more on 64-byte lines, as onnxruntime hands them out: the write-back
/// streams whole lines with non-temporal stores (then plain stores for a partial last tile,
/// and for the 4 channels past the last whole 8-lane group), on 1 and 2 threads. The bits are
/// the contract's.
#[test]
fn streamed_output_on_line_aligned_buffers_is_exact() {
    let mut rng = Rng(31);
    for (ty, c, n) in [(Ty::F32, 20, 65536 + 48), (Ty::F16, 36, 65536 + 96)] {
        let case = random_case(&mut rng, (1, c, 100, n), ty);
        assert!(
            c * n * if ty == Ty::F32 { 4 } else { 2 } >= 4 << 20,
            "an output large enough to stream"
        );
        let want = canon(ty, &reference_bits(&case));
        let tensors = case.tensors();
        for par in [&Serial as &dyn Parallel, &Threads(2)] {
            let out = run_line_aligned(&op(), "ThreeInterpolate", &tensors, par);
            let bits: Vec<u32> = match (&out.data, ty) {
                (OwnedData::F32(v), Ty::F32) => v.iter().map(|x| x.to_bits()).collect(),
                (OwnedData::F16(v), Ty::F16) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
                _ => panic!("output dtype differs from the inputs'"),
            };
            assert_eq!(canon(ty, &bits), want, "{ty:?} C {c} N {n}");
        }
    }
}

// ---------------------------------------------------------------- errors (one per rule)

fn small(ty: Ty) -> Case {
    random_case(&mut Rng(77), (2, 3, 5, 4), ty)
}

#[test]
fn error_index_negative() {
    for ty in [Ty::F32, Ty::F16] {
        for bad in [-1, i32::MIN] {
            let mut case = small(ty);
            case.indices[(4 + 2) * 3 + 1] = bad; // b 1, n 2, k 1
            let msg = expect_error(&case.tensors(), "indices");
            assert!(msg.contains(&bad.to_string()), "{msg}");
        }
    }
}

#[test]
fn error_index_not_below_m() {
    for ty in [Ty::F32, Ty::F16] {
        for bad in [5, 6, i32::MAX] {
            let mut case = small(ty);
            case.indices[5] = bad; // b 0, n 1, k 2
            let msg = expect_error(&case.tensors(), "indices");
            assert!(msg.contains(&bad.to_string()), "{msg}");
        }
    }
}

#[test]
fn error_m_zero_with_target_points() {
    // M = 0 and N > 0: every index is outside [0, 0).
    for ty in [Ty::F32, Ty::F16] {
        let case = Case {
            b: 2,
            c: 3,
            m: 0,
            n: 4,
            ty,
            features: vec![],
            indices: vec![0; 24],
            weights: vec![0.5; 24],
        };
        expect_error(&case.tensors(), "indices");
    }
}

#[test]
fn error_dtype_mismatch() {
    let case = small(Ty::F32);
    let base = case.tensors();
    let bad: Vec<(usize, Tensor, &str)> = vec![
        // features and weights must share T.
        (2, tensor(Ty::F16, [2, 4, 3], &case.weights), "weights"),
        // T is float32 or float16 only.
        (0, Tensor::i32([2, 3, 5], vec![0; 30]), "features"),
        (0, Tensor::i64([2, 3, 5], vec![0; 30]), "features"),
        (2, Tensor::i32([2, 4, 3], vec![0; 24]), "weights"),
        // indices are int32.
        (1, Tensor::i64([2, 4, 3], vec![0; 24]), "indices"),
        (1, Tensor::f32([2, 4, 3], vec![0.0; 24]), "indices"),
    ];
    for (slot, t, name) in bad {
        let mut ts = base.clone();
        ts[slot] = t;
        let msg = expect_error(&ts, name);
        assert!(msg.contains("dtype"), "{msg}");
    }
    // float16 features with float32 weights: one of the two is named.
    let mut ts = small(Ty::F16).tensors();
    ts[2] = tensor(Ty::F32, [2, 4, 3], &case.weights);
    let err = run_tensors(&ts, &Serial).expect_err("T mismatch");
    let msg = format!("{err}");
    assert!(msg.contains("'weights'") || msg.contains("'features'"), "{msg}");
}

#[test]
fn error_shape_mismatch() {
    for ty in [Ty::F32, Ty::F16] {
        let case = small(ty);
        let base = case.tensors();
        let bad: Vec<(usize, Tensor, &str)> = vec![
            // indices: wrong B, last dimension not 3, rank 2 / 4.
            (1, Tensor::i32([1, 8, 3], case.indices.clone()), "indices"),
            (1, Tensor::i32([2, 6, 2], case.indices.clone()), "indices"),
            (1, Tensor::i32([8, 3], case.indices.clone()), "indices"),
            (1, Tensor::i32([2, 4, 3, 1], case.indices.clone()), "indices"),
            // weights: not [B, N, 3].
            (2, tensor(ty, [2, 12, 1], &case.weights), "weights"),
            (2, tensor(ty, [4, 2, 3], &case.weights), "weights"),
            (2, tensor(ty, [2, 3, 3], &case.weights[..18]), "weights"),
        ];
        for (slot, t, name) in bad {
            let mut ts = base.clone();
            ts[slot] = t;
            let msg = expect_error(&ts, name);
            assert!(msg.contains("shape"), "{msg}");
        }
        // features of rank 2 or 4.
        for shape in [vec![6, 5], vec![2, 3, 5, 1]] {
            let flat = tensor(ty, [2, 3, 5], &case.features);
            let bad = Tensor { shape, data: flat.data };
            expect_error(&[bad, base[1].clone(), base[2].clone()], "features");
        }
    }
}

#[test]
fn error_missing_input() {
    let t = small(Ty::F32).tensors();
    for missing in 0..3 {
        let inputs: Vec<Option<&Tensor>> =
            (0..3).map(|k| if k == missing { None } else { Some(&t[k]) }).collect();
        let err = run(&op(), &inputs, &Serial).expect_err("all inputs are required");
        let name = ["features", "indices", "weights"][missing];
        assert!(format!("{err}").contains(&format!("'{name}'")), "{err}");
    }
}

// ---------------------------------------------------------------- properties

/// Random shapes, M in 0..7, indices mostly in [0, M) and sometimes anywhere (negative,
/// M, extremes), both dtypes, values with zeros and non-finite ones.
fn any_case() -> impl Strategy<Value = Case> {
    (0usize..3, 0usize..5, 0usize..7, 0usize..9, any::<bool>())
        .prop_flat_map(|(b, c, m, n, half)| {
            let mi = m as i32;
            let index = prop_oneof![
                12 => 0..mi.max(1),
                2 => -2..mi + 2,
                1 => Just(i32::MIN),
                1 => Just(i32::MAX),
            ];
            let value = prop_oneof![
                12 => -4.0f32..4.0,
                1 => Just(0.0f32),
                1 => Just(-0.0f32),
                1 => Just(f32::NAN),
                1 => Just(f32::INFINITY),
            ];
            (
                Just((b, c, m, n, half)),
                prop::collection::vec(index, b * n * 3),
                prop::collection::vec(value.clone(), b * c * m),
                prop::collection::vec(value, b * n * 3),
            )
        })
        .prop_map(|((b, c, m, n, half), indices, features, weights)| {
            let ty = if half { Ty::F16 } else { Ty::F32 };
            let features = features.into_iter().map(|x| representable(ty, x)).collect();
            let weights = weights.into_iter().map(|x| representable(ty, x)).collect();
            Case { b, c, m, n, ty, features, indices, weights }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Never a panic; an error naming indices exactly when an index lies outside [0, M);
    /// otherwise the exact float32 evaluation.
    #[test]
    fn random_indices_follow_the_contract(case in any_case(), threads in 1usize..4) {
        // B = 0, M = 0, N > 0: indices hold no value, so no index lies outside [0, M), but
        // the contract's aside "M = 0 with N > 0 is an error" could be read to cover it too.
        let ambiguous = case.b == 0 && case.m == 0 && case.n > 0;
        match run_case(&case, &Threads(threads)) {
            Ok(_) if ambiguous => {}
            Err(err) if ambiguous => prop_assert!(format!("{err}").contains("'indices'"), "{}", err),
            Ok((_, got)) => {
                prop_assert!(!case.index_error(), "accepted an index outside [0, {}): {:?}", case.m, case.indices);
                prop_assert_eq!(canon(case.ty, &got), canon(case.ty, &reference_bits(&case)));
            }
            Err(err) => {
                prop_assert!(case.index_error(), "rejected a valid case: {}", err);
                prop_assert!(format!("{err}").contains("'indices'"), "{}", err);
            }
        }
    }
}
