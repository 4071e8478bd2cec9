"""Pooling operators: 2-D max and average pooling (``nn.max_pool2d``, ``nn.avg_pool2d``), N-D
pooling (1-, 2- and 3-D: max, avg, lp; ``nn.pool``) and ONNX MaxPool's indices output
(``nn.max_pool_indices``). Window sizes follow ``nn.py``'s ``_out_size`` and N-D helpers, shared
with the convolutions."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .nn import (_all_of, _clamped, _gather_nd_window, _in_bounds, _lowest, _nd_check,
                 _nd_out_sizes, _nd_taps, _out_size, _window_positions)
from .registry import REDUCTION, register_op


# ---- pooling ------------------------------------------------------------------------------------

def _infer_pool(x: TensorType, kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0),
                dilation=(1, 1), ceil_mode: bool = False, count_include_pad: bool = False, *,
                relations: list) -> TensorType:
    n, c, h, w = x.shape
    oh = _out_size(h, kernel[0], strides[0], padding[0], padding[2], dilation[0], ceil_mode,
                   relations=relations)
    ow = _out_size(w, kernel[1], strides[1], padding[1], padding[3], dilation[1], ceil_mode,
                   relations=relations)
    return TensorType((n, c, oh, ow), x.dtype)


def _legalize_max_pool(x: te.Tensor, out_type: TensorType, name: str, kernel=(1, 1),
                       strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                       ceil_mode: bool = False, count_include_pad: bool = False) -> te.Tensor:
    _, _, h, w = x.shape
    ry, rx = te.reduce_axis(kernel[0], "ry"), te.reduce_axis(kernel[1], "rx")
    lowest = (te.const(float("-inf"), x.dtype) if x.dtype in te.FLOAT_DTYPES
              else te.const(int(np.iinfo(x.dtype).min), x.dtype))

    def body(n, c, y, xx):
        iy = y * strides[0] - padding[0] + ry * dilation[0]
        ix = xx * strides[1] - padding[1] + rx * dilation[1]
        value = te.if_then_else(te.logical_and(_in_bounds(iy, h), _in_bounds(ix, w)),
                                x[n, c, _clamped(iy, h), _clamped(ix, w)], lowest)
        return te.max_of(value, (ry, rx))

    tag_reduction(ry, "max_pool2d", (x,), kernel=tuple(kernel), strides=tuple(strides),
                  padding=tuple(padding), dilation=tuple(dilation))
    return te.compute(out_type.shape, body, name=name)


def _legalize_avg_pool(x: te.Tensor, out_type: TensorType, name: str, kernel=(1, 1),
                       strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                       ceil_mode: bool = False, count_include_pad: bool = False) -> te.Tensor:
    _, _, h, w = x.shape
    ry, rx = te.reduce_axis(kernel[0], "ry"), te.reduce_axis(kernel[1], "rx")

    def window_count(o: te.Expr, k: int, s: int, pad0: int, pad1: int, size: int) -> te.Expr:
        start = o * s - pad0
        end = te.minimum(start + k, size + pad1)
        if not count_include_pad:
            return te.minimum(end, size) - te.maximum(start, 0)
        return end - start

    def body(n, c, y, xx):
        iy = y * strides[0] - padding[0] + ry
        ix = xx * strides[1] - padding[1] + rx
        value = te.if_then_else(te.logical_and(_in_bounds(iy, h), _in_bounds(ix, w)),
                                x[n, c, _clamped(iy, h), _clamped(ix, w)], 0.0)
        count = (window_count(y, kernel[0], strides[0], padding[0], padding[2], h)
                 * window_count(xx, kernel[1], strides[1], padding[1], padding[3], w))
        return te.sum_of(value, (ry, rx)) / te.cast(count, x.dtype)

    return te.compute(out_type.shape, body, name=name)


def _pool_windows(x: np.ndarray, kernel, strides, padding, dilation, ceil_mode, fill):
    n, c, h, w = x.shape
    static: list = []   # numpy: sizes are known, nothing is assumed
    oh = _out_size(h, kernel[0], strides[0], padding[0], padding[2], dilation[0], ceil_mode,
                   relations=static)
    ow = _out_size(w, kernel[1], strides[1], padding[1], padding[3], dilation[1], ceil_mode,
                   relations=static)
    # Pad enough on the far side for ceil_mode windows that run past the declared padding.
    extra_h = max(0, (oh - 1) * strides[0] + dilation[0] * (kernel[0] - 1) + 1 - h - padding[0])
    extra_w = max(0, (ow - 1) * strides[1] + dilation[1] * (kernel[1] - 1) + 1 - w - padding[1])
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding[0], extra_h),
                                       (padding[1], extra_w)), constant_values=fill)
    windows = np.empty((n, c, oh, ow, kernel[0] * kernel[1]))
    for ky in range(kernel[0]):
        for kx in range(kernel[1]):
            y0, x0 = ky * dilation[0], kx * dilation[1]
            windows[..., ky * kernel[1] + kx] = xp[:, :, y0:y0 + strides[0] * (oh - 1) + 1:strides[0],
                                                   x0:x0 + strides[1] * (ow - 1) + 1:strides[1]]
    return windows, oh, ow


@register_op("nn.max_pool2d", REDUCTION, _infer_pool, _legalize_max_pool)
def max_pool2d(x, kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
               ceil_mode=False, count_include_pad=False):
    windows, _, _ = _pool_windows(x, kernel, strides, padding, dilation, ceil_mode, -np.inf)
    return windows.max(axis=-1).astype(x.dtype)


@register_op("nn.avg_pool2d", REDUCTION, _infer_pool, _legalize_avg_pool)
def avg_pool2d(x, kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
               ceil_mode=False, count_include_pad=False):
    _, _, h, w = x.shape
    windows, oh, ow = _pool_windows(x, kernel, strides, padding, (1, 1), ceil_mode, 0.0)
    ys = np.arange(oh) * strides[0] - padding[0]
    xs = np.arange(ow) * strides[1] - padding[1]
    ye = np.minimum(ys + kernel[0], h + padding[2])
    xe = np.minimum(xs + kernel[1], w + padding[3])
    if not count_include_pad:
        ye, ys = np.minimum(ye, h), np.maximum(ys, 0)
        xe, xs = np.minimum(xe, w), np.maximum(xs, 0)
    count = np.outer(ye - ys, xe - xs)
    return (windows.sum(axis=-1) / count).astype(x.dtype)



# ---- N-D pooling (1-, 2- and 3-D: max, avg, lp) -----------------------------------------------

def _infer_pool_nd(x: TensorType, mode: str = "max", kernel=(), strides=(), padding=(),
                   dilation=(), ceil_mode: bool = False, count_include_pad: bool = False,
                   p: float = 2, *, relations: list) -> TensorType:
    if mode not in ("max", "avg", "lp"):
        raise ValueError(f"pool: mode {mode!r} is not max, avg or lp")
    spatial = x.shape[2:]
    _nd_check("pool", spatial, kernel=kernel, strides=strides, padding=padding,
              dilation=dilation)
    return TensorType(x.shape[:2] + _nd_out_sizes(spatial, kernel, strides, padding, dilation,
                                                  ceil_mode, relations=relations), x.dtype)


def _power(v: te.Expr, p: float) -> te.Expr:
    """|v| ** p for v >= 0 (written with exp/log; 0 stays 0)."""
    if p == 1:
        return v
    if p == 2:
        return v * v
    safe = te.maximum(v, te.const(1e-30, v.dtype))
    return te.if_then_else(v > te.const(0.0, v.dtype), te.exp(te.log(safe) * p),
                           te.const(0.0, v.dtype))


def _legalize_pool_nd(x: te.Tensor, out_type: TensorType, name: str, mode: str = "max",
                      kernel=(), strides=(), padding=(), dilation=(), ceil_mode: bool = False,
                      count_include_pad: bool = False, p: float = 2) -> te.Tensor:
    spatial = x.shape[2:]
    n = len(spatial)
    rs = tuple(te.reduce_axis(k, f"r{d}") for d, k in enumerate(kernel))

    def body(b, c, *o):
        pos = _window_positions(o, rs, strides, padding, dilation)
        inside = _all_of([_in_bounds(pos[d], spatial[d]) for d in range(n)])
        read = x[(b, c) + tuple(_clamped(pos[d], spatial[d]) for d in range(n))]
        if mode == "max":
            return te.max_of(te.if_then_else(inside, read, _lowest(x.dtype)), rs)
        value = te.if_then_else(inside, read, te.const(0.0, x.dtype))
        if mode == "lp":
            total = te.sum_of(_power(te.math("abs", value), p), rs)
            return _power(total, 1.0 / p)
        # avg: the window's element count, a sum of per-tap indicators per axis (no division
        # of negative numbers), multiplied over the axes.
        count: te.Expr | None = None
        for d in range(n):
            lo, hi = (-padding[d], spatial[d] + padding[n + d]) if count_include_pad \
                else (0, spatial[d])
            start = o[d] * strides[d] - padding[d]
            taps: te.Expr | None = None
            for k in range(kernel[d]):
                at = start + k * dilation[d]
                one = te.if_then_else(te.logical_and(at >= lo, at < hi), te.const(1, "int64"),
                                      te.const(0, "int64"))
                taps = one if taps is None else taps + one
            count = taps if count is None else count * taps
        count = te.maximum(count, te.const(1, "int64"))
        return te.sum_of(value, rs) / te.cast(count, x.dtype)

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.pool", REDUCTION, _infer_pool_nd, _legalize_pool_nd)
def pool(x: np.ndarray, mode: str = "max", kernel=(), strides=(), padding=(), dilation=(),
         ceil_mode: bool = False, count_include_pad: bool = False, p: float = 2) -> np.ndarray:
    spatial = x.shape[2:]
    n = len(spatial)
    outs = _nd_out_sizes(spatial, kernel, strides, padding, dilation, ceil_mode, relations=[])
    shape = x.shape[:2] + outs
    if mode == "max":
        acc = np.full(shape, -np.inf)
    else:
        acc = np.zeros(shape)
    count = np.zeros(outs)
    for _, per_axis in _nd_taps(spatial, kernel, strides, padding, dilation, outs):
        vals, mask = _gather_nd_window(x.astype(np.float64), per_axis)
        if mode == "max":
            acc = np.maximum(acc, np.where(mask, vals, -np.inf))
        elif mode == "lp":
            acc += np.where(mask, np.abs(vals) ** p, 0.0)
        else:
            acc += np.where(mask, vals, 0.0)
            if count_include_pad:
                inc = np.ones(outs, dtype=bool)
                for d, a in enumerate(per_axis):
                    ok = (a[2] >= -padding[d]) & (a[2] < spatial[d] + padding[n + d])
                    inc = inc & ok.reshape([-1 if e == d else 1 for e in range(n)])
                count += inc
            else:
                count += mask
    if mode == "lp":
        acc = acc ** (1.0 / p)
    elif mode == "avg":
        acc = acc / np.maximum(count, 1)
    return acc.astype(x.dtype)


# ---- max pool indices (ONNX MaxPool's second output) --------------------------------------------

def _infer_pool_indices(x: TensorType, kernel=(), strides=(), padding=(), dilation=(),
                        ceil_mode: bool = False, storage_order: int = 0, *, relations: list
                        ) -> TensorType:
    t = _infer_pool_nd(x, "max", kernel, strides, padding, dilation, ceil_mode,
                       relations=relations)
    return TensorType(t.shape, "int64")


def _flat_index(b, c, pos, channels: int, spatial, storage_order: int):
    """ONNX's index of an input element: row-major over (N, C, spatial), or with the spatial
    axes column-major when storage_order is 1."""
    index = (b * channels + c) * int(np.prod(spatial))
    order = range(len(spatial)) if storage_order == 0 else reversed(range(len(spatial)))
    inner = None
    for d in order:
        inner = pos[d] if inner is None else inner * spatial[d] + pos[d]
    return index + inner


def _legalize_pool_indices(x: te.Tensor, out_type: TensorType, name: str, kernel=(),
                           strides=(), padding=(), dilation=(), ceil_mode: bool = False,
                           storage_order: int = 0) -> te.Tensor:
    spatial = x.shape[2:]
    n = len(spatial)
    best = _legalize_pool_nd(x, TensorType(out_type.shape, x.dtype), f"{name}_max", "max",
                             kernel, strides, padding, dilation, ceil_mode)
    rs = tuple(te.reduce_axis(k, f"q{d}") for d, k in enumerate(kernel))
    big = te.const(int(np.prod(x.shape)), "int64")

    def body(b, c, *o):
        pos = _window_positions(o, rs, strides, padding, dilation)
        clamped = [_clamped(pos[d], spatial[d]) for d in range(n)]
        inside = _all_of([_in_bounds(pos[d], spatial[d]) for d in range(n)])
        hit = te.logical_and(inside, te.eq(x[(b, c) + tuple(clamped)], best[(b, c) + tuple(o)]))
        flat = _flat_index(b, c, clamped, x.shape[1], spatial, storage_order)
        return te.min_of(te.if_then_else(hit, flat, big), rs)

    return te.compute(out_type.shape, body, name=name, dtype="int64")


@register_op("nn.max_pool_indices", REDUCTION, _infer_pool_indices, _legalize_pool_indices)
def max_pool_indices(x: np.ndarray, kernel=(), strides=(), padding=(), dilation=(),
                     ceil_mode: bool = False, storage_order: int = 0) -> np.ndarray:
    spatial = x.shape[2:]
    outs = _nd_out_sizes(spatial, kernel, strides, padding, dilation, ceil_mode, relations=[])
    best = np.full(x.shape[:2] + outs, -np.inf)
    index = np.zeros(x.shape[:2] + outs, dtype=np.int64)
    bc = (np.arange(x.shape[0])[:, None] * x.shape[1] + np.arange(x.shape[1])[None, :])
    bc = bc.reshape(x.shape[:2] + (1,) * len(spatial)) * int(np.prod(spatial))
    for _, per_axis in _nd_taps(spatial, kernel, strides, padding, dilation, outs):
        vals, mask = _gather_nd_window(x.astype(np.float64), per_axis)
        vals = np.where(mask, vals, -np.inf)
        grids = np.ix_(*[a[0] for a in per_axis])
        order = range(len(spatial)) if storage_order == 0 else reversed(range(len(spatial)))
        inner = 0
        for d in order:
            inner = inner * spatial[d] + grids[d]
        better = vals > best
        best = np.where(better, vals, best)
        index = np.where(better, bc + inner, index)
    return index
