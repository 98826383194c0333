"""The export path of DynamicScatter (PointPillars), ThreeInterpolate (PointNet++), PsRoiPool
(the R-FCN head) and the backward operators as graph nodes, as test_export.py (whose
docstring says how) does VoxelPoolingForward and the sparse convolution."""

from __future__ import annotations

import io
import math

import numpy as np
import onnx
import pytest
import torch
from conftest import assert_accumulating
from export_harness import (  # noqa: F401 (lib: a fixture)
    EXACT_GRAD,
    EXPORTER_WARNINGS,
    assert_outputs,
    attrs,
    cpu_session,
    dims,
    eager,
    export,
    feeds_of,
    graph_output,
    lib,
    mluops_nodes,
    mt,
    producer,
)
from reference import dsb_reference, prp_reference, tib_reference
from torch import nn

pytestmark = EXPORTER_WARNINGS


# ----------------------------------------------------------------------------- (c) PointPillars dynamic voxelisation
class DynamicVoxelEncoder(nn.Module):
    """mmdet3d-style dynamic voxel feature encoder: points are quantised to (z, y, x)
    voxels (outside the range: dropped), encoded by a linear layer, averaged per voxel
    (DynamicScatter mean), the voxel mean is gathered back to its points
    (point2voxel_map) and concatenated, and a second layer's output is max-pooled per
    voxel (DynamicScatter max)."""

    def __init__(self, c=12):
        super().__init__()
        self.register_buffer("lower", torch.tensor([0.0, -8.0, -2.0]))
        self.register_buffer("voxel_size", torch.tensor([1.0, 1.0, 4.0]))
        self.register_buffer("grid", torch.tensor([16, 16, 1], dtype=torch.int32))
        self.pfn1 = nn.Linear(4, c)
        self.pfn2 = nn.Linear(2 * c, c)

    def forward(self, points):
        xyz = ((points[:, :3] - self.lower) / self.voxel_size).floor().to(torch.int32)
        inside = ((xyz >= 0) & (xyz < self.grid)).all(dim=1, keepdim=True)
        coors = torch.where(inside, xyz.flip(1), torch.full_like(xyz, -1))  # (z, y, x)
        feats = torch.relu(self.pfn1(points))
        mean, _, p2v, _, _ = mt.dynamic_scatter(feats, coors, "mean")
        decorated = torch.cat([feats, mean[p2v.clamp(min=0)]], dim=1)
        feats2 = torch.relu(self.pfn2(decorated))
        return mt.dynamic_scatter(feats2, coors, "max")


DS_OUTPUTS = ["voxel_feats", "voxel_coors", "point2voxel_map", "voxel_points_count", "voxel_num"]


def pillar_points(n: int, seed: int) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pts = torch.rand(n, 4, generator=g) * torch.tensor([18.0, 18.0, 5.0, 1.0]) - torch.tensor([1.0, 9.0, 2.5, 0.0])
    return (pts,)


@pytest.fixture(scope="module")
def pillar_model():
    torch.manual_seed(6)
    model = DynamicVoxelEncoder().eval()
    return model, export(model, pillar_points(500, 60), ["points"], DS_OUTPUTS, {"points": {0: "points"}})


def test_dynamic_voxel_encoder_exports_two_dynamic_scatters_with_symbolic_voxel_counts(pillar_model):
    _, proto = pillar_model
    mean, mx = mluops_nodes(proto)
    assert (mean.op_type, attrs(mean)) == ("DynamicScatter", {"reduce_type": b"mean"})
    assert (mx.op_type, attrs(mx)) == ("DynamicScatter", {"reduce_type": b"max"})
    assert len(mean.output) == len(mx.output) == 5
    assert list(mx.output) == DS_OUTPUTS
    types = {name: graph_output(proto, name) for name in DS_OUTPUTS}
    assert [types[n].elem_type for n in DS_OUTPUTS] == [onnx.TensorProto.FLOAT] + [onnx.TensorProto.INT32] * 4
    # The ranks are the schema's and the voxel count M is symbolic. The exporter keeps the
    # types a symbolic sets only when every output has a static dimension (torch's
    # CustomSettype), and voxel_points_count [M] has none, so C, D, N and the 1 of
    # voxel_num come out symbolic as well.
    shapes = [dims(types[n]) for n in DS_OUTPUTS]
    assert [len(s) for s in shapes] == [2, 2, 1, 1, 1]
    assert all(isinstance(shapes[i][0], str) for i in (0, 1, 3))


