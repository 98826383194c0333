#!/usr/bin/env bash
# CPU benchmarks at the seed network scales (benches/ops.rs), with the copy bandwidth,
# onnxruntime session overhead and naive references measured in the same run; then the
# GetIndicePairs peer comparison against spconv 2.3.8 (benches/spconv_peer.py) when its
# requirements are installed (scripts/requirements-spconv.txt: spconv without torch or
# torchvision). Arguments filter operators.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/setup.sh
cargo build --release --lib --quiet
export MLU_EP_LIB="$ROOT/target/release/libonnxruntime_ep_mlu.so"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%Y-%m-%d)"
cargo bench --quiet --bench ops -- "$@"
if [ -f benches/spconv_peer.py ]; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r scripts/requirements-spconv.txt
    "$VENV/bin/python" benches/spconv_peer.py
fi
