"""The network runner (networks/run.py) can fail: a peer that disagrees, a coordinate set
that differs, or outputs that change with the thread count make its graph fail; the runs
themselves are in scripts/test.sh (`networks/run.py --scale ci`)."""

from __future__ import annotations

import dataclasses
import re
import sys

import numpy as np
import pytest
from conftest import REPO, emulated_mluops

sys.path.insert(0, str(REPO))
from networks import bevdepth, centerpoint, common, run  # noqa: E402


@pytest.fixture(scope="module")
def bev_case():
    return bevdepth.case("ci", 7)


def test_the_bevdepth_graph_agrees_with_its_peer_on_both_paths(bev_case, mlu_lib):
    graph = bev_case.graphs[0]  # the view transform
    rows, ok = run.run_graph(bev_case, graph, str(mlu_lib), 1, str(emulated_mluops(mlu_lib)))
    assert ok, rows
    assert "1/1" in rows[1], "VoxelPoolingForward on the MLU"
    # The CPU row, the MLU row, then one row per backend and auto (common.mlu_rows).
    mlu_rows = common.mlu_rows(str(mlu_lib))
    assert len(rows) == 1 + len(mlu_rows), rows
    by_row = dict(zip(mlu_rows[1:], rows[2:]))
    # Whole numbers: "1 on bang" must not be the end of "11 on bang".
    assert re.search(r"(?<!\d)1 on bang", by_row["bang"]), rows
    assert re.search(r"(?<!\d)1 on mluops", by_row["mluops"]), rows
    assert re.search(r"(?<!\d)0 CPU fallbacks", by_row["mluops"]), rows


def test_a_peer_that_disagrees_fails_the_graph(bev_case, mlu_lib):
    graph = bev_case.graphs[0]  # the view transform

    def off_by_one_cell(threads):
        out = graph.peer(threads)
        bev = out["bev"].copy()
        bev[0, :, 64, 64] += np.abs(bev).max()
        return {**out, "bev": bev}

    rows, ok = run.run_graph(bev_case, dataclasses.replace(graph, peer=off_by_one_cell), str(mlu_lib), 1,
                             str(emulated_mluops(mlu_lib)))
    assert not ok
    assert all("BAD" in r for r in rows), rows


def test_sparse_coordinates_compare_as_sets_and_nothing_looser():
    rng = np.random.default_rng(0)
    sites = rng.integers(0, 50, (200, 4)).astype(np.int32)
    shuffled = sites[rng.permutation(200)]
    canonical = {"out_indices": centerpoint.sorted_rows}
    assert common.compare({"out_indices": shuffled}, {"out_indices": sites}, canonical)[0] == 0.0
    moved = shuffled.copy()
    moved[5, 3] += 1
    assert common.compare({"out_indices": moved}, {"out_indices": sites}, canonical)[0] > 1.0


def test_outputs_that_depend_on_the_thread_count_fail_the_graph(bev_case, mlu_lib, monkeypatch):
    """One ulp at 2 threads, far inside the peer tolerance, still fails the CPU row."""
    graph = bev_case.graphs[0]  # the view transform
    real = common.cpu_session

    class OneUlpOff:
        def __init__(self, sess):
            self.sess = sess

        def get_outputs(self):
            return self.sess.get_outputs()

        def run(self, names, feeds):
            out = self.sess.run(names, feeds)
            out[0] = np.nextafter(out[0], np.float32(np.inf))
            return out

    def session(model, threads, library):
        sess = real(model, threads, library)
        return OneUlpOff(sess) if threads == 2 else sess

    monkeypatch.setattr(common, "cpu_session", session)
    rows, ok = run.run_graph(bev_case, graph, str(mlu_lib), 1, str(emulated_mluops(mlu_lib)))
    assert not ok
    assert "BAD" in rows[0] and "1- and 2-thread outputs differ: bev" in rows[0], rows
    assert "OK" in rows[1], rows


