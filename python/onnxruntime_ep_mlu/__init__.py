"""Find and register ``libonnxruntime_ep_mlu.so`` with ONNX Runtime.

The library is both a custom-op library (the ``mluops`` ONNX domain, CPU kernels) and the
``MLUExecutionProvider`` plugin execution provider. This module needs only the standard
library until a function that talks to ONNX Runtime is called; the PyTorch front end is the
separate submodule :mod:`onnxruntime_ep_mlu.torch` (the only part that needs torch).

Typical use::

    import onnxruntime as ort
    import onnxruntime_ep_mlu as mlu

    sess = ort.InferenceSession("model.onnx", mlu.session_options())      # CPU kernels
    sess = ort.InferenceSession("model.onnx", mlu.session_options(with_ep=True))  # MLU
"""

from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"

__all__ = [
    "DOMAIN",
    "EP_NAME",
    "LIBRARY_NAME",
    "OPSET_VERSION",
    "backends",
    "demo_inputs",
    "demo_model",
    "emulated_mluops_path",
    "get_devices",
    "get_ep_name",
    "get_library_path",
    "library_candidates",
    "models_dir",
    "node_assignment",
    "operators",
    "register_execution_provider",
    "session_options",
    "zoo",
]

#: ONNX domain of the operators, and its opset version.
DOMAIN = "mluops"
OPSET_VERSION = 1
#: Name under which the library registers its execution provider.
EP_NAME = "MLUExecutionProvider"
#: File name of the library.
LIBRARY_NAME = "libonnxruntime_ep_mlu.so"
#: Environment variable that names the library explicitly.
ENV_LIBRARY = "MLU_EP_LIB"
#: Environment variable read by the library when it is registered as an EP: "1" adds the
#: emulated MLU370 card.
ENV_EMULATE = "MLU_EP_EMULATE"
#: Environment variable the provider reads (when a session is created) for the MLU-OPS
#: library's path, and the two whose lib64/libmluops.so it tries next: naming a real library.
ENV_MLUOPS_LIBRARY = "MLU_EP_MLUOPS_LIBRARY"
ENV_MLUOPS_HOMES = ("MLUOPS_HOME", "NEUWARE_HOME")
#: File name of the emulated MLU-OPS library (mluops_emulated/), packaged beside the library.
EMULATED_MLUOPS_NAME = "libmluops_emulated.so"
#: Session config entry that makes a session record which provider ran each node.
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"

_PACKAGE_DIR = Path(__file__).resolve().parent
#: Where the build puts the demo model and the model zoo inside the package (setup.py copies
#: them from the checkout's models/ at build time, so they are never a second copy in git).
_PACKAGED_MODELS = _PACKAGE_DIR / "models"
DEMO_MODEL = "mluops_demo.onnx"
DEMO_DATA = "mluops_demo.npz"
ZOO = "zoo.json"


def get_ep_name() -> str:
    """The execution provider's name, ``"MLUExecutionProvider"``."""
    return EP_NAME


def _repo_root() -> Path | None:
    """The source checkout this package sits in (``<repo>/python/onnxruntime_ep_mlu``), if
    any: true when it is imported from the repository or installed editable."""
    root = _PACKAGE_DIR.parent.parent
    return root if (root / "Cargo.toml").is_file() else None


def library_candidates() -> list[Path]:
    """Where :func:`get_library_path` looks when ``MLU_EP_LIB`` is not set, in order: the
    library installed inside the package (``pip install ./python`` builds it in), then, for
    a package in the repository (imported from it or installed editable), the repository's
    release and debug builds."""
    out = [_PACKAGE_DIR / LIBRARY_NAME]
    root = _repo_root()
    if root is not None:
        out += [root / "target" / "release" / LIBRARY_NAME, root / "target" / "debug" / LIBRARY_NAME]
    return out


def get_library_path() -> str:
    """Absolute path of ``libonnxruntime_ep_mlu.so``.

    ``MLU_EP_LIB`` when set (it must name an existing file); otherwise the first existing
    file of :func:`library_candidates`. Absolute because ONNX Runtime resolves a relative
    EP library path against its own folder.

    Raises FileNotFoundError when there is no library.
    """
    env = os.environ.get(ENV_LIBRARY)
    if env:
        path = Path(env).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{ENV_LIBRARY}={env!r} does not name a file ({path} not found)")
        return str(path)
    candidates = library_candidates()
    for path in candidates:
        if path.is_file():
            return str(path)
    looked = ", ".join(str(p) for p in candidates)
    root = _repo_root()
    hint = (
        f"build it with `cargo build --release --lib` in {root}, or set {ENV_LIBRARY} to the library's path"
        if root is not None
        else f"this installed package ships no library and is not in the repository: set {ENV_LIBRARY} to the "
        "library's path, or install the package from the repository with `pip install ./python` (which builds "
        "the library into it)"
    )
    raise FileNotFoundError(f"{LIBRARY_NAME} not found ({ENV_LIBRARY} is not set; looked at {looked}): {hint}")


