"""``onnxruntime_ep_mlu.torch.from_spconv`` on models written against spconv.pytorch the way
their authors write them: CenterPoint's SpMiddleResNetFHD (det3d/models/backbones/scn.py),
mmdet3d's SparseEncoder with spconv modules (make_sparse_convmodule's SparseSequential of
conv, BatchNorm1d, ReLU), SECOND's SpMiddleFHD (second/pytorch/models/middle.py), and an
encoder-decoder with SparseInverseConv3d. Each is converted, exported, and run by ONNX
Runtime's CPU path at 1 and 2 intra-op threads; outputs equal spconv 2.3.8's eager outputs
(at 1 torch thread: its CPU path is wrong on 2): dense grids within the contract's float
tolerance, coordinates as sets exactly. Our own weights (seeded) and scans (random sites)."""

from __future__ import annotations

import importlib
import io
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import assert_accumulating
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO))
mlu = importlib.import_module("onnxruntime_ep_mlu")
mt = importlib.import_module("onnxruntime_ep_mlu.torch")
try:
    spconv = importlib.import_module("spconv.pytorch")
except ImportError as e:
    # The test command installs spconv: without it this file fails, never skips unseen.
    raise ImportError(
        f"tests/python/test_from_spconv.py needs spconv 2.3.8 ({e}): scripts/setup.sh --test installs it "
        "(scripts/requirements-peers.txt)"
    ) from e
from spconv.pytorch import SparseConvTensor  # noqa: E402  (imported by name, as many models do)
from networks.common import seed_batchnorms  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export"),
    pytest.mark.filterwarnings("ignore:The feature will be removed"),
]


def bn(c):
    return nn.BatchNorm1d(c, eps=1e-3, momentum=0.01)


# ----------------------------------------------------------- CenterPoint: SpMiddleResNetFHD
def conv3x3(cin, cout, stride=1, indice_key=None, bias=True):
    return spconv.SubMConv3d(cin, cout, 3, stride, padding=1, bias=bias, indice_key=indice_key)


class SparseBasicBlock(spconv.SparseModule):
    def __init__(self, inplanes, planes, stride=1, indice_key=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride, indice_key=indice_key, bias=True)
        self.bn1 = bn(planes)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(planes, planes, indice_key=indice_key, bias=True)
        self.bn2 = bn(planes)

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = out.replace_feature(self.relu(self.bn1(out.features)))
        out = self.conv2(out)
        out = out.replace_feature(self.bn2(out.features))
        out = out.replace_feature(self.relu(out.features + identity.features))
        return out


class SpMiddleResNetFHD(nn.Module):
    def __init__(self, num_input_features=5):
        super().__init__()
        self.conv_input = spconv.SparseSequential(
            spconv.SubMConv3d(num_input_features, 16, 3, bias=False, indice_key="res0"), bn(16), nn.ReLU(inplace=True)
        )
        self.conv1 = spconv.SparseSequential(SparseBasicBlock(16, 16, indice_key="res0"),
                                             SparseBasicBlock(16, 16, indice_key="res0"))
        self.conv2 = spconv.SparseSequential(
            spconv.SparseConv3d(16, 32, 3, 2, padding=1, bias=False), bn(32), nn.ReLU(inplace=True),
            SparseBasicBlock(32, 32, indice_key="res1"), SparseBasicBlock(32, 32, indice_key="res1"),
        )
        self.conv3 = spconv.SparseSequential(
            spconv.SparseConv3d(32, 64, 3, 2, padding=1, bias=False), bn(64), nn.ReLU(inplace=True),
            SparseBasicBlock(64, 64, indice_key="res2"), SparseBasicBlock(64, 64, indice_key="res2"),
        )
        self.conv4 = spconv.SparseSequential(
            spconv.SparseConv3d(64, 128, 3, 2, padding=[0, 1, 1], bias=False), bn(128), nn.ReLU(inplace=True),
            SparseBasicBlock(128, 128, indice_key="res3"), SparseBasicBlock(128, 128, indice_key="res3"),
        )
        self.extra_conv = spconv.SparseSequential(
            spconv.SparseConv3d(128, 128, (3, 1, 1), (2, 1, 1), bias=False), bn(128), nn.ReLU()
        )

    def forward(self, voxel_features, coors, batch_size, input_shape):
        sparse_shape = np.array(input_shape[::-1]) + [1, 0, 0]
        coors = coors.int()
        ret = spconv.SparseConvTensor(voxel_features, coors, sparse_shape, batch_size)
        x = self.conv_input(ret)
        x_conv1 = self.conv1(x)
        x_conv2 = self.conv2(x_conv1)
        x_conv3 = self.conv3(x_conv2)
        x_conv4 = self.conv4(x_conv3)
        ret = self.extra_conv(x_conv4)
        ret = ret.dense()
        n, c, d, h, w = ret.shape
        return ret.view(n, c * d, h, w)


