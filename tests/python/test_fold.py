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
from onnxruntime_ep_mlu.fold import fold_affine, fuse_epilogue  # noqa: E402

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


# ----------------------------------------------------------------------------- fuse_epilogue


def _block(extra_inputs=(), tail=None):
    """conv (features -> y, then Relu -> x1), conv2 over the same rulebook (x1 -> y2),
    BatchNormalization, Add(identity x1), Relu -> "out": spconv's SparseBasicBlock after a
    first submanifold layer; `tail` replaces the nodes after conv2."""
    rng = np.random.default_rng(5)
    head = [helper.make_node("Relu", ["y"], ["x1"]),
            helper.make_node("IndiceConv", ["x1", "w2", "pairs", "num", "sites"], ["y2"], domain="mluops",
                             name="conv2")]
    tail = tail if tail is not None else [
        helper.make_node("BatchNormalization", ["y2", "g", "be", "m", "v"], ["bn"]),
        helper.make_node("Add", ["bn", "x1"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["out"])]
    inits = {"w2": rng.standard_normal((27, COUT, COUT)) * 0.2, "g": GAMMA, "be": BETA, "m": MEAN, "v": VAR}
    return _model(head + tail, inits, bias=True, extra_inputs=extra_inputs)


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_fuses_relu_and_a_residual_block_bit_for_bit_with_the_folded_graph():
    model = _block()
    folded = fold_affine(model)
    notes: list[str] = []
    fused = fuse_epilogue(folded, notes)
    onnx.checker.check_model(fused)
    assert _ops(fused) == ["GetIndicePairs", "IndiceConv", "IndiceConv"], _ops(fused)
    assert notes == []
    conv, conv2 = fused.graph.node[1:]
    assert _attrs(conv).get("activation") == b"relu" and list(conv.output) == ["x1"]
    # conv2: bias (the folded BatchNorm), no scale or shift, residual x1, then ReLU.
    assert list(conv2.input[5:]) == ["conv2_folded_bias", "", "", "x1"] and _attrs(conv2)["activation"] == b"relu"
    feeds = _feeds()
    want, got, original = _run(folded, feeds)[0], _run(fused, feeds)[0], _run(model, feeds)[0]
    assert got.tobytes() == want.tobytes(), "the fused epilogue is the unfused graph's float32 steps"
    assert (got == 0).mean() > 0.2, "ReLU clamps some outputs"
    assert max(accumulating_metrics(got, original)) <= 3e-6


def test_leaves_a_residual_it_cannot_show_to_have_the_rows_and_says_why():
    # A graph input of [N, Cout] rows may broadcast (N = 1) where the fused node would refuse.
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, [None, COUT])
    model = _model([helper.make_node("Add", ["y", "r"], ["sum"]), helper.make_node("Relu", ["sum"], ["out"])], {},
                   extra_inputs=[r])
    notes: list[str] = []
    fused = fuse_epilogue(model, notes)
    assert _ops(fused) == ["GetIndicePairs", "IndiceConv", "Add", "Relu"]
    assert len(notes) == 1 and "Add" in notes[0] and "'r'" in notes[0] and "broadcast" in notes[0], notes
    # Over a regular (not submanifold) rulebook's sites: the fuser cannot know their count
    # (here, kernel 1 over unique sites, it is the same; the graph still runs as it was).
    rules2 = helper.make_node(
        "GetIndicePairs", ["coords"], ["pairs2", "sites2", "num2"], domain="mluops", name="rules2", batch_size=1,
        spatial_shape=SPATIAL, kernel_size=[1, 1, 1], stride=[1, 1, 1], padding=[0, 0, 0], dilation=[1, 1, 1], subm=0)
    other = helper.make_node("IndiceConv", ["x1", "w3", "pairs2", "num2", "sites2"], ["y2"], domain="mluops",
                             name="conv2")
    model = _block(tail=[helper.make_node("Add", ["x1", "y2"], ["out"])])
    model.graph.node.insert(0, rules2)
    model.graph.node.remove(next(n for n in model.graph.node if n.name == "conv2"))
    model.graph.node.insert(len(model.graph.node) - 1, other)
    w3 = np.random.default_rng(6).standard_normal((1, COUT, COUT)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w3, "w3"))
    notes = []
    fused = fuse_epilogue(model, notes)
    assert _ops(fused)[-1] == "Add" and any("'x1'" in n for n in notes), (notes, _ops(fused))
    feeds = _feeds()
    assert _run(fused, feeds)[0].tobytes() == _run(model, feeds)[0].tobytes()


def test_a_residual_after_the_activation_and_a_fold_after_the_epilogue_are_left():
    feeds = _feeds()
    # Relu, then Add: the residual would come after the activation, against the contract's order.
    model = _block(tail=[helper.make_node("Relu", ["y2"], ["a"]), helper.make_node("Add", ["a", "x1"], ["out"])])
    notes: list[str] = []
    fused = fold_affine(fuse_epilogue(model, notes))
    assert _ops(fused) == ["GetIndicePairs", "IndiceConv", "IndiceConv", "Add"], _ops(fused)
    assert any("already has its activation" in n for n in notes), notes
    assert _run(fused, feeds)[0].tobytes() == _run(model, feeds)[0].tobytes()
    # Relu, then a Mul by a constant of both signs: once the Relu is in the node, the Mul is
    # no filter fold (relu(y) * s is not relu(y * s)).
    model = _block(tail=[helper.make_node("Relu", ["y2"], ["a"]), helper.make_node("Mul", ["a", "s"], ["out"])])
    model.graph.initializer.append(numpy_helper.from_array((SCALE - 1.0).astype(np.float32), "s"))
    fused = fold_affine(fuse_epilogue(model))
    assert _ops(fused) == ["GetIndicePairs", "IndiceConv", "IndiceConv", "Mul"], _ops(fused)
    assert _run(fused, feeds)[0].tobytes() == _run(model, feeds)[0].tobytes()


def test_the_command_line_folds_fuses_and_reports(tmp_path, capsys):
    from onnxruntime_ep_mlu.fold import main
    onnx.save(_block(), tmp_path / "in.onnx")
    assert main([str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")]) == 0
    assert _ops(onnx.load(tmp_path / "out.onnx")) == ["GetIndicePairs", "IndiceConv", "IndiceConv"]
    assert "4 nodes folded or fused" in capsys.readouterr().out
