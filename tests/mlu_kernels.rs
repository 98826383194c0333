//! The BANG kernels of kernels/ on the card under test (`common::card`: a real MLU card when
//! the Cambricon runtime lists one, else the emulated card, the same sources compiled for
//! the host against kernels/emulator), against the Rust CPU kernels: exact for index
//! outputs and DynamicScatterBackward, the contract's accumulating class otherwise.

use half::f16;
use onnxruntime_ep_mlu::mlu::Device;
use onnxruntime_ep_mlu::ops::device::{BangOperator, run_on_device};
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::Threads;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::{OwnedData, Tensor};
use std::collections::HashMap;
use std::sync::Arc;
mod common;
use common::{ELEM_REL, ELEM_REL_F16, Rng, assert_accumulating_within, assert_rejects_planted};

/// The card under test: the emulated one unless a real card is present (common::card).
fn device() -> Arc<Device> {
    common::card()
}

/// Full network scale when MLU_EP_FULL_SCALE=1, else the reduced size.
fn scale(full: usize, reduced: usize) -> usize {
    if std::env::var("MLU_EP_FULL_SCALE").as_deref() == Ok("1") { full } else { reduced }
}

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// Runs `op` on CPU and on the card under test.
fn both<O: BangOperator + Clone>(op: &O, inputs: &[Option<&Tensor>]) -> (Vec<Tensor>, Vec<Tensor>) {
    let cpu = run(op, inputs, &Threads(2)).expect("CPU kernel runs");
    let mlu = run_on_device(&device(), op, inputs).expect("BANG kernels run on the card");
    assert_eq!(cpu.len(), mlu.len());
    for (c, m) in cpu.iter().zip(&mlu) {
        assert_eq!(c.shape, m.shape, "output shapes");
    }
    (cpu, mlu)
}

fn assert_exact(cpu: &Tensor, mlu: &Tensor, what: &str) {
    match (&cpu.data, &mlu.data) {
        (OwnedData::I32(a), OwnedData::I32(b)) => {
            if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
                panic!("{what}[{i}]: CPU {} MLU {}", a[i], b[i]);
            }
        }
        (OwnedData::F32(a), OwnedData::F32(b)) => {
            if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
                panic!("{what}[{i}]: CPU {} MLU {}", a[i], b[i]);
            }
        }
        _ => panic!("{what}: dtype"),
    }
}

/// An accumulating output of the CPU and the card as the judge takes it, with its E.
fn judged(cpu: &Tensor, mlu: &Tensor, what: &str) -> (Vec<f32>, Vec<f64>, f64) {
    match (&cpu.data, &mlu.data) {
        (OwnedData::F32(a), OwnedData::F32(b)) => {
            (b.clone(), a.iter().map(|&v| v as f64).collect(), ELEM_REL)
        }
        (OwnedData::F16(a), OwnedData::F16(b)) => (
            b.iter().map(|v| v.to_f32()).collect(),
            a.iter().map(|v| v.to_f64()).collect(),
            ELEM_REL_F16,
        ),
        _ => panic!("{what}: dtype"),
    }
}

fn assert_close(cpu: &Tensor, mlu: &Tensor, what: &str) {
    let (got, want, elem_rel) = judged(cpu, mlu, what);
    assert_accumulating_within(&got, &want, elem_rel, what);
}

/// One wrong element planted in the card's network-scale output fails the judge.
fn assert_planted_rejected(cpu: &Tensor, mlu: &Tensor, what: &str) {
    let (got, want, elem_rel) = judged(cpu, mlu, what);
    assert_rejects_planted(&got, &want, elem_rel, what);
}

// ------------------------------------------------------------ VoxelPoolingForward

mod voxel_pooling_forward {
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
}

// ------------------------------------------------------------ ThreeInterpolateBackward

mod three_interpolate_backward {
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
}

// ------------------------------------------------------------ GetIndicePairs

mod get_indice_pairs {
    use super::*;
    use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;

