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
from onnxruntime_ep_mlu.regression import DETECTIONS

from .centerhead import BN_EPS, CUTS, CenterHead, conv_bn
from .common import Case, Graph, Voxelizer, export, numpy_out, seed_batchnorms, tensor
from .lidar import centerpoint_sites, scan_points

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
        # spconv 2.3.8's CPU path gives wrong rows on 2 threads: the encoder runs at 1 whatever
        # the caller's torch thread count (a whole detector's dense parts keep theirs).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            x = self.spt.SparseConvTensor(voxel_features, coors, self.sparse_shape, 1)
            x = encode(self, x)
            dense = x.dense()
        finally:
            torch.set_num_threads(threads)
        n, c, d, h, w = dense.shape
        return dense.view(n, c * d, h, w), x.indices


# ----------------------------------------------------------------------------- whole detector
#: mmdet3d's CenterPoint nuScenes configuration (configs/centerpoint/
#: centerpoint_0075voxel_second_secfpn_4x8_cyclic_20e_nus.py and its base
#: centerpoint_0075voxel_second_secfpn_nus.py): voxels 0.075 x 0.075 x 0.2 m over
#: [-54, 54] x [-54, 54] x [-5, 3], DynamicSimpleVFE (the mean of a voxel's points), the
#: SparseEncoder above, SECOND (layer_nums [5, 5], strides [1, 2], channels [128, 256]),
#: SECONDFPN (upsample strides [1, 2] to 2 x 256), CenterHead (shared conv 64, six tasks,
#: heads reg 2, height 1, dim 3, rot 2, vel 2, heatmap; networks/centerhead.py) at
#: out_size_factor 8.
CP_VOXEL = (0.075, 0.075, 0.2)
CP_RANGE = (-54.0, -54.0, -5.0, 54.0, 54.0, 3.0)
CP_CI_RANGE = (-13.2, -13.2, -5.0, 13.2, 13.2, 3.0)  # the central 352 x 352 cells (an even head map)
OUT_SIZE_FACTOR = 8


class CenterPointDetector(nn.Module):
    """Points [N, 5] (x, y, z, intensity, time lag) to boxes [M, 9] (x, y, z, dx, dy, dz,
    yaw, score, label): voxelisation, the VFE by DynamicScatter mean (``scatter``), the
    sparse ``encoder`` (spconv's modules, or those from_spconv made of them), the 2D
    backbone, neck and head, and the decoding."""

    def __init__(self, encoder, scatter, pc_range):
        super().__init__()
        self.encoder, self.scatter = encoder, scatter
        self.voxelize = Voxelizer(pc_range, CP_VOXEL)
        self.second = nn.ModuleList([
            nn.Sequential(*conv_bn(256, 128), *sum((conv_bn(128, 128) for _ in range(5)), [])),
            nn.Sequential(*conv_bn(128, 256, stride=2), *sum((conv_bn(256, 256) for _ in range(5)), [])),
        ])
        self.fpn = nn.ModuleList([
            nn.Sequential(nn.ConvTranspose2d(c, 256, s, s, bias=False), nn.BatchNorm2d(256, eps=BN_EPS, momentum=0.01), nn.ReLU())
            for c, s in ((128, 1), (256, 2))
        ])
        cell = (OUT_SIZE_FACTOR * CP_VOXEL[0], OUT_SIZE_FACTOR * CP_VOXEL[1])
        self.head = CenterHead(512, cell, pc_range[:2])

    def forward(self, points):
        coors = self.voxelize(points)
        voxel_feats, voxel_coors, _ = self.scatter(points, coors, "mean")
        x, _ = self.encoder(voxel_feats, voxel_coors.to(torch.int32))
        ups = []
        for block, up in zip(self.second, self.fpn):
            x = block(x)
            ups.append(up(x))
        return self.head(torch.cat(ups, 1))


def detector_graph(scale: str, seed: int) -> Graph:
    """The whole detector on points: ours through from_spconv, the peer the same spconv
    model eagerly (torch.unique voxelisation; the spconv encoder at 1 thread, the rest at the
    timed thread count)."""
    from .pointpillars import ours_dynamic_scatter, peer_dynamic_scatter

    rng = np.random.default_rng(seed + 1)
    xyz = scan_points(rng, sweeps=10)
    points = np.concatenate([xyz, rng.random((xyz.shape[0], 2), dtype=np.float32)], 1).astype(np.float32)
    pc_range = CP_RANGE if scale == "full" else CP_CI_RANGE
    nx, ny, nz = Voxelizer(pc_range, CP_VOXEL).grid
    torch.manual_seed(seed)
    spconv_encoder = SpconvEncoder(SparseEncoder([nz + 1, ny, nx]))
    torch.manual_seed(seed)
    peer = seed_batchnorms(CenterPointDetector(spconv_encoder, peer_dynamic_scatter, pc_range), seed)
    # The same weights: the encoder converted once peer's is seeded (the conversion draws
    # initial weights of its own), then the same seeds.
    encoder = mlu_torch.from_spconv(spconv_encoder)
    torch.manual_seed(seed)
    ours = seed_batchnorms(CenterPointDetector(encoder, ours_dynamic_scatter, pc_range), seed)
    model = export(ours, (tensor(points),), ["points"], ["detections"], {"points": {0: "N"}})

    def run_peer(threads: int):
        with torch.no_grad():
            return {"detections": numpy_out(peer(tensor(points)))}

    return Graph("detections", model, {"points": points}, run_peer,
                 "spconv 2.3.8 (1 thread) + torch (the same decoding)", tolerances={"detections": {**DETECTIONS, **CUTS}},
                 note="boxes matched by label and centre")


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
    return Case("centerpoint", f"SparseEncoder {'x'.join(map(str, shape))}, {sites.shape[0]} voxels",
                [graph, detector_graph(scale, seed)])
