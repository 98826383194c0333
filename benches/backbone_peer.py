#!/usr/bin/env python3
"""Peer benchmark: the CenterPoint sparse 3D backbone on onnxruntime's CPU path (our
GetIndicePairs + IndiceConv + affine/ReLU as one ONNX graph) against spconv 2.3.8 eager on CPU.

The backbone is CenterPoint's nuScenes SpMiddleResNetFHD: SubMConv3d 5 -> 16 and two
SparseBasicBlocks of 16 channels over 41 x 1440 x 1440, then three stages that each open with
a strided SparseConv3d (16 -> 32, 32 -> 64, 64 -> 128; 3x3x3, stride 2) followed by two
SparseBasicBlocks, and a last SparseConv3d 128 -> 128 (3x1x1, stride (2, 1, 1)): 21
convolutions over 8 rulebooks (submanifold ones shared by indice_key). Every convolution is
followed by BatchNorm (eval) and ReLU, the blocks by their residual addition. spconv runs on
CPU without a convolution bias (its CPU path has none), so neither side has one.

Input: a simulated 32-beam scan (nuScenes' lidar: 32 beams from -30.67 to +10.67 degrees,
1.39M points/s at 20 Hz, 70 m range; 10 sweeps with the ego moving 0.5 m between them) of a
street scene of boxes (road, cars, pedestrians, building fronts, trees, poles), voxelized at
CenterPoint's 0.075 x 0.075 x 0.2 m grid: 104,968 voxels at the default seed. A synthetic
stand-in, not real lidar. `--sites lidar` uses spconv_peer.py's clustered sites instead.

In one run, with spconv's reference at 1 torch thread (its CPU path is wrong on 2), ours
at 1 and 2 onnxruntime intra-op threads:
- per layer: each rulebook (GetIndicePairs node vs spconv's get_indice_pairs) and each
  convolution alone (an IndiceConv node vs spconv.pytorch.ops.indice_conv on the same
  rulebook, which is what SubMConv3d / SparseConv3d call);
- the whole backbone: our ONNX graph in one session.run (BatchNorm as Mul + Add nodes, as
  BatchNormalization nodes, and folded into IndiceConv's filters and bias) against
  spconv's modules (SubMConv3d / SparseConv3d + BatchNorm1d(eval) + ReLU) on a fresh
  SparseConvTensor;
- the checks: output coordinates identical (as sets of (batch, z, y, x), both orders
  compared after sorting) and features within the contract's accumulating class
  (diff1, diff2 <= 3e-3 against spconv's) for every layer and the whole backbone; ours at
  1 and 2 threads bit-identical; fold_affine folding every Mul and Add, and every
  BatchNormalization. Any failure exits non-zero. Speed ratios are only reported.
- where our time goes: onnxruntime's profile of the whole graph (per op type), and whether
  its graph optimisations fold the per-channel Mul/Add into IndiceConv (the optimized model
  is saved and inspected).

    cargo build --release --lib
    "$VENV/bin/pip" install --no-deps -r scripts/requirements-peers.txt   # spconv 2.3.8 (torch: scripts/setup.sh --test)
    "$VENV/bin/python" benches/backbone_peer.py            # --repeat N, --seed S, --sites

The library is $MLU_EP_LIB, else target/release/libonnxruntime_ep_mlu.so.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
HINT = ('install the bench requirements into the project venv: "$VENV/bin/pip" install --no-deps -r '
        'scripts/requirements-peers.txt (or run scripts/setup.sh --test), then run "$VENV/bin/python" benches/backbone_peer.py')

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:
    sys.exit(f"backbone_peer: {e}; run it with the project venv's python.\n{HINT}")
try:
    import torch
    import spconv
    import spconv.pytorch as spt
    from spconv.pytorch import ops as spops
    from spconv.core import ConvAlgo
except ImportError as e:
    sys.exit(f"backbone_peer: spconv or torch is not installed ({e});\n{HINT}")
# After the guarded imports: networks.common needs torch and the package.
from networks.common import interleaved  # noqa: E402
from networks.lidar import centerpoint_sites, scan_points  # noqa: E402 (the simulated scan)
from onnxruntime_ep_mlu.fold import fold_affine  # noqa: E402 (this checkout's package: networks/__init__.py puts it on the path)
from onnxruntime_ep_mlu.regression import (  # noqa: E402 (the judges of every runner)
    DEFAULT_FLOAT,
    accumulating_metrics,
    element_ratio,
    elementwise_errors,
)
from onnxruntime_ep_mlu.regression import compare as judge  # noqa: E402

SEED = 20241124
#: The whole-backbone graphs timed: BatchNorm as separate Mul and Add nodes, as one
#: BatchNormalization node, and folded into IndiceConv by fold_affine.
VARIANTS = {"ours": "BN as Mul + Add", "bn": "BN as BatchNormalization", "folded": "BN folded into IndiceConv"}
REPEAT = 5
SPATIAL = (41, 1440, 1440)
BN_EPS = 1e-3  # CenterPoint's BatchNorm1d(eps=1e-3)


# ----------------------------------------------------------------------------- input
def sites(kind: str, rng, voxels: int) -> np.ndarray:
    if kind == "scan":
        return centerpoint_sites(scan_points(rng), rng)
    sys.path.insert(0, str(REPO / "benches"))
    import spconv_peer  # noqa: E402 (its generator, reused)
    cfg = spconv_peer.Config("lidar", voxels, 1, SPATIAL, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), True)
    return spconv_peer.lidar_sites(rng, cfg)


# ----------------------------------------------------------------------------- the backbone
@dataclass(frozen=True)
class Rule:
    """One rulebook: a submanifold one (shared by indice_key) or a strided convolution's."""
    name: str
    src: str           # the rulebook whose output sites are this one's input sites ("" = voxels)
    spatial: tuple     # input spatial shape
    ksize: tuple
    stride: tuple
    padding: tuple
    subm: bool

    @property
    def K(self) -> int:
        return int(np.prod(self.ksize))

    @property
    def out_spatial(self) -> tuple:
        if self.subm:
            return self.spatial
        return tuple((n + 2 * p - (k - 1) - 1) // s + 1 for n, k, s, p in zip(self.spatial, self.ksize, self.stride, self.padding))


@dataclass(frozen=True)
class Conv:
    name: str
    rule: str
    cin: int
    cout: int
    block: str = ""    # SparseBasicBlock name; its second conv ends with the residual add
    second: bool = False


def backbone():
    s0 = SPATIAL
    s1 = Rule("down1", "res0", s0, (3, 3, 3), (2, 2, 2), (1, 1, 1), False).out_spatial
    s2 = Rule("down2", "res1", s1, (3, 3, 3), (2, 2, 2), (1, 1, 1), False).out_spatial
    s3 = Rule("down3", "res2", s2, (3, 3, 3), (2, 2, 2), (0, 1, 1), False).out_spatial
    rules = [
        Rule("res0", "", s0, (3, 3, 3), (1, 1, 1), (1, 1, 1), True),
        Rule("down1", "res0", s0, (3, 3, 3), (2, 2, 2), (1, 1, 1), False),
        Rule("res1", "down1", s1, (3, 3, 3), (1, 1, 1), (1, 1, 1), True),
        Rule("down2", "res1", s1, (3, 3, 3), (2, 2, 2), (1, 1, 1), False),
        Rule("res2", "down2", s2, (3, 3, 3), (1, 1, 1), (1, 1, 1), True),
        Rule("down3", "res2", s2, (3, 3, 3), (2, 2, 2), (0, 1, 1), False),
        Rule("res3", "down3", s3, (3, 3, 3), (1, 1, 1), (1, 1, 1), True),
        Rule("extra", "res3", s3, (3, 1, 1), (2, 1, 1), (0, 0, 0), False),
    ]
    convs = [Conv("conv_input", "res0", 5, 16)]
    for stage, (c, rule, down) in enumerate([(16, "res0", None), (32, "res1", "down1"), (64, "res2", "down2"), (128, "res3", "down3")]):
        if down:
            convs.append(Conv(down, down, c // 2, c))
        for blk in ("a", "b"):
            name = f"block{stage}{blk}"
            convs += [Conv(f"{name}.conv1", rule, c, c, name), Conv(f"{name}.conv2", rule, c, c, name, True)]
    convs.append(Conv("extra", "extra", 128, 128))
    return {r.name: r for r in rules}, convs


def make_weights(rng, convs):
    """Per conv: filters [K, Cin, Cout] (ours) and BatchNorm (gamma, beta, mean, var)."""
    rules, _ = backbone()
    w = {}
    for c in convs:
        K = rules[c.rule].K
        std = np.sqrt(2.0 / (K * c.cin))
        filt = (rng.standard_normal((K, c.cin, c.cout)) * std).astype(np.float32)
        gamma = rng.uniform(0.5, 1.5, c.cout).astype(np.float32)
        beta = rng.uniform(-0.2, 0.2, c.cout).astype(np.float32)
        mean = rng.uniform(-0.2, 0.2, c.cout).astype(np.float32)
        var = rng.uniform(0.5, 2.0, c.cout).astype(np.float32)
        scale = (gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + BN_EPS))
        shift = beta.astype(np.float64) - mean.astype(np.float64) * scale
        w[c.name] = dict(filters=filt, gamma=gamma, beta=beta, mean=mean, var=var,
                         scale=scale.astype(np.float32), shift=shift.astype(np.float32))
    return w


# ----------------------------------------------------------------------------- spconv
def spconv_weight(filters: np.ndarray, ksize) -> torch.Tensor:
    """Ours [K, Cin, Cout] with k = (kz*KH + ky)*KW + kx -> spconv 2's KRSC [Cout, kd, kh, kw, Cin]."""
    K, cin, cout = filters.shape
    return torch.from_numpy(np.ascontiguousarray(filters.reshape(*ksize, cin, cout).transpose(4, 0, 1, 2, 3)))


class SpconvBackbone(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        rules, convs = backbone()
        self.convs = convs
        self.mods = torch.nn.ModuleDict()
        self.bns = torch.nn.ModuleDict()
        for c in convs:
            r = rules[c.rule]
            cls = spt.SubMConv3d if r.subm else spt.SparseConv3d
            m = cls(c.cin, c.cout, r.ksize, stride=r.stride, padding=r.padding, bias=False, indice_key=r.name,
                    algo=ConvAlgo.Native)
            with torch.no_grad():
                m.weight.copy_(spconv_weight(weights[c.name]["filters"], r.ksize))
            bn = torch.nn.BatchNorm1d(c.cout, eps=BN_EPS)
            with torch.no_grad():
                for k in ("weight", "bias", "running_mean", "running_var"):
                    src = {"weight": "gamma", "bias": "beta", "running_mean": "mean", "running_var": "var"}[k]
                    getattr(bn, k).copy_(torch.from_numpy(weights[c.name][src]))
            key = c.name.replace(".", "_")
            self.mods[key], self.bns[key] = m, bn
        self.eval()

    def forward(self, x):
        identity = None
        for c in self.convs:
            key = c.name.replace(".", "_")
            if c.block and not c.second:
                identity = x.features
            x = self.mods[key](x)
            f = self.bns[key](x.features)
            if c.second:
                f = f + identity
            x = x.replace_feature(torch.relu(f))
        return x


def spconv_rulebook(r: Rule, indices: torch.Tensor):
    outids, pairs, num = spops.get_indice_pairs(indices, 1, list(r.spatial), ConvAlgo.Native, list(r.ksize),
                                                list(r.stride), list(r.padding), [1, 1, 1], [0, 0, 0], r.subm, False)
    return outids, pairs, num


def spconv_conv(r: Rule, feats, weight, rb):
    outids, pairs, num = rb
    return spops.indice_conv(feats, weight, pairs, num, outids.shape[0], False, r.subm, ConvAlgo.Native)


# ----------------------------------------------------------------------------- ours
def session(model: onnx.ModelProto, lib: str, threads: int, optimized: str | None = None, profile: str | None = None):
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Idle workers sleep instead of spinning, so that a pool does not take a core from the
    # variant timed next (spconv's, in particular).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if optimized:
        so.optimized_model_filepath = optimized
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def model_of(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "backbone_peer", inputs, outputs, list(inits))
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mluops", 1)])


def rule_node(r: Rule, src: str):
    return helper.make_node(
        "GetIndicePairs", [src], [f"{r.name}_pairs", f"{r.name}_out", f"{r.name}_num"], domain="mluops",
        name=f"{r.name}_rules", batch_size=1, spatial_shape=list(r.spatial), kernel_size=list(r.ksize),
        stride=list(r.stride), padding=list(r.padding), dilation=[1, 1, 1], subm=int(r.subm))


def rule_model(r: Rule):
    return model_of([rule_node(r, "indices")], [helper.make_tensor_value_info("indices", TensorProto.INT32, [None, 4])],
                    [helper.make_tensor_value_info(f"{r.name}_{s}", TensorProto.INT32, None) for s in ("pairs", "out", "num")])


def conv_model(bias: bool = False):
    names = ["features", "filters", "pairs", "num", "out"] + (["bias"] if bias else [])
    node = helper.make_node("IndiceConv", names, ["y"], domain="mluops", name="conv")
    types = [TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT32, TensorProto.INT32, TensorProto.FLOAT]
    ins = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)]
    return model_of([node], ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def backbone_model(weights, batchnorm: bool = False):
    """The whole backbone as one graph: IndiceConv -> Mul(scale) -> Add(shift) [-> Add(identity)]
    -> Relu, or with batchnorm a BatchNormalization node (as torch exports BatchNorm1d)
    instead of the Mul and Add. (onnxruntime_ep_mlu.fold.fold_affine of either is the graph
    with BatchNorm folded into IndiceConv's filters and bias.)"""
    rules, convs = backbone()
    nodes, inits = [], []
    for r in rules.values():
        nodes.append(rule_node(r, "voxel_coords" if not r.src else f"{r.src}_out"))
    x, identity = "voxel_features", None
    for c in convs:
        w = weights[c.name]
        n = c.name.replace(".", "_")
        if c.block and not c.second:
            identity = x
        ins = [x, f"{n}_w", f"{c.rule}_pairs", f"{c.rule}_num", f"{c.rule}_out"]
        inits.append(numpy_helper.from_array(w["filters"], f"{n}_w"))
        nodes.append(helper.make_node("IndiceConv", ins, [f"{n}_y"], domain="mluops", name=n))
        if batchnorm:
            params = ("gamma", "beta", "mean", "var")
            bn = [f"{n}_{p}" for p in params]
            inits += [numpy_helper.from_array(w[p], name) for p, name in zip(params, bn)]
            nodes.append(helper.make_node("BatchNormalization", [f"{n}_y", *bn], [f"{n}_bn"], name=f"{n}_bn", epsilon=BN_EPS))
        else:
            inits += [numpy_helper.from_array(w["scale"], f"{n}_s"), numpy_helper.from_array(w["shift"], f"{n}_t")]
            nodes += [helper.make_node("Mul", [f"{n}_y", f"{n}_s"], [f"{n}_m"], name=f"{n}_scale"),
                      helper.make_node("Add", [f"{n}_m", f"{n}_t"], [f"{n}_bn"], name=f"{n}_shift")]
        pre = f"{n}_bn"
        if c.second:
            nodes.append(helper.make_node("Add", [pre, identity], [f"{n}_res"], name=f"{n}_residual"))
            pre = f"{n}_res"
        x = f"{n}_relu"
        nodes.append(helper.make_node("Relu", [pre], [x], name=f"{n}_relu"))
    last = convs[-1].rule
    nodes.append(helper.make_node("Identity", [x], ["features"], name="out_features"))
    nodes.append(helper.make_node("Identity", [f"{last}_out"], ["indices"], name="out_indices"))
    inputs = [helper.make_tensor_value_info("voxel_features", TensorProto.FLOAT, [None, 5]),
              helper.make_tensor_value_info("voxel_coords", TensorProto.INT32, [None, 4])]
    outputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, 128]),
               helper.make_tensor_value_info("indices", TensorProto.INT32, [None, 4])]
    return model_of(nodes, inputs, outputs, inits)


