#!/usr/bin/env bash
# Runs the emulated-card tests (tests/bang_kernels.rs, tests/emulator.rs) with the BANG
# kernels and the host emulator built under a sanitizer:
#   scripts/sanitize.sh thread    ThreadSanitizer: a data race between emulated cores (two
#                                 host threads storing the same GDRAM element without an
#                                 atomic, or one storing what another reads) fails the run;
#   scripts/sanitize.sh address   AddressSanitizer + UndefinedBehaviorSanitizer: an overrun of
#                                 a device buffer (allocated at its exact size), a scalar
#                                 access to NRAM/WRAM outside every carved tile (poisoned, see
#                                 Core::poison_onchip in kernels/emulator/emu_runtime.cc), or
#                                 undefined behaviour fails the run.
# Only the C++ (kernels/, compiled by build.rs through the cc crate, which honours CXXFLAGS)
# is instrumented; the Rust code is not. The build shares the normal target/ (the debug
# profile): the dependencies are the ones `cargo test` built, only this crate is rebuilt
# with the instrumented C++, and the next plain build rebuilds it again (cc's CXXFLAGS are
# tracked). Each card size of MLU_EMU_CLUSTERS (default "2 4") is one run of the two built
# test binaries. Exits nonzero on a failing test or any sanitizer report.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

kind="${1:-}"
case "$kind" in
    thread) sanitizers=thread; runtimes=(tsan); packages="libtsan2 (and libgcc-12-dev)" ;;
    address) sanitizers=address,undefined; runtimes=(asan ubsan); packages="libasan8 libubsan1 (and libgcc-12-dev)" ;;
    *) echo "usage: $0 thread|address" >&2; exit 2 ;;
esac

# The sanitizer runtimes of the C++ compiler build.rs uses (gcc's; `cc` honours CXX).
cxx="${CXX:-c++}"
libs=()
for rt in "${runtimes[@]}"; do
    path="$("$cxx" -print-file-name="lib$rt.so")"
    if [ "$path" = "lib$rt.so" ] || [ ! -e "$path" ]; then
        echo "error: $cxx has no lib$rt.so (Debian: apt-get install $packages)" >&2
        exit 1
    fi
    libs+=("$path")
done

out="${CARGO_TARGET_DIR:-$ROOT/target}/sanitize-$kind"
mkdir -p "$out"
log="$out/sanitize.log"
: >"$log"

# C++: instrumented, with frame pointers and line info for the reports; MLU_EMU_SANITIZE
# switches on the emulator's poisoning of on-chip memory (a no-op without ASan).
export CXXFLAGS="-fsanitize=$sanitizers -g -O1 -fno-omit-frame-pointer -DMLU_EMU_SANITIZE"
# Rust: rustc links with -nodefaultlibs, so -fsanitize at link time adds no runtime: name it.
# Only on the two test binaries' link (`cargo rustc` passes what follows `--` to the named
# target alone): the dependencies, build scripts and proc macros stay those of the plain
# debug build, so nothing but this crate is compiled again (RUSTFLAGS would rebuild them all).
link=(-C "link-arg=-fsanitize=$sanitizers")
for rt in "${runtimes[@]}"; do link+=(-C "link-arg=-l$rt"); done
# Every report ends the process with a nonzero status, so the run fails.
# TSan: only the C++ is instrumented; the Rust side (test harness channels, OnceLock, the CPU
# kernels' threads) synchronises with atomics and futexes TSan cannot see, so the memcpy,
# memcmp and free it calls would show as races between Rust threads. ignore_interceptors_accesses
# drops every access made inside such intercepted calls; the emulator declares its own copies
# of device memory to TSan (copy_bytes/fill_bytes in emu_runtime.cc), and the kernels' loads and
# stores are instrumented, so a race between emulated cores is still reported. Locks, condition
# variables and thread creation and join are still seen, wherever they are called from.
# history_size: the earlier access's stack in a race between long-running tasks.
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:ignore_interceptors_accesses=1:second_deadlock_stack=1:history_size=4"
# ASan: LeakSanitizer on too (a device buffer or queue never freed is a report); the Rust test
# harness leaks nothing it would flag (what std keeps for the process stays reachable).
export ASAN_OPTIONS="halt_on_error=1:exitcode=66:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:exitcode=66:print_stacktrace=1"

echo "== build: kernels and emulator with -fsanitize=$sanitizers (the test binaries' paths in $out/bins)"
start=$SECONDS
: >"$out/bins"
for t in bang_kernels emulator; do
    cargo rustc --quiet --profile test --test "$t" --message-format=json-render-diagnostics -- "${link[@]}" \
        2> >(tee -a "$log" >&2) \
        | python3 -c 'import json, sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable")]' >>"$out/bins"
done
mapfile -t bins <"$out/bins"
[ ${#bins[@]} -eq 2 ] || { echo "error: cargo reported ${#bins[@]} test executables, not 2 (see $out/bins)" >&2; exit 1; }
echo "   built in $((SECONDS - start)) s"

# The runtime must be the first library of the process (ASan refuses to start otherwise, TSan
# must see every thread and allocation): the test binaries run with it preloaded, as cargo
# test runs them (from the package root); cargo and rustc themselves never load it. ASan's
# runtime only: the UBSan runtime is an ordinary dependency of the binary.
status=0
for clusters in ${MLU_EMU_CLUSTERS:-2 4}; do
    echo "== tests on an emulated card of $clusters clusters under -fsanitize=$sanitizers"
    start=$SECONDS
    for bin in "${bins[@]}"; do
        if ! MLU_EMU_CLUSTERS=$clusters CARGO_MANIFEST_DIR="$ROOT" LD_PRELOAD="${libs[0]}" "$bin" -q 2>&1 | tee -a "$log"; then
            status=1
        fi
    done
    echo "   ran in $((SECONDS - start)) s"
done

# A report that did not end the process (one printed by a child, say) still fails the run.
if grep -qE '(Thread|Address|Leak|UndefinedBehavior)Sanitizer|runtime error:' "$log"; then
    echo "error: sanitizer report(s) in $log:" >&2
    grep -nE '(Thread|Address|Leak|UndefinedBehavior)Sanitizer|runtime error:' "$log" | head -20 >&2
    status=1
fi
if [ "$status" -ne 0 ]; then
    echo "FAILED: scripts/sanitize.sh $kind (log: $log)" >&2
else
    echo "OK: no sanitizer report (-fsanitize=$sanitizers)"
fi
exit "$status"
