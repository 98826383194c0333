#!/usr/bin/env python3
"""Network regression runner: each named network (networks/<name>.py) built as a PyTorch
module, exported with torch.onnx.export through onnxruntime_ep_mlu.torch, run under
onnxruntime on the CPU path (the custom-op library) and under the MLUExecutionProvider on
the emulated card (no MLU hardware is reachable here), and compared with the peer library
its users run today on the same inputs and weights.

One line per network, graph and path: nodes on the MLU / nodes the EP must take (those with
an MLU kernel) and, on the MLU path, how many nodes ONNX Runtime assigned in all; then one
line per card backend (`mlu_backend` = bang, mluops, auto: the MLU-OPS and auto rows use the emulated
libmluops unless --mluops-library names another, and say so where MLU-OPS ran nodes:
"emulated MLU-OPS = our CPU kernels: binding check") with the nodes it claimed and declined
and the host<->card bytes, ONNX Runtime's copies around CPU nodes included: those of one
inference (a session of two inferences less the row's session of one) against the minimum,
the card segment's inputs plus outputs (the tensors crossing between the nodes ONNX Runtime
put on the card and the rest in the graph ONNX Runtime runs after its optimizations, sized on
the graph's inputs: common.card_boundary; a row moving less than that fails, its accounting
being wrong), and apart the session's own bytes (the card nodes' weights, copied once per
session); --crossings N lists the N largest crossing tensors of each kind under each row.
Every MLU row reads the provider's traffic report and ONNX Runtime's warnings of its session
(onnxruntime_ep_mlu.placement): the node runs on the card per backend, the run-time CPU
fallbacks and declines, and its expectation; it fails when no node ran on the card (unless
the graph says why nothing is expected there, Graph.off_card, and then when something
does), or on any run-time fallback or decline; the worst
output against the peer relative to its tolerance (<= 1 passes: exact for integers; for
floats diff1 and diff2 <= 3e-3 and, per element, max |a-b| <= 3e-5 * max|peer|, levels
and measurements in onnxruntime_ep_mlu.regression.DEFAULT_FLOAT; a network's own level where
it says so); and, on the CPU
path, onnxruntime's time at 1 and 2 intra-op threads against the peer's eager time at the
same torch thread count, in the same run (best of --repeat interleaved rounds after a
warm-up; spconv only at 1 thread, its CPU path being wrong on 2). The emulated card's time
is printed for completeness: it measures the emulator, not an MLU.

Exits non-zero when an output disagrees with its peer beyond the tolerance, the CPU path's
outputs at 1 and 2 threads are not bit-identical, a node that must run on the MLU does not,
an MLU row's placement fails, or a session fails. Speed is reported, never asserted.

    python networks/run.py [--scale ci|full] [--networks centerpoint,...] [--repeat N]
                           [--seed S] [--library path/to/libonnxruntime_ep_mlu.so] [--crossings N]

--scale ci (the test command) runs reduced sizes (each network module says which);
--scale full the published configurations. The library defaults to $MLU_EP_LIB, else
target/release/libonnxruntime_ep_mlu.so.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from networks import common  # noqa: E402
from onnxruntime_ep_mlu import placement  # noqa: E402

NETWORKS = {
    "centerpoint": "centerpoint",
    "pointpillars": "pointpillars",
    "bevdepth": "bevdepth",
    "pointnet2_fp": "pointnet2",
    "rfcn_head": "rfcn",
}


def bytes_row(g: common.Graph, library: str, options: dict, session: dict, where: dict, row: str, crossings: int,
              notes: list[str]) -> tuple[str, list[str]]:
    """The host<->card bytes of one inference under a card backend against the minimum
    (common.card_boundary: the card segment's inputs plus outputs), and the session's own
    (the weights, copied once): a second session of two inferences, less the row's session of
    one, is one inference. With ``crossings``, the largest crossing tensors go to ``notes``.
    Also what is wrong: fewer bytes than the minimum means the accounting missed a rewrite."""
    t = session["traffic"]
    twice = common.mlu_run(g.model, library, g.feeds, options, runs=2)[4]["traffic"]
    per = {k: twice[k] - t[k] for k in ("h2d", "d2h")}
    once = {k: t[k] - per[k] for k in ("h2d", "d2h")}
    cross = common.card_boundary(g.model, where, g.feeds, library)
    least, moved = cross.minimum, per["h2d"] + per["d2h"]
    for side, part in (("to card", cross.to_card), ("back", cross.back), ("weights", cross.weights)):
        for name, made, read, b in sorted(part, key=lambda x: -x[3])[:crossings]:
            notes.append(f"{'':23}{row:<6} {side:<7} {b:>13,} B  {name} ({made} -> {read})")
    wrong = [f"{moved:,} B moved, below the minimum {least:,} B: the boundary is not the graph run"] \
        if moved < least else []
    return (f"per inference {per['h2d']:,} B to the card + {per['d2h']:,} B back = "
            + (f"{moved / least:.2f}x" if least else "-") + f" the minimum {least:,} B (the card segment's inputs "
            f"{sum(b for *_, b in cross.to_card):,} + outputs {sum(b for *_, b in cross.back):,}); once per session "
            f"{once['h2d']:,} B to the card, {once['d2h']:,} B back (the card nodes' weights: "
            f"{sum(b for *_, b in cross.weights):,} B)"), wrong


def run_graph(case: common.Case, g: common.Graph, library: str, repeat: int, mluops_library: str,
              crossings: int = 0) -> tuple[list[str], bool]:
    rows, ok, notes = [], True, []
    label = f"{case.network:<13} {g.name:<9}"
    cpu = {t: common.cpu_session(g.model, t, library) for t in (1, 2)}
    names = [o.name for o in cpu[1].get_outputs()]

    def ours(t):
        return lambda: dict(zip(names, cpu[t].run(None, g.feeds)))

    def peer(t):
        def call():
            torch.set_num_threads(t)
            return g.peer(t)

        return call

    fns = {("ort", 1): ours(1), ("ort", 2): ours(2)}
    for t in g.peer_threads:
        fns[("peer", t)] = peer(t)
    best, results = common.interleaved(fns, repeat)
    torch.set_num_threads(1)
    ref = results[("peer", 1)]
    worst = 0.0
    what = ""
    for t in (1, 2):
        ratio, text = common.compare(results[("ort", t)], ref, g.canonical, g.tolerances)
        if ratio > worst or not what:
            worst, what = ratio, text
    # The contract's outputs do not depend on the thread count; a network whose outputs do
    # fails, whichever node is the cause.
    moved = [k for k in names if not np.array_equal(results[("ort", 1)][k], results[("ort", 2)][k])]
    if moved:
        what += f"; 1- and 2-thread outputs differ: {', '.join(moved)}"
    good = worst <= 1.0 and not moved
    ok &= good
    speed = []
    for t in (1, 2):
        # A peer timed only at 1 thread (spconv) is compared at 1 thread: its only right setting.
        p = best.get(("peer", t), best[("peer", 1)])
        o = best[("ort", t)]
        mark = "" if ("peer", t) in best else "*"
        speed.append(f"{t}t {o * 1e3:8.1f} ms vs {p * 1e3:8.1f}{mark:1} ms = {p / o:5.2f}x")
    rows.append(f"{label} CPU  {'-':>7}  {'OK ' if good else 'BAD'} {worst:8.2e}  {'; '.join(speed)}   {what}")

    for row in common.mlu_rows(library):
        # The MLU row: the provider's defaults (auto, no MLU-OPS library: the BANG kernels).
        options = None if row == "MLU" else {"mlu_backend": row, "mluops_library": mluops_library}
        out, emu, (on, want, assigned, missed), counts, session, where = common.mlu_run(g.model, library, g.feeds, options)
        ratio, text = common.compare(out, ref, g.canonical, g.tolerances)
        fallbacks, declines, why = g.run_time.get(row, (0, 0, ""))
        expect = placement.Expectation(off_card=g.off_card.get(row, ""), cpu_fallbacks=fallbacks,
                                       run_time_declines=declines)
        described = expect.describe() + (f" ({why})" if why else "")
        wrong = placement.judge(counts, expect)
        if row == "MLU":
            # Every node with a BANG kernel is on the card (the MLU-OPS ones need a library).
            wrong += [f"must be on MLU but not: {', '.join(missed)}"] if missed else []
            on_mlu = on
        elif row == "bang" and counts["bang"] != on_mlu:
            # Without a library the default (auto) path is the BANG one: the same nodes.
            wrong.append(f"{counts['bang']} nodes ran on bang, {on_mlu} on the MLU row")
        bus = ""
        if row != "MLU":
            bus, below = bytes_row(g, library, options, session, where, row, crossings, notes)
            wrong += below
        good = ratio <= 1.0 and not wrong
        ok &= good
        peer = f" [{placement.EMULATED_MLUOPS}]" if row in ("mluops", "auto") and counts["mluops"] and \
            placement.emulated_mluops(mluops_library) else ""
        what = "; ".join([text] + wrong)
        if row == "MLU":
            rows.append(f"{label} MLU  {on:>3}/{want:<3}  {'OK ' if good else 'BAD'} {ratio:8.2e}  {assigned} nodes assigned; "
                        f"emulated card {emu * 1e3:8.1f} ms (the emulator's time, not an MLU's); "
                        f"{placement.summary(counts, library)}; {described}   {what}")
        else:
            rows.append(f"{label} {row:<6} {'OK ' if good else 'BAD'} {ratio:8.2e}  {placement.summary(counts, library)}, "
                        f"{sum(session['claimed'].values())} claimed, {session['declined']} declined; {described}; "
                        f"host<->card (ONNX Runtime's copies included) {bus}{peer}   {what}")
            rows += notes
            notes.clear()
    return rows, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", choices=common.SCALES, default="full")
    ap.add_argument("--networks", default=",".join(NETWORKS), help="comma-separated subset of " + ",".join(NETWORKS))
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds after one warm-up (best is kept)")
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--library", default=os.environ.get("MLU_EP_LIB")
                    or str(REPO / "target" / "release" / "libonnxruntime_ep_mlu.so"))
    ap.add_argument("--mluops-library", help="the libmluops.so of the mluops backend rows (default: the emulated "
                    "one beside the library, examples/libmluops_emulated.so)")
    ap.add_argument("--crossings", type=int, default=0, metavar="N",
                    help="under each card backend's row, the N largest tensors of each kind that cross between "
                    "host and card (to the card, back, weights) with their producer and readers")
    args = ap.parse_args(argv)
    chosen = [n.strip() for n in args.networks.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in NETWORKS]
    if unknown:
        ap.error(f"unknown network(s) {unknown}; choose from {list(NETWORKS)}")
    if not Path(args.library).is_file():
        sys.exit(f"networks/run.py: {args.library} not found: build it with `cargo build --release --lib` or pass --library")
    library = str(Path(args.library).resolve())
    mluops_library = args.mluops_library or str(Path(library).parent / "examples" / "libmluops_emulated.so")
    if not Path(mluops_library).is_file():
        sys.exit(f"networks/run.py: {mluops_library} not found: build it with `cargo build --release --example "
                 "mluops_emulated` or pass --mluops-library")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    import onnxruntime
    import spconv
    import torchvision

    print(f"networks ({args.scale} scale, seed {args.seed}): onnxruntime {onnxruntime.__version__} with "
          f"{Path(library).name} against torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"spconv {spconv.__version__}; {os.cpu_count()} cores; best of {args.repeat} interleaved rounds")
    print("network       graph     path MLU/must  ok  worst/tol  time: onnxruntime vs peer eager at 1 and 2 threads "
          "(peer / onnxruntime; * the peer at 1 thread)   worst output")
    failed = []
    for name in chosen:
        mod = importlib.import_module(f"networks.{NETWORKS[name]}")
        t0 = time.perf_counter()
        try:
            case = mod.case(args.scale, args.seed)
        except Exception:
            traceback.print_exc()
            failed.append(f"{name}: building or exporting the network failed")
            continue
        peers = ", ".join(sorted({g.peer_name for g in case.graphs}))
        print(f"# {name}: {case.config}; peer {peers} (built and exported in {time.perf_counter() - t0:.1f} s)")
        for g in case.graphs:
            try:
                rows, ok = run_graph(case, g, library, args.repeat, mluops_library, args.crossings)
            except Exception:
                traceback.print_exc()
                failed.append(f"{name} {g.name}: a session failed")
                continue
            for r in rows:
                print(r, flush=True)
            if g.note:
                print(f"{'':23}({g.note})")
            if not ok:
                failed.append(f"{name} {g.name}")
    if failed:
        print("networks: FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    print(f"networks: all {len(chosen)} networks agree with their peers on both paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
