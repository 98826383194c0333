#!/usr/bin/env bash
# Coverage-guided in-process fuzzing (libFuzzer) of every operator: fuzz/, docs/VERIFICATION.md.
#   scripts/fuzz.sh [--runs N | --seconds S] [--seed N] [target...]
#   scripts/fuzz.sh --merge [target...]
#   scripts/fuzz.sh --self-test
# Builds the targets with SanitizerCoverage (stable Rust: -Cpasses=sancov-module) into
# target/fuzz (the emulated libmluops is the plain release build), then runs each target, one process per
# target, for N cases or S seconds with libFuzzer's -seed (default 1), over two corpora: the
# scratch one, target/fuzz/corpus/<target>, emptied first and where the new inputs that add
# coverage are written, and the tracked fuzz/corpus/<target>, only read. A run therefore
# depends only on the tracked corpus, the seed and the code (with --runs). Any finding (a
# panic, a disagreement between paths, a crash) stops the run and leaves its input in
# target/fuzz/artifacts/<target>/. A run interrupted by hand with no input saved is no finding:
# it exits 130, skipping any targets after it (keep its new inputs with --merge).
# --merge adds the scratch inputs that add coverage to fuzz/corpus (libFuzzer -merge=1): the
# one way the tracked corpus changes; run it after a long run, before the next run empties
# the scratch corpus.
# --self-test builds VoxelPoolingForward's target with one wrong element planted in its CPU
# kernel (the feature planted-fault, src/ops/voxel_pooling/forward.rs), replays the tracked
# corpus in name order, and fails unless a replayed input catches the fault; it prints how
# many inputs it took.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
limit=(-runs=2000)
seed=1
mode=fuzz
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) limit=("-runs=$2"); shift 2 ;;
        --seconds) limit=("-max_total_time=$2"); shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --merge) mode=merge; shift ;;
        --self-test) mode=self-test; shift ;;
        *) targets+=("$1"); shift ;;
    esac
done
if [ "$mode" = self-test ]; then
    targets=(voxel_pooling_forward)
elif [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v onnxruntime-ep-mlu-fuzz)
fi
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
# The emulated libmluops is the plain release build (scripts/test.sh's build stage has made
# it: nothing recompiles); only the instrumented targets go to target/fuzz.
cargo build --quiet --release --example mluops_emulated
export MLU_EP_MLUOPS_LIBRARY="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/libmluops_emulated.so"
export CARGO_TARGET_DIR="$ROOT/target/fuzz"
SCRATCH="$CARGO_TARGET_DIR/corpus"
SANCOV="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
planted=()
if [ "$mode" = self-test ]; then
    planted=(--features planted-fault)
fi
echo "== fuzz: building ${#targets[@]} targets with coverage instrumentation${planted[*]:+ and ${planted[*]}}"
# --target: build scripts (which compile the C++ emulator) are not instrumented. The planted
# build shares the dependencies with the normal one (same RUSTFLAGS); cargo keeps this crate's
# two builds apart (features are in their hash), so neither rebuilds the other.
RUSTFLAGS="$SANCOV" \
    cargo build --quiet --release --manifest-path fuzz/Cargo.toml --target "$TRIPLE" "${planted[@]}" \
    $(printf -- '--bin %s ' "${targets[@]}")
run() { # target, log, libFuzzer arguments...
    local t="$1" log="$2"
    shift 2
    "$CARGO_TARGET_DIR/$TRIPLE/release/$t" "$@" -max_len=4096 -rss_limit_mb=2048 \
        -artifact_prefix="$CARGO_TARGET_DIR/artifacts/$t/" >"$log" 2>&1
}
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "$CARGO_TARGET_DIR/artifacts/$t"
    log="$CARGO_TARGET_DIR/artifacts/$t/last.log"
    status=0
    case "$mode" in
    merge)
        echo "== fuzz: merging $SCRATCH/$t into fuzz/corpus/$t"
        before=$(find "fuzz/corpus/$t" -type f | wc -l)
        run "$t" "$log" -merge=1 "fuzz/corpus/$t" "$SCRATCH/$t" || status=$?
        echo "fuzz/corpus/$t: $before -> $(find "fuzz/corpus/$t" -type f | wc -l) inputs"
        ;;
    self-test)
        mapfile -t inputs < <(find "fuzz/corpus/$t" -type f | LC_ALL=C sort)
        echo "== fuzz: self-test: $t with the planted fault over its ${#inputs[@]} corpus inputs (log $log)"
        # Files, not the directory: libFuzzer runs them in this order and names each.
        run "$t" "$log" "${inputs[@]}" || status=$?
        replayed=$(grep -c '^Running: ' "$log" || true)
        if [ "$status" -eq 0 ]; then
            echo "fuzz: self-test FAILED: the planted fault went through all ${#inputs[@]} corpus inputs undetected"
            exit 1
        fi
        # The finding must be the planted one: output 0 of VoxelPoolingForward, on a card
        # path against the CPU or the CPU against the reference.
        if ! grep -A1 "panicked" "$log" | grep -q "VoxelPoolingForward on .*: output 0\|output_features against the reference"; then
            echo "fuzz: self-test FAILED: the target stopped (exit $status) without finding the planted fault"
            tail -20 "$log"
            exit 1
        fi
        echo "fuzz: self-test passed: the planted fault caught at corpus input $replayed of ${#inputs[@]}:"
        grep -m1 -A1 "panicked" "$log"
        status=0
        ;;
    fuzz)
        rm -rf "${SCRATCH:?}/$t"
        mkdir -p "$SCRATCH/$t"
        echo "== fuzz: $t (${limit[*]} -seed=$seed; log $log)"
        run "$t" "$log" "$SCRATCH/$t" "fuzz/corpus/$t" "${limit[@]}" -seed="$seed" -print_final_stats=1 || status=$?
        grep -E "^(fuzz-counts|fuzz-judge|fuzz-off-card|Done|stat::number_of_executed_units|stat::peak_rss_mb)|INITED|panicked|ERROR|SUMMARY" "$log" | tail -9
        # libFuzzer exits 72 when interrupted (SIGINT or SIGTERM) and then writes no input: a
        # long run stopped by hand (kill -INT <pid>), not a finding. Any other status, or any
        # input saved, is a finding (an old saved input too: on the safe side).
        if [ "$status" -eq 72 ] && [ -z "$(find "$CARGO_TARGET_DIR/artifacts/$t" -type f ! -name last.log)" ]; then
            echo "fuzz: $t interrupted (SIGINT or SIGTERM) with no finding (its last counts: $log); keep its new inputs with --merge"
            exit 130
        fi
        ;;
    esac
    if [ "$status" -ne 0 ]; then
        echo "fuzz: $t found a failure (exit $status); the input is in $CARGO_TARGET_DIR/artifacts/$t/, the log above"
        tail -40 "$log"
        exit 1
    fi
done
