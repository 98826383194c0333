//! ThreeInterpolate's case and contract references, shared by its suite (tests/three_interpolate.rs)
//! and its fuzz target (fuzz/fuzz_targets/).

use half::f16;
use onnxruntime_ep_mlu::tensor::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F32,
    F16,
}

/// Inputs: features [B, C, M], indices [B, N, 3], weights [B, N, 3]; values stored as f32
/// exactly representable in the tensor type.
#[derive(Debug, Clone)]
pub struct Case {
    pub b: usize,
    pub c: usize,
    pub m: usize,
    pub n: usize,
    pub ty: Ty,
    pub features: Vec<f32>,
    pub indices: Vec<i32>,
    pub weights: Vec<f32>,
}

pub fn tensor(ty: Ty, shape: [usize; 3], data: &[f32]) -> Tensor {
    match ty {
        Ty::F32 => Tensor::f32(shape, data.to_vec()),
        Ty::F16 => Tensor::f16(shape, data.iter().map(|&x| f16::from_f32(x)).collect()),
    }
}

pub fn representable(ty: Ty, x: f32) -> f32 {
    match ty {
        Ty::F32 => x,
        Ty::F16 => f16::from_f32(x).to_f32(),
    }
}

impl Case {
    pub fn tensors(&self) -> [Tensor; 3] {
        [
            tensor(self.ty, [self.b, self.c, self.m], &self.features),
            Tensor::i32([self.b, self.n, 3], self.indices.clone()),
            tensor(self.ty, [self.b, self.n, 3], &self.weights),
        ]
    }

    pub fn index_error(&self) -> bool {
        self.indices.iter().any(|&i| i < 0 || i as i64 >= self.m as i64)
    }
}

/// float64 reference: output[b, c, n] = sum over k of features[b, c, idx[k]] * w[k].
pub fn reference64(case: &Case) -> Vec<f64> {
    let (b, c, m, n) = (case.b, case.c, case.m, case.n);
    let mut out = vec![0f64; b * c * n];
    for bi in 0..b {
        for ci in 0..c {
            for ni in 0..n {
                let mut acc = 0f64;
                for k in 0..3 {
                    let i = case.indices[(bi * n + ni) * 3 + k] as usize;
                    acc += case.features[(bi * c + ci) * m + i] as f64
                        * case.weights[(bi * n + ni) * 3 + k] as f64;
                }
                out[(bi * c + ci) * n + ni] = acc;
            }
        }
    }
    out
}

/// The contract's exact evaluation: ((f0*w0) + (f1*w1)) + (f2*w2) in float32, every
/// operation rounded (Rust never fuses), then for float16 one rounding to float16. Bits.
pub fn reference_bits(case: &Case) -> Vec<u32> {
    let (b, c, m, n) = (case.b, case.c, case.m, case.n);
    let mut out = Vec::with_capacity(b * c * n);
    for bi in 0..b {
        for ci in 0..c {
            for ni in 0..n {
                let f = |k: usize| {
                    case.features[(bi * c + ci) * m + case.indices[(bi * n + ni) * 3 + k] as usize]
                };
                let w = |k: usize| case.weights[(bi * n + ni) * 3 + k];
                let p0 = f(0) * w(0);
                let p1 = f(1) * w(1);
                let p2 = f(2) * w(2);
                let s = (p0 + p1) + p2;
                out.push(match case.ty {
                    Ty::F32 => s.to_bits(),
                    Ty::F16 => f16::from_f32(s).to_bits() as u32,
                });
            }
        }
    }
    out
}
