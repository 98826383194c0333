//! PsRoiPoolBackward against docs/CONTRACT.md §6, through the Rust API.
//!
//! The reference below is written from the contract alone (one loop per top_grad element,
//! as in the R-FCN kernel, with float64 sums); it shares no code with the kernel.

use onnxruntime_ep_mlu::ops::psroipool::backward::PsRoiPoolBackward;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::tensor::Tensor;
use proptest::prelude::*;
mod common;
#[path = "reference/psroipool_backward.rs"]
mod reference;
use common::psroi::Attrs;
use common::{Rng, assert_accumulating};
use reference::{Case, reference};

// ---------------------------------------------------------------- helpers

impl Case {
    fn run(&self, a: Attrs, par: &dyn Parallel) -> Result<Tensor, String> {
        let op: PsRoiPoolBackward = descriptor(&a.map()).map_err(|e| e.to_string())?;
        let t = self.tensors(a);
        let out = run(&op, &[Some(&t[0]), Some(&t[1]), Some(&t[2]), Some(&t[3])], par)
            .map_err(|e| e.to_string())?;
        assert_eq!(out.len(), 1);
        Ok(out.into_iter().next().expect("one output"))
    }

    fn bottom_grad(&self, a: Attrs, par: &dyn Parallel) -> Vec<f32> {
        let t = self.run(a, par).expect("valid case runs");
        let dims: Vec<usize> = self.bottom_shape.iter().map(|&d| d as usize).collect();
        assert_eq!(t.shape, dims, "bottom_grad shape");
        t.data.f32().expect("bottom_grad is float32").to_vec()
    }
}

