//! DynamicScatterBackward's BANG kernels against its CPU kernel, bit for bit.

use super::*;
use onnxruntime_ep_mlu::ops::dynamic_scatter::backward::DynamicScatterBackward;

fn op(reduce: &str) -> DynamicScatterBackward {
    descriptor(&HashMap::from([("reduce_type".to_string(), AttrValue::String(reduce.to_string()))]))
        .unwrap()
}

/// N points into V of M voxel rows; features drawn from `levels` values (ties), with
/// NaN and signed zeros among them when `odd`.
fn case(seed: u64, n: usize, m: usize, v: usize, c: usize, levels: u64, odd: bool) {
    let mut rng = Rng(seed);
    let map: Vec<i32> = (0..n).map(|_| rng.int(-1, v as i64 - 1) as i32).collect();
    let feats: Vec<f32> = (0..n * c)
        .map(|_| {
            let k = rng.below(levels);
            match (odd, k) {
                (true, 0) => f32::NAN,
                (true, 1) => -0.0,
                (true, 2) => 0.0,
                _ => k as f32 * 0.25 - 1.0,
            }
        })
        .collect();
    check(&mut rng, map, feats, m, v, c, &[false]);
}

/// voxel_feats = per-voxel, per-channel max (NaN-ignoring, as a forward max pass would
/// compare), NaN for a voxel whose points are all NaN in that channel; then the card
/// against the CPU kernel, exactly, on the inputs as they are (`false` in `flushes`) or
/// with denormals flushed to zero (`true`): the card must match one of them.
fn check(
    rng: &mut Rng,
    map: Vec<i32>,
    feats: Vec<f32>,
    m: usize,
    v: usize,
    c: usize,
    flushes: &[bool],
) {
    let n = map.len();
    let mut vox = vec![f32::NAN; m * c];
    let mut count = vec![0i32; m];
    for (i, &t) in map.iter().enumerate() {
        if t < 0 {
            continue;
        }
        count[t as usize] += 1;
        for ch in 0..c {
            let (f, slot) = (feats[i * c + ch], &mut vox[t as usize * c + ch]);
            if slot.is_nan() || f > *slot {
                *slot = f;
            }
        }
    }
    let grad = rng.f32s(m * c);
    let flush = |d: &[f32], on: bool| -> Vec<f32> {
        d.iter().map(|&x| if on && x.is_subnormal() { 0.0 } else { x }).collect()
    };
    let t = |s: [usize; 2], d: Vec<f32>| Tensor::f32(s, d);
    let (g, f, vf) = (t([m, c], grad), t([n, c], feats.clone()), t([m, c], vox.clone()));
    let (mp, cnt) = (Tensor::i32([n], map), Tensor::i32([m], count));
    let vn = Tensor::i32([1], vec![v as i32]);
    let (_, mlu) =
        both(&op("max"), &[Some(&g), Some(&f), Some(&vf), Some(&mp), Some(&cnt), Some(&vn)]);
    let wants: Vec<Tensor> = flushes
        .iter()
        .map(|&on| {
            let (f, vf) = (t([n, c], flush(&feats, on)), t([m, c], flush(&vox, on)));
            let cpu = run(
                &op("max"),
                &[Some(&g), Some(&f), Some(&vf), Some(&mp), Some(&cnt), Some(&vn)],
                &Threads(2),
            );
            cpu.unwrap().remove(0)
        })
        .collect();
    let what = format!("grad_feats (n {n}, m {m}, v {v}, c {c})");
    let bits = |t: &Tensor| common::canon(t.data.f32().expect("float32 grad_feats"));
    match wants.iter().find(|w| bits(w) == bits(&mlu[0])) {
        Some(want) => assert!(
            want.data.f32().unwrap().iter().any(|&x| x != 0.0) || n == 0 || v == 0,
            "{what}: all zero"
        ),
        None => assert_exact(&wants[0], &mlu[0], &what),
    }
}

/// Distinct denormal features, which a card flushing denormals sees as ties with each
/// other and with zero. Under MLU_EMU_FTZ=1 the card gives the CPU kernel's result on
/// the inputs flushed to zero: the behaviour docs/CONTRACT.md §2.5 states for such a card.
/// A real card, whose handling is undocumented, may give either result.
#[test]
fn denormal_features() {
    let mut rng = Rng(8);
    let (n, m, c) = (300, 20, 33);
    let map: Vec<i32> = (0..n).map(|_| rng.int(0, m as i64 - 1) as i32).collect();
    let levels =
        [f32::from_bits(1), f32::from_bits(0x0004_0000), -f32::from_bits(0x0000_1000), 0.0, 2.0];
    let feats = (0..n * c).map(|_| levels[rng.below(levels.len() as u64) as usize]).collect();
    let ftz = std::env::var("MLU_EMU_FTZ").is_ok_and(|v| v == "1");
    let flushes: &[bool] = if !device().info.emulated {
        &[false, true]
    } else if ftz {
        &[true]
    } else {
        &[false]
    };
    check(&mut rng, map, feats, m, m, c, flushes);
}

#[test]
fn small_random_cases_with_ties_nan_and_signed_zeros() {
    case(1, 10, 4, 4, 3, 3, false);
    case(2, 200, 30, 30, 33, 4, true);
    case(3, 500, 60, 40, 7, 2, true);
    case(4, 0, 5, 5, 4, 3, false);
    case(5, 50, 5, 0, 4, 3, false);
}

#[test]
fn several_tiles_on_every_core() {
    // C 128: about 250 points per tile; 5000 points span many tiles on all 8 cores.
    case(6, 5000, 900, 800, 128, 5, true);
}

#[test]
fn mean_and_sum_are_declined() {
    assert!(op("max").bang_supported().is_ok());
    assert!(op("mean").bang_supported().unwrap_err().to_string().contains("max only"));
    assert!(op("sum").bang_supported().unwrap_err().to_string().contains("max only"));
}

#[test]
fn network_scale() {
    // Seed scale N 17176, M 13743, C 128 (the same at full and reduced scale).
    case(7, 17_176, 13_743, 13_743, 128, 16, false);
}
