#!/usr/bin/env bash
# The card owner's first run, rehearsed without a card (docs/USAGE.md, "The card run,
# rehearsed"): builds a stand-in Neuware toolkit from our emulator under
# target/rehearsal/neuware, then runs the owner's exact command,
# `NEUWARE_HOME=<stand-in> scripts/test.sh --card`, on a clean clone of HEAD, and checks that
# the cards came through src/mlu/cnrt.rs (MLU_EP_EMULATE unset) and that the nodes ran
# through the cncc-built kernel library and the toolkit's libmluops
# (tests/standin_neuware/provenance.py). The stand-in toolkit:
#   lib64/libcnrt.so     the CNRT calls of src/mlu/cnrt.rs over the emulator, reporting
#                        MLU_STANDIN_CARDS (default 2) emulated MLU370 cards
#                        (tests/standin_neuware/cnrt.cc);
#   lib64/libcndrv.so    empty: the kernel library's link line names it
#                        (build_support/cncc.rs) and nothing calls it;
#   bin/cncc             the host C++ compiler behind cncc's command line
#                        (tests/standin_neuware/cncc);
#   lib64/libmluops.so   the emulated libmluops (mluops_emulated/);
#   include/mlu_op.h     the stand-in header (tests/data/mlu_op_standin.h).
# It proves our glue and our harness, never Cambricon's compiler, runtime or silicon.
#
# The clone builds into its own target/, seeded with a copy of this checkout's
# target/release (when present) so that only this crate is rebuilt. Uses .venv (linked into
# the clone) and the host C++ compiler ($CXX, default c++).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/target/rehearsal"
TOOLKIT="$OUT/neuware"
CHECKOUT="$OUT/checkout"
CXX_PATH="$(command -v "${CXX:-c++}")" || { echo "rehearse_card: no host C++ compiler (${CXX:-c++})" >&2; exit 1; }
unset MLU_EP_EMULATE MLU_EP_BACKEND MLU_EP_MLUOPS_LIBRARY MLU_EP_KERNEL_LIBRARY MLUOPS_HOME MLU_EP_TEST_DEVICE
start=$SECONDS

echo "== rehearse_card: the stand-in Neuware toolkit in $TOOLKIT"
rm -rf "$OUT"
mkdir -p "$TOOLKIT/bin" "$TOOLKIT/lib64" "$TOOLKIT/include"
"$CXX_PATH" -std=c++17 -O2 -fPIC -shared -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -pthread \
    -o "$TOOLKIT/lib64/libcnrt.so" tests/standin_neuware/cnrt.cc kernels/emulator/emu_runtime.cc
"$CXX_PATH" -shared -fPIC -x c++ /dev/null -o "$TOOLKIT/lib64/libcndrv.so"
sed "s|@CXX@|$CXX_PATH|" tests/standin_neuware/cncc >"$TOOLKIT/bin/cncc"
chmod +x "$TOOLKIT/bin/cncc"
cargo build --quiet --release --example mluops_emulated
cp target/release/examples/libmluops_emulated.so "$TOOLKIT/lib64/libmluops.so"
cp tests/data/mlu_op_standin.h "$TOOLKIT/include/mlu_op.h"
echo "   built in $((SECONDS - start)) s"

echo "== rehearse_card: a clean clone of HEAD ($(git rev-parse --short HEAD)) in $CHECKOUT"
git clone --quiet "$ROOT" "$CHECKOUT"
ln -s "$ROOT/.venv" "$CHECKOUT/.venv"
if [ -d target/release ]; then
    # A copy, not hard links: the clone's build rewrites some of these files in place.
    mkdir -p "$CHECKOUT/target"
    cp -a --reflink=auto target/release "$CHECKOUT/target/release"
fi

echo "== rehearse_card: NEUWARE_HOME=$TOOLKIT scripts/test.sh --card"
NEUWARE_HOME="$TOOLKIT" "$CHECKOUT/scripts/test.sh" --card 2>&1 | tee "$OUT/test-card.log"
summary="$(grep '^== card mode: all passed' "$OUT/test-card.log" | tail -n 1)"

echo "== rehearse_card: provenance (cards through libcnrt, nodes through the cncc kernel library and the toolkit's libmluops)"
LIB="$CHECKOUT/target/release/libonnxruntime_ep_mlu.so"
KERNELS="$(grep -a -o '/[^[:space:][:cntrl:]]*/libbang_kernels_mlu\.so' "$LIB" | head -n 1)"
[ -f "$KERNELS" ] || { echo "rehearse_card: the library names no built kernel library ($KERNELS)" >&2; exit 1; }
NEUWARE_HOME="$TOOLKIT" "$ROOT/.venv/bin/python" "$CHECKOUT/tests/standin_neuware/provenance.py" "$LIB" "$TOOLKIT" "$KERNELS"

echo "== rehearse_card: the doctor's report on the stand-in toolkit (python -m onnxruntime_ep_mlu.doctor --card)"
NEUWARE_HOME="$TOOLKIT" MLU_EP_LIB="$LIB" PYTHONPATH="$CHECKOUT/python" "$ROOT/.venv/bin/python" -m onnxruntime_ep_mlu.doctor --card

echo "== rehearse_card: a toolkit whose cncc fails the kernel family sparse_conv (MLU_STANDIN_CNCC_FAIL): the card stays, the other families and MLU-OPS run"
BROKEN="$OUT/neuware-broken"
cp -r "$TOOLKIT" "$BROKEN"
sed "s|@CXX@|$CXX_PATH|" tests/standin_neuware/cncc | sed '2i export MLU_STANDIN_CNCC_FAIL=sparse_conv' >"$BROKEN/bin/cncc"
(cd "$CHECKOUT" && NEUWARE_HOME="$BROKEN" cargo build --release --lib 2>&1 | grep -F "cncc failed on the kernel family")
NEUWARE_HOME="$BROKEN" "$ROOT/.venv/bin/python" "$CHECKOUT/tests/standin_neuware/one_family_failed.py" "$LIB"
echo "== rehearse_card: passed in $((SECONDS - start)) s (stand-in toolkit: our emulator, not Cambricon's); test.sh --card said:"
echo "$summary"
