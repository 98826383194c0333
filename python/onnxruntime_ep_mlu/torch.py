"""PyTorch front end of the ``mluops`` operators, for exporting models to ONNX.

Every operator is a ``torch.autograd.Function`` whose

- ``forward`` computes the operator's contract (docs/CONTRACT.md, ``schemas/<family>/*.json``) with
  plain torch ops, on any device (this is an independent implementation: it never calls
  ``libonnxruntime_ep_mlu.so``);
- ``backward``, where the operator has a gradient, computes it with torch ops too, by the
  same rules as the library's backward operators (VoxelPoolingForward: a gather at the
  pos_memo cells; DynamicScatter: DynamicScatterBackward's rules; ThreeInterpolate:
  ThreeInterpolateBackward's scatter-add; PsRoiPool: PsRoiPoolBackward's);
- ``symbolic`` emits the ``mluops`` node exactly as its schema declares it (inputs,
  outputs, attribute names and types), and sets each output's ONNX type, with a symbolic
  dimension where the size is data-dependent (GetIndicePairs' output sites, DynamicScatter's
  voxels).

Export with the TorchScript exporter, which honours ``symbolic``::

    torch.onnx.export(model, args, "model.onnx", dynamo=False, opset_version=17,
                      custom_opsets={"mluops": 1})

or :func:`export`, which fills those in. Index tensors are int32 in the graph, as the
schemas require; the functions cast int64 inputs.
"""

from __future__ import annotations

import functools
import io
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from . import DOMAIN, OPSET_VERSION

__all__ = [
    "CUSTOM_OPSETS",
    "ONNX_OPSET",
    "DynamicScatterBackwardFunction",
    "DynamicScatterFunction",
    "GetIndicePairsFunction",
    "IndiceConvFunction",
    "PsRoiPoolBackwardFunction",
    "PsRoiPoolFunction",
    "Rulebook",
    "SparseConv3d",
    "SparseInverseConv3d",
    "SparseSequential",
    "SparseTensor",
    "SubMConv3d",
    "ThreeInterpolateBackwardFunction",
    "ThreeInterpolateFunction",
    "ToDense",
    "VoxelPoolingFunction",
    "dynamic_scatter",
    "dynamic_scatter_backward",
    "export",
    "from_spconv",
    "get_indice_pairs",
    "indice_conv",
    "psroi_pool",
    "psroi_pool_backward",
    "sparse_conv3d",
    "three_interpolate",
    "three_interpolate_backward",
    "voxel_pooling",
]

#: ``custom_opsets`` argument of ``torch.onnx.export``.
CUSTOM_OPSETS = {DOMAIN: OPSET_VERSION}
#: The standard ONNX opset the project's models use.
ONNX_OPSET = 17

_I32 = torch.int32


def export(
    model, args, f, *, opset_version: int = ONNX_OPSET, custom_opsets: dict | None = None, fuse: bool = True, **kwargs
):
    """``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``, the one that
    calls ``symbolic``), opset 17 and the ``mluops`` opset; other keyword arguments are
    passed through. With ``fuse`` (the default) the exported graph then goes through
    :func:`onnxruntime_ep_mlu.fold.fold_affine` and
    :func:`~onnxruntime_ep_mlu.fold.fuse_epilogue`: a BatchNorm1d after a sparse convolution
    folds into its filters and bias, and a residual ``replace_feature(out.features +
    identity.features)`` and a ReLU after it become the IndiceConv's fused epilogue, so the
    activations of a SparseSequential or a SparseBasicBlock stay on the card; what is left
    unfused is reported as a warning saying why. ``f`` is a path or a binary file object."""
    buf = io.BytesIO() if fuse else f
    with warnings.catch_warnings():
        # torch >= 2.9 marks the TorchScript exporter deprecated; it is the one that honours
        # autograd.Function.symbolic.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        result = torch.onnx.export(
            model,
            args,
            buf,
            dynamo=False,
            opset_version=opset_version,
            custom_opsets={**CUSTOM_OPSETS, **(custom_opsets or {})},
            **kwargs,
        )
    if fuse:
        import onnx

        from .fold import fold_affine, fuse_epilogue

        notes: list[str] = []
        data = fuse_epilogue(fold_affine(onnx.load_from_string(buf.getvalue())), notes).SerializeToString()
        for note in dict.fromkeys(notes):
            warnings.warn(f"onnxruntime_ep_mlu.torch.export: {note}", stacklevel=2)
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(data)
        else:
            f.write(data)
    return result


# ----------------------------------------------------------------------------- helpers
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


# ----------------------------------------------------------------------------- VoxelPoolingForward
def _voxel_cells(geom_xyz: Tensor, voxel_num: Sequence[int]):
    nx, ny, nz = voxel_num
    g = geom_xyz.long()
    x, y, z = g[..., 0], g[..., 1], g[..., 2]
    valid = (x >= 0) & (x < nx) & (y >= 0) & (y < ny) & (z >= 0) & (z < nz)
    b = torch.arange(geom_xyz.shape[0], device=geom_xyz.device).view(-1, 1).expand_as(x)
    cell = (b * ny + y) * nx + x
    return valid, cell, b, y, x


def voxel_pooling_forward_eager(geom_xyz: Tensor, features: Tensor, voxel_num: Sequence[int]) -> tuple[Tensor, Tensor]:
    """VoxelPoolingForward in torch: (BEV [B, ny, nx, C], pos_memo int32 [B, N, 3])."""
    op = "VoxelPoolingForward"
    nx, ny, _ = voxel_num = _ints(op, "voxel_num", voxel_num)
    if min(voxel_num) <= 0:
        _fail(op, f"attribute 'voxel_num': each value must be > 0, got {voxel_num}")
    _check_tensor(op, "geom_xyz", geom_xyz, 3, (_I32,))
    _check_tensor(op, "input_features", features, 3, (torch.float32, torch.float64))
    bsz, n, c = features.shape
    if geom_xyz.shape != (bsz, n, 3):
        _fail(op, f"geom_xyz must have shape [{bsz}, {n}, 3], got {list(geom_xyz.shape)}")
    valid, cell, b, y, x = _voxel_cells(geom_xyz, voxel_num)
    out = features.new_zeros(bsz * ny * nx, c)
    out.index_add_(0, cell[valid], features[valid])
    pos = torch.where(valid.unsqueeze(-1), torch.stack([b, y, x], dim=-1), torch.full_like(cell, -1).unsqueeze(-1))
    return out.view(bsz, ny, nx, c), pos.to(_I32)


