"""Operator-table rows for resampling (resize and friends).

``resize_axis`` resamples one axis with a small table per output position, computed at export
by the frontend (Resize is separable): ``y[.., o, ..] = sum_t w[o, t] * x[.., idx[o, t], ..]
+ fill[o]``. Every interpolation mode (linear, cubic, antialiased filters, exclude_outside) is
only a different table; ``fill`` carries tf_crop_and_resize's extrapolation value for the
positions that fall outside the input (their weights are zero).
"""

from __future__ import annotations

import itertools

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .registry import REDUCTION, register_op, size_expr


def _infer_resize_axis(x: TensorType, idx: TensorType, w: TensorType, fill: TensorType,
                       axis: int = 0) -> TensorType:
    if x.dtype not in ("float32", "float64"):
        raise ValueError(f"resize_axis: input must be float32 or float64, not {x.dtype}")
    if not -len(x.shape) <= axis < len(x.shape):
        raise ValueError(f"resize_axis: axis {axis} is out of range for {x.shape}")
    if (len(idx.shape) != 2 or idx.shape != w.shape or fill.shape != idx.shape[:1]
            or idx.dtype != "int64" or w.dtype != x.dtype or fill.dtype != x.dtype):
        raise ValueError(f"resize_axis: tables idx {idx.shape} {idx.dtype}, w {w.shape} "
                         f"{w.dtype}, fill {fill.shape} {fill.dtype} do not match "
                         f"([O, T] int64, [O, T] and [O] of {x.dtype})")
    axis %= len(x.shape)
    return TensorType(x.shape[:axis] + idx.shape[:1] + x.shape[axis + 1:], x.dtype)


def _legalize_resize_axis(x: te.Tensor, idx: te.Tensor, w: te.Tensor, fill: te.Tensor,
                          out_type: TensorType, name: str, axis: int = 0) -> te.Tensor:
    axis %= x.ndim
    size = x.shape[axis]
    t = te.reduce_axis(idx.shape[1], "t")
    tag_reduction(t, "resize_axis", (x, idx, w, fill), along=axis)   # codegen/resize.py

    def body(*i):
        o = i[axis]
        src = te.minimum(te.maximum(te.cast(idx[o, t], "int64"), 0), size_expr(size) - 1)
        read = x[tuple(src if d == axis else v for d, v in enumerate(i))]
        return te.sum_of(w[o, t] * read, t) + fill[o]

    return te.compute(out_type.shape, body, name=name)


@register_op("resize_axis", REDUCTION, _infer_resize_axis, _legalize_resize_axis)
def resize_axis(x: np.ndarray, idx: np.ndarray, w: np.ndarray, fill: np.ndarray,
                axis: int = 0) -> np.ndarray:
    axis %= x.ndim
    src = np.clip(idx.astype(np.int64), 0, x.shape[axis] - 1)
    gathered = np.take(x.astype(np.float64), src, axis=axis)       # [.., O, T, ..]
    shape = (1,) * axis + w.shape + (1,) * (x.ndim - axis - 1)
    out = (gathered * w.astype(np.float64).reshape(shape)).sum(axis=axis + 1)
    out = out + fill.astype(np.float64).reshape((1,) * axis + fill.shape
                                                + (1,) * (x.ndim - axis - 1))
    return out.astype(x.dtype)


# ---- grid_sample (ONNX GridSample) --------------------------------------------------------------
# x [N, C, *spatial], grid [N, *out, D] with the coordinates of the last axis in x, y(, z) order,
# normalized to [-1, 1]; every output element samples its channel at the grid point.

def _infer_grid_sample(x: TensorType, grid: TensorType, mode: str = "linear",
                       padding_mode: str = "zeros", align_corners: bool = False) -> TensorType:
    d = len(x.shape) - 2
    if d < 1 or len(grid.shape) != d + 2 or grid.shape[-1] != d or grid.shape[0] != x.shape[0]:
        raise ValueError(f"grid_sample: grid {grid.shape} does not fit input {x.shape} "
                         f"(expected [N, *out, {max(d, 1)}])")
    if x.dtype not in ("float32", "float64") or grid.dtype != x.dtype:
        raise ValueError(f"grid_sample: input {x.dtype} and grid {grid.dtype} must be the same "
                         "float type")
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"grid_sample: mode {mode!r} is not nearest, linear or cubic")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"grid_sample: padding_mode {padding_mode!r} is not zeros, border or "
                         "reflection")
    return TensorType(x.shape[:2] + grid.shape[1:-1], x.dtype)


