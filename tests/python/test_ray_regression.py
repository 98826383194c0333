"""The dataset regression runner (python/onnxruntime_ep_mlu/regression.py) in this process and
on a local Ray cluster (2 CPUs, no dashboard), on the CPU path and the emulated MLU card.

- A frame folder (<dir>/<model>/<frame>.npz) through the command line: every frame passes,
  then a corrupted golden and a frame without one of its model's inputs make it exit 1.
- The command line with --ray over 100 generated frames (20 per zoo model), run with 1 and
  then 2 actors on the same frames: every frame of every path reported once and within
  tolerance, the MLU sessions really on the card; the throughput ratio is printed.
- Ray Data with an actor pool of 2 over the same 100 frames, one actor ending its process
  in the middle of a batch: Ray restarts it, the batch is retried on the new process, and
  every frame is still reported exactly once.
- Plain Ray tasks on reused workers (more tasks than workers): waves that alternate the
  emulated card on and off in the same processes, and a task that fails once on purpose
  (a marker file) with max_retries/retry_exceptions, whose retry must succeed.

The workers get no MLU_EP_EMULATE from their environment: the card is an argument of the
actors and tasks (register_execution_provider(emulate=...)). Ray is required (scripts/setup.sh
--test installs it); nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import ray

from conftest import REPO

sys.path.insert(0, str(REPO / "python"))  # the package of this checkout, installed or not
from onnxruntime_ep_mlu import regression as rg  # noqa: E402

ZOO = REPO / "models" / "zoo.json"
FRAMES_PER_MODEL = 20  # x 5 zoo models = 100 frames per run
SEED = 23


def worker_env() -> dict:
    """The runtime_env of the test's workers: this checkout's package on their path, and
    nothing else (the emulated card is an argument, never the workers' environment)."""
    return {"env_vars": {"PYTHONPATH": str(REPO / "python")}}


@pytest.fixture
def no_emulate_env(monkeypatch):
    """Ray's processes inherit this process's environment: make sure it does not select the
    emulated card (other tests set MLU_EP_EMULATE=1 in this process)."""
    monkeypatch.delenv("MLU_EP_EMULATE", raising=False)


@pytest.fixture(scope="module")
def zoo_models():
    return rg.load_zoo(ZOO)


def by_model_and_path(results):
    out = defaultdict(list)
    for r in results:
        out[(r["model"], r["path"])].append(r)
    return out


def assert_every_frame(results, rows, paths=("cpu", "mlu")):
    """Every frame of `rows` reported exactly once per path, every result within tolerance,
    the generated frames checked against the right reference, the MLU sessions on the card."""
    expected = defaultdict(list)
    for row in rows:
        expected[row["model"]].append(row["frame"])
    groups = by_model_and_path(results)
    assert sorted({p for _, p in groups}) == sorted(paths)
    for model, frames in expected.items():
        for path in paths:
            rs = groups[(model, path)]
            assert sorted(r["frame"] for r in rs) == sorted(frames), f"{model}/{path}: frames lost or doubled"
            bad = [f"{r['frame']}: {r['worst']} {r['error']}" for r in rs if not r["ok"]]
            assert not bad, f"{model}/{path}: {bad[:3]}"
            for r in rs:
                assert r["ratio"] <= 1
                zoo_frame = r["frame"].endswith("-00000")
                if zoo_frame:  # the zoo frame: its independent goldens, on both paths
                    assert r["golden_ratio"] <= 1 and "golden" in r["ref"], r
                if path == "mlu":
                    assert r["on_mlu"] >= 1, f"{model}: no node on the MLU"
                    if not zoo_frame:  # a generated frame: the CPU path is its golden
                        assert r["ref"] == "cpu" and r["cpu_ratio"] <= 1, r
                else:
                    assert r["on_mlu"] == 0
    table, ok, _ = rg.summarize(results, {}, dict(expected))
    assert ok, table


# ----------------------------------------------------------------------------- in-process, frame folder
def run_cli(args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("MLU_EP_EMULATE",)}
    env["PYTHONPATH"] = str(REPO / "python")
    return subprocess.run(
        [sys.executable, "-m", "onnxruntime_ep_mlu.regression", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_frame_folder_in_process_passes_then_fails_on_a_regression(tmp_path, zoo_models, mlu_lib):
    frames = tmp_path / "frames"
    models = {m: zoo_models[m] for m in ("bevdepth", "rfcn_head")}
    assert rg.write_frames(frames, models, 3, seed=SEED) == 6
    assert sorted(p.name for p in (frames / "bevdepth").iterdir()) == [
        *(f"gen-{SEED}-0000{i}.npz" for i in range(3)), "model.onnx", "tolerances.json"
    ]
    lib = ["--library", str(mlu_lib)]

    out = run_cli(["--frames", str(frames), *lib])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every frame matches" in out.stdout
    lines = {tuple(line.split()[:2]): line for line in out.stdout.splitlines() if line.split()[:1] in (["bevdepth"], ["rfcn_head"])}
    assert set(lines) == {(m, p) for m in models for p in ("cpu", "mlu")}, out.stdout

    # A golden of the zoo frame off by a little more than the tolerance: exit 1, the frame named.
    first = frames / "rfcn_head" / f"gen-{SEED}-00000.npz"
    arrays = dict(np.load(first))
    arrays["out.cls_score"] = arrays["out.cls_score"] * np.float32(1.01)
    np.savez(first, **arrays)
    # A frame that lacks one of the model's inputs.
    broken = frames / "bevdepth" / "broken.npz"
    np.savez(broken, **{"in.img_feats": np.zeros((4, 32, 8, 22), np.float32)})
    out = run_cli(["--frames", str(frames), *lib])
    assert out.returncode == 1, out.stdout + out.stderr
    assert "REGRESSION" in out.stdout
    assert f"FAIL gen-{SEED}-00000" in out.stdout and "cls_score" in out.stdout, out.stdout
    assert "FAIL broken" in out.stdout and "in.geom_xyz" in out.stdout, out.stdout


# ----------------------------------------------------------------------------- Ray: the command line
def test_command_line_on_a_local_ray_cluster_with_1_then_2_workers(tmp_path, no_emulate_env, zoo_models, mlu_lib):
    report = tmp_path / "runs.json"
    t0 = time.perf_counter()
    status = rg.main(
        [
            "--generate", str(FRAMES_PER_MODEL), "--seed", str(SEED), "--ray", "--num-cpus", "2",
            "--workers", "1,2", "--library", str(mlu_lib), "--json", str(report),
        ]
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    assert not ray.is_initialized()  # the command line stops the cluster it started
    assert status == 0
    runs = json.loads(report.read_text())
    assert [r["info"]["workers"] for r in runs] == [1, 2]
    rows = rg.generated_frames(zoo_models, FRAMES_PER_MODEL, SEED)
    for run in runs:
        results = run["results"]
        for r in results:
            for k in ("ratio", "golden_ratio", "cpu_ratio", "seconds"):
                r[k] = float(r[k])
        assert_every_frame(results, rows)
        assert run["info"]["frames"] == len(rows) == 100
    assert runs[1]["info"]["processes"] == 2, "both actors of the second run checked frames"
    one, two = (r["info"] for r in runs)
    print(
        f"\n100 frames x 2 paths: 1 worker {one['throughput']:.1f} frames/s, 2 workers {two['throughput']:.1f} "
        f"frames/s ({two['throughput'] / one['throughput']:.2f}x; over the wall time, actor start-up included: "
        f"{two['wall_throughput'] / one['wall_throughput']:.2f}x); command {elapsed:.1f} s"
    )


# ----------------------------------------------------------------------------- Ray: one cluster for the rest
@pytest.fixture(scope="module")
def local_cluster():
    saved = os.environ.pop("MLU_EP_EMULATE", None)
    try:
        # address="local": a new cluster of this test's own, whatever else runs on the machine.
        ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env=worker_env(), log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        if saved is not None:
            os.environ["MLU_EP_EMULATE"] = saved


def test_ray_data_actor_pool_survives_an_actor_dying_mid_batch(local_cluster, zoo_models, mlu_lib, tmp_path):
    marker = tmp_path / "crashed"
    rows = rg.generated_frames(zoo_models, FRAMES_PER_MODEL, SEED)
    results, info = rg.run_ray(rows, zoo_models, workers=2, library=str(mlu_lib), batch_size=4, crash_once=str(marker))
    assert marker.exists(), "no actor reached its second batch"
    crashed = marker.read_text()
    assert_every_frame(results, rows)
    processes = {r["worker"] for r in results}
    # The two actors, and the process that replaced the one that died (which may have
    # reported its first batch before dying).
    assert len(processes) >= 3, processes
    print(f"\nactor {crashed} died in its second batch; {len(processes)} processes reported; wall {info['wall']:.1f} s")


@ray.remote(num_cpus=1, max_retries=2, retry_exceptions=True)
def check_frames(models, rows, emulate, library, fail_once=None):
    """A Ray task on a reused worker: registers through the package's helper with the card
    the task asks for (emulate=False: the registration a generic worker set-up would make,
    with the CPU path only), checks its frames, and, with `fail_once`, fails once after its
    work (marker file), so that its retry runs again in a worker that has registered."""
    import onnxruntime_ep_mlu as mlu

    from onnxruntime_ep_mlu import regression

    retried = bool(fail_once) and os.path.exists(fail_once)
    if emulate:
        checker = regression.FrameChecker(models, paths=("cpu", "mlu"), emulate=True, library=library, warm_up=False)
        cards = len(checker.devices)
    else:
        cards = len(mlu.register_execution_provider(library, emulate=False))
        checker = regression.FrameChecker(models, paths=("cpu",), emulate=False, library=library, warm_up=False)
    results = checker.check_rows(rows)
    if fail_once and not retried:
        Path(fail_once).write_text(str(os.getpid()))
        raise RuntimeError("planted failure, once")
    return {"pid": os.getpid(), "emulate": emulate, "cards": cards, "retried": retried, "results": results}


def test_ray_tasks_reused_workers_switch_the_card_and_a_failed_task_is_retried(local_cluster, zoo_models, mlu_lib, tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    names = ("pointpillars", "bevdepth", "rfcn_head")
    models = {m: zoo_models[m] for m in names}
    models_ref = ray.put(models)
    rows = rg.generated_frames(models, 8, SEED + 1)  # 24 frames: 3 per task
    chunks = [rows[i::8] for i in range(8)]
    marker = tmp_path / "failed-once"
    outs = []
    # Four waves of two tasks on two CPUs: the card on, off, on (one task failing once), off.
    for wave in range(4):
        emulate = wave % 2 == 0
        refs = [
            check_frames.remote(models_ref, chunks[2 * wave + k], emulate, str(mlu_lib), str(marker) if wave == 2 and k == 0 else None)
            for k in range(2)
        ]
        outs += ray.get(refs)
    assert marker.exists(), "the planted failure did not happen"
    assert sum(o["retried"] for o in outs) == 1, "the failed task was not retried (or not once)"
    for o in outs:
        assert o["cards"] == (1 if o["emulate"] else 0), o["cards"]
        mine = {(x["model"], x["frame"]) for x in o["results"]}
        assert_every_frame(o["results"], [r for r in rows if (r["model"], r["frame"]) in mine],
                           ("cpu", "mlu") if o["emulate"] else ("cpu",))  # fmt: skip
        assert len(mine) == 3
    assert sorted((r["model"], r["frame"]) for o in outs for r in o["results"] if r["path"] == "cpu") == sorted(
        (r["model"], r["frame"]) for r in rows
    )
    pids = [o["pid"] for o in outs]
    assert len(set(pids)) < len(outs), f"no worker was reused: {pids}"
    both = [p for p in set(pids) if {o["emulate"] for o in outs if o["pid"] == p} == {True, False}]
    assert both, f"no worker ran with the card both on and off: {[(o['pid'], o['emulate']) for o in outs]}"
    print(f"\n8 tasks on {len(set(pids))} worker processes; {len(both)} switched the emulated card off and on")
