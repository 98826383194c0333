//! IndiceConv (spconv v1 / mmcv indice_conv) against its contract, the `doc` of
//! schemas/sparse_conv/indice_conv.json, through the Rust API.
//!
//! Two references, both written from the contract text alone and sharing no code with the
//! kernel (accuracy class: accumulating, float64 sums):
//! - the rulebook reference: output = bias, then for every k and j < indice_num[k],
//!   output[dst] += features[src] @ filters[k], with the slots swapped when inverse = 1;
//! - the dense reference: the rulebook comes from the crate's real GetIndicePairs op, and the
//!   result is compared with a 3D convolution computed directly from the sparse sites
//!   (out[o] = bias + sum over k of in[o*s - p + k*d] @ filters[k], with k = (kz*KH + ky)*KW + kx
//!   and the input grid zero off the active sites), for submanifold, strided, dilated and
//!   transposed convolutions and for inverse convolutions over a forward rulebook.
//!
//! The contract also makes the result bit-identical across runs and thread counts.

// Reference helpers take the convolution's pieces as plain arguments.
#![allow(clippy::too_many_arguments)]

use onnxruntime_ep_mlu::error::Error;
use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;
use onnxruntime_ep_mlu::ops::sparse_conv::indice_conv::IndiceConv;
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, Threads};
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap, HashSet};
mod common;
#[path = "reference/indice_conv.rs"]
mod reference;
use common::{Rng, assert_accumulating};
use reference::{Conv, Epilogue, attrs, index_errors, reference};

// ---------------------------------------------------------------- IndiceConv inputs

impl Conv {
    fn run(&self, inverse: i64, par: &dyn Parallel) -> Result<Vec<f32>, Error> {
        run_tensors(inverse, &self.tensors(), par).map(|out| {
            assert_eq!(out.shape, vec![self.num_out, self.cout], "output shape [num_out, Cout]");
            out.data.f32().expect("float32 output").to_vec()
        })
    }
}

fn run_tensors(inverse: i64, t: &[Tensor], par: &dyn Parallel) -> Result<Tensor, Error> {
    let op: IndiceConv = descriptor(&attrs(inverse))?;
    let mut inputs: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
    inputs.resize(6, None);
    let mut out = run(&op, &inputs, par)?;
    assert_eq!(out.len(), 1, "one output");
    Ok(out.remove(0))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.float()).collect()
    }
}

/// Checks a run against the rulebook reference, with Serial, Threads(2), Threads(3) and
/// Threads(4) bit-identical. Returns the output.
fn check(c: &Conv, inverse: bool) -> Vec<f32> {
    let inv = inverse as i64;
    let first = c.run(inv, &Serial).expect("valid case runs");
    assert_accumulating(&first, &reference(c, inverse), "output vs rulebook reference");
    for par in [&Threads(2) as &dyn Parallel, &Threads(3), &Threads(4), &Serial] {
        let again = c.run(inv, par).expect("valid case runs");
        assert_eq!(bits(&again), bits(&first), "bit-identical across runs and thread counts");
    }
    first
}

/// A random rulebook: every pair in range, `num` at most P, garbage in unused slots,
/// repeated destinations (and sources) likely.
fn random_conv(
    rng: &mut Rng,
    l: usize,
    cin: usize,
    cout: usize,
    k: usize,
    p: usize,
    num_out: usize,
    bias: bool,
) -> Conv {
    let mut pairs = vec![0i32; k * 2 * p];
    let mut num = vec![0i32; k];
    for kk in 0..k {
        let n = if l == 0 || num_out == 0 { 0 } else { rng.below(p + 1) };
        num[kk] = n as i32;
        for j in 0..p {
            let (src, dst) = if j < n {
                (rng.below(l) as i32, rng.below(num_out) as i32)
            } else {
                (-1 - rng.below(3) as i32, i32::MAX - rng.below(3) as i32)
            };
            pairs[(kk * 2) * p + j] = src;
            pairs[(kk * 2 + 1) * p + j] = dst;
        }
    }
    Conv {
        l,
        cin,
        cout,
        k,
        p,
        num_out,
        features: rng.floats(l * cin),
        filters: rng.floats(k * cin * cout),
        pairs,
        num,
        out_indices: vec![i32::MIN; num_out * 4],
        out_d: 4,
        bias: bias.then(|| rng.floats(cout).iter().map(|x| x * 3.0).collect()),
    }
}

/// Swaps the roles of the two slots: an inverse = 1 node over `c` equals an inverse = 0
/// node over the swapped rulebook with L and num_out exchanged.
fn swapped(c: &Conv, features: Vec<f32>, l: usize, num_out: usize) -> Conv {
    let mut s = c.clone();
    for k in 0..c.k {
        for j in 0..c.p {
            s.pairs.swap((k * 2) * c.p + j, (k * 2 + 1) * c.p + j);
        }
    }
    s.features = features;
    s.l = l;
    s.num_out = num_out;
    s.out_indices = vec![0; num_out * 4];
    s
}

// ---------------------------------------------------------------- GetIndicePairs and the dense reference

/// A sparse convolution configuration (valid for GetIndicePairs).
#[derive(Debug, Clone, Copy)]
struct Geometry {
    batch: i64,
    spatial: [i64; 3],
    kernel: [i64; 3],
    stride: [i64; 3],
    padding: [i64; 3],
    dilation: [i64; 3],
    output_padding: [i64; 3],
    subm: bool,
    transpose: bool,
}

impl Geometry {
    fn new(batch: i64, spatial: [i64; 3], kernel: [i64; 3]) -> Self {
        Geometry {
            batch,
            spatial,
            kernel,
            stride: [1; 3],
            padding: [0; 3],
            dilation: [1; 3],
            output_padding: [0; 3],
            subm: false,
            transpose: false,
        }
    }
    fn subm(batch: i64, spatial: [i64; 3], kernel: [i64; 3], dilation: [i64; 3]) -> Self {
        let padding = [0, 1, 2].map(|a| dilation[a] * (kernel[a] - 1) / 2);
        Geometry { padding, dilation, subm: true, ..Geometry::new(batch, spatial, kernel) }
    }
    fn volume(&self) -> usize {
        self.kernel.iter().product::<i64>() as usize
    }
    fn out_size(&self, a: usize) -> i64 {
        let (i, k, s, p, d, op) = (
            self.spatial[a],
            self.kernel[a],
            self.stride[a],
            self.padding[a],
            self.dilation[a],
            self.output_padding[a],
        );
        if self.subm {
            i
        } else if self.transpose {
            (i - 1) * s - 2 * p + d * (k - 1) + op + 1
        } else {
            (i + 2 * p - d * (k - 1) - 1) / s + 1
        }
    }
    fn map(&self) -> HashMap<String, AttrValue> {
        let mut m = HashMap::from([
            ("batch_size".to_string(), AttrValue::Int(self.batch)),
            ("subm".to_string(), AttrValue::Int(self.subm as i64)),
            ("transpose".to_string(), AttrValue::Int(self.transpose as i64)),
        ]);
        for (name, v) in [
            ("spatial_shape", self.spatial),
            ("kernel_size", self.kernel),
            ("stride", self.stride),
            ("padding", self.padding),
            ("dilation", self.dilation),
            ("output_padding", self.output_padding),
        ] {
            m.insert(name.to_string(), AttrValue::Ints(v.to_vec()));
        }
        m
    }
    /// The kernel offsets (kz, ky, kx) in the contract's order k = (kz*KH + ky)*KW + kx.
    fn offsets(&self) -> Vec<[i64; 3]> {
        let [kd, kh, kw] = self.kernel;
        let mut v = Vec::new();
        for kz in 0..kd {
            for ky in 0..kh {
                for kx in 0..kw {
                    v.push([kz, ky, kx]);
                }
            }
        }
        v
    }
    /// The dense convolution's relation: the input coordinate on axis `a` read by output
    /// coordinate `o` through tap `kk`, if inside the input.
    fn input_of(&self, a: usize, o: i64, kk: i64) -> Option<i64> {
        let (s, p, d) = (self.stride[a], self.padding[a], self.dilation[a]);
        let i = if self.transpose {
            // o = i*s - p + kk*d
            let t = o + p - kk * d;
            if t.rem_euclid(s) != 0 {
                return None;
            }
            t.div_euclid(s)
        } else {
            o * s - p + kk * d
        };
        (0..self.spatial[a]).contains(&i).then_some(i)
    }
    /// The same relation read the other way: the output coordinate fed by input coordinate
    /// `i` through tap `kk`, if inside the output.
    fn output_of(&self, a: usize, i: i64, kk: i64) -> Option<i64> {
        let (s, p, d) = (self.stride[a], self.padding[a], self.dilation[a]);
        let o = if self.transpose {
            i * s - p + kk * d
        } else {
            let t = i + p - kk * d;
            if t.rem_euclid(s) != 0 {
                return None;
            }
            t.div_euclid(s)
        };
        (0..self.out_size(a)).contains(&o).then_some(o)
    }
}