# ----------------------------------------------------------- mmdet3d: SparseEncoder
def make_sparse_convmodule(cin, cout, k, indice_key, stride=1, padding=0, conv_type="SubMConv3d"):
    if conv_type == "SubMConv3d":
        conv = spconv.SubMConv3d(cin, cout, k, stride=stride, padding=padding, bias=False, indice_key=indice_key)
    else:
        conv = spconv.SparseConv3d(cin, cout, k, stride=stride, padding=padding, bias=False, indice_key=indice_key)
    return spconv.SparseSequential(conv, bn(cout), nn.ReLU(inplace=True))


class SparseEncoder(nn.Module):
    def __init__(self, in_channels, sparse_shape, base_channels=16, output_channels=128,
                 encoder_channels=((16,), (32, 32, 32), (64, 64, 64), (64, 64, 64)),
                 encoder_paddings=((1,), (1, 1, 1), (1, 1, 1), ((0, 1, 1), 1, 1))):
        super().__init__()
        self.sparse_shape = sparse_shape
        self.conv_input = make_sparse_convmodule(in_channels, base_channels, 3, "subm1", padding=1)
        self.encoder_layers = spconv.SparseSequential()
        cin = base_channels
        for i, blocks in enumerate(encoder_channels):
            stage = []
            for j, cout in enumerate(blocks):
                padding = tuple(encoder_paddings[i])[j]
                if i != 0 and j == 0:
                    stage.append(make_sparse_convmodule(cin, cout, 3, f"spconv{i + 1}", stride=2, padding=padding,
                                                        conv_type="SparseConv3d"))
                else:
                    stage.append(make_sparse_convmodule(cin, cout, 3, f"subm{i + 1}", padding=padding))
                cin = cout
            self.encoder_layers.add_module(f"encoder_layer{i + 1}", spconv.SparseSequential(*stage))
        self.conv_out = make_sparse_convmodule(cin, output_channels, (3, 1, 1), "spconv_down2", stride=(2, 1, 1),
                                               conv_type="SparseConv3d")

    def forward(self, voxel_features, coors, batch_size):
        input_sp_tensor = SparseConvTensor(voxel_features, coors, self.sparse_shape, batch_size)
        x = self.conv_input(input_sp_tensor)
        encode_features = []
        for encoder_layer in self.encoder_layers:
            x = encoder_layer(x)
            encode_features.append(x)
        out = self.conv_out(encode_features[-1])
        spatial_features = out.dense()
        n, c, d, h, w = spatial_features.shape
        return spatial_features.view(n, c * d, h, w)


# ----------------------------------------------------------- SECOND: SpMiddleFHD
class SpMiddleFHD(nn.Module):
    def __init__(self, output_shape, num_input_features=4):
        super().__init__()
        self.sparse_shape = np.array(output_shape[1:4]) + [1, 0, 0]
        layers = []
        cin = num_input_features
        for stage, (cout, key, n_subm) in enumerate([(16, "subm0", 2), (32, "subm1", 2), (64, "subm2", 3), (64, "subm3", 3)]):
            if stage:
                padding = [0, 1, 1] if stage == 3 else 1
                layers += [spconv.SparseConv3d(cin, cout, 3, 2, padding=padding, bias=False), bn(cout), nn.ReLU()]
                cin = cout
            for _ in range(n_subm):
                layers += [spconv.SubMConv3d(cin, cout, 3, bias=False, indice_key=key), bn(cout), nn.ReLU()]
                cin = cout
        layers += [spconv.SparseConv3d(64, 64, (3, 1, 1), (2, 1, 1), bias=False), bn(64), nn.ReLU()]
        self.middle_conv = spconv.SparseSequential(*layers)

    def forward(self, voxel_features, coors, batch_size):
        ret = spconv.SparseConvTensor(voxel_features, coors.int(), self.sparse_shape, batch_size)
        ret = self.middle_conv(ret)
        ret = ret.dense()
        n, c, d, h, w = ret.shape
        return ret.view(n, c * d, h, w)


