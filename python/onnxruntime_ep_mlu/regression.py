"""Model-level regression over a dataset of frames, in this process or on a Ray cluster.

Every frame of every model runs on the CPU path (the custom-op library registered with
``SessionOptions.register_custom_ops_library``) and under the MLUExecutionProvider (the
emulated card by default), and each output is compared with its reference under the
model's tolerance:

- a frame with goldens (``out.<output>`` arrays) is compared with them, on every path;
- a frame without goldens (a generated frame, or a dataset frame without ``out.*``) takes
  the CPU path's result as its golden: the MLU result is compared with it (the CPU path is
  then its own reference and reported as such).

Frames come from one of two sources:

- a folder, ``<dir>/<model>/<frame>.npz``: one sub-folder per model, one ``.npz`` per
  frame holding ``in.<input>`` for every model input and, optionally, ``out.<output>``
  goldens (the layout of ``models/<name>.npz``). The model is ``<dir>/<model>/model.onnx``
  when present (``--write-frames`` writes it), else the zoo's model of that name (``--zoo``,
  default the zoo packaged with this module, :func:`onnxruntime_ep_mlu.zoo`); tolerances
  are ``<dir>/<model>/tolerances.json`` (``{"<output>": {"class": "exact"} |
  {"class": "accumulating", "diff1": .., "diff2": .., "max_rel": .., "elem_rel": ..} |
  {"class": "detections", ...}}``, :data:`DETECTIONS` for a detector's boxes; max_rel and
  elem_rel the per-element bounds max |a-b| <= max_rel * max|reference| and, element by
  element, |a_i - b_i| <= elem_rel * (|b_i| + rms(b)) (docs/CONTRACT.md, section 1.5),
  :data:`DEFAULT_FLOAT`'s when absent; ``--write-frames`` writes it too) when present,
  else the zoo's, else exact for
  integer outputs and :data:`DEFAULT_FLOAT` for float outputs. Any other key in a frame is
  an error.
- generated from the zoo's inputs with a seed (``--generate N``): frame 0 of each model is
  the zoo's own frame with its independent numpy goldens; frames 1..N-1 are perturbations
  that keep the inputs valid for the model (see :data:`GENERATORS`), whose golden is the
  CPU path's result, or, with ``--reference FILE.py``, the goldens of that file's
  ``goldens(model, inputs)`` (the checkout's ``models/make_zoo_goldens.py``: the zoo's
  independent numpy models), computed when the frames are made.

Runs in this process by default; ``--ray`` starts a local Ray cluster and ``--address``
(``auto``, ``ray://host:10001``) joins one: the frames become a Ray Dataset (each row
carries its frame's bytes, or the seed and index of a generated frame, so workers need no
shared file system) and ``map_batches`` runs them on a fixed pool of actors
(``ActorPoolStrategy``, 1 CPU each), each holding its own sessions and registering the
library with the package's idempotent
:func:`onnxruntime_ep_mlu.register_execution_provider` (``emulate`` is an argument of the
actor, never read from a worker's environment). Ray restarts an actor whose process dies
and retries its batch on the new process, 3 times at most (Ray Data's default, forever,
would turn a frame that kills its worker every time into a hang); then the run fails.
Ray is an optional extra (``pip install './python[ray]'``); nothing else in the package
imports it.

An MLU frame also fails when its timed run put no node on the card or had a run-time CPU
fallback or decline (:mod:`onnxruntime_ep_mlu.placement`: the provider's traffic report and
ONNX Runtime's warnings of that run; the sessions log at warning level). A model of a frame
folder that legitimately puts nothing on the card says why in ``<dir>/<model>/expect.json``,
``{"off_card": "<why>"}``; its MLU frames then fail when a node does run on the card.

The per-frame results are gathered into one table: per model and path, the nodes on the
MLU, the node runs on the card per frame, the frames, the failed frames (placement
included), the worst error / tolerance against the goldens and
against the CPU path, the median run time, the frames per second of one worker's busy
time, and the worst output; then the end-to-end figures (a frame counts once, for all its
paths): the wall time, and the frames per second over the window from the first frame's
start to the last frame's end over all workers (actor start-up excluded). The exit status
is 1 when any frame of any path fails or is lost (or a Ray run fails), 0 otherwise.

Usage::

    python -m onnxruntime_ep_mlu.regression --generate 20                 # in-process, zoo
    python -m onnxruntime_ep_mlu.regression --frames DIR --ray --workers 1,2
    python -m onnxruntime_ep_mlu.regression --frames DIR --address ray://head:10001 --workers 8 \\
        --runtime-env '{"pip": ["onnxruntime==1.31.1"], "py_modules": ["target/wheels/onnxruntime_ep_mlu-0.1.0-py3-none-manylinux_2_35_x86_64.whl"]}'
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import socket
import statistics
import sys
import time
import warnings
import zlib
from pathlib import Path

import numpy as np

from . import placement
from . import (
    EP_NAME,
    RECORD_ASSIGNMENT,
    _has_emulated,
    _repo_root,
    get_library_path,
    models_dir,
    register_execution_provider,
)

__all__ = [
    "GENERATORS",
    "FrameChecker",
    "DETECTIONS",
    "compare",
    "compare_detections",
    "element_ratio",
    "elementwise_errors",
    "dataset_frames",
    "generated_frames",
    "load_dataset_models",
    "load_zoo",
    "main",
    "run_in_process",
    "run_ray",
    "summarize",
    "write_frames",
]

#: The accumulating class of the operator contract (diff1, diff2 <= 3e-3), the default
#: tolerance of float outputs without one, with a per-element bound beside it (whole-tensor
#: diff1/diff2 let a few wrong elements of a large output through): max |a-b| <= max_rel *
#: max|reference|. max_rel 3e-5 is 17x the worst measured where it applies (networks/run.py
#: --scale ci against the peers, 2026-05: 1.8e-6, PointPillars' cls_score; every other float
#: output <= 6.2e-7; the one exception has its own level, networks/pointpillars.py). And
#: the contract's per-element rule (docs/CONTRACT.md, section 1.5): |a_i - b_i| <= elem_rel *
#: (|b_i| + rms(b)), each element against its own magnitude and the tensor's accumulation
#: scale, so that one large element does not hide small ones gone wrong. elem_rel 3e-5 is
#: 6.7x the worst measured, 4.5e-6 (networks/run.py --scale ci, 2026-12, BEVDepth's bev;
#: models/run_dataset.py --generate 20 against the numpy goldens: 4.0e-6, rfcn_head's
#: grad_hidden), and rejects zeroing an element of 0.01 beside one of 1000 among a thousand
#: near 1 (10x over). A tolerance without max_rel or elem_rel (an older tolerances.json, the
#: zoo's) takes this one's.
DEFAULT_FLOAT = {"class": "accumulating", "diff1": 3e-3, "diff2": 3e-3, "max_rel": 3e-5, "elem_rel": 3e-5}
EXACT = {"class": "exact"}
PATHS = ("cpu", "mlu")
#: A result row's fields; the MLU path's card_runs .. run_time_warnings are
#: onnxruntime_ep_mlu.placement's counts of the frame's timed run (-1 on the CPU path), and
#: binding_check says that run used MLU-OPS on the emulated card, whose libmluops is the
#: emulated one: our own CPU kernels (placement.EMULATED_MLUOPS); off_card: why the model
#: expects no node on the card ("" when it expects some).
RESULT_FIELDS = (
    "model", "frame", "path", "ok", "ratio", "golden_ratio", "cpu_ratio", "worst", "ref", "seconds", "on_mlu", "start",
    "end", "worker", "error", "card_runs", "cpu_fallbacks", "run_time_declines", "run_time_warnings", "binding_check",
    "off_card", "documented_run_time",
)
_NO_COUNTS = {"card_runs": -1, "cpu_fallbacks": -1, "run_time_declines": -1, "run_time_warnings": -1,
              "documented_run_time": -1}


# ============================================================================ comparison
def accumulating_metrics(actual: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """diff1 = sum|a-b| / sum|b| and diff2 = sqrt(sum (a-b)^2 / sum b^2), in float64. An
    all-zero reference admits only an all-zero result (both 0, else inf)."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"accumulating_metrics: {a.size} elements against a reference of {b.size}")
    err = a - b
    den1, den2 = np.abs(b).sum(), (b * b).sum()
    if den1 == 0:
        return (0.0, 0.0) if not np.any(err) and not np.any(np.isnan(a)) else (math.inf, math.inf)
    return float(np.abs(err).sum() / den1), float(math.sqrt((err * err).sum() / den2))