/// GetIndicePairs' outputs: (indice_pairs [K, 2, L], out_indices [num_out, 4], indice_num [K]).
struct Rulebook {
    pairs: Tensor,
    out_indices: Tensor,
    num: Tensor,
}

fn get_indice_pairs(g: &Geometry, sites: &[[i32; 4]]) -> Rulebook {
    let op: GetIndicePairs = descriptor(&g.map()).expect("valid GetIndicePairs attributes");
    let indices = Tensor::i32([sites.len(), 4], sites.concat());
    let mut out = run(&op, &[Some(&indices)], &Serial).expect("GetIndicePairs runs");
    assert_eq!(out.len(), 3);
    let num = out.pop().expect("indice_num");
    let out_indices = out.pop().expect("out_indices");
    let pairs = out.pop().expect("indice_pairs");
    assert_eq!(pairs.shape, vec![g.volume(), 2, sites.len()]);
    Rulebook { pairs, out_indices, num }
}

fn rows4(t: &Tensor) -> Vec<[i32; 4]> {
    t.data.i32().expect("int32").chunks(4).map(|r| [r[0], r[1], r[2], r[3]]).collect()
}

/// IndiceConv inputs over a GetIndicePairs rulebook.
fn conv_over(
    rb: &Rulebook,
    l: usize,
    features: Vec<f32>,
    filters: Vec<f32>,
    cin: usize,
    cout: usize,
    bias: Option<Vec<f32>>,
    num_out: usize,
    out_indices: Vec<i32>,
) -> Conv {
    Conv {
        l,
        cin,
        cout,
        k: rb.pairs.shape[0],
        p: rb.pairs.shape[2],
        num_out,
        features,
        filters,
        pairs: rb.pairs.data.i32().expect("int32").to_vec(),
        num: rb.num.data.i32().expect("int32").to_vec(),
        out_indices,
        out_d: 4,
        bias,
    }
}

fn key(b: i64, c: [i64; 3]) -> [i64; 4] {
    [b, c[0], c[1], c[2]]
}

/// Dense forward convolution at the given output sites: out[o] = bias + sum over taps k of
/// grid[input_of(o, k)] @ filters[k], the grid holding the sum of the features of the input
/// rows at each active site (zero elsewhere).
fn dense_forward(
    g: &Geometry,
    sites: &[[i32; 4]],
    x: &[f32],
    filters: &[f32],
    cin: usize,
    cout: usize,
    bias: Option<&[f32]>,
    out_sites: &[[i32; 4]],
) -> Vec<f64> {
    let mut grid: HashMap<[i64; 4], Vec<f64>> = HashMap::new();
    for (row, s) in sites.iter().enumerate() {
        let cell = grid.entry(s.map(i64::from)).or_insert_with(|| vec![0.0; cin]);
        for ci in 0..cin {
            cell[ci] += x[row * cin + ci] as f64;
        }
    }
    let offsets = g.offsets();
    let mut out = Vec::with_capacity(out_sites.len() * cout);
    for o in out_sites {
        let mut acc: Vec<f64> = (0..cout).map(|co| bias.map_or(0.0, |b| b[co] as f64)).collect();
        for (k, kk) in offsets.iter().enumerate() {
            let i: Option<Vec<i64>> =
                (0..3).map(|a| g.input_of(a, o[a + 1] as i64, kk[a])).collect();
            let Some(i) = i else { continue };
            let Some(v) = grid.get(&key(o[0] as i64, [i[0], i[1], i[2]])) else { continue };
            for ci in 0..cin {
                for co in 0..cout {
                    acc[co] += v[ci] * filters[(k * cin + ci) * cout + co] as f64;
                }
            }
        }
        out.extend(acc);
    }
    out
}

/// Dense inverse convolution: features y on the forward output sites, results at the forward
/// input rows: out[i] = bias + sum over taps k of y[output_of(i, k)] @ filters[k].
fn dense_inverse(
    g: &Geometry,
    in_sites: &[[i32; 4]],
    out_sites: &[[i32; 4]],
    y: &[f32],
    filters: &[f32],
    cin: usize,
    cout: usize,
    bias: Option<&[f32]>,
) -> Vec<f64> {
    let rows: HashMap<[i64; 4], usize> =
        out_sites.iter().enumerate().map(|(r, s)| (s.map(i64::from), r)).collect();
    assert_eq!(rows.len(), out_sites.len(), "output sites are unique");
    let offsets = g.offsets();
    let mut out = Vec::with_capacity(in_sites.len() * cout);
    for s in in_sites {
        let mut acc: Vec<f64> = (0..cout).map(|co| bias.map_or(0.0, |b| b[co] as f64)).collect();
        for (k, kk) in offsets.iter().enumerate() {
            let o: Option<Vec<i64>> =
                (0..3).map(|a| g.output_of(a, s[a + 1] as i64, kk[a])).collect();
            let Some(o) = o else { continue };
            let Some(&r) = rows.get(&key(s[0] as i64, [o[0], o[1], o[2]])) else { continue };
            for ci in 0..cin {
                for co in 0..cout {
                    acc[co] += y[r * cin + ci] as f64 * filters[(k * cin + ci) * cout + co] as f64;
                }
            }
        }
        out.extend(acc);
    }
    out
}

/// The output sites a (non-subm) convolution must have: every output position with an
/// active input under some tap, found by scanning the whole output grid.
fn expected_out_sites(g: &Geometry, sites: &[[i32; 4]]) -> BTreeSet<[i32; 4]> {
    let active: HashSet<[i64; 4]> = sites.iter().map(|s| s.map(i64::from)).collect();
    let offsets = g.offsets();
    let mut out = BTreeSet::new();
    for b in 0..g.batch {
        for z in 0..g.out_size(0) {
            for y in 0..g.out_size(1) {
                for x in 0..g.out_size(2) {
                    let o = [z, y, x];
                    let hit = offsets.iter().any(|kk| {
                        let i: Option<Vec<i64>> =
                            (0..3).map(|a| g.input_of(a, o[a], kk[a])).collect();
                        i.is_some_and(|i| active.contains(&key(b, [i[0], i[1], i[2]])))
                    });
                    if hit {
                        out.insert([b as i32, z as i32, y as i32, x as i32]);
                    }
                }
            }
        }
    }
    out
}

/// Random active sites; unique when `unique`, else with some repeated rows.
fn random_sites(rng: &mut Rng, g: &Geometry, n: usize, unique: bool) -> Vec<[i32; 4]> {
    let mut seen = HashSet::new();
    let mut sites = Vec::new();
    let capacity = (g.batch * g.spatial.iter().product::<i64>()) as usize;
    while sites.len() < n.min(capacity) {
        let s = [
            rng.below(g.batch as usize) as i32,
            rng.below(g.spatial[0] as usize) as i32,
            rng.below(g.spatial[1] as usize) as i32,
            rng.below(g.spatial[2] as usize) as i32,
        ];
        if seen.insert(s) || !unique {
            sites.push(s);
        }
    }
    if !unique && !sites.is_empty() {
        for k in 0..sites.len() / 8 {
            let s = sites[(k * 7) % sites.len()];
            sites.push(s);
        }
    }
    sites
}

