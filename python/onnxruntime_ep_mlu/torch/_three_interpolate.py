"""ThreeInterpolate and ThreeInterpolateBackward."""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import _I32, _as_i32, _check_tensor, _compute_dtype, _fail, _op, _sizes, _typed, _untraced


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
