#!/usr/bin/env bash
# Runs every test on a fresh machine: installs onnxruntime 1.31.1, pytest and PyTorch into
# .venv (scripts/setup.sh --test), builds the
# library, runs the Rust unit and integration tests (including the sessions driven through
# the `ort` crate, the BANG kernels and emulator self-tests on the emulated MLU card, those
# again with the C++ built by g++-11 and clang-14 at -std=c++17), the
# network-scale seed cases in release mode (MLU_EP_FULL_SCALE=1, CPU and emulated MLU), the
# Python session and export tests, the in-process fuzz targets (scripts/fuzz.sh) and the
# session fuzz harness, the model-zoo regression runner, the named networks
# against their peer libraries (networks/run.py, CI scale), the card owner's run rehearsed
# against a stand-in Neuware toolkit (scripts/rehearse_card.sh), and the main job.
#
# scripts/test.sh --card: on a host with Cambricon MLU cards and a Neuware toolkit
# (NEUWARE_HOME), the tests that run on a card, on every card the runtime lists, instead
# (docs/USAGE.md, "Testing on a card").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
case "${1:-}" in
    "") card=0 ;;
    --card) card=1 ;;
    *) echo "usage: scripts/test.sh [--card]" >&2; exit 2 ;;
esac
if [ "$card" = 1 ] && [ -z "${NEUWARE_HOME:-}" ]; then
    echo "test.sh --card: set NEUWARE_HOME to the Neuware toolkit: its cncc compiles kernels/ for the card and its lib64/libcnrt.so is the runtime" >&2
    exit 1
