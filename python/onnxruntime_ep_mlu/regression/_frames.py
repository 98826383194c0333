"""The frames: generated from the zoo's with a seed, read from a dataset folder, written
to one; and the models they run on."""

from __future__ import annotations

import io
import json
import os
import zlib
from pathlib import Path

import numpy as np

from .. import models_dir


# ============================================================================ generated frames
# Each generator takes (rng, the zoo frame's inputs) and returns new inputs that keep the
# model's input contract: the same dtypes and fixed dimensions, the grids the zoo's inputs
# are drawn on (so exact outputs stay well defined), unique sparse sites, indices in range.


def _pointpillars(rng, base):
    # points [N, 4] = (x, y, z, intensity) on a 1/64 m grid, intensity k/64. A random subset
    # (N varies), every point moved by up to 0.5 m and the cloud by up to 2 m in x and y (on
    # the grid, so the PFN values stay exact), new intensities, 50 exact duplicates (ties in
    # the max), shuffled.
    pts = base["points"].astype(np.float64)
    pts = pts[rng.random(len(pts)) < rng.uniform(0.7, 1.0)]
    pts[:, :3] += rng.integers(-32, 33, (len(pts), 3)) / 64
    pts[:, :2] += rng.integers(-128, 129, 2) / 64
    pts[:, 3] = rng.integers(0, 64, len(pts)) / 64
    pts = np.concatenate([pts, pts[rng.integers(0, len(pts), 50)]])
    return {"points": pts[rng.permutation(len(pts))].astype(np.float32)}


def _centerpoint(rng, base):
    # voxel_coords [L, 4] = (batch, z, y, x) unique sites in a 2 x (8, 64, 64) grid, with
    # voxel_features [L, 5]: a random subset of the sites (L varies), mirrored in y and/or x
    # per batch (a bijection of the grid: the sites stay unique and in range), shuffled, with
    # new features.
    coords = base["voxel_coords"].astype(np.int64)
    coords = coords[rng.random(len(coords)) < rng.uniform(0.6, 1.0)]
    for b in np.unique(coords[:, 0]):
        rows = coords[:, 0] == b
        for axis, size in ((2, 64), (3, 64)):
            if rng.random() < 0.5:
                coords[rows, axis] = size - 1 - coords[rows, axis]
    coords = coords[rng.permutation(len(coords))].astype(np.int32)
    feats = rng.standard_normal((len(coords), base["voxel_features"].shape[1])).astype(np.float32)
    return {"voxel_features": feats, "voxel_coords": coords}


def _bevdepth(rng, base):
    # img_feats [4, 32, 8, 22] re-sampled; geom_xyz [2, 5632, 3] (x, y, z cells of the
    # frustum points, in frustum order) moved by up to 3 cells in x and y per sample (the ego
    # pose): more or fewer points fall outside the 32 x 32 x 1 grid, as in the zoo's frame.
    geom = base["geom_xyz"].copy()
    geom[..., :2] += rng.integers(-3, 4, (geom.shape[0], 1, 2)).astype(np.int32)
    return {"img_feats": rng.standard_normal(base["img_feats"].shape).astype(np.float32), "geom_xyz": geom}


def _pointnet2_fp(rng, base):
    # The zoo's recipe again: unknown points on a 1/256 grid in [0, 4)^3 (squared distances
    # exact in float32), the known points a random subset of them (as after farthest point
    # sampling), new features.
    b, n, _ = base["unknown_xyz"].shape
    m = base["known_xyz"].shape[1]
    unknown = rng.integers(0, 1024, (b, n, 3)) / 256
    known = np.stack([unknown[i, rng.permutation(n)[:m]] for i in range(b)])
    return {
        "unknown_xyz": unknown.astype(np.float32),
        "known_xyz": known.astype(np.float32),
        "known_feats": rng.standard_normal(base["known_feats"].shape).astype(np.float32),
        "unknown_feats": rng.standard_normal(base["unknown_feats"].shape).astype(np.float32),
    }


def _rfcn_head(rng, base):
    # features [2, 32, 32, 64] (post-ReLU: >= 0) re-sampled; the zoo's rois [R, 5] shuffled,
    # each moved by a multiple of 0.5 px (half-pixel corners stay on the half grid, the
    # degenerate and outside boxes keep their shape), batch ids re-drawn in {0, 1}; labels
    # re-drawn in [0, 21).
    feats = np.abs(rng.standard_normal(base["features"].shape)).astype(np.float32)
    rois = base["rois"].astype(np.float64)[rng.permutation(len(base["rois"]))]
    shift = rng.integers(-32, 33, (len(rois), 2)) / 2
    rois[:, 1:] += np.concatenate([shift, shift], axis=1)
    rois[:, 0] = rng.integers(0, base["features"].shape[0], len(rois))
    labels = rng.integers(0, 21, len(rois)).astype(base["labels"].dtype)
    return {"features": feats, "rois": rois.astype(np.float32), "labels": labels}


