//! DynamicScatter's BANG kernels (bounds, linear, mark and rank, index, reduce) against its
//! CPU kernel.

use super::*;
use onnxruntime_ep_mlu::ops::Kernel;
use onnxruntime_ep_mlu::ops::device::{
    Bang, CardBackends, CardNode, Ran, path, run_node_on_device,
};
use onnxruntime_ep_mlu::ops::dynamic_scatter::DynamicScatter;
use onnxruntime_ep_mlu::ops::dynamic_scatter::bang::BOX_CELLS;

const REDUCES: [&str; 3] = ["max", "mean", "sum"];

fn op(reduce: &str) -> DynamicScatter {
    descriptor(&HashMap::from([("reduce_type".to_string(), AttrValue::String(reduce.to_string()))]))
        .unwrap()
}

/// Features drawn from `levels` values (ties), with NaN and signed zeros among them
/// when `odd`; otherwise 24-bit fractions in [-1, 1) when `levels` is 0.
fn feats(rng: &mut Rng, len: usize, levels: u64, odd: bool) -> Vec<f32> {
    (0..len)
        .map(|_| {
            if levels == 0 {
                return rng.f32();
            }
            match (odd, rng.below(levels)) {
                (true, 0) => f32::NAN,
                (true, 1) => -0.0,
                (true, 2) => 0.0,
                (_, k) => k as f32 * 0.25 - 1.0,
            }
        })
        .collect()
}

/// Every output of the card bit for bit the CPU kernel's (NaN payloads canonical), for
/// each reduction; returns M.
fn check(f: &Tensor, coors: &Tensor) -> usize {
    let mut m = 0;
    for reduce in REDUCES {
        let (cpu, mlu) = both(&op(reduce), &[Some(f), Some(coors)]);
        let what = format!("{reduce} (feats {:?}, coors {:?})", f.shape, coors.shape);
        for (i, name) in
            ["voxel_feats", "voxel_coors", "point2voxel_map", "voxel_points_count", "voxel_num"]
                .iter()
                .enumerate()
        {
            match (&cpu[i].data, &mlu[i].data) {
                (OwnedData::F32(a), OwnedData::F32(b)) => {
                    // Signed zeros kept; NaN payloads canonical.
                    let bits = |v: &[f32]| -> Vec<u32> {
                        v.iter()
                            .map(|&x| if x.is_nan() { 0x7FC0_0000 } else { x.to_bits() })
                            .collect()
                    };
                    let (a, b) = (bits(a), bits(b));
                    if let Some(k) = (0..a.len()).find(|&k| a[k] != b[k]) {
                        panic!("{what}: {name}[{k}]: CPU {:#x} MLU {:#x}", a[k], b[k]);
                    }
                }
                _ => assert_exact(&cpu[i], &mlu[i], &format!("{what}: {name}")),
            }
        }
        m = cpu[4].data.i32().expect("voxel_num")[0] as usize;
    }
    m
}

/// N points of C channels with D coordinates each in [-1, range) (a -1 drops the point).
fn case(seed: u64, n: usize, c: usize, d: usize, range: i64, levels: u64, odd: bool) -> usize {
    let mut rng = Rng(seed);
    let coors: Vec<i32> = (0..n * d).map(|_| rng.int(-1, range - 1) as i32).collect();
    let f = Tensor::f32([n, c], feats(&mut rng, n * c, levels, odd));
    check(&f, &Tensor::i32([n, d], coors))
}

#[test]
fn small_random_cases_with_ties_nan_signed_zeros_and_dropped_points() {
    assert!(case(1, 10, 3, 3, 3, 3, false) > 0);
    assert!(case(2, 300, 33, 3, 4, 4, true) > 5);
    assert!(case(3, 500, 7, 1, 40, 2, true) > 5);
    assert!(case(4, 1000, 5, 4, 5, 0, false) > 5);
    // Many points per voxel: long sums, ties everywhere.
    assert!(case(5, 2000, 16, 2, 3, 5, true) > 1);
    // D = 6, a sparse box.
    assert!(case(6, 400, 4, 6, 6, 0, true) > 5);
}

#[test]
fn empty_cases() {
    // No point; every point dropped; no channel.
    assert_eq!(case(7, 0, 4, 3, 4, 3, false), 0);
    let f = Tensor::f32([5, 2], vec![1.0; 10]);
    assert_eq!(check(&f, &Tensor::i32([5, 2], vec![-1, 0, 3, -2, -1, -1, 0, -5, 7, -1])), 0);
    assert!(case(8, 300, 0, 3, 4, 3, false) > 5);
}

/// Coordinates far from 0 (the box starts at their least values), one voxel, and values
/// whose float32 sums depend on their order.
#[test]
fn offset_boxes_and_order_sensitive_sums() {
    let mut rng = Rng(9);
    let n = 3000;
    let coors: Vec<i32> =
        (0..n * 3).map(|i| [1_000_000, 70_000, 5][i % 3] + rng.int(0, 9) as i32).collect();
    let f: Vec<f32> =
        (0..n * 8).map(|_| rng.f32() * [1.0, 1e7, 1e-7][rng.below(3) as usize]).collect();
    assert!(check(&Tensor::f32([n, 8], f), &Tensor::i32([n, 3], coors)) > 500);
    let one = Tensor::i32([4, 2], vec![3, 4, 3, 4, 3, 4, 3, 4]);
    assert_eq!(check(&Tensor::f32([4, 1], vec![0.1, 0.2, 0.3, f32::NAN]), &one), 1);
}

