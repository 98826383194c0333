//! The accumulating judge (`common::judge_accumulating`, which the suites and the fuzz
//! oracle share): its per-element bound rejects single wrong elements that diff1 and diff2
//! alone pass, at network scale; one planted wrong element (zeroed, sign-flipped, 1% off)
//! fails it in VoxelPoolingForward's, IndiceConv's and PsRoiPool's outputs (the BANG kernel
//! tests, tests/bang_kernels.rs, plant it in the card's VoxelPoolingForward,
//! ThreeInterpolateBackward and PsRoiPoolBackward outputs).

use onnxruntime_ep_mlu::ops::psroipool::PsRoiPool;
use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;
use onnxruntime_ep_mlu::ops::sparse_conv::indice_conv::IndiceConv;
use onnxruntime_ep_mlu::ops::voxel_pooling::forward::VoxelPoolingForward;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::Threads;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use std::collections::{BTreeSet, HashMap};
mod common;
use common::psroi::Attrs as PsRoiAttrs;
use common::{
    ELEM_REL, ELEM_REL_F16, Rng, assert_rejects_planted, judge_accumulating, judge_against_terms,
};
#[path = "reference/get_indice_pairs.rs"]
#[allow(dead_code)]
mod gip_reference;
#[path = "reference/indice_conv.rs"]
#[allow(dead_code)]
mod indice_conv_reference;
#[path = "reference/psroipool.rs"]
#[allow(dead_code)]
mod psroipool_reference;

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
/// kernel on 60,000 points per batch (bang_kernels' reduced network scale).
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

#[test]
fn cancelling_terms_are_judged_against_their_magnitude_and_wrong_elements_still_fail() {
    // The PsRoiPoolBackward fuzz finding (its input in fuzz/corpus/psroipool_backward): the
    // output's one nonzero cell adds these; the CPU in bin order gets 0, the card's atomics
    // in another order 1e-40. Against the CPU result's rms (0) the card fails; against the
    // terms' magnitude (27.25) it is well within the class.
    let terms = [1e-40f32, -13.625, 4.5, 9.125];
    let in_order = terms.iter().fold(0f32, |s, &x| s + x);
    let reordered = terms.iter().rev().fold(0f32, |s, &x| s + x);
    assert_eq!((in_order, reordered), (0.0, 1e-40));
    let magnitude: f64 = terms.iter().map(|x| f64::from(x.abs())).sum();
    let (want, t) = ([f64::from(in_order), 0.0], [magnitude, 0.0]);
    judge_accumulating(&[reordered, 0.0], &want, ELEM_REL).expect_err("no rms to scale by");
    judge_against_terms(&[reordered, 0.0], &want, &t, ELEM_REL).expect("within the class");
    // Beyond the class: off by just over E x 27.25, a term lost, and the empty cell nonzero.
    for got in [[9e-4, 0.0], [4.5, 0.0], [-13.625, 0.0], [reordered, 1e-40]] {
        judge_against_terms(&got, &want, &t, ELEM_REL).expect_err(&format!("{got:?}"));
    }
    // A thousand sums of four random signed terms: float32 in order passes; the median
    // element zeroed, sign-flipped or 1% off fails, as under the rms rule.
    let mut rng = Rng(50);
    let sums: Vec<[f32; 4]> = (0..1000).map(|_| [(); 4].map(|_| rng.f32())).collect();
    let got: Vec<f32> = sums.iter().map(|s| s.iter().sum()).collect();
    let want: Vec<f64> = sums.iter().map(|s| s.iter().map(|&x| f64::from(x)).sum()).collect();
    let t: Vec<f64> = sums.iter().map(|s| s.iter().map(|x| f64::from(x.abs())).sum()).collect();
    judge_against_terms(&got, &want, &t, ELEM_REL).expect("float32 sums pass");
    assert_rejects_planted(&got, &want, ELEM_REL, "four-term sums, rms rule");
    let mut order: Vec<usize> = (0..got.len()).collect();
    order.sort_by(|&i, &j| want[i].abs().total_cmp(&want[j].abs()));
    let at = order[order.len() / 2];
    for value in [0.0, -got[at], got[at] * 1.01] {
        let mut planted = got.clone();
        planted[at] = value;
        judge_against_terms(&planted, &want, &t, ELEM_REL)
            .expect_err(&format!("element {at}: {} -> {value}", got[at]));
    }
}

#[test]
fn an_element_whose_terms_overflowed_must_equal_its_reference() {
    // A float16 sum of magnitudes past 65,504 is inf: it bounds nothing, so only the exact
    // value passes (a finite reference, its terms' magnitude infinite).
    let (want, t) = ([3.0f64, -1.5], [f64::INFINITY, f64::INFINITY]);
    judge_against_terms(&[3.0, -1.5], &want, &t, ELEM_REL).expect("equal passes");
    judge_against_terms(&[3.0, 1e30], &want, &t, ELEM_REL).expect_err("no bound: not equal");
    judge_against_terms(&[3.0, -1.5], &want, &[f64::NAN, 1.0], ELEM_REL).expect("equal passes");
    judge_against_terms(&[3.5, -1.5], &want, &[f64::NAN, 1.0], ELEM_REL).expect_err("NaN terms");
}

