"""BEVDepth's LSS view transform at its nuScenes configuration (bev_depth_lss_r50_256x704_128x128:
6 cameras, 256 x 704 images at stride 16 -> 16 x 44 features, depth bins 2-58 m step 0.5
-> 112, 80 context channels, BEV x/y bounds [-51.2, 51.2] step 0.8 -> 128 x 128, z [-5, 3]
one cell), ending in VoxelPoolingForward, then a BEV head.

Simplified where the custom op is not involved: the depth net is LSS's 1 x 1 convolution
from the 512-channel image features to 112 depth logits + 80 context channels (BEVDepth's
camera-aware DepthNet is more dense convolutions before the same softmax and outer
product), and the head is two 3 x 3 Conv + BatchNorm + ReLU and a 1 x 1 heatmap
convolution (10 classes). The frustum geometry is computed outside the graph, as BEVDepth's
get_geometry does from the camera matrices, for a nuScenes-like rig (six cameras at yaw 0,
+-55, +-110, 180 degrees, 1.5 m high, the intrinsics of 1600 x 900 images resized to
704 wide), and quantised like BEVDepth's voxel_pooling ((p - (lower bound)) / 0.8, then
.int(), truncating toward zero); the graph's input is that int32 geom_xyz.

Peer: the same module with the pooling as torch's index_add into the BEV grid (the sum
BEVDepth's CUDA voxel_pooling computes), in eager mode. The CI scale uses 8 x 22 features
and 1 m depth steps (56 bins)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from onnxruntime_ep_mlu import torch as mlu_torch
from onnxruntime_ep_mlu.regression import DETECTIONS

from .centerhead import BN_EPS, CUTS, CenterHead, conv_bn
from .common import Case, Graph, export, numpy_out, seed_batchnorms, tensor

BEV = (128, 128, 1)  # nx, ny, nz
CHANNELS = 80


#: The rig's intrinsics: 1600 x 900 images resized by 0.44, cropped to 704 x 256.
FOCAL, CX, CY = 1266.0 * 0.44, 352.0, 128.0


def rig(cams: int):
    """Each camera's yaw rotation (ego frame: x forward, y left, z up) and its position,
    1 m from the centre and 1.5 m high, at yaw 0, -55, 55, 180, -110, 110 degrees."""
    for yaw in np.deg2rad([0, -55, 55, 180, -110, 110][:cams]):
        rot = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
        yield rot, np.array([1.0 * np.cos(yaw), 1.0 * np.sin(yaw), 1.5])


def geometry(cams: int, h: int, w: int, depths: np.ndarray) -> np.ndarray:
    """int32 [1, cams*D*h*w, 3] voxel coordinates (x, y, z) of the frustum points, in the
    order of the features (camera, depth, row, column)."""
    f, cx, cy = FOCAL, CX, CY
    u = np.linspace(0, 703, w)
    v = np.linspace(0, 255, h)
    d, vv, uu = np.meshgrid(depths, v, u, indexing="ij")
    cam = np.stack([(uu - cx) * d / f, (vv - cy) * d / f, d], -1)  # x right, y down, z forward
    ego_local = np.stack([cam[..., 2], -cam[..., 0], -cam[..., 1]], -1)  # x forward, y left, z up
    p = np.stack([ego_local @ rot.T + trans for rot, trans in rig(cams)]).reshape(-1, 3)
    lower = np.array([-51.2, -51.2, -5.0])
    size = np.array([0.8, 0.8, 8.0])
    return np.trunc((p - lower) / size).astype(np.int32)[None]


class LSSViewTransform(nn.Module):
    def __init__(self, depth_bins: int, pool):
        super().__init__()
        self.depth_bins = depth_bins
        self.pool = pool
        self.depth_net = nn.Conv2d(512, depth_bins + CHANNELS, 1)
        head = []
        for _ in range(2):
            head += [nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False), nn.BatchNorm2d(CHANNELS), nn.ReLU()]
        self.head = nn.Sequential(*head)
        self.heatmap = nn.Conv2d(CHANNELS, 10, 1)

    def forward(self, img_feats, geom_xyz):
        x = self.depth_net(img_feats)  # [cams, D + C, h, w]
        depth = x[:, : self.depth_bins].softmax(dim=1)
        context = x[:, self.depth_bins:]
        # Formed in VoxelPoolingForward's layout, [cams, D, h, w, C]: the small context is
        # transposed, not the D times larger product (the same products, bit for bit).
        feats = (depth.unsqueeze(-1) * context.permute(0, 2, 3, 1).unsqueeze(1)).reshape(1, -1, CHANNELS)
        bev = self.pool(geom_xyz, feats).permute(0, 3, 1, 2)  # [1, C, ny, nx]
        return bev, self.heatmap(self.head(bev))


# ----------------------------------------------------------------------------- whole detector
MID = 512  # BEVDepth's depth_net_conf mid_channels


def camera_params(cams: int) -> np.ndarray:
    """BEVDepth's mlp_input per camera [cams, 27] for the rig of ``geometry``: fx, fy, cx, cy;
    the image augmentation's (identity) 2 x 3 entries; the BEV augmentation's (identity)
    five; sensor2ego's 3 x 4."""
    cam2local = np.array([[0, 0, 1], [-1, 0, 0], [0, -1, 0]], float)  # camera: x right, y down, z forward
    rows = [
        np.concatenate([[FOCAL, FOCAL, CX, CY], [1, 0, 0, 0, 1, 0], [1, 0, 0, 1, 1],
                        np.concatenate([rot @ cam2local, trans[:, None]], 1).ravel()])
        for rot, trans in rig(cams)
    ]
    return np.array(rows, np.float32)


