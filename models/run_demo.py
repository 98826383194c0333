"""The main job: runs models/mluops_demo.onnx under onnxruntime with libonnxruntime_ep_mlu.so
registered as a custom-op library, prints what ran, and checks every output against the
golden outputs stored in models/mluops_demo.npz (computed by make_demo_data.py with the
independent numpy references, not by this library).

Usage: python models/run_demo.py [path/to/libonnxruntime_ep_mlu.so]
"""

import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from reference import accumulating_metrics  # noqa: E402

# Outputs compared bit for bit (indices, and DynamicScatterBackward whose class is exact);
# the others use the contract's accumulating class.
EXACT = {"pos_memo", "subm_pairs", "subm_out", "subm_num", "down_pairs", "down_out", "down_num", "ds_grad_feats"}
TOL = 3e-3


def main():
    lib = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MLU_EP_LIB")
    if not lib or not os.path.exists(lib):
        sys.exit(f"library not found: {lib!r} (pass the path to libonnxruntime_ep_mlu.so)")
    model_path = os.path.join(HERE, "mluops_demo.onnx")
    data = np.load(os.path.join(HERE, "mluops_demo.npz"))
    model = onnx.load(model_path)

    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: data["in." + i.name] for i in sess.get_inputs()}
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    elapsed = time.perf_counter() - t0

    print(f"onnxruntime {ort.__version__}, library {lib}")
    print(f"model {os.path.relpath(model_path)}: {len(model.graph.node)} nodes, run in {elapsed * 1e3:.1f} ms on CPU")
    print(f"{'node':<18} {'op':<34} {'outputs'}")
    for n in model.graph.node:
        op = f"{n.domain + '.' if n.domain else ''}{n.op_type}"
        print(f"{n.name:<18} {op:<34} {', '.join(n.output)}")
    print()
    print(f"{'output':<20} {'shape':<20} {'check':<14} {'result'}")
    failed = 0
    for meta, value in zip(sess.get_outputs(), outs):
        want = data["out." + meta.name]
        if value.shape != want.shape:
            ok, detail = False, f"shape {value.shape} != golden {want.shape}"
        elif meta.name in EXACT:
            mism = int(np.count_nonzero(value != want))
            ok, detail = mism == 0, f"{mism} mismatching elements"
        else:
            d1, d2 = accumulating_metrics(value, want)
            ok, detail = d1 <= TOL and d2 <= TOL, f"diff1 {d1:.2e} diff2 {d2:.2e} (<= {TOL})"
        failed += not ok
        kind = "exact" if meta.name in EXACT else "accumulating"
        print(f"{meta.name:<20} {str(list(value.shape)):<20} {kind:<14} {'OK ' if ok else 'FAIL'} {detail}")
    if failed:
        sys.exit(f"{failed} output(s) differ from the goldens")
    print("\nall outputs match the goldens")


if __name__ == "__main__":
    main()
