"""PsRoiPool and PsRoiPoolBackward."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import _I32, _as_i32, _check_tensor, _fail, _op, _sizes, _typed, _untraced


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
