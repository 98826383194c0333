"""The card backends through real ONNX Runtime sessions: every model of the zoo on the
emulated card with `mlu_backend` = mluops, bang and auto (the MLU-OPS backend against the
emulated libmluops of mluops_emulated/, never Cambricon's library), each output against the
CPU custom-op session's, and the provider's counts read from the traffic report's session
line: which backend ran each node, no run-time CPU fallback, and the declines expected.

Each backend runs in its own process: the provider reads MLU_EP_EMULATE and the traffic
report's path from the environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, emulated_mluops, library_path

sys.path.insert(0, str(REPO / "python"))
from onnxruntime_ep_mlu import backends, operators, placement  # noqa: E402
from onnxruntime_ep_mlu.placement import EMULATED_MLUOPS  # noqa: E402

ZOO = REPO / "models"
#: The library's card backends, in auto's order (its table, src/ops/device/backends.rs).
BACKENDS = backends(str(library_path()))


SCRIPT = r"""
import json, os, sys
import numpy as np, onnxruntime as ort
lib, backend, mluops, zoo_dir, model, data, tolerances = sys.argv[1:8]
sys.path.insert(0, os.path.join(os.path.dirname(zoo_dir), "python"))
from onnxruntime_ep_mlu.regression import compare
ort.register_execution_provider_library("MLUExecutionProvider", lib)
# The emulated card, told by its metadata: the emulated libmluops computes on host memory.
devices = [d for d in ort.get_ep_devices() if d.ep_name == "MLUExecutionProvider" and dict(d.device.metadata).get("emulated") == "true"]
feeds_npz = np.load(os.path.join(zoo_dir, data))
cpu_opts = ort.SessionOptions(); cpu_opts.register_custom_ops_library(lib)
cpu = ort.InferenceSession(os.path.join(zoo_dir, model), cpu_opts)
feeds = {i.name: feeds_npz["in." + i.name] for i in cpu.get_inputs()}
want = cpu.run(None, feeds)
so = ort.SessionOptions(); so.log_severity_level = 3
so.add_provider_for_devices(devices, {"mlu_backend": backend, "mluops_library": mluops})
sess = ort.InferenceSession(os.path.join(zoo_dir, model), so)
got = sess.run(None, feeds)
# Each output not bit-identical to the CPU session's: (error / its zoo tolerance, what).
diffs = {}
for o, a, b in zip(sess.get_outputs(), got, want):
    same = a.shape == b.shape and np.array_equal(a.view(np.uint8) if a.dtype.kind == "f" else a,
                                                 b.view(np.uint8) if b.dtype.kind == "f" else b)
    if not same:
        diffs[o.name] = compare(a, b, json.loads(tolerances)[o.name])