class VoxelPoolingFunction(torch.autograd.Function):
    """BEVDepth voxel pooling: ``mluops::VoxelPoolingForward``."""

    @staticmethod
    @_untraced
    def forward(ctx, geom_xyz, features, voxel_num):
        out, pos = voxel_pooling_forward_eager(geom_xyz, features, voxel_num)
        valid, cell, *_ = _voxel_cells(geom_xyz, _ints("VoxelPoolingForward", "voxel_num", voxel_num))
        ctx.save_for_backward(valid, cell)
        ctx.mark_non_differentiable(pos)
        return out, pos

    @staticmethod
    def backward(ctx, grad_out, _grad_pos):
        valid, cell = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None, None
        c = grad_out.shape[-1]
        # each valid point's gradient is the gradient of its BEV cell (the pos_memo cell)
        rows = grad_out.reshape(-1, c)[torch.where(valid, cell, 0).reshape(-1)].view(*cell.shape, c)
        grad = torch.where(valid.unsqueeze(-1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
        return None, grad, None

    @staticmethod
    def symbolic(g, geom_xyz, features, voxel_num):
        nx, ny, nz = (int(v) for v in voxel_num)
        out, pos = _op(g, "VoxelPoolingForward", geom_xyz, features, voxel_num_i=[nx, ny, nz], outputs=2)
        b, n, _ = _sizes(geom_xyz, 3)
        c = _sizes(features, 3)[2]
        _typed(out, features, torch.float32, [b, ny, nx, c])
        _typed(pos, geom_xyz, _I32, [b, n, 3])
        return out, pos


def voxel_pooling(geom_xyz: Tensor, features: Tensor, voxel_num: Sequence[int]) -> tuple[Tensor, Tensor]:
    """BEVDepth ``voxel_pooling``: sums the features of the points whose voxel coordinate
    ``geom_xyz`` = (x, y, z) lies in the grid ``voxel_num`` = (nx, ny, nz) into BEV cells.

    Returns ``(bev [B, ny, nx, C], pos_memo int32 [B, N, 3])`` like the op
    (``bev.permute(0, 3, 1, 2)`` is BEVDepth's NCHW layout); gradients flow to ``features``.
    """
    return VoxelPoolingFunction.apply(_as_i32(geom_xyz), _as_f32(features), tuple(int(v) for v in voxel_num))


# ----------------------------------------------------------------------------- GetIndicePairs
@dataclass(frozen=True)
class _ConvGeometry:
    batch_size: int
    spatial_shape: tuple[int, int, int]
    kernel_size: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    output_padding: tuple[int, int, int]
    subm: int
    transpose: int

    @property
    def kernel_volume(self) -> int:
        return math.prod(self.kernel_size)

    def out_shape(self) -> tuple[int, int, int]:
        if self.subm:
            return self.spatial_shape
        per_axis = zip(
            self.spatial_shape, self.kernel_size, self.stride, self.padding, self.dilation, self.output_padding
        )
        if self.transpose:
            return tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, k, s, p, d, op in per_axis)
        return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d, _ in per_axis)


def _conv_geometry(
    batch_size, spatial_shape, kernel_size, stride, padding, dilation, output_padding, subm, transpose, inverse=0
) -> _ConvGeometry:
    op = "GetIndicePairs"
    geo = _ConvGeometry(
        int(batch_size),
        tuple(_ints(op, "spatial_shape", spatial_shape)),
        tuple(_ints(op, "kernel_size", kernel_size)),
        tuple(_ints(op, "stride", stride)),
        tuple(_ints(op, "padding", padding)),
        tuple(_ints(op, "dilation", dilation)),
        tuple(_ints(op, "output_padding", output_padding)),
        int(subm),
        int(transpose),
    )
    for name in ("spatial_shape", "kernel_size", "stride", "dilation"):
        if min(getattr(geo, name)) <= 0:
            _fail(op, f"attribute '{name}': each value must be > 0, got {list(getattr(geo, name))}")
    if geo.batch_size <= 0:
        _fail(op, f"attribute 'batch_size' must be > 0, got {geo.batch_size}")
    for name in ("padding", "output_padding"):
        if min(getattr(geo, name)) < 0:
            _fail(op, f"attribute '{name}': each value must be >= 0, got {list(getattr(geo, name))}")
    if geo.subm not in (0, 1) or geo.transpose not in (0, 1):
        _fail(op, f"attributes 'subm' and 'transpose' must be 0 or 1, got {geo.subm} and {geo.transpose}")
    if int(inverse) != 0:
        _fail(op, f"attribute 'inverse' must be 0, got {inverse}")
    if geo.kernel_volume > 4096:
        _fail(op, f"kernel volume {geo.kernel_volume} > 4096")
    if any(s > 1 and d > 1 for s, d in zip(geo.stride, geo.dilation)):
        _fail(op, "stride > 1 together with dilation > 1 on one axis")
    if geo.subm and geo.transpose:
        _fail(op, "subm = 1 together with transpose = 1")
    if geo.transpose and max(geo.dilation) > 1:
        _fail(op, "transpose = 1 with dilation > 1")
    if geo.subm:
        if max(geo.stride) != 1:
            _fail(op, f"subm needs stride 1, got {list(geo.stride)}")
        natural = _ConvGeometry(**{**geo.__dict__, "subm": 0}).out_shape()
        if natural != geo.spatial_shape:
            _fail(
                op,
                f"subm needs an output size equal to the input size (padding = dilation*(k-1)/2), got {list(natural)}",
            )
    elif min(geo.out_shape()) <= 0:
        _fail(op, f"non-positive output size {list(geo.out_shape())}")
    return geo


def _site_keys(b: Tensor, zyx: Tensor, shape: Sequence[int]) -> Tensor:
    """(batch, z, y, x) -> int64 key whose order is the lexicographic order of the sites."""
    return ((b * shape[0] + zyx[..., 0]) * shape[1] + zyx[..., 1]) * shape[2] + zyx[..., 2]


def get_indice_pairs_eager(indices: Tensor, geo: _ConvGeometry) -> tuple[Tensor, Tensor, Tensor]:
    """GetIndicePairs in torch: (indice_pairs [K, 2, L], out_indices [num_out, 4], indice_num [K])."""
    op = "GetIndicePairs"
    _check_tensor(op, "indices", indices, 2, (_I32,))
    if indices.shape[1] != 4:
        _fail(op, f"indices must have shape [L, 4], got {list(indices.shape)}")
    dev = indices.device
    n_in = indices.shape[0]
    n_k = geo.kernel_volume
    site = indices.long()
    b, zyx = site[:, 0], site[:, 1:]
    in_shape = torch.tensor(geo.spatial_shape, device=dev)
    if n_in and (bool(((b < 0) | (b >= geo.batch_size)).any()) or bool(((zyx < 0) | (zyx >= in_shape)).any())):
        _fail(op, f"a site lies outside batch [0, {geo.batch_size}) x spatial shape {list(geo.spatial_shape)}")
    out_shape = geo.out_shape()
    out_t = torch.tensor(out_shape, device=dev)
    s, p, d = (torch.tensor(v, device=dev) for v in (geo.stride, geo.padding, geo.dilation))
    kz, ky, kx = torch.meshgrid(*(torch.arange(k, device=dev) for k in geo.kernel_size), indexing="ij")
    offsets = torch.stack([kz, ky, kx], dim=-1).reshape(n_k, 1, 3)  # k = (kz*KH + ky)*KW + kx
    if geo.transpose:
        target = zyx.unsqueeze(0) * s - p + offsets * d
        hit = torch.ones(target.shape, dtype=torch.bool, device=dev)
    else:
        num = zyx.unsqueeze(0) + p - offsets * d
        hit = torch.remainder(num, s) == 0
        target = torch.div(num, s, rounding_mode="floor")
    hit = (hit & (target >= 0) & (target < out_t)).all(dim=-1)  # [K, L]
    keys = _site_keys(b.unsqueeze(0), target, out_shape)  # [K, L]
    out_row = torch.full((n_k, n_in), -1, dtype=torch.long, device=dev)
    if geo.subm:
        in_keys = _site_keys(b, zyx, geo.spatial_shape)
        sorted_keys, order = torch.sort(in_keys)
        if n_in > 1 and bool((sorted_keys[1:] == sorted_keys[:-1]).any()):
            _fail(op, "duplicate input site in subm mode")
        if n_in:
            at = torch.searchsorted(sorted_keys, keys.reshape(-1)).clamp(max=n_in - 1).view(n_k, n_in)
            hit &= sorted_keys[at] == keys
            out_row = torch.where(hit, order[at], out_row)
        out_indices = indices.clone()
    else:
        unique, inverse = torch.unique(keys[hit], sorted=True, return_inverse=True)
        out_row[hit] = inverse
        rest, x = torch.div(unique, out_shape[2], rounding_mode="floor"), unique % out_shape[2]
        rest, y = torch.div(rest, out_shape[1], rounding_mode="floor"), rest % out_shape[1]
        ob, z = torch.div(rest, out_shape[0], rounding_mode="floor"), rest % out_shape[0]
        out_indices = torch.stack([ob, z, y, x], dim=1).to(_I32).reshape(-1, 4)
    pairs = torch.full((n_k, 2, n_in), -1, dtype=_I32, device=dev)
    slot = hit.long().cumsum(dim=1) - 1  # within each k, pairs ascending by input row
    kk, jj = hit.nonzero(as_tuple=True)
    pairs[kk, 0, slot[kk, jj]] = jj.to(_I32)
    pairs[kk, 1, slot[kk, jj]] = out_row[kk, jj].to(_I32)
    return pairs, out_indices, hit.sum(dim=1).to(_I32)


