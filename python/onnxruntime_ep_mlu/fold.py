"""Fold the per-channel affine after an ``IndiceConv`` into its filters and bias.

ONNX Runtime fuses BatchNormalization into its own Conv, but a custom op is opaque to its
graph optimisations: after ``IndiceConv`` it runs BatchNormalization, or the Mul and Add a
hand-built graph may use for it, as separate nodes over every output row (what that costs
on CenterPoint's sparse backbone: docs/BENCHMARKS.md in the repository). :func:`fold_affine`
rewrites the graph instead, before the session is made::

    import onnx
    from onnxruntime_ep_mlu.fold import fold_affine

    model = fold_affine(onnx.load("model.onnx"))

or ``python -m onnxruntime_ep_mlu.fold in.onnx out.onnx``. It needs the ``onnx`` package
(the ``torch`` extra has it) and numpy.

A node is folded into the ``IndiceConv`` before it when that ``IndiceConv``'s output is
read by that node alone (no other node, no subgraph, not a graph output), its filters
``[K, Cin, Cout]`` (and bias ``[Cout]``, if any) are float32 initializers read by no other
node and not graph outputs, and the node is one of

- ``BatchNormalization`` in inference mode (one output) whose scale, B, mean and var are
  float32 initializers of shape ``[Cout]``: ``y * s + (B - mean * s)`` with
  ``s = scale / sqrt(var + epsilon)``;
- ``Mul`` by a float32 initializer of one value per output channel (shape ``[Cout]``,
  ``[1, Cout]``, or a single value), on either side: ``y * s``;
- ``Add`` of such an initializer: ``y + t``.

Initializers that are also graph inputs (a run may override them) are not constants here.
Filters become ``filters * s`` (per output channel) and the bias ``bias * s + t``
(``t`` alone when there was none), computed in float64 and stored as float32 (a fold whose values would overflow float32 is
not made), so the folded graph equals the original up to float32 rounding of the folded
values and of the convolution's sums (within the contract's accumulating class) for
finite values; a non-finite convolution output multiplied by 0 is the one case that
differs (NaN before, the folded value after), as with ONNX Runtime's own Conv +
BatchNormalization fusion. The folded node's constants are dropped unless read elsewhere.
Folding repeats until no node qualifies, so a Mul followed by an Add folds both.

:func:`fuse_epilogue` then moves what follows into the node's fused epilogue (the contract's
``residual`` input and ``activation`` attribute), so that on the card the activations stay
there: after an ``IndiceConv`` whose output is read by that node alone,

- a residual ``Add`` (either side) of a value the fuser can prove to have the node's rows and
  channels: a value computed from the output of an ``IndiceConv`` over the same sites (the
  same ``out_indices`` tensor, or one a submanifold ``GetIndicePairs`` made from it, which
  has its rows: so the same num_out) with constant filters of the same Cout,
  through nothing but ``Relu``, ``Identity``, an inference ``BatchNormalization`` or a
  per-channel constant ``Mul`` / ``Add`` (none of which changes the shape). Any other value
  (a graph input, say) may broadcast where the fused node would refuse it: left unfused;
- then a ``Relu``: ``activation = "relu"``.

Each is the unfused graph's float32 operation on the same value (docs/CONTRACT.md, §7): the
fused output is the unfused one bit for bit on the same path. A node that already has a
residual or an activation takes no further affine fold, and a residual only before the
activation. What is left unfused, and why, is reported (``notes``; the command line prints
it). ``python -m onnxruntime_ep_mlu.fold`` runs both.
"""

from __future__ import annotations

import sys
from collections import Counter

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"onnxruntime_ep_mlu.fold needs numpy and onnx ({e}); pip install onnx") from e

from . import DOMAIN

__all__ = ["fold_affine", "fuse_epilogue"]


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _per_channel(value: np.ndarray, cout: int) -> np.ndarray | None:
    """One float64 value per output channel from a constant broadcast against [rows, Cout],
    or None when it is not one (other shapes would broadcast over rows or change the shape)."""
    if value.shape in ((), (1,), (1, 1)):
        return np.full(cout, float(value.reshape(())), dtype=np.float64)
    if value.shape in ((cout,), (1, cout)):
        return value.reshape(cout).astype(np.float64)
    return None


