"""MLUExecutionProvider through onnxruntime 1.31.1 from Python, on the emulated MLU card
(MLU_EP_EMULATE=1: the BANG kernels of kernels/ compiled for the host; no MLU hardware), or
on the real cards under scripts/test.sh --card. Every session pins the card backend
(conftest.BACKEND: `bang` on the host; under --card each backend the host has, in turn), and
the placement each test expects is that backend's.

Which node ran on which provider is read from the session's graph-assignment record
(`session.record_ep_graph_assignment_info`), never inferred. Outputs are compared with the
same model run on the CPU path (custom-op library only): index outputs exactly, float
outputs in the contract's accumulating class."""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import BACKEND, CARD_MODE, DOMAIN, IR_VERSION, OPSETS, REPO, assert_accumulating, build_model, ep_devices, is_emulated
from reference import dsb_inputs, gip_sites, tib_reference

EP = "MLUExecutionProvider"
DEMO = REPO / "models" / "mluops_demo.onnx"
DEMO_DATA = REPO / "models" / "mluops_demo.npz"


def options(lib: Path | None = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if lib is not None:
        so.register_custom_ops_library(str(lib))
    return so


def mlu_session(model, devices, provider_options=None) -> ort.InferenceSession:
    so = options()
    so.add_provider_for_devices(devices, {"mlu_backend": BACKEND, **(provider_options or {})})
    return ort.InferenceSession(model, so)


def cpu_session(model, lib: Path) -> ort.InferenceSession:
    return ort.InferenceSession(model, options(lib), providers=["CPUExecutionProvider"])


def assignment(sess: ort.InferenceSession) -> dict[str, str]:
    """node name -> provider, from the session's record."""
    out = {}
    for sub in sess.get_provider_graph_assignment_info():
        for node in sub.get_nodes():
            out[node.name] = sub.ep_name
    return out


def assert_same(mlu_outs, cpu_outs, names):
    for name, a, b in zip(names, mlu_outs, cpu_outs):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{name}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        if np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert_accumulating(a, b.astype(np.float64), name)


def make_graph_model(nodes, inputs, outputs) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS], ir_version=IR_VERSION)
    return model.SerializeToString()