@pytest.mark.parametrize("n, seed", [(500, 60), (77, 61), (1500, 62), (0, 63)])
def test_dynamic_voxel_encoder_on_cpu_matches_eager_torch(pillar_model, lib, n, seed):
    model, proto = pillar_model
    args = pillar_points(n, seed)
    want = eager(model, args)
    got = cpu_session(proto, lib).run(None, {"points": args[0].numpy()})
    assert_outputs(got, want, DS_OUTPUTS)
    if n:
        assert want[4][0] > 10 and (want[2] == -1).any()


def naive_dynamic_scatter(feats, coors, mode):
    """Loop reference of the DynamicScatter contract (float64 sums)."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(coors.tolist()):
        if min(row) >= 0:
            groups.setdefault(tuple(row), []).append(i)
    keys = sorted(groups)
    vf = np.zeros((len(keys), feats.shape[1]))
    p2v = np.full(len(coors), -1, np.int32)
    for v, key in enumerate(keys):
        rows = feats[groups[key]].astype(np.float64)
        p2v[groups[key]] = v
        if mode == "max":
            vf[v] = np.where(np.isnan(rows), -np.inf, rows).max(axis=0)
        else:
            vf[v] = rows.sum(axis=0) / (len(rows) if mode == "mean" else 1)
    counts = np.array([len(groups[k]) for k in keys], np.int32)
    return vf, np.array(keys, np.int32).reshape(-1, coors.shape[1]), p2v, counts, np.array([len(keys)], np.int32)


@pytest.mark.parametrize("mode", ["max", "mean", "sum"])
def test_eager_dynamic_scatter_and_its_gradient_match_the_references(mode):
    rng = np.random.default_rng({"max": 1, "mean": 2, "sum": 3}[mode])
    n, c = 400, 6
    coors = rng.integers(-1, 4, (n, 4)).astype(np.int32)
    coors[:, 0] = rng.integers(0, 2, n)
    feats = (rng.integers(-4, 5, (n, c)) / 2).astype(np.float32)  # many ties (max: lowest index wins)
    feats[rng.random((n, c)) < 0.05] = np.nan
    coors[(coors == [1, 3, 3, 3]).all(axis=1)] = [0, 0, 0, 0]
    coors[:3] = [1, 3, 3, 3]  # voxel (1, 3, 3, 3) holds only these three all-NaN points
    feats[:3] = np.nan  # (-inf under max)
    ft = torch.from_numpy(feats).requires_grad_()
    got = mt.dynamic_scatter(ft, torch.from_numpy(coors), mode)
    want = naive_dynamic_scatter(feats, coors, mode)
    for name, a, b in zip(DS_OUTPUTS, got, want):
        if name == "voxel_feats":
            finite = np.isfinite(b)
            np.testing.assert_array_equal(np.isfinite(a.detach().numpy()), finite, err_msg=name)
            if mode == "max":
                np.testing.assert_array_equal(a.detach().numpy(), b.astype(np.float32), err_msg=name)
            else:
                assert_accumulating(a.detach().numpy()[finite], b[finite], name)
        else:
            np.testing.assert_array_equal(a.numpy(), b, err_msg=name)
    if mode == "max":
        assert np.isneginf(got[0].detach().numpy()).any()
    vf, _, p2v, cnt, _ = got
    gvf = torch.from_numpy(rng.standard_normal(vf.shape).astype(np.float32))
    (grad,) = torch.autograd.grad(vf, ft, gvf)
    expect = dsb_reference(gvf.numpy(), feats, vf.detach().numpy(), p2v.numpy(), cnt.numpy(), mode)
    np.testing.assert_array_equal(grad.numpy(), expect)


# ----------------------------------------------------------------------------- (d) PointNet++ feature propagation
class FeaturePropagation(nn.Module):
    """PointNet++ FP layer: the three nearest known points of every unknown point (squared
    distances, top-3), inverse-distance weights, three_interpolate, concatenation with the
    skip features and a shared MLP (1x1 Conv1d)."""

    def __init__(self, c_known=8, c_skip=4, c_out=16):
        super().__init__()
        self.mlp = nn.Conv1d(c_known + c_skip, c_out, 1)

    def forward(self, unknown_xyz, known_xyz, known_feats, skip_feats):
        diff = unknown_xyz.unsqueeze(2) - known_xyz.unsqueeze(1)  # [B, N, M, 3]
        dist2 = (diff * diff).sum(dim=-1)
        dist, idx = torch.topk(dist2, 3, dim=2, largest=False)
        recip = 1.0 / (dist + 1e-8)
        weight = recip / recip.sum(dim=2, keepdim=True)
        interp = mt.three_interpolate(known_feats, idx.to(torch.int32), weight)
        return torch.relu(self.mlp(torch.cat([interp, skip_feats], dim=1))), interp


FP_INPUTS = ["unknown_xyz", "known_xyz", "known_feats", "skip_feats"]


def fp_args(b: int, n: int, m: int, seed: int):
    """Coordinates on a 1/8 grid: squared distances are exact in float32 in torch and in
    onnxruntime alike, and redrawn until the four nearest are distinct (no top-3 ties)."""
    rng = np.random.default_rng(seed)
    for _ in range(100):
        unknown = rng.integers(0, 64, (b, n, 3)) / 8
        known = rng.integers(0, 64, (b, m, 3)) / 8
        d2 = ((unknown[:, :, None] - known[:, None]) ** 2).sum(-1)
        near = np.sort(d2, axis=2)[..., :4]
        if (np.diff(near, axis=2) > 0).all():
            break
    else:
        raise AssertionError("no tie-free draw")
    return (
        torch.from_numpy(unknown.astype(np.float32)),
        torch.from_numpy(known.astype(np.float32)),
        torch.from_numpy(rng.standard_normal((b, 8, m)).astype(np.float32)),
        torch.from_numpy(rng.standard_normal((b, 4, n)).astype(np.float32)),
    )


def test_pointnet2_feature_propagation_exports_and_matches_eager(lib):
    torch.manual_seed(7)
    model = FeaturePropagation().eval()
    proto = export(
        model,
        fp_args(2, 40, 12, 70),
        FP_INPUTS,
        ["fp_out", "interp"],
        {"unknown_xyz": {1: "n"}, "skip_feats": {2: "n"}, "known_xyz": {1: "m"}, "known_feats": {2: "m"}},
    )
    (ti,) = mluops_nodes(proto)
    assert ti.op_type == "ThreeInterpolate" and attrs(ti) == {}
    assert producer(proto, ti.input[1])[0].op_type == "Cast"  # top-k's int64 indices -> int32
    interp = graph_output(proto, "interp")
    assert dims(interp)[:2] == [2, 8] and isinstance(dims(interp)[2], str)  # N is dynamic
    for args in [fp_args(2, 40, 12, 70), fp_args(2, 100, 30, 71)]:
        want = eager(model, args)
        got = cpu_session(proto, lib).run(None, feeds_of(FP_INPUTS, args))
        assert_outputs(got, want, ["fp_out", "interp"])


class HalfInterpolate(nn.Module):
    def forward(self, features, indices, weights):
        return mt.three_interpolate(features, indices, weights)


def test_three_interpolate_float16_exports_and_matches_eager(lib):
    rng = np.random.default_rng(8)
    args = (
        torch.from_numpy(rng.standard_normal((2, 5, 20)).astype(np.float16)),
        torch.from_numpy(rng.integers(0, 20, (2, 33, 3)).astype(np.int32)),
        torch.from_numpy(rng.random((2, 33, 3)).astype(np.float16)),
    )
    names = ["features", "indices", "weights"]
    proto = export(HalfInterpolate(), args, names, ["out"])
    assert graph_output(proto, "out").elem_type == onnx.TensorProto.FLOAT16
    got = cpu_session(proto, lib).run(None, feeds_of(names, args))
    assert_outputs(got, eager(HalfInterpolate(), args), ["out"])


def test_eager_three_interpolate_and_its_gradients_match_the_references():
    rng = np.random.default_rng(9)
    b, c, m, n = 2, 4, 15, 25
    feats = rng.standard_normal((b, c, m))
    idx = rng.integers(0, m, (b, n, 3)).astype(np.int32)
    w = rng.random((b, n, 3))
    out = mt.three_interpolate(torch.from_numpy(feats).float(), torch.from_numpy(idx), torch.from_numpy(w).float())
    gathered = np.stack([feats[i][:, idx[i]] for i in range(b)])  # [B, C, N, 3]
    want = np.einsum("bcnk,bnk->bcn", gathered, w)
    assert_accumulating(out.numpy(), want, "three_interpolate")
    f64, w64 = torch.from_numpy(feats).requires_grad_(), torch.from_numpy(w).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda f, ww: mt.three_interpolate(f, torch.from_numpy(idx), ww), (f64, w64), **EXACT_GRAD
    )
    go = rng.standard_normal((b, c, n)).astype(np.float32)
    grad = mt.three_interpolate_backward(torch.from_numpy(go), torch.from_numpy(idx), torch.from_numpy(w).float(), m)
    assert_accumulating(grad.numpy(), tib_reference(go, idx, w.astype(np.float32), m), "three_interpolate_backward")


# ----------------------------------------------------------------------------- (e) R-FCN position-sensitive head
class RFCNHead(nn.Module):
    """R-FCN head: a 1x1 convolution makes k*k*classes position-sensitive score maps, NHWC
    for PsRoiPool, and each roi's class scores are the mean over its k x k bins (vote)."""

    def __init__(self, c_in=16, k=3, classes=4, scale=0.25):
        super().__init__()
        self.k, self.classes, self.scale = k, classes, scale
        self.score = nn.Conv2d(c_in, k * k * classes, 1)

    def forward(self, feature_map, rois):
        maps = self.score(feature_map).permute(0, 2, 3, 1)
        pooled, mapping = mt.psroi_pool(maps, rois, self.k, self.k, self.scale, self.classes)
        return pooled.mean(dim=(1, 2)), pooled, mapping


