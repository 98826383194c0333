#!/usr/bin/env python3
"""Peer benchmark: our mluops.GetIndicePairs against spconv 2.3.8's CPU rulebook generation.

Both run on the same indices in one process, at the two seed network scales of
docs/CONTRACT.md §4.6. The rulebooks are checked in the same run -- against each other
and against a numpy evaluation of the contract -- as *sets* of
(kernel offset, input site, output site), because the two implementations number their
output rows differently. Any mismatch exits non-zero; speed ratios are only reported.

Install (bench-only requirements, into the project venv; no torch needed):
    source scripts/setup.sh
    "$VENV/bin/pip" install --no-deps -r scripts/requirements-spconv.txt
    cargo build --release --lib
    "$VENV/bin/python" benches/spconv_peer.py            # --sites lidar, --repeat N

The library is $MLU_EP_LIB, else target/release/libonnxruntime_ep_mlu.so.

spconv side: spconv.core_cc.csrc.sparse.all.SpconvOps.get_indice_pairs -- the C++ entry
that spconv.pytorch.ops.get_indice_pairs calls for CPU tensors (SPCONV_CPP_INDICE_PAIRS,
spconv's default). It only needs an ExternalAllocator, which we implement over numpy, so
torch is never imported. For CPU indices it dispatches to the serial C++ functions
SpconvOps.generate_conv_inds_cpu / generate_subm_conv_inds_cpu.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALL_HINT = (
    "install the bench requirements into the project venv:\n"
    "    source scripts/setup.sh\n"
    '    "$VENV/bin/pip" install --no-deps -r scripts/requirements-spconv.txt\n'
    'then run  "$VENV/bin/python" benches/spconv_peer.py'
)

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError as e:  # the project venv always has these (scripts/setup.sh)
    sys.exit(f"spconv_peer: {e}; run it with the project venv's python.\n{INSTALL_HINT}")
try:
    from cumm import tensorview as tv
    from spconv.core import ConvAlgo
    from spconv.core_cc.csrc.sparse.all import SpconvOps
    from spconv.core_cc.csrc.sparse.alloc import ExternalAllocator
except ImportError as e:
    sys.exit(f"spconv_peer: spconv is not installed ({e});\n{INSTALL_HINT}")

SEED = 20240607
REPEAT = 5


@dataclass(frozen=True)
class Config:
    name: str
    L: int
    batch: int
    spatial: tuple[int, int, int]
    ksize: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    subm: bool

    @property
    def K(self) -> int:
        return int(np.prod(self.ksize))

    @property
    def out_spatial(self) -> tuple[int, ...]:
        # Contract formula (conv); subm keeps the input size. Transpose is not benchmarked.
        if self.subm:
            return self.spatial
        return tuple(
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, k, s, p, d in zip(self.spatial, self.ksize, self.stride, self.padding, self.dilation)
        )


CONFIGS = [
    Config("subm", 248636, 4, (41, 1440, 1440), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), True),
    Config("sparse", 149100, 4, (11, 360, 360), (3, 3, 3), (2, 2, 2), (0, 1, 1), (1, 1, 1), False),
]


# ----------------------------------------------------------------------------- sites
def decode(lin: np.ndarray, batch: int, dims) -> np.ndarray:
    """Linear ids over (batch, D, H, W) -> int32 rows (b, z, y, x)."""
    return np.stack(np.unravel_index(lin, (batch, *dims)), axis=1).astype(np.int32)


def encode(rows: np.ndarray, batch: int, dims) -> np.ndarray:
    return np.ravel_multi_index(tuple(rows.T.astype(np.int64)), (batch, *dims)).astype(np.int64)


def uniform_sites(rng, cfg: Config) -> np.ndarray:
    """L distinct sites drawn uniformly from the whole (batch, D, H, W) volume, rows in
    random order (as a voxelizer emitting voxels in point order would give)."""
    volume = cfg.batch * int(np.prod(cfg.spatial))
    lin = np.unique(rng.integers(0, volume, size=int(cfg.L * 1.05) + 16, dtype=np.int64))
    while lin.size < cfg.L:  # not reached at the seed densities; kept for other sizes
        lin = np.unique(np.concatenate([lin, rng.integers(0, volume, size=cfg.L, dtype=np.int64)]))
    return decode(rng.permutation(lin)[: cfg.L], cfg.batch, cfg.spatial)


def lidar_sites(rng, cfg: Config) -> np.ndarray:
    """L distinct sites clustered like a lidar sweep, so that neighbourhoods are populated
    (uniform sites at the subm density almost never touch). Per batch: a ground layer
    two voxels thick whose density falls off as 1/r around the sensor (uniform r), plus
    surfaces of random boxes ("objects"). A synthetic stand-in, not real lidar."""
    D, H, W = cfg.spatial
    per_batch = -(-cfg.L // cfg.batch)
    rows = []
    for b in range(cfg.batch):
        picked = np.empty(0, np.int64)
        while picked.size < per_batch:
            n = per_batch
            # ground: 70 % of the points
            ng = int(n * 0.7)
            r = rng.uniform(0, 0.5 * min(H, W), ng)
            th = rng.uniform(0, 2 * np.pi, ng)
            gy = np.clip((H / 2 + r * np.sin(th)).astype(np.int64), 0, H - 1)
            gx = np.clip((W / 2 + r * np.cos(th)).astype(np.int64), 0, W - 1)
            gz = np.clip(D // 4 + rng.integers(0, 2, ng), 0, D - 1)
            # objects: faces of axis-aligned boxes standing on the ground
            no = n - ng
            nbox = max(1, no // 200)
            bz = np.full(nbox, D // 4)
            by, bx = rng.integers(0, H, nbox), rng.integers(0, W, nbox)
            sz = rng.integers(2, max(3, D // 3), nbox)
            sy, sx = rng.integers(4, 20, nbox), rng.integers(4, 20, nbox)
            which = rng.integers(0, nbox, no)
            u, v, w = (rng.random(no) for _ in range(3))
            face = rng.integers(0, 3, no)  # snap one axis to a face of the box
            u = np.where(face == 0, rng.integers(0, 2, no), u)
            v = np.where(face == 1, rng.integers(0, 2, no), v)
            w = np.where(face == 2, rng.integers(0, 2, no), w)
            oz = np.clip(bz[which] + (u * sz[which]).astype(np.int64), 0, D - 1)
            oy = np.clip(by[which] + (v * sy[which]).astype(np.int64), 0, H - 1)
            ox = np.clip(bx[which] + (w * sx[which]).astype(np.int64), 0, W - 1)
            z, y, x = np.concatenate([gz, oz]), np.concatenate([gy, oy]), np.concatenate([gx, ox])
            lin = np.ravel_multi_index((np.full(z.size, b), z, y, x), (cfg.batch, D, H, W))
            picked = np.unique(np.concatenate([picked, lin]))
        rows.append(rng.permutation(picked)[:per_batch])
    lin = rng.permutation(np.concatenate(rows))[: cfg.L]
    return decode(lin, cfg.batch, cfg.spatial)


# ----------------------------------------------------------------------------- spconv
class NumpyAllocator(ExternalAllocator):
    """spconv's C++ get_indice_pairs allocates its outputs through this interface (torch
    tensors in spconv.pytorch); numpy arrays wrapped by tv.from_numpy (zero-copy views)
    serve the same purpose. Named allocations are the results we read back."""

    def __init__(self) -> None:
        super().__init__()
        self.alive: dict = {}
        self.named: dict[str, np.ndarray] = {}

    def _keep(self, name, arr, is_temp_memory):
        t = tv.from_numpy(arr)
        self.alive[t.byte_pointer()] = arr
        if name and not is_temp_memory:
            self.named[name] = arr
        return t

    @staticmethod
    def _np(dtype, device):
        if device != -1:
            raise RuntimeError("NumpyAllocator: CPU only")
        return tv.TENSOR_TO_NPDTYPE_MAP[dtype]

    def zeros(self, name, shape, dtype, device, stream=0, is_temp_memory=False, scale=1.0):
        return self._keep(name, np.zeros(shape, self._np(dtype, device)), is_temp_memory)

    def empty(self, name, shape, dtype, device, stream=0, is_temp_memory=False, scale=1.0):
        return self._keep(name, np.empty(shape, self._np(dtype, device)), is_temp_memory)

    def full_int(self, name, shape, value, dtype, device, stream=0, is_temp_memory=False):
        return self._keep(name, np.full(shape, value, self._np(dtype, device)), is_temp_memory)

    def full_float(self, name, shape, value, dtype, device, stream=0, is_temp_memory=False):
        return self._keep(name, np.full(shape, value, self._np(dtype, device)), is_temp_memory)

    def get_tensor_by_name(self, name):
        return tv.from_numpy(self.named[name])

    def free(self, ten):
        self.alive.pop(ten.byte_pointer(), None)

    def free_noexcept(self, ten):
        self.alive.pop(ten.byte_pointer(), None)


def run_spconv(cfg: Config, indices: np.ndarray):
    """One spconv rulebook. Returns (pairs [2, K, L], out_indices, indice_num [K]) in
    spconv's own layout, exactly as spconv.pytorch would receive them."""
    alloc = NumpyAllocator()
    num_out = SpconvOps.get_indice_pairs(
        alloc,
        tv.from_numpy(indices),   # int32 [L, 4] (batch, z, y, x), CPU
        cfg.batch,                # batch_size
        list(cfg.spatial),        # input_dims (D, H, W); the output size is computed inside
        ConvAlgo.Native.value,    # algo: Native = gather-GEMM-scatter rulebook (the only CPU one)
        list(cfg.ksize), list(cfg.stride), list(cfg.padding), list(cfg.dilation),
        [0, 0, 0],                # out_padding (transpose only)
        cfg.subm,                 # subm
        False,                    # transposed
    )
    pairs = alloc.named["PairFwd"]             # [2, K, L]: [0] input rows, [1] output rows
    num = alloc.named["IndiceNumPerLoc"]       # [K]
    # subm: spconv returns the input indices as the output sites (out row == in row).
    out = indices if cfg.subm else alloc.named["OutIndices"][:num_out]
    return pairs, out, num


