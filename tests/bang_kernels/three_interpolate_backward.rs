//! ThreeInterpolateBackward's BANG kernels (float32 and float16) against its CPU kernel.

use super::*;
use onnxruntime_ep_mlu::ops::three_interpolate::backward::ThreeInterpolateBackward;

/// Returns grad_features, CPU and card.
fn case(
    seed: u64,
    b: usize,
    c: usize,
    n: usize,
    m: usize,
    half_precision: bool,
) -> (Tensor, Tensor) {
    let op: ThreeInterpolateBackward =
        descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(m as i64))])).unwrap();
    let mut rng = Rng(seed);
    let idx: Vec<i32> = (0..b * n * 3).map(|_| rng.below(m as u64) as i32).collect();
    let (go, w) = (rng.f32s(b * c * n), rng.f32s(b * n * 3));
    let (go, w) = if half_precision {
        let h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
        (Tensor::f16([b, c, n], h(go)), Tensor::f16([b, n, 3], h(w)))
    } else {
        (Tensor::f32([b, c, n], go), Tensor::f32([b, n, 3], w))
    };
    let idx = Tensor::i32([b, n, 3], idx);
    let (cpu, mlu) = both(&op, &[Some(&go), Some(&idx), Some(&w)]);
    assert_close(
        &cpu[0],
        &mlu[0],
        &format!("grad_features ({b},{c},{n},{m}) half={half_precision}"),
    );
    (cpu[0].clone(), mlu[0].clone())
}

#[test]
fn small_random_cases() {
    for (i, &(b, c, n, m)) in [
        (1, 1, 1, 1),
        (2, 3, 5, 7),
        (1, 33, 17, 9),
        (3, 8, 64, 300),
        (0, 4, 4, 4),
        (2, 0, 4, 4),
        (2, 4, 0, 4),
    ]
    .iter()
    .enumerate()
    {
        case(i as u64, b, c, n, m, false);
        case(100 + i as u64, b, c, n, m, true);
    }
}

#[test]
fn seed_boundary_cases() {
    // Cases 16-20 of the seed (18-20 reduced in channels to keep the emulator quick).
    for &(b, c, n, m) in &[
        (1, 1, 1, 1),
        (7, 63, 129, 127),
        (2, 1025, 1023, 1023),
        (2, 1029, 257, 1027),
        (1, 2047, 99, 2033),
    ] {
        case(b as u64 * 31 + c as u64, b, c, n, m, false);
        case(b as u64 * 37 + c as u64, b, c, n, m, true);
    }
}

#[test]
fn several_tiles_in_every_direction() {
    // Mo 256, Co 128, No a few hundred: 3 M tiles, 3 C tiles, several N tiles, all cores.
    case(7, 4, 300, 1500, 700, false);
    case(8, 4, 300, 1500, 700, true);
}

#[test]
fn network_scale() {
    // Seed case 4 (16, 128, 4096, 1024), reduced in B unless MLU_EP_FULL_SCALE=1.
    let b = scale(16, 2);
    for (seed, half_precision) in [(9, false), (10, true)] {
        let (cpu, mlu) = case(seed, b, 128, 4096, 1024, half_precision);
        assert_planted_rejected(&cpu, &mlu, &format!("grad_features half={half_precision}"));
    }
}
