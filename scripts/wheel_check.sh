#!/usr/bin/env bash
# The wheel, end to end, as a user gets it:
# 1. a fresh virtual environment (PYTHON, default python3), nothing installed;
# 2. `pip wheel ./python`: the package's build step runs `cargo build --release --lib` (into
#    this checkout's target/, or CARGO_TARGET_DIR: a warm build compiles nothing) and puts
#    libonnxruntime_ep_mlu.so in the package; the wheel must be tagged py3-none-<platform>
#    (not py3-none-any) and carry the very library cargo built;
# 3. the wheel installed into that environment with onnxruntime 1.31.1 and numpy, and nothing
#    else (no onnx, no torch: `import onnxruntime_ep_mlu.torch` must fail for want of torch);
# 4. from a folder outside the checkout, with MLU_EP_LIB, MLU_EP_EMULATE, ORT_DYLIB_PATH and
#    PYTHONPATH unset, so nothing can be found by accident: the README's three lines on the
#    CPU path (register_custom_ops_library(get_library_path())), then, in a new process with
#    MLU_EP_EMULATE=1, the MLUExecutionProvider added by device (register_execution_provider(),
#    twice: the second finds the first) with every mluops node the EP supports placed on it;
#    both on the demo model the wheel carries (demo_model(), demo_inputs(): models/mluops_demo.onnx
#    and its inputs, copied into the package at build time), outputs against its goldens
#    (`out.<name>`: integers exact, floats in the contract's accumulating class). The wheel's
#    models/ files must be byte-identical to the checkout's models/ (never a stale copy).
# Prints how long the wheel build took. pip's output is printed only when a pip step fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mlu-wheel-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
VENV="$WORK/venv"
PY="$VENV/bin/python"

quiet_pip() {  # quiet_pip <what> <pip arguments>: pip's output kept in a file, shown if it fails
    local what="$1" log="$WORK/pip.log"
    shift
    if ! "$PY" -m pip --disable-pip-version-check "$@" >"$log" 2>&1; then
        cat "$log"
        echo "wheel_check: $what failed (pip's output above)"
        exit 1
    fi
}

echo "== wheel_check: a fresh virtual environment, $VENV"
"$PYTHON" -m venv "$VENV"

TARGET_DIR="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
echo "== wheel_check: pip wheel ./python (cargo build --release --lib into $TARGET_DIR)"
start=$EPOCHREALTIME
quiet_pip "pip wheel ./python" wheel -v --no-deps "$ROOT/python" -w "$WORK/dist"
build_seconds="$("$PY" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$start" "$EPOCHREALTIME")"
WHEEL="$(ls "$WORK"/dist/onnxruntime_ep_mlu-*.whl)"
echo "== wheel_check: $(basename "$WHEEL") built in $build_seconds s; checking its tag and its library"
"$PY" - "$WHEEL" "$TARGET_DIR/release/libonnxruntime_ep_mlu.so" "$ROOT/models" <<'PY'
import hashlib, json, os, sys, sysconfig, zipfile
wheel, built, models = sys.argv[1:4]
tag = os.path.basename(wheel)[: -len(".whl")].split("-")[-3:]
platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
assert tag == ["py3", "none", platform], f"wheel tag {'-'.join(tag)}, want py3-none-{platform}"
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    lib = z.read("onnxruntime_ep_mlu/libonnxruntime_ep_mlu.so")
    meta = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
assert "Root-Is-Purelib: false" in meta, meta
with open(built, "rb") as f:
    same = hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(lib).hexdigest()
assert same, f"the wheel's library is not {built}"
zoo = json.load(open(os.path.join(models, "zoo.json")))["models"]
want = {"mluops_demo.onnx", "mluops_demo.npz", "zoo.json"} | {spec[k] for spec in zoo.values() for k in ("model", "data")}
with zipfile.ZipFile(wheel) as z:
    packaged = {n.split("/")[-1] for n in names if n.startswith("onnxruntime_ep_mlu/models/")}
    assert packaged == want, f"the wheel's models/ holds {sorted(packaged)}, want {sorted(want)}"
    for n in sorted(want):
        with open(os.path.join(models, n), "rb") as f:
            assert z.read("onnxruntime_ep_mlu/models/" + n) == f.read(), f"the wheel's models/{n} is not {models}/{n}"
print(f"onnxruntime_ep_mlu/models/: {len(want)} files, each the checkout's models/ file")
print(f"tag py3-none-{platform}; onnxruntime_ep_mlu/libonnxruntime_ep_mlu.so ({len(lib) / 2**20:.1f} MiB) is {built}")
print("files:", ", ".join(n for n in names if not n.endswith("/RECORD")))
PY

