#!/usr/bin/env python3
"""Where a whole detector's time goes, ONNX Runtime's CPU path against its eager PyTorch
model: the `detections` graphs of networks/run.py (CenterPoint, PointPillars, BEVDepth), the
same module, weights and inputs.

For each detector and thread count (1 and 2):
- the exported graph: its op types, Transpose nodes, and how many IndiceConv nodes carry the
  fused epilogue (scale/shift inputs, a residual, activation relu) against BatchNormalization,
  Relu and Add nodes left beside them; then the graph ONNX Runtime runs at each optimization
  level (its optimized model saved and counted: Transpose, the NCHWc layout transformer's
  ReorderInput/ReorderOutput and com.microsoft.nchwc nodes, fused Conv);
- the time, interleaved in one run (one warm-up each, then --repeat rounds calling each side
  in turn, the best kept; common.interleaved): onnxruntime at ORT_ENABLE_BASIC, _EXTENDED,
  _LAYOUT and _ALL (the runners' level: onnxruntime's default, which the runners keep)
  against the peer at the same torch thread count (CenterPoint's spconv encoder always at 1
  thread, its CPU path being wrong on 2: the peer's 2-thread time runs its dense parts at 2);
- where it goes: onnxruntime's profiler (SessionOptions.enable_profiling; kernel time per op
  type over --profile-runs runs, at ORT_ENABLE_ALL) and torch.profiler (self CPU time per
  aten op over as many runs), each as shares of its side's summed op time, and the share of
  the `mluops` nodes.

Shares from profiles are robust to a loaded host; absolute times are not: the run prints
`uptime`'s load before and after. Speed is reported, never asserted.

    python networks/profile_detectors.py [--scale full|ci] [--networks centerpoint,pointpillars,bevdepth]
                                         [--threads 1,2] [--repeat N] [--profile-runs N] [--top N]

`--profile-runs 0` times only (the quiet-host ratios); `--profile-runs 1` is the most the
24 GB host holds at full scale with CenterPoint's torch.profiler.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
import torch  # noqa: E402

from networks import common  # noqa: E402  (puts python/ on the path)
import onnxruntime_ep_mlu as mlu  # noqa: E402

DETECTORS = {"centerpoint": "centerpoint", "pointpillars": "pointpillars", "bevdepth": "bevdepth"}
LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT", "ORT_ENABLE_ALL")


def session(model: bytes, threads: int, library: str, level: str = "ORT_ENABLE_ALL", profile: str = "",
            optimized: str = ""):
    """common.cpu_session's options at ``level``; ``profile``: the profiler's file prefix;
    ``optimized``: where to save the graph ONNX Runtime runs."""
    import onnxruntime as ort

    so = mlu.session_options(library=library)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    if optimized:
        so.optimized_model_filepath = optimized
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def graph_facts(model: bytes) -> str:
    """The exported graph's op types that matter to layout and the epilogue."""
    g = onnx.load_from_string(model).graph
    ops = collections.Counter(n.op_type for n in g.node)
    convs = [n for n in g.node if n.op_type == "IndiceConv"]
    fused = 0
    for n in convs:
        act = next((a.s.decode() for a in n.attribute if a.name == "activation"), "none")
        scaled = len(n.input) > 6 and bool(n.input[6])
        fused += act != "none" or scaled
    return (f"{len(g.node)} nodes; Transpose {ops['Transpose']}, Conv {ops['Conv']}, ConvTranspose "
            f"{ops['ConvTranspose']}, BatchNormalization {ops['BatchNormalization']}, Relu {ops['Relu']}, "
            f"IndiceConv {len(convs)} ({fused} with the fused epilogue), DynamicScatter {ops['DynamicScatter']}, "
            f"VoxelPoolingForward {ops['VoxelPoolingForward']}")


def optimized_facts(model: bytes, library: str, level: str, where: str) -> str:
    """The op types of the graph ONNX Runtime runs at ``level`` (its saved optimized model)."""
    path = os.path.join(where, f"{level}.onnx")
    session(model, 1, library, level, optimized=path)
    g = onnx.load(path).graph
    ops = collections.Counter((n.domain or "ai.onnx", n.op_type) for n in g.node)
    nchwc = sum(c for (d, _), c in ops.items() if d == "com.microsoft.nchwc")
    fused = sum(c for (d, o), c in ops.items() if o == "FusedConv" or (d == "com.microsoft.nchwc" and o == "Conv"))
    return (f"{level}: {len(g.node)} nodes; Transpose {ops[('ai.onnx', 'Transpose')]}, NCHWc nodes {nchwc} "
            f"(ReorderInput {ops[('com.microsoft.nchwc', 'ReorderInput')]}, ReorderOutput "
            f"{ops[('com.microsoft.nchwc', 'ReorderOutput')]}), Conv {ops[('ai.onnx', 'Conv')]}, fused or NCHWc Conv "
            f"{fused}, BatchNormalization {ops[('ai.onnx', 'BatchNormalization')]}")


