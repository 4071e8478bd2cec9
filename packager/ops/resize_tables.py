"""Resize's per-axis tables (source indices, weights, extrapolation fill) as the ONNX
specification defines them, in numpy: the frontends build them at export when the sizes are
known (``frontends/onnx/resize.py``), and they are the reference of ``resize_taps``, the
kernel that builds them at run time (``ops/resize.py``).
"""

from __future__ import annotations

import numpy as np


# ---- 1-D filter coefficients (as the ONNX specification writes them) ----------------------------

def _nearest_coeffs(ratio: float, nearest_mode: str) -> np.ndarray:
    if float(ratio).is_integer():
        return np.array([0.0, 1.0])
    if nearest_mode == "round_prefer_floor":
        return np.array([ratio <= 0.5, ratio > 0.5], dtype=np.float64)
    if nearest_mode == "round_prefer_ceil":
        return np.array([ratio < 0.5, ratio >= 0.5], dtype=np.float64)
    if nearest_mode == "floor":
        return np.array([1.0, 0.0])
    return np.array([0.0, 1.0])


def _linear_coeffs(ratio: float, scale: float, antialias: bool) -> np.ndarray:
    if not antialias:
        return np.array([1 - ratio, ratio])
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    footprint = 2 - 2 * start
    args = (np.arange(start, start + footprint) - ratio) * scale
    coeffs = np.clip(1 - np.abs(args), 0, 1)
    return coeffs / coeffs.sum()


def _cubic_coeffs(ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
    if not antialias:
        r, s = ratio, 1 - ratio
        return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                         ((a + 2) * r - (a + 3)) * r * r + 1,
                         ((a + 2) * s - (a + 3)) * s * s + 1,
                         ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a])
    scale = min(scale, 1.0)

    def coeff(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        if x < 2:
            return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
        return 0.0

    i_start = int(np.floor(-2 / scale) + 1)
    coeffs = np.array([coeff(scale * (i - ratio)) for i in range(i_start, 2 - i_start)])
    return coeffs / coeffs.sum()


def _source_coords(coord: str, out_size: int, in_size: int, scale: float,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """Each output position's source coordinate, and which ones extrapolate (tf_crop)."""
    y = np.arange(out_size, dtype=np.float64)
    out_width = scale * in_size  # the specification uses the unrounded output width
    outside = np.zeros(out_size, dtype=bool)
    if coord == "align_corners":
        x = np.zeros(out_size) if out_width == 1 else y * (in_size - 1) / (out_width - 1)
    elif coord == "asymmetric":
        x = y / scale
    elif coord == "tf_crop_and_resize":
        start, end = roi if roi is not None else (0.0, 1.0)
        if out_width == 1:
            x = np.full(out_size, (end - start) * (in_size - 1) / 2)
        else:
            x = y * (end - start) * (in_size - 1) / (out_width - 1)
        x = x + start * (in_size - 1)
        outside = (x < 0) | (x > in_size - 1)
    elif coord == "pytorch_half_pixel":
        x = np.full(out_size, -0.5) if out_width == 1 else (y + 0.5) / scale - 0.5
    elif coord == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        offset = in_size / 2 * (1 - out_size / out_width)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def resize_tables(in_size: int, out_size: int, scale: float, mode: str, coord: str,
                  roi: tuple[float, float] | None = None, nearest_mode: str = "round_prefer_floor",
                  cubic_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
                  extrapolation: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source indices [O, T] clamped into the input, weights [O, T], fill [O]) of one axis."""
    x, outside = _source_coords(coord, out_size, in_size, scale, roi)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)
    if mode == "nearest":
        coeffs = np.stack([_nearest_coeffs(r, nearest_mode) for r in ratios])
    elif mode == "linear":
        coeffs = np.stack([_linear_coeffs(r, scale, antialias) for r in ratios])
    else:
        coeffs = np.stack([_cubic_coeffs(r, scale, cubic_a, antialias) for r in ratios])
    n = coeffs.shape[1]
    # The n nearest positions to x (ties to the smaller), in the edge-padded input.
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        first = p + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        first = p + np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    neighbors = first[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((neighbors < 0) | (neighbors >= in_size), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    idx = np.clip(neighbors, 0, in_size - 1)
    coeffs = np.where(outside[:, None], 0.0, coeffs)
    fill = np.where(outside, extrapolation, 0.0)
    return idx.astype(np.int64), coeffs, fill
