"""CenterHead with its decoding, as mmdet3d's CenterPoint and BEVDepth configure it for
nuScenes (mmdet3d configs/_base_/models/centerpoint_0075voxel_second_secfpn_nus.py;
BEVDepth's bev_depth_lss_r50_256x704_128x128.py uses the same tasks and heads): a shared
3 x 3 convolution to 64 channels, six tasks (car; truck, construction vehicle; bus,
trailer; barrier; motorcycle, bicycle; pedestrian, traffic cone), each with the heads reg 2,
height 1, dim 3, rot 2, vel 2 and a heatmap of its classes (head_conv 64, final kernel 3,
heatmap bias -2.19). Decoding per task: sigmoid heatmap, its 3 x 3 peaks (max-pool, CenterNet's
way; mmdet3d's CenterPointBBoxCoder takes the top of the raw heatmap and leaves neighbours to
NMS), the top 500 (its max_num), the box from the peak's cell and the regressions,
score_threshold 0.1. Velocity is
computed by its head but not decoded: the compared box rows have none. Rotated or circle
NMS stays outside the graph."""

from __future__ import annotations

import warnings

import torch
from torch import nn

BN_EPS = 1e-3
TASKS = (1, 2, 2, 1, 2, 2)
TOP_K, SCORE_THR = 500, 0.1
#: The cuts of the decoding, for regression.compare_detections: the top TOP_K per task (each
#: task's labels share one), then the score threshold.
CUTS = {
    "top_k": TOP_K,
    "top_k_labels": [list(range(sum(TASKS[:i]), sum(TASKS[: i + 1]))) for i in range(len(TASKS))],
    "threshold": SCORE_THR,
}


def conv_bn(cin, cout, k=3, stride=1):
    return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout, eps=BN_EPS, momentum=0.01), nn.ReLU()]


class CenterHead(nn.Module):
    """BEV features [1, C, H, W] to boxes [M, 9] (x, y, z, dx, dy, dz, yaw, score, label);
    ``cell`` is the size in metres of a head-map cell, ``origin`` the (x, y) of cell 0's
    corner."""

    def __init__(self, channels: int, cell, origin):
        super().__init__()
        self.cell, self.origin = tuple(cell), tuple(origin)
        self.shared = nn.Sequential(*conv_bn(channels, 64))
        self.tasks = nn.ModuleList()
        for n in TASKS:
            task = nn.ModuleDict()
            for name, out in (("reg", 2), ("height", 1), ("dim", 3), ("rot", 2), ("vel", 2), ("heatmap", n)):
                task[name] = nn.Sequential(*conv_bn(64, 64), nn.Conv2d(64, out, 3, 1, 1))
            nn.init.constant_(task["heatmap"][-1].bias, -2.19)
            self.tasks.append(task)

    def decode(self, out, first_label):
        heat = torch.sigmoid(out["heatmap"])
        _, n, h, w = heat.shape
        peaks = heat * (nn.functional.max_pool2d(heat, 3, 1, 1) == heat).to(heat.dtype)
        with warnings.catch_warnings():
            # The head map's size is a constant of the model (its BEV grid is fixed).
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            k = min(TOP_K, int(n * h * w))
        score, idx = peaks.reshape(-1).topk(k)
        label, pix = idx // (h * w), idx % (h * w)
        ys, xs = (pix // w).to(heat.dtype), (pix % w).to(heat.dtype)

        def at(name):
            return out[name].reshape(out[name].shape[1], -1)[:, pix].t()

        reg, rot = at("reg"), at("rot")
        x = (xs + reg[:, 0]) * self.cell[0] + self.origin[0]
        y = (ys + reg[:, 1]) * self.cell[1] + self.origin[1]
        yaw = torch.atan2(rot[:, 0], rot[:, 1])
        return torch.cat([torch.stack([x, y], 1), at("height"), torch.exp(at("dim")), yaw.unsqueeze(1),
                          score.unsqueeze(1), (label + first_label).to(heat.dtype).unsqueeze(1)], 1)

    def forward(self, x):
        x = self.shared(x)
        boxes, first = [], 0
        for n, task in zip(TASKS, self.tasks):
            boxes.append(self.decode({k: m(x) for k, m in task.items()}, first))
            first += n
        det = torch.cat(boxes, 0)
        return det[det[:, 7] > SCORE_THR]
