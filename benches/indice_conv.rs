//! IndiceConv kernel at the CenterPoint backbone's layers, and where its time goes.
//!
//!     .venv/bin/python benches/backbone_peer.py --dump /tmp/layers   # each layer's inputs
//!     cargo bench --bench indice_conv -- /tmp/layers [LAYER...]
//!
//! Per layer, timed in turn round after round (best of each; the machine is shared, so only
//! ratios measured side by side mean anything), on persistent pools of 1 and 2 threads:
//! - the kernel (plan + execute, as a node runs), and its plan alone (validation and the
//!   grouping of the pairs by row tile);
//! - the previous kernel (an axpy per pair and input channel into the output row, pairs
//!   grouped by output row; the code before gather -> GEMM -> scatter), for the speedup;
//! - single-threaded pieces of the execution, each over all pairs of the layer in chunks of
//!   the kernel's size: the GEMMs alone (on one gathered block, so from cache), the gathers
//!   alone (the source rows copied into the chunk block), and the adds of the product rows
//!   into the output rows (in the kernel's tile order).
//!
//! Also checks, per layer: 1 and 2 threads bit-identical, and the previous kernel within the
//! accumulating class of the new one (the two round differently).
//! `-- DIR --profile LAYER SECONDS` runs only that layer's kernel on 1 thread in a loop (for perf).
//!
//!     cargo bench --bench indice_conv -- --gemm
//!
//! compares the two GEMM crates considered for the kernel (the chosen `gemm`, and
//! `matrixmultiply`, ndarray's) on the kernel's call: single-threaded f32, row-major
//! C[m, Cout] = A[m, Cin] @ W[Cin, Cout], at the backbone's channel counts and chunk sizes
//! m, both timed in turn (best of 9 rounds).

use onnxruntime_ep_mlu::ops::sparse_conv::indice_conv::{IndiceConv, gemm_rows, tile_shift};
use onnxruntime_ep_mlu::ops::{Operator, descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, for_each_part_mut};
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::{Inputs, Tensor, TensorRef};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

#[path = "../tests/common/rng.rs"]
mod rng;

use rng::Rng;

const ROUNDS: usize = 7;
const BUDGET: Duration = Duration::from_millis(4000);
/// The kernel's chunk: a gathered block plus its product of at most this many bytes
/// (src/ops/sparse_conv/indice_conv/mod.rs CHUNK_BYTES).
const CHUNK_BYTES: usize = 128 * 1024;

struct Pool(rayon::ThreadPool);

impl Pool {
    fn new(n: usize) -> Self {
        Pool(rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("thread pool"))
    }
}

impl Parallel for Pool {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        use rayon::prelude::*;
        self.0.install(|| (0..tasks).into_par_iter().with_max_len(1).for_each(f));
    }
}

// ---------------------------------------------------------------- .npy files

fn npy(path: &Path) -> (String, Vec<usize>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x93NUMPY"), "{}: not a .npy file", path.display());
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).expect("ascii header");
    let field = |name: &str| {
        let at = header.find(name).unwrap_or_else(|| panic!("{}: no {name}", path.display()))
            + name.len();
        header[at..].trim_start_matches([':', ' ', '\'']).to_string()
    };
    let descr = field("'descr'").split('\'').next().unwrap_or("").to_string();
    assert!(field("'fortran_order'").starts_with("False"), "{}: Fortran order", path.display());
    let shape_text = field("'shape'");
    let inner =
        &shape_text[shape_text.find('(').expect("shape") + 1..shape_text.find(')').expect("shape")];
    let shape = inner
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("dim"))
        .collect();
    (descr, shape, bytes[start + hlen..].to_vec())
}

fn load(dir: &Path, name: &str) -> Tensor {
    let (descr, shape, data) = npy(&dir.join(format!("{name}.npy")));
    let words = data.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
    match descr.as_str() {
        "<f4" => Tensor::f32(shape, words.map(f32::from_le_bytes).collect()),
        "<i4" => Tensor::i32(shape, words.map(i32::from_le_bytes).collect()),
        d => panic!("{name}: dtype {d} (want <f4 or <i4)"),
    }
}

