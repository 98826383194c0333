"""Writes models/mluops_demo.npz: seeded inputs of models/mluops_demo.onnx and golden
outputs computed by the independent numpy references of tests/python/reference.py (never by
this library). Run: .venv/bin/python models/make_demo_data.py"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from reference import (  # noqa: E402
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


def main():
    rng = np.random.default_rng(2026)
    inputs, outputs = {}, {}

    vp = vpf_inputs(rng, 2, 4096, 32, 32, 32, 4)
    inputs["vp_geom_xyz"], inputs["vp_features"] = vp["geom_xyz"], vp["input_features"]
    bev, pos = vpf_reference(vp["geom_xyz"], np.maximum(vp["input_features"], 0), 32, 32, 4)
    outputs["bev_nchw"] = bev.transpose(0, 3, 1, 2).astype(np.float32)
    outputs["pos_memo"] = pos

    sites = gip_sites(rng, 2, (8, 32, 32), 600)
    inputs["sp_indices"] = sites
    for prefix, subm, stride in (("subm", 1, 1), ("down", 0, 2)):
        pairs, out, num = gip_reference(
            sites, 2, (8, 32, 32), (3, 3, 3), (stride,) * 3, (1, 1, 1), (1, 1, 1), (0, 0, 0), subm, 0
        )
        outputs[f"{prefix}_pairs"], outputs[f"{prefix}_out"], outputs[f"{prefix}_num"] = pairs, out, num

    go = rng.standard_normal((2, 16, 256)).astype(np.float32)
    idx = rng.integers(0, 64, (2, 256, 3)).astype(np.int32)
    w = rng.random((2, 256, 3)).astype(np.float32)
    inputs["ti_grad_output"], inputs["ti_indices"], inputs["ti_weights"] = go, idx, w
    outputs["ti_grad_features"] = tib_reference(go, idx, w, 64).astype(np.float32)

    ds = dsb_inputs(rng, 300, 80, 16, "max")
    for k, v in ds.items():
        inputs["ds_" + k] = v
    outputs["ds_grad_feats"] = dsb_reference(
        ds["grad_voxel_feats"], ds["feats"], ds["voxel_feats"], ds["point2voxel_map"], ds["voxel_points_count"], "max"
    )

    ps = prp_inputs(rng, 12, 3, 4, 2, 16, 16, 0.25)
    inputs["ps_top_grad"], inputs["ps_rois"], inputs["ps_mapping_channel"] = ps["top_grad"], ps["rois"], ps["mapping_channel"]
    outputs["ps_bottom_grad"] = prp_reference(
        ps["top_grad"], ps["rois"], ps["mapping_channel"], ps["bottom_shape"], 3, 3, 0.25, 4
    ).astype(np.float32)

    arrays = {"in." + k: v for k, v in inputs.items()} | {"out." + k: v for k, v in outputs.items()}
    path = os.path.join(HERE, "mluops_demo.npz")
    np.savez_compressed(path, **arrays)
    print(f"wrote {path}: {len(inputs)} inputs, {len(outputs)} outputs")


if __name__ == "__main__":
    main()