def _keys_cubic(t, a: float = -0.75):
    """The four cubic convolution weights for a fractional offset t (works on numpy and TE)."""
    s = 1 - t
    return [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * s - (a + 3)) * s * s + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


def _legalize_grid_sample(x: te.Tensor, grid: te.Tensor, out_type: TensorType, name: str,
                          mode: str = "linear", padding_mode: str = "zeros",
                          align_corners: bool = False) -> te.Tensor:
    dims = x.shape[2:]
    nd = len(dims)
    dt = x.dtype

    def c(v: float) -> te.Expr:
        return te.const(float(v), dt)

    def floor(v: te.Expr) -> te.Expr:
        return te.math("floor", v)

    def reflect(v: te.Expr, lo: float, hi: float) -> te.Expr:
        rng = hi - lo
        below, above = c(lo) - v, v - c(hi)
        out = v
        for dx, base, other, sign in ((below, lo, hi, 1.0), (above, hi, lo, -1.0)):
            n = floor(dx / c(rng))
            r = dx - n * c(rng)
            odd = (n - c(2.0) * floor(n * c(0.5))) > c(0.5)
            folded = te.if_then_else(odd, c(other) - c(sign) * r, c(base) + c(sign) * r)
            out = te.if_then_else(dx > c(0.0), folded, out)
        return out

    def rint(v: te.Expr) -> te.Expr:  # round half to even
        f = floor(v)
        diff = v - f
        odd = (f - c(2.0) * floor(f * c(0.5))) > c(0.5)
        up = te.logical_or(diff > c(0.5), te.logical_and(te.eq(diff, c(0.5)), odd))
        return te.if_then_else(up, f + c(1.0), f)

    ntaps = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    out_sp = grid.shape[1:-1]

    def coordinate(i: int, n, o) -> te.Expr:
        """The sampling coordinate on axis i (in pixels), the padding mode applied."""
        size = dims[i]
        g = grid[(n,) + tuple(o) + (nd - 1 - i,)]
        if align_corners:
            v = (g + c(1.0)) * c((size - 1) / 2.0)
        else:
            v = ((g + c(1.0)) * c(size) - c(1.0)) * c(0.5)
        if mode == "nearest":
            v = rint(v)
        if padding_mode == "border":
            v = te.minimum(te.maximum(v, c(0.0)), c(size - 1))
        elif padding_mode == "reflection":
            v = reflect(v, *borders[i])
        return v

    borders = [(0.0, size - 1.0) if align_corners else (-0.5, size - 0.5) for size in dims]
    # Per axis, two small stages over [N, *out, taps]: the input index of each tap (padding
    # applied, clamped) and its weight (0 for a zeros-padded tap outside the input).
    index_stages, weight_stages = [], []
    for i, size in enumerate(dims):
        def tap_position(n, *rest, _i=i):
            o, t = rest[:-1], rest[-1]
            v = coordinate(_i, n, o)
            if mode == "nearest":
                return te.cast(v, "int64")  # a whole number; truncation as the reference
            return te.cast(floor(v), "int64") + t + (-1 if mode == "cubic" else 0)

        def index(*at, _i=i, _size=size):
            p = tap_position(*at, _i=_i)
            if padding_mode == "reflection" and mode != "nearest":
                # (a nearest coordinate is already reflected into the input's range)
                p = te.cast(reflect(te.cast(p, dt), *borders[_i]), "int64")
            return te.minimum(te.maximum(p, 0), _size - 1)

        def weight(n, *rest, _i=i, _size=size):
            o, t = rest[:-1], rest[-1]
            if mode == "nearest":
                w = c(1.0)
            else:
                v = coordinate(_i, n, o)
                frac = v - floor(v)
                ws = [c(1.0) - frac, frac] if mode == "linear" else _keys_cubic(frac)
                w = ws[-1]
                for k in range(len(ws) - 2, -1, -1):
                    w = te.if_then_else(te.eq(t, k), ws[k], w)
            if padding_mode == "zeros":
                p = tap_position(n, *rest, _i=_i)
                w = te.if_then_else(te.logical_and(p >= 0, p < _size), w, c(0.0))
            return w

        shape = (x.shape[0],) + out_sp + (ntaps,)
        index_stages.append(te.compute(shape, index, name=f"{name}_idx{i}", dtype="int64"))
        weight_stages.append(te.compute(shape, weight, name=f"{name}_w{i}", dtype=dt))

    taps = tuple(te.reduce_axis(ntaps, f"t{i}") for i in range(nd))

    def body(n, ch, *o):
        at = tuple(index_stages[i][(n,) + tuple(o) + (taps[i],)] for i in range(nd))
        w = weight_stages[0][(n,) + tuple(o) + (taps[0],)]
        for i in range(1, nd):
            w = w * weight_stages[i][(n,) + tuple(o) + (taps[i],)]
        return te.sum_of(w * x[(n, ch) + at], taps)

    return te.compute(out_type.shape, body, name=name)