del sess
print(json.dumps(diffs))
"""


def run_model(lib: Path, backend: str, name: str, spec: dict, tmp: Path) -> tuple[dict, list[dict]]:
    traffic = tmp / f"{name}-{backend}.jsonl"
    env = dict(os.environ, MLU_EP_EMULATE="1", MLU_EP_TRAFFIC=str(traffic))
    env.pop("MLU_EP_BACKEND", None)
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(lib), backend, str(emulated_mluops(lib)), str(ZOO), spec["model"], spec["data"],
         json.dumps(spec["outputs"])],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, f"{name} with mlu_backend={backend} failed:\n{p.stderr[-3000:]}"
    diffs = json.loads(p.stdout.strip().splitlines()[-1])
    lines = [json.loads(x) for x in traffic.read_text().splitlines()] if traffic.exists() else []
    return diffs, lines


def biased_indice_conv(model: Path) -> bool:
    import onnx

    return any(n.op_type == "IndiceConv" and len(n.input) > 5 and n.input[5] for n in onnx.load(str(model)).graph.node)


ULP_RULE = "within one ulp of an integer"


def zoo_models() -> dict:
    return json.loads((ZOO / "zoo.json").read_text())["models"]


def test_the_backends_export_is_the_rust_table():
    """onnxruntime_ep_mlu.backends() (MluEpBackends) gives the rows of the backend table in
    src/ops/device/backends.rs, in its order, and every backend an operator names is one."""
    source = (REPO / "src" / "ops" / "device" / "backends.rs").read_text()
    table = source[source.index("backends! {"):]
    table = table[:table.index("\n}")]
    rows = re.findall(r'^\s*\w+ = "([a-z_0-9]+)",$', table, re.M)
    assert rows and BACKENDS == rows, (BACKENDS, rows)
    named = {b for row in operators(str(library_path())) for b in row["backends"]}
    assert named <= set(BACKENDS), f"operators name backends the table lacks: {named - set(BACKENDS)}"


@pytest.mark.parametrize("backend", [*BACKENDS, "auto"])
def test_every_zoo_model_on_each_backend(backend, tmp_path):
    lib = library_path()
    totals = dict.fromkeys(BACKENDS, 0)
    for name, spec in zoo_models().items():
        diffs, lines = run_model(lib, backend, name, spec, tmp_path)
        nodes = [x for x in lines if "op" in x]
        sessions = [x for x in lines if "session" in x]
        assert len(sessions) == 1, f"{name}: one provider session line, got {sessions}"
        s = sessions[0]
        # The only run-time declines expected: MLU-OPS's PsRoiPool nodes whose rois have a bin
        # edge within one ulp of an integer (src/ops/psroipool/mluops.rs); rfcn_head has two.
        ulp = [x for x in nodes if ULP_RULE in x.get("why", "")]
        assert all(x["op"].startswith("PsRoiPool") for x in ulp), ulp
        assert bool(ulp) == (name == "rfcn_head" and backend != "bang"), f"{name} ({backend}): {ulp}"
        on_cpu = [x for x in nodes if x["backend"] == "cpu"]
        assert all(x in ulp for x in on_cpu), f"{name} ({backend}): unexpected run-time CPU fallbacks: {on_cpu}"
        assert s["cpu_fallbacks"] == len(on_cpu), f"{name} ({backend}): {s}"
        after = len(ulp) - len(on_cpu)
        want = {**dict.fromkeys(BACKENDS, 0), "mluops": after}
        assert s["run_time_declines"] == want, f"{name} ({backend}): unexpected run-time declines: {s}"
        assert sum(s["card_runs"].values()) == len(nodes) - len(on_cpu), f"{name}: node lines and counts disagree: {s}"
        for other in (b for b in BACKENDS if backend not in ("auto", b)):
            assert s["card_runs"][other] == 0 and s["claimed"][other] == 0, f"{name}: {other} ran under {backend}: {s}"
        # The MLU-OPS path computes with the emulated library's CPU kernels, the BANG path
        # with the BANG kernels: exact against the CPU session but for atomics' order, and
        # on MLU-OPS for IndiceConv's bias, added after the library's sums there; each
        # output within its zoo tolerance, element by element (regression.compare).
        if backend == "mluops" and not biased_indice_conv(ZOO / spec["model"]):
            assert diffs == {}, f"{name} on mluops ({EMULATED_MLUOPS}) differs from the CPU session: {diffs}"
        else:
            bad = {k: d for k, (ratio, d) in diffs.items() if not ratio <= 1}
            assert bad == {}, f"{name} ({backend}; on mluops: {EMULATED_MLUOPS}) beyond its tolerance: {bad}"
        for b in totals:
            totals[b] += s["card_runs"][b]
    # Under auto, the first backend of its order runs the nodes it supports.
    first = BACKENDS[0] if backend == "auto" else backend
    assert totals[first] > 0, f"no node of the zoo ran on {first} under {backend}: {totals}"


def test_an_unknown_backend_is_a_clear_provider_error(tmp_path):
    """CreateEp fails with the rule; onnxruntime's Python wrapper prints it and retries on
    the CPU provider (its behaviour, not ours: the C API returns the error)."""
    lib = library_path()
    spec = zoo_models()["pointpillars"]
    traffic = tmp_path / "t.jsonl"
    env = dict(os.environ, MLU_EP_EMULATE="1", MLU_EP_TRAFFIC=str(traffic))
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(lib), "cuda", "", str(ZOO), spec["model"], spec["data"],
         json.dumps(spec["outputs"])],
        env=env, capture_output=True, text=True, timeout=600,
    )
    said = p.stdout + p.stderr
    assert "EP Error" in said and "INVALID_ARGUMENT" in said and "option mlu_backend" in said, said[-2000:]
    assert f"'cuda' is not one of {', '.join(['auto', *BACKENDS])}" in said, said[-2000:]


FALLBACK_SCRIPT = r"""
import json, sys
import numpy as np, onnxruntime as ort
sys.path.insert(0, sys.argv[4])
from conftest import build_model
lib, backend, mluops = sys.argv[1:4]
ort.set_default_logger_severity(1)
ort.register_execution_provider_library("MLUExecutionProvider", lib)
# The emulated card, told by its metadata: the emulated libmluops computes on host memory.
devices = [d for d in ort.get_ep_devices() if d.ep_name == "MLUExecutionProvider" and dict(d.device.metadata).get("emulated") == "true"]
n, m, c = 30, 40, 4
rng = np.random.default_rng(1)
feats = rng.standard_normal((n, c)).astype(np.float32)
pmap = (np.arange(n) % m).astype(np.int32)
count = np.bincount(pmap, minlength=m).astype(np.int32)
vfeats = np.full((m, c), -np.inf, np.float32)
for i, v in enumerate(pmap):
    vfeats[v] = np.maximum(vfeats[v], feats[i])