/// Forward convolution through GetIndicePairs + IndiceConv, checked against both references
/// and for thread-count independence; then the inverse convolution over the same rulebook.
fn check_geometry(
    rng: &mut Rng,
    g: &Geometry,
    n_sites: usize,
    cin: usize,
    cout: usize,
    with_bias: bool,
) {
    let sites = random_sites(rng, g, n_sites, g.subm);
    let rb = get_indice_pairs(g, &sites);
    let out_sites = rows4(&rb.out_indices);
    let l = sites.len();
    if g.subm {
        assert_eq!(out_sites, sites, "subm: out_indices = indices");
    } else {
        let set: BTreeSet<[i32; 4]> = out_sites.iter().copied().collect();
        assert_eq!(set.len(), out_sites.len(), "unique output sites");
        assert_eq!(
            set,
            expected_out_sites(g, &sites),
            "output sites = positions with an active input"
        );
    }
    let features = rng.floats(l * cin);
    let filters = rng.floats(g.volume() * cin * cout);
    let bias = with_bias.then(|| rng.floats(cout));
    let conv = conv_over(
        &rb,
        l,
        features.clone(),
        filters.clone(),
        cin,
        cout,
        bias.clone(),
        out_sites.len(),
        rb.out_indices.data.i32().expect("int32").to_vec(),
    );
    let what = format!("{g:?} L {l} Cin {cin} Cout {cout} bias {with_bias}");
    let got = check(&conv, false);
    let dense =
        dense_forward(g, &sites, &features, &filters, cin, cout, bias.as_deref(), &out_sites);
    assert_accumulating(&got, &dense, &format!("forward vs dense convolution: {what}"));

    // Inverse: features on the forward output rows, results on the forward input rows;
    // out_indices is the forward input indices.
    let y = rng.floats(out_sites.len() * cin);
    let inv = Conv {
        l: out_sites.len(),
        features: y.clone(),
        num_out: l,
        out_indices: sites.concat(),
        ..conv.clone()
    };
    let got = check(&inv, true);
    let dense = dense_inverse(g, &sites, &out_sites, &y, &filters, cin, cout, bias.as_deref());
    assert_accumulating(&got, &dense, &format!("inverse vs dense convolution: {what}"));
    // And against an inverse = 0 node over the slot-swapped rulebook.
    let plain = swapped(&conv, y, out_sites.len(), l);
    assert_eq!(bits(&check(&plain, false)), bits(&got), "inverse = 1 equals the swapped rulebook");
}

// ---------------------------------------------------------------- semantics

#[test]
fn hand_computed_example_with_duplicate_destinations() {
    // L 3, Cin 1, Cout 2, K 2, P 3, num_out 2; pairs of k 0: 0->1, 2->1, 1->1 (three sources
    // into one row); k 1: 2->0 only (slot 2 unused, holds garbage).
    let conv = Conv {
        l: 3,
        cin: 1,
        cout: 2,
        k: 2,
        p: 3,
        num_out: 2,
        features: vec![1.0, 2.0, 4.0],
        filters: vec![1.0, 10.0, 0.5, -1.0],
        pairs: vec![0, 2, 1, 1, 1, 1, 2, -7, 99, 0, 12345, i32::MIN],
        num: vec![3, 1],
        out_indices: vec![0; 2 * 4],
        out_d: 4,
        bias: Some(vec![100.0, 200.0]),
    };
    let got = check(&conv, false);
    // row 0: bias + 4*[0.5, -1] = [102, 196]; row 1: bias + (1+4+2)*[1, 10] = [107, 270].
    assert_eq!(got, vec![102.0, 196.0, 107.0, 270.0]);
    let no_bias = Conv { bias: None, ..conv.clone() };
    assert_eq!(check(&no_bias, false), vec![2.0, -4.0, 7.0, 70.0]);
}

#[test]
fn inverse_swaps_the_slots() {
    // The same rulebook read backwards: gather slot 1, scatter to slot 0; L is now the
    // number of rows slot 1 refers to (2), num_out those of slot 0 (3).
    let conv = Conv {
        l: 2,
        cin: 1,
        cout: 1,
        k: 2,
        p: 3,
        num_out: 3,
        features: vec![1.0, 10.0],
        filters: vec![2.0, 3.0],
        pairs: vec![0, 2, 1, 1, 1, 1, 2, -7, 99, 0, 12345, i32::MIN],
        num: vec![3, 1],
        out_indices: vec![0; 3],
        out_d: 1,
        bias: None,
    };
    // k 0 (w 2): 1->0, 1->2, 1->1 each 20; k 1 (w 3): 0->2 gives 3.
    assert_eq!(check(&conv, true), vec![20.0, 20.0, 23.0]);
    let mut rng = Rng(4);
    for (l, num_out) in [(5, 9), (9, 5), (1, 30), (30, 1)] {
        // Valid for inverse = 1: slot 1 < L, slot 0 < num_out.
        let base = random_conv(&mut rng, num_out, 3, 4, 5, 7, l, true);
        let inv = Conv {
            l,
            num_out,
            out_indices: vec![0; num_out * 4],
            features: rng.floats(l * 3),
            ..base.clone()
        };
        let got = check(&inv, true);
        let plain = swapped(&inv, inv.features.clone(), l, num_out);
        assert_eq!(bits(&check(&plain, false)), bits(&got));
    }
}

#[test]
fn random_rulebooks_with_and_without_bias() {
    let mut rng = Rng(7);
    // (L, Cin, Cout, K, P, num_out)
    for (l, cin, cout, k, p, num_out) in [
        (1, 1, 1, 1, 1, 1),
        (10, 3, 5, 27, 10, 12),
        (40, 16, 8, 8, 40, 15),
        (100, 5, 33, 3, 100, 7),
        (7, 64, 2, 1, 50, 100),
    ] {
        for bias in [false, true] {
            let conv = random_conv(&mut rng, l, cin, cout, k, p, num_out, bias);
            check(&conv, false);
        }
    }
}

#[test]
fn zero_size_dimensions() {
    let mut rng = Rng(8);
    // (L, Cin, Cout, K, P, num_out): each zero in turn.
    for (l, cin, cout, k, p, num_out) in [
        (0, 3, 4, 2, 0, 5),
        (0, 3, 4, 2, 3, 5),
        (4, 0, 3, 2, 4, 5),
        (4, 3, 0, 2, 4, 5),
        (4, 3, 2, 0, 4, 5),
        (4, 3, 2, 2, 0, 5),
        (4, 3, 2, 2, 4, 0),
        (0, 0, 0, 0, 0, 0),
    ] {
        for bias in [false, true] {
            let conv = random_conv(&mut rng, l, cin, cout, k, p, num_out, bias);
            let got = check(&conv, false);
            assert_eq!(got.len(), num_out * cout);
            // No pair contributes anything readable when L, Cin, K or P is zero: output = bias.
            if l == 0 || cin == 0 || k == 0 || p == 0 {
                let want: Vec<f32> = (0..num_out * cout)
                    .map(|e| conv.bias.as_ref().map_or(0.0, |b| b[e % cout]))
                    .collect();
                assert_eq!(got, want);
            }
        }
    }
}

#[test]
fn out_indices_values_are_not_read() {
    let mut rng = Rng(9);
    let conv = random_conv(&mut rng, 6, 2, 3, 4, 5, 7, true);
    let base = check(&conv, false);
    for (d, fill) in [(1, 0), (4, i32::MIN), (4, -1), (9, i32::MAX)] {
        let other = Conv { out_d: d, out_indices: vec![fill; 7 * d], ..conv.clone() };
        assert_eq!(bits(&check(&other, false)), bits(&base));
    }
}

#[test]
fn submanifold_convolutions_match_dense_reference() {
    let mut rng = Rng(11);
    check_geometry(&mut rng, &Geometry::subm(2, [6, 7, 5], [3, 3, 3], [1; 3]), 80, 3, 4, true);
    check_geometry(&mut rng, &Geometry::subm(1, [8, 8, 8], [3, 3, 3], [1; 3]), 200, 4, 2, false);
    check_geometry(&mut rng, &Geometry::subm(2, [7, 9, 6], [3, 3, 3], [2, 1, 2]), 90, 2, 3, true);
    check_geometry(&mut rng, &Geometry::subm(1, [5, 6, 7], [5, 1, 3], [1; 3]), 60, 3, 3, true);
    check_geometry(&mut rng, &Geometry::subm(3, [4, 4, 4], [1, 1, 1], [1; 3]), 30, 5, 2, false);
    // Dense: every site active.
    check_geometry(&mut rng, &Geometry::subm(1, [3, 3, 3], [3, 3, 3], [1; 3]), 27, 2, 2, true);
}