class GetIndicePairsFunction(torch.autograd.Function):
    """spconv v1 rulebook: ``mluops::GetIndicePairs`` (no gradient: integer outputs)."""

    @staticmethod
    @_untraced
    def forward(
        ctx, indices, batch_size, spatial_shape, kernel_size, stride, padding, dilation, output_padding, subm, transpose
    ):
        geo = _conv_geometry(
            batch_size, spatial_shape, kernel_size, stride, padding, dilation, output_padding, subm, transpose
        )
        outs = get_indice_pairs_eager(indices, geo)
        ctx.mark_non_differentiable(*outs)
        return outs

    @staticmethod
    def backward(ctx, *grads):
        return (None,) * 10

    @staticmethod
    def symbolic(
        g, indices, batch_size, spatial_shape, kernel_size, stride, padding, dilation, output_padding, subm, transpose
    ):
        geo = _conv_geometry(
            batch_size, spatial_shape, kernel_size, stride, padding, dilation, output_padding, subm, transpose
        )
        pairs, out_indices, num = _op(
            g,
            "GetIndicePairs",
            indices,
            batch_size_i=geo.batch_size,
            spatial_shape_i=list(geo.spatial_shape),
            kernel_size_i=list(geo.kernel_size),
            stride_i=list(geo.stride),
            padding_i=list(geo.padding),
            dilation_i=list(geo.dilation),
            output_padding_i=list(geo.output_padding),
            subm_i=geo.subm,
            transpose_i=geo.transpose,
            outputs=3,
        )
        n_in = _sizes(indices, 2)[0]
        k = geo.kernel_volume
        _typed(pairs, indices, _I32, [k, 2, n_in])
        # subm: the output sites are the input sites; otherwise data-dependent (symbolic).
        _typed(out_indices, indices, _I32, [n_in if geo.subm else None, 4])
        _typed(num, indices, _I32, [k])
        return pairs, out_indices, num


