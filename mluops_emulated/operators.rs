//! The operator functions of the emulated MLU-OPS library: each function's documented
//! parameter checks (docs/MLUOPS_BINDING.md, "checks"), then the crate's CPU kernel.

use super::*;
use onnxruntime_ep_mlu::ops::{
    dynamic_scatter, psroipool, sparse_conv, three_interpolate, voxel_pooling,
};

use onnxruntime_ep_mlu::mlu::NRAM_RESERVED_BYTES;

/// The vendor kernels' NRAM on MLU370: MAX_NRAM_SIZE of mlu-ops kernels/kernel.h (tag
/// v1.4.0, beside REM_FOR_STACK at line 67), the core's 768 KiB less the stack. It bounds
/// DynamicPointToVoxelBackward's 5N + 20C + 4 bytes and PsRoiPoolForward's passes. The
/// vendor's figure, kept apart from our kernels' `NRAM_BUDGET` (equal today): a change to
/// our budget must not move the model of their library.
const VENDOR_MAX_NRAM: usize = 768 * 1024 - NRAM_RESERVED_BYTES as usize;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpGetDynamicPointToVoxelBackwardWorkspaceSize(
    h: *mut c_void,
    reduce: c_int,
    grad_voxel_feats: *mut c_void,
    feats: *mut c_void,
    voxel_feats: *mut c_void,
    map: *mut c_void,
    count: *mut c_void,
    voxel_num: *mut c_void,
    size: *mut usize,
) -> Status {
    guarded("mluOpGetDynamicPointToVoxelBackwardWorkspaceSize", || {
        let _h = handle(h)?;
        require(!size.is_null(), BAD_PARAM, || "workspace_size is null".into())?;
        let (n, _) = dpv_backward_check(
            reduce,
            grad_voxel_feats,
            feats,
            voxel_feats,
            map,
            count,
            voxel_num,
        )?;
        let c = desc(feats, "feats")?.dims[1];
        // SAFETY: the caller's out-pointer.
        unsafe { *size = n * c * 4 };
        Ok(())
    })
}
const _: exports::mluOpGetDynamicPointToVoxelBackwardWorkspaceSize =
    mluOpGetDynamicPointToVoxelBackwardWorkspaceSize;