# ----------------------------------------------------------- encoder-decoder (inverse conv)
class EncoderDecoder(nn.Module):
    """A UNet-style pair: down with SparseConv3d, back up with SparseInverseConv3d on its
    rulebook, a skip connection and a bias; returns features and sites."""

    def __init__(self, shape, cin=4):
        super().__init__()
        self.shape = shape
        self.stem = spconv.SparseSequential(spconv.SubMConv3d(cin, 16, 3, indice_key="s0"), bn(16), nn.ReLU())
        self.down = spconv.SparseSequential(spconv.SparseConv3d(16, 32, 3, 2, padding=1, indice_key="down"), nn.ReLU())
        self.up = spconv.SparseInverseConv3d(32, 16, 3, indice_key="down")
        self.head = spconv.SubMConv3d(16, 8, 1, indice_key="s1")

    def forward(self, feats, coors, batch_size):
        x = spconv.SparseConvTensor(feats, coors, self.shape, batch_size)
        x = self.stem(x)
        y = self.up(self.down(x))
        y = y.replace_feature(y.features + x.features)
        out = self.head(y)
        return out.features, out.indices


# ----------------------------------------------------------- subclasses of spconv's classes
class SubMConvBNReLU(spconv.SparseSequential):
    """spconv's quantisation examples' block (there 2D), a SparseSequential subclass that
    only fills itself in ``__init__``: it runs SparseSequential's forward."""

    def __init__(self, cin, cout, indice_key):
        super().__init__(spconv.SubMConv3d(cin, cout, 3, bias=False, indice_key=indice_key), bn(cout), nn.ReLU())


class DownConv(spconv.SparseConv3d):
    """A convolution subclass with its own defaults and an attribute, spconv's forward."""

    def __init__(self, cin, cout, indice_key):
        super().__init__(cin, cout, 3, 2, padding=1, indice_key=indice_key)
        self.role = "down"


class UpConv(spconv.SparseInverseConv3d):
    pass


class Head(spconv.SubMConv3d):
    pass


class Subclassed(nn.Module):
    """Subclasses in every converted role; the head reuses the stem's key after the
    down-up round trip (the key is in its input's lineage, as in spconv)."""

    def __init__(self, shape, cin=4):
        super().__init__()
        self.shape = shape
        self.stem = SubMConvBNReLU(cin, 16, "s0")
        self.down = DownConv(16, 32, "down")
        self.mid = spconv.SparseSequential(SubMConvBNReLU(32, 32, "s1"), spconv.SparseIdentity())
        self.up = UpConv(32, 16, 3, indice_key="down")
        self.head = Head(16, 8, 3, indice_key="s0")

    def forward(self, feats, coors, batch_size):
        x = self.stem(spconv.SparseConvTensor(feats, coors, self.shape, batch_size))
        y = self.up(self.mid(self.down(x)))
        out = self.head(y.replace_feature(y.features + x.features))
        return out.features, out.indices


class OwnSequentialForward(spconv.SparseSequential):
    def forward(self, x):
        return x.replace_feature(x.features * 2)


class OwnConvForward(spconv.SubMConv3d):
    def forward(self, x, add_input=None):
        return super().forward(x, add_input)


class Pool(spconv.SparseMaxPool3d):
    pass


# ----------------------------------------------------------- indice keys per tensor lineage
class SiblingKeys(nn.Module):
    """Two branches from one tensor store the key "down" with different strides, each
    inverse convolution reading its own branch's (spconv scopes keys per lineage)."""

    def __init__(self, shape, cin=4):
        super().__init__()
        self.shape = shape
        self.stem = spconv.SparseSequential(spconv.SubMConv3d(cin, 16, 3, indice_key="s0"), bn(16), nn.ReLU())
        self.down_a = spconv.SparseConv3d(16, 24, 3, 2, padding=1, indice_key="down")
        self.up_a = spconv.SparseInverseConv3d(24, 16, 3, indice_key="down")
        self.down_b = spconv.SparseConv3d(16, 24, (3, 3, 3), (1, 2, 2), padding=1, indice_key="down")
        self.mid_b = spconv.SubMConv3d(24, 24, 3, indice_key="s1")
        self.up_b = spconv.SparseInverseConv3d(24, 16, 3, indice_key="down")

    def forward(self, feats, coors, batch_size):
        x = self.stem(spconv.SparseConvTensor(feats, coors, self.shape, batch_size))
        a = self.up_a(self.down_a(x))
        b = self.up_b(self.mid_b(self.down_b(x)))
        return a.features + b.features + x.features, a.indices


