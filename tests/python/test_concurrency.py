"""One session per operator and path, run from 8 threads at once, 1,000 runs per thread,
valid and invalid inputs mixed: every valid output equals the single-threaded one bit for
bit, every invalid input gets its error (naming the node and the tensor), and the sessions
keep working. Paths: the custom-op library on CPU, and MLUExecutionProvider on the emulated
card (the forward partners run on the CPU provider inside that session)."""

from __future__ import annotations

import gc
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest

from conftest import assert_accumulating, build_model, make_session
from reference import dsb_inputs, gip_reference, gip_sites, prp_inputs, vpf_inputs

EP = "MLUExecutionProvider"
THREADS = 8
RUNS = 1000
# On the card these add floats with atomics, in an order that varies between runs: their
# float outputs agree within the contract's accumulating class, not bit for bit (the CPU
# results are bit-identical).
ATOMIC_ON_THE_CARD = {"VoxelPoolingForward", "PsRoiPoolBackward"}


def _cases():
    """op -> (attributes, valid feeds, invalid feeds, the tensor its error names)."""
    rng = np.random.default_rng(17)
    out = {}

    feeds = dsb_inputs(rng, 60, 12, 5, "max")
    bad = dict(feeds, point2voxel_map=feeds["point2voxel_map"].copy())
    bad["point2voxel_map"][3] = 12  # >= voxel_num
    out["DynamicScatterBackward"] = ({"reduce_type": {"string": "max"}}, feeds, bad, "point2voxel_map")

    idx = rng.integers(0, 9, (2, 7, 3)).astype(np.int32)
    feeds = {
        "grad_output": rng.standard_normal((2, 4, 7)).astype(np.float32),
        "indices": idx,
        "weights": rng.random((2, 7, 3)).astype(np.float32),
    }
    bad = dict(feeds, indices=idx.copy())
    bad["indices"][1, 2, 0] = 9  # >= m
    out["ThreeInterpolateBackward"] = ({"m": {"int": 9}}, feeds, bad, "indices")

    geo = {"batch_size": {"int": 2}, "spatial_shape": {"ints": [5, 6, 7]}, "kernel_size": {"ints": [3, 3, 3]}}
    gip_attrs = dict(geo, padding={"ints": [1, 1, 1]}, subm={"int": 1})
    sites = gip_sites(rng, 2, (5, 6, 7), 40)
    bad_sites = sites.copy()
    bad_sites[5, 2] = 6  # y beyond the spatial shape
    out["GetIndicePairs"] = (gip_attrs, {"indices": sites}, {"indices": bad_sites}, "indices")

    feeds = vpf_inputs(rng, 2, 50, 3, 6, 5, 2)
    bad = dict(feeds, input_features=np.concatenate([feeds["input_features"]] * 2, axis=1))  # N differs
    out["VoxelPoolingForward"] = ({"voxel_num": {"ints": [6, 5, 2]}}, feeds, bad, "input_features")

    prp_attrs = {
        "pooled_height": {"int": 2},
        "pooled_width": {"int": 2},
        "spatial_scale": {"float": 0.5},
        "output_dim": {"int": 3},
    }
    feeds = prp_inputs(rng, 6, 2, 3, 2, 8, 9, 0.5)
    bad = dict(feeds, rois=feeds["rois"].copy())
    bad["rois"][0] = [2.0, 1.0, 1.0, 4.0, 4.0]  # finite batch id beyond the 2 batches
    out["PsRoiPoolBackward"] = (prp_attrs, feeds, bad, "rois")

    feats = rng.standard_normal((2, 4, 9)).astype(np.float32)
    feeds = {"features": feats, "indices": idx, "weights": rng.random((2, 7, 3)).astype(np.float32)}
    bad = dict(feeds, indices=idx.copy())
    bad["indices"][0, 0, 1] = -1
    out["ThreeInterpolate"] = ({}, feeds, bad, "indices")

    coors = rng.integers(-1, 4, (40, 3)).astype(np.int32)
    feeds = {"feats": rng.standard_normal((40, 5)).astype(np.float32), "coors": coors}
    bad = dict(feeds, coors=coors[:30])  # N differs
    out["DynamicScatter"] = ({"reduce_type": {"string": "max"}}, feeds, bad, "coors")

    ps_feeds = {
        "input": rng.standard_normal((2, 8, 9, 12)).astype(np.float32),
        "rois": feeds_rois(rng),
    }
    bad = dict(ps_feeds, rois=ps_feeds["rois"].copy())
    bad["rois"][1, 0] = 5.0
    out["PsRoiPool"] = (prp_attrs, ps_feeds, bad, "rois")

    pairs, out_indices, num = gip_reference(sites, 2, (5, 6, 7), (3, 3, 3), (2, 2, 2), (0, 1, 1), (1, 1, 1), (0, 0, 0), 0, 0)
    feeds = {
        "features": rng.standard_normal((len(sites), 4)).astype(np.float32),
        "filters": rng.standard_normal((27, 4, 3)).astype(np.float32),
        "indice_pairs": pairs,
        "indice_num": num,
        "out_indices": out_indices,
    }
    bad = dict(feeds, indice_num=num.copy())
    bad["indice_num"][4] = pairs.shape[2] + 1  # more pairs than the rulebook holds
    out["IndiceConv"] = ({}, feeds, bad, "indice_num")
    return out