def ort_profile(model: bytes, feeds: dict, threads: int, library: str, runs: int, where: str) -> dict[str, float]:
    """Kernel seconds per op type, per run, from onnxruntime's profiler over ``runs`` runs
    after a warm-up (whose events are left out)."""
    sess = session(model, threads, library, profile=os.path.join(where, f"ort_{threads}t"))
    sess.run(None, feeds)
    for _ in range(runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    warm = min((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    per: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > warm["ts"] + warm["dur"]:
            per[e["args"]["op_name"]] += e["dur"] * 1e-6 / runs
    return dict(per)


def torch_profile(peer, threads: int, runs: int) -> tuple[dict[str, float], float]:
    """Self CPU seconds per op, per run, from torch.profiler over ``runs`` runs after a
    warm-up, and the profiled runs' wall seconds per run (ops the profiler does not see, such
    as spconv's own kernels called outside the dispatcher, are in the wall time only)."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    peer(threads)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(runs):
            peer(threads)
        wall = (time.perf_counter() - t0) / runs
    torch.set_num_threads(1)
    return {e.key: e.self_cpu_time_total * 1e-6 / runs for e in prof.key_averages()}, wall


def shares(per: dict[str, float], top: int) -> str:
    total = sum(per.values())
    ranked = sorted(per.items(), key=lambda kv: -kv[1])
    head = "; ".join(f"{k} {v * 1e3:.1f} ms {v / total:.0%}" for k, v in ranked[:top])
    return f"{total * 1e3:.1f} ms of ops: {head}"


def load() -> str:
    """uptime's load averages (1, 5, 15 minutes)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", choices=common.SCALES, default="full")
    ap.add_argument("--networks", default=",".join(DETECTORS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=3, help="timed interleaved rounds after one warm-up (best kept)")
    ap.add_argument("--profile-runs", type=int, default=1,
                    help="0: time only (at full scale, torch.profiler over CenterPoint's peer with 2 runs "
                         "held 23.8 GB of this 24 GB host, 2026-12-03)")
    ap.add_argument("--top", type=int, default=8, help="op types listed per profile")
    ap.add_argument("--levels", default=",".join(LEVELS), help="the optimization levels timed")
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--library", default=os.environ.get("MLU_EP_LIB")
                    or str(REPO / "target" / "release" / "libonnxruntime_ep_mlu.so"))
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    library = str(Path(args.library).resolve())
    threads = [int(t) for t in args.threads.split(",")]
    levels = [x.strip() for x in args.levels.split(",") if x.strip()]
    print(f"profile_detectors ({args.scale} scale): load average {load()} at the start; {os.cpu_count()} cores; "
          f"best of {args.repeat} interleaved rounds; profiles over {args.profile_runs} runs after a warm-up")
    for name in [n.strip() for n in args.networks.split(",") if n.strip()]:
        mod = importlib.import_module(f"networks.{DETECTORS[name]}")
        if hasattr(mod, "detector_graph"):
            # CenterPoint's case also exports the encoder alone: only the detector is needed.
            g, config = mod.detector_graph(args.scale, args.seed), f"{args.scale} scale"
        else:
            case = mod.case(args.scale, args.seed)
            g, config = next(x for x in case.graphs if x.name == "detections"), case.config
        print(f"# {name} detections: {config}; peer {g.peer_name}; {', '.join(f'{k} {v.shape}' for k, v in g.feeds.items())}")
        print(f"  exported: {graph_facts(g.model)}")
        custom = {n.op_type for n in onnx.load_from_string(g.model).graph.node if n.domain == mlu.DOMAIN}
        with tempfile.TemporaryDirectory() as where:
            for level in levels:
                print(f"  optimized {optimized_facts(g.model, library, level, where)}")
            for t in threads:
                fns = {}
                for level in levels:
                    s = session(g.model, t, library, level)
                    fns[level] = (lambda s: lambda: s.run(None, g.feeds))(s)

                def peer(t=t):
                    torch.set_num_threads(t)
                    return g.peer(t)

                fns["peer"] = peer
                before = load()
                best, _ = common.interleaved(fns, args.repeat)
                torch.set_num_threads(1)
                p = best["peer"]
                times = "; ".join(f"{lv[4:]} {best[lv] * 1e3:.0f} ms = {p / best[lv]:.2f}x" for lv in levels)
                print(f"  {t}t time (load {before} -> {load()}): peer {p * 1e3:.0f} ms; onnxruntime {times}")
                if args.profile_runs == 0:
                    continue
                ort = ort_profile(g.model, g.feeds, t, library, args.profile_runs, where)
                ours = sum(v for k, v in ort.items() if k in custom)
                print(f"  {t}t onnxruntime profile (ORT_ENABLE_ALL): {shares(ort, args.top)}; mluops nodes "
                      f"({', '.join(sorted(custom))}) {ours * 1e3:.1f} ms = {ours / sum(ort.values()):.1%}")
                eager, wall = torch_profile(g.peer, t, args.profile_runs)
                print(f"  {t}t torch profile ({wall * 1e3:.0f} ms per profiled run): {shares(eager, args.top)}")
    print(f"load average {load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