def rfcn_rois(r: int, seed: int, batches=2, h=12, w=14, scale=0.25) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    rois = np.zeros((r, 5), np.float32)
    for k in range(r):
        x1, y1 = np.round(rng.uniform(-4, w / scale) * 2) / 2, np.round(rng.uniform(-4, h / scale) * 2) / 2
        rois[k] = [
            rng.integers(0, batches) + rng.choice([0.0, 0.5]),
            x1,
            y1,
            x1 + np.round(rng.uniform(-2, w / scale) * 2) / 2,
            y1 + np.round(rng.uniform(-2, h / scale) * 2) / 2,
        ]
    if r >= 3:
        rois[1, 3] = np.inf  # a non-finite roi pools zeros
        rois[2, 1:] = [w / scale + 8, h / scale + 8, w / scale + 20, h / scale + 20]  # outside the map: empty bins
    return torch.from_numpy(rois)


def rfcn_args(r: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 16, 12, 14, generator=g), rfcn_rois(r, seed)


RFCN_OUTPUTS = ["scores", "pooled", "mapping_channel"]


def test_rfcn_head_exports_psroi_pool_with_typed_attributes_and_matches_eager(lib):
    torch.manual_seed(9)
    model = RFCNHead().eval()
    buf = io.BytesIO()
    # the package's export helper (TorchScript exporter, opset 17, mluops opset 1)
    mt.export(
        model,
        rfcn_args(20, 90),
        buf,
        input_names=["feature_map", "rois"],
        output_names=RFCN_OUTPUTS,
        dynamic_axes={"rois": {0: "r"}},
    )
    proto = onnx.load_from_string(buf.getvalue())
    (pool,) = mluops_nodes(proto)
    assert pool.op_type == "PsRoiPool"
    types = {a.name: a.type for a in pool.attribute}
    assert types == {
        "pooled_height": onnx.AttributeProto.INT,
        "pooled_width": onnx.AttributeProto.INT,
        "spatial_scale": onnx.AttributeProto.FLOAT,
        "output_dim": onnx.AttributeProto.INT,
    }
    assert attrs(pool) == {"pooled_height": 3, "pooled_width": 3, "spatial_scale": 0.25, "output_dim": 4}
    assert producer(proto, pool.input[0])[0].op_type == "Transpose"
    mapping = graph_output(proto, "mapping_channel")
    assert mapping.elem_type == onnx.TensorProto.INT32
    assert isinstance(dims(mapping)[0], str) and dims(mapping)[1:] == [3, 3, 4]  # R is dynamic
    for r, seed in [(20, 90), (7, 91), (0, 92)]:
        args = rfcn_args(r, seed)
        want = eager(model, args)
        got = cpu_session(proto, lib).run(None, feeds_of(["feature_map", "rois"], args))
        assert_outputs(got, want, RFCN_OUTPUTS)
        if r:
            assert np.abs(want[1]).sum() > 0 and not want[1][1].any() and not want[1][2].any()


