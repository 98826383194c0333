"""The runs, in this process or on Ray, and the table of their results."""

from __future__ import annotations

import math
import statistics
import time
import warnings

import numpy as np

from .. import placement
from ._checker import PATHS, FrameChecker


# ============================================================================ runs
def run_in_process(rows, models, paths=PATHS, emulate=True, library=None, threads=1) -> tuple[list[dict], dict]:
    """Checks every frame in this process; returns (results, run info)."""
    t0 = time.perf_counter()
    checker = FrameChecker(models, paths=paths, emulate=emulate, library=library, threads=threads)
    results = checker.check_rows(rows)
    return results, {"mode": "in-process", "workers": 1, "wall": time.perf_counter() - t0}


def run_ray(
    rows,
    models,
    workers: int = 2,
    paths=PATHS,
    emulate: bool = True,
    library: str | None = None,
    threads: int = 1,
    batch_size: int = 4,
    crash_once: str | None = None,
    retries: int = 3,
    start_timeout: int = 600,
) -> tuple[list[dict], dict]:
    """Checks every frame on the Ray cluster this process is connected to (``ray.init``
    first): a Ray Dataset of the rows, ``map_batches`` over a fixed pool of ``workers``
    :class:`FrameChecker` actors (1 CPU each; the cluster needs that many CPUs), ``batch_size``
    frames per actor task. An actor whose process dies is restarted and its task retried on
    the new process, ``retries`` times at most (Ray Data's default is forever, which a frame
    that crashes its worker every time would turn into a hang); then the run raises. The
    pool's actors must all be up within ``start_timeout`` seconds.
    Returns (results, run info)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("run_ray needs a Ray connection: call ray.init() first")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # Every actor of the pool ready (sessions created and warmed up) before the first
    # batch: all workers check frames from the start, and a cluster without the CPUs for
    # the pool fails after this many seconds instead of waiting forever.
    ctx.wait_for_min_actors_s = start_timeout
    t0 = time.perf_counter()
    ds = ray.data.from_items(list(rows), override_num_blocks=max(1, math.ceil(len(rows) / batch_size)))
    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing remote args (max_restarts, max_task_retries) through
        # map_batches and offers no named parameter for them yet (hence ray < 2.64 in the
        # package's ray extra).
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        out = _map_batches(ds, models, workers, paths, emulate, library, threads, batch_size, crash_once, retries)
    results = [_plain(r) for r in out.take_all()]
    return results, {"mode": "ray", "workers": workers, "wall": time.perf_counter() - t0}


def _map_batches(ds, models, workers, paths, emulate, library, threads, batch_size, crash_once, retries):
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        FrameChecker,
        fn_constructor_kwargs={
            "models": models,
            "paths": tuple(paths),
            "emulate": emulate,
            "library": library,
            "threads": threads,
            "crash_once": crash_once,
        },
        compute=ActorPoolStrategy(size=workers),
        batch_size=batch_size,
        batch_format="numpy",
        num_cpus=1,
        max_restarts=retries,  # instead of Ray Data's defaults, -1: forever
        max_task_retries=retries,
    )


def _plain(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        out[k] = v.item() if isinstance(v, np.generic) else v
    return out


# ============================================================================ the table
def _worst(values) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{max(values):.1e}" if values else "-"


def summarize(results: list[dict], info: dict | None = None, expected_frames: dict | None = None) -> tuple[str, bool, dict]:
    """(the table, every frame of every path passed, the run info with the end-to-end figures). ``expected_frames``: {model: frame ids}
    each path must have reported exactly once (a lost or doubled frame fails the run).

    Columns: the nodes ONNX Runtime assigned to the MLUExecutionProvider in the session
    (from its assignment record; 0 on the CPU path); the node runs on the card per frame
    (fewest-most, from the provider's traffic report); frames and failed frames, an MLU
    frame failing too when :func:`onnxruntime_ep_mlu.placement.judge` rejects its counts (no
    node ran on the card, a run-time CPU fallback or decline); the worst
    error / tolerance against the goldens and against the CPU path (over the frames that
    have that reference; <= 1 passes); the median run time and the frames per second of one
    worker's busy time; the worst output and its frame."""
    info = dict(info or {})
    groups: dict[tuple[str, str], list[dict]] = {}
    model_order = list(expected_frames or {})
    for r in sorted(
        results,
        key=lambda r: (model_order.index(r["model"]) if r["model"] in model_order else len(model_order), r["model"],
                       PATHS.index(r["path"]) if r["path"] in PATHS else 9),
    ):
        groups.setdefault((r["model"], r["path"]), []).append(r)
    header = (
        f"{'model':<13} {'path':<4} {'on MLU':>6} {'card runs':>9} {'frames':>6} {'failed':>6} {'vs golden':>9} {'vs cpu':>8} "
        f"{'ms/frame':>9} {'frames/s':>9}  worst output (error against its tolerance)"
    )
    lines = [header, "-" * len(header)]
    all_ok = True
    for (model, path), rs in groups.items():
        # An MLU frame's placement is judged here too, whatever produced the rows.
        misplaced = {id(r): placement.judge(r, placement.Expectation(off_card=r["off_card"]))
                     for r in rs if path == "mlu" and r["card_runs"] >= 0}
        bad = [r for r in rs if not r["ok"] or misplaced.get(id(r))]
        all_ok &= not bad
        secs = [r["seconds"] for r in rs if not math.isnan(r["seconds"])]
        ms = f"{statistics.median(secs) * 1e3:.1f}" if secs else "-"
        fps = f"{len(secs) / sum(secs):.1f}" if secs and sum(secs) > 0 else "-"
        worst = max(rs, key=lambda r: r["ratio"])
        nodes = sorted({r["on_mlu"] for r in rs if r["on_mlu"] >= 0})
        on_mlu = "/".join(map(str, nodes)) or "-"
        runs = sorted({r["card_runs"] for r in rs if r["card_runs"] >= 0})
        card = f"{runs[0]}-{runs[-1]}" if len(runs) > 1 else (str(runs[0]) if runs else "-")
        lines.append(
            f"{model:<13} {path:<4} {on_mlu:>6} {card:>9} {len(rs):>6} {len(bad):>6} {_worst(r['golden_ratio'] for r in rs):>9} "
            f"{_worst(r['cpu_ratio'] for r in rs):>8} {ms:>9} {fps:>9}  {worst['worst']} [{worst['frame']}]"
        )
        expected = sorted({r["off_card"] for r in rs if path == "mlu" and r["off_card"]})
        for why in expected:
            lines.append(f"{'':<13} {'':<4} {placement.Expectation(off_card=why).describe()}")
        if any(r["binding_check"] for r in rs):
            lines.append(f"{'':<13} {'':<4} MLU-OPS ran nodes: {placement.EMULATED_MLUOPS}")
        for r in bad[:5]:
            wrong = "; ".join(f"placement: {w}" for w in misplaced.get(id(r), []) if f"placement: {w}" not in r["error"])
            lines.append(f"{'':<13} {'':<4} FAIL {r['frame']} on {r['worker']}: {r['worst']} {r['error']} {wrong}".rstrip())
        if len(bad) > 5:
            lines.append(f"{'':<13} {'':<4} ... and {len(bad) - 5} more failed frames")
    if expected_frames is not None:
        paths = sorted({p for _, p in groups})
        if not paths:
            all_ok = False
            lines.append("FAIL no results")
        for model, frames in expected_frames.items():
            for path in paths:
                got = [r["frame"] for r in groups.get((model, path), [])]
                if sorted(got) != sorted(frames):
                    all_ok = False
                    lost = sorted(set(frames) - set(got))
                    dup = sorted({f for f in got if got.count(f) > 1})
                    lines.append(f"FAIL {model}/{path}: {len(lost)} frame(s) missing {lost[:3]}, {len(dup)} doubled {dup[:3]}")
    starts = [r["start"] for r in results if not math.isnan(r["start"])]
    ends = [r["end"] for r in results if not math.isnan(r["end"])]
    frames = len({(r["model"], r["frame"]) for r in results})
    window = (max(ends) - min(starts)) if starts else math.nan
    info.update(
        frames=frames,
        window=window,
        throughput=frames / window if window and window > 0 else math.nan,
        wall_throughput=frames / info["wall"] if info.get("wall") else math.nan,
        processes=len({r["worker"] for r in results}),
        ok=all_ok,
    )
    lines += [
        "",
        f"{info.get('mode', '?')}, {info.get('workers', '?')} worker(s), {info['processes']} process(es) reported: "
        f"{frames} frames on {len({p for _, p in groups})} path(s) in {info.get('wall', math.nan):.1f} s wall, "
        f"{info['throughput']:.1f} frames/s over the {window:.1f} s from the first frame's start to the last one's end",
    ]
    return "\n".join(lines), all_ok, info
