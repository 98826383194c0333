"""The runners' placement checks (onnxruntime_ep_mlu.placement): each runner's MLU row fails
on a traffic report that says no node ran on the card, or that a run-time CPU fallback it did
not expect happened. networks/run.py, models/run_zoo.py and models/run_demo.py are run on a
CPU session whose provider "report" is planted (the report file is what the runners read);
``python -m onnxruntime_ep_mlu.regression``'s summarize gets result rows with those counts.
And the report's node lines count what its session line counts (src/ep/kernel.rs names a
run-time decline in the node line of the card run after it)."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "models"))
sys.path.insert(0, str(REPO))
from onnxruntime_ep_mlu import placement, regression  # noqa: E402

ZOO = REPO / "models"
SPEC = json.loads((ZOO / "zoo.json").read_text())["models"]["rfcn_head"]


def session_line(bang: int, fallbacks: int = 0, declines: int = 0) -> dict:
    """A provider's session line (src/ep/provider.rs) with these counts."""
    runs = {"mluops": 0, "bang": bang}
    return {"session": "0x1", "claimed": runs, "declined": 0, "declines": [], "card_runs": runs,
            "run_time_declines": {"mluops": declines, "bang": 0}, "cpu_fallbacks": fallbacks,
            "traffic": {"h2d": 0, "d2h": 0, "d2d": 0, "memset": 0, "gdram_read": 0, "gdram_write": 0, "launches": 0,
                        "syncs": 0}}


# The two reports every runner must reject, and the failure each must name.
BAD = [
    pytest.param(session_line(0), "no node ran on the card", id="nothing-on-the-card"),
    pytest.param(session_line(1, fallbacks=1), "1 run-time CPU fallback(s), expected 0", id="unexpected-fallback"),
]


def planted_cpu_session(line: dict, model, lib):
    """A CPU session of ``model``, with ``line`` written to the traffic report the runner set."""
    with open(os.environ["MLU_EP_TRAFFIC"], "a") as f:
        f.write(json.dumps(line) + "\n")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.register_custom_ops_library(str(lib))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def test_judge_names_each_rule():
    good = placement.counts([session_line(2)])
    assert placement.judge(good) == []
    assert placement.judge(placement.counts([session_line(0)])) == ["no node ran on the card"]
    off = placement.Expectation(off_card="DynamicScatter only")
    assert placement.judge(placement.counts([session_line(0)]), off) == []
    assert placement.judge(good, off) == ["2 node run(s) on the card where nothing is expected (DynamicScatter only)"]
    assert placement.judge(placement.counts([session_line(1, declines=1)])) == [
        "1 run-time decline(s) to the next backend, expected 0"]
    assert placement.judge(placement.counts([session_line(1, declines=1)]), placement.Expectation(run_time_declines=1)) == []
    # A fallback the report counts but ONNX Runtime's log never warned of (or the reverse).
    warned = placement.counts([session_line(1)], ["x [W:onnxruntime:, ep] ... ran on the host CPU (inputs [3]): why"])
    assert placement.judge(warned) == [
        "1 run-time warning(s) in ONNX Runtime's log against 0 fallback(s) and 0 decline(s) in the traffic report"]
    with pytest.raises(ValueError, match="2 sessions' lines"):
        placement.counts([session_line(1), session_line(1)])


def test_counts_name_a_backend_the_library_lacks(mlu_lib):
    """A report whose runs are on a backend the library's table does not have (another build's)
    is refused by name, from its node lines and from its session line."""
    node = {"op": "VoxelPoolingForward", "node": "n", "backend": "xpu", "why": ""}
    with pytest.raises(ValueError, match="runs on xpu, not backends of the library"):
        placement.counts([node], library=str(mlu_lib))
    line = session_line(1)
    line["card_runs"] = {**line["card_runs"], "xpu": 1}
    with pytest.raises(ValueError, match="runs on xpu, not backends of the library"):
        placement.counts([line], library=str(mlu_lib))


@pytest.mark.parametrize("line,why", BAD)
def test_run_zoo_fails(line, why, mlu_lib):
    run_zoo = importlib.import_module("run_zoo")
    data = np.load(ZOO / SPEC["data"])
    model = str(ZOO / SPEC["model"])
    row = run_zoo.run_one("rfcn_head", "MLU", lambda: planted_cpu_session(line, model, mlu_lib), SPEC, data, 22, 1, False, str(mlu_lib))
    assert not row["ok"], row
    assert any(why in n for n in row["notes"]), row["notes"]


