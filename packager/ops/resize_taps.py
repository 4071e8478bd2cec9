"""``resize_taps``: one axis's Resize tables built by a kernel at run time, for a Resize whose
scales or sizes arrive when the model runs (``frontends/onnx/resize.py``).

The tables are those of ``resize_tables.resize_tables`` (the ONNX specification's
coordinate transforms and nearest/linear/cubic filters): ``part`` picks the source indices
``[O, T]`` (int64, clamped into the input), the weights ``[O, T]`` or the extrapolation fill
``[O]``. Inputs: the scale ``[1]`` (float64; with ``from_sizes`` the output size over the input
size instead) and tf_crop_and_resize's ``(start, end)`` ``[2]`` (float64); the input and output
sizes are attributes, either of them a size expression read at run time. Everything is
computed in float64, as the export-time tables are; ``resize_axis`` then applies them.
With ``antialias`` the filter's width follows the scale: ``taps`` (``antialias_width``) is the
widest it can be, ``part`` is ``index`` or ``raw`` (the weights before normalisation, float64,
0 past the filter's width), and the frontend normalises each row by its sum.
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.sym import Dim
from .registry import INJECTIVE, register_op, size_expr
from .resize_tables import resize_tables

TAPS = {"nearest": 2, "linear": 2, "cubic": 4}


def _infer(scale: TensorType, roi: TensorType, in_size: Dim = 1, out_size: Dim = 1,
           mode: str = "linear", coord: str = "half_pixel", part: str = "index",
           dtype: str = "float32", nearest_mode: str = "round_prefer_floor",
           cubic_a: float = -0.75, exclude_outside: bool = False,
           extrapolation: float = 0.0, from_sizes: bool = False, antialias: bool = False,
           taps: int = 0) -> TensorType:
    if scale.dtype != "float64" or roi.dtype != "float64" or scale.shape != (1,) \
            or roi.shape != (2,):
        raise ValueError(f"resize_taps: scale [1] and roi [2] of float64 expected, not "
                         f"{scale} and {roi}")
    if part == "fill":
        return TensorType((out_size,), dtype)
    if antialias:
        if mode == "nearest" or taps < 2 or part not in ("index", "raw"):
            raise ValueError("resize_taps: antialias needs mode linear or cubic, taps >= 2 and "
                             "part index or raw")
        return TensorType((out_size, taps), "int64" if part == "index" else "float64")
    return TensorType((out_size, TAPS[mode]), "int64" if part == "index" else dtype)


def _legalize(scale: te.Tensor, roi: te.Tensor, out_type: TensorType, name: str,
              in_size: Dim = 1, out_size: Dim = 1, mode: str = "linear",
              coord: str = "half_pixel", part: str = "index", dtype: str = "float32",
              nearest_mode: str = "round_prefer_floor", cubic_a: float = -0.75,
              exclude_outside: bool = False, extrapolation: float = 0.0,
              from_sizes: bool = False, antialias: bool = False, taps: int = 0) -> te.Tensor:
    f64 = "float64"

    def c(v: float) -> te.Expr:
        return te.const(float(v), f64)

    def fsize(d: Dim) -> te.Expr:
        return te.cast(size_expr(d), f64) if not isinstance(d, int) else c(d)

    n_in, n_out = fsize(in_size), fsize(out_size)
    s = n_out / n_in if from_sizes else scale[(0,)]
    taps = TAPS[mode]

    def source(o: te.Expr) -> tuple[te.Expr, te.Expr]:
        """(source coordinate, whether it extrapolates) of output position ``o``."""
        y = te.cast(o, f64)
        width = s * n_in   # the specification's unrounded output width
        outside = te.const(False, "bool")
        if coord == "align_corners":
            x = te.if_then_else(te.eq(width, c(1)), c(0), y * (n_in - c(1)) / (width - c(1)))
        elif coord == "asymmetric":
            x = y / s
        elif coord == "tf_crop_and_resize":
            start, end = roi[(0,)], roi[(1,)]
            span = (end - start) * (n_in - c(1))
            x = te.if_then_else(te.eq(width, c(1)), span / c(2), y * span / (width - c(1)))
            x = x + start * (n_in - c(1))
            outside = te.logical_or(x < c(0), x > n_in - c(1))
        elif coord == "pytorch_half_pixel":
            x = te.if_then_else(te.eq(width, c(1)), c(-0.5), (y + c(0.5)) / s - c(0.5))
        elif coord == "half_pixel":
            x = (y + c(0.5)) / s - c(0.5)
        else:   # half_pixel_symmetric
            offset = n_in / c(2) * (c(1) - n_out / width)
            x = offset + (y + c(0.5)) / s - c(0.5)
        return x, outside

    def coeffs(ratio: te.Expr) -> list[te.Expr]:
        if mode == "linear":
            return [c(1) - ratio, ratio]
        if mode == "cubic":
            a, r, q = cubic_a, ratio, c(1) - ratio
            return [((c(a) * (r + c(1)) - c(5 * a)) * (r + c(1)) + c(8 * a)) * (r + c(1)) - c(4 * a),
                    ((c(a + 2) * r - c(a + 3)) * r) * r + c(1),
                    ((c(a + 2) * q - c(a + 3)) * q) * q + c(1),
                    ((c(a) * (q + c(1)) - c(5 * a)) * (q + c(1)) + c(8 * a)) * (q + c(1)) - c(4 * a)]
        whole = te.eq(ratio, c(1))
        if nearest_mode == "round_prefer_floor":
            low = ratio <= c(0.5)
        elif nearest_mode == "round_prefer_ceil":
            low = ratio < c(0.5)
        else:
            low = te.const(nearest_mode == "floor", "bool")
        first = te.if_then_else(whole, c(0), te.if_then_else(low, c(1), c(0)))
        return [first, c(1) - first]

    def taps_of(o: te.Expr) -> tuple[list[te.Expr], list[te.Expr], te.Expr]:
        """(neighbour indices before clamping, weights, extrapolates) of position ``o``."""
        x, outside = source(o)
        fl = te.math("floor", x)
        ratio = te.if_then_else(te.eq(x, fl), c(1), x - fl)
        w = coeffs(ratio)
        pad = -(-taps // 2)
        xp = x + c(pad)
        p = te.math("floor", xp)
        first = p + te.if_then_else(te.eq(xp - p, c(0)), c(-(taps // 2)), c(-(taps // 2) + 1))
        near = [first + c(t - pad) for t in range(taps)]
        if exclude_outside:
            w = [te.if_then_else(te.logical_or(n < c(0), n > n_in - c(1)), c(0), wt)
                 for n, wt in zip(near, w)]
            total = w[0]
            for wt in w[1:]:
                total = total + wt
            total = te.if_then_else(te.eq(total, c(0)), c(1), total)
            w = [wt / total for wt in w]
        return near, w, outside

    def pick(values: list[te.Expr], t: te.Expr) -> te.Expr:
        out = values[-1]
        for k in range(len(values) - 2, -1, -1):
            out = te.if_then_else(te.eq(t, k), values[k], out)
        return out

    if antialias:
        width = out_type.shape[1]
        return te.compute(out_type.shape, lambda o, t: _antialias_tap(
            source(o), o, t, s, n_in, width, mode, part, cubic_a, exclude_outside),
            name=name, dtype=out_type.dtype)

    if part == "fill":
        def fill(o):
            _, outside = source(o)
            return te.cast(te.if_then_else(outside, c(extrapolation), c(0)), dtype)
        return te.compute(out_type.shape, fill, name=name, dtype=dtype)

    def body(o, t):
        near, w, outside = taps_of(o)
        if part == "index":
            at = te.minimum(te.maximum(pick(near, t), c(0)), n_in - c(1))
            return te.cast(at, "int64")
        return te.cast(te.if_then_else(outside, c(0), pick(w, t)), dtype)

    return te.compute(out_type.shape, body, name=name, dtype=out_type.dtype)


def _antialias_tap(at: tuple[te.Expr, te.Expr], o: te.Expr, t: te.Expr, s: te.Expr,
                   n_in: te.Expr, taps: int, mode: str, part: str, cubic_a: float,
                   exclude_outside: bool) -> te.Expr:
    """Tap ``t`` of output position ``o`` of an antialiased filter: its source index (clamped)
    or its weight before normalisation (float64). The filter of scale ``min(s, 1)`` spans
    ``n = 2 * ceil(1 / scale)`` taps (linear; ``2 * ceil(2 / scale)`` cubic), at most ``taps``
    (the scale is held at ``2 / taps``, ``4 / taps`` cubic, or above: the smallest scale that
    still gives an output element); taps past ``n`` weigh 0."""
    f64 = "float64"

    def c(v: float) -> te.Expr:
        return te.const(float(v), f64)

    x, outside = at
    reach = 1 if mode == "linear" else 2
    scale = te.maximum(te.minimum(s, c(1)), c(2 * reach / taps))
    start = te.math("floor", c(-reach) / scale) + c(1)
    n = te.minimum(c(2) - c(2) * start, c(taps))
    fl = te.math("floor", x)
    whole = te.eq(x, fl)
    tf = te.cast(t, f64)
    near = fl - n / c(2) + tf + te.if_then_else(whole, c(0), c(1))
    if part == "index":
        return te.cast(te.minimum(te.maximum(near, c(0)), n_in - c(1)), "int64")
    ratio = te.if_then_else(whole, c(1), x - fl)
    arg = (start + tf - ratio) * scale
    if mode == "linear":
        w = te.minimum(te.maximum(c(1) - te.math("abs", arg), c(0)), c(1))
    else:
        a = cubic_a
        v = te.math("abs", arg)
        inner = (c(a + 2) * v * v * v - c(a + 3) * v * v) + c(1)
        outer = ((c(a) * v * v * v - c(5 * a) * v * v) + c(8 * a) * v) - c(4 * a)
        w = te.if_then_else(v <= c(1), inner, te.if_then_else(v < c(2), outer, c(0)))
    off = te.logical_or(outside, tf >= n)
    if exclude_outside:
        off = te.logical_or(off, te.logical_or(near < c(0), near > n_in - c(1)))
    return te.if_then_else(off, c(0), w)


def antialias_taps(in_size: int, out_size: int, scale: float, mode: str, coord: str,
                   roi: tuple[float, float], taps: int, cubic_a: float = -0.75,
                   exclude_outside: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's antialias tables in numpy: (source indices [O, taps], weights before
    normalisation [O, taps], float64); normalised per row they are ``resize_tables``'s."""
    from .resize_tables import _source_coords
    x, outside = _source_coords(coord, out_size, in_size, scale, roi)
    reach = 1 if mode == "linear" else 2
    s = max(min(scale, 1.0), 2 * reach / taps)
    start = np.floor(-reach / s) + 1
    n = min(2 - 2 * start, float(taps))
    fl = np.floor(x)
    whole = x == fl
    t = np.arange(taps, dtype=np.float64)[None, :]
    near = fl[:, None] - n / 2 + t + np.where(whole, 0.0, 1.0)[:, None]
    idx = np.clip(near, 0, in_size - 1).astype(np.int64)
    ratio = np.where(whole, 1.0, x - fl)[:, None]
    arg = (start + t - ratio) * s
    if mode == "linear":
        w = np.clip(1 - np.abs(arg), 0, 1)
    else:
        a, v = cubic_a, np.abs(arg)
        inner = ((a + 2) * v * v * v - (a + 3) * v * v) + 1
        outer = ((a * v * v * v - 5 * a * v * v) + 8 * a * v) - 4 * a
        w = np.where(v <= 1, inner, np.where(v < 2, outer, 0.0))
    off = outside[:, None] | (t >= n)
    if exclude_outside:
        off = off | (near < 0) | (near > in_size - 1)
    return idx, np.where(off, 0.0, w)