def get_indice_pairs(
    indices: Tensor,
    batch_size: int,
    spatial_shape: Sequence[int],
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    output_padding: int | Sequence[int] = 0,
    subm: bool = False,
    transpose: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """spconv v1 ``get_indice_pairs``: the rulebook of a 3D sparse convolution over the
    active sites ``indices`` = (batch, z, y, x) [L, 4].

    Returns ``(indice_pairs int32 [K, 2, L], out_indices int32 [num_out, 4], indice_num
    int32 [K])``; ``num_out`` is data-dependent (the number of L for subm)."""
    op = "GetIndicePairs"
    return GetIndicePairsFunction.apply(
        _as_i32(indices),
        int(batch_size),
        tuple(_ints(op, "spatial_shape", spatial_shape)),
        tuple(_ints(op, "kernel_size", kernel_size)),
        tuple(_ints(op, "stride", stride)),
        tuple(_ints(op, "padding", padding)),
        tuple(_ints(op, "dilation", dilation)),
        tuple(_ints(op, "output_padding", output_padding)),
        int(subm),
        int(transpose),
    )


# ----------------------------------------------------------------------------- IndiceConv
def _conv_slots(inverse: int) -> tuple[int, int]:
    return (1, 0) if inverse else (0, 1)


def _pair_rows(op, pairs, num, k, inverse, n_src, n_dst):
    n = int(num[k])
    src_slot, dst_slot = _conv_slots(inverse)
    src = pairs[k, src_slot, :n].long()
    dst = pairs[k, dst_slot, :n].long()
    if n and (int(src.min()) < 0 or int(src.max()) >= n_src):
        _fail(op, f"offset {k}: a source row lies outside [0, {n_src})")
    if n and (int(dst.min()) < 0 or int(dst.max()) >= n_dst):
        _fail(op, f"offset {k}: a destination row lies outside [0, {n_dst})")
    return src, dst


def _check_indice_conv(features, filters, indice_pairs, indice_num, out_indices, bias, inverse):
    op = "IndiceConv"
    _check_tensor(op, "features", features, 2, (torch.float32, torch.float64))
    _check_tensor(op, "filters", filters, 3, (features.dtype,))
    _check_tensor(op, "indice_pairs", indice_pairs, 3, (_I32,))
    _check_tensor(op, "indice_num", indice_num, 1, (_I32,))
    _check_tensor(op, "out_indices", out_indices, 2, (_I32,))
    n_k, c_in, c_out = filters.shape
    if features.shape[1] != c_in:
        _fail(op, f"features [L, {features.shape[1]}] do not match filters [K, {c_in}, {c_out}]")
    if indice_pairs.shape[:2] != (n_k, 2) or indice_num.shape[0] != n_k:
        _fail(
            op, f"indice_pairs {list(indice_pairs.shape)} / indice_num {list(indice_num.shape)} do not match K = {n_k}"
        )
    if bias is not None:
        _check_tensor(op, "bias", bias, 1, (features.dtype,))
        if bias.shape[0] != c_out:
            _fail(op, f"bias must have shape [{c_out}], got {list(bias.shape)}")
    if int(inverse) not in (0, 1):
        _fail(op, f"attribute 'inverse' must be 0 or 1, got {inverse}")
    p = indice_pairs.shape[2]
    if n_k and (int(indice_num.min()) < 0 or int(indice_num.max()) > p):
        _fail(op, f"indice_num values must lie in [0, {p}]")


def indice_conv_eager(features, filters, indice_pairs, indice_num, out_indices, bias=None, inverse=0) -> Tensor:
    """IndiceConv in torch: output [num_out, Cout] = bias + sum over the rulebook of
    features[src] @ filters[k], scattered to dst."""
    _check_indice_conv(features, filters, indice_pairs, indice_num, out_indices, bias, inverse)
    num_out = out_indices.shape[0]
    out = features.new_zeros(num_out, filters.shape[2])
    if bias is not None:
        out += bias
    for k in range(filters.shape[0]):
        src, dst = _pair_rows("IndiceConv", indice_pairs, indice_num, k, inverse, features.shape[0], num_out)
        if src.numel():
            out.index_add_(0, dst, features[src] @ filters[k])
    return out


class IndiceConvFunction(torch.autograd.Function):
    """Sparse convolution over a rulebook: ``mluops::IndiceConv``."""

    @staticmethod
    @_untraced
    def forward(ctx, features, filters, indice_pairs, indice_num, out_indices, bias, inverse):
        out = indice_conv_eager(features, filters, indice_pairs, indice_num, out_indices, bias, inverse)
        ctx.save_for_backward(features, filters, indice_pairs, indice_num)
        ctx.inverse = int(inverse)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        features, filters, pairs, num = ctx.saved_tensors
        grad_f = torch.zeros_like(features) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(filters) if ctx.needs_input_grad[1] else None
        for k in range(filters.shape[0]):
            src, dst = _pair_rows("IndiceConv", pairs, num, k, ctx.inverse, features.shape[0], grad_out.shape[0])
            if not src.numel():
                continue
            g = grad_out[dst]
            if grad_f is not None:
                grad_f.index_add_(0, src, g @ filters[k].t())
            if grad_w is not None:
                grad_w[k] = features[src].t() @ g
        grad_b = grad_out.sum(dim=0) if ctx.has_bias and ctx.needs_input_grad[5] else None
        return grad_f, grad_w, None, None, None, grad_b, None

    @staticmethod
    def symbolic(g, features, filters, indice_pairs, indice_num, out_indices, bias, inverse):
        inputs = [features, filters, indice_pairs, indice_num, out_indices]
        if not _is_none(bias):
            inputs.append(bias)
        out = _op(g, "IndiceConv", *inputs, inverse_i=int(inverse))
        return _typed(out, features, torch.float32, [_sizes(out_indices, 2)[0], _sizes(filters, 3)[2]])


def indice_conv(
    features: Tensor,
    filters: Tensor,
    indice_pairs: Tensor,
    indice_num: Tensor,
    out_indices: Tensor,
    bias: Tensor | None = None,
    inverse: bool = False,
) -> Tensor:
    """spconv v1 / mmcv ``indice_conv``: ``features`` [L, Cin] of the input sites through
    ``filters`` [K, Cin, Cout] (mmcv's [kd, kh, kw, Cin, Cout] weight reshaped) along a
    GetIndicePairs rulebook, into ``out_indices.shape[0]`` output rows. ``inverse=True``
    runs the rulebook backwards (an inverse convolution: ``out_indices`` are then the
    forward convolution's input sites)."""
    return IndiceConvFunction.apply(
        features, filters, _as_i32(indice_pairs), _as_i32(indice_num), _as_i32(out_indices), bias, int(inverse)
    )


# ----------------------------------------------------------------------------- sparse modules
@dataclass
class Rulebook:
    """A GetIndicePairs result, kept so that later layers can reuse it (``indice_key``)."""

    indice_pairs: Tensor
    out_indices: Tensor
    indice_num: Tensor
    in_indices: Tensor
    geometry: _ConvGeometry

    @property
    def in_spatial_shape(self) -> tuple[int, int, int]:
        return self.geometry.spatial_shape

    @property
    def out_spatial_shape(self) -> tuple[int, int, int]:
        return self.geometry.out_shape()

    def applies_to(self, indices: Tensor) -> bool:
        """Whether the rulebook was built for these sites (a submanifold one also serves
        its own output sites, which are its input sites)."""
        return indices is self.in_indices or (bool(self.geometry.subm) and indices is self.out_indices)


@dataclass
class SparseTensor:
    """Active sites of a batch of 3D grids: ``features`` [L, C] and ``indices`` int32
    [L, 4] = (batch, z, y, x), with the grid's (D, H, W) and the batch size.
    ``rulebooks`` holds the rulebooks stored under an ``indice_key`` upstream of this tensor,
    scoped as spconv 2.x scopes its ``indice_dict``: a convolution's output carries a copy of
    its input's with its own key added, ``replace_feature`` carries it as it is (spconv
    2.3.8, spconv/pytorch/conv.py ``_conv_forward``: ``indice_dict =
    input.indice_dict.copy()``; core.py ``replace_feature``), so a key stored in one branch
    is not seen by a sibling branch from the same tensor. ``built`` holds every rulebook
    built from the root tensor, keyed or not, shared by all tensors derived from it: a cache
    of GetIndicePairs results by sites and geometry (:meth:`find_rulebook`)."""

    features: Tensor
    indices: Tensor
    spatial_shape: tuple[int, int, int]
    batch_size: int
    rulebooks: dict[str, Rulebook] = field(default_factory=dict)
    built: list[Rulebook] = field(default_factory=list)

    def __post_init__(self):
        # spconv's SparseConvTensor takes the grid as a list or an array, and int64 sites.
        self.spatial_shape = tuple(int(v) for v in self.spatial_shape)
        self.batch_size = int(self.batch_size)
        self.indices = _as_i32(self.indices)

    def replace_feature(self, features: Tensor) -> SparseTensor:
        return self._with(features, self.indices, self.spatial_shape)

    def dense(self, channels_first: bool = True) -> Tensor:
        """The features on the full grid, zero where no site is active: [B, C, D, H, W]
        (``channels_first``, as spconv's ``dense()``) or [B, D, H, W, C]."""
        d, h, w = self.spatial_shape
        c = _weight_shape(self.features)[1]
        idx = self.indices.long()
        cell = ((idx[:, 0] * d + idx[:, 1]) * h + idx[:, 2]) * w + idx[:, 3]
        grid = self.features.new_zeros(self.batch_size * d * h * w, c).index_put((cell,), self.features)
        grid = grid.view(self.batch_size, d, h, w, c)
        return grid.permute(0, 4, 1, 2, 3).contiguous() if channels_first else grid

    def _with(self, features: Tensor, indices: Tensor, spatial_shape, rulebooks=None) -> SparseTensor:
        rulebooks = self.rulebooks if rulebooks is None else rulebooks
        return SparseTensor(features, indices, tuple(spatial_shape), self.batch_size, rulebooks, self.built)

    def find_rulebook(self, geometry) -> Rulebook | None:
        """A rulebook already built for these very sites (the same ``indices`` tensor) and
        this geometry, keyed or not: GetIndicePairs is a function of the two, so a layer
        without an ``indice_key`` reuses it rather than building (and exporting) it again,
        as mmdet3d's SparseBasicBlocks would otherwise do for each convolution."""
        for book in self.built:
            if book.geometry == geometry and book.applies_to(self.indices):
                return book
        return None


def _weight_shape(weight: Tensor) -> tuple[int, ...]:
    """A weight's shape as Python ints (under tracing, sizes are traced values; a
    parameter's shape is fixed for the model, so reading it as constants is correct)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return tuple(int(v) for v in weight.shape)


def sparse_conv3d(
    x: SparseTensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    subm: bool = False,
    indice_key: str | None = None,
) -> SparseTensor:
    """A sparse 3D convolution: GetIndicePairs then IndiceConv. ``weight`` is
    [kd, kh, kw, Cin, Cout] (mmcv's layout). A submanifold rulebook stored under
    ``indice_key`` upstream of ``x`` is reused by a submanifold layer of the same geometry
    (one GetIndicePairs node for both), as spconv reuses it; any other layer finding its key
    upstream is an error, as in spconv. A rulebook built earlier for the same sites and
    geometry, keyed or not, in any branch, is reused too. The output carries ``x``'s keys
    and this layer's (see :class:`SparseTensor`)."""
    kd, kh, kw, c_in, c_out = _weight_shape(weight)
    geo = _conv_geometry(
        x.batch_size,
        x.spatial_shape,
        (kd, kh, kw),
        _ints("GetIndicePairs", "stride", stride),
        _ints("GetIndicePairs", "padding", padding),
        _ints("GetIndicePairs", "dilation", dilation),
        (0, 0, 0),
        int(subm),
        0,
    )
    stored = x.rulebooks.get(indice_key) if indice_key is not None else None
    if stored is not None and not (subm and stored.geometry.subm):
        # spconv 2.3.8 conv.py, _conv_forward: "only support reuse subm indices".
        raise ValueError(
            f"indice_key {indice_key!r}: a {'submanifold' if stored.geometry.subm else 'non-submanifold'} "
            f"convolution upstream of this {'submanifold' if subm else 'non-submanifold'} one stored it; spconv "
            "reuses a key only between submanifold convolutions (give this layer another key)"
        )
    if stored is not None and stored.geometry != geo:
        # spconv 2.3.8 conv.py, _check_subm_reuse_valid: same kernel, dilation and grid.
        raise ValueError(
            f"indice_key {indice_key!r}: stored rulebook has geometry {stored.geometry}, this layer {geo}; "
            "spconv reuses a key only with the same kernel, dilation and spatial shape"
        )
    book = stored if stored is not None and stored.applies_to(x.indices) else x.find_rulebook(geo)
    if book is None:
        pairs, out_indices, num = get_indice_pairs(
            x.indices,
            geo.batch_size,
            geo.spatial_shape,
            geo.kernel_size,
            geo.stride,
            geo.padding,
            geo.dilation,
            subm=subm,
        )
        book = Rulebook(pairs, out_indices, num, x.indices, geo)
        x.built.append(book)
    rulebooks = x.rulebooks
    if indice_key is not None and stored is None:
        rulebooks = {**rulebooks, indice_key: book}
    out = indice_conv(
        x.features,
        weight.reshape(kd * kh * kw, c_in, c_out),
        book.indice_pairs,
        book.indice_num,
        book.out_indices,
        bias,
    )
    return x._with(out, book.out_indices, book.out_spatial_shape, rulebooks)


class SparseConv3d(nn.Module):
    """A sparse 3D convolution layer (spconv / mmcv ``SparseConv3d``; ``subm=True`` for
    ``SubMConv3d``) over :class:`SparseTensor`. Weight [kd, kh, kw, Cin, Cout]."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        bias: bool = True,
        subm: bool = False,
        indice_key: str | None = None,
    ):
        super().__init__()
        self.kernel_size = tuple(_ints("SparseConv3d", "kernel_size", kernel_size))
        self.stride = tuple(_ints("SparseConv3d", "stride", stride))
        self.padding = tuple(_ints("SparseConv3d", "padding", padding))
        self.dilation = tuple(_ints("SparseConv3d", "dilation", dilation))
        self.subm = bool(subm)
        self.indice_key = indice_key
        self.weight = nn.Parameter(torch.empty(*self.kernel_size, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        fan_in = self.weight.shape[3] * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return sparse_conv3d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.subm, self.indice_key
        )


class SubMConv3d(SparseConv3d):
    """Submanifold sparse 3D convolution (output sites = input sites); padding defaults to
    dilation*(k-1)/2, the only one the contract allows."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        dilation=1,
        bias: bool = True,
        indice_key: str | None = None,
    ):
        k = _ints("SubMConv3d", "kernel_size", kernel_size)
        d = _ints("SubMConv3d", "dilation", dilation)
        super().__init__(
            in_channels,
            out_channels,
            k,
            1,
            [di * (ki - 1) // 2 for ki, di in zip(k, d)],
            d,
            bias,
            subm=True,
            indice_key=indice_key,
        )


class SparseInverseConv3d(nn.Module):
    """Inverse of the SparseConv3d that stored its rulebook under ``indice_key``: maps the
    features of that layer's output sites back to its input sites (IndiceConv with
    ``inverse=1``). Weight [kd, kh, kw, Cin, Cout] in the same offset order."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, indice_key: str, bias: bool = True):
        super().__init__()
        self.kernel_size = tuple(_ints("SparseInverseConv3d", "kernel_size", kernel_size))
        self.indice_key = indice_key
        self.weight = nn.Parameter(torch.empty(*self.kernel_size, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        SparseConv3d.reset_parameters(self)

    def forward(self, x: SparseTensor) -> SparseTensor:
        key = self.indice_key
        book = x.rulebooks.get(key)
        if book is None:
            raise KeyError(
                f"SparseInverseConv3d: no rulebook under indice_key {key!r} upstream of its input (keys are "
                f"scoped per tensor lineage, as in spconv: only a convolution this input derives from counts; "
                f"keys there: {sorted(x.rulebooks)})"
            )
        kd, kh, kw, c_in, c_out = _weight_shape(self.weight)
        # The checks of spconv 2.3.8 conv.py (_conv_forward, _check_inverse_reuse_valid).
        if book.geometry.subm:
            raise ValueError(f"SparseInverseConv3d: indice_key {key!r} names a submanifold convolution's rulebook")
        if book.geometry.kernel_volume != kd * kh * kw:
            raise ValueError("SparseInverseConv3d: kernel size differs from the forward convolution's")
        if x.spatial_shape != book.out_spatial_shape:
            raise ValueError(
                f"SparseInverseConv3d: indice_key {key!r}: input grid {x.spatial_shape}, the forward "
                f"convolution's output grid {book.out_spatial_shape}"
            )
        if not torch.jit.is_tracing() and x.indices.shape[0] != book.out_indices.shape[0]:
            raise ValueError(
                f"SparseInverseConv3d: indice_key {key!r}: input has {x.indices.shape[0]} sites, the forward "
                f"convolution's output {book.out_indices.shape[0]}"
            )
        out = indice_conv(
            x.features,
            self.weight.reshape(kd * kh * kw, c_in, c_out),
            book.indice_pairs,
            book.indice_num,
            book.in_indices,
            self.bias,
            inverse=True,
        )
        return x._with(out, book.in_indices, book.in_spatial_shape)


class SparseSequential(nn.Sequential):
    """spconv's ``SparseSequential`` over :class:`SparseTensor`: a sparse module (a
    convolution, or any module given the whole tensor, see ``_takes_sparse``) is called with
    the tensor, any other (BatchNorm1d, ReLU, ...) with its features."""

    def forward(self, x):
        for module in self:
            if _takes_sparse(module) or not isinstance(x, SparseTensor):
                x = module(x)
            elif _weight_shape(x.indices)[0] != 0:
                x = x.replace_feature(module(x.features))
        return x


class ToDense(nn.Module):
    """spconv's ``ToDense``: :meth:`SparseTensor.dense`, channels first."""

    def forward(self, x: SparseTensor) -> Tensor:
        return x.dense()


def _takes_sparse(module: nn.Module) -> bool:
    """Whether ``module`` takes a whole :class:`SparseTensor` (this package's sparse modules,
    or a module marked ``takes_sparse``, as :func:`from_spconv` marks spconv's)."""
    return isinstance(module, (SparseConv3d, SparseInverseConv3d, SparseSequential, ToDense)) or getattr(
        module, "takes_sparse", False
    )


def from_spconv(model: nn.Module) -> nn.Module:
    """``model`` with spconv.pytorch's modules and tensor type replaced by this package's
    (see ``onnxruntime_ep_mlu._spconv``), ready for :func:`export`."""
    from ._spconv import convert

    return convert(model)


# ----------------------------------------------------------------------------- DynamicScatter
_REDUCE_TYPES = ("max", "mean", "sum")


def _check_reduce(op: str, reduce_type: str) -> str:
    if reduce_type not in _REDUCE_TYPES:
        _fail(op, f"attribute 'reduce_type' must be one of {list(_REDUCE_TYPES)}, got {reduce_type!r}")
    return reduce_type


def dynamic_scatter_eager(feats: Tensor, coors: Tensor, reduce_type: str = "max"):
    """DynamicScatter in torch: (voxel_feats [M, C], voxel_coors int32 [M, D],
    point2voxel_map int32 [N], voxel_points_count int32 [M], voxel_num int32 [1])."""
    op = "DynamicScatter"
    _check_reduce(op, reduce_type)
    _check_tensor(op, "feats", feats, 2, (torch.float32, torch.float64))
    _check_tensor(op, "coors", coors, 2, (_I32,))
    n, c = feats.shape
    if coors.shape[0] != n:
        _fail(op, f"coors must have {n} rows, got {coors.shape[0]}")
    if coors.shape[1] == 0:
        _fail(op, "coors has no column (D = 0)")
    dev = feats.device
    keep = (coors >= 0).all(dim=1)
    kept = coors[keep]
    p2v = torch.full((n,), -1, dtype=torch.long, device=dev)
    if kept.shape[0]:
        # unique rows, sorted lexicographically (first coordinate most significant)
        voxels, inverse, counts = torch.unique(kept, dim=0, sorted=True, return_inverse=True, return_counts=True)
        p2v[keep] = inverse
    else:
        voxels = coors.new_zeros(0, coors.shape[1])
        counts = torch.zeros(0, dtype=torch.long, device=dev)
    m = voxels.shape[0]
    rows = p2v[keep]
    vals = feats[keep]
    if reduce_type == "max":
        # NaN never wins; an all-NaN channel stays -inf
        vals = torch.where(torch.isnan(vals), torch.full_like(vals, -math.inf), vals)
        out = feats.new_full((m, c), -math.inf)
        out.scatter_reduce_(0, rows.unsqueeze(1).expand(-1, c), vals, reduce="amax", include_self=True)
    else:
        out = feats.new_zeros(m, c).index_add_(0, rows, vals)
        if reduce_type == "mean":
            out = out / counts.to(feats.dtype).unsqueeze(1)
    voxel_num = torch.tensor([m], dtype=_I32, device=dev)
    return out, voxels.to(_I32), p2v.to(_I32), counts.to(_I32), voxel_num


def dynamic_scatter_backward_eager(
    grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count, voxel_num=None, reduce_type: str = "max"
) -> Tensor:
    """DynamicScatterBackward in torch: the gradient of the point features."""
    op = "DynamicScatterBackward"
    _check_reduce(op, reduce_type)
    n, c = feats.shape
    m = voxel_feats.shape[0]
    v = m if voxel_num is None else int(voxel_num.reshape(-1)[0])
    if not 0 <= v <= m:
        _fail(op, f"voxel_num {v} outside [0, {m}]")
    p2v = point2voxel_map.long()
    if n and (int(p2v.min()) < -1 or int(p2v.max()) >= v):
        _fail(op, f"point2voxel_map values must lie in [-1, {v})")
    valid = p2v >= 0
    rows = p2v.clamp(min=0)
    zero = torch.zeros((), dtype=feats.dtype, device=feats.device)
    picked = grad_voxel_feats[rows] if m else feats.new_zeros(n, c)
    if reduce_type == "sum":
        return torch.where(valid.unsqueeze(1), picked, zero)
    if reduce_type == "mean":
        counts = voxel_points_count.long()[rows] if m else torch.ones(n, dtype=torch.long, device=feats.device)
        if bool((valid & (counts <= 0)).any()):
            _fail(op, "a point maps to a voxel whose count is <= 0")
        return torch.where(valid.unsqueeze(1), picked / counts.to(feats.dtype).unsqueeze(1), zero)
    # max: for each (voxel, channel) the lowest point index equal to the maximum takes it
    match = valid.unsqueeze(1) & (feats == (voxel_feats[rows] if m else feats))
    point = torch.arange(n, device=feats.device).unsqueeze(1).expand(n, c)
    candidate = torch.where(match, point, torch.full_like(point, n))
    winner = torch.full((max(m, 1), c), n, dtype=torch.long, device=feats.device)
    winner.scatter_reduce_(0, rows.unsqueeze(1).expand(n, c), candidate, reduce="amin", include_self=True)
    return torch.where(match & (winner[rows] == point), picked, zero)


class DynamicScatterFunction(torch.autograd.Function):
    """mmcv ``dynamic_scatter`` (dynamic_point_to_voxel forward): ``mluops::DynamicScatter``."""

    @staticmethod
    @_untraced
    def forward(ctx, feats, coors, reduce_type):
        outs = dynamic_scatter_eager(feats, coors, reduce_type)
        vf, _, p2v, counts, _ = outs
        ctx.save_for_backward(feats, vf, p2v, counts)
        ctx.reduce_type = reduce_type
        ctx.mark_non_differentiable(*outs[1:])
        return outs

    @staticmethod
    def backward(ctx, grad_vf, *_):
        feats, vf, p2v, counts = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        grad = dynamic_scatter_backward_eager(grad_vf.contiguous(), feats, vf, p2v, counts, None, ctx.reduce_type)
        return grad, None, None

    @staticmethod
    def symbolic(g, feats, coors, reduce_type):
        vf, vc, p2v, cnt, vn = _op(g, "DynamicScatter", feats, coors, reduce_type_s=reduce_type, outputs=5)
        n, c = _sizes(feats, 2)
        d = _sizes(coors, 2)[1]
        # M, the number of voxels, is data-dependent: a symbolic dimension. (torch's
        # TorchScript exporter keeps the types a symbolic sets only when every output has
        # a static dimension; voxel_points_count [M] has none, so the exported graph keeps
        # these dtypes and ranks but makes every dimension symbolic.)
        _typed(vf, feats, torch.float32, [None, c])
        _typed(vc, coors, _I32, [None, d])
        _typed(p2v, coors, _I32, [n])
        _typed(cnt, coors, _I32, [None])
        _typed(vn, coors, _I32, [1])
        return vf, vc, p2v, cnt, vn


def dynamic_scatter(feats: Tensor, coors: Tensor, reduce_type: str = "max"):
    """mmcv ``dynamic_scatter``: reduces the point features ``feats`` [N, C] per distinct
    voxel coordinate ``coors`` [N, D] (a negative coordinate drops the point).

    Returns ``(voxel_feats [M, C], voxel_coors int32 [M, D], point2voxel_map int32 [N],
    voxel_points_count int32 [M], voxel_num int32 [1])``, voxels sorted ascending; M is
    data-dependent. Gradients flow to ``feats`` (DynamicScatterBackward's rules)."""
    return DynamicScatterFunction.apply(_as_f32(feats), _as_i32(coors), _check_reduce("DynamicScatter", reduce_type))


class DynamicScatterBackwardFunction(torch.autograd.Function):
    """``mluops::DynamicScatterBackward`` as an explicit graph node (no gradient)."""

    @staticmethod
    @_untraced
    def forward(ctx, grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count, voxel_num, reduce_type):
        return dynamic_scatter_backward_eager(
            grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count, voxel_num, reduce_type
        )

    @staticmethod
    def symbolic(g, grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count, voxel_num, reduce_type):
        inputs = [grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count]
        if not _is_none(voxel_num):
            inputs.append(voxel_num)
        out = _op(g, "DynamicScatterBackward", *inputs, reduce_type_s=reduce_type)
        return _typed(out, feats, torch.float32, _sizes(feats, 2))


def dynamic_scatter_backward(
    grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count, voxel_num=None, reduce_type: str = "max"
) -> Tensor:
    """mmcv ``dynamic_point_to_voxel_backward``: the gradient of ``feats`` (as a graph node)."""
    return DynamicScatterBackwardFunction.apply(
        grad_voxel_feats,
        feats,
        voxel_feats,
        _as_i32(point2voxel_map),
        _as_i32(voxel_points_count),
        None if voxel_num is None else _as_i32(voxel_num),
        _check_reduce("DynamicScatterBackward", reduce_type),
    )


# ----------------------------------------------------------------------------- ThreeInterpolate
def _check_three(op, values, indices, weights, n_src):
    _check_tensor(op, "indices", indices, 3, (_I32,))
    _check_tensor(op, "weights", weights, 3, (values.dtype,))
    b = indices.shape[0]
    if indices.shape[2] != 3 or weights.shape != indices.shape or values.shape[0] != b:
        _fail(op, f"indices {list(indices.shape)} / weights {list(weights.shape)} must be [{values.shape[0]}, N, 3]")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= n_src):
        _fail(op, f"an index lies outside [0, {n_src})")


