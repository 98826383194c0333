#!/usr/bin/env bash
# The main job on a fresh machine: installs onnxruntime 1.31.1 into .venv, builds
# libonnxruntime_ep_mlu.so, runs models/mluops_demo.onnx under onnxruntime with it (every
# output checked against the stored goldens), then the model zoo (PointPillars, CenterPoint,
# BEVDepth, PointNet++ FP, R-FCN head) on the CPU path and on the emulated MLU provider,
# printing the regression table. Exits non-zero on any mismatch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/setup.sh
cargo build --release --lib --quiet
"$VENV/bin/python" models/run_demo.py "$ROOT/target/release/libonnxruntime_ep_mlu.so"
"$VENV/bin/python" models/run_zoo.py "$ROOT/target/release/libonnxruntime_ep_mlu.so"