def elementwise_errors(actual: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(max_abs, max_rel): the largest |a-b| over the elements, and that over the reference's
    scale max|b| (its largest finite magnitude), in float64. diff1 and diff2 dilute one wrong
    element among millions; this bound does not. NaN and infinities must be in the same
    places with the same values (else both inf); an all-zero reference admits only an exact
    result (max_rel 0, else inf)."""
    a, b = _finite_pairs(actual, reference)
    if a is None:
        return math.inf, math.inf
    if a.size == 0:
        return 0.0, 0.0
    max_abs = float(np.abs(a - b).max())
    scale = float(np.abs(b).max())
    if scale == 0:
        return max_abs, (0.0 if max_abs == 0 else math.inf)
    return max_abs, max_abs / scale


def element_ratio(actual: np.ndarray, reference: np.ndarray) -> float:
    """max over the elements of |a_i - b_i| / (|b_i| + rms(b)), rms(b) = sqrt(mean(b^2)) over
    the reference's finite elements (the tensor's accumulation scale), in float64: the
    accumulating class's per-element rule (docs/CONTRACT.md, section 1.5). Unlike max_rel,
    an element is judged against its own magnitude, so one large element does not hide small
    ones gone wrong. NaN and infinities must match (else inf); an all-zero reference admits
    only an exact result (0, else inf)."""
    a, b = _finite_pairs(actual, reference)
    if a is None:
        return math.inf
    if a.size == 0:
        return 0.0
    err = np.abs(a - b)
    scale = np.abs(b) + math.sqrt(float(np.mean(b * b)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / scale)
    return float(ratio.max())


def _finite_pairs(actual, reference) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Both flattened in float64 with their non-finite places removed, or (None, None) when
    those places or values differ."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    special = ~np.isfinite(a) | ~np.isfinite(b)
    if np.any(special):
        same = (a[special] == b[special]) | (np.isnan(a[special]) & np.isnan(b[special]))
        if not same.all():
            return None, None
        a, b = a[~special], b[~special]
    return a, b


def compare(value: np.ndarray, golden: np.ndarray, tol: dict | None) -> tuple[float, str]:
    """(error / tolerance, description): <= 1 passes. ``tol`` None: exact for integer
    outputs, the accumulating class for floats. Exact: 0, or inf with the mismatch count."""
    if tol is None:
        tol = DEFAULT_FLOAT if np.issubdtype(np.asarray(golden).dtype, np.floating) else EXACT
    if tol["class"] == "detections":
        return compare_detections(value, golden, tol)
    if value.shape != golden.shape:
        return math.inf, f"shape {list(value.shape)} != reference {list(golden.shape)}"
    if value.dtype != golden.dtype:
        return math.inf, f"dtype {value.dtype} != reference {golden.dtype}"
    if tol["class"] == "exact":
        if np.issubdtype(value.dtype, np.floating):
            same = (value == golden) | (np.isnan(value) & np.isnan(golden))
        else:
            same = value == golden
        bad = int(value.size - np.count_nonzero(same))
        if bad == 0:
            return 0.0, "exact"
        where = tuple(int(i) for i in np.unravel_index(int(np.argmin(same.ravel())), value.shape)) if value.ndim else ()
        return math.inf, f"{bad} of {value.size} differ (first at {list(where)}: {value[where]!s} vs {golden[where]!s})"
    d1, d2 = accumulating_metrics(value, golden)
    max_abs, max_rel = elementwise_errors(value, golden)
    elem = element_ratio(value, golden)
    bounds = {key: tol.get(key, DEFAULT_FLOAT[key]) for key in ("max_rel", "elem_rel")}
    ratio = max(d1 / tol["diff1"], d2 / tol["diff2"], max_rel / bounds["max_rel"], elem / bounds["elem_rel"])
    if math.isnan(ratio):
        ratio = math.inf
    return ratio, (
        f"diff1 {d1:.1e} diff2 {d2:.1e} (<= {tol['diff1']:.0e}), max abs {max_abs:.1e} = {max_rel:.1e} x scale "
        f"(<= {bounds['max_rel']:.0e}), per element {elem:.1e} x (|ref| + rms) (<= {bounds['elem_rel']:.0e})"
    )


#: Detections: [M, 9] rows (x, y, z, dx, dy, dz, yaw, score, label), the rows a detector
#: graph keeps (score threshold and top-K inside the graph; rotated NMS, which standard ONNX
#: ops cannot express, outside it). Boxes match by label and centre distance (<= ``match``
#: metres, nearest first, the reference's highest scores first); matched boxes are held to
#: max |score|, centre distance, |size| and wrapped |yaw| differences, each against its
#: bound. Every box must be matched, except where the tolerance names a cut of the graph and
#: the reference has a tie at it: scores equal within ``tie`` decide nothing, so either side
#: may keep either box. ``tie`` 1e-6: two sides' roundings reorder two boxes only when their
#: scores differ by less than both boxes' score differences between the sides together, at
#: most 4.2e-7 measured (networks/run.py --scale ci, 2026-12: CenterPoint); the boxes
#: swapped at a cut lie within 5e-8 of it at the ci scale (BEVDepth) and 3.4e-7 at the full
#: scale (CenterPoint, docs/BENCHMARKS.md).
#:
#: - ``top_k`` with ``top_k_labels`` (lists of labels sharing one top-K, such as CenterHead's
#:   tasks; absent: one top-K over all labels): where both sides kept exactly ``top_k`` boxes
#:   of a group, an unmatched reference box and an unmatched box of ours may be a swap inside
#:   the reference's tie group at the cut: each scored within ``tie`` of the reference's
#:   lowest kept score of the group, as many of ours as of the reference's, label by label,
#:   and only where the reference kept two or more boxes of that label and score (a tie the
#:   reference shows: its lone lowest box replaced by another is a moved box).
#: - ``threshold`` (boxes kept when score > threshold): a box of one side scored within
#:   ``tie`` above it, which the other side's rounding put at or below it; never when a box
#:   is unmatched at the threshold on the other side too (a moved or relabelled box).
#:
#: Nothing else is excused: no box at another side's lowest score, no box near a twin, no
#: box of ours for a reference box missing elsewhere.
DETECTIONS = {
    "class": "detections", "match": 0.5, "score": 1e-4, "center": 1e-3, "size": 1e-3, "yaw": 1e-3, "tie": 1e-6,
}


def compare_detections(value: np.ndarray, golden: np.ndarray, tol: dict) -> tuple[float, str]:
    """(error / tolerance, description) of two sets of detections (see :data:`DETECTIONS`)."""
    value, golden = np.asarray(value, np.float64), np.asarray(golden, np.float64)
    for name, d in (("detections", value), ("reference", golden)):
        if d.ndim != 2 or d.shape[1] != 9:
            return math.inf, f"{name} of shape {list(d.shape)}, not [M, 9] (x, y, z, dx, dy, dz, yaw, score, label)"
        if not np.isfinite(d).all():
            return math.inf, f"{name} hold a non-finite value"
    unknown = set(tol) - set(DETECTIONS) - {"threshold", "top_k", "top_k_labels"}
    if unknown:
        return math.inf, f"unknown detections tolerance key(s) {sorted(unknown)}"
    free = np.ones(len(value), bool)
    pairs = []
    for g in np.argsort(-golden[:, 7], kind="stable"):
        same = free & (value[:, 8] == golden[g, 8])
        dist = np.where(same, np.linalg.norm(value[:, :3] - golden[g, :3], axis=1), np.inf)
        v = int(np.argmin(dist)) if len(value) else -1
        if v >= 0 and dist[v] <= tol["match"]:
            free[v] = False
            pairs.append((v, g))
    lone_v = free.copy()
    lone_g = np.ones(len(golden), bool)
    lone_g[[g for _, g in pairs]] = False
    tie = tol.get("tie", DETECTIONS["tie"])
    swapped = at_threshold = 0
    if "top_k" in tol:
        k = tol["top_k"]
        groups = tol.get("top_k_labels") or [sorted(set(golden[:, 8]) | set(value[:, 8]))]
        for labels in groups:
            in_g, in_v = np.isin(golden[:, 8], labels), np.isin(value[:, 8], labels)
            if in_g.sum() != k or in_v.sum() != k:
                continue  # the cut did not decide this group on both sides: no tie at it
            cut = golden[in_g, 7].min()
            for label in labels:
                g = lone_g & (golden[:, 8] == label)
                v = lone_v & (value[:, 8] == label)
                group = (golden[:, 8] == label) & (np.abs(golden[:, 7] - cut) <= tie)
                tied = (np.abs(golden[g, 7] - cut) <= tie).all() and (np.abs(value[v, 7] - cut) <= tie).all()
                # A tie the reference shows: two or more kept boxes of the label at the cut score.
                if g.sum() == v.sum() and tied and group.sum() >= 2:
                    lone_g &= ~g
                    lone_v &= ~v
                    swapped += int(g.sum())
    if "threshold" in tol:
        g = lone_g & (golden[:, 7] > tol["threshold"]) & (golden[:, 7] - tol["threshold"] <= tie)
        v = lone_v & (value[:, 7] > tol["threshold"]) & (value[:, 7] - tol["threshold"] <= tie)
        if g.any() != v.any():  # one side only: a crossing; on both, a moved (or relabelled) box
            lone_g &= ~g
            lone_v &= ~v
            at_threshold = int(g.sum() + v.sum())
    unmatched = int(lone_g.sum() + lone_v.sum())
    excused = f"{swapped} swapped per side in a tie at the top-K cut, {at_threshold} at the threshold"
    if not pairs:
        ratio = math.inf if unmatched else 0.0
        return ratio, f"no matched boxes of {len(golden)} (reference) and {len(value)}; {unmatched} unmatched; {excused}"
    v, g = (np.array(i) for i in zip(*pairs))
    yaw = np.abs((value[v, 6] - golden[g, 6] + np.pi) % (2 * np.pi) - np.pi)
    worst = {
        "score": float(np.abs(value[v, 7] - golden[g, 7]).max()),
        "center": float(np.linalg.norm(value[v, :3] - golden[g, :3], axis=1).max()),
        "size": float(np.abs(value[v, 3:6] - golden[g, 3:6]).max()),
        "yaw": float(yaw.max()),
    }
    ratio = max([math.inf if unmatched else 0.0] + [worst[k] / tol[k] for k in worst])
    return ratio, (
        f"{len(pairs)} matched of {len(golden)} (reference) and {len(value)}, {unmatched} unmatched ({excused}); "
        f"max score {worst['score']:.1e} (<= {tol['score']:.0e}), "
        f"centre {worst['center']:.1e} m, size {worst['size']:.1e} m, yaw {worst['yaw']:.1e} rad"
    )


# ============================================================================ generated frames
# Each generator takes (rng, the zoo frame's inputs) and returns new inputs that keep the
# model's input contract: the same dtypes and fixed dimensions, the grids the zoo's inputs
# are drawn on (so exact outputs stay well defined), unique sparse sites, indices in range.


def _pointpillars(rng, base):
    # points [N, 4] = (x, y, z, intensity) on a 1/64 m grid, intensity k/64. A random subset
    # (N varies), every point moved by up to 0.5 m and the cloud by up to 2 m in x and y (on
    # the grid, so the PFN values stay exact), new intensities, 50 exact duplicates (ties in
    # the max), shuffled.
    pts = base["points"].astype(np.float64)
    pts = pts[rng.random(len(pts)) < rng.uniform(0.7, 1.0)]
    pts[:, :3] += rng.integers(-32, 33, (len(pts), 3)) / 64
    pts[:, :2] += rng.integers(-128, 129, 2) / 64
    pts[:, 3] = rng.integers(0, 64, len(pts)) / 64
    pts = np.concatenate([pts, pts[rng.integers(0, len(pts), 50)]])
    return {"points": pts[rng.permutation(len(pts))].astype(np.float32)}


def _centerpoint(rng, base):
    # voxel_coords [L, 4] = (batch, z, y, x) unique sites in a 2 x (8, 64, 64) grid, with
    # voxel_features [L, 5]: a random subset of the sites (L varies), mirrored in y and/or x
    # per batch (a bijection of the grid: the sites stay unique and in range), shuffled, with
    # new features.
    coords = base["voxel_coords"].astype(np.int64)
    coords = coords[rng.random(len(coords)) < rng.uniform(0.6, 1.0)]
    for b in np.unique(coords[:, 0]):
        rows = coords[:, 0] == b
        for axis, size in ((2, 64), (3, 64)):
            if rng.random() < 0.5:
                coords[rows, axis] = size - 1 - coords[rows, axis]
    coords = coords[rng.permutation(len(coords))].astype(np.int32)
    feats = rng.standard_normal((len(coords), base["voxel_features"].shape[1])).astype(np.float32)
    return {"voxel_features": feats, "voxel_coords": coords}


def _bevdepth(rng, base):
    # img_feats [4, 32, 8, 22] re-sampled; geom_xyz [2, 5632, 3] (x, y, z cells of the
    # frustum points, in frustum order) moved by up to 3 cells in x and y per sample (the ego
    # pose): more or fewer points fall outside the 32 x 32 x 1 grid, as in the zoo's frame.
    geom = base["geom_xyz"].copy()
    geom[..., :2] += rng.integers(-3, 4, (geom.shape[0], 1, 2)).astype(np.int32)
    return {"img_feats": rng.standard_normal(base["img_feats"].shape).astype(np.float32), "geom_xyz": geom}


def _pointnet2_fp(rng, base):
    # The zoo's recipe again: unknown points on a 1/256 grid in [0, 4)^3 (squared distances
    # exact in float32), the known points a random subset of them (as after farthest point
    # sampling), new features.
    b, n, _ = base["unknown_xyz"].shape
    m = base["known_xyz"].shape[1]
    unknown = rng.integers(0, 1024, (b, n, 3)) / 256
    known = np.stack([unknown[i, rng.permutation(n)[:m]] for i in range(b)])
    return {
        "unknown_xyz": unknown.astype(np.float32),
        "known_xyz": known.astype(np.float32),
        "known_feats": rng.standard_normal(base["known_feats"].shape).astype(np.float32),
        "unknown_feats": rng.standard_normal(base["unknown_feats"].shape).astype(np.float32),
    }


def _rfcn_head(rng, base):
    # features [2, 32, 32, 64] (post-ReLU: >= 0) re-sampled; the zoo's rois [R, 5] shuffled,
    # each moved by a multiple of 0.5 px (half-pixel corners stay on the half grid, the
    # degenerate and outside boxes keep their shape), batch ids re-drawn in {0, 1}; labels
    # re-drawn in [0, 21).
    feats = np.abs(rng.standard_normal(base["features"].shape)).astype(np.float32)
    rois = base["rois"].astype(np.float64)[rng.permutation(len(base["rois"]))]
    shift = rng.integers(-32, 33, (len(rois), 2)) / 2
    rois[:, 1:] += np.concatenate([shift, shift], axis=1)
    rois[:, 0] = rng.integers(0, base["features"].shape[0], len(rois))
    labels = rng.integers(0, 21, len(rois)).astype(base["labels"].dtype)
    return {"features": feats, "rois": rois.astype(np.float32), "labels": labels}


#: Perturbations of the zoo models' inputs (generated frames exist for these models only).
GENERATORS = {
    "pointpillars": _pointpillars,
    "centerpoint": _centerpoint,
    "bevdepth": _bevdepth,
    "pointnet2_fp": _pointnet2_fp,
    "rfcn_head": _rfcn_head,
}


def _frame_rng(seed: int, model: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(model.encode()), index])


def generate(model: str, base: dict[str, np.ndarray], seed: int, index: int) -> dict[str, np.ndarray]:
    """The inputs of generated frame ``index`` of ``model`` (0: the zoo frame itself)."""
    inputs = {k[3:]: v for k, v in base.items() if k.startswith("in.")}
    if index == 0:
        return inputs
    return GENERATORS[model](_frame_rng(seed, model, index), inputs)


# ============================================================================ models and frames
def _load_npz(data: bytes | str | os.PathLike) -> dict[str, np.ndarray]:
    src = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    with np.load(src, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def default_zoo() -> Path | None:
    """The zoo packaged with this module (:func:`onnxruntime_ep_mlu.zoo`: the wheel's copy of
    the checkout's models/, or the checkout's own), None when there is none."""
    try:
        return models_dir() / "zoo.json"
    except FileNotFoundError:
        return None


def _read_zoo(zoo_json: str | os.PathLike) -> dict:
    """zoo.json's ``models``, or a one-line FileNotFoundError / ValueError naming the file."""
    zoo_json = Path(zoo_json)
    if not zoo_json.is_file():
        raise FileNotFoundError(f"zoo file {zoo_json} not found")
    try:
        return json.loads(zoo_json.read_text())["models"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{zoo_json} is not a zoo.json (a JSON object with \"models\"): {type(e).__name__}: {e}") from None


def _zoo_file(zoo_json: Path, name: str, spec: dict, key: str) -> bytes:
    path = zoo_json.parent / spec[key]
    if not path.is_file():
        raise FileNotFoundError(f"{path}, the {key} file of {name!r} in {zoo_json}, not found")
    return path.read_bytes()


def load_zoo(zoo_json: str | os.PathLike, names: list[str] | None = None) -> dict[str, dict]:
    """The zoo's models as the specs the checkers take: ``{name: {"onnx": bytes,
    "tolerances": {output: tol}, "base": npz bytes of the zoo frame (inputs and goldens)}}``."""
    zoo_json = Path(zoo_json)
    zoo = _read_zoo(zoo_json)
    names = list(zoo) if names is None else names
    unknown = [n for n in names if n not in zoo]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; {zoo_json} has {list(zoo)}")
    out = {}
    for name in names:
        spec = zoo[name]
        out[name] = {
            "onnx": _zoo_file(zoo_json, name, spec, "model"),
            "tolerances": spec["outputs"],
            "base": _zoo_file(zoo_json, name, spec, "data"),
        }
    return out


def load_dataset_models(frames_dir: str | os.PathLike, zoo_json=None, names: list[str] | None = None) -> dict[str, dict]:
    """The specs of the models of a frame folder (``<dir>/<model>/``): its ``model.onnx``
    else the zoo's model of that name; ``tolerances.json`` else the zoo's, else defaults."""
    frames_dir = Path(frames_dir)
    if not frames_dir.is_dir():
        raise FileNotFoundError(f"frame folder {frames_dir} not found")
    present = sorted(p.name for p in frames_dir.iterdir() if p.is_dir())
    if not present:
        raise ValueError(f"{frames_dir} has no model folders (the layout is {frames_dir}/<model>/<frame>.npz)")
    names = present if names is None else names
    missing = [n for n in names if n not in present]
    if missing:
        raise ValueError(f"no folder for model(s) {missing} in {frames_dir} (it has {present})")
    # The zoo is read only for a folder that needs it (no model.onnx or no tolerances.json).
    zoo = None
    out = {}
    for name in names:
        sub = frames_dir / name
        own_model, own_tol = (sub / "model.onnx").is_file(), (sub / "tolerances.json").is_file()
        if zoo is None and not (own_model and own_tol):
            zoo = _read_zoo(zoo_json) if zoo_json else {}
        if own_model:
            onnx_bytes = (sub / "model.onnx").read_bytes()
        elif name in zoo:
            onnx_bytes = _zoo_file(Path(zoo_json), name, zoo[name], "model")
        else:
            raise FileNotFoundError(
                f"{sub} has no model.onnx, and {name!r} is not a model of the zoo ({zoo_json}): put the model there as "
                "model.onnx, or pass --zoo with a zoo.json that has it"
            )
        if own_tol:
            try:
                tolerances = json.loads((sub / "tolerances.json").read_text())
            except ValueError as e:
                raise ValueError(f"{sub / 'tolerances.json'} is not JSON: {e}") from None
        else:
            tolerances = zoo.get(name, {}).get("outputs", {})
        out[name] = {"onnx": onnx_bytes, "tolerances": tolerances, "base": None, "off_card": _off_card(sub / "expect.json")}
    return out


def _off_card(path: Path) -> str:
    """Why a folder's model puts no node on the card, from its ``expect.json`` (``{"off_card":
    "<why>"}``); "" (nodes on the card expected) without one."""
    if not path.is_file():
        return ""
    try:
        expect = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(expect, dict) or set(expect) != {"off_card"} or not isinstance(expect["off_card"], str) \
            or not expect["off_card"].strip():
        raise ValueError(f"{path} must be {{\"off_card\": \"<why no node of the model runs on the card>\"}}, got {expect!r}")
    return expect["off_card"]


def generated_frames(models: dict[str, dict], count: int, seed: int = 0, reference=None) -> list[dict]:
    """``count`` generated frames per model (rows of the dataset: the frame is generated by
    the worker from the model's zoo frame, the seed and the index). With ``reference``, a
    function ``(model, inputs) -> {output: golden}`` independent of this library (the
    checkout's numpy models, ``models/make_zoo_goldens.py``), frames 1.. are generated here
    and carry its goldens, so that the CPU path is checked on them too."""
    rows = []
    for name, spec in models.items():
        if name not in GENERATORS or spec.get("base") is None:
            raise ValueError(f"no generator for model {name!r} (generated frames exist for {list(GENERATORS)})")
        base = _load_npz(spec["base"]) if reference is not None else None
        for i in range(count):
            row = {"model": name, "frame": f"gen-{seed}-{i:05d}", "seed": seed, "index": i, "payload": b""}
            if base is not None and i > 0:
                inputs = generate(name, base, seed, i)
                arrays = {"in." + k: v for k, v in inputs.items()}
                arrays |= {"out." + k: np.asarray(v) for k, v in reference(name, inputs).items()}
                buffer = io.BytesIO()
                np.savez(buffer, **arrays)
                row["payload"] = buffer.getvalue()
            rows.append(row)
    return rows


def load_reference(path: str | os.PathLike):
    """The ``goldens(model, inputs)`` function of the Python file ``path`` (``--reference``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regression_reference", path)
    if spec is None or spec.loader is None:
        raise ValueError("not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    goldens = getattr(module, "goldens", None)
    if not callable(goldens):
        raise ValueError("defines no goldens(model, inputs) function")
    return goldens


def dataset_frames(frames_dir: str | os.PathLike, models: dict[str, dict], limit: int | None = None) -> list[dict]:
    """The frames of a folder (``<dir>/<model>/<frame>.npz``), read into rows (the file's
    bytes travel with the row, so workers need no shared file system)."""
    rows = []
    for name in models:
        files = sorted((Path(frames_dir) / name).glob("*.npz"))
        if not files:
            raise FileNotFoundError(f"{Path(frames_dir) / name}: no .npz frames")
        for f in files[:limit]:
            rows.append({"model": name, "frame": f.stem, "seed": -1, "index": -1, "payload": f.read_bytes()})
    return rows


def write_frames(out_dir: str | os.PathLike, models: dict[str, dict], count: int, seed: int = 0) -> int:
    """Writes ``count`` generated frames per model in the folder layout (frame 0 with the zoo's
    goldens, the others inputs only), with each model's ``model.onnx`` and
    ``tolerances.json``, so that ``--frames`` reads the folder back without the zoo; returns
    the number of frame files."""
    n = 0
    for name, spec in models.items():
        base = _load_npz(spec["base"])
        sub = Path(out_dir) / name
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "model.onnx").write_bytes(spec["onnx"])
        (sub / "tolerances.json").write_text(json.dumps(spec.get("tolerances") or {}, indent=1) + "\n")
        for i in range(count):
            arrays = {"in." + k: v for k, v in generate(name, base, seed, i).items()}
            if i == 0:
                arrays |= {k: v for k, v in base.items() if k.startswith("out.")}
            np.savez(sub / f"gen-{seed}-{i:05d}.npz", **arrays)
            n += 1
    return n


# ============================================================================ the checker
class _Session:
    __slots__ = ("on_mlu", "sess", "warm")

    def __init__(self, sess, on_mlu: int):
        self.sess, self.on_mlu, self.warm = sess, on_mlu, False


class FrameChecker:
    """Holds one session per model and path and checks frames. One per process (or Ray
    actor); the sessions are created on first use.

    ``emulate`` selects the emulated card for the MLU path: it is passed to
    :func:`onnxruntime_ep_mlu.register_execution_provider`, which registers the library
    once per process and switches the card when an earlier registration differs, so the
    checker is safe in reused and restarted workers. ``library``: the library's path (None:
    :func:`onnxruntime_ep_mlu.get_library_path` in this process). ``threads``: intra-op
    threads per session (0: ONNX Runtime's default). ``crash_once``: fault injection for
    tests, a file path: the first checker (in any process) to reach its second batch
    creates the file and ends its process, so Ray restarts the actor and retries the batch.
    ``warm_up``: create every session at construction and run it once on the model's zoo
    frame (when it has one), so that the timed runs measure frames only.
    """

    def __init__(
        self,
        models: dict[str, dict],
        paths=PATHS,
        emulate: bool = True,
        library: str | None = None,
        threads: int = 1,
        crash_once: str | None = None,
        warm_up: bool = True,
    ):
        import onnxruntime as ort

        self._ort = ort
        self.models = models
        self.paths = tuple(paths)
        bad = [p for p in self.paths if p not in PATHS]
        if bad or not self.paths:
            raise ValueError(f"paths are cpu and/or mlu, got {list(paths)}")
        self.emulate = emulate
        # Absolute: ONNX Runtime resolves a relative EP library path against its own folder.
        self.library = os.path.abspath(library) if library else get_library_path()
        self.threads = threads
        self.crash_once = crash_once
        self.batches = 0
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._sessions = {}
        self._bases = {}
        self.devices = []
        if "mlu" in self.paths:
            devices = register_execution_provider(self.library, emulate=emulate)
            # The card asked for: the emulated one with emulate=True, real cards otherwise.
            self.devices = [d for d in devices if _has_emulated([d]) == bool(emulate)]
        if warm_up:
            self.warm_up()

    def warm_up(self):
        """Creates every session now and runs each once on its zoo frame, when the model has
        one (so the timed runs exclude session creation and first-run costs); a failure here
        is left for the frames to report."""
        for model, spec in self.models.items():
            feeds = None
            if spec.get("base") is not None:
                feeds = generate(model, self._base(model), 0, 0)
            for path in self.paths:
                try:
                    entry = self.session(model, path)
                    if feeds is not None and not entry.warm:
                        entry.sess.run(None, {i.name: feeds[i.name] for i in entry.sess.get_inputs()})
                        entry.warm = True
                except Exception:  # noqa: BLE001,S112 -- reported per frame
                    continue

    def _base(self, model: str) -> dict:
        if model not in self._bases:
            self._bases[model] = _load_npz(self.models[model]["base"])
        return self._bases[model]

    def _options(self):
        so = self._ort.SessionOptions()
        # Warnings logged: placement.ort_warnings counts a frame's (the run-time fallback's
        # is one); a session's placement notes are printed when it is created.
        so.log_severity_level = 2
        if self.threads:
            so.intra_op_num_threads = self.threads
        return so

    def session(self, model: str, path: str) -> _Session:
        """The session of ``model`` on ``path`` (created on first use)."""
        key = (model, path)
        if key not in self._sessions:
            so = self._options()
            so.add_session_config_entry(RECORD_ASSIGNMENT, "1")
            onnx_bytes = self.models[model]["onnx"]
            if path == "cpu":
                so.register_custom_ops_library(self.library)
                sess = self._ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
            else:
                if not self.devices:
                    raise RuntimeError(
                        f"{EP_NAME} offers no {'emulated' if self.emulate else 'real'} card in this process "
                        f"({self.worker})"
                    )
                so.add_provider_for_devices(self.devices, {})
                sess = self._ort.InferenceSession(onnx_bytes, so)
            on_mlu = sum(len(sub.get_nodes()) for sub in sess.get_provider_graph_assignment_info() if sub.ep_name == EP_NAME)
            self._sessions[key] = _Session(sess, on_mlu)
        return self._sessions[key]

    def frame_arrays(self, row: dict) -> tuple[dict, dict]:
        """(inputs, goldens) of a dataset row."""
        model = row["model"]
        if row["payload"] is not None and len(row["payload"]):
            arrays = _load_npz(bytes(row["payload"]))
            other = [k for k in arrays if not k.startswith(("in.", "out."))]
            if other:
                raise ValueError(f"keys {other} are neither in.<input> nor out.<output>")
            inputs = {k[3:]: v for k, v in arrays.items() if k.startswith("in.")}
            goldens = {k[4:]: v for k, v in arrays.items() if k.startswith("out.")}
            return inputs, goldens
        base = self._base(model)
        index = int(row["index"])
        goldens = {k[4:]: v for k, v in base.items() if k.startswith("out.")} if index == 0 else {}
        return generate(model, base, int(row["seed"]), index), goldens

    def _run(self, model, path, feeds):
        entry = self.session(model, path)
        if not entry.warm:  # first run of a session: allocations, thread pool start-up; untimed
            entry.sess.run(None, feeds)
            entry.warm = True
        # On the MLU the provider's traffic report and ONNX Runtime's warnings of the timed run
        # give where its nodes ran (the report's lines are written outside the timed span's
        # kernels; the session's own line comes only when it ends, so the node lines count).
        mlu = path == "mlu"
        with (
            placement.traffic_report() if mlu else contextlib.nullcontext() as report,
            placement.ort_warnings() if mlu else contextlib.nullcontext() as warned,
        ):
            start = time.time()
            t0 = time.perf_counter()
            outs = entry.sess.run(None, feeds)
            seconds, end = time.perf_counter() - t0, time.time()
            lines = placement.read_report(report) if mlu else None
        counts = placement.counts(lines, warned) if mlu else _NO_COUNTS
        return dict(zip([o.name for o in entry.sess.get_outputs()], outs)), seconds, start, end, entry.on_mlu, counts

    def check(self, row: dict) -> list[dict]:
        """One result per path for one frame (dataset row)."""
        model, frame = str(row["model"]), str(row["frame"])
        base_result = {"model": model, "frame": frame, "worker": self.worker}
        try:
            inputs, goldens = self.frame_arrays(row)
            names = [i.name for i in self.session(model, self.paths[0]).sess.get_inputs()]
            missing = [n for n in names if n not in inputs]
            if missing:
                raise ValueError(f"the frame has no in.{missing[0]} (model inputs: {names})")
            feeds = {n: inputs[n] for n in names}
        except Exception as e:  # noqa: BLE001 -- a bad frame is a failed row per path
            return [dict(base_result, **_failed(p, e)) for p in self.paths]
        tolerances = self.models[model].get("tolerances") or {}
        expect = placement.Expectation(off_card=self.models[model].get("off_card", ""))
        results, cpu_outs = [], None
        # The CPU path first: it is the reference of the outputs without a golden.
        order = ["cpu"] + [p for p in self.paths if p != "cpu"]
        for path in order:
            if path not in self.paths and (path != "cpu" or "mlu" not in self.paths):
                continue
            try:
                outs, seconds, start, end, on_mlu, counts = self._run(model, path, feeds)
            except Exception as e:  # noqa: BLE001
                if path in self.paths:
                    results.append(dict(base_result, **_failed(path, e)))
                continue
            if path == "cpu":
                cpu_outs = outs
                if "cpu" not in self.paths:
                    continue  # run only as the reference of the MLU path
            worst, worst_desc, failed, refs = -1.0, "", [], set()
            by_kind = {"golden": math.nan, "cpu": math.nan}
            for name, value in outs.items():
                if name in goldens:
                    ref, kind = goldens[name], "golden"
                elif path != "cpu" and cpu_outs is not None:
                    ref, kind = cpu_outs[name], "cpu"
                elif path == "cpu":
                    refs.add("self")  # the CPU path is the reference of the outputs without a golden
                    continue
                else:
                    failed.append(f"{name}: no reference (no golden, and the CPU path failed)")
                    continue
                refs.add(kind)
                ratio, desc = compare(value, ref, tolerances.get(name))
                by_kind[kind] = ratio if math.isnan(by_kind[kind]) else max(by_kind[kind], ratio)
                if ratio > 1:
                    failed.append(f"{name}: {desc}")
                if ratio > worst:
                    worst, worst_desc = ratio, f"{name}: {desc} vs {kind}"
            absent = sorted(set(goldens) - set(outs))
            if absent:
                failed.append(f"goldens without a model output: {absent}")
            if path == "mlu":
                failed += [f"placement: {w}" for w in placement.judge(counts, expect)]
            ratio = max(worst, 0.0)
            if failed and ratio <= 1:  # a failure that is no output's difference (absent outputs)
                ratio = math.inf
            results.append(
                dict(
                    base_result,
                    path=path,
                    ok=not failed,
                    ratio=ratio,
                    golden_ratio=by_kind["golden"],
                    cpu_ratio=by_kind["cpu"],
                    worst=worst_desc or "-",
                    ref="+".join(sorted(refs)) or "-",
                    seconds=seconds,
                    on_mlu=on_mlu,
                    start=start,
                    end=end,
                    error="; ".join(f"also {f}" for f in failed if not worst_desc.startswith(f)),
                    **{k: counts[k] for k in _NO_COUNTS},
                    # The emulated card runs no real libmluops (it computes on host memory).
                    binding_check=bool(self.emulate and path == "mlu" and counts["mluops"] > 0),
                    off_card=expect.off_card,
                )
            )
        return results

    def __call__(self, batch: dict) -> dict:
        """Ray Data ``map_batches`` entry: a batch of frame rows (numpy format) -> result rows."""
        self.batches += 1
        if self.crash_once and self.batches == 2:
            try:
                fd = os.open(self.crash_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, self.worker.encode())
                os.close(fd)
                os._exit(3)  # the process dies in a batch: Ray restarts the actor and retries the batch
        n = len(batch["model"])
        rows = []
        for i in range(n):
            rows += self.check({k: batch[k][i] for k in ("model", "frame", "seed", "index", "payload")})
        return {f: np.array([r[f] for r in rows], dtype=object if f in ("worst", "error", "ref", "off_card") else None)
                for f in RESULT_FIELDS}

    def check_rows(self, rows: list[dict]) -> list[dict]:
        """Plain entry (in-process runs, Ray tasks): every frame of ``rows``."""
        out = []
        for row in rows:
            out += self.check(row)
        return out


def _failed(path: str, e: BaseException) -> dict:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return {
        "path": path,
        "ok": False,
        "ratio": math.inf,
        "golden_ratio": math.nan,
        "cpu_ratio": math.nan,
        "worst": "ERROR",
        "ref": "-",
        "seconds": math.nan,
        "on_mlu": -1,
        "start": math.nan,
        "end": math.nan,
        "error": f"{type(e).__name__}: {msg}",
        **_NO_COUNTS,
        "binding_check": False,
        "off_card": "",
    }


# ============================================================================ runs
def run_in_process(rows, models, paths=PATHS, emulate=True, library=None, threads=1) -> tuple[list[dict], dict]:
    """Checks every frame in this process; returns (results, run info)."""
    t0 = time.perf_counter()
    checker = FrameChecker(models, paths=paths, emulate=emulate, library=library, threads=threads)
    results = checker.check_rows(rows)
    return results, {"mode": "in-process", "workers": 1, "wall": time.perf_counter() - t0}


def run_ray(
    rows,
    models,
    workers: int = 2,
    paths=PATHS,
    emulate: bool = True,
    library: str | None = None,
    threads: int = 1,
    batch_size: int = 4,
    crash_once: str | None = None,
    retries: int = 3,
    start_timeout: int = 600,
) -> tuple[list[dict], dict]:
    """Checks every frame on the Ray cluster this process is connected to (``ray.init``
    first): a Ray Dataset of the rows, ``map_batches`` over a fixed pool of ``workers``
    :class:`FrameChecker` actors (1 CPU each; the cluster needs that many CPUs), ``batch_size``
    frames per actor task. An actor whose process dies is restarted and its task retried on
    the new process, ``retries`` times at most (Ray Data's default is forever, which a frame
    that crashes its worker every time would turn into a hang); then the run raises. The
    pool's actors must all be up within ``start_timeout`` seconds.
    Returns (results, run info)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("run_ray needs a Ray connection: call ray.init() first")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # Every actor of the pool ready (sessions created and warmed up) before the first
    # batch: all workers check frames from the start, and a cluster without the CPUs for
    # the pool fails after this many seconds instead of waiting forever.
    ctx.wait_for_min_actors_s = start_timeout
    t0 = time.perf_counter()
    ds = ray.data.from_items(list(rows), override_num_blocks=max(1, math.ceil(len(rows) / batch_size)))
    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing remote args (max_restarts, max_task_retries) through
        # map_batches and offers no named parameter for them yet (hence ray < 2.64 in the
        # package's ray extra).
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        out = _map_batches(ds, models, workers, paths, emulate, library, threads, batch_size, crash_once, retries)
    results = [_plain(r) for r in out.take_all()]
    return results, {"mode": "ray", "workers": workers, "wall": time.perf_counter() - t0}


def _map_batches(ds, models, workers, paths, emulate, library, threads, batch_size, crash_once, retries):
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        FrameChecker,
        fn_constructor_kwargs={
            "models": models,
            "paths": tuple(paths),
            "emulate": emulate,
            "library": library,
            "threads": threads,
            "crash_once": crash_once,
        },
        compute=ActorPoolStrategy(size=workers),
        batch_size=batch_size,
        batch_format="numpy",
        num_cpus=1,
        max_restarts=retries,  # instead of Ray Data's defaults, -1: forever
        max_task_retries=retries,
    )


