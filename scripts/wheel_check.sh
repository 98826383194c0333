#!/usr/bin/env bash
# The binary wheel, end to end, as a user without a compiler gets it:
# 1. scripts/wheel.sh builds it (`pip wheel ./python`: `cargo build --release --lib --example
#    mluops_emulated` into this checkout's target/, or CARGO_TARGET_DIR: a warm build compiles
#    nothing; then auditwheel repair), tagged py3-none-manylinux_2_35_x86_64, carrying the
#    very library and emulated libmluops cargo built and the checkout's demo and zoo models;
# 2. a fresh virtual environment (PYTHON, default python3) whose PATH holds only its own bin/:
#    no cargo, rustc or C/C++ compiler can be found (checked); the wheel installed there with
#    --only-binary (nothing may build), with onnxruntime 1.31.1 and numpy and nothing else
#    (no onnx, no torch: `import onnxruntime_ep_mlu.torch` must fail for want of torch); the
#    wheel's own install is timed;
# 3. from a folder outside the checkout, with MLU_EP_LIB, MLU_EP_EMULATE, ORT_DYLIB_PATH,
#    PYTHONPATH and the MLU-OPS variables unset, so nothing can be found by accident: the
#    README's three lines on the CPU path (register_custom_ops_library(get_library_path())),
#    then, in a new process with MLU_EP_EMULATE=1, the MLUExecutionProvider added by device
#    (register_execution_provider(), twice: the second finds the first) with every mluops
#    node the EP supports placed on it and run by the packaged emulated libmluops where
#    MLU-OPS supports it (the session's MLU_EP_TRAFFIC line); both on the demo model the
#    wheel carries, outputs against its goldens (`out.<name>`: integers exact, floats in the
#    contract's accumulating class);
# 4. every ```python snippet of README.md, verbatim, each in a new process from an empty
#    folder, and `python -m onnxruntime_ep_mlu.regression --generate 5`: none may fail, and
#    none may say "not found" (nothing the user asked for is missing);
# 5. docs/USAGE.md's ```sh lines for a pip user of the Rust example, as written, from an
#    empty folder holding only the example binary (built by cargo before the environment is
#    made, as a user builds their program; only the binary runs there): ONNX Runtime's
#    library, get_library_path() and the packaged bevdepth.onnx come from the venv's python,
#    and it prints its one line (tests/python/test_usage_example.py checks the value).
# Prints how long the wheel build and install took. pip's output is printed only when a pip
# step fails.
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
    if ! PATH="$NOCC_PATH" "$PY" -m pip --disable-pip-version-check "$@" >"$log" 2>&1; then
        cat "$log"
        echo "wheel_check: $what failed (pip's output above)"
        exit 1
    fi
}

echo "== wheel_check: scripts/wheel.sh"
start=$EPOCHREALTIME
"$ROOT/scripts/wheel.sh" "$WORK/dist"
build_seconds="$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$start" "$EPOCHREALTIME")"
WHEEL="$(ls "$WORK"/dist/onnxruntime_ep_mlu-*.whl)"
TARGET_DIR="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
echo "== wheel_check: cargo build --release --example usage (docs/USAGE.md's Rust example, run in step 5)"
(cd "$ROOT" && cargo build --release --quiet --example usage)
cp "$TARGET_DIR/release/examples/usage" "$WORK/usage"

