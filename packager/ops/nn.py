"""Neural-network operators: matmul, convolution, pooling, softmax and reductions."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .registry import COMPLEX, REDUCTION, broadcast_shape, register_op


# ---- matmul -------------------------------------------------------------------------------------

def _matmul_dims(a: tuple[int, ...], b: tuple[int, ...], transpose_b: bool) -> tuple[int, ...]:
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"matmul needs operands of rank >= 2, got {a} and {b}")
    k_b, n = (b[-1], b[-2]) if transpose_b else (b[-2], b[-1])
    if a[-1] != k_b:
        raise ValueError(f"matmul inner dimensions differ: {a} @ {b}"
                         + (" (b transposed)" if transpose_b else ""))
    return broadcast_shape(a[:-2], b[:-2]) + (a[-2], n)


def _infer_matmul(a: TensorType, b: TensorType, transpose_b: bool = False) -> TensorType:
    return TensorType(_matmul_dims(a.shape, b.shape, transpose_b), a.dtype)


def _batch_index(t: te.Tensor, batch_axes: tuple[te.IndexVar, ...]) -> tuple:
    nb = t.ndim - 2
    offset = len(batch_axes) - nb
    return tuple(batch_axes[offset + d] if t.shape[d] != 1 else 0 for d in range(nb))


def _legalize_matmul(a: te.Tensor, b: te.Tensor, out_type: TensorType, name: str,
                     transpose_b: bool = False) -> te.Tensor:
    k = te.reduce_axis(a.shape[-1], "k")
    tag_reduction(k, "matmul", (a, b), transpose_b=transpose_b)

    def body(*i: te.IndexVar) -> te.Expr:
        batch, m, n = i[:-2], i[-2], i[-1]
        b_idx = (n, k) if transpose_b else (k, n)
        return te.sum_of(a[_batch_index(a, batch) + (m, k)] * b[_batch_index(b, batch) + b_idx], k)

    return te.compute(out_type.shape, body, name=name)


@register_op("matmul", COMPLEX, _infer_matmul, _legalize_matmul)
def matmul(a: np.ndarray, b: np.ndarray, transpose_b: bool = False) -> np.ndarray:
    return np.matmul(a, np.swapaxes(b, -1, -2) if transpose_b else b).astype(a.dtype)


# ---- conv2d -------------------------------------------------------------------------------------

def _out_size(size: int, k: int, stride: int, pad0: int, pad1: int, dilation: int = 1,
              ceil_mode: bool = False) -> int:
    span = size + pad0 + pad1 - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad0:
        out -= 1  # the last window must start inside the input or its left padding
    if out < 1:
        raise ValueError(f"window {k} (dilation {dilation}) does not fit input {size} "
                         f"with padding {pad0}+{pad1}")
    return out


def _infer_conv2d(x: TensorType, w: TensorType, strides=(1, 1), padding=(0, 0, 0, 0),
                  dilation=(1, 1), groups: int = 1) -> TensorType:
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c != cg * groups or o % groups:
        raise ValueError(f"conv2d: input channels {c} and weight {w.shape} with groups={groups} "
                         "do not match")
    oh = _out_size(h, kh, strides[0], padding[0], padding[2], dilation[0])
    ow = _out_size(wd, kw, strides[1], padding[1], padding[3], dilation[1])
    return TensorType((n, o, oh, ow), x.dtype)


def _clamped(e: te.Expr, extent: int) -> te.Expr:
    return te.minimum(te.maximum(e, 0), extent - 1)


def _in_bounds(e: te.Expr, extent: int) -> te.Expr:
    return te.logical_and(e >= 0, e < extent)


def _legalize_conv2d(x: te.Tensor, w: te.Tensor, out_type: TensorType, name: str,
                     strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                     groups: int = 1) -> te.Tensor:
    _, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    rc, ry, rx = te.reduce_axis(cg, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    padded = any(padding)
    tag_reduction(rc, "conv2d", (x, w), strides=tuple(strides), padding=tuple(padding),
                  dilation=tuple(dilation), groups=groups)

    def body(n: te.IndexVar, oc: te.IndexVar, y: te.IndexVar, xx: te.IndexVar) -> te.Expr:
        ic = rc if groups == 1 else (oc // og) * cg + rc
        iy = y * strides[0] - padding[0] + ry * dilation[0]
        ix = xx * strides[1] - padding[1] + rx * dilation[1]
        if padded:
            value = te.if_then_else(te.logical_and(_in_bounds(iy, h), _in_bounds(ix, wd)),
                                    x[n, ic, _clamped(iy, h), _clamped(ix, wd)], 0.0)
        else:
            value = x[n, ic, iy, ix]
        return te.sum_of(value * w[oc, rc, ry, rx], (rc, ry, rx))

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.conv2d", COMPLEX, _infer_conv2d, _legalize_conv2d)
def conv2d(x: np.ndarray, w: np.ndarray, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
           groups: int = 1) -> np.ndarray:
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[2]), (padding[1], padding[3])))
    oh = _out_size(h, kh, strides[0], padding[0], padding[2], dilation[0])
    ow = _out_size(wd, kw, strides[1], padding[1], padding[3], dilation[1])
    out = np.zeros((n, o, oh, ow), dtype=np.float64)
    og = o // groups
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg].astype(np.float64)
        wg = w[g * og:(g + 1) * og].astype(np.float64)
        for ky in range(kh):
            for kx in range(kw):
                y0, x0 = ky * dilation[0], kx * dilation[1]
                patch = xg[:, :, y0:y0 + strides[0] * (oh - 1) + 1:strides[0],
                           x0:x0 + strides[1] * (ow - 1) + 1:strides[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, ky, kx])
    return out.astype(x.dtype)


# ---- pooling ------------------------------------------------------------------------------------

def _infer_pool(x: TensorType, kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0),
                dilation=(1, 1), ceil_mode: bool = False, count_include_pad: bool = False
                ) -> TensorType:
    n, c, h, w = x.shape
    oh = _out_size(h, kernel[0], strides[0], padding[0], padding[2], dilation[0], ceil_mode)
    ow = _out_size(w, kernel[1], strides[1], padding[1], padding[3], dilation[1], ceil_mode)
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
    oh = _out_size(h, kernel[0], strides[0], padding[0], padding[2], dilation[0], ceil_mode)
    ow = _out_size(w, kernel[1], strides[1], padding[1], padding[3], dilation[1], ceil_mode)
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


# ---- reductions and softmax ---------------------------------------------------------------------

def _norm_axes(axes, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    return tuple(sorted(a % ndim for a in axes))


def _infer_reduce(x: TensorType, axes=None, keepdims: bool = True) -> TensorType:
    red = _norm_axes(axes, len(x.shape))
    shape = tuple(1 if d in red else n for d, n in enumerate(x.shape) if keepdims or d not in red)
    return TensorType(shape, x.dtype)


def _reduce_legalizer(combiner: str):
    def legalize(x: te.Tensor, out_type: TensorType, name: str, axes=None,
                 keepdims: bool = True) -> te.Tensor:
        red = _norm_axes(axes, x.ndim)
        raxes = {d: te.reduce_axis(x.shape[d], f"r{d}") for d in red}
        count = int(np.prod([x.shape[d] for d in red]))

        def body(*i):
            it = iter(i)
            idx = []
            for d in range(x.ndim):
                if d in red:
                    idx.append(raxes[d])
                    if keepdims:
                        next(it)
                else:
                    idx.append(next(it))
            value = x[tuple(idx)]
            rs = tuple(raxes.values())
            if combiner == "mean":
                return te.sum_of(value, rs) * (1.0 / count)
            return te._reduce(combiner, value, rs)

        return te.compute(out_type.shape, body, name=name)
    return legalize


for _name, _np_fn in {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}.items():
    register_op(_name, REDUCTION, _infer_reduce, _reduce_legalizer(_name))(
        lambda x, axes=None, keepdims=True, _f=_np_fn:
        _f(x, axis=None if axes is None else tuple(axes), keepdims=keepdims).astype(x.dtype))


def _infer_softmax(x: TensorType, axis: int = -1) -> TensorType:
    return x


def _softmax_stages(x: te.Tensor, axis: int, name: str, log: bool) -> te.Tensor:
    axis %= x.ndim
    row_shape = tuple(1 if d == axis else n for d, n in enumerate(x.shape))
    r = te.reduce_axis(x.shape[axis], "r")

    def along(i, index):
        return tuple(index if d == axis else v for d, v in enumerate(i))

    row_max = te.compute(row_shape, lambda *i: te.max_of(x[along(i, r)], r), name=f"{name}_max")
    shifted = te.compute(x.shape, lambda *i: x[i] - row_max[along(i, 0)], name=f"{name}_shift")
    total = te.compute(row_shape, lambda *i: te.sum_of(te.exp(shifted[along(i, r)]), r),
                       name=f"{name}_sum")
    if log:
        return te.compute(x.shape, lambda *i: shifted[i] - te.log(total[along(i, 0)]), name=name)
    return te.compute(x.shape, lambda *i: te.exp(shifted[i]) / total[along(i, 0)], name=name)


@register_op("nn.softmax", REDUCTION, _infer_softmax,
             lambda x, out_type, name, axis=-1: _softmax_stages(x, axis, name, log=False))
def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


@register_op("nn.log_softmax", REDUCTION, _infer_softmax,
             lambda x, out_type, name, axis=-1: _softmax_stages(x, axis, name, log=True))
def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    s = x - x.max(axis=axis, keepdims=True)
    return (s - np.log(np.exp(s).sum(axis=axis, keepdims=True))).astype(x.dtype)
