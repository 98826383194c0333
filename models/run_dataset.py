"""Model-level regression over a dataset of frames, in this process or on Ray: this checkout's
python/onnxruntime_ep_mlu/regression/ (``python -m onnxruntime_ep_mlu.regression`` where
the package is installed), with the same arguments. models/run_zoo.py runs the zoo's one
frame per model; this runs many frames per model, generated from the zoo's or read from a
folder (<dir>/<model>/<frame>.npz with in.<input> arrays and optional out.<output> goldens).

  python models/run_dataset.py --generate 20                       # in-process, 20 frames per zoo model
  python models/run_dataset.py --frames DIR --ray --workers 1,2    # local Ray cluster, 1 then 2 actors
  python models/run_dataset.py --frames DIR --address auto --workers 8 --runtime-env '{"py_modules": ["x.whl"]}'
  python models/run_dataset.py --help

Exits 1 when any frame of any path fails its tolerance (or any frame is lost).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from onnxruntime_ep_mlu.regression import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
