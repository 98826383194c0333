"""The rehearsal's broken-toolkit check (scripts/rehearse_card.sh): the library was built by a
stand-in cncc that fails the kernel family sparse_conv (MLU_STANDIN_CNCC_FAIL). The card must
still be listed; on `bang`, GetIndicePairs (sparse_conv) runs on the CPU and the other
families on the card; on `mluops`, GetIndicePairs still runs on the card (its MLU-OPS path
needs only our value checks) while IndiceConv, whose pre-call steps need sparse_conv, runs on
the CPU, the reason naming the family. Every output equals the CPU path's.

usage: one_family_failed.py <libonnxruntime_ep_mlu.so>
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
from conftest import DOMAIN, IR_VERSION, OPSETS  # noqa: E402
from reference import gip_sites  # noqa: E402

EP = "MLUExecutionProvider"


def run(model, feeds, lib, devices, backend):
    """(node -> provider, outputs, the session's declines, CPU-path outputs)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "traffic.jsonl")
        os.environ["MLU_EP_TRAFFIC"] = report
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        so.add_provider_for_devices(devices, {"mlu_backend": backend})
        sess = ort.InferenceSession(model, so)
        where = {n.name: s.ep_name for s in sess.get_provider_graph_assignment_info() for n in s.get_nodes()}
        outs = sess.run(None, feeds)
        del sess
        gc.collect()
        del os.environ["MLU_EP_TRAFFIC"]
        lines = [json.loads(x) for x in Path(report).read_text().splitlines()]
    (session,) = [x for x in lines if "session" in x]
    cpu_so = ort.SessionOptions()
    cpu_so.register_custom_ops_library(lib)
    cpu = ort.InferenceSession(model, cpu_so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(outs, cpu):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-4, atol=1e-5)
    return where, json.dumps(session["declines"])


def main() -> int:
    lib = sys.argv[1]
    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library(EP, lib)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP and dict(d.device.metadata)["emulated"] == "false"]
    assert devices, "the card is listed although one kernel family failed to build"
    failures = []

    data = np.load(REPO / "models" / "mluops_demo.npz")
    demo = str(REPO / "models" / "mluops_demo.onnx")
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
    where, declines = run(demo, feeds, lib, devices[:1], "bang")
    print(f"one_family_failed: bang, demo: {where}")
    for node, want in [("subm_rules", "CPUExecutionProvider"), ("down_rules", "CPUExecutionProvider"),
                       ("voxel_pooling", EP), ("fp_backward", EP), ("psroi_backward", EP)]:
        if where.get(node) != want:
            failures.append(f"bang: {node} ran on {where.get(node)}, expected {want}")
    if "sparse_conv" not in declines:
        failures.append(f"bang: no decline names the family sparse_conv: {declines}")

    rng = np.random.default_rng(4)
    sites = gip_sites(rng, 2, (4, 5, 6), 40)
    feeds = {"sites": sites, "site_feats": rng.standard_normal((len(sites), 3)).astype(np.float32),
             "filters": rng.standard_normal((27, 3, 4)).astype(np.float32)}
    nodes = [
        helper.make_node("GetIndicePairs", ["sites"], ["pairs", "out", "num"], domain=DOMAIN, name="gip", batch_size=2,
                         spatial_shape=[4, 5, 6], kernel_size=[3, 3, 3], stride=[2, 2, 2], padding=[1, 1, 1]),
        helper.make_node("IndiceConv", ["site_feats", "filters", "pairs", "num", "out"], ["conv"], domain=DOMAIN,
                         name="conv"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g",
        [vi("sites", TensorProto.INT32, list(sites.shape)), vi("site_feats", TensorProto.FLOAT, [len(sites), 3]),
         vi("filters", TensorProto.FLOAT, [27, 3, 4])],
        [vi("conv", TensorProto.FLOAT, None), vi("num", TensorProto.INT32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS],
                              ir_version=IR_VERSION).SerializeToString()
    where, declines = run(model, feeds, lib, devices[:1], "mluops")
    print(f"one_family_failed: mluops, GetIndicePairs -> IndiceConv: {where}; declines {declines}")
    if where.get("gip") != EP or where.get("conv") != "CPUExecutionProvider":
        failures.append(f"mluops: gip on {where.get('gip')} (expected the card), conv on {where.get('conv')} (expected CPU)")
    if "sparse_conv" not in declines:
        failures.append(f"mluops: IndiceConv's decline does not name the family sparse_conv: {declines}")
    for f in failures:
        print(f"one_family_failed: FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