/// The shared checks of the two DynamicPointToVoxelBackward functions: (N, M).
fn dpv_backward_check(
    reduce: c_int,
    grad_voxel_feats: *mut c_void,
    feats: *mut c_void,
    voxel_feats: *mut c_void,
    map: *mut c_void,
    count: *mut c_void,
    voxel_num: *mut c_void,
) -> Result<(usize, usize), Status> {
    require(reduce == REDUCE_MAX, NOT_SUPPORTED, || {
        format!("reduce_type {reduce}: only max is supported")
    })?;
    let f = desc(feats, "feats")?;
    require(f.dims.len() == 2 && f.dtype == DTYPE_FLOAT, BAD_PARAM, || {
        "feats: float [N, C]".into()
    })?;
    let (n, c) = (f.dims[0], f.dims[1]);
    let g = desc(grad_voxel_feats, "grad_voxel_feats")?;
    require(g.dims.len() == 2 && g.dims[1] == c, BAD_PARAM, || {
        "grad_voxel_feats: float [M, C]".into()
    })?;
    let m = g.dims[0];
    expect(g, "grad_voxel_feats", DTYPE_FLOAT, &[m, c])?;
    expect(desc(voxel_feats, "voxel_feats")?, "voxel_feats", DTYPE_FLOAT, &[m, c])?;
    expect(desc(map, "point2voxel_map")?, "point2voxel_map", DTYPE_INT32, &[n])?;
    expect(desc(count, "voxel_points_count")?, "voxel_points_count", DTYPE_INT32, &[m])?;
    expect(desc(voxel_num, "voxel_num")?, "voxel_num", DTYPE_INT32, &[1])?;
    require(n >= m, BAD_PARAM, || format!("N = {n} < M = {m}"))?;
    require(5 * n + 20 * c + 4 <= VENDOR_MAX_NRAM, BAD_PARAM, || {
        format!("N = {n}, C = {c} exceed the NRAM bound")
    })?;
    Ok((n, m))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpDynamicPointToVoxelBackward(
    h: *mut c_void,
    reduce: c_int,
    grad_voxel_feats_desc: *mut c_void,
    grad_voxel_feats: *const c_void,
    feats_desc: *mut c_void,
    feats: *const c_void,
    voxel_feats_desc: *mut c_void,
    voxel_feats: *const c_void,
    map_desc: *mut c_void,
    map: *const c_void,
    count_desc: *mut c_void,
    count: *const c_void,
    voxel_num_desc: *mut c_void,
    voxel_num: *const c_void,
    workspace: *mut c_void,
    workspace_size: usize,
    grad_feats_desc: *mut c_void,
    grad_feats: *mut c_void,
) -> Status {
    guarded("mluOpDynamicPointToVoxelBackward", || {
        let _h = handle(h)?;
        let (n, _) = dpv_backward_check(
            reduce,
            grad_voxel_feats_desc,
            feats_desc,
            voxel_feats_desc,
            map_desc,
            count_desc,
            voxel_num_desc,
        )?;
        let f = desc(feats_desc, "feats")?;
        let c = f.dims[1];
        expect(desc(grad_feats_desc, "grad_feats")?, "grad_feats", DTYPE_FLOAT, &[n, c])?;
        require(
            workspace_size >= n * c * 4 && (n * c == 0 || !workspace.is_null()),
            BAD_PARAM,
            || format!("workspace of {workspace_size} bytes where {} are required", n * c * 4),
        )?;
        if n * c == 0 {
            return Ok(());
        }
        let inputs = [
            tensor(desc(grad_voxel_feats_desc, "")?, grad_voxel_feats, "grad_voxel_feats")?,
            tensor(f, feats, "feats")?,
            tensor(desc(voxel_feats_desc, "")?, voxel_feats, "voxel_feats")?,
            tensor(desc(map_desc, "")?, map, "point2voxel_map")?,
            tensor(desc(count_desc, "")?, count, "voxel_points_count")?,
            tensor(desc(voxel_num_desc, "")?, voxel_num, "voxel_num")?,
        ];
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
        let out = compute::<dynamic_scatter::DynamicScatterBackward>(
            attrs(vec![("reduce_type", AttrValue::String("max".into()))]),
            &refs,
        )?;
        store(&out[0], grad_feats, "grad_feats")
    })
}
const _: exports::mluOpDynamicPointToVoxelBackward = mluOpDynamicPointToVoxelBackward;

/// The dims of a ThreeInterpolate tensor of 3 dimensions, ARRAY layout, half or float
/// (three_interpolate.cpp:273-287 at v1.4.0); `what` names it and its shape.
fn real_array3(d: &TensorDesc, what: &str) -> Result<[usize; 3], Status> {
    require(d.dims.len() == 3 && d.layout == LAYOUT_ARRAY, BAD_PARAM, || {
        format!("{what}, ARRAY layout")
    })?;
    require(matches!(d.dtype, DTYPE_FLOAT | DTYPE_HALF), BAD_PARAM, || {
        format!("{what}: half or float")
    })?;
    Ok([d.dims[0], d.dims[1], d.dims[2]])
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpThreeInterpolateBackward(
    h: *mut c_void,
    grad_output_desc: *mut c_void,
    grad_output: *const c_void,
    indices_desc: *mut c_void,
    indices: *const c_void,
    weights_desc: *mut c_void,
    weights: *const c_void,
    grad_features_desc: *mut c_void,
    grad_features: *mut c_void,
) -> Status {
    guarded("mluOpThreeInterpolateBackward", || {
        let _h = handle(h)?;
        let g = desc(grad_output_desc, "grad_output")?;
        let [b, c, n] = real_array3(g, "grad_output: [B, C, N]")?;
        let gf = desc(grad_features_desc, "grad_features")?;
        require(gf.dims.len() == 3, BAD_PARAM, || "grad_features: [B, C, M]".into())?;
        let m = gf.dims[2];
        expect(gf, "grad_features", g.dtype, &[b, c, m])?;
        expect(desc(indices_desc, "indices")?, "indices", DTYPE_INT32, &[b, n, 3])?;
        expect(desc(weights_desc, "weights")?, "weights", g.dtype, &[b, n, 3])?;
        // Zero elements in any tensor but grad_features' M: BAD_PARAM (the caller skips the
        // call); M == 0 alone: success with nothing written.
        require(b * c * n > 0, BAD_PARAM, || {
            "zero elements in grad_output, indices or weights".into()
        })?;
        if m == 0 {
            return Ok(());
        }
        let inputs = [
            tensor(g, grad_output, "grad_output")?,
            tensor(desc(indices_desc, "")?, indices, "indices")?,
            tensor(desc(weights_desc, "")?, weights, "weights")?,
        ];
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
        let out = compute::<three_interpolate::ThreeInterpolateBackward>(
            attrs(vec![("m", AttrValue::Int(m as i64))]),
            &refs,
        )?;
        store(&out[0], grad_features, "grad_features")
    })
}
const _: exports::mluOpThreeInterpolateBackward = mluOpThreeInterpolateBackward;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpThreeInterpolateForward(
    h: *mut c_void,
    features_desc: *mut c_void,
    features: *const c_void,
    indices_desc: *mut c_void,
    indices: *const c_void,
    weights_desc: *mut c_void,
    weights: *const c_void,
    output_desc: *mut c_void,
    output: *mut c_void,
) -> Status {
    guarded("mluOpThreeInterpolateForward", || {
        let _h = handle(h)?;
        let f = desc(features_desc, "features")?;
        let [b, c, m] = real_array3(f, "features: [B, C, M]")?;
        let i = desc(indices_desc, "indices")?;
        require(i.dims.len() == 3 && i.dims[0] == b && i.dims[2] == 3, BAD_PARAM, || {
            "indices: int32 [B, N, 3]".into()
        })?;
        let n = i.dims[1];
        expect(i, "indices", DTYPE_INT32, &[b, n, 3])?;
        expect(desc(weights_desc, "weights")?, "weights", f.dtype, &[b, n, 3])?;
        expect(desc(output_desc, "output")?, "output", f.dtype, &[b, c, n])?;
        for d in [f, i] {
            require(d.numel() < 1 << 31, NOT_SUPPORTED, || {
                format!("{} elements (2^31 or more)", d.numel())
            })?;
        }
        require(b * c * n < 1 << 31 && b * n * 3 < 1 << 31, NOT_SUPPORTED, || {
            "output or weights of 2^31 elements or more".into()
        })?;
        // Zero elements in indices, weights or output: BAD_PARAM (three_interpolate.cpp:339-344
        // at v1.4.0; the caller skips the call); M == 0 alone: success, nothing written.
        require(b * c * n > 0, BAD_PARAM, || "zero elements in indices, weights or output".into())?;
        if m == 0 {
            return Ok(());
        }
        let inputs = [
            tensor(f, features, "features")?,
            tensor(i, indices, "indices")?,
            tensor(desc(weights_desc, "")?, weights, "weights")?,
        ];
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
        let out = compute::<three_interpolate::ThreeInterpolate>(attrs(Vec::new()), &refs)?;
        store(&out[0], output, "output")
    })
}
const _: exports::mluOpThreeInterpolateForward = mluOpThreeInterpolateForward;

fn sparse<'a>(d: *mut c_void) -> Result<&'a mut SparseConv, Status> {
    require(!d.is_null(), BAD_PARAM, || "sparse_conv_desc is null".into())?;
    // SAFETY: made by mluOpCreateSparseConvolutionDescriptor; used by one call at a time.
    let s = unsafe { &mut *(d as *mut SparseConv) };
    require(s.set, BAD_PARAM, || "sparse_conv_desc was never set".into())?;
    Ok(s)
}

/// GetIndicePairs' checks, shared by its two functions: (L, K).
fn gip_check(
    s: &SparseConv,
    indices: *mut c_void,
    pairs: *mut c_void,
    out: *mut c_void,
    num: *mut c_void,
) -> Result<(usize, usize), Status> {
    let i = desc(indices, "indices")?;
    require(i.dims.len() == 2 && i.dims[1] == 4, BAD_PARAM, || "indices: int32 [L, 4]".into())?;
    let l = i.dims[0];
    expect(i, "indices", DTYPE_INT32, &[l, 4])?;
    // The vendor holds batch * output volume + 1 and batch * input volume in int
    // (normal_get_indice_pairs.cpp:205-208, 841 at v1.4.0): beyond it, undefined there.
    let volume = |space: &[i32; 3]| space.iter().fold(s.batch as u128, |a, &d| a * d as u128);
    require(
        volume(&s.output) < i32::MAX as u128 && volume(&s.input) <= i32::MAX as u128,
        BAD_PARAM,
        || "batch * output or input volume overflows the vendor's int grid".into(),
    )?;
    let grid = s.input.iter().fold(s.batch as usize, |a, &d| a * d as usize);
    require(l <= grid, BAD_PARAM, || format!("L = {l} beyond batch * input volume = {grid}"))?;
    let k: usize = s.filter.iter().map(|&x| x as usize).product();
    require(k <= 4096, NOT_SUPPORTED, || format!("K = {k} beyond 4096"))?;
    require(l <= 1_000_000, NOT_SUPPORTED, || format!("L = {l} beyond 1,000,000"))?;
    expect(desc(pairs, "indice_pairs")?, "indice_pairs", DTYPE_INT32, &[k, 2, l])?;
    let o = desc(out, "out_indices")?;
    require(o.dims.len() == 2 && o.dims[1] == 4 && o.dtype == DTYPE_INT32, BAD_PARAM, || {
        "out_indices: int32 [num_act_out_bound, 4]".into()
    })?;
    expect(desc(num, "indice_num")?, "indice_num", DTYPE_INT32, &[k])?;
    Ok((l, k))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpGetIndicePairsWorkspaceSize(
    h: *mut c_void,
    sc: *mut c_void,
    indices: *mut c_void,
    pairs: *mut c_void,
    out: *mut c_void,
    num: *mut c_void,
    size: *mut usize,
) -> Status {
    guarded("mluOpGetIndicePairsWorkspaceSize", || {
        let _h = handle(h)?;
        require(!size.is_null(), BAD_PARAM, || "workspace_size is null".into())?;
        let (l, k) = gip_check(sparse(sc)?, indices, pairs, out, num)?;
        // A stand-in size: one int32 per (offset, site) pair, as a sort of the keys would take.
        // SAFETY: the caller's out-pointer.
        unsafe { *size = (k * l + 1) * 4 };
        Ok(())
    })
}
const _: exports::mluOpGetIndicePairsWorkspaceSize = mluOpGetIndicePairsWorkspaceSize;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpGetIndicePairs(
    h: *mut c_void,
    sc: *mut c_void,
    indices_desc: *mut c_void,
    indices: *const c_void,
    workspace: *mut c_void,
    workspace_size: usize,
    pairs_desc: *mut c_void,
    pairs: *mut c_void,
    out_desc: *mut c_void,
    out: *mut c_void,
    num_desc: *mut c_void,
    num: *mut c_void,
) -> Status {
    guarded("mluOpGetIndicePairs", || {
        let _h = handle(h)?;
        let s = sparse(sc)?;
        let (l, k) = gip_check(s, indices_desc, pairs_desc, out_desc, num_desc)?;
        require(workspace_size >= (k * l + 1) * 4 && !workspace.is_null(), BAD_PARAM, || {
            "workspace too small".into()
        })?;
        if l == 0 {
            return Ok(());
        }
        let input = tensor(desc(indices_desc, "")?, indices, "indices")?;
        let at = |a: [i32; 3]| ints(&a);
        let result = compute::<sparse_conv::GetIndicePairs>(
            attrs(vec![
                ("batch_size", AttrValue::Int(i64::from(s.batch))),
                ("spatial_shape", at(s.input)),
                ("kernel_size", at(s.filter)),
                ("stride", at(s.stride)),
                ("padding", at(s.pad)),
                ("dilation", at(s.dilation)),
                ("subm", AttrValue::Int(i64::from(s.sub_m))),
            ]),
            &[Some(&input)],
        )?;
        let bound = desc(out_desc, "")?.dims[0];
        let mut found = result[1].shape[0];
        require(found <= bound, EXECUTION_FAILED, || {
            format!("{found} output sites do not fit out_indices of {bound} rows")
        })?;
        let mut book = result[0].data.clone();
        // The vendor's count (normal_get_indice_pairs.cpp:1059-1061 at v1.4.0) drops one
        // site whenever every (site, offset) pair is valid but the sites repeat: the last
        // site is lost and its pairs' output slots read -1.
        let OwnedData::I32(nums) = &result[2].data else {
            return Err(fail(INTERNAL_ERROR, "indice_num type"));
        };
        let valid: usize = nums.iter().map(|&n| n as usize).sum();
        if s.sub_m == 0 && valid == k * l && found < k * l && found > 0 {
            found -= 1;
            if let OwnedData::I32(p) = &mut book {
                for kk in 0..k {
                    for slot in &mut p[(2 * kk + 1) * l..(2 * kk + 2) * l] {
                        if *slot == found as i32 {
                            *slot = -1;
                        }
                    }
                }
            }
        }
        store(&Tensor { shape: result[0].shape.clone(), data: book }, pairs, "indice_pairs")?;
        let OwnedData::I32(sites) = &result[1].data else {
            return Err(fail(INTERNAL_ERROR, "out_indices type"));
        };
        write(out, &sites[..found * 4], "out_indices")?;
        store(&result[2], num, "indice_num")?;
        // In sub_m mode the vendor library never writes num_act_out (the caller uses L).
        if s.sub_m == 0 {
            s.num_act_out = found as i32;
        }
        Ok(())
    })
}
const _: exports::mluOpGetIndicePairs = mluOpGetIndicePairs;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpVoxelPoolingForward(
    h: *mut c_void,
    batch: c_int,
    points: c_int,
    channels: c_int,
    nx: c_int,
    ny: c_int,
    nz: c_int,
    geom_desc: *mut c_void,
    geom: *const c_void,
    feats_desc: *mut c_void,
    feats: *const c_void,
    out_desc: *mut c_void,
    out: *mut c_void,
    pos_desc: *mut c_void,
    pos: *mut c_void,
) -> Status {
    guarded("mluOpVoxelPoolingForward", || {
        let _h = handle(h)?;
        // Every integer argument must be positive: no zero-element path.
        require([batch, points, channels, nx, ny, nz].iter().all(|&v| v > 0), BAD_PARAM, || {
            "every size must be > 0".into()
        })?;
        let [b, n, c, x, y] = [batch, points, channels, nx, ny].map(|v| v as usize);
        let g = desc(geom_desc, "geom_xyz")?;
        expect(g, "geom_xyz", DTYPE_INT32, &[b, n, 3])?;
        let f = desc(feats_desc, "input_features")?;
        expect(f, "input_features", DTYPE_FLOAT, &[b, n, c])?;
        expect(desc(out_desc, "output_features")?, "output_features", DTYPE_FLOAT, &[b, y, x, c])?;
        expect(desc(pos_desc, "pos_memo")?, "pos_memo", DTYPE_INT32, &[b, n, 3])?;
        let inputs = [tensor(g, geom, "geom_xyz")?, tensor(f, feats, "input_features")?];
        let result = compute::<voxel_pooling::VoxelPoolingForward>(
            attrs(vec![("voxel_num", ints(&[nx, ny, nz]))]),
            &[Some(&inputs[0]), Some(&inputs[1])],
        )?;
        store(&result[0], out, "output_features")?;
        store(&result[1], pos, "pos_memo")
    })
}
const _: exports::mluOpVoxelPoolingForward = mluOpVoxelPoolingForward;

/// The largest bin edge magnitude the vendor kernel converts to int without overflow.
const INT_EDGE: f32 = 2_147_483_520.0;

/// The checks both PsRoiPool functions make (psroipool.cpp:48-145 at v1.4.0) of `[map,
/// rois, pooled, mapping]`: the feature map [batches, h, w, ph*pw*od] and the pooled side
/// [R, ph, pw, od] float NHWC (named `names`), rois float [R, 5], mapping_channel int32 NHWC
/// shaped as the pooled side; ph == pw, od >= 1, scale > 0, every tensor below 2^31 bytes.
/// Returns R.
fn psroi_check(
    d: [&TensorDesc; 4],
    names: [&str; 2],
    [ph, pw, od]: [c_int; 3],
    scale: f32,
) -> Result<usize, Status> {
    let [map, rois, pooled, mapping] = d;
    let ranks = [map, rois, pooled, mapping].map(|t| t.dims.len());
    require(ranks == [4, 2, 4, 4], BAD_PARAM, || {
        format!("{} rank 4, rois rank 2, {} and mapping_channel rank 4", names[0], names[1])
    })?;
    require(
        map.dtype == DTYPE_FLOAT
            && rois.dtype == DTYPE_FLOAT
            && pooled.dtype == DTYPE_FLOAT
            && mapping.dtype == DTYPE_INT32,
        BAD_PARAM,
        || format!("float {}, rois, {}; int32 mapping_channel", names[0], names[1]),
    )?;
    require(
        map.layout == LAYOUT_NHWC && pooled.layout == LAYOUT_NHWC && mapping.layout == LAYOUT_NHWC,
        BAD_PARAM,
        || format!("{}, {} and mapping_channel: NHWC layout", names[0], names[1]),
    )?;
    let r = pooled.dims[0];
    require(
        [ph, pw, od].iter().all(|&v| v >= 1)
            && pooled.dims[1..] == [ph as usize, pw as usize, od as usize],
        BAD_PARAM,
        || format!("pooled sizes and output_dim >= 1 and matching {}", names[1]),
    )?;
    require(ph == pw && scale > 0.0, BAD_PARAM, || {
        "pooled_height == pooled_width, spatial_scale > 0".into()
    })?;
    require(rois.dims == [r, 5] && mapping.dims == pooled.dims, BAD_PARAM, || {
        format!("rois [R, 5], mapping_channel shaped as {}", names[1])
    })?;
    require(map.dims[3] == (ph * pw * od) as usize, BAD_PARAM, || {
        format!("{} channels != output_dim * ph * pw", names[0])
    })?;
    for t in d {
        require(t.numel() * 4 < 1 << 31, NOT_SUPPORTED, || {
            format!("{} bytes (2^31 or more)", t.numel() * 4)
        })?;
    }
    Ok(r)
}

/// What the vendor's PsRoiPool kernel does at a roi whose batch is outside [0, batches).
#[derive(PartialEq)]
enum BadBatch {
    /// The backward kernel skips the roi (modelled: batch NaN, which the CPU kernel skips).
    Skipped,
    /// The forward kernel returns from its roi loop (psroipool_block.mlu:82-84 at v1.4.0):
    /// that core's remaining rois are never written. Undefined there, a failed call here.
    Abandons,
}

/// The rois as the vendor's PsRoiPool kernels read them: coordinates converted with a
/// round-down intrinsic (the reading that differs from the contract: modelled so that the
/// provider's pre-rounding is what makes the results agree), `bad` at an out-of-range batch,
/// and each coordinate (psroipool_block.mlu:35-42), then each bin edge (256-263), converted
/// to int before clamping: beyond the int range, undefined there, a failed call here.
fn vendor_rois(
    rois: &mut [f32],
    batches: usize,
    pooled: [c_int; 2],
    scale: f32,
    bad: BadBatch,
) -> Result<(), Status> {
    for roi in rois.chunks_exact_mut(5) {
        for v in &mut roi[1..] {
            *v = v.floor();
        }
        let b = roi[0];
        if !(b.is_finite() && b.trunc() >= 0.0 && (b.trunc() as usize) < batches) {
            require(bad == BadBatch::Skipped, EXECUTION_FAILED, || {
                format!(
                    "roi {roi:?}: batch id outside [0, {batches}) stops the vendor kernel's remaining rois"
                )
            })?;
            roi[0] = f32::NAN;
            continue;
        }
        require(roi[1..].iter().all(|v| v.abs() < INT_EDGE), EXECUTION_FAILED, || {
            format!(
                "roi {roi:?}: a coordinate outside the int range (undefined in the vendor kernel)"
            )
        })?;
        let (start_w, start_h) = (roi[1] * scale, roi[2] * scale);
        let bin_w = ((roi[3] + 1.0) * scale - start_w).max(0.1) / pooled[1] as f32;
        let bin_h = ((roi[4] + 1.0) * scale - start_h).max(0.1) / pooled[0] as f32;
        let edges = [
            start_w,
            start_h,
            start_w + pooled[1] as f32 * bin_w,
            start_h + pooled[0] as f32 * bin_h,
        ];
        require(
            edges.iter().all(|e| e.is_finite() && e.abs() < INT_EDGE),
            EXECUTION_FAILED,
            || {
                format!(
                    "roi {roi:?}: a bin edge outside the int range (undefined in the vendor kernel)"
                )
            },
        )?;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpPsRoiPoolBackward(
    h: *mut c_void,
    pooled_height: c_int,
    pooled_width: c_int,
    spatial_scale: f32,
    output_dim: c_int,
    top_grad_desc: *mut c_void,
    top_grad: *const c_void,
    rois_desc: *mut c_void,
    rois: *const c_void,
    mapping_desc: *mut c_void,
    mapping: *const c_void,
    bottom_desc: *mut c_void,
    bottom: *mut c_void,
) -> Status {
    guarded("mluOpPsRoiPoolBackward", || {
        let _h = handle(h)?;
        let (t, rd, m, bd) = (
            desc(top_grad_desc, "top_grad")?,
            desc(rois_desc, "rois")?,
            desc(mapping_desc, "mapping_channel")?,
            desc(bottom_desc, "bottom_grad")?,
        );
        let r = psroi_check(
            [bd, rd, t, m],
            ["bottom_grad", "top_grad"],
            [pooled_height, pooled_width, output_dim],
            spatial_scale,
        )?;
        require(r > 0, BAD_PARAM, || "rois has zero elements".into())?;
        if t.numel() == 0 || bd.numel() == 0 {
            return Ok(());
        }
        let mut roi_rows: Vec<f32> = read(rois, r * 5, "rois")?;
        let batches = bd.dims[0];
        vendor_rois(
            &mut roi_rows,
            batches,
            [pooled_height, pooled_width],
            spatial_scale,
            BadBatch::Skipped,
        )?;
        let shape = Tensor {
            shape: vec![4],
            data: OwnedData::I64(bd.dims.iter().map(|&d| d as i64).collect()),
        };
        let inputs = [
            tensor(t, top_grad, "top_grad")?,
            Tensor { shape: vec![r, 5], data: OwnedData::F32(roi_rows) },
            tensor(m, mapping, "mapping_channel")?,
            shape,
        ];
        let result = compute::<psroipool::PsRoiPoolBackward>(
            attrs(vec![
                ("pooled_height", AttrValue::Int(i64::from(pooled_height))),
                ("pooled_width", AttrValue::Int(i64::from(pooled_width))),
                ("spatial_scale", AttrValue::Float(spatial_scale)),
                ("output_dim", AttrValue::Int(i64::from(output_dim))),
            ]),
            &[Some(&inputs[0]), Some(&inputs[1]), Some(&inputs[2]), Some(&inputs[3])],
        )?;
        store(&result[0], bottom, "bottom_grad")
    })
}
const _: exports::mluOpPsRoiPoolBackward = mluOpPsRoiPoolBackward;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpPsRoiPoolForward(
    h: *mut c_void,
    pooled_height: c_int,
    pooled_width: c_int,
    spatial_scale: f32,
    group_size: c_int,
    output_dim: c_int,
    input_desc: *mut c_void,
    input: *const c_void,
    rois_desc: *mut c_void,
    rois: *const c_void,
    output_desc: *mut c_void,
    output: *mut c_void,
    mapping_desc: *mut c_void,
    mapping: *mut c_void,
) -> Status {
    guarded("mluOpPsRoiPoolForward", || {
        let _h = handle(h)?;
        let (i, rd, o, m) = (
            desc(input_desc, "input")?,
            desc(rois_desc, "rois")?,
            desc(output_desc, "output")?,
            desc(mapping_desc, "mapping_channel")?,
        );
        let r = psroi_check(
            [i, rd, o, m],
            ["input", "output"],
            [pooled_height, pooled_width, output_dim],
            spatial_scale,
        )?;
        require(group_size == pooled_height, BAD_PARAM, || "group_size == pooled_height".into())?;
        // The kernel's output channels per NRAM pass (psroipool_block.mlu:199-203 at v1.4.0,
        // MLU370's 640 KiB): 0 is a division by zero there, a failed call here.
        let bins = (group_size as usize * group_size as usize).div_ceil(64) * 64;
        require(VENDOR_MAX_NRAM / ((2 + 2 * bins) * 4) >= 64, EXECUTION_FAILED, || {
            format!(
                "group_size {group_size}: no output channel block fits the vendor kernel's NRAM (division by zero)"
            )
        })?;
        // An empty input is success with nothing written; no rois is BAD_PARAM
        // (psroipool.cpp:132-139 at v1.4.0).
        if i.numel() == 0 {
            return Ok(());
        }
        require(r > 0, BAD_PARAM, || "rois has zero elements".into())?;
        let mut roi_rows: Vec<f32> = read(rois, r * 5, "rois")?;
        let batches = i.dims[0];
        vendor_rois(
            &mut roi_rows,
            batches,
            [pooled_height, pooled_width],
            spatial_scale,
            BadBatch::Abandons,
        )?;
        let inputs = [
            tensor(i, input, "input")?,
            Tensor { shape: vec![r, 5], data: OwnedData::F32(roi_rows) },
        ];
        let result = compute::<psroipool::PsRoiPool>(
            attrs(vec![
                ("pooled_height", AttrValue::Int(i64::from(pooled_height))),
                ("pooled_width", AttrValue::Int(i64::from(pooled_width))),
                ("spatial_scale", AttrValue::Float(spatial_scale)),
                ("output_dim", AttrValue::Int(i64::from(output_dim))),
            ]),
            &[Some(&inputs[0]), Some(&inputs[1])],
        )?;
        store(&result[0], output, "output")?;
        store(&result[1], mapping, "mapping_channel")
    })
}
const _: exports::mluOpPsRoiPoolForward = mluOpPsRoiPoolForward;

/// The checks of IndiceConvolutionForward's two functions (foolProof,
/// indice_convolution_forward.cpp:37-167 at v1.4.0): (L, Cin, Cout, indice_num).
#[allow(clippy::too_many_arguments)]
fn icf_check(
    features: *mut c_void,
    filters: *mut c_void,
    pairs: *mut c_void,
    out: *mut c_void,
    indice_num: *const i64,
    num_act_out: i64,
    inverse: i64,
    sub_m: i64,
) -> Result<(usize, usize, usize, Vec<i64>), Status> {
    let f = desc(features, "features")?;
    let w = desc(filters, "filters")?;
    let p = desc(pairs, "indice_pairs")?;
    let o = desc(out, "features_out")?;
    require(!indice_num.is_null(), BAD_PARAM, || "indice_num is null".into())?;
    require(
        matches!(f.dtype, DTYPE_FLOAT | DTYPE_HALF) && f.dtype == w.dtype && f.dtype == o.dtype,
        BAD_PARAM,
        || "features, filters and features_out: one of half, float".into(),
    )?;
    require(p.dtype == DTYPE_INT32, BAD_PARAM, || "indice_pairs: int32".into())?;
    require(matches!(sub_m, 0 | 1) && matches!(inverse, 0 | 1), BAD_PARAM, || {
        "sub_m and inverse: 0 or 1".into()
    })?;
    require(inverse == 0, NOT_SUPPORTED, || "inverse is not supported".into())?;
    // NDHWC and NCDHW filters are transposed by the vendor: only ARRAY ([kd, kh, kw, Cin,
    // Cout], read as [K][Cin][Cout]) is computed here, the layout the provider passes.
    require(w.layout == LAYOUT_ARRAY, NOT_SUPPORTED, || {
        "filters: the emulated library computes ARRAY layout only".into()
    })?;
    require(f.dims.len() == 2 && p.dims.len() == 3 && o.dims.len() == 2, BAD_PARAM, || {
        "features, indice_pairs, features_out: ranks 2, 3, 2".into()
    })?;
    require(p.dims[2] <= 1_000_000, NOT_SUPPORTED, || {
        format!("indice_pairs' dims[2] = {} beyond 1,000,000", p.dims[2])
    })?;
    require(w.dims.len() == 5, NOT_SUPPORTED, || "filters: 5 dimensions".into())?;
    let (ci, k, co) = (w.dims[3], w.dims[0] * w.dims[1] * w.dims[2], w.dims[4]);
    let l = f.dims[0];
    require(l == p.dims[2] && f.dims[1] == ci, BAD_PARAM, || {
        "features: [indice_pairs' dims[2], Cin]".into()
    })?;
    require(p.dims[0] == k && p.dims[1] == 2, BAD_PARAM, || "indice_pairs: [K, 2, L]".into())?;
    require(
        num_act_out >= 0 && o.dims[0] == num_act_out as usize && o.dims[1] == co,
        BAD_PARAM,
        || "features_out: [num_act_out, Cout]".into(),
    )?;
    // SAFETY: the caller's host array of K values (the API's contract).
    let counts = unsafe { std::slice::from_raw_parts(indice_num, k) }.to_vec();
    require(counts.iter().all(|&n| (0..=l as i64).contains(&n)), BAD_PARAM, || {
        format!("indice_num {counts:?} outside [0, {l}]")
    })?;
    // The vendor sizes its gathered and product blocks as int products (:194-206).
    let most = counts.iter().copied().max().unwrap_or(0) as usize;
    require(most * ci.max(co) * 4 <= i32::MAX as usize, EXECUTION_FAILED, || {
        format!(
            "max indice_num {most} x {}: beyond the vendor's int workspace arithmetic",
            ci.max(co)
        )
    })?;
    Ok((l, ci, co, counts))
}

/// The emulated library's workspace: a gathered block, its product and a scatter result
/// (the vendor's segments, indice_convolution_forward.cpp:199-216, without CNNL's extras).
fn icf_workspace(ci: usize, co: usize, num_act_out: usize, counts: &[i64]) -> usize {
    let most = counts.iter().copied().max().unwrap_or(0) as usize;
    (most * (ci + co) + num_act_out * co) * 4
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpGetIndiceConvolutionForwardWorkspaceSize(
    h: *mut c_void,
    features: *mut c_void,
    filters: *mut c_void,
    pairs: *mut c_void,
    out: *mut c_void,
    indice_num: *const i64,
    num_act_out: i64,
    inverse: i64,
    sub_m: i64,
    size: *mut usize,
) -> Status {
    guarded("mluOpGetIndiceConvolutionForwardWorkspaceSize", || {
        let _h = handle(h)?;
        let (_, ci, co, counts) =
            icf_check(features, filters, pairs, out, indice_num, num_act_out, inverse, sub_m)?;
        // A zero-element tensor: success with *size left unset (as the vendor).
        if [features, filters, pairs, out]
            .iter()
            .any(|&d| desc(d, "").map_or(true, |d| d.numel() == 0))
        {
            return Ok(());
        }
        require(!size.is_null(), BAD_PARAM, || "workspace_size is null".into())?;
        // SAFETY: the caller's out-pointer.
        unsafe { *size = icf_workspace(ci, co, num_act_out as usize, &counts) };
        Ok(())
    })
}
const _: exports::mluOpGetIndiceConvolutionForwardWorkspaceSize =
    mluOpGetIndiceConvolutionForwardWorkspaceSize;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mluOpIndiceConvolutionForward(
    h: *mut c_void,
    features_desc: *mut c_void,
    features: *const c_void,
    filters_desc: *mut c_void,
    filters: *const c_void,
    pairs_desc: *mut c_void,
    pairs: *const c_void,
    indice_num: *const i64,
    num_act_out: i64,
    inverse: i64,
    sub_m: i64,
    workspace: *mut c_void,
    workspace_size: usize,
    out_desc: *mut c_void,
    out: *mut c_void,
) -> Status {
    guarded("mluOpIndiceConvolutionForward", || {
        let _h = handle(h)?;
        let (l, ci, co, counts) = icf_check(
            features_desc,
            filters_desc,
            pairs_desc,
            out_desc,
            indice_num,
            num_act_out,
            inverse,
            sub_m,
        )?;
        let descs = [features_desc, filters_desc, pairs_desc, out_desc].map(|d| desc(d, ""));
        if descs.iter().any(|d| d.as_ref().map_or(true, |d| d.numel() == 0)) {
            return Ok(());
        }
        require(
            workspace_size >= icf_workspace(ci, co, num_act_out as usize, &counts)
                && !workspace.is_null(),
            BAD_PARAM,
            || {
                format!(
                    "workspace of {workspace_size} bytes where {} are required",
                    icf_workspace(ci, co, num_act_out as usize, &counts)
                )
            },
        )?;
        let k = counts.len();
        let rulebook: Vec<i32> = read(pairs, k * 2 * l, "indice_pairs")?;
        // Each offset's products reach the output through ScatterNd in UPDATE mode
        // (indice_convolution_forward.cpp:482): a destination repeated within one offset
        // keeps one of its contributions there, a failed call here.
        for (kk, &n) in counts.iter().enumerate() {
            let mut seen = std::collections::HashSet::new();
            let dst = &rulebook[(kk * 2 + 1) * l..(kk * 2 + 1) * l + n as usize];
            require(dst.iter().all(|d| seen.insert(*d)), EXECUTION_FAILED, || {
                format!(
                    "offset {kk}: a destination repeats (ScatterNd UPDATE keeps one contribution in the vendor library)"
                )
            })?;
        }
        let filters_t = tensor(desc(filters_desc, "")?, filters, "filters")?;
        let inputs = [
            tensor(desc(features_desc, "")?, features, "features")?,
            Tensor { shape: vec![k, ci, co], data: filters_t.data },
            Tensor { shape: vec![k, 2, l], data: OwnedData::I32(rulebook) },
            Tensor {
                shape: vec![k],
                data: OwnedData::I32(counts.iter().map(|&n| n as i32).collect()),
            },
            Tensor { shape: vec![num_act_out as usize, 0], data: OwnedData::I32(Vec::new()) },
        ];
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
        let result =
            compute::<sparse_conv::IndiceConv>(attrs(vec![("inverse", AttrValue::Int(0))]), &refs)?;
        store(&result[0], out, "features_out")
    })
}
const _: exports::mluOpIndiceConvolutionForward = mluOpIndiceConvolutionForward;
