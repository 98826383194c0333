"""The rehearsal's last check (scripts/rehearse_card.sh): in this process, with the library
built by `scripts/test.sh --card` against the stand-in toolkit, the provider found its cards
through the toolkit's libcnrt (not MLU_EP_EMULATE), and each card's nodes ran through the
cncc-built kernel library and the toolkit's libmluops, never on the CPU. Read from the
provider's counters (MLU_EP_TRAFFIC's session line) and from the files mapped into this
process (/proc/self/maps).

usage: provenance.py <libonnxruntime_ep_mlu.so> <NEUWARE_HOME> <kernel library>
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

EP = "MLUExecutionProvider"
DEMO = Path(__file__).resolve().parents[2] / "models"


def mapped() -> set[str]:
    with open("/proc/self/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}


def session_line(model: str, devices, backend: str, feeds_file: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "traffic.jsonl")
        os.environ["MLU_EP_TRAFFIC"] = report
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_provider_for_devices(devices, {"mlu_backend": backend})
        sess = ort.InferenceSession(model, so)
        data = np.load(feeds_file)
        sess.run(None, {i.name: data["in." + i.name] for i in sess.get_inputs()})
        del sess
        gc.collect()
        del os.environ["MLU_EP_TRAFFIC"]
        (line,) = [json.loads(x) for x in Path(report).read_text().splitlines() if "session" in json.loads(x)]
        return line


def main() -> int:
    lib, home, kernels = sys.argv[1:4]
    if "MLU_EP_EMULATE" in os.environ:
        sys.exit("provenance: MLU_EP_EMULATE is set: the cards must come through libcnrt alone")
    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library(EP, lib)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    emulated = [d for d in devices if dict(d.device.metadata).get("emulated") != "false"]
    if not devices or emulated:
        sys.exit(f"provenance: {len(devices)} device(s), {len(emulated)} of them emulated")
    failures = []
    model, feeds = str(DEMO / "mluops_demo.onnx"), str(DEMO / "mluops_demo.npz")
    for d in devices:
        card = d.device.device_id
        # auto: MLU-OPS where it runs the node, our kernels for the rest; each node on a card.
        s = session_line(model, [d], "auto", feeds)
        runs, claimed = s["card_runs"], s["claimed"]
        print(f"provenance: card {card}, mlu_backend=auto: claimed {claimed}, card runs {runs}, "
              f"CPU fallbacks {s['cpu_fallbacks']}, declined {s['declined']}")
        # One run: each claimed node ran once, on one of the two backends.
        if s["cpu_fallbacks"] or runs["mluops"] == 0 or runs["bang"] == 0 or sum(runs.values()) != sum(claimed.values()):
            failures.append(f"card {card}: every claimed node on a card, through both backends: {s}")
    maps = mapped()
    want = {
        "the toolkit's libcnrt": str(Path(home, "lib64", "libcnrt.so").resolve()),
        "the toolkit's libmluops": str(Path(home, "lib64", "libmluops.so").resolve()),
        "the cncc-built kernel library": str(Path(kernels).resolve()),
    }
    for what, path in want.items():
        print(f"provenance: {what}: {path} {'mapped' if path in maps else 'NOT mapped'}")
        if path not in maps:
            failures.append(f"{what} ({path}) is not mapped into the process")
    others = sorted(p for p in maps if ("libmluops" in p or "libcnrt" in p) and p not in want.values())
    if others:
        failures.append(f"other MLU libraries mapped: {others}")
    for f in failures:
        print(f"provenance: FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
