#!/usr/bin/env bash
# The main job on a fresh machine: installs onnxruntime 1.31.1, onnx and numpy into .venv
# (nothing the tests need), builds libonnxruntime_ep_mlu.so, runs models/mluops_demo.onnx
# under onnxruntime with it (every output checked against the stored goldens), then the model
# zoo (PointPillars, CenterPoint, BEVDepth, PointNet++ FP, R-FCN head) on the CPU path and on
# the emulated MLU provider, printing the regression table. Exits non-zero on any mismatch.
# Run again, it installs and rebuilds nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LIB="$ROOT/target/release/libonnxruntime_ep_mlu.so"
echo "== setup: .venv with onnxruntime 1.31.1, onnx, numpy (scripts/setup.sh)"
source scripts/setup.sh
echo "== build: cargo build --release --lib (from scratch: minutes; warm: nothing to compile)"
cargo build --release --lib
echo "== the demo model (models/run_demo.py): CPU path, then MLUExecutionProvider on the emulated card"
"$VENV/bin/python" models/run_demo.py "$LIB"
echo "== the model zoo (models/run_zoo.py): CPU path and emulated MLU provider"
"$VENV/bin/python" models/run_zoo.py "$LIB"