def feeds_rois(rng):
    rois = np.zeros((5, 5), np.float32)
    for r in range(5):
        x1, y1 = rng.uniform(0, 12, 2)
        rois[r] = [r % 2, x1, y1, x1 + rng.uniform(1, 6), y1 + rng.uniform(1, 6)]
    return rois


def _model(op, attrs, feeds):
    # Symbolic dimensions: the invalid feeds may differ in size, and the provider claims
    # nodes without static shapes.
    spec = [(name, str(a.dtype), [f"{name}_{i}" for i in range(a.ndim)]) for name, a in feeds.items()]
    return build_model(op, attrs, spec, f"node_{op}")


def _mlu_session(model):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == EP], {})
    return ort.InferenceSession(model, so)


@pytest.fixture(scope="module")
def card(mlu_lib):
    os.environ["MLU_EP_EMULATE"] = "1"
    if not any(d.ep_name == EP for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(EP, str(mlu_lib))
    assert any(d.ep_name == EP for d in ort.get_ep_devices())


@pytest.mark.parametrize("path", ["cpu", "mlu"])
def test_eight_threads_mixing_valid_and_invalid_inputs(path, mlu_lib, card, tmp_path, monkeypatch):
    cases = _cases()
    sessions, baseline = {}, {}
    report = tmp_path / "traffic.jsonl"
    monkeypatch.setenv("MLU_EP_TRAFFIC", str(report))
    for op, (attrs, valid, _, _) in cases.items():
        model = _model(op, attrs, valid)
        sessions[op] = make_session(model, mlu_lib, intra_threads=2) if path == "cpu" else _mlu_session(model)
        baseline[op] = sessions[op].run(None, valid)
    ops = list(cases)

    def worker(t: int) -> tuple[int, int]:
        valid_runs = errors = 0
        for i in range(RUNS):
            op = ops[(i + t) % len(ops)]
            attrs, valid, invalid, tensor = cases[op]
            if (i // len(ops)) % 2 == 0:
                got = sessions[op].run(None, valid)
                for a, b in zip(got, baseline[op]):
                    what = f"{op} thread {t} run {i}"
                    assert a.dtype == b.dtype and a.shape == b.shape, what
                    if path == "mlu" and op in ATOMIC_ON_THE_CARD and a.dtype.kind == "f":
                        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=what)
                        assert_accumulating(a, b.astype(np.float64), what)
                    else:
                        assert a.tobytes() == b.tobytes(), what
                valid_runs += 1
            else:
                with pytest.raises(Exception) as e:
                    sessions[op].run(None, invalid)
                msg = str(e.value)
                assert f"node_{op}" in msg and tensor in msg, f"{op} thread {t} run {i}: {msg}"
                errors += 1
        return valid_runs, errors

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))
    assert sum(v for v, _ in results) + sum(e for _, e in results) == THREADS * RUNS
    assert all(v > 0 and e > 0 for v, e in results)
    if path == "mlu":
        # The five MLU operators ran on the card, not on a silent CPU fallback: placed there,
        # and no run-time fallback or decline in any session's counts (its line in the
        # traffic report, written when the session ends).
        for op in ops[:5]:
            placed = {n.name: sub.ep_name for sub in sessions[op].get_provider_graph_assignment_info() for n in sub.get_nodes()}
            assert placed[f"node_{op}"] == EP, (op, placed)
        sessions.clear()
        gc.collect()
        lines = [json.loads(x) for x in report.read_text().splitlines()]
        counts = [x for x in lines if "session" in x]
        assert len(counts) == len(ops), counts
        assert all(c["cpu_fallbacks"] == 0 and c["run_time_declines"] == {"mluops": 0, "bang": 0} for c in counts), counts
        assert sum(c["card_runs"]["bang"] for c in counts) == sum(1 for x in lines if x.get("backend") == "bang") > 0
