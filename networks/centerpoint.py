"""CenterPoint / SECOND sparse 3D backbone: mmdet3d's SparseEncoder at CenterPoint's
nuScenes configuration (in_channels 5, sparse_shape [41, 1440, 1440], block_type
basicblock, encoder_channels ((16, 16, 32), (32, 32, 64), (64, 64, 128), (128, 128)),
encoder_paddings ((0, 0, 1), (0, 0, 1), (0, 0, [0, 1, 1]), (0, 0)), conv_out (3, 1, 1) /
(2, 1, 1) to 128 channels, BatchNorm1d(eps 1e-3) + ReLU after every convolution, then
``dense()`` viewed as [N, C*D, H, W]). As in mmdet3d, the SparseBasicBlocks' SubMConv3d
have no indice_key: spconv builds a rulebook for each of their convolutions (21 in all);
onnxruntime_ep_mlu.torch reuses one built for the same sites and geometry, so the exported
graph has 8 GetIndicePairs nodes.

Peer: the same network built from spconv 2.3.8's modules (SubMConv3d / SparseConv3d,
ConvAlgo.Native, the weights converted from [kd, kh, kw, Cin, Cout] to spconv's
[Cout, kd, kh, kw, Cin]), run eagerly on CPU at 1 torch thread: spconv 2.3.8's CPU path
gives wrong rows, different from run to run, on 2 threads.

Input: the simulated 32-beam scan (networks/lidar.py), 10 sweeps on the full grid (about
100k voxels); the CI scale keeps the scan's central 360 x 360 cells (grid [41, 360, 360])."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from onnxruntime_ep_mlu import torch as mlu_torch

from .common import Case, Graph, export, numpy_out, seed_batchnorms, tensor
from .lidar import centerpoint_sites, scan_points

BN_EPS = 1e-3
ENCODER_CHANNELS = ((16, 16, 32), (32, 32, 64), (64, 64, 128), (128, 128))
ENCODER_PADDINGS = ((0, 0, 1), (0, 0, 1), (0, 0, (0, 1, 1)), (0, 0))


def layers(in_channels: int = 5, base: int = 16, out_channels: int = 128):
    """The convolutions in order: (name, cin, cout, kernel, stride, padding, subm,
    indice_key, block, second): block names a SparseBasicBlock, second marks its second
    convolution (the one followed by the residual addition)."""
    out = [("conv_input", in_channels, base, (3, 3, 3), 1, 1, True, "subm1", "", False)]
    cin = base
    for i, blocks in enumerate(ENCODER_CHANNELS):
        for j, cout in enumerate(blocks):
            if j == len(blocks) - 1 and i != len(ENCODER_CHANNELS) - 1:
                pad = ENCODER_PADDINGS[i][j]
                out.append((f"encoder{i + 1}.down", cin, cout, (3, 3, 3), 2, pad, False, f"spconv{i + 1}", "", False))
            else:
                block = f"encoder{i + 1}.block{j}"
                out.append((f"{block}.conv1", cout, cout, (3, 3, 3), 1, 1, True, None, block, False))
                out.append((f"{block}.conv2", cout, cout, (3, 3, 3), 1, 1, True, None, block, True))
            cin = cout
    out.append(("conv_out", cin, out_channels, (3, 1, 1), (2, 1, 1), 0, False, "spconv_down2", "", False))
    return out


def encode(net, x):
    """The convolutions of ``net`` (its ``spec``, ``convs`` and ``norms``) on the sparse
    tensor ``x``, ours or spconv's: conv, BatchNorm, the blocks' residual, ReLU."""
    identity = None
    for (_, _, _, _, _, _, _, _, block, second), conv, norm in zip(net.spec, net.convs, net.norms):
        if block and not second:
            identity = x.features
        x = conv(x)
        f = norm(x.features)
        if second:
            f = f + identity
        x = x.replace_feature(torch.relu(f))
    return x


class SparseEncoder(nn.Module):
    """The backbone on the package's modules (GetIndicePairs + IndiceConv nodes)."""

    def __init__(self, sparse_shape):
        super().__init__()
        self.sparse_shape = tuple(sparse_shape)
        self.spec = layers()
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        for _, cin, cout, k, stride, pad, subm, key, _, _ in self.spec:
            if subm:
                conv = mlu_torch.SubMConv3d(cin, cout, k, bias=False, indice_key=key)
            else:
                conv = mlu_torch.SparseConv3d(cin, cout, k, stride=stride, padding=pad, bias=False, indice_key=key)
            self.convs.append(conv)
            self.norms.append(nn.BatchNorm1d(cout, eps=BN_EPS, momentum=0.01))

    def forward(self, voxel_features, coors):
        x = mlu_torch.SparseTensor(voxel_features, coors, self.sparse_shape, 1)
        x = encode(self, x)
        d, h, w = x.spatial_shape
        c = x.features.shape[1]
        idx = x.indices.long()
        cell = (idx[:, 1] * h + idx[:, 2]) * w + idx[:, 3]  # batch 0
        dense = x.features.new_zeros(d * h * w, c).index_put((cell,), x.features)
        spatial_features = dense.view(d, h, w, c).permute(3, 0, 1, 2).reshape(1, c * d, h, w)
        return spatial_features, x.indices


