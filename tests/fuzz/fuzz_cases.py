"""The fuzz harness's cases (tests/fuzz/fuzz.py): the operators and special values, a valid
case per operator from a seed, and the mutations of it.

The first of the harness's modules to load: it puts tests/python and python/ on the path
for all of them."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))

from conftest import SCHEMAS, library_path  # noqa: E402
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
from onnxruntime_ep_mlu import operators  # noqa: E402
from onnxruntime_ep_mlu.regression import DEFAULT_FLOAT, ELEM_REL_F16  # noqa: E402

EP = "MLUExecutionProvider"
# The registry's order (ops::ALL, read from the library): an op's index seeds its cases, so an
# op's cases do not depend on --ops.
OPS = [row["op"] for row in operators(str(library_path()))]
PATHS = ["cpu", "mlu"]
#: The accumulating class (§1.5) with regression.compare's per-element bounds, by result
#: dtype: float32's are regression's default; a float16 result is rounded to 2^-11 of each
#: element, and two paths' roundings of float32 sums in different orders may differ by an
#: ulp, so its max_rel is two float16 ulps (2^-9) and its elem_rel the tests' float16 one
#: (regression's ELEM_REL_F16, the Rust judge's value), not float32's.
ACC = {np.dtype(np.float32): DEFAULT_FLOAT,
       np.dtype(np.float16): {**DEFAULT_FLOAT, "max_rel": 2.0**-9, "elem_rel": ELEM_REL_F16}}
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


#: One valid-case generator per operator of the registry (OPS): an operator without one fails
#: fuzz.py at its start and tests/python/test_fuzz_cases.py, naming it.
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
    if op not in GENERATORS:
        raise KeyError(f"{op}: the registry's operator has no case generator in tests/fuzz/fuzz_cases.py (GENERATORS)")
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