fn check(case: &Case, a: Attrs, par: &dyn Parallel) {
    let got = case.bottom_grad(a, par);
    assert_accumulating(&got, &reference(case, a), "bottom_grad");
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

/// Random rois inside an image of `img` pixels (the map is img * scale), fractional batch
/// ids, and random mapping_channel values.
fn random_case(rng: &mut Rng, r: usize, a: Attrs, bottom: [usize; 4], img: f32) -> Case {
    let n = r * a.channels();
    let channels = bottom[3] as u64;
    let top = (0..n).map(|_| rng.unit() * 2.0 - 1.0).collect();
    let mapping = (0..n).map(|_| rng.below(channels) as i32).collect();
    let mut rois = Vec::with_capacity(r * 5);
    for _ in 0..r {
        let b = rng.below(bottom[0] as u64) as f32 + rng.unit() * 0.99;
        let (x1, y1) = (rng.unit() * img, rng.unit() * img);
        let (x2, y2) = (x1 + rng.unit() * (img - x1), y1 + rng.unit() * (img - y1));
        rois.extend([b, x1, y1, x2, y2]);
    }
    Case { r, top, rois, mapping, bottom_shape: bottom.iter().map(|&d| d as i64).collect() }
}

fn expect_err(case: &Case, a: Attrs, names: &str) {
    match case.run(a, &Serial) {
        Ok(_) => panic!("expected an error naming {names}"),
        Err(e) => assert!(e.contains(names), "error should name {names}: {e}"),
    }
}

/// A small valid case: 2 rois on a [2, 6, 6, 2*2*3] map.
fn small() -> (Case, Attrs) {
    let a = Attrs::square(2, 0.5, 3);
    let mut rng = Rng(5);
    (random_case(&mut rng, 2, a, [2, 6, 6, 12], 12.0), a)
}

// ---------------------------------------------------------------- semantics

#[test]
fn seed_document_example() {
    // The seed's example (NCHW there, NHWC here): pooled 2, scale 0.25, output_dim 1,
    // two identical rois (0, 1, 2, 2, 3) on batch 0; every bin is pixel (0, 0).
    let a = Attrs::square(2, 0.25, 1);
    let case = Case {
        r: 2,
        top: vec![1.0; 8],
        rois: [0.0, 1.0, 2.0, 2.0, 3.0].repeat(2),
        mapping: [0, 1, 2, 3].repeat(2),
        bottom_shape: vec![2, 3, 3, 4],
    };
    let got = case.bottom_grad(a, &Serial);
    let mut want = vec![0f32; 2 * 3 * 3 * 4];
    want[..4].copy_from_slice(&[2.0; 4]);
    assert_eq!(got, want);
}

#[test]
fn golden_case0_reproduced_exactly() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/mluops/psroipool_backward_case0.json"
    ))
    .expect("golden file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("golden json");
    let attr = |k: &str| &v["attributes"][k];
    let a = Attrs {
        ph: attr("pooled_height").as_i64().expect("int"),
        pw: attr("pooled_width").as_i64().expect("int"),
        scale: attr("spatial_scale").as_f64().expect("float") as f32,
        od: attr("output_dim").as_i64().expect("int"),
    };
    let data = |t: &str| v["inputs"][t]["data"].as_array().expect("data").clone();
    let f32s =
        |t: &str| data(t).iter().map(|x| x.as_f64().expect("number") as f32).collect::<Vec<_>>();
    let top = f32s("top_grad");
    let case = Case {
        r: top.len() / a.channels(),
        top,
        rois: f32s("rois"),
        mapping: data("mapping_channel").iter().map(|x| x.as_i64().expect("int") as i32).collect(),
        bottom_shape: data("bottom_shape").iter().map(|x| x.as_i64().expect("int")).collect(),
    };
    let out = case.run(a, &Threads(2)).expect("golden case runs");
    let want_shape: Vec<usize> = v["outputs"]["bottom_grad"]["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|x| x.as_u64().expect("dim") as usize)
        .collect();
    let want: Vec<u32> = v["outputs"]["bottom_grad"]["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|x| (x.as_f64().expect("number") as f32).to_bits())
        .collect();
    assert_eq!(out.shape, want_shape);
    let got: Vec<u32> = out.data.f32().expect("float32").iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, want);
}

#[test]
fn seed_case_1() {
    // top_grad [320, 7, 7, 8], bottom [2, 14, 14, 392], scale 1.
    let a = Attrs::square(7, 1.0, 8);
    let case = random_case(&mut Rng(1), 320, a, [2, 14, 14, 392], 14.0);
    check(&case, a, &Threads(2));
}

#[test]
fn seed_case_2() {
    // top_grad [493, 3, 3, 21], bottom [8, 14, 14, 189], scale 0.0625.
    let a = Attrs::square(3, 0.0625, 21);
    let case = random_case(&mut Rng(2), 493, a, [8, 14, 14, 189], 224.0);
    check(&case, a, &Threads(2));
}

#[test]
fn deterministic_across_thread_counts() {
    let a = Attrs::square(3, 0.5, 4);
    let case = random_case(&mut Rng(3), 200, a, [3, 9, 11, 36], 22.0);
    let first: Vec<u32> = case.bottom_grad(a, &Serial).iter().map(|v| v.to_bits()).collect();
    let pars: [&dyn Parallel; 4] = [&Threads(1), &Threads(2), &Threads(7), &Threads(2)];
    for par in pars {
        let again: Vec<u32> = case.bottom_grad(a, par).iter().map(|v| v.to_bits()).collect();
        assert_eq!(again, first);
    }
}

#[test]
fn zero_rois_give_all_zero_output() {
    let a = Attrs::square(2, 1.0, 3);
    let case =
        Case { r: 0, top: vec![], rois: vec![], mapping: vec![], bottom_shape: vec![2, 4, 5, 12] };
    let got = case.bottom_grad(a, &Threads(2));
    assert_eq!(got.len(), 2 * 4 * 5 * 12);
    assert!(got.iter().all(|&v| v == 0.0));
}

#[test]
fn empty_bottom_dimensions() {
    let a = Attrs::square(2, 1.0, 1);
    // height 0 and width 0: every bin is empty; batches 0 is only possible with R = 0.
    for shape in [[1, 0, 5, 4], [1, 5, 0, 4], [1, 0, 0, 4]] {
        let case = random_case(&mut Rng(4), 3, a, shape, 6.0);
        assert!(case.bottom_grad(a, &Serial).is_empty());
    }
    let case =
        Case { r: 0, top: vec![], rois: vec![], mapping: vec![], bottom_shape: vec![0, 3, 3, 4] };
    assert!(case.bottom_grad(a, &Serial).is_empty());
}

#[test]
fn non_finite_rois_contribute_nothing() {
    let a = Attrs::square(2, 1.0, 1);
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    for k in 0..5 {
        for s in specials {
            let mut roi = vec![0.0, 1.0, 1.0, 4.0, 4.0];
            roi[k] = s;
            let case = Case {
                r: 1,
                top: vec![1.0; 4],
                rois: roi,
                mapping: vec![0, 1, 2, 3],
                bottom_shape: vec![1, 6, 6, 4],
            };
            let got = case.bottom_grad(a, &Serial);
            assert!(got.iter().all(|&v| v == 0.0), "roi value {k} = {s}");
        }
    }
}

#[test]
fn non_finite_roi_is_not_batch_checked() {
    // Reading: the batch_id rule applies to rois whose five values are finite; a roi with a
    // non-finite value contributes nothing, whatever its batch id.
    let a = Attrs::square(1, 1.0, 1);
    for roi in [[7.0, f32::NAN, 0.0, 1.0, 1.0], [-3.0, 0.0, 0.0, f32::INFINITY, 1.0], [f32::NAN; 5]]
    {
        let case = Case {
            r: 1,
            top: vec![1.0],
            rois: roi.to_vec(),
            mapping: vec![0],
            bottom_shape: vec![1, 2, 2, 1],
        };
        assert!(case.bottom_grad(a, &Serial).iter().all(|&v| v == 0.0), "{roi:?}");
    }
}

#[test]
fn overflowing_scaled_values_contribute_nothing() {
    // start overflows (3e38 * 2), or the bin size does (end - start = inf).
    let a = Attrs::square(2, 2.0, 1);
    for roi in [
        [0.0, 3.0e38, 0.0, 3.0e38, 1.0],
        [0.0, 0.0, -3.0e38, 1.0, 1.0],
        [0.0, -3.0e38, 0.0, 3.0e38, 1.0],
    ] {
        let case = Case {
            r: 1,
            top: vec![1.0; 4],
            rois: roi.to_vec(),
            mapping: vec![0, 1, 2, 3],
            bottom_shape: vec![1, 5, 5, 4],
        };
        assert_eq!(
            reference(&case, a).iter().filter(|&&v| v != 0.0).count(),
            0,
            "reference agrees: {roi:?}"
        );
        assert!(case.bottom_grad(a, &Serial).iter().all(|&v| v == 0.0), "{roi:?}");
    }
}

#[test]
fn huge_finite_coordinates_are_clamped() {
    // Finite scaled values far outside the map: clamped in float, never an out-of-bounds index.
    let a = Attrs::square(3, 1.0, 2);
    let rois = [
        [0.0, -1.0e30, -1.0e30, 1.0e30, 1.0e30],
        [0.0, -1.0e30, 2.0, 3.0, 1.0e30],
        [0.0, 1.0e20, 1.0e20, 2.0e20, 2.0e20],
        [0.0, -1.0e20, -1.0e20, -5.0e19, -5.0e19],
        [0.0, 1.0e38, -1.0e38, 1.0e38, 1.0e38],
    ];
    let mut rng = Rng(8);
    let mut case = random_case(&mut rng, rois.len(), a, [1, 4, 5, 18], 5.0);
    case.rois = rois.iter().flatten().copied().collect();
    check(&case, a, &Threads(2));
    assert!(reference(&case, a).iter().any(|&v| v != 0.0), "some roi covers the map");
}

#[test]
fn rois_outside_the_map_contribute_nothing() {
    let a = Attrs::square(2, 0.5, 1);
    for roi in [
        [0.0, 40.0, 0.0, 60.0, 5.0],
        [0.0, 0.0, 40.0, 5.0, 60.0],
        [0.0, -60.0, -60.0, -30.0, -30.0],
    ] {
        let case = Case {
            r: 1,
            top: vec![1.0; 4],
            rois: roi.to_vec(),
            mapping: vec![0, 1, 2, 3],
            bottom_shape: vec![1, 6, 6, 4],
        };
        assert!(case.bottom_grad(a, &Serial).iter().all(|&v| v == 0.0), "{roi:?}");
    }
}

#[test]
fn fractional_batch_ids_truncate_toward_zero() {
    let a = Attrs::square(1, 1.0, 1);
    // 1.9 -> 1; -0.7 -> 0 (truncation, not floor); 0.5 -> 0.
    for (batch_id, want) in [(1.9f32, 1usize), (-0.7, 0), (0.5, 0), (2.999, 2)] {
        let case = Case {
            r: 1,
            top: vec![3.0],
            rois: vec![batch_id, 0.0, 0.0, 0.0, 0.0],
            mapping: vec![0],
            bottom_shape: vec![3, 2, 2, 1],
        };
        let got = case.bottom_grad(a, &Serial);
        let hit: Vec<usize> =
            got.iter().enumerate().filter(|(_, v)| **v != 0.0).map(|(k, _)| k / 4).collect();
        assert_eq!(hit, vec![want], "batch_id {batch_id}");
    }
}

#[test]
fn negative_zero_is_batch_zero_and_coordinate_zero() {
    let a = Attrs::square(1, 1.0, 1);
    let case = Case {
        r: 1,
        top: vec![2.0],
        rois: vec![-0.0, -0.0, -0.0, -0.0, -0.0],
        mapping: vec![0],
        bottom_shape: vec![1, 2, 2, 1],
    };
    // round(-0) = -0, start = -0 -> floor -0 -> 0; end = (−0 + 1) * 1 = 1: pixel (0, 0), area 1.
    assert_eq!(case.bottom_grad(a, &Serial), vec![2.0, 0.0, 0.0, 0.0]);
}

#[test]
fn round_half_away_from_zero() {
    // x1 = 0.5 rounds to 1 (not 0 as round-half-even would): bin starts at column 1.
    let a = Attrs::square(1, 1.0, 1);
    let case = Case {
        r: 1,
        top: vec![4.0],
        rois: vec![0.0, 0.5, 0.0, 1.5, 0.0],
        mapping: vec![0],
        bottom_shape: vec![1, 1, 4, 1],
    };
    // round(1.5) = 2 -> end_w = 3: columns 1 and 2, area 2.
    assert_eq!(case.bottom_grad(a, &Serial), vec![0.0, 2.0, 2.0, 0.0]);
    // -0.5 rounds to -1: the bin spans columns -1..3, clamped to 0..3 before the area
    // is taken, so area 3 and each of columns 0, 1, 2 gets 1.
    let case = Case {
        r: 1,
        top: vec![3.0],
        rois: vec![0.0, -0.5, 0.0, 1.5, 0.0],
        mapping: vec![0],
        bottom_shape: vec![1, 1, 4, 1],
    };
    assert_eq!(case.bottom_grad(a, &Serial), vec![1.0, 1.0, 1.0, 0.0]);
}

#[test]
fn nan_and_inf_in_top_grad_propagate() {
    let a = Attrs::square(2, 1.0, 2);
    let mut case = random_case(&mut Rng(9), 6, a, [2, 5, 5, 8], 5.0);
    case.top[0] = f32::NAN;
    case.top[9] = f32::INFINITY;
    case.top[17] = f32::NEG_INFINITY;
    let want = reference(&case, a);
    assert!(want.iter().any(|v| !v.is_finite()), "case reaches the map");
    check(&case, a, &Threads(2));
}

#[test]
fn min_roi_extent_is_a_tenth() {
    // x2 < x1: end - start is negative, the roi width becomes 0.1, bin width 0.1 / 1.
    let a = Attrs::square(1, 1.0, 1);
    let case = Case {
        r: 1,
        top: vec![5.0],
        rois: vec![0.0, 2.0, 1.0, -4.0, 1.0],
        mapping: vec![0],
        bottom_shape: vec![1, 3, 4, 1],
    };
    // w: floor(2) = 2, ceil(2.1) = 3; h: floor(1) = 1, ceil(1 + 1) = 2.
    let mut want = vec![0f32; 12];
    want[4 + 2] = 5.0;
    assert_eq!(case.bottom_grad(a, &Serial), want);
}

// ---------------------------------------------------------------- errors (one per rule)

#[test]
fn pooled_height_not_equal_pooled_width_is_error() {
    let (case, _) = small();
    expect_err(&case, Attrs { ph: 2, pw: 3, scale: 0.5, od: 3 }, "pooled_width");
}

#[test]
fn pooled_height_below_one_is_error() {
    let (case, _) = small();
    for p in [0, -1, i64::MIN] {
        expect_err(&case, Attrs::square(p, 0.5, 3), "pooled_height");
    }
}

#[test]
fn output_dim_below_one_is_error() {
    let (case, _) = small();
    for od in [0, -2] {
        expect_err(&case, Attrs::square(2, 0.5, od), "output_dim");
    }
}

#[test]
fn spatial_scale_not_positive_is_error() {
    let (case, _) = small();
    for s in [0.0, -0.0, -1.0, -f32::MIN_POSITIVE] {
        expect_err(&case, Attrs::square(2, s, 3), "spatial_scale");
    }
}

#[test]
fn spatial_scale_non_finite_is_error() {
    let (case, _) = small();
    for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        expect_err(&case, Attrs::square(2, s, 3), "spatial_scale");
    }
}