#[test]
fn strided_convolutions_match_dense_reference() {
    let mut rng = Rng(12);
    let seed_like =
        Geometry { stride: [2; 3], padding: [0, 1, 1], ..Geometry::new(2, [9, 10, 11], [3, 3, 3]) };
    check_geometry(&mut rng, &seed_like, 120, 3, 4, true);
    check_geometry(&mut rng, &seed_like, 120, 2, 5, false);
    let down = Geometry { stride: [2; 3], ..Geometry::new(1, [8, 6, 10], [2, 2, 2]) };
    check_geometry(&mut rng, &down, 100, 4, 3, true);
    let mixed = Geometry {
        stride: [1, 2, 3],
        padding: [1, 0, 2],
        ..Geometry::new(2, [5, 9, 11], [3, 2, 4])
    };
    check_geometry(&mut rng, &mixed, 80, 2, 2, true);
    let plain = Geometry::new(1, [6, 6, 6], [3, 3, 3]);
    check_geometry(&mut rng, &plain, 50, 3, 3, false);
}

#[test]
fn dilated_and_transposed_convolutions_match_dense_reference() {
    let mut rng = Rng(13);
    let dilated = Geometry {
        dilation: [2, 1, 3],
        padding: [1, 1, 0],
        ..Geometry::new(2, [9, 7, 12], [3, 3, 3])
    };
    check_geometry(&mut rng, &dilated, 90, 3, 2, true);
    let transposed = Geometry {
        stride: [2; 3],
        padding: [1; 3],
        output_padding: [1, 0, 1],
        transpose: true,
        ..Geometry::new(1, [4, 5, 3], [3, 3, 3])
    };
    check_geometry(&mut rng, &transposed, 30, 2, 3, true);
    let transposed =
        Geometry { stride: [2, 1, 2], transpose: true, ..Geometry::new(2, [3, 4, 4], [2, 3, 2]) };
    check_geometry(&mut rng, &transposed, 25, 3, 2, false);
}

#[test]
fn empty_site_lists() {
    let mut rng = Rng(14);
    check_geometry(&mut rng, &Geometry::subm(1, [4, 4, 4], [3, 3, 3], [1; 3]), 0, 3, 2, true);
    let g = Geometry { stride: [2; 3], ..Geometry::new(1, [6, 6, 6], [3, 3, 3]) };
    check_geometry(&mut rng, &g, 0, 3, 2, true);
}

#[test]
fn bit_identical_across_thread_counts_and_runs() {
    // Large enough for many tasks: a submanifold convolution on ~5000 sites, Cin 16, Cout 32.
    let mut rng = Rng(15);
    let g = Geometry::subm(2, [16, 16, 16], [3, 3, 3], [1; 3]);
    let sites = random_sites(&mut rng, &g, 5000, true);
    let rb = get_indice_pairs(&g, &sites);
    let (cin, cout) = (16, 32);
    let mut features = rng.floats(sites.len() * cin);
    // Mixed magnitudes so that any change of summation order shows up.
    for (k, v) in features.iter_mut().enumerate() {
        *v *= [1.0, 1e-3, 1e3, 7.0][k % 4];
    }
    let conv = conv_over(
        &rb,
        sites.len(),
        features,
        rng.floats(27 * cin * cout),
        cin,
        cout,
        Some(rng.floats(cout)),
        sites.len(),
        sites.concat(),
    );
    let first = check(&conv, false);
    for par in [&Threads(2) as &dyn Parallel, &Threads(3), &Threads(2), &Serial] {
        assert_eq!(bits(&conv.run(0, par).expect("runs")), bits(&first));
    }
    let inv = check(&conv, true);
    for par in [&Threads(3) as &dyn Parallel, &Threads(2)] {
        assert_eq!(bits(&conv.run(1, par).expect("runs")), bits(&inv));
    }
}

/// Features of mixed magnitudes, so that a change of summation order shows in the bits.
fn mixed_floats(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|i| rng.float() * [1.0, 1e-3, 1e3, 7.0, 3e4][i % 5]).collect()
}

/// Sites clustered in blobs (as lidar voxels are), so that submanifold neighbourhoods are
/// populated, rows in generation order.
fn clustered_sites(rng: &mut Rng, g: &Geometry, n: usize) -> Vec<[i32; 4]> {
    let mut seen = HashSet::new();
    let mut sites = Vec::new();
    let mut centre = [0i32; 4];
    while sites.len() < n {
        if rng.below(40) == 0 || sites.is_empty() {
            centre = [
                rng.below(g.batch as usize) as i32,
                rng.below(g.spatial[0] as usize) as i32,
                rng.below(g.spatial[1] as usize) as i32,
                rng.below(g.spatial[2] as usize) as i32,
            ];
        }
        let jitter = |rng: &mut Rng, c: i32, r: usize, hi: i64| {
            (c + rng.below(2 * r + 1) as i32 - r as i32).clamp(0, hi as i32 - 1)
        };
        let s = [
            centre[0],
            jitter(rng, centre[1], 2, g.spatial[0]),
            jitter(rng, centre[2], 4, g.spatial[1]),
            jitter(rng, centre[3], 4, g.spatial[2]),
        ];
        if seen.insert(s) {
            sites.push(s);
        }
    }
    sites
}

/// A forward convolution over GetIndicePairs' rulebook of `sites`, mixed-magnitude features.
fn conv_on_sites(
    rng: &mut Rng,
    g: &Geometry,
    sites: &[[i32; 4]],
    cin: usize,
    cout: usize,
    bias: bool,
) -> Conv {
    let rb = get_indice_pairs(g, sites);
    let num_out = rb.out_indices.shape[0];
    let out_indices = rb.out_indices.data.i32().expect("int32").to_vec();
    let features = mixed_floats(rng, sites.len() * cin);
    let filters = rng.floats(g.volume() * cin * cout);
    conv_over(
        &rb,
        sites.len(),
        features,
        filters,
        cin,
        cout,
        bias.then(|| rng.floats(cout)),
        num_out,
        out_indices,
    )
}

#[test]
fn bit_identical_at_1_2_3_4_threads_at_backbone_channel_counts() {
    // The CenterPoint backbone's channel counts, submanifold and strided, each case large
    // enough for many row tiles and tasks (more sites where the channels are few), compared
    // bit for bit at 1, 2, 3 and 4 threads (in `check`) and against the reference.
    let mut rng = Rng(16);
    let subm = Geometry::subm(2, [12, 48, 48], [3, 3, 3], [1; 3]);
    let strided =
        Geometry { stride: [2; 3], padding: [1; 3], ..Geometry::new(2, [12, 48, 48], [3, 3, 3]) };
    for (cin, cout, n) in [
        (5, 16, 12000),
        (16, 16, 12000),
        (16, 32, 8000),
        (32, 32, 6000),
        (64, 64, 2500),
        (64, 128, 1500),
        (128, 128, 1200),
    ] {
        let sites = clustered_sites(&mut rng, &subm, n);
        for g in [&subm, &strided] {
            let conv = conv_on_sites(&mut rng, g, &sites, cin, cout, cin % 2 == 0);
            let first = check(&conv, false);
            for par in [&Threads(4) as &dyn Parallel, &Threads(2), &Threads(3), &Serial] {
                assert_eq!(
                    bits(&conv.run(0, par).expect("runs")),
                    bits(&first),
                    "Cin {cin} Cout {cout} subm {}",
                    g.subm
                );
            }
        }
    }
}

#[test]
fn large_channel_counts_match_dense_reference() {
    let mut rng = Rng(17);
    let subm = Geometry::subm(1, [6, 10, 10], [3, 3, 3], [1; 3]);
    let strided =
        Geometry { stride: [2; 3], padding: [0, 1, 1], ..Geometry::new(1, [7, 10, 10], [3, 3, 3]) };
    let extra = Geometry { stride: [2, 1, 1], ..Geometry::new(1, [5, 6, 6], [3, 1, 1]) };
    for (cin, cout) in [(16, 16), (32, 32), (64, 64), (128, 128), (16, 32), (64, 128)] {
        check_geometry(&mut rng, &subm, 250, cin, cout, true);
        check_geometry(&mut rng, &strided, 250, cin, cout, false);
    }
    check_geometry(&mut rng, &extra, 120, 128, 128, true);
}