    struct Conf {
        batch: i64,
        spatial: [i64; 3],
        k: [i64; 3],
        s: [i64; 3],
        p: [i64; 3],
        d: [i64; 3],
        subm: bool,
    }

    fn op(c: &Conf) -> GetIndicePairs {
        let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
        descriptor(&HashMap::from([
            ("batch_size".to_string(), AttrValue::Int(c.batch)),
            ("spatial_shape".to_string(), ints(&c.spatial)),
            ("kernel_size".to_string(), ints(&c.k)),
            ("stride".to_string(), ints(&c.s)),
            ("padding".to_string(), ints(&c.p)),
            ("dilation".to_string(), ints(&c.d)),
            ("subm".to_string(), AttrValue::Int(c.subm as i64)),
        ]))
        .expect("valid descriptor")
    }

    /// `l` random sites (distinct when `distinct`).
    fn sites(rng: &mut Rng, c: &Conf, l: usize, distinct: bool) -> Tensor {
        let mut seen = std::collections::HashSet::new();
        let mut v = Vec::with_capacity(l * 4);
        while v.len() < l * 4 {
            let row = [
                rng.below(c.batch as u64) as i32,
                rng.below(c.spatial[0] as u64) as i32,
                rng.below(c.spatial[1] as u64) as i32,
                rng.below(c.spatial[2] as u64) as i32,
            ];
            if !distinct || seen.insert(row) {
                v.extend_from_slice(&row);
            }
        }
        Tensor::i32([l, 4], v)
    }

    fn case(seed: u64, c: &Conf, l: usize) {
        let op = op(c);
        let t = sites(&mut Rng(seed), c, l, c.subm);
        let (cpu, mlu) = both(&op, &[Some(&t)]);
        for (i, name) in ["indice_pairs", "out_indices", "indice_num"].iter().enumerate() {
            assert_exact(&cpu[i], &mlu[i], name);
        }
    }

    fn conf(
        spatial: [i64; 3],
        k: [i64; 3],
        s: [i64; 3],
        p: [i64; 3],
        d: [i64; 3],
        subm: bool,
    ) -> Conf {
        Conf { batch: 2, spatial, k, s, p, d, subm }
    }

