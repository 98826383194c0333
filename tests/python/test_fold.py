"""onnxruntime_ep_mlu.fold.fold_affine: which per-channel affines after IndiceConv it folds,
which it must leave, and that the folded graph computes what the original did (within the
contract's accumulating class) under onnxruntime with the library."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import IR_VERSION, OPSETS, REPO, library_path
from reference import accumulating_metrics

sys.path.insert(0, str(REPO / "python"))
from onnxruntime_ep_mlu.fold import fold_affine  # noqa: E402

CIN, COUT, SITES = 4, 8, 300
SPATIAL = [6, 20, 20]


def _sites(rng) -> np.ndarray:
    cells = rng.choice(int(np.prod(SPATIAL)), SITES, replace=False)
    z, yx = np.divmod(cells, SPATIAL[1] * SPATIAL[2])
    y, x = np.divmod(yx, SPATIAL[2])
    return np.stack([np.zeros_like(z), z, y, x], 1).astype(np.int32)


def _model(tail, inits, *, bias=False, extra_outputs=(), extra_inputs=(), w_scale=0.3):
    """GetIndicePairs (subm 3x3x3) -> IndiceConv (output "y") -> `tail` nodes -> "out"."""
    rng = np.random.default_rng(7)
    rules = helper.make_node(
        "GetIndicePairs", ["coords"], ["pairs", "sites", "num"], domain="mluops", name="rules", batch_size=1,
        spatial_shape=SPATIAL, kernel_size=[3, 3, 3], stride=[1, 1, 1], padding=[1, 1, 1], dilation=[1, 1, 1], subm=1)
    ins = ["features", "w", "pairs", "num", "sites"] + (["b"] if bias else [])
    conv = helper.make_node("IndiceConv", ins, ["y"], domain="mluops", name="conv")
    weights = [numpy_helper.from_array((rng.standard_normal((27, CIN, COUT)) * w_scale).astype(np.float32), "w")]
    if bias:
        weights.append(numpy_helper.from_array(rng.uniform(-1, 1, COUT).astype(np.float32), "b"))
    all_inits = weights + [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in inits.items()]
    inputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, CIN]),
              helper.make_tensor_value_info("coords", TensorProto.INT32, [None, 4])] + list(extra_inputs)
    shapes = {"w": [27, CIN, COUT], "conv_folded_bias": [COUT]}
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes.get(n, [None, COUT])) for n in ("out", *extra_outputs)]
    graph = helper.make_graph([rules, conv, *tail], "fold", inputs, outputs, all_inits)
    return helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS])


def _run(model, feeds):
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library_path()))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds():
    rng = np.random.default_rng(11)
    return {"features": rng.standard_normal((SITES, CIN)).astype(np.float32), "coords": _sites(rng)}


def _ops(model):
    return [n.op_type for n in model.graph.node]


RNG = np.random.default_rng(3)
GAMMA, BETA = RNG.uniform(0.5, 1.5, COUT), RNG.uniform(-0.3, 0.3, COUT)
MEAN, VAR = RNG.uniform(-0.3, 0.3, COUT), RNG.uniform(0.5, 2.0, COUT)
SCALE, SHIFT = RNG.uniform(0.5, 1.5, COUT), RNG.uniform(-0.3, 0.3, COUT)

BN = ([helper.make_node("BatchNormalization", ["y", "g", "be", "m", "v"], ["bn"], epsilon=1e-3),
       helper.make_node("Relu", ["bn"], ["out"])], {"g": GAMMA, "be": BETA, "m": MEAN, "v": VAR})
# epsilon left at its default (1e-5), with a variance small enough for it to matter.
BN_DEFAULT = ([helper.make_node("BatchNormalization", ["y", "g", "be", "m", "v"], ["out"])],
              {"g": GAMMA, "be": BETA, "m": MEAN, "v": VAR * 1e-4})
MUL_ADD = ([helper.make_node("Mul", ["y", "s"], ["ms"]), helper.make_node("Add", ["t", "ms"], ["out"])],
           {"s": SCALE.reshape(1, COUT), "t": SHIFT})


@pytest.mark.parametrize("case, bias, folded", [
    (BN, False, 1),
    (BN, True, 1),
    (BN_DEFAULT, False, 1),
    (MUL_ADD, False, 2),        # the Mul, then the Add (its constant first) that now follows
    (MUL_ADD, True, 2),
    (([helper.make_node("Mul", ["y", "c"], ["out"])], {"c": np.float32(0.5)}), False, 1),  # one value
])
def test_folds_and_computes_the_same(case, bias, folded):
    tail, inits = case
    model = _model(tail, inits, bias=bias)
    before = model.SerializeToString()
    out = fold_affine(model)
    onnx.checker.check_model(out)
    assert model.SerializeToString() == before, "the input model is not modified"
    assert len(model.graph.node) - len(out.graph.node) == folded, _ops(out)
    assert "IndiceConv" in _ops(out) and not {"BatchNormalization", "Mul"} & set(_ops(out))
    conv = next(n for n in out.graph.node if n.op_type == "IndiceConv")
    assert len(conv.input) == 6 and conv.input[5], "the folded affine is IndiceConv's bias"
    feeds = _feeds()
    want, got = _run(model, feeds)[0], _run(out, feeds)[0]
    assert got.shape == want.shape
    diff1, diff2 = accumulating_metrics(got, want)
    assert diff1 <= 3e-6 and diff2 <= 3e-6, (diff1, diff2)
    # The folded node's constants are gone with it.
    assert {i.name for i in out.graph.initializer} == {"w", "b" if bias else conv.input[5]}


def _unfolded(model):
    out = fold_affine(model)
    assert out.SerializeToString() == model.SerializeToString()


def _branch(read: str):
    out = helper.make_tensor_value_info("r_out", TensorProto.FLOAT, [None, COUT])
    return helper.make_graph([helper.make_node("Identity", [read], ["r_out"])], "branch", [], [out])


def test_a_constant_shared_by_two_affines_stays_until_both_are_folded_and_names_never_clash():
    tail = [helper.make_node("Mul", ["y", "s"], ["out"]),
            helper.make_node("IndiceConv", ["features", "w2", "pairs", "num", "sites"], ["y2"], domain="mluops", name="conv2"),
            helper.make_node("Mul", ["s", "y2"], ["out2"]),
            helper.make_node("Identity", ["s"], ["conv_folded_bias"])]
    model = _model(tail, {"s": SCALE, "w2": np.full((27, CIN, COUT), 0.1)}, extra_outputs=["out2", "conv_folded_bias"])
    out = fold_affine(model)
    onnx.checker.check_model(out)
    assert _ops(out).count("Mul") == 0
    biases = sorted(n.input[5] for n in out.graph.node if n.op_type == "IndiceConv")
    assert biases == ["conv2_folded_bias", "conv_folded_bias_1"]
    # "s" is still read by the Identity.
    assert "s" in {i.name for i in out.graph.initializer}
    feeds = _feeds()
    for want, got in zip(_run(model, feeds), _run(out, feeds)):
        assert max(accumulating_metrics(got, want)) <= 3e-6


def test_leaves_what_is_not_a_per_channel_constant_affine():
    feeds_shape = helper.make_tensor_value_info("s", TensorProto.FLOAT, [COUT])
    cases = [
        # A constant that broadcasts over rows too, not per channel.
        _model([helper.make_node("Mul", ["y", "s"], ["out"])], {"s": np.ones((2, COUT))}),
        # A scale that is also a graph input (an initializer a run may override), not a constant.
        _model([helper.make_node("Mul", ["y", "s"], ["out"])], {"s": SCALE}, extra_inputs=[feeds_shape]),
        # IndiceConv's output also read by another node.
        _model([helper.make_node("Mul", ["y", "s"], ["out"]), helper.make_node("Relu", ["y"], ["r"])],
               {"s": SCALE}, extra_outputs=["r"]),
        # IndiceConv's output is a graph output.
        _model([helper.make_node("Mul", ["y", "s"], ["out"])], {"s": SCALE}, extra_outputs=["y"]),
        # Training-mode BatchNormalization.
        _model([helper.make_node("BatchNormalization", ["y", "g", "be", "m", "v"], ["out"], training_mode=1)],
               {"g": GAMMA, "be": BETA, "m": MEAN, "v": VAR}),
        # y * y is not an affine.
        _model([helper.make_node("Mul", ["y", "y"], ["out"])], {}),
        # A scale whose folded filters overflow float32.
        _model([helper.make_node("Mul", ["y", "s"], ["out"])], {"s": np.full(COUT, 1e10)}, w_scale=1e30),
        # A [Cout, 1] constant is not per channel.
        _model([helper.make_node("Mul", ["y", "s"], ["out"])], {"s": np.ones((COUT, 1))}),
        # A Mul of another domain.
        _model([helper.make_node("Mul", ["y", "s"], ["out"], domain="com.example")], {"s": SCALE}),
        # The filters are also a graph output: folding would change it.
        _model([helper.make_node("Mul", ["y", "s"], ["out"])], {"s": SCALE}, extra_outputs=["w"]),
        # The bias is shared with another IndiceConv.
        _model([helper.make_node("Mul", ["y", "s"], ["out"]),
                helper.make_node("IndiceConv", ["features", "w2", "pairs", "num", "sites", "b"], ["y2"], domain="mluops")],
               {"s": SCALE, "w2": np.ones((27, CIN, COUT))}, bias=True, extra_outputs=["y2"]),
        # y read inside an If branch too.
        _model([helper.make_node("Mul", ["y", "s"], ["out"]),
                helper.make_node("If", ["cond"], ["r"], then_branch=_branch("y"), else_branch=_branch("y"))],
               {"s": SCALE, "cond": np.array(True)}, extra_outputs=["r"]),
    ]
    for model in cases:
        _unfolded(model)
    # Filters shared with another IndiceConv: folding would change both.
    model = _model([helper.make_node("Mul", ["y", "s"], ["out"]),
                    helper.make_node("IndiceConv", ["features", "w", "pairs", "num", "sites"], ["y2"], domain="mluops")],
                   {"s": SCALE}, extra_outputs=["y2"])
    _unfolded(model)