/// Features and bias drawn from values whose float32 sums depend on their order, and
/// filters of ones with Cin = 1, so that every product is exact: the output must then be
/// the float32 sum in exactly the contract's order (bias, then k ascending, then j
/// ascending), which this computes.
fn in_contract_order(c: &Conv, inverse: bool) -> Vec<f32> {
    assert_eq!(c.cin, 1);
    let mut out = vec![0f32; c.num_out * c.cout];
    for (e, v) in out.iter_mut().enumerate() {
        *v = c.bias.as_ref().map_or(0.0, |b| b[e % c.cout]);
    }
    for k in 0..c.k {
        for j in 0..c.num[k] as usize {
            let (a, b) =
                (c.pairs[(k * 2) * c.p + j] as usize, c.pairs[(k * 2 + 1) * c.p + j] as usize);
            let (src, dst) = if inverse { (b, a) } else { (a, b) };
            for co in 0..c.cout {
                out[dst * c.cout + co] += c.features[src] * c.filters[k * c.cout + co];
            }
        }
    }
    out
}

#[test]
fn sums_follow_k_then_j_across_chunks_and_row_tiles() {
    // Dense rulebooks with many repeated destinations: an offset's pairs into one row tile
    // outnumber a GEMM chunk (so runs are cut into several chunks), destinations fall on
    // both sides of tile boundaries, and offsets interleave. Cin = 1 and filters of ones make
    // every product exact, so the bits must be the float32 sums in (k, j) order.
    let mut rng = Rng(18);
    let magnitudes = [16777216.0f32, 1.0, -16777216.0, 0.75, 3.0e-3, -1.0, 4096.5, -0.125];
    for (k, p, l, num_out, cout) in [
        (3, 6000, 50, 40, 128),
        (5, 3000, 700, 600, 64),
        (2, 20000, 90, 300, 16),
        (27, 800, 400, 1000, 128),
    ] {
        for inverse in [false, true] {
            let (src_rows, dst_rows) = (l, num_out);
            let mut pairs = vec![0i32; k * 2 * p];
            let mut num = vec![0i32; k];
            for kk in 0..k {
                num[kk] = (p - rng.below(p / 4)) as i32;
                for j in 0..p {
                    // Destinations cluster on a few rows around tile-sized boundaries.
                    let dst = if rng.below(2) == 0 {
                        rng.below(dst_rows)
                    } else {
                        (rng.below(8) * 16 + rng.below(3)).min(dst_rows - 1)
                    };
                    let (s0, s1) = if inverse {
                        (dst, rng.below(src_rows))
                    } else {
                        (rng.below(src_rows), dst)
                    };
                    pairs[(kk * 2) * p + j] = s0 as i32;
                    pairs[(kk * 2 + 1) * p + j] = s1 as i32;
                }
            }
            let conv = Conv {
                l,
                cin: 1,
                cout,
                k,
                p,
                num_out,
                features: (0..l).map(|_| magnitudes[rng.below(magnitudes.len())]).collect(),
                filters: vec![1.0; k * cout],
                pairs,
                num,
                out_indices: vec![0; num_out * 2],
                out_d: 2,
                bias: Some((0..cout).map(|_| magnitudes[rng.below(magnitudes.len())]).collect()),
            };
            let want = in_contract_order(&conv, inverse);
            for par in [&Serial as &dyn Parallel, &Threads(2), &Threads(3), &Threads(4)] {
                let got = conv.run(inverse as i64, par).expect("runs");
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "K {k} P {p} num_out {num_out} Cout {cout} inverse {inverse}"
                );
            }
        }
    }
}

/// The fused path's arithmetic: for each pair in (k, j) order, each product added to the
/// output element by one fused multiply-add, in input-channel order.
fn fused_order(c: &Conv) -> Vec<f32> {
    let mut out = vec![0f32; c.num_out * c.cout];
    for (e, v) in out.iter_mut().enumerate() {
        *v = c.bias.as_ref().map_or(0.0, |b| b[e % c.cout]);
    }
    for k in 0..c.k {
        for j in 0..c.num[k] as usize {
            let (src, dst) =
                (c.pairs[(k * 2) * c.p + j] as usize, c.pairs[(k * 2 + 1) * c.p + j] as usize);
            for co in 0..c.cout {
                let o = &mut out[dst * c.cout + co];
                for ci in 0..c.cin {
                    *o = c.features[src * c.cin + ci]
                        .mul_add(c.filters[(k * c.cin + ci) * c.cout + co], *o);
                }
            }
        }
    }
    out
}

#[test]
fn cout_16_32_64_128_on_avx512_add_each_product_by_one_fma_in_channel_order() {
    // On a CPU with AVX-512F (this machine's) Cout 16, 32, 64 and 128 take the fused path:
    // the bits must be exactly its order; elsewhere the GEMM path's, within the class.
    // Random rulebooks repeat destinations within an offset, so groups of pairs with a
    // repeated row (taken pair by pair) are covered too.
    let fused = cfg!(target_arch = "x86_64") && is_avx512f();
    let mut rng = Rng(19);
    for (l, cin, cout, k, p, num_out) in [
        (300, 7, 16, 27, 200, 250),
        (200, 32, 32, 8, 300, 90),
        (90, 5, 64, 3, 400, 60),
        (50, 16, 16, 1, 600, 9),
        (80, 24, 128, 5, 150, 70),
    ] {
        for bias in [false, true] {
            let conv = random_conv(&mut rng, l, cin, cout, k, p, num_out, bias);
            let got = check(&conv, false);
            if fused {
                assert_eq!(bits(&got), bits(&fused_order(&conv)), "Cin {cin} Cout {cout} K {k}");
            }
        }
    }
}

/// `c` with the valid pairs of every offset in a random order: the same pairs, so with no
/// destination repeated within an offset every output element sums the same products in
/// the same order, but no offset's sources or destinations ascend any more.
fn shuffled_within_offsets(rng: &mut Rng, c: &Conv) -> Conv {
    let mut s = c.clone();
    for k in 0..c.k {
        let n = c.num[k] as usize;
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for slot in 0..2 {
            let base = (k * 2 + slot) * c.p;
            for (j, &o) in order.iter().enumerate() {
                s.pairs[base + j] = c.pairs[base + o];
            }
        }
    }
    s
}

#[test]
fn submanifold_rulebooks_in_any_site_order_give_the_bits_of_the_same_pairs_shuffled() {
    // A submanifold rulebook over sites in (batch, z, y, x) order has every offset's
    // destinations ascending; over sites in generation order its offsets ascend by source
    // and their mirror offsets by destination; shuffled within each offset, neither. The
    // kernel reads the first two in place (directly, or through the mirror offset) and
    // groups the third: at the fused path's widths (AVX-512F) all three must give the bits
    // of the fused order exactly, elsewhere results within the class (in `check`).
    let fused = cfg!(target_arch = "x86_64") && is_avx512f();
    let mut rng = Rng(23);
    let g = Geometry::subm(2, [8, 40, 40], [3, 3, 3], [1; 3]);
    for (cin, cout, n) in [
        (5, 16, 6000),
        (16, 16, 6000),
        (16, 32, 4000),
        (32, 64, 2000),
        (24, 128, 1200),
        (16, 48, 1500),
    ] {
        let sites = clustered_sites(&mut rng, &g, n);
        let mut sorted = sites.clone();
        sorted.sort();
        for sites in [&sites, &sorted] {
            let conv = conv_on_sites(&mut rng, &g, sites, cin, cout, true);
            let shuffled = shuffled_within_offsets(&mut rng, &conv);
            let (got, got_shuffled) = (check(&conv, false), check(&shuffled, false));
            if fused && cout != 48 {
                assert_eq!(bits(&got), bits(&fused_order(&conv)), "Cin {cin} Cout {cout}");
                assert_eq!(bits(&got_shuffled), bits(&got), "Cin {cin} Cout {cout}, shuffled");
            }
        }
    }
}