def spconv_counts(cfg: Config, num: np.ndarray, L: int) -> np.ndarray:
    """Per-offset pair counts in full. spconv's subm CPU path fills the pairs of every
    offset (it writes each neighbour pair at k and, mirrored, at K-1-k; the centre is the
    identity) but counts only offsets k < K/2: the conv loop in spconv.pytorch.ops reads
    the count of k > K/2 from K-1-k and skips the centre. Rebuild the implied counts."""
    if not cfg.subm:
        return num.astype(np.int64)
    c = cfg.K // 2
    full = num.astype(np.int64).copy()
    full[c + 1 :] = full[:c][::-1]
    full[c] = L
    return full


# ----------------------------------------------------------------------------- ours
def ours_session(cfg: Config, lib: str, threads: int) -> ort.InferenceSession:
    node = helper.make_node(
        "GetIndicePairs", ["indices"], ["indice_pairs", "out_indices", "indice_num"],
        domain="mluops", name="gip",
        batch_size=cfg.batch, spatial_shape=list(cfg.spatial), kernel_size=list(cfg.ksize),
        stride=list(cfg.stride), padding=list(cfg.padding), dilation=list(cfg.dilation),
        subm=int(cfg.subm),
    )
    graph = helper.make_graph(
        [node], "spconv_peer",
        [helper.make_tensor_value_info("indices", TensorProto.INT32, [cfg.L, 4])],
        [helper.make_tensor_value_info("indice_pairs", TensorProto.INT32, [cfg.K, 2, cfg.L]),
         helper.make_tensor_value_info("out_indices", TensorProto.INT32, [None, 4]),
         helper.make_tensor_value_info("indice_num", TensorProto.INT32, [cfg.K])],
    )
    model = helper.make_model(
        graph, ir_version=10,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mluops", 1)],
    )
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    so.intra_op_num_threads = threads  # the kernels run on this pool (KernelContext_ParallelFor)
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# ----------------------------------------------------------------------------- checking
class Mismatch(Exception):
    pass