#[test]
fn attribute_product_overflow_is_error() {
    let (case, _) = small();
    expect_err(&case, Attrs::square(1 << 31, 0.5, 1 << 20), "output_dim");
}

#[test]
fn missing_attribute_is_error() {
    for name in ["pooled_height", "pooled_width", "spatial_scale", "output_dim"] {
        let mut m = Attrs::square(2, 0.5, 3).map();
        m.remove(name);
        let e = descriptor::<PsRoiPoolBackward>(&m).expect_err("all four attributes are required");
        assert!(e.to_string().contains(name), "{e}");
    }
}

#[test]
fn bottom_shape_not_four_values_is_error() {
    let (mut case, a) = small();
    for shape in [vec![2, 6, 6], vec![2, 6, 6, 12, 1], vec![]] {
        case.bottom_shape = shape;
        expect_err(&case, a, "bottom_shape");
    }
    // Four values, but not as a 1-D tensor.
    let (case, a) = small();
    let t = case.tensors(a);
    let shape2d = Tensor::i64([2, 2], vec![2, 6, 6, 12]);
    let e = run(
        &a.op::<PsRoiPoolBackward>(),
        &[Some(&t[0]), Some(&t[1]), Some(&t[2]), Some(&shape2d)],
        &Serial,
    )
    .expect_err("2-D bottom_shape");
    assert!(e.to_string().contains("bottom_shape"), "{e}");
}

