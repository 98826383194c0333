"""The R-FCN position-sensitive head (ResNet-101 R-FCN on VOC: 7 x 7 bins, 21 classes, 300
rois, stride 16 on a 600 x 1000 image, so a 38 x 63 map): conv_new_1 (1 x 1, 2048 -> 1024,
ReLU), rfcn_cls (1 x 1 -> 7*7*21 score maps) and rfcn_bbox (1 x 1 -> 7*7*8), PsRoiPool of
each, averaged over the bins (cls_score [R, 21], bbox_pred [R, 8]) and the class softmax;
the pooled class bins themselves (cls_bins [R, 7, 7, 21], PsRoiPool's output) are an output
too, so that the pooled values are compared and not only their 49-bin means (the comparison
is still the contract's diff1 / diff2 over the whole tensor).

Its gradient is a second graph: the gradient of sum(cls_score * G) for an upstream gradient
G with respect to rfcn_cls's weight, through PsRoiPoolBackward.

Peer: torchvision's ps_roi_pool (NCHW) in eager mode, torch autograd for the gradient.
torchvision rounds a roi after scaling (start = round(x1 * scale), end = round(x2 * scale))
where the contract rounds before and adds one pixel (start = round(x1) * scale, end =
(round(x2) + 1) * scale); torchvision also adds the start after its floor / ceil (the
contract before) and clamps bin ends to the last row and column (the contract to the map's
size). The rois are shaped like RPN proposals (about 32-384 px) but on the stride and clear
of the map's last row and column, and torchvision gets (x1, y1, x2 + 1, y2 + 1): then both
rules give the same bins, which `proposals` checks for every roi in float32. The CI scale
is a 300 x 500 image (19 x 32) with 512 input channels and 64 rois."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from onnxruntime_ep_mlu import placement
from onnxruntime_ep_mlu import torch as mlu_torch

from .common import Case, Graph, export, mluops_only, numpy_out, tensor

GROUP, CLASSES, BOX = 7, 21, 8
STRIDE = 16


class RFCNHead(nn.Module):
    def __init__(self, in_channels: int):
        super().__init__()
        self.conv_new_1 = nn.Conv2d(in_channels, 1024, 1)
        self.rfcn_cls = nn.Conv2d(1024, GROUP * GROUP * CLASSES, 1)
        self.rfcn_bbox = nn.Conv2d(1024, GROUP * GROUP * BOX, 1)

    def maps(self, x):
        h = torch.relu(self.conv_new_1(x))
        return h, self.rfcn_cls(h), self.rfcn_bbox(h)

    def forward(self, x, rois):
        _, cls_maps, box_maps = self.maps(x)
        cls_bins = pool(cls_maps, rois, CLASSES)[0]
        cls_score = cls_bins.mean(dim=(1, 2))
        bbox_pred = pool(box_maps, rois, BOX)[0].mean(dim=(1, 2))
        return cls_bins, cls_score, cls_score.softmax(dim=1), bbox_pred


def pool(maps, rois, out_dim):
    """PsRoiPool of NCHW maps (the op is NHWC): ([R, 7, 7, out_dim], mapping_channel, NHWC maps)."""
    nhwc = maps.permute(0, 2, 3, 1)
    out, mapping = mlu_torch.psroi_pool(nhwc, rois, GROUP, GROUP, 1.0 / STRIDE, out_dim)
    return out, mapping, nhwc


class ClsGradient(nn.Module):
    """d sum(cls_score * grad_score) / d rfcn_cls.weight, written out with PsRoiPoolBackward."""

    def __init__(self, head: RFCNHead):
        super().__init__()
        self.head = head

    def forward(self, x, rois, grad_score):
        h, cls_maps, _ = self.head.maps(x)
        _, mapping, nhwc = pool(cls_maps, rois, CLASSES)
        r = grad_score.shape[0]
        top = (grad_score / (GROUP * GROUP)).reshape(r, 1, 1, CLASSES).expand(r, GROUP, GROUP, CLASSES).contiguous()
        grad_maps = mlu_torch.psroi_pool_backward(top, rois, mapping, torch._shape_as_tensor(nhwc), GROUP, GROUP,
                                                  1.0 / STRIDE, CLASSES)
        c = grad_maps.shape[3]
        # (h @ grad)^T: both operands in their stored layout (ONNX Runtime's MatMul with
        # transposed operands ran 35% slower here), one transpose of the small result.
        return (h[0].reshape(h.shape[1], -1) @ grad_maps.reshape(-1, c)).t()


def half_away(v) -> int:
    """Rounding to nearest, halves away from zero (the contract's `round`, C's std::round)."""
    return int(np.sign(v) * np.floor(np.abs(v) + 0.5))


def contract_bins(x1, x2, extent):
    """The contract's bin edges of one axis (start, end per bin) for pixel coordinates x1, x2,
    every step rounded to float32 as the contract says."""
    f = np.float32
    scale = f(1.0 / STRIDE)
    start = f(half_away(x1)) * scale
    size = max(f(f(half_away(x2)) + f(1)) * scale - start, f(0.1))
    b = f(size / f(GROUP))
    lo = [min(max(np.floor(f(f(f(i) * b) + start)), 0), extent) for i in range(GROUP)]
    hi = [min(max(np.ceil(f(f(f(i + 1) * b) + start)), 0), extent) for i in range(GROUP)]
    return lo, hi


def torchvision_bins(x1, x2, extent):
    """torchvision's (0.29, CPU forward): integer start and size rounded after scaling, bin
    edges from the float32 bin size, then the start added and clamped to extent - 1."""
    f = np.float32
    start = half_away(f(f(x1) * f(1.0 / STRIDE)))
    size = max(half_away(f(f(x2) * f(1.0 / STRIDE))) - start, 1)
    b = f(f(size) / f(GROUP))
    lo = [min(max(int(np.floor(f(f(i) * b))) + start, 0), extent - 1) for i in range(GROUP)]
    hi = [min(max(int(np.ceil(f(f(i + 1) * b))) + start, 0), extent - 1) for i in range(GROUP)]
    return lo, hi


def proposals(rng, count: int, height: int, width: int) -> np.ndarray:
    """[count, 5] (0, x1, y1, x2, y2) image pixels shaped like RPN proposals: sqrt(w h) drawn
    log-uniform in 2-24 cells (about 32-384 px; sides 1-34 cells after rounding), aspect
    log-uniform in 1:2-2:1, on the stride (x1, y1, x2 + 1 and y2 + 1 multiples of 16, where
    both roundings give the same integer start and end) and clear of the map's last row and
    column (where torchvision clamps bin ends). At these sizes the contract's bins and
    torchvision's are then the same; each roi is checked with both rules computed in float32
    as each specifies (they do differ for some wider rois, e.g. 57 cells at x 5 of 63), and a
    disagreement raises rather than being drawn again."""
    out = np.zeros((count, 5), np.float32)
    for r in range(count):
        side = np.exp(rng.uniform(np.log(2), np.log(24)))
        aspect = np.exp(rng.uniform(np.log(0.5), np.log(2)))
        w = int(np.clip(round(side * np.sqrt(aspect)), 1, width - 2))
        h = int(np.clip(round(side / np.sqrt(aspect)), 1, height - 2))
        x0, y0 = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        roi = (x0 * STRIDE, y0 * STRIDE, (x0 + w) * STRIDE - 1, (y0 + h) * STRIDE - 1)
        for lo, hi, extent in ((roi[0], roi[2], width), (roi[1], roi[3], height)):
            if contract_bins(lo, hi, extent) != torchvision_bins(lo, hi + 1, extent):
                raise AssertionError(f"rfcn: roi {roi} has different bins under the contract and torchvision")
        out[r, 1:] = roi
    return out


def case(scale: str, seed: int) -> Case:
    from torchvision.ops import ps_roi_pool

    rng = np.random.default_rng(seed)
    cin, height, width, count = (2048, 38, 63, 300) if scale == "full" else (512, 19, 32, 64)
    x = np.maximum(rng.standard_normal((1, cin, height, width)), 0).astype(np.float32)  # a ReLU'd res5 map
    rois = proposals(rng, count, height, width)
    tv_rois = rois.copy()
    tv_rois[:, 3:] += 1.0
    grad_score = rng.standard_normal((count, CLASSES)).astype(np.float32)
    torch.manual_seed(seed)
    net = RFCNHead(cin).eval()
    fwd = export(net, (tensor(x), tensor(rois)), ["features", "rois"], ["cls_bins", "cls_score", "cls_prob", "bbox_pred"],
                 {"rois": {0: "R"}})
    grad_model = export(ClsGradient(net), (tensor(x), tensor(rois), tensor(grad_score)),
                        ["features", "rois", "grad_score"], ["grad_rfcn_cls_weight"])

    def peer_pool(maps):
        return ps_roi_pool(maps, tensor(tv_rois), GROUP, 1.0 / STRIDE)

    def peer_forward(threads: int):
        with torch.no_grad():
            _, cls_maps, box_maps = net.maps(tensor(x))
            cls_bins = peer_pool(cls_maps)
            cls_score = cls_bins.mean(dim=(2, 3))
            bbox_pred = peer_pool(box_maps).mean(dim=(2, 3))
        return {"cls_bins": numpy_out(cls_bins.permute(0, 2, 3, 1)), "cls_score": numpy_out(cls_score),
                "cls_prob": numpy_out(cls_score.softmax(dim=1)), "bbox_pred": numpy_out(bbox_pred)}

    def peer_gradient(threads: int):
        # Only the gradient the graph computes (torch.autograd.grad prunes the rest).
        with torch.enable_grad():
            # Only the score maps (the exported graph drops the unused box maps too).
            cls_maps = net.rfcn_cls(torch.relu(net.conv_new_1(tensor(x))))
            loss = (peer_pool(cls_maps).mean(dim=(2, 3)) * tensor(grad_score)).sum()
            (grad,) = torch.autograd.grad(loss, net.rfcn_cls.weight)
        return {"grad_rfcn_cls_weight": numpy_out(grad[:, :, 0, 0])}

    # PsRoiPool and PsRoiPoolBackward leave MLU-OPS at run time on these rois: boxes on a
    # 16-pixel stride put bin edges on integers, where the library's on-card division and
    # floor/ceil may land one row off (docs/MLUOPS_BINDING.md, "within one ulp of an integer");
    # PsRoiPool then runs on the CPU (no BANG kernel), the backward on the BANG kernel under auto.
    ulp = placement.ULP_EDGES
    return Case(
        "rfcn_head",
        f"{cin} x {height} x {width} map, {count} rois, 7x7 bins, 21 classes",
        [
            Graph("forward", fwd, {"features": x, "rois": rois}, peer_forward, "torchvision ps_roi_pool",
                  note="torchvision gets (x1, y1, x2 + 1, y2 + 1)",
                  off_card={**mluops_only("PsRoiPool"), "mluops": ulp, "auto": ulp},
                  run_time={"mluops": (2, 0, ulp), "auto": (2, 0, ulp)}),
            Graph("gradient", grad_model, {"features": x, "rois": rois, "grad_score": grad_score}, peer_gradient,
                  "torchvision autograd", off_card={"mluops": ulp},
                  run_time={"mluops": (2, 0, ulp), "auto": (1, 1, ulp)}),
        ],
    )
