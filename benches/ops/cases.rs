//! The cases of benches/ops.rs, one builder per operator at the seed network scales: inputs,
//! the naive implementation and the bytes each input is read as.

// The builders are pub(super) for the parent's table (`cases()`); the rest is theirs.
use super::*;

pub(super) fn dynamic_scatter_backward(rng: &mut Rng, [n, m, c]: [usize; 3]) -> Case {
    // Every voxel holds at least one point; 1% of points are dropped.
    let mut map: Vec<i32> =
        (0..n).map(|i| if i < m { i as i32 } else { rng.below(m as u64) as i32 }).collect();
    for i in (1..n).rev() {
        map.swap(i, rng.below(i as u64 + 1) as usize);
    }
    map.iter_mut().filter(|_| rng.below(100) == 0).for_each(|v| *v = -1);
    let feats = rng.floats(n * c);
    let mut vf = vec![f32::NEG_INFINITY; m * c];
    let mut count = vec![0i32; m];
    for (i, &v) in map.iter().enumerate().filter(|(_, v)| **v >= 0) {
        count[v as usize] += 1;
        for ch in 0..c {
            vf[v as usize * c + ch] = vf[v as usize * c + ch].max(feats[i * c + ch]);
        }
    }
    let gvf = rng.floats(m * c);
    let inputs = vec![
        ("grad_voxel_feats", Tensor::f32([m, c], gvf)),
        ("feats", Tensor::f32([n, c], feats)),
        ("voxel_feats", Tensor::f32([m, c], vf)),
        ("point2voxel_map", Tensor::i32([n], map)),
        ("voxel_points_count", Tensor::i32([m], count)),
    ];
    let bytes = inputs.iter().map(|(_, t)| bytes_of(t)).sum::<usize>() + n * c * 4;
    let ins: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    // Each kept point's row meets its voxel's row.
    let idx = i32s(&ins[3]).iter().filter(|&&v| v >= 0).map(|&v| v as u32).collect();
    Case {
        access: Some(Access { idx, fan: 1, row: c, table: m }),
        op: "DynamicScatterBackward",
        shapes: format!("max N {n} M {m} C {c}"),
        attrs: attrs(&[("reduce_type", AttrValue::String("max".into()))]),
        inputs,
        bytes,
        unread: 0,
        naive: Box::new(move || {
            vec![OwnedData::F32(naive::dynamic_scatter_backward_max(
                f32s(&ins[0]),
                f32s(&ins[1]),
                f32s(&ins[2]),
                i32s(&ins[3]),
                c,
            ))]
        }),
        exact: true,
    }
}

