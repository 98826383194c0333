"""Model-level regression over a dataset of frames, in this process or on a Ray cluster.

Every frame of every model runs on the CPU path (the custom-op library registered with
``SessionOptions.register_custom_ops_library``) and under the MLUExecutionProvider (the
emulated card by default), and each output is compared with its reference under the
model's tolerance:

- a frame with goldens (``out.<output>`` arrays) is compared with them, on every path;
- a frame without goldens (a generated frame, or a dataset frame without ``out.*``) takes
  the CPU path's result as its golden: the MLU result is compared with it (the CPU path is
  then its own reference and reported as such).

Frames come from one of two sources:

- a folder, ``<dir>/<model>/<frame>.npz``: one sub-folder per model, one ``.npz`` per
  frame holding ``in.<input>`` for every model input and, optionally, ``out.<output>``
  goldens (the layout of ``models/<name>.npz``). The model is ``<dir>/<model>/model.onnx``
  when present (``--write-frames`` writes it), else the zoo's model of that name (``--zoo``,
  default the zoo packaged with this module, :func:`onnxruntime_ep_mlu.zoo`); tolerances
  are ``<dir>/<model>/tolerances.json`` (``{"<output>": {"class": "exact"} |
  {"class": "accumulating", "diff1": .., "diff2": .., "max_rel": .., "elem_rel": ..} |
  {"class": "detections", ...}}``, :data:`DETECTIONS` for a detector's boxes; max_rel and
  elem_rel the per-element bounds max |a-b| <= max_rel * max|reference| and, element by
  element, |a_i - b_i| <= elem_rel * (|b_i| + rms(b)) (docs/CONTRACT.md, section 1.5),
  :data:`DEFAULT_FLOAT`'s when absent; ``--write-frames`` writes it too) when present,
  else the zoo's, else exact for
  integer outputs and :data:`DEFAULT_FLOAT` for float outputs. Any other key in a frame is
  an error.
- generated from the zoo's inputs with a seed (``--generate N``): frame 0 of each model is
  the zoo's own frame with its independent numpy goldens; frames 1..N-1 are perturbations
  that keep the inputs valid for the model (see :data:`GENERATORS`), whose golden is the
  CPU path's result, or, with ``--reference FILE.py``, the goldens of that file's
  ``goldens(model, inputs)`` (the checkout's ``models/make_zoo_goldens.py``: the zoo's
  independent numpy models), computed when the frames are made.

Runs in this process by default; ``--ray`` starts a local Ray cluster and ``--address``
(``auto``, ``ray://host:10001``) joins one: the frames become a Ray Dataset (each row
carries its frame's bytes, or the seed and index of a generated frame, so workers need no
shared file system) and ``map_batches`` runs them on a fixed pool of actors
(``ActorPoolStrategy``, 1 CPU each), each holding its own sessions and registering the
library with the package's idempotent
:func:`onnxruntime_ep_mlu.register_execution_provider` (``emulate`` is an argument of the
actor, never read from a worker's environment). Ray restarts an actor whose process dies
and retries its batch on the new process, 3 times at most (Ray Data's default, forever,
would turn a frame that kills its worker every time into a hang); then the run fails.
Ray is an optional extra (``pip install './python[ray]'``); nothing else in the package
imports it.

An MLU frame also fails when its timed run put no node on the card or had a run-time CPU
fallback or decline (:mod:`onnxruntime_ep_mlu.placement`: the provider's traffic report and
ONNX Runtime's warnings of that run; the sessions log at warning level). A model of a frame
folder that legitimately puts nothing on the card says why in ``<dir>/<model>/expect.json``,
``{"off_card": "<why>"}``; its MLU frames then fail when a node does run on the card.

The per-frame results are gathered into one table: per model and path, the nodes on the
MLU, the node runs on the card per frame, the frames, the failed frames (placement
included), the worst error / tolerance against the goldens and
against the CPU path, the median run time, the frames per second of one worker's busy
time, and the worst output; then the end-to-end figures (a frame counts once, for all its
paths): the wall time, and the frames per second over the window from the first frame's
start to the last frame's end over all workers (actor start-up excluded). The exit status
is 1 when any frame of any path fails or is lost (or a Ray run fails), 0 otherwise.

Usage::

    python -m onnxruntime_ep_mlu.regression --generate 20                 # in-process, zoo
    python -m onnxruntime_ep_mlu.regression --frames DIR --ray --workers 1,2
    python -m onnxruntime_ep_mlu.regression --frames DIR --address ray://head:10001 --workers 8 \\
        --runtime-env '{"pip": ["onnxruntime==1.31.1"], "py_modules": ["target/wheels/onnxruntime_ep_mlu-0.1.0-py3-none-manylinux_2_35_x86_64.whl"]}'
"""

from __future__ import annotations

# Beside __all__, every name the module regression.py had before it became a package stays
# importable from here (EXACT, accumulating_metrics, ... have importers).
from .. import EP_NAME, RECORD_ASSIGNMENT
from ._checker import PATHS, RESULT_FIELDS, FrameChecker
from ._cli import main
from ._compare import (
    DEFAULT_FLOAT,
    DETECTIONS,
    ELEM_REL_F16,
    EXACT,
    accumulating_metrics,
    compare,
    compare_detections,
    element_ratio,
    elementwise_errors,
)
from ._frames import (
    GENERATORS,
    dataset_frames,
    default_zoo,
    generate,
    generated_frames,
    load_dataset_models,
    load_reference,
    load_zoo,
    write_frames,
)
from ._runs import run_in_process, run_ray, summarize

__all__ = [
    "GENERATORS",
    "FrameChecker",
    "DETECTIONS",
    "compare",
    "compare_detections",
    "element_ratio",
    "elementwise_errors",
    "dataset_frames",
    "generated_frames",
    "load_dataset_models",
    "load_zoo",
    "main",
    "run_in_process",
    "run_ray",
    "summarize",
    "write_frames",
]
