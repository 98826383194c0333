"""VoxelPoolingForward."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._common import _I32, _as_f32, _as_i32, _check_tensor, _fail, _ints, _op, _sizes, _typed, _untraced


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
