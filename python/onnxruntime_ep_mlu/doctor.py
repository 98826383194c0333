"""``python -m onnxruntime_ep_mlu.doctor``: what the provider finds on this machine.

Prints the report the library makes of itself (``MluEpDoctorReport``, the same text ONNX
Runtime's log gets at INFO when the provider factory is created): the Cambricon runtime
(path, version), each card and its topology, the kernel library, libmluops on each card
(path, version, ``mluOpCreate`` result), each operator's backend order on each card, and the
emulated card's state. Needs only the standard library and the built library (``MLU_EP_LIB``
or :func:`onnxruntime_ep_mlu.get_library_path`); ONNX Runtime is not loaded.

Exit status: 0; 1 when a Cambricon card was asked for (``--card``, or ``NEUWARE_HOME`` set)
and none is usable, with the reason on stderr; 2 when the library cannot be loaded or gives
no report.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

from . import get_library_path


def report(library: str | None = None) -> dict:
    """The library's report: ``text``, ``real_cards`` and ``no_real_card`` (why none)."""
    lib = ctypes.CDLL(library or get_library_path())
    make = lib.MluEpDoctorReport
    make.restype = ctypes.c_char_p
    make.argtypes = []
    raw = make()
    if raw is None:
        raise RuntimeError("MluEpDoctorReport gave no report (it failed inside the library)")
    return json.loads(raw.decode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onnxruntime_ep_mlu.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--card", action="store_true", help="a Cambricon card must be usable (implied by NEUWARE_HOME)")
    parser.add_argument("--library", help="the provider library (default: MLU_EP_LIB or the package's)")
    args = parser.parse_args(argv)
    try:
        found = report(args.library)
    except (OSError, RuntimeError, ValueError) as e:
        print(f"doctor: {e}", file=sys.stderr)
        return 2
    print(found["text"])
    asked = "--card" if args.card else ("NEUWARE_HOME is set" if os.environ.get("NEUWARE_HOME") else None)
    if asked and found["real_cards"] == 0:
        print(f"doctor: a Cambricon card was asked for ({asked}) and none is usable: {found['no_real_card']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
