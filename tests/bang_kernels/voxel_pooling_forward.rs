//! VoxelPoolingForward's BANG kernel against its CPU kernel.

use super::*;
use onnxruntime_ep_mlu::ops::voxel_pooling::forward::VoxelPoolingForward;

/// Returns output_features, CPU and card.
fn case(seed: u64, b: usize, n: usize, c: usize, grid: [i64; 3]) -> (Tensor, Tensor) {
    let op: VoxelPoolingForward =
        descriptor(&HashMap::from([("voxel_num".to_string(), AttrValue::Ints(grid.to_vec()))]))
            .unwrap();
    let mut rng = Rng(seed);
    // About a tenth of the points fall outside the grid on some axis.
    let geom: Vec<i32> =
        (0..b * n * 3).map(|i| rng.int(-1, grid[i % 3] + grid[i % 3] / 8) as i32).collect();
    let g = Tensor::i32([b, n, 3], geom);
    let f = Tensor::f32([b, n, c], rng.f32s(b * n * c));
    let (cpu, mlu) = both(&op, &[Some(&g), Some(&f)]);
    assert_close(&cpu[0], &mlu[0], "output_features");
    assert_exact(&cpu[1], &mlu[1], "pos_memo");
    (cpu[0].clone(), mlu[0].clone())
}

#[test]
fn small_random_cases() {
    for (i, &(b, n, c, g)) in [
        (1, 1, 1, [1, 1, 1]),
        (1, 7, 3, [4, 3, 2]),
        (2, 33, 5, [5, 6, 1]),
        (3, 100, 16, [8, 8, 2]),
        (1, 0, 4, [2, 2, 2]),
        (2, 50, 0, [3, 3, 3]),
    ]
    .iter()
    .enumerate()
    {
        case(i as u64, b, n, c, g);
    }
}

/// Out-of-grid coordinates anywhere in int32 (the kernel zeroes them before its int32
/// cell products; the old `x + 1` at INT32_MAX is what scripts/sanitize.sh's UBSan run of
/// this test reports).
#[test]
fn coordinates_at_the_int32_extremes() {
    let op: VoxelPoolingForward =
        descriptor(&HashMap::from([("voxel_num".to_string(), AttrValue::Ints(vec![3, 2, 1]))]))
            .unwrap();
    let (lo, hi) = (i32::MIN, i32::MAX);
    let geom =
        vec![hi, 0, 0, 2, 1, 0, 0, hi, 0, lo, lo, lo, 1, 1, hi, 1, 0, 0, hi, hi, hi, 0, lo, 0];
    let g = Tensor::i32([2, 4, 3], geom);
    let f = Tensor::f32([2, 4, 2], (0..16).map(|v| v as f32).collect());
    let (cpu, mlu) = both(&op, &[Some(&g), Some(&f)]);
    assert_exact(&cpu[0], &mlu[0], "output_features");
    assert_exact(&cpu[1], &mlu[1], "pos_memo");
}

#[test]
fn several_tiles_on_every_core() {
    // About 11.7K points per NRAM tile: 3 batches of 40K points need many tiles on all 8 cores.
    case(11, 3, 40_000, 3, [64, 64, 2]);
}

#[test]
fn feature_rows_wider_than_one_chunk() {
    case(12, 1, 64, 9000, [4, 4, 1]);
}

#[test]
fn network_scale() {
    // Seed scale: B 2, N 473088, C 80, grid (128, 128, 1).
    let (cpu, mlu) = case(13, 2, scale(473_088, 60_000), 80, [128, 128, 1]);
    assert_planted_rejected(&cpu, &mlu, "output_features");
}
