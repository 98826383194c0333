"""The main job: runs models/mluops_demo.onnx under onnxruntime with libonnxruntime_ep_mlu.so,
first registered as a custom-op library (CPU kernels), then as the MLUExecutionProvider
plugin EP on the emulated MLU card; prints which provider ran each node (from the session's
assignment record) and checks every output against the golden outputs stored in
models/mluops_demo.npz (computed by make_demo_data.py with the independent numpy
references, not by this library) with onnxruntime_ep_mlu.regression's compare (exact, or
the accumulating class with its per-element bound); the MLU path fails too when no node ran
on the card or a run-time CPU fallback or decline happened (onnxruntime_ep_mlu.placement:
the provider's traffic report and ONNX Runtime's warnings).

Usage: python models/run_demo.py [path/to/libonnxruntime_ep_mlu.so]
"""

import gc
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from onnxruntime_ep_mlu import placement  # noqa: E402
from onnxruntime_ep_mlu.regression import EXACT, compare  # noqa: E402

# Outputs compared bit for bit (indices, and DynamicScatterBackward whose class is exact);
# the others by regression.compare's default for floats: the contract's accumulating class
# and its per-element bound.
EXACT_OUTPUTS = {"pos_memo", "subm_pairs", "subm_out", "subm_num", "down_pairs", "down_out", "down_num", "ds_grad_feats"}


EP = "MLUExecutionProvider"


def check(sess, outs, data):
    """Prints one line per output against its golden; returns the number of failures."""
    print(f"{'output':<20} {'shape':<20} {'check':<14} {'result'}")
    failed = 0
    for meta, value in zip(sess.get_outputs(), outs):
        exact = meta.name in EXACT_OUTPUTS
        ratio, detail = compare(value, data["out." + meta.name], EXACT if exact else None)
        ok = ratio <= 1
        failed += not ok
        kind = "exact" if exact else "accumulating"
        print(f"{meta.name:<20} {str(list(value.shape)):<20} {kind:<14} {'OK ' if ok else 'FAIL'} {detail}")
    return failed


def run(title, make_session, model, data, on_card: str | None):
    """Runs the demo twice in a new session and checks it; ``on_card``: the library whose
    MLUExecutionProvider the session is (else None), judged by its traffic report and ONNX Runtime's warnings too
    (onnxruntime_ep_mlu.placement: nodes on the card, no run-time fallback or decline).
    Returns the number of failures."""
    with placement.traffic_report() as report, placement.ort_warnings() as warned:
        sess = make_session()
        feeds = {i.name: data["in." + i.name] for i in sess.get_inputs()}
        sess.run(None, feeds)  # first run: allocations
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        elapsed = time.perf_counter() - t0
        where = {}
        for sub in sess.get_provider_graph_assignment_info():
            for node in sub.get_nodes():
                where[node.name] = sub.ep_name
        on_ep = sum(v == EP for v in where.values())
        print(f"== {title}: {len(model.graph.node)} nodes, {on_ep} on {EP}, run in {elapsed * 1e3:.1f} ms")
        print(f"{'node':<18} {'op':<34} {'provider':<22} {'outputs'}")
        for n in model.graph.node:
            op = f"{n.domain + '.' if n.domain else ''}{n.op_type}"
            print(f"{n.name:<18} {op:<34} {where.get(n.name, '?'):<22} {', '.join(n.output)}")
        print()
        failed = check(sess, outs, data)
        del sess
        gc.collect()  # the session's end writes the provider's session line
        lines = placement.read_report(report)
    if on_card:
        counts = placement.counts(lines, warned, on_card)
        wrong = placement.judge(counts)
        print(f"placement over both runs: {placement.summary(counts, on_card)}: {'OK' if not wrong else 'FAIL ' + '; '.join(wrong)}")
        failed += bool(wrong)
    print()
    return failed


def main():
    lib = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MLU_EP_LIB")
    if not lib or not os.path.exists(lib):
        sys.exit(f"library not found: {lib!r} (pass the path to libonnxruntime_ep_mlu.so)")
    lib = os.path.abspath(lib)  # register_execution_provider_library resolves relative paths elsewhere
    model_path = os.path.join(HERE, "mluops_demo.onnx")
    data = np.load(os.path.join(HERE, "mluops_demo.npz"))
    model = onnx.load(model_path)
    print(f"onnxruntime {ort.__version__}, library {lib}\n")

    def options():
        so = ort.SessionOptions()
        # Warnings logged: placement.ort_warnings counts them (the run-time fallback's is one).
        so.log_severity_level = 2
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        return so

    # 1. The custom-op library alone: every mluops node on the CPU kernels.
    def cpu_session():
        so = options()
        so.register_custom_ops_library(lib)
        return ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])

    failed = run("CPU path (register_custom_ops_library)", cpu_session, model, data, on_card=None)

    # 2. The plugin EP on the emulated MLU card (MLU_EP_EMULATE=1: the BANG kernels compiled
    #    for the host; no MLU hardware is involved).
    os.environ["MLU_EP_EMULATE"] = "1"
    ort.register_execution_provider_library(EP, lib)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    if not devices:
        sys.exit(f"{EP} reports no device")
    meta = dict(devices[0].device.metadata)

    def mlu_session():
        so = options()
        so.add_provider_for_devices(devices, {})
        return ort.InferenceSession(model_path, so)

    failed += run(f"{EP} on {meta.get('Description')} ({meta.get('architecture')})", mlu_session, model, data, on_card=lib)

    if failed:
        sys.exit(f"{failed} output(s) differ from the goldens")
    print("all outputs match the goldens on both paths")


if __name__ == "__main__":
    main()
