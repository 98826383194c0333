"""``from_spconv``: a model written against spconv.pytorch (2.x) on this package's modules.

Replaced, recursively, keeping each module's name in its parent:

- ``SubMConv3d`` / ``SparseConv3d`` / ``SparseInverseConv3d`` by this package's, with the
  weight converted from spconv's [Cout, kd, kh, kw, Cin] to [kd, kh, kw, Cin, Cout] (a 1x1x1
  one as spconv computes it, its memory read as [Cin, Cout]), the bias,
  stride, padding, dilation and ``indice_key`` carried (a submanifold convolution's padding
  is not: spconv centres its kernel whatever the padding, as the contract does);
- ``SparseSequential`` by this package's, its BatchNorm1d / ReLU / ... children kept (they
  run on the features, as in spconv);
- ``ToDense`` by this package's; ``SparseIdentity`` by ``nn.Identity``.

A subclass of one of these (a user's ``class SubMConvBNReLU(spconv.SparseSequential)``, as in
spconv's quantisation examples, or of ``SubMConv3d``) converts as its spconv class does when
a call runs that class's own code; one that redefines ``forward`` (or ``_conv_forward``,
``__call__``) is an error naming it, as is one with forward hooks: the converted module would
run neither. Attributes such a subclass adds are not carried (the module is replaced).

Any other spconv module (pooling, transposed or grouped convolutions, fused activations,
quantisation, 1D/2D/4D), or a user's subclass of one, is an error naming the module's path
and class and why: nothing is skipped or half-converted. A user's own ``spconv.SparseModule``
subclass (CenterPoint's ``SparseBasicBlock``) is kept, its children converted, and marked as
taking the whole sparse tensor.

Indice keys are scoped as spconv 2.x scopes them (see :class:`~onnxruntime_ep_mlu.torch.SparseTensor`):
per tensor lineage, so sibling branches may reuse a key name.

The tensor type: the returned model runs the original ``forward`` with spconv's
``SparseConvTensor`` replaced by :class:`~onnxruntime_ep_mlu.torch.SparseTensor` (same first
four arguments, and ``features``, ``indices``, ``spatial_shape``, ``batch_size``,
``replace_feature``, ``dense``), both as ``spconv.pytorch.SparseConvTensor`` and where a module
defining one of the model's classes imported the class by name (other helper modules are not
patched); the replacement lasts for the call only, one call at a time in the process.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
import types

import torch
from torch import nn

from . import torch as mt

_LOCK = threading.RLock()
#: Nesting of converted models' calls in the thread holding _LOCK.
_DEPTH = 0


def _spconv():
    try:
        import spconv.pytorch as spt
    except ImportError as e:  # pragma: no cover - the converter needs the library it converts from
        raise ImportError(f"from_spconv needs spconv.pytorch (spconv 2.x): {e}") from e
    return spt


def _filter_hwio() -> bool:
    import spconv.pytorch.conv as conv

    return bool(getattr(conv, "FILTER_HWIO", False))


def _refuse(path: str, module: nn.Module, why: str):
    raise ValueError(f"from_spconv: {path or '<model>'} ({type(module).__module__}.{type(module).__name__}): {why}")


def _conv(path: str, m) -> nn.Module:
    """One spconv convolution as this package's."""
    if m.ndim != 3:
        _refuse(path, m, f"a {m.ndim}D convolution; the mluops operators are 3D")
    if m.groups != 1:
        _refuse(path, m, f"groups = {m.groups}; IndiceConv has no groups")
    if m.transposed:
        _refuse(path, m, "a transposed convolution; GetIndicePairs with transpose = 1 has no IndiceConv partner here")
    if int(m.act_type.value) != 0:
        _refuse(path, m, f"a fused activation ({m.act_type}); put it after the convolution")
    if getattr(m, "scale", 1.0) != 1.0 or getattr(m, "zero_point", 0) != 0:
        _refuse(path, m, "a quantised convolution")
    if tuple(m.weight.shape) != (m.out_channels, *m.kernel_size, m.in_channels):
        _refuse(path, m, f"weight of shape {tuple(m.weight.shape)}, not spconv's [Cout, kd, kh, kw, Cin]")
    bias = m.bias is not None
    if m.inverse and m.conv1x1:
        _refuse(path, m, "a 1x1x1 inverse convolution, which spconv runs as a plain 1x1 product on its input "
                         "sites, not as an inverse (spconv/pytorch/conv.py, the conv1x1 branch)")
    if m.inverse:
        ours = mt.SparseInverseConv3d(m.in_channels, m.out_channels, m.kernel_size, m.indice_key, bias=bias)
    elif m.subm:
        if any(s != 1 for s in m.stride):
            _refuse(path, m, f"a submanifold convolution with stride {m.stride}")
        if any(d * (k - 1) % 2 for k, d in zip(m.kernel_size, m.dilation)):
            _refuse(path, m, f"kernel {m.kernel_size} with dilation {m.dilation}: the contract's submanifold "
                             "convolution needs dilation * (kernel - 1) even on every axis")
        ours = mt.SubMConv3d(m.in_channels, m.out_channels, m.kernel_size, m.dilation, bias, m.indice_key)
    else:
        ours = mt.SparseConv3d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation,
                               bias, indice_key=m.indice_key)
    weight = m.weight.detach().permute(1, 2, 3, 4, 0)
    if m.conv1x1 and not _filter_hwio():
        # spconv 2.x runs a 1x1x1 convolution as features @ weight.view(Cin, Cout): the
        # weight's memory read as [Cin, Cout], whatever its [Cout, 1, 1, 1, Cin] shape says
        # (spconv/pytorch/conv.py, the conv1x1 branch, FILTER_HWIO False). Checkpoints hold
        # weights trained that way, so the converted layer reads them the same way.
        weight = m.weight.detach().reshape(1, 1, 1, m.in_channels, m.out_channels)
    with torch.no_grad():
        ours.weight.copy_(weight)
        if bias:
            ours.bias.copy_(m.bias.detach())
    return ours.train(m.training)


