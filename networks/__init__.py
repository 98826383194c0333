"""The named networks at their published configurations, as PyTorch modules exported
through onnxruntime_ep_mlu.torch, each with the peer library its users run today
(networks/README.md; the runner is networks/run.py)."""

import sys
from pathlib import Path

# The package in this checkout (python/onnxruntime_ep_mlu), whose library is this checkout's.
_PACKAGE = str(Path(__file__).resolve().parents[1] / "python")
if _PACKAGE not in sys.path:
    sys.path.insert(0, _PACKAGE)
