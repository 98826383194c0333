"""PointNet++ SSG feature propagation (mmdet3d's PointFPModule) from 4,096 known points with
256 channels to 16,384 points with 128 skip channels, batch 2: the three nearest known
points of each point (three_nn, outside the graph as in mmcv, where it is its own op),
inverse-distance weights (1 / (dist + 1e-8), normalised), ThreeInterpolate, the skip
concatenation and the MLP (Conv1d 1 x 1 + BatchNorm + ReLU, 384 -> 256 -> 256). The
channels are those of the second FP module of mmdet3d's PointNet2Head (configs/_base_/
models/pointnet2_ssg.py: fp_channels (384, 256, 256), 256 known + 128 skip channels); the
point counts are not published ones: that config runs the module at 64 -> 256 points of an
8,192-point ScanNet crop, and these are the 4k -> 16k points of a full scan, where the
operator's cost shows.

Its gradient is a second graph: the gradient of sum(out * G) for an upstream gradient G
with respect to the known points' features, back through the MLP (written out: the
BatchNorm scale, the ReLU mask, the transposed 1 x 1 weights) and ThreeInterpolateBackward.

Peer: the same module with three_interpolate as torch's gather of the three neighbours'
features times their weights, summed (mmcv's formulation), eager; torch autograd for the
gradient. three_nn is computed once, exactly (float64 distances, ties to the lower index),
and fed to both. The CI scale is batch 1, 4,096 -> 1,024 points."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from onnxruntime_ep_mlu import torch as mlu_torch

from .common import Case, Graph, export, mluops_only, numpy_out, seed_batchnorms, tensor

KNOWN_CHANNELS, SKIP_CHANNELS, MLP = 256, 128, (384, 256, 256)


def three_nn(unknown: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dist float32 [B, n, 3], idx int32 [B, n, 3]): the three nearest known points of each
    point, nearest first."""
    b, n, _ = unknown.shape
    dist = np.empty((b, n, 3), np.float32)
    idx = np.empty((b, n, 3), np.int32)
    k = torch.from_numpy(known.astype(np.float64))
    for i in range(b):
        for s in range(0, n, 2048):
            u = torch.from_numpy(unknown[i, s : s + 2048].astype(np.float64))
            d2 = ((u[:, None, :] - k[i][None, :, :]) ** 2).sum(-1)
            order = np.argsort(d2.numpy(), axis=1, kind="stable")[:, :3]
            idx[i, s : s + 2048] = order
            dist[i, s : s + 2048] = np.sqrt(np.take_along_axis(d2.numpy(), order, 1))
    return dist, idx


def ours_interpolate(features, idx, weight):
    return mlu_torch.three_interpolate(features, idx, weight)


def peer_interpolate(features, idx, weight):
    """mmcv's three_interpolate as a gather: sum over k of features[:, :, idx[..., k]] * weight[..., k]."""
    b, c, _ = features.shape
    n = idx.shape[1]
    picked = torch.gather(features, 2, idx.long().reshape(b, 1, n * 3).expand(b, c, n * 3)).view(b, c, n, 3)
    return (picked * weight.unsqueeze(1)).sum(-1)


class PointFP(nn.Module):
    def __init__(self, interpolate):
        super().__init__()
        self.interpolate = interpolate
        self.convs = nn.ModuleList(nn.Conv1d(a, b, 1, bias=False) for a, b in zip(MLP, MLP[1:]))
        self.norms = nn.ModuleList(nn.BatchNorm1d(b) for b in MLP[1:])

    def layers(self, unknown_feats, known_feats, idx, dist):
        """(the interpolation weights, each layer's ReLU input, the output)."""
        recip = 1.0 / (dist + 1e-8)
        weight = recip / recip.sum(dim=2, keepdim=True)
        x = torch.cat([self.interpolate(known_feats, idx, weight), unknown_feats], dim=1)
        pres = []
        for conv, norm in zip(self.convs, self.norms):
            pres.append(norm(conv(x)))
            x = torch.relu(pres[-1])
        return weight, pres, x

    def forward(self, unknown_feats, known_feats, idx, dist):
        return self.layers(unknown_feats, known_feats, idx, dist)[2]