#[test]
fn a_mirror_offset_that_differs_by_one_pair_is_not_read_in_its_place() {
    // An offset whose pairs still ascend by source while its mirror offset holds other
    // pairs (one source moved up by one, one destination changed, or one pair fewer):
    // reading the mirror would be wrong, so the result must follow the offset's own pairs
    // (the rulebook reference in `check`, and the fused order exactly on AVX-512F).
    let mut rng = Rng(24);
    let g = Geometry::subm(1, [6, 30, 30], [3, 3, 3], [1; 3]);
    let sites = clustered_sites(&mut rng, &g, 1500);
    let base = conv_on_sites(&mut rng, &g, &sites, 16, 16, false);
    let (k, p) = (3, base.p);
    let n = base.num[k] as usize;
    let src = |j: usize| base.pairs[(k * 2) * p + j];
    // A source with a gap above it, so that moving it up keeps the sources ascending.
    let j = (0..n - 1).find(|&j| src(j + 1) - src(j) >= 2).expect("a gap between two sources");
    let mut one_source = base.clone();
    one_source.pairs[(k * 2) * p + j] += 1;
    let mut one_destination = base.clone();
    let d = &mut one_destination.pairs[(k * 2 + 1) * p + n / 2];
    *d = (*d + 1) % base.num_out as i32;
    let mut one_fewer = base.clone();
    one_fewer.num[k] -= 1;
    for (what, conv) in [
        ("one source", &one_source),
        ("one destination", &one_destination),
        ("one pair fewer", &one_fewer),
    ] {
        let got = check(conv, false);
        if cfg!(target_arch = "x86_64") && is_avx512f() {
            assert_eq!(bits(&got), bits(&fused_order(conv)), "{what}");
        }
    }
}

fn is_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[test]
fn inverse_convolutions_at_backbone_channel_counts() {
    // An inverse convolution over a strided rulebook (features on the strided output sites,
    // results on its input sites), against the rulebook reference at 1-4 threads, and equal
    // bit for bit to a forward node over the slot-swapped rulebook.
    let mut rng = Rng(19);
    let g =
        Geometry { stride: [2; 3], padding: [1; 3], ..Geometry::new(2, [12, 48, 48], [3, 3, 3]) };
    for (cin, cout, n) in [(32, 16, 8000), (64, 32, 4000), (128, 64, 2000)] {
        let sites = clustered_sites(&mut rng, &g, n);
        let fwd = conv_on_sites(&mut rng, &g, &sites, cin, cout, true);
        let y = mixed_floats(&mut rng, fwd.num_out * cin);
        let inv = Conv {
            l: fwd.num_out,
            features: y.clone(),
            num_out: sites.len(),
            out_indices: sites.concat(),
            ..fwd.clone()
        };
        let got = check(&inv, true);
        let plain = swapped(&fwd, y, fwd.num_out, sites.len());
        assert_eq!(bits(&check(&plain, false)), bits(&got), "Cin {cin} Cout {cout}");
    }
}

#[test]
fn empty_offsets_and_rows_without_pairs() {
    // A 27-offset rulebook with offsets emptied (first, middle, last, all but one, all), and
    // output rows that no pair reaches (they must equal the bias exactly).
    let mut rng = Rng(20);
    let g = Geometry::subm(2, [12, 32, 32], [3, 3, 3], [1; 3]);
    let sites = clustered_sites(&mut rng, &g, 3000);
    let base = conv_on_sites(&mut rng, &g, &sites, 32, 64, true);
    let all: Vec<usize> = (0..27).collect();
    let empty_sets: [Vec<usize>; 6] = [
        vec![0],
        vec![13],
        vec![26],
        vec![0, 5, 13, 20, 26],
        all.iter().copied().filter(|&k| k != 7).collect(),
        all.clone(),
    ];
    for (case, emptied) in empty_sets.iter().enumerate() {
        let mut conv = base.clone();
        for &k in emptied {
            conv.num[k] = 0;
        }
        // Extra output rows past every destination: whole row tiles without pairs.
        conv.num_out = sites.len() + 5000;
        conv.out_indices = vec![0; conv.num_out * 4];
        let got = check(&conv, false);
        let bias = conv.bias.as_ref().expect("bias");
        for (row, out) in got.chunks(64).enumerate().skip(sites.len()) {
            assert_eq!(bits(out), bits(bias), "case {case}: row {row} has no pair");
        }
        if emptied.len() == 27 {
            assert!(
                got.chunks(64).all(|r| bits(r) == bits(bias)),
                "no pairs at all: every row is the bias"
            );
        }
    }
}

#[test]
fn huge_channel_counts_without_pairs_give_the_bias() {
    // No pair, so nothing is multiplied: Cin (and K) bound no buffer the kernel needs.
    for (l, cin) in [(0usize, 1usize << 40), (3, 0)] {
        let conv = Conv {
            l,
            cin,
            cout: 3,
            k: 0,
            p: 4,
            num_out: 70,
            features: vec![0.5; l * cin],
            filters: vec![],
            pairs: vec![],
            num: vec![],
            out_indices: vec![0; 70 * 4],
            out_d: 4,
            bias: Some(vec![1.5, -2.0, 0.25]),
        };
        let got = conv.run(0, &Threads(2)).expect("valid: no pairs");
        assert!(got.chunks(3).all(|r| r == [1.5, -2.0, 0.25]), "Cin {cin}: output = bias");
    }
}

// ---------------------------------------------------------------- errors (one per rule)

/// L 4, Cin 3, Cout 2, K 3, P 5, num_out 6, bias; unused slots hold garbage.
fn small() -> Conv {
    random_conv(&mut Rng(77), 4, 3, 2, 3, 5, 6, true)
}

/// As `small`, with every slot used and valid for inverse = 0 (slot 0 < 4, slot 1 < 6).
fn full_small() -> Conv {
    let mut c = small();
    c.num = vec![5; 3];
    for k in 0..3 {
        for j in 0..5 {
            c.pairs[(k * 2) * 5 + j] = ((j + k) % 4) as i32;
            c.pairs[(k * 2 + 1) * 5 + j] = ((2 * j + k) % 6) as i32;
        }
    }
    c
}

/// Replaces input `slot` and expects an error naming `name`.
/// A replaced tensor of another dtype must be reported as a dtype error, one of another
/// shape as a shape error.
fn expect_error(c: &Conv, inverse: i64, slot: usize, t: Tensor, name: &str) -> String {
    let mut ts = c.tensors();
    let rule = if std::mem::discriminant(&ts[slot].data) != std::mem::discriminant(&t.data) {
        Some("dtype")
    } else if ts[slot].shape != t.shape {
        Some("shape")
    } else {
        None
    };
    ts[slot] = t;
    let err = run_tensors(inverse, &ts, &Threads(2)).expect_err("contract says error");
    let msg = format!("{err}");
    assert_eq!(err.code(), ort_sys::OrtErrorCode::ORT_INVALID_ARGUMENT, "{msg}");
    assert!(msg.contains(&format!("'{name}'")), "message should name {name}: {msg}");
    if let Some(rule) = rule {
        assert!(msg.contains(rule), "message should state the {rule} rule: {msg}");
    }
    msg
}

#[test]
fn inverse_not_zero_or_one_is_error() {
    for bad in [2, -1, i64::MAX] {
        let e = descriptor::<IndiceConv>(&attrs(bad)).expect_err("inverse must be 0 or 1");
        assert!(format!("{e}").contains("'inverse'"), "{e}");
    }
    let wrong = HashMap::from([("inverse".to_string(), AttrValue::Float(1.0))]);
    let e = descriptor::<IndiceConv>(&wrong).expect_err("inverse is an int");
    assert!(format!("{e}").contains("'inverse'"), "{e}");
    // Default 0.
    let op: IndiceConv = descriptor(&HashMap::new()).expect("inverse is optional");
    let c = small();
    let ts = c.tensors();
    let refs: Vec<Option<&Tensor>> = ts.iter().map(Some).collect();
    let got = run(&op, &refs, &Serial).expect("runs");
    assert_eq!(got[0], run_tensors(0, &ts, &Serial).expect("runs"));
}

#[test]
fn features_shape_or_dtype_mismatch_is_error() {
    let c = small();
    expect_error(&c, 0, 0, Tensor::f32([12], c.features.clone()), "features");
    expect_error(&c, 0, 0, Tensor::f32([4, 3, 1], c.features.clone()), "features");
    expect_error(&c, 0, 0, Tensor::i32([4, 3], vec![0; 12]), "features");
    expect_error(&c, 0, 0, Tensor::f16([4, 3], vec![half::f16::ZERO; 12]), "features");
}

#[test]
fn filters_shape_or_dtype_mismatch_is_error() {
    let c = small(); // K 3, Cin 3, Cout 2
    // Cin differs from features', rank 2, rank 4, dtype.
    expect_error(&c, 0, 1, Tensor::f32([3, 2, 3], c.filters.clone()), "filters");
    expect_error(&c, 0, 1, Tensor::f32([9, 2], c.filters.clone()), "filters");
    expect_error(&c, 0, 1, Tensor::f32([3, 3, 2, 1], c.filters.clone()), "filters");
    expect_error(&c, 0, 1, Tensor::i32([3, 3, 2], vec![0; 18]), "filters");
}