def pair_keys(cfg: Config, k, in_rows, out_sites_lin, in_lin) -> np.ndarray:
    """One int64 key per pair (k, input site, output site); sites as linear ids over
    (batch, spatial), so row numbering does not enter."""
    vin = cfg.batch * int(np.prod(cfg.spatial))
    vout = cfg.batch * int(np.prod(cfg.out_spatial))
    if cfg.K * vin * vout >= 2**63:
        raise SystemExit("spconv_peer: key space exceeds int64 for this config")
    return (k.astype(np.int64) * vin + in_lin[in_rows]) * vout + out_sites_lin


def rulebook_keys(cfg, label, pairs_in, pairs_out, counts, out_indices, in_lin):
    """Keys of a rulebook given per-offset input-row / output-row arrays [K, L] and counts.
    Also checks its well-formedness: rows in range, -1 past the count, no duplicate pair."""
    L = pairs_in.shape[1]
    nout = out_indices.shape[0]
    ks, ins, outs = [], [], []
    for k in range(cfg.K):
        n = int(counts[k])
        if not (0 <= n <= L):
            raise Mismatch(f"{label}: offset {k}: count {n} outside [0, {L}]")
        i, o = pairs_in[k, :n], pairs_out[k, :n]
        if n and (i.min() < 0 or i.max() >= L or o.min() < 0 or o.max() >= nout):
            raise Mismatch(f"{label}: offset {k}: a row index out of range")
        if (pairs_in[k, n:] != -1).any() or (pairs_out[k, n:] != -1).any():
            raise Mismatch(f"{label}: offset {k}: slots past the count are not -1")
        ks.append(np.full(n, k, np.int64))
        ins.append(i)
        outs.append(o)
    out_lin = encode(out_indices, cfg.batch, cfg.out_spatial)
    keys = pair_keys(cfg, np.concatenate(ks), np.concatenate(ins), out_lin[np.concatenate(outs)], in_lin)
    keys.sort()
    if keys.size and (np.diff(keys) == 0).any():
        raise Mismatch(f"{label}: a pair is listed twice")
    return keys, np.sort(out_lin)


