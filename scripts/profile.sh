#!/usr/bin/env bash
# Counts what each CPU kernel of the bench executes: instructions and simulated cache misses
# per case of benches/ops.rs, from callgrind (valgrind), for hosts whose counters perf cannot
# read (a VM without a PMU: `perf stat` reports every hardware event `<not supported>`).
#
# The bench's `--profile` mode builds every case as `cargo bench --bench ops` does, runs each
# kernel once on one thread (after a warm-up run and a 64 MiB cache flush) inside
# `profiled_run`, and callgrind counts that call only (--toggle-collect) and dumps its totals
# after it (--dump-after). The table gives, per case:
#   instructions per output element and per byte of the case's minimal traffic (its inputs
#   read once, its outputs written once: the bench's "MB moved");
#   D1 misses x 64 B and LL misses x 64 B over the minimal traffic: how many bytes crossed
#   into the 32 KiB L1 and from beyond a 32 MiB last level, per byte the case needs.
# What callgrind counts exactly: instructions (of the builds a CPU without AVX-512 runs:
# valgrind hides AVX-512, so the AVX-512 builds cannot be counted here; a rep-prefixed
# string instruction, as glibc's memset of large blocks, counts once per iteration), loads
# and stores. What it models: the caches (L1 32 KiB 8-way and LL 32 MiB 16-way, 64 B lines,
# as this host's L1d and L3; no L2, no hardware prefetcher, software prefetches ignored,
# non-temporal stores treated as ordinary write-allocating stores, write-backs not counted:
# the LL column counts lines fetched, not lines written back). No timing: cycles come from
# the bench. About 2 minutes on 2 cores for every case once built (valgrind runs one
# thread at about 1/50 speed).
#
# Usage: scripts/profile.sh [operator-name filter, as the bench's]
# Output: the table on stdout and in target/profile/profile.md; callgrind's dumps beside it
# (callgrind_annotate reads them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
command -v valgrind >/dev/null || { echo "error: valgrind not found (Debian: apt-get install valgrind)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "error: python3 not found" >&2; exit 1; }

out="$ROOT/target/profile"
rm -rf "$out"
mkdir -p "$out"
# The bench binary's path from cargo's JSON messages (the build's own output goes to stderr).
if ! cargo bench --bench ops --no-run --message-format=json >"$out/build.json"; then
    echo "error: the ops bench did not build; the compiler's messages:" >&2
    python3 -c 'import json, sys; [print(json.loads(l).get("message", {}).get("rendered", ""), end="", file=sys.stderr) for l in open(sys.argv[1]) if l.startswith("{")]' "$out/build.json"
    exit 1
fi
bench="$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "ops" and m.get("executable"):
        print(m["executable"])
' "$out/build.json")"
[ -x "$bench" ] || { echo "error: cargo reported no executable for the ops bench (see $out/build.json)" >&2; exit 1; }
# The cache geometry is given, not detected: valgrind reads this VM's CPUID as a 320 MiB
# direct-mapped L3.
if ! valgrind --tool=callgrind --cache-sim=yes \
    --I1=32768,8,64 --D1=32768,8,64 --LL=33554432,16,64 \
    --toggle-collect=ops::profiled_run --dump-after=ops::profiled_run \
    --callgrind-out-file="$out/callgrind.out" \
    "$bench" --bench --profile ${1:+"$1"} >"$out/cases.tsv" 2>"$out/valgrind.log"; then
    echo "error: the bench failed under callgrind; the end of $out/valgrind.log:" >&2
    tail -20 "$out/valgrind.log" >&2
    exit 1
fi

python3 - "$out" <<'EOF' | tee "$out/profile.md"
import pathlib, sys
out = pathlib.Path(sys.argv[1])
cases = [line.split("\t")[1:] for line in (out / "cases.tsv").read_text().splitlines() if line.startswith("profiled\t")]
# callgrind numbers the dumps after the output file: callgrind.out.1, .2, ... in call order.
dumps = sorted(out.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
if not cases:
    sys.exit("error: no bench case matches the filter")
if len(dumps) != len(cases):
    sys.exit(f"error: {len(cases)} cases but {len(dumps)} callgrind dumps (see {out}/valgrind.log)")
print("| operator | shapes | output elements | MB moved | instructions (M) | per output element | per byte moved | D1 miss bytes / byte moved | LL miss bytes / byte moved |")
print("|---|---|---|---|---|---|---|---|---|")
for (op, shapes, moved, elements), dump in zip(cases, dumps):
    text = dump.read_text().splitlines()
    events = next(l.split()[1:] for l in text if l.startswith("events:"))
    totals = dict(zip(events, map(int, next(l.split()[1:] for l in text if l.startswith("totals:")))))
    moved, elements = int(moved), int(elements)
    ir = totals["Ir"]
    d1 = (totals["D1mr"] + totals["D1mw"]) * 64
    ll = (totals["DLmr"] + totals["DLmw"]) * 64
    print(f"| {op} | {shapes} | {elements} | {moved / 1e6:.1f} | {ir / 1e6:.1f} | {ir / elements:.1f} | {ir / moved:.2f} | {d1 / moved:.2f} | {ll / moved:.2f} |")
EOF