feeds = {"grad_voxel_feats": rng.standard_normal((m, c)).astype(np.float32), "feats": feats, "voxel_feats": vfeats,
         "point2voxel_map": pmap, "voxel_points_count": count}
model = build_model("DynamicScatterBackward", {"reduce_type": {"string": "max"}},
                    [(k, str(v.dtype), list(v.shape)) for k, v in feeds.items()], "dsb")
so = ort.SessionOptions(); so.log_severity_level = 1
so.add_provider_for_devices(devices, {"mlu_backend": backend, "mluops_library": mluops})
sess = ort.InferenceSession(model, so)
sess.run(None, feeds)
del sess
"""


def run_fallback_script(backend: str, tmp_path: Path) -> tuple[str, Path]:
    """FALLBACK_SCRIPT under `mlu_backend` = `backend` with the emulated libmluops: what it
    printed (ONNX Runtime's log included) and its traffic report."""
    lib = library_path()
    traffic = tmp_path / "t.jsonl"
    env = dict(os.environ, MLU_EP_EMULATE="1", MLU_EP_TRAFFIC=str(traffic))
    p = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, str(lib), backend, str(emulated_mluops(lib)), str(Path(__file__).parent)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-3000:]
    return said, traffic


def test_a_run_time_fallback_is_logged_and_counted(tmp_path):
    """N < M: MLU-OPS declines at run time (N >= M is its rule) and, with mlu_backend=mluops,
    the node runs on the host CPU: a warning through ONNX Runtime's logger naming op, node,
    sizes and reason, and cpu_fallbacks = 1 in the session line."""
    said, traffic = run_fallback_script("mluops", tmp_path)
    assert "mluops.DynamicScatterBackward node 'dsb' ran on the host CPU (inputs [40, 4], [30, 4]" in said, said[-3000:]
    assert "mluops: N = 30 points < M = 40 voxels: MLU-OPS requires N >= M" in said, said[-3000:]
    session = [json.loads(x) for x in traffic.read_text().splitlines() if "session" in x]
    assert len(session) == 1 and session[0]["cpu_fallbacks"] == 1 and session[0]["card_runs"] == {"mluops": 0, "bang": 0}, session
    assert session[0]["claimed"]["mluops"] == 1 and session[0]["traffic"]["d2h"] > 0, session
    assert_node_lines_count_as_the_session(traffic)


def test_a_run_time_decline_to_the_next_backend_is_logged_and_counted(tmp_path):
    """The same node under auto: MLU-OPS declines at run time and the BANG kernels run it, a
    warning through ONNX Runtime's logger naming the reason, run_time_declines.mluops = 1."""
    said, traffic = run_fallback_script("auto", tmp_path)
    line = next((x for x in said.splitlines() if "node 'dsb' ran on backend bang after a run-time decline" in x), None)
    assert line is not None and "[W:onnxruntime:" in line, said[-3000:]
    assert "mluops: N = 30 points < M = 40 voxels: MLU-OPS requires N >= M" in line, line
    session = [json.loads(x) for x in traffic.read_text().splitlines() if "session" in x]
    assert len(session) == 1, session
    s = session[0]
    assert s["cpu_fallbacks"] == 0 and s["card_runs"] == {"mluops": 0, "bang": 1}, s
    assert s["run_time_declines"] == {"mluops": 1, "bang": 0} and s["claimed"]["mluops"] == 1, s
    assert_node_lines_count_as_the_session(traffic)


def assert_node_lines_count_as_the_session(traffic: Path):
    """placement.counts of the report's node lines alone (what a runner reads while its
    session is open) equals that of its session line."""
    lines = [json.loads(x) for x in traffic.read_text().splitlines()]
    by_nodes = placement.counts([x for x in lines if "op" in x])
    by_session = placement.counts(lines)
    assert by_nodes == by_session, (by_nodes, by_session, lines)


def test_the_librarys_log_records_reach_onnxruntimes_logger(tmp_path):
    """An unwritable traffic report is a `log` warning of the library (never an error of the
    node): it must come out of ONNX Runtime's default logger."""
    lib = library_path()
    env = dict(os.environ, MLU_EP_EMULATE="1", MLU_EP_TRAFFIC="/nonexistent-folder/t.jsonl")
    p = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, str(lib), "bang", "", str(Path(__file__).parent)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-3000:]
    line = next((x for x in said.splitlines() if "onnxruntime-ep-mlu: MLU_EP_TRAFFIC=/nonexistent-folder/t.jsonl" in x), None)
    assert line is not None, said[-3000:]
    # ONNX Runtime's log format: "<time> [W:onnxruntime:<logger id>, ...] message".
    assert "[W:onnxruntime:" in line, line