def naive_psroi_pool(maps, rois, ph, scale, od):
    """Loop reference of the PsRoiPool contract, bins by the same float32 rules as
    reference.prp_reference."""
    _, h, w, _ = maps.shape
    out = np.zeros((len(rois), ph, ph, od))
    f32 = np.float32

    def rnd(v):
        return f32(math.copysign(math.floor(abs(float(v)) + 0.5), float(v)))

    for r, roi in enumerate(rois):
        if not np.isfinite(roi).all():
            continue
        b = int(np.trunc(roi[0]))
        sw, sh = rnd(roi[1]) * f32(scale), rnd(roi[2]) * f32(scale)
        ew, eh = (rnd(roi[3]) + f32(1)) * f32(scale), (rnd(roi[4]) + f32(1)) * f32(scale)
        bw, bh = max(ew - sw, f32(0.1)) / f32(ph), max(eh - sh, f32(0.1)) / f32(ph)
        for i in range(ph):
            hs = int(min(max(np.floor(f32(i) * bh + sh), 0), h))
            he = int(min(max(np.ceil(f32(i + 1) * bh + sh), 0), h))
            for j in range(ph):
                ws = int(min(max(np.floor(f32(j) * bw + sw), 0), w))
                we = int(min(max(np.ceil(f32(j + 1) * bw + sw), 0), w))
                if he > hs and we > ws:
                    for o in range(od):
                        c = (o * ph + i) * ph + j
                        out[r, i, j, o] = maps[b, hs:he, ws:we, c].astype(np.float64).sum() / ((he - hs) * (we - ws))
    return out


