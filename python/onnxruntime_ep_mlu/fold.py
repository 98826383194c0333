"""Fold the per-channel affine after an ``IndiceConv`` into its filters and bias.

ONNX Runtime fuses BatchNormalization into its own Conv, but a custom op is opaque to its
graph optimisations: after ``IndiceConv`` it runs BatchNormalization, or the Mul and Add an
exporter may emit for it, as separate nodes over every output row (on CenterPoint's sparse
backbone, some 5-13% of the time at one thread). :func:`fold_affine` rewrites the graph
instead, before the session is made::

    import onnx
    from onnxruntime_ep_mlu.fold import fold_affine

    model = fold_affine(onnx.load("model.onnx"))

or ``python -m onnxruntime_ep_mlu.fold in.onnx out.onnx``. It needs the ``onnx`` package
(the ``torch`` extra has it) and numpy.

A node is folded into the ``IndiceConv`` before it when that ``IndiceConv``'s output feeds
only that node (and is not a graph output), its filters (and bias, if any) are
initializers used by no other node, and the node is one of

- ``BatchNormalization`` in inference mode (one output) with initializer scale, B, mean
  and var: ``y * s + (B - mean * s)`` with ``s = scale / sqrt(var + epsilon)``;
- ``Mul`` by an initializer of one value per output channel (shape ``[Cout]``, ``[1, Cout]``,
  or a single value): ``y * s``;
- ``Add`` of such an initializer: ``y + t``.

Filters become ``filters * s`` (per output channel) and the bias ``bias * s + t``
(``t`` alone when there was none), computed in float64 and stored as float32, so the folded
graph equals the original up to float32 rounding of the folded values and of the
convolution's sums (within the contract's accumulating class) for finite values; a
non-finite convolution output multiplied by 0 is the one case that differs (NaN before,
the folded value after), as with ONNX Runtime's own Conv + BatchNormalization fusion.
Folding repeats until no node qualifies, so a Mul followed by an Add folds both.
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

DOMAIN = "mluops"
__all__ = ["fold_affine"]


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


def _affine(node, inits: dict, conv_out: str, cout: int):
    """(s, t) of `node` as y * s + t per channel, or None when it is not a foldable affine of
    `conv_out`."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "BatchNormalization":
        outputs = [o for o in node.output if o]
        if node.input[0] != conv_out or len(node.input) != 5 or len(outputs) != 1 or _attr(node, "training_mode", 0):
            return None
        params = [inits.get(n) for n in node.input[1:]]
        if any(v is None or v.shape != (cout,) or v.dtype != np.float32 for v in params):
            return None
        scale, b, mean, var = (v.astype(np.float64) for v in params)
        s = scale / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))
        return s, b - mean * s
    if node.op_type in ("Mul", "Add") and len(node.input) == 2 and conv_out in node.input:
        other = node.input[1] if node.input[0] == conv_out else node.input[0]
        if other == conv_out or other not in inits or inits[other].dtype != np.float32:
            return None
        v = _per_channel(inits[other], cout)
        if v is None:
            return None
        return (v, np.zeros(cout)) if node.op_type == "Mul" else (np.ones(cout), v)
    return None


def _subgraph_names(nodes) -> set[str]:
    """Every name read inside the subgraphs (If / Loop / Scan bodies) of `nodes`: values of
    the outer graph may be read there without being a node input here."""
    names: set[str] = set()
    for n in nodes:
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                names |= {name for m in g.node for name in m.input} | _subgraph_names(g.node)
    return names


def _fold_once(graph) -> bool:
    # Initializers that are also graph inputs can be overridden at run time: not constants.
    overridable = {i.name for i in graph.input}
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name not in overridable}
    uses = Counter(name for n in graph.node for name in n.input if name)
    uses.update(_subgraph_names(graph.node))
    graph_outputs = {o.name for o in graph.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for name in set(n.input):
            consumers.setdefault(name, []).append(n)
    for conv in graph.node:
        if conv.domain != DOMAIN or conv.op_type != "IndiceConv" or len(conv.output) != 1:
            continue
        y = conv.output[0]
        filters = conv.input[1]
        bias = conv.input[5] if len(conv.input) > 5 and conv.input[5] else None
        if y in graph_outputs or len(consumers.get(y, [])) != 1 or uses[y] != 1:
            continue
        if filters not in inits or uses[filters] != 1 or inits[filters].ndim != 3 or inits[filters].dtype != np.float32:
            continue
        cout = inits[filters].shape[2]
        if bias is not None and (bias not in inits or uses[bias] != 1 or inits[bias].shape != (cout,)):
            continue
        node = consumers[y][0]
        st = _affine(node, inits, y, cout)
        if st is None:
            continue
        s, t = st
        w = (inits[filters].astype(np.float64) * s).astype(np.float32)
        b = (t if bias is None else inits[bias].astype(np.float64) * s + t).astype(np.float32)
        b_name = bias or _fresh(graph, f"{conv.name or filters}_folded_bias")
        kept = [i for i in graph.initializer if i.name not in (filters, b_name)]
        del graph.initializer[:]
        graph.initializer.extend(kept + [numpy_helper.from_array(w, filters), numpy_helper.from_array(b, b_name)])
        ins = list(conv.input) + [""] * (6 - len(conv.input))
        ins[5] = b_name
        del conv.input[:]
        conv.input.extend(ins)
        # The IndiceConv now writes the folded node's output; its own output name is gone.
        conv.output[0] = next(o for o in node.output if o)
        graph.node.remove(node)
        # The folded node's constants, unless something else reads them.
        still = {name for n in graph.node for name in n.input} | _subgraph_names(graph.node) | overridable
        gone = {name for name in node.input if name in inits and name not in still}
        kept = [i for i in graph.initializer if i.name not in gone]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        kept_info = [v for v in graph.value_info if v.name != y]
        del graph.value_info[:]
        graph.value_info.extend(kept_info)
        return True
    return False


def _fresh(graph, base: str) -> str:
    taken = {i.name for i in graph.initializer} | {i.name for i in graph.input}
    taken |= {name for n in graph.node for name in list(n.input) + list(n.output)}
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
    after = fold_affine(before)
    onnx.save(after, args[1])
    print(f"{args[0]}: {len(before.graph.node) - len(after.graph.node)} nodes folded into IndiceConv -> {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
