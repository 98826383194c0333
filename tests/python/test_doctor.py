"""`python -m onnxruntime_ep_mlu.doctor`, and the same report in ONNX Runtime's log: with no
toolkit, with an asked-for card that is absent, on the emulated card with the emulated
libmluops, and with a libmluops missing a symbol. Each runs in a subprocess, as the
report is made once per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, emulated_mluops

sys.path.insert(0, str(REPO / "python"))
from onnxruntime_ep_mlu import backends, operators  # noqa: E402

# Variables that change what the provider finds; each case sets its own.
FINDING = ["NEUWARE_HOME", "MLUOPS_HOME", "MLU_EP_EMULATE", "MLU_EP_BACKEND", "MLU_EP_MLUOPS_LIBRARY", "MLU_EP_KERNEL_LIBRARY"]


def run(lib: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in FINDING}
    e.update(env, MLU_EP_LIB=str(lib), PYTHONPATH=str(REPO / "python"))
    return subprocess.run(
        [sys.executable, "-m", "onnxruntime_ep_mlu.doctor", *args], env=e, capture_output=True, text=True, timeout=300
    )


def test_no_toolkit(mlu_lib):
    r = run(mlu_lib)
    assert r.returncode == 0, r.stderr
    assert "Cambricon runtime: libcnrt.so: " in r.stdout and "Cambricon cards in use: none: " in r.stdout
    assert "emulated card: off (MLU_EP_EMULATE is not 1)" in r.stdout
    assert "card 0" not in r.stdout
    # A card asked for and none usable: non-zero, with the reason.
    asked = run(mlu_lib, "--card")
    assert asked.returncode == 1 and asked.stdout == r.stdout
    assert "asked for (--card) and none is usable: Cambricon runtime libcnrt.so not loadable" in asked.stderr


def test_neuware_home_without_a_runtime_asks_for_a_card(mlu_lib, tmp_path):
    r = run(mlu_lib, NEUWARE_HOME=str(tmp_path))
    assert r.returncode == 1, r.stdout
    assert "asked for (NEUWARE_HOME is set) and none is usable" in r.stderr


def test_emulated_card_with_the_emulated_libmluops(mlu_lib):
    mluops = emulated_mluops(mlu_lib)
    r = run(mlu_lib, MLU_EP_EMULATE="1", MLU_EP_MLUOPS_LIBRARY=str(mluops), MLU_EMU_CLUSTERS="2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "emulated card: on (MLU_EP_EMULATE=1), modes: MLU_EMU_CLUSTERS=2" in out
    assert "card 0: MLU370 (mtp_372) (emulated on the host), 2 clusters x 4 cores" in out
    assert "card 0: kernel library linked into this library" in out and "kernel family sparse_conv: entries resolved" in out
    assert f"card 0: libmluops MLU-OPS 1.4.0 ({mluops}): mluOpCreate succeeded on this card" in out
    order = out.split("card 0: backend order (MLU_EP_BACKEND=auto): ")[1].splitlines()[0]
    ops = dict(kv.split(": ") for kv in order.split("; "))
    # One entry per operator of the registry: the backends auto tries for it, then the CPU.
    names = backends(str(mlu_lib))
    want = {row["op"]: ", ".join([*(b for b in names if b in row["backends"]), "cpu"]) for row in operators(str(mlu_lib))}
    assert ops == want, (ops, want)
    assert ops["PsRoiPoolBackward"] == "mluops, bang, cpu" and ops["PsRoiPool"] == "mluops, cpu"
    assert ops["DynamicScatter"] == "bang, cpu"
    # The emulated card is not a Cambricon card.
    assert run(mlu_lib, "--card", MLU_EP_EMULATE="1", MLU_EP_MLUOPS_LIBRARY=str(mluops)).returncode == 1
    bang = run(mlu_lib, MLU_EP_EMULATE="1", MLU_EP_BACKEND="bang").stdout
    assert "libmluops not in use: not opened (MLU_EP_BACKEND=bang)" in bang
    assert "PsRoiPoolBackward: bang, cpu; " in bang


def test_a_libmluops_missing_a_symbol_is_reported_and_bang_runs(mlu_lib, tmp_path):
    source = tmp_path / "broken.c"
    # A dependency symbol (CNNL's) nothing provides: refused when opened (RTLD_NOW).
    source.write_text("int cnnlFill_v3(void);\nint mluOpCreate(void **h) { return cnnlFill_v3(); }\n")
    broken = tmp_path / "libmluops.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(broken), str(source)], check=True)
    r = run(mlu_lib, MLU_EP_EMULATE="1", MLU_EP_MLUOPS_LIBRARY=str(broken))
    assert r.returncode == 0, r.stderr
    assert "card 0: libmluops not in use: no usable MLU-OPS library" in r.stdout
    assert "undefined symbol: cnnlFill_v3" in r.stdout
    assert "PsRoiPoolBackward: bang, cpu; " in r.stdout and "PsRoiPool: cpu" in r.stdout


def test_the_log_has_the_same_report(mlu_lib):
    mluops = emulated_mluops(mlu_lib)
    env = {"MLU_EP_EMULATE": "1", "MLU_EP_MLUOPS_LIBRARY": str(mluops)}
    doctor = run(mlu_lib, **env)
    e = {k: v for k, v in os.environ.items() if k not in FINDING}
    e.update(env)
    script = (
        "import onnxruntime as ort, sys; ort.set_default_logger_severity(1); "
        "ort.register_execution_provider_library('MLUExecutionProvider', sys.argv[1])"
    )
    logged = subprocess.run(
        [sys.executable, "-c", script, str(mlu_lib)], env=e, capture_output=True, text=True, timeout=300
    )
    assert logged.returncode == 0, logged.stderr
    for line in doctor.stdout.splitlines():
        assert line in logged.stderr, f"{line!r} not in the log:\n{logged.stderr}"