def emulated_mluops_path() -> str | None:
    """Absolute path of the emulated MLU-OPS library packaged beside the library (a wheel,
    ``pip install ./python``), the emulated card's stand-in for Cambricon's ``libmluops.so``;
    None for a package without it (imported from the checkout or installed editable: there
    the tests choose the backend, and ``MLU_EP_MLUOPS_LIBRARY`` names
    ``target/release/examples/libmluops_emulated.so``)."""
    path = _PACKAGE_DIR / EMULATED_MLUOPS_NAME
    return str(path) if path.is_file() else None


_defaulted_mluops: str | None = None


def _default_mluops_for_emulation() -> None:
    """On the emulated card, names the emulated MLU-OPS library (``MLU_EP_MLUOPS_LIBRARY``)
    unless the user named one (that variable, ``MLUOPS_HOME`` or ``NEUWARE_HOME``), so the
    emulated card runs what a card with MLU-OPS runs; off the emulated card, takes back a
    name it set. The provider reads the variable when a session is created."""
    global _defaulted_mluops
    if _defaulted_mluops is not None and os.environ.get(ENV_MLUOPS_LIBRARY) == _defaulted_mluops:
        del os.environ[ENV_MLUOPS_LIBRARY]  # ours: decided afresh below
    _defaulted_mluops = None
    if os.environ.get(ENV_EMULATE) == "1" and not any(os.environ.get(v) for v in (ENV_MLUOPS_LIBRARY, *ENV_MLUOPS_HOMES)):
        path = emulated_mluops_path()
        if path is not None:
            os.environ[ENV_MLUOPS_LIBRARY] = _defaulted_mluops = path


def models_dir() -> Path:
    """The folder holding the demo model (``mluops_demo.onnx`` and its inputs and goldens,
    ``mluops_demo.npz``) and the model zoo (``zoo.json`` and the files it names): the
    package's own ``models/`` (a wheel, or ``pip install ./python``), else, for a package
    imported from the checkout or installed editable, the checkout's ``models/``.

    Raises FileNotFoundError when there is neither."""
    if (_PACKAGED_MODELS / ZOO).is_file():
        return _PACKAGED_MODELS
    root = _repo_root()
    if root is not None and (root / "models" / ZOO).is_file():
        return root / "models"
    raise FileNotFoundError(
        f"no models folder: {_PACKAGED_MODELS} does not exist (this package was not built by `pip install "
        "./python` or `pip wheel ./python`, which put the repository's models/ into it) and the package is not "
        "in the repository"
    )


def demo_model() -> str:
    """Absolute path of the demo model, ``mluops_demo.onnx``: the five MLU operators among
    standard ONNX nodes (models/README.md)."""
    return str(models_dir() / DEMO_MODEL)


def demo_inputs() -> dict:
    """The demo model's inputs, ``{input name: numpy array}``, ready for ``session.run``
    (stored as ``in.<name>`` in ``mluops_demo.npz``, beside the goldens ``out.<name>``).
    Needs numpy."""
    import numpy as np

    with np.load(models_dir() / DEMO_DATA, allow_pickle=False) as data:
        return {k[3:]: data[k] for k in data.files if k.startswith("in.")}


def zoo() -> str:
    """Absolute path of the model zoo's ``zoo.json`` (five models with one frame of inputs
    and goldens each, and every output's tolerance): the default zoo of
    ``python -m onnxruntime_ep_mlu.regression``."""
    return str(models_dir() / ZOO)