    #[test]
    fn small_random_conv_cases() {
        case(1, &conf([5, 6, 7], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], false), 40);
        case(2, &conf([9, 8, 10], [3, 2, 3], [2, 2, 1], [0, 1, 1], [1, 1, 2], false), 100);
        case(3, &conf([4, 4, 4], [1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1], false), 30);
        case(4, &conf([3, 30, 33], [2, 3, 3], [3, 2, 2], [1, 0, 2], [1, 1, 1], false), 500);
        case(5, &conf([5, 5, 5], [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1], false), 0);
        // Duplicate input rows are legal outside subm mode.
        let c = conf([2, 2, 2], [2, 2, 2], [1, 1, 1], [1, 1, 1], [1, 1, 1], false);
        let t = Tensor::i32([3, 4], vec![0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0]);
        let (cpu, mlu) = both(&op(&c), &[Some(&t)]);
        for i in 0..3 {
            assert_exact(&cpu[i], &mlu[i], "duplicates");
        }
    }

    #[test]
    fn small_random_subm_cases() {
        case(6, &conf([5, 6, 7], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], true), 60);
        case(7, &conf([9, 8, 10], [5, 3, 1], [1, 1, 1], [2, 1, 0], [1, 1, 1], true), 200);
        case(8, &conf([9, 9, 9], [3, 3, 3], [1, 1, 1], [2, 2, 2], [2, 2, 2], true), 150);
        case(9, &conf([5, 5, 5], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], true), 0);
    }

    #[test]
    fn subm_duplicate_site_is_the_contract_error() {
        let c = conf([4, 4, 4], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], true);
        let t = Tensor::i32([3, 4], vec![0, 1, 2, 3, 1, 0, 0, 0, 0, 1, 2, 3]);
        let err = run_on_device(&device(), &op(&c), &[Some(&t)]).expect_err("duplicate site");
        let msg = err.to_string();
        assert!(msg.contains("rows 0 and 2") && msg.contains("duplicate"), "{msg}");
    }

    #[test]
    fn transpose_is_declined() {
        let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
        let op: GetIndicePairs = descriptor(&HashMap::from([
            ("batch_size".to_string(), AttrValue::Int(1)),
            ("spatial_shape".to_string(), ints(&[4, 4, 4])),
            ("kernel_size".to_string(), ints(&[3, 3, 3])),
            ("transpose".to_string(), AttrValue::Int(1)),
        ]))
        .unwrap();
        assert!(op.bang_supported().unwrap_err().to_string().contains("transpose"));
    }

    /// Padding and (kernel - 1) * dilation just inside the kernels' int32 tap arithmetic.
    #[test]
    fn taps_at_the_int32_edge() {
        let d = (1 << 30) - 1;
        case(14, &conf([4, 4, 4], [3, 1, 1], [1, 1, 1], [d, 0, 0], [d, 1, 1], false), 30);
    }

    #[test]
    fn many_tiles_and_a_wide_kernel() {
        // K = 125: about 1000 rows per expand tile; 6000 rows need several per core.
        case(10, &conf([20, 40, 40], [5, 5, 5], [2, 2, 2], [2, 2, 2], [1, 1, 1], false), 6000);
        case(11, &conf([20, 40, 40], [5, 5, 5], [1, 1, 1], [2, 2, 2], [1, 1, 1], true), 6000);
    }

    #[test]
    fn network_scale() {
        // The seed configurations; L reduced unless MLU_EP_FULL_SCALE=1.
        let subm = Conf {
            batch: 4,
            spatial: [41, 1440, 1440],
            k: [3; 3],
            s: [1; 3],
            p: [1; 3],
            d: [1; 3],
            subm: true,
        };
        case(12, &subm, scale(248_636, 30_000));
        let sparse = Conf {
            batch: 4,
            spatial: [11, 360, 360],
            k: [3; 3],
            s: [2; 3],
            p: [0, 1, 1],
            d: [1; 3],
            subm: false,
        };
        case(13, &sparse, scale(149_100, 30_000));
    }
}

// ------------------------------------------------------------ PsRoiPoolBackward

mod psroipool_backward {
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
        let map =
            Tensor::i32([r, p, p, od], (0..r * c).map(|_| rng.below(c as u64) as i32).collect());
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
        let map =
            Tensor::i32([r, p, p, od], (0..r * c).map(|_| rng.below(c as u64) as i32).collect());
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
}

// ------------------------------------------------------------ DynamicScatterBackward

mod dynamic_scatter_backward {
    use super::*;
    use onnxruntime_ep_mlu::ops::dynamic_scatter::backward::DynamicScatterBackward;

    fn op(reduce: &str) -> DynamicScatterBackward {
        descriptor(&HashMap::from([(
            "reduce_type".to_string(),
            AttrValue::String(reduce.to_string()),
        )]))
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
        let levels = [
            f32::from_bits(1),
            f32::from_bits(0x0004_0000),
            -f32::from_bits(0x0000_1000),
            0.0,
            2.0,
        ];
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
}

// ------------------------------------------------------------ DynamicScatter

mod dynamic_scatter {
    use super::*;
    use onnxruntime_ep_mlu::ops::Kernel;
    use onnxruntime_ep_mlu::ops::device::{
        Backend, Bang, CardBackends, CardNode, Ran, path, run_node_on_device,
    };
    use onnxruntime_ep_mlu::ops::dynamic_scatter::DynamicScatter;
    use onnxruntime_ep_mlu::ops::dynamic_scatter::bang::BOX_CELLS;

    const REDUCES: [&str; 3] = ["max", "mean", "sum"];

