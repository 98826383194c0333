//! GetIndicePairs against the contract (docs/CONTRACT.md §4). The reference below is
//! written from the contract text alone: brute-force loops over every input row and every
//! kernel offset, i128 arithmetic, BTreeMaps for the sites. It shares no code with the kernel.
//! Accuracy class: exact, so every output is compared element for element.
//!
//! Set MLU_EP_FULL_SCALE=1 to also run the two seed network cases at full size (timed).

use onnxruntime_ep_mlu::error::Error;
use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::tensor::Tensor;
use proptest::prelude::*;
use std::collections::HashSet;
use std::time::Instant;
mod common;
#[path = "reference/get_indice_pairs.rs"]
mod reference;
use common::Rng;
use reference::{Attrs, Expect, Rulebook, expect, reference, resolve};

// ---------------------------------------------------------------------------------------
// Running the kernel
// ---------------------------------------------------------------------------------------

fn indices(rows: &[[i32; 4]]) -> Tensor {
    Tensor::i32([rows.len(), 4], rows.iter().flatten().copied().collect())
}

fn run_tensor(a: &Attrs, t: &Tensor, par: &dyn Parallel) -> Result<Rulebook, Error> {
    let op: GetIndicePairs = descriptor(&a.map())?;
    let k = op.kernel_volume();
    let out = run(&op, &[Some(t)], par)?;
    let l = t.shape[0];
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].shape, [k, 2, l]);
    assert_eq!(out[1].shape.len(), 2);
    assert_eq!(out[1].shape[1], 4);
    assert_eq!(out[2].shape, [k]);
    let get = |i: usize| out[i].data.i32().expect("int32 output").to_vec();
    Ok(Rulebook { pairs: get(0), out: get(1), num: get(2) })
}

fn run_rows(a: &Attrs, rows: &[[i32; 4]], par: &dyn Parallel) -> Result<Rulebook, Error> {
    run_tensor(a, &indices(rows), par)
}

/// Runs serially and on 2 and 3 threads, checks the three agree, and compares with the
/// reference.
fn check(a: &Attrs, rows: &[[i32; 4]]) -> Rulebook {
    let c = resolve(a).unwrap_or_else(|e| panic!("test case breaks a rule ({e}): {a:?}"));
    let want = reference(&c, rows);
    for par in [&Serial as &dyn Parallel, &Threads(2), &Threads(3)] {
        let got = run_rows(a, rows, par).unwrap_or_else(|e| panic!("{a:?}: {e}"));
        assert_rulebook(&got, &want, a);
    }
    want
}

fn assert_rulebook(got: &Rulebook, want: &Rulebook, a: &Attrs) {
    assert_eq!(got.num, want.num, "indice_num, {a:?}");
    assert_eq!(got.out.len(), want.out.len(), "num_act_out * 4, {a:?}");
    if let Some(i) = (0..got.out.len()).find(|&i| got.out[i] != want.out[i]) {
        panic!(
            "out_indices differ first at row {}: got {:?}, want {:?}; {a:?}",
            i / 4,
            &got.out[i / 4 * 4..][..4],
            &want.out[i / 4 * 4..][..4]
        );
    }
    assert_eq!(got.pairs.len(), want.pairs.len());
    if let Some(i) = (0..got.pairs.len()).find(|&i| got.pairs[i] != want.pairs[i]) {
        panic!(
            "indice_pairs differ first at flat index {i}: got {}, want {}; {a:?}",
            got.pairs[i], want.pairs[i]
        );
    }
}

/// Builds the node (which must succeed) and runs it; the run must fail.
fn run_error(a: &Attrs, t: &Tensor) -> String {
    descriptor::<GetIndicePairs>(&a.map())
        .unwrap_or_else(|e| panic!("attributes are valid, got {e}"));
    let e = run_tensor(a, t, &Threads(2)).expect_err("the contract says this run fails");
    e.to_string()
}

/// Building the node must fail with an error naming `attribute`.
fn attribute_error(a: &Attrs, attribute: &str) -> String {
    let e = descriptor::<GetIndicePairs>(&a.map())
        .expect_err("the contract says these attributes are an error");
    assert!(
        matches!(&e, Error::Attribute { name, .. } if name == attribute),
        "expected attribute '{attribute}', got {e}"
    );
    let msg = e.to_string();
    assert!(msg.contains(&format!("attribute '{attribute}'")), "{msg}");
    msg
}

// ---------------------------------------------------------------------------------------
// Random data
// ---------------------------------------------------------------------------------------

impl Rng {
    fn below(&mut self, n: i64) -> i64 {
        (self.next() % n.max(1) as u64) as i64
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as i64 + 1) as usize);
        }
    }
}

/// `n` uniform random rows (duplicates possible).
fn uniform_rows(rng: &mut Rng, n: usize, batch: i64, spatial: [i64; 3]) -> Vec<[i32; 4]> {
    (0..n)
        .map(|_| {
            [
                rng.below(batch) as i32,
                rng.below(spatial[0]) as i32,
                rng.below(spatial[1]) as i32,
                rng.below(spatial[2]) as i32,
            ]
        })
        .collect()
}