# ----------------------------------------------------------------------------- checking
def keys(idx: np.ndarray, spatial) -> np.ndarray:
    idx = np.asarray(idx).astype(np.int64)
    return ((idx[:, 0] * spatial[0] + idx[:, 1]) * spatial[1] + idx[:, 2]) * spatial[2] + idx[:, 3]


def compare(label, spatial, ours_idx, ours_f, ref_idx, ref_f, problems: list) -> str:
    """Coordinates identical as sets; features matched by site within the accumulating class,
    each element bounded as well (regression.compare's judge, docs/CONTRACT.md §1.5).
    Returns 'diff1 / diff2 / max rel / per element' as text."""
    ko, kr = keys(ours_idx, spatial), keys(ref_idx, spatial)
    oo, orr = np.argsort(ko, kind="stable"), np.argsort(kr, kind="stable")
    if ko.size != kr.size or not np.array_equal(ko[oo], kr[orr]):
        problems.append(f"{label}: output coordinates differ ({ko.size} vs {kr.size} sites)")
        return "coords differ"
    a, b = np.asarray(ours_f, np.float32)[oo], np.asarray(ref_f, np.float32)[orr]
    ratio, text = judge(a, b, DEFAULT_FLOAT)
    if not ratio <= 1.0:
        problems.append(f"{label}: features outside the accumulating class: {text}")
    (d1, d2), (_, rel) = accumulating_metrics(a, b), elementwise_errors(a, b)
    return f"{d1:.1e} / {d2:.1e} / {rel:.1e} / {element_ratio(a, b):.1e}"