def test_the_regression_runner_checks_a_detector_box_by_box(mlu_lib, tmp_path):
    """A frame folder of the whole PointPillars detector (three simulated scans, goldens from
    the eager torch model, tolerances of the detections class): the runner passes every
    frame on the CPU path and the emulated card, in this process and on Ray, and fails the
    frame whose golden has one box moved by 0.3 m."""
    import copy
    import json
    import subprocess

    import torch
    from conftest import user_env
    from networks import pointpillars as pp

    pc_range = (0.0, -19.84, -3.0, 34.56, 19.84, 1.0)
    torch.manual_seed(3)
    peer_net = common.seed_batchnorms(pp.PointPillars(pc_range, pp.peer_dynamic_scatter), 3)
    ours_net = copy.deepcopy(peer_net)
    ours_net.scatter = pp.ours_dynamic_scatter
    peer = pp.PointPillarsDetector(peer_net, pc_range).eval()
    folder = tmp_path / "frames" / "pointpillars_detector"
    folder.mkdir(parents=True)
    points = []
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        xyz = pp.scan_points(rng, sweeps=1)
        points.append(np.concatenate([xyz, rng.random((len(xyz), 1), dtype=np.float32)], 1).astype(np.float32))
    (folder / "model.onnx").write_bytes(common.export(pp.PointPillarsDetector(ours_net, pc_range), (common.tensor(points[0]),),
                                                      ["points"], ["detections"], {"points": {0: "N"}}))
    tol = {"detections": {**pp.DETECTIONS, "threshold": pp.SCORE_THR}}
    (folder / "tolerances.json").write_text(json.dumps(tol))
    # Its mluops nodes are DynamicScatter, which the default session runs on the BANG kernels.
    goldens = []
    for i, p in enumerate(points):
        with torch.no_grad():
            goldens.append(common.numpy_out(peer(common.tensor(p))))
        np.savez(folder / f"scan{i}.npz", **{"in.points": p, "out.detections": goldens[-1]})
    env = user_env() | {"PYTHONPATH": str(REPO / "python"), "MLU_EP_LIB": str(mlu_lib)}
    run = [sys.executable, "-m", "onnxruntime_ep_mlu.regression", "--frames", str(tmp_path / "frames")]
    good = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "every frame matches its reference on every path" in good.stdout, good.stdout
    assert good.stdout.count("100 matched of 100 (reference) and 100, 0 unmatched") == 2, good.stdout
    # Its two DynamicScatter nodes on the card (on MLU, card runs), each frame.
    mlu_row = next(x.split() for x in good.stdout.splitlines() if x.startswith("pointpillars_detector mlu "))
    assert mlu_row[2:4] == ["2", "2"], good.stdout
    # The same folder on a local Ray cluster (one actor): the same verdict, box by box.
    on_ray = subprocess.run([*run, "--ray", "--num-cpus", "1", "--workers", "1"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    assert on_ray.stdout.count("100 matched of 100 (reference) and 100, 0 unmatched") == 2, on_ray.stdout
    moved = goldens[1].copy()
    moved[5, 0] += 0.3
    np.savez(folder / "scan1.npz", **{"in.points": points[1], "out.detections": moved})
    bad = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL scan1" in bad.stdout and "FAIL scan0" not in bad.stdout and "FAIL scan2" not in bad.stdout, bad.stdout


def test_the_bytes_row_counts_one_inference_against_the_card_segment(bev_case, mlu_lib):
    """The view transform's one card node, VoxelPoolingForward, reads geom_xyz [B, N, 3] int32
    and features [B, N, C] float32 and writes the BEV [B, 128, 128, C] (pos_memo unread): the
    minimum is exactly those bytes, no weight crosses, and one inference moves the minimum
    plus the node's few bytes of value-check records and nothing else."""
    graph = bev_case.graphs[0]  # the view transform
    options = {"mlu_backend": "bang"}
    _, _, _, _, session, where = common.mlu_run(graph.model, str(mlu_lib), graph.feeds, options)
    cross = common.card_boundary(graph.model, where, graph.feeds, str(mlu_lib))
    geom = graph.feeds["geom_xyz"]
    b, n, _ = geom.shape
    c = next(size for _, made, _, size in cross.to_card if made != "graph input") // (b * n * 4)
    assert [(name, size) for name, _, _, size in cross.to_card if name == "geom_xyz"] == [("geom_xyz", geom.nbytes)]
    assert cross.minimum == geom.nbytes + b * n * c * 4 + b * 128 * 128 * c * 4, cross
    assert cross.weights == []
    notes: list[str] = []
    row, wrong = run.bytes_row(graph, str(mlu_lib), options, session, where, "bang", 1, notes)
    assert wrong == [], wrong
    h2d, d2h = (int(x.replace(",", "")) for x in re.search(r"per inference ([\d,]+) B to the card \+ ([\d,]+) B back",
                                                           row).groups())
    inputs, outputs = (sum(size for *_, size in part) for part in (cross.to_card, cross.back))
    assert 0 <= h2d - inputs <= 64 and 0 <= d2h - outputs <= 64, row
    assert "once per session 0 B to the card, 0 B back (the card nodes' weights: 0 B)" in row, row
    assert len(notes) == 2 and "(VoxelPoolingForward -> " in notes[-1], notes