def test_eager_psroi_pool_and_its_gradient_match_the_references():
    rng = np.random.default_rng(10)
    ph, od, scale = 3, 2, 0.5
    maps = rng.standard_normal((2, 9, 11, ph * ph * od)).astype(np.float32)
    rois = rfcn_rois(30, 11, batches=2, h=9, w=11, scale=scale).numpy()
    rois[5] = [1.0, 4.5, -3.5, 6.5, 2.5]  # half-way coordinates round away from zero
    mt_in = torch.from_numpy(maps).requires_grad_()
    pooled, mapping = mt.psroi_pool(mt_in, torch.from_numpy(rois), ph, ph, scale, od)
    assert_accumulating(pooled.detach().numpy(), naive_psroi_pool(maps, rois, ph, scale, od), "psroi_pool")
    expect_mapping = (np.arange(od)[None, None, :] * ph + np.arange(ph)[:, None, None]) * ph + np.arange(ph)[
        None, :, None
    ]
    np.testing.assert_array_equal(mapping.numpy(), np.broadcast_to(expect_mapping, mapping.shape))
    top = rng.standard_normal(pooled.shape).astype(np.float32)
    (grad,) = torch.autograd.grad(pooled, mt_in, torch.from_numpy(top))
    want = prp_reference(top, rois, mapping.numpy(), maps.shape, ph, ph, scale, od)
    assert_accumulating(grad.numpy(), want, "psroi_pool gradient")
    with pytest.raises(ValueError, match="batch_id"):
        mt.psroi_pool(torch.from_numpy(maps), torch.tensor([[2.0, 0, 0, 4, 4]]), ph, ph, scale, od)


# ----------------------------------------------------------------------------- (f) the backward operators as graph nodes
class ExplicitGradients(nn.Module):
    """A graph of the three backward operators, fed by their forward partners, so the
    library's backward kernels can be compared with the package's autograd backward."""

    def forward(self, tf, tidx, tw, grad_interp, feats, coors, grad_voxels, maps, rois, grad_pooled):
        interp = mt.three_interpolate(tf, tidx, tw)
        g_tf = mt.three_interpolate_backward(grad_interp, tidx, tw, 16)
        vf, _, p2v, cnt, vn = mt.dynamic_scatter(feats, coors, "max")
        g_feats = mt.dynamic_scatter_backward(grad_voxels[: vf.shape[0]], feats, vf, p2v, cnt, vn, "max")
        pooled, mapping = mt.psroi_pool(maps, rois, 3, 3, 1.0, 2)
        g_maps = mt.psroi_pool_backward(grad_pooled, rois, mapping, torch._shape_as_tensor(maps), 3, 3, 1.0, 2)
        return interp, g_tf, vf, g_feats, pooled, g_maps