    fn op(reduce: &str) -> DynamicScatter {
        descriptor(&HashMap::from([(
            "reduce_type".to_string(),
            AttrValue::String(reduce.to_string()),
        )]))
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
        let backends = CardBackends {
            order: &[Backend::Bang],
            mluops: Err(onnxruntime_ep_mlu::error::Error::declined("not used")),
        };
        let run_node = |coors: Vec<i32>| {
            let op = Arc::new(op("sum"));
            let bang = path::<DynamicScatter, Bang>(&op, &backends);
            let node = CardNode {
                op: "DynamicScatter",
                schema: onnxruntime_ep_mlu::ops::schema("DynamicScatter"),
                cpu: Arc::clone(&op) as Arc<dyn Kernel>,
                paths: vec![bang],
                size_inputs: &[],
            };
            let f = Tensor::f32([2, 1], vec![1.0, 2.0]);
            let c = Tensor::i32([2, 2], coors);
            let (outputs, ran) =
                run_node_on_device(&device(), &node, &[Some(&f), Some(&c)]).unwrap();
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
}

// ------------------------------------------------------------ bad input

/// The device path validates exactly as the CPU path: the same contract error, nothing
/// launched.
mod bad_input {
    use super::*;
    use onnxruntime_ep_mlu::ops::three_interpolate::backward::ThreeInterpolateBackward;
    use onnxruntime_ep_mlu::ops::voxel_pooling::forward::VoxelPoolingForward;

    fn same_error<O: BangOperator + Clone>(op: &O, inputs: &[Option<&Tensor>], rule: &str) {
        let cpu = run(op, inputs, &Threads(2)).expect_err("CPU rejects").to_string();
        let mlu = run_on_device(&device(), op, inputs).expect_err("MLU rejects").to_string();
        assert_eq!(cpu, mlu);
        assert!(mlu.contains(rule), "{mlu}");
    }

    #[test]
    fn index_and_shape_rules() {
        let ti: ThreeInterpolateBackward =
            descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(4))])).unwrap();
        let go = Tensor::f32([1, 2, 2], vec![1.0; 4]);
        let w = Tensor::f32([1, 2, 3], vec![0.5; 6]);
        let bad = Tensor::i32([1, 2, 3], vec![0, 1, 2, 3, 4, 0]);
        same_error(&ti, &[Some(&go), Some(&bad), Some(&w)], "outside [0, m)");
        let neg = Tensor::i32([1, 2, 3], vec![0, -1, 2, 3, 1, 0]);
        same_error(&ti, &[Some(&go), Some(&neg), Some(&w)], "outside [0, m)");
        // The kernel runs beside the check: int32's extremes must not overflow its tile test
        // in any M tile (m0 > 0 from the second; under scripts/sanitize.sh UBSan reports the
        // old `index - m0`).
        let wide: ThreeInterpolateBackward =
            descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(1000))])).unwrap();
        let far = Tensor::i32([1, 2, 3], vec![700, i32::MIN, 2, i32::MAX, 999, 3]);
        same_error(
            &wide,
            &[Some(&go), Some(&far), Some(&w)],
            "indices[0, 0, 1] = -2147483648 is outside [0, m)",
        );
        // Seed boundary case 13: M = 0 with points is an error.
        let ti0: ThreeInterpolateBackward =
            descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(0))])).unwrap();
        let zero = Tensor::i32([1, 2, 3], vec![0; 6]);
        same_error(&ti0, &[Some(&go), Some(&zero), Some(&w)], "outside [0, m)");

        let vp: VoxelPoolingForward =
            descriptor(&HashMap::from([("voxel_num".to_string(), AttrValue::Ints(vec![2, 2, 1]))]))
                .unwrap();
        let g = Tensor::i32([1, 2, 3], vec![0; 6]);
        let f = Tensor::f32([1, 3, 2], vec![0.0; 6]);
        same_error(&vp, &[Some(&g), Some(&f)], "input_features");
    }

    /// Every value rule reported by the check kernels on the card in the CPU path's words,
    /// for the first broken row, whatever rows follow.
    #[test]
    fn value_rules_on_the_card() {
        use onnxruntime_ep_mlu::ops::dynamic_scatter::backward::DynamicScatterBackward;
        use onnxruntime_ep_mlu::ops::psroipool::backward::PsRoiPoolBackward;
        use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;
        let dsb: DynamicScatterBackward = descriptor(&HashMap::from([(
            "reduce_type".to_string(),
            AttrValue::String("max".into()),
        )]))
        .unwrap();
        let (m, c, n) = (3, 2, 5);
        let f = |r: usize| Tensor::f32([r, c], (0..r * c).map(|x| x as f32).collect());
        let count = Tensor::i32([m], vec![1; m]);
        for (map, rule) in [
            (vec![0, 1, 3, -2, 0], "point2voxel_map[2] = 3 must be < voxel_num V = 3"),
            (vec![0, -1, -7, 9, 0], "point2voxel_map[2] = -7 is below -1"),
        ] {
            let map = Tensor::i32([n], map);
            same_error(
                &dsb,
                &[Some(&f(m)), Some(&f(n)), Some(&f(m)), Some(&map), Some(&count), None],
                rule,
            );
        }
        // voxel_num = 2 makes row 2 invalid: the size input is read on the host.
        let (map, vn) = (Tensor::i32([n], vec![0, 1, 2, 0, 0]), Tensor::i32([1], vec![2]));
        let inputs = [Some(&f(m)), Some(&f(n)), Some(&f(m)), Some(&map), Some(&count), Some(&vn)];
        same_error(&dsb, &inputs, "point2voxel_map[2] = 2 must be < voxel_num V = 2");

        let prp: PsRoiPoolBackward = descriptor(&HashMap::from([
            ("pooled_height".to_string(), AttrValue::Int(1)),
            ("pooled_width".to_string(), AttrValue::Int(1)),
            ("spatial_scale".to_string(), AttrValue::Float(1.0)),
            ("output_dim".to_string(), AttrValue::Int(2)),
        ]))
        .unwrap();
        let top = Tensor::f32([3, 1, 1, 2], vec![1.0; 6]);
        let shape = Tensor::i64([4], vec![2, 4, 4, 2]);
        let good_map = Tensor::i32([3, 1, 1, 2], vec![0, 1, 1, 0, 0, 1]);
        // A non-finite roi is never an error, whatever its batch id; the next finite one is.
        let rois = Tensor::f32(
            [3, 5],
            vec![0.5, 0., 0., 1., 1., 9.0, f32::NAN, 0., 1., 1., 2.0, 0., 0., 1., 1.],
        );
        same_error(
            &prp,
            &[Some(&top), Some(&rois), Some(&good_map), Some(&shape)],
            "roi 2: batch_id 2 (truncated 2) outside [0, 2)",
        );
        let rois = Tensor::f32(
            [3, 5],
            vec![-0.9, 0., 0., 1., 1., 1.5, 0., 0., 1., 1., 0., 0., 0., 1., 1.],
        );
        let bad_map = Tensor::i32([3, 1, 1, 2], vec![0, 1, 1, 2, -1, 1]);
        same_error(
            &prp,
            &[Some(&top), Some(&rois), Some(&bad_map), Some(&shape)],
            "value 2 at flat index 3 outside [0, channels = 2)",
        );

        let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
        for subm in [0, 1] {
            let gip: GetIndicePairs = descriptor(&HashMap::from([
                ("batch_size".to_string(), AttrValue::Int(2)),
                ("spatial_shape".to_string(), ints(&[4, 5, 6])),
                ("kernel_size".to_string(), ints(&[3, 3, 3])),
                ("padding".to_string(), ints(&[1, 1, 1])),
                ("subm".to_string(), AttrValue::Int(subm)),
            ]))
            .unwrap();
            let rows = Tensor::i32([3, 4], vec![0, 1, 2, 3, 1, 3, 4, 6, 2, 0, 0, 0]);
            same_error(
                &gip,
                &[Some(&rows)],
                "row 1 = [1, 3, 4, 6]: coordinate 6 on axis 2 (W, x) is outside [0, 6)",
            );
            let rows = Tensor::i32([2, 4], vec![1, 3, 4, 5, -1, 0, 0, 0]);
            same_error(
                &gip,
                &[Some(&rows)],
                "row 1 = [-1, 0, 0, 0]: batch -1 is outside [0, batch_size = 2)",
            );
        }
    }

    #[test]
    fn seed_case_15_all_empty() {
        let ti: ThreeInterpolateBackward =
            descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(0))])).unwrap();
        let e = |s: [usize; 3]| Tensor::f32(s, vec![]);
        let idx = Tensor::i32([0, 0, 3], vec![]);
        let (cpu, mlu) = both(&ti, &[Some(&e([0, 0, 0])), Some(&idx), Some(&e([0, 0, 3]))]);
        assert_eq!(mlu[0].shape, vec![0, 0, 0]);
        assert_eq!(cpu[0].shape, mlu[0].shape);
    }
}

