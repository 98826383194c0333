"""The MLU data path's traffic table (models/run_zoo.py --traffic, src/ep/traffic.rs): every
claimed node of the zoo reports its card traffic, and no node reads more than 64 bytes back
from the card (records and size inputs; no input comes back to the host) except
PsRoiPoolBackward, whose bin spans the host computes from the rois (docs/CONTRACT.md §6.5):
exactly R * 20 bytes of rois back and R * ph * pw * 20 bytes of spans to the card, and
DynamicScatter, whose host sizes the voxel bitmap from the coordinates' box: each task's box
(2 x D int32) and the voxel count back, the box's least corner and strides (2 x D int32) to
the card (src/ops/dynamic_scatter/bang.rs)."""

import re
import subprocess
import sys

import numpy as np
import onnx

from conftest import REPO

sys.path.insert(0, str(REPO / "python"))
from onnxruntime_ep_mlu import operators  # noqa: E402

LAST = re.compile(r"^traffic: (\d+) nodes, max card->host per node (\d+) bytes, worst GDRAM/minimum ([\d.]+)x$")


def test_traffic_table_of_the_zoo(mlu_lib):
    run = subprocess.run(
        [sys.executable, str(REPO / "models" / "run_zoo.py"), str(mlu_lib), "--traffic"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    m = LAST.match(lines[-1])
    assert m, lines[-1]
    nodes = int(m.group(1))
    # The zoo's claimed nodes: one each of DynamicScatter and DynamicScatterBackward, three
    # GetIndicePairs, one each of VoxelPoolingForward, ThreeInterpolateBackward and
    # PsRoiPoolBackward.
    assert nodes == 8, run.stdout
    on_bang = "|".join(row["op"] for row in operators(str(mlu_lib)) if "bang" in row["backends"])
    rows = [l for l in lines if re.match(rf"^\w+\s+({on_bang})\s", l)]
    assert len(rows) == nodes
    # Without an MLU-OPS library (none is named here), auto runs every node on the BANG kernels.
    assert all(r.split()[3] == "bang" for r in rows), run.stdout
    # No host->card copy inside a node (its inputs are on the card already), at most 64 bytes
    # back; PsRoiPoolBackward's rois and spans exactly.
    rois = np.load(REPO / "models" / "rfcn_head.npz")["in.rois"].shape[0]
    (node,) = [n for n in onnx.load(REPO / "models" / "rfcn_head.onnx").graph.node if n.op_type == "PsRoiPoolBackward"]
    pooled = next(a.i for a in node.attribute if a.name == "pooled_height")
    for r in rows:
        h2d, d2h = int(r.split()[4]), int(r.split()[5])
        if r.split()[1] == "PsRoiPoolBackward":
            assert h2d == rois * pooled * pooled * 20, r
            assert rois * 20 <= d2h <= rois * 20 + 64, r
        elif r.split()[1] == "DynamicScatter":
            box = h2d  # 2 x D int32: the least corner and the strides
            assert box > 0 and box % 8 == 0, r
            tasks, rest = divmod(d2h - 4, box)
            assert rest == 0 and 1 <= tasks <= 64, r
        else:
            assert h2d == 0 and d2h <= 64, r
