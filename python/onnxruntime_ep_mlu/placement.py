"""Where the MLUExecutionProvider ran a run's nodes, and the judge of an MLU run against what
it expects: the one place the runners (networks/run.py, models/run_zoo.py, models/run_demo.py,
``python -m onnxruntime_ep_mlu.regression``) read this from.

The source is the provider's traffic report (``MLU_EP_TRAFFIC=<file>``, src/ep/traffic.rs):
one line per run of a claimed node, ``backend`` the backend that ran it (``cpu`` for a
run-time fallback to the host) and ``why`` the run-time declines before it; one ``session``
line with the provider's own counts (``card_runs``, ``run_time_declines`` per backend,
``cpu_fallbacks``) when its session ends. ONNX Runtime's warnings, which a session at log
level 3 hides, are counted too (:func:`ort_warnings`): the provider warns once per run-time
fallback or decline, so their count must agree with the report's.

An MLU run fails (:func:`judge`) when no node ran on the card, unless its
:class:`Expectation` says nothing is expected there and why (then it fails when something
does run there), and when its run-time CPU fallbacks or declines are not the number it
expects (none, unless it says otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Said beside every comparison of the MLU-OPS backend on the emulated libmluops with the CPU:
#: that library (mluops_emulated/) computes with this crate's own CPU kernels, so the
#: comparison tests the binding (arguments, layouts, workspaces), not the arithmetic.
EMULATED_MLUOPS = "emulated MLU-OPS = our CPU kernels: binding check"

# ONNX Runtime's default logger: "<time> [W:onnxruntime:<id>, <where>] <message>".
_WARNING = re.compile(r"\[W:onnxruntime:")
# The provider's per-run warnings (src/ep/kernel.rs): a fallback to the host, or a card run
# after a run-time decline.
_RUN_TIME = re.compile(r"ran on the host CPU \(inputs|after a run-time decline \(inputs")
#: Run-time declines the contract documents as data-dependent, which no run can promise to
#: avoid: a PsRoiPool roi with a bin edge within one ulp of an integer leaves MLU-OPS
#: (docs/MLUOPS_BINDING.md). Counted apart (``documented_run_time``), never as unexpected.
DOCUMENTED_RUN_TIME = ("within one ulp of an integer",)
#: Why a runner expects those declines of PsRoiPool's rois (networks/rfcn.py, models/zoo.json).
ULP_EDGES = "rois with a bin edge within one ulp of an integer leave MLU-OPS"


@functools.lru_cache(maxsize=None)
def card_backends(library: str | None = None) -> tuple[str, ...]:
    """The card backends' names of ``library`` (default: the package's,
    :func:`onnxruntime_ep_mlu.backends`), in the order ``auto`` tries them: the report's
    ``backend`` values besides ``cpu`` and the keys of its per-backend counts."""
    from . import backends

    return tuple(backends(library))


@functools.lru_cache(maxsize=None)
def _decliner(names: tuple[str, ...]) -> re.Pattern:
    # One reason per decline in a node line's ``why``: "<backend>: why; <backend>: why".
    return re.compile(r"(?:^|; )(" + "|".join(map(re.escape, names)) + r"): ")


def emulated_mluops(library: str | os.PathLike | None) -> bool:
    """Whether ``library`` (a ``mluops_library`` option) is the emulated libmluops that the
    build writes beside the provider (``examples/libmluops_emulated.so``)."""
    return library is not None and Path(library).name == "libmluops_emulated.so"


@dataclass(frozen=True)
class Expectation:
    """What an MLU run must show. ``off_card``: empty when at least one node must run on a
    card backend; else why no node is expected there (then none may). ``cpu_fallbacks`` and
    ``run_time_declines``: how many of each the run has, exactly."""

    off_card: str = ""
    cpu_fallbacks: int = 0
    run_time_declines: int = 0

    def describe(self) -> str:
        what = f"expected: nothing on the card ({self.off_card})" if self.off_card else "expected: nodes on the card"
        extra = [f"{n} {k}" for n, k in ((self.cpu_fallbacks, "CPU fallbacks"), (self.run_time_declines, "run-time declines")) if n]
        return what + (", " + ", ".join(extra) if extra else "")


def read_report(path: str | os.PathLike) -> list[dict]:
    """The lines of a traffic report (none when the file was never written: no node ran)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def counts(lines: list[dict], warnings: list[str] | None = None, library: str | None = None) -> dict:
    """The counts of a report, flat (one int each, for result rows): ``card_runs`` (node runs
    on a card backend) and per backend (one key per name of :func:`card_backends` of
    ``library``), ``cpu_fallbacks``,
    ``run_time_declines`` (to the next backend), and with ``warnings`` (:func:`ort_warnings`)
    ``warnings`` and ``run_time_warnings`` (else -1). From the provider's own counts when the
    report has exactly one session line, else (a session still open) from its node lines.
    Raises ValueError on a report of several sessions (one judgement is of one session), and
    on a backend the library does not name."""
    names = card_backends(library)
    sessions = [x for x in lines if "session" in x]
    if len(sessions) > 1:
        raise ValueError(f"the traffic report holds {len(sessions)} sessions' lines, not one")
    if sessions:
        s = sessions[0]
        per, fallbacks, declines = dict(s["card_runs"]), int(s["cpu_fallbacks"]), sum(s["run_time_declines"].values())
        documented = 0
    else:
        per, fallbacks, declines, documented = dict.fromkeys(names, 0), 0, 0, 0
        for x in lines:
            if "op" not in x:
                continue
            whys = [w for w in _decliner(names).split(x.get("why", "")) if w and w not in names]
            known = sum(any(d in w for d in DOCUMENTED_RUN_TIME) for w in whys)
            if x["backend"] == "cpu":
                # A fallback is documented when every decline before it is.
                if whys and known == len(whys):
                    documented += 1
                else:
                    fallbacks += 1
                continue
            # A backend the library lacks is counted here and refused below, as a session line's.
            per[x["backend"]] = per.get(x["backend"], 0) + 1
            declines += len(whys) - known
            documented += known
    unknown = set(per) - set(names)
    if unknown:
        raise ValueError(f"the traffic report counts runs on {', '.join(sorted(map(str, unknown)))}, not backends of the "
                         f"library ({', '.join(names)})")
    out = {"card_runs": sum(per.values()), **{b: int(per.get(b, 0)) for b in names}, "cpu_fallbacks": fallbacks,
           "run_time_declines": declines, "documented_run_time": documented, "warnings": -1,
           "run_time_warnings": -1}
    if warnings is not None:
        out["warnings"] = len(warnings)
        out["run_time_warnings"] = sum(bool(_RUN_TIME.search(w)) for w in warnings)
    return out


