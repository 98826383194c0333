"""What the network runner (networks/run.py) needs from every network: the case a network
module builds, the export, the sessions of both paths, the comparison and the timing."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import onnxruntime_ep_mlu as mlu
from onnxruntime_ep_mlu import placement as placement_report
from onnxruntime_ep_mlu import torch as mlu_torch
from onnxruntime_ep_mlu.regression import compare as compare_output

SCALES = ("ci", "full")


def mlu_ops(library: str) -> frozenset[str]:
    """The op types ``library``'s BANG backend runs (its registry): the nodes a network must
    place on the card with the provider's defaults (the forward partners run on ONNX Runtime's
    CPU provider inside the EP session, except ThreeInterpolate and PsRoiPool on MLU-OPS)."""
    return frozenset(row["op"] for row in mlu.operators(library) if "bang" in row["backends"])


def mlu_rows(library: str) -> tuple[str, ...]:
    """The MLU rows of networks/run.py: the provider's defaults (auto without an MLU-OPS
    library: the BANG kernels), then each mlu_backend with the MLU-OPS library: every backend
    of ``library``'s table (in auto's order), then auto."""
    return ("MLU", *mlu.backends(library), "auto")

#: Why a graph whose only mluops nodes are DynamicScatter puts nothing on the card with
#: mlu_backend=mluops (the other rows run it on the BANG kernels).
DYNAMIC_SCATTER_OFF_CARD = {
    "mluops": "its mluops nodes are DynamicScatter, which runs on the BANG kernels only (docs/CONTRACT.md §1.7)"
}


def mluops_only(op: str) -> dict[str, str]:
    """Graph.off_card of a graph whose only mluops node is ``op``, a forward partner that
    runs on the MLU-OPS backend only (docs/CONTRACT.md §1.7): nothing on the card in the rows
    without MLU-OPS."""
    why = f"{op} runs on MLU-OPS only (docs/CONTRACT.md §1.7)"
    return {"MLU": why + "; the default session has no MLU-OPS library", "bang": why}


@dataclass
class Graph:
    """One exported graph of a network (its inference, or its training gradient), the inputs
    it runs on, and its peer: the eager PyTorch computation users run today on the same
    inputs and weights. ``peer(threads)`` returns the outputs named like the graph's;
    ``canonical`` maps an output name to a function applied to both sides before comparing
    (sets of sparse coordinates, say); ``peer_threads`` lists the torch thread counts the
    peer may be timed at."""

    name: str
    model: bytes
    feeds: dict[str, np.ndarray]
    peer: Callable[[int], dict[str, np.ndarray]]
    peer_name: str
    canonical: dict[str, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)
    peer_threads: tuple[int, ...] = (1, 2)
    note: str = ""
    #: MLU row (MLU, bang, mluops, auto) -> why no node of this graph runs on the card there
    #: (a row without one must run nodes on the card)
    off_card: dict[str, str] = field(default_factory=dict)
    #: MLU row -> (CPU fallbacks, run-time declines, why) the row must show, for a graph whose
    #: inputs a card backend refuses at run time (a row not named here must show none)
    run_time: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    #: output name -> tolerance (regression.compare's), for an output the default does not fit
    tolerances: dict[str, dict] = field(default_factory=dict)


@dataclass
class Case:
    network: str
    config: str
    graphs: list[Graph]


def export(module: torch.nn.Module, args: tuple, input_names, output_names, dynamic_axes=None) -> bytes:
    """The module exported as a user would, through the package's autograd Functions
    (torch.onnx.export's TorchScript exporter, opset 17 and the mluops opset)."""
    buf = io.BytesIO()
    module.eval()
    with torch.no_grad():
        mlu_torch.export(
            module, args, buf, input_names=list(input_names), output_names=list(output_names),
            dynamic_axes=dynamic_axes or {},
        )
    return buf.getvalue()


def cpu_session(model: bytes, threads: int, library: str):
    import onnxruntime as ort

    so = mlu.session_options(library=library)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Idle pool threads sleep rather than spin, so that they do not take a core from the
    # peer timed next.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def mlu_session(model: bytes, library: str, provider_options: dict | None = None):
    """A session under the MLUExecutionProvider on the emulated card (no MLU hardware is
    reachable here), recording which provider runs each node; `provider_options` go to the
    EP (`mlu_backend`, `mluops_library`)."""
    import onnxruntime as ort

    so = mlu.session_options(with_ep=True, record_assignment=True, emulate=True, library=library,
                             provider_options=provider_options)
    so.intra_op_num_threads = 1
    # Warnings kept: the run-time fallback's is one (placement.ort_warnings counts them).
    so.log_severity_level = 2
    return ort.InferenceSession(model, so)


def mlu_run(model: bytes, library: str, feeds: dict, provider_options: dict | None = None, runs: int = 1):
    """``runs`` inferences in a new MLU session (mlu_session) with the provider's traffic
    report and ONNX Runtime's warnings captured (onnxruntime_ep_mlu.placement): (the last
    run's outputs by name, the first run's seconds, placement(), the report's counts with the
    warnings', its session line, the session's node assignment). The session ends before this
    returns: its end writes the session line."""
    import gc

    with placement_report.traffic_report() as report, placement_report.ort_warnings() as warned:
        sess = mlu_session(model, library, provider_options)
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        seconds = time.perf_counter() - t0
        for _ in range(runs - 1):
            outs = sess.run(None, feeds)
        out = dict(zip([o.name for o in sess.get_outputs()], outs))
        placed = placement(model, sess, library)
        where = mlu.node_assignment(sess)
        del sess
        gc.collect()
        lines = placement_report.read_report(report)
    sessions = [x for x in lines if "session" in x]
    if len(sessions) != 1:
        raise RuntimeError(f"expected one session line in the traffic report, got {len(sessions)}")
    return out, seconds, placed, placement_report.counts(lines, warned, library), sessions[0], where


def placement(model: bytes, sess, library: str) -> tuple[int, int, int, list[str]]:
    """(nodes on the MLU, nodes that must be there, nodes ONNX Runtime assigned to any
    provider, the mluops nodes it kept on CPU that ``library``'s EP has BANG kernels for)."""
    import onnx

    graph = onnx.load_from_string(model).graph
    bang_ops = mlu_ops(library)  # loads the library and reads its registry: once, not per node
    want = {n.name: n.op_type for n in graph.node if n.domain == mlu.DOMAIN and n.op_type in bang_ops}
    where = mlu.node_assignment(sess)
    on = [n for n, ep in where.items() if ep == mlu.EP_NAME]
    missed = sorted(f"{want[n]} {n}" for n in want if where.get(n) != mlu.EP_NAME)
    return len(on), len(want), len(where), missed


@dataclass
class Crossings:
    """What one inference must move between host and card given where ONNX Runtime put the
    nodes (card_boundary): ``to_card``, the tensors made on the host (graph inputs, CPU
    nodes' outputs) that a card node reads; ``back``, the tensors a card node makes that a
    CPU node or the graph's outputs read; ``weights``, the initializers and Constant outputs a
    card node reads, which a session copies once. Each a list of (tensor, producer op,
    consumer ops, bytes) in one inference on the graph's feeds."""

    to_card: list[tuple[str, str, str, int]]
    back: list[tuple[str, str, str, int]]
    weights: list[tuple[str, str, str, int]]

    @property
    def minimum(self) -> int:
        """The card segment's inputs plus outputs, per inference (the weights apart)."""
        return sum(b for *_, b in self.to_card + self.back)


def optimized_graph(model: bytes, library: str) -> bytes:
    """The graph ONNX Runtime runs: ``model`` after its optimizations at its default level,
    the MLU sessions' (saved by a CPU session; the mluops nodes keep their names). The
    boundary is found on it because the level's rewrites move it: a Cast to the type its input
    already has is removed, so CenterPoint's GetIndicePairs reads DynamicScatter's coordinates
    on the card, where the exported graph has them cross twice."""
    import tempfile
    from pathlib import Path

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "optimized.onnx"
        so = mlu.session_options(library=library)
        so.optimized_model_filepath = str(path)
        so.log_severity_level = 3  # the NCHWc transformer's "hardware specific" warning
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        return path.read_bytes()


def card_boundary(model: bytes, where: dict[str, str], feeds: dict, library: str) -> Crossings:
    """The tensors that cross between the card and the host in one inference of ``model``
    when the nodes named in ``where`` (mlu.node_assignment) with the MLUExecutionProvider
    run on the card and every other node on the host (a node ONNX Runtime fused or renamed
    is not on the card: only mluops nodes are claimed), in the graph ONNX Runtime runs
    (optimized_graph). Sizes are measured: the boundary tensors made graph outputs of a CPU
    session on ``feeds``. Any operator the provider claims counts alike, so a node newly
    placed on the card changes the figures by itself."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load_from_string(optimized_graph(model, library))
    graph = m.graph
    card = {n.name for n in graph.node if where.get(n.name) == mlu.EP_NAME}
    producer = {o: n for n in graph.node for o in n.output if o}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            if i:
                consumers.setdefault(i, []).append(n)
    stored = {t.name: t for t in graph.initializer}
    constants = {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    outputs = {o.name for o in graph.output}
    to_card, back, weights = [], [], []
    for name, users in consumers.items():
        made = producer.get(name)
        on_card = made is not None and made.name in card
        read_on_card = sorted({u.op_type for u in users if u.name in card})
        read_on_host = sorted({u.op_type for u in users if u.name not in card})
        what = made.op_type if made is not None else ("initializer" if name in stored else "graph input")
        if name in stored or name in constants:
            if read_on_card:
                weights.append((name, what, ", ".join(read_on_card), -1))
        elif not on_card and read_on_card:
            to_card.append((name, what, ", ".join(read_on_card), -1))
        elif on_card and (read_on_host or name in outputs):
            back.append((name, what, ", ".join(read_on_host + (["graph output"] if name in outputs else [])), -1))
    for n in graph.node:
        if n.name in card:
            back += [(o, n.op_type, "graph output", -1) for o in n.output if o in outputs and o not in consumers]
    measured = [t[0] for t in to_card + back + weights if t[0] not in stored and t[0] not in feeds]
    extra = [o for o in dict.fromkeys(measured) if o not in outputs]
    graph.output.extend(onnx.ValueInfoProto(name=o) for o in extra)
    sess = cpu_session(m.SerializeToString(), 1, library)
    fetch = [o.name for o in sess.get_outputs() if o.name in measured]
    values = dict(zip(fetch, sess.run(fetch, feeds))) if fetch else {}

    def size(name: str) -> int:
        if name in stored:
            return int(numpy_helper.to_array(stored[name]).nbytes)
        if name in feeds:
            return int(np.asarray(feeds[name]).nbytes)
        return int(np.asarray(values[name]).nbytes)

    sized = [[(n, p, c, size(n)) for n, p, c, _ in part] for part in (to_card, back, weights)]
    return Crossings(*sized)


def compare(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], canonical, tolerances=None) -> tuple[float, str]:
    """The worst output (error / its tolerance: ``tolerances[name]`` when given, else exact for
    integers and for floats regression.DEFAULT_FLOAT: diff1, diff2 <= 3e-3 and per element
    max |a-b| <= 3e-5 * max|peer|) and its description."""
    worst, what = 0.0, "no output"
    for name, r in ref.items():
        a = ours[name]
        f = canonical.get(name)
        if f is not None:
            a, r = f(a), f(r)
        ratio, text = compare_output(np.asarray(a), np.asarray(r), (tolerances or {}).get(name))
        if ratio >= worst:
            worst, what = ratio, f"{name}: {text}"
    return worst, what


def interleaved(fns: dict, repeat: int, cpu: dict | None = None):
    """One warm-up call of each, then ``repeat`` rounds calling each once in turn (so that a
    noisy neighbour slows all alike): the best wall time of each (seconds) and its last
    result. ``cpu``, when given, receives the process's CPU time / wall time of each best run
    (about the number of busy threads)."""
    results = {k: f() for k, f in fns.items()}
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            results[k] = f()
            wall = time.perf_counter() - t0
            if wall < best[k]:
                best[k] = wall
                if cpu is not None:
                    cpu[k] = (time.process_time() - c0) / wall
    return best, results


def tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def numpy_out(x: torch.Tensor) -> np.ndarray:
    return x.detach().contiguous().numpy()


class Voxelizer(torch.nn.Module):
    """Points [N, >= 3] to their voxel sites (batch 0, z, y, x) int32, floor((p - lower) /
    voxel) as mmdet3d's dynamic voxelisation, a -1 row for a point outside ``pc_range``
    (x0, y0, z0, x1, y1, z1); ``grid`` is (nx, ny, nz)."""

    def __init__(self, pc_range, voxel):
        super().__init__()
        lo, hi, size = torch.tensor(pc_range[:3]), torch.tensor(pc_range[3:]), torch.tensor(voxel)
        self.grid = [int(round(float(v))) for v in (hi - lo) / size]
        self.register_buffer("lo", lo)
        self.register_buffer("size", size)
        self.register_buffer("cells", torch.tensor(self.grid, dtype=torch.int32))

    def forward(self, points):
        c = torch.floor((points[:, :3] - self.lo) / self.size).to(torch.int32)
        inside = ((c >= 0) & (c < self.cells)).all(dim=1, keepdim=True)
        zyx = torch.cat([torch.zeros_like(c[:, :1]), c[:, 2:3], c[:, 1:2], c[:, 0:1]], dim=1)
        return torch.where(inside, zyx, torch.full_like(zyx, -1))


def seed_batchnorms(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Gives every BatchNorm of ``module`` seeded running statistics and affine weights (a
    freshly built one is the identity in eval mode) and puts it in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                m.running_mean.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
    return module.eval()