class SameGeometryOtherSites(nn.Module):
    """The key "down" stored twice with one geometry on different sites (the stem's, and
    those of a stride-1 convolution that grows them): the first branch's inverse convolution
    reads the first branch's rulebook, as in spconv."""

    def __init__(self, shape, cin=4):
        super().__init__()
        self.shape = shape
        self.stem = spconv.SubMConv3d(cin, 16, 3, indice_key="s0")
        self.grow = spconv.SparseConv3d(16, 16, 3, 1, padding=1)
        self.down_a = spconv.SparseConv3d(16, 16, 3, 2, padding=1, indice_key="down")
        self.down_b = spconv.SparseConv3d(16, 16, 3, 2, padding=1, indice_key="down")
        self.up_a = spconv.SparseInverseConv3d(16, 8, 3, indice_key="down")
        self.up_b = spconv.SparseInverseConv3d(16, 8, 3, indice_key="down")

    def forward(self, feats, coors, batch_size):
        x = self.stem(spconv.SparseConvTensor(feats, coors, self.shape, batch_size))
        a = self.down_a(x)
        b = self.up_b(self.down_b(self.grow(x)))
        a = self.up_a(a)
        return a.features, a.indices, b.features, b.indices


# ----------------------------------------------------------- harness
def sites(rng, batch, shape, n):
    """`n` distinct active sites per batch element, int32 [b, z, y, x]."""
    rows = []
    for b in range(batch):
        cells = rng.choice(int(np.prod(shape)), size=n, replace=False)
        z, rem = np.divmod(cells, shape[1] * shape[2])
        y, x = np.divmod(rem, shape[2])
        rows.append(np.stack([np.full(n, b), z, y, x], 1))
    return np.concatenate(rows).astype(np.int32)


def seeded(build, seed):
    """``build()`` with seeded weights (torch's initialisation under ``seed``), BatchNorms
    (networks/common.py) and spconv biases, in eval mode."""
    torch.manual_seed(seed)
    model = seed_batchnorms(build(), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, spconv.conv.SparseConvolution) and m.bias is not None:
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.2 - 0.1)
    return model


class Bound(nn.Module):
    """The model with its non-tensor arguments fixed, as the exported graph has them."""

    def __init__(self, model, *extra):
        super().__init__()
        self.model, self.extra = model, extra

    def forward(self, feats, coors):
        return self.model(feats, coors, *self.extra)


def eager_spconv(model, feats, coors):
    """spconv's eager outputs at 1 torch thread. Its CPU convolution refuses a bias ("cpu
    don't support act and bias", spconv 2.3.8 ops.py): a biased convolution runs without it
    and a forward hook adds it to the output features, as its CUDA path fuses it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    biased = [m for m in model.modules() if isinstance(m, spconv.conv.SparseConvolution) and m.bias is not None]
    hooks, saved = [], []
    for m in biased:
        saved.append(m.bias)
        hooks.append(m.register_forward_hook(lambda _m, _in, out, b=m.bias: out.replace_feature(out.features + b)))
        m.bias = None
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(feats), torch.from_numpy(coors))
    finally:
        torch.set_num_threads(threads)
        for m, b, h in zip(biased, saved, hooks):
            m.bias = b
            h.remove()
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def run_onnx(model, feats, coors, outputs):
    """The model exported once, then run by ONNX Runtime's CPU path at 1 and 2 intra-op
    threads: {threads: outputs}, and the model."""
    buf = io.BytesIO()
    mt.export(model, (torch.from_numpy(feats), torch.from_numpy(coors)), buf, input_names=["feats", "coors"],
              output_names=outputs, dynamic_axes={"feats": {0: "L"}, "coors": {0: "L"}})
    runs = {}
    for threads in (1, 2):
        so = mlu.session_options(library=mlu.get_library_path())
        so.log_severity_level = 3
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(buf.getvalue(), so, providers=["CPUExecutionProvider"])
        runs[threads] = sess.run(None, {"feats": feats, "coors": coors})
    return runs, buf.getvalue()


def assert_same_sites(runs, want, what):
    """Each run's (features, indices) pairs equal spconv's: the sites as sets exactly, each
    site's features by the contract's judge (``assert_accumulating``)."""
    for threads, got in runs.items():
        for k in range(0, len(want), 2):
            (got_f, got_i), (want_f, want_i) = got[k : k + 2], want[k : k + 2]
            order_w, order_g = np.lexsort(want_i.T[::-1]), np.lexsort(got_i.T[::-1])
            np.testing.assert_array_equal(got_i[order_g], want_i[order_w])
            assert_accumulating(got_f[order_g], want_f[order_w].astype(np.float64),
                                f"{what}: output {k} at {threads} threads")


def converted_matches_spconv(build, seed, outputs):
    """``build()``'s model (seeded) converted, exported and run on 300 random sites per
    batch element of 2 in a 9 x 20 x 20 grid, compared with spconv's eager outputs."""
    rng = np.random.default_rng(seed)
    grid = (9, 20, 20)
    coors = sites(rng, 2, grid, 300)
    feats = rng.standard_normal((coors.shape[0], 4)).astype(np.float32)
    reference = seeded(lambda: build(list(grid)), seed)
    want = eager_spconv(Bound(reference, 2), feats, coors)
    converted = mt.from_spconv(reference)
    runs, _ = run_onnx(Bound(converted, 2), feats, coors, outputs)
    assert_same_sites(runs, want, build.__name__)
    return converted


