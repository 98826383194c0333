"""``python -m onnxruntime_ep_mlu.regression``."""

import sys

from ._cli import main

sys.exit(main())
