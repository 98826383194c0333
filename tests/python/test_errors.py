"""The error rules and legal edge cases of docs/CONTRACT.md, driven by tests/cases/errors.json
through real onnxruntime sessions (one pytest id per table entry): on the CPU custom-op path,
then every error case again under the MLUExecutionProvider on the emulated card with each
card backend, which must fail in the same phase with the same message."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np

import onnxruntime as ort
import pytest

from conftest import BACKEND, CARD_MODE, SCHEMAS, emulated_mluops, is_emulated, load_cases, make_session, materialize, node_name


def _failure(case, harness, session=None):
    """(phase, exception) of the first failure of the case's model, or (None, outputs).
    `session` builds the session from the model (default: the CPU custom-op path)."""
    model, feeds = harness.case_model(case)
    try:
        sess = session(model) if session else make_session(model, harness.lib)
    except Exception as e:  # onnxruntime raises per-status subclasses of RuntimeError/Exception
        return "create", e
    try:
        return None, sess.run(None, feeds)
    except Exception as e:
        return "run", e


def _status_message(e) -> str:
    """The library's own words: what follows ONNX Runtime's 'Status Message:' prefix, which
    names the provider's kernel."""
    return str(e).split("Status Message:")[-1].strip()


@pytest.mark.parametrize("backend", [BACKEND] if CARD_MODE else ["bang", "mluops"])
def test_error_case_fails_alike_under_each_card_backend(error_case, backend, harness, mlu_devices, tmp_path, monkeypatch):
    """The card path gets the error table too: same phase, same message as the CPU path,
    whether the provider claimed the node (its shape and value rules on the card) or
    declined it (ONNX Runtime's CPU provider); a claimed node's error comes from the card
    path, never from a run-time fallback to its CPU kernel (the traffic report has no
    `cpu` run of it). Under scripts/test.sh --card: the run's backend, with the libmluops
    the provider finds in the toolkit."""
    if backend == "mluops" and not CARD_MODE and not is_emulated(mlu_devices[0]):
        pytest.skip("the emulated libmluops computes on host memory: mluops here needs the emulated card")
    want_phase, want = _failure(error_case, harness)
    report = tmp_path / "traffic.jsonl"
    monkeypatch.setenv("MLU_EP_TRAFFIC", str(report))
    phase, got = _failure(error_case, harness, lambda model: _card_session(model, backend, harness.lib, mlu_devices))
    gc.collect()
    monkeypatch.delenv("MLU_EP_TRAFFIC")
    assert phase == want_phase, f"{backend}: failed at {phase}, the CPU path at {want_phase}: {got}"
    assert _status_message(got) == _status_message(want), f"{backend}: {_status_message(got)}\n  CPU path: {_status_message(want)}"
    # The node's own run lines (a session line may come from an earlier test's session,
    # released later); float16 on MLU-OPS is the one documented run-time fallback here.
    lines = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
    fallbacks = [x for x in lines if x.get("node") == node_name(error_case) and x.get("backend") == "cpu"
                 and not x.get("why", "").startswith("mluops: float16: ")]
    assert fallbacks == [], f"{backend}: the card path fell back to the CPU: {fallbacks}"


def _card_session(model, backend: str, lib, devices) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options = {"mlu_backend": backend}
    # The emulated libmluops on the emulated card; a card run uses the library the provider
    # finds (the toolkit's), and `bang` needs none.
    if backend != "bang" and not CARD_MODE:
        options["mluops_library"] = str(emulated_mluops(lib))
    so.add_provider_for_devices(devices, options)
    return ort.InferenceSession(model, so)


def test_the_card_backends_claim_most_error_cases(harness, emulated_devices):
    """The comparison above is not only ONNX Runtime's CPU provider twice: count the run-time
    error cases each backend claims."""
    cases = [c for c in load_cases() if c["kind"] == "error" and c["phase"] == "run"]
    for backend, least in (("bang", 50), ("mluops", 61)):
        claimed = 0
        for case in cases:
            model, _ = harness.case_model(case)
            try:
                sess = _card_session(model, backend, harness.lib, emulated_devices)
            except Exception:
                continue
            claimed += any(sub.ep_name == "MLUExecutionProvider" and sub.get_nodes()
                           for sub in sess.get_provider_graph_assignment_info())
        assert claimed >= least, f"{backend}: only {claimed} of {len(cases)} run-time error cases claimed by the provider"


