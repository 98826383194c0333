"""Model-level regression runner of the model zoo (models/zoo.rs): every model runs on the CPU
path (the custom-op library registered with SessionOptions.register_custom_ops_library) and
under the MLUExecutionProvider plugin EP on the emulated card (MLU_EP_EMULATE=1: the BANG
kernels compiled for the host; no MLU hardware is involved). Every output is compared with
its golden (models/<name>.npz, computed by make_zoo_goldens.py with independent numpy models,
never by onnxruntime or this library) under its tolerance in models/zoo.json, and one line per
model and provider is printed: nodes on the MLU / nodes ORT assigned (from the session's
assignment record; the model's own node count in parentheses, ORT fuses or folds some), the
worst output against its tolerance, and the run time. An MLU row also reads the provider's
traffic report and ONNX Runtime's warnings of its runs (onnxruntime_ep_mlu.placement) and
fails when no node ran on the card or a run-time CPU fallback or decline happened, except
the ones a model's inputs cause on MLU-OPS that zoo.json states (``mluops_run_time``: per
``mlu_backend``, the fallbacks and declines of one run and whether anything stays on the
card, with why).

The EP declines the nodes no card backend of it runs (the forward partners IndiceConv,
ThreeInterpolate and PsRoiPool without an MLU-OPS library, DynamicScatter under
mlu_backend=mluops;
DynamicScatterBackward mean/sum; GetIndicePairs transpose): they run on ONNX Runtime's CPU provider inside the EP session, and the table
lists them.

Usage: python models/run_zoo.py [path/to/libonnxruntime_ep_mlu.so] [--models bevdepth,...]
       [--providers cpu,mlu] [--repeat 5] [-v] [--traffic]

--traffic instead runs every model once under the MLUExecutionProvider with MLU_EP_TRAFFIC
set (src/ep/traffic.rs) and prints, per claimed node, what crossed the emulated card's
boundaries: bytes host->card, card->host and card->card, device memsets, GDRAM bytes the
kernels read and wrote (copies with a GDRAM end and atomics; scalar GDRAM accesses are not
counted), launches and queue synchronisations, against the least the operator must move (its
inputs' and outputs' bytes). The last line is
`traffic: <nodes> nodes, max card->host per node <B> bytes, worst GDRAM/minimum <R>x`.
The library defaults to $MLU_EP_LIB, else target/release/libonnxruntime_ep_mlu.so. Exits
non-zero when any output of any model fails its tolerance (onnxruntime_ep_mlu.regression's
compare), an MLU row's placement fails, or any session fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
from onnxruntime_ep_mlu import placement  # noqa: E402
from onnxruntime_ep_mlu.regression import compare  # noqa: E402

EP = "MLUExecutionProvider"


def assignment(sess) -> list[tuple[str, str, str, str]]:
    """(provider, node name, domain, op_type) of every node ORT assigned."""
    out = []
    for sub in sess.get_provider_graph_assignment_info():
        for node in sub.get_nodes():
            out.append((sub.ep_name, node.name, node.domain, node.op_type))
    return out


def options(warnings: bool = False) -> ort.SessionOptions:
    """``warnings``: log ONNX Runtime's warnings (an MLU session's, which placement.ort_warnings
    counts: the run-time fallback's is one); else errors only."""
    so = ort.SessionOptions()
    so.log_severity_level = 2 if warnings else 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so


def expectation(spec: dict, lines: list[dict], runs: int) -> placement.Expectation:
    """What an MLU row of this model must show over ``runs`` runs: nodes on the card and no
    run-time fallback or decline, unless zoo.json's ``mluops_run_time`` names the ones its
    inputs cause under the session's ``mlu_backend`` (MLU_EP_BACKEND, default auto) once
    MLU-OPS claimed nodes at session creation (the session line's ``claimed``; without a
    library none is claimed and the model runs as on ``bang``)."""
    sessions = [x for x in lines if "session" in x]
    claimed = sessions[0]["claimed"]["mluops"] if len(sessions) == 1 else 0
    documented = spec.get("mluops_run_time", {})
    row = documented.get(os.environ.get("MLU_EP_BACKEND", "auto")) if claimed else None
    if row is None:
        return placement.Expectation()
    return placement.Expectation(
        off_card=documented["why"] if row.get("off_card") else "",
        cpu_fallbacks=row.get("cpu_fallbacks", 0) * runs,
        run_time_declines=row.get("run_time_declines", 0) * runs,
    )


