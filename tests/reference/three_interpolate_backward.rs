//! ThreeInterpolateBackward's case and contract reference, shared by its suite
//! (tests/three_interpolate_backward.rs) and its fuzz target (fuzz/fuzz_targets/).

use half::f16;
use onnxruntime_ep_mlu::tensor::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F32,
    F16,
}

/// One set of inputs, stored as float64 values exactly representable in the tensor type.
#[derive(Debug, Clone)]
pub struct Case {
    pub b: usize,
    pub c: usize,
    pub n: usize,
    pub m: i64,
    pub ty: Ty,
    pub grad_output: Vec<f64>,
    pub indices: Vec<i32>,
    pub weights: Vec<f64>,
}

pub fn tensor(ty: Ty, shape: [usize; 3], data: &[f64]) -> Tensor {
    match ty {
        Ty::F32 => Tensor::f32(shape, data.iter().map(|&x| x as f32).collect()),
        Ty::F16 => Tensor::f16(shape, data.iter().map(|&x| f16::from_f64(x)).collect()),
    }
}

/// Rounds a value to the tensor type, so the reference sees exactly what the kernel sees.
pub fn representable(ty: Ty, x: f64) -> f64 {
    match ty {
        Ty::F32 => f64::from(x as f32),
        Ty::F16 => f16::from_f64(x).to_f64(),
    }
}

impl Case {
    pub fn tensors(&self) -> Vec<Tensor> {
        vec![
            tensor(self.ty, [self.b, self.c, self.n], &self.grad_output),
            Tensor::i32([self.b, self.n, 3], self.indices.clone()),
            tensor(self.ty, [self.b, self.n, 3], &self.weights),
        ]
    }
}

/// grad_features = 0, then for every b, c, n, k: += grad_output[b,c,n] * weights[b,n,k],
/// in float64.
pub fn reference(case: &Case) -> Vec<f64> {
    let (b, c, n, m) = (case.b, case.c, case.n, case.m as usize);
    let mut out = vec![0.0f64; b * c * m];
    for bi in 0..b {
        for ci in 0..c {
            for ni in 0..n {
                let g = case.grad_output[(bi * c + ci) * n + ni];
                for k in 0..3 {
                    let j = case.indices[(bi * n + ni) * 3 + k] as usize;
                    out[(bi * c + ci) * m + j] += g * case.weights[(bi * n + ni) * 3 + k];
                }
            }
        }
    }
    out
}