@pytest.mark.parametrize("line,why", BAD)
def test_run_demo_fails(line, why, mlu_lib, capsys):
    run_demo = importlib.import_module("run_demo")
    import onnx

    path = str(ZOO / "mluops_demo.onnx")
    failed = run_demo.run("planted", lambda: planted_cpu_session(line, path, mlu_lib), onnx.load(path),
                          np.load(ZOO / "mluops_demo.npz"), on_card=str(mlu_lib))
    said = capsys.readouterr().out
    assert failed == 1, said[-2000:]
    assert f"FAIL {why}" in said, said[-2000:]


@pytest.mark.parametrize("line,why", BAD)
def test_networks_run_fails(line, why, mlu_lib, monkeypatch):
    from networks import common, run

    model = (ZOO / SPEC["model"]).read_bytes()
    data = np.load(ZOO / SPEC["data"])
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(mlu_lib))
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    graph = common.Graph("forward", model, feeds, lambda threads: want, "itself")
    case = common.Case("rfcn_head", "the zoo's", [graph])
    monkeypatch.setattr(common, "mlu_session", lambda m, lib, options=None: planted_cpu_session(line, m, mlu_lib))
    rows, ok = run.run_graph(case, graph, str(mlu_lib), 1, "")
    assert not ok
    mlu_rows = rows[1:]
    assert len(mlu_rows) == 4 and all(" BAD " in r and why in r for r in mlu_rows), "\n".join(rows)


def result_row(**counts) -> dict:
    row = {"model": "m", "frame": "f0", "path": "mlu", "ok": True, "ratio": 0.0, "golden_ratio": 0.0, "cpu_ratio": math.nan,
           "worst": "-", "ref": "golden", "seconds": 0.01, "on_mlu": 1, "start": 0.0, "end": 0.01, "worker": "w", "error": "",
           "card_runs": 1, "cpu_fallbacks": 0, "run_time_declines": 0, "run_time_warnings": 0, "binding_check": False,
           "off_card": ""}
    return {**row, **counts}


@pytest.mark.parametrize("counts,why", [
    pytest.param({"card_runs": 0}, "no node ran on the card", id="nothing-on-the-card"),
    pytest.param({"cpu_fallbacks": 1, "run_time_warnings": 1}, "1 run-time CPU fallback(s), expected 0",
                 id="unexpected-fallback"),
])
def test_regression_summarize_fails(counts, why):
    table, ok, _ = regression.summarize([result_row()], {}, {"m": ["f0"]})
    assert ok, table
    table, ok, _ = regression.summarize([result_row(**counts)], {}, {"m": ["f0"]})
    assert not ok and f"placement: {why}" in table, table


def test_regression_summarize_says_when_mluops_is_the_emulated_one():
    table, ok, _ = regression.summarize([result_row(binding_check=True)], {}, {"m": ["f0"]})
    assert ok and placement.EMULATED_MLUOPS in table, table


def test_regression_summarize_holds_a_model_to_its_off_card_expectation():
    why = "DynamicScatter only"
    table, ok, _ = regression.summarize([result_row(card_runs=0, off_card=why)], {}, {"m": ["f0"]})
    assert ok and f"expected: nothing on the card ({why})" in table, table
    table, ok, _ = regression.summarize([result_row(card_runs=1, off_card=why)], {}, {"m": ["f0"]})
    assert not ok and f"1 node run(s) on the card where nothing is expected ({why})" in table, table


@pytest.mark.parametrize("text", ['{"off_card": ""}', '{"off_card": "x", "cpu_fallbacks": 1}', '["x"]', "{"])
def test_a_wrong_expect_json_is_named(text, tmp_path):
    sub = tmp_path / "m"
    sub.mkdir()
    (sub / "model.onnx").write_bytes(b"")
    (sub / "tolerances.json").write_text("{}")
    (sub / "expect.json").write_text(text)
    with pytest.raises(ValueError, match="expect.json"):
        regression.load_dataset_models(tmp_path)
    (sub / "expect.json").write_text('{"off_card": "DynamicScatter only"}')
    assert regression.load_dataset_models(tmp_path)["m"]["off_card"] == "DynamicScatter only"
