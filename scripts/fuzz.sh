#!/usr/bin/env bash
# Coverage-guided in-process fuzzing (libFuzzer) of every operator: fuzz/, docs/VERIFICATION.md.
#   scripts/fuzz.sh [--runs N | --seconds S] [target...]
# Builds the targets with SanitizerCoverage (stable Rust: -Cpasses=sancov-module) into
# target/fuzz (the emulated libmluops is the plain release build), then runs each target over its corpus in
# fuzz/corpus/<target> (new inputs that add coverage are added there) for N cases or S
# seconds, one process per target. Any finding (a panic, a disagreement between paths, a
# crash) stops the run and leaves its input in target/fuzz/artifacts/<target>/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
limit=(-runs=2000)
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) limit=("-runs=$2"); shift 2 ;;
        --seconds) limit=("-max_total_time=$2"); shift 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v onnxruntime-ep-mlu-fuzz)
fi
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
# The emulated libmluops is the plain release build (scripts/test.sh's build stage has made
# it: nothing recompiles); only the instrumented targets go to target/fuzz.
cargo build --quiet --release --example mluops_emulated
export MLU_EP_MLUOPS_LIBRARY="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/libmluops_emulated.so"
export CARGO_TARGET_DIR="$ROOT/target/fuzz"
echo "== fuzz: building ${#targets[@]} targets with coverage instrumentation"
# --target: build scripts (which compile the C++ emulator) are not instrumented.
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing" \
    cargo build --quiet --release --manifest-path fuzz/Cargo.toml --target "$TRIPLE" --bins
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "$CARGO_TARGET_DIR/artifacts/$t"
    log="$CARGO_TARGET_DIR/artifacts/$t/last.log"
    echo "== fuzz: $t (${limit[*]}; log $log)"
    status=0
    "$CARGO_TARGET_DIR/$TRIPLE/release/$t" "fuzz/corpus/$t" "${limit[@]}" -max_len=4096 -rss_limit_mb=2048 \
        -artifact_prefix="$CARGO_TARGET_DIR/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E "^(fuzz-counts|fuzz-off-card|Done|stat::number_of_executed_units|stat::peak_rss_mb)|INITED|panicked|ERROR|SUMMARY" "$log" | tail -8
    if [ "$status" -ne 0 ]; then
        echo "fuzz: $t found a failure (exit $status); the input is in $CARGO_TARGET_DIR/artifacts/$t/, the log above"
        tail -40 "$log"
        exit 1
    fi
done