def _affine(node, const, conv_out: str, cout: int):
    """(s, t) of `node` as y * s + t per channel, or None when it is not a foldable affine of
    `conv_out`; `const(name)` is the float32 initializer `name` as an array, or None."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "BatchNormalization":
        # Inference mode: one output (more, in any opset, means training statistics).
        if node.input[0] != conv_out or len(node.input) != 5 or not node.output[0] or any(node.output[1:]):
            return None
        if _attr(node, "training_mode", 0):
            return None
        params = [const(n) for n in node.input[1:]]
        if any(v is None or v.shape != (cout,) for v in params):
            return None
        scale, b, mean, var = (v.astype(np.float64) for v in params)
        s = scale / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))
        return s, b - mean * s
    if node.op_type in ("Mul", "Add") and len(node.input) == 2 and not node.attribute:
        # (The caller has checked that conv_out is read once, so `other` is the constant.)
        other = node.input[1] if node.input[0] == conv_out else node.input[0]
        v = const(other)
        v = None if v is None else _per_channel(v, cout)
        if v is None:
            return None
        return (v, np.zeros(cout)) if node.op_type == "Mul" else (np.ones(cout), v)
    return None


def _graphs(graph):
    """`graph` and every subgraph (If / Loop / Scan bodies) in it, recursively."""
    yield graph
    for n in graph.node:
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _graphs(g)


def _fold_once(graph) -> bool:
    # Initializers that are also graph inputs can be overridden at run time: not constants.
    overridable = {i.name for i in graph.input}
    protos = {i.name: i for i in graph.initializer if i.name not in overridable}
    arrays: dict[str, np.ndarray] = {}

    def const(name):
        if name not in protos or protos[name].data_type != onnx.TensorProto.FLOAT:
            return None
        if name not in arrays:
            arrays[name] = numpy_helper.to_array(protos[name])
        return arrays[name]

    # Reads of a value: node inputs here and in subgraphs (which may read outer values), and
    # graph outputs. A value read twice is never folded or rewritten.
    uses = Counter(name for g in _graphs(graph) for n in g.node for name in n.input if name)
    uses.update(o.name for o in graph.output)
    readers = {name: n for n in graph.node for name in n.input}
    for conv in graph.node:
        if conv.domain != DOMAIN or conv.op_type != "IndiceConv" or len(conv.output) != 1 or len(conv.input) < 5:
            continue
        if _has_epilogue(conv):
            continue  # an affine after the residual or the activation is not a filter fold
        y, filters = conv.output[0], conv.input[1]
        bias = conv.input[5] if len(conv.input) > 5 and conv.input[5] else None
        if uses[y] != 1 or y not in readers:
            continue
        w0 = const(filters) if uses[filters] == 1 else None
        if w0 is None or w0.ndim != 3:
            continue
        cout = w0.shape[2]
        b0 = None if bias is None else const(bias) if uses[bias] == 1 else None
        if bias is not None and (b0 is None or b0.shape != (cout,)):
            continue
        node = readers[y]
        st = _affine(node, const, y, cout)
        if st is None:
            continue
        s, t = st
        with np.errstate(over="ignore", invalid="ignore"):
            w = (w0.astype(np.float64) * s).astype(np.float32)
            b = (t if b0 is None else b0.astype(np.float64) * s + t).astype(np.float32)
        # A fold whose values overflow float32 would make finite outputs infinite.
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            continue
        b_name = bias or _fresh(graph, f"{conv.name or filters}_folded_bias")
        # The folded node's constants go too, unless something else reads them.
        gone = {name for name in node.input if name in protos and uses[name] == 1}
        inits = [i for i in graph.initializer if i.name not in gone | {filters, b_name}]
        inits += [numpy_helper.from_array(w, filters), numpy_helper.from_array(b, b_name)]
        del graph.initializer[:]
        graph.initializer.extend(inits)
        del conv.input[5:]
        conv.input.append(b_name)
        # The IndiceConv now writes the folded node's output; its own output name is gone.
        conv.output[0] = node.output[0]
        graph.node.remove(node)
        _forget_value_info(graph, y)
        return True
    return False


def _forget_value_info(graph, name: str) -> None:
    """Drops the shape record of ``name``, a tensor the fold removed from the graph."""
    info = [v for v in graph.value_info if v.name != name]
    del graph.value_info[:]
    graph.value_info.extend(info)


def _has_epilogue(conv) -> bool:
    """Whether the node has a scale, shift or residual input or an activation."""
    return any(conv.input[6:]) or _attr(conv, "activation", b"none") not in (b"none", "none")


def _sites(name: str, producers) -> str:
    """The sites tensor `name` (an out_indices) has the rows of: a submanifold
    GetIndicePairs' out_indices is its indices row for row (its schema), followed back."""
    seen = set()
    while name not in seen:
        seen.add(name)
        node = producers.get(name)
        if (node is None or node.domain != DOMAIN or node.op_type != "GetIndicePairs" or node.output[1:2] != [name]
                or _attr(node, "subm", 0) != 1 or not node.input):
            return name
        name = node.input[0]
    return name