// ------------------------------------------------------------ fuzzing the index inputs

mod fuzz {
    use super::*;
    use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;
    use onnxruntime_ep_mlu::ops::three_interpolate::backward::ThreeInterpolateBackward;
    use proptest::prelude::*;

    /// CPU and MLU agree: the same outputs, or the same error.
    fn agree<O: BangOperator + Clone>(op: &O, inputs: &[Option<&Tensor>], exact: bool) {
        let cpu = run(op, inputs, &Threads(2));
        let mlu = run_on_device(&device(), op, inputs);
        match (cpu, mlu) {
            (Ok(c), Ok(m)) => {
                for (a, b) in c.iter().zip(&m) {
                    assert_eq!(a.shape, b.shape);
                    if exact { assert_exact(a, b, "fuzz") } else { assert_close(a, b, "fuzz") }
                }
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (c, m) => panic!("CPU {:?} vs MLU {:?}", c.err(), m.err()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn get_indice_pairs_random_sites(
            seed in any::<u64>(), l in 0usize..60, k in 1i64..4, s in 1i64..3, subm in any::<bool>(), spill in 0u64..3,
        ) {
            let spatial = [4i64, 5, 6];
            let p = if subm { (k - 1) / 2 } else { 1 };
            let k = if subm { 2 * p + 1 } else { k };
            let s = if subm { 1 } else { s };
            let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
            let op: GetIndicePairs = descriptor(&HashMap::from([
                ("batch_size".to_string(), AttrValue::Int(2)),
                ("spatial_shape".to_string(), ints(&spatial)),
                ("kernel_size".to_string(), ints(&[k; 3])),
                ("stride".to_string(), ints(&[s; 3])),
                ("padding".to_string(), ints(&[p; 3])),
                ("subm".to_string(), AttrValue::Int(subm as i64)),
            ])).unwrap();
            let mut rng = Rng(seed);
            // Coordinates sometimes one past the shape or negative; duplicates happen.
            let lim = [2i64, 4, 5, 6];
            let rows: Vec<i32> = (0..l * 4)
                .map(|i| rng.int(-(spill as i64 / 2), lim[i % 4] - 1 + (spill == 2) as i64) as i32)
                .collect();
            agree(&op, &[Some(&Tensor::i32([l, 4], rows))], true);
        }

        #[test]
        fn three_interpolate_backward_random_indices(seed in any::<u64>(), n in 0usize..40, m in 0usize..20, bad in any::<bool>()) {
            let op: ThreeInterpolateBackward = descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(m as i64))])).unwrap();
            let mut rng = Rng(seed);
            let hi = m as i64 - 1 + bad as i64;
            let idx: Vec<i32> = (0..2 * n * 3).map(|_| rng.int(-(bad as i64), hi.max(0)) as i32).collect();
            let go = Tensor::f32([2, 3, n], rng.f32s(6 * n));
            let w = Tensor::f32([2, n, 3], rng.f32s(6 * n));
            agree(&op, &[Some(&go), Some(&Tensor::i32([2, n, 3], idx)), Some(&w)], false);
        }
    }
}
