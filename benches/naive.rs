//! Straightforward single-threaded implementations of the operators: the loops one
//! writes first from docs/CONTRACT.md, with no attention to memory order, allocation or threads.
//! The bench measures the kernels against them (and checks that both agree).

use std::collections::{BTreeMap, HashMap};

pub fn dynamic_scatter_backward_max(
    gvf: &[f32],
    feats: &[f32],
    vf: &[f32],
    map: &[i32],
    c: usize,
) -> Vec<f32> {
    let n = map.len();
    let mut out = vec![0f32; n * c];
    let mut winner: HashMap<(usize, usize), usize> = HashMap::new();
    for i in 0..n {
        if map[i] < 0 {
            continue;
        }
        let v = map[i] as usize;
        for ch in 0..c {
            if feats[i * c + ch] == vf[v * c + ch] {
                winner.entry((v, ch)).or_insert(i);
            }
        }
    }
    for ((v, ch), i) in winner {
        out[i * c + ch] = gvf[v * c + ch];
    }
    out
}

/// DynamicScatter's outputs: voxels in ascending coordinate order, each reduced over its
/// points in point order (mean: the sum divided by the count).
pub fn dynamic_scatter(
    feats: &[f32],
    coors: &[i32],
    c: usize,
    reduce: &str,
) -> (Vec<f32>, Vec<i32>, Vec<i32>, Vec<i32>) {
    let n = coors.len() / 3;
    let mut voxels: BTreeMap<&[i32], Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        let row = &coors[i * 3..i * 3 + 3];
        if row.iter().all(|&x| x >= 0) {
            voxels.entry(row).or_default().push(i);
        }
    }
    let (mut vf, mut vc, mut map, mut count) = (Vec::new(), Vec::new(), vec![-1; n], Vec::new());
    for (v, (row, points)) in voxels.iter().enumerate() {
        vc.extend_from_slice(row);
        count.push(points.len() as i32);
        for ch in 0..c {
            let mut acc = if reduce == "max" { f32::NEG_INFINITY } else { 0.0 };
            for &i in points {
                let x = feats[i * c + ch];
                if reduce == "max" {
                    if x > acc {
                        acc = x;
                    }
                } else {
                    acc += x;
                }
            }
            vf.push(if reduce == "mean" { acc / points.len() as f32 } else { acc });
        }
        for &i in points {
            map[i] = v as i32;
        }
    }
    (vf, vc, map, count)
}

pub fn three_interpolate(f: &[f32], idx: &[i32], w: &[f32], [b, c, m, n]: [usize; 4]) -> Vec<f32> {
    let mut out = vec![0f32; b * c * n];
    for bi in 0..b {
        for ci in 0..c {
            for ni in 0..n {
                let mut sum = 0.0;
                for k in 0..3 {
                    let t = (bi * n + ni) * 3 + k;
                    let v = f[(bi * c + ci) * m + idx[t] as usize] * w[t];
                    sum = if k == 0 { v } else { sum + v };
                }
                out[(bi * c + ci) * n + ni] = sum;
            }
        }
    }
    out
}

pub fn three_interpolate_backward(
    go: &[f32],
    idx: &[i32],
    w: &[f32],
    [b, c, n, m]: [usize; 4],
) -> Vec<f32> {
    let mut out = vec![0f32; b * c * m];
    for bi in 0..b {
        for ci in 0..c {
            for ni in 0..n {
                for k in 0..3 {
                    let j = idx[(bi * n + ni) * 3 + k] as usize;
                    out[(bi * c + ci) * m + j] +=
                        go[(bi * c + ci) * n + ni] * w[(bi * n + ni) * 3 + k];
                }
            }
        }
    }
    out
}

/// Rulebook of a regular (non-subm, non-transpose) or subm convolution: (pairs, out, num).
#[allow(clippy::too_many_arguments)]
pub fn get_indice_pairs(
    indices: &[i32],
    spatial: [i64; 3],
    k: [i64; 3],
    s: [i64; 3],
    p: [i64; 3],
    subm: bool,
) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let l = indices.len() / 4;
    let kv = (k[0] * k[1] * k[2]) as usize;
    let out_size: Vec<i64> = (0..3)
        .map(|a| {
            if subm {
                spatial[a]
            } else {
                (spatial[a] + 2 * p[a] - (k[a] - 1) - 1).div_euclid(s[a]) + 1
            }
        })
        .collect();
    let site =
        |r: usize| [indices[r * 4], indices[r * 4 + 1], indices[r * 4 + 2], indices[r * 4 + 3]];
    let mut outs: BTreeMap<[i32; 4], i32> = BTreeMap::new();
    let mut raw: Vec<(usize, usize, [i32; 4])> = Vec::new();
    let active: HashMap<[i32; 4], usize> = (0..l).map(|r| (site(r), r)).collect();
    for r in 0..l {
        let [bb, z, y, x] = site(r);
        for kk in 0..kv {
            let off = [kk as i64 / (k[1] * k[2]), kk as i64 / k[2] % k[1], kk as i64 % k[2]];
            let mut o = [bb, 0, 0, 0];
            let mut ok = true;
            for (a, i) in [z, y, x].into_iter().enumerate() {
                let num = i as i64 + p[a] - off[a];
                ok &= num.rem_euclid(s[a]) == 0 && (0..out_size[a]).contains(&num.div_euclid(s[a]));
                o[a + 1] = num.div_euclid(s[a]) as i32;
            }
            if ok && (!subm || active.contains_key(&o)) {
                raw.push((kk, r, o));
                outs.insert(o, 0);
            }
        }
    }
    let out: Vec<[i32; 4]> =
        if subm { (0..l).map(site).collect() } else { outs.keys().copied().collect() };
    let row: HashMap<[i32; 4], i32> = out.iter().enumerate().map(|(i, o)| (*o, i as i32)).collect();
    let mut pairs = vec![-1i32; kv * 2 * l];
    let mut num = vec![0i32; kv];
    for (kk, r, o) in raw {
        let j = num[kk] as usize;
        pairs[kk * 2 * l + j] = r as i32;
        pairs[(kk * 2 + 1) * l + j] = row[&o];
        num[kk] += 1;
    }
    (pairs, out.concat(), num)
}

