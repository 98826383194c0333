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
use common::{ELEM_REL, Rng, assert_accumulating, judge_against_terms};
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

// The tests, by theme; the helpers above are theirs (`use super::*`).
#[path = "indice_conv/epilogue.rs"]
mod epilogue;
#[path = "indice_conv/errors.rs"]
mod errors;
#[path = "indice_conv/properties.rs"]
mod properties;
#[path = "indice_conv/semantics.rs"]
mod semantics;