def run_one(name, provider, make_session, spec, data, model_nodes, repeat, verbose, lib):
    """Runs one model on one provider; returns a result row (dict)."""
    row = {"model": name, "provider": provider, "ok": False, "nodes": "-", "worst": "-", "ms": math.nan, "notes": []}
    # On the MLU: the provider's traffic report and ONNX Runtime's warnings of every run, read
    # when the session has ended (placement.judge).
    with placement.traffic_report() as report, placement.ort_warnings() as warned:
        try:
            t0 = time.perf_counter()
            sess = make_session()
            row["create_ms"] = (time.perf_counter() - t0) * 1e3
            feeds = {i.name: data["in." + i.name] for i in sess.get_inputs()}
            outs = sess.run(None, feeds)  # first run: allocations, thread pool warm-up
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                outs = sess.run(None, feeds)
                times.append((time.perf_counter() - t0) * 1e3)
            row["ms"] = statistics.median(times)
        except Exception as e:  # noqa: BLE001 -- a failing session or run is a failed row, not the end of the run
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            row["worst"] = "ERROR"
            row["notes"].append(f"{type(e).__name__}: {msg}")
            if verbose:
                traceback.print_exc()
            return row
        placed = assignment(sess)
        out_names = [m.name for m in sess.get_outputs()]
        del sess
        gc.collect()  # the session's end writes the provider's session line
        lines = placement.read_report(report)

    on_mlu = sum(p == EP for p, *_ in placed)
    row["nodes"] = f"{on_mlu}/{len(placed)} ({model_nodes})"
    wrong = []
    if provider != "CPU":
        declined = sorted({op for p, _, dom, op in placed if dom == "mluops" and p != EP})
        claimed = sorted({op for p, _, dom, op in placed if dom == "mluops" and p == EP})
        row["notes"].append(f"on MLU: {', '.join(claimed) or 'none'}; mluops on CPU: {', '.join(declined) or 'none'}")
        counts = placement.counts(lines, warned, lib)
        expect = expectation(spec, lines, repeat + 1)
        wrong = placement.judge(counts, expect)
        row["notes"].append(f"{placement.summary(counts, lib)} over {repeat + 1} runs; {expect.describe()}")

    worst, worst_desc, failed = -1.0, "", [f"placement: {w}" for w in wrong]
    for out_name, value in zip(out_names, outs):
        tol = spec["outputs"][out_name]
        ratio, desc = compare(value, data["out." + out_name], tol)
        if verbose:
            print(
                f"    {name:<13} {provider:<4} {out_name:<20} {list(value.shape)!s:<18} {tol['class']:<12} {'OK  ' if ratio <= 1 else 'FAIL'} {desc}"
            )
        if ratio > 1:
            failed.append(f"{out_name}: {desc}")
        if ratio > worst:
            worst, worst_desc = ratio, f"{out_name}: {desc}"
    missing = set(spec["outputs"]) - set(out_names)
    if missing:
        failed.append(f"outputs missing from the session: {sorted(missing)}")
    row["worst"] = worst_desc
    row["notes"] = [f"also FAIL {f}" for f in failed if f != worst_desc] + row["notes"]
    row["ok"] = not failed
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", nargs="?", default=None, help="libonnxruntime_ep_mlu.so")
    ap.add_argument("--models", default=None, help="comma-separated subset (default: all of zoo.json)")
    ap.add_argument("--providers", default="cpu,mlu", help="cpu, mlu or both (default)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per session (median reported)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per output")
    ap.add_argument("--traffic", action="store_true", help="per-node card traffic of one run of each model (MLU only)")
    ap.add_argument(
        "--card", type=int, default=None, help="run on this real card (scripts/test.sh --card) instead of the emulated one"
    )
    args = ap.parse_args()
    if args.traffic:
        args.providers = "mlu"

    lib = (
        args.lib or os.environ.get("MLU_EP_LIB") or os.path.join(REPO, "target", "release", "libonnxruntime_ep_mlu.so")
    )
    if not os.path.exists(lib):
        sys.exit(f"library not found: {lib!r} (pass the path to libonnxruntime_ep_mlu.so)")
    lib = os.path.abspath(lib)  # register_execution_provider_library resolves relative paths elsewhere
    with open(os.path.join(HERE, "zoo.json")) as f:
        zoo = json.load(f)["models"]
    names = list(zoo) if args.models is None else [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in zoo]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {list(zoo)}")
    providers = [p for p in args.providers.split(",") if p]
    if not providers or any(p not in ("cpu", "mlu") for p in providers):
        sys.exit(f"--providers takes cpu and/or mlu, got {args.providers!r}")

    print(f"onnxruntime {ort.__version__}, library {lib}")
    devices = []
    if "mlu" in providers:
        # The factory reads MLU_EP_EMULATE when the library is registered.
        if args.card is None:
            os.environ["MLU_EP_EMULATE"] = "1"
        ort.register_execution_provider_library(EP, lib)
        devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
        if args.card is not None:
            devices = [
                d
                for d in devices
                if d.device.device_id == args.card and dict(d.device.metadata).get("emulated") == "false"
            ]
        if not devices:
            sys.exit(f"{EP} reports no device" + (f" that is real card {args.card}" if args.card is not None else ""))
        meta = dict(devices[0].device.metadata)
        print(
            f"{EP}: {len(devices)} device(s), {meta.get('Description', '?')} ({meta.get('architecture', '?')}, emulated={meta.get('emulated', '?')})"
        )
    print()

    if args.traffic:
        sys.exit(traffic_table(names, zoo, devices))
    rows = []
    for name in names:
        spec = zoo[name]
        model_path = os.path.join(HERE, spec["model"])
        data = np.load(os.path.join(HERE, spec["data"]))
        model_nodes = len(onnx.load(model_path, load_external_data=False).graph.node)

        def cpu_session(model_path=model_path):
            so = options()
            so.register_custom_ops_library(lib)
            return ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])

        def mlu_session(model_path=model_path):
            so = options(warnings=True)
            so.add_provider_for_devices(devices, {})
            return ort.InferenceSession(model_path, so)

        for p in providers:
            title, make = ("CPU", cpu_session) if p == "cpu" else ("MLU", mlu_session)
            rows.append(run_one(name, title, make, spec, data, model_nodes, args.repeat, args.verbose, lib))

    print()
    header = f"{'model':<13} {'provider':<9} {'MLU/assigned (model)':<21} {'ms':>8}  {'result':<6} worst output against its tolerance"
    print(header)
    print("-" * len(header))
    for r in rows:
        ms = f"{r['ms']:.1f}" if not math.isnan(r["ms"]) else "-"
        print(
            f"{r['model']:<13} {r['provider']:<9} {r['nodes']:<21} {ms:>8}  {'OK' if r['ok'] else 'FAIL':<6} {r['worst']}"
        )
        for note in r["notes"]:
            print(f"{'':<13} {'':<9} {'':<21} {'':>8}  {'':<6} {note}")
    failed = [r for r in rows if not r["ok"]]
    print()
    if failed:
        print(
            f"{len(failed)} of {len(rows)} model runs FAILED: {', '.join(r['model'] + '/' + r['provider'] for r in failed)}"
        )
        sys.exit(1)
    print(f"all {len(rows)} model runs match their goldens")