struct Layer {
    name: String,
    /// features, filters, indice_pairs, indice_num, out_indices
    t: Vec<Tensor>,
}

impl Layer {
    fn dims(&self) -> (usize, usize, usize, usize, usize) {
        let (l, cin) = (self.t[0].shape[0], self.t[0].shape[1]);
        let (k, cout) = (self.t[1].shape[0], self.t[1].shape[2]);
        (l, cin, k, cout, self.t[4].shape[0])
    }
    fn f32(&self, i: usize) -> &[f32] {
        self.t[i].data.f32().expect("f32")
    }
    fn i32(&self, i: usize) -> &[i32] {
        self.t[i].data.i32().expect("i32")
    }
    fn pairs(&self) -> usize {
        self.i32(3).iter().map(|&n| n as usize).sum()
    }
    /// (k, src, dst) of every pair, in (k, j) order.
    fn list(&self) -> Vec<(usize, usize, usize)> {
        let p = self.t[2].shape[2];
        let (pairs, num) = (self.i32(2), self.i32(3));
        let mut v = Vec::with_capacity(self.pairs());
        for (k, &n) in num.iter().enumerate() {
            for j in 0..n as usize {
                v.push((k, pairs[k * 2 * p + j] as usize, pairs[k * 2 * p + p + j] as usize));
            }
        }
        v
    }
}

// ---------------------------------------------------------------- the previous kernel

/// The kernel before gather -> GEMM -> scatter (inverse = 0 only): pairs counting-sorted by
/// output row (serially), then blocks of 64 output rows, offsets ascending, one axpy per pair
/// and input channel into the output row.
fn previous(layer: &Layer, par: &dyn Parallel) -> Vec<f32> {
    const BLOCK_ROWS: usize = 64;
    const GRAIN: usize = 256 * 1024;
    let (_, cin, _, cout, rows) = layer.dims();
    let (features, filters) = (layer.f32(0), layer.f32(1));
    let p = layer.t[2].shape[2];
    let (pairs, num) = (layer.i32(2), layer.i32(3));
    let mut counts = vec![0usize; rows + 1];
    for (k, &n) in num.iter().enumerate() {
        for &o in &pairs[k * 2 * p + p..k * 2 * p + p + n as usize] {
            counts[o as usize + 1] += 1;
        }
    }
    for o in 0..rows {
        counts[o + 1] += counts[o];
    }
    let starts = counts;
    let mut cursor = starts.clone();
    let mut grouped = vec![(0u32, 0u32); starts[rows]];
    for (k, &n) in num.iter().enumerate() {
        let n = n as usize;
        for (&s, &o) in
            pairs[k * 2 * p..k * 2 * p + n].iter().zip(&pairs[k * 2 * p + p..k * 2 * p + p + n])
        {
            grouped[cursor[o as usize]] = (k as u32, s as u32);
            cursor[o as usize] += 1;
        }
    }
    let mut out = vec![0f32; rows * cout];
    let mut bounds = vec![0usize];
    let mut work = 0usize;
    for block in (BLOCK_ROWS..rows).step_by(BLOCK_ROWS) {
        work += (starts[block] - starts[block - BLOCK_ROWS]) * cin * cout + BLOCK_ROWS * cout;
        if work >= GRAIN {
            bounds.push(block * cout);
            work = 0;
        }
    }
    bounds.push(out.len());
    for_each_part_mut(par, &mut out, &bounds, |t, part| {
        let first = bounds[t] / cout;
        let mut cur = Vec::with_capacity(BLOCK_ROWS);
        for (b, block) in part.chunks_mut(BLOCK_ROWS * cout).enumerate() {
            let row0 = first + b * BLOCK_ROWS;
            let n_rows = block.len() / cout;
            block.fill(0.0);
            cur.clear();
            cur.extend((row0..row0 + n_rows).map(|o| starts[o]));
            let mut k = grouped[starts[row0]..starts[row0 + n_rows]].iter().map(|p| p.0).min();
            while let Some(kk) = k {
                let w = &filters[kk as usize * cin * cout..(kk as usize + 1) * cin * cout];
                let mut next: Option<u32> = None;
                for (i, row) in block.chunks_exact_mut(cout).enumerate() {
                    let end = starts[row0 + i + 1];
                    let c = &mut cur[i];
                    while *c < end && grouped[*c].0 == kk {
                        let x = &features
                            [grouped[*c].1 as usize * cin..(grouped[*c].1 as usize + 1) * cin];
                        for (&xi, wrow) in x.iter().zip(w.chunks_exact(cout)) {
                            for (o, &wv) in row.iter_mut().zip(wrow) {
                                *o += xi * wv;
                            }
                        }
                        *c += 1;
                    }
                    if *c < end {
                        next = Some(next.map_or(grouped[*c].0, |n| n.min(grouped[*c].0)));
                    }
                }
                k = next;
            }
        }
    });
    out
}