/// The CPU kernel's outputs of `op` on `inputs` (valid inputs expected).
fn cpu<O: onnxruntime_ep_mlu::ops::Operator>(op: &O, inputs: &[Tensor]) -> Vec<Tensor> {
    let inputs: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
    run(op, &inputs, &Threads(2)).expect("the CPU kernel runs")
}

#[test]
fn one_wrong_element_of_a_network_scale_indice_conv_output_fails() {
    // CenterPoint's encoder1 submanifold convolution (3 x 3 x 3, 16 -> 16) on its CI grid
    // (41 x 360 x 360, about 65k voxels: networks/README.md): half the cells of a two-cell
    // thick sloping surface over half the grid, about 9 pairs a site as the simulated scan's
    // rulebook has (9.4); the rulebook from the GetIndicePairs CPU kernel.
    let spatial = [41i64, 360, 360];
    let mut rng = Rng(461);
    let mut sites = BTreeSet::new();
    for y in 0..180 {
        for x in 0..360 {
            let ground = 8 + (x + y) / 120;
            for z in [ground, ground + 1] {
                if rng.next().is_multiple_of(2) {
                    sites.insert([0, z, y, x]);
                }
            }
        }
    }
    let sites: Vec<[i32; 4]> = sites.into_iter().collect();
    let l = sites.len();
    assert!((55_000..75_000).contains(&l), "{l} sites");
    let geometry = gip_reference::Attrs::new(1, spatial, [3, 3, 3]).padding([1, 1, 1]).subm();
    let gip: GetIndicePairs = descriptor(&geometry.map()).expect("valid GetIndicePairs attributes");
    let rulebook = cpu(&gip, &[Tensor::i32([l, 4], sites.concat())]);
    let data = |t: &Tensor| t.data.i32().expect("int32 rulebook").to_vec();
    let (cin, cout) = (16, 16);
    let conv = indice_conv_reference::Conv {
        l,
        cin,
        cout,
        k: 27,
        p: l,
        num_out: rulebook[1].shape[0],
        features: (0..l * cin).map(|_| rng.f32()).collect(),
        filters: (0..27 * cin * cout).map(|_| rng.f32() * 0.05).collect(),
        pairs: data(&rulebook[0]),
        num: data(&rulebook[2]),
        out_indices: data(&rulebook[1]),
        out_d: 4,
        bias: None,
    };
    let pairs: i32 = conv.num.iter().sum();
    assert!(pairs as usize > 8 * l, "{pairs} pairs for {l} sites");
    println!("IndiceConv: {l} sites, {pairs} pairs");
    let op: IndiceConv = descriptor(&indice_conv_reference::attrs(0)).expect("valid attributes");
    let out = cpu(&op, &conv.tensors());
    let got = out[0].data.f32().expect("float32 output").to_vec();
    assert_eq!(got.len(), l * cout);
    let want = indice_conv_reference::reference(&conv, false);
    assert_rejects_planted(&got, &want, ELEM_REL, "IndiceConv output");
}

#[test]
fn one_wrong_element_of_a_network_scale_psroipool_output_fails() {
    // R-FCN's head at its full scale (networks/rfcn.py): a 38 x 63 map of 7 x 7 x 21 score
    // channels, 300 rois on the stride-16 grid (1 to 34 cells a side), values in [-1, 1).
    let (height, width, r) = (38usize, 63usize, 300usize);
    let a = PsRoiAttrs::square(7, 1.0 / 16.0, 21);
    let shape = [1, height, width, a.channels()];
    let mut rng = Rng(462);
    let input = (0..shape.iter().product::<usize>()).map(|_| rng.f32()).collect();
    let mut rois = Vec::with_capacity(r * 5);
    for _ in 0..r {
        let side = |rng: &mut Rng, extent: usize| 1 + rng.next() as usize % 34.min(extent - 2);
        let (w, h) = (side(&mut rng, width), side(&mut rng, height));
        let (x0, y0) = (rng.next() as usize % (width - w), rng.next() as usize % (height - h));
        let px = |cells: usize| (cells * 16) as f32;
        rois.extend([0.0, px(x0), px(y0), px(x0 + w) - 1.0, px(y0 + h) - 1.0]);
    }
    let case = psroipool_reference::Case { shape, input, r, rois };
    let (x, rois) = case.tensors();
    let out = cpu(&a.op::<PsRoiPool>(), &[x, rois]);
    let got = out[0].data.f32().expect("float32 output").to_vec();
    assert_eq!(got.len(), r * 7 * 7 * 21);
    let want = psroipool_reference::reference(&case, a).out64;
    assert_rejects_planted(&got, &want, ELEM_REL, "PsRoiPool output");
}
