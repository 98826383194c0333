"""Fuzz harness for libonnxruntime_ep_mlu: the nine `mluops` operators, each case run on two
paths, the custom-op library on ONNX Runtime's CPU provider ("cpu") and MLUExecutionProvider
on the emulated card ("mlu", MLU_EP_EMULATE=1).

A case is a single-node model plus feeds, generated deterministically from (seed, op, k): a
valid case of random shape (zero-size dimensions included), then, in most cases, one or two
mutations (dtype, rank, shape, index values, special floats, attributes), with input shapes
declared static, symbolic or mixed. Checks (docs/CONTRACT.md):
- outcome per path: ok / error / crash / memory abort / hang;
- an unmutated case on cpu agrees with the numpy reference (tests/python/reference*.py) in
  the output's accuracy class (§1.5);
- cpu and mlu agree: both error with the same message, or both succeed with agreeing
  outputs; one path alone running out of memory is a finding too;
- an error raised by the library names `mluops.<Op> node '<node>'` (§1.2);
- after a run-time error the session still runs the case's unmutated feeds correctly.

Cases run in persistent worker subprocesses (this file with --worker) under an RLIMIT_AS cap
and a per-case timeout, so that a crash, an abort or a hang costs one worker, not the run.

    python tests/fuzz/fuzz.py --lib target/release/libonnxruntime_ep_mlu.so --seed 1 --cases 2000
    python tests/fuzz/fuzz.py --lib ... --seed 1 --replay GetIndicePairs:17   # one case, verbose
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

# The harness's modules sit beside this file, also when it is loaded by path (a test
# imports it as a module); fuzz_cases puts tests/python and python/ on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_cases import GENERATORS, MUTATORS, OPS, PATHS, STARTUP_GRACE, make_case, operators  # noqa: E402
from fuzz_checks import binding_note, documented_offcard  # noqa: E402
from fuzz_worker import Runner, cap_address_space, worker_main  # noqa: E402
from onnxruntime_ep_mlu import backends  # noqa: E402


# ============================================================================= parent
class Worker:
    """One worker subprocess and the case it is running."""

    def __init__(self, args, logdir: Path, wid: int):
        self.args = args
        self.log = open(logdir / f"worker{wid}.stderr", "ab+")
        self.start()

    def start(self):
        env = dict(os.environ, MLU_EP_EMULATE="1")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--lib", self.args.lib,
               "--mem-gib", str(self.args.mem_gib)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.buf = b""
        self.task = None
        self.fresh = True

    def assign(self, task: dict):
        # a fresh worker's first case also waits for its start (imports, EP registration)
        deadline = time.monotonic() + self.args.timeout + (STARTUP_GRACE if self.fresh else 0.0)
        self.fresh = False
        self.task = dict(task, stage=None, deadline=deadline, log_from=os.fstat(self.log.fileno()).st_size)
        self.proc.stdin.write((json.dumps({k: task[k] for k in ("seed", "op", "k", "paths")}) + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> list | None:
        """Complete protocol lines available now; None at end of file (the worker died)."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            return None
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in lines if x]

    def stderr_tail(self) -> str:
        self.log.flush()
        self.log.seek(self.task["log_from"] if self.task else 0)
        return self.log.read()[-3000:].decode(errors="replace")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def restart(self):
        self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.start()


COLUMNS = ["cases", "ok", "error", "crash", "hang", "memabort", "disagree", "unusable", "noname",
           "unmutated", "rechecked", "loose", "on_mlu", "off_card", "offcard", "ort_noname", "oom", "msgcmp", "message"]
FAILING = {"crash", "hang", "memabort", "disagree", "unusable", "noname", "internal", "oom", "message", "offcard"}


