"""Independent numpy references of the five mluops operators, written from docs/CONTRACT.md
(no code shared with the Rust kernels), with the input generators the tests use and the
contract's accumulating-class metric and the per-element bound beside it. Used by the session tests (test_ops.py) and by
models/make_demo_data.py to compute the demo model's goldens."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np

# The accumulating class's metrics and per-element bounds are the package's (one definition
# for the runners and the tests).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from onnxruntime_ep_mlu.regression import (  # noqa: E402, F401
    DEFAULT_FLOAT,
    ELEM_REL_F16,
    accumulating_metrics,
    element_ratio,
    elementwise_errors,
)

F32 = np.float32


def dsb_reference(gvf, feats, vf, p2v, count, mode):
    n, c = feats.shape
    out = np.zeros((n, c), np.float32)
    valid = p2v >= 0
    rows = p2v[valid]
    if mode == "sum":
        out[valid] = gvf[rows]
    elif mode == "mean":
        # float32 division by the count as given
        out[valid] = gvf[rows] / count[rows].astype(np.float32)[:, None]
    else:
        taken = np.zeros(vf.shape, bool)
        for i in range(n):  # ascending i: the lowest matching index wins
            v = p2v[i]
            if v < 0:
                continue
            hit = (feats[i] == vf[v]) & ~taken[v]
            out[i, hit] = gvf[v, hit]
            taken[v] |= hit
    return out


def dsb_inputs(rng, n, m, c, mode, v=None):
    limit = m if v is None else v
    p2v = rng.integers(-1, limit, n).astype(np.int32) if limit > 0 else np.full(n, -1, np.int32)
    # few distinct values: many ties between points of a voxel (lowest index must win)
    feats = (rng.integers(-4, 5, (n, c)) / 2).astype(np.float32)
    feats[rng.random((n, c)) < 0.1] = -0.0
    vf = rng.standard_normal((m, c)).astype(np.float32)
    for vox in range(m):
        pts = p2v == vox
        if pts.any():
            vf[vox] = feats[pts].max(axis=0)
    vf[vf == 0] = 0.0  # +0 against -0 features: IEEE equal
    vf[rng.random((m, c)) < 0.15] += 0.25  # no point matches: gradient dropped
    if m and c:
        vf[rng.integers(0, m), rng.integers(0, c)] = np.nan  # never equal
    count = np.bincount(p2v[p2v >= 0], minlength=m).astype(np.int32)
    count += rng.integers(0, 2, m).astype(np.int32)  # the count is used as given, not recomputed
    gvf = rng.standard_normal((m, c)).astype(np.float32)
    if v is not None:
        # rows >= V are never read, counts included
        gvf[v:] = np.nan
        count[v:] = -3
    feeds = {
        "grad_voxel_feats": gvf,
        "feats": feats,
        "voxel_feats": vf,
        "point2voxel_map": p2v,
        "voxel_points_count": count,
    }
    if v is not None:
        feeds["voxel_num"] = np.array([v], np.int32)
    return feeds


def tib_reference(go, idx, w, m):
    b_, c_, n_ = go.shape
    out = np.zeros((b_, c_, m), np.float64)
    for b in range(b_):
        scatter = np.zeros((n_, m), np.float64)  # scatter[n, idx] += w
        np.add.at(scatter, (np.repeat(np.arange(n_), 3), idx[b].reshape(-1)), w[b].astype(np.float64).reshape(-1))
        out[b] = go[b].astype(np.float64) @ scatter
    return out


def gip_reference(indices, batch_size, spatial, ksize, stride, padding, dilation, out_pad, subm, transpose):
    if subm:
        out_size = list(spatial)
    elif transpose:
        out_size = [
            (i - 1) * s - 2 * p + d * (k - 1) + op + 1
            for i, s, p, d, k, op in zip(spatial, stride, padding, dilation, ksize, out_pad)
        ]
    else:
        out_size = [
            (i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in zip(spatial, stride, padding, dilation, ksize)
        ]
    assert all(o > 0 for o in out_size) and 0 < batch_size

    def target(coord, kk, axis):
        s, p, d = stride[axis], padding[axis], dilation[axis]
        if transpose:
            o = coord * s - p + kk * d
        else:
            num = coord + p - kk * d
            if num % s:
                return None
            o = num // s
        return o if 0 <= o < out_size[axis] else None

    offsets = list(itertools.product(*(range(k) for k in ksize)))  # k = (kz*KH + ky)*KW + kx
    n_k, n_in = len(offsets), len(indices)
    rows = [tuple(int(v) for v in r) for r in indices]
    targets = []  # targets[j][k] = output site or None
    for b, z, y, x in rows:
        per_k = []
        for kz, ky, kx in offsets:
            t = (target(z, kz, 0), target(y, ky, 1), target(x, kx, 2))
            per_k.append(None if None in t else (b,) + t)
        targets.append(per_k)
    if subm:
        out_rows = {r: j for j, r in enumerate(rows)}
        out_indices = np.array(rows, np.int32).reshape(-1, 4)
    else:
        sites = sorted({t for per_k in targets for t in per_k if t is not None})
        out_rows = {s: r for r, s in enumerate(sites)}
        out_indices = np.array(sites, np.int32).reshape(-1, 4)
    pairs = np.full((n_k, 2, n_in), -1, np.int32)
    num = np.zeros(n_k, np.int32)
    for j in range(n_in):  # ascending input row within each k
        for k in range(n_k):
            t = targets[j][k]
            if t is not None and t in out_rows:
                pairs[k, 0, num[k]] = j
                pairs[k, 1, num[k]] = out_rows[t]
                num[k] += 1
    return pairs, out_indices, num


def gip_sites(rng, batch_size, spatial, count, duplicates=0):
    total = batch_size * math.prod(spatial)
    flat = rng.choice(total, size=min(count, total), replace=False)
    sites = np.stack(np.unravel_index(flat, (batch_size, *spatial)), axis=1).astype(np.int32)
    if duplicates and len(sites):
        sites = np.concatenate([sites, sites[rng.integers(0, len(sites), duplicates)]])
        rng.shuffle(sites)
    return sites.reshape(-1, 4)




def vpf_reference(geom, feats, nx, ny, nz):
    b_, n_, c_ = feats.shape
    out = np.zeros((b_, ny, nx, c_), np.float64)
    pos = np.full((b_, n_, 3), -1, np.int32)
    for b in range(b_):
        x, y, z = geom[b, :, 0], geom[b, :, 1], geom[b, :, 2]
        ok = (0 <= x) & (x < nx) & (0 <= y) & (y < ny) & (0 <= z) & (z < nz)
        np.add.at(out[b], (y[ok], x[ok]), feats[b][ok].astype(np.float64))
        pos[b, ok] = np.stack([np.full(ok.sum(), b), y[ok], x[ok]], axis=1)
    return out, pos


def vpf_inputs(rng, b, n, c, nx, ny, nz, spread=1.0):
    geom = np.stack(
        [rng.integers(-1, nx + 2, (b, n)), rng.integers(-2, ny + 1, (b, n)), rng.integers(-1, nz + 1, (b, n))], axis=2
    ).astype(np.int32)
    feats = (rng.standard_normal((b, n, c)) * 10.0 ** rng.uniform(-spread, spread, (b, n, 1))).astype(np.float32)
    return {"geom_xyz": geom, "input_features": feats}


def _round_half_away(x: np.float32) -> np.float32:
    v = float(x)  # exact; adding 0.5 in float64 is exact for every float32 below 2^28
    return F32(math.copysign(math.floor(abs(v) + 0.5), v))


def psroi_bins(roi, ph, pw, scale, height, width):
    """The bins of one roi as (batch, [(i, j, hs, he, ws, we)]), computed in float32 one
    rounded operation at a time; None for a roi with a non-finite value or overflow."""
    if not np.all(np.isfinite(roi)):
        return None
    scale = F32(scale)
    one, tenth = F32(1), F32(0.1)
    b = int(np.trunc(roi[0]))
    start_w = _round_half_away(roi[1]) * scale
    start_h = _round_half_away(roi[2]) * scale
    end_w = (_round_half_away(roi[3]) + one) * scale
    end_h = (_round_half_away(roi[4]) + one) * scale
    roi_w = max(end_w - start_w, tenth)
    roi_h = max(end_h - start_h, tenth)
    bin_w, bin_h = roi_w / F32(pw), roi_h / F32(ph)
    if not all(np.isfinite(v) for v in (start_w, start_h, bin_w, bin_h)):
        return None
    bins = []
    for i in range(ph):
        hs = int(min(max(np.floor(F32(i) * bin_h + start_h), 0), height))
        he = int(min(max(np.ceil(F32(i + 1) * bin_h + start_h), 0), height))
        for j in range(pw):
            ws = int(min(max(np.floor(F32(j) * bin_w + start_w), 0), width))
            we = int(min(max(np.ceil(F32(j + 1) * bin_w + start_w), 0), width))
            bins.append((i, j, hs, he, ws, we))
    return b, bins


def prp_reference(top_grad, rois, mapping, bottom_shape, ph, pw, scale, od):
    nb, h, w, ch = (int(v) for v in bottom_shape)
    out = np.zeros((nb, h, w, ch), np.float64)
    for r in range(rois.shape[0]):
        got = psroi_bins(rois[r], ph, pw, scale, h, w)
        if got is None:
            continue
        b, bins = got
        for i, j, hs, he, ws, we in bins:
            if he <= hs or we <= ws:
                continue
            area = (he - hs) * (we - ws)
            for o in range(od):
                c = mapping[r, i, j, o]
                out[b, hs:he, ws:we, c] += float(top_grad[r, i, j, o]) / area
    return out


def prp_inputs(rng, r, ph, od, nb, h, w, scale):
    ch = ph * ph * od
    top_grad = rng.standard_normal((r, ph, ph, od)).astype(np.float32)
    mapping = rng.integers(0, ch, (r, ph, ph, od)).astype(np.int32)
    rois = np.zeros((r, 5), np.float32)
    for k in range(r):
        batch = rng.integers(0, nb) + rng.choice([0.0, 0.25, 0.75])
        # half-integer coordinates exercise round-half-away-from-zero, negatives included
        x1 = np.round(rng.uniform(-3, w / scale + 2) * 2) / 2
        y1 = np.round(rng.uniform(-3, h / scale + 2) * 2) / 2
        x2 = x1 + np.round(rng.uniform(-2, w / scale) * 2) / 2
        y2 = y1 + np.round(rng.uniform(-2, h / scale) * 2) / 2
        rois[k] = [batch, x1, y1, x2, y2]
    if r >= 3:
        rois[1, 2] = np.nan  # contributes nothing
        rois[2, 1:] = [w / scale + 5, h / scale + 5, w / scale + 9, h / scale + 9]  # outside the map
    bottom = np.array([nb, h, w, ch], np.int64)
    return {"top_grad": top_grad, "rois": rois, "mapping_channel": mapping, "bottom_shape": bottom}


# (R, pooled, output_dim, batches, height, width, spatial_scale)