def traffic_table(names, zoo, devices) -> int:
    """Prints the per-node traffic of one run of each model; returns the exit status."""
    import tempfile

    rows = []
    for name in names:
        spec = zoo[name]
        so = options()
        so.add_provider_for_devices(devices, {})
        sess = ort.InferenceSession(os.path.join(HERE, spec["model"]), so)
        data = np.load(os.path.join(HERE, spec["data"]))
        feeds = {i.name: data["in." + i.name] for i in sess.get_inputs()}
        sess.run(None, feeds)  # warm-up, not recorded
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "traffic.jsonl")
            os.environ["MLU_EP_TRAFFIC"] = path
            try:
                sess.run(None, feeds)
            finally:
                del os.environ["MLU_EP_TRAFFIC"]
            with open(path) as f:
                # Node lines only: a session's summary line comes when its provider is released.
                rows += [dict(r, model=name) for r in map(json.loads, f) if "op" in r]
    if not rows:
        print("traffic: no node ran on the MLU")
        return 1
    header = (f"{'model':<13} {'op':<25} {'node':<14} {'backend':<7} {'h2d':>6} {'d2h':>6} {'d2d':>9} {'memset':>9} "
              f"{'GDRAM rd':>10} {'GDRAM wr':>10} {'launch':>6} {'sync':>4} {'minimum':>10} {'GDRAM/min':>9}")
    print(header)
    print("-" * len(header))
    worst = 0.0
    for r in rows:
        gdram = r["gdram_read"] + r["gdram_write"] + r["memset"] + 2 * r["d2d"]
        r["ratio"] = gdram / r["minimum"] if r["minimum"] else 0.0
        worst = max(worst, r["ratio"])
        print(f"{r['model']:<13} {r['op']:<25} {r['node'][:14]:<14} {r['backend']:<7} {r['h2d']:>6} {r['d2h']:>6} {r['d2d']:>9} "
              f"{r['memset']:>9} {r['gdram_read']:>10} {r['gdram_write']:>10} {r['launches']:>6} {r['syncs']:>4} "
              f"{r['minimum']:>10} {r['ratio']:>8.2f}x")
    print()
    print("GDRAM = kernels' reads + writes + memsets + 2 x card->card copies; minimum = the node's inputs + outputs.")
    print(f"traffic: {len(rows)} nodes, max card->host per node {max(r['d2h'] for r in rows)} bytes, "
          f"worst GDRAM/minimum {worst:.2f}x")
    return 0


if __name__ == "__main__":
    main()