def judge(c: dict, expect: Expectation = Expectation()) -> list[str]:
    """Why an MLU run with counts ``c`` (:func:`counts`) fails ``expect``; empty when it
    passes. When ``c`` counts ONNX Runtime's warnings, its run-time ones must be one per
    fallback and decline the report counts (the provider warns for each)."""
    failures = []
    if expect.off_card and c["card_runs"]:
        failures.append(f"{c['card_runs']} node run(s) on the card where nothing is expected ({expect.off_card})")
    if not expect.off_card and not c["card_runs"]:
        failures.append("no node ran on the card")
    if c["cpu_fallbacks"] != expect.cpu_fallbacks:
        failures.append(f"{c['cpu_fallbacks']} run-time CPU fallback(s), expected {expect.cpu_fallbacks}")
    if c["run_time_declines"] != expect.run_time_declines:
        failures.append(f"{c['run_time_declines']} run-time decline(s) to the next backend, expected "
                        f"{expect.run_time_declines}")
    documented = max(c.get("documented_run_time", 0), 0)
    if c["run_time_warnings"] >= 0 and c["run_time_warnings"] != c["cpu_fallbacks"] + c["run_time_declines"] + documented:
        failures.append(f"{c['run_time_warnings']} run-time warning(s) in ONNX Runtime's log against "
                        f"{c['cpu_fallbacks']} fallback(s) and {c['run_time_declines']} decline(s) in the traffic report")
    return failures


def summary(c: dict, library: str | None = None) -> str:
    """One phrase of the counts (:func:`counts` of the same ``library``): the card runs per
    backend, fallbacks, declines, warnings."""
    per = ", ".join(f"{c[b]} on {b}" for b in card_backends(library))
    text = (f"card runs {c['card_runs']} ({per}), {c['cpu_fallbacks']} CPU "
            f"fallbacks, {c['run_time_declines']} run-time declines")
    if c["warnings"] >= 0:
        text += f", {c['warnings']} ONNX Runtime warnings ({c['run_time_warnings']} at run time)"
    return text


@contextlib.contextmanager
def traffic_report():
    """Sets ``MLU_EP_TRAFFIC`` to a fresh file for the block (the provider reads it at every
    node run and when a session ends) and yields its path; restores the variable after.
    Sessions no longer referenced are collected first: one held in a reference cycle would
    otherwise end, and write its session line, inside the block, whenever the collector ran."""
    gc.collect()
    before = os.environ.get("MLU_EP_TRAFFIC")
    with tempfile.TemporaryDirectory(prefix="mlu-traffic-") as tmp:
        path = os.path.join(tmp, "traffic.jsonl")
        os.environ["MLU_EP_TRAFFIC"] = path
        try:
            yield path
        finally:
            if before is None:
                del os.environ["MLU_EP_TRAFFIC"]
            else:
                os.environ["MLU_EP_TRAFFIC"] = before


@contextlib.contextmanager
def ort_warnings():
    """Captures what the process writes to its standard error (fd 2, where ONNX Runtime's
    default logger writes) in the block and yields a list that receives its ONNX Runtime
    warnings when the block ends. Everything else, and the run-time warnings, is written
    back to standard error; the other warnings (placement notes, expected) are counted only.
    Sessions of the block need ``log_severity_level`` <= 2 for their warnings to be logged."""
    found: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield found
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            kept = []
            for line in text.splitlines(keepends=True):
                if _WARNING.search(line):
                    found.append(line.rstrip("\n"))
                    if not _RUN_TIME.search(line):
                        continue
                kept.append(line)
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
