"""Scratch memory that runs out is an error, not a process abort.

Each case runs one node in a child process whose address space is capped (RLIMIT_AS) so
that onnxruntime can still allocate the node's outputs but the kernel's own scratch
buffers (which grow with the attributes, not with the inputs' size) cannot all fit. Rust's
infallible allocations would abort the child (SIGABRT, which no error handling can stop);
the kernels allocate those buffers fallibly, so the run fails with an "out of memory" error
naming the buffer, and the child exits normally.

Each cap sits inside the window where the outputs fit and the scratch does not, so that the
run must take the fallible path: a run that succeeds fails the test (it would prove nothing).
Windows measured (2026-05, release build, 2 threads), lower end where ONNX Runtime's own output
allocation fails: GetIndicePairs fails in the kernel from 2.0 to 3.0 GB (cap 2.5);
ThreeInterpolateBackward from 3.0 to 4.5 GB, succeeds at 5.0 (cap 3.5); VoxelPoolingForward
from 2.5 to 4.0 GB, its 1.6 GB output failing in ONNX Runtime at 2.0 and the run succeeding
at 4.5 (cap 3.2).
"""
from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# The child: reads (op, attributes, feeds, library, on the emulated card) as JSON on stdin, builds the model with
# the tests' own helpers and prints the outcome as JSON.
CHILD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import onnxruntime as ort
from conftest import build_model, make_session
op, attrs, feeds, lib, card, symbolic = json.loads(sys.stdin.read())
arrays = {name: np.array(value, dtype=dtype).reshape(shape) for name, (value, dtype, shape) in feeds.items()}
# Symbolic dimensions keep the provider from declining the node on static sizes.
spec = [(name, str(a.dtype), [f"{name}_{i}" for i in range(a.ndim)] if symbolic else list(a.shape)) for name, a in arrays.items()]
try:
    model = build_model(op, attrs, spec, "oom_node")
    if card:
        os.environ["MLU_EP_EMULATE"] = "1"
        ort.register_execution_provider_library("MLUExecutionProvider", lib)
        so = ort.SessionOptions()
        so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == "MLUExecutionProvider"], {})
        sess = ort.InferenceSession(model, so)
    else:
        sess = make_session(model, lib, intra_threads=2)
    outs = sess.run(None, arrays)
    print(json.dumps({"ok": [list(o.shape) for o in outs]}))
except Exception as e:
    print(json.dumps({"error": str(e)}))
"""


def rng_ints(n: int, high: int, seed: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(0, high, n).tolist()


def gip_case():
    # indice_pairs would be K * 2 * L int32 = 1.3 GB, allocated after the plan; the plan's
    # pairs (up to K per row, 12 bytes each with the output-grid bitmap: about 2 GB, more
    # while their buffers grow) do not fit under 2.5 GB.
    l, s = 40000, 200
    rows = [[0, z, y, x] for z, y, x in zip(rng_ints(l, s, 1), rng_ints(l, s, 2), rng_ints(l, s, 3))]
    attrs = {
        "batch_size": {"int": 1},
        "spatial_shape": {"ints": [s, s, s]},
        "kernel_size": {"ints": [16, 16, 16]},
        "padding": {"ints": [8, 8, 8]},
    }
    feeds = {"indices": (sum(rows, []), "int32", [l, 4])}
    return "GetIndicePairs", attrs, feeds, 2_500_000_000


def tib_case():
    # grad_features is B * C * m floats = 1.92 GB; each task's accumulators take m * 8
    # floats more.
    m = 30_000_000
    feeds = {
        "grad_output": ([0.5] * 16, "float32", [1, 16, 1]),
        "indices": ([0, 1, m - 1], "int32", [1, 1, 3]),
        "weights": ([0.2, 0.3, 0.5], "float32", [1, 1, 3]),
    }
    return "ThreeInterpolateBackward", {"m": {"int": m}}, feeds, 3_500_000_000


def vpf_case():
    # output_features is ny * nx * C floats = 1.6 GB with C = 1; cutting the grid among
    # tasks (2 threads) counts the points of each of its 4e8 cells: 1.6 GB of u32 more.
    n = 64
    geom = sum(([x, y, 0] for x, y in zip(rng_ints(n, 20000, 4), rng_ints(n, 20000, 5))), [])
    feeds = {"geom_xyz": (geom, "int32", [1, n, 3]), "input_features": ([1.0] * n, "float32", [1, n, 1])}
    return "VoxelPoolingForward", {"voxel_num": {"ints": [20000, 20000, 1]}}, feeds, 3_200_000_000


def run_capped(op, attrs, feeds, limit, lib, card=False, symbolic=False) -> dict:
    """The child's outcome; fails the test if the child did not exit normally."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    args = [sys.executable, "-c", CHILD, str(HERE)]
    job = json.dumps([op, attrs, feeds, str(lib), card, symbolic])
    p = subprocess.run(args, input=job, capture_output=True, text=True, preexec_fn=cap, timeout=600)
    assert p.returncode == 0, f"{op}: the child died with {p.returncode}: {p.stderr[-500:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [gip_case, tib_case, vpf_case], ids=["GetIndicePairs", "ThreeInterpolateBackward", "VoxelPoolingForward"])
