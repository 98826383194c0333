"""What every operator's function shares: argument checks and casts on the eager side,
node emission and output types on the symbolic side."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import DOMAIN

_I32 = torch.int32


def _fail(op: str, message: str):
    raise ValueError(f"mluops.{op}: {message}")


def _ints(op: str, name: str, value, n: int | None = 3) -> list[int]:
    if isinstance(value, int):
        value = [value] * (n or 1)
    out = [int(v) for v in value]
    if n is not None and len(out) != n:
        _fail(op, f"attribute '{name}' needs {n} values, got {out}")
    return out


def _check_tensor(op: str, name: str, t: Tensor, rank: int, dtypes: tuple[torch.dtype, ...]):
    if not isinstance(t, Tensor):
        _fail(op, f"input '{name}' must be a tensor, got {type(t).__name__}")
    if t.dim() != rank:
        _fail(op, f"input '{name}' must have rank {rank}, got shape {list(t.shape)}")
    if t.dtype not in dtypes:
        _fail(op, f"input '{name}' must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")


def _as_i32(t: Tensor) -> Tensor:
    return t if t.dtype == _I32 else t.to(_I32)


def _as_f32(t: Tensor) -> Tensor:
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 (and bfloat16) are computed in float32; float32/float64 in themselves."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _untraced(forward):
    """For ``autograd.Function.forward``: under ``torch.onnx.export`` the function is recorded
    as one node whose ``symbolic`` is exported, so the tracer's warnings about the eager code
    inside (tensor-to-Python conversions) are false alarms."""

    @functools.wraps(forward)
    def run(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return forward(*args, **kwargs)

    return run


# symbolic side --------------------------------------------------------------
def _op(g, op_type: str, *inputs, **attrs):
    return g.op(f"{DOMAIN}::{op_type}", *inputs, **attrs)


def _sizes(value, rank: int) -> list[int | None]:
    """Static sizes of a graph value (None for a dynamic or unknown dimension)."""
    try:
        sizes = value.type().varyingSizes()
    except (AttributeError, RuntimeError):  # not a tensor type
        sizes = None
    if sizes is None or len(sizes) != rank:
        return [None] * rank
    return [None if s is None else int(s) for s in sizes]


def _typed(value, like, dtype: torch.dtype | None, sizes: Sequence[int | None]):
    """Gives an output of a custom node its ONNX type (ONNX shape inference cannot know the
    types of a custom domain's outputs): ``dtype`` (None: the dtype of the graph value
    ``like``) and ``sizes`` (None for a dynamic dimension).

    The type is built from scratch: ``TensorType.with_sizes`` keeps the strides of the type
    it starts from, and strides of another rank make the exporter drop every output type
    of the node."""
    if dtype is None:
        dtype = like.type().dtype()
    t = torch._C.TensorType.get()
    if dtype is not None:
        t = t.with_dtype(dtype)
    value.setType(t.with_sizes(list(sizes)))
    return value


def _is_none(v) -> bool:
    return v is None or (hasattr(v, "node") and v.node().mustBeNone())