// ---------------------------------------------------------------- pieces of the execution

/// Each offset's pairs in chunks of `chunk` rows, as the kernel cuts them when a tile holds
/// all of an offset's pairs (in the kernel a tile holds fewer: its chunks are smaller).
fn chunks(list: &[(usize, usize, usize)], chunk: usize) -> Vec<&[(usize, usize, usize)]> {
    list.chunk_by(|a, b| a.0 == b.0).flat_map(|run| run.chunks(chunk)).collect()
}

// ---------------------------------------------------------------- main

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn diff(a: &[f32], b: &[f32]) -> (f64, f64) {
    let (mut d1, mut n1, mut d2, mut n2) = (0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        d1 += (x - y).abs();
        n1 += y.abs();
        d2 += (x - y) * (x - y);
        n2 += y * y;
    }
    (d1 / n1.max(1e-300), (d2 / n2.max(1e-300)).sqrt())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `--gemm`: the two GEMM crates side by side (GFLOP/s).
fn compare_gemm_crates() {
    let mut rng = Rng(1);
    let mut floats = |n: usize| -> Vec<f32> {
        (0..n).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
    };
    println!(
        "single-threaded f32 GEMM C[m, Cout] = A[m, Cin] @ W[Cin, Cout], row-major; GFLOP/s, best of 9 rounds, crates in turn"
    );
    println!("| Cin->Cout | m | gemm | matrixmultiply | gemm / matrixmultiply |");
    println!("|---|---|---|---|---|");
    for (cin, cout) in
        [(5, 16), (16, 16), (16, 32), (32, 32), (32, 64), (64, 64), (64, 128), (128, 128)]
    {
        for m in [8, 32, 64, 128, 256, 1024] {
            let (a, w) = (floats(m * cin), floats(cin * cout));
            let mut c = vec![0f32; m * cout];
            let flop = 2.0 * (m * cin * cout) as f64;
            let reps = ((5e7 / flop) as usize).max(3);
            let mut best = [f64::MAX; 2];
            for _ in 0..9 {
                for (i, b) in best.iter_mut().enumerate() {
                    let t = Instant::now();
                    for _ in 0..reps {
                        if i == 0 {
                            gemm_rows(m, cin, cout, &a, &w, &mut c);
                        } else {
                            // SAFETY: row-major [m, cin] @ [cin, cout] -> [m, cout] in buffers of those sizes.
                            unsafe {
                                matrixmultiply::sgemm(
                                    m,
                                    cin,
                                    cout,
                                    1.0,
                                    a.as_ptr(),
                                    cin as isize,
                                    1,
                                    w.as_ptr(),
                                    cout as isize,
                                    1,
                                    0.0,
                                    c.as_mut_ptr(),
                                    cout as isize,
                                    1,
                                )
                            };
                        }
                        std::hint::black_box(&mut c);
                    }
                    *b = b.min(t.elapsed().as_secs_f64() / reps as f64);
                }
            }
            let (g, mm) = (flop / best[0] / 1e9, flop / best[1] / 1e9);
            println!("| {cin}->{cout} | {m} | {g:.0} | {mm:.0} | {:.2}x |", g / mm);
        }
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` only builds and starts the
    // binary, which then has nothing to do.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "benches/indice_conv.rs: run with `cargo bench --bench indice_conv -- DIR` (or `-- --gemm`)"
        );
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.first().map(String::as_str) == Some("--gemm") {
        return compare_gemm_crates();
    }
    let Some(dir) = args.first() else {
        eprintln!(
            "usage: cargo bench --bench indice_conv -- DIR [LAYER...] | DIR --profile LAYER SECONDS"
        );
        eprintln!("(DIR from `.venv/bin/python benches/backbone_peer.py --dump DIR`)");
        std::process::exit(2);
    };
    let dir = Path::new(dir);
    let names: Vec<String> = if args.len() > 1 && args[1] != "--profile" {
        args[1..].to_vec()
    } else {
        std::fs::read_to_string(dir.join("layers.txt"))
            .expect("layers.txt")
            .lines()
            .map(str::to_string)
            .collect()
    };
    let op: IndiceConv =
        descriptor(&HashMap::from([("inverse".to_string(), AttrValue::Int(0))])).expect("op");
    let pools = [Pool::new(1), Pool::new(2)];
    let layer_of = |name: &str| {
        let d = dir.join(name);
        Layer {
            name: name.to_string(),
            t: ["features", "filters", "pairs", "num", "out_indices"]
                .iter()
                .map(|n| load(&d, n))
                .collect(),
        }
    };
    let kernel = |layer: &Layer, par: &dyn Parallel| -> Tensor {
        let ins: Vec<Option<&Tensor>> = layer.t.iter().map(Some).chain([None]).collect();
        run(&op, &ins, par).expect("IndiceConv runs").remove(0)
    };
    let plan_only = |layer: &Layer, par: &dyn Parallel| {
        let refs: Vec<Option<TensorRef<'_>>> =
            layer.t.iter().map(|t| Some(t.view())).chain([None]).collect();
        let names = ["features", "filters", "indice_pairs", "indice_num", "out_indices", "bias"]
            .map(String::from)
            .to_vec();
        let inputs = Inputs::new(names, refs).expect("inputs");
        std::hint::black_box(op.plan(&inputs, par).expect("plan"));
    };

    if args.get(1).map(String::as_str) == Some("--profile") {
        let layer = layer_of(&args[2]);
        let secs: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10.0);
        let start = Instant::now();
        let mut n = 0;
        while start.elapsed().as_secs_f64() < secs {
            std::hint::black_box(kernel(&layer, &pools[0]));
            n += 1;
        }
        println!(
            "{}: {n} runs, {:.2} ms each",
            layer.name,
            start.elapsed().as_secs_f64() * 1e3 / n as f64
        );
        return;
    }

    println!(
        "IndiceConv at the backbone's layers ({}): best of at least {ROUNDS} rounds, variants in turn; \
         pieces single-threaded; GF/s = 2 * pairs * Cin * Cout / time",
        dir.display()
    );
    println!(
        "| layer | Cin->Cout | pairs | GFLOP | kernel 1T ms | 2T ms | 1->2 | GF/s 1T | plan 1T ms | plan 2T ms | previous 1T ms | previous 2T ms | speedup 1T / 2T | GEMMs alone ms (GF/s) | gathers alone ms | adds alone ms | checks |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut sums = [Duration::ZERO; 9];
    for name in &names {
        let layer = layer_of(name);
        let (_, cin, _, cout, rows) = layer.dims();
        let total = layer.pairs();
        let list = layer.list();
        let (features, filters) = (layer.f32(0), layer.f32(1));
        let chunk = (CHUNK_BYTES / ((cin + cout) * 4)).max(1);
        let mut a = vec![0f32; chunk * cin];
        for (row, &(_, s, _)) in a.chunks_exact_mut(cin).zip(&list) {
            row.copy_from_slice(&features[s * cin..(s + 1) * cin]);
        }
        let mut c = vec![0f32; chunk * cout];
        let (mut a2, c2) = (a.clone(), vec![0.5f32; chunk * cout]);
        let cs = chunks(&list, chunk);
        // The adds in the kernel's order: pairs by row tile, (k, j) order within a tile.
        let active = layer.i32(3).iter().filter(|&&n| n > 0).count();
        let tr = 1usize << tile_shift(rows, cout, total, active, layer.i32(3).len());
        let mut by_tile = list.clone();
        by_tile.sort_by_key(|&(_, _, d)| d / tr); // stable: (k, j) order within a tile
        let mut out = vec![0f32; rows * cout];

        let (first1, first2) = (kernel(&layer, &pools[0]), kernel(&layer, &pools[1]));
        let (first1, first2) = (first1.data.f32().expect("f32"), first2.data.f32().expect("f32"));
        let prev = previous(&layer, &pools[1]);
        let (d1, d2) = diff(&prev, first1);
        let same = bits(first1) == bits(first2);
        let ok = same && d1 <= 3e-3 && d2 <= 3e-3;

        let mut best = [Duration::MAX; 9];
        let start = Instant::now();
        let mut rounds = 0;
        while rounds < ROUNDS || (start.elapsed() < BUDGET && rounds < 100) {
            let mut variants: [&mut dyn FnMut(); 9] = [
                &mut || drop(std::hint::black_box(kernel(&layer, &pools[0]))),
                &mut || drop(std::hint::black_box(kernel(&layer, &pools[1]))),
                &mut || plan_only(&layer, &pools[0]),
                &mut || plan_only(&layer, &pools[1]),
                &mut || drop(std::hint::black_box(previous(&layer, &pools[0]))),
                &mut || drop(std::hint::black_box(previous(&layer, &pools[1]))),
                &mut || {
                    for ch in &cs {
                        let k = ch[0].0;
                        gemm_rows(
                            ch.len(),
                            cin,
                            cout,
                            &a[..ch.len() * cin],
                            &filters[k * cin * cout..(k + 1) * cin * cout],
                            &mut c[..ch.len() * cout],
                        );
                    }
                    std::hint::black_box(&c);
                },
                &mut || {
                    for ch in &cs {
                        for (row, &(_, s, _)) in a2.chunks_exact_mut(cin).zip(*ch) {
                            row.copy_from_slice(&features[s * cin..(s + 1) * cin]);
                        }
                        std::hint::black_box(&a2);
                    }
                },
                &mut || {
                    for ch in by_tile.chunks(chunk) {
                        for (&(_, _, d), prod) in ch.iter().zip(c2.chunks_exact(cout)) {
                            for (o, &v) in out[d * cout..(d + 1) * cout].iter_mut().zip(prod) {
                                *o += v;
                            }
                        }
                    }
                    std::hint::black_box(&out);
                },
            ];
            for (b, f) in best.iter_mut().zip(variants.iter_mut()) {
                let t = Instant::now();
                f();
                *b = (*b).min(t.elapsed());
            }
            rounds += 1;
        }
        for (s, b) in sums.iter_mut().zip(best) {
            *s += b;
        }
        let gflop = 2.0 * (total * cin * cout) as f64 / 1e9;
        println!(
            "| {} | {cin}->{cout} | {total} | {gflop:.2} | {:.2} | {:.2} | {:.2}x | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x / {:.2}x | {:.2} ({:.0}) | {:.2} | {:.2} | {} |",
            layer.name,
            ms(best[0]),
            ms(best[1]),
            ms(best[0]) / ms(best[1]),
            gflop / best[0].as_secs_f64(),
            ms(best[2]),
            ms(best[3]),
            ms(best[4]),
            ms(best[5]),
            ms(best[4]) / ms(best[0]),
            ms(best[5]) / ms(best[1]),
            ms(best[6]),
            gflop / best[6].as_secs_f64(),
            ms(best[7]),
            ms(best[8]),
            if ok {
                format!("1T = 2T bits; previous diff1 {d1:.0e}")
            } else {
                format!("FAILED (1T = 2T: {same}, previous diff1 {d1:e} diff2 {d2:e})")
            },
        );
        if !ok {
            std::process::exit(1);
        }
    }
    println!(
        "| all | | | | {:.1} | {:.1} | {:.2}x | | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x / {:.2}x | {:.1} | {:.1} | {:.1} | |",
        ms(sums[0]),
        ms(sums[1]),
        ms(sums[0]) / ms(sums[1]),
        ms(sums[2]),
        ms(sums[3]),
        ms(sums[4]),
        ms(sums[5]),
        ms(sums[4]) / ms(sums[0]),
        ms(sums[5]) / ms(sums[1]),
        ms(sums[6]),
        ms(sums[7]),
        ms(sums[8]),
    );
}