class Fuzz:
    def __init__(self, args):
        self.args = args
        self.backends = backends(args.lib)
        self.stats = defaultdict(Counter)  # (op, path) -> column -> count
        self.findings = []  # (kind, op, k, path, detail)
        self.ort_messages = Counter()  # ONNX Runtime messages without the node name, by pattern
        self.ort_examples = {}  # pattern -> its first case
        self.by_kind = defaultdict(Counter)  # (mutation kind, path) -> outcome -> count
        self.offcard = Counter()  # (op, reason with numbers masked) -> mlu-path cases off the card

    def record_path(self, op, k, path, res):
        st = self.stats[(op, path)]
        st["cases"] += 1
        st[res["outcome"]] += 1
        st["on_mlu"] += bool(res["on_mlu"])
        why = res.get("offcard")
        if why:
            st["off_card"] += 1
            self.offcard[(op, re.sub(r"-?\d+(\.\d+)?", "N", why)[:200])] += 1
            # A valid case that runs must run on the card unless a documented rule keeps it off.
            if res["kinds"] == ["none"] and res["outcome"] == "ok" and not documented_offcard(why, self.backends):
                self.finding("offcard", op, k, path, f"a valid node ran off the card for an undocumented reason: {why}")
        st["unmutated"] += res["kinds"] == ["none"]
        st["rechecked"] += res["rechecked"]
        for kind in res["kinds"]:
            self.by_kind[(kind, path)][res["outcome"]] += 1
        if res["noname"] == "ours":
            self.finding("noname", op, k, path, res["msg"])
        elif res["noname"] == "ort":
            st["ort_noname"] += 1
            pattern = re.sub(r"\d+", "N", res["msg"].split("\n")[0])[:160]
            self.ort_messages[pattern] += 1
            self.ort_examples.setdefault(pattern, f"{op}:{k} [{path}]")
        for kind, detail in res["findings"]:
            self.finding(kind, op, k, path, detail)

    def finding(self, kind, op, k, path, detail):
        if kind in COLUMNS:
            self.stats[(op, path)][kind] += 1
        self.findings.append((kind, op, k, path, detail))
        print(f"FINDING {kind} {op}:{k} [{path}] {detail[:300]}", flush=True)

    def handle_death(self, w: Worker, hang: bool):
        """Records the crash, abort or hang of the worker's current path, then runs the paths
        the case has left on a fresh worker."""
        t = w.task
        stage = t["stage"]
        if hang:
            w.kill()
            kind, detail = "hang", f"no answer within {self.args.timeout} s"
        else:
            w.proc.wait()
            rc = w.proc.returncode
            tail = w.stderr_tail()
            how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
            abort = "memory allocation of" in tail
            kind, detail = ("memabort" if abort else "crash"), f"{how}; stderr: {tail.strip()[-600:]}"
        if stage in PATHS:
            path, left = stage, t["paths"][t["paths"].index(stage) + 1:]
            self.stats[(t["op"], path)]["cases"] += 1
        else:  # lost outside a session (generation or comparison): the harness's problem
            path, left = t["paths"][0], []
            kind, detail = "internal", f"worker lost at stage {stage}: {detail}"
        self.finding(kind, t["op"], t["k"], path, detail)
        w.restart()
        return dict(t, paths=left) if left else None

    def handle_lines(self, w: Worker, lines) -> bool:
        """True when the worker finished its case."""
        t = w.task
        for msg in lines:
            if "stage" in msg:
                t["stage"] = msg["stage"]
            elif "path" in msg:
                self.record_path(t["op"], t["k"], msg["path"], msg["result"])
            elif "done" in msg:
                self.stats[(t["op"], "mlu")]["loose"] += msg["loose"]
                self.stats[(t["op"], "mlu")]["msgcmp"] += msg["msgcmp"]
                for kind, detail in msg["done"]:
                    self.finding(kind, t["op"], t["k"], "mlu", detail)
                return True
            elif "internal" in msg:
                self.finding("internal", t["op"], t["k"], t["paths"][0], msg["internal"])
                return True
        return False

    def run(self, tasks):
        with tempfile.TemporaryDirectory(prefix="mluops-fuzz-") as logdir:
            return self._run(tasks, Path(logdir))

    def _run(self, tasks, logdir: Path):
        args = self.args
        workers = [Worker(args, logdir, i) for i in range(args.workers)]
        retry = []  # paths left over from a crashed or hung case, run before new cases
        start = last = time.monotonic()
        done = 0
        try:
            while True:
                for w in workers:
                    if w.task is None:
                        task = retry.pop() if retry else next(tasks, None)
                        if task is not None:
                            w.assign(task)
                busy = [w for w in workers if w.task is not None]
                if not busy:
                    break
                now = time.monotonic()
                wait = max(0.0, min(w.task["deadline"] for w in busy) - now)
                ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], min(wait, 5.0))
                for w in busy:
                    if w.proc.stdout in ready:
                        lines = w.read()
                        if lines is None:
                            left = self.handle_death(w, hang=False)
                        elif self.handle_lines(w, lines):
                            w.task, left = None, None
                        else:
                            continue
                        done += left is None
                        retry += [left] if left else []
                    elif time.monotonic() > w.task["deadline"]:
                        left = self.handle_death(w, hang=True)
                        done += left is None
                        retry += [left] if left else []
                if time.monotonic() - last >= args.progress:
                    last = time.monotonic()
                    bad = sum(1 for f in self.findings if f[0] in FAILING)
                    print(f"[{last - start:7.1f} s] {done} cases done, {bad} failing findings", flush=True)
        finally:
            for w in workers:
                w.kill()
                w.log.close()
        return time.monotonic() - start

    def report(self, elapsed) -> int:
        if binding_note():
            print(f"\n{binding_note()}")
        print(f"\n{'operator':26} {'path':4} " + " ".join(f"{c:>10}" for c in COLUMNS))
        total = Counter()
        for op in OPS:
            for path in PATHS:
                st = self.stats.get((op, path))
                if st:
                    print(f"{op:26} {path:4} " + " ".join(f"{st[c]:>10}" for c in COLUMNS))
                    total.update(st)
        print(f"{'total':31} " + " ".join(f"{total[c]:>10}" for c in COLUMNS))
        print(f"elapsed {elapsed:.1f} s")
        print("\noutcomes by mutation kind (a case with two mutations counts under both):")
        for kind in ["none"] + list(MUTATORS):
            cells = [f"{path} ok {self.by_kind[(kind, path)]['ok']:>6} error {self.by_kind[(kind, path)]['error']:>6}"
                     for path in PATHS if (kind, path) in self.by_kind]
            if cells:
                print(f"  {kind:6} " + "   ".join(cells))
        if self.offcard:
            print("\nmlu-path nodes off the card, by reason (valid ones must match a rule of DOCUMENTED_OFFCARD):")
            for (op, why), n in sorted(self.offcard.items(), key=lambda x: -x[1])[:20]:
                print(f"  {n:6}  {op}: {why}")
        if self.ort_messages:
            print("\nONNX Runtime errors that do not name the node (reported, not failing):")
            for text, n in self.ort_messages.most_common(12):
                print(f"  {n:6}  {text}  (e.g. {self.ort_examples[text]})")
        failing = sorted((f for f in self.findings if f[0] in FAILING), key=lambda f: (OPS.index(f[1]), f[2], f[3]))
        if failing:
            print(f"\n{len(failing)} failing findings (replay: {sys.argv[0]} --lib {self.args.lib} "
                  f"--seed {self.args.seed} --replay OP:K):")
            for kind, op, k, path, detail in failing:
                print(f"- {kind} {op}:{k} [{path}] {detail[:500]}")
                print(f"    case: {json.dumps(make_case(self.args.seed, op, k).describe())[:1500]}")
        return 1 if failing else 0


