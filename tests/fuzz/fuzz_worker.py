"""The fuzz harness's worker (tests/fuzz/fuzz.py --worker): runs cases on both paths in this
process and reports each outcome to the parent."""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import traceback

from conftest import SCHEMAS, build_model
from fuzz_cases import EP, Case, make_case
from fuzz_checks import OUT_OF_MEMORY, compare_all, conforms, message_names_node, offcard_reason, overflow_prone

class Runner:
    """Runs cases in this process (the worker): sessions on both paths and the checks."""

    def __init__(self, lib: str):
        import onnxruntime as ort

        self.ort = ort
        self.lib = lib
        ort.set_default_logger_severity(4)
        os.environ["MLU_EP_EMULATE"] = "1"
        if not any(d.ep_name == EP for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(EP, lib)
        self.devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
        if not self.devices:
            raise RuntimeError("MLUExecutionProvider registered but offers no device")
        # The provider's traffic report, one per worker: where each mlu-path node ran and why.
        fd, self.report = tempfile.mkstemp(prefix="mluops-fuzz-traffic-", suffix=".jsonl")
        os.close(fd)

    def session(self, case: Case, path: str, model: bytes):
        ort = self.ort
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.intra_op_num_threads = case.threads
        # Without the arena: after a failed huge request ONNX Runtime's BFC arena keeps the grown
        # region size and, on the next small allocation, reserves all the address space left under
        # RLIMIT_AS (ConstantOfShape does the same); that is ONNX Runtime's state, not the library's.
        so.enable_cpu_mem_arena = False
        if path == "cpu":
            so.register_custom_ops_library(self.lib)
            return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        so.add_provider_for_devices(self.devices, {})
        return ort.InferenceSession(model, so)

    def run_path(self, case: Case, path: str) -> tuple[dict, list | None]:
        """(result, outputs) of one path; result is JSON-able. On the mlu path, `offcard` is
        the provider's reason when the node did not run on the card (its traffic report)."""
        if path != "mlu":
            return self._run_path(case, path)
        import gc

        open(self.report, "w").close()
        os.environ["MLU_EP_TRAFFIC"] = self.report
        try:
            res, outs = self._run_path(case, path)
            gc.collect()  # the session's end writes the provider's session line
        finally:
            del os.environ["MLU_EP_TRAFFIC"]
        res["offcard"] = offcard_reason(self.report, case.node)
        return res, outs

    def _run_path(self, case: Case, path: str) -> tuple[dict, list | None]:
        res = {"outcome": "ok", "phase": None, "msg": None, "noname": None, "on_mlu": None, "rechecked": False,
               "offcard": None, "kinds": sorted({m.split()[0] for m in case.mutations}) or ["none"], "findings": []}
        names = [o["name"] for o in SCHEMAS[case.op]["outputs"]]
        model = build_model(case.op, case.attrs, case.decl, case.node)
        try:
            sess = self.session(case, path, model)
        except Exception as e:  # onnxruntime raises its own exception classes
            return self._error(res, case, "create", e), None
        if path == "mlu":
            placed = {n.name: s.ep_name for s in sess.get_provider_graph_assignment_info() for n in s.get_nodes()}
            res["on_mlu"] = placed.get(case.node) == EP
        try:
            outs = sess.run(None, case.feeds)
        except Exception as e:
            self._error(res, case, "run", e)
            self._recover(res, case, sess, names)
            return res, None
        if path == "cpu" and not case.mutations:
            try:
                why = compare_all(outs, case.reference(case.valid_feeds), case.classes, names)
            except MemoryError:  # the reference does not fit under the worker's cap
                why = None
            if why:
                res["findings"].append(("disagree", f"cpu vs numpy reference: {why}"))
        return res, outs

    def _error(self, res, case, phase, e):
        msg = str(e)
        res.update(outcome="error", phase=phase, msg=msg[:400], noname=message_names_node(case.op, case.node, msg))
        if phase == "create" and not case.attr_mutated and conforms(case.valid_feeds, case.decl):
            # nothing about this model is invalid until it runs: creation must succeed
            res["findings"].append(("disagree", f"session creation failed on a valid model: {msg[:300]}"))
        elif not case.mutations:
            res["findings"].append(("disagree", f"valid case rejected at {phase}: {msg[:300]}"))
        return res

    def _recover(self, res, case, sess, names):
        """After a run-time error the same session must run the unmutated feeds correctly. Skipped
        when the attributes were mutated (no valid input is known for them) or when the valid
        feeds do not fit the model's declared inputs (ONNX Runtime would reject them first)."""
        if case.attr_mutated or not case.mutations or not conforms(case.valid_feeds, case.decl):
            return
        try:
            outs = sess.run(None, case.valid_feeds)
        except Exception as e:
            res["findings"].append(("unusable", f"valid feeds fail after the error: {str(e)[:300]}"))
            return
        why = compare_all(outs, case.reference(case.valid_feeds), case.classes, names)
        if why:
            res["findings"].append(("unusable", f"valid feeds after the error disagree with the reference: {why}"))
        res["rechecked"] = True

    def cross_check(self, case: Case, results: dict, outputs: dict) -> tuple[list, bool]:
        """(findings, loose) of cpu vs mlu: both error, or both succeed with agreeing outputs;
        loose when the accumulating outputs' values could not be compared (overflow_prone)."""
        cpu, mlu = results["cpu"], results["mlu"]
        if cpu["outcome"] != mlu["outcome"]:
            which = "mlu" if mlu["outcome"] == "error" else "cpu"
            msg = results[which]["msg"]
            # Only one path ran out of memory: a finding (failing) of its own kind, so that a
            # path that needs more memory than the other for the same node is seen. (The
            # emulated card holds every output twice, in card memory, which is host memory
            # here, and in ONNX Runtime's host copy; the fixed-seed runs have none.)
            kind = "oom" if OUT_OF_MEMORY.search(msg or "") else "disagree"
            return [(kind, f"only {which} fails: {msg}")], False
        if cpu["outcome"] != "ok":
            return self.compare_messages(cpu, mlu), False
        loose = overflow_prone(case) and "acc" in case.classes
        classes = ["loose" if loose and c == "acc" else c for c in case.classes]
        names = [o["name"] for o in SCHEMAS[case.op]["outputs"]]
        try:
            why = compare_all(outputs["mlu"], outputs["cpu"], classes, names, same_dtype=True)
        except MemoryError:
            # The comparison itself does not fit under the worker's cap: not compared.
            return [], True
        return ([("disagree", f"mlu vs cpu: {why}")] if why else []), loose


    @staticmethod
    def compare_messages(cpu: dict, mlu: dict) -> list:
        """Both paths failed: the same rule must give the same error, in the same phase, word
        for word. Out of memory on both is the one exception: ONNX Runtime's host allocator
        (std::bad_alloc) and the card's allocator word it differently, so both need only say
        that memory ran out. Every both-failed case counts as `msgcmp` (see handle_lines)."""
        findings = []
        if cpu["phase"] != mlu["phase"]:
            findings.append(("message", f"cpu fails at {cpu['phase']}, mlu at {mlu['phase']}: {cpu['msg']} | {mlu['msg']}"))
        elif cpu["msg"] != mlu["msg"] and not (OUT_OF_MEMORY.search(cpu["msg"]) and OUT_OF_MEMORY.search(mlu["msg"])):
            findings.append(("message", f"the messages differ: cpu {cpu['msg']!r} | mlu {mlu['msg']!r}"))
        return findings


def cap_address_space(gib: float) -> None:
    cap = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def worker_main(args) -> None:
    """Reads one JSON request per line ({seed, op, k, paths}); writes JSON lines: {"stage": path}
    before each path, {"path": path, "result": ...} after it, {"done": cross-check findings}."""
    cap_address_space(args.mem_gib)
    # The protocol gets its own descriptor: anything the library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    runner = Runner(args.lib)

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    for line in iter(sys.stdin.readline, ""):
        req = json.loads(line)
        try:
            case = make_case(req["seed"], req["op"], req["k"])
            results, outputs = {}, {}
            for path in req["paths"]:
                send({"stage": path})
                results[path], outputs[path] = runner.run_path(case, path)
                send({"path": path, "result": results[path]})
            send({"stage": "compare"})
            findings, loose = runner.cross_check(case, results, outputs) if len(results) == 2 else ([], False)
            both_failed = len(results) == 2 and all(r["outcome"] == "error" for r in results.values())
            send({"done": findings, "loose": loose, "msgcmp": both_failed})
        except Exception:
            send({"internal": traceback.format_exc()})
