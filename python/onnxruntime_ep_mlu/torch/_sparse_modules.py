"""The spconv-like sparse modules built on GetIndicePairs and IndiceConv."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ._common import _as_i32, _ints
from ._sparse_conv import _conv_geometry, _ConvGeometry, get_indice_pairs, indice_conv


@dataclass
class Rulebook:
    """A GetIndicePairs result, kept so that later layers can reuse it (``indice_key``)."""

    indice_pairs: Tensor
    out_indices: Tensor
    indice_num: Tensor
    in_indices: Tensor
    geometry: _ConvGeometry

    @property
    def in_spatial_shape(self) -> tuple[int, int, int]:
        return self.geometry.spatial_shape

    @property
    def out_spatial_shape(self) -> tuple[int, int, int]:
        return self.geometry.out_shape()

    def applies_to(self, indices: Tensor) -> bool:
        """Whether the rulebook was built for these sites (a submanifold one also serves
        its own output sites, which are its input sites)."""
        return indices is self.in_indices or (bool(self.geometry.subm) and indices is self.out_indices)


@dataclass
class SparseTensor:
    """Active sites of a batch of 3D grids: ``features`` [L, C] and ``indices`` int32
    [L, 4] = (batch, z, y, x), with the grid's (D, H, W) and the batch size.
    ``rulebooks`` holds the rulebooks stored under an ``indice_key`` upstream of this tensor,
    scoped as spconv 2.x scopes its ``indice_dict``: a convolution's output carries a copy of
    its input's with its own key added, ``replace_feature`` carries it as it is (spconv
    2.3.8, spconv/pytorch/conv.py ``_conv_forward``: ``indice_dict =
    input.indice_dict.copy()``; core.py ``replace_feature``), so a key stored in one branch
    is not seen by a sibling branch from the same tensor. ``built`` holds every rulebook
    built from the root tensor, keyed or not, shared by all tensors derived from it: a cache
    of GetIndicePairs results by sites and geometry (:meth:`find_rulebook`)."""

    features: Tensor
    indices: Tensor
    spatial_shape: tuple[int, int, int]
    batch_size: int
    rulebooks: dict[str, Rulebook] = field(default_factory=dict)
    built: list[Rulebook] = field(default_factory=list)

    def __post_init__(self):
        # spconv's SparseConvTensor takes the grid as a list or an array, and int64 sites.
        self.spatial_shape = tuple(int(v) for v in self.spatial_shape)
        self.batch_size = int(self.batch_size)
        self.indices = _as_i32(self.indices)

    def replace_feature(self, features: Tensor) -> SparseTensor:
        return self._with(features, self.indices, self.spatial_shape)

    def dense(self, channels_first: bool = True) -> Tensor:
        """The features on the full grid, zero where no site is active: [B, C, D, H, W]
        (``channels_first``, as spconv's ``dense()``) or [B, D, H, W, C]."""
        d, h, w = self.spatial_shape
        c = _weight_shape(self.features)[1]
        idx = self.indices.long()
        cell = ((idx[:, 0] * d + idx[:, 1]) * h + idx[:, 2]) * w + idx[:, 3]
        grid = self.features.new_zeros(self.batch_size * d * h * w, c).index_put((cell,), self.features)
        grid = grid.view(self.batch_size, d, h, w, c)
        return grid.permute(0, 4, 1, 2, 3).contiguous() if channels_first else grid

    def _with(self, features: Tensor, indices: Tensor, spatial_shape, rulebooks=None) -> SparseTensor:
        rulebooks = self.rulebooks if rulebooks is None else rulebooks
        return SparseTensor(features, indices, tuple(spatial_shape), self.batch_size, rulebooks, self.built)

    def find_rulebook(self, geometry) -> Rulebook | None:
        """A rulebook already built for these very sites (the same ``indices`` tensor) and
        this geometry, keyed or not: GetIndicePairs is a function of the two, so a layer
        without an ``indice_key`` reuses it rather than building (and exporting) it again,
        as mmdet3d's SparseBasicBlocks would otherwise do for each convolution."""
        for book in self.built:
            if book.geometry == geometry and book.applies_to(self.indices):
                return book
        return None


def _weight_shape(weight: Tensor) -> tuple[int, ...]:
    """A weight's shape as Python ints (under tracing, sizes are traced values; a
    parameter's shape is fixed for the model, so reading it as constants is correct)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return tuple(int(v) for v in weight.shape)


def sparse_conv3d(
    x: SparseTensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    subm: bool = False,
    indice_key: str | None = None,
) -> SparseTensor:
    """A sparse 3D convolution: GetIndicePairs then IndiceConv. ``weight`` is
    [kd, kh, kw, Cin, Cout] (mmcv's layout). A submanifold rulebook stored under
    ``indice_key`` upstream of ``x`` is reused by a submanifold layer of the same geometry
    (one GetIndicePairs node for both), as spconv reuses it; any other layer finding its key
    upstream is an error, as in spconv. A rulebook built earlier for the same sites and
    geometry, keyed or not, in any branch, is reused too. The output carries ``x``'s keys
    and this layer's (see :class:`SparseTensor`)."""
    kd, kh, kw, c_in, c_out = _weight_shape(weight)
    geo = _conv_geometry(
        x.batch_size,
        x.spatial_shape,
        (kd, kh, kw),
        _ints("GetIndicePairs", "stride", stride),
        _ints("GetIndicePairs", "padding", padding),
        _ints("GetIndicePairs", "dilation", dilation),
        (0, 0, 0),
        int(subm),
        0,
    )
    stored = x.rulebooks.get(indice_key) if indice_key is not None else None
    if stored is not None and not (subm and stored.geometry.subm):
        # spconv 2.3.8 conv.py, _conv_forward: "only support reuse subm indices".
        raise ValueError(
            f"indice_key {indice_key!r}: a {'submanifold' if stored.geometry.subm else 'non-submanifold'} "
            f"convolution upstream of this {'submanifold' if subm else 'non-submanifold'} one stored it; spconv "
            "reuses a key only between submanifold convolutions (give this layer another key)"
        )
    if stored is not None and stored.geometry != geo:
        # spconv 2.3.8 conv.py, _check_subm_reuse_valid: same kernel, dilation and grid.
        raise ValueError(
            f"indice_key {indice_key!r}: stored rulebook has geometry {stored.geometry}, this layer {geo}; "
            "spconv reuses a key only with the same kernel, dilation and spatial shape"
        )
    book = stored if stored is not None and stored.applies_to(x.indices) else x.find_rulebook(geo)
    if book is None:
        pairs, out_indices, num = get_indice_pairs(
            x.indices,
            geo.batch_size,
            geo.spatial_shape,
            geo.kernel_size,
            geo.stride,
            geo.padding,
            geo.dilation,
            subm=subm,
        )
        book = Rulebook(pairs, out_indices, num, x.indices, geo)
        x.built.append(book)
    rulebooks = x.rulebooks
    if indice_key is not None and stored is None:
        rulebooks = {**rulebooks, indice_key: book}
    out = indice_conv(
        x.features,
        weight.reshape(kd * kh * kw, c_in, c_out),
        book.indice_pairs,
        book.indice_num,
        book.out_indices,
        bias,
    )
    return x._with(out, book.out_indices, book.out_spatial_shape, rulebooks)


class SparseConv3d(nn.Module):
    """A sparse 3D convolution layer (spconv / mmcv ``SparseConv3d``; ``subm=True`` for
    ``SubMConv3d``) over :class:`SparseTensor`. Weight [kd, kh, kw, Cin, Cout]."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        bias: bool = True,
        subm: bool = False,
        indice_key: str | None = None,
    ):
        super().__init__()
        self.kernel_size = tuple(_ints("SparseConv3d", "kernel_size", kernel_size))
        self.stride = tuple(_ints("SparseConv3d", "stride", stride))
        self.padding = tuple(_ints("SparseConv3d", "padding", padding))
        self.dilation = tuple(_ints("SparseConv3d", "dilation", dilation))
        self.subm = bool(subm)
        self.indice_key = indice_key
        self.weight = nn.Parameter(torch.empty(*self.kernel_size, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        fan_in = self.weight.shape[3] * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return sparse_conv3d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.subm, self.indice_key
        )


class SubMConv3d(SparseConv3d):
    """Submanifold sparse 3D convolution (output sites = input sites); padding defaults to
    dilation*(k-1)/2, the only one the contract allows."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        dilation=1,
        bias: bool = True,
        indice_key: str | None = None,
    ):
        k = _ints("SubMConv3d", "kernel_size", kernel_size)
        d = _ints("SubMConv3d", "dilation", dilation)
        super().__init__(
            in_channels,
            out_channels,
            k,
            1,
            [di * (ki - 1) // 2 for ki, di in zip(k, d)],
            d,
            bias,
            subm=True,
            indice_key=indice_key,
        )


class SparseInverseConv3d(nn.Module):
    """Inverse of the SparseConv3d that stored its rulebook under ``indice_key``: maps the
    features of that layer's output sites back to its input sites (IndiceConv with
    ``inverse=1``). Weight [kd, kh, kw, Cin, Cout] in the same offset order."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, indice_key: str, bias: bool = True):
        super().__init__()
        self.kernel_size = tuple(_ints("SparseInverseConv3d", "kernel_size", kernel_size))
        self.indice_key = indice_key
        self.weight = nn.Parameter(torch.empty(*self.kernel_size, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        SparseConv3d.reset_parameters(self)

    def forward(self, x: SparseTensor) -> SparseTensor:
        key = self.indice_key
        book = x.rulebooks.get(key)
        if book is None:
            raise KeyError(
                f"SparseInverseConv3d: no rulebook under indice_key {key!r} upstream of its input (keys are "
                f"scoped per tensor lineage, as in spconv: only a convolution this input derives from counts; "
                f"keys there: {sorted(x.rulebooks)})"
            )
        kd, kh, kw, c_in, c_out = _weight_shape(self.weight)
        # The checks of spconv 2.3.8 conv.py (_conv_forward, _check_inverse_reuse_valid).
        if book.geometry.subm:
            raise ValueError(f"SparseInverseConv3d: indice_key {key!r} names a submanifold convolution's rulebook")
        if book.geometry.kernel_volume != kd * kh * kw:
            raise ValueError("SparseInverseConv3d: kernel size differs from the forward convolution's")
        if x.spatial_shape != book.out_spatial_shape:
            raise ValueError(
                f"SparseInverseConv3d: indice_key {key!r}: input grid {x.spatial_shape}, the forward "
                f"convolution's output grid {book.out_spatial_shape}"
            )
        if not torch.jit.is_tracing() and x.indices.shape[0] != book.out_indices.shape[0]:
            raise ValueError(
                f"SparseInverseConv3d: indice_key {key!r}: input has {x.indices.shape[0]} sites, the forward "
                f"convolution's output {book.out_indices.shape[0]}"
            )
        out = indice_conv(
            x.features,
            self.weight.reshape(kd * kh * kw, c_in, c_out),
            book.indice_pairs,
            book.indice_num,
            book.in_indices,
            self.bias,
            inverse=True,
        )
        return x._with(out, book.in_indices, book.in_spatial_shape)


class SparseSequential(nn.Sequential):
    """spconv's ``SparseSequential`` over :class:`SparseTensor`: a sparse module (a
    convolution, or any module given the whole tensor, see ``_takes_sparse``) is called with
    the tensor, any other (BatchNorm1d, ReLU, ...) with its features."""

    def forward(self, x):
        for module in self:
            if _takes_sparse(module) or not isinstance(x, SparseTensor):
                x = module(x)
            elif _weight_shape(x.indices)[0] != 0:
                x = x.replace_feature(module(x.features))
        return x


class ToDense(nn.Module):
    """spconv's ``ToDense``: :meth:`SparseTensor.dense`, channels first."""

    def forward(self, x: SparseTensor) -> Tensor:
        return x.dense()


def _takes_sparse(module: nn.Module) -> bool:
    """Whether ``module`` takes a whole :class:`SparseTensor` (this package's sparse modules,
    or a module marked ``takes_sparse``, as :func:`from_spconv` marks spconv's)."""
    return isinstance(module, (SparseConv3d, SparseInverseConv3d, SparseSequential, ToDense)) or getattr(
        module, "takes_sparse", False
    )


def from_spconv(model: nn.Module) -> nn.Module:
    """``model`` with spconv.pytorch's modules and tensor type replaced by this package's
    (see ``onnxruntime_ep_mlu._spconv``), ready for :func:`export`."""
    from .._spconv import convert

    return convert(model)