def _sequential(path: str, m, spt) -> nn.Module:
    out = mt.SparseSequential()
    for name, child in m.named_children():
        out.add_module(name, _convert(f"{path}.{name}" if path else name, child, spt))
    return out


def _converters(spt):
    """spconv's classes this package carries, each with its conversion: a subclass of one
    converts as the class does when it runs the class's forward (see ``_overrides``)."""
    return (
        (spt.conv.SparseConvolution, lambda path, m, spt: _conv(path, m)),
        (spt.SparseSequential, _sequential),
        (spt.ToDense, lambda path, m, spt: mt.ToDense()),
        (spt.SparseIdentity, lambda path, m, spt: nn.Identity()),
    )


#: What a module runs when called: a class redefining one of these runs its own code.
_RUNS = ("forward", "_conv_forward", "__call__", "_call_impl")


def _overrides(m: nn.Module, base: type) -> str | None:
    """Where ``m``'s class (or a class between it and spconv's ``base``) redefines how a
    call runs, as ``"forward (in pkg.Class)"``; None when a call runs ``base``'s code."""
    for klass in type(m).__mro__:
        if klass is base:
            return None
        names = [n for n in _RUNS if n in vars(klass)]
        if names:
            return f"{' and '.join(names)} (in {_name(klass)})"
    return None


def _name(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def _spconv_class(m: nn.Module, spt) -> type | None:
    """The first spconv class among ``m``'s classes, other than ``SparseModule`` (the
    placeholder base spconv gives users' own sparse modules)."""
    for klass in type(m).__mro__:
        if klass.__module__.startswith("spconv.") and klass is not spt.SparseModule:
            return klass
    return None


def _convert(path: str, m: nn.Module, spt) -> nn.Module:
    for base, convert_one in _converters(spt):
        if isinstance(m, base):
            runs = _overrides(m, base)
            if runs is not None:
                # Its forward is the user's code written against spconv's tensor and modules:
                # nothing proves it equal to the base's, so it is not converted in part.
                klass = _spconv_class(m, spt)
                sub = "" if klass is type(m) else f"a subclass of {_name(klass)} that "
                _refuse(path, m, f"{sub}redefines {runs}: only a class running {_name(base)}'s own forward "
                                 "converts (a module with its own forward derived from spconv.SparseModule "
                                 "instead is kept, its children converted)")
            if m._forward_hooks or m._forward_pre_hooks:
                _refuse(path, m, "forward hooks are registered on it; the converted module would not run them")
            return convert_one(path, m, spt).train(m.training)
    klass = _spconv_class(m, spt)
    if klass is not None:
        sub = "" if klass is type(m) else f"a subclass of {_name(klass)}: "
        _refuse(path, m, f"{sub}no mluops counterpart (GetIndicePairs + IndiceConv cover the 3D convolutions; "
                         "SparseSequential, ToDense and SparseIdentity are carried)")
    for name, child in list(m.named_children()):
        setattr(m, name, _convert(f"{path}.{name}" if path else name, child, spt))
    if isinstance(m, spt.SparseModule):
        # A user's own sparse module: the sequential containers hand it the whole tensor.
        m.takes_sparse = True
    return m


@contextlib.contextmanager
def _sparse_tensor_for(model: nn.Module, spt):
    """spconv's SparseConvTensor read as this package's SparseTensor while the block runs:
    on spconv.pytorch and in every module namespace of the model's classes that bound it.
    One call at a time (a process-wide lock, re-entrant for nested converted models): the
    class being replaced is spconv.pytorch.core's, which is never patched, so every call
    restores it, whatever ran before or raised. Other threads' use of spconv.pytorch during
    a call sees this package's class."""
    import spconv.pytorch.core as core

    global _DEPTH
    cls = core.SparseConvTensor
    with _LOCK:
        if _DEPTH:  # a converted model inside another's call: already replaced
            _DEPTH += 1
            try:
                yield
            finally:
                _DEPTH -= 1
            return
        spaces = {id(spt): vars(spt)}
        for m in model.modules():
            for klass in type(m).__mro__:
                mod = sys.modules.get(klass.__module__)
                if mod is not None and not klass.__module__.startswith(("torch.", "spconv.")):
                    spaces[id(mod)] = vars(mod)
        bound = [(ns, name) for ns in spaces.values() for name, v in list(ns.items()) if v is cls]
        for ns, name in bound:
            ns[name] = mt.SparseTensor
        _DEPTH = 1
        try:
            yield
        finally:
            _DEPTH = 0
            for ns, name in bound:
                ns[name] = cls


class FromSpconv(nn.Module):
    """A converted spconv model: its ``forward`` with spconv's tensor type replaced."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        with _sparse_tensor_for(self.model, _spconv()):
            return self.model(*args, **kwargs)


def convert(model: nn.Module) -> nn.Module:
    """See the module's documentation: a converted copy of ``model`` (which is left as it
    is), wrapped in :class:`FromSpconv`."""
    spt = _spconv()
    # Python modules a model keeps as attributes (``self.spt = spconv.pytorch``) are shared,
    # not copied (they cannot be).
    keep = {id(v): v for m in model.modules() for v in vars(m).values() if isinstance(v, types.ModuleType)}
    root = _convert("", copy.deepcopy(model, keep), spt)
    if any(_spconv_class(m, spt) is not None for m in root.modules()):
        raise AssertionError("from_spconv left an spconv module in place")
    return FromSpconv(root).train(model.training)