def case_stream(args):
    """Round robin over the selected ops; the k-th case of an op is (seed, op, k)."""
    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    i = 0
    while (args.cases is None or i < args.cases) and (deadline is None or time.monotonic() < deadline):
        op = args.ops[i % len(args.ops)]
        yield {"seed": args.seed, "op": op, "k": i // len(args.ops), "paths": args.paths}
        i += 1


def replay(args) -> int:
    """One case in this process, under the workers' memory cap, everything printed."""
    cap_address_space(args.mem_gib)
    op, k = args.replay.split(":")
    case = make_case(args.seed, op, int(k))
    print(json.dumps(case.describe(), indent=1))
    runner = Runner(args.lib)
    results, outputs = {}, {}
    for path in args.paths:
        results[path], outputs[path] = runner.run_path(case, path)
        print(f"{path}: {json.dumps(results[path], indent=1)}")
    findings, loose = runner.cross_check(case, results, outputs) if len(results) == 2 else ([], False)
    findings += [f for r in results.values() for f in r["findings"]]
    if loose:
        print("accumulating outputs compared in shape only (overflow-prone inputs)")
    print("findings:", findings or "none")
    return 1 if findings else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", required=True, help="libonnxruntime_ep_mlu.so")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cases", type=int, help="number of cases (round robin over --ops)")
    p.add_argument("--minutes", type=float, help="run new cases for this long")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--ops-on", metavar="BACKEND", help="the operators card backend BACKEND runs (the library's registry), not --ops")
    p.add_argument("--paths", default="cpu,mlu")
    p.add_argument("--mem-gib", type=float, default=6.0, help="RLIMIT_AS of each worker")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines")
    p.add_argument("--replay", metavar="OP:K", help="run one case in this process and print everything")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    # Absolute: onnxruntime resolves a relative EP library path against its own folder.
    args.lib = str(Path(args.lib).resolve())
    if args.worker:
        worker_main(args)
        return 0
    args.ops = args.ops.split(",")
    if args.ops_on:
        args.ops = [row["op"] for row in operators(args.lib) if args.ops_on in row["backends"]]
        if not args.ops:
            p.error(f"no operator of the registry runs on card backend {args.ops_on!r}")
    args.paths = args.paths.split(",")
    unknown = [o for o in args.ops if o not in OPS] + [x for x in args.paths if x not in PATHS]
    if unknown:
        p.error(f"unknown op or path: {unknown}")
    ungenerated = [o for o in args.ops if o not in GENERATORS]
    if ungenerated:
        p.error(f"operators of the registry without a case generator in tests/fuzz/fuzz_cases.py: {ungenerated}")
    if not Path(args.lib).is_file():
        p.error(f"library not found: {args.lib}")
    if args.replay:
        return replay(args)
    if args.cases is None and args.minutes is None:
        args.cases = 900
    fuzz = Fuzz(args)
    print(f"fuzz: seed {args.seed}, {args.cases or 'unbounded'} cases, {args.minutes or '-'} min, ops {len(args.ops)}, "
          f"paths {args.paths}, {args.workers} workers, {args.mem_gib} GiB, {args.timeout} s per case", flush=True)
    if binding_note():
        print(binding_note(), flush=True)
    elapsed = fuzz.run(case_stream(args))
    return fuzz.report(elapsed)


if __name__ == "__main__":
    sys.exit(main())
