#!/usr/bin/env bash
# Installs what the project needs on a fresh machine: a local virtual environment (.venv)
# with onnxruntime 1.31.1 from PyPI (it carries the C library libonnxruntime.so.1.31.1),
# onnx, numpy and pytest, and PyTorch 2.15.0 for the export path (scripts/requirements-torch.txt:
# about 2.4 GB of downloads, installed --no-deps). Idempotent. Source-able: exports ORT_DYLIB_PATH and VENV.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import onnxruntime, onnx, numpy, pytest; assert onnxruntime.__version__ == '1.31.1'" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/scripts/requirements.txt"
fi
if ! "$VENV/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '2.15.0'" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$ROOT/scripts/requirements-torch.txt"
fi
ORT_DYLIB_PATH="$("$VENV/bin/python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.1.31.1"))')"
[ -f "$ORT_DYLIB_PATH" ] || { echo "setup: $ORT_DYLIB_PATH not found in the onnxruntime wheel" >&2; exit 1; }
export ORT_DYLIB_PATH VENV