#[test]
fn bottom_shape_negative_value_is_error() {
    let (case, a) = small();
    for k in 0..4 {
        let mut c = case.clone();
        c.bottom_shape[k] = -1;
        expect_err(&c, a, "bottom_shape");
    }
}

#[test]
fn channels_not_pooled_area_times_output_dim_is_error() {
    let (case, a) = small();
    for ch in [11, 13, 0, 198] {
        let mut c = case.clone();
        c.bottom_shape[3] = ch;
        expect_err(&c, a, "bottom_shape");
    }
}

#[test]
fn bottom_grad_size_overflow_is_error() {
    let a = Attrs::square(1, 1.0, 1);
    let case = Case {
        r: 0,
        top: vec![],
        rois: vec![],
        mapping: vec![],
        bottom_shape: vec![1 << 40, 1 << 20, 1 << 20, 1],
    };
    expect_err(&case, a, "bottom_shape");
}

#[test]
fn batch_id_outside_batches_is_error() {
    let (case, a) = small();
    // batches is 2: 2.0 and 2.5 truncate to 2; -1.0 and -1.5 to -1; 1e30 far out.
    for b in [2.0, 2.5, -1.0, -1.5, 1e30, f32::MAX] {
        let mut c = case.clone();
        c.rois[5] = b;
        expect_err(&c, a, "rois");
    }
}