class SE(nn.Module):
    """BEVDepth's SELayer: x gated by the camera features."""

    def __init__(self, c):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x, cam):
        return x * torch.sigmoid(self.expand(torch.relu(self.reduce(cam))))


def mlp(cin, mid, cout):
    return nn.Sequential(nn.Linear(cin, mid), nn.ReLU(), nn.Linear(mid, cout))


class DepthNet(nn.Module):
    """BEVDepth's camera-aware DepthNet: the camera parameters (BatchNorm1d, then an MLP per
    branch) gate the reduced image features (SE) of the context and depth branches. Simplified
    where no custom op is involved: the depth branch's three BasicBlocks, ASPP and deformable
    convolution are two 3 x 3 convolutions here."""

    def __init__(self, depth_bins):
        super().__init__()
        self.reduce = nn.Sequential(nn.Conv2d(512, MID, 3, 1, 1, bias=False), nn.BatchNorm2d(MID), nn.ReLU())
        self.bn = nn.BatchNorm1d(27)
        self.depth_mlp, self.context_mlp = mlp(27, MID, MID), mlp(27, MID, MID)
        self.depth_se, self.context_se = SE(MID), SE(MID)
        self.context_conv = nn.Conv2d(MID, CHANNELS, 1)
        self.depth_conv = nn.Sequential(
            nn.Conv2d(MID, MID, 3, 1, 1, bias=False), nn.BatchNorm2d(MID), nn.ReLU(),
            nn.Conv2d(MID, MID, 3, 1, 1, bias=False), nn.BatchNorm2d(MID), nn.ReLU(),
            nn.Conv2d(MID, depth_bins, 1),
        )

    def forward(self, img_feats, cam_params):
        cam = self.bn(cam_params)
        x = self.reduce(img_feats)
        context = self.context_conv(self.context_se(x, self.context_mlp(cam)[..., None, None]))
        depth = self.depth_conv(self.depth_se(x, self.depth_mlp(cam)[..., None, None]))
        return depth, context


