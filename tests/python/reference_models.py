"""Independent numpy references used by the model zoo's goldens (models/make_zoo_goldens.py):
the four forward partners (DynamicScatter, IndiceConv, ThreeInterpolate, PsRoiPool), written
from the `doc` fields of schemas/dynamic_scatter/dynamic_scatter.json, indice_conv.json, three_interpolate.json
and psroipool.json (no code shared with the Rust kernels), and straightforward numpy versions
of the standard ONNX operators the zoo's graphs use (Conv, Softmax, ...).

Float results are float64 (the contract's accumulating class is measured against a float64
reference); index results are exact. The five operators of docs/CONTRACT.md are in reference.py."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from reference import psroi_bins

F32 = np.float32
F64 = np.float64


# ----------------------------------------------------------------------------- standard ops
def conv2d(x, w, b=None, stride=1, pad=0):
    """ONNX Conv, NCHW, square stride and symmetric padding, group 1, dilation 1; float64."""
    x = np.asarray(x, F64)
    w = np.asarray(w, F64)
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]  # [B, C, Ho, Wo, kh, kw]
    out = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3]))  # [B, Ho, Wo, O]
    out = out.transpose(0, 3, 1, 2)
    if b is not None:
        out = out + np.asarray(b, F64)[None, :, None, None]
    return np.ascontiguousarray(out)


def conv1x1_1d(x, w, b=None):
    """ONNX Conv over [B, C, N] with a [O, C, 1] kernel; float64."""
    out = np.einsum("oc,bcn->bon", np.asarray(w, F64)[:, :, 0], np.asarray(x, F64))
    if b is not None:
        out = out + np.asarray(b, F64)[None, :, None]
    return out


def relu(x):
    return np.maximum(x, 0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, F64)))


def softmax(x, axis):
    x = np.asarray(x, F64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def exact_f32(x, what: str) -> np.ndarray:
    """x (float64) as float32, asserting that no rounding happens: the graph computes it in
    float32 and the result is compared bit for bit, so it must be exactly representable."""
    x = np.asarray(x, F64)
    y = x.astype(F32)
    bad = np.count_nonzero(y.astype(F64) != x)
    assert bad == 0, f"{what}: {bad} values are not exact in float32"
    return y


# ----------------------------------------------------------------------------- DynamicScatter
def dynamic_scatter_reference(feats, coors, reduce_type="max"):
    """Returns voxel_feats, voxel_coors, point2voxel_map, voxel_points_count, voxel_num.
    max is exact (float32); sum and mean are float64."""
    n, c = feats.shape
    d = coors.shape[1]
    keep = np.all(coors >= 0, axis=1)
    kept = coors[keep]
    if len(kept):
        voxels, inverse, counts = np.unique(kept, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
    else:
        voxels, inverse, counts = np.zeros((0, d), coors.dtype), np.zeros(0, np.int64), np.zeros(0, np.int64)
    m = len(voxels)
    p2v = np.full(n, -1, np.int32)
    p2v[keep] = inverse
    if reduce_type == "max":
        out = np.full((m, c), -np.inf, F32)
        np.fmax.at(out, inverse, feats[keep])  # fmax: NaN never wins, all-NaN stays -inf
    else:
        out = np.zeros((m, c), F64)
        np.add.at(out, inverse, feats[keep].astype(F64))
        if reduce_type == "mean":
            out /= counts[:, None]
    return out, voxels.astype(np.int32), p2v, counts.astype(np.int32), np.array([m], np.int32)


# ----------------------------------------------------------------------------- IndiceConv
def indice_conv_reference(features, filters, pairs, num, num_out, bias=None, inverse=0):
    """Gather-GEMM-scatter over a GetIndicePairs rulebook; float64 [num_out, Cout]."""
    k_, _, cout = filters.shape
    out = np.zeros((num_out, cout), F64)
    if bias is not None:
        out += np.asarray(bias, F64)
    feats = np.asarray(features, F64)
    for k in range(k_):
        n = int(num[k])
        src, dst = pairs[k, 0, :n], pairs[k, 1, :n]
        if inverse:
            src, dst = dst, src
        np.add.at(out, dst, feats[src] @ np.asarray(filters[k], F64))
    return out


# ----------------------------------------------------------------------------- ThreeInterpolate
def three_interpolate_reference(features, indices, weights):
    """output[b, c, n] = sum_k features[b, c, indices[b, n, k]] * weights[b, n, k]; float64."""
    b_, c_, m_ = features.shape
    assert np.all((indices >= 0) & (indices < m_))
    out = np.zeros((b_, c_, indices.shape[1]), F64)
    for b in range(b_):
        gathered = np.asarray(features[b], F64)[:, indices[b]]  # [C, N, 3]
        out[b] = (gathered * np.asarray(weights[b], F64)[None]).sum(axis=-1)
    return out


# ----------------------------------------------------------------------------- PsRoiPool
def psroipool_reference(inp, rois, ph, pw, scale, od):
    """R-FCN position-sensitive RoI pooling forward (NHWC): float64 output [R, ph, pw, od] and
    int32 mapping_channel."""
    nb, height, width, ch = inp.shape
    assert ch == ph * pw * od
    r_ = rois.shape[0]
    out = np.zeros((r_, ph, pw, od), F64)
    o = np.arange(od)
    mapping = np.empty((r_, ph, pw, od), np.int32)
    for i in range(ph):
        for j in range(pw):
            mapping[:, i, j, :] = (o * ph + i) * pw + j
    for r in range(r_):
        got = psroi_bins(rois[r], ph, pw, scale, height, width)
        if got is None:
            continue
        b, bins = got
        assert 0 <= b < nb, f"roi {r}: batch {b} outside [0, {nb})"
        for i, j, hs, he, ws, we in bins:
            if he <= hs or we <= ws:
                continue
            c = (o * ph + i) * pw + j
            window = np.asarray(inp[b, hs:he, ws:we][:, :, c], F64)
            out[r, i, j] = window.sum(axis=(0, 1)) / ((he - hs) * (we - ws))
    return out, mapping


def nearest3(unknown, known):
    """Three nearest known points of every unknown point by squared distance (float64),
    ties to the lower index (as ONNX TopK): indices [B, n, 3] int64, squared distances."""
    d2 = ((np.asarray(unknown, F64)[:, :, None, :] - np.asarray(known, F64)[:, None, :, :]) ** 2).sum(-1)
    idx = np.argsort(d2, axis=-1, kind="stable")[..., :3]
    return idx, np.take_along_axis(d2, idx, axis=-1)