class SpconvEncoder(nn.Module):
    """The same backbone on spconv 2.3.8's modules, with ``ours``'s weights."""

    def __init__(self, ours: SparseEncoder):
        super().__init__()
        import spconv.pytorch as spt
        from spconv.core import ConvAlgo

        self.spt = spt
        self.sparse_shape = list(ours.sparse_shape)
        self.spec = ours.spec
        self.convs = nn.ModuleList()
        self.norms = ours.norms
        for (_, cin, cout, k, stride, pad, subm, key, _, _), conv in zip(ours.spec, ours.convs):
            if subm:
                m = spt.SubMConv3d(cin, cout, k, padding=1, bias=False, indice_key=key, algo=ConvAlgo.Native)
            else:
                m = spt.SparseConv3d(cin, cout, k, stride=stride, padding=pad, bias=False, indice_key=key,
                                     algo=ConvAlgo.Native)
            with torch.no_grad():
                m.weight.copy_(conv.weight.permute(4, 0, 1, 2, 3))
            self.convs.append(m)
        self.eval()

    def forward(self, voxel_features, coors):
        x = self.spt.SparseConvTensor(voxel_features, coors, self.sparse_shape, 1)
        x = encode(self, x)
        dense = x.dense()
        n, c, d, h, w = dense.shape
        return dense.view(n, c * d, h, w), x.indices


def sorted_rows(a: np.ndarray) -> np.ndarray:
    """Sparse coordinates as a set: the rows sorted (spconv and the contract order output
    sites differently)."""
    a = np.asarray(a)
    return a[np.lexsort(a.T[::-1])] if a.size else a


def case(scale: str, seed: int, sweeps: int = 10) -> Case:
    rng = np.random.default_rng(seed)
    sites = centerpoint_sites(scan_points(rng, sweeps), rng)
    shape = [41, 1440, 1440]
    if scale == "ci":
        keep = (sites[:, 2] >= 540) & (sites[:, 2] < 900) & (sites[:, 3] >= 540) & (sites[:, 3] < 900)
        sites = sites[keep] - np.array([0, 0, 540, 540], np.int32)
        shape = [41, 360, 360]
    feats = rng.standard_normal((sites.shape[0], 5)).astype(np.float32)
    torch.manual_seed(seed)
    net = seed_batchnorms(SparseEncoder(shape), seed)
    model = export(net, (tensor(feats), tensor(sites)), ["voxel_features", "coors"], ["spatial_features", "out_indices"],
                   {"voxel_features": {0: "L"}, "coors": {0: "L"}, "out_indices": {0: "M"}})
    peer_net = SpconvEncoder(net)

    def peer(threads: int):
        with torch.no_grad():
            dense, idx = peer_net(tensor(feats), tensor(sites))
        return {"spatial_features": numpy_out(dense), "out_indices": numpy_out(idx).astype(np.int32)}

    graph = Graph("forward", model, {"voxel_features": feats, "coors": sites}, peer, "spconv 2.3.8", 
                  {"out_indices": sorted_rows}, peer_threads=(1,),
                  note="out_indices compared as sets (sorted rows)")
    return Case("centerpoint", f"SparseEncoder {'x'.join(map(str, shape))}, {sites.shape[0]} voxels", [graph])