def _plain(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        out[k] = v.item() if isinstance(v, np.generic) else v
    return out


# ============================================================================ the table
def _worst(values) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{max(values):.1e}" if values else "-"


def summarize(results: list[dict], info: dict | None = None, expected_frames: dict | None = None) -> tuple[str, bool, dict]:
    """(the table, every frame of every path passed, the run info with the end-to-end figures). ``expected_frames``: {model: frame ids}
    each path must have reported exactly once (a lost or doubled frame fails the run).

    Columns: the nodes ONNX Runtime assigned to the MLUExecutionProvider in the session
    (from its assignment record; 0 on the CPU path); the node runs on the card per frame
    (fewest-most, from the provider's traffic report); frames and failed frames, an MLU
    frame failing too when :func:`onnxruntime_ep_mlu.placement.judge` rejects its counts (no
    node ran on the card, a run-time CPU fallback or decline); the worst
    error / tolerance against the goldens and against the CPU path (over the frames that
    have that reference; <= 1 passes); the median run time and the frames per second of one
    worker's busy time; the worst output and its frame."""
    info = dict(info or {})
    groups: dict[tuple[str, str], list[dict]] = {}
    model_order = list(expected_frames or {})
    for r in sorted(
        results,
        key=lambda r: (model_order.index(r["model"]) if r["model"] in model_order else len(model_order), r["model"],
                       PATHS.index(r["path"]) if r["path"] in PATHS else 9),
    ):
        groups.setdefault((r["model"], r["path"]), []).append(r)
    header = (
        f"{'model':<13} {'path':<4} {'on MLU':>6} {'card runs':>9} {'frames':>6} {'failed':>6} {'vs golden':>9} {'vs cpu':>8} "
        f"{'ms/frame':>9} {'frames/s':>9}  worst output (error against its tolerance)"
    )
    lines = [header, "-" * len(header)]
    all_ok = True
    for (model, path), rs in groups.items():
        # An MLU frame's placement is judged here too, whatever produced the rows.
        misplaced = {id(r): placement.judge(r, placement.Expectation(off_card=r["off_card"]))
                     for r in rs if path == "mlu" and r["card_runs"] >= 0}
        bad = [r for r in rs if not r["ok"] or misplaced.get(id(r))]
        all_ok &= not bad
        secs = [r["seconds"] for r in rs if not math.isnan(r["seconds"])]
        ms = f"{statistics.median(secs) * 1e3:.1f}" if secs else "-"
        fps = f"{len(secs) / sum(secs):.1f}" if secs and sum(secs) > 0 else "-"
        worst = max(rs, key=lambda r: r["ratio"])
        nodes = sorted({r["on_mlu"] for r in rs if r["on_mlu"] >= 0})
        on_mlu = "/".join(map(str, nodes)) or "-"
        runs = sorted({r["card_runs"] for r in rs if r["card_runs"] >= 0})
        card = f"{runs[0]}-{runs[-1]}" if len(runs) > 1 else (str(runs[0]) if runs else "-")
        lines.append(
            f"{model:<13} {path:<4} {on_mlu:>6} {card:>9} {len(rs):>6} {len(bad):>6} {_worst(r['golden_ratio'] for r in rs):>9} "
            f"{_worst(r['cpu_ratio'] for r in rs):>8} {ms:>9} {fps:>9}  {worst['worst']} [{worst['frame']}]"
        )
        expected = sorted({r["off_card"] for r in rs if path == "mlu" and r["off_card"]})
        for why in expected:
            lines.append(f"{'':<13} {'':<4} {placement.Expectation(off_card=why).describe()}")
        if any(r["binding_check"] for r in rs):
            lines.append(f"{'':<13} {'':<4} MLU-OPS ran nodes: {placement.EMULATED_MLUOPS}")
        for r in bad[:5]:
            wrong = "; ".join(f"placement: {w}" for w in misplaced.get(id(r), []) if f"placement: {w}" not in r["error"])
            lines.append(f"{'':<13} {'':<4} FAIL {r['frame']} on {r['worker']}: {r['worst']} {r['error']} {wrong}".rstrip())
        if len(bad) > 5:
            lines.append(f"{'':<13} {'':<4} ... and {len(bad) - 5} more failed frames")
    if expected_frames is not None:
        paths = sorted({p for _, p in groups})
        if not paths:
            all_ok = False
            lines.append("FAIL no results")
        for model, frames in expected_frames.items():
            for path in paths:
                got = [r["frame"] for r in groups.get((model, path), [])]
                if sorted(got) != sorted(frames):
                    all_ok = False
                    lost = sorted(set(frames) - set(got))
                    dup = sorted({f for f in got if got.count(f) > 1})
                    lines.append(f"FAIL {model}/{path}: {len(lost)} frame(s) missing {lost[:3]}, {len(dup)} doubled {dup[:3]}")
    starts = [r["start"] for r in results if not math.isnan(r["start"])]
    ends = [r["end"] for r in results if not math.isnan(r["end"])]
    frames = len({(r["model"], r["frame"]) for r in results})
    window = (max(ends) - min(starts)) if starts else math.nan
    info.update(
        frames=frames,
        window=window,
        throughput=frames / window if window and window > 0 else math.nan,
        wall_throughput=frames / info["wall"] if info.get("wall") else math.nan,
        processes=len({r["worker"] for r in results}),
        ok=all_ok,
    )
    lines += [
        "",
        f"{info.get('mode', '?')}, {info.get('workers', '?')} worker(s), {info['processes']} process(es) reported: "
        f"{frames} frames on {len({p for _, p in groups})} path(s) in {info.get('wall', math.nan):.1f} s wall, "
        f"{info['throughput']:.1f} frames/s over the {window:.1f} s from the first frame's start to the last one's end",
    ]
    return "\n".join(lines), all_ok, info


# ============================================================================ command line
class _Parser(argparse.ArgumentParser):
    """Every user error as one line that names what to pass (argparse's own errors start
    with a usage block; a wrong file or folder would otherwise end in a traceback)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return value


def main(argv=None) -> int:
    ap = _Parser(
        prog="python -m onnxruntime_ep_mlu.regression",
        description="Model-level regression over a dataset of frames (CPU path and MLUExecutionProvider), "
        "in this process or on Ray.",
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--frames", metavar="DIR", help="frame folder: DIR/<model>/<frame>.npz (in.<input>, optional out.<output>)")
    src.add_argument("--generate", type=_positive, metavar="N", help="N generated frames per zoo model (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated frames (default 0)")
    ap.add_argument("--reference", default=None, metavar="FILE.py",
                    help="a Python file defining goldens(model, inputs) -> {output: array}, independent of this "
                         "library: the goldens of generated frames 1.. (default: the CPU path's result)")
    ap.add_argument("--limit", type=_positive, default=None, help="at most this many frames per model of --frames")
    ap.add_argument("--models", default=None, help="comma-separated subset of the models")
    ap.add_argument("--zoo", default=None, help="zoo.json (default: the zoo packaged with this module, onnxruntime_ep_mlu.zoo())")
    ap.add_argument("--paths", default="cpu,mlu", help="cpu, mlu or both (default)")
    ap.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=True,
                    help="the MLU path on the emulated card (default) or, --no-emulate, on real cards")
    ap.add_argument(
        "--library",
        default=None,
        help="libonnxruntime_ep_mlu.so (default: get_library_path() of this process, in-process and on a local "
        "cluster; of each worker, on a joined cluster)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads per session (default 1: the frames are the parallelism; 0: ONNX Runtime's default)",
    )
    ap.add_argument("--ray", action="store_true", help="start a local Ray cluster and run there")
    ap.add_argument("--address", default=None, help="join a Ray cluster: auto, ray://host:10001, host:6379")
    ap.add_argument("--num-cpus", type=_positive, default=None, help="CPUs of the local cluster (--ray; default: all)")
    ap.add_argument("--workers", default="2", help="actors (1 CPU each); a list (1,2) runs the same frames once per size")
    ap.add_argument("--batch-size", type=_positive, default=4, help="frames per actor task (default 4)")
    ap.add_argument("--runtime-env", default=None, help="Ray runtime_env as JSON (e.g. pip/py_modules for a multi-node cluster)")
    ap.add_argument("--crash-once", default=None, metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--write-frames", default=None, metavar="DIR", help="write the generated frames in the folder layout, then stop")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every per-frame result to FILE")
    args = ap.parse_args(argv)

    if args.library:
        args.library = os.path.abspath(args.library)  # the path as given, not against ORT's folder
        if not os.path.isfile(args.library):
            ap.error(f"--library {args.library}: file not found (pass the path of libonnxruntime_ep_mlu.so, or leave "
                     "--library out for the package's own)")
    if args.zoo is not None and not Path(args.zoo).is_file():
        ap.error(f"--zoo {args.zoo}: file not found (pass the path of a zoo.json such as the checkout's "
                 "models/zoo.json, or leave --zoo out for the packaged zoo)")
    zoo_json = args.zoo or default_zoo()
    names = [m for m in args.models.split(",") if m] if args.models else None
    if args.models is not None and not names:
        ap.error("--models takes a comma-separated list of model names")
    paths = [p for p in args.paths.split(",") if p]
    if not paths or any(p not in PATHS for p in paths):
        ap.error(f"--paths takes cpu and/or mlu, got {args.paths!r}")
    try:
        workers = [_positive(w) for w in str(args.workers).split(",") if w]
    except argparse.ArgumentTypeError as e:
        ap.error(f"--workers takes positive counts separated by commas: {e}")
    if not workers:
        ap.error("--workers takes positive counts separated by commas")
    runtime_env = {}
    if args.runtime_env:
        try:
            runtime_env = json.loads(args.runtime_env)
        except ValueError as e:
            ap.error(f"--runtime-env takes a JSON object ({e})")
        if not isinstance(runtime_env, dict):
            ap.error("--runtime-env takes a JSON object, e.g. '{\"pip\": [\"onnxruntime==1.31.1\"]}'")
    if args.runtime_env and not (args.ray or args.address):
        ap.error("--runtime-env is for Ray runs: pass --ray or --address too")
    if not args.library and not args.address and not args.write_frames:
        # In this process and on a local cluster the library is this process's: find it now.
        try:
            get_library_path()
        except FileNotFoundError as e:
            ap.error(f"{e}; or pass --library")

    if args.frames and args.write_frames:
        ap.error("--write-frames writes generated frames: it does not take --frames")
    if args.frames:
        try:
            models = load_dataset_models(args.frames, zoo_json, names)
            rows = dataset_frames(args.frames, models, args.limit)
        except (OSError, ValueError) as e:
            ap.error(f"--frames {args.frames}: {e}")
        expected = {m: [r["frame"] for r in rows if r["model"] == m] for m in models}
        source = f"{len(rows)} frames from {args.frames}"
    else:
        if zoo_json is None:
            ap.error("this package has no zoo (it was not built from the repository with pip): pass --zoo with the "
                     "path of the checkout's models/zoo.json")
        try:
            known = list(_read_zoo(zoo_json))
            unknown = [n for n in names or () if n not in known]
            if unknown:
                ap.error(f"--models: no model {', '.join(unknown)} in {zoo_json} (it has {','.join(known)})")
            models = load_zoo(zoo_json, names)
            generated_frames(models, 1)  # every model has a generator, checked before any work
        except (OSError, ValueError) as e:
            ap.error(f"--zoo {zoo_json}: {e}" if args.zoo else f"the packaged zoo: {e}")
        count = 20 if args.generate is None else args.generate
        if args.write_frames:
            try:
                n = write_frames(args.write_frames, models, count, args.seed)
            except OSError as e:
                ap.error(f"--write-frames {args.write_frames}: {e}")
            print(f"wrote {n} frames, with each model's model.onnx and tolerances.json, to {args.write_frames}/<model>/ "
                  f"(read them back with --frames {args.write_frames})")
            return 0
        try:
            reference = load_reference(args.reference) if args.reference else None
        except (OSError, ValueError) as e:
            ap.error(f"--reference {args.reference}: {e}")
        rows = generated_frames(models, count, args.seed, reference)
        expected = {m: [r["frame"] for r in rows if r["model"] == m] for m in models}
        source = (f"{count} generated frames per model (seed {args.seed}; frame 0: the zoo frame and its goldens; "
                  f"frames 1..: {'goldens of ' + args.reference if reference else 'the CPU path as their reference'})")
    print(f"{len(models)} model(s): {', '.join(models)}; {source}; paths {', '.join(paths)}"
          f"{' (emulated card)' if 'mlu' in paths and args.emulate else ''}")

    runs, failed_runs = [], 0
    if args.ray or args.address:
        import logging

        try:
            import ray
        except ImportError:
            print("--ray and --address need Ray, an optional extra of the package: pip install 'onnxruntime-ep-mlu[ray]' "
                  "(from the checkout: pip install './python[ray]')", file=sys.stderr)
            return 2
        logging.getLogger("ray.data").setLevel(logging.WARNING)

        library = args.library
        if args.address is None:
            # A local cluster: its workers are processes of this machine, and get this
            # process's library. When the package is imported from the checkout rather than
            # installed, the workers get its folder on their path too.
            if _repo_root() is not None:
                pkg_parent = str(Path(__file__).resolve().parent.parent)
                env_vars = dict(runtime_env.get("env_vars", {}))
                env_vars["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH")) if p)
                runtime_env["env_vars"] = env_vars
            library = library or get_library_path()
            # address="local": a new cluster, even when this machine runs one (`ray start`).
            ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                     runtime_env=runtime_env or None, log_to_driver=False)
        else:
            ray.init(address=args.address, runtime_env=runtime_env or None, log_to_driver=False)
        try:
            for w in workers:
                try:
                    runs.append(
                        run_ray(rows, models, workers=w, paths=paths, emulate=args.emulate, library=library,
                                threads=args.threads, batch_size=args.batch_size, crash_once=args.crash_once)
                    )
                except Exception as e:  # noqa: BLE001 -- e.g. a frame that kills its worker every time
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    print(f"\nREGRESSION: the Ray run with {w} worker(s) failed: {type(e).__name__}: {msg}")
                    failed_runs += 1
        finally:
            ray.shutdown()
    else:
        runs.append(
            run_in_process(rows, models, paths=paths, emulate=args.emulate, library=args.library, threads=args.threads)
        )

    ok, infos = failed_runs == 0, []
    for results, info in runs:
        table, run_ok, info = summarize(results, info, expected)
        ok &= run_ok
        infos.append(info)
        print()
        print(table)
    if len(infos) > 1:
        print()
        for info in infos:
            print(
                f"workers {info['workers']}: {info['throughput']:.1f} frames/s from the first frame to the last "
                f"({info['throughput'] / infos[0]['throughput']:.2f}x of {infos[0]['workers']}); "
                f"{info['wall_throughput']:.1f} frames/s over the wall time, actor start-up included "
                f"({info['wall_throughput'] / infos[0]['wall_throughput']:.2f}x)"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps([{"info": info, "results": r} for (r, _), info in zip(runs, infos)], default=str, indent=1)
        )
    print()
    print("every frame matches its reference on every path" if ok else "REGRESSION: some frames failed (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
