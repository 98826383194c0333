"""The Python export path: PyTorch modules built on ``onnxruntime_ep_mlu.torch`` exported
with the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, which calls the
autograd Functions' ``symbolic``), checked node by node, run under onnxruntime 1.31.1 with
the library under test, and compared with the modules' eager torch output (index outputs
exactly, float outputs in the contract's accumulating class).

The eager torch implementations are themselves checked against the independent numpy
references of reference.py (and, for the forward partners, small loop references below),
so a shared mistake of the package and the library cannot pass unseen.

The library is ``onnxruntime_ep_mlu.get_library_path()``: MLU_EP_LIB when set, else the
repository's target/release then target/debug build. torch is a hard requirement of this
file (scripts/requirements-torch.txt).

This file: VoxelPoolingForward (BEVDepth), the sparse convolution (CenterPoint) and the
package itself; test_export_ops.py: the other operators; export_harness.py: the harness."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import assert_accumulating
from export_harness import (  # noqa: F401 (lib, package_devices: fixtures)
    CPU,
    EP,
    EXACT_GRAD,
    EXPORTER_WARNINGS,
    REPO,
    assert_outputs,
    attrs,
    cpu_session,
    dims,
    eager,
    export,
    feeds_of,
    graph_output,
    lib,
    mlu,
    mlu_session,
    mluops_nodes,
    mt,
    node_placement,
    package_devices,
    producer,
)
from reference import gip_reference, gip_sites, vpf_reference
from torch import nn

pytestmark = EXPORTER_WARNINGS


# ----------------------------------------------------------------------------- (a) BEVDepth voxel pooling
class BEVDepthPooling(nn.Module):
    """BEVDepth's lift-splat core: per camera a depth distribution (softmax over depth
    bins) times a context vector gives one feature per frustum point; the points' ego
    coordinates are quantised to voxels; voxel pooling sums them into the BEV grid, which
    goes NCHW into a convolution."""

    def __init__(
        self,
        c_img=12,
        depth_bins=6,
        c_ctx=10,
        c_bev=8,
        grid=(16, 12, 1),
        lower=(-8.0, -6.0, -2.0),
        voxel_size=(1.0, 1.0, 4.0),
    ):
        super().__init__()
        self.depth_bins, self.c_ctx, self.grid = depth_bins, c_ctx, grid
        self.depth_net = nn.Conv2d(c_img, depth_bins + c_ctx, 1)
        self.bev_conv = nn.Conv2d(c_ctx, c_bev, 3, padding=1)
        self.register_buffer("lower", torch.tensor(lower))
        self.register_buffer("voxel_size", torch.tensor(voxel_size))

    def forward(self, img_feats, points):
        # img_feats [B*cams, c_img, H, W]; points [B, cams*D*H*W, 3]: ego (x, y, z) of every
        # frustum point, in the order (camera, depth bin, row, column)
        x = self.depth_net(img_feats)
        depth = x[:, : self.depth_bins].softmax(dim=1)
        context = x[:, self.depth_bins :]
        volume = depth.unsqueeze(1) * context.unsqueeze(2)  # [B*cams, C, D, H, W]
        feats = volume.permute(0, 2, 3, 4, 1).reshape(points.shape[0], -1, self.c_ctx)
        geom_xyz = ((points - self.lower) / self.voxel_size).floor().to(torch.int32)
        bev, pos_memo = mt.voxel_pooling(geom_xyz, feats, self.grid)
        return self.bev_conv(bev.permute(0, 3, 1, 2)), pos_memo


BEV_INPUTS, BEV_OUTPUTS = ["img_feats", "points"], ["bev_feats", "pos_memo"]


def bev_args(batch: int, seed: int, cams=2, h=4, w=5):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(batch * cams, 12, h, w, generator=g)
    n = cams * 6 * h * w
    # ego coordinates reaching beyond the grid ([-8, 8) x [-6, 6) x [-2, 2)): some points fall outside
    points = torch.rand(batch, n, 3, generator=g) * torch.tensor([20.0, 15.0, 5.0]) - torch.tensor([10.0, 7.5, 2.5])
    return img, points


@pytest.fixture(scope="module")
def bev_model():
    torch.manual_seed(1)
    model = BEVDepthPooling().eval()
    args = bev_args(2, 10)
    proto = export(
        model,
        args,
        BEV_INPUTS,
        BEV_OUTPUTS,
        {"img_feats": {0: "batch_cams"}, "points": {0: "batch"}, "bev_feats": {0: "batch"}, "pos_memo": {0: "batch"}},
    )
    return model, proto


def test_bevdepth_block_exports_one_voxel_pooling_node_feeding_the_bev_conv(bev_model):
    _, proto = bev_model
    (vp,) = mluops_nodes(proto)
    assert vp.op_type == "VoxelPoolingForward"
    assert attrs(vp) == {"voxel_num": [16, 12, 1]}
    assert [producer(proto, i)[0].op_type for i in vp.input] == ["Cast", "Reshape"]
    (transpose,) = [n for n in proto.graph.node if vp.output[0] in n.input]
    assert transpose.op_type == "Transpose" and attrs(transpose)["perm"] == [0, 3, 1, 2]
    (conv,) = [n for n in proto.graph.node if transpose.output[0] in n.input]
    assert conv.op_type == "Conv"
    assert vp.output[1] == "pos_memo"
    assert {o.domain: o.version for o in proto.opset_import} == {"": 17, "mluops": 1}
    pos = graph_output(proto, "pos_memo")
    assert pos.elem_type == onnx.TensorProto.INT32
    assert dims(pos)[1:] == [2 * 6 * 4 * 5, 3] and isinstance(dims(pos)[0], str)
    assert dims(graph_output(proto, "bev_feats"))[1:] == [8, 12, 16]


@pytest.mark.parametrize("batch, seed", [(2, 10), (1, 11), (3, 12)])
def test_bevdepth_block_on_cpu_matches_eager_torch(bev_model, lib, batch, seed):
    model, proto = bev_model
    args = bev_args(batch, seed)
    sess = cpu_session(proto, lib)
    want = eager(model, args)
    got = sess.run(None, feeds_of(BEV_INPUTS, args))
    assert_outputs(got, want, BEV_OUTPUTS)
    pos = want[1]
    assert (pos[..., 0] == -1).any() and (pos[..., 0] >= 0).mean() > 0.5  # points dropped and kept
    assert set(node_placement(sess, proto, "VoxelPoolingForward")) == {CPU}


def test_bevdepth_block_on_the_emulated_mlu_runs_voxel_pooling_on_the_mlu(bev_model, package_devices):
    model, proto = bev_model
    sess = mlu_session(proto, package_devices)
    assert node_placement(sess, proto, "VoxelPoolingForward") == [EP]
    assert set(node_placement(sess, proto, "Conv")) == {CPU}
    for batch, seed in [(2, 20), (1, 21)]:
        args = bev_args(batch, seed)
        assert_outputs(sess.run(None, feeds_of(BEV_INPUTS, args)), eager(model, args), BEV_OUTPUTS)


def test_eager_voxel_pooling_matches_the_numpy_reference():
    rng = np.random.default_rng(3)
    b, n, c, nx, ny, nz = 2, 500, 7, 9, 6, 2
    geom = np.stack(
        [rng.integers(-1, nx + 1, (b, n)), rng.integers(-1, ny + 1, (b, n)), rng.integers(-1, nz + 1, (b, n))], axis=2
    ).astype(np.int32)
    feats = rng.standard_normal((b, n, c)).astype(np.float32)
    out, pos = mt.voxel_pooling(torch.from_numpy(geom), torch.from_numpy(feats), (nx, ny, nz))
    want_out, want_pos = vpf_reference(geom, feats, nx, ny, nz)
    np.testing.assert_array_equal(pos.numpy(), want_pos)
    assert_accumulating(out.numpy(), want_out, "voxel pooling")


def test_voxel_pooling_gradient_is_the_bev_gradient_at_each_points_cell():
    g = torch.Generator().manual_seed(4)
    geom = torch.randint(-1, 5, (2, 30, 3), generator=g, dtype=torch.int32)
    geom[..., 2] = torch.randint(0, 2, (2, 30), generator=g, dtype=torch.int32)
    feats = torch.randn(2, 30, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda f: mt.VoxelPoolingFunction.apply(geom, f, (4, 3, 1))[0], (feats,), **EXACT_GRAD
    )
    f32 = feats.detach().float().requires_grad_()
    bev, pos = mt.voxel_pooling(geom, f32, (4, 3, 1))
    grad_bev = torch.randn(bev.shape, generator=g)
    (grad,) = torch.autograd.grad(bev, f32, grad_bev)
    for b in range(2):
        for i in range(30):
            bb, y, x = pos[b, i].tolist()
            expect = grad_bev[bb, y, x] if bb >= 0 else torch.zeros(3)
            assert torch.equal(grad[b, i], expect)


# ----------------------------------------------------------------------------- (b) CenterPoint sparse block
SPATIAL, BATCH = (9, 20, 20), 2


class CenterPointSparseBlock(nn.Module):
    """The start of CenterPoint's sparse 3D backbone: two submanifold convolutions sharing
    one rulebook (indice_key), ReLU, then a strided sparse convolution (no bias)."""

    def __init__(self, c_in=4):
        super().__init__()
        self.subm1 = mt.SubMConv3d(c_in, 16, 3, indice_key="subm1")
        self.subm2 = mt.SubMConv3d(16, 16, 3, indice_key="subm1")
        self.down = mt.SparseConv3d(16, 24, 3, stride=2, padding=(0, 1, 1), bias=False)

    def forward(self, voxel_feats, voxel_coors):
        x = mt.SparseTensor(voxel_feats, voxel_coors, SPATIAL, BATCH)
        x = self.subm1(x)
        x = x.replace_feature(torch.relu(x.features))
        x = self.subm2(x)
        x = x.replace_feature(torch.relu(x.features))
        x = self.down(x)
        return x.features, x.indices


SPARSE_INPUTS, SPARSE_OUTPUTS = ["voxel_feats", "voxel_coors"], ["out_feats", "out_coors"]


def sparse_args(count: int, seed: int):
    rng = np.random.default_rng(seed)
    sites = gip_sites(rng, BATCH, SPATIAL, count)
    return torch.from_numpy(rng.standard_normal((len(sites), 4)).astype(np.float32)), torch.from_numpy(sites)


@pytest.fixture(scope="module")
def sparse_model():
    torch.manual_seed(2)
    model = CenterPointSparseBlock().eval()
    proto = export(
        model,
        sparse_args(300, 30),
        SPARSE_INPUTS,
        SPARSE_OUTPUTS,
        {"voxel_feats": {0: "sites"}, "voxel_coors": {0: "sites"}},
    )
    return model, proto


def test_centerpoint_block_exports_rulebooks_and_convolutions_wired_per_the_schemas(sparse_model):
    _, proto = sparse_model
    assert [n.op_type for n in mluops_nodes(proto)] == [
        "GetIndicePairs",
        "IndiceConv",
        "IndiceConv",
        "GetIndicePairs",
        "IndiceConv",
    ]
    subm_rules, down_rules = mluops_nodes(proto, "GetIndicePairs")
    common = {
        "batch_size": BATCH,
        "spatial_shape": list(SPATIAL),
        "kernel_size": [3, 3, 3],
        "dilation": [1, 1, 1],
        "output_padding": [0, 0, 0],
        "transpose": 0,
    }
    assert attrs(subm_rules) == {**common, "stride": [1, 1, 1], "padding": [1, 1, 1], "subm": 1}
    assert attrs(down_rules) == {**common, "stride": [2, 2, 2], "padding": [0, 1, 1], "subm": 0}
    assert list(subm_rules.input) == ["voxel_coors"]
    # the strided rulebook is built over the submanifold output sites
    assert list(down_rules.input) == [subm_rules.output[1]]
    conv1, conv2, conv3 = mluops_nodes(proto, "IndiceConv")
    for conv, rules, bias in [(conv1, subm_rules, True), (conv2, subm_rules, True), (conv3, down_rules, False)]:
        assert attrs(conv) == {"inverse": 0}
        assert list(conv.input[2:5]) == [rules.output[0], rules.output[2], rules.output[1]]
        assert len(conv.input) == (6 if bias else 5)
    init = {t.name: list(t.dims) for t in proto.graph.initializer}
    assert init[conv1.input[1]] == [27, 4, 16] and init[conv3.input[1]] == [27, 16, 24]
    assert producer(proto, conv2.input[0])[0].op_type == "Relu"
    # data-dependent output dimensions are symbolic in the graph
    coors, feats = graph_output(proto, "out_coors"), graph_output(proto, "out_feats")
    assert coors.elem_type == onnx.TensorProto.INT32 and feats.elem_type == onnx.TensorProto.FLOAT
    assert isinstance(dims(coors)[0], str) and dims(coors)[1] == 4
    assert isinstance(dims(feats)[0], str) and dims(feats)[1] == 24


class UnkeyedBasicBlock(nn.Module):
    """mmdet3d's SparseBasicBlock: two submanifold convolutions without an indice_key over
    the same sites, then one with another kernel size (another rulebook), and a strided
    one over the same sites (another geometry)."""

    def __init__(self):
        super().__init__()
        self.conv1 = mt.SubMConv3d(4, 8, 3, bias=False)
        self.conv2 = mt.SubMConv3d(8, 8, 3, bias=False)
        self.conv3 = mt.SubMConv3d(8, 8, 1, bias=False)
        self.down = mt.SparseConv3d(8, 8, 3, stride=2, padding=1, bias=False)

    def forward(self, voxel_feats, voxel_coors):
        x = mt.SparseTensor(voxel_feats, voxel_coors, SPATIAL, BATCH)
        x = self.conv1(x)
        y = self.conv2(x.replace_feature(torch.relu(x.features)))
        y = self.conv3(y.replace_feature(y.features + x.features))
        return self.down(y).features


def test_convolutions_without_indice_key_share_the_rulebook_of_the_same_sites_and_geometry(lib):
    torch.manual_seed(3)
    model = UnkeyedBasicBlock().eval()
    args = sparse_args(300, 34)
    proto = export(model, args, SPARSE_INPUTS, ["out"], {"voxel_feats": {0: "sites"}, "voxel_coors": {0: "sites"}})
    rules = mluops_nodes(proto, "GetIndicePairs")
    # conv1 and conv2: one rulebook; conv3 (1x1x1) and down (strided) build their own
    assert [attrs(r)["kernel_size"] for r in rules] == [[3, 3, 3], [1, 1, 1], [3, 3, 3]]
    assert [attrs(r)["subm"] for r in rules] == [1, 1, 0]
    conv1, conv2, _, _ = mluops_nodes(proto, "IndiceConv")
    assert conv1.input[2:5] == conv2.input[2:5] == rules[0].output[:1] + rules[0].output[2:3] + rules[0].output[1:2]
    want = eager(model, args)
    got = cpu_session(proto, lib).run(None, feeds_of(SPARSE_INPUTS, args))
    assert_outputs(got, want, ["out"])


@pytest.mark.parametrize("count, seed", [(300, 30), (57, 31), (900, 32), (0, 33)])
def test_centerpoint_block_on_cpu_matches_eager_torch(sparse_model, lib, count, seed):
    model, proto = sparse_model
    args = sparse_args(count, seed)
    want = eager(model, args)
    got = cpu_session(proto, lib).run(None, feeds_of(SPARSE_INPUTS, args))
    assert_outputs(got, want, SPARSE_OUTPUTS)
    if count:
        assert len(want[1]) > 0 and np.abs(want[0]).sum() > 0


def test_centerpoint_block_on_the_emulated_mlu_runs_the_rulebooks_on_the_mlu(sparse_model, package_devices):
    model, proto = sparse_model
    sess = mlu_session(proto, package_devices)
    assert node_placement(sess, proto, "GetIndicePairs") == [EP, EP]
    assert set(node_placement(sess, proto, "IndiceConv")) == {CPU}  # no MLU kernel: declined
    args = sparse_args(400, 34)
    assert_outputs(sess.run(None, feeds_of(SPARSE_INPUTS, args)), eager(model, args), SPARSE_OUTPUTS)


@pytest.mark.parametrize(
    "subm, transpose, ksize, stride, padding, dilation, out_pad",
    [
        (1, 0, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0)),
        (1, 0, (3, 1, 3), (1, 1, 1), (2, 0, 2), (2, 1, 2), (0, 0, 0)),
        (0, 0, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (0, 0, 0)),
        (0, 0, (2, 3, 1), (1, 2, 3), (0, 1, 0), (1, 1, 1), (0, 0, 0)),
        (0, 0, (3, 3, 3), (1, 1, 1), (0, 2, 1), (2, 2, 1), (0, 0, 0)),
        (0, 1, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (1, 0, 1)),
    ],
)
def test_eager_get_indice_pairs_matches_the_numpy_reference(subm, transpose, ksize, stride, padding, dilation, out_pad):
    rng = np.random.default_rng(sum(ksize) + 7 * subm + 11 * transpose + padding[1])
    spatial = (5, 7, 6)
    sites = gip_sites(rng, 2, spatial, 70, duplicates=0 if subm else 5)
    got = mt.get_indice_pairs(
        torch.from_numpy(sites),
        2,
        spatial,
        ksize,
        stride,
        padding,
        dilation,
        out_pad,
        subm=bool(subm),
        transpose=bool(transpose),
    )
    want = gip_reference(sites, 2, spatial, ksize, stride, padding, dilation, out_pad, subm, transpose)
    for name, a, b in zip(["indice_pairs", "out_indices", "indice_num"], got, want):
        assert a.dtype == torch.int32
        np.testing.assert_array_equal(a.numpy(), b, err_msg=name)


def test_get_indice_pairs_contract_errors_are_raised_eagerly():
    sites = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="duplicate input site"):
        mt.get_indice_pairs(sites, 1, (3, 3, 3), 3, padding=1, subm=True)
    with pytest.raises(ValueError, match="outside"):
        mt.get_indice_pairs(sites, 1, (3, 3, 1), 3, padding=1)
    with pytest.raises(ValueError, match="subm needs"):
        mt.get_indice_pairs(sites[:1], 1, (3, 3, 3), 3, padding=0, subm=True)
    with pytest.raises(ValueError, match="stride > 1 together with dilation > 1"):
        mt.get_indice_pairs(sites, 1, (3, 3, 3), 3, stride=2, dilation=2)


def naive_indice_conv(feats, filters, pairs, num, num_out, bias, inverse):
    """float64 loop over the rulebook."""
    out = np.zeros((num_out, filters.shape[2])) + (0 if bias is None else bias.astype(np.float64))
    for k in range(filters.shape[0]):
        for j in range(num[k]):
            src, dst = pairs[k, 0, j], pairs[k, 1, j]
            if inverse:
                src, dst = dst, src
            out[dst] += feats[src].astype(np.float64) @ filters[k].astype(np.float64)
    return out


@pytest.mark.parametrize("inverse", [0, 1])
def test_eager_indice_conv_and_its_gradients(inverse):
    rng = np.random.default_rng(40 + inverse)
    sites = gip_sites(rng, 2, (6, 6, 6), 80)
    pairs, out_idx, num = mt.get_indice_pairs(torch.from_numpy(sites), 2, (6, 6, 6), 3, 2, 1)
    n_in, n_out = len(sites), len(out_idx)
    src_rows, dst_indices = (n_out, torch.from_numpy(sites)) if inverse else (n_in, out_idx)
    feats = torch.from_numpy(rng.standard_normal((src_rows, 5)))
    filters = torch.from_numpy(rng.standard_normal((27, 5, 3)))
    bias = torch.from_numpy(rng.standard_normal(3))
    got = mt.indice_conv(feats.float(), filters.float(), pairs, num, dst_indices, bias.float(), inverse=bool(inverse))
    want = naive_indice_conv(
        feats.numpy(), filters.numpy(), pairs.numpy(), num.numpy(), len(dst_indices), bias.numpy(), inverse
    )
    assert got.shape == want.shape
    assert_accumulating(got.numpy(), want, "indice_conv")
    args = (feats.requires_grad_(), filters.requires_grad_(), pairs, num, dst_indices, bias.requires_grad_(), inverse)
    assert torch.autograd.gradcheck(
        lambda f, w, b: mt.IndiceConvFunction.apply(f, w, *args[2:5], b, inverse),
        (args[0], args[1], args[5]),
        **EXACT_GRAD,
    )


class SparseUNetTail(nn.Module):
    """A strided sparse convolution and the inverse convolution that returns to its input
    sites (IndiceConv inverse = 1 over the same rulebook)."""

    def __init__(self):
        super().__init__()
        self.down = mt.SparseConv3d(4, 8, 3, stride=2, padding=1, indice_key="down1")
        self.up = mt.SparseInverseConv3d(8, 4, 3, indice_key="down1")

    def forward(self, feats, coors):
        x = self.down(mt.SparseTensor(feats, coors, SPATIAL, BATCH))
        y = self.up(x.replace_feature(torch.relu(x.features)))
        return y.features, y.indices


def test_inverse_sparse_convolution_exports_and_matches_eager(lib):
    torch.manual_seed(5)
    model = SparseUNetTail().eval()
    names = ["feats", "coors"]
    proto = export(
        model, sparse_args(200, 50), names, ["up_feats", "up_coors"], {"feats": {0: "sites"}, "coors": {0: "sites"}}
    )
    (rules,) = mluops_nodes(proto, "GetIndicePairs")
    down, up = mluops_nodes(proto, "IndiceConv")
    assert attrs(down) == {"inverse": 0} and attrs(up) == {"inverse": 1}
    # the inverse convolution reuses the forward rulebook and writes the forward input sites
    assert list(up.input[2:5]) == [rules.output[0], rules.output[2], "coors"]
    for count, seed in [(200, 50), (333, 51)]:
        args = sparse_args(count, seed)
        assert_outputs(cpu_session(proto, lib).run(None, feeds_of(names, args)), eager(model, args), ["f", "c"])


# ----------------------------------------------------------------------------- the package itself
def test_package_names_and_cpu_session_options(lib):
    assert mlu.get_ep_name() == EP and mlu.DOMAIN == "mluops" and mt.CUSTOM_OPSETS == {"mluops": 1}
    assert mlu.get_library_path() == lib and os.path.isabs(lib)
    with pytest.raises(ValueError, match="with_ep"):
        mlu.session_options(provider_options={"device_id": "0"})


def test_with_ep_session_options_register_the_ep_once_and_add_its_devices(package_devices, bev_model):
    assert mlu.register_execution_provider(emulate=True) == package_devices  # no second registration
    assert all(d.ep_name == EP for d in package_devices)
    assert dict(package_devices[0].device.metadata)["emulated"] == "true"
    _, proto = bev_model
    sess = ort.InferenceSession(
        proto.SerializeToString(),
        mlu.session_options(with_ep=True, record_assignment=True, provider_options={"device_id": "0"}),
    )
    assert EP in mlu.node_assignment(sess).values()


def run_python(code: str, env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MLU_EP_LIB", "MLU_EP_EMULATE", "PYTHONPATH")}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_get_library_path_search_order(tmp_path):
    """MLU_EP_LIB, then a library shipped in the package, then the checkout's release and
    debug builds, else FileNotFoundError; exercised on copies of the package."""
    checkout = tmp_path / "checkout"
    pkg = checkout / "python" / "onnxruntime_ep_mlu"
    shutil.copytree(REPO / "python" / "onnxruntime_ep_mlu", pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    code = """
        import onnxruntime_ep_mlu as m
        try:
            print("PATH", m.get_library_path())
        except FileNotFoundError as e:
            print("MISSING", e)
    """
    env = {"PYTHONPATH": str(checkout / "python")}

    def found(extra=None) -> str:
        out = run_python(code, {**env, **(extra or {})}, tmp_path)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    # not in a checkout (no Cargo.toml two levels up) and nothing shipped
    message = found()
    assert message.startswith("MISSING") and "libonnxruntime_ep_mlu.so not found" in message and "MLU_EP_LIB" in message
    (checkout / "Cargo.toml").write_text("[package]\n")
    message = found()
    assert "cargo build --release --lib" in message and str(checkout / "target" / "release") in message
    for folder in ["debug", "release"]:
        (checkout / "target" / folder).mkdir(parents=True)
        (checkout / "target" / folder / mlu.LIBRARY_NAME).write_bytes(b"")
        assert found() == f"PATH {checkout / 'target' / folder / mlu.LIBRARY_NAME}"  # release before debug
    (pkg / mlu.LIBRARY_NAME).write_bytes(b"")
    assert found() == f"PATH {pkg / mlu.LIBRARY_NAME}"  # shipped in the package first
    other = tmp_path / "elsewhere.so"
    other.write_bytes(b"")
    assert found({"MLU_EP_LIB": "elsewhere.so"}) == f"PATH {other}"  # relative to the cwd, made absolute
    message = found({"MLU_EP_LIB": str(tmp_path / "nope.so")})
    assert message.startswith("MISSING") and "MLU_EP_LIB" in message and "nope.so" in message


def test_package_imports_without_torch(tmp_path):
    """Only the torch submodule needs torch."""
    code = """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch blocked")
        sys.meta_path.insert(0, Block())
        import onnxruntime_ep_mlu as m
        print(m.get_ep_name(), "torch" in sys.modules)
        try:
            import onnxruntime_ep_mlu.torch
        except ImportError as e:
            print("needs", e)
    """
    out = run_python(code, {"PYTHONPATH": str(REPO / "python")}, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["MLUExecutionProvider False", "needs torch blocked"]


def test_with_ep_without_a_card_or_the_emulator_fails_clearly(lib, tmp_path):
    """In a fresh process without MLU_EP_EMULATE: no device, so session_options(with_ep=True)
    raises; asking for the emulated card afterwards registers the library again with it."""
    code = f"""
        import onnxruntime as ort
        import onnxruntime_ep_mlu as m
        ort.set_default_logger_severity(4)
        print(len(m.register_execution_provider({lib!r})))
        try:
            m.session_options(with_ep=True)
        except RuntimeError as e:
            print("RuntimeError:", e)
        print("devices", len(m.register_execution_provider(emulate=True)))
    """
    env = {"PYTHONPATH": str(REPO / "python")}
    out = run_python(code, env, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "0", out.stdout
    assert lines[1].startswith("RuntimeError: MLUExecutionProvider offers no device") and "MLU_EP_EMULATE=1" in lines[1]
    # The emulated card is asked for after a registration without it: the helper registers
    # again, and the card is there.
    assert lines[2] == "devices 1", out.stdout


def test_a_reused_worker_switches_the_emulated_card_and_keeps_older_sessions(lib, tmp_path):
    """As a Ray or multiprocessing worker reused by tasks that want different cards: each
    call of the helper with `emulate` gets what it asks for, whatever the environment was at
    the first registration, and a session made before the switch still runs."""
    demo, data = REPO / "models" / "mluops_demo.onnx", REPO / "models" / "mluops_demo.npz"
    code = f"""
        import numpy as np, onnxruntime as ort
        import onnxruntime_ep_mlu as m
        ort.set_default_logger_severity(4)
        devices = m.register_execution_provider({lib!r}, emulate=True)
        so = ort.SessionOptions()
        so.add_provider_for_devices(devices, {{}})
        sess = ort.InferenceSession({str(demo)!r}, so)
        npz = np.load({str(data)!r})
        feeds = {{i.name: npz["in." + i.name] for i in sess.get_inputs()}}
        first = sess.run(None, feeds)
        print("off", len(m.register_execution_provider(emulate=False)))
        again = sess.run(None, feeds)
        print("old session", all(a.shape == b.shape for a, b in zip(first, again)))
        print("on", len(m.register_execution_provider(emulate=True)))
        print("on again", len(m.register_execution_provider(emulate=True)))
        # Options built from the devices of a replaced registration: refused clearly.
        try:
            stale = ort.InferenceSession({str(demo)!r}, so)
            print("stale on", "MLUExecutionProvider" in stale.get_providers())
        except Exception as e:
            print("stale raised", "this registration of the library was unregistered" in str(e))
    """
    out = run_python(code, {"PYTHONPATH": str(REPO / "python")}, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[:4] == ["off 0", "old session True", "on 1", "on again 1"], out.stdout
    # onnxruntime up to 1.31 prints the provider's error and falls back to CPU; 1.32 raises.
    assert lines[-1] in ("stale on False", "stale raised True"), out.stdout
    if lines[-1] == "stale on False":
        assert "this registration of the library was unregistered" in out.stdout + out.stderr, out.stdout