def vi(name, elem, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def placed(mluops: bool, bang: bool) -> str:
    """The provider a node runs on under BACKEND, given whether MLU-OPS and our BANG kernels
    claim it (docs/MLUOPS_BINDING.md §4, docs/CONTRACT.md's MLU lines); `auto` takes either."""
    on = {"bang": bang, "mluops": mluops, "auto": mluops or bang}[BACKEND]
    return EP if on else "CPUExecutionProvider"


# ----------------------------------------------------------------------------- devices
def test_each_card_is_an_npu_with_cambricon_vendor_id(mlu_devices):
    (d,) = mlu_devices
    assert d.ep_vendor == "Cambricon"
    assert d.device.type == ort.OrtHardwareDeviceType.NPU
    assert d.device.vendor_id == 0xCABC
    meta = dict(d.device.metadata)
    assert meta["emulated"] in ("true", "false")
    assert meta["architecture"].startswith("MLU")
    assert int(meta["nram_bytes"]) > 0
    if is_emulated(d):
        # The emulated card is an MLU370 (mtp_372) with its NRAM size.
        assert meta["architecture"].startswith("MLU370")
        assert int(meta["nram_bytes"]) == 768 * 1024


def test_without_a_card_or_the_emulator_the_ep_offers_no_device_and_says_why(mlu_lib):
    if any(not is_emulated(d) for d in ep_devices()):
        pytest.skip("needs a host without a Cambricon card: this one has a real card")
    # A fresh process: the factory reads MLU_EP_EMULATE when the library is registered.
    code = (
        "import onnxruntime as ort, sys\n"
        f"ort.register_execution_provider_library('{EP}', {str(mlu_lib)!r})\n"
        f"print(sum(d.ep_name == '{EP}' for d in ort.get_ep_devices()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLU_EP_EMULATE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"
    lines = [line for line in out.stderr.splitlines() if "MLUExecutionProvider: no MLU device" in line]
    assert len(lines) == 1, out.stderr


# ----------------------------------------------------------------------------- the five operators
def demo_feeds(sess):
    data = np.load(DEMO_DATA)
    return {i.name: data["in." + i.name] for i in sess.get_inputs()}


def test_all_five_operators_run_on_the_mlu_and_match_the_cpu_path(mlu_devices, mlu_lib):
    mlu = mlu_session(str(DEMO), mlu_devices)
    cpu = cpu_session(str(DEMO), mlu_lib)
    where = assignment(mlu)
    # MLU-OPS has no submanifold GetIndicePairs; our kernels run all six.
    for n in ["voxel_pooling", "down_rules", "fp_backward", "scatter_backward", "psroi_backward"]:
        assert where[n] == EP, f"{n} ran on {where.get(n)}"
    assert where["subm_rules"] == placed(mluops=False, bang=True), f"subm_rules ran on {where.get('subm_rules')}"
    assert where["relu_features"] == "CPUExecutionProvider"
    assert where["bev_to_nchw"] == "CPUExecutionProvider"
    feeds = demo_feeds(mlu)
    names = [o.name for o in mlu.get_outputs()]
    assert_same(mlu.run(None, feeds), cpu.run(None, feeds), names)


def test_providers_list_with_register_custom_ops_library(mlu_devices, mlu_lib):
    # providers=[...] does not register the EP's custom-op domain by itself: the user also
    # calls register_custom_ops_library (docs/USAGE.md: the registration pitfall).
    sess = ort.InferenceSession(str(DEMO), options(mlu_lib), providers=[EP, "CPUExecutionProvider"])
    where = assignment(sess)
    if EP not in ort.get_available_providers():
        # onnxruntime 1.24 does not list a registered plugin EP, so its Python layer does
        # not know the name: it warns and runs everything on CPU (docs/USAGE.md: add the EP by device).
        assert EP not in where.values(), where
    else:
        assert where["voxel_pooling"] == EP and where["psroi_backward"] == EP
    cpu = cpu_session(str(DEMO), mlu_lib)
    feeds = demo_feeds(sess)
    assert_same(sess.run(None, feeds), cpu.run(None, feeds), [o.name for o in sess.get_outputs()])


def test_providers_list_without_the_custom_op_library_fails_to_load_the_model(mlu_devices):
    with pytest.raises(Exception, match="mluops"):
        ort.InferenceSession(str(DEMO), options(), providers=[EP, "CPUExecutionProvider"])


# ----------------------------------------------------------------------------- partitioning
def test_declined_configurations_run_on_cpu_in_the_same_session(mlu_devices, mlu_lib):
    rng = np.random.default_rng(3)
    n, m, c = 60, 12, 5
    nodes, feeds = [], {}
    inputs = [vi("gvf", TensorProto.FLOAT, [m, c]), vi("feats", TensorProto.FLOAT, [n, c]), vi("vf", TensorProto.FLOAT, [m, c]),
              vi("p2v", TensorProto.INT32, [n]), vi("count", TensorProto.INT32, [m]), vi("sites", TensorProto.INT32, None)]
    ins = dsb_inputs(rng, n, m, c, "mean")
    feeds.update(zip(["gvf", "feats", "vf", "p2v", "count"], ins.values()))
    outputs = []
    for mode in ["max", "mean", "sum"]:
        nodes.append(helper.make_node("DynamicScatterBackward", ["gvf", "feats", "vf", "p2v", "count"], [f"g_{mode}"],
                                      domain=DOMAIN, name=f"dsb_{mode}", reduce_type=mode))
        outputs.append(vi(f"g_{mode}", TensorProto.FLOAT))
    spatial = (4, 5, 6)
    feeds["sites"] = gip_sites(rng, 2, spatial, 30)
    for transpose in [0, 1]:
        outs = [f"pairs_t{transpose}", f"out_t{transpose}", f"num_t{transpose}"]
        nodes.append(helper.make_node("GetIndicePairs", ["sites"], outs, domain=DOMAIN, name=f"gip_t{transpose}",
                                      batch_size=2, spatial_shape=list(spatial), kernel_size=[3, 3, 3], stride=[2, 2, 2],
                                      padding=[1, 1, 1], transpose=transpose))
        outputs += [vi(o, TensorProto.INT32) for o in outs]
    model = make_graph_model(nodes, inputs, outputs)
    mlu = mlu_session(model, mlu_devices)
    where = assignment(mlu)
    assert where["dsb_max"] == EP and where["gip_t0"] == EP
    for n_ in ["dsb_mean", "dsb_sum", "gip_t1"]:
        assert where[n_] == "CPUExecutionProvider", f"{n_} ran on {where.get(n_)}"
    cpu = cpu_session(model, mlu_lib)
    assert_same(mlu.run(None, feeds), cpu.run(None, feeds), [o.name for o in outputs])


def test_forward_operators_without_mlu_kernels_run_on_cpu_between_mlu_nodes(mlu_devices, mlu_lib):
    """IndiceConv, ThreeInterpolate and PsRoiPool have no BANG kernel, DynamicScatter no MLU-OPS
    path: a backend without one declines them, they run on CPU in the same session, and
    their outputs feed MLU nodes (DynamicScatterBackward, PsRoiPoolBackward) and take MLU
    outputs (GetIndicePairs). DynamicScatter runs on the BANG kernels (`bang`, `auto`)."""
    rng = np.random.default_rng(11)
    F, I = TensorProto.FLOAT, TensorProto.INT32
    n, c = 200, 6
    feeds = {
        "feats": rng.integers(-3, 4, (n, c)).astype(np.float32),
        "coors": rng.integers(-1, 4, (n, 3)).astype(np.int32),
        "sites": gip_sites(rng, 2, (4, 5, 6), 40),
        "filters": rng.standard_normal((27, 3, 4)).astype(np.float32),
        "tf": rng.standard_normal((2, 5, 16)).astype(np.float32),
        "tidx": rng.integers(0, 16, (2, 9, 3)).astype(np.int32),
        "tw": rng.random((2, 9, 3)).astype(np.float32),
        "maps": rng.standard_normal((2, 8, 8, 3 * 3 * 2)).astype(np.float32),
        "rois": np.array([[0, 0, 0, 5, 6], [1, 2, 1, 7, 7], [0, 3, 3, 3, 3]], np.float32),
    }
    feeds["site_feats"] = rng.standard_normal((len(feeds["sites"]), 3)).astype(np.float32)
    nodes = [
        helper.make_node("DynamicScatter", ["feats", "coors"], ["vf", "vc", "p2v", "cnt", "vn"], domain=DOMAIN, name="ds"),
        helper.make_node("Sin", ["vf"], ["gvf"], name="grad"),
        helper.make_node("DynamicScatterBackward", ["gvf", "feats", "vf", "p2v", "cnt", "vn"], ["gfeats"], domain=DOMAIN,
                         name="dsb"),
        helper.make_node("GetIndicePairs", ["sites"], ["pairs", "out", "num"], domain=DOMAIN, name="gip", batch_size=2,
                         spatial_shape=[4, 5, 6], kernel_size=[3, 3, 3], stride=[2, 2, 2], padding=[1, 1, 1]),
        helper.make_node("IndiceConv", ["site_feats", "filters", "pairs", "num", "out"], ["conv"], domain=DOMAIN, name="conv"),
        helper.make_node("ThreeInterpolate", ["tf", "tidx", "tw"], ["interp"], domain=DOMAIN, name="ti"),
        helper.make_node("PsRoiPool", ["maps", "rois"], ["pooled", "mapping"], domain=DOMAIN, name="psroi", pooled_height=3,
                         pooled_width=3, spatial_scale=1.0, output_dim=2),
        helper.make_node("Shape", ["maps"], ["maps_shape"], name="shape"),
        helper.make_node("PsRoiPoolBackward", ["pooled", "rois", "mapping", "maps_shape"], ["gmaps"], domain=DOMAIN,
                         name="psroi_grad", pooled_height=3, pooled_width=3, spatial_scale=1.0, output_dim=2),
    ]
    inputs = [vi(k, I if v.dtype == np.int32 else F, list(v.shape)) for k, v in feeds.items()]
    out_names = ["vf", "vc", "p2v", "cnt", "vn", "gfeats", "out", "conv", "interp", "pooled", "mapping", "gmaps"]
    outputs = [vi(o, I if o in {"vc", "p2v", "cnt", "vn", "out", "mapping"} else F) for o in out_names]
    model = make_graph_model(nodes, inputs, outputs)
    mlu = mlu_session(model, mlu_devices)
    where = assignment(mlu)
    assert where["ds"] == placed(mluops=False, bang=True), f"ds ran on {where.get('ds')}"
    for node in ["conv", "ti", "psroi"]:
        assert where[node] == placed(mluops=True, bang=False), f"{node} ran on {where.get(node)}"
    for node in ["dsb", "gip", "psroi_grad"]:
        assert where[node] == EP, f"{node} ran on {where.get(node)}"
    got, want = mlu.run(None, feeds), cpu_session(model, mlu_lib).run(None, feeds)
    assert_same(got, want, out_names)
    # Not trivial: voxels formed, some points dropped, the convolution and the pooling produced values.
    assert got[4][0] > 5 and (got[2] == -1).any() and np.abs(got[7]).sum() > 0 and np.abs(got[9]).sum() > 0


def test_static_shapes_beyond_the_kernels_limits_are_declined(mlu_devices, mlu_lib, tmp_path, monkeypatch):
    # DynamicScatterBackward with C = 60000: one point's rows exceed the kernel's NRAM tile.
    n, m, c = 3, 2, 60000
    rng = np.random.default_rng(1)
    feeds = {k: v for k, v in dsb_inputs(rng, n, m, c, "max").items()}
    spec = [(k, str(v.dtype), list(v.shape)) for k, v in feeds.items()]
    model = build_model("DynamicScatterBackward", {}, spec, "dsb_wide")
    mlu = mlu_session(model, mlu_devices)
    # Nor does MLU-OPS: its NRAM bound 5N + 20C + 4 (docs/MLUOPS_BINDING.md §3.1) is passed by
    # the static C alone, so no backend claims the node (it is never claimed to be declined
    # at every run).
    assert assignment(mlu)["dsb_wide"] == "CPUExecutionProvider"
    np.testing.assert_array_equal(mlu.run(None, feeds)[0], cpu_session(model, mlu_lib).run(None, feeds)[0])
    # The same node with a symbolic C is claimed (the limit is then checked at run time);
    # the run finds C beyond the kernel's limit and runs the node's CPU kernel instead.
    dyn = [(k, d, [None] * len(s)) for k, d, s in spec]
    dyn_model = build_model("DynamicScatterBackward", {}, dyn, "dsb_dyn")
    report = tmp_path / "traffic.jsonl"
    # Earlier tests' sessions released now, not into this report.
    gc.collect()
    monkeypatch.setenv("MLU_EP_TRAFFIC", str(report))
    dyn_sess = mlu_session(dyn_model, mlu_devices)
    assert assignment(dyn_sess)["dsb_dyn"] == EP
    np.testing.assert_array_equal(dyn_sess.run(None, feeds)[0], cpu_session(dyn_model, mlu_lib).run(None, feeds)[0])
    # ... and a valid C in the same session still runs on the card.
    small = {k: v for k, v in dsb_inputs(rng, n, m, 8, "max").items()}
    np.testing.assert_array_equal(dyn_sess.run(None, small)[0], cpu_session(dyn_model, mlu_lib).run(None, small)[0])
    # The fallback is the expected one, and counted: the traffic report's node lines and the
    # session line written when the session ends.
    del dyn_sess
    gc.collect()
    monkeypatch.delenv("MLU_EP_TRAFFIC")
    lines = [json.loads(x) for x in report.read_text().splitlines()]
    runs = [x for x in lines if x.get("node") == "dsb_dyn"]
    # (MLU-OPS, first under `mluops` and `auto`, declines this C at run time too.)
    card = "bang" if BACKEND == "bang" else "mluops"
    assert [x["backend"] for x in runs] == ["cpu", card], runs
    assert "C = 60000" in runs[0]["why"] or "60000" in runs[0]["why"], runs[0]
    # dyn_sess's line is the last: its release ends the report.
    session = [x for x in lines if "session" in x][-1]
    assert session["cpu_fallbacks"] == 1 and session["card_runs"][card] == 1, session
    # The kernels' static limits below, decided at session creation on both backends (MLU-OPS
    # takes tensors below 2^31 elements; these sessions are not run).
    # VoxelPoolingForward whose output B*ny*nx*C exceeds int32 offsets (session only: the
    # output would be 16 GiB).
    vspec = [("geom_xyz", "int32", [1, 8, 3]), ("input_features", "float32", [1, 8, 1024])]
    big = build_model("VoxelPoolingForward", {"voxel_num": {"ints": [2048, 2048, 1]}}, vspec, "vpf_big")
    assert assignment(mlu_session(big, mlu_devices))["vpf_big"] == "CPUExecutionProvider"
    small = build_model("VoxelPoolingForward", {"voxel_num": {"ints": [64, 64, 1]}}, vspec, "vpf_small")
    assert assignment(mlu_session(small, mlu_devices))["vpf_small"] == EP
    # A grid size beyond the kernel's int32 arguments (the output itself is small).
    deep = build_model("VoxelPoolingForward", {"voxel_num": {"ints": [4, 4, 2**33]}}, vspec, "vpf_deep")
    assert assignment(mlu_session(deep, mlu_devices))["vpf_deep"] == "CPUExecutionProvider"
    # ThreeInterpolateBackward whose output B*C*m exceeds int32 offsets (session only).
    tspec = [("go", "float32", [2, 1024, 4]), ("idx", "int32", [2, 4, 3]), ("w", "float32", [2, 4, 3])]
    wide = build_model("ThreeInterpolateBackward", {"m": {"int": 2**20 + 1}}, tspec, "tib_wide")
    assert assignment(mlu_session(wide, mlu_devices))["tib_wide"] == "CPUExecutionProvider"
    narrow = build_model("ThreeInterpolateBackward", {"m": {"int": 2**20 - 1}}, tspec, "tib_narrow")
    assert assignment(mlu_session(narrow, mlu_devices))["tib_narrow"] == EP


def test_mixed_graph_keeps_a_tensor_on_the_mlu_between_two_mlu_nodes(mlu_devices, mlu_lib):
    # Relu (CPU) -> ThreeInterpolateBackward (MLU) -> ThreeInterpolateBackward (MLU) -> Abs (CPU)
    rng = np.random.default_rng(5)
    b, c, n1, m1, m2 = 2, 6, 40, 25, 9
    feeds = {
        "go": rng.standard_normal((b, c, n1)).astype(np.float32),
        "idx1": rng.integers(0, m1, (b, n1, 3)).astype(np.int32),
        "w1": rng.random((b, n1, 3)).astype(np.float32),
        "idx2": rng.integers(0, m2, (b, m1, 3)).astype(np.int32),
        "w2": rng.random((b, m1, 3)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Relu", ["go"], ["go_relu"], name="relu"),
        helper.make_node("ThreeInterpolateBackward", ["go_relu", "idx1", "w1"], ["g1"], domain=DOMAIN, name="tib1", m=m1),
        helper.make_node("ThreeInterpolateBackward", ["g1", "idx2", "w2"], ["g2"], domain=DOMAIN, name="tib2", m=m2),
        helper.make_node("Neg", ["g2"], ["out"], name="neg"),
    ]
    inputs = [vi(k, TensorProto.FLOAT if v.dtype == np.float32 else TensorProto.INT32, list(v.shape)) for k, v in feeds.items()]
    model = make_graph_model(nodes, inputs, [vi("out", TensorProto.FLOAT), vi("g1", TensorProto.FLOAT)])
    mlu = mlu_session(model, mlu_devices)
    where = assignment(mlu)
    assert where["tib1"] == EP and where["tib2"] == EP
    assert where["relu"] == "CPUExecutionProvider" and where["neg"] == "CPUExecutionProvider"
    out, g1 = mlu.run(None, feeds)
    expect_g1 = tib_reference(np.maximum(feeds["go"], 0), feeds["idx1"], feeds["w1"], m1)
    assert_accumulating(g1, expect_g1, "g1")
    assert_accumulating(out, -tib_reference(expect_g1.astype(np.float32), feeds["idx2"], feeds["w2"], m2), "out")
    cpu_out, cpu_g1 = cpu_session(model, mlu_lib).run(None, feeds)
    assert_accumulating(out, cpu_out.astype(np.float64), "out vs cpu")


def test_float16_runs_on_the_mlu(mlu_devices, mlu_lib):
    rng = np.random.default_rng(8)
    feeds = {
        "grad_output": rng.standard_normal((2, 4, 30)).astype(np.float16),
        "indices": rng.integers(0, 11, (2, 30, 3)).astype(np.int32),
        "weights": rng.random((2, 30, 3)).astype(np.float16),
    }
    spec = [(k, str(v.dtype), list(v.shape)) for k, v in feeds.items()]
    model = build_model("ThreeInterpolateBackward", {"m": {"int": 11}}, spec, "tib_f16")
    mlu = mlu_session(model, mlu_devices)
    assert assignment(mlu)["tib_f16"] == EP
    (got,) = mlu.run(None, feeds)
    assert got.dtype == np.float16
    ref = tib_reference(feeds["grad_output"].astype(np.float32), feeds["indices"], feeds["weights"].astype(np.float32), 11)
    assert_accumulating(got, ref, "float16 on the MLU")


# ----------------------------------------------------------------------------- errors and options
def test_bad_index_on_the_mlu_gives_the_contract_error(mlu_devices):
    feeds = {
        "grad_output": np.ones((1, 2, 4), np.float32),
        "indices": np.array([[[0, 1, 2], [0, 1, 5], [0, 0, 0], [1, 1, 1]]], np.int32),
        "weights": np.ones((1, 4, 3), np.float32),
    }
    spec = [(k, str(v.dtype), list(v.shape)) for k, v in feeds.items()]
    sess = mlu_session(build_model("ThreeInterpolateBackward", {"m": {"int": 5}}, spec, "tib_bad"), mlu_devices)
    assert assignment(sess)["tib_bad"] == EP
    with pytest.raises(Exception) as e:
        sess.run(None, feeds)
    msg = str(e.value)
    assert "INVALID_ARGUMENT" in msg and "mluops.ThreeInterpolateBackward node 'tib_bad'" in msg and "indices" in msg, msg


def test_device_id_option_selects_the_card_or_fails_clearly(mlu_devices, capfd):
    assert assignment(mlu_session(str(DEMO), mlu_devices, {"device_id": "0"}))["voxel_pooling"] == EP
    # The EP refuses to be created. onnxruntime up to 1.31 prints the error and falls back
    # to CPU, so nothing may run on the MLU; 1.32 raises it.
    cards = sorted(d.device.device_id for d in ep_devices())
    for value, message in [("7", f"no MLU card 7; this process has cards {cards}"), ("first", "'first' is not a device number")]:
        capfd.readouterr()
        try:
            sess = mlu_session(str(DEMO), mlu_devices, {"device_id": value})
        except Exception as e:  # noqa: BLE001 - onnxruntime's own error types
            err = str(e)
            sess = None
        else:
            captured = capfd.readouterr()
            err = captured.out + captured.err
        assert f"MLUExecutionProvider option device_id': {message}" in err, err
        assert sess is None or EP not in assignment(sess).values()


# ----------------------------------------------------------------------------- lifetime and threads
def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_two_hundred_sessions_and_concurrent_runs(mlu_devices):
    data = np.load(DEMO_DATA)
    model = DEMO.read_bytes()
    feeds = None
    before = None
    for i in range(200):
        sess = mlu_session(model, mlu_devices)
        if feeds is None:
            feeds = {x.name: data["in." + x.name] for x in sess.get_inputs()}
        sess.run(None, feeds)
        del sess
        if i == 49:
            before = rss_kib()
    grown = rss_kib() - before
    assert grown < 64 * 1024, f"RSS grew by {grown} KiB over 150 sessions"
    sess = mlu_session(model, mlu_devices)
    expected = sess.run(None, feeds)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: sess.run(None, feeds), range(16)))
    for outs in results:
        for a, b in zip(outs, expected):
            if np.issubdtype(a.dtype, np.integer):
                np.testing.assert_array_equal(a, b)
            else:
                assert_accumulating(a, b.astype(np.float64), "concurrent run")


# ----------------------------------------------------------------------------- registration lifetime
UNREGISTER_CHILD = """
import os, sys, numpy as np, onnxruntime as ort
os.environ["MLU_EP_EMULATE"] = "1"
lib, model, data = sys.argv[1:4]
EP = "MLUExecutionProvider"
ort.set_default_logger_severity(3)
ort.register_execution_provider_library(EP, lib)
so = ort.SessionOptions()
so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == EP], {})
sess = ort.InferenceSession(model, so)
npz = np.load(data)
feeds = {i.name: npz["in." + i.name] for i in sess.get_inputs()}
before = sess.run(None, feeds)
ort.unregister_execution_provider_library(EP)
after = sess.run(None, feeds)
np.savez(sys.argv[4], *before, *after)
del sess
print("ran", len(before))
"""


def test_unregistering_while_a_session_lives_keeps_the_session_working(mlu_lib, tmp_path):
    # ONNX Runtime calls this misuse; the session must still run (the factory outlives its
    # EPs and allocators, the library stays mapped) and the process must exit cleanly.
    out = tmp_path / "outs.npz"
    args = [sys.executable, "-c", UNREGISTER_CHILD, str(mlu_lib), str(DEMO), str(DEMO_DATA), str(out)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"child died with {p.returncode}: {p.stderr[-2000:]}"
    arrays = np.load(out)
    n = len(arrays.files) // 2
    names = [o.name for o in ort.InferenceSession(str(DEMO), options(mlu_lib), providers=["CPUExecutionProvider"]).get_outputs()]
    assert_same([arrays[f"arr_{n + i}"] for i in range(n)], [arrays[f"arr_{i}"] for i in range(n)], names)


SECOND_REGISTRATION_CHILD = """
import os, sys, onnxruntime as ort
os.environ["MLU_EP_EMULATE"] = "1"
lib = sys.argv[1]
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("MLUExecutionProvider", lib)
try:
    ort.register_execution_provider_library("second_name", lib)
    print("accepted")
except Exception as e:
    print("refused:", e)
print("devices", sum(d.ep_name == "MLUExecutionProvider" for d in ort.get_ep_devices()))
ort.unregister_execution_provider_library("MLUExecutionProvider")
ort.register_execution_provider_library("second_name", lib)
print("devices", sum(d.ep_name == "MLUExecutionProvider" for d in ort.get_ep_devices()))
"""


def test_the_library_serves_one_registration_per_process(mlu_lib):
    p = subprocess.run([sys.executable, "-c", SECOND_REGISTRATION_CHILD, str(mlu_lib)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("refused:") and "already registered in this process, as 'MLUExecutionProvider'" in lines[0], p.stdout
    # The same devices while registered once and after an unregister and a new registration:
    # this process's (the emulated card, as the child registers it too, besides any real card).
    devices = len(ep_devices()) + (1 if CARD_MODE else 0)
    assert lines[1:] == [f"devices {devices}"] * 2, p.stdout