def three_interpolate_eager(features: Tensor, indices: Tensor, weights: Tensor) -> Tensor:
    """ThreeInterpolate in torch: [B, C, N], the three products summed left to right (in
    float32 for float16 inputs, rounded once)."""
    op = "ThreeInterpolate"
    _check_tensor(op, "features", features, 3, (torch.float32, torch.float16, torch.float64))
    b, c, m = features.shape
    _check_three(op, features, indices, weights, m)
    n = indices.shape[1]
    cd = _compute_dtype(features.dtype)
    idx = indices.long().reshape(b, 1, n * 3).expand(b, c, n * 3)
    src = torch.gather(features.to(cd), 2, idx).view(b, c, n, 3)
    w = weights.to(cd).unsqueeze(1)
    out = src[..., 0] * w[..., 0] + src[..., 1] * w[..., 1] + src[..., 2] * w[..., 2]
    return out.to(features.dtype)


def three_interpolate_backward_eager(grad_output: Tensor, indices: Tensor, weights: Tensor, m: int) -> Tensor:
    """ThreeInterpolateBackward in torch: grad_features [B, C, m] by scatter-add."""
    op = "ThreeInterpolateBackward"
    _check_tensor(op, "grad_output", grad_output, 3, (torch.float32, torch.float16, torch.float64))
    if int(m) < 0:
        _fail(op, f"attribute 'm' must be >= 0, got {m}")
    b, c, n = grad_output.shape
    _check_three(op, grad_output, indices, weights, int(m))
    cd = _compute_dtype(grad_output.dtype)
    contrib = grad_output.to(cd).unsqueeze(-1) * weights.to(cd).unsqueeze(1)  # [B, C, N, 3]
    out = torch.zeros(b, c, int(m), dtype=cd, device=grad_output.device)
    out.scatter_add_(2, indices.long().reshape(b, 1, n * 3).expand(b, c, n * 3), contrib.reshape(b, c, n * 3))
    return out.to(grad_output.dtype)


