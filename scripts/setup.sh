#!/usr/bin/env bash
# Prepares this checkout's virtual environment, .venv, from PyPI:
#   (no argument)  what the main job needs: onnxruntime 1.31.1 (it carries the C library
#                  libonnxruntime.so.1.31.1), onnx and numpy (scripts/requirements.txt);
#   --test         also what the tests need: pytest (scripts/requirements-test.txt) and
#                  PyTorch 2.15.0 for the export path (scripts/requirements-torch.txt: about
#                  2.4 GB of downloads, installed --no-deps), and the peer libraries
#                  spconv 2.3.8 and torchvision 0.29.2 (scripts/requirements-peers.txt);
#                  and, outside .venv, Debian's g++-11 and clang-14 (apt-get, as root), the
#                  older host compilers scripts/test.sh also builds the C++ of kernels/ with;
#   --card         what `scripts/test.sh --card` needs on a card host, and nothing else: the
#                  main job's pins and pytest (scripts/requirements.txt and
#                  requirements-test.txt), after checking what it cannot install: cargo, a
#                  C++17 host compiler ($CXX or c++; GCC >= 9 or clang), and a Python >= 3.11
#                  ($PYTHON, else python3, else python3.11 to 3.13): onnxruntime >= 1.24, the
#                  oldest this library loads into, has no wheel for Python 3.10 (PyPI's newest
#                  cp310 build is 1.23.2). Each missing piece is named, with how to get it.
# Idempotent: nothing is installed when .venv already has every pinned version. Every step
# says what it does, on stderr.
#
#   scripts/setup.sh [--test|--card]    run it: prints `export VENV=...` and
#                                       `export ORT_DYLIB_PATH=...` on stdout
#                                       (eval "$(scripts/setup.sh)" applies them)
#   source scripts/setup.sh [--test|--card]  or source it (bash): the same work in a child bash,
#                                       then VENV and ORT_DYLIB_PATH exported into your shell;
#                                       nothing else of your shell changes (options included)
#
# `cargo test` needs none of this exported: it finds .venv's onnxruntime itself
# (tests/common/mod.rs, ort_dylib_path).

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    # Sourced. A script that sources this file without arguments passes its own: only
    # --test and --card are taken from them. The work runs in a new bash process, so its `set -euo
    # pipefail` never reaches the caller's shell (and holds even when the caller sources
    # this file inside an `if`, where a function or subshell would run with -e ignored).
    __mlu_ep_args=()
    for __mlu_ep_arg in "$@"; do
        case "$__mlu_ep_arg" in --test | --card) __mlu_ep_args=("$__mlu_ep_arg") ;; esac
    done
    if __mlu_ep_exports="$("$BASH" "${BASH_SOURCE[0]}" "${__mlu_ep_args[@]}")"; then
        eval "$__mlu_ep_exports"
        unset __mlu_ep_args __mlu_ep_arg __mlu_ep_exports
        return 0
    else
        __mlu_ep_exports=$?
        unset __mlu_ep_args __mlu_ep_arg
        echo "setup: failed (exit status $__mlu_ep_exports); VENV and ORT_DYLIB_PATH not exported" >&2
        eval "unset __mlu_ep_exports; return $__mlu_ep_exports"
    fi
fi

set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
WITH_TESTS=0
CARD=0
for arg in "$@"; do
    case "$arg" in
        --test) WITH_TESTS=1 ;;
        --card) CARD=1 ;;
        *) echo "setup: unknown argument '$arg' (usage: scripts/setup.sh [--test|--card])" >&2; exit 2 ;;
    esac
done
if [ "$WITH_TESTS$CARD" = 11 ]; then
    echo "setup: --test and --card exclude each other" >&2
    exit 2
fi
# Progress goes to stderr; stdout carries only the export lines.
exec 3>&1 1>&2

# unmet <requirements file>: prints each `name==version` pin of the file (and of the files
# it includes with -r) that .venv does not have (as "name==version (installed: x)").
unmet() {
    "$VENV/bin/python" - "$1" <<'PY'
import shlex
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def pins(path, seen=()):
    path = Path(path).resolve()
    if path in seen:
        sys.exit(f"setup: {path} includes itself")
    for line in open(path):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        # An included file, in any spelling pip accepts: -r F, -rF, --requirement F / =F.
        head = words[0]
        if head in ("-r", "--requirement"):
            yield from pins(path.parent / words[1], seen + (path,))
        elif head.startswith("--requirement="):
            yield from pins(path.parent / head.split("=", 1)[1], seen + (path,))
        elif head.startswith("-r"):
            yield from pins(path.parent / head[2:], seen + (path,))
        elif head.startswith("-"):
            sys.exit(f"setup: {path}: an option this check does not read: {line.strip()}")
        elif "==" in head:
            yield (part.strip() for part in head.split("==", 1))


for name, want in pins(sys.argv[1]):
    try:
        have = version(name)
    except PackageNotFoundError:
        have = "none"
    if have.split("+")[0] != want:
        print(f"{name}=={want} (installed: {have})")
PY
}

