//! GetIndicePairs' BANG kernels (expand, mark, rank, out, pairs) against its CPU kernel.

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

fn conf(spatial: [i64; 3], k: [i64; 3], s: [i64; 3], p: [i64; 3], d: [i64; 3], subm: bool) -> Conf {
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