echo "== wheel_check: a fresh virtual environment, $VENV, with only its own bin/ on PATH"
"$PYTHON" -m venv "$VENV"
NOCC_PATH="$VENV/bin"
PATH="$NOCC_PATH" "$PY" -c '
import shutil, sys
found = [t for t in ("cargo", "rustc", "cc", "c++", "gcc", "g++", "clang", "clang++", "ld") if shutil.which(t)]
sys.exit(f"wheel_check: {found} on the install environment'"'"'s PATH" if found else 0)'

echo "== wheel_check: $(basename "$WHEEL") built in $build_seconds s; checking its tag, libraries and models"
"$PY" - "$WHEEL" "$TARGET_DIR/release" "$ROOT/models" <<'PY'
import hashlib, json, os, sys, zipfile
wheel, release, models = sys.argv[1:4]
tag = os.path.basename(wheel)[: -len(".whl")].split("-")[-3:]
assert tag == ["py3", "none", "manylinux_2_35_x86_64"], f"wheel tag {'-'.join(tag)}, want py3-none-manylinux_2_35_x86_64"
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    meta = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert "Root-Is-Purelib: false" in meta, meta
    # auditwheel grafted nothing and left both libraries as cargo built them.
    assert not [n for n in names if ".libs/" in n], names
    for name, built in (("libonnxruntime_ep_mlu.so", "libonnxruntime_ep_mlu.so"), ("libmluops_emulated.so", "examples/libmluops_emulated.so")):
        lib = z.read("onnxruntime_ep_mlu/" + name)
        with open(os.path.join(release, built), "rb") as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(lib).digest(), f"the wheel's {name} is not {release}/{built}"
        print(f"onnxruntime_ep_mlu/{name} ({len(lib) / 2**20:.1f} MiB) is {release}/{built}")
    zoo = json.load(open(os.path.join(models, "zoo.json")))["models"]
    want = {"mluops_demo.onnx", "mluops_demo.npz", "zoo.json"} | {spec[k] for spec in zoo.values() for k in ("model", "data")}
    packaged = {n.split("/")[-1] for n in names if n.startswith("onnxruntime_ep_mlu/models/") and not n.endswith("/")}
    assert packaged == want, f"the wheel's models/ holds {sorted(packaged)}, want {sorted(want)}"
    for n in sorted(want):
        with open(os.path.join(models, n), "rb") as f:
            assert z.read("onnxruntime_ep_mlu/models/" + n) == f.read(), f"the wheel's models/{n} is not {models}/{n}"
print(f"onnxruntime_ep_mlu/models/: {len(want)} files, each the checkout's models/ file")
print(f"{os.path.basename(wheel)}: {os.path.getsize(wheel) / 2**20:.1f} MiB")
PY

echo "== wheel_check: installing onnxruntime 1.31.1 and numpy 2.2.6, then the wheel, into $VENV"
quiet_pip "pip install onnxruntime==1.31.1 numpy==2.2.6" install --only-binary=:all: onnxruntime==1.31.1 numpy==2.2.6
start=$EPOCHREALTIME
quiet_pip "pip install <the wheel>" install --only-binary=:all: --no-index --no-deps "$WHEEL"
install_seconds="$("$PY" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$start" "$EPOCHREALTIME")"
echo "wheel_check: the wheel installed in $install_seconds s"
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
    packaged = os.path.join(os.path.dirname(mlu.__file__), "libmluops_emulated.so")
    assert os.environ.get("MLU_EP_MLUOPS_LIBRARY") == packaged, os.environ.get("MLU_EP_MLUOPS_LIBRARY")

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
if mode == "mlu":
    import json

    del sess, meta  # the session (which meta, a NodeArg, holds) ends: the provider appends its counts
    (line,) = [json.loads(x) for x in open(os.environ["MLU_EP_TRAFFIC"]) if '"card_runs"' in x]
    print(f"[{mode}] card runs per backend {line['card_runs']}; declined {line['declined']}")
    assert line["card_runs"]["mluops"] > 0 and line["declined"] == 0, line
sys.exit(f"[{mode}] {failed} output(s) differ from the goldens" if failed else 0)
PY

mkdir "$WORK/outside"
cd "$WORK/outside"
clean=(env -u MLU_EP_LIB -u MLU_EP_EMULATE -u ORT_DYLIB_PATH -u PYTHONPATH -u PYTHONHOME
       -u MLU_EP_MLUOPS_LIBRARY -u MLUOPS_HOME -u NEUWARE_HOME -u MLU_EP_BACKEND -u MLU_EP_TRAFFIC PATH="$NOCC_PATH")