def contract_keys(cfg: Config, indices: np.ndarray, in_lin: np.ndarray):
    """The rulebook docs/CONTRACT.md §4.2 defines, evaluated directly with numpy: offset
    k = (kz*KH + ky)*KW + kx maps input coordinate i to o = (i + p - kk*d) / s when that
    division is exact and 0 <= o < out; subm keeps only outputs that are active inputs."""
    _, kh, kw = cfg.ksize
    ijk = indices[:, 1:].astype(np.int64)
    p, d, s = (np.array(v, np.int64) for v in (cfg.padding, cfg.dilation, cfg.stride))
    out_dims = np.array(cfg.out_spatial, np.int64)
    active = np.sort(in_lin)
    ks, ins, outs = [], [], []
    rows = np.arange(len(indices))
    for k in range(cfg.K):
        kk = np.array([k // (kh * kw), (k // kw) % kh, k % kw], np.int64)
        num = ijk + p - kk * d
        o = num // s
        ok = ((num % s) == 0).all(1) & ((o >= 0) & (o < out_dims)).all(1)
        o_lin = encode(np.column_stack([indices[ok, 0], o[ok]]), cfg.batch, cfg.out_spatial)
        r = rows[ok]
        if cfg.subm:
            pos = np.searchsorted(active, o_lin).clip(max=active.size - 1)
            hit = active[pos] == o_lin
            r, o_lin = r[hit], o_lin[hit]
        ks.append(np.full(r.size, k, np.int64))
        ins.append(r)
        outs.append(o_lin)
    outs_all = np.concatenate(outs)
    keys = np.sort(pair_keys(cfg, np.concatenate(ks), np.concatenate(ins), outs_all, in_lin))
    out_sites = active if cfg.subm else np.unique(outs_all)
    return keys, out_sites


def compare(label_a, a, label_b, b) -> list[str]:
    """Differences between two (pair keys, output sites) results, as readable lines."""
    problems = []
    (ka, sa), (kb, sb) = a, b
    if not np.array_equal(sa, sb):
        problems.append(
            f"output sites differ: {label_a} {sa.size}, {label_b} {sb.size}, "
            f"only in {label_a}: {np.setdiff1d(sa, sb).size}, only in {label_b}: {np.setdiff1d(sb, sa).size}"
        )
    if not np.array_equal(ka, kb):
        problems.append(
            f"pairs differ: {label_a} {ka.size}, {label_b} {kb.size}, "
            f"only in {label_a}: {np.setdiff1d(ka, kb).size}, only in {label_b}: {np.setdiff1d(kb, ka).size}"
        )
    return problems


# ----------------------------------------------------------------------------- timing
def best_of(fn, repeat: int):
    """Warm-up call, then the best wall time of `repeat` calls, with the CPU time of that
    same call (CPU/wall ~ number of busy threads). Returns (seconds, cpu/wall, result)."""
    result = fn()
    best = (float("inf"), 0.0)
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if wall < best[0]:
            best = (wall, cpu / wall if wall > 0 else 0.0)
    return best[0], best[1], result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", choices=["uniform", "lidar"], default="uniform",
                    help="active-site distribution (default uniform over the whole volume)")
    ap.add_argument("--repeat", type=int, default=REPEAT, help="timed runs after one warm-up (best is kept)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()

    lib = os.environ.get("MLU_EP_LIB") or str(REPO / "target" / "release" / "libonnxruntime_ep_mlu.so")
    if not Path(lib).is_file():
        sys.exit(f"spconv_peer: {lib} not found: build it with `cargo build --release --lib` or set MLU_EP_LIB")

    import cumm
    import spconv

    print(f"spconv_peer: spconv {spconv.__version__} (cumm {cumm.__version__}, CPU-only build "
          f"{SpconvOps.is_cpu_only_build()}) vs {Path(lib).name} under onnxruntime {ort.__version__}; "
          f"{os.cpu_count()} cores; sites {args.sites}, seed {args.seed}; best of {args.repeat} after 1 warm-up")

    rng = np.random.default_rng(args.seed)
    rows, notes, failed = [], [], False
    for cfg in CONFIGS:
        indices = (uniform_sites if args.sites == "uniform" else lidar_sites)(rng, cfg)
        in_lin = encode(indices, cfg.batch, cfg.spatial)

        t_sp, par_sp, (sp_pairs, sp_out, sp_num) = best_of(lambda c=cfg, x=indices: run_spconv(c, x), args.repeat)
        sessions = {t: ours_session(cfg, lib, t) for t in (1, 2)}
        times = {}
        for t, sess in sessions.items():
            times[t] = best_of(lambda s=sess, x=indices: s.run(None, {"indices": x}), args.repeat)
        del sessions  # free their thread pools before the next config's spconv timing
        # Both thread counts must give the same rulebook (the contract says bit-identical).
        o1, o2 = times[1][2], times[2][2]
        problems = []
        if not all(np.array_equal(x, y) for x, y in zip(o1, o2)):
            problems.append("ours: 1-thread and 2-thread outputs differ")
        pairs, out_idx, num = o2

        try:
            ref = contract_keys(cfg, indices, in_lin)
            sp = rulebook_keys(cfg, "spconv", sp_pairs[0], sp_pairs[1], spconv_counts(cfg, sp_num, cfg.L), sp_out, in_lin)
            ours = rulebook_keys(cfg, "ours", pairs[:, 0, :], pairs[:, 1, :], num, out_idx, in_lin)
        except Mismatch as e:
            problems.append(str(e))
        else:
            problems += [f"ours vs spconv: {p}" for p in compare("ours", ours, "spconv", sp)]
            problems += [f"ours vs contract: {p}" for p in compare("ours", ours, "contract", ref)]
            problems += [f"spconv vs contract: {p}" for p in compare("spconv", sp, "contract", ref)]
            # Our ordering decisions (not a spconv property): subm outputs are the inputs
            # row for row; conv outputs ascend by (batch, z, y, x).
            out_lin = encode(out_idx, cfg.batch, cfg.out_spatial)
            if cfg.subm and not np.array_equal(out_idx, indices):
                problems.append("ours: subm out_indices differ from indices row for row")
            if not cfg.subm and (np.diff(out_lin) <= 0).any():
                problems.append("ours: out_indices not strictly ascending")

        match = not problems
        failed |= not match
        for p in problems:
            print(f"MISMATCH [{cfg.name}] {p}", file=sys.stderr)
        rows.append((cfg.name, cfg.L, out_idx.shape[0], int(num.sum()), t_sp * 1e3,
                     times[1][0] * 1e3, times[2][0] * 1e3, t_sp / times[2][0], "yes" if match else "NO"))
        notes.append(f"{cfg.name}: CPU/wall during the best run: spconv {par_sp:.2f}, "
                     f"ours 1t {times[1][1]:.2f}, ours 2t {times[2][1]:.2f}")

    head = ("config", "L", "out sites", "pairs", "spconv ms", "ours 1t ms", "ours 2t ms",
            "spconv/ours-2t", "sets match")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.1f} | {r[5]:.1f} | {r[6]:.1f} | {r[7]:.2f}x | {r[8]} |")
    for n in notes:
        print(n)
    print("spconv runs its CPU rulebook in one thread (a serial loop over an std::unordered_map); "
          "spconv ms includes allocating its outputs, ours is one onnxruntime session.run "
          "(outputs copied back to numpy).")
    if failed:
        print("spconv_peer: rulebooks differ (see MISMATCH lines)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
