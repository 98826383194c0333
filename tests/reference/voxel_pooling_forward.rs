//! VoxelPoolingForward's case and contract reference, shared by its suite
//! (tests/voxel_pooling_forward.rs) and its fuzz target (fuzz/fuzz_targets/).

use onnxruntime_ep_mlu::tensor::Tensor;

/// A case: geom_xyz [B, N, 3], input_features [B, N, C].
pub struct Case {
    pub b: usize,
    pub n: usize,
    pub c: usize,
    pub geom: Vec<i32>,
    pub feats: Vec<f32>,
}

impl Case {
    pub fn tensors(&self) -> (Tensor, Tensor) {
        (
            Tensor::i32([self.b, self.n, 3], self.geom.clone()),
            Tensor::f32([self.b, self.n, self.c], self.feats.clone()),
        )
    }
}

/// Serial float64 reference straight from the contract text.
pub fn reference(case: &Case, voxel_num: [i64; 3]) -> (Vec<f64>, Vec<i32>) {
    let [nx, ny, nz] = voxel_num;
    let (b, n, c) = (case.b, case.n, case.c);
    let mut out = vec![0f64; b * (ny * nx) as usize * c];
    let mut memo = vec![-1i32; b * n * 3];
    for bi in 0..b {
        for p in 0..n {
            let at = (bi * n + p) * 3;
            let (x, y, z) =
                (case.geom[at] as i64, case.geom[at + 1] as i64, case.geom[at + 2] as i64);
            let inside = (0..nx).contains(&x) && (0..ny).contains(&y) && (0..nz).contains(&z);
            if !inside {
                continue;
            }
            memo[at] = bi as i32;
            memo[at + 1] = y as i32;
            memo[at + 2] = x as i32;
            let cell = ((bi as i64 * ny + y) * nx + x) as usize;
            for k in 0..c {
                out[cell * c + k] += case.feats[(bi * n + p) * c + k] as f64;
            }
        }
    }
    (out, memo)
}