# install <what> <requirements file> [pip options]: installs the file's pins unless .venv has
# them all.
install() {
    local what="$1" file="$2" missing
    shift 2
    missing="$(unmet "$file")"
    if [ -z "$missing" ]; then
        echo "setup: $what: already in .venv ($(basename "$file"))"
        return
    fi
    echo "setup: $what: installing into .venv from $(basename "$file"); missing or at another version:"
    echo "$missing" | sed 's/^/setup:     /'
    # pip's hundreds of lines stay out of the log unless it fails (follow them with tail -f).
    local log="$VENV/pip-$(basename "$file" .txt).log"
    echo "setup:     pip's output: $log"
    if ! "$VENV/bin/pip" install --disable-pip-version-check "$@" -r "$file" >"$log" 2>&1; then
        cat "$log"
        echo "setup: pip install -r $(basename "$file") failed (its output above, kept in $log)"
        exit 1
    fi
}

if [ "$WITH_TESTS" = 1 ]; then
    # Compilers older than Debian 12's g++ 12, as a Cambricon host has (docs/USAGE.md).
    if command -v g++-11 >/dev/null && command -v clang++-14 >/dev/null; then
        echo "setup: g++-11 and clang++-14: already installed"
    elif [ "$(id -u)" = 0 ]; then
        echo "setup: g++-11 and clang-14: installing with apt-get"
        apt-get install -y g++-11 clang-14 || { apt-get update && apt-get install -y g++-11 clang-14; }
    else
        echo "setup: g++-11 or clang++-14 missing; install them as root: apt-get install -y g++-11 clang-14"
        exit 1
    fi
fi
# python_ok <python>: whether it runs and is 3.11 or newer (onnxruntime >= 1.24's floor).
python_ok() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}
if [ "$CARD" = 1 ]; then
    # What card mode cannot install itself, all named at once.
    missing=()
    command -v cargo >/dev/null || missing+=("cargo (Rust >= 1.89: https://rustup.rs)")
    cxx="${CXX:-c++}"
    if ! command -v "$cxx" >/dev/null; then
        missing+=("a C++17 host compiler: $cxx not found (Ubuntu: apt-get install g++)")
    elif ! printf '#include <optional>\n#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 9\n#error GCC older than 9\n#endif\nint main() { std::optional<int> x; return x.value_or(0); }\n' |
        "$cxx" -std=c++17 -x c++ - -o /dev/null 2>/dev/null; then
        missing+=("a C++17 host compiler: $cxx ($("$cxx" --version 2>/dev/null | head -n 1)) does not compile C++17 or is GCC < 9")
    fi
    if [ -x "$VENV/bin/python" ]; then
        python_ok "$VENV/bin/python" ||
            missing+=("Python >= 3.11 in $VENV (it has $("$VENV/bin/python" -V 2>&1)): remove it and rerun with PYTHON=python3.11")
    elif ! python_ok "$PYTHON"; then
        for candidate in python3.11 python3.12 python3.13; do
            if command -v "$candidate" >/dev/null && python_ok "$candidate"; then PYTHON="$candidate"; break; fi
        done
        python_ok "$PYTHON" || missing+=("Python >= 3.11 with venv ($PYTHON is $("$PYTHON" -V 2>&1 || echo absent)); onnxruntime >= 1.24 has no Python 3.10 wheel. Ubuntu 22.04: apt-get install python3.11 python3.11-venv")
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        echo "setup --card: missing, not installed by this script:"
        printf 'setup:     %s\n' "${missing[@]}"
        exit 1
    fi
    echo "setup --card: cargo, $cxx (C++17) and Python >= 3.11 found"
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating the virtual environment $VENV ($PYTHON -m venv)"
    "$PYTHON" -m venv "$VENV"
fi
install "onnxruntime 1.31.1, onnx, numpy (main job)" "$ROOT/scripts/requirements.txt"
if [ "$WITH_TESTS$CARD" != 00 ]; then
    install "pytest (tests)" "$ROOT/scripts/requirements-test.txt"
fi
if [ "$WITH_TESTS" = 1 ]; then
    install "PyTorch 2.15.0 (export tests; about 2.4 GB of downloads the first time)" \
        "$ROOT/scripts/requirements-torch.txt" --no-deps
    install "spconv 2.3.8 and torchvision 0.29.2 (the network runner's peers)" \
        "$ROOT/scripts/requirements-peers.txt" --no-deps
    install "Ray 2.60.0 with Ray Data (dataset regression tests)" "$ROOT/scripts/requirements-ray.txt"
fi
ORT_DYLIB_PATH="$("$VENV/bin/python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so." + onnxruntime.__version__))')"
if [ ! -f "$ORT_DYLIB_PATH" ]; then
    echo "setup: $ORT_DYLIB_PATH not found in the onnxruntime wheel"
    exit 1
fi
echo "setup: .venv ready; ONNX Runtime's C library: $ORT_DYLIB_PATH"
printf 'export VENV=%q\nexport ORT_DYLIB_PATH=%q\n' "$VENV" "$ORT_DYLIB_PATH" >&3