def mluops_ops(model_bytes):
    import onnx

    proto = onnx.load_from_string(model_bytes)
    return sorted({n.op_type for n in proto.graph.node if n.domain == "mluops"})


DETECTORS = {
    # (builder, non-tensor arguments, input channels, grid, sites per batch element)
    "centerpoint_SpMiddleResNetFHD": (lambda: SpMiddleResNetFHD(5), (1, [64, 64, 40]), 5, (41, 64, 64), 900),
    "mmdet3d_SparseEncoder": (lambda: SparseEncoder(5, [41, 64, 64]), (1,), 5, (41, 64, 64), 900),
    "second_SpMiddleFHD": (lambda: SpMiddleFHD([1, 40, 48, 48, 64], 4), (2,), 4, (41, 48, 48), 500),
}


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_converted_backbone_matches_spconv(name):
    build, extra, cin, grid, n = DETECTORS[name]
    rng = np.random.default_rng(len(name))
    batch = extra[0]
    coors = sites(rng, batch, grid, n)
    feats = rng.standard_normal((coors.shape[0], cin)).astype(np.float32)
    reference = seeded(build, 7)
    (want,) = eager_spconv(Bound(reference, *extra), feats, coors)
    assert np.count_nonzero(want) > want.size // 100, "the scan reaches the output grid"
    converted = mt.from_spconv(reference)
    assert not any(type(m).__module__.startswith("spconv.") for m in converted.modules())
    runs, model = run_onnx(Bound(converted, *extra), feats, coors, ["spatial_features"])
    for threads, (got,) in runs.items():
        assert got.shape == want.shape
        assert_accumulating(got, want.astype(np.float64), f"{name} at {threads} threads")
    assert mluops_ops(model) == ["GetIndicePairs", "IndiceConv"]
    # The export fuses each BatchNorm1d (into the filters), ReLU and residual Add into the
    # convolutions: none is left between them, one residual per basic block.
    import onnx

    graph = onnx.load_from_string(model).graph
    assert not {"BatchNormalization", "Relu"} & {n.op_type for n in graph.node}
    convs = [n for n in graph.node if n.op_type == "IndiceConv"]
    blocks = sum(type(m).__name__.endswith("BasicBlock") for m in reference.modules())
    assert sum(len(n.input) > 8 and bool(n.input[8]) for n in convs) == blocks
    assert all(any(a.name == "activation" and a.s == b"relu" for a in n.attribute) for n in convs)


def test_inverse_convolution_and_sites_as_sets():
    rng = np.random.default_rng(3)
    grid = (9, 20, 20)
    coors = sites(rng, 2, grid, 300)
    feats = rng.standard_normal((coors.shape[0], 4)).astype(np.float32)
    reference = seeded(lambda: EncoderDecoder(list(grid)), 11)
    want = eager_spconv(Bound(reference, 2), feats, coors)
    converted = mt.from_spconv(reference)
    runs, _ = run_onnx(Bound(converted, 2), feats, coors, ["features", "indices"])
    assert_same_sites(runs, want, "EncoderDecoder")


