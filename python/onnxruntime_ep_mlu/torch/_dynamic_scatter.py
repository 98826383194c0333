"""DynamicScatter and DynamicScatterBackward."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import _I32, _as_f32, _as_i32, _check_tensor, _fail, _is_none, _op, _sizes, _typed, _untraced


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