/// `n` distinct sites in blobs (lidar-like: dense patches in an empty volume), including
/// the volume's corners, in random row order.
fn blob_rows(
    rng: &mut Rng,
    n: usize,
    batch: i64,
    spatial: [i64; 3],
    radius: [i64; 3],
) -> Vec<[i32; 4]> {
    let cells = spatial.iter().fold(batch, |acc, &s| acc.saturating_mul(s));
    let n = n.min(usize::try_from(cells).unwrap_or(usize::MAX));
    let mut set = HashSet::with_capacity(n);
    let mut rows = Vec::with_capacity(n);
    let mut push = |r: [i32; 4], rows: &mut Vec<[i32; 4]>| {
        if rows.len() < n && set.insert(r) {
            rows.push(r);
        }
    };
    let last = spatial.map(|s| (s - 1) as i32);
    for b in 0..batch as i32 {
        for corner in 0..8 {
            let c = [
                (corner & 1) * last[0],
                ((corner >> 1) & 1) * last[1],
                ((corner >> 2) & 1) * last[2],
            ];
            push([b, c[0], c[1], c[2]], &mut rows);
        }
    }
    while rows.len() < n {
        let b = rng.below(batch) as i32;
        let center = spatial.map(|s| rng.below(s));
        for _ in 0..400 {
            let p: [i64; 3] = std::array::from_fn(|a| {
                (center[a] + rng.range(-radius[a], radius[a])).clamp(0, spatial[a] - 1)
            });
            push([b, p[0] as i32, p[1] as i32, p[2] as i32], &mut rows);
        }
    }
    rng.shuffle(&mut rows);
    rows
}