class BEVDepthDetector(nn.Module):
    """Image features [cams, 512, h, w], camera parameters [cams, 27] and the frustum's
    geom_xyz to boxes [M, 9]: DepthNet, the LSS outer product, voxel pooling (``pool``), the
    BEV encoder (BEVDepth's ResNet-18 stages at strides 1, 2, 2 and channels 160, 320, 640,
    one 3 x 3 convolution each here, and SECONDFPN to 4 x 64) and CenterHead at 0.8 m cells
    (networks/centerhead.py)."""

    def __init__(self, depth_bins, pool):
        super().__init__()
        self.depth_bins, self.pool = depth_bins, pool
        self.depth_net = DepthNet(depth_bins)
        self.stages = nn.ModuleList(
            nn.Sequential(*conv_bn(cin, cout, stride=s)) for cin, cout, s in ((CHANNELS, 160, 1), (160, 320, 2), (320, 640, 2))
        )
        self.fpn = nn.ModuleList(
            nn.Sequential(nn.ConvTranspose2d(c, 64, s, s, bias=False), nn.BatchNorm2d(64, eps=BN_EPS, momentum=0.01), nn.ReLU())
            for c, s in ((CHANNELS, 1), (160, 1), (320, 2), (640, 4))
        )
        self.head = CenterHead(256, (0.8, 0.8), (-51.2, -51.2))

    def forward(self, img_feats, cam_params, geom_xyz):
        depth, context = self.depth_net(img_feats, cam_params)
        # [cams, D, h, w, C] directly, as LSSViewTransform does.
        feats = depth.softmax(dim=1).unsqueeze(-1) * context.permute(0, 2, 3, 1).unsqueeze(1)
        x = self.pool(geom_xyz, feats.reshape(1, -1, CHANNELS)).permute(0, 3, 1, 2)
        ups = [self.fpn[0](x)]
        for stage, up in zip(self.stages, self.fpn[1:]):
            x = stage(x)
            ups.append(up(x))
        return self.head(torch.cat(ups, 1))


def ours_pool(geom_xyz, feats):
    return mlu_torch.voxel_pooling(geom_xyz, feats, BEV)[0]


def peer_pool(geom_xyz, feats):
    """BEVDepth's voxel pooling as torch's index_add: each point with all three coordinates
    inside the grid adds its features to its (y, x) cell."""
    nx, ny, nz = BEV
    g = geom_xyz[0].long()
    keep = (g >= 0).all(dim=1) & (g[:, 0] < nx) & (g[:, 1] < ny) & (g[:, 2] < nz)
    cell = g[keep, 1] * nx + g[keep, 0]
    bev = feats.new_zeros(ny * nx, feats.shape[2]).index_add_(0, cell, feats[0, keep])
    return bev.view(1, ny, nx, -1)


def case(scale: str, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    h, w, step = (16, 44, 0.5) if scale == "full" else (8, 22, 1.0)
    depths = np.arange(2.0, 58.0, step)
    geom = geometry(6, h, w, depths)
    img = rng.standard_normal((6, 512, h, w)).astype(np.float32)
    torch.manual_seed(seed)
    net = seed_batchnorms(LSSViewTransform(len(depths), ours_pool), seed)
    peer_net = copy.deepcopy(net)
    peer_net.pool = peer_pool
    model = export(net, (tensor(img), tensor(geom)), ["img_feats", "geom_xyz"], ["bev", "heatmap"])

    def peer(threads: int):
        with torch.no_grad():
            bev, heat = peer_net(tensor(img), tensor(geom))
        return {"bev": numpy_out(bev), "heatmap": numpy_out(heat)}

    cams = camera_params(6)
    torch.manual_seed(seed)
    detector = seed_batchnorms(BEVDepthDetector(len(depths), ours_pool), seed)
    with torch.no_grad():  # the camera BatchNorm's statistics on the scale of its inputs
        detector.depth_net.bn.running_mean.copy_(torch.from_numpy(cams.mean(0)))
        detector.depth_net.bn.running_var.copy_(torch.from_numpy(cams.var(0) + 1.0))
    peer_detector = copy.deepcopy(detector)
    peer_detector.pool = peer_pool
    det_model = export(detector, (tensor(img), tensor(cams), tensor(geom)), ["img_feats", "cam_params", "geom_xyz"],
                       ["detections"])

    def peer_detections(threads: int):
        with torch.no_grad():
            return {"detections": numpy_out(peer_detector(tensor(img), tensor(cams), tensor(geom)))}

    inside = int(((geom[0] >= 0).all(1) & (geom[0] < BEV).all(1)).sum())
    return Case(
        "bevdepth",
        f"6 cams {h}x{w}, {len(depths)} depth bins, {geom.shape[1]} points ({inside} in the 128x128 BEV)",
        [
            Graph("forward", model, {"img_feats": img, "geom_xyz": geom}, peer, "torch (index_add voxel pooling)"),
            Graph("detections", det_model, {"img_feats": img, "cam_params": cams, "geom_xyz": geom}, peer_detections,
                  "torch (the same modules, index_add voxel pooling)",
                  tolerances={"detections": {**DETECTIONS, **CUTS}}),
        ],
    )