#: Perturbations of the zoo models' inputs (generated frames exist for these models only).
GENERATORS = {
    "pointpillars": _pointpillars,
    "centerpoint": _centerpoint,
    "bevdepth": _bevdepth,
    "pointnet2_fp": _pointnet2_fp,
    "rfcn_head": _rfcn_head,
}


def _frame_rng(seed: int, model: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(model.encode()), index])


def generate(model: str, base: dict[str, np.ndarray], seed: int, index: int) -> dict[str, np.ndarray]:
    """The inputs of generated frame ``index`` of ``model`` (0: the zoo frame itself)."""
    inputs = {k[3:]: v for k, v in base.items() if k.startswith("in.")}
    if index == 0:
        return inputs
    return GENERATORS[model](_frame_rng(seed, model, index), inputs)


# ============================================================================ models and frames
def _load_npz(data: bytes | str | os.PathLike) -> dict[str, np.ndarray]:
    src = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    with np.load(src, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def default_zoo() -> Path | None:
    """The zoo packaged with this module (:func:`onnxruntime_ep_mlu.zoo`: the wheel's copy of
    the checkout's models/, or the checkout's own), None when there is none."""
    try:
        return models_dir() / "zoo.json"
    except FileNotFoundError:
        return None


def _read_zoo(zoo_json: str | os.PathLike) -> dict:
    """zoo.json's ``models``, or a one-line FileNotFoundError / ValueError naming the file."""
    zoo_json = Path(zoo_json)
    if not zoo_json.is_file():
        raise FileNotFoundError(f"zoo file {zoo_json} not found")
    try:
        return json.loads(zoo_json.read_text())["models"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{zoo_json} is not a zoo.json (a JSON object with \"models\"): {type(e).__name__}: {e}") from None


def _zoo_file(zoo_json: Path, name: str, spec: dict, key: str) -> bytes:
    path = zoo_json.parent / spec[key]
    if not path.is_file():
        raise FileNotFoundError(f"{path}, the {key} file of {name!r} in {zoo_json}, not found")
    return path.read_bytes()


def load_zoo(zoo_json: str | os.PathLike, names: list[str] | None = None) -> dict[str, dict]:
    """The zoo's models as the specs the checkers take: ``{name: {"onnx": bytes,
    "tolerances": {output: tol}, "base": npz bytes of the zoo frame (inputs and goldens)}}``."""
    zoo_json = Path(zoo_json)
    zoo = _read_zoo(zoo_json)
    names = list(zoo) if names is None else names
    unknown = [n for n in names if n not in zoo]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; {zoo_json} has {list(zoo)}")
    out = {}
    for name in names:
        spec = zoo[name]
        out[name] = {
            "onnx": _zoo_file(zoo_json, name, spec, "model"),
            "tolerances": spec["outputs"],
            "base": _zoo_file(zoo_json, name, spec, "data"),
        }
    return out


def load_dataset_models(frames_dir: str | os.PathLike, zoo_json=None, names: list[str] | None = None) -> dict[str, dict]:
    """The specs of the models of a frame folder (``<dir>/<model>/``): its ``model.onnx``
    else the zoo's model of that name; ``tolerances.json`` else the zoo's, else defaults."""
    frames_dir = Path(frames_dir)
    if not frames_dir.is_dir():
        raise FileNotFoundError(f"frame folder {frames_dir} not found")
    present = sorted(p.name for p in frames_dir.iterdir() if p.is_dir())
    if not present:
        raise ValueError(f"{frames_dir} has no model folders (the layout is {frames_dir}/<model>/<frame>.npz)")
    names = present if names is None else names
    missing = [n for n in names if n not in present]
    if missing:
        raise ValueError(f"no folder for model(s) {missing} in {frames_dir} (it has {present})")
    # The zoo is read only for a folder that needs it (no model.onnx or no tolerances.json).
    zoo = None
    out = {}
    for name in names:
        sub = frames_dir / name
        own_model, own_tol = (sub / "model.onnx").is_file(), (sub / "tolerances.json").is_file()
        if zoo is None and not (own_model and own_tol):
            zoo = _read_zoo(zoo_json) if zoo_json else {}
        if own_model:
            onnx_bytes = (sub / "model.onnx").read_bytes()
        elif name in zoo:
            onnx_bytes = _zoo_file(Path(zoo_json), name, zoo[name], "model")
        else:
            raise FileNotFoundError(
                f"{sub} has no model.onnx, and {name!r} is not a model of the zoo ({zoo_json}): put the model there as "
                "model.onnx, or pass --zoo with a zoo.json that has it"
            )
        if own_tol:
            try:
                tolerances = json.loads((sub / "tolerances.json").read_text())
            except ValueError as e:
                raise ValueError(f"{sub / 'tolerances.json'} is not JSON: {e}") from None
        else:
            tolerances = zoo.get(name, {}).get("outputs", {})
        out[name] = {"onnx": onnx_bytes, "tolerances": tolerances, "base": None, "off_card": _off_card(sub / "expect.json")}
    return out


def _off_card(path: Path) -> str:
    """Why a folder's model puts no node on the card, from its ``expect.json`` (``{"off_card":
    "<why>"}``); "" (nodes on the card expected) without one."""
    if not path.is_file():
        return ""
    try:
        expect = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(expect, dict) or set(expect) != {"off_card"} or not isinstance(expect["off_card"], str) \
            or not expect["off_card"].strip():
        raise ValueError(f"{path} must be {{\"off_card\": \"<why no node of the model runs on the card>\"}}, got {expect!r}")
    return expect["off_card"]


def generated_frames(models: dict[str, dict], count: int, seed: int = 0, reference=None) -> list[dict]:
    """``count`` generated frames per model (rows of the dataset: the frame is generated by
    the worker from the model's zoo frame, the seed and the index). With ``reference``, a
    function ``(model, inputs) -> {output: golden}`` independent of this library (the
    checkout's numpy models, ``models/make_zoo_goldens.py``), frames 1.. are generated here
    and carry its goldens, so that the CPU path is checked on them too."""
    rows = []
    for name, spec in models.items():
        if name not in GENERATORS or spec.get("base") is None:
            raise ValueError(f"no generator for model {name!r} (generated frames exist for {list(GENERATORS)})")
        base = _load_npz(spec["base"]) if reference is not None else None
        for i in range(count):
            row = {"model": name, "frame": f"gen-{seed}-{i:05d}", "seed": seed, "index": i, "payload": b""}
            if base is not None and i > 0:
                inputs = generate(name, base, seed, i)
                arrays = {"in." + k: v for k, v in inputs.items()}
                arrays |= {"out." + k: np.asarray(v) for k, v in reference(name, inputs).items()}
                buffer = io.BytesIO()
                np.savez(buffer, **arrays)
                row["payload"] = buffer.getvalue()
            rows.append(row)
    return rows


def load_reference(path: str | os.PathLike):
    """The ``goldens(model, inputs)`` function of the Python file ``path`` (``--reference``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regression_reference", path)
    if spec is None or spec.loader is None:
        raise ValueError("not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    goldens = getattr(module, "goldens", None)
    if not callable(goldens):
        raise ValueError("defines no goldens(model, inputs) function")
    return goldens


def dataset_frames(frames_dir: str | os.PathLike, models: dict[str, dict], limit: int | None = None) -> list[dict]:
    """The frames of a folder (``<dir>/<model>/<frame>.npz``), read into rows (the file's
    bytes travel with the row, so workers need no shared file system)."""
    rows = []
    for name in models:
        files = sorted((Path(frames_dir) / name).glob("*.npz"))
        if not files:
            raise FileNotFoundError(f"{Path(frames_dir) / name}: no .npz frames")
        for f in files[:limit]:
            rows.append({"model": name, "frame": f.stem, "seed": -1, "index": -1, "payload": f.read_bytes()})
    return rows


def write_frames(out_dir: str | os.PathLike, models: dict[str, dict], count: int, seed: int = 0) -> int:
    """Writes ``count`` generated frames per model in the folder layout (frame 0 with the zoo's
    goldens, the others inputs only), with each model's ``model.onnx`` and
    ``tolerances.json``, so that ``--frames`` reads the folder back without the zoo; returns
    the number of frame files."""
    n = 0
    for name, spec in models.items():
        base = _load_npz(spec["base"])
        sub = Path(out_dir) / name
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "model.onnx").write_bytes(spec["onnx"])
        (sub / "tolerances.json").write_text(json.dumps(spec.get("tolerances") or {}, indent=1) + "\n")
        for i in range(count):
            arrays = {"in." + k: v for k, v in generate(name, base, seed, i).items()}
            if i == 0:
                arrays |= {k: v for k, v in base.items() if k.startswith("out.")}
            np.savez(sub / f"gen-{seed}-{i:05d}.npz", **arrays)
            n += 1
    return n
