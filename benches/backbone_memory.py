#!/usr/bin/env python3
"""Peak memory of the CenterPoint sparse backbone (networks/centerpoint.py at full scale):
onnxruntime's CPU path (1 and 2 intra-op threads, with and without its CPU arena) against
spconv 2.3.8 eager at 1 torch thread, each in a fresh process: the process's peak RSS minus
its RSS just before the one run (the model, inputs and weights already loaded).

    "$VENV/bin/python" benches/backbone_memory.py [--sweeps 10 16] [--seed S]

--sweeps sets the simulated scan's sweeps (10: about 97k voxels, 16: about 125k).
The library is $MLU_EP_LIB, else target/release/libonnxruntime_ep_mlu.so.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(run) -> str:
    before = rss_kib()
    run()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return f"{(peak - before) / 1024:.0f} MB (peak {peak / 1024:.0f} MB, before the run {before / 1024:.0f} MB)"


def child(args) -> None:
    import numpy as np

    d = Path(args.dir)
    if args.child == "build":
        from networks import centerpoint

        case = centerpoint.case("full", args.seed, args.sweeps[0])
        g = case.graphs[0]
        (d / "model.onnx").write_bytes(g.model)
        np.savez(d / "feeds.npz", **g.feeds)
        print(case.config)
        return
    feeds = dict(np.load(d / "feeds.npz"))
    if args.child.startswith("ort"):
        import onnxruntime as ort

        import networks  # noqa: F401 (puts this checkout's package on the path)
        import onnxruntime_ep_mlu as mlu

        threads, arena = int(args.child[3]), not args.child.endswith("noarena")
        so = mlu.session_options(library=args.library)
        so.intra_op_num_threads = threads
        so.enable_cpu_mem_arena = arena
        sess = ort.InferenceSession((d / "model.onnx").read_bytes(), so, providers=["CPUExecutionProvider"])
        print(f"onnxruntime, {threads} thread{'s' if threads > 1 else ''}{'' if arena else ', no CPU arena'}: "
              f"{measure(lambda: sess.run(None, feeds))}")
        return
    import torch

    from networks import centerpoint
    from networks.common import seed_batchnorms, tensor

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    peer = centerpoint.SpconvEncoder(seed_batchnorms(centerpoint.SparseEncoder([41, 1440, 1440]), args.seed))

    def run():
        with torch.no_grad():
            peer(tensor(feeds["voxel_features"]), tensor(feeds["coors"]))

    print(f"spconv 2.3.8, 1 torch thread: {measure(run)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, nargs="+", default=[10, 16])
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--library", default=os.environ.get("MLU_EP_LIB")
                    or str(REPO / "target" / "release" / "libonnxruntime_ep_mlu.so"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    library = str(Path(args.library).resolve())
    for sweeps in args.sweeps:
        with tempfile.TemporaryDirectory() as d:
            def run(what):
                cmd = [sys.executable, "-W", "ignore", __file__, "--child", what, "--dir", d, "--sweeps", str(sweeps),
                       "--seed", str(args.seed), "--library", library]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode:
                    sys.exit(f"backbone_memory: the {what} child failed:\n{p.stderr[-3000:]}")
                return p.stdout.strip()

            print(f"{sweeps} sweeps: {run('build')}")
            for what in ("ort1", "ort2", "ort1noarena", "spconv"):
                print("  " + run(what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
