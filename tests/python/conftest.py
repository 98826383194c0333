"""Shared harness of the ONNX Runtime session tests of libonnxruntime_ep_mlu.

Every test builds a single-node model in domain `mluops` with onnx.helper, registers the
library under test with `SessionOptions.register_custom_ops_library`, and runs it with the
onnxruntime wheel of the project's virtual environment (scripts/setup.sh).

The library is MLU_EP_LIB when set, else target/debug/libonnxruntime_ep_mlu.so. A missing
library fails the tests (it is never a reason to skip).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from reference import DEFAULT_FLOAT, ELEM_REL_F16, accumulating_metrics, element_ratio, elementwise_errors

REPO = Path(__file__).resolve().parents[2]
CASES_FILE = REPO / "tests" / "cases" / "errors.json"
DOMAIN = "mluops"
# ORT 1.31.1 reads IR versions up to 13 (onnx 1.19 writes 12 by default); 10 is pinned so the
# models do not depend on the onnx package's default.
IR_VERSION = 10
OPSETS = [("", 17), (DOMAIN, 1)]

DTYPES = {
    "float32": (np.float32, TensorProto.FLOAT),
    "float16": (np.float16, TensorProto.FLOAT16),
    "float64": (np.float64, TensorProto.DOUBLE),
    "int32": (np.int32, TensorProto.INT32),
    "int64": (np.int64, TensorProto.INT64),
}
ONNX_TYPE_NAMES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
}


def library_path() -> Path:
    env = os.environ.get("MLU_EP_LIB")
    # Absolute: onnxruntime resolves a relative EP library path against its own capi/ folder.
    return Path(env).resolve() if env else REPO / "target" / "debug" / "libonnxruntime_ep_mlu.so"


def load_schemas() -> dict:
    out = {}
    for f in sorted((REPO / "schemas").glob("*/*.json")):
        s = json.loads(f.read_text())
        out[s["op_type"]] = s
    return out


SCHEMAS = load_schemas()


def load_cases() -> list[dict]:
    return json.loads(CASES_FILE.read_text())["cases"]


# ----------------------------------------------------------------------------- data
def _number(v):
    if isinstance(v, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[v]
    return v


def materialize(data, shape, dtype: str) -> np.ndarray:
    """The array an errors.json data spec describes (explicit list or generator)."""
    np_dtype = DTYPES[dtype][0]
    n = math.prod(shape)
    if isinstance(data, dict):
        if "fill" in data:
            flat = np.full(n, _number(data["fill"]), dtype=np.float64)
        elif "arange" in data:
            start, step = data["arange"]
            flat = start + step * np.arange(n, dtype=np.float64)
        else:
            raise ValueError(f"unknown data generator {data}")
    else:
        if len(data) != n:
            raise ValueError(f"{len(data)} values for shape {shape}")
        flat = np.array([_number(v) for v in data], dtype=np.float64)
    return flat.astype(np_dtype).reshape(shape)


def attribute_values(attributes: dict) -> dict:
    """errors.json typed attributes -> {name: (python value, AttributeProto type)}."""
    out = {}
    for name, spec in attributes.items():
        ((kind, value),) = spec.items()
        if kind == "int":
            out[name] = (int(value), onnx.AttributeProto.INT)
        elif kind == "ints":
            out[name] = ([int(v) for v in value], onnx.AttributeProto.INTS)
        elif kind == "float":
            out[name] = (float(_number(value)), onnx.AttributeProto.FLOAT)
        elif kind == "string":
            out[name] = (str(value), onnx.AttributeProto.STRING)
        else:
            raise ValueError(f"attribute {name}: unknown kind {kind}")
    return out


# ----------------------------------------------------------------------------- models
def output_dtypes(op: str, input_dtypes: dict[str, str]) -> list[tuple[str, str]]:
    """(name, dtype) of the op's outputs per its schema; a type constraint takes the dtype of
    the first input bound to it when that dtype is allowed (float32 otherwise)."""
    schema = SCHEMAS[op]
    constraints = {c["type_str"]: c["allowed_types"] for c in schema.get("type_constraints", [])}
    bound = {}
    for formal in schema["inputs"]:
        t = formal["type_str"]
        if t in constraints and t not in bound and formal["name"] in input_dtypes:
            d = input_dtypes[formal["name"]]
            allowed = [ONNX_TYPE_NAMES[a] for a in constraints[t]]
            bound[t] = d if d in allowed else allowed[0]
    outs = []
    for formal in schema["outputs"]:
        t = formal["type_str"]
        outs.append((formal["name"], bound.get(t) or ONNX_TYPE_NAMES.get(t) or ONNX_TYPE_NAMES[constraints[t][0]]))
    return outs


def build_model(op: str, attributes: dict, inputs: list[tuple[str, str, list[int]]], node_name: str) -> bytes:
    """A single-node model; `inputs` are (name, dtype, shape) in node order, fed as graph inputs."""
    outs = output_dtypes(op, {n: d for n, d, _ in inputs})
    node = helper.make_node(op, [n for n, _, _ in inputs], [n for n, _ in outs], domain=DOMAIN, name=node_name)
    for name, (value, kind) in attribute_values(attributes).items():
        node.attribute.append(helper.make_attribute(name, value, attr_type=kind))
    graph = helper.make_graph(
        [node],
        f"single_{op}",
        [helper.make_tensor_value_info(n, DTYPES[d][1], list(s)) for n, d, s in inputs],
        [helper.make_tensor_value_info(n, DTYPES[d][1], None) for n, d in outs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS], ir_version=IR_VERSION
    )
    return model.SerializeToString()


def make_session(model: bytes, lib: Path, intra_threads: int | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    if intra_threads is not None:
        so.intra_op_num_threads = intra_threads
    so.register_custom_ops_library(str(lib))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


class Harness:
    """Runs single-node mluops models against the library under test."""

    def __init__(self, lib: Path):
        self.lib = lib

    def session(
        self, op: str, attributes: dict, feeds: dict[str, np.ndarray], node_name: str = "n0", intra_threads=None
    ):
        spec = [(name, _dtype_name(a), list(a.shape)) for name, a in feeds.items()]
        return make_session(build_model(op, attributes, spec, node_name), self.lib, intra_threads)

    def run(self, op: str, attributes: dict, feeds: dict[str, np.ndarray], node_name: str = "n0", intra_threads=None):
        """Outputs of one run, in schema order."""
        sess = self.session(op, attributes, feeds, node_name, intra_threads)
        return sess.run(None, feeds)

    def case_model(self, case: dict) -> tuple[bytes, dict[str, np.ndarray]]:
        feeds = {t["name"]: materialize(t["data"], t["shape"], t["dtype"]) for t in case["inputs"]}
        spec = [(t["name"], t["dtype"], t["shape"]) for t in case["inputs"]]
        return build_model(case["op"], case["attributes"], spec, node_name(case)), feeds


def node_name(case: dict) -> str:
    return f"n_{case['name']}"


def _dtype_name(a: np.ndarray) -> str:
    for name, (np_dtype, _) in DTYPES.items():
        if a.dtype == np_dtype:
            return name
    raise TypeError(f"unsupported dtype {a.dtype}")


# ----------------------------------------------------------------------------- accuracy
#: The per-element bound beside diff1/diff2: max |a-b| <= MAX_REL[dtype] * max|reference|.
#: Measured over every assert_accumulating of test_ops, test_ep, test_concurrency and
#: test_export (1,096 comparisons, 2026-05): at most 7.6e-7 in float32 (ThreeInterpolateBackward
#: against float64), 2.9e-4 in float16 (its epsilon is 9.8e-4); the bounds are 40x and 10x those.
MAX_REL = {"float16": 3e-3, "float32": 3e-5, "float64": 3e-5}


#: The contract's per-element rule (docs/CONTRACT.md, section 1.5): |a_i - b_i| <= ELEM_REL[dtype]
#: * (|b_i| + rms(b)); the package's values (regression's DEFAULT_FLOAT and ELEM_REL_F16, as
#: tests/common's).
ELEM_REL = {"float16": ELEM_REL_F16, "float32": DEFAULT_FLOAT["elem_rel"], "float64": DEFAULT_FLOAT["elem_rel"]}


def assert_accumulating(actual, reference, what: str, tol: float = 3e-3):
    """The contract's accumulating class (diff1, diff2 <= tol) and, because those whole-tensor
    metrics dilute one wrong element among many, the per-element bounds of the actual's
    dtype: max |a-b| <= MAX_REL * max|reference|, and each element against its own magnitude
    and the tensor's rms (ELEM_REL), so that one large element hides no small one gone wrong."""
    d1, d2 = accumulating_metrics(actual, reference)
    # NaN metrics fail these comparisons too.
    assert d1 <= tol and d2 <= tol, f"{what}: diff1 = {d1:.3g}, diff2 = {d2:.3g} (limit {tol})"
    dtype = np.asarray(actual).dtype.name
    ea, er = elementwise_errors(actual, reference)
    assert er <= MAX_REL[dtype], f"{what}: max |a-b| = {ea:.3g} = {er:.3g} x max|reference| (limit {MAX_REL[dtype]:g})"
    elem = element_ratio(actual, reference)
    assert elem <= ELEM_REL[dtype], f"{what}: an element off by {elem:.3g} x (|ref| + rms) (limit {ELEM_REL[dtype]:g})"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def mlu_lib() -> Path:
    lib = library_path()
    if not lib.is_file():
        pytest.fail(
            f"library under test not found: {lib} (build it with `cargo build --lib`, or set MLU_EP_LIB)", pytrace=False
        )
    return lib


