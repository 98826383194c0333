"""The fuzz harness's checks (tests/fuzz/fuzz.py): outputs against references and across
paths, error messages, the documented reasons a node stays off the card."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
from fuzz_cases import ACC, Case
from onnxruntime_ep_mlu.placement import EMULATED_MLUOPS, emulated_mluops
from onnxruntime_ep_mlu.regression import DEFAULT_FLOAT, compare as compare_values

# A clean error saying memory ran out (ours, ONNX Runtime's, numpy's).
OUT_OF_MEMORY = re.compile(r"out of memory|bad_alloc|Unable to allocate|MemoryError", re.IGNORECASE)


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


def documented_offcard(why: str, backends: list[str]) -> bool:
    """Every backend's part of the reason ("mluops: ...; bang: ...") matches a documented rule;
    ``backends``: the library's (onnxruntime_ep_mlu.backends)."""
    parts = re.split(r"; (?=(?:%s): )" % "|".join(map(re.escape, backends)), why)
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