echo "== wheel_check: the CPU path from $WORK/outside"
"${clean[@]}" "$PY" "$WORK/use.py" cpu
echo "== wheel_check: MLUExecutionProvider on the emulated card (MLU_EP_EMULATE=1) from $WORK/outside"
"${clean[@]}" MLU_EP_EMULATE=1 MLU_EP_TRAFFIC="$WORK/traffic.jsonl" "$PY" "$WORK/use.py" mlu

said() {  # said <what> <log>: the log printed; it must not say "not found"
    cat "$2"
    if grep -qi "not found" "$2"; then
        echo "wheel_check: $1 says \"not found\" (above), though the user asked for nothing missing"
        exit 1
    fi
}
"$PY" - "$ROOT/README.md" "$WORK/snippets" <<'PY'
import pathlib, re, sys
blocks = re.findall(r"^```python\n(.*?)^```", pathlib.Path(sys.argv[1]).read_text(), re.S | re.M)
assert len(blocks) >= 2, f"README.md has {len(blocks)} python snippets"
out = pathlib.Path(sys.argv[2])
out.mkdir()
for i, code in enumerate(blocks, 1):
    (out / f"readme_{i}.py").write_text(code)
PY
for snippet in "$WORK"/snippets/*.py; do
    name="$(basename "$snippet" .py)"
    mkdir "$WORK/empty-$name"
    echo "== wheel_check: README.md snippet ${name#readme_}, from an empty folder"
    if ! (cd "$WORK/empty-$name" && "${clean[@]}" "$PY" "$snippet" >"$WORK/$name.log" 2>&1); then
        cat "$WORK/$name.log"
        echo "wheel_check: README.md snippet ${name#readme_} failed:"
        cat "$snippet"
        exit 1
    fi
    said "README.md snippet ${name#readme_}" "$WORK/$name.log"
done
echo "== wheel_check: python -m onnxruntime_ep_mlu.regression --generate 5, from an empty folder"
mkdir "$WORK/empty-regression"
if ! (cd "$WORK/empty-regression" && "${clean[@]}" "$PY" -m onnxruntime_ep_mlu.regression --generate 5 >"$WORK/regression.log" 2>&1); then
    cat "$WORK/regression.log"
    echo "wheel_check: the regression tool failed (its output above)"
    exit 1
fi
said "the regression tool" "$WORK/regression.log"
echo "== wheel_check: docs/USAGE.md's Rust example with the pip package's paths, from an empty folder"
"$PY" - "$ROOT/docs/USAGE.md" "$WORK/rust.sh" <<'PY'
import pathlib, re, sys
blocks = [b for b in re.findall(r"^```sh\n(.*?)^```", pathlib.Path(sys.argv[1]).read_text(), re.S | re.M) if './usage "' in b]
assert len(blocks) == 1, f"docs/USAGE.md has {len(blocks)} ```sh blocks running ./usage, want 1"
pathlib.Path(sys.argv[2]).write_text(blocks[0])
PY
mkdir "$WORK/empty-rust"
cp "$WORK/usage" "$WORK/empty-rust/usage"
if ! (cd "$WORK/empty-rust" && "${clean[@]}" /bin/bash -euo pipefail "$WORK/rust.sh" >"$WORK/rust.log" 2>&1); then
    cat "$WORK/rust.log"
    echo "wheel_check: docs/USAGE.md's Rust lines failed:"
    cat "$WORK/rust.sh"
    exit 1
fi
said "the Rust example" "$WORK/rust.log"
if ! grep -qxE 'bev_feat: float32 \[2, 24, 32, 32\], sum of \|x\| [0-9]+\.[0-9]{3}' "$WORK/rust.log" || [ "$(wc -l <"$WORK/rust.log")" != 1 ]; then
    echo "wheel_check: the Rust example printed the above, not its one line on bev_feat"
    exit 1
fi
echo "== wheel_check: OK (wheel build $build_seconds s, wheel install $install_seconds s, no compiler on PATH)"
