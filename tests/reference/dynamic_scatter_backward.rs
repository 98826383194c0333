//! DynamicScatterBackward's case, contract reference and error rules, shared by its suite
//! (tests/dynamic_scatter_backward.rs) and its fuzz target (fuzz/fuzz_targets/).

use onnxruntime_ep_mlu::tensor::Tensor;

/// One set of inputs. Sizes are kept separately so malformed tensors can be built too.
#[derive(Debug, Clone)]
pub struct Case {
    pub n: usize,
    pub m: usize,
    pub c: usize,
    pub grad_voxel_feats: Vec<f32>,
    pub feats: Vec<f32>,
    pub voxel_feats: Vec<f32>,
    pub map: Vec<i32>,
    pub count: Vec<i32>,
    pub voxel_num: Option<i32>,
}

impl Case {
    pub fn tensors(&self) -> Vec<Tensor> {
        let (n, m, c) = (self.n, self.m, self.c);
        let mut t = vec![
            Tensor::f32([m, c], self.grad_voxel_feats.clone()),
            Tensor::f32([n, c], self.feats.clone()),
            Tensor::f32([m, c], self.voxel_feats.clone()),
            Tensor::i32([n], self.map.clone()),
            Tensor::i32([m], self.count.clone()),
        ];
        if let Some(v) = self.voxel_num {
            t.push(Tensor::i32([1], vec![v]));
        }
        t
    }
}

/// The contract's result, assuming the case is valid. Max: points are visited in increasing
/// index order and the first match of each (voxel, channel) takes its gradient.
pub fn reference(case: &Case, reduce: &str) -> Vec<f32> {
    let c = case.c;
    let mut out = vec![0.0f32; case.n * c];
    let mut taken = vec![false; case.m * c];
    for i in 0..case.n {
        let v = case.map[i];
        if v == -1 {
            continue;
        }
        let v = v as usize;
        for ch in 0..c {
            let g = case.grad_voxel_feats[v * c + ch];
            out[i * c + ch] = match reduce {
                "sum" => g,
                "mean" => g / case.count[v] as f32,
                _ => {
                    let matches = case.feats[i * c + ch] == case.voxel_feats[v * c + ch];
                    if matches && !taken[v * c + ch] {
                        taken[v * c + ch] = true;
                        g
                    } else {
                        0.0
                    }
                }
            };
        }
    }
    out
}

/// The tensors whose rules the case violates (empty when it is valid).
pub fn violated(case: &Case, reduce: &str) -> Vec<&'static str> {
    let mut names = Vec::new();
    let v = i64::from(case.voxel_num.unwrap_or(case.m as i32));
    if v < 0 || v > case.m as i64 {
        names.push("voxel_num");
        return names;
    }
    for &p in &case.map {
        if p < -1 || i64::from(p) >= v {
            names.push("point2voxel_map");
        } else if reduce == "mean" && p >= 0 && case.count[p as usize] <= 0 {
            names.push("voxel_points_count");
        }
    }
    names.dedup();
    names
}