fi
# Each stage's heading carries the minutes and seconds since the start (CI's budget); at the
# exit, on a failure too, a table of every stage's duration.
stage_names=()
stage_starts=()
stage_ends=()
fg=-1 # the foreground stage running
stage() {
    [ "$fg" -lt 0 ] || stage_ends[fg]=$SECONDS
    stage_names+=("$*")
    stage_starts+=("$SECONDS")
    fg=$((${#stage_names[@]} - 1))
    echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"
}
# stage_beside <name> <command...>: a stage that runs in the background, beside the stages
# that follow until stage_join: one that keeps one core busy (valgrind runs a program's
# threads one at a time) while the other core works. Its output goes to a log of its own,
# printed whole when it is joined; its status is checked there.
beside_pids=()
beside_stages=()
stage_beside() {
    local name="$1" i log
    shift
    stage_names+=("$name")
    stage_starts+=("$SECONDS")
    i=$((${#stage_names[@]} - 1))
    log="$ROOT/target/test-stages/$i.log"
    mkdir -p "$ROOT/target/test-stages"
    rm -f "$log" "$log.status" "$log.end"
    echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $name (in the background beside the next stages; its output when it ends)"
    # $SECONDS goes on counting in the subshell from the script's start. The command runs in
    # a process group of its own (set -m), which the subshell ends when it is stopped itself.
    (
        set +e -m
        "$@" >"$log" 2>&1 &
        child=$!
        set +m
        trap 'kill -- -$child 2>/dev/null; exit 143' TERM
        wait "$child"
        echo $? >"$log.status"
        echo "$SECONDS" >"$log.end"
    ) &
    beside_pids+=($!)
    beside_stages+=("$i")
}
# stage_join: waits for every background stage, prints its output, and stops the script with
# the status of the first that failed.
stage_join() {
    local k i log status
    # The foreground stage ended here; the wait below is the background stages' own time.
    [ "$fg" -lt 0 ] || stage_ends[fg]=$SECONDS
    fg=-1
    for k in "${!beside_pids[@]}"; do
        i=${beside_stages[k]}
        log="$ROOT/target/test-stages/$i.log"
        wait "${beside_pids[k]}" || true
        stage_ends[i]=$(cat "$log.end")
        status=$(cat "$log.status")
        echo "== the output of \"${stage_names[i]:0:110}\" (exit $status):"
        cat "$log"
        if [ "$status" != 0 ]; then
            failed=$i
            beside_pids=("${beside_pids[@]:k+1}")
            exit "$status"
        fi
    done
    beside_pids=()
    beside_stages=()
}
stage_table() {
    local status=$? i end pid
    # Background stages still running when a foreground stage fails are stopped with it.
    for pid in "${beside_pids[@]}"; do
        kill -- "$pid" 2>/dev/null || true
    done
    [ "$fg" -lt 0 ] || stage_ends[fg]=$SECONDS
    if [ ${#stage_names[@]} -gt 0 ]; then
        echo "== stage times ($([ "$status" = 0 ] && echo "all passed" || echo "stopped with exit $status in the stage marked FAILED"), $((SECONDS / 60))m$((SECONDS % 60))s in all; \"beside\": run in the background beside the stages below it)"
        for i in "${!stage_names[@]}"; do
            end=${stage_ends[i]:-$SECONDS}
            printf '%4dm%02ds  %s%s\n' $(((end - stage_starts[i]) / 60)) $(((end - stage_starts[i]) % 60)) \
                "$([ "$status" != 0 ] && [ "$i" = "${failed:-$fg}" ] && echo "FAILED: ")" "${stage_names[$i]:0:110}"
        done
    fi
    return "$status"
}
trap stage_table EXIT
if [ "$card" = 1 ]; then
    # Card mode needs only Rust, the toolkit, a C++17 compiler and Python with onnxruntime,
    # onnx, numpy and pytest (scripts/setup.sh --card says what is missing).
    source scripts/setup.sh --card
    unset MLU_EP_EMULATE MLU_EP_BACKEND
    echo "== card mode: build with the toolkit's cncc (NEUWARE_HOME=$NEUWARE_HOME)"
    cargo build --release --lib
    export MLU_EP_LIB="$ROOT/target/release/libonnxruntime_ep_mlu.so"
    cards=$("$VENV/bin/python" -c '
import sys, onnxruntime as ort
ort.register_execution_provider_library("MLUExecutionProvider", sys.argv[1])
print(sum(d.ep_name == "MLUExecutionProvider" and dict(d.device.metadata).get("emulated") == "false" for d in ort.get_ep_devices()))
' "$MLU_EP_LIB")
    if [ "$cards" -lt 1 ]; then
        echo "test.sh --card: the provider lists no real MLU card (run with ORT's logging at INFO to see why)" >&2
        exit 1
    fi
    for ((i = 0; i < cards; i++)); do
        echo "== card $i of $cards: the BANG kernels against the CPU kernels, seed and network scale"
        MLU_EP_TEST_DEVICE=$i cargo test --release --test bang_kernels
        MLU_EP_TEST_DEVICE=$i MLU_EP_FULL_SCALE=1 cargo test --release --test bang_kernels -- network_scale
    done
    # The backends this host has: `bang` whenever there is a card (the cncc kernel library is
    # loaded with it); `mluops` when the provider finds a usable libmluops (it says why not;
    # onnxruntime <= 1.31 prints that refusal and runs the session on the CPU, so placement
    # decides); `auto` then too (without MLU-OPS it is `bang`, already run).
    backends=(bang)
    not_run=()
    probe_log="$(mktemp)"
    if "$VENV/bin/python" -c '
import sys, onnxruntime as ort
EP = "MLUExecutionProvider"
ort.register_execution_provider_library(EP, sys.argv[1])
so = ort.SessionOptions()
so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == EP][:1], {"mlu_backend": "mluops"})
sess = ort.InferenceSession(sys.argv[2], so)
sys.exit(0 if any(s.ep_name == EP and s.get_nodes() for s in sess.get_provider_graph_assignment_info()) else 1)
' "$MLU_EP_LIB" models/mluops_demo.onnx 2>"$probe_log"; then
        backends+=(mluops auto)
    else
        why="$(grep -o "not usable: .*" "$probe_log" | head -n 1 || true)"
        [ -n "$why" ] || why="no node claimed: $(tail -n 3 "$probe_log" | tr '\n' ' ')"
        not_run+=("mluops: the provider finds no usable MLU-OPS library (${why#not usable: })"
            "auto: without MLU-OPS it is the bang run")
    fi
    rm -f "$probe_log"
    for backend in "${backends[@]}"; do
        echo "== mlu_backend=$backend on every card: sessions, placement, declines, the error table, the model zoo"
        MLU_EP_TEST_CARD=1 MLU_EP_BACKEND=$backend "$VENV/bin/python" -m pytest tests/python/test_ep.py tests/python/test_errors.py -q -rs
        for ((i = 0; i < cards; i++)); do
            MLU_EP_BACKEND=$backend "$VENV/bin/python" models/run_zoo.py --card "$i" --providers mlu "$MLU_EP_LIB"
        done
    done
    for why in "${not_run[@]}"; do
        echo "== card mode: NOT RUN: mlu_backend=$why"
    done
    echo "== card mode: all passed on $cards card(s), mlu_backend ${backends[*]}; ${#not_run[@]} backend(s) not run${not_run:+ (above)}"
    exit 0
fi
source scripts/setup.sh --test
# The host suite tests the emulated card (its clusters and modes), also on a card host.
export MLU_EP_TEST_DEVICE=emulated
# Property tests draw their cases from a fixed seed here, so that a failure replays exactly
# (`PROPTEST_RNG_SEED=<n> cargo test` explores other cases; proptest keeps what fails in
# the tests' *.proptest-regressions files, replayed first).
export PROPTEST_RNG_SEED=1
stage "format: cargo fmt --check (rustfmt.toml), the crate and the fuzz targets"
cargo fmt --check
cargo fmt --check --manifest-path fuzz/Cargo.toml
stage "lints: cargo clippy on every target, warnings are errors (Cargo.toml [lints])"
cargo clippy --quiet --all-targets -- -D warnings
stage "build (release library for the Python tests)"
cargo build --release --lib --example mluops_emulated
export MLU_EP_LIB="$ROOT/target/release/libonnxruntime_ep_mlu.so"
stage "cargo test (unit, integration, ort sessions, property tests)"
# tests/mluops_backend.rs loads the emulated libmluops of the same profile; `cargo test`
# builds examples under hashed names only, so the plain name is built here.
cargo build --example mluops_emulated
cargo test --all-targets
stage "BANG kernels and emulator rules on emulated cards of 1 and 4 clusters (2 above)"
# (The emulator's self-tests launch 8 tasks: they need 2 clusters or more.)
MLU_EMU_CLUSTERS=1 cargo test --quiet --test bang_kernels
MLU_EMU_CLUSTERS=4 cargo test --quiet --test bang_kernels --test emulator
stage "BANG kernels and emulator rules in each emulator mode: denormals flushed, async copies landing at issue, clusters one at a time last first"
# What a card may do differently from the host (kernels/README.md, "Modes"): a kernel whose
# result depends on the mode is a bug.
for mode in MLU_EMU_FTZ=1 MLU_EMU_ASYNC=early MLU_EMU_ORDER=serial; do
    env "$mode" MLU_EMU_CLUSTERS=4 cargo test --quiet --test bang_kernels --test emulator
done
stage "the same, the C++ (emulator, kernels, self-tests) built at -std=c++17 -Werror by g++-11, then clang-14"
# A Cambricon host's compiler is older than Debian 12's g++ 12 (docs/USAGE.md, toolchain).
# `cc` honours CXX and CXXFLAGS: only the C++ and this crate are rebuilt (seconds), and the
# next plain debug build rebuilds them with the default compiler again.
for cxx in g++-11 clang++-14; do
    start=$SECONDS
    CXX=$cxx CXXFLAGS=-Werror MLU_EMU_CLUSTERS=4 cargo test --quiet --test bang_kernels --test emulator --test bang_allow_list
    echo "   $cxx: built and ran in $((SECONDS - start)) s"
done
stage "BANG kernels and emulator under ThreadSanitizer, then Address+UndefinedBehaviorSanitizer (4 clusters)"
MLU_EMU_CLUSTERS=4 scripts/sanitize.sh thread
MLU_EMU_CLUSTERS=4 scripts/sanitize.sh address
stage "seed cases at network scale (release)"
# An operator suite's seed cases are its tests named seed_*: every suite that has one runs
# them (and its other tests named with "seed"), at full size where they read MLU_EP_FULL_SCALE.
mapfile -t seed_suites < <(grep -lzP '#\[test\]\n(#\[[^\n]*\]\n)*fn seed_' tests/*.rs | xargs -n1 basename -s .rs)
[ ${#seed_suites[@]} -gt 0 ] || { echo "no suite in tests/ has a seed_* test" >&2; exit 1; }
echo "   suites: ${seed_suites[*]}"
MLU_EP_FULL_SCALE=1 cargo test --release $(printf -- '--test %s ' "${seed_suites[@]}") -- seed
stage "BANG kernels on the emulated MLU card at network scale (release; no MLU hardware)"
MLU_EP_FULL_SCALE=1 cargo test --release --test bang_kernels -- network_scale
stage "python session tests"
# -rs: every skip says why (the C++ example NOT RUN without headers); -n 2: pytest-xdist's two
# worker processes, one per core (most tests drive one session at a time).
"$VENV/bin/python" -m pytest tests/python -q -rs -n 2
stage "in-process coverage-guided fuzzing: each operator's target over its corpus, then new cases up to 1,500 runs at -seed=1 into a scratch corpus, every path; then the self-test: a planted wrong element the corpus replay must catch (fuzz/, scripts/fuzz.sh)"
scripts/fuzz.sh --runs 1500 --seed 1
scripts/fuzz.sh --self-test
stage "session fuzz: 9,000 fixed-seed cases (every operator of the registry, both paths, through ONNX Runtime, isolated workers; tests/fuzz/README.md)"
"$VENV/bin/python" tests/fuzz/fuzz.py --lib "$MLU_EP_LIB" --seed 1 --cases 9000
stage "session fuzz on the MLU-OPS backend: 4,800 cases of the operators it runs (the registry's), mlu_backend=mluops against the emulated libmluops"
MLU_EP_BACKEND=mluops MLU_EP_MLUOPS_LIBRARY="$ROOT/target/release/examples/libmluops_emulated.so" \
    "$VENV/bin/python" tests/fuzz/fuzz.py --lib "$MLU_EP_LIB" --seed 2 --cases 4800 \
    --ops-on mluops
stage "builds of the two valgrind stages (release library and driver, the ops bench)"
# Here, before they run side by side, so that neither's build rewrites a library that the
# other stages have loaded: in the stages, both cargo commands find everything fresh.
cargo build --release --lib --example valgrind_sessions
cargo bench --bench ops --no-run
stage_beside "beside: every operator's session on both paths under valgrind (memcheck)" scripts/valgrind.sh
stage_beside "beside: the kernel profile: callgrind's instruction and cache-miss counts of every bench case (scripts/profile.sh)" scripts/profile.sh
stage "the ONNX Runtime range: 1.24.4 and 1.32.0 (own environments), 1.23.2 refused"
scripts/ort_range.sh
stage_join
stage "the wheel: scripts/wheel.sh (manylinux_2_35, auditwheel), installed with no compiler on PATH with onnxruntime 1.31.1 and numpy only, both paths, README's snippets and the regression tool from outside the checkout"
scripts/wheel_check.sh
stage "model fixtures are what the builder writes"
# Release: the CXX stage above left the debug build on clang-14, the release one is warm.
cargo run --release --quiet --example build_models -- --check
stage "model goldens are what the independent numpy models compute"
"$VENV/bin/python" models/make_zoo_goldens.py --check
stage "model-level regression suite (CPU and emulated MLU provider)"
"$VENV/bin/python" models/run_zoo.py "$MLU_EP_LIB"
stage "the named networks exported from PyTorch against their peers (spconv 2.3.8, torch, torchvision), CI scale, both paths"
"$VENV/bin/python" networks/run.py --scale ci --repeat 3 --library "$MLU_EP_LIB"
stage "dataset regression: 20 generated frames per zoo model, CPU and emulated MLU against the numpy models' goldens, in-process (the Ray runs are in tests/python/test_ray_regression.py)"
"$VENV/bin/python" models/run_dataset.py --generate 20 --library "$MLU_EP_LIB" --reference models/make_zoo_goldens.py
stage "the card owner's first run, rehearsed: NEUWARE_HOME=<stand-in toolkit> scripts/test.sh --card on a clean clone (2 stand-in cards, the cncc-built kernel library, the toolkit's libmluops), provenance, the doctor, one failed kernel family (scripts/rehearse_card.sh)"
scripts/rehearse_card.sh
stage "main job"
"$VENV/bin/python" models/run_demo.py "$MLU_EP_LIB"
