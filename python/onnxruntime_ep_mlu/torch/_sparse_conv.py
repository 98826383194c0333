"""GetIndicePairs and IndiceConv: the sparse convolution's two operators."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ._common import _I32, _as_i32, _check_tensor, _fail, _ints, _is_none, _op, _sizes, _typed, _untraced


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
