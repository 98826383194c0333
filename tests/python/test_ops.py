"""The five mluops operators through onnxruntime sessions, against numpy references written
from docs/CONTRACT.md (independent of the Rust kernels).

Accuracy classes of the contract: exact (index outputs, DynamicScatterBackward) compares
equal; accumulating compares diff1 and diff2 <= 3e-3 against a float64 reference."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import assert_accumulating
from reference import (
    dsb_inputs,
    dsb_reference,
    gip_reference,
    gip_sites,
    prp_inputs,
    prp_reference,
    tib_reference,
    vpf_inputs,
    vpf_reference,
)


# Shapes and configurations of the parametrised tests.
DSB_SIZES = [
    (40, 10, 5, None),
    (120, 30, 8, None),
    (7, 3, 1, None),
    (50, 12, 4, 7),
    (20, 6, 3, 0),
    (0, 4, 3, None),
    (6, 0, 2, None),
    (6, 4, 0, None),
    (0, 0, 0, None),
]
TIB_SIZES = [
    (2, 3, 5, 4),
    (1, 4, 16, 8),
    (3, 2, 7, 1),
    (2, 5, 600, 2),
    (1, 1, 1, 1),
    (0, 3, 4, 5),
    (2, 0, 4, 5),
    (2, 3, 0, 5),
    (2, 3, 0, 0),
    (0, 0, 0, 0),
]
# (name, batch, spatial, kernel, stride, padding, dilation, output_padding, subm, transpose, L, duplicates)
GIP_CONFIGS = [
    ("subm_k3", 2, (4, 5, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), 1, 0, 30, 0),
    ("subm_k3_dilation2", 1, (5, 6, 7), (3, 3, 3), (1, 1, 1), (2, 2, 2), (2, 2, 2), (0, 0, 0), 1, 0, 40, 0),
    ("subm_k133", 3, (1, 6, 6), (1, 3, 3), (1, 1, 1), (0, 1, 1), (1, 1, 1), (0, 0, 0), 1, 0, 20, 0),
    ("subm_k531", 1, (6, 5, 4), (5, 3, 1), (1, 1, 1), (2, 1, 0), (1, 1, 1), (0, 0, 0), 1, 0, 25, 0),
    ("conv_k3_s2_dup", 2, (5, 6, 7), (3, 3, 3), (2, 2, 2), (0, 1, 1), (1, 1, 1), (0, 0, 0), 0, 0, 40, 6),
    ("conv_k3_d2", 1, (7, 7, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (2, 2, 2), (0, 0, 0), 0, 0, 30, 0),
    ("conv_k231_s123", 2, (6, 8, 9), (2, 3, 1), (1, 2, 3), (0, 0, 0), (1, 1, 1), (0, 0, 0), 0, 0, 35, 3),
    ("conv_empty", 2, (5, 5, 5), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (0, 0, 0), 0, 0, 0, 0),
    ("transpose_k3_s2", 1, (3, 4, 5), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (1, 0, 1), 0, 1, 20, 2),
    ("transpose_k2_s2", 2, (4, 4, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1), (0, 0, 0), 0, 1, 30, 0),
    ("transpose_k3_s1", 1, (3, 3, 3), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), 0, 1, 10, 0),
]
VPF_SIZES = [
    (2, 50, 3, 4, 5, 2),
    (1, 200, 8, 6, 3, 1),
    (3, 17, 1, 1, 1, 1),
    (1, 0, 3, 4, 4, 1),
    (2, 30, 0, 3, 3, 1),
    (0, 10, 2, 3, 3, 1),
]
PRP_CONFIGS = [
    (6, 3, 2, 2, 10, 12, 0.5),
    (5, 2, 3, 1, 7, 9, 1.0),
    (8, 3, 1, 3, 14, 14, 0.0625),
    (4, 1, 4, 2, 5, 5, 0.3),
    (7, 4, 2, 1, 9, 6, 0.7),
    (0, 2, 2, 2, 4, 4, 1.0),
]


def ints(*v):
    return {"ints": list(v)}


def int_(v):
    return {"int": int(v)}


# =============================================================================
# DynamicScatterBackward (exact)
# =============================================================================
@pytest.mark.parametrize("mode", ["max", "mean", "sum"])
@pytest.mark.parametrize(
    "n,m,c,v", DSB_SIZES, ids=[f"N{n}_M{m}_C{c}" + (f"_V{v}" if v is not None else "") for n, m, c, v in DSB_SIZES]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_dynamic_scatter_backward_matches_reference_exactly(harness, mode, n, m, c, v, seed):
    rng = np.random.default_rng(1000 * seed + n + 7 * m + 31 * c)
    feeds = dsb_inputs(rng, n, m, c, mode, v)
    (out,) = harness.run("DynamicScatterBackward", {"reduce_type": {"string": mode}}, feeds)
    ref = dsb_reference(
        feeds["grad_voxel_feats"],
        feeds["feats"],
        feeds["voxel_feats"],
        feeds["point2voxel_map"],
        feeds["voxel_points_count"],
        mode,
    )
    assert out.dtype == np.float32 and out.shape == (n, c)
    np.testing.assert_array_equal(out, ref)


def test_dynamic_scatter_backward_default_reduce_is_max(harness):
    feeds = dsb_inputs(np.random.default_rng(5), 30, 8, 4, "max")
    (out,) = harness.run("DynamicScatterBackward", {}, feeds)
    np.testing.assert_array_equal(out, dsb_reference(*feeds.values(), "max"))


# =============================================================================
# ThreeInterpolateBackward (accumulating; float16 accumulates in float32)
# =============================================================================
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("b,c,n,m", TIB_SIZES, ids=[f"B{b}_C{c}_N{n}_M{m}" for b, c, n, m in TIB_SIZES])
@pytest.mark.parametrize("seed", [0, 1])
def test_three_interpolate_backward_matches_float64_reference(harness, dtype, b, c, n, m, seed):
    rng = np.random.default_rng(100 * seed + b + 3 * c + 5 * n + 11 * m)
    go = rng.standard_normal((b, c, n)).astype(dtype)
    idx = rng.integers(0, max(m, 1), (b, n, 3)).astype(np.int32)
    w = rng.random((b, n, 3)).astype(dtype)
    (out,) = harness.run("ThreeInterpolateBackward", {"m": int_(m)}, {"grad_output": go, "indices": idx, "weights": w})
    assert out.dtype == dtype and out.shape == (b, c, m)
    assert_accumulating(out, tib_reference(go, idx, w, m), f"grad_features {np.dtype(dtype).name}")


def test_three_interpolate_backward_float16_accumulates_in_float32(harness):
    """Many small float16 products onto one source point: float16 accumulation would stall
    (1 + 2^-11 rounds back to 1), float32 accumulation keeps them."""
    n = 4096
    go = np.ones((1, 1, n), np.float16)
    idx = np.zeros((1, n, 3), np.int32)
    w = np.full((1, n, 3), 2.0**-11, np.float16)
    (out,) = harness.run("ThreeInterpolateBackward", {"m": int_(1)}, {"grad_output": go, "indices": idx, "weights": w})
    assert out.dtype == np.float16
    assert_accumulating(out, tib_reference(go, idx, w, 1), "float16 accumulation")


#: Outputs of 4 MiB or more, rows on 64-byte lines (onnxruntime's buffers start on one):
#: written back with non-temporal stores, whole lines, then plainly for a last partial tile
#: (float32) and the 4 channels past the last whole 8-lane group (C 20 and 36).
STREAMED = [(np.float32, 20, 65536 + 48), (np.float16, 36, 65536 + 96)]


@pytest.mark.parametrize("dtype,c,length", STREAMED, ids=["float32", "float16"])
def test_three_interpolate_streamed_output_is_the_formula_exactly(harness, dtype, c, length):
    """Each output is (f[i0] * w0 + f[i1] * w1) + f[i2] * w2 in float32, rounded once."""
    rng = np.random.default_rng(c)
    m = 100
    f = rng.standard_normal((1, c, m)).astype(dtype)
    idx = rng.integers(0, m, (1, length, 3)).astype(np.int32)
    w = rng.random((1, length, 3)).astype(dtype)
    (out,) = harness.run("ThreeInterpolate", {}, {"features": f, "indices": idx, "weights": w})
    f32, w32 = f[0].astype(np.float32), w[0].astype(np.float32)
    t = [f32[:, idx[0, :, k]] * w32[:, k] for k in range(3)]
    assert out.dtype == dtype and out.nbytes >= 4 << 20
    np.testing.assert_array_equal(out[0], ((t[0] + t[1]) + t[2]).astype(dtype))


@pytest.mark.parametrize("dtype,c,length", STREAMED, ids=["float32", "float16"])
def test_three_interpolate_backward_streamed_output_sums_in_the_contracts_order(harness, dtype, c, length):
    """Each accumulator adds its float32 terms in (n, k) order (np.add.at applies them in
    index order), rounded once."""
    rng = np.random.default_rng(c + 1)
    n, m = 3000, length
    go = rng.standard_normal((1, c, n)).astype(dtype)
    idx = rng.integers(0, m, (1, n, 3)).astype(np.int32)
    w = rng.random((1, n, 3)).astype(dtype)
    (out,) = harness.run("ThreeInterpolateBackward", {"m": int_(m)}, {"grad_output": go, "indices": idx, "weights": w})
    terms = go[0].astype(np.float32)[:, np.repeat(np.arange(n), 3)] * w[0].astype(np.float32).reshape(-1)
    want = np.zeros((c, m), np.float32)
    np.add.at(want, (slice(None), idx[0].reshape(-1)), terms)
    assert out.dtype == dtype and out.nbytes >= 4 << 20
    np.testing.assert_array_equal(out[0], want.astype(dtype))


# =============================================================================
# GetIndicePairs (exact)
# =============================================================================
@pytest.mark.parametrize("cfg", GIP_CONFIGS, ids=[c[0] for c in GIP_CONFIGS])
@pytest.mark.parametrize("seed", [0, 1])
def test_get_indice_pairs_matches_reference_exactly(harness, cfg, seed):
    name, batch, spatial, k, s, p, d, op, subm, transpose, count, dup = cfg
    rng = np.random.default_rng(seed * 7919 + len(name))
    indices = gip_sites(rng, batch, spatial, count, dup)
    attrs = {
        "batch_size": int_(batch),
        "spatial_shape": ints(*spatial),
        "kernel_size": ints(*k),
        "stride": ints(*s),
        "padding": ints(*p),
        "dilation": ints(*d),
        "output_padding": ints(*op),
        "subm": int_(subm),
        "transpose": int_(transpose),
        "inverse": int_(0),
    }
    pairs, out_indices, num = harness.run("GetIndicePairs", attrs, {"indices": indices})
    ref_pairs, ref_out, ref_num = gip_reference(indices, batch, spatial, k, s, p, d, op, subm, transpose)
    assert pairs.dtype == out_indices.dtype == num.dtype == np.int32
    np.testing.assert_array_equal(num, ref_num, err_msg="indice_num")
    np.testing.assert_array_equal(out_indices, ref_out, err_msg="out_indices")
    np.testing.assert_array_equal(pairs, ref_pairs, err_msg="indice_pairs")
    if subm and len(indices):
        # the centre offset pairs every site with itself
        centre = ((k[0] // 2) * k[1] + k[1] // 2) * k[2] + k[2] // 2
        assert num[centre] == len(indices)


def test_get_indice_pairs_default_attributes_are_a_plain_conv(harness):
    rng = np.random.default_rng(3)
    indices = gip_sites(rng, 1, (4, 4, 4), 12)
    attrs = {"batch_size": int_(1), "spatial_shape": ints(4, 4, 4), "kernel_size": ints(2, 2, 2)}
    got = harness.run("GetIndicePairs", attrs, {"indices": indices})
    ref = gip_reference(indices, 1, (4, 4, 4), (2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1), (0, 0, 0), 0, 0)
    for g, r, what in zip(got, ref, ["indice_pairs", "out_indices", "indice_num"]):
        np.testing.assert_array_equal(g, r, err_msg=what)


# =============================================================================
# VoxelPoolingForward (accumulating; pos_memo exact; bit-identical across threads)
# =============================================================================
@pytest.mark.parametrize(
    "b,n,c,nx,ny,nz", VPF_SIZES, ids=[f"B{b}_N{n}_C{c}_v{nx}x{ny}x{nz}" for b, n, c, nx, ny, nz in VPF_SIZES]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_voxel_pooling_forward_matches_reference(harness, b, n, c, nx, ny, nz, seed):
    rng = np.random.default_rng(seed * 131 + n + c)
    feeds = vpf_inputs(rng, b, n, c, nx, ny, nz)
    out, pos = harness.run("VoxelPoolingForward", {"voxel_num": ints(nx, ny, nz)}, feeds)
    ref_out, ref_pos = vpf_reference(feeds["geom_xyz"], feeds["input_features"], nx, ny, nz)
    assert out.dtype == np.float32 and out.shape == (b, ny, nx, c)
    np.testing.assert_array_equal(pos, ref_pos, err_msg="pos_memo")
    assert_accumulating(out, ref_out, "output_features")


def _vpf_big(seed=11):
    # ~40 points per cell over a wide range of magnitudes: any change of summation order
    # changes the float32 bits
    rng = np.random.default_rng(seed)
    return vpf_inputs(rng, 2, 20000, 8, 16, 16, 1, spread=3.0)


def _bits(arrays):
    return [a.tobytes() for a in arrays]


def test_voxel_pooling_forward_bit_identical_across_thread_counts_and_runs(harness):
    feeds = _vpf_big()
    attrs = {"voxel_num": ints(16, 16, 1)}
    results = {}
    for threads in (1, 2, 4):
        sess = harness.session("VoxelPoolingForward", attrs, feeds, intra_threads=threads)
        first, second = sess.run(None, feeds), sess.run(None, feeds)
        assert _bits(first) == _bits(second), f"two runs with intra_op_num_threads={threads} differ"
        results[threads] = first
    for threads in (2, 4):
        assert _bits(results[threads]) == _bits(results[1]), f"intra_op_num_threads={threads} differs from 1"
    ref_out, ref_pos = vpf_reference(feeds["geom_xyz"], feeds["input_features"], 16, 16, 1)
    np.testing.assert_array_equal(results[1][1], ref_pos)
    assert_accumulating(results[1][0], ref_out, "output_features")


def test_voxel_pooling_forward_concurrent_runs_of_one_session_agree(harness):
    feeds = _vpf_big(seed=12)
    sess = harness.session("VoxelPoolingForward", {"voxel_num": ints(16, 16, 1)}, feeds, intra_threads=2)
    expected = _bits(sess.run(None, feeds))
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda _: _bits(sess.run(None, feeds)), range(8)))
    for i, got in enumerate(runs):
        assert got == expected, f"concurrent run {i} differs from the serial run"


def test_voxel_pooling_forward_nan_and_inf_propagate(harness):
    geom = np.array([[[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]]], np.int32)
    feats = np.array([[[np.nan, 1], [2, 3], [np.inf, -np.inf], [1, 1]]], np.float32)
    out, _ = harness.run(
        "VoxelPoolingForward", {"voxel_num": ints(2, 2, 1)}, {"geom_xyz": geom, "input_features": feats}
    )
    assert np.isnan(out[0, 0, 0, 0]) and out[0, 0, 0, 1] == 4
    assert out[0, 0, 1, 0] == np.inf and out[0, 0, 1, 1] == -np.inf
    assert np.all(out[0, 1, 0] == 0) and np.all(out[0, 1, 1] == 1)


# =============================================================================
# PsRoiPoolBackward (accumulating; bin limits in float32, one rounding per operation)
# =============================================================================
@pytest.mark.parametrize(
    "cfg", PRP_CONFIGS, ids=[f"R{c[0]}_p{c[1]}_od{c[2]}_b{c[3]}_{c[4]}x{c[5]}_s{c[6]}" for c in PRP_CONFIGS]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_psroipool_backward_matches_reference(harness, cfg, seed):
    r, ph, od, nb, h, w, scale = cfg
    rng = np.random.default_rng(seed * 977 + r * 13 + ph)
    feeds = prp_inputs(rng, r, ph, od, nb, h, w, scale)
    attrs = {
        "pooled_height": int_(ph),
        "pooled_width": int_(ph),
        "spatial_scale": {"float": scale},
        "output_dim": int_(od),
    }
    (out,) = harness.run("PsRoiPoolBackward", attrs, feeds)
    ref = prp_reference(
        feeds["top_grad"], feeds["rois"], feeds["mapping_channel"], feeds["bottom_shape"], ph, ph, scale, od
    )
    assert out.dtype == np.float32 and out.shape == tuple(feeds["bottom_shape"])
    assert_accumulating(out, ref, "bottom_grad")


def test_psroipool_backward_bins_use_float32_arithmetic(harness):
    """A bin edge where float32 and float64 arithmetic disagree: with scale 0.1f the roi end is
    (9 + 1) * 0.1f, which rounds to exactly 1.0 in float32 (ceil -> 1, one pixel) but is
    1.0000000149 in float64 (ceil -> 2, four pixels). The contract computes in float32."""
    feeds = {
        "top_grad": np.array([[[[1.0]]]], np.float32),
        "rois": np.array([[0, 0, 0, 9, 9]], np.float32),
        "mapping_channel": np.zeros((1, 1, 1, 1), np.int32),
        "bottom_shape": np.array([1, 3, 3, 1], np.int64),
    }
    attrs = {"pooled_height": int_(1), "pooled_width": int_(1), "spatial_scale": {"float": 0.1}, "output_dim": int_(1)}
    (out,) = harness.run("PsRoiPoolBackward", attrs, feeds)
    expected = np.zeros((1, 3, 3, 1), np.float32)
    expected[0, 0, 0, 0] = 1.0
    ref = prp_reference(feeds["top_grad"], feeds["rois"], feeds["mapping_channel"], feeds["bottom_shape"], 1, 1, 0.1, 1)
    np.testing.assert_array_equal(ref, expected)  # the reference itself follows float32
    np.testing.assert_array_equal(out, expected)