#[test]
fn indice_pairs_shape_or_dtype_mismatch_is_error() {
    let c = small(); // K 3, P 5
    // K differs from filters' (either side), middle dimension not 2, rank, dtype.
    for t in [
        Tensor::i32([2, 2, 5], c.pairs[..20].to_vec()),
        Tensor::i32([4, 2, 5], [c.pairs.clone(), vec![0; 10]].concat()),
        Tensor::i32([3, 1, 10], c.pairs.clone()),
        Tensor::i32([3, 3, 5], [c.pairs.clone(), vec![0; 15]].concat()),
        Tensor::i32([6, 5], c.pairs.clone()),
        Tensor::i64([3, 2, 5], vec![0; 30]),
        Tensor::f32([3, 2, 5], vec![0.0; 30]),
    ] {
        expect_error(&c, 0, 2, t, "indice_pairs");
    }
}

#[test]
fn indice_num_shape_or_dtype_mismatch_is_error() {
    let c = small();
    for t in [
        Tensor::i32([2], vec![0; 2]),
        Tensor::i32([4], vec![0; 4]),
        Tensor::i32([3, 1], vec![0; 3]),
        Tensor::i32([], vec![0]),
        Tensor::i64([3], vec![0; 3]),
        Tensor::f32([3], vec![0.0; 3]),
    ] {
        expect_error(&c, 0, 3, t, "indice_num");
    }
}

#[test]
fn out_indices_not_rank_two_is_error() {
    let c = small();
    for t in [
        Tensor::i32([6], vec![0; 6]),
        Tensor::i32([6, 4, 1], vec![0; 24]),
        Tensor::i32([], vec![0]),
    ] {
        let e = expect_error(&c, 0, 4, t, "out_indices");
        assert!(e.contains("shape"), "{e}");
    }
    // out_indices is int32.
    expect_error(&c, 0, 4, Tensor::f32([6, 4], vec![0.0; 24]), "out_indices");
}

#[test]
fn bias_shape_or_dtype_mismatch_is_error() {
    let c = small(); // Cout 2
    for t in [
        Tensor::f32([3], vec![0.0; 3]),
        Tensor::f32([1], vec![0.0]),
        Tensor::f32([1, 2], vec![0.0; 2]),
        Tensor::f32([], vec![0.0]),
        Tensor::i32([2], vec![0; 2]),
    ] {
        expect_error(&c, 0, 5, t, "bias");
    }
}

#[test]
fn missing_required_input_is_error() {
    let c = small();
    let ts = c.tensors();
    let names = ["features", "filters", "indice_pairs", "indice_num", "out_indices"];
    for (slot, name) in names.iter().enumerate() {
        let inputs: Vec<Option<&Tensor>> =
            ts.iter().enumerate().map(|(k, t)| (k != slot).then_some(t)).collect();
        let op: IndiceConv = descriptor(&attrs(0)).expect("valid");
        let e = run(&op, &inputs, &Serial).expect_err("required input missing");
        assert!(format!("{e}").contains(&format!("'{name}'")), "{e}");
    }
}

#[test]
fn indice_num_outside_zero_to_p_is_error() {
    for inverse in [0, 1] {
        for bad in [-1, 6, i32::MIN, i32::MAX] {
            let mut c = small(); // P 5
            if inverse == 1 {
                c = Conv {
                    l: 6,
                    num_out: 4,
                    features: vec![0.5; 18],
                    out_indices: vec![0; 16],
                    ..c
                };
            }
            c.num[1] = bad;
            let e = expect_error(&c, inverse, 3, Tensor::i32([3], c.num.clone()), "indice_num");
            assert!(e.contains(&bad.to_string()), "{e}");
        }
    }
    // indice_num[k] = P is legal.
    check(&full_small(), false);
}