def test_scratch_memory_beyond_the_limit_is_an_error_not_an_abort(case, mlu_lib):
    op, attrs, feeds, limit = case()
    result = run_capped(op, attrs, feeds, limit, mlu_lib)
    # The run must fail with the message only the kernels' fallible allocations write
    # (src/scratch.rs: "out of memory: <buffer> needs <N> MB of host memory ..."), located at
    # the node: proof that the fallible path was taken, not ONNX Runtime's output allocation
    # failing (which would not exercise the kernel) nor a run that never ran short.
    assert "error" in result, f"{op} succeeded under a {limit / 1e9:.1f} GB cap: the fallible path was not exercised"
    scratch = re.compile(rf"mluops\.{op} node 'oom_node': out of memory: .+ needs [0-9.]+ MB of host memory that could not be allocated")
    assert scratch.search(result["error"]), result["error"]


def test_card_memory_that_runs_out_names_the_output(mlu_lib):
    # On the emulated card (host memory), an output of 8.6 GB within the kernel's int32
    # offsets (B*C*m = 2^31 - 8): the card allocator fails, and the error says which
    # output and why (the allocator's own log line may go nowhere).
    m = 2**28 - 1
    feeds = {
        "grad_output": ([0.5] * 8, "float32", [1, 8, 1]),
        "indices": ([0, 1, 2], "int32", [1, 1, 3]),
        "weights": ([0.2, 0.3, 0.5], "float32", [1, 1, 3]),
    }
    result = run_capped("ThreeInterpolateBackward", {"m": {"int": m}}, feeds, 4_000_000_000, mlu_lib, card=True)
    error = result.get("error", "")
    assert "output 'grad_features'" in error and "out of card memory" in error and "oom_node" in error, result


def provider_reproducers():
    """Contract-valid nodes whose outputs cannot be allocated. The provider claims them,
    its kernels decline the sizes at run time (int32 offsets) and it falls back to the CPU
    kernel on host copies: that host buffer used to be an infallible allocation (SIGABRT)."""
    tib = {
        "grad_output": ([1.0], "float32", [1, 1, 1]),
        "indices": ([0, 0, 0], "int32", [1, 1, 3]),
        "weights": ([1.0, 1.0, 1.0], "float32", [1, 1, 3]),
    }
    vpf = {"geom_xyz": ([0, 0, 0, 1, 1, 0], "int32", [1, 2, 3]), "input_features": ([1.0] * 8, "float32", [1, 2, 4])}
    prp = {
        "top_grad": ([1.0], "float32", [1, 1, 1, 1]),
        "rois": ([0.0, 0.0, 0.0, 1.0, 1.0], "float32", [1, 5]),
        "mapping_channel": ([0], "int32", [1, 1, 1, 1]),
        "bottom_shape": ([1, 2**20, 2**20, 1], "int64", [4]),
    }
    prp_attrs = {"pooled_height": {"int": 1}, "pooled_width": {"int": 1}, "spatial_scale": {"float": 1.0}, "output_dim": {"int": 1}}
    return [
        ("ThreeInterpolateBackward", {"m": {"int": 2**33}}, tib, "grad_features"),
        ("VoxelPoolingForward", {"voxel_num": {"ints": [2**31 - 1, 4, 1]}}, vpf, "output_features"),
        ("PsRoiPoolBackward", prp_attrs, prp, "bottom_grad"),
    ]


@pytest.mark.parametrize("case", provider_reproducers(), ids=lambda c: c[0])
def test_provider_output_too_large_for_the_host_is_an_error(case, mlu_lib):
    op, attrs, feeds, output = case
    result = run_capped(op, attrs, feeds, 4_000_000_000, mlu_lib, card=True, symbolic=True)
    error = result.get("error", "")
    assert "oom_node" in error and op in error and f"output '{output}'" in error and "out of memory" in error, result