def test_the_conversion_carries_layout_keys_and_containers():
    reference = seeded(lambda: SpMiddleResNetFHD(5), 1)
    converted = mt.from_spconv(reference).model
    first = converted.conv_input[0]
    assert isinstance(converted.conv_input, mt.SparseSequential) and isinstance(first, mt.SubMConv3d)
    assert first.indice_key == "res0" and first.bias is None
    spc = spconv.SubMConv3d(5, 16, 3, bias=False)
    with torch.no_grad():
        spc.weight.copy_(torch.arange(spc.weight.numel(), dtype=torch.float32).view(spc.weight.shape))
    ours = mt.from_spconv(spconv.SparseSequential(spc)).model[0]
    # spconv [Cout, kd, kh, kw, Cin] -> ours [kd, kh, kw, Cin, Cout]
    assert ours.weight[1, 2, 0, 4, 7] == spc.weight[7, 1, 2, 0, 4]
    # A 1x1x1 convolution as spconv computes it: features @ weight.view(Cin, Cout).
    one = spconv.SubMConv3d(16, 8, 1, bias=False)
    ours = mt.from_spconv(spconv.SparseSequential(one)).model[0]
    assert torch.equal(ours.weight.reshape(16, 8), one.weight.detach().view(16, 8))
    down = converted.conv4[0]
    assert (down.stride, down.padding, down.subm) == ((2, 2, 2), (0, 1, 1), False)
    assert converted.conv1[0].takes_sparse, "the user's SparseModule takes the whole tensor"


@pytest.mark.parametrize(
    "module, why",
    [
        (lambda: spconv.SparseMaxPool3d(3, 2), "SparseMaxPool3d): no mluops counterpart"),
        (lambda: spconv.SparseConvTranspose3d(4, 8, 3, 2), "a transposed convolution"),
        (lambda: spconv.SubMConv3d(4, 8, 2), "dilation * (kernel - 1) even"),
        (lambda: spconv.SparseConv2d(4, 8, 3), "a 2D convolution"),
        (lambda: spconv.SparseInverseConv3d(4, 8, 1, indice_key="k"), "a 1x1x1 inverse convolution"),
    ],
)
def test_what_cannot_be_converted_is_an_error_naming_the_module(module, why):
    model = nn.Module()
    model.body = spconv.SparseSequential(spconv.SubMConv3d(4, 4, 3), module())
    with pytest.raises(ValueError, match="from_spconv: body.1 ") as e:
        mt.from_spconv(model)
    assert why in str(e.value)


