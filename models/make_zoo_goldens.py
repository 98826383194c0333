"""Writes the data of the model zoo (models/zoo.rs): for every model, seeded inputs and golden
outputs in models/<name>.npz (`in.<input>`, `out.<output>`), and the tolerance of every output
in models/zoo.json.

The goldens come from an independent numpy implementation of each whole model, written from
the description in models/zoo.rs and the operator contracts (docs/CONTRACT.md, schemas/<family>/*.json):
numpy versions of the standard ONNX ops (tests/python/reference_models.py: Conv, Softmax, ...)
and of the mluops ops (tests/python/reference.py and reference_models.py). Only the learned
weights are read from the .onnx files (onnx.numpy_helper); the structural constants (voxel
sizes, ranges, strides, shapes) are written here again, on purpose. Never computed with
onnxruntime or this library.

Tolerances: index outputs, and the float outputs the graph computes exactly (PointPillars'
DynamicScatter max and DynamicScatterBackward, whose inputs are dyadic by construction; this
script asserts that they are exact in float32) are compared bit for bit; every other float
output uses the contract's accumulating class (diff1, diff2 <= 3e-3 against float64) and a
per-element bound (max |a-b| <= max_rel * max|golden|, max_rel = MAX_REL below).

Run: .venv/bin/python models/make_zoo_goldens.py [--models a,b] [--check]
(--check recomputes everything and verifies the stored files bit for bit instead of writing.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from reference import dsb_reference, gip_reference, prp_reference, tib_reference, vpf_reference
from onnxruntime_ep_mlu.placement import ULP_EDGES  # noqa: E402 (reference puts python/ on the path)
from reference_models import (
    conv1x1_1d,
    conv2d,
    dynamic_scatter_reference,
    exact_f32,
    indice_conv_reference,
    nearest3,
    psroipool_reference,
    relu,
    sigmoid,
    softmax,
    three_interpolate_reference,
)

F32, F64, I32 = np.float32, np.float64, np.int32
TOL = 3e-3
# Per element, beside diff1/diff2 (which let a few wrong elements of a large output through):
# max |a-b| <= MAX_REL * max|golden|. Measured (run_zoo.py, CPU and emulated MLU, 2026-05):
# at most 7.2e-7 (centerpoint reg), 6.9e-8 to 7.2e-7 over the 16 float outputs; 2e-5 is
# 28x the worst.
MAX_REL = 2e-5
EXACT = {"class": "exact"}
ACC = {"class": "accumulating", "diff1": TOL, "diff2": TOL, "max_rel": MAX_REL}


def load_weights(name: str) -> dict[str, np.ndarray]:
    model = onnx.load(os.path.join(HERE, f"{name}.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


# ============================================================================ PointPillars
PP_MIN = np.array([0.0, -16.0, -3.0])  # x, y, z
PP_VOXEL = np.array([0.5, 0.5, 4.0])
PP_GRID = np.array([64, 64, 1])  # x, y, z cells


def pointpillars_inputs(rng):
    # A few dozen objects (clusters) on a ground plane, partly outside the range (dropped
    # points), on a 1/64 m grid; intensities k/64; 100 exact duplicates (ties in the max).
    centres = rng.uniform([1.0, -15.0, -2.0], [31.0, 15.0, -0.5], (40, 3))
    obj = centres[rng.integers(0, 40, 4200)] + rng.normal(0.0, [0.7, 0.7, 0.5], (4200, 3))
    ground = rng.uniform([-2.0, -18.0, -3.6], [34.0, 18.0, -2.6], (1700, 3))
    xyz = np.round(np.concatenate([obj, ground]) * 64) / 64
    intensity = rng.integers(0, 64, (len(xyz), 1)) / 64
    pts = np.concatenate([xyz, intensity], axis=1)
    pts = np.concatenate([pts, pts[rng.integers(0, len(pts), 100)]])
    pts = pts[rng.permutation(len(pts))]
    return {"points": exact_f32(pts, "points")}


def pointpillars_model(w, x):
    pts = x["points"].astype(F64)
    xyz = pts[:, :3]
    cell = np.floor((xyz - PP_MIN) / PP_VOXEL)  # (x, y, z) cell, float
    outside = np.any((cell < 0) | (cell >= PP_GRID), axis=1)
    coors = cell[:, ::-1].astype(I32)  # (z, y, x)
    coors[outside] = -1
    centre = (cell + 0.5) * PP_VOXEL + PP_MIN
    pfn_in = np.concatenate([pts, xyz - centre], axis=1)
    point_feats = exact_f32(relu(pfn_in @ w["pfn_w"].astype(F64) + w["pfn_b"]), "PFN features")

    vf, vc, p2v, count, vnum = dynamic_scatter_reference(point_feats, coors, "max")
    h, wd, c = int(PP_GRID[1]), int(PP_GRID[0]), vf.shape[1]
    canvas = np.zeros((h, wd, c), F64)
    canvas[vc[:, 1], vc[:, 2]] = vf  # pillars are unique in (y, x): one z cell
    bev = canvas.transpose(2, 0, 1)[None]
    x1 = relu(conv2d(bev, w["block1_w"], w["block1_b"], stride=2, pad=1))
    x2 = relu(conv2d(x1, w["block2_w"], w["block2_b"], stride=1, pad=1))
    cls_score = conv2d(x2, w["cls_head_w"], w["cls_head_b"])
    bbox_pred = conv2d(x2, w["box_head_w"], w["box_head_b"])

    grad_voxel = exact_f32(vf.astype(F64) * w["grad_scale"] + w["grad_shift"], "grad_voxel_feats")
    grad_point = dsb_reference(grad_voxel, point_feats, vf, p2v, count, "max")
    outs = {
        "coors": (coors, EXACT),
        "voxel_feats": (vf, EXACT),
        "voxel_coors": (vc, EXACT),
        "point2voxel_map": (p2v, EXACT),
        "voxel_points_count": (count, EXACT),
        "voxel_num": (vnum, EXACT),
        "cls_score": (cls_score, ACC),
        "bbox_pred": (bbox_pred, ACC),
        "grad_point_feats": (grad_point, EXACT),
    }
    stats = f"N {len(pts)}, dropped {int(outside.sum())}, pillars M {int(vnum[0])}"
    return outs, stats


# ============================================================================ CenterPoint
CP_BATCH = 2
CP_SPATIAL = (8, 64, 64)
CP_SPATIAL1 = (4, 32, 32)  # after the stride-2 convolution (k 3, p 1)


def centerpoint_inputs(rng):
    d, h, w = CP_SPATIAL
    rows = []
    for b in range(CP_BATCH):
        # ground returns in the two lowest slices, and a dozen partly filled object boxes
        flat = rng.choice(h * w, 1100, replace=False)
        rows.append(np.stack([np.full(1100, b), rng.integers(0, 2, 1100), flat // w, flat % w], axis=1))
        for _ in range(14):
            lo = rng.integers([0, 0, 0], [d - 2, h - 4, w - 4])
            hi = np.minimum(lo + rng.integers([2, 3, 3], [5, 8, 8]), [d, h, w])
            zz, yy, xx = np.meshgrid(*(np.arange(a, e) for a, e in zip(lo, hi)), indexing="ij")
            box = np.stack([np.full(zz.size, b), zz.ravel(), yy.ravel(), xx.ravel()], axis=1)
            rows.append(box[rng.random(len(box)) < 0.6])
    sites = np.unique(np.concatenate(rows), axis=0)
    sites = sites[rng.permutation(len(sites))].astype(I32)
    feats = rng.standard_normal((len(sites), 5)).astype(F32)
    return {"voxel_features": feats, "voxel_coords": sites}


def centerpoint_model(w, x):
    feats, coords = x["voxel_features"], x["voxel_coords"]
    rules = {"ksize": (3, 3, 3), "padding": (1, 1, 1), "dilation": (1, 1, 1), "out_pad": (0, 0, 0), "transpose": 0}
    pairs0, out0, num0 = gip_reference(coords, CP_BATCH, CP_SPATIAL, stride=(1, 1, 1), subm=1, **rules)
    x0 = relu(indice_conv_reference(feats, w["conv_input_w"], pairs0, num0, len(out0), w["conv_input_b"]))
    x1 = relu(indice_conv_reference(x0, w["subm1_w"], pairs0, num0, len(out0)))
    pairs1, out1, num1 = gip_reference(coords, CP_BATCH, CP_SPATIAL, stride=(2, 2, 2), subm=0, **rules)
    x2 = relu(indice_conv_reference(x1, w["down1_w"], pairs1, num1, len(out1), w["down1_b"]))
    pairs2, out2, num2 = gip_reference(out1, CP_BATCH, CP_SPATIAL1, stride=(1, 1, 1), subm=1, **rules)
    x3 = relu(indice_conv_reference(x2, w["subm2_w"], pairs2, num2, len(out2), w["subm2_b"]))

    d1, h1, w1 = CP_SPATIAL1
    dense = np.zeros((CP_BATCH, d1, h1, w1, x3.shape[1]), F64)
    dense[out2[:, 0], out2[:, 1], out2[:, 2], out2[:, 3]] = x3
    bev = dense.transpose(0, 4, 1, 2, 3).reshape(CP_BATCH, x3.shape[1] * d1, h1, w1)  # channel c*D + d
    shared = relu(conv2d(bev, w["shared_conv_w"], w["shared_conv_b"], stride=1, pad=1))
    heatmap = sigmoid(conv2d(shared, w["heatmap_head_w"], w["heatmap_head_b"]))
    reg = conv2d(shared, w["reg_head_w"], w["reg_head_b"])
    outs = {
        "subm1_pairs": (pairs0, EXACT),
        "subm1_num": (num0, EXACT),
        "down1_pairs": (pairs1, EXACT),
        "down1_out": (out1, EXACT),
        "down1_num": (num1, EXACT),
        "subm2_pairs": (pairs2, EXACT),
        "subm2_num": (num2, EXACT),
        "sparse_feats": (x3, ACC),
        "heatmap": (heatmap, ACC),
        "reg": (reg, ACC),
    }
    stats = f"L {len(coords)}, L1 {len(out1)}, subm pairs {int(num0.sum())}, strided pairs {int(num1.sum())}"
    return outs, stats


# ============================================================================ BEVDepth
BD_B, BD_NCAM, BD_C, BD_FH, BD_FW, BD_D, BD_CC = 2, 2, 32, 8, 22, 16, 24
BD_GRID = (32, 32, 1)  # x, y, z cells


def bevdepth_geometry(rng):
    """geom_xyz [B, Ncam*D*FH*FW, 3] (x, y, z cells) of a toy camera rig: each frustum point
    (camera n, depth bin d, row h, column w), in that order, unprojected with pinhole
    intrinsics (stride-16 features of a 128 x 352 image), rotated by the camera's yaw,
    mounted 1.5 m high, and voxelised on a 1.6 m grid over [-25.6, 25.6) m (z: one 8 m cell);
    the far depth bins fall outside the grid."""
    depth = 2.0 + 2.0 * np.arange(BD_D) + 0.5
    u = (np.arange(BD_FW) + 0.5) * 16
    v = (np.arange(BD_FH) + 0.5) * 16
    fx = fy = 300.0
    cx, cy = 176.0, 64.0
    dd, vv, uu = np.meshgrid(depth, v, u, indexing="ij")  # [D, FH, FW]
    right, down, fwd = (uu - cx) / fx * dd, (vv - cy) / fy * dd, dd
    geom = np.empty((BD_B, BD_NCAM, BD_D, BD_FH, BD_FW, 3), I32)
    for b in range(BD_B):
        for n in range(BD_NCAM):
            yaw = n * np.pi + 0.3 * b + rng.uniform(-0.2, 0.2)
            ex = fwd * np.cos(yaw) + right * np.sin(yaw) + rng.uniform(-1, 1)
            ey = fwd * np.sin(yaw) - right * np.cos(yaw) + rng.uniform(-1, 1)
            ez = 1.5 - down
            pts = np.stack([ex, ey, ez], axis=-1)
            geom[b, n] = np.floor((pts - np.array([-25.6, -25.6, -5.0])) / np.array([1.6, 1.6, 8.0])).astype(I32)
    return geom.reshape(BD_B, -1, 3)


def bevdepth_inputs(rng):
    feats = rng.standard_normal((BD_B * BD_NCAM, BD_C, BD_FH, BD_FW)).astype(F32)
    return {"img_feats": feats, "geom_xyz": bevdepth_geometry(rng)}


def bevdepth_model(w, x):
    y = relu(conv2d(x["img_feats"], w["depth_reduce_w"], w["depth_reduce_b"], stride=1, pad=1))
    y = conv2d(y, w["depth_out_w"], w["depth_out_b"])
    depth = softmax(y[:, :BD_D], axis=1)
    context = y[:, BD_D:]
    frustum = depth[:, None] * context[:, :, None]  # [B*Ncam, Cc, D, FH, FW]
    pts = frustum.reshape(BD_B, BD_NCAM, BD_CC, BD_D, BD_FH, BD_FW).transpose(0, 1, 3, 4, 5, 2)
    pts = pts.reshape(BD_B, -1, BD_CC)
    bev_nhwc, pos = vpf_reference(x["geom_xyz"], pts, *BD_GRID)
    bev = bev_nhwc.transpose(0, 3, 1, 2)
    head = conv2d(
        relu(conv2d(bev, w["bev_conv_w"], w["bev_conv_b"], stride=1, pad=1)), w["bev_head_w"], w["bev_head_b"]
    )
    outs = {"depth": (depth, ACC), "bev_feat": (bev, ACC), "pos_memo": (pos, EXACT), "head": (head, ACC)}
    valid = int((pos[..., 0] >= 0).sum())
    return outs, f"frustum points {pos.shape[0]} x {pos.shape[1]}, inside the grid {valid}"


# ============================================================================ PointNet++ FP
PN_B, PN_N, PN_M, PN_C2, PN_C1 = 2, 1024, 256, 64, 32
PN_EPS = float(F32(1e-8))  # the graph's float32 constant


def pointnet2_fp_inputs(rng):
    # Coordinates on a 1/256 grid in [0, 4)^3: squared distances are exact in float32, so the
    # three nearest neighbours (index outputs) are well defined; the known points are a subset
    # of the unknown ones (as after farthest point sampling): distance 0, weight ~1.
    unknown = rng.integers(0, 1024, (PN_B, PN_N, 3)) / 256
    known = np.stack([unknown[b, rng.permutation(PN_N)[:PN_M]] for b in range(PN_B)])
    return {
        "unknown_xyz": exact_f32(unknown, "unknown_xyz"),
        "known_xyz": exact_f32(known, "known_xyz"),
        "known_feats": rng.standard_normal((PN_B, PN_C2, PN_M)).astype(F32),
        "unknown_feats": rng.standard_normal((PN_B, PN_C1, PN_N)).astype(F32),
    }


def pointnet2_fp_mlp1(w, x):
    """(nn_idx, nn_weight, mlp1's pre-activation) of the PointNet++ FP layer."""
    idx, d2 = nearest3(x["unknown_xyz"], x["known_xyz"])
    exact_f32(d2, "squared distances")
    recip = 1.0 / (np.sqrt(d2) + PN_EPS)
    weight = recip / recip.sum(axis=-1, keepdims=True)
    interp = three_interpolate_reference(x["known_feats"], idx, weight)
    fp_in = np.concatenate([interp, x["unknown_feats"].astype(F64)], axis=1)
    return idx, weight, conv1x1_1d(fp_in, w["mlp1_w"], w["mlp1_b"])


def pointnet2_fp_model(w, x):
    idx, weight, pre1 = pointnet2_fp_mlp1(w, x)
    y1 = relu(pre1)
    y2 = relu(conv1x1_1d(y1, w["mlp2_w"], w["mlp2_b"]))
    # 0.5 * |y2|^2: dL/d(pre-ReLU of mlp2) = y2; back through the 1x1 convs and mlp1's ReLU.
    g_y1 = np.einsum("oc,bon->bcn", w["mlp2_w"][:, :, 0].astype(F64), y2)
    g_pre1 = np.where(y1 > 0, g_y1, 0.0)
    g_in = np.einsum("oc,bon->bcn", w["mlp1_w"][:, :, 0].astype(F64), g_pre1)
    grad_known = tib_reference(g_in[:, :PN_C2], idx, weight, PN_M)
    outs = {
        "nn_idx": (idx.astype(I32), EXACT),
        "nn_weight": (weight, ACC),
        "new_features": (y2, ACC),
        "grad_known_feats": (grad_known, ACC),
    }
    return outs, f"B {PN_B}, n {PN_N}, m {PN_M}"


# ============================================================================ R-FCN head
RF_NB, RF_HW, RF_CF, RF_K, RF_NCLS, RF_NBOX, RF_SCALE, RF_R = 2, 32, 64, 3, 21, 8, 0.0625, 96


def rfcn_head_inputs(rng):
    feats = np.abs(rng.standard_normal((RF_NB, RF_HW, RF_HW, RF_CF))).astype(F32)
    img = RF_HW / RF_SCALE  # 512
    rois = np.zeros((RF_R, 5))
    rois[:, 0] = rng.integers(0, RF_NB, RF_R)
    cx, cy = rng.uniform(-20, img + 20, RF_R), rng.uniform(-20, img + 20, RF_R)
    bw, bh = np.exp(rng.uniform(np.log(8), np.log(400), (2, RF_R)))
    rois[:, 1:] = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
    rois[: RF_R // 2, 1:] = np.round(rois[: RF_R // 2, 1:] * 2) / 2  # halves: round half away from zero
    rois[3, 1:] = [300.0, 200.0, 280.0, 180.0]  # x2 < x1: the 0.1 minimum size
    rois[4, 1:] = [-200.0, -150.0, -40.0, -30.0]  # entirely outside the map: empty bins
    rois[5, 1:] = [-30.0, -30.0, 560.0, 540.0]  # the whole map
    labels = rng.integers(0, RF_NCLS, RF_R).astype(np.int64)
    return {"features": feats, "rois": rois.astype(F32), "labels": labels}


def rfcn_head_model(w, x):
    f64 = {k: v.astype(F64) for k, v in w.items()}
    hidden = relu(x["features"].astype(F64) @ f64["conv_new_w"] + f64["conv_new_b"])
    cls_maps = hidden @ f64["rfcn_cls_w"] + f64["rfcn_cls_b"]
    bbox_maps = hidden @ f64["rfcn_bbox_w"] + f64["rfcn_bbox_b"]
    rois = x["rois"]
    cls_pooled, cls_mapping = psroipool_reference(cls_maps, rois, RF_K, RF_K, RF_SCALE, RF_NCLS)
    bbox_pooled, _ = psroipool_reference(bbox_maps, rois, RF_K, RF_K, RF_SCALE, RF_NBOX)
    cls_score = cls_pooled.mean(axis=(1, 2))
    cls_prob = softmax(cls_score, axis=1)
    bbox_pred = bbox_pooled.mean(axis=(1, 2))
    onehot = np.eye(RF_NCLS)[x["labels"]]
    grad_pooled = np.broadcast_to(((cls_prob - onehot) / (RF_K * RF_K))[:, None, None, :], cls_pooled.shape)
    grad_maps = prp_reference(grad_pooled, rois, cls_mapping, cls_maps.shape, RF_K, RF_K, RF_SCALE, RF_NCLS)
    grad_hidden = grad_maps @ f64["rfcn_cls_w"].T
    outs = {
        "cls_score": (cls_score, ACC),
        "cls_prob": (cls_prob, ACC),
        "bbox_pred": (bbox_pred, ACC),
        "cls_mapping": (cls_mapping, EXACT),
        "grad_cls_maps": (grad_maps, ACC),
        "grad_hidden": (grad_hidden, ACC),
    }
    return outs, f"features {list(x['features'].shape)}, R {RF_R}"


# What a model's inputs cause at run time once MLU-OPS claims its nodes (models/run_zoo.py
# judges an MLU row by it), per mlu_backend, per run. R-FCN's half-rounded rois put bin edges
# on integers, and such rois leave MLU-OPS (docs/MLUOPS_BINDING.md, PsRoiPool): under
# `mluops` all three PsRoiPool nodes fall back to the CPU; under `auto` the two forward ones
# do (no BANG kernel) and the backward one declines to BANG.
MLUOPS_RUN_TIME = {
    "rfcn_head": {
        "why": ULP_EDGES,
        "mluops": {"off_card": True, "cpu_fallbacks": 3},
        "auto": {"cpu_fallbacks": 2, "run_time_declines": 1},
    },
}

# ============================================================================ driver
MODELS = {
    "pointpillars": (pointpillars_inputs, pointpillars_model, 101),
    "centerpoint": (centerpoint_inputs, centerpoint_model, 102),
    "bevdepth": (bevdepth_inputs, bevdepth_model, 103),
    "pointnet2_fp": (pointnet2_fp_inputs, pointnet2_fp_model, 104),
    "rfcn_head": (rfcn_head_inputs, rfcn_head_model, 105),
}


def stored(value, tol):
    """Goldens are stored as the graph's dtypes: int32 index outputs, float32 floats (exact ones
    asserted exact)."""
    value = np.asarray(value)
    if np.issubdtype(value.dtype, np.integer):
        return value.astype(I32)
    if tol["class"] == "exact":
        return exact_f32(value, "exact output")
    return value.astype(F32)


_WEIGHTS: dict[str, dict[str, np.ndarray]] = {}


#: ReLU's derivative is a step: a gradient through it depends on the sign of each
#: pre-activation, which float32 (the graph) and float64 (these models) can disagree on when
#: it lies within float32's rounding of 0 (measured: at most 3.2e-7 x max|pre| for mlp1 of
#: the generated PointNet++ frames). Such a frame's gradient has no golden.
KINK = 1e-6


def ambiguous_outputs(model: str, w, x) -> list[str]:
    """The outputs of `model` whose reference crosses a ReLU step at a pre-activation within
    KINK x max|pre| of 0 for inputs `x` (their float32 value may take the other branch)."""
    if model == "pointnet2_fp":
        pre = np.abs(pointnet2_fp_mlp1(w, x)[2])
        if (pre < KINK * pre.max()).any():
            return ["grad_known_feats"]
    return []


def goldens(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The numpy model's outputs for any inputs of zoo model `model`, stored as the zoo's
    goldens are: the dataset regression's reference for generated frames
    (``python -m onnxruntime_ep_mlu.regression --generate N --reference models/make_zoo_goldens.py``).
    Outputs of :func:`ambiguous_outputs` are left out (the regression then compares the MLU
    path with the CPU path there)."""
    if model not in _WEIGHTS:
        _WEIGHTS[model] = load_weights(model)
    outs, _ = MODELS[model][1](_WEIGHTS[model], inputs)
    skip = ambiguous_outputs(model, _WEIGHTS[model], inputs)
    return {k: stored(v, tol) for k, (v, tol) in outs.items() if k not in skip}


def npz_differences(path: str, arrays: dict[str, np.ndarray]) -> list[str]:
    """What differs between the stored file and freshly computed arrays (bit for bit)."""
    if not os.path.exists(path):
        return ["missing"]
    with np.load(path) as old:
        keys = set(old.files)
        diff = [f"{k} missing" for k in arrays if k not in keys] + [f"{k} extra" for k in keys - set(arrays)]
        for k, v in arrays.items():
            if k in keys and (old[k].dtype != v.dtype or old[k].shape != v.shape or old[k].tobytes() != v.tobytes()):
                diff.append(f"{k} differs")
    return diff


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    ap.add_argument("--check", action="store_true", help="verify the stored data instead of writing it")
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {list(MODELS)}")

    spec_path = os.path.join(HERE, "zoo.json")
    old_models = {}
    if os.path.exists(spec_path):
        with open(spec_path) as f:
            old_models = json.load(f)["models"]
    spec = {}
    spec["about"] = (
        "Tolerance of every output of the model zoo (models/zoo.rs), written by "
        "models/make_zoo_goldens.py and read by models/run_zoo.py. exact: bit-identical "
        "(integer outputs and float outputs the graph computes exactly); accumulating: "
        "diff1 = sum|a-b|/sum|b| and diff2 = sqrt(sum (a-b)^2 / sum b^2) against the float64 "
        "numpy golden, each <= its bound, and per element max |a-b| <= max_rel * max|golden| "
        "(set from the measured errors with a margin: models/make_zoo_goldens.py, MAX_REL)."
    )
    spec["models"] = dict(old_models)
    stale = []
    for name in names:
        make_inputs, model_fn, seed = MODELS[name]
        graph = onnx.load(os.path.join(HERE, f"{name}.onnx")).graph
        weights = load_weights(name)
        inputs = make_inputs(np.random.default_rng(seed))
        assert list(inputs) == [i.name for i in graph.input], f"{name}: inputs {list(inputs)}"
        outs, stats = model_fn(weights, inputs)
        assert list(outs) == [o.name for o in graph.output], f"{name}: outputs {list(outs)}"
        arrays = {"in." + k: v for k, v in inputs.items()}
        arrays |= {"out." + k: stored(v, tol) for k, (v, tol) in outs.items()}
        path = os.path.join(HERE, f"{name}.npz")
        spec["models"][name] = {
            "model": f"{name}.onnx",
            "data": f"{name}.npz",
            "inputs": {k: list(v.shape) for k, v in inputs.items()},
            "outputs": {k: tol for k, (v, tol) in outs.items()},
        }
        if name in MLUOPS_RUN_TIME:
            spec["models"][name]["mluops_run_time"] = MLUOPS_RUN_TIME[name]
        if args.check:
            diff = npz_differences(path, arrays)
            if spec["models"][name] != old_models.get(name):
                diff.append("its zoo.json entry")
            if diff:
                stale.append(name)
                print(f"{path} is stale ({'; '.join(diff)}): rerun models/make_zoo_goldens.py")
            else:
                print(f"{path} is up to date: {stats}")
            continue
        np.savez_compressed(path, **arrays)
        print(f"wrote {path}: {stats}")
    if args.check:
        if stale:
            sys.exit(1)
        return
    spec["models"] = {k: spec["models"][k] for k in MODELS if k in spec["models"]}
    text = json.dumps(spec, indent=1)
    # one line per shape and per tolerance
    text = re.sub(r"\[[\s\d,]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    text = re.sub(r"\{[^{}]*\}", lambda m: json.dumps(json.loads(m.group(0))), text)
    with open(spec_path, "w") as f:
        f.write(text + "\n")
    print(f"wrote {spec_path}")


if __name__ == "__main__":
    main()