def test_error_case_is_rejected_with_named_message(error_case, harness):
    phase, result = _failure(error_case, harness)
    allowed = {"create": {"create"}, "run": {"run"}, "either": {"create", "run"}}[error_case["phase"]]
    assert phase is not None, (
        f"{error_case['name']}: no error; the model ran and returned shapes {[o.shape for o in result]}"
    )
    msg = str(result)
    assert phase in allowed, f"failed at {phase}, contract phase is {error_case['phase']}: {msg}"
    missing = [s for s in error_case["expect"] if s not in msg]
    assert not missing, f"message lacks {missing}: {msg}"
    if error_case.get("expect_any"):
        assert any(s in msg for s in error_case["expect_any"]), (
            f"message names none of {error_case['expect_any']}: {msg}"
        )
    assert node_name(error_case) in msg, f"message does not name the node {node_name(error_case)!r}: {msg}"
    if phase == "run" and f"mluops.{error_case['op']}" in msg:
        # A contract violation found by the library at run time is INVALID_ARGUMENT (at session
        # creation ONNX Runtime rewraps kernel-creation failures itself, so no code is checked there).
        assert "INVALID_ARGUMENT" in msg, f"library error not reported as INVALID_ARGUMENT: {msg}"


def test_valid_edge_case_runs_with_contract_outputs(valid_case, harness):
    phase, result = _failure(valid_case, harness)
    assert phase is None, f"legal input rejected at {phase}: {result}"
    expected = valid_case["outputs"]
    names = [o["name"] for o in SCHEMAS[valid_case["op"]]["outputs"]]
    assert [o["name"] for o in expected] == names
    assert len(result) == len(expected)
    for got, exp in zip(result, expected):
        assert list(got.shape) == exp["shape"], f"{exp['name']}: shape {list(got.shape)}, expected {exp['shape']}"
        if "data" not in exp:
            continue
        want = materialize(exp["data"], exp["shape"], "float64")
        if np.issubdtype(got.dtype, np.integer):
            np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=exp["name"])
        else:
            np.testing.assert_allclose(
                got.astype(np.float64), want, rtol=1e-5, atol=1e-7, equal_nan=True, err_msg=exp["name"]
            )


def test_error_table_covers_every_operator():
    cases = load_cases()
    errors = Counter(c["op"] for c in cases if c["kind"] == "error")
    edges = Counter(c["op"] for c in cases if c["kind"] == "valid_edge")
    for op in SCHEMAS:
        assert errors[op] >= 8 and edges[op] >= 3, f"{op}: {errors[op]} error and {edges[op]} edge cases"
    for c in cases:
        inputs = [t["name"] for t in c["inputs"]]
        formal = [f["name"] for f in SCHEMAS[c["op"]]["inputs"]]
        assert inputs == formal[: len(inputs)], f"{c['name']}: inputs {inputs} are not a prefix of {formal}"


FLOAT64_FEATS_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {here!r})
    import numpy as np
    from conftest import build_model, make_session
    from pathlib import Path
    feeds = {{
        "grad_voxel_feats": np.ones((2, 2), np.float32),
        "feats": np.ones((3, 2), np.float64),
        "voxel_feats": np.ones((2, 2), np.float32),
        "point2voxel_map": np.array([0, 1, 0], np.int32),
        "voxel_points_count": np.array([2, 1], np.int32),
    }}
    spec = [(k, str(v.dtype), list(v.shape)) for k, v in feeds.items()]
    model = build_model("DynamicScatterBackward", {{}}, spec, "n_float64_feats")
    try:
        sess = make_session(model, Path({lib!r}))
        sess.run(None, feeds)
    except Exception as e:
        print("REJECTED", type(e).__name__, str(e).replace(chr(10), " "))
        sys.exit(0)
    print("ACCEPTED")
    """
)


def test_float64_feats_is_rejected_without_crashing(mlu_lib):
    """A dtype mismatch may be reported by ONNX Runtime itself (INVALID_GRAPH type error) or by
    the library, but never accepted and never a crash: run in a child process to see a crash."""
    here = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", FLOAT64_FEATS_SCRIPT.format(here=here, lib=str(mlu_lib))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"child process died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    out = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert out.startswith("REJECTED"), f"float64 feats was not rejected: {out!r}"
    assert "feats" in out and "DynamicScatterBackward" in out, out