/// A random valid configuration of the given mode (0 conv, 1 transpose, 2 subm).
fn random_attrs(rng: &mut Rng, mode: u8) -> Attrs {
    loop {
        let kernel: [i64; 3] = std::array::from_fn(|_| rng.range(1, 4));
        let mut a = Attrs::new(rng.range(1, 3), std::array::from_fn(|_| rng.range(1, 9)), kernel);
        let stride: [i64; 3] =
            std::array::from_fn(|_| if rng.chance(1, 2) { 1 } else { rng.range(2, 4) });
        let dilation: [i64; 3] = std::array::from_fn(|i| {
            if stride[i] > 1 || mode == 1 || rng.chance(2, 3) { 1 } else { rng.range(2, 3) }
        });
        match mode {
            0 => {
                a = a
                    .stride(stride)
                    .dilation(dilation)
                    .padding(std::array::from_fn(|_| rng.range(0, 3)));
            }
            1 => {
                a = a
                    .transpose()
                    .stride(stride)
                    .padding(std::array::from_fn(|_| rng.range(0, 3)))
                    .output_padding(std::array::from_fn(|_| rng.range(0, 2)));
            }
            _ => {
                // Odd kernels or even dilations keep the size.
                let kernel: [i64; 3] = std::array::from_fn(|_| 2 * rng.range(0, 2) + 1);
                let d: [i64; 3] = std::array::from_fn(|_| rng.range(1, 2));
                a.kernel_size = Some(kernel.to_vec());
                a = a
                    .subm()
                    .dilation(d)
                    .padding(std::array::from_fn(|i| d[i] * (kernel[i] - 1) / 2));
            }
        }
        if resolve(&a).is_ok() {
            return a;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Hand-computed cases
// ---------------------------------------------------------------------------------------

#[test]
fn conv_small_rulebook_by_hand() {
    // out x size (4 - 1 - 1) / 2 + 1 = 2. x=3: tap 1 -> 1. x=0: tap 0 -> 0. x=1: tap 1 -> 0.
    let a = Attrs::new(1, [1, 1, 4], [1, 1, 2]).stride([1, 1, 2]);
    let got = check(&a, &[[0, 0, 0, 3], [0, 0, 0, 0], [0, 0, 0, 1]]);
    assert_eq!(got.out, [0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(got.num, [1, 2]);
    assert_eq!(got.pairs, [1, -1, -1, 0, -1, -1, 0, 2, -1, 1, 0, -1]);
}

#[test]
fn subm_small_rulebook_by_hand() {
    let a = Attrs::new(1, [1, 1, 3], [1, 1, 3]).padding([0, 0, 1]).subm();
    let rows = [[0, 0, 0, 0], [0, 0, 0, 1]];
    let got = check(&a, &rows);
    assert_eq!(got.out, [0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(got.num, [1, 2, 1]);
    // tap 0: o = x + 1; tap 1: o = x; tap 2: o = x - 1.
    assert_eq!(got.pairs, [0, -1, 1, -1, 0, 1, 0, 1, 1, -1, 0, -1]);
}

#[test]
fn stride_and_dilation_on_different_axes_by_hand() {
    let a = Attrs::new(1, [4, 5, 3], [1, 3, 1]).stride([2, 1, 1]).dilation([1, 2, 1]);
    let got = check(&a, &[[0, 2, 4, 1]]);
    assert_eq!(got.out, [0, 1, 0, 1]);
    assert_eq!(got.num, [0, 0, 1]);
    assert_eq!(got.pairs, [-1, -1, -1, -1, 0, 0]);
}

#[test]
fn transpose_small_rulebook_by_hand() {
    // out x size (2 - 1) * 2 + 1 + 1 = 4; x=1 -> 2, 3; x=0 -> 0, 1.
    let a = Attrs::new(1, [1, 1, 2], [1, 1, 2]).stride([1, 1, 2]).transpose();
    let got = check(&a, &[[0, 0, 0, 1], [0, 0, 0, 0]]);
    assert_eq!(got.out, [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3]);
    assert_eq!(got.num, [2, 2]);
    assert_eq!(got.pairs, [0, 1, 2, 0, 0, 1, 3, 1]);
}

#[test]
fn duplicate_rows_outside_subm_each_get_their_pairs() {
    let a = Attrs::new(1, [2, 2, 2], [1, 1, 1]);
    let got = check(&a, &[[0, 1, 0, 1], [0, 1, 0, 1]]);
    assert_eq!(got.out, [0, 1, 0, 1]);
    assert_eq!(got.num, [2]);
    assert_eq!(got.pairs, [0, 1, 0, 0]);
    // And in random data with many repeats, for every mode but subm.
    let mut rng = Rng(7);
    for mode in [0, 1] {
        for _ in 0..20 {
            let a = random_attrs(&mut rng, mode);
            let c = resolve(&a).expect("valid");
            let spatial = c.spatial.map(|s| s.min(3) as i64);
            let mut rows = uniform_rows(&mut rng, 30, c.batch, spatial);
            rows.extend_from_within(..10);
            check(&a, &rows);
        }
    }
}

#[test]
fn no_active_sites_in_every_mode() {
    for a in [
        Attrs::new(1, [3, 3, 3], [3, 3, 3]).stride([2, 2, 2]).padding([1, 1, 1]),
        Attrs::new(1, [3, 3, 3], [3, 3, 3]).padding([1, 1, 1]).subm(),
        Attrs::new(1, [3, 3, 3], [2, 2, 2]).stride([2, 2, 2]).transpose(),
    ] {
        let k = resolve(&a).expect("valid").volume();
        for par in [&Serial as &dyn Parallel, &Threads(2)] {
            let got = run_rows(&a, &[], par).expect("L = 0 is legal");
            assert!(got.pairs.is_empty() && got.out.is_empty());
            assert_eq!(got.num, vec![0; k]);
        }
    }
}

#[test]
fn single_offset_kernel() {
    let mut rng = Rng(11);
    for mode in [0u8, 1, 2] {
        let mut a = random_attrs(&mut rng, mode);
        a.kernel_size = Some(vec![1, 1, 1]);
        a.padding = Some(vec![0, 0, 0]);
        let c = resolve(&a).expect("valid");
        let rows = blob_rows(&mut rng, 40, c.batch, c.spatial.map(|s| s as i64), [1, 1, 1]);
        let got = check(&a, &rows);
        if mode == 2 {
            // Every site pairs with itself, in row order.
            assert_eq!(got.num, [40]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Random shapes against the reference
// ---------------------------------------------------------------------------------------

#[test]
fn random_shapes_every_mode_match_reference() {
    let mut rng = Rng(2024);
    for case in 0..300 {
        let mode = (case % 3) as u8;
        let a = random_attrs(&mut rng, mode);
        let c = resolve(&a).expect("valid");
        let spatial = c.spatial.map(|s| s as i64);
        let volume = c.batch * spatial.iter().product::<i64>();
        let n = match rng.below(6) {
            0 => 0,
            1 => 1,
            _ => rng.below(volume.min(120)) as usize + 1,
        };
        let rows = if mode == 2 || rng.chance(1, 2) {
            blob_rows(&mut rng, n.min(volume as usize), c.batch, spatial, [1, 2, 2])
        } else {
            uniform_rows(&mut rng, n, c.batch, spatial)
        };
        check(&a, &rows);
    }
}

#[test]
fn non_cubic_kernels_dilation_padding_stride() {
    let cases = [
        Attrs::new(2, [5, 7, 9], [1, 3, 5]).padding([0, 1, 2]),
        Attrs::new(2, [6, 7, 9], [2, 1, 4]).stride([2, 1, 3]).padding([1, 0, 2]),
        Attrs::new(1, [9, 9, 9], [3, 2, 3]).dilation([2, 3, 1]).padding([2, 0, 1]),
        Attrs::new(1, [8, 8, 8], [3, 3, 3])
            .stride([1, 2, 1])
            .dilation([3, 1, 2])
            .padding([3, 1, 0]),
        // Stride larger than the kernel leaves gaps; padding larger than the kernel.
        Attrs::new(2, [9, 9, 9], [2, 2, 2]).stride([3, 4, 3]).padding([4, 0, 5]),
        Attrs::new(2, [4, 5, 6], [2, 3, 4])
            .stride([2, 3, 1])
            .padding([1, 2, 3])
            .transpose()
            .output_padding([1, 0, 2]),
        Attrs::new(2, [7, 9, 11], [1, 3, 5]).dilation([1, 2, 3]).padding([0, 2, 6]).subm(),
        Attrs::new(1, [7, 7, 7], [5, 5, 5]).padding([2, 2, 2]).subm(),
        // The largest kernel volume.
        Attrs::new(1, [16, 16, 16], [16, 16, 16]),
        Attrs::new(1, [16, 16, 16], [16, 16, 16]).padding([3, 7, 15]),
    ];
    let mut rng = Rng(5);
    for a in &cases {
        let c = resolve(a).expect("valid");
        let spatial = c.spatial.map(|s| s as i64);
        let rows = blob_rows(&mut rng, 60, c.batch, spatial, [2, 2, 2]);
        check(a, &rows);
    }
}

#[test]
fn huge_attributes_stay_exact() {
    // Padding and stride near i64::MAX, output sizes still small; spatial far beyond int32.
    let big = i64::MAX;
    let cases = [
        Attrs::new(1, [big, 5, 5], [3, 3, 3]).padding([big, 0, 0]).stride([big, 1, 1]),
        Attrs::new(i64::MAX, [1 << 40, 1 << 40, 3], [1, 1, 1]).stride([1 << 20, 1 << 20, 1]),
        Attrs::new(3, [4, 5, 6], [2, 2, 2]).stride([1 << 28, 1, 1]).transpose(),
        Attrs::new(2, [1 << 33, 9, 9], [3, 3, 3]).stride([1 << 33, 1, 1]).padding([
            (1 << 33) - 1,
            1,
            1,
        ]),
    ];
    let mut rng = Rng(99);
    for a in &cases {
        let c = resolve(a).unwrap_or_else(|e| panic!("{e}: {a:?}"));
        let spatial = c.spatial.map(|s| s.min(1 << 31) as i64);
        let mut rows = uniform_rows(&mut rng, 50, c.batch.min(4), spatial);
        rows.push([0, (spatial[0] - 1) as i32, (spatial[1] - 1) as i32, (spatial[2] - 1) as i32]);
        rows.extend(uniform_rows(&mut rng, 30, c.batch.min(4), spatial.map(|s| s.min(6))));
        check(a, &rows);
    }
}

#[test]
fn wide_site_keys() {
    // Batch, z, y and x all need 31 bits: more than 64 bits per key.
    let m = i32::MAX;
    let a = Attrs::new(i64::MAX, [1 << 31, 1 << 31, 1 << 31], [1, 1, 1]);
    assert!(resolve(&a).is_err(), "output size 2^31 is beyond int32");
    let a = Attrs::new(i64::MAX, [i64::from(m), i64::from(m), i64::from(m)], [1, 1, 3])
        .padding([0, 0, 1]);
    let rows = [
        [m, m - 1, m - 1, m - 1],
        [0, 0, 0, 0],
        [m, m - 1, m - 1, m - 2],
        [m - 1, 5, m - 1, 7],
        [m, m - 1, m - 1, m - 1],
    ];
    check(&a, &rows);
    let s = Attrs::new(i64::MAX, [i64::from(m), i64::from(m), i64::from(m)], [3, 1, 3])
        .padding([1, 0, 1])
        .subm();
    let rows = [
        [m, m - 1, m - 1, m - 1],
        [0, 0, 0, 0],
        [m, m - 1, m - 1, m - 2],
        [m - 1, 5, m - 1, 7],
        [m, m - 2, m - 1, m - 1],
    ];
    check(&s, &rows);
}

// ---------------------------------------------------------------------------------------
// Seed network cases
// ---------------------------------------------------------------------------------------

fn seed_subm() -> Attrs {
    Attrs::new(4, [41, 1440, 1440], [3, 3, 3])
        .stride([1, 1, 1])
        .padding([1, 1, 1])
        .dilation([1, 1, 1])
        .subm()
}

fn seed_sparse() -> Attrs {
    Attrs::new(4, [11, 360, 360], [3, 3, 3])
        .stride([2, 2, 2])
        .padding([0, 1, 1])
        .dilation([1, 1, 1])
}

fn full_scale() -> bool {
    std::env::var("MLU_EP_FULL_SCALE").is_ok_and(|v| v == "1")
}

/// Best of `n` wall-clock runs, in milliseconds.
fn time_ms(n: usize, mut f: impl FnMut()) -> f64 {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

fn seed_case(name: &str, a: &Attrs, l: usize, radius: [i64; 3], seed: u64, timed: bool) {
    let c = resolve(a).expect("seed attributes are valid");
    let mut rng = Rng(seed);
    let rows = blob_rows(&mut rng, l, c.batch, c.spatial.map(|s| s as i64), radius);
    let t = Instant::now();
    let want = reference(&c, &rows);
    let ref_ms = t.elapsed().as_secs_f64() * 1e3;
    let got = run_rows(a, &rows, &Threads::all()).expect("seed case runs");
    assert_rulebook(&got, &want, a);
    if c.subm {
        assert_eq!(got.out.len(), 4 * l);
        assert_eq!(got.num[13] as usize, l, "the centre offset pairs every site with itself");
    }
    let pairs: i64 = got.num.iter().map(|&n| i64::from(n)).sum();
    if timed {
        let tensor = indices(&rows);
        let op: GetIndicePairs = descriptor(&a.map()).expect("valid");
        let threads = Threads::all();
        let par_ms = time_ms(5, || drop(run(&op, &[Some(&tensor)], &threads).expect("runs")));
        let ser_ms = time_ms(3, || drop(run(&op, &[Some(&tensor)], &Serial).expect("runs")));
        println!(
            "{name}: L = {l}, num_act_out = {}, pairs = {pairs}: {par_ms:.1} ms on {} threads, {ser_ms:.1} ms serial; naive reference {ref_ms:.0} ms",
            got.out.len() / 4,
            threads.0
        );
    }
}

#[test]
fn seed_subm_reduced_scale() {
    seed_case("subm (reduced)", &seed_subm(), 5000, [2, 6, 6], 1, false);
}

#[test]
fn seed_sparse_reduced_scale() {
    seed_case("sparse (reduced)", &seed_sparse(), 5000, [2, 5, 5], 2, false);
}

#[test]
fn seed_subm_full_scale() {
    if full_scale() {
        seed_case("subm seed case", &seed_subm(), 248_636, [2, 6, 6], 3, true);
    }
}

#[test]
fn seed_sparse_full_scale() {
    if full_scale() {
        seed_case("sparse seed case", &seed_sparse(), 149_100, [2, 5, 5], 4, true);
    }
}

// ---------------------------------------------------------------------------------------
// One test per error rule of docs/CONTRACT.md §4.3
// ---------------------------------------------------------------------------------------

fn base() -> Attrs {
    Attrs::new(1, [3, 3, 3], [3, 3, 3])
}

#[test]
fn error_batch_outside_zero_to_batch_size() {
    for row in [[1, 0, 0, 0], [-1, 1, 1, 1], [i32::MAX, 0, 0, 0]] {
        let msg = run_error(&base(), &indices(&[[0, 1, 1, 1], row]));
        assert!(
            msg.contains("input 'indices'") && msg.contains("row 1") && msg.contains("batch"),
            "{msg}"
        );
    }
}

#[test]
fn error_coordinate_outside_spatial_shape() {
    let a = Attrs::new(1, [3, 2, 4], [1, 1, 1]);
    for row in [
        [0, 3, 0, 0],
        [0, 0, 2, 0],
        [0, 0, 0, 4],
        [0, -1, 0, 0],
        [0, 0, -1, 0],
        [0, 0, 0, i32::MIN],
    ] {
        let msg = run_error(&a, &indices(&[[0, 0, 1, 3], row]));
        assert!(
            msg.contains("input 'indices'")
                && msg.contains("row 1")
                && msg.contains("spatial_shape"),
            "{msg}"
        );
    }
    // In subm and transpose mode too.
    let subm = base().padding([1, 1, 1]).subm();
    assert!(run_error(&subm, &indices(&[[0, 1, 1, 1], [0, 0, 3, 0]])).contains("indices"));
    let tr = base().stride([2, 2, 2]).transpose();
    assert!(run_error(&tr, &indices(&[[0, 1, 1, 1], [0, 0, 0, 3]])).contains("indices"));
}

#[test]
fn error_kernel_volume_above_4096() {
    let msg = attribute_error(&Attrs::new(1, [1, 17, 241], [1, 17, 241]), "kernel_size");
    assert!(msg.contains("4096") && msg.contains("4097"), "{msg}");
    attribute_error(&Attrs::new(1, [20, 20, 20], [17, 17, 17]), "kernel_size");
    attribute_error(&Attrs::new(1, [20, 20, 20], [i64::MAX, i64::MAX, i64::MAX]), "kernel_size");
    // 4096 itself is legal.
    assert!(descriptor::<GetIndicePairs>(&Attrs::new(1, [16, 16, 16], [16, 16, 16]).map()).is_ok());
}

#[test]
fn error_stride_above_one_with_dilation_above_one_on_one_axis() {
    let a = Attrs::new(1, [9, 9, 9], [3, 3, 3]).stride([1, 2, 1]).dilation([1, 2, 1]);
    let msg = attribute_error(&a, "dilation");
    assert!(
        msg.contains("stride 2") && msg.contains("dilation 2") && msg.contains("axis 1"),
        "{msg}"
    );
    // On different axes it is legal.
    let ok = Attrs::new(1, [9, 9, 9], [3, 3, 3]).stride([2, 1, 1]).dilation([1, 2, 1]);
    assert!(descriptor::<GetIndicePairs>(&ok.map()).is_ok());
}

#[test]
fn error_non_positive_batch_size() {
    for v in [0, -1, i64::MIN] {
        let mut a = base();
        a.batch_size = Some(v);
        attribute_error(&a, "batch_size");
    }
    let mut a = base();
    a.batch_size = None;
    attribute_error(&a, "batch_size");
}

#[test]
fn error_non_positive_spatial_value() {
    for v in [[3, 0, 3], [-3, 3, 3], [3, 3, i64::MIN]] {
        let msg = attribute_error(&Attrs::new(1, v, [1, 1, 1]), "spatial_shape");
        assert!(msg.contains("> 0"), "{msg}");
    }
    let mut a = base();
    a.spatial_shape = Some(vec![3, 3]);
    attribute_error(&a, "spatial_shape");
    a.spatial_shape = None;
    attribute_error(&a, "spatial_shape");
}

#[test]
fn error_non_positive_kernel_value() {
    attribute_error(&Attrs::new(1, [3, 3, 3], [3, 3, 0]), "kernel_size");
    attribute_error(&Attrs::new(1, [3, 3, 3], [-1, 3, 3]), "kernel_size");
    let mut a = base();
    a.kernel_size = Some(vec![3, 3, 3, 3]);
    attribute_error(&a, "kernel_size");
    a.kernel_size = None;
    attribute_error(&a, "kernel_size");
}

#[test]
fn error_non_positive_stride_value() {
    attribute_error(&base().stride([1, 0, 1]), "stride");
    attribute_error(&base().stride([1, 1, -2]), "stride");
    let mut a = base();
    a.stride = Some(vec![1, 1]);
    attribute_error(&a, "stride");
}

#[test]
fn error_non_positive_dilation_value() {
    attribute_error(&base().dilation([0, 1, 1]), "dilation");
    attribute_error(&base().dilation([1, i64::MIN, 1]), "dilation");
}

#[test]
fn error_non_positive_output_size() {
    // Conv: y = (2 - 2 - 1) / 1 + 1 = 0; x = (1 - 4 - 1) + 1 = -3.
    let msg = attribute_error(&Attrs::new(1, [3, 2, 3], [3, 3, 3]), "kernel_size");
    assert!(msg.contains("output size") && msg.contains("axis 1"), "{msg}");
    attribute_error(&Attrs::new(1, [3, 3, 1], [3, 3, 3]).dilation([1, 1, 2]), "kernel_size");
    // Floor division: (2 - 2 - 1) / 2 + 1 = 0 (truncation would give 1).
    attribute_error(&Attrs::new(1, [3, 2, 3], [1, 3, 1]).stride([1, 2, 1]), "kernel_size");
    // Transpose: (1 - 1) * 1 - 2 + 0 + 0 + 1 = -1.
    let msg = attribute_error(
        &Attrs::new(1, [1, 1, 1], [1, 1, 1]).padding([1, 0, 0]).transpose(),
        "padding",
    );
    assert!(msg.contains("output size") && msg.contains("axis 0"), "{msg}");
}

#[test]
fn error_output_size_beyond_int32() {
    // The kernel's decision: out_indices holds int32 coordinates, so sizes must fit int32.
    let msg = attribute_error(&Attrs::new(1, [3, 3, 1 << 31], [1, 1, 1]), "spatial_shape");
    assert!(msg.contains("2147483647"), "{msg}");
    attribute_error(&Attrs::new(1, [3, 3, 3], [3, 3, 3]).padding([0, 1 << 40, 0]), "spatial_shape");
    attribute_error(
        &Attrs::new(1, [3, 3, 3], [3, 3, 3]).stride([1, 1 << 31, 1]).transpose(),
        "spatial_shape",
    );
    attribute_error(
        &Attrs::new(1, [3, 3, i64::MAX], [3, 3, 3]).stride([1, 1, i64::MAX]).transpose(),
        "spatial_shape",
    );
}

#[test]
fn error_negative_padding() {
    let msg = attribute_error(&base().padding([0, -1, 0]), "padding");
    assert!(msg.contains("-1") && msg.contains(">= 0"), "{msg}");
    attribute_error(&base().padding([i64::MIN, 0, 0]), "padding");
}

#[test]
fn error_negative_output_padding() {
    // Checked even where unused (conv and subm) as well as in transpose.
    attribute_error(&base().output_padding([-1, 0, 0]), "output_padding");
    attribute_error(&base().padding([1, 1, 1]).subm().output_padding([0, -1, 0]), "output_padding");
    attribute_error(&base().transpose().output_padding([0, 0, -1]), "output_padding");
}

#[test]
fn error_duplicate_input_site_in_subm() {
    let a = base().padding([1, 1, 1]).subm();
    let msg = run_error(&a, &indices(&[[0, 1, 1, 1], [0, 0, 0, 0], [0, 2, 2, 2], [0, 1, 1, 1]]));
    assert!(
        msg.contains("input 'indices'") && msg.contains("rows 0 and 3") && msg.contains("subm"),
        "{msg}"
    );
}

#[test]
fn error_subm_with_stride_above_one() {
    let msg = attribute_error(&base().padding([1, 1, 1]).stride([2, 1, 1]).subm(), "stride");
    assert!(msg.contains("subm"), "{msg}");
}

#[test]
fn error_subm_output_size_differs_from_input_size() {
    // padding must be dilation * (k - 1) / 2 per axis.
    let msg = attribute_error(&base().padding([1, 0, 1]).subm(), "padding");
    assert!(msg.contains("axis 1"), "{msg}");
    attribute_error(
        &Attrs::new(1, [5, 5, 5], [3, 3, 3]).dilation([2, 2, 2]).padding([1, 1, 1]).subm(),
        "padding",
    );
    // An even dilated kernel cannot keep the size.
    attribute_error(&Attrs::new(1, [3, 3, 3], [2, 2, 2]).subm(), "kernel_size");
}

#[test]
fn error_subm_together_with_transpose() {
    attribute_error(&base().padding([1, 1, 1]).subm().transpose(), "transpose");
}

#[test]
fn error_transpose_with_dilation_above_one() {
    let msg = attribute_error(&base().transpose().dilation([1, 1, 2]), "dilation");
    assert!(msg.contains("transpose") && msg.contains("axis 2"), "{msg}");
}

#[test]
fn error_inverse_not_zero() {
    for v in [1, -1, 2] {
        let mut a = base();
        a.inverse = Some(v);
        attribute_error(&a, "inverse");
    }
}

#[test]
fn error_subm_and_transpose_not_zero_or_one() {
    let mut a = base();
    a.subm = Some(2);
    attribute_error(&a, "subm");
    let mut a = base();
    a.transpose = Some(-1);
    attribute_error(&a, "transpose");
}

#[test]
fn error_indices_shape_not_l_by_4() {
    for t in [
        Tensor::i32([2, 3], vec![0, 1, 1, 0, 0, 0]),
        Tensor::i32([8], vec![0, 1, 1, 1, 0, 0, 0, 0]),
        Tensor::i32([1, 2, 4], vec![0, 1, 1, 1, 0, 0, 0, 0]),
        Tensor::i32([0, 5], vec![]),
    ] {
        let msg = run_error(&base(), &t);
        assert!(msg.contains("input 'indices'") && msg.contains("[L, 4]"), "{msg}");
    }
}

#[test]
fn error_indices_dtype_not_int32() {
    let t = Tensor::i64([2, 4], vec![0, 1, 1, 1, 0, 0, 0, 0]);
    let msg = run_error(&base(), &t);
    assert!(msg.contains("input 'indices'") && msg.contains("int32"), "{msg}");
}

#[test]
fn error_pair_tensor_beyond_int32() {
    // K * 2 * L = 4096 * 2 * 262144 = 2^31 elements: offsets would not fit int32.
    let a = Attrs::new(1, [16, 16, 16], [16, 16, 16]);
    let msg = run_error(&a, &indices(&vec![[0, 0, 0, 0]; 262_144]));
    assert!(msg.contains("output 'indice_pairs'") && msg.contains("int32"), "{msg}");
}

#[test]
fn valid_runs_never_depend_on_thread_count() {
    let mut rng = Rng(77);
    let a = random_attrs(&mut rng, 0);
    let c = resolve(&a).expect("valid");
    let rows = uniform_rows(&mut rng, 500, c.batch, c.spatial.map(|s| s as i64));
    let first = run_rows(&a, &rows, &Serial).expect("runs");
    for t in 1..6 {
        assert_eq!(run_rows(&a, &rows, &Threads(t)).expect("runs"), first);
    }
}

// ---------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------

/// Values that break rules or stress arithmetic.
fn weird() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0),
        Just(-1),
        Just(-2),
        Just(2),
        Just(17),
        Just(4097),
        Just(1 << 31),
        Just((1 << 31) - 1),
        Just(1 << 40),
        Just(i64::MAX),
        Just(i64::MIN),
    ]
}

/// One attribute damaged: (which, axis, value, wrong length).
type Damage = Option<(u8, usize, i64, bool)>;

#[derive(Debug, Clone)]
struct RawCase {
    mode: u8,
    batch: i64,
    spatial: [i64; 3],
    kernel: [i64; 3],
    stride: [i64; 3],
    dilation: [i64; 3],
    padding: [i64; 3],
    output_padding: [i64; 3],
    /// Skip the fix-ups that make the mode's combination rules hold.
    raw_combination: bool,
    /// Set attributes explicitly even when they equal the default.
    explicit: bool,
    damage: Damage,
    /// Per row: raw values, and a selector that pushes one field out of range when < 2.
    rows: Vec<([u32; 4], u8, u8)>,
    dedup: bool,
    /// 0: [L, 4]; 1: [L, 3]; 2: [4L]; 3: [L, 5].
    layout: u8,
}

fn raw_case() -> impl Strategy<Value = RawCase> {
    let axis = |lo: i64, hi: i64| [lo..=hi, lo..=hi, lo..=hi];
    let damage = prop_oneof![
        4 => Just(None),
        1 => (0u8..11, 0usize..3, weird(), prop::bool::weighted(0.1)).prop_map(Some),
    ];
    let rows = prop::collection::vec((any::<[u32; 4]>(), any::<u8>(), any::<u8>()), 0..28);
    let layout = prop_oneof![20 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)];
    (
        (0u8..3, 1i64..=3, axis(1, 8), axis(1, 4), axis(1, 3), axis(1, 3), axis(0, 3), axis(0, 2)),
        (prop::bool::weighted(0.1), any::<bool>(), damage, rows, prop::bool::weighted(0.8), layout),
    )
        .prop_map(
            |(
                (mode, batch, spatial, kernel, stride, dilation, padding, output_padding),
                (raw_combination, explicit, damage, rows, dedup, layout),
            )| RawCase {
                mode,
                batch,
                spatial,
                kernel,
                stride,
                dilation,
                padding,
                output_padding,
                raw_combination,
                explicit,
                damage,
                rows,
                dedup,
                layout,
            },
        )
}

/// Turns the raw material into attributes and an indices tensor.
fn build(r: &RawCase) -> (Attrs, Tensor) {
    let mut dilation = r.dilation;
    let mut stride = r.stride;
    let mut padding = r.padding;
    let mut kernel = r.kernel;
    if !r.raw_combination {
        for i in 0..3 {
            // Dilation is mostly 1, and never with a stride on its axis.
            if stride[i] > 1 || r.mode == 1 || dilation[i] == 3 {
                dilation[i] = 1;
            }
            if r.mode == 2 {
                stride[i] = 1;
                if dilation[i] * (kernel[i] - 1) % 2 != 0 {
                    kernel[i] -= 1;
                }
                padding[i] = dilation[i] * (kernel[i] - 1) / 2;
            }
        }
    }
    let opt = |v: [i64; 3], default: [i64; 3]| (r.explicit || v != default).then(|| v.to_vec());
    let mut a = Attrs {
        batch_size: Some(r.batch),
        spatial_shape: Some(r.spatial.to_vec()),
        kernel_size: Some(kernel.to_vec()),
        stride: opt(stride, [1; 3]),
        padding: opt(padding, [0; 3]),
        dilation: opt(dilation, [1; 3]),
        output_padding: if r.mode == 1 { opt(r.output_padding, [0; 3]) } else { None },
        subm: (r.mode == 2 || r.explicit).then_some(i64::from(r.mode == 2)),
        transpose: (r.mode == 1 || r.explicit).then_some(i64::from(r.mode == 1)),
        inverse: r.explicit.then_some(0),
    };
    if let Some((which, axis, value, wrong_len)) = r.damage {
        let set = |v: &mut Option<Vec<i64>>, default: [i64; 3]| {
            let mut x = v.clone().unwrap_or_else(|| default.to_vec());
            if wrong_len {
                x.push(value);
            } else {
                x[axis] = value;
            }
            *v = Some(x);
        };
        match which {
            0 => a.batch_size = Some(value),
            1 => set(&mut a.spatial_shape, [1; 3]),
            2 => set(&mut a.kernel_size, [1; 3]),
            3 => set(&mut a.stride, [1; 3]),
            4 => set(&mut a.padding, [0; 3]),
            5 => set(&mut a.dilation, [1; 3]),
            6 => set(&mut a.output_padding, [0; 3]),
            7 => a.subm = Some(value),
            8 => a.transpose = Some(value),
            9 => a.inverse = Some(value),
            _ => match axis {
                0 => a.batch_size = None,
                1 => a.spatial_shape = None,
                _ => a.kernel_size = None,
            },
        }
    }
    // Rows inside the (possibly damaged) limits, except where the selector says otherwise.
    let limit = |f: usize| -> i64 {
        match f {
            0 => a.batch_size.unwrap_or(1),
            _ => a.spatial_shape.as_ref().and_then(|s| s.get(f - 1).copied()).unwrap_or(1),
        }
    };
    let mut rows: Vec<[i32; 4]> = r
        .rows
        .iter()
        .map(|(raw, sel, which)| {
            let mut row: [i32; 4] =
                std::array::from_fn(|f| (i64::from(raw[f]) % limit(f).clamp(1, 12)) as i32);
            if *sel < 2 {
                let f = usize::from(*which % 4);
                let lim = limit(f);
                row[f] = if *sel == 0 || lim > i64::from(i32::MAX) {
                    -1
                } else {
                    lim.max(i64::from(i32::MIN)) as i32
                };
            }
            row
        })
        .collect();
    if r.dedup && a.subm == Some(1) {
        let mut seen = HashSet::new();
        rows.retain(|row| seen.insert(*row));
    }
    let flat: Vec<i32> = rows.iter().flatten().copied().collect();
    let l = rows.len();
    let t = match r.layout {
        0 => Tensor::i32([l, 4], flat),
        1 => Tensor::i32([l, 3], flat[..3 * l].to_vec()),
        2 => Tensor::i32([4 * l], flat),
        _ => Tensor::i32([l, 5], flat.iter().copied().chain(std::iter::repeat_n(0, l)).collect()),
    };
    (a, t)
}

fn rows_of(t: &Tensor) -> Vec<[i32; 4]> {
    t.data.i32().unwrap_or(&[]).chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// Never a panic; an error exactly where the contract (and the int32 decisions) say so,
    /// at node creation for attribute rules and at run time for input rules; otherwise the
    /// reference's exact rulebook.
    #[test]
    fn prop_matches_contract(r in raw_case()) {
        let (a, t) = build(&r);
        let data = t.data.i32().unwrap_or(&[]);
        let expected = expect(&a, &t.shape, data);
        let built = descriptor::<GetIndicePairs>(&a.map());
        match (&expected, built) {
            (Expect::Attribute, Err(e)) => prop_assert!(matches!(e, Error::Attribute { .. }), "{e}"),
            (Expect::Attribute, Ok(op)) => prop_assert!(false, "expected an attribute error, built {op:?}"),
            (_, Err(e)) => prop_assert!(false, "unexpected attribute error {e}"),
            (Expect::Run, Ok(_)) => {
                let e = run_tensor(&a, &t, &Threads(2));
                prop_assert!(e.is_err(), "expected a run error, got {e:?}");
                let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
                prop_assert!(msg.contains("'indices'") || msg.contains("'indice_pairs'"), "{msg}");
            }
            (Expect::Valid(c), Ok(_)) => {
                let want = reference(c, &rows_of(&t));
                for par in [&Serial as &dyn Parallel, &Threads(2)] {
                    let got = run_tensor(&a, &t, par);
                    prop_assert_eq!(got.as_ref().ok(), Some(&want), "{:?}", got.as_ref().err());
                }
            }
        }
    }
}