@pytest.fixture(scope="session")
def harness(mlu_lib) -> Harness:
    return Harness(mlu_lib)


EP = "MLUExecutionProvider"


#: `scripts/test.sh --card`: the provider tests run on the real cards only (no emulated card
#: is registered, and a host without a card fails instead of testing the emulator).
CARD_MODE = os.environ.get("MLU_EP_TEST_CARD") == "1"

#: The card backend the provider tests pin (`mlu_backend`): scripts/test.sh --card runs them
#: once per backend the host has, through MLU_EP_BACKEND (the factory's default for sessions
#: without the option); the host suite pins `bang`, or MLU_EP_BACKEND when given.
BACKEND = os.environ.get("MLU_EP_BACKEND") or "bang"


def ep_devices() -> list:
    """Registers the library as an EP library once per process and returns its devices: the
    real cards the Cambricon runtime lists and, unless CARD_MODE, the emulated card (the
    factory reads MLU_EP_EMULATE when the library is registered)."""
    if not CARD_MODE:
        os.environ["MLU_EP_EMULATE"] = "1"
    ort.set_default_logger_severity(3)
    if not any(d.ep_name == EP for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(EP, str(library_path()))
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    assert devices, "the EP library registered but reports no device" + (" (MLU_EP_TEST_CARD=1: no real card)" if CARD_MODE else "")
    return devices


def is_emulated(device) -> bool:
    """The emulated card, told by its metadata (never by a device count)."""
    return dict(device.device.metadata).get("emulated") == "true"


@pytest.fixture(scope="session")
def emulated_devices(mlu_lib: Path):
    """The emulated card alone, for tests that need it (the emulated libmluops computes on
    host memory; emulator facts); skipped with the reason under CARD_MODE."""
    if CARD_MODE:
        pytest.skip("needs the emulated card, which scripts/test.sh --card does not register")
    return [d for d in ep_devices() if is_emulated(d)]


def emulated_mluops(lib: Path) -> Path:
    """The emulated libmluops built beside the library (`cargo build --example mluops_emulated`)."""
    path = lib.parent / "examples" / "libmluops_emulated.so"
    assert path.exists(), f"{path} is missing: build it with cargo build [--release] --example mluops_emulated"
    return path


def pytest_generate_tests(metafunc):
    """`error_case` / `valid_case` arguments run once per errors.json entry, with the case name
    as id; `mlu_devices` once per device the provider offers (each real card, and the
    emulated card unless CARD_MODE), as a one-device list."""
    for arg, kind in (("error_case", "error"), ("valid_case", "valid_edge")):
        if arg in metafunc.fixturenames:
            cases = [c for c in load_cases() if c["kind"] == kind]
            metafunc.parametrize(arg, cases, ids=[c["name"] for c in cases])
    if "mlu_devices" in metafunc.fixturenames:
        devices = ep_devices()
        ids = ["emulated" if is_emulated(d) else f"card{d.device.device_id}" for d in devices]
        metafunc.parametrize("mlu_devices", [[d] for d in devices], ids=ids, scope="session")


# ----------------------------------------------------------------------------- the installed wheel
#: Variables that would let a process find the checkout's library or package instead of the
#: installed ones: unset for every process that stands for a user of the wheel.
CHECKOUT_VARIABLES = ("MLU_EP_LIB", "MLU_EP_EMULATE", "PYTHONPATH", "PYTHONHOME", "ORT_DYLIB_PATH")


def user_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in CHECKOUT_VARIABLES}


@pytest.fixture(scope="session")
def installed_python(tmp_path_factory) -> Path:
    """The python of a fresh virtual environment into which pip installed this checkout's
    wheel (`pip wheel ./python`, as a user builds it; the build's cargo step reuses target/).
    onnxruntime, numpy, onnx, torch and ray come from this test environment, through a .pth
    file that puts its site-packages after the new environment's own: the package is the
    wheel's, and the heavy dependencies are not downloaded a second time. pip's output is
    shown only when a step fails."""
    import subprocess
    import sys
    import sysconfig

    work = tmp_path_factory.mktemp("installed")

    def run(cmd, what):
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=work, env=user_env())
        if p.returncode != 0:
            pytest.fail(f"{what} failed (exit status {p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
        return p.stdout

    dist = work / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps", REPO / "python", "-w", dist],
        "pip wheel ./python")
    (wheel,) = dist.glob("onnxruntime_ep_mlu-*.whl")
    venv = work / "venv"
    run([sys.executable, "-m", "venv", venv], "python -m venv")
    py = venv / "bin" / "python"
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], "the new site-packages").strip())
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz-test-environment.pth").write_text("".join(p + "\n" for p in ours))
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--no-index", wheel], "pip install <the wheel>")
    return py