pub fn voxel_pooling_forward(
    geom: &[i32],
    feats: &[f32],
    [b, n, c]: [usize; 3],
    [nx, ny, nz]: [i32; 3],
) -> Vec<f32> {
    let mut out = vec![0f32; b * (ny * nx) as usize * c];
    for bi in 0..b {
        for pi in 0..n {
            let g = &geom[(bi * n + pi) * 3..][..3];
            if (0..nx).contains(&g[0]) && (0..ny).contains(&g[1]) && (0..nz).contains(&g[2]) {
                let cell = (bi * ny as usize + g[1] as usize) * nx as usize + g[0] as usize;
                for ch in 0..c {
                    out[cell * c + ch] += feats[(bi * n + pi) * c + ch];
                }
            }
        }
    }
    out
}

/// A roi's bin (i, j) as input rows and columns, as the R-FCN CUDA kernel computes it.
fn psroipool_bin(
    roi: &[f32],
    i: usize,
    j: usize,
    [h, w]: [usize; 2],
    pooled: usize,
    scale: f32,
) -> (usize, usize, usize, usize) {
    let sw = roi[1].round() * scale;
    let sh = roi[2].round() * scale;
    let ew = (roi[3].round() + 1.0) * scale;
    let eh = (roi[4].round() + 1.0) * scale;
    let bw = (ew - sw).max(0.1) / pooled as f32;
    let bh = (eh - sh).max(0.1) / pooled as f32;
    let hs = (i as f32 * bh + sh).floor().clamp(0.0, h as f32) as usize;
    let he = ((i + 1) as f32 * bh + sh).ceil().clamp(0.0, h as f32) as usize;
    let ws = (j as f32 * bw + sw).floor().clamp(0.0, w as f32) as usize;
    let we = ((j + 1) as f32 * bw + sw).ceil().clamp(0.0, w as f32) as usize;
    (hs, he, ws, we)
}

/// One thread per (roi, bin, o) element in the R-FCN CUDA kernel, run in a loop: the bin's
/// mean of input channel (o * pooled + i) * pooled + j, and that channel.
pub fn psroipool(
    input: &[f32],
    rois: &[f32],
    [nb, h, w, ch]: [usize; 4],
    pooled: usize,
    od: usize,
    scale: f32,
) -> (Vec<f32>, Vec<i32>) {
    let r_count = rois.len() / 5;
    let (mut out, mut mapping) =
        (vec![0f32; r_count * pooled * pooled * od], vec![0i32; r_count * pooled * pooled * od]);
    for r in 0..r_count {
        let roi = &rois[r * 5..r * 5 + 5];
        let b = roi[0] as usize;
        for i in 0..pooled {
            for j in 0..pooled {
                let (hs, he, ws, we) = psroipool_bin(roi, i, j, [h, w], pooled, scale);
                for o in 0..od {
                    let e = ((r * pooled + i) * pooled + j) * od + o;
                    let c = (o * pooled + i) * pooled + j;
                    mapping[e] = c as i32;
                    if he <= hs || we <= ws || b >= nb {
                        continue;
                    }
                    let mut sum = 0f32;
                    for y in hs..he {
                        for x in ws..we {
                            sum += input[((b * h + y) * w + x) * ch + c];
                        }
                    }
                    out[e] = sum / ((he - hs) * (we - ws)) as f32;
                }
            }
        }
    }
    (out, mapping)
}

/// One thread per (roi, bin, o) element in the R-FCN CUDA kernel, run in a loop.
#[allow(clippy::too_many_arguments)]
pub fn psroipool_backward(
    top: &[f32],
    rois: &[f32],
    mapping: &[i32],
    [nb, h, w, ch]: [usize; 4],
    pooled: usize,
    od: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; nb * h * w * ch];
    let r_count = rois.len() / 5;
    for r in 0..r_count {
        let roi = &rois[r * 5..r * 5 + 5];
        let b = roi[0] as usize;
        for i in 0..pooled {
            for j in 0..pooled {
                let (hs, he, ws, we) = psroipool_bin(roi, i, j, [h, w], pooled, scale);
                for o in 0..od {
                    if he <= hs || we <= ws {
                        continue;
                    }
                    let e = ((r * pooled + i) * pooled + j) * od + o;
                    let v = top[e] / ((he - hs) * (we - ws)) as f32;
                    let c = mapping[e] as usize;
                    for y in hs..he {
                        for x in ws..we {
                            out[((b * h + y) * w + x) * ch + c] += v;
                        }
                    }
                }
            }
        }
    }
    out
}