def session_options(
    with_ep: bool = False,
    *,
    provider_options: dict[str, str] | None = None,
    record_assignment: bool = False,
    emulate: bool | None = None,
    library: str | None = None,
):
    """``onnxruntime.SessionOptions`` that can load models with ``mluops`` nodes.

    - ``with_ep=False``: registers the custom-op library; every node runs on CPU.
    - ``with_ep=True``: registers the library as the MLUExecutionProvider (once per
      process, see :func:`register_execution_provider`) and adds its devices; the
      ``mluops`` nodes the MLU kernels support run on the card, the rest on CPU. This also
      registers the ``mluops`` domain. Raises RuntimeError when there is no MLU device.

    ``provider_options`` go to the EP (e.g. ``{"device_id": "0"}``); ``record_assignment``
    makes the session record node placement (read it with :func:`node_assignment`);
    ``emulate`` is passed to :func:`register_execution_provider`; ``library`` overrides
    :func:`get_library_path`.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    if record_assignment:
        so.add_session_config_entry(RECORD_ASSIGNMENT, "1")
    if with_ep:
        devices = register_execution_provider(library, emulate=emulate)
        if not devices:
            raise RuntimeError(
                f"{EP_NAME} offers no device: no MLU card was found; set {ENV_EMULATE}=1 before the "
                "library is registered (or pass emulate=True) to use the emulated card"
            )
        so.add_provider_for_devices(devices, dict(provider_options or {}))
    else:
        if provider_options:
            raise ValueError("provider_options need with_ep=True")
        so.register_custom_ops_library(library or get_library_path())
    return so


_registered_library: str | None = None


def get_devices() -> list:
    """The ``OrtEpDevice``\\ s of the MLUExecutionProvider known to ONNX Runtime (empty
    before registration or without a card)."""
    import onnxruntime as ort

    return [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]


def register_execution_provider(library: str | None = None, *, emulate: bool | None = None) -> list:
    """Registers the library with ``onnxruntime.register_execution_provider_library`` under
    :func:`get_ep_name` and returns its devices (``ep_device.ep_name == get_ep_name()``).

    Safe to call from any process that may be reused (Ray workers, multiprocessing pools,
    retried tasks): ONNX Runtime keeps a registration for the life of the process, so this
    registers at most once and otherwise returns the current devices.

    The library reads ``MLU_EP_EMULATE`` when it is registered. ``emulate=True`` sets it to
    ``"1"`` (``False`` removes it). With it set, and no MLU-OPS library named
    (``MLU_EP_MLUOPS_LIBRARY``, ``MLUOPS_HOME``, ``NEUWARE_HOME``), this names the emulated
    one (:func:`emulated_mluops_path`) in ``MLU_EP_MLUOPS_LIBRARY``, so the emulated card
    runs MLU-OPS's nodes as a card with MLU-OPS does. When the current registration does
    not match the request, it is replaced: unregistered and registered again. Sessions created before
    keep working on the card they were created with (the library outlives its
    unregistration), so a reused worker can switch whatever an earlier task set; session
    options built from the earlier devices must be built again (a session made from them
    gets a clear error from the provider, and ONNX Runtime falls back to CPU or raises).
    """
    global _registered_library
    import onnxruntime as ort

    if emulate is not None:
        if emulate:
            os.environ[ENV_EMULATE] = "1"
        else:
            os.environ.pop(ENV_EMULATE, None)
    _default_mluops_for_emulation()
    devices = get_devices()
    path = library or _registered_library or get_library_path()
    if not devices and _registered_library is None:
        try:
            ort.register_execution_provider_library(EP_NAME, path)
        except Exception as e:  # registered by other code of this process: keep that one
            if "already registered" not in str(e):
                raise
        _registered_library = path
        devices = get_devices()
    if emulate is not None and _has_emulated(devices) != emulate:
        try:
            ort.unregister_execution_provider_library(EP_NAME)
        except Exception as e:
            raise RuntimeError(
                f"{EP_NAME} is registered in this process under another name, so its emulated card cannot be "
                f"{'added' if emulate else 'removed'} here; unregister it first ({e})"
            ) from e
        _registered_library = None  # until the new registration succeeds
        ort.register_execution_provider_library(EP_NAME, path)
        _registered_library = path
        devices = get_devices()
    return devices


def _has_emulated(devices) -> bool:
    return any(dict(d.device.metadata).get("emulated") == "true" for d in devices)


def _exported(name: str, library: str | None):
    """The JSON a C export of the library (``MluEpOperators``, ``MluEpBackends``) returns,
    read; ONNX Runtime is not loaded."""
    import ctypes
    import json

    make = getattr(ctypes.CDLL(library or get_library_path()), name)
    make.restype = ctypes.c_char_p
    make.argtypes = []
    raw = make()
    if raw is None:
        raise RuntimeError(f"{name} gave no list (it failed inside the library)")
    return json.loads(raw.decode())


def operators(library: str | None = None) -> list[dict]:
    """The library's registry, in its order: ``[{"op": op_type, "backends": [...]}]``, the
    card backends (``mlu_backend`` names) that run each operator (at least one each;
    ``MluEpOperators``; ONNX Runtime is not loaded)."""
    return _exported("MluEpOperators", library)


def backends(library: str | None = None) -> list[str]:
    """The library's card backends' names (``mlu_backend``'s values besides ``auto``, the
    traffic report's keys), in the order ``auto`` tries them (``MluEpBackends``; ONNX Runtime
    is not loaded)."""
    return _exported("MluEpBackends", library)


def node_assignment(session) -> dict[str, str]:
    """``{node name: provider}`` of a session created with ``record_assignment=True`` (the
    session config entry ``session.record_ep_graph_assignment_info`` = ``"1"``)."""
    out = {}
    for sub in session.get_provider_graph_assignment_info():
        for node in sub.get_nodes():
            out[node.name] = sub.ep_name
    return out