#[test]
fn source_row_outside_features_is_error() {
    // inverse = 0: slot 0 is the source, in [0, L = 4).
    check(&full_small(), false);
    for bad in [-1, 4, 5, i32::MIN, i32::MAX] {
        let mut c = full_small();
        c.pairs[(2 * 2) * 5 + 1] = bad;
        let e = expect_error(&c, 0, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
        assert!(e.contains(&bad.to_string()), "{e}");
    }
    // A value valid as a destination (num_out 6) but not as a source (L 4).
    let mut c = full_small();
    c.pairs[0] = 5;
    expect_error(&c, 0, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
}

#[test]
fn destination_row_outside_output_is_error() {
    // inverse = 0: slot 1 is the destination, in [0, num_out = 6).
    for bad in [-1, 6, i32::MIN, i32::MAX] {
        let mut c = full_small();
        c.pairs[(2 + 1) * 5 + 4] = bad; // k 1, slot 1, j 4
        let e = expect_error(&c, 0, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
        assert!(e.contains(&bad.to_string()), "{e}");
    }
}

#[test]
fn inverse_checks_the_swapped_slots() {
    // inverse = 1 with L 4, num_out 6: slot 1 is the source (< 4), slot 0 the destination (< 6).
    let mut c = small();
    c.num = vec![1, 0, 0];
    c.pairs[0] = 5; // destination 5 < num_out: fine
    c.pairs[5] = 3; // source 3 < L: fine
    check(&c, true);
    // Source 4 (= L) in slot 1: error, though valid as an inverse = 0 destination.
    c.pairs[5] = 4;
    expect_error(&c, 1, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
    c.run(0, &Serial).expect_err("slot 0 = 5 is not a source row either");
    // Destination 6 (= num_out) in slot 0.
    c.pairs[5] = 0;
    c.pairs[0] = 6;
    expect_error(&c, 1, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
}

#[test]
fn unused_slots_are_not_read() {
    let mut c = small();
    c.num = vec![2, 0, 1];
    for k in 0..3 {
        for j in 0..5 {
            let used = (j as i32) < c.num[k];
            let (s, d) = if used { ((j % 4) as i32, (j % 6) as i32) } else { (i32::MIN, i32::MAX) };
            c.pairs[(k * 2) * 5 + j] = s;
            c.pairs[(k * 2 + 1) * 5 + j] = d;
        }
    }
    check(&c, false);
}

// ---------------------------------------------------------------- properties

fn any_conv() -> impl Strategy<Value = (Conv, bool)> {
    (0usize..4, 0usize..5, 0usize..5, 0usize..5, 0usize..3, 0usize..3, any::<bool>(), any::<bool>())
        .prop_flat_map(|(k, p, l, num_out, cin, cout, inverse, bias)| {
            let (src_limit, dst_limit) = (l as i32, num_out as i32);
            let index = |limit: i32| {
                prop_oneof![
                    30 => 0..limit.max(1),
                    2 => -3..limit + 3,
                    1 => Just(i32::MIN),
                    1 => Just(i32::MAX),
                ]
            };
            // Slot 0 holds sources unless inverse, then destinations.
            let (slot0, slot1) = if inverse { (dst_limit, src_limit) } else { (src_limit, dst_limit) };
            let pi = p as i32;
            let num = prop_oneof![20 => 0..=pi, 1 => -2..pi + 3, 1 => Just(i32::MIN), 1 => Just(i32::MAX)];
            (
                Just((k, p, l, num_out, cin, cout, inverse, bias)),
                prop::collection::vec(index(slot0), k * p),
                prop::collection::vec(index(slot1), k * p),
                prop::collection::vec(num, k),
                any::<u64>(),
            )
        })
        .prop_map(|((k, p, l, num_out, cin, cout, inverse, bias), s0, s1, num, seed)| {
            let mut rng = Rng(seed);
            let mut pairs = Vec::with_capacity(k * 2 * p);
            for kk in 0..k {
                pairs.extend_from_slice(&s0[kk * p..(kk + 1) * p]);
                pairs.extend_from_slice(&s1[kk * p..(kk + 1) * p]);
            }
            let conv = Conv {
                l,
                cin,
                cout,
                k,
                p,
                num_out,
                features: rng.floats(l * cin),
                filters: rng.floats(k * cin * cout),
                pairs,
                num,
                out_indices: vec![-1; num_out * 2],
                out_d: 2,
                bias: bias.then(|| rng.floats(cout)),
            };
            (conv, inverse)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Random indice_pairs / indice_num (out-of-range values, indice_num > P or < 0), both
    /// directions: never a panic; an error naming the offending tensor exactly when the
    /// contract says; otherwise the reference, bit-identical between Serial and Threads(2).
    #[test]
    fn random_rulebooks_follow_the_contract((conv, inverse) in any_conv()) {
        let (num_bad, pair_bad) = index_errors(&conv, inverse);
        match conv.run(inverse as i64, &Threads(2)) {
            Ok(got) => {
                prop_assert!(!num_bad && !pair_bad, "accepted an invalid rulebook: {:?}", conv);
                assert_accumulating(&got, &reference(&conv, inverse), "output");
                let serial = conv.run(inverse as i64, &Serial).expect("runs");
                prop_assert_eq!(bits(&serial), bits(&got));
            }
            Err(e) => {
                let msg = format!("{e}");
                prop_assert!(num_bad || pair_bad, "rejected a valid rulebook: {}", msg);
                let names_num = msg.contains("'indice_num'");
                let names_pairs = msg.contains("'indice_pairs'");
                match (num_bad, pair_bad) {
                    (true, false) => prop_assert!(names_num, "{}", msg),
                    (false, true) => prop_assert!(names_pairs, "{}", msg),
                    _ => prop_assert!(names_num || names_pairs, "{}", msg),
                }
            }
        }
    }
}

// ---------------------------------------------------------------- fused epilogue

/// The node with `e`'s epilogue, its output.
fn run_fused(c: &Conv, e: &Epilogue, par: &dyn Parallel) -> Result<Vec<f32>, Error> {
    let op: IndiceConv = descriptor(&e.attrs(0))?;
    let ts = e.inputs(c);
    let refs: Vec<Option<&Tensor>> = ts.iter().map(Option::as_ref).collect();
    let mut out = run(&op, &refs, par)?;
    Ok(out.remove(0).data.f32().expect("float32 output").to_vec())
}

/// Every subset of {scale, shift, residual, relu} over `c`, with values of both signs.
fn epilogues(rng: &mut Rng, c: &Conv) -> Vec<Epilogue> {
    (0..16)
        .map(|m| Epilogue {
            scale: (m & 1 != 0).then(|| rng.floats(c.cout).iter().map(|x| x * 2.0).collect()),
            shift: (m & 2 != 0).then(|| rng.floats(c.cout)),
            residual: (m & 4 != 0).then(|| rng.floats(c.num_out * c.cout)),
            relu: m & 8 != 0,
        })
        .collect()
}

#[test]
fn fused_epilogue_is_the_unfused_graph_bit_for_bit() {
    // Scale, shift, residual and ReLU on the plain convolution's output, each one float32
    // operation, whichever path (GEMM: Cout 3, 40; AVX-512 fused: 16, 64, 128), rulebook
    // (grouped: random; in place: submanifold and strided over sites), row tiles and threads.
    let mut rng = Rng(51);
    let mut convs: Vec<Conv> = [(3, 8), (16, 16), (40, 5), (64, 32), (128, 16)]
        .into_iter()
        .map(|(cout, cin)| random_conv(&mut rng, 300, cin, cout, 27, 300, 2500, cout % 2 == 0))
        .collect();
    let subm = Geometry::subm(2, [8, 32, 32], [3, 3, 3], [1; 3]);
    let strided =
        Geometry { stride: [2; 3], padding: [1; 3], ..Geometry::new(2, [8, 32, 32], [3, 3, 3]) };
    let sites = clustered_sites(&mut rng, &subm, 3000);
    for (g, cout) in [(&subm, 16), (&strided, 32), (&subm, 24)] {
        convs.push(conv_on_sites(&mut rng, g, &sites, 16, cout, true));
    }
    for c in &convs {
        let plain = c.run(0, &Serial).expect("plain convolution runs");
        for e in epilogues(&mut rng, c) {
            let want = bits(&e.unfused(&plain, c.cout));
            for par in [&Serial as &dyn Parallel, &Threads(3)] {
                let got = run_fused(c, &e, par).expect("fused convolution runs");
                assert_eq!(bits(&got), want, "Cout {} epilogue {e:?}", c.cout);
            }
        }
    }
}

#[test]
fn without_the_epilogue_the_output_is_the_plain_convolutions() {
    // activation "none" given explicitly, the optional inputs absent: the same bits as the
    // node without the attribute, whose sums the tests above pin to the contract's order.
    let mut rng = Rng(52);
    for cout in [5, 16, 64] {
        let c = random_conv(&mut rng, 60, 7, cout, 27, 60, 200, true);
        let plain = c.run(0, &Threads(2)).expect("runs");
        let none = Epilogue::default();
        assert_eq!(bits(&run_fused(&c, &none, &Threads(2)).expect("runs")), bits(&plain));
    }
}

#[test]
fn relu_keeps_nan_and_negative_zero_and_zeroes_negatives() {
    // One output row per case: plain output 0 (no pair), residual the value, ReLU.
    let c = Conv { num: vec![0; 3], ..random_conv(&mut Rng(53), 4, 3, 5, 3, 4, 1, false) };
    let residual = vec![f32::NAN, -0.0, -1.5, 2.0, f32::NEG_INFINITY];
    let e = Epilogue { residual: Some(residual), relu: true, ..Epilogue::default() };
    let got = run_fused(&c, &e, &Serial).expect("runs");
    // 0 + NaN = NaN, 0 + -0 = +0 (round to nearest), -1.5 -> 0, 2, -inf -> 0.
    assert!(got[0].is_nan(), "{got:?}");
    assert_eq!(bits(&got[1..]), bits(&[0.0, 0.0, 2.0, 0.0]));
    // A negative-zero product kept through ReLU: scale -1 on a plain 0 gives -0.
    let e = Epilogue { scale: Some(vec![-1.0; 5]), relu: true, ..Epilogue::default() };
    assert_eq!(bits(&run_fused(&c, &e, &Serial).expect("runs")), bits(&[-0.0f32; 5]));
}

#[test]
fn epilogue_shape_dtype_or_activation_mismatch_is_error() {
    let c = small(); // Cout 2, num_out 6
    let full = Epilogue {
        scale: Some(vec![1.0; 2]),
        shift: Some(vec![0.0; 2]),
        residual: Some(vec![0.0; 12]),
        relu: true,
    };
    for (slot, name, bad) in [
        (6, "scale", Tensor::f32([3], vec![1.0; 3])),
        (6, "scale", Tensor::f32([1, 2], vec![1.0; 2])),
        (6, "scale", Tensor::i32([2], vec![1; 2])),
        (7, "shift", Tensor::f32([1], vec![0.0])),
        (7, "shift", Tensor::f32([], vec![0.0])),
        (8, "residual", Tensor::f32([5, 2], vec![0.0; 10])),
        (8, "residual", Tensor::f32([6, 3], vec![0.0; 18])),
        (8, "residual", Tensor::f32([12], vec![0.0; 12])),
        (8, "residual", Tensor::f16([6, 2], vec![half::f16::ZERO; 12])),
    ] {
        let mut ts = full.inputs(&c);
        ts[slot] = Some(bad);
        let op: IndiceConv = descriptor(&full.attrs(0)).expect("valid attributes");
        let refs: Vec<Option<&Tensor>> = ts.iter().map(Option::as_ref).collect();
        let err = run(&op, &refs, &Serial).expect_err("contract says error");
        let msg = format!("{err}");
        assert_eq!(err.code(), ort_sys::OrtErrorCode::ORT_INVALID_ARGUMENT, "{msg}");
        assert!(msg.contains(&format!("'{name}'")), "message should name {name}: {msg}");
    }
    // The full epilogue with valid shapes runs.
    run_fused(&c, &full, &Serial).expect("valid epilogue runs");
    for bad in ["Relu", "relu6", "leaky_relu", ""] {
        let mut a = attrs(0);
        a.insert("activation".into(), AttrValue::String(bad.into()));
        let e = descriptor::<IndiceConv>(&a).expect_err("unknown activation");
        assert!(format!("{e}").contains("'activation'"), "{e}");
    }
    let mut a = attrs(0);
    a.insert("activation".into(), AttrValue::Int(1));
    let e = descriptor::<IndiceConv>(&a).expect_err("activation is a string");
    assert!(format!("{e}").contains("'activation'"), "{e}");
}
