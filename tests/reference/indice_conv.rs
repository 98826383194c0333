//! IndiceConv's inputs, contract rules and rulebook reference, shared by its suite
//! (tests/indice_conv.rs) and its fuzz target (fuzz/fuzz_targets/).

use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use std::collections::HashMap;

/// The inputs of one IndiceConv node.
#[derive(Debug, Clone)]
pub struct Conv {
    pub l: usize,
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub p: usize,
    pub num_out: usize,
    pub features: Vec<f32>,
    pub filters: Vec<f32>,
    /// [K, 2, P]
    pub pairs: Vec<i32>,
    pub num: Vec<i32>,
    /// out_indices' data (never read by the op: only its first dimension counts).
    pub out_indices: Vec<i32>,
    pub out_d: usize,
    pub bias: Option<Vec<f32>>,
}

impl Conv {
    pub fn tensors(&self) -> Vec<Tensor> {
        let mut t = vec![
            Tensor::f32([self.l, self.cin], self.features.clone()),
            Tensor::f32([self.k, self.cin, self.cout], self.filters.clone()),
            Tensor::i32([self.k, 2, self.p], self.pairs.clone()),
            Tensor::i32([self.k], self.num.clone()),
            Tensor::i32([self.num_out, self.out_d], self.out_indices.clone()),
        ];
        if let Some(b) = &self.bias {
            t.push(Tensor::f32([self.cout], b.clone()));
        }
        t
    }
}

pub fn attrs(inverse: i64) -> HashMap<String, AttrValue> {
    HashMap::from([("inverse".to_string(), AttrValue::Int(inverse))])
}

/// The rulebook reference: float64, straight from the contract's loop.
impl Conv {
    /// The same node on the inputs' magnitudes: its reference is, per output element, the
    /// sum of the magnitudes of the terms that element adds up.
    pub fn magnitudes(&self) -> Conv {
        let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
        Conv {
            features: abs(&self.features),
            filters: abs(&self.filters),
            bias: self.bias.as_deref().map(abs),
            ..self.clone()
        }
    }
}

pub fn reference(c: &Conv, inverse: bool) -> Vec<f64> {
    let (cin, cout, p) = (c.cin, c.cout, c.p);
    let mut out = vec![0f64; c.num_out * cout];
    for row in out.chunks_mut(cout.max(1)) {
        for (o, v) in row.iter_mut().enumerate() {
            *v = c.bias.as_ref().map_or(0.0, |b| b[o] as f64);
        }
    }
    for k in 0..c.k {
        for j in 0..c.num[k] as usize {
            let (a, b) = (c.pairs[(k * 2) * p + j] as usize, c.pairs[(k * 2 + 1) * p + j] as usize);
            let (src, dst) = if inverse { (b, a) } else { (a, b) };
            for ci in 0..cin {
                let x = c.features[src * cin + ci] as f64;
                for co in 0..cout {
                    out[dst * cout + co] += x * c.filters[(k * cin + ci) * cout + co] as f64;
                }
            }
        }
    }
    out
}

/// True when the contract makes these (well-shaped) inputs an error, with the tensors that
/// may be named: indice_num outside [0, P], or a read pair outside its range.
pub fn index_errors(c: &Conv, inverse: bool) -> (bool, bool) {
    let (src_slot, dst_slot) = if inverse { (1, 0) } else { (0, 1) };
    let mut num_bad = false;
    let mut pair_bad = false;
    for k in 0..c.k {
        let n = c.num[k];
        if n < 0 || n as usize > c.p {
            num_bad = true;
            continue;
        }
        for j in 0..n as usize {
            let src = c.pairs[(k * 2 + src_slot) * c.p + j];
            let dst = c.pairs[(k * 2 + dst_slot) * c.p + j];
            if src < 0 || src as usize >= c.l || dst < 0 || dst as usize >= c.num_out {
                pair_bad = true;
            }
        }
    }
    (num_bad, pair_bad)
}

/// The fused epilogue's inputs and activation (absent: None / false).
#[derive(Debug, Clone, Default)]
pub struct Epilogue {
    pub scale: Option<Vec<f32>>,
    pub shift: Option<Vec<f32>>,
    /// [num_out, Cout]
    pub residual: Option<Vec<f32>>,
    pub relu: bool,
}

impl Epilogue {
    /// The node's inputs: the convolution's, its bias slot (absent when it has none), then
    /// scale, shift and residual; trailing absent ones dropped.
    pub fn inputs(&self, c: &Conv) -> Vec<Option<Tensor>> {
        let mut t: Vec<Option<Tensor>> = c.tensors().into_iter().map(Some).collect();
        t.resize(6, None);
        t.push(self.scale.clone().map(|v| Tensor::f32([c.cout], v)));
        t.push(self.shift.clone().map(|v| Tensor::f32([c.cout], v)));
        t.push(self.residual.clone().map(|v| Tensor::f32([c.num_out, c.cout], v)));
        while t.last().is_some_and(Option::is_none) {
            t.pop();
        }
        t
    }

    pub fn attrs(&self, inverse: i64) -> HashMap<String, AttrValue> {
        let mut a = attrs(inverse);
        let act = if self.relu { "relu" } else { "none" };
        a.insert("activation".to_string(), AttrValue::String(act.into()));
        a
    }

    /// The unfused graph from the plain convolution's output: Mul(scale), Add(shift),
    /// Add(residual), Relu, each one float32 operation per element (Relu as ONNX Runtime's:
    /// y < 0 -> 0, NaN and -0 kept).
    pub fn unfused(&self, plain: &[f32], cout: usize) -> Vec<f32> {
        plain
            .iter()
            .enumerate()
            .map(|(e, &y)| {
                let c = e % cout.max(1);
                let y = self.scale.as_ref().map_or(y, |s| y * s[c]);
                let y = self.shift.as_ref().map_or(y, |s| y + s[c]);
                let y = self.residual.as_ref().map_or(y, |r| y + r[e]);
                if self.relu && y < 0.0 { 0.0 } else { y }
            })
            .collect()
    }
}
