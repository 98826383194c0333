//! DynamicScatter's case and contract reference, shared by its suite (tests/dynamic_scatter.rs)
//! and its fuzz target (fuzz/fuzz_targets/).

use onnxruntime_ep_mlu::tensor::Tensor;
use std::collections::BTreeMap;

/// Inputs: feats [N, C], coors [N, D].
#[derive(Debug, Clone)]
pub struct Case {
    pub n: usize,
    pub c: usize,
    pub d: usize,
    pub feats: Vec<f32>,
    pub coors: Vec<i32>,
}

impl Case {
    pub fn tensors(&self) -> (Tensor, Tensor) {
        (
            Tensor::f32([self.n, self.c], self.feats.clone()),
            Tensor::i32([self.n, self.d], self.coors.clone()),
        )
    }
}

/// The contract's outputs, computed naively.
pub struct Reference {
    pub m: usize,
    pub voxel_coors: Vec<i32>,
    pub map: Vec<i32>,
    pub count: Vec<i32>,
    /// max: largest non-NaN value, -inf when there is none.
    pub max: Vec<f32>,
    /// float32 sums in ascending point order, and those divided in float32 by the count.
    pub sum32: Vec<f32>,
    pub mean32: Vec<f32>,
    /// float64 sums and means.
    pub sum64: Vec<f64>,
    pub mean64: Vec<f64>,
}

pub fn reference(case: &Case) -> Reference {
    let (n, c, d) = (case.n, case.c, case.d);
    // Distinct rows of kept points; Vec<i32> orders lexicographically, first coordinate
    // most significant. Points are pushed in ascending order.
    let mut voxels: BTreeMap<Vec<i32>, Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        let row = &case.coors[i * d..(i + 1) * d];
        if row.iter().all(|&x| x >= 0) {
            voxels.entry(row.to_vec()).or_default().push(i);
        }
    }
    let m = voxels.len();
    let mut r = Reference {
        m,
        voxel_coors: Vec::with_capacity(m * d),
        map: vec![-1; n],
        count: Vec::with_capacity(m),
        max: vec![f32::NEG_INFINITY; m * c],
        sum32: vec![0.0; m * c],
        mean32: vec![0.0; m * c],
        sum64: vec![0.0; m * c],
        mean64: vec![0.0; m * c],
    };
    for (v, (row, points)) in voxels.iter().enumerate() {
        r.voxel_coors.extend_from_slice(row);
        r.count.push(points.len() as i32);
        for &i in points {
            r.map[i] = v as i32;
        }
        for ch in 0..c {
            let values: Vec<f32> = points.iter().map(|&i| case.feats[i * c + ch]).collect();
            let non_nan: Vec<f32> = values.iter().copied().filter(|x| !x.is_nan()).collect();
            r.max[v * c + ch] =
                non_nan.iter().copied().fold(f32::NEG_INFINITY, |a, x| if x > a { x } else { a });
            let mut s32 = 0f32;
            let mut s64 = 0f64;
            for &x in &values {
                s32 += x;
                s64 += x as f64;
            }
            r.sum32[v * c + ch] = s32;
            r.mean32[v * c + ch] = s32 / points.len() as f32;
            r.sum64[v * c + ch] = s64;
            r.mean64[v * c + ch] = s64 / points.len() as f64;
        }
    }
    r
}