class ThreeInterpolateFunction(torch.autograd.Function):
    """PointNet++ ``three_interpolate``: ``mluops::ThreeInterpolate``."""

    @staticmethod
    @_untraced
    def forward(ctx, features, indices, weights):
        ctx.save_for_backward(features, indices, weights)
        return three_interpolate_eager(features, indices, weights)

    @staticmethod
    def backward(ctx, grad_out):
        features, indices, weights = ctx.saved_tensors
        grad_f = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_f = three_interpolate_backward_eager(grad_out.contiguous(), indices, weights, features.shape[2])
        if ctx.needs_input_grad[2]:
            b, c, _ = features.shape
            n = indices.shape[1]
            cd = _compute_dtype(features.dtype)
            src = torch.gather(features.to(cd), 2, indices.long().reshape(b, 1, n * 3).expand(b, c, n * 3))
            grad_w = (src.view(b, c, n, 3) * grad_out.to(cd).unsqueeze(-1)).sum(dim=1).to(weights.dtype)
        return grad_f, None, grad_w

    @staticmethod
    def symbolic(g, features, indices, weights):
        out = _op(g, "ThreeInterpolate", features, indices, weights)
        b, c, _ = _sizes(features, 3)
        return _typed(out, features, None, [b, c, _sizes(indices, 3)[1]])