echo "== wheel_check: installing the wheel, onnxruntime 1.31.1 and numpy 2.2.6 into $VENV"
quiet_pip "pip install <the wheel> onnxruntime==1.31.1 numpy==2.2.6" install "$WHEEL" onnxruntime==1.31.1 numpy==2.2.6
"$PY" -m pip list --disable-pip-version-check

cat >"$WORK/use.py" <<'PY'
"""The wheel in use, outside the checkout: cpu (custom-op library) or mlu (emulated card)."""
import os
import sys

import numpy as np
import onnxruntime as ort
import onnxruntime_ep_mlu as mlu

mode = sys.argv[1]
lib = mlu.get_library_path()
shipped = os.path.join(os.path.dirname(mlu.__file__), "libonnxruntime_ep_mlu.so")
assert lib == shipped, f"get_library_path() = {lib}, not the wheel's {shipped}"
model = mlu.demo_model()
assert model == os.path.join(os.path.dirname(mlu.__file__), "models", "mluops_demo.onnx"), model
data = np.load(os.path.join(os.path.dirname(model), "mluops_demo.npz"))
feeds = mlu.demo_inputs()
assert mlu.get_ep_name() == "MLUExecutionProvider"
for absent in ("onnx", "torch"):
    try:
        __import__(absent)
    except ImportError:
        pass
    else:
        sys.exit(f"{absent} is installed: this environment is meant to hold onnxruntime and numpy only")
try:
    import onnxruntime_ep_mlu.torch  # noqa: F401
except ImportError as e:
    assert "torch" in str(e), e
else:
    sys.exit("onnxruntime_ep_mlu.torch imported without torch")
print(f"[{mode}] cwd {os.getcwd()}; library {lib}")

if mode == "cpu":
    # the README's three lines
    so = ort.SessionOptions(); so.register_custom_ops_library(mlu.get_library_path())
    sess = ort.InferenceSession(model, so)
    outs = sess.run(None, feeds)
else:
    assert os.environ.get("MLU_EP_EMULATE") == "1"
    devices = mlu.register_execution_provider()
    again = mlu.register_execution_provider()  # registers once per process
    assert devices and [d.ep_name for d in again] == [d.ep_name for d in devices], (devices, again)
    assert len(devices) == len([d for d in ort.get_ep_devices() if d.ep_name == mlu.get_ep_name()])
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    sess = ort.InferenceSession(model, so)
    outs = sess.run(None, feeds)
    placed = [(sub.ep_name, n.domain, n.op_type, n.name) for sub in sess.get_provider_graph_assignment_info() for n in sub.get_nodes()]
    on_mlu = sorted({op for ep, domain, op, _ in placed if ep == mlu.get_ep_name() and domain == mlu.DOMAIN})
    print(f"[{mode}] {len(devices)} device(s); mluops nodes on {mlu.get_ep_name()}: {', '.join(on_mlu)}")
    assert on_mlu, placed

failed = 0
for meta, got in zip(sess.get_outputs(), outs):
    want = data["out." + meta.name]
    if got.shape != want.shape:
        ok, detail = False, f"shape {got.shape} != {want.shape}"
    elif np.issubdtype(want.dtype, np.integer) or want.dtype == np.bool_:
        mism = int(np.count_nonzero(got != want))
        ok, detail = mism == 0, f"exact, {mism} mismatching"
    else:
        a, b = got.astype(np.float64), want.astype(np.float64)
        n1, n2 = np.abs(b).sum(), (b * b).sum()
        d1 = np.abs(a - b).sum() / n1 if n1 else np.abs(a).sum()
        d2 = np.sqrt(((a - b) ** 2).sum() / n2) if n2 else np.abs(a).sum()
        ok, detail = d1 <= 3e-3 and d2 <= 3e-3, f"diff1 {d1:.1e} diff2 {d2:.1e}"
    failed += not ok
    print(f"[{mode}] {meta.name:<16} {'OK' if ok else 'FAIL'} {detail}")
sys.exit(f"[{mode}] {failed} output(s) differ from the goldens" if failed else 0)
PY

mkdir "$WORK/outside"
cd "$WORK/outside"
clean=(env -u MLU_EP_LIB -u MLU_EP_EMULATE -u ORT_DYLIB_PATH -u PYTHONPATH -u PYTHONHOME)
echo "== wheel_check: the CPU path from $WORK/outside"
"${clean[@]}" "$PY" "$WORK/use.py" cpu
echo "== wheel_check: MLUExecutionProvider on the emulated card (MLU_EP_EMULATE=1) from $WORK/outside"
"${clean[@]}" MLU_EP_EMULATE=1 "$PY" "$WORK/use.py" mlu
echo "== wheel_check: OK (wheel build $build_seconds s)"