# ----------------------------------------------------------------------------- timing
def profile_breakdown(model, lib, threads, feeds, runs: int = 3):
    """onnxruntime's profile of `runs` runs after a warm-up: the kernel time summed per op type
    (ms per run), and the run's wall time."""
    with tempfile.TemporaryDirectory() as d:
        s = session(model, lib, threads, profile=os.path.join(d, "prof"))
        s.run(None, feeds)
        t0 = time.perf_counter()
        for _ in range(runs):
            s.run(None, feeds)
        wall = (time.perf_counter() - t0) / runs
        path = s.end_profiling()
        events = json.load(open(path))
    per_op = collections.defaultdict(float)
    run_events = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    # Drop the warm-up run: keep the last runs * nodes events.
    nodes = len({e["name"] for e in run_events})
    for e in run_events[-runs * nodes:]:
        per_op[e["args"]["op_name"]] += e["dur"] / 1e3 / runs
    return wall * 1e3, dict(per_op)


def dump_layers(directory: str, coords, feats, weights, lib: str) -> None:
    """Writes each convolution's IndiceConv inputs (ours, chained through our own layers) as
    .npy files under directory/<layer>/, for benches/indice_conv.rs (kernel breakdown)."""
    rules, convs = backbone()
    rb = {}
    for r in rules.values():
        src = coords if not r.src else rb[r.src][1]
        rb[r.name] = session(rule_model(r), lib, 2).run(None, {"indices": src})
    conv = session(conv_model(), lib, 2)
    x, ident = feats, None
    for c in convs:
        w, (pairs, out, num) = weights[c.name], rb[c.rule]
        if c.block and not c.second:
            ident = x
        d = Path(directory) / c.name
        d.mkdir(parents=True, exist_ok=True)
        for name, a in (("features", x), ("filters", w["filters"]), ("pairs", pairs), ("num", num), ("out_indices", out)):
            np.save(d / f"{name}.npy", np.ascontiguousarray(a))
        y = conv.run(None, {"features": x, "filters": w["filters"], "pairs": pairs, "num": num, "out": out})[0]
        z = y * w["scale"] + w["shift"]
        if c.second:
            z = z + ident
        x = np.maximum(z, 0).astype(np.float32)
    (Path(directory) / "layers.txt").write_text("".join(f"{c.name}\n" for c in convs))
    print(f"backbone_peer: wrote the inputs of {len(convs)} IndiceConv layers to {directory}")


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", choices=["scan", "lidar"], default="scan", help="simulated 32-beam scan (default) or spconv_peer's clustered sites")
    ap.add_argument("--voxels", type=int, default=100_000, help="voxel count for --sites lidar")
    ap.add_argument("--repeat", type=int, default=REPEAT, help="timed rounds after one warm-up (best is kept)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer table")
    ap.add_argument("--dump", metavar="DIR", help="only write each layer's IndiceConv inputs to DIR (for "
                    "`cargo bench --bench indice_conv -- DIR`) and exit")
    args = ap.parse_args()

    lib = os.environ.get("MLU_EP_LIB") or str(REPO / "target" / "release" / "libonnxruntime_ep_mlu.so")
    if not Path(lib).is_file():
        sys.exit(f"backbone_peer: {lib} not found: build it with `cargo build --release --lib` or set MLU_EP_LIB")
    torch.set_num_threads(1)  # spconv's CPU path is only right on one torch thread
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    coords = sites(args.sites, rng, args.voxels)
    L = coords.shape[0]
    feats = rng.standard_normal((L, 5)).astype(np.float32)
    rules, convs = backbone()
    weights = make_weights(rng, convs)
    print(f"backbone_peer: spconv {spconv.__version__} (torch {torch.__version__}, 1 thread) vs {Path(lib).name} under "
          f"onnxruntime {ort.__version__}; {os.cpu_count()} cores; sites {args.sites}: {L} voxels over "
          f"{'x'.join(map(str, SPATIAL))} (made in {time.perf_counter() - t0:.1f} s), seed {args.seed}; "
          f"best of {args.repeat} interleaved rounds after 1 warm-up")
    if args.dump:
        dump_layers(args.dump, coords, feats, weights, lib)
        return 0
    problems: list[str] = []

    # ---- the whole backbone
    net = SpconvBackbone(weights)
    tcoords, tfeats = torch.from_numpy(coords), torch.from_numpy(feats)

    def run_spconv():
        with torch.no_grad():
            return net(spt.SparseConvTensor(tfeats, tcoords, list(SPATIAL), 1))

    graphs = {"ours": backbone_model(weights), "bn": backbone_model(weights, batchnorm=True)}
    graphs["folded"] = fold_affine(graphs["ours"])
    # (The folded BatchNormalization graph is only counted: it equals the folded one.)
    for name, folded, want in (("ours", graphs["folded"], 2 * len(convs)), ("bn", fold_affine(graphs["bn"]), len(convs))):
        folded_nodes = len(graphs[name].graph.node) - len(folded.graph.node)
        if folded_nodes != want:
            problems.append(f"fold_affine folded {folded_nodes} nodes of the {VARIANTS[name]} graph, expected {want}")
    feeds = {"voxel_features": feats, "voxel_coords": coords}
    with tempfile.TemporaryDirectory() as d:
        opt_path = os.path.join(d, "optimized.onnx")
        sessions = {(v, t): session(graphs[v], lib, t, optimized=opt_path if (v == "ours" and t == 1) else None)
                    for v in VARIANTS for t in (1, 2)}
        optimized = onnx.load(opt_path)
    fns = {"spconv": run_spconv}
    for key, s in sessions.items():
        fns[key] = lambda s=s: s.run(None, feeds)
    busy: dict = {}
    best, res = interleaved(fns, args.repeat, busy)
    ref = res["spconv"]
    ref_idx, ref_f = ref.indices.numpy(), ref.features.numpy()
    out_spatial = rules[convs[-1].rule].out_spatial
    checks = {}
    for key in fns:
        if key == "spconv":
            continue
        f, idx = res[key]
        checks[key] = compare(f"backbone, {VARIANTS[key[0]]}, {key[1]} thread(s)", out_spatial, idx, f, ref_idx, ref_f, problems)
    for v in VARIANTS:
        a, b = res[(v, 1)], res[(v, 2)]
        if not all(np.array_equal(x, y) for x, y in zip(a, b)):
            problems.append(f"backbone, {VARIANTS[v]}: 1-thread and 2-thread outputs differ")
    del sessions

    # ---- per layer
    layer_rows = []
    if not args.no_layers:
        lrows, rb_ours, rb_sp = [], {}, {}
        in_idx = {"": coords}
        sess_r = {}
        for r in rules.values():
            src = coords if not r.src else rb_ours[r.src][1]
            m = rule_model(r)
            s1, s2 = session(m, lib, 1), session(m, lib, 2)
            src_t = torch.from_numpy(src if not r.src else rb_sp[r.src][0].numpy())
            bt, out = interleaved({"spconv": lambda r=r, x=src_t: spconv_rulebook(r, x),
                                   1: lambda s=s1, x=src: s.run(None, {"indices": x}),
                                   2: lambda s=s2, x=src: s.run(None, {"indices": x})}, args.repeat)
            rb_ours[r.name], rb_sp[r.name] = out[2], out["spconv"]
            if not all(np.array_equal(x, y) for x, y in zip(out[1], out[2])):
                problems.append(f"rulebook {r.name}: 1-thread and 2-thread outputs differ")
            ko, ks = keys(out[2][1], r.out_spatial), keys(out["spconv"][0].numpy(), r.out_spatial)
            same = ko.size == ks.size and np.array_equal(np.sort(ko), np.sort(ks))
            if not same:
                problems.append(f"rulebook {r.name}: output sites differ from spconv's")
            pairs = int(out[2][2].sum())
            layer_rows.append((f"rules {r.name}", "subm" if r.subm else "strided", "", src.shape[0], out[2][1].shape[0], pairs,
                               bt["spconv"], bt[1], bt[2], "sites " + ("identical" if same else "DIFFER")))
        # Convolutions, each on its own side's chained input (conv -> BN -> residual -> ReLU).
        cm = conv_model()
        c1, c2 = session(cm, lib, 1), session(cm, lib, 2)
        x_o, x_s = feats, tfeats
        ident_o = ident_s = None
        for c in convs:
            r, w = rules[c.rule], weights[c.name]
            pairs_o, out_o, num_o = rb_ours[c.rule]
            rb = rb_sp[c.rule]
            wt = spconv_weight(w["filters"], r.ksize)
            if c.block and not c.second:
                ident_o, ident_s = x_o, x_s
            feed = {"features": x_o, "filters": w["filters"], "pairs": pairs_o, "num": num_o, "out": out_o}
            bt, out = interleaved({"spconv": lambda x=x_s, wt=wt, rb=rb, r=r: spconv_conv(r, x, wt, rb),
                                   1: lambda f=feed: c1.run(None, f), 2: lambda f=feed: c2.run(None, f)}, args.repeat)
            y_o, y_s = out[2][0], out["spconv"]
            if not np.array_equal(out[1][0], y_o):
                problems.append(f"{c.name}: 1-thread and 2-thread outputs differ")
            check = compare(c.name, r.out_spatial, out_o, y_o, rb[0].numpy(), y_s.numpy(), problems)
            layer_rows.append((c.name, "subm" if r.subm else "strided", f"{c.cin}->{c.cout}", x_o.shape[0], out_o.shape[0],
                               int(num_o.sum()), bt["spconv"], bt[1], bt[2], check))
            # Next input: BN, residual, ReLU on each side (numpy for ours, torch for spconv).
            z_o = y_o * w["scale"] + w["shift"]
            with torch.no_grad():
                z_s = torch.nn.functional.batch_norm(y_s, torch.from_numpy(w["mean"]), torch.from_numpy(w["var"]),
                                                     torch.from_numpy(w["gamma"]), torch.from_numpy(w["beta"]), False, 0.0, BN_EPS)
            if c.second:
                z_o, z_s = z_o + ident_o, z_s + ident_s
            x_o, x_s = np.maximum(z_o, 0).astype(np.float32), torch.relu(z_s)

    # ---- where our time goes
    prof = {t: profile_breakdown(graphs["ours"], lib, t, feeds) for t in (1, 2)}
    prof_f = {t: profile_breakdown(graphs["folded"], lib, t, feeds) for t in (1, 2)}

    # ---- report
    print()
    print("Whole backbone (one session.run of the ONNX graph vs spconv eager modules on a fresh SparseConvTensor):")
    print("| variant | ms | CPU / wall | spconv 1t / this | check vs spconv (diff1 / diff2 / max rel / per element) |")
    print("|---|---|---|---|---|")
    print(f"| spconv 2.3.8, 1 torch thread | {best['spconv'] * 1e3:.1f} | {busy['spconv']:.2f} | 1.00x | reference |")
    for v, what in VARIANTS.items():
        for t in (1, 2):
            label = f"ours, {t} thread{'s' if t > 1 else ''}, {what}"
            print(f"| {label} | {best[(v, t)] * 1e3:.1f} | {busy[(v, t)]:.2f} | {best['spconv'] / best[(v, t)]:.2f}x | {checks[(v, t)]} |")
    print("ours 1 -> 2 threads: " + ", ".join(f"{best[(v, 1)] / best[(v, 2)]:.2f}x ({what})" for v, what in VARIANTS.items()))
    if layer_rows:
        print()
        print("Per layer (rulebooks: GetIndicePairs node vs spconv get_indice_pairs; convolutions: one IndiceConv node vs "
              "spconv.pytorch.ops.indice_conv on the same rulebook):")
        print("| layer | kind | channels | in sites | out sites | pairs | spconv 1t ms | ours 1t ms | ours 2t ms | spconv/ours-1t | spconv/ours-2t | check (diff1 / diff2 / max rel / per element) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        tot = collections.defaultdict(float)
        for (name, kind, ch, lin, lout, pairs, tsp, t1, t2, check) in layer_rows:
            group = "rules" if name.startswith("rules") else "convs"
            tot[(group, "sp")] += tsp
            tot[(group, 1)] += t1
            tot[(group, 2)] += t2
            print(f"| {name} | {kind} | {ch} | {lin} | {lout} | {pairs} | {tsp * 1e3:.2f} | {t1 * 1e3:.2f} | {t2 * 1e3:.2f} | "
                  f"{tsp / t1:.2f}x | {tsp / t2:.2f}x | {check} |")
        for group in ("rules", "convs"):
            print(f"| all {group} | | | | | | {tot[(group, 'sp')] * 1e3:.1f} | {tot[(group, 1)] * 1e3:.1f} | {tot[(group, 2)] * 1e3:.1f} | "
                  f"{tot[(group, 'sp')] / tot[(group, 1)]:.2f}x | {tot[(group, 'sp')] / tot[(group, 2)]:.2f}x | |")
    print()
    print("Where our time goes (onnxruntime profile of the whole graph: kernel time per op type, ms per run; "
          "the rest of the wall time is onnxruntime's own between the nodes):")
    ops = sorted({op for p in list(prof.values()) + list(prof_f.values()) for op in p[1]}, key=lambda o: -prof[1][1].get(o, 0))
    print("| op type | BN as Mul+Add 1t | 2t | BN folded 1t | 2t |")
    print("|---|---|---|---|---|")
    for op in ops:
        print(f"| {op} | " + " | ".join(f"{p[t][1].get(op, 0.0):.1f}" for p in (prof, prof_f) for t in (1, 2)) + " |")
    print("| sum of kernels | " + " | ".join(f"{sum(p[t][1].values()):.1f}" for p in (prof, prof_f) for t in (1, 2)) + " |")
    print("| wall (profiled run) | " + " | ".join(f"{p[t][0]:.1f}" for p in (prof, prof_f) for t in (1, 2)) + " |")
    before = collections.Counter(n.op_type for n in graphs["ours"].graph.node)
    after = collections.Counter(n.op_type for n in optimized.graph.node)
    fused = after.get("Mul", 0) < before["Mul"] or after.get("Add", 0) < before["Add"]
    print(f"onnxruntime graph optimisations (ORT_ENABLE_ALL, optimized model inspected): nodes before {dict(before)}, "
          f"after {dict(after)}: the per-channel Mul/Add after IndiceConv are "
          f"{'partly fused' if fused else 'NOT fused into IndiceConv (nor into each other)'}.")
    for p in problems:
        print(f"MISMATCH {p}", file=sys.stderr)
    if problems:
        print("backbone_peer: checks failed (see MISMATCH lines)", file=sys.stderr)
        return 1
    print("checks: output coordinates identical and features within the accumulating class, each element "
          "bounded, everywhere; "
          "ours bit-identical at 1 and 2 threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
