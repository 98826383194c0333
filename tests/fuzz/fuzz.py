"""Fuzz harness for libonnxruntime_ep_mlu: the nine `mluops` operators, each case run on two
paths, the custom-op library on ONNX Runtime's CPU provider ("cpu") and MLUExecutionProvider
on the emulated card ("mlu", MLU_EP_EMULATE=1).

A case is a single-node model plus feeds, generated deterministically from (seed, op, k): a
valid case of random shape (zero-size dimensions included), then, in most cases, one or two
mutations (dtype, rank, shape, index values, special floats, attributes), with input shapes
declared static, symbolic or mixed. Checks (docs/CONTRACT.md):
- outcome per path: ok / error / crash / memory abort / hang;
- an unmutated case on cpu agrees with the numpy reference (tests/python/reference*.py) in
  the output's accuracy class (§1.5);
- cpu and mlu agree: both error with the same message, or both succeed with agreeing
  outputs; one path alone running out of memory is a finding too;
- an error raised by the library names `mluops.<Op> node '<node>'` (§1.2);
- after a run-time error the session still runs the case's unmutated feeds correctly.

Cases run in persistent worker subprocesses (this file with --worker) under an RLIMIT_AS cap
and a per-case timeout, so that a crash, an abort or a hang costs one worker, not the run.

    python tests/fuzz/fuzz.py --lib target/release/libonnxruntime_ep_mlu.so --seed 1 --cases 2000
    python tests/fuzz/fuzz.py --lib ... --seed 1 --replay GetIndicePairs:17   # one case, verbose
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))

from conftest import SCHEMAS, build_model  # noqa: E402
from reference import (  # noqa: E402
    dsb_inputs,
    dsb_reference,
    gip_reference,
    gip_sites,
    prp_inputs,
    prp_reference,
    tib_reference,
    vpf_inputs,
    vpf_reference,
)
from reference_models import (  # noqa: E402
    dynamic_scatter_reference,
    indice_conv_reference,
    psroipool_reference,
    three_interpolate_reference,
)

sys.path.insert(0, str(REPO / "python"))
from onnxruntime_ep_mlu.placement import EMULATED_MLUOPS, emulated_mluops  # noqa: E402
from onnxruntime_ep_mlu.regression import DEFAULT_FLOAT, compare as compare_values  # noqa: E402

EP = "MLUExecutionProvider"
# Fixed order: an op's index seeds its cases, so an op's cases do not depend on --ops.
OPS = [
    "DynamicScatterBackward",
    "ThreeInterpolateBackward",
    "GetIndicePairs",
    "VoxelPoolingForward",
    "PsRoiPoolBackward",
    "DynamicScatter",
    "IndiceConv",
    "ThreeInterpolate",
    "PsRoiPool",
]
PATHS = ["cpu", "mlu"]
#: The accumulating class (§1.5) with regression.compare's per-element bound, by result
#: dtype: float32's is regression's default; a float16 result is rounded to 2^-11 of each
#: element, and two paths' roundings of float32 sums in different orders may differ by an
#: ulp, so its per-element bounds are two float16 ulps (2^-9), not float32's (as the Rust
#: judge's ELEM_REL_F16, docs/CONTRACT.md 1.5).
ACC = {np.dtype(np.float32): DEFAULT_FLOAT,
       np.dtype(np.float16): {**DEFAULT_FLOAT, "max_rel": 2.0**-9, "elem_rel": 2.0**-9}}
STARTUP_GRACE = 60.0  # seconds a fresh worker may take to start, on top of --timeout

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
# 16 and 4096: K = kd*kh*kw <= 4096 (§4.3) sits between 16^3 and 17 * 16^2
INT_ATTR_SPECIALS = [0, -1, -2, 16, 17, 4096, I32_MAX, 2**31, 2**32 + 1, 2**62, I32_MIN, -(2**62), I64_MAX]
FLOAT_ATTR_SPECIALS = [0.0, -0.0, -1.0, "nan", "inf", "-inf", 1e-45, 1e-30, 3e38]
STRING_ATTR_SPECIALS = ["", "max\0", "m\0ax", "sum\0\0", "\0", "MAX", "mean ", "m\u00e4x"]
INT32_VALUE_SPECIALS = [-1, -2, -7, I32_MIN, I32_MAX, I32_MIN + 1, I32_MAX - 1, 2**16, 2**24]
INT64_VALUE_SPECIALS = [-1, 0, 2**31 - 1, 2**31, 2**32, 2**62, -(2**62), I64_MAX, I64_MIN]
F32_SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 1e-45, 1e-40, -1e-39, 3e38, -3e38, 3.4028235e38]
F16_SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 6e-8, 1e-5, 65504.0, -65504.0]


# ============================================================================= cases
@dataclass
class Case:
    op: str
    k: int
    node: str
    attrs: dict  # typed, as conftest.build_model takes them; possibly mutated
    feeds: dict  # name -> array, node order; possibly mutated
    valid_attrs: dict
    valid_feeds: dict
    reference: object  # valid feeds -> expected outputs (numpy reference of the valid case)
    classes: list  # accuracy class per output: "exact" or "acc"
    shape_mode: str  # static / symbolic / mixed
    decl: list  # (name, dtype, declared shape) per input, for build_model
    threads: int
    mutations: list = field(default_factory=list)

    @property
    def attr_mutated(self) -> bool:
        return self.attrs != self.valid_attrs

    def describe(self) -> dict:
        """What a reproducer needs to know, JSON-able."""
        return {
            "op": self.op,
            "k": self.k,
            "node": self.node,
            "mutations": self.mutations,
            "attrs": self.attrs,
            "inputs": [
                {"name": n, "dtype": d, "shape": list(self.feeds[n].shape), "declared": s} for n, d, s in self.decl
            ],
            "shape_mode": self.shape_mode,
            "intra_op_threads": self.threads,
        }


def _dim(rng, hi: int, zero: float = 0.15) -> int:
    """A dimension in [1, hi], or 0 with probability `zero` (§1.3: zero sizes are legal)."""
    return 0 if rng.random() < zero else int(rng.integers(1, hi + 1))


def _i(v):
    return {"int": int(v)}


def _ints(v):
    return {"ints": [int(x) for x in v]}


# Valid generators: rng, big -> (attrs, feeds, reference(feeds) -> outputs, classes).
def gen_dynamic_scatter_backward(rng, big):
    n, m, c = _dim(rng, 4000 if big else 64), _dim(rng, 500 if big else 16), _dim(rng, 300 if big else 8)
    mode = str(rng.choice(["max", "mean", "sum"]))
    attrs = {} if mode == "max" and rng.random() < 0.3 else {"reduce_type": {"string": mode}}
    v = int(rng.integers(0, m + 1)) if rng.random() < 0.3 else None
    feeds = dsb_inputs(rng, n, m, c, mode, v)

    def ref(f):
        names = ["grad_voxel_feats", "feats", "voxel_feats", "point2voxel_map", "voxel_points_count"]
        return [dsb_reference(*(f[x] for x in names), mode)]

    return attrs, feeds, ref, ["exact"]


def gen_three_interpolate_backward(rng, big):
    b, c, n = _dim(rng, 4), _dim(rng, 256 if big else 8), _dim(rng, 2048 if big else 40)
    m = _dim(rng, 2048 if big else 20)
    if m == 0 and b and n:
        m = 1  # M = 0 with indices is an error (§3.4), not a valid case
    dtype = np.float16 if rng.random() < 0.3 else np.float32
    feeds = {
        "grad_output": rng.standard_normal((b, c, n)).astype(dtype),
        "indices": rng.integers(0, max(m, 1), (b, n, 3)).astype(np.int32),
        "weights": rng.random((b, n, 3)).astype(dtype),
    }
    return {"m": _i(m)}, feeds, lambda f: [tib_reference(f["grad_output"], f["indices"], f["weights"], m)], ["acc"]


def _gip_config(rng, big):
    """A random valid sparse-convolution descriptor (§4.3) and its optional-attribute choice."""
    mode = str(rng.choice(["conv", "subm", "transpose"]))
    batch = int(rng.integers(1, 4))
    spatial = [int(rng.integers(1, 25 if big else 9)) for _ in range(3)]
    ksize, stride, pad, dil, opad = [], [], [], [], []
    for axis in range(3):
        k = int(rng.integers(1, 5))
        if mode == "subm":
            d = int(rng.integers(1, 3))
            if d * (k - 1) % 2:
                d = 2
            s, p, op = 1, d * (k - 1) // 2, 0
        elif mode == "transpose":
            s, d, p, op = int(rng.integers(1, 4)), 1, int(rng.integers(0, 3)), int(rng.integers(0, 2))
            if (spatial[axis] - 1) * s - 2 * p + (k - 1) + op + 1 <= 0:
                p = 0
        else:
            s = int(rng.integers(1, 4))
            d = 1 if s > 1 else int(rng.integers(1, 3))
            p, op = int(rng.integers(0, 3)), int(rng.integers(0, 2))
            while (spatial[axis] + 2 * p - d * (k - 1) - 1) // s + 1 <= 0:
                p += 1
        ksize.append(k), stride.append(s), pad.append(p), dil.append(d), opad.append(op)
    subm, transpose = int(mode == "subm"), int(mode == "transpose")
    attrs = {"batch_size": _i(batch), "spatial_shape": _ints(spatial), "kernel_size": _ints(ksize)}
    optional = {
        "stride": (stride, [1, 1, 1]),
        "padding": (pad, [0, 0, 0]),
        "dilation": (dil, [1, 1, 1]),
        "output_padding": (opad, [0, 0, 0]),
        "subm": (subm, 0),
        "transpose": (transpose, 0),
        "inverse": (0, 0),
    }
    for name, (value, default) in optional.items():
        # defaults are sometimes spelled out, sometimes left to the library
        if value != default or rng.random() < 0.3:
            attrs[name] = _ints(value) if isinstance(value, list) else _i(value)
    geometry = (batch, spatial, ksize, stride, pad, dil, opad, subm, transpose)
    return attrs, geometry


def gen_get_indice_pairs(rng, big):
    attrs, g = _gip_config(rng, big)
    batch, spatial, subm = g[0], g[1], g[7]
    count = _dim(rng, 600 if big else 60)
    sites = gip_sites(rng, batch, spatial, count, 0 if subm else int(rng.integers(0, 4)))
    return attrs, {"indices": sites}, lambda f: list(gip_reference(f["indices"], *g)), ["exact"] * 3


def gen_voxel_pooling_forward(rng, big):
    b, n, c = _dim(rng, 3), _dim(rng, 20000 if big else 50), _dim(rng, 128 if big else 6)
    nx, ny, nz = (int(rng.integers(1, 65 if big else 9)) for _ in range(3))
    feeds = vpf_inputs(rng, b, n, c, nx, ny, nz)

    def ref(f):
        return list(vpf_reference(f["geom_xyz"], f["input_features"], nx, ny, nz))

    return {"voxel_num": _ints([nx, ny, nz])}, feeds, ref, ["acc", "exact"]


def _psroi_geometry(rng, big):
    r = _dim(rng, 50 if big else 8)
    ph, od = int(rng.integers(1, 8 if big else 4)), int(rng.integers(1, 65 if big else 5))
    nb = int(rng.integers(0 if r == 0 else 1, 4))
    h, w = _dim(rng, 32 if big else 10, 0.1), _dim(rng, 32 if big else 10, 0.1)
    scale = float(rng.choice([1.0, 0.5, 0.25, 0.0625, 2.0]))
    attrs = {"pooled_height": _i(ph), "pooled_width": _i(ph), "spatial_scale": {"float": scale}, "output_dim": _i(od)}
    return attrs, (r, ph, od, nb, h, w, scale)


def gen_psroipool_backward(rng, big):
    attrs, (r, ph, od, nb, h, w, scale) = _psroi_geometry(rng, big)
    feeds = prp_inputs(rng, r, ph, od, nb, h, w, scale)

    def ref(f):
        return [prp_reference(f["top_grad"], f["rois"], f["mapping_channel"], f["bottom_shape"], ph, ph, scale, od)]

    return attrs, feeds, ref, ["acc"]


def gen_dynamic_scatter(rng, big):
    n, c, d = _dim(rng, 2000 if big else 60), _dim(rng, 32 if big else 6), int(rng.integers(1, 5))
    hi = 1000 if rng.random() < 0.2 else 4  # few distinct coordinates: many points per voxel
    mode = str(rng.choice(["max", "mean", "sum"]))
    attrs = {} if mode == "max" and rng.random() < 0.3 else {"reduce_type": {"string": mode}}
    feeds = {
        "feats": rng.standard_normal((n, c)).astype(np.float32),
        "coors": rng.integers(-1, hi, (n, d)).astype(np.int32),
    }
    classes = ["exact" if mode == "max" else "acc"] + ["exact"] * 4
    return attrs, feeds, lambda f: list(dynamic_scatter_reference(f["feats"], f["coors"], mode)), classes


def gen_indice_conv(rng, big):
    _, g = _gip_config(rng, big)
    batch, spatial, subm = g[0], g[1], g[7]
    sites = gip_sites(rng, batch, spatial, _dim(rng, 300 if big else 40), 0 if subm else int(rng.integers(0, 3)))
    pairs, out_indices, num = gip_reference(sites, *g)
    inverse = int(rng.integers(0, 2))
    cin, cout = _dim(rng, 16 if big else 5), _dim(rng, 16 if big else 5)
    # inverse: the features are the forward output's, the output rows the forward input's
    rows_in, out_rows = (len(out_indices), sites) if inverse else (len(sites), out_indices)
    feeds = {
        "features": rng.standard_normal((rows_in, cin)).astype(np.float32),
        "filters": rng.standard_normal((len(num), cin, cout)).astype(np.float32),
        "indice_pairs": pairs,
        "indice_num": num,
        "out_indices": out_rows,
    }
    if rng.random() < 0.5:
        feeds["bias"] = rng.standard_normal(cout).astype(np.float32)
    attrs = {"inverse": _i(inverse)} if inverse or rng.random() < 0.3 else {}

    def ref(f):
        rulebook = (f["indice_pairs"], f["indice_num"], f["out_indices"].shape[0])
        return [indice_conv_reference(f["features"], f["filters"], *rulebook, f.get("bias"), inverse)]

    return attrs, feeds, ref, ["acc"]


def gen_three_interpolate(rng, big):
    b, c, n = _dim(rng, 4), _dim(rng, 64 if big else 8), _dim(rng, 1024 if big else 40)
    m = _dim(rng, 512 if big else 20)
    if m == 0 and b and n:
        m = 1
    dtype = np.float16 if rng.random() < 0.3 else np.float32
    feeds = {
        "features": rng.standard_normal((b, c, m)).astype(dtype),
        "indices": rng.integers(0, max(m, 1), (b, n, 3)).astype(np.int32),
        "weights": rng.random((b, n, 3)).astype(dtype),
    }
    return {}, feeds, lambda f: [three_interpolate_reference(f["features"], f["indices"], f["weights"])], ["acc"]


def gen_psroipool(rng, big):
    attrs, (r, ph, od, nb, h, w, scale) = _psroi_geometry(rng, big)
    rois = prp_inputs(rng, r, ph, od, nb, h, w, scale)["rois"]
    feeds = {"input": rng.standard_normal((nb, h, w, ph * ph * od)).astype(np.float32), "rois": rois}
    return attrs, feeds, lambda f: list(psroipool_reference(f["input"], f["rois"], ph, ph, scale, od)), ["acc", "exact"]


GENERATORS = {
    "DynamicScatterBackward": gen_dynamic_scatter_backward,
    "ThreeInterpolateBackward": gen_three_interpolate_backward,
    "GetIndicePairs": gen_get_indice_pairs,
    "VoxelPoolingForward": gen_voxel_pooling_forward,
    "PsRoiPoolBackward": gen_psroipool_backward,
    "DynamicScatter": gen_dynamic_scatter,
    "IndiceConv": gen_indice_conv,
    "ThreeInterpolate": gen_three_interpolate,
    "PsRoiPool": gen_psroipool,
}


# ----------------------------------------------------------------------------- mutations
def _cast(a: np.ndarray, dtype) -> np.ndarray:
    """a converted, saturating: out-of-range values become the extremes (or inf), NaN 0."""
    dtype = np.dtype(dtype)
    with np.errstate(all="ignore"):
        if dtype.kind == "i":
            info = np.iinfo(dtype)
            if a.dtype.kind == "f":
                # float64 cannot hold int64's maximum; 2^63 - 1024 is the largest below it
                top = min(float(info.max), 2.0**63 - 1024)
                return np.clip(np.nan_to_num(a.astype(np.float64)), info.min, top).astype(dtype)
            return np.clip(a, info.min, info.max).astype(dtype)
        return a.astype(dtype)


def _reshaped(a: np.ndarray, shape) -> np.ndarray | None:
    """a's values cycled into a new shape (zeros when a is empty): values stay plausible, so the
    shape is what is wrong. None when that would not fit in memory (after a `huge` mutation)."""
    if math.prod(shape) > 2**26:
        return None
    return np.resize(a, shape) if a.size else np.zeros(shape, a.dtype)


def mutate_dtype(rng, case):
    name = str(rng.choice(list(case.feeds)))
    a = case.feeds[name]
    options = {"float32": ["float64", "int32", "float16", "int64"], "float16": ["float32", "float64", "int32"],
               "int32": ["float32", "int64", "float64", "float16"], "int64": ["int32", "float32", "float64"]}
    new = str(rng.choice(options[a.dtype.name]))
    case.feeds[name] = _cast(a, new)
    return f"dtype {name} {a.dtype.name} -> {new}"


def mutate_rank(rng, case):
    name = str(rng.choice(list(case.feeds)))
    shape = list(case.feeds[name].shape)
    if shape and rng.random() < 0.5:
        axis = int(rng.integers(0, len(shape)))
        del shape[axis]
        what = f"drop axis {axis}"
    else:
        axis = int(rng.integers(0, len(shape) + 1))
        shape.insert(axis, int(rng.integers(1, 3)))
        what = f"add axis {axis} of {shape[axis]}"
    new = _reshaped(case.feeds[name], shape)
    if new is None:
        return None
    case.feeds[name] = new
    return f"rank {name}: {what} -> {shape}"


def mutate_shape(rng, case):
    names = [n for n, a in case.feeds.items() if a.ndim]
    if not names:
        return None
    name = str(rng.choice(names))
    shape = list(case.feeds[name].shape)
    axis = int(rng.integers(0, len(shape)))
    old = shape[axis]
    shape[axis] = int(rng.choice([v for v in {old + 1, max(old - 1, 0), 0, 1, old + 3, 2 * old + 1} if v != old]))
    new = _reshaped(case.feeds[name], shape)
    if new is None:
        return None
    case.feeds[name] = new
    return f"shape {name} axis {axis}: {old} -> {shape[axis]}"


def _symbols(shape: str) -> list:
    """A schema shape such as "[B, C, N]" as its dimension names (numbers stay strings)."""
    return [d.strip() for d in shape.strip("[]").split(",") if d.strip()]


def mutate_huge(rng, case):
    """One named dimension of the schema (e.g. C) made huge in every input holding it, where each
    of them stays empty through another zero dimension: size arithmetic (element counts, int32
    offsets, the provider's static limits) must not overflow. Outputs may be empty or huge."""
    shapes = {f["name"]: _symbols(f["shape"]) for f in SCHEMAS[case.op]["inputs"] if f["name"] in case.feeds}
    options = []
    for sym in sorted({d for dims in shapes.values() for d in dims if d.isidentifier()}):
        holders = {n: dims.index(sym) for n, dims in shapes.items() if sym in dims}
        if all(
            case.feeds[n].ndim == len(shapes[n]) and 0 in case.feeds[n].shape[:i] + case.feeds[n].shape[i + 1:]
            for n, i in holders.items()
        ):
            options.append((sym, holders))
    if not options:
        return None
    sym, holders = options[int(rng.integers(0, len(options)))]
    huge = int(rng.choice([I32_MAX, 2**31, 2**32 + 3, 2**40, 2**52]))
    new = {}
    for n, i in holders.items():
        shape = list(case.feeds[n].shape)
        shape[i] = huge
        try:
            new[n] = np.zeros(shape, case.feeds[n].dtype)
        except ValueError:  # numpy's own limit on the product of the non-zero dimensions
            return None
    case.feeds.update(new)
    return f"huge {sym} = {huge} in {', '.join(holders)} (empty)"


def _poke(rng, a: np.ndarray, values) -> tuple[np.ndarray, str]:
    """a with special values written at a few positions, a tenth of them, or all of them."""
    a = a.copy()
    flat = a.reshape(-1)
    how = str(rng.choice(["one", "few", "tenth", "all"], p=[0.4, 0.3, 0.2, 0.1]))
    count = {"one": 1, "few": 3, "tenth": max(1, flat.size // 10), "all": flat.size}[how]
    where = rng.choice(flat.size, size=min(count, flat.size), replace=False)
    values = np.array(values, dtype=np.float64 if a.dtype.kind == "f" else a.dtype)
    picked = values[rng.integers(0, len(values), len(where))]
    with np.errstate(over="ignore"):  # 3e38 in a float16 tensor is meant to become inf
        flat[where] = picked.astype(a.dtype)
    shown = sorted({repr(float(v)) if a.dtype.kind == "f" else str(int(v)) for v in np.unique(picked)})
    return a, f"{how} ({len(where)}) <- {', '.join(shown[:4])}"


def mutate_index(rng, case):
    names = [n for n, a in case.feeds.items() if a.dtype.kind == "i" and a.size]
    if not names:
        return None
    name = str(rng.choice(names))
    a = case.feeds[name]
    top, hi = int(a.max()), int(np.iinfo(a.dtype).max)
    specials = INT64_VALUE_SPECIALS if a.dtype == np.int64 else INT32_VALUE_SPECIALS
    case.feeds[name], what = _poke(rng, a, specials + [min(top + 1, hi), min(top + 2, hi)])
    return f"index {name}: {what}"


def mutate_float(rng, case):
    names = [n for n, a in case.feeds.items() if a.dtype.kind == "f" and a.size]
    if not names:
        return None
    name = str(rng.choice(names))
    a = case.feeds[name]
    case.feeds[name], what = _poke(rng, a, F16_SPECIALS if a.dtype == np.float16 else F32_SPECIALS)
    return f"float {name}: {what}"


def _typed(kind: str, like):
    """A value of attribute kind `kind` derived from `like` (wrong-type mutations keep the value)."""
    scalar = like[0] if isinstance(like, list) and like else (like if isinstance(like, (int, float)) else 3)
    if kind == "int":
        return {"int": int(scalar) if math.isfinite(float(scalar)) else 3}
    if kind == "ints":
        return {"ints": like if isinstance(like, list) else [int(scalar)] * 3}
    if kind == "float":
        return {"float": float(scalar)}
    return {"string": "max" if isinstance(like, str) else str(scalar)}


def mutate_attr(rng, case):
    schema = SCHEMAS[case.op].get("attributes", [])
    if not schema:
        return None
    spec = schema[int(rng.integers(0, len(schema)))]
    name, kind = spec["name"], spec["type"]
    current = case.attrs.get(name)
    value = next(iter(current.values())) if current else spec.get("default", [1, 1, 1] if kind == "ints" else 1)
    how = str(rng.choice(["missing", "type", "value", "value"]))
    if how == "missing":
        if name not in case.attrs:
            return None
        del case.attrs[name]
        return f"attr {name}: missing ({'required' if spec['required'] else 'default applies'})"
    if how == "type":
        new_kind = str(rng.choice([k for k in ["int", "ints", "float", "string"] if k != kind]))
        case.attrs[name] = _typed(new_kind, value)
        return f"attr {name}: {kind} given as {case.attrs[name]}"
    if kind == "int":
        new = {"int": int(rng.choice(INT_ATTR_SPECIALS))}
    elif kind == "ints":
        values = list(value) if isinstance(value, list) and value else [1, 1, 1]
        if rng.random() < 0.3:
            new = {"ints": [values[0]] * int(rng.choice([0, 1, 2, 4]))}  # wrong length
        else:
            values[int(rng.integers(0, len(values)))] = int(rng.choice(INT_ATTR_SPECIALS))
            new = {"ints": values}
    elif kind == "float":
        new = {"float": FLOAT_ATTR_SPECIALS[int(rng.integers(0, len(FLOAT_ATTR_SPECIALS)))]}
    else:
        new = {"string": str(rng.choice(STRING_ATTR_SPECIALS))}
    case.attrs[name] = new
    return f"attr {name} = {new}"


MUTATORS = {
    "dtype": mutate_dtype,
    "rank": mutate_rank,
    "shape": mutate_shape,
    "index": mutate_index,
    "float": mutate_float,
    "attr": mutate_attr,
    "huge": mutate_huge,
}


def make_case(seed: int, op: str, k: int) -> Case:
    """The k-th case of op for seed: a function of (seed, op, k) only."""
    rng = np.random.default_rng([seed, OPS.index(op), k])
    big = rng.random() < 0.1  # larger sizes reach the multi-tile paths of the MLU kernels
    attrs, feeds, reference, classes = GENERATORS[op](rng, big)
    case = Case(
        op=op,
        k=k,
        node=f"fz{k}",
        attrs={n: dict(v) for n, v in attrs.items()},
        feeds=dict(feeds),
        valid_attrs=attrs,
        valid_feeds=feeds,
        reference=reference,
        classes=classes,
        shape_mode=str(rng.choice(["static", "symbolic", "mixed"])),
        decl=[],
        threads=int(rng.choice([1, 2])),
    )
    n_mut = int(rng.choice([0, 1, 2], p=[0.3, 0.6, 0.1]))
    used = set()
    while len(case.mutations) < n_mut:
        # the first mutator that applies, in a random order (some need a non-empty tensor); two
        # mutations are of different kinds, so that the second does not undo the first
        for kind in rng.permutation([m for m in MUTATORS if m not in used]):
            what = MUTATORS[str(kind)](rng, case)
            if what:
                case.mutations.append(what)
                used.add(str(kind))
                break
        else:
            break
    for name, a in case.feeds.items():
        shape = [
            f"{name}_{i}" if case.shape_mode == "symbolic" or (case.shape_mode == "mixed" and rng.random() < 0.5) else d
            for i, d in enumerate(a.shape)
        ]
        case.decl.append((name, a.dtype.name, shape))
    return case


# ============================================================================= checks
def _at(index) -> tuple:
    return tuple(int(i) for i in index)


def compare(got: np.ndarray, want: np.ndarray, cls: str, what: str) -> str | None:
    """None when `got` agrees with `want` in accuracy class `cls` (§1.5), else why not.
    Floats: NaN in the same places; "exact" is bit-identical otherwise (sign of zero
    included), "acc" needs equal infinities and, on the finite rest, regression.compare under
    ACC of `got`'s dtype (diff1, diff2 <= 3e-3 and every element within its bound), "loose"
    (overflow_prone) only the same shape."""
    if got.shape != want.shape:
        return f"{what}: shape {got.shape} vs {want.shape}"
    if got.size == 0:  # nothing to compare; widening an empty [0, 2^52] array would not fit numpy
        return None
    if got.dtype.kind != "f" or want.dtype.kind != "f":
        if got.dtype != want.dtype:
            return f"{what}: dtype {got.dtype} vs {want.dtype}"
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)
            at = _at(bad[0])
            return f"{what}: {len(bad)} values differ, first at {at}: {got[at]} vs {want[at]}"
        return None
    if cls == "loose":
        return None
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(g)
    if not np.array_equal(nan, np.isnan(w)):
        at = _at(np.argwhere(nan != np.isnan(w))[0])
        return f"{what}: NaN positions differ, first at {at}: {g[at]} vs {w[at]}"
    if cls == "exact":
        same = (g == w) & (np.signbit(g) == np.signbit(w)) | nan
        if not same.all():
            at = _at(np.argwhere(~same)[0])
            return f"{what}: {np.count_nonzero(~same)} values differ (exact class), first at {at}: {g[at]} vs {w[at]}"
        return None
    inf = np.isinf(g) | np.isinf(w)
    if not np.array_equal(g[inf], w[inf]):
        at = _at(np.argwhere(inf & (g != w))[0])
        return f"{what}: infinities differ, first at {at}: {g[at]} vs {w[at]}"
    finite = ~(nan | inf)
    # Both in float64: the reference is float64 for any float result dtype.
    ratio, text = compare_values(g[finite], w[finite], ACC.get(got.dtype, DEFAULT_FLOAT))
    return None if ratio <= 1 else f"{what}: {text}"


def binding_note() -> str:
    """What the mlu path's agreement with the cpu path means when its MLU-OPS backend runs the
    emulated libmluops (test.sh's MLU-OPS stage), else ""."""
    backend = os.environ.get("MLU_EP_BACKEND", "auto")
    if backend in ("mluops", "auto") and emulated_mluops(os.environ.get("MLU_EP_MLUOPS_LIBRARY")):
        return f"mlu path on mlu_backend={backend} with the emulated libmluops: mlu vs cpu is {EMULATED_MLUOPS}"
    return ""


def overflow_prone(case: Case) -> bool:
    """Whether a summed input holds a finite value so large that float32 sums (float16 results)
    may overflow: then the accumulating class's freedom of summation order decides between
    finite, +-inf and NaN (3e38 + 3e38 - inf is NaN, 3e38 - inf + 3e38 is -inf), and such
    outputs are compared in shape only. `rois` only places bins (exact, §1.4): not summed."""
    for name, a in case.feeds.items():
        if a.dtype.kind == "f" and name != "rois" and a.size:
            finite = np.abs(a[np.isfinite(a)].astype(np.float64))
            if finite.size and finite.max() >= (1e3 if a.dtype == np.float16 else 1e30):
                return True
    return False


def compare_all(got, want, classes, names, same_dtype: bool = False) -> str | None:
    """The first disagreement of two output lists; same_dtype between two paths (a float64
    reference stands for any float dtype)."""
    if len(got) != len(want):
        return f"{len(got)} outputs vs {len(want)}"
    for g, w, cls, name in zip(got, want, classes, names):
        g, w = np.asarray(g), np.asarray(w)
        why = f"{name}: dtype {g.dtype} vs {w.dtype}" if same_dtype and g.dtype != w.dtype else None
        why = why or compare(g, w, cls, name)
        if why:
            return why
    return None


def message_names_node(op: str, node: str, msg: str) -> str | None:
    """None when the error names the node; "ours" for a library message (`mluops.<Op>`) without
    `mluops.<Op> node '<node>'` (a contract violation, §1.2), "ort" for an ONNX Runtime message
    that does not mention the node (reported only)."""
    if f"mluops.{op}" in msg:
        return None if f"mluops.{op} node '{node}'" in msg else "ours"
    return None if node in msg else "ort"


def offcard_reason(report: str, node: str) -> str | None:
    """Why `node` did not run on the card, from a traffic report (src/ep/traffic.rs): its
    decline at placement, or its run-time fallback to the CPU; None when it ran there or no
    session reached placement."""
    lines = [json.loads(x) for x in Path(report).read_text().splitlines() if x.strip()]
    for line in lines:
        if line.get("node") == node and line.get("backend") == "cpu":
            return "run time: " + line.get("why", "?")
        for d in line.get("declines", []):
            if d.get("node") == node:
                return "placement: " + d.get("why", "?")
    return None


#: Why a valid node may stay off the card, each a rule the docs state (a reason matching
#: none of them is an `offcard` finding); tests/fuzz/offcard.json, which the in-process
#: fuzz targets read too (fuzz/src/lib.rs).
DOCUMENTED_OFFCARD = [
    (re.compile(rule["reason"]), rule["where"])
    for rule in json.loads((Path(__file__).with_name("offcard.json")).read_text())
]


def documented_offcard(why: str) -> bool:
    """Every backend's part of the reason ("mluops: ...; bang: ...") matches a documented rule."""
    parts = re.split(r"; (?=(?:mluops|bang): )", why)
    return all(any(p.search(part) for p, _ in DOCUMENTED_OFFCARD) for part in parts)


def conforms(feeds: dict, decl: list) -> bool:
    """Whether the feeds fit the model's declared inputs (dtype, rank, static dims)."""
    for name, dtype, shape in decl:
        a = feeds.get(name)
        if a is None or a.dtype.name != dtype or a.ndim != len(shape):
            return False
        if any(isinstance(d, int) and d != s for d, s in zip(shape, a.shape)):
            return False
    return True


# ============================================================================= worker
class Runner:
    """Runs cases in this process (the worker): sessions on both paths and the checks."""

    def __init__(self, lib: str):
        import onnxruntime as ort

        self.ort = ort
        self.lib = lib
        ort.set_default_logger_severity(4)
        os.environ["MLU_EP_EMULATE"] = "1"
        if not any(d.ep_name == EP for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(EP, lib)
        self.devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
        if not self.devices:
            raise RuntimeError("MLUExecutionProvider registered but offers no device")
        # The provider's traffic report, one per worker: where each mlu-path node ran and why.
        fd, self.report = tempfile.mkstemp(prefix="mluops-fuzz-traffic-", suffix=".jsonl")
        os.close(fd)

    def session(self, case: Case, path: str, model: bytes):
        ort = self.ort
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.intra_op_num_threads = case.threads
        # Without the arena: after a failed huge request ONNX Runtime's BFC arena keeps the grown
        # region size and, on the next small allocation, reserves all the address space left under
        # RLIMIT_AS (ConstantOfShape does the same); that is ONNX Runtime's state, not the library's.
        so.enable_cpu_mem_arena = False
        if path == "cpu":
            so.register_custom_ops_library(self.lib)
            return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        so.add_provider_for_devices(self.devices, {})
        return ort.InferenceSession(model, so)

    def run_path(self, case: Case, path: str) -> tuple[dict, list | None]:
        """(result, outputs) of one path; result is JSON-able. On the mlu path, `offcard` is
        the provider's reason when the node did not run on the card (its traffic report)."""
        if path != "mlu":
            return self._run_path(case, path)
        import gc

        open(self.report, "w").close()
        os.environ["MLU_EP_TRAFFIC"] = self.report
        try:
            res, outs = self._run_path(case, path)
            gc.collect()  # the session's end writes the provider's session line
        finally:
            del os.environ["MLU_EP_TRAFFIC"]
        res["offcard"] = offcard_reason(self.report, case.node)
        return res, outs

    def _run_path(self, case: Case, path: str) -> tuple[dict, list | None]:
        res = {"outcome": "ok", "phase": None, "msg": None, "noname": None, "on_mlu": None, "rechecked": False,
               "offcard": None, "kinds": sorted({m.split()[0] for m in case.mutations}) or ["none"], "findings": []}
        names = [o["name"] for o in SCHEMAS[case.op]["outputs"]]
        model = build_model(case.op, case.attrs, case.decl, case.node)
        try:
            sess = self.session(case, path, model)
        except Exception as e:  # onnxruntime raises its own exception classes
            return self._error(res, case, "create", e), None
        if path == "mlu":
            placed = {n.name: s.ep_name for s in sess.get_provider_graph_assignment_info() for n in s.get_nodes()}
            res["on_mlu"] = placed.get(case.node) == EP
        try:
            outs = sess.run(None, case.feeds)
        except Exception as e:
            self._error(res, case, "run", e)
            self._recover(res, case, sess, names)
            return res, None
        if path == "cpu" and not case.mutations:
            try:
                why = compare_all(outs, case.reference(case.valid_feeds), case.classes, names)
            except MemoryError:  # the reference does not fit under the worker's cap
                why = None
            if why:
                res["findings"].append(("disagree", f"cpu vs numpy reference: {why}"))
        return res, outs

    def _error(self, res, case, phase, e):
        msg = str(e)
        res.update(outcome="error", phase=phase, msg=msg[:400], noname=message_names_node(case.op, case.node, msg))
        if phase == "create" and not case.attr_mutated and conforms(case.valid_feeds, case.decl):
            # nothing about this model is invalid until it runs: creation must succeed
            res["findings"].append(("disagree", f"session creation failed on a valid model: {msg[:300]}"))
        elif not case.mutations:
            res["findings"].append(("disagree", f"valid case rejected at {phase}: {msg[:300]}"))
        return res

    def _recover(self, res, case, sess, names):
        """After a run-time error the same session must run the unmutated feeds correctly. Skipped
        when the attributes were mutated (no valid input is known for them) or when the valid
        feeds do not fit the model's declared inputs (ONNX Runtime would reject them first)."""
        if case.attr_mutated or not case.mutations or not conforms(case.valid_feeds, case.decl):
            return
        try:
            outs = sess.run(None, case.valid_feeds)
        except Exception as e:
            res["findings"].append(("unusable", f"valid feeds fail after the error: {str(e)[:300]}"))
            return
        why = compare_all(outs, case.reference(case.valid_feeds), case.classes, names)
        if why:
            res["findings"].append(("unusable", f"valid feeds after the error disagree with the reference: {why}"))
        res["rechecked"] = True

    def cross_check(self, case: Case, results: dict, outputs: dict) -> tuple[list, bool]:
        """(findings, loose) of cpu vs mlu: both error, or both succeed with agreeing outputs;
        loose when the accumulating outputs' values could not be compared (overflow_prone)."""
        cpu, mlu = results["cpu"], results["mlu"]
        if cpu["outcome"] != mlu["outcome"]:
            which = "mlu" if mlu["outcome"] == "error" else "cpu"
            msg = results[which]["msg"]
            # Only one path ran out of memory: a finding (failing) of its own kind, so that a
            # path that needs more memory than the other for the same node is seen. (The
            # emulated card holds every output twice, in card memory, which is host memory
            # here, and in ONNX Runtime's host copy; the fixed-seed runs have none.)
            kind = "oom" if OUT_OF_MEMORY.search(msg or "") else "disagree"
            return [(kind, f"only {which} fails: {msg}")], False
        if cpu["outcome"] != "ok":
            return self.compare_messages(cpu, mlu), False
        loose = overflow_prone(case) and "acc" in case.classes
        classes = ["loose" if loose and c == "acc" else c for c in case.classes]
        names = [o["name"] for o in SCHEMAS[case.op]["outputs"]]
        try:
            why = compare_all(outputs["mlu"], outputs["cpu"], classes, names, same_dtype=True)
        except MemoryError:
            # The comparison itself does not fit under the worker's cap: not compared.
            return [], True
        return ([("disagree", f"mlu vs cpu: {why}")] if why else []), loose


    @staticmethod
    def compare_messages(cpu: dict, mlu: dict) -> list:
        """Both paths failed: the same rule must give the same error, in the same phase, word
        for word. Out of memory on both is the one exception: ONNX Runtime's host allocator
        (std::bad_alloc) and the card's allocator word it differently, so both need only say
        that memory ran out. Every both-failed case counts as `msgcmp` (see handle_lines)."""
        findings = []
        if cpu["phase"] != mlu["phase"]:
            findings.append(("message", f"cpu fails at {cpu['phase']}, mlu at {mlu['phase']}: {cpu['msg']} | {mlu['msg']}"))
        elif cpu["msg"] != mlu["msg"] and not (OUT_OF_MEMORY.search(cpu["msg"]) and OUT_OF_MEMORY.search(mlu["msg"])):
            findings.append(("message", f"the messages differ: cpu {cpu['msg']!r} | mlu {mlu['msg']!r}"))
        return findings


def cap_address_space(gib: float) -> None:
    cap = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def worker_main(args) -> None:
    """Reads one JSON request per line ({seed, op, k, paths}); writes JSON lines: {"stage": path}
    before each path, {"path": path, "result": ...} after it, {"done": cross-check findings}."""
    cap_address_space(args.mem_gib)
    # The protocol gets its own descriptor: anything the library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    runner = Runner(args.lib)

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    for line in iter(sys.stdin.readline, ""):
        req = json.loads(line)
        try:
            case = make_case(req["seed"], req["op"], req["k"])
            results, outputs = {}, {}
            for path in req["paths"]:
                send({"stage": path})
                results[path], outputs[path] = runner.run_path(case, path)
                send({"path": path, "result": results[path]})
            send({"stage": "compare"})
            findings, loose = runner.cross_check(case, results, outputs) if len(results) == 2 else ([], False)
            both_failed = len(results) == 2 and all(r["outcome"] == "error" for r in results.values())
            send({"done": findings, "loose": loose, "msgcmp": both_failed})
        except Exception:
            send({"internal": traceback.format_exc()})


# ============================================================================= parent
class Worker:
    """One worker subprocess and the case it is running."""

    def __init__(self, args, logdir: Path, wid: int):
        self.args = args
        self.log = open(logdir / f"worker{wid}.stderr", "ab+")
        self.start()

    def start(self):
        env = dict(os.environ, MLU_EP_EMULATE="1")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--lib", self.args.lib,
               "--mem-gib", str(self.args.mem_gib)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.buf = b""
        self.task = None
        self.fresh = True

    def assign(self, task: dict):
        # a fresh worker's first case also waits for its start (imports, EP registration)
        deadline = time.monotonic() + self.args.timeout + (STARTUP_GRACE if self.fresh else 0.0)
        self.fresh = False
        self.task = dict(task, stage=None, deadline=deadline, log_from=os.fstat(self.log.fileno()).st_size)
        self.proc.stdin.write((json.dumps({k: task[k] for k in ("seed", "op", "k", "paths")}) + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> list | None:
        """Complete protocol lines available now; None at end of file (the worker died)."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            return None
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in lines if x]

    def stderr_tail(self) -> str:
        self.log.flush()
        self.log.seek(self.task["log_from"] if self.task else 0)
        return self.log.read()[-3000:].decode(errors="replace")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def restart(self):
        self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.start()


COLUMNS = ["cases", "ok", "error", "crash", "hang", "memabort", "disagree", "unusable", "noname",
           "unmutated", "rechecked", "loose", "on_mlu", "off_card", "offcard", "ort_noname", "oom", "msgcmp", "message"]
# A clean error saying memory ran out (ours, ONNX Runtime's, numpy's).
OUT_OF_MEMORY = re.compile(r"out of memory|bad_alloc|Unable to allocate|MemoryError", re.IGNORECASE)
FAILING = {"crash", "hang", "memabort", "disagree", "unusable", "noname", "internal", "oom", "message", "offcard"}


class Fuzz:
    def __init__(self, args):
        self.args = args
        self.stats = defaultdict(Counter)  # (op, path) -> column -> count
        self.findings = []  # (kind, op, k, path, detail)
        self.ort_messages = Counter()  # ONNX Runtime messages without the node name, by pattern
        self.ort_examples = {}  # pattern -> its first case
        self.by_kind = defaultdict(Counter)  # (mutation kind, path) -> outcome -> count
        self.offcard = Counter()  # (op, reason with numbers masked) -> mlu-path cases off the card

    def record_path(self, op, k, path, res):
        st = self.stats[(op, path)]
        st["cases"] += 1
        st[res["outcome"]] += 1
        st["on_mlu"] += bool(res["on_mlu"])
        why = res.get("offcard")
        if why:
            st["off_card"] += 1
            self.offcard[(op, re.sub(r"-?\d+(\.\d+)?", "N", why)[:200])] += 1
            # A valid case that runs must run on the card unless a documented rule keeps it off.
            if res["kinds"] == ["none"] and res["outcome"] == "ok" and not documented_offcard(why):
                self.finding("offcard", op, k, path, f"a valid node ran off the card for an undocumented reason: {why}")
        st["unmutated"] += res["kinds"] == ["none"]
        st["rechecked"] += res["rechecked"]
        for kind in res["kinds"]:
            self.by_kind[(kind, path)][res["outcome"]] += 1
        if res["noname"] == "ours":
            self.finding("noname", op, k, path, res["msg"])
        elif res["noname"] == "ort":
            st["ort_noname"] += 1
            pattern = re.sub(r"\d+", "N", res["msg"].split("\n")[0])[:160]
            self.ort_messages[pattern] += 1
            self.ort_examples.setdefault(pattern, f"{op}:{k} [{path}]")
        for kind, detail in res["findings"]:
            self.finding(kind, op, k, path, detail)

    def finding(self, kind, op, k, path, detail):
        if kind in COLUMNS:
            self.stats[(op, path)][kind] += 1
        self.findings.append((kind, op, k, path, detail))
        print(f"FINDING {kind} {op}:{k} [{path}] {detail[:300]}", flush=True)

    def handle_death(self, w: Worker, hang: bool):
        """Records the crash, abort or hang of the worker's current path, then runs the paths
        the case has left on a fresh worker."""
        t = w.task
        stage = t["stage"]
        if hang:
            w.kill()
            kind, detail = "hang", f"no answer within {self.args.timeout} s"
        else:
            w.proc.wait()
            rc = w.proc.returncode
            tail = w.stderr_tail()
            how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
            abort = "memory allocation of" in tail
            kind, detail = ("memabort" if abort else "crash"), f"{how}; stderr: {tail.strip()[-600:]}"
        if stage in PATHS:
            path, left = stage, t["paths"][t["paths"].index(stage) + 1:]
            self.stats[(t["op"], path)]["cases"] += 1
        else:  # lost outside a session (generation or comparison): the harness's problem
            path, left = t["paths"][0], []
            kind, detail = "internal", f"worker lost at stage {stage}: {detail}"
        self.finding(kind, t["op"], t["k"], path, detail)
        w.restart()
        return dict(t, paths=left) if left else None

    def handle_lines(self, w: Worker, lines) -> bool:
        """True when the worker finished its case."""
        t = w.task
        for msg in lines:
            if "stage" in msg:
                t["stage"] = msg["stage"]
            elif "path" in msg:
                self.record_path(t["op"], t["k"], msg["path"], msg["result"])
            elif "done" in msg:
                self.stats[(t["op"], "mlu")]["loose"] += msg["loose"]
                self.stats[(t["op"], "mlu")]["msgcmp"] += msg["msgcmp"]
                for kind, detail in msg["done"]:
                    self.finding(kind, t["op"], t["k"], "mlu", detail)
                return True
            elif "internal" in msg:
                self.finding("internal", t["op"], t["k"], t["paths"][0], msg["internal"])
                return True
        return False

    def run(self, tasks):
        with tempfile.TemporaryDirectory(prefix="mluops-fuzz-") as logdir:
            return self._run(tasks, Path(logdir))

    def _run(self, tasks, logdir: Path):
        args = self.args
        workers = [Worker(args, logdir, i) for i in range(args.workers)]
        retry = []  # paths left over from a crashed or hung case, run before new cases
        start = last = time.monotonic()
        done = 0
        try:
            while True:
                for w in workers:
                    if w.task is None:
                        task = retry.pop() if retry else next(tasks, None)
                        if task is not None:
                            w.assign(task)
                busy = [w for w in workers if w.task is not None]
                if not busy:
                    break
                now = time.monotonic()
                wait = max(0.0, min(w.task["deadline"] for w in busy) - now)
                ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], min(wait, 5.0))
                for w in busy:
                    if w.proc.stdout in ready:
                        lines = w.read()
                        if lines is None:
                            left = self.handle_death(w, hang=False)
                        elif self.handle_lines(w, lines):
                            w.task, left = None, None
                        else:
                            continue
                        done += left is None
                        retry += [left] if left else []
                    elif time.monotonic() > w.task["deadline"]:
                        left = self.handle_death(w, hang=True)
                        done += left is None
                        retry += [left] if left else []
                if time.monotonic() - last >= args.progress:
                    last = time.monotonic()
                    bad = sum(1 for f in self.findings if f[0] in FAILING)
                    print(f"[{last - start:7.1f} s] {done} cases done, {bad} failing findings", flush=True)
        finally:
            for w in workers:
                w.kill()
                w.log.close()
        return time.monotonic() - start

    def report(self, elapsed) -> int:
        if binding_note():
            print(f"\n{binding_note()}")
        print(f"\n{'operator':26} {'path':4} " + " ".join(f"{c:>10}" for c in COLUMNS))
        total = Counter()
        for op in OPS:
            for path in PATHS:
                st = self.stats.get((op, path))
                if st:
                    print(f"{op:26} {path:4} " + " ".join(f"{st[c]:>10}" for c in COLUMNS))
                    total.update(st)
        print(f"{'total':31} " + " ".join(f"{total[c]:>10}" for c in COLUMNS))
        print(f"elapsed {elapsed:.1f} s")
        print("\noutcomes by mutation kind (a case with two mutations counts under both):")
        for kind in ["none"] + list(MUTATORS):
            cells = [f"{path} ok {self.by_kind[(kind, path)]['ok']:>6} error {self.by_kind[(kind, path)]['error']:>6}"
                     for path in PATHS if (kind, path) in self.by_kind]
            if cells:
                print(f"  {kind:6} " + "   ".join(cells))
        if self.offcard:
            print("\nmlu-path nodes off the card, by reason (valid ones must match a rule of DOCUMENTED_OFFCARD):")
            for (op, why), n in sorted(self.offcard.items(), key=lambda x: -x[1])[:20]:
                print(f"  {n:6}  {op}: {why}")
        if self.ort_messages:
            print("\nONNX Runtime errors that do not name the node (reported, not failing):")
            for text, n in self.ort_messages.most_common(12):
                print(f"  {n:6}  {text}  (e.g. {self.ort_examples[text]})")
        failing = sorted((f for f in self.findings if f[0] in FAILING), key=lambda f: (OPS.index(f[1]), f[2], f[3]))
        if failing:
            print(f"\n{len(failing)} failing findings (replay: {sys.argv[0]} --lib {self.args.lib} "
                  f"--seed {self.args.seed} --replay OP:K):")
            for kind, op, k, path, detail in failing:
                print(f"- {kind} {op}:{k} [{path}] {detail[:500]}")
                print(f"    case: {json.dumps(make_case(self.args.seed, op, k).describe())[:1500]}")
        return 1 if failing else 0


def case_stream(args):
    """Round robin over the selected ops; the k-th case of an op is (seed, op, k)."""
    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    i = 0
    while (args.cases is None or i < args.cases) and (deadline is None or time.monotonic() < deadline):
        op = args.ops[i % len(args.ops)]
        yield {"seed": args.seed, "op": op, "k": i // len(args.ops), "paths": args.paths}
        i += 1


def replay(args) -> int:
    """One case in this process, under the workers' memory cap, everything printed."""
    cap_address_space(args.mem_gib)
    op, k = args.replay.split(":")
    case = make_case(args.seed, op, int(k))
    print(json.dumps(case.describe(), indent=1))
    runner = Runner(args.lib)
    results, outputs = {}, {}
    for path in args.paths:
        results[path], outputs[path] = runner.run_path(case, path)
        print(f"{path}: {json.dumps(results[path], indent=1)}")
    findings, loose = runner.cross_check(case, results, outputs) if len(results) == 2 else ([], False)
    findings += [f for r in results.values() for f in r["findings"]]
    if loose:
        print("accumulating outputs compared in shape only (overflow-prone inputs)")
    print("findings:", findings or "none")
    return 1 if findings else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", required=True, help="libonnxruntime_ep_mlu.so")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cases", type=int, help="number of cases (round robin over --ops)")
    p.add_argument("--minutes", type=float, help="run new cases for this long")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--paths", default="cpu,mlu")
    p.add_argument("--mem-gib", type=float, default=6.0, help="RLIMIT_AS of each worker")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines")
    p.add_argument("--replay", metavar="OP:K", help="run one case in this process and print everything")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    # Absolute: onnxruntime resolves a relative EP library path against its own folder.
    args.lib = str(Path(args.lib).resolve())
    if args.worker:
        worker_main(args)
        return 0
    args.ops = args.ops.split(",")
    args.paths = args.paths.split(",")
    unknown = [o for o in args.ops if o not in OPS] + [x for x in args.paths if x not in PATHS]
    if unknown:
        p.error(f"unknown op or path: {unknown}")
    if not Path(args.lib).is_file():
        p.error(f"library not found: {args.lib}")
    if args.replay:
        return replay(args)
    if args.cases is None and args.minutes is None:
        args.cases = 900
    fuzz = Fuzz(args)
    print(f"fuzz: seed {args.seed}, {args.cases or 'unbounded'} cases, {args.minutes or '-'} min, ops {len(args.ops)}, "
          f"paths {args.paths}, {args.workers} workers, {args.mem_gib} GiB, {args.timeout} s per case", flush=True)
    if binding_note():
        print(binding_note(), flush=True)
    elapsed = fuzz.run(case_stream(args))
    return fuzz.report(elapsed)


if __name__ == "__main__":
    sys.exit(main())
