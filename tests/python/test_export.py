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
file (scripts/requirements-torch.txt)."""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import assert_accumulating
from reference import dsb_reference, gip_reference, gip_sites, prp_reference, tib_reference, vpf_reference
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))  # the package of this checkout, installed or not
mlu = importlib.import_module("onnxruntime_ep_mlu")
mt = importlib.import_module("onnxruntime_ep_mlu.torch")

EP = "MLUExecutionProvider"
CPU = "CPUExecutionProvider"
# gradcheck in float64 on functions linear in the checked input: the finite differences are
# exact to rounding, so the tolerance can be far below gradcheck's default (rtol 1e-3)
EXACT_GRAD = {"atol": 1e-8, "rtol": 1e-7}

pytestmark = [
    # torch >= 2.9 marks the TorchScript exporter (the one that honours `symbolic`) deprecated.
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export"),
    pytest.mark.filterwarnings("ignore:The feature will be removed"),
]


# ----------------------------------------------------------------------------- harness
@pytest.fixture(scope="module")
def lib() -> str:
    try:
        return mlu.get_library_path()
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def package_devices(lib):
    """The library registered as the MLUExecutionProvider with the emulated card (the
    library reads MLU_EP_EMULATE when it is registered, so it is set first)."""
    os.environ["MLU_EP_EMULATE"] = "1"
    ort.set_default_logger_severity(3)
    devices = mlu.register_execution_provider(lib, emulate=True)
    assert devices, "the EP library registered but reports no device"
    return devices


@contextlib.contextmanager
def stderr_of_native_code():
    """Captures file descriptor 2, where torch's C++ exporter writes its warnings."""
    result = {}
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield result
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            result["text"] = tmp.read().decode(errors="replace")


def export(model: nn.Module, args: tuple, input_names, output_names, dynamic_axes=None) -> onnx.ModelProto:
    """Exports with the TorchScript exporter; fails if the exporter had no type for an
    mluops output (every symbolic sets its outputs' types) or if tracing warned that the
    trace might not generalise."""
    model.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught, stderr_of_native_code() as native:
        warnings.simplefilter("always")
        torch.onnx.export(
            model,
            args,
            buf,
            dynamo=False,
            opset_version=17,
            custom_opsets={"mluops": 1},
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
        )
    tracer = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert not tracer, tracer
    untyped = [line for line in native["text"].splitlines() if "shape inference of mluops" in line]
    assert not untyped, untyped
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto)  # a custom domain's nodes are not checked, the rest is
    return proto


def mluops_nodes(proto: onnx.ModelProto, op_type: str | None = None) -> list[onnx.NodeProto]:
    return [n for n in proto.graph.node if n.domain == "mluops" and (op_type is None or n.op_type == op_type)]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def producer(proto: onnx.ModelProto, name: str) -> tuple[onnx.NodeProto, int]:
    for n in proto.graph.node:
        if name in n.output:
            return n, list(n.output).index(name)
    raise KeyError(name)


def graph_output(proto: onnx.ModelProto, name: str):
    (o,) = [o for o in proto.graph.output if o.name == name]
    return o.type.tensor_type


def dims(tensor_type) -> list:
    """A value's shape: ints, or the symbol's name for a symbolic dimension."""
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in tensor_type.shape.dim]


def cpu_session(proto: onnx.ModelProto, lib: str) -> ort.InferenceSession:
    so = mlu.session_options(library=lib, record_assignment=True)
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=[CPU])


def mlu_session(proto: onnx.ModelProto, devices) -> ort.InferenceSession:
    so = mlu.session_options(with_ep=True, record_assignment=True)
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so)


def eager(model: nn.Module, args: tuple) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*args)
    out = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in out]


def feeds_of(names, args) -> dict[str, np.ndarray]:
    return {n: a.numpy() for n, a in zip(names, args)}


def assert_outputs(got, want, names):
    assert len(got) == len(want)
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, f"{name}: shape {a.shape} vs eager {b.shape}"
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} vs eager {b.dtype}"
        if np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert_accumulating(a, b.astype(np.float64), name)


def node_placement(sess: ort.InferenceSession, proto: onnx.ModelProto, op_type: str) -> list[str]:
    where = mlu.node_assignment(sess)
    names = [n.name for n in proto.graph.node if n.op_type == op_type]
    assert names, f"no {op_type} node"
    return [where[n] for n in names]


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