#[test]
fn mapping_channel_outside_channels_is_error() {
    let (case, a) = small();
    for v in [-1, 12, i32::MIN, i32::MAX] {
        let mut c = case.clone();
        let last = c.mapping.len() - 1;
        c.mapping[last] = v;
        expect_err(&c, a, "mapping_channel");
    }
}

#[test]
fn mapping_channel_checked_even_for_rois_that_contribute_nothing() {
    let (mut case, a) = small();
    case.rois[1] = f32::NAN;
    case.mapping[0] = 12;
    expect_err(&case, a, "mapping_channel");
}

#[test]
fn top_grad_shape_mismatch_is_error() {
    let (case, a) = small();
    let t = case.tensors(a);
    for top in [
        Tensor::f32([2, 2, 2, 4], vec![0.0; 32]),
        Tensor::f32([2, 3, 2, 3], vec![0.0; 36]),
        Tensor::f32([2, 12], vec![0.0; 24]),
    ] {
        let e = run(
            &a.op::<PsRoiPoolBackward>(),
            &[Some(&top), Some(&t[1]), Some(&t[2]), Some(&t[3])],
            &Serial,
        )
        .expect_err("bad top_grad");
        assert!(e.to_string().contains("top_grad"), "{e}");
    }
}

#[test]
fn rois_shape_mismatch_is_error() {
    let (case, a) = small();
    let t = case.tensors(a);
    for rois in [
        Tensor::f32([3, 5], vec![0.0; 15]),
        Tensor::f32([2, 4], vec![0.0; 8]),
        Tensor::f32([10], vec![0.0; 10]),
    ] {
        let e = run(
            &a.op::<PsRoiPoolBackward>(),
            &[Some(&t[0]), Some(&rois), Some(&t[2]), Some(&t[3])],
            &Serial,
        )
        .expect_err("bad rois");
        assert!(e.to_string().contains("rois"), "{e}");
    }
}

