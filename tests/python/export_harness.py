"""The harness of the export tests (test_export.py, test_export_ops.py): the library, the
emulated card's devices, exporting a module and checking its nodes, sessions on both paths."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import assert_accumulating
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))  # the package of this checkout, installed or not
mlu = importlib.import_module("onnxruntime_ep_mlu")
mt = importlib.import_module("onnxruntime_ep_mlu.torch")

EP = "MLUExecutionProvider"
CPU = "CPUExecutionProvider"
# gradcheck in float64 on functions linear in the checked input: the finite differences are
# exact to rounding, so the tolerance can be far below gradcheck's default (rtol 1e-3)
EXACT_GRAD = {"atol": 1e-8, "rtol": 1e-7}

# torch >= 2.9 marks the TorchScript exporter (the one that honours `symbolic`) deprecated:
# every export test module's pytestmark.
EXPORTER_WARNINGS = [
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export"),
    pytest.mark.filterwarnings("ignore:The feature will be removed"),
]


@pytest.fixture(scope="module")
def lib() -> str:
    try:
        return mlu.get_library_path()
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def package_devices(lib):
    """The library registered as the MLUExecutionProvider with the emulated card (the
    library reads MLU_EP_EMULATE when it is registered, so it is set first)."""
    os.environ["MLU_EP_EMULATE"] = "1"
    ort.set_default_logger_severity(3)
    devices = mlu.register_execution_provider(lib, emulate=True)
    assert devices, "the EP library registered but reports no device"
    return devices


@contextlib.contextmanager
def stderr_of_native_code():
    """Captures file descriptor 2, where torch's C++ exporter writes its warnings."""
    result = {}
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield result
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            result["text"] = tmp.read().decode(errors="replace")


def export(model: nn.Module, args: tuple, input_names, output_names, dynamic_axes=None) -> onnx.ModelProto:
    """Exports with the TorchScript exporter; fails if the exporter had no type for an
    mluops output (every symbolic sets its outputs' types) or if tracing warned that the
    trace might not generalise."""
    model.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught, stderr_of_native_code() as native:
        warnings.simplefilter("always")
        torch.onnx.export(
            model,
            args,
            buf,
            dynamo=False,
            opset_version=17,
            custom_opsets={"mluops": 1},
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
        )
    tracer = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert not tracer, tracer
    untyped = [line for line in native["text"].splitlines() if "shape inference of mluops" in line]
    assert not untyped, untyped
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto)  # a custom domain's nodes are not checked, the rest is
    return proto


def mluops_nodes(proto: onnx.ModelProto, op_type: str | None = None) -> list[onnx.NodeProto]:
    return [n for n in proto.graph.node if n.domain == "mluops" and (op_type is None or n.op_type == op_type)]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def producer(proto: onnx.ModelProto, name: str) -> tuple[onnx.NodeProto, int]:
    for n in proto.graph.node:
        if name in n.output:
            return n, list(n.output).index(name)
    raise KeyError(name)


def graph_output(proto: onnx.ModelProto, name: str):
    (o,) = [o for o in proto.graph.output if o.name == name]
    return o.type.tensor_type


def dims(tensor_type) -> list:
    """A value's shape: ints, or the symbol's name for a symbolic dimension."""
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in tensor_type.shape.dim]


def cpu_session(proto: onnx.ModelProto, lib: str) -> ort.InferenceSession:
    so = mlu.session_options(library=lib, record_assignment=True)
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=[CPU])


def mlu_session(proto: onnx.ModelProto, devices) -> ort.InferenceSession:
    so = mlu.session_options(with_ep=True, record_assignment=True)
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so)


def eager(model: nn.Module, args: tuple) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*args)
    out = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in out]


def feeds_of(names, args) -> dict[str, np.ndarray]:
    return {n: a.numpy() for n, a in zip(names, args)}


def assert_outputs(got, want, names):
    assert len(got) == len(want)
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, f"{name}: shape {a.shape} vs eager {b.shape}"
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} vs eager {b.dtype}"
        if np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert_accumulating(a, b.astype(np.float64), name)


def node_placement(sess: ort.InferenceSession, proto: onnx.ModelProto, op_type: str) -> list[str]:
    where = mlu.node_assignment(sess)
    names = [n.name for n in proto.graph.node if n.op_type == op_type]
    assert names, f"no {op_type} node"
    return [where[n] for n in names]