/// Points over `m` distinct voxels (x, y, z coordinates of a 1440 x 1440 x 41 grid), every
/// voxel holding at least one point, 1% of points dropped (a negative coordinate).
pub(super) fn dynamic_scatter(rng: &mut Rng, [n, m, c]: [usize; 3], reduce: &'static str) -> Case {
    let mut seen = HashSet::new();
    let mut cells = Vec::with_capacity(m);
    while cells.len() < m {
        let cell = [rng.below(1440) as i32, rng.below(1440) as i32, rng.below(41) as i32];
        if seen.insert(cell) {
            cells.push(cell);
        }
    }
    let mut map: Vec<usize> =
        (0..n).map(|i| if i < m { i } else { rng.below(m as u64) as usize }).collect();
    for i in (1..n).rev() {
        map.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let coors: Vec<i32> = map
        .iter()
        .flat_map(|&v| if rng.below(100) == 0 { [-1, -1, -1] } else { cells[v] })
        .collect();
    let inputs = vec![
        ("feats", Tensor::f32([n, c], rng.floats(n * c))),
        ("coors", Tensor::i32([n, 3], coors)),
    ];
    // voxel_feats, voxel_coors, point2voxel_map and voxel_points_count written.
    let bytes =
        inputs.iter().map(|(_, t)| bytes_of(t)).sum::<usize>() + (m * c + m * 3 + n + m) * 4;
    let ins: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    // Each kept point's row meets its voxel's row.
    let kept = i32s(&ins[1])
        .chunks_exact(3)
        .zip(&map)
        .filter(|(row, _)| row[0] >= 0)
        .map(|(_, &v)| v as u32)
        .collect();
    Case {
        access: Some(Access { idx: kept, fan: 1, row: c, table: m }),
        op: "DynamicScatter",
        shapes: format!("{reduce} N {n} M {m} C {c}"),
        attrs: attrs(&[("reduce_type", AttrValue::String(reduce.into()))]),
        inputs,
        bytes,
        unread: 0,
        naive: Box::new(move || {
            let (vf, vc, map, count) =
                naive::dynamic_scatter(f32s(&ins[0]), i32s(&ins[1]), c, reduce);
            let voxels = count.len() as i32;
            vec![
                OwnedData::F32(vf),
                OwnedData::I32(vc),
                OwnedData::I32(map),
                OwnedData::I32(count),
                OwnedData::I32(vec![voxels]),
            ]
        }),
        exact: true,
    }
}

/// ThreeInterpolate (features [B, C, M] in, [B, C, N] out) or, `backward`, its gradient
/// (grad_output [B, C, N] in, [B, C, M] out). `half`: float16 data, weights and output
/// (computed in float32 and rounded once, as the contract says; the naive loops do the same
/// on the widened values).
pub(super) fn three_interpolate(
    rng: &mut Rng,
    [b, c, n, m]: [usize; 4],
    half: bool,
    backward: bool,
) -> Case {
    let (len_in, len_out) = if backward { (n, m) } else { (m, n) };
    let data = rng.floats(b * c * len_in);
    let idx: Vec<i32> = (0..b * n * 3).map(|_| rng.below(m as u64) as i32).collect();
    let w: Vec<f32> = (0..b * n * 3).map(|_| rng.unit().abs()).collect();
    let float = |shape: [usize; 3], v: Vec<f32>| {
        if half {
            Tensor::f16(shape, v.into_iter().map(f16::from_f32).collect())
        } else {
            Tensor::f32(shape, v)
        }
    };
    let data_name = if backward { "grad_output" } else { "features" };
    let inputs = vec![
        (data_name, float([b, c, len_in], data)),
        ("indices", Tensor::i32([b, n, 3], idx)),
        ("weights", float([b, n, 3], w)),
    ];
    let bytes = inputs.iter().map(|(_, t)| bytes_of(t)).sum::<usize>()
        + b * c * len_out * if half { 2 } else { 4 };
    let ins: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    // Each point's C values meet its three source points' (read forward, added to backward;
    // a channel-major layout strides the same rows).
    let idx = i32s(&ins[1])
        .iter()
        .enumerate()
        .map(|(k, &j)| (k / (3 * n) * m) as u32 + j as u32)
        .collect();
    Case {
        access: Some(Access { idx, fan: 3, row: c, table: b * m }),
        op: if backward { "ThreeInterpolateBackward" } else { "ThreeInterpolate" },
        shapes: format!("{} B {b} C {c} N {n} M {m}", if half { "f16" } else { "f32" }),
        attrs: if backward { attrs(&[("m", AttrValue::Int(m as i64))]) } else { HashMap::new() },
        inputs,
        bytes,
        unread: 0,
        naive: Box::new(move || {
            let (data, idx, w) = (widened(&ins[0].data), i32s(&ins[1]), widened(&ins[2].data));
            let out = if backward {
                naive::three_interpolate_backward(&data, idx, &w, [b, c, n, m])
            } else {
                naive::three_interpolate(&data, idx, &w, [b, c, m, n])
            };
            vec![if half {
                OwnedData::F16(out.into_iter().map(f16::from_f32).collect())
            } else {
                OwnedData::F32(out)
            }]
        }),
        // The backward op accumulates; the forward one is three products and two sums.
        exact: !half && !backward,
    }
}

/// Distinct sites: lidar-like clusters (subm) or uniform (strided), as (batch, z, y, x).
fn sites(rng: &mut Rng, l: usize, batch: u64, spatial: [u64; 3], clustered: bool) -> Vec<i32> {
    let mut seen = HashSet::with_capacity(l);
    let mut out = Vec::with_capacity(l * 4);
    let mut centre = [0u64; 4];
    while seen.len() < l {
        let s = if clustered {
            if rng.below(64) == 0 || seen.is_empty() {
                centre = [
                    rng.below(batch),
                    rng.below(spatial[0]),
                    rng.below(spatial[1]),
                    rng.below(spatial[2]),
                ];
            }
            let jitter = |rng: &mut Rng, c: u64, r: u64, hi: u64| {
                (c + rng.below(2 * r + 1)).saturating_sub(r).min(hi - 1)
            };
            [
                centre[0],
                jitter(rng, centre[1], 2, spatial[0]),
                jitter(rng, centre[2], 6, spatial[1]),
                jitter(rng, centre[3], 6, spatial[2]),
            ]
        } else {
            [rng.below(batch), rng.below(spatial[0]), rng.below(spatial[1]), rng.below(spatial[2])]
        };
        if seen.insert(s) {
            out.extend(s.map(|v| v as i32));
        }
    }
    out
}

pub(super) fn get_indice_pairs(rng: &mut Rng, subm: bool) -> Case {
    let (l, spatial, stride, pad) = if subm {
        (248_636, [41, 1440, 1440], [1; 3], [1; 3])
    } else {
        (149_100, [11, 360, 360], [2; 3], [0, 1, 1])
    };
    let idx = sites(rng, l, 4, spatial.map(|v| v as u64), subm);
    let inputs = vec![("indices", Tensor::i32([l, 4], idx))];
    let ins: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    let k = 27;
    Case {
        access: None,
        op: "GetIndicePairs",
        shapes: format!(
            "{} L {l} {}x{}x{} s{}",
            if subm { "subm" } else { "conv" },
            spatial[0],
            spatial[1],
            spatial[2],
            stride[0]
        ),
        attrs: attrs(&[
            ("batch_size", AttrValue::Int(4)),
            ("spatial_shape", AttrValue::Ints(spatial.to_vec())),
            ("kernel_size", AttrValue::Ints(vec![3; 3])),
            ("stride", AttrValue::Ints(stride.to_vec())),
            ("padding", AttrValue::Ints(pad.to_vec())),
            ("subm", AttrValue::Int(subm as i64)),
        ]),
        inputs,
        // indices read; pairs, out_indices (bounded by L here) and counts written.
        bytes: l * 16 + k * 2 * l * 4 + l * 16 + k * 4,
        unread: 0,
        naive: Box::new(move || {
            let (pairs, outs, num) =
                naive::get_indice_pairs(i32s(&ins[0]), spatial, [3; 3], stride, pad, subm);
            vec![OwnedData::I32(pairs), OwnedData::I32(outs), OwnedData::I32(num)]
        }),
        exact: true,
    }
}

/// BEVDepth's voxel pooling: B 2 is the seed scale, B 1 its inference batch.
/// Where the points of a VoxelPoolingForward row land in the 128 x 128 x 1 grid.
#[derive(Clone, Copy)]
pub(super) enum Geometry {
    /// Uniformly random cells (about 97% inside the grid): no locality at all, the worst case.
    Uniform,
    /// BEVDepth's frustum, in its point order: 6 cameras x 112 depth bins (2-58 m) x 16 x 44
    /// feature pixels, each pixel's ray cast into a 0.8 m grid over [-51.2, 51.2) m. Points
    /// next to each other in memory (neighbouring pixels, same depth) land in nearby cells.
    Frustum,
}

/// The (x, y, z) cell of every point of one batch in BEVDepth's frustum (see `Geometry`).
fn frustum_cells(rng: &mut Rng) -> Vec<i32> {
    let (cams, depths, h, w) = (6, 112, 16, 44);
    let mut cells = Vec::with_capacity(cams * depths * h * w * 3);
    // Each camera's yaw jitters a little, as calibrations do.
    let yaws: Vec<f32> = (0..cams)
        .map(|k| k as f32 * std::f32::consts::TAU / cams as f32 + rng.unit() * 0.05)
        .collect();
    for &yaw in &yaws {
        for d in 0..depths {
            let depth = 2.0 + 0.5 * d as f32;
            for row in 0..h {
                // About 30 degrees of elevation, the camera 1.5 m above ground.
                let z = 1.5 - depth * ((row as f32 / (h - 1) as f32 - 0.5) * 0.52).tan();
                for col in 0..w {
                    // About 70 degrees of azimuth per camera.
                    let az = yaw + (col as f32 / (w - 1) as f32 - 0.5) * 1.22;
                    let (x, y) = (depth * az.cos(), depth * az.sin());
                    cells.extend([
                        ((x + 51.2) / 0.8).floor() as i32,
                        ((y + 51.2) / 0.8).floor() as i32,
                        ((z + 5.0) / 8.0).floor() as i32,
                    ]);
                }
            }
        }
    }
    cells
}

pub(super) fn voxel_pooling_forward(rng: &mut Rng, b: usize, geometry: Geometry) -> Case {
    let (n, c) = (473_088usize, 80usize);
    let (nx, ny, nz) = (128i32, 128i32, 1i32);
    let geom: Vec<i32> = match geometry {
        Geometry::Uniform => (0..b * n)
            .flat_map(|_| {
                [rng.below(132) as i32 - 2, rng.below(132) as i32 - 2, (rng.below(50) == 0) as i32]
            })
            .collect(),
        Geometry::Frustum => (0..b).flat_map(|_| frustum_cells(rng)).collect(),
    };
    debug_assert_eq!(geom.len(), b * n * 3);
    let outside = geom
        .chunks_exact(3)
        .filter(|p| {
            !(0..nx).contains(&p[0]) || !(0..ny).contains(&p[1]) || !(0..nz).contains(&p[2])
        })
        .count();
    let unread = outside * c * 4;
    let inputs = vec![
        ("geom_xyz", Tensor::i32([b, n, 3], geom)),
        ("input_features", Tensor::f32([b, n, c], rng.floats(b * n * c))),
    ];
    let bytes = inputs.iter().map(|(_, t)| bytes_of(t)).sum::<usize>() - unread
        + b * (nx * ny) as usize * c * 4
        + b * n * 12;
    let ins: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    // Each in-grid point's row is added to its cell's.
    let cells = (nx * ny) as usize;
    let idx = i32s(&ins[0])
        .chunks_exact(3)
        .enumerate()
        .filter(|(_, p)| {
            (0..nx).contains(&p[0]) && (0..ny).contains(&p[1]) && (0..nz).contains(&p[2])
        })
        .map(|(i, p)| (i / n * cells + (p[1] * nx + p[0]) as usize) as u32)
        .collect();
    Case {
        access: Some(Access { idx, fan: 1, row: c, table: b * cells }),
        op: "VoxelPoolingForward",
        shapes: format!(
            "B {b} N {n} C {c} grid {nx}x{ny}x{nz}{}",
            match geometry {
                Geometry::Uniform => "",
                Geometry::Frustum => " frustum",
            }
        ),
        attrs: attrs(&[("voxel_num", AttrValue::Ints(vec![nx as i64, ny as i64, nz as i64]))]),
        inputs,
        bytes,
        unread,
        naive: Box::new(move || {
            vec![OwnedData::F32(naive::voxel_pooling_forward(
                i32s(&ins[0]),
                f32s(&ins[1]),
                [b, n, c],
                [nx, ny, nz],
            ))]
        }),
        exact: false,
    }
}

/// `r` rois of a random batch, each from a random corner up to half the input's size on.
fn rois(rng: &mut Rng, r: usize, nb: usize, [h, w]: [usize; 2], scale: f32) -> Vec<f32> {
    (0..r)
        .flat_map(|_| {
            let (x1, y1) =
                (rng.unit().abs() * w as f32 / scale, rng.unit().abs() * h as f32 / scale);
            let (x2, y2) = (
                x1 + rng.unit().abs() * w as f32 / scale / 2.0,
                y1 + rng.unit().abs() * h as f32 / scale / 2.0,
            );
            [rng.below(nb as u64) as f32, x1, y1, x2, y2]
        })
        .collect()
}

fn psroipool_attrs(pooled: usize, od: usize, scale: f32) -> HashMap<String, AttrValue> {
    attrs(&[
        ("pooled_height", AttrValue::Int(pooled as i64)),
        ("pooled_width", AttrValue::Int(pooled as i64)),
        ("spatial_scale", AttrValue::Float(scale)),
        ("output_dim", AttrValue::Int(od as i64)),
    ])
}

pub(super) fn psroipool(
    rng: &mut Rng,
    r: usize,
    pooled: usize,
    od: usize,
    bottom: [usize; 4],
    scale: f32,
) -> Case {
    let [nb, h, w, ch] = bottom;
    let e = r * pooled * pooled * od;
    let inputs = vec![
        ("input", Tensor::f32(bottom, rng.floats(nb * h * w * ch))),
        ("rois", Tensor::f32([r, 5], rois(rng, r, nb, [h, w], scale))),
    ];
    // output and mapping_channel written.
    let bytes = inputs.iter().map(|(_, t)| bytes_of(t)).sum::<usize>() + e * 8;
    let ins: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    Case {
        access: None,
        op: "PsRoiPool",
        shapes: format!("R {r} {pooled}x{pooled}x{od} bottom {nb}x{h}x{w}x{ch}"),
        attrs: psroipool_attrs(pooled, od, scale),
        inputs,
        bytes,
        unread: 0,
        naive: Box::new(move || {
            let (out, mapping) =
                naive::psroipool(f32s(&ins[0]), f32s(&ins[1]), bottom, pooled, od, scale);
            vec![OwnedData::F32(out), OwnedData::I32(mapping)]
        }),
        exact: false,
    }
}

pub(super) fn psroipool_backward(
    rng: &mut Rng,
    r: usize,
    pooled: usize,
    od: usize,
    bottom: [usize; 4],
    scale: f32,
) -> Case {
    let [nb, h, w, ch] = bottom;
    let e = r * pooled * pooled * od;
    let rois = rois(rng, r, nb, [h, w], scale);
    let mapping: Vec<i32> = (0..e).map(|_| rng.below(ch as u64) as i32).collect();
    let inputs = vec![
        ("top_grad", Tensor::f32([r, pooled, pooled, od], rng.floats(e))),
        ("rois", Tensor::f32([r, 5], rois)),
        ("mapping_channel", Tensor::i32([r, pooled, pooled, od], mapping)),
        ("bottom_shape", Tensor::i64([4], bottom.map(|v| v as i64).to_vec())),
    ];
    let bytes = inputs.iter().map(|(_, t)| bytes_of(t)).sum::<usize>() + nb * h * w * ch * 4;
    let ins: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    Case {
        access: None,
        op: "PsRoiPoolBackward",
        shapes: format!("R {r} {pooled}x{pooled}x{od} bottom {nb}x{h}x{w}x{ch}"),
        attrs: psroipool_attrs(pooled, od, scale),
        inputs,
        bytes,
        unread: 0,
        naive: Box::new(move || {
            vec![OwnedData::F32(naive::psroipool_backward(
                f32s(&ins[0]),
                f32s(&ins[1]),
                i32s(&ins[2]),
                bottom,
                pooled,
                od,
                scale,
            ))]
        }),
        exact: false,
    }
}