def antialias_width(mode: str, in_size: int) -> int:
    """Taps an antialiased filter needs at most on an axis of ``in_size`` (the scale at least
    ``1 / in_size``, below which the output is empty)."""
    return (2 if mode == "linear" else 4) * in_size


@register_op("resize_taps", INJECTIVE, _infer, _legalize)
def resize_taps(scale: np.ndarray, roi: np.ndarray, in_size: Dim = 1, out_size: Dim = 1,
                mode: str = "linear", coord: str = "half_pixel", part: str = "index",
                dtype: str = "float32", nearest_mode: str = "round_prefer_floor",
                cubic_a: float = -0.75, exclude_outside: bool = False,
                extrapolation: float = 0.0, from_sizes: bool = False, antialias: bool = False,
                taps: int = 0) -> np.ndarray:
    factor = int(out_size) / int(in_size) if from_sizes else float(scale[0])
    if antialias:
        idx, raw = antialias_taps(int(in_size), int(out_size), factor, mode, coord,
                                  (float(roi[0]), float(roi[1])), taps, cubic_a, exclude_outside)
        return idx if part == "index" else raw
    idx, w, fill = resize_tables(int(in_size), int(out_size), factor, mode, coord,
                                 (float(roi[0]), float(roi[1])), nearest_mode, cubic_a,
                                 exclude_outside, False, extrapolation)
    if mode == "nearest" and idx.shape[1] != 2:
        raise ValueError("resize_taps: nearest tables have two taps")
    if part == "index":
        return idx
    return (w if part == "weight" else fill).astype(dtype)