GRAD_INPUTS = ["tf", "tidx", "tw", "grad_interp", "feats", "coors", "grad_voxels", "maps", "rois", "grad_pooled"]
GRAD_OUTPUTS = ["interp", "g_tf", "vf", "g_feats", "pooled", "g_maps"]


def grad_args(seed: int):
    rng = np.random.default_rng(seed)
    n = 120
    coors = rng.integers(-1, 4, (n, 3)).astype(np.int32)
    feats = (rng.integers(-3, 4, (n, 5)) / 2).astype(np.float32)
    arrays = [
        rng.standard_normal((2, 6, 16)).astype(np.float32),
        rng.integers(0, 16, (2, 30, 3)).astype(np.int32),
        rng.random((2, 30, 3)).astype(np.float32),
        rng.standard_normal((2, 6, 30)).astype(np.float32),
        feats,
        coors,
        rng.standard_normal((n, 5)).astype(np.float32),
        rng.standard_normal((2, 8, 9, 18)).astype(np.float32),
        np.array([[0, 0, 0, 5, 6], [1, 2, 1, 7, 7], [0, 3, 3, 3, 3], [1, -2, 4.5, 20, 5]], np.float32),
        rng.standard_normal((4, 3, 3, 2)).astype(np.float32),
    ]
    return tuple(torch.from_numpy(a) for a in arrays)


def test_backward_operators_export_and_equal_the_packages_autograd_gradients(lib):
    proto = export(
        ExplicitGradients(),
        grad_args(100),
        GRAD_INPUTS,
        GRAD_OUTPUTS,
        {"feats": {0: "n"}, "coors": {0: "n"}, "grad_voxels": {0: "n"}, "maps": {1: "h", 2: "w"}},
    )
    assert [n.op_type for n in mluops_nodes(proto)] == [
        "ThreeInterpolate",
        "ThreeInterpolateBackward",
        "DynamicScatter",
        "DynamicScatterBackward",
        "PsRoiPool",
        "PsRoiPoolBackward",
    ]
    tib, dsb, prb = (
        mluops_nodes(proto, op)[0] for op in ["ThreeInterpolateBackward", "DynamicScatterBackward", "PsRoiPoolBackward"]
    )
    assert attrs(tib) == {"m": 16} and attrs(dsb) == {"reduce_type": b"max"} and len(dsb.input) == 6
    assert attrs(prb) == {"pooled_height": 3, "pooled_width": 3, "spatial_scale": 1.0, "output_dim": 2}
    assert producer(proto, prb.input[3])[0].op_type == "Shape"
    args = grad_args(101)
    got = dict(zip(GRAD_OUTPUTS, cpu_session(proto, lib).run(None, feeds_of(GRAD_INPUTS, args))))
    assert_outputs(list(got.values()), eager(ExplicitGradients(), args), GRAD_OUTPUTS)
    # the library's backward kernels against the package's autograd backward
    tf, tidx, tw, g_interp, feats, coors, g_vox, maps, rois, g_pooled = args
    tf, feats, maps = (t.clone().requires_grad_() for t in (tf, feats, maps))
    (auto_tf,) = torch.autograd.grad(mt.three_interpolate(tf, tidx, tw), tf, g_interp)
    vf = mt.dynamic_scatter(feats, coors, "max")[0]
    (auto_feats,) = torch.autograd.grad(vf, feats, g_vox[: vf.shape[0]])
    (auto_maps,) = torch.autograd.grad(mt.psroi_pool(maps, rois, 3, 3, 1.0, 2)[0], maps, g_pooled)
    assert_accumulating(got["g_tf"], auto_tf.numpy().astype(np.float64), "ThreeInterpolateBackward")
    np.testing.assert_array_equal(got["g_feats"], auto_feats.numpy())
    assert_accumulating(got["g_maps"], auto_maps.numpy().astype(np.float64), "PsRoiPoolBackward")
    assert np.abs(got["g_feats"]).sum() > 0 and np.abs(got["g_maps"]).sum() > 0
