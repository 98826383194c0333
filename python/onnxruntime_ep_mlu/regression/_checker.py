"""The checker: one worker's sessions, running a frame on every path and judging it."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time

import numpy as np

from .. import (
    EP_NAME,
    RECORD_ASSIGNMENT,
    _has_emulated,
    get_library_path,
    placement,
    register_execution_provider,
)
from ._compare import compare
from ._frames import _load_npz, generate


PATHS = ("cpu", "mlu")
#: A result row's fields; the MLU path's card_runs .. run_time_warnings are
#: onnxruntime_ep_mlu.placement's counts of the frame's timed run (-1 on the CPU path), and
#: binding_check says that run used MLU-OPS on the emulated card, whose libmluops is the
#: emulated one: our own CPU kernels (placement.EMULATED_MLUOPS); off_card: why the model
#: expects no node on the card ("" when it expects some).
RESULT_FIELDS = (
    "model", "frame", "path", "ok", "ratio", "golden_ratio", "cpu_ratio", "worst", "ref", "seconds", "on_mlu", "start",
    "end", "worker", "error", "card_runs", "cpu_fallbacks", "run_time_declines", "run_time_warnings", "binding_check",
    "off_card", "documented_run_time",
)
_NO_COUNTS = {"card_runs": -1, "cpu_fallbacks": -1, "run_time_declines": -1, "run_time_warnings": -1,
              "documented_run_time": -1}


# ============================================================================ the checker
class _Session:
    __slots__ = ("on_mlu", "sess", "warm")

    def __init__(self, sess, on_mlu: int):
        self.sess, self.on_mlu, self.warm = sess, on_mlu, False


class FrameChecker:
    """Holds one session per model and path and checks frames. One per process (or Ray
    actor); the sessions are created on first use.

    ``emulate`` selects the emulated card for the MLU path: it is passed to
    :func:`onnxruntime_ep_mlu.register_execution_provider`, which registers the library
    once per process and switches the card when an earlier registration differs, so the
    checker is safe in reused and restarted workers. ``library``: the library's path (None:
    :func:`onnxruntime_ep_mlu.get_library_path` in this process). ``threads``: intra-op
    threads per session (0: ONNX Runtime's default). ``crash_once``: fault injection for
    tests, a file path: the first checker (in any process) to reach its second batch
    creates the file and ends its process, so Ray restarts the actor and retries the batch.
    ``warm_up``: create every session at construction and run it once on the model's zoo
    frame (when it has one), so that the timed runs measure frames only.
    """

    def __init__(
        self,
        models: dict[str, dict],
        paths=PATHS,
        emulate: bool = True,
        library: str | None = None,
        threads: int = 1,
        crash_once: str | None = None,
        warm_up: bool = True,
    ):
        import onnxruntime as ort

        self._ort = ort
        self.models = models
        self.paths = tuple(paths)
        bad = [p for p in self.paths if p not in PATHS]
        if bad or not self.paths:
            raise ValueError(f"paths are cpu and/or mlu, got {list(paths)}")
        self.emulate = emulate
        # Absolute: ONNX Runtime resolves a relative EP library path against its own folder.
        self.library = os.path.abspath(library) if library else get_library_path()
        self.threads = threads
        self.crash_once = crash_once
        self.batches = 0
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._sessions = {}
        self._bases = {}
        self.devices = []
        if "mlu" in self.paths:
            devices = register_execution_provider(self.library, emulate=emulate)
            # The card asked for: the emulated one with emulate=True, real cards otherwise.
            self.devices = [d for d in devices if _has_emulated([d]) == bool(emulate)]
        if warm_up:
            self.warm_up()

    def warm_up(self):
        """Creates every session now and runs each once on its zoo frame, when the model has
        one (so the timed runs exclude session creation and first-run costs); a failure here
        is left for the frames to report."""
        for model, spec in self.models.items():
            feeds = None
            if spec.get("base") is not None:
                feeds = generate(model, self._base(model), 0, 0)
            for path in self.paths:
                try:
                    entry = self.session(model, path)
                    if feeds is not None and not entry.warm:
                        entry.sess.run(None, {i.name: feeds[i.name] for i in entry.sess.get_inputs()})
                        entry.warm = True
                except Exception:  # noqa: BLE001,S112 -- reported per frame
                    continue

    def _base(self, model: str) -> dict:
        if model not in self._bases:
            self._bases[model] = _load_npz(self.models[model]["base"])
        return self._bases[model]

    def _options(self):
        so = self._ort.SessionOptions()
        # Warnings logged: placement.ort_warnings counts a frame's (the run-time fallback's
        # is one); a session's placement notes are printed when it is created.
        so.log_severity_level = 2
        if self.threads:
            so.intra_op_num_threads = self.threads
        return so

    def session(self, model: str, path: str) -> _Session:
        """The session of ``model`` on ``path`` (created on first use)."""
        key = (model, path)
        if key not in self._sessions:
            so = self._options()
            so.add_session_config_entry(RECORD_ASSIGNMENT, "1")
            onnx_bytes = self.models[model]["onnx"]
            if path == "cpu":
                so.register_custom_ops_library(self.library)
                sess = self._ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
            else:
                if not self.devices:
                    raise RuntimeError(
                        f"{EP_NAME} offers no {'emulated' if self.emulate else 'real'} card in this process "
                        f"({self.worker})"
                    )
                so.add_provider_for_devices(self.devices, {})
                sess = self._ort.InferenceSession(onnx_bytes, so)
            on_mlu = sum(len(sub.get_nodes()) for sub in sess.get_provider_graph_assignment_info() if sub.ep_name == EP_NAME)
            self._sessions[key] = _Session(sess, on_mlu)
        return self._sessions[key]

    def frame_arrays(self, row: dict) -> tuple[dict, dict]:
        """(inputs, goldens) of a dataset row."""
        model = row["model"]
        if row["payload"] is not None and len(row["payload"]):
            arrays = _load_npz(bytes(row["payload"]))
            other = [k for k in arrays if not k.startswith(("in.", "out."))]
            if other:
                raise ValueError(f"keys {other} are neither in.<input> nor out.<output>")
            inputs = {k[3:]: v for k, v in arrays.items() if k.startswith("in.")}
            goldens = {k[4:]: v for k, v in arrays.items() if k.startswith("out.")}
            return inputs, goldens
        base = self._base(model)
        index = int(row["index"])
        goldens = {k[4:]: v for k, v in base.items() if k.startswith("out.")} if index == 0 else {}
        return generate(model, base, int(row["seed"]), index), goldens

    def _run(self, model, path, feeds):
        entry = self.session(model, path)
        if not entry.warm:  # first run of a session: allocations, thread pool start-up; untimed
            entry.sess.run(None, feeds)
            entry.warm = True
        # On the MLU the provider's traffic report and ONNX Runtime's warnings of the timed run
        # give where its nodes ran (the report's lines are written outside the timed span's
        # kernels; the session's own line comes only when it ends, so the node lines count).
        mlu = path == "mlu"
        with (
            placement.traffic_report() if mlu else contextlib.nullcontext() as report,
            placement.ort_warnings() if mlu else contextlib.nullcontext() as warned,
        ):
            start = time.time()
            t0 = time.perf_counter()
            outs = entry.sess.run(None, feeds)
            seconds, end = time.perf_counter() - t0, time.time()
            lines = placement.read_report(report) if mlu else None
        counts = placement.counts(lines, warned, self.library) if mlu else _NO_COUNTS
        return dict(zip([o.name for o in entry.sess.get_outputs()], outs)), seconds, start, end, entry.on_mlu, counts

    def check(self, row: dict) -> list[dict]:
        """One result per path for one frame (dataset row)."""
        model, frame = str(row["model"]), str(row["frame"])
        base_result = {"model": model, "frame": frame, "worker": self.worker}
        try:
            inputs, goldens = self.frame_arrays(row)
            names = [i.name for i in self.session(model, self.paths[0]).sess.get_inputs()]
            missing = [n for n in names if n not in inputs]
            if missing:
                raise ValueError(f"the frame has no in.{missing[0]} (model inputs: {names})")
            feeds = {n: inputs[n] for n in names}
        except Exception as e:  # noqa: BLE001 -- a bad frame is a failed row per path
            return [dict(base_result, **_failed(p, e)) for p in self.paths]
        tolerances = self.models[model].get("tolerances") or {}
        expect = placement.Expectation(off_card=self.models[model].get("off_card", ""))
        results, cpu_outs = [], None
        # The CPU path first: it is the reference of the outputs without a golden.
        order = ["cpu"] + [p for p in self.paths if p != "cpu"]
        for path in order:
            if path not in self.paths and (path != "cpu" or "mlu" not in self.paths):
                continue
            try:
                outs, seconds, start, end, on_mlu, counts = self._run(model, path, feeds)
            except Exception as e:  # noqa: BLE001
                if path in self.paths:
                    results.append(dict(base_result, **_failed(path, e)))
                continue
            if path == "cpu":
                cpu_outs = outs
                if "cpu" not in self.paths:
                    continue  # run only as the reference of the MLU path
            worst, worst_desc, failed, refs = -1.0, "", [], set()
            by_kind = {"golden": math.nan, "cpu": math.nan}
            for name, value in outs.items():
                if name in goldens:
                    ref, kind = goldens[name], "golden"
                elif path != "cpu" and cpu_outs is not None:
                    ref, kind = cpu_outs[name], "cpu"
                elif path == "cpu":
                    refs.add("self")  # the CPU path is the reference of the outputs without a golden
                    continue
                else:
                    failed.append(f"{name}: no reference (no golden, and the CPU path failed)")
                    continue
                refs.add(kind)
                ratio, desc = compare(value, ref, tolerances.get(name))
                by_kind[kind] = ratio if math.isnan(by_kind[kind]) else max(by_kind[kind], ratio)
                if ratio > 1:
                    failed.append(f"{name}: {desc}")
                if ratio > worst:
                    worst, worst_desc = ratio, f"{name}: {desc} vs {kind}"
            absent = sorted(set(goldens) - set(outs))
            if absent:
                failed.append(f"goldens without a model output: {absent}")
            if path == "mlu":
                failed += [f"placement: {w}" for w in placement.judge(counts, expect)]
            ratio = max(worst, 0.0)
            if failed and ratio <= 1:  # a failure that is no output's difference (absent outputs)
                ratio = math.inf
            results.append(
                dict(
                    base_result,
                    path=path,
                    ok=not failed,
                    ratio=ratio,
                    golden_ratio=by_kind["golden"],
                    cpu_ratio=by_kind["cpu"],
                    worst=worst_desc or "-",
                    ref="+".join(sorted(refs)) or "-",
                    seconds=seconds,
                    on_mlu=on_mlu,
                    start=start,
                    end=end,
                    error="; ".join(f"also {f}" for f in failed if not worst_desc.startswith(f)),
                    **{k: counts[k] for k in _NO_COUNTS},
                    # The emulated card runs no real libmluops (it computes on host memory).
                    binding_check=bool(self.emulate and path == "mlu" and counts["mluops"] > 0),
                    off_card=expect.off_card,
                )
            )
        return results

    def __call__(self, batch: dict) -> dict:
        """Ray Data ``map_batches`` entry: a batch of frame rows (numpy format) -> result rows."""
        self.batches += 1
        if self.crash_once and self.batches == 2:
            try:
                fd = os.open(self.crash_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, self.worker.encode())
                os.close(fd)
                os._exit(3)  # the process dies in a batch: Ray restarts the actor and retries the batch
        n = len(batch["model"])
        rows = []
        for i in range(n):
            rows += self.check({k: batch[k][i] for k in ("model", "frame", "seed", "index", "payload")})
        return {f: np.array([r[f] for r in rows], dtype=object if f in ("worst", "error", "ref", "off_card") else None)
                for f in RESULT_FIELDS}

    def check_rows(self, rows: list[dict]) -> list[dict]:
        """Plain entry (in-process runs, Ray tasks): every frame of ``rows``."""
        out = []
        for row in rows:
            out += self.check(row)
        return out


def _failed(path: str, e: BaseException) -> dict:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return {
        "path": path,
        "ok": False,
        "ratio": math.inf,
        "golden_ratio": math.nan,
        "cpu_ratio": math.nan,
        "worst": "ERROR",
        "ref": "-",
        "seconds": math.nan,
        "on_mlu": -1,
        "start": math.nan,
        "end": math.nan,
        "error": f"{type(e).__name__}: {msg}",
        **_NO_COUNTS,
        "binding_check": False,
        "off_card": "",
    }