def test_the_tensor_type_is_restored_after_each_call_even_one_that_raises_or_runs_beside_another():
    import spconv.pytorch.core as core
    import threading

    original = core.SparseConvTensor
    reference = seeded(lambda: SpMiddleFHD([1, 40, 48, 48, 64], 4), 2)
    converted = mt.from_spconv(reference)
    rng = np.random.default_rng(5)
    coors = torch.from_numpy(sites(rng, 1, (41, 48, 48), 200))
    feats = torch.from_numpy(rng.standard_normal((coors.shape[0], 4)).astype(np.float32))
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((spconv.SparseConvTensor, globals()["SparseConvTensor"]))
            return x

    converted.model.middle_conv.add_module("probe", Probe())
    with torch.no_grad():
        converted(feats, coors, 1)
        with pytest.raises(ValueError, match="do not match filters"):
            converted(feats[:, :2], coors, 1)  # a wrong channel count raises inside the call
        threads = [threading.Thread(target=converted, args=(feats, coors, 1)) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    assert seen and all(a is mt.SparseTensor and b is mt.SparseTensor for a, b in seen), seen
    assert spconv.SparseConvTensor is original and globals()["SparseConvTensor"] is original
    assert original.__module__ == "spconv.pytorch.core"


def test_subclasses_running_their_spconv_class_forward_are_converted_and_match_spconv():
    converted = converted_matches_spconv(Subclassed, 13, ["features", "indices"]).model
    assert isinstance(converted.stem, mt.SparseSequential) and isinstance(converted.stem[0], mt.SubMConv3d)
    assert isinstance(converted.down, mt.SparseConv3d) and converted.down.stride == (2, 2, 2)
    assert isinstance(converted.up, mt.SparseInverseConv3d) and isinstance(converted.head, mt.SubMConv3d)
    assert isinstance(converted.mid[1], nn.Identity)


@pytest.mark.parametrize(
    "child, why",
    [
        (lambda: OwnSequentialForward(spconv.SubMConv3d(4, 4, 3)),
         "a subclass of spconv.pytorch.modules.SparseSequential that redefines forward (in {m}.OwnSequentialForward)"),
        (lambda: OwnConvForward(4, 4, 3),
         "a subclass of spconv.pytorch.conv.SubMConv3d that redefines forward (in {m}.OwnConvForward)"),
        (lambda: Pool(3, 2), "a subclass of spconv.pytorch.pool.SparseMaxPool3d: no mluops counterpart"),
    ],
    ids=["SparseSequential-forward", "SubMConv3d-forward", "SparseMaxPool3d"],
)
def test_a_subclass_with_its_own_forward_is_refused_naming_its_path_and_class(child, why):
    model = nn.Module()
    model.body = spconv.SparseSequential(spconv.SubMConv3d(4, 4, 3), SubMConvBNReLU(4, 4, "k"),
                                         spconv.SparseSequential(child()))
    with pytest.raises(ValueError) as e:
        mt.from_spconv(model)
    name = type(model.body[2][0]).__name__
    assert str(e.value).startswith(f"from_spconv: body.2.0 ({__name__}.{name}): "), str(e.value)
    assert why.format(m=__name__) in str(e.value)


def test_sibling_branches_reusing_a_key_name_with_different_strides_match_spconv():
    converted_matches_spconv(SiblingKeys, 17, ["features", "indices"])


def test_a_key_stored_on_other_sites_with_the_same_geometry_leaves_the_inverse_its_own_rulebook():
    converted_matches_spconv(SameGeometryOtherSites, 19, ["features_a", "indices_a", "features_b", "indices_b"])


class Steps(nn.Module):
    """Layers each applied to an earlier step's output (-1: the previous one; 0: the input)."""

    def __init__(self, *steps):
        super().__init__()
        self.layers = nn.ModuleList([m for m, _ in steps])
        self.sources = [src for _, src in steps]

    def forward(self, feats, coors):
        outs = [spconv.SparseConvTensor(feats, coors, [9, 20, 20], 1)]
        for layer, src in zip(self.layers, self.sources):
            outs.append(layer(outs[src]))
        return outs[-1].features


def down(key=None, stride=2):
    return spconv.SparseConv3d(4, 4, 3, stride, padding=1, bias=False, indice_key=key), -1


def subm(key, k=3):
    return spconv.SubMConv3d(4, 4, k, bias=False, indice_key=key), -1


def up(key, src=-1):
    return spconv.SparseInverseConv3d(4, 4, 3, bias=False, indice_key=key), src


@pytest.mark.parametrize(
    "steps, theirs, ours",
    [
        ((down("d"), down("d")), "only support reuse subm indices",
         "indice_key 'd': a non-submanifold convolution upstream of this non-submanifold one stored it"),
        ((subm("s"), subm("s", 5)), "subm with same indice_key must have same kernel",
         "indice_key 's': stored rulebook has geometry"),
        ((subm("s"), up("s")), "inverse conv can only be used with standard conv",
         "indice_key 's' names a submanifold convolution's rulebook"),
        ((down("d"), down(), up("d")), "Inverse with same indice_key must have same spatial structure",
         "indice_key 'd': input grid (3, 5, 5), the forward convolution's output grid (5, 10, 10)"),
        ((down("d"), down(stride=1), up("d")), "Inverse with same indice_key must have same num of indices",
         "sites, the forward convolution's output"),
        ((down("d"), up("d", src=0)), "",
         "no rulebook under indice_key 'd' upstream of its input (keys are scoped per tensor lineage"),
    ],
    ids=["strided-key-upstream", "subm-other-kernel", "inverse-of-subm", "inverse-other-grid",
         "inverse-other-sites", "inverse-key-in-sibling"],
)
def test_what_spconv_refuses_of_a_key_is_refused_after_conversion(steps, theirs, ours):
    rng = np.random.default_rng(23)
    coors = torch.from_numpy(sites(rng, 1, (9, 20, 20), 60))
    feats = torch.from_numpy(rng.standard_normal((coors.shape[0], 4)).astype(np.float32))
    model = Steps(*steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises((AssertionError, ValueError), match=theirs):
            model(feats, coors)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises((KeyError, ValueError)) as e:
        mt.from_spconv(model)(feats, coors)
    assert ours in str(e.value)
