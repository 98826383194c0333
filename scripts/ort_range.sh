#!/usr/bin/env bash
# The ONNX Runtime range the README promises, tested at both ends: the session tests that
# cover every operator on both paths, node placement and the error cases
# (tests/python/test_ep.py, test_ops.py, test_errors.py) against onnxruntime 1.24.4 (the
# oldest the library supports) and 1.32.0 (the newest on PyPI), each in its own virtual
# environment under .venv-ort/; and 1.23.2 must refuse the library with the clear version
# error. Uses MLU_EP_LIB (default: the release library).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIB="${MLU_EP_LIB:-$ROOT/target/release/libonnxruntime_ep_mlu.so}"
PYTHON="${PYTHON:-python3}"

venv() {  # venv <onnxruntime version>: prints the environment's python, installing it once
    local dir="$ROOT/.venv-ort/$1"
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir" >&2
    if ! "$dir/bin/python" -c "import onnxruntime, onnx, numpy, pytest; assert onnxruntime.__version__ == '$1'" 2>/dev/null; then
        echo "ort_range: installing onnxruntime $1 into $dir (pip's output: $dir/pip.log, shown if it fails)" >&2
        if ! "$dir/bin/pip" install --disable-pip-version-check "onnxruntime==$1" onnx==1.19.0 numpy==2.2.6 pytest==8.4.2 \
            >"$dir/pip.log" 2>&1; then
            cat "$dir/pip.log" >&2
            echo "ort_range: pip failed installing onnxruntime $1 (its output above)" >&2
            exit 1
        fi
    fi
    echo "$dir/bin/python"
}

for version in 1.24.4 1.32.0; do
    echo "== onnxruntime $version: session tests (both paths, placement, errors)"
    py="$(venv "$version")"
    (cd "$ROOT/tests/python" && MLU_EP_LIB="$LIB" "$py" -m pytest -q -p no:cacheprovider test_ep.py test_ops.py test_errors.py)
done

echo "== onnxruntime 1.23.2: the clear version error"
py="$(venv 1.23.2)"
"$py" - "$LIB" <<'PY'
import sys
import onnxruntime as ort
lib = sys.argv[1]
want = "libonnxruntime_ep_mlu needs ONNX Runtime >= 1.24 (C API version 24); this host is ONNX Runtime 1.23.2"
for what, register in [
    ("register_custom_ops_library", lambda: ort.SessionOptions().register_custom_ops_library(lib)),
    ("register_execution_provider_library", lambda: ort.register_execution_provider_library("MLUExecutionProvider", lib)),
]:
    try:
        register()
    except Exception as e:  # onnxruntime's own error type
        assert want in str(e), f"{what}: {e}"
        print(f"  {what}: {want}")
    else:
        sys.exit(f"{what} accepted the library on onnxruntime 1.23.2")
PY