#[test]
fn mapping_channel_shape_mismatch_is_error() {
    let (case, a) = small();
    let t = case.tensors(a);
    for m in [Tensor::i32([1, 2, 2, 3], vec![0; 12]), Tensor::i32([2, 2, 2, 2], vec![0; 16])] {
        let e = run(
            &a.op::<PsRoiPoolBackward>(),
            &[Some(&t[0]), Some(&t[1]), Some(&m), Some(&t[3])],
            &Serial,
        )
        .expect_err("bad mapping_channel");
        assert!(e.to_string().contains("mapping_channel"), "{e}");
    }
}

#[test]
fn dtype_mismatch_is_error() {
    let (case, a) = small();
    let t = case.tensors(a);
    let op = a.op::<PsRoiPoolBackward>();
    let top_i = Tensor::i32([2, 2, 2, 3], vec![0; 24]);
    let rois_i = Tensor::i32([2, 5], vec![0; 10]);
    let map_f = Tensor::f32([2, 2, 2, 3], vec![0.0; 24]);
    let shape_i = Tensor::i32([4], vec![2, 6, 6, 12]);
    let cases: [([&Tensor; 4], &str); 4] = [
        ([&top_i, &t[1], &t[2], &t[3]], "top_grad"),
        ([&t[0], &rois_i, &t[2], &t[3]], "rois"),
        ([&t[0], &t[1], &map_f, &t[3]], "mapping_channel"),
        ([&t[0], &t[1], &t[2], &shape_i], "bottom_shape"),
    ];
    for (inputs, name) in cases {
        let e = run(&op, &inputs.map(Some), &Serial).expect_err("dtype mismatch");
        assert!(e.to_string().contains(name), "{e}");
    }
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
        1 => Just(1.0e20f32),
    ]
}

/// A batch id as a function of `batches`: mostly inside [0, batches) (possibly
/// fractional), sometimes just outside, -0.0, or non-finite.
fn batch_id() -> impl Strategy<Value = fn(f32, f32) -> f32> {
    // (batches, uniform in [0, 1)) -> batch id
    let inside: fn(f32, f32) -> f32 = |b, u| (u * b).min(b - 0.01).max(0.0);
    let integer: fn(f32, f32) -> f32 = |b, u| (u * b).floor();
    let at_end: fn(f32, f32) -> f32 = |b, u| b + u * 0.9;
    let negative: fn(f32, f32) -> f32 = |_, u| -1.0 - u;
    let small_negative: fn(f32, f32) -> f32 = |_, u| -0.99 * u;
    let neg_zero: fn(f32, f32) -> f32 = |_, _| -0.0;
    let nan: fn(f32, f32) -> f32 = |_, _| f32::NAN;
    let inf: fn(f32, f32) -> f32 = |_, _| f32::INFINITY;
    prop_oneof![
        12 => Just(inside),
        6 => Just(integer),
        1 => Just(at_end),
        1 => Just(negative),
        1 => Just(small_negative),
        1 => Just(neg_zero),
        1 => Just(nan),
        1 => Just(inf),
    ]
}

