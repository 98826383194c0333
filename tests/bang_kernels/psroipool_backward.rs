//! PsRoiPoolBackward's BANG kernel against its CPU kernel.

use super::*;
use onnxruntime_ep_mlu::ops::psroipool::backward::PsRoiPoolBackward;

/// The node of pooled size p x p, output_dim od and spatial scale s.
fn op(p: usize, od: usize, s: f32) -> PsRoiPoolBackward {
    descriptor(&HashMap::from([
        ("pooled_height".to_string(), AttrValue::Int(p as i64)),
        ("pooled_width".to_string(), AttrValue::Int(p as i64)),
        ("spatial_scale".to_string(), AttrValue::Float(s)),
        ("output_dim".to_string(), AttrValue::Int(od as i64)),
    ]))
    .unwrap()
}

/// bottom (n, h, w), pooled p, output_dim od, r rois, spatial scale s.
#[allow(clippy::too_many_arguments)]
fn case(
    seed: u64,
    n: usize,
    h: usize,
    w: usize,
    p: usize,
    od: usize,
    r: usize,
    s: f32,
    odd_rois: bool,
) -> (Tensor, Tensor) {
    let op = op(p, od, s);
    let c = p * p * od;
    let mut rng = Rng(seed);
    let mut rois = Vec::with_capacity(r * 5);
    for i in 0..r {
        let (wf, hf) = (w as f32 / s, h as f32 / s);
        let x1 = rng.f32() * wf * 0.7 + wf * 0.3 - 2.0;
        let y1 = rng.f32() * hf * 0.7 + hf * 0.3 - 2.0;
        let x2 = x1 + rng.f32().abs() * wf * 0.8;
        let y2 = y1 + rng.f32().abs() * hf * 0.8;
        let mut roi = [rng.below(n as u64) as f32 + 0.7, x1, y1, x2, y2];
        if odd_rois {
            match i % 6 {
                0 => roi[3] = x1 - 3.0, // inverted
                1 => roi[1] = f32::NAN, // non-finite: contributes nothing
                2 => roi[4] = f32::INFINITY,
                3 => roi[1] = -1e30, // huge, finite
                _ => {}
            }
        }
        rois.extend_from_slice(&roi);
    }
    let top = Tensor::f32([r, p, p, od], rng.f32s(r * c));
    let map = Tensor::i32([r, p, p, od], (0..r * c).map(|_| rng.below(c as u64) as i32).collect());
    let rois = Tensor::f32([r, 5], rois);
    let shape = Tensor::i64([4], vec![n as i64, h as i64, w as i64, c as i64]);
    let (cpu, mlu) = both(&op, &[Some(&top), Some(&rois), Some(&map), Some(&shape)]);
    if r > 0 {
        assert!(
            cpu[0].data.f32().unwrap().iter().any(|&v| v != 0.0),
            "the case must move some gradient"
        );
    }
    assert_close(&cpu[0], &mlu[0], &format!("bottom_grad (r {r}, p {p}, od {od})"));
    (cpu[0].clone(), mlu[0].clone())
}

#[test]
fn small_random_cases() {
    case(1, 1, 5, 6, 2, 3, 4, 1.0, false);
    case(2, 2, 9, 7, 3, 5, 30, 0.5, true);
    case(3, 3, 14, 14, 7, 2, 50, 1.0, true);
    case(4, 2, 4, 4, 1, 1, 0, 1.0, false);
}

#[test]
fn seed_cases() {
    // The seed's R-FCN sizes, the network's.
    let (cpu, mlu) = case(5, 2, 14, 14, 7, 8, 320, 1.0, false);
    assert_planted_rejected(&cpu, &mlu, "bottom_grad (seed case 5)");
    let (cpu, mlu) = case(6, 8, 14, 14, 3, 21, 493, 0.0625, false);
    assert_planted_rejected(&cpu, &mlu, "bottom_grad (seed case 6)");
}

/// Rois whose every bin edge is an integer (at scale 1/16, width 7k * 16 pixels: bins of
/// k): where one ulp of a division would move a whole row or column of pixels.
#[test]
fn integer_aligned_bin_edges() {
    let (p, od, s) = (7usize, 2usize, 0.0625f32);
    let op = op(p, od, s);
    let (n, h, w, c) = (2usize, 40usize, 40usize, p * p * od);
    let mut rois = Vec::new();
    for (b, a, k) in [(0, 0, 1), (1, 3, 2), (0, 5, 4), (1, 0, 5), (0, 1, 3)] {
        // x1 = 16a, x2 = 16(a + 7k) - 1: start a, end a + 7k, bins of k pixels.
        let (lo, hi) = ((16 * a) as f32, (16 * (a + 7 * k) - 1) as f32);
        rois.extend_from_slice(&[b as f32, lo, lo, hi, hi]);
    }
    let r = rois.len() / 5;
    let mut rng = Rng(11);
    let top = Tensor::f32([r, p, p, od], rng.f32s(r * c));
    let map = Tensor::i32([r, p, p, od], (0..r * c).map(|_| rng.below(c as u64) as i32).collect());
    let rois = Tensor::f32([r, 5], rois);
    let shape = Tensor::i64([4], vec![n as i64, h as i64, w as i64, c as i64]);
    let (cpu, mlu) = both(&op, &[Some(&top), Some(&rois), Some(&map), Some(&shape)]);
    assert_close(&cpu[0], &mlu[0], "bottom_grad of integer-aligned rois");
}

#[test]
fn output_dim_larger_than_nram() {
    // 60000 > about 54.5K elements per NRAM tile: the seed's second case, in chunks.
    case(7, 1, 8, 8, 1, 60_000, 4, 1.0, false);
}