class FPGradient(nn.Module):
    """d sum(out * grad_out) / d known_feats, written out (the graph a training step exports)."""

    def __init__(self, fp: PointFP, known_points: int):
        super().__init__()
        self.fp = fp
        self.known_points = known_points

    def forward(self, unknown_feats, known_feats, idx, dist, grad_out):
        weight, pres, _ = self.fp.layers(unknown_feats, known_feats, idx, dist)
        g = grad_out
        for conv, norm, pre in reversed(list(zip(self.fp.convs, self.fp.norms, pres))):
            scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
            g_pre = g * (pre > 0).to(g.dtype) * scale.unsqueeze(1)
            g = torch.matmul(conv.weight[:, :, 0].t(), g_pre)
        return mlu_torch.three_interpolate_backward(g[:, :KNOWN_CHANNELS].contiguous(), idx, weight, self.known_points)


def case(scale: str, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    b, n, m = (2, 16384, 4096) if scale == "full" else (1, 4096, 1024)
    xyz = rng.uniform(-1, 1, (b, n, 3)).astype(np.float32)
    known_xyz = np.stack([xyz[i, rng.choice(n, m, replace=False)] for i in range(b)])
    dist, idx = three_nn(xyz, known_xyz)
    unknown_feats = rng.standard_normal((b, SKIP_CHANNELS, n)).astype(np.float32)
    known_feats = rng.standard_normal((b, KNOWN_CHANNELS, m)).astype(np.float32)
    grad_out = rng.standard_normal((b, MLP[-1], n)).astype(np.float32)
    torch.manual_seed(seed)
    net = seed_batchnorms(PointFP(ours_interpolate), seed)
    peer_net = copy.deepcopy(net)
    peer_net.interpolate = peer_interpolate
    names = ["unknown_feats", "known_feats", "indices", "dist"]
    feeds = dict(zip(names, (unknown_feats, known_feats, idx, dist)))
    args = tuple(tensor(a) for a in feeds.values())
    fwd = export(net, args, names, ["new_features"])
    grad_model = export(FPGradient(net, m), args + (tensor(grad_out),), names + ["grad_out"], ["grad_known_feats"])

    def peer_forward(threads: int):
        with torch.no_grad():
            return {"new_features": numpy_out(peer_net(*args))}

    def peer_gradient(threads: int):
        known = tensor(known_feats).requires_grad_(True)
        with torch.enable_grad():
            out = peer_net(tensor(unknown_feats), known, tensor(idx), tensor(dist))
            # Only the gradient the graph computes (torch.autograd.grad prunes the weights').
            (grad,) = torch.autograd.grad((out * tensor(grad_out)).sum(), known)
        return {"grad_known_feats": numpy_out(grad)}

    # A ReLU input within float32 rounding of 0 takes either branch depending on the order
    # of a sum, and the gradient through it is then all or nothing: the known points fed by
    # a point with such an input (|x| < 1e-6 in the peer, at any layer; rounding moves these
    # inputs by about 1e-7) are left out of the gradient's comparison, on both sides.
    with torch.no_grad():
        _, pres, _ = peer_net.layers(*args)
        ambiguous = torch.stack([(pre.abs() < 1e-6).any(dim=1) for pre in pres]).any(dim=0)
    left_out = np.zeros((b, m), bool)
    for i in range(b):
        left_out[i, np.unique(idx[i][ambiguous[i].numpy()])] = True

    def comparable(a: np.ndarray) -> np.ndarray:
        return np.where(left_out[:, None, :], 0.0, a)

    return Case(
        "pointnet2_fp",
        f"batch {b}, {m} -> {n} points, {KNOWN_CHANNELS}+{SKIP_CHANNELS} -> {MLP[-1]} channels",
        [
            Graph("forward", fwd, feeds, peer_forward, "torch (gather three_interpolate)",
                  off_card=mluops_only("ThreeInterpolate")),
            Graph("gradient", grad_model, {**feeds, "grad_out": grad_out}, peer_gradient, "torch autograd",
                  {"grad_known_feats": comparable},
                  note=f"{int(left_out.sum())} of {b * m} known points left out: fed through a ReLU input within 1e-6 of 0"),
        ],
    )