def three_interpolate(features: Tensor, indices: Tensor, weights: Tensor) -> Tensor:
    """PointNet++ ``three_interpolate``: ``features`` [B, C, M] of M source points
    interpolated at N targets from their three sources ``indices`` [B, N, 3] with
    ``weights`` [B, N, 3]: [B, C, N]. float32 or float16. Gradients flow to features and
    weights."""
    return ThreeInterpolateFunction.apply(features, _as_i32(indices), weights)


class ThreeInterpolateBackwardFunction(torch.autograd.Function):
    """``mluops::ThreeInterpolateBackward`` as an explicit graph node (no gradient)."""

    @staticmethod
    @_untraced
    def forward(ctx, grad_output, indices, weights, m):
        return three_interpolate_backward_eager(grad_output, indices, weights, m)

    @staticmethod
    def symbolic(g, grad_output, indices, weights, m):
        out = _op(g, "ThreeInterpolateBackward", grad_output, indices, weights, m_i=int(m))
        b, c, _ = _sizes(grad_output, 3)
        return _typed(out, grad_output, None, [b, c, int(m)])


def three_interpolate_backward(grad_output: Tensor, indices: Tensor, weights: Tensor, m: int) -> Tensor:
    """PointNet++ ``three_interpolate`` backward: grad_features [B, C, m] (as a graph node)."""
    return ThreeInterpolateBackwardFunction.apply(grad_output, _as_i32(indices), weights, int(m))


# ----------------------------------------------------------------------------- PsRoiPool
def _check_psroi(op, ph, pw, scale, od, channels):
    if ph != pw:
        _fail(op, f"pooled_height {ph} != pooled_width {pw}")
    if ph < 1:
        _fail(op, f"pooled_height must be >= 1, got {ph}")
    if od < 1:
        _fail(op, f"output_dim must be >= 1, got {od}")
    if not (math.isfinite(scale) and scale > 0):
        _fail(op, f"spatial_scale must be finite and > 0, got {scale}")
    if channels != ph * pw * od:
        _fail(op, f"channels {channels} != pooled_height * pooled_width * output_dim = {ph * pw * od}")


def _round_half_away(x: Tensor) -> Tensor:
    t = torch.trunc(x)
    step = torch.where((x - t).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))
    return t + step


def _psroi_bins(op, rois: Tensor, ph: int, pw: int, scale: float, batches: int, height: int, width: int):
    """Per roi: batch [R], row spans [R, ph] and column spans [R, pw] (int64, clamped to the
    map), and whether the roi contributes. Float32 with each operation rounded."""
    f32 = torch.float32
    r = rois.to(f32)
    finite = torch.isfinite(r).all(dim=1)
    r = torch.where(finite.unsqueeze(1), r, torch.zeros((), dtype=f32, device=r.device))
    batch = torch.trunc(r[:, 0])
    bad = finite & ((batch < 0) | (batch >= batches))
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        _fail(op, f"roi {k}: batch_id {float(rois[k, 0])} outside [0, {batches})")
    s = torch.tensor(scale, dtype=f32, device=r.device)
    one = torch.tensor(1.0, dtype=f32, device=r.device)
    tenth = torch.tensor(0.1, dtype=f32, device=r.device)
    start_w = _round_half_away(r[:, 1]) * s
    start_h = _round_half_away(r[:, 2]) * s
    end_w = (_round_half_away(r[:, 3]) + one) * s
    end_h = (_round_half_away(r[:, 4]) + one) * s
    bin_w = torch.maximum(end_w - start_w, tenth) / torch.tensor(float(pw), dtype=f32)
    bin_h = torch.maximum(end_h - start_h, tenth) / torch.tensor(float(ph), dtype=f32)
    live = finite
    for v in (start_w, start_h, bin_w, bin_h):
        live = live & torch.isfinite(v)

    def spans(bin_size, start, count, limit):
        i = torch.arange(count, dtype=f32, device=r.device).unsqueeze(0)
        lo = torch.floor(i * bin_size.unsqueeze(1) + start.unsqueeze(1))
        hi = torch.ceil((i + one) * bin_size.unsqueeze(1) + start.unsqueeze(1))
        lo = torch.where(live.unsqueeze(1), lo, torch.zeros_like(lo))
        hi = torch.where(live.unsqueeze(1), hi, torch.zeros_like(hi))
        return lo.clamp(0, limit).long(), hi.clamp(0, limit).long()

    hs, he = spans(bin_h, start_h, ph, height)
    ws, we = spans(bin_w, start_w, pw, width)
    return batch.long().clamp(0, max(batches - 1, 0)), hs, he, ws, we, live


def _bin_mask(live, hs, he, ws, we, i, j, height, width, device):
    h = torch.arange(height, device=device)
    w = torch.arange(width, device=device)
    rows = (h >= hs[:, i : i + 1]) & (h < he[:, i : i + 1])  # [R, H]
    cols = (w >= ws[:, j : j + 1]) & (w < we[:, j : j + 1])  # [R, W]
    return live.view(-1, 1, 1) & rows.unsqueeze(2) & cols.unsqueeze(1)  # [R, H, W]