fn scale() -> impl Strategy<Value = f32> {
    prop_oneof![
        16 => prop::sample::select(vec![0.0625f32, 0.25, 0.5, 1.0, 2.0, 1.3]),
        1 => Just(0.0f32),
        1 => Just(-0.5f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
    ]
}

/// Whether the contract accepts these inputs, computed from its rules.
fn contract_accepts(a: Attrs, case: &Case) -> bool {
    let attrs_ok = a.ph >= 1 && a.ph == a.pw && a.od >= 1 && a.scale.is_finite() && a.scale > 0.0;
    if !attrs_ok {
        return false;
    }
    let s = &case.bottom_shape;
    if s.len() != 4 || s.iter().any(|&d| d < 0) || s[3] != a.channels() as i64 {
        return false;
    }
    let batch_ok = case.rois.chunks(5).all(|roi| {
        roi.iter().any(|v| !v.is_finite()) || {
            let b = roi[0].trunc();
            b >= 0.0 && (b as f64) < s[0] as f64
        }
    });
    batch_ok && case.mapping.iter().all(|&c| c >= 0 && (c as i64) < s[3])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random attributes, bottom_shape, rois and mapping_channel, valid and not: never a
    /// panic, Err exactly when the contract says, agreement with the reference otherwise.
    #[test]
    fn random_inputs_follow_the_contract(
        (ph, pw, od) in (prop_oneof![1 => Just(0i64), 8 => 1i64..4], 0i64..4, prop_oneof![1 => Just(0i64), 8 => 1i64..3]),
        equal_pools in prop::bool::weighted(0.9),
        scale in scale(),
        r in 0usize..5,
        (batches, height, width) in (prop_oneof![1 => Just(0i64), 6 => 1i64..4], 0i64..7, 0i64..7),
        channel_delta in prop_oneof![16 => Just(0i64), 1 => Just(1i64), 1 => Just(-1i64)],
        negative_dim in prop::option::weighted(0.05, 0usize..4),
        shape_len in prop_oneof![20 => Just(4usize), 1 => Just(3usize), 1 => Just(5usize)],
        batch_ids in prop::collection::vec((batch_id(), 0.0f32..1.0), 5),
        coords in prop::collection::vec(roi_coordinate(), 20),
        mapping_seed in prop::collection::vec(-1i32..40, 108),
        bad_mapping in prop::bool::weighted(0.05),
        top in prop::collection::vec(-10.0f32..10.0, 108),
    ) {
        let a = Attrs { ph, pw: if equal_pools { ph } else { pw }, scale, od };
        // Tensors need non-negative dims; invalid pooled sizes are still checked (as
        // attributes) with 1-sized tensors.
        let (p, q, o) = (ph.max(1) as usize, a.pw.max(1) as usize, od.max(1) as usize);
        let n = r * p * q * o;
        let want_channels = (a.ph * a.pw * a.od).max(0);
        let channels = (want_channels + channel_delta).max(0);
        let mut bottom_shape = vec![batches, height, width, channels, 1];
        bottom_shape.truncate(shape_len);
        if let Some(k) = negative_dim
            && k < bottom_shape.len()
        {
            bottom_shape[k] = -1;
        }
        let mut rois = Vec::new();
        for k in 0..r {
            let (id, u) = batch_ids[k];
            rois.push(id(batches as f32, u));
            rois.extend_from_slice(&coords[k * 4..k * 4 + 4]);
        }
        let mut mapping: Vec<i32> = (0..n).map(|k| mapping_seed[k] % (channels.max(1) as i32 + 1)).collect();
        // Mostly valid values; some runs keep the out-of-range ones.
        if !bad_mapping {
            for v in &mut mapping {
                *v = v.rem_euclid(channels.max(1) as i32);
            }
        }
        let case = Case { r, top: top[..n].to_vec(), rois, mapping, bottom_shape };
        let tensors_attrs = Attrs { ph: p as i64, pw: q as i64, scale, od: o as i64 };
        let t = case.tensors(tensors_attrs);
        let result = descriptor::<PsRoiPoolBackward>(&a.map())
            .and_then(|op| run(&op, &[Some(&t[0]), Some(&t[1]), Some(&t[2]), Some(&t[3])], &Threads(2)));
        let accepts = contract_accepts(a, &case);
        prop_assert_eq!(result.is_ok(), accepts, "{:?} {:?}: {:?}", a, case, result.as_ref().err());
        if let Ok(out) = result {
            let got = out[0].data.f32().expect("float32").to_vec();
            assert_accumulating(&got, &reference(&case, a), "bottom_grad");
        }
    }
}
