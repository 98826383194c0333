#!/usr/bin/env bash
# The main job on a fresh machine: installs onnxruntime 1.31.1 into .venv, builds
# libonnxruntime_ep_mlu.so, and runs models/mluops_demo.onnx under onnxruntime with it,
# checking every output against the stored goldens.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/setup.sh
cargo build --release --lib --quiet
"$VENV/bin/python" models/run_demo.py "$ROOT/target/release/libonnxruntime_ep_mlu.so"
