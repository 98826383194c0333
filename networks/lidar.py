"""A simulated lidar scan, shared by the networks and the benches: a street scene of boxes
(road, cars in four lanes and parked, bushes, pedestrians, building fronts, tree crowns,
poles) seen by nuScenes' lidar: 32 beams from -30.67 to +10.67 degrees, 1.39M points/s at
20 Hz, 70 m range, the sensor 1.84 m above the road, 10 sweeps with the ego moving 0.5 m
between them. A synthetic stand-in, not real lidar."""

from __future__ import annotations

import numpy as np


def scan_points(rng, sweeps: int = 10) -> np.ndarray:
    """The points (x, y, z) [P, 3] float32 of a simulated 32-beam scan (see the module doc),
    sweep after sweep, each in azimuth order within its beams."""
    h = 1.84  # sensor height above the road
    elev = np.deg2rad(np.linspace(-30.67, 10.67, 32))
    az_steps = 2170  # 1.39M points/s / 20 Hz / 32 beams
    boxes = []  # [xmin, xmax, ymin, ymax, zmin, zmax], road at z = -h
    for _ in range(60):  # cars in four lanes
        cx, cy = rng.uniform(-50, 50), rng.choice([-7.5, -4.0, 4.0, 7.5]) + rng.normal(0, 0.3)
        length, width, height = rng.uniform(3.8, 5.0), rng.uniform(1.7, 2.0), rng.uniform(1.4, 1.8)
        if abs(cx) < 4 and abs(cy) < 3:
            continue
        boxes.append([cx - length / 2, cx + length / 2, cy - width / 2, cy + width / 2, -h, -h + height])
    for _ in range(80):  # parked cars along the curbs
        cx, cy = rng.uniform(-54, 54), rng.choice([-9.5, 9.5]) + rng.normal(0, 0.2)
        length, width, height = rng.uniform(3.8, 5.0), rng.uniform(1.7, 2.0), rng.uniform(1.4, 1.8)
        boxes.append([cx - length / 2, cx + length / 2, cy - width / 2, cy + width / 2, -h, -h + height])
    for _ in range(150):  # bushes, hedges, bins
        cx, cy = rng.uniform(-54, 54), rng.choice([-1, 1]) * rng.uniform(10.5, 14)
        r = rng.uniform(0.3, 1.5)
        boxes.append([cx - r, cx + r, cy - r, cy + r, -h, -h + rng.uniform(0.5, 1.5)])
    for _ in range(40):  # pedestrians on the sidewalks
        cx, cy = rng.uniform(-50, 50), rng.choice([-11.0, 11.0]) + rng.normal(0, 0.8)
        boxes.append([cx - 0.3, cx + 0.3, cy - 0.3, cy + 0.3, -h, -h + 1.75])
    x = -54.0
    while x < 54:  # building fronts on both sides, with gaps
        length = rng.uniform(8, 25)
        for side in (-1, 1):
            if rng.random() < 0.8:
                y0 = side * rng.uniform(14, 18)
                boxes.append([x, x + length, min(y0, y0 + side * 10), max(y0, y0 + side * 10), -h, -h + rng.uniform(4, 15)])
        x += length + rng.uniform(2, 8)
    for _ in range(120):  # tree crowns
        cx, cy = rng.uniform(-54, 54), rng.choice([-12.5, 12.5]) + rng.normal(0, 0.5)
        r, z0 = rng.uniform(1.0, 2.5), rng.uniform(2.0, 3.5)
        boxes.append([cx - r, cx + r, cy - r, cy + r, -h + z0, -h + z0 + rng.uniform(2, 5)])
    for _ in range(50):  # poles and trunks
        cx, cy = rng.uniform(-50, 50), rng.choice([-12.5, 12.5])
        boxes.append([cx - 0.15, cx + 0.15, cy - 0.15, cy + 0.15, -h, -h + rng.uniform(3, 8)])
    boxes = np.array(boxes, np.float32)

    pts = []
    step = 2 * np.pi / az_steps
    for s in range(sweeps):
        origin = np.array([-0.5 * s, 0.0, 0.0], np.float32)  # 10 m/s, 20 Hz
        a0 = rng.uniform(0, step)
        az = a0 + step * np.arange(az_steps)
        e, a = np.meshgrid(elev, az, indexing="ij")
        d = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], -1).astype(np.float32)  # [32, az, 3]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(d[..., 2] < 0, -h / d[..., 2], np.inf).astype(np.float32)  # the road
            inv = 1.0 / d
        t = np.minimum(t, 70.0)
        for b in boxes:
            # The rays of the box's azimuth window (all beams), slab test.
            c = np.array([b[0:2].mean(), b[2:4].mean()]) - origin[:2]
            ac = np.arctan2(c[1], c[0])
            corners = np.array([[b[0], b[2]], [b[0], b[3]], [b[1], b[2]], [b[1], b[3]]]) - origin[:2]
            rel = (np.arctan2(corners[:, 1], corners[:, 0]) - ac + np.pi) % (2 * np.pi) - np.pi
            i0 = int(np.floor((ac + rel.min() - a0) / step)) - 1
            i1 = int(np.ceil((ac + rel.max() - a0) / step)) + 1
            idx = np.arange(i0, i1 + 1) % az_steps
            iv = inv[:, idx, :]
            with np.errstate(invalid="ignore"):
                ta, tb = (b[0::2] - origin) * iv, (b[1::2] - origin) * iv
                tn, tf = np.minimum(ta, tb).max(-1), np.maximum(ta, tb).min(-1)
            hit = np.where((tn <= tf) & (tf > 0), np.maximum(tn, 0), np.inf)
            t[:, idx] = np.minimum(t[:, idx], hit)
        ok = t < 70.0
        noise = 1 + rng.normal(0, 0.002, ok.sum()).astype(np.float32)  # ~2 cm at 10 m
        pts.append(origin + d[ok] * (t[ok] * noise)[:, None])
    return np.concatenate(pts)


def centerpoint_sites(points: np.ndarray, rng) -> np.ndarray:
    """The voxel sites (batch 0, z, y, x) int32 of ``points`` on CenterPoint's nuScenes grid
    (0.075 x 0.075 x 0.2 m from (-54, -54, -5): 41 x 1440 x 1440), each once, rows in random
    order (as a voxelizer emitting voxels in point order gives)."""
    p = points
    lo, vs = np.array([-54.0, -54.0, -5.0]), np.array([0.075, 0.075, 0.2])
    v = np.floor((p - lo) / vs).astype(np.int64)  # (x, y, z)
    v = v[(v >= 0).all(1) & (v < [1440, 1440, 40]).all(1)]
    lin = np.unique((v[:, 2] * 1440 + v[:, 1]) * 1440 + v[:, 0])
    lin = rng.permutation(lin)
    z, yx = np.divmod(lin, 1440 * 1440)
    y, x = np.divmod(yx, 1440)
    return np.stack([np.zeros_like(z), z, y, x], 1).astype(np.int32)


