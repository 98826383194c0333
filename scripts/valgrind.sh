#!/usr/bin/env bash
# Runs ONNX Runtime sessions of every operator under valgrind (memcheck), on both paths:
#   cpu  the custom-op library (CPU kernels), every node on ONNX Runtime's CPU provider;
#   mlu  the MLUExecutionProvider plugin on the emulated card (MLU_EP_EMULATE=1; the BANG
#        kernels compiled for the host), the declined nodes on the CPU provider.
# The driver is examples/valgrind_sessions.rs (Rust, the `ort` crate, ONNX Runtime loaded
# from ORT_DYLIB_PATH): one session per model of the zoo (models/zoo.json: all nine
# operators) and of the demo model (models/mluops_demo.onnx: the five MLU operators), one
# intra-op thread, no CPU memory arena and no memory pattern (so every tensor is its own
# heap block and memcheck sees its bounds), every output compared with its golden.
#
# The two paths run as two valgrind processes, in parallel (VALGRIND_JOBS=1: one after the
# other). The run fails (exit 1) on
#   - any memcheck error (invalid read/write, use of uninitialised values, bad free,
#     overlap, ...) not matched by scripts/valgrind.supp, which only suppresses reports in
#     ONNX Runtime and glibc's loader, each pinned to their frames (see the file);
#   - any definitely or indirectly lost block at exit (a leak nobody can free any more);
#     memcheck itself runs with --errors-for-leak-kinds=none and the leak summary is
#     checked here, so a leak and a memory error are told apart. Still-reachable and
#     possibly-lost blocks are not failures: ONNX Runtime keeps process-lifetime singletons
#     (the ort crate never unloads libonnxruntime, ORT's schema registry, logging manager,
#     ...) and our library its parsed schemas; those are not leaks of a session.
#   - a failing session or an output that misses its golden (the driver's own exit code).
# Logs: target/valgrind/{cpu,mlu}.log (memcheck; with the list of used suppressions) and
# target/valgrind/{cpu,mlu}.out (the driver). About 2.5 minutes on 2 cores once built (the
# first build, with the dev-dependencies the driver uses, takes about 6 more).
#
# Usage: scripts/valgrind.sh [cpu|mlu|cpu,mlu] [-- extra valgrind_sessions arguments]
#   e.g. scripts/valgrind.sh mlu -- --models bevdepth
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

paths="cpu,mlu"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    paths="$1"
    shift
fi
[ "${1:-}" = "--" ] && shift
extra=("$@")
case ",$paths," in
    *,cpu,* | *,mlu,*) ;;
    *) echo "usage: $0 [cpu|mlu|cpu,mlu] [-- driver arguments]" >&2; exit 2 ;;
esac

command -v valgrind >/dev/null || { echo "error: valgrind not found (Debian: apt-get install valgrind)" >&2; exit 1; }
source scripts/setup.sh

# Release with debuginfo (Cargo.toml: [profile.release] debug = 1, line tables; the cc crate
# compiles kernels/ with -g too), so every frame of ours has a file:line.
echo "== build (release, line-table debuginfo)"
cargo build --release --lib --example valgrind_sessions
LIB="$ROOT/target/release/libonnxruntime_ep_mlu.so"
DRIVER="$ROOT/target/release/examples/valgrind_sessions"

OUT="$ROOT/target/valgrind"
DATA="$OUT/data"
mkdir -p "$DATA"
# The .npz files are deflate-compressed zips: unpacked to .npy files for the driver.
for npz in models/*.npz; do
    name="$(basename "$npz" .npz)"
    rm -rf "${DATA:?}/$name"
    "$VENV/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$npz" "$DATA/$name"
done

# ONNX Runtime's 1DS telemetry (the 1.31 Linux wheel) runs a worker thread that outlives
# ReleaseEnv and can touch memory ORT's static destructors freed at exit (see the driver).
export ORT_DISABLE_TELEMETRY=1

vg=(valgrind --tool=memcheck
    --error-exitcode=42
    --errors-for-leak-kinds=none --leak-check=full --show-leak-kinds=definite,indirect
    --track-origins=yes
    --num-callers=40
    --suppressions="$ROOT/scripts/valgrind.supp"
    --gen-suppressions=all
    --show-error-list=yes)

run() { # path -> target/valgrind/<path>.{log,out,rc,time}
    local p="$1" t0 rc
    t0=$(date +%s)
    set +e
    "${vg[@]}" --log-file="$OUT/$p.log" "$DRIVER" --data "$DATA" --lib "$LIB" --paths "$p" "${extra[@]}" >"$OUT/$p.out" 2>&1
    rc=$?
    set -e
    echo "$rc" >"$OUT/$p.rc"
    echo $(($(date +%s) - t0)) >"$OUT/$p.time"
}

IFS=, read -ra list <<<"$paths"
echo "== valgrind memcheck: ${list[*]} (logs in target/valgrind/)"
start=$(date +%s)
if [ "${VALGRIND_JOBS:-2}" -gt 1 ]; then
    pids=()
    for p in "${list[@]}"; do run "$p" & pids+=($!); done
    for pid in "${pids[@]}"; do wait "$pid"; done
else
    for p in "${list[@]}"; do run "$p"; done
fi

failed=0
for p in "${list[@]}"; do
    rc="$(cat "$OUT/$p.rc")"
    log="$OUT/$p.log"
    sed 's/^/    /' "$OUT/$p.out"
    errors="$(sed -n 's/^==[0-9]*== ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$log" | tail -1)"
    suppressed="$(sed -n 's/^==[0-9]*== ERROR SUMMARY: .*suppressed: \([0-9]*\) from.*/\1/p' "$log" | tail -1)"
    definite="$(sed -n 's/^==[0-9]*== *definitely lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -1 | tr -d ,)"
    indirect="$(sed -n 's/^==[0-9]*== *indirectly lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -1 | tr -d ,)"
    echo "$p: $(cat "$OUT/$p.time") s; memcheck errors: ${errors:-?} (suppressed: ${suppressed:-?}); definitely lost: ${definite:-0} B, indirectly lost: ${indirect:-0} B; driver exit $rc"
    if [ -z "$errors" ]; then
        echo "error: $p: valgrind did not finish (no ERROR SUMMARY in $log)" >&2
        failed=1
        continue
    fi
    if [ "$errors" != 0 ] || [ "$rc" = 42 ]; then
        echo "error: $p: memcheck reported errors; first reports (full log: $log):" >&2
        awk '/^==[0-9]+== HEAP SUMMARY/{exit} /^==[0-9]+== (Invalid|Conditional|Use of|Syscall|Source and|Mismatched|Argument)/{n=40} n>0{print; n--}' "$log" | head -200 >&2
        failed=1
    fi
    if [ "${definite:-0}" != 0 ] || [ "${indirect:-0}" != 0 ]; then
        echo "error: $p: blocks definitely/indirectly lost at exit (stacks in $log)" >&2
        failed=1
    fi
    if [ "$rc" != 0 ] && [ "$rc" != 42 ]; then
        echo "error: $p: the driver failed (exit $rc): a session or an output against its golden (see $OUT/$p.out)" >&2
        failed=1
    fi
done
echo "valgrind: $(($(date +%s) - start)) s wall for ${list[*]}"
if [ "$failed" != 0 ]; then
    echo "valgrind: FAILED" >&2
    exit 1
fi
echo "valgrind: clean (no memcheck error outside scripts/valgrind.supp, no definite or indirect leak, every output matches its golden)"
