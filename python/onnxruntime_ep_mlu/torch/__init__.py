"""PyTorch front end of the ``mluops`` operators, for exporting models to ONNX.

Every operator is a ``torch.autograd.Function`` whose

- ``forward`` computes the operator's contract (docs/CONTRACT.md, ``schemas/<family>/*.json``) with
  plain torch ops, on any device (this is an independent implementation: it never calls
  ``libonnxruntime_ep_mlu.so``);
- ``backward``, where the operator has a gradient, computes it with torch ops too, by the
  same rules as the library's backward operators (VoxelPoolingForward: a gather at the
  pos_memo cells; DynamicScatter: DynamicScatterBackward's rules; ThreeInterpolate:
  ThreeInterpolateBackward's scatter-add; PsRoiPool: PsRoiPoolBackward's);
- ``symbolic`` emits the ``mluops`` node exactly as its schema declares it (inputs,
  outputs, attribute names and types), and sets each output's ONNX type, with a symbolic
  dimension where the size is data-dependent (GetIndicePairs' output sites, DynamicScatter's
  voxels).

Export with the TorchScript exporter, which honours ``symbolic``::

    torch.onnx.export(model, args, "model.onnx", dynamo=False, opset_version=17,
                      custom_opsets={"mluops": 1})

or :func:`export`, which fills those in. Index tensors are int32 in the graph, as the
schemas require; the functions cast int64 inputs.
"""

from __future__ import annotations

import io
import os
import warnings

import torch

from .. import DOMAIN, OPSET_VERSION
from ._dynamic_scatter import (
    DynamicScatterBackwardFunction,
    DynamicScatterFunction,
    dynamic_scatter,
    dynamic_scatter_backward,
)
from ._psroipool import PsRoiPoolBackwardFunction, PsRoiPoolFunction, psroi_pool, psroi_pool_backward
from ._sparse_conv import GetIndicePairsFunction, IndiceConvFunction, get_indice_pairs, indice_conv
from ._sparse_modules import (
    Rulebook,
    SparseConv3d,
    SparseInverseConv3d,
    SparseSequential,
    SparseTensor,
    SubMConv3d,
    ToDense,
    from_spconv,
    sparse_conv3d,
)
from ._three_interpolate import (
    ThreeInterpolateBackwardFunction,
    ThreeInterpolateFunction,
    three_interpolate,
    three_interpolate_backward,
)
from ._voxel_pooling import VoxelPoolingFunction, voxel_pooling

__all__ = [
    "CUSTOM_OPSETS",
    "ONNX_OPSET",
    "DynamicScatterBackwardFunction",
    "DynamicScatterFunction",
    "GetIndicePairsFunction",
    "IndiceConvFunction",
    "PsRoiPoolBackwardFunction",
    "PsRoiPoolFunction",
    "Rulebook",
    "SparseConv3d",
    "SparseInverseConv3d",
    "SparseSequential",
    "SparseTensor",
    "SubMConv3d",
    "ThreeInterpolateBackwardFunction",
    "ThreeInterpolateFunction",
    "ToDense",
    "VoxelPoolingFunction",
    "dynamic_scatter",
    "dynamic_scatter_backward",
    "export",
    "from_spconv",
    "get_indice_pairs",
    "indice_conv",
    "psroi_pool",
    "psroi_pool_backward",
    "sparse_conv3d",
    "three_interpolate",
    "three_interpolate_backward",
    "voxel_pooling",
]

#: ``custom_opsets`` argument of ``torch.onnx.export``.
CUSTOM_OPSETS = {DOMAIN: OPSET_VERSION}
#: The standard ONNX opset the project's models use.
ONNX_OPSET = 17


def export(
    model, args, f, *, opset_version: int = ONNX_OPSET, custom_opsets: dict | None = None, fuse: bool = True, **kwargs
):
    """``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``, the one that
    calls ``symbolic``), opset 17 and the ``mluops`` opset; other keyword arguments are
    passed through. With ``fuse`` (the default) the exported graph then goes through
    :func:`onnxruntime_ep_mlu.fold.fold_affine` and
    :func:`~onnxruntime_ep_mlu.fold.fuse_epilogue`: a BatchNorm1d after a sparse convolution
    folds into its filters and bias, and a residual ``replace_feature(out.features +
    identity.features)`` and a ReLU after it become the IndiceConv's fused epilogue, so the
    activations of a SparseSequential or a SparseBasicBlock stay on the card; what is left
    unfused is reported as a warning saying why. ``f`` is a path or a binary file object."""
    buf = io.BytesIO() if fuse else f
    with warnings.catch_warnings():
        # torch >= 2.9 marks the TorchScript exporter deprecated; it is the one that honours
        # autograd.Function.symbolic.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        result = torch.onnx.export(
            model,
            args,
            buf,
            dynamo=False,
            opset_version=opset_version,
            custom_opsets={**CUSTOM_OPSETS, **(custom_opsets or {})},
            **kwargs,
        )
    if fuse:
        import onnx

        from ..fold import fold_affine, fuse_epilogue

        notes: list[str] = []
        data = fuse_epilogue(fold_affine(onnx.load_from_string(buf.getvalue())), notes).SerializeToString()
        for note in dict.fromkeys(notes):
            warnings.warn(f"onnxruntime_ep_mlu.torch.export: {note}", stacklevel=2)
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(data)
        else:
            f.write(data)
    return result