def _rows_of(value: str, const, producers) -> tuple[str, int] | None:
    """(out_indices, Cout) of the IndiceConv whose output `value` is computed from through
    shape-keeping nodes only, or None when that cannot be shown."""
    affines, seen = [], set()
    while value not in seen:
        seen.add(value)
        node = producers.get(value)
        if node is None:
            return None
        if node.domain == DOMAIN and node.op_type == "IndiceConv" and len(node.input) >= 5:
            w = const(node.input[1])
            if w is None or w.ndim != 3:
                return None
            found = (_sites(node.input[4], producers), int(w.shape[2]))
            # Each affine keeps the shape when its constants are per channel of that Cout.
            ok = all(_affine(n, const, v, found[1]) is not None for n, v in affines)
            return found if ok else None
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            return None
        if node.op_type in ("Relu", "Identity"):
            value = node.input[0]
        elif node.op_type in ("BatchNormalization", "Mul", "Add"):
            ins = [n for n in node.input if n]
            inner = [n for n in (ins[:1] if node.op_type == "BatchNormalization" else ins) if const(n) is None]
            if len(inner) != 1:
                return None
            affines.append((node, inner[0]))
            value = inner[0]
        else:
            return None
    return None


def _fuse_once(graph, notes: list[str]) -> bool:
    overridable = {i.name for i in graph.input}
    protos = {i.name: i for i in graph.initializer if i.name not in overridable}

    def const(name):
        if name not in protos or protos[name].data_type != onnx.TensorProto.FLOAT:
            return None
        return numpy_helper.to_array(protos[name])

    uses = Counter(name for g in _graphs(graph) for n in g.node for name in n.input if name)
    uses.update(o.name for o in graph.output)
    readers = {name: n for n in graph.node for name in n.input}
    producers = {o: n for n in graph.node for o in n.output}
    for conv in list(graph.node):
        if conv.domain != DOMAIN or conv.op_type != "IndiceConv" or len(conv.output) != 1 or len(conv.input) < 5:
            continue
        y = conv.output[0]
        if uses[y] != 1 or y not in readers:
            continue
        node = readers[y]
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        relu = _attr(conv, "activation", b"none") not in (b"none", "none")
        where = f"IndiceConv '{conv.name or y}'"
        if node.op_type == "Relu" and not relu and list(node.input) == [y]:
            pass
        elif node.op_type == "Add" and len(node.input) == 2 and node.input[0] != node.input[1]:
            other = node.input[1] if node.input[0] == y else node.input[0]
            if const(other) is not None:
                continue  # a constant: fold_affine's, not a residual
            if relu or any(conv.input[8:9]):
                notes.append(f"{where}: Add '{node.name}' left unfused: the node already has "
                             f"{'its activation' if relu else 'a residual'} (the residual comes before it)")
                continue
            w = const(conv.input[1])
            mine = (_sites(conv.input[4], producers), int(w.shape[2])) if w is not None and w.ndim == 3 else None
            theirs = _rows_of(other, const, producers)
            if mine is None or theirs != mine:
                notes.append(f"{where}: Add '{node.name}' left unfused: '{other}' is not shown to have the "
                             "node's rows and channels (the output of an IndiceConv over the same sites "
                             "with the same Cout, through shape-keeping nodes), and Add would broadcast where "
                             "the fused node refuses")
                continue
            while len(conv.input) < 8:
                conv.input.append("")
            conv.input.append(other)
        else:
            continue
        if node.op_type == "Relu":
            keep = [a for a in conv.attribute if a.name != "activation"]
            del conv.attribute[:]
            conv.attribute.extend(keep + [onnx.helper.make_attribute("activation", "relu")])
        # The node now writes the fused node's output, at its place (after the residual).
        conv.output[0] = node.output[0]
        at = list(graph.node).index(node)
        graph.node.remove(conv)
        graph.node.insert(at - 1, conv)
        graph.node.remove(node)
        _forget_value_info(graph, y)
        return True
    return False


def fuse_epilogue(model: onnx.ModelProto, notes: list[str] | None = None) -> onnx.ModelProto:
    """A copy of `model` with each residual Add and Relu after an ``IndiceConv`` that can be
    shown equal moved into its fused epilogue (module docstring); what is left, and why, is
    appended to `notes`. Run it after :func:`fold_affine` (a residual blocks later folds)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    notes = [] if notes is None else notes
    while _fuse_once(out.graph, notes):
        pass
    return out


def _fresh(graph, base: str) -> str:
    """`base`, or `base_N`, a name no value, initializer or node of the model uses."""
    taken: set[str] = set()
    for g in _graphs(graph):
        taken |= {i.name for i in g.initializer} | {i.values.name for i in g.sparse_initializer}
        taken |= {v.name for v in g.value_info} | {i.name for i in g.input} | {o.name for o in g.output}
        taken |= {name for n in g.node for name in list(n.input) + list(n.output)}
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def fold_affine(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every foldable per-channel affine after an ``IndiceConv``
    folded into it (module docstring); the model's inputs and outputs are unchanged."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    while _fold_once(out.graph):
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m onnxruntime_ep_mlu.fold IN.onnx OUT.onnx", file=sys.stderr)
        return 2
    before = onnx.load(args[0])
    notes: list[str] = []
    after = fuse_epilogue(fold_affine(before), notes)
    onnx.save(after, args[1])
    for note in dict.fromkeys(notes):
        print(note)
    print(f"{args[0]}: {len(before.graph.node) - len(after.graph.node)} nodes folded or fused into IndiceConv -> {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