def _reflect_np(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    rng = hi - lo
    out = v.copy()
    for dx, base, other, sign in ((lo - v, lo, hi, 1.0), (v - hi, hi, lo, -1.0)):
        n = np.floor(dx / rng)
        r = dx - n * rng
        folded = np.where(n % 2 == 1, other - sign * r, base + sign * r)
        out = np.where(dx > 0, folded, out)
    return out


@register_op("grid_sample", REDUCTION, _infer_grid_sample, _legalize_grid_sample)
def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str = "linear",
                padding_mode: str = "zeros", align_corners: bool = False) -> np.ndarray:
    dims = x.shape[2:]
    nd = len(dims)
    g = grid.astype(np.float64)
    coords, borders = [], []
    for i, size in enumerate(dims):
        v = g[..., nd - 1 - i]
        if align_corners:
            v, lo, hi = (v + 1) / 2 * (size - 1), 0.0, size - 1.0
        else:
            v, lo, hi = ((v + 1) * size - 1) / 2, -0.5, size - 0.5
        if mode == "nearest":
            v = np.rint(v)
        if padding_mode == "border":
            v = np.clip(v, 0, size - 1)
        elif padding_mode == "reflection":
            v = _reflect_np(v, lo, hi)
        coords.append(v)
        borders.append((lo, hi))
    batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (g.ndim - 2))
    x64 = x.astype(np.float64)

    def pixel(idx):
        ok = np.ones(idx[0].shape, dtype=bool)
        at = []
        for i, (p, size) in enumerate(zip(idx, dims)):
            if padding_mode == "zeros":
                ok &= (p >= 0) & (p < size)
            elif padding_mode == "reflection":
                p = _reflect_np(p.astype(np.float64), *borders[i]).astype(np.int64)
            at.append(np.clip(p, 0, size - 1))
        vals = x64[(batch, slice(None)) + tuple(at)]          # [N, *out, C]
        vals = np.moveaxis(vals, -1, 1)
        return np.where(ok[:, None], vals, 0.0)

    if mode == "nearest":
        return pixel([v.astype(np.int64) for v in coords]).astype(x.dtype)
    taps_per_axis = []
    for v in coords:
        base = np.floor(v)
        t = v - base
        b = base.astype(np.int64)
        if mode == "linear":
            taps_per_axis.append([(b, 1 - t), (b + 1, t)])
        else:
            w = _keys_cubic(t)
            taps_per_axis.append([(b + (k - 1), w[k]) for k in range(4)])
    total = 0.0
    for combo in itertools.product(*taps_per_axis):
        weight = np.prod([wk for _, wk in combo], axis=0)
        total = total + weight[:, None] * pixel([p for p, _ in combo])
    return np.asarray(total).astype(x.dtype)