#[test]
fn several_voxel_chunks_and_point_tiles_on_every_core() {
    // C 600: about 130 voxels and 130 points per reduce tile; M in the thousands.
    assert!(case(10, 6000, 600, 2, 80, 0, true) > 2000);
}

/// Distinct denormal features: under MLU_EMU_FTZ=1 the card gives the CPU kernel's
/// result on the inputs flushed to zero (docs/CONTRACT.md §2.5's card that flushes), max
/// only (a sum of flushed inputs can itself be denormal).
#[test]
fn denormal_features() {
    let mut rng = Rng(11);
    let (n, c) = (400, 9);
    let levels =
        [f32::from_bits(1), f32::from_bits(0x0004_0000), -f32::from_bits(0x1000), 0.0, 2.0];
    let raw: Vec<f32> = (0..n * c).map(|_| levels[rng.below(5) as usize]).collect();
    let coors = Tensor::i32([n, 2], (0..n * 2).map(|_| rng.int(0, 4) as i32).collect());
    let ftz = device().info.emulated && std::env::var("MLU_EMU_FTZ").is_ok_and(|v| v == "1");
    // A flushing card compares a denormal as a zero of its sign; the winner it copies
    // keeps its bits, so its output is flushed alike before the exact comparison.
    let flush = |v: &[f32]| -> Vec<f32> {
        v.iter().map(|&x| if ftz && x.is_subnormal() { 0f32.copysign(x) } else { x }).collect()
    };
    let f = Tensor::f32([n, c], raw.clone());
    let mlu = run_on_device(&device(), &op("max"), &[Some(&f), Some(&coors)])
        .expect("BANG kernels run on the card");
    let f = Tensor::f32([n, c], flush(&raw));
    let cpu = run(&op("max"), &[Some(&f), Some(&coors)], &Threads(2)).unwrap();
    let got = Tensor::f32(mlu[0].shape.clone(), flush(mlu[0].data.f32().expect("float32")));
    assert_exact(&cpu[0], &got, "voxel_feats");
    // Not trivial: denormal winners where nothing flushes.
    assert!(ftz || cpu[0].data.f32().unwrap().iter().any(|x| x.is_subnormal()));
}

/// A box of more than BOX_CELLS cells is a logged run-time decline: the node runs its CPU
/// kernel (same outputs); one of BOX_CELLS cells runs on the card.
#[test]
fn boxes_beyond_the_bitmap_are_declined_at_run_time() {
    let backends = CardBackends::bang();
    let run_node = |coors: Vec<i32>| {
        let op = Arc::new(op("sum"));
        let bang = path::<DynamicScatter, Bang>(&op, &backends);
        let node = CardNode {
            op: "DynamicScatter",
            schema: onnxruntime_ep_mlu::ops::schema("DynamicScatter"),
            cpu: Arc::clone(&op) as Arc<dyn Kernel>,
            paths: vec![bang],
            elsewhere: Vec::new(),
            size_inputs: &[],
        };
        let f = Tensor::f32([2, 1], vec![1.0, 2.0]);
        let c = Tensor::i32([2, 2], coors);
        let (outputs, ran) = run_node_on_device(&device(), &node, &[Some(&f), Some(&c)]).unwrap();
        let cpu = run(&*op, &[Some(&f), Some(&c)], &Threads(1)).unwrap();
        for (a, b) in cpu.iter().zip(&outputs) {
            assert_eq!(a.data, b.data);
        }
        ran
    };
    let side = 1i32 << 14;
    match run_node(vec![0, 0, side, side - 1]) {
        Ran::Host(why) => assert!(why.contains("bitmap cells"), "{why}"),
        ran => panic!("{ran:?}"),
    }
    assert_eq!(BOX_CELLS, 1 << 28);
    assert!(matches!(run_node(vec![0, 0, side - 1, side - 1]), Ran::Card(..)));
}

#[test]
fn network_scale() {
    // PointPillars' dynamic voxelisation: points in a batch-2 grid of 1 x 496 x 432
    // pillars, mean of the raw features (C 4) and max of the lifted ones (C 64).
    let n = scale(120_000, 20_000);
    let mut rng = Rng(12);
    let coors: Vec<i32> = (0..n)
        .flat_map(|_| {
            let b = rng.int(0, 1) as i32;
            let drop = rng.below(20) == 0;
            let y = if drop { -1 } else { rng.int(0, 495) as i32 };
            [b, 0, y, rng.int(0, 431) as i32]
        })
        .collect();
    let coors = Tensor::i32([n, 4], coors);
    for c in [4, 64] {
        let f = Tensor::f32([n, c], rng.f32s(n * c));
        assert!(check(&f, &coors) > n / 2);
    }
}