def psroi_pool_eager(
    input: Tensor, rois: Tensor, pooled_height: int, pooled_width: int, spatial_scale: float, output_dim: int
) -> tuple[Tensor, Tensor]:
    """PsRoiPool in torch (NHWC): (output [R, ph, pw, od], mapping_channel int32)."""
    op = "PsRoiPool"
    _check_tensor(op, "input", input, 4, (torch.float32, torch.float64))
    _check_tensor(op, "rois", rois, 2, (input.dtype,))
    ph, pw, od = int(pooled_height), int(pooled_width), int(output_dim)
    batches, height, width, channels = input.shape
    _check_psroi(op, ph, pw, float(spatial_scale), od, channels)
    if rois.shape[1] != 5:
        _fail(op, f"rois must have shape [R, 5], got {list(rois.shape)}")
    n_r = rois.shape[0]
    dev = input.device
    b, hs, he, ws, we, live = _psroi_bins(op, rois, ph, pw, float(spatial_scale), batches, height, width)
    out = input.new_zeros(n_r, ph, pw, od)
    o = torch.arange(od, device=dev)
    for i in range(ph):
        for j in range(pw):
            c = (o * ph + i) * pw + j
            mask = _bin_mask(live, hs, he, ws, we, i, j, height, width, dev)
            vals = input[:, :, :, c][b]  # [R, H, W, od]
            total = torch.where(mask.unsqueeze(-1), vals, torch.zeros((), dtype=input.dtype, device=dev)).sum(
                dim=(1, 2)
            )
            area = ((he[:, i] - hs[:, i]) * (we[:, j] - ws[:, j])).clamp(min=0)
            nonempty = live & (area > 0)
            out[:, i, j, :] = torch.where(
                nonempty.unsqueeze(1),
                total / area.clamp(min=1).to(input.dtype).unsqueeze(1),
                torch.zeros((), dtype=input.dtype, device=dev),
            )
    mapping = ((o * ph).view(1, 1, 1, od) + torch.arange(ph, device=dev).view(1, ph, 1, 1)) * pw
    mapping = (mapping + torch.arange(pw, device=dev).view(1, 1, pw, 1)).expand(n_r, ph, pw, od)
    return out, mapping.to(_I32).contiguous()


def psroi_pool_backward_eager(
    top_grad: Tensor,
    rois: Tensor,
    mapping_channel: Tensor,
    bottom_shape,
    pooled_height: int,
    pooled_width: int,
    spatial_scale: float,
    output_dim: int,
) -> Tensor:
    """PsRoiPoolBackward in torch: bottom_grad [batches, height, width, channels] (NHWC)."""
    op = "PsRoiPoolBackward"
    shape = [int(v) for v in (bottom_shape.tolist() if isinstance(bottom_shape, Tensor) else bottom_shape)]
    if len(shape) != 4 or min(shape) < 0:
        _fail(op, f"bottom_shape must be 4 values >= 0, got {shape}")
    batches, height, width, channels = shape
    ph, pw, od = int(pooled_height), int(pooled_width), int(output_dim)
    _check_psroi(op, ph, pw, float(spatial_scale), od, channels)
    n_r = rois.shape[0]
    if top_grad.shape != (n_r, ph, pw, od) or mapping_channel.shape != top_grad.shape:
        _fail(op, f"top_grad and mapping_channel must have shape [{n_r}, {ph}, {pw}, {od}]")
    if mapping_channel.numel() and (int(mapping_channel.min()) < 0 or int(mapping_channel.max()) >= channels):
        _fail(op, f"a mapping_channel value lies outside [0, {channels})")
    dev = top_grad.device
    grad = top_grad.new_zeros(batches, height, width, channels)
    b, hs, he, ws, we, live = _psroi_bins(op, rois, ph, pw, float(spatial_scale), batches, height, width)
    for i in range(ph):
        for j in range(pw):
            mask = _bin_mask(live, hs, he, ws, we, i, j, height, width, dev)
            r, h, w = mask.nonzero(as_tuple=True)
            if not r.numel():
                continue
            area = ((he[r, i] - hs[r, i]) * (we[r, j] - ws[r, j])).to(top_grad.dtype)
            vals = top_grad[r, i, j, :] / area.unsqueeze(1)  # [P, od]
            ch = mapping_channel[r, i, j, :].long()
            grad.index_put_((b[r].unsqueeze(1), h.unsqueeze(1), w.unsqueeze(1), ch), vals, accumulate=True)
    return grad


class PsRoiPoolFunction(torch.autograd.Function):
    """R-FCN position-sensitive RoI pooling (NHWC): ``mluops::PsRoiPool``."""

    @staticmethod
    @_untraced
    def forward(ctx, input, rois, pooled_height, pooled_width, spatial_scale, output_dim):
        out, mapping = psroi_pool_eager(input, rois, pooled_height, pooled_width, spatial_scale, output_dim)
        ctx.save_for_backward(rois, mapping)
        ctx.attrs = (pooled_height, pooled_width, spatial_scale, output_dim)
        ctx.bottom_shape = tuple(input.shape)
        ctx.mark_non_differentiable(mapping)
        return out, mapping

    @staticmethod
    def backward(ctx, grad_out, _grad_mapping):
        rois, mapping = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 6
        grad = psroi_pool_backward_eager(grad_out.contiguous(), rois, mapping, ctx.bottom_shape, *ctx.attrs)
        return grad, None, None, None, None, None

    @staticmethod
    def symbolic(g, input, rois, pooled_height, pooled_width, spatial_scale, output_dim):
        ph, pw, od = int(pooled_height), int(pooled_width), int(output_dim)
        out, mapping = _op(
            g,
            "PsRoiPool",
            input,
            rois,
            pooled_height_i=ph,
            pooled_width_i=pw,
            spatial_scale_f=float(spatial_scale),
            output_dim_i=od,
            outputs=2,
        )
        r = _sizes(rois, 2)[0]
        _typed(out, input, torch.float32, [r, ph, pw, od])
        _typed(mapping, rois, _I32, [r, ph, pw, od])
        return out, mapping


def psroi_pool(
    input: Tensor, rois: Tensor, pooled_height: int, pooled_width: int, spatial_scale: float, output_dim: int
) -> tuple[Tensor, Tensor]:
    """R-FCN ``psroi_pool`` on an NHWC map ``input`` [batches, H, W, ph*pw*output_dim] and
    ``rois`` [R, 5] = (batch_id, x1, y1, x2, y2). Returns ``(output [R, ph, pw, od],
    mapping_channel int32 [R, ph, pw, od])``; gradients flow to ``input``."""
    return PsRoiPoolFunction.apply(
        input, rois, int(pooled_height), int(pooled_width), float(spatial_scale), int(output_dim)
    )


class PsRoiPoolBackwardFunction(torch.autograd.Function):
    """``mluops::PsRoiPoolBackward`` as an explicit graph node (no gradient). The bottom
    shape is an int64 tensor input of the node (a Shape of the forward input, say)."""

    @staticmethod
    @_untraced
    def forward(
        ctx, top_grad, rois, mapping_channel, bottom_shape, pooled_height, pooled_width, spatial_scale, output_dim
    ):
        return psroi_pool_backward_eager(
            top_grad, rois, mapping_channel, bottom_shape, pooled_height, pooled_width, spatial_scale, output_dim
        )

    @staticmethod
    def symbolic(
        g, top_grad, rois, mapping_channel, bottom_shape, pooled_height, pooled_width, spatial_scale, output_dim
    ):
        out = _op(
            g,
            "PsRoiPoolBackward",
            top_grad,
            rois,
            mapping_channel,
            bottom_shape,
            pooled_height_i=int(pooled_height),
            pooled_width_i=int(pooled_width),
            spatial_scale_f=float(spatial_scale),
            output_dim_i=int(output_dim),
        )
        return _typed(out, top_grad, torch.float32, [None, None, None, None])


def psroi_pool_backward(
    top_grad: Tensor,
    rois: Tensor,
    mapping_channel: Tensor,
    bottom_shape: Tensor,
    pooled_height: int,
    pooled_width: int,
    spatial_scale: float,
    output_dim: int,
) -> Tensor:
    """R-FCN ``psroi_pool`` backward (as a graph node): bottom_grad with the shape given by
    the int64 tensor ``bottom_shape`` = (batches, height, width, channels)."""
    if not isinstance(bottom_shape, Tensor):
        bottom_shape = torch.tensor(list(bottom_shape), dtype=torch.int64)
    if bottom_shape.dtype != torch.int64:
        bottom_shape = bottom_shape.to(torch.int64)
    return PsRoiPoolBackwardFunction.apply(
        top_grad,
        rois,
        _as_i32(mapping_channel),
        bottom_shape,
        int(pooled_height),
        int(pooled_width),
        float(spatial_scale),
        int(output_dim),
    )
