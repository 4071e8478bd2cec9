"""Neural-network operators: matmul, convolution (2-D, N-D, transposed), LRN, col2im, softmax
and reductions, and the window helpers they share with pooling (``pool.py``). The layout-only
forms of matmul and convolution (packed constant weights) are in ``layout.py``."""

from __future__ import annotations

import itertools

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.sym import SymbolicShapeError, SymExpr, assume, product
from ..ir.patterns import tag_reduction
from .registry import COMPLEX, INJECTIVE, REDUCTION, broadcast_shape, register_op


# ---- matmul -------------------------------------------------------------------------------------

def _matmul_dims(a: tuple[int, ...], b: tuple[int, ...], transpose_b: bool,
                 relations: list) -> tuple[int, ...]:
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"matmul needs operands of rank >= 2, got {a} and {b}")
    k_b, n = (b[-1], b[-2]) if transpose_b else (b[-2], b[-1])
    if a[-1] != k_b:
        raise ValueError(f"matmul inner dimensions differ: {a} @ {b}"
                         + (" (b transposed)" if transpose_b else ""))
    return broadcast_shape(a[:-2], b[:-2], relations=relations) + (a[-2], n)


def _infer_matmul(a: TensorType, b: TensorType, transpose_b: bool = False, *,
                  relations: list) -> TensorType:
    return TensorType(_matmul_dims(a.shape, b.shape, transpose_b, relations), a.dtype)


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
              ceil_mode: bool = False, *, relations: list) -> int:
    """A window's output size; a symbolic one adds "the window fits" to ``relations``."""
    span = size + pad0 + pad1 - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and isinstance(out, int):
        if (out - 1) * stride >= size + pad0:
            out -= 1  # the last window must start inside the input or its left padding
    elif ceil_mode:
        # the same rule for a run-time size: the last window starts at (out - 1) * stride =
        # span + r, r = (-span) mod stride the rounding up; it starts past the input and its
        # left padding when r >= m = dilation * (k - 1) + 1 - pad1 (as 0 <= r < stride: never
        # for m >= stride, always for m <= 0, else the indicator (r + stride - m) // stride)
        m = dilation * (k - 1) + 1 - pad1
        if m <= 0:
            out -= 1
        elif m < stride:
            out -= ((-span) % stride + stride - m) // stride
    try:
        small = out < 1
    except SymbolicShapeError:   # fits for large enough sizes: checked at run time
        assume(relations, "le", 1, out, f"window {k} fits")
        small = False
    if small:
        raise ValueError(f"window {k} (dilation {dilation}) does not fit input {size} "
                         f"with padding {pad0}+{pad1}")
    return out


def _infer_conv2d(x: TensorType, w: TensorType, strides=(1, 1), padding=(0, 0, 0, 0),
                  dilation=(1, 1), groups: int = 1, *, relations: list) -> TensorType:
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c != cg * groups or o % groups:
        raise ValueError(f"conv2d: input channels {c} and weight {w.shape} with groups={groups} "
                         "do not match")
    oh = _out_size(h, kh, strides[0], padding[0], padding[2], dilation[0], relations=relations)
    ow = _out_size(wd, kw, strides[1], padding[1], padding[3], dilation[1], relations=relations)
    return TensorType((n, o, oh, ow), x.dtype)


def _clamped(e: te.Expr, extent: int) -> te.Expr:
    return te.minimum(te.maximum(e, 0), extent - 1)


def _in_bounds(e: te.Expr, extent: int) -> te.Expr:
    return te.logical_and(e >= 0, e < extent)


def _strided_source(p: te.Expr, r: te.Expr, pad: int, dilation: int, stride: int, extent: int,
                    conds: list) -> te.Expr:
    """The position ``i`` (< ``extent``) of a strided, dilated window whose tap ``r`` lands on
    output ``p`` (``i * stride = p + pad - r * dilation``), as transposed convolution and col2im
    scatter; appends to ``conds`` what must hold for that position to exist; clamped for reads."""
    t = p + pad - r * dilation
    i = t // stride if stride > 1 else t
    conds.append(_in_bounds(i, extent))
    if stride > 1:
        conds.append(te.eq(t % stride, 0))
    return _clamped(i, extent)


def _window_value(x: te.Tensor, n, ic, y, xx, ry, rx, strides, padding, dilation=None
                  ) -> te.Expr:
    """The input a convolution's window tap (ry, rx) reads for output (n, ., y, xx) from
    channel ``ic``: zero in the padding. ``dilation`` None: the packed ops' undilated taps."""
    h, wd = x.shape[2], x.shape[3]
    if dilation is not None:
        ry, rx = ry * dilation[0], rx * dilation[1]
    iy = y * strides[0] - padding[0] + ry
    ix = xx * strides[1] - padding[1] + rx
    if any(padding):
        return te.if_then_else(te.logical_and(_in_bounds(iy, h), _in_bounds(ix, wd)),
                               x[n, ic, _clamped(iy, h), _clamped(ix, wd)], 0.0)
    return x[n, ic, iy, ix]


def _legalize_conv2d(x: te.Tensor, w: te.Tensor, out_type: TensorType, name: str,
                     strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                     groups: int = 1) -> te.Tensor:
    o, cg, kh, kw = w.shape
    og = o // groups
    rc, ry, rx = te.reduce_axis(cg, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    tag_reduction(rc, "conv2d", (x, w), strides=tuple(strides), padding=tuple(padding),
                  dilation=tuple(dilation), groups=groups)

    def body(n: te.IndexVar, oc: te.IndexVar, y: te.IndexVar, xx: te.IndexVar) -> te.Expr:
        ic = rc if groups == 1 else (oc // og) * cg + rc
        value = _window_value(x, n, ic, y, xx, ry, rx, strides, padding, dilation)
        return te.sum_of(value * w[oc, rc, ry, rx], (rc, ry, rx))

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.conv2d", COMPLEX, _infer_conv2d, _legalize_conv2d)
def conv2d(x: np.ndarray, w: np.ndarray, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
           groups: int = 1) -> np.ndarray:
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[2]), (padding[1], padding[3])))
    static: list = []   # numpy: sizes are known, nothing is assumed
    oh = _out_size(h, kh, strides[0], padding[0], padding[2], dilation[0], relations=static)
    ow = _out_size(wd, kw, strides[1], padding[1], padding[3], dilation[1], relations=static)
    # float64, a tap at a time: out[n, g, o', p] += w[g, o', c', tap] @ x[n, g, c', p + tap]
    # through BLAS (the golden check runs this on whole real models: a 1-D convolution over
    # 144160 audio samples took minutes as an einsum per tap)
    og = o // groups
    xg = xp.astype(np.float64).reshape(n, groups, cg, *xp.shape[2:])
    # [KH, KW, G, O', C'] contiguous: numpy's matmul goes through BLAS only for contiguous rows
    wg = np.ascontiguousarray(w.astype(np.float64).reshape(groups, og, cg, kh, kw)
                              .transpose(3, 4, 0, 1, 2))
    if tuple(strides) == (1, 1):
        # stride 1: with the padded image flattened, a tap's window is one contiguous run of
        # it (rows Wp apart), which BLAS reads in place; the Wp - ow columns past each output
        # row are computed and cut
        hp, wp = xp.shape[2:]
        flat = xg.reshape(n, groups, cg, hp * wp)
        run = (oh - 1) * wp + ow
        out = np.zeros((n, groups, og, oh * wp), dtype=np.float64)
        for ky in range(kh):
            for kx in range(kw):
                start = ky * dilation[0] * wp + kx * dilation[1]
                _accumulate_tap(out[..., :run], wg[ky, kx], flat[..., start:start + run])
        return out.reshape(n, o, oh, wp)[..., :ow].astype(x.dtype)
    out = np.zeros((n, groups, og, oh * ow), dtype=np.float64)
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dilation[0], kx * dilation[1]
            patch = xg[..., y0:y0 + strides[0] * (oh - 1) + 1:strides[0],
                       x0:x0 + strides[1] * (ow - 1) + 1:strides[1]].reshape(n, groups, cg, -1)
            _accumulate_tap(out, wg[ky, kx], patch)
    return out.reshape(n, o, oh, ow).astype(x.dtype)


def _accumulate_tap(out: np.ndarray, tap: np.ndarray, patch: np.ndarray) -> None:
    """``out[n, g] += tap[g] @ patch[n, g]`` (out [N, G, O', P], tap [G, O', C'], patch
    [N, G, C', P]): a scale per channel for depthwise, else BLAS's matmul."""
    if tap.shape[1:] == (1, 1):
        out += patch * tap[None]
    else:
        out += np.matmul(tap[None], patch)


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
        count = product([x.shape[d] for d in red])

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
            if combiner == "mean" and isinstance(count, SymExpr):   # a run-time count
                return te.sum_of(value, rs) / te.cast(te.Const(count, "int64"), value.dtype)
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

    tag_reduction(r, "softmax", (x,), dim=axis, log=log)   # codegen/softmax.py's kernel
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


# ---- N-D windows (1-, 2- and 3-D): pooling, convolution, transposed convolution ---------------
# ``padding`` is ONNX's order: the begin pads of every spatial axis, then the end pads.

def _nd_check(kind: str, spatial: tuple[int, ...], **params) -> None:
    n = len(spatial)
    if n < 1:
        raise ValueError(f"{kind}: input needs at least one spatial axis")
    for key, value in params.items():
        want = 2 * n if key in ("padding",) else n
        if len(value) != want:
            raise ValueError(f"{kind}: {key} {list(value)} should have {want} values for "
                             f"{n} spatial axes")


def _nd_out_sizes(spatial, kernel, strides, padding, dilation, ceil_mode=False, *,
                  relations: list) -> tuple[int, ...]:
    n = len(spatial)
    return tuple(_out_size(spatial[d], kernel[d], strides[d], padding[d], padding[n + d],
                           dilation[d], ceil_mode, relations=relations) for d in range(n))


def _all_of(conds: list[te.Expr]) -> te.Expr:
    out = conds[0]
    for c in conds[1:]:
        out = te.logical_and(out, c)
    return out


def _lowest(dtype: str) -> te.Expr:
    if dtype in te.FLOAT_DTYPES:
        return te.const(float("-inf"), dtype)
    return te.const(int(np.iinfo(dtype).min), dtype)


def _window_positions(o, kernel_axes, strides, padding, dilation):
    return [o[d] * strides[d] - padding[d] + kernel_axes[d] * dilation[d]
            for d in range(len(kernel_axes))]


def _nd_taps(spatial, kernel, strides, padding, dilation, outs):
    """For every kernel offset: per-axis (clipped positions, in-bounds mask, raw positions)."""
    n = len(spatial)
    for offs in itertools.product(*[range(k) for k in kernel]):
        per_axis = []
        for d in range(n):
            pos = np.arange(outs[d]) * strides[d] - padding[d] + offs[d] * dilation[d]
            per_axis.append((np.clip(pos, 0, spatial[d] - 1), (pos >= 0) & (pos < spatial[d]),
                             pos))
        yield offs, per_axis


def _gather_nd_window(x: np.ndarray, per_axis) -> tuple[np.ndarray, np.ndarray]:
    n = len(per_axis)
    grids = np.ix_(*[a[0] for a in per_axis])
    vals = x[(slice(None), slice(None)) + grids]
    mask = np.ones([len(a[1]) for a in per_axis], dtype=bool)
    for d, a in enumerate(per_axis):
        mask = mask & a[1].reshape([-1 if e == d else 1 for e in range(n)])
    return vals, mask


# ---- N-D convolution ----------------------------------------------------------------------------

def _infer_conv_nd(x: TensorType, w: TensorType, strides=(), padding=(), dilation=(),
                   groups: int = 1, *, relations: list) -> TensorType:
    spatial = x.shape[2:]
    _nd_check("conv", spatial, strides=strides, padding=padding, dilation=dilation)
    if len(w.shape) != len(x.shape):
        raise ValueError(f"conv: weight {w.shape} and input {x.shape} ranks differ")
    c, o, cg = x.shape[1], w.shape[0], w.shape[1]
    if c != cg * groups or o % groups:
        raise ValueError(f"conv: input channels {c} and weight {w.shape} with groups={groups} "
                         "do not match")
    return TensorType((x.shape[0], o) + _nd_out_sizes(spatial, w.shape[2:], strides, padding,
                                                      dilation, relations=relations), x.dtype)


def _legalize_conv_nd(x: te.Tensor, w: te.Tensor, out_type: TensorType, name: str, strides=(),
                      padding=(), dilation=(), groups: int = 1) -> te.Tensor:
    spatial = x.shape[2:]
    n = len(spatial)
    o, cg = w.shape[0], w.shape[1]
    og = o // groups
    rc = te.reduce_axis(cg, "rc")
    rs = tuple(te.reduce_axis(k, f"r{d}") for d, k in enumerate(w.shape[2:]))

    def body(b, oc, *out):
        ic = rc if groups == 1 else (oc // og) * cg + rc
        pos = _window_positions(out, rs, strides, padding, dilation)
        inside = _all_of([_in_bounds(pos[d], spatial[d]) for d in range(n)])
        read = x[(b, ic) + tuple(_clamped(pos[d], spatial[d]) for d in range(n))]
        value = te.if_then_else(inside, read, te.const(0.0, x.dtype)) if any(padding) else \
            x[(b, ic) + tuple(pos)]
        return te.sum_of(value * w[(oc, rc) + rs], (rc,) + rs)

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.conv", COMPLEX, _infer_conv_nd, _legalize_conv_nd)
def conv(x: np.ndarray, w: np.ndarray, strides=(), padding=(), dilation=(),
         groups: int = 1) -> np.ndarray:
    spatial = x.shape[2:]
    kernel = w.shape[2:]
    outs = _nd_out_sizes(spatial, kernel, strides, padding, dilation, relations=[])
    o, cg = w.shape[0], w.shape[1]
    og = o // groups
    n = x.shape[0]
    out = np.zeros((n, groups, og, int(np.prod(outs, dtype=np.int64))))
    x64 = x.astype(np.float64)
    for offs, per_axis in _nd_taps(spatial, kernel, strides, padding, dilation, outs):
        vals, mask = _gather_nd_window(x64, per_axis)
        vals = np.where(mask, vals, 0.0).reshape(n, groups, cg, -1)
        wk = np.ascontiguousarray(w[(slice(None), slice(None)) + offs], np.float64) \
            .reshape(groups, og, cg)
        out += np.matmul(wk[None], vals)   # through BLAS, as conv2d's
    return out.reshape((n, o) + outs).astype(x.dtype)


# ``nn.window_unfold`` lays a convolution's window taps along some axes out as channels, so
# that a 2-D convolution computes a 3-D or dilated one (see passes/conv_nd.py): for input
# [N, C, D0, D1, D2] and per axis a (kernel k_a, stride s_a, dilation d_a, pad p_a, size o_a),
# ``y[n, c, t0, t1, t2, j0, j1, j2] = x[n, c, .., j_a * s_a - p_a + t_a * d_a, ..]``, zero
# outside x; shape [N, C, k0, k1, k2, o0, o1, o2]. An axis whose taps stay in the convolution
# has kernel 1: it is only padded (and cut to o_a).

def _infer_window_unfold(x: TensorType, kernel=(1, 1, 1), strides=(1, 1, 1),
                         dilation=(1, 1, 1), pads=(0, 0, 0), sizes=(1, 1, 1)) -> TensorType:
    if len(x.shape) != 5:
        raise ValueError(f"window_unfold: input {x.shape} is not [N, C, D, H, W]")
    if any(len(v) != 3 for v in (kernel, strides, dilation, pads, sizes)):
        raise ValueError("window_unfold: kernel, strides, dilation, pads and sizes need 3 values")
    if min(tuple(kernel) + tuple(strides) + tuple(dilation) + tuple(sizes)) < 1:
        raise ValueError("window_unfold: kernels, strides, dilations and sizes must be positive")
    return TensorType(x.shape[:2] + tuple(kernel) + tuple(sizes), x.dtype)


def _legalize_window_unfold(x: te.Tensor, out_type: TensorType, name: str, kernel=(1, 1, 1),
                            strides=(1, 1, 1), dilation=(1, 1, 1), pads=(0, 0, 0),
                            sizes=(1, 1, 1)) -> te.Tensor:
    spatial = x.shape[2:]

    def body(n, c, *tj):
        pos = [tj[3 + a] * strides[a] - pads[a] + tj[a] * dilation[a] for a in range(3)]
        # axes read at their own positions need no bounds check (and no clamp)
        plain = [(kernel[a], strides[a], pads[a], sizes[a]) == (1, 1, 0, spatial[a])
                 for a in range(3)]
        read = x[(n, c) + tuple(pos[a] if plain[a] else _clamped(pos[a], spatial[a])
                                for a in range(3))]
        checks = [_in_bounds(pos[a], spatial[a]) for a in range(3) if not plain[a]]
        if not checks:
            return read
        return te.if_then_else(_all_of(checks), read, te.const(0.0, x.dtype))

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.window_unfold", INJECTIVE, _infer_window_unfold, _legalize_window_unfold)
def window_unfold(x: np.ndarray, kernel=(1, 1, 1), strides=(1, 1, 1), dilation=(1, 1, 1),
                  pads=(0, 0, 0), sizes=(1, 1, 1)) -> np.ndarray:
    out = np.zeros(x.shape[:2] + tuple(kernel) + tuple(sizes), dtype=x.dtype)
    for taps in itertools.product(*map(range, kernel)):
        pos = [np.arange(sizes[a]) * strides[a] - pads[a] + taps[a] * dilation[a]
               for a in range(3)]
        ok = [(p >= 0) & (p < x.shape[2 + a]) for a, p in enumerate(pos)]
        dst = out[(slice(None), slice(None)) + taps]
        dst[np.ix_(range(x.shape[0]), range(x.shape[1]), *ok)] = \
            x[np.ix_(range(x.shape[0]), range(x.shape[1]), *[p[m] for p, m in zip(pos, ok)])]
    return out


# ---- N-D transposed convolution -----------------------------------------------------------------

def _conv_transpose_sizes(spatial, kernel, strides, padding, dilation, output_padding):
    n = len(spatial)
    outs = tuple(strides[d] * (spatial[d] - 1) + output_padding[d] + (kernel[d] - 1) * dilation[d]
                 + 1 - padding[d] - padding[n + d] for d in range(n))
    if any(s < 1 for s in outs):
        raise ValueError(f"conv_transpose: output size {outs} is empty")
    return outs


def _infer_conv_transpose(x: TensorType, w: TensorType, b: TensorType | None = None, strides=(),
                          padding=(), dilation=(), output_padding=(), groups: int = 1
                          ) -> TensorType:
    spatial = x.shape[2:]
    _nd_check("conv_transpose", spatial, strides=strides, padding=padding, dilation=dilation,
              output_padding=output_padding)
    if len(w.shape) != len(x.shape) or w.shape[0] != x.shape[1] or x.shape[1] % groups:
        raise ValueError(f"conv_transpose: weight {w.shape} does not fit input {x.shape} with "
                         f"groups={groups} (weight is [C_in, C_out/groups, k...])")
    outs = _conv_transpose_sizes(spatial, w.shape[2:], strides, padding, dilation,
                                 output_padding)
    if b is not None and b.shape != (w.shape[1] * groups,):
        raise ValueError(f"conv_transpose: bias {b.shape} should be [{w.shape[1] * groups}]")
    return TensorType((x.shape[0], w.shape[1] * groups) + outs, x.dtype)


def _legalize_conv_transpose(x: te.Tensor, w: te.Tensor, b: te.Tensor | None = None, *,
                             out_type: TensorType, name: str, strides=(), padding=(),
                             dilation=(), output_padding=(), groups: int = 1) -> te.Tensor:
    """The generic loop nest (every output sums every tap that lands on it); constant weights
    take the fast path instead (``passes/conv_transpose.py``)."""
    spatial = x.shape[2:]
    n = len(spatial)
    cg = x.shape[1] // groups
    og = w.shape[1]
    rc = te.reduce_axis(cg, "rc")
    rs = tuple(te.reduce_axis(k, f"r{d}") for d, k in enumerate(w.shape[2:]))

    def body(n_, oc, *out):
        ic = rc if groups == 1 else (oc // og) * cg + rc
        woc = oc if groups == 1 else oc % og
        conds, idx = [], []
        for d in range(n):
            idx.append(_strided_source(out[d], rs[d], padding[d], dilation[d], strides[d],
                                       spatial[d], conds))
        value = te.if_then_else(_all_of(conds), x[(n_, ic) + tuple(idx)], te.const(0.0, x.dtype))
        total = te.sum_of(value * w[(ic, woc) + rs], (rc,) + rs)
        return total if b is None else total + b[oc]

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.conv_transpose", COMPLEX, _infer_conv_transpose, _legalize_conv_transpose)
def conv_transpose(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, strides=(),
                   padding=(), dilation=(), output_padding=(), groups: int = 1) -> np.ndarray:
    spatial = x.shape[2:]
    n = len(spatial)
    kernel = w.shape[2:]
    outs = _conv_transpose_sizes(spatial, kernel, strides, padding, dilation, output_padding)
    cg, og = x.shape[1] // groups, w.shape[1]
    # Scatter in full coordinates (input i, tap k land at i * stride + k * dilation) on a
    # canvas [lo, hi) that also covers every output position o (at o + pad_begin).
    lo = [min(0, padding[d]) for d in range(n)]
    hi = [max((spatial[d] - 1) * strides[d] + (kernel[d] - 1) * dilation[d] + 1,
              outs[d] + padding[d]) for d in range(n)]
    canvas = np.zeros((x.shape[0], og * groups) + tuple(top - bottom for bottom, top in zip(lo, hi)))
    for offs in itertools.product(*[range(k) for k in kernel]):
        where = tuple(slice(offs[d] * dilation[d] - lo[d],
                            offs[d] * dilation[d] - lo[d] + (spatial[d] - 1) * strides[d] + 1,
                            strides[d]) for d in range(n))
        for g in range(groups):
            wk = w[(slice(g * cg, (g + 1) * cg), slice(None)) + offs].astype(np.float64)
            canvas[(slice(None), slice(g * og, (g + 1) * og)) + where] += np.einsum(
                "nc...,co->no...", x[:, g * cg:(g + 1) * cg].astype(np.float64), wk)
    crop = tuple(slice(padding[d] - lo[d], padding[d] - lo[d] + outs[d]) for d in range(n))
    out = canvas[(slice(None), slice(None)) + crop]
    if b is not None:
        out = out + b.astype(np.float64).reshape((1, -1) + (1,) * n)
    return out.astype(x.dtype)


# ---- interleaving the phases of a transposed convolution -----------------------------------------
# A transposed convolution with strides s computes each output phase (o mod s, per axis) from
# stride-1 convolutions or one GEMM (``passes/conv_transpose.py``); this operator sums those
# results into their places, with the bias. Its output is [N, G, C/G, Q1, s1, ..., Qd, sd]
# (Q = ``blocks`` per axis, Q * s covering the output), which a reshape views as [N, C, ...].
# ``phases`` has, for every phase in row-major order over (r1, ..., rd), a tuple of terms
# (input number, channel of its first output channel in group 0, channel step between groups,
# shift of q on each axis) that add up: ``y[n, g, c, .., q, r, ..] = sum over terms of
# inputs[i][n, g * step + first + c, .., q + shift, ..]`` (zero for a phase without terms).

def _infer_phase_interleave(*xs: TensorType, phases=(), strides=(), groups: int = 1,
                            channels: int = 1, blocks=(), has_bias: bool = False) -> TensorType:
    inputs = xs[:-1] if has_bias else xs
    if not inputs or len(phases) != int(np.prod(strides)):
        raise ValueError(f"phase_interleave: {len(phases)} phases for strides {strides}")
    n = len(strides)
    batch = inputs[0].shape[0]
    if len(blocks) != n or min(blocks) < 1:
        raise ValueError(f"phase_interleave: blocks {blocks} should be {n} positive sizes")
    for i, first, step, shift in (term for terms in phases for term in terms):
        t = inputs[i].shape
        if len(t) != n + 2 or t[0] != batch:
            raise ValueError(f"phase_interleave: input {t} is not [N, C, {n} spatial axes]")
        if (groups - 1) * step + first + channels // groups > t[1]:
            raise ValueError(f"phase_interleave: input {t} has too few channels")
        if any(shift[d] < 0 or t[2 + d] - shift[d] < blocks[d] for d in range(n)):
            raise ValueError(f"phase_interleave: input {t} shifted by {shift} holds fewer "
                             f"than {list(blocks)} positions")
    if not any(phases):
        raise ValueError("phase_interleave: no phase has an input")
    shape = (batch, groups, channels // groups)
    for q, s in zip(blocks, strides):
        shape += (q, s)
    return TensorType(shape, inputs[0].dtype)


def _legalize_phase_interleave(*xs: te.Tensor, out_type: TensorType, name: str, phases=(),
                               strides=(), groups: int = 1, channels: int = 1, blocks=(),
                               has_bias: bool = False) -> te.Tensor:
    inputs, bias = (xs[:-1], xs[-1]) if has_bias else (xs, None)
    n = len(strides)
    og = channels // groups
    zero = te.const(0.0, out_type.dtype)
    single = _single_stack(phases, og)
    every = list(itertools.product(*map(range, strides)))

    def phase_sum(b, g, c, q, terms) -> te.Expr:
        total = None
        for i, first, step, shift in terms:
            read = inputs[i][(b, g * step + first + c) + tuple(q[d] + shift[d] for d in range(n))]
            total = read if total is None else total + read
        return zero if total is None else total

    def body(b, g, c, *qr):
        q, r = qr[0::2], qr[1::2]
        if single is not None:   # one input holds every phase, channel-major by phase
            flat = None
            for d in range(n):
                flat = r[d] if flat is None else flat * strides[d] + r[d]
            value = inputs[0][(b, g * single + flat * og + c) + tuple(q)]
        else:
            # the last phase is the default, the others override it where r matches
            value = phase_sum(b, g, c, q, phases[-1])
            for at, terms in list(zip(every, phases))[:-1]:
                hit = _all_of([te.eq(r[d], at[d]) for d in range(n)])
                value = te.if_then_else(hit, phase_sum(b, g, c, q, terms), value)
        return value if bias is None else value + bias[g * og + c]

    return te.compute(out_type.shape, body, name=name)


def _single_stack(phases, og: int) -> int | None:
    """The channel step between groups when every phase is one unshifted term of input 0 at
    channel ``phase number * og`` (kernel == stride: one GEMM computed them all), else None."""
    steps = {terms[0][2] for terms in phases if len(terms) == 1}
    if len(steps) != 1:
        return None
    for j, terms in enumerate(phases):
        if len(terms) != 1:
            return None
        i, first, _, shift = terms[0]
        if i != 0 or first != j * og or any(shift):
            return None
    return steps.pop()


@register_op("nn.phase_interleave", INJECTIVE, _infer_phase_interleave, _legalize_phase_interleave)
def phase_interleave(*xs: np.ndarray, phases=(), strides=(), groups: int = 1, channels: int = 1,
                     blocks=(), has_bias: bool = False) -> np.ndarray:
    inputs, bias = (xs[:-1], xs[-1]) if has_bias else (xs, None)
    shape = _infer_phase_interleave(*[TensorType(a.shape, str(a.dtype)) for a in xs],
                                    phases=phases, strides=strides, groups=groups,
                                    channels=channels, blocks=blocks, has_bias=has_bias).shape
    n = len(strides)
    og = channels // groups
    out = np.zeros(shape, dtype=np.float64)
    for at, terms in zip(itertools.product(*map(range, strides)), phases):
        place = tuple(x for d in range(n) for x in (slice(None), at[d]))
        for i, first, step, shift in terms:
            for g in range(groups):
                src = inputs[i][:, g * step + first:g * step + first + og]
                src = src[(slice(None), slice(None)) + tuple(slice(shift[d], shift[d] + blocks[d])
                                                             for d in range(n))]
                out[(slice(None), g, slice(None)) + place] += src
    if bias is not None:
        out = out + bias.reshape((1, groups, og) + (1,) * (2 * n))
    return out.astype(inputs[0].dtype)


# ---- local response normalization ---------------------------------------------------------------

def _infer_lrn(x: TensorType, size: int = 1, alpha: float = 1e-4, beta: float = 0.75,
               bias: float = 1.0) -> TensorType:
    if len(x.shape) < 3:
        raise ValueError(f"lrn: input {x.shape} needs a channel axis and spatial axes")
    if size < 1:
        raise ValueError(f"lrn: size {size} must be positive")
    return x


def _legalize_lrn(x: te.Tensor, out_type: TensorType, name: str, size: int = 1,
                  alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> te.Tensor:
    channels = x.shape[1]
    before = (size - 1) // 2
    r = te.reduce_axis(size, "r")

    def square_sum(b, c, *rest):
        ch = c - before + r
        v = te.if_then_else(_in_bounds(ch, channels), x[(b, _clamped(ch, channels)) + rest],
                            te.const(0.0, x.dtype))
        return te.sum_of(v * v, r)

    sq = te.compute(x.shape, square_sum, name=f"{name}_sq")

    def body(*i):
        base = te.const(bias, x.dtype) + te.const(alpha / size, x.dtype) * sq[i]
        return x[i] * te.exp(te.log(base) * te.const(-beta, x.dtype))

    return te.compute(x.shape, body, name=name)


@register_op("nn.lrn", REDUCTION, _infer_lrn, _legalize_lrn)
def lrn(x: np.ndarray, size: int = 1, alpha: float = 1e-4, beta: float = 0.75,
        bias: float = 1.0) -> np.ndarray:
    channels = x.shape[1]
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.zeros(x.shape)
    x64 = x.astype(np.float64)
    for c in range(channels):
        sq[:, c] = (x64[:, max(0, c - before):min(channels, c + after + 1)] ** 2).sum(axis=1)
    return (x64 / (bias + alpha / size * sq) ** beta).astype(x.dtype)


# ---- col2im (ONNX Col2Im): sum sliding blocks back into an image --------------------------------

def _col2im_blocks(image, block, strides, padding, dilation) -> tuple[int, ...]:
    n = len(image)
    return tuple((image[d] + padding[d] + padding[n + d] - dilation[d] * (block[d] - 1) - 1)
                 // strides[d] + 1 for d in range(n))


def _infer_col2im(x: TensorType, image_shape=(), block_shape=(), strides=(), padding=(),
                  dilation=()) -> TensorType:
    _nd_check("col2im", tuple(image_shape), block_shape=block_shape, strides=strides,
              padding=padding, dilation=dilation)
    if len(x.shape) != 3:
        raise ValueError(f"col2im: input {x.shape} must be [N, C * prod(block), L]")
    k = int(np.prod(block_shape))
    blocks = _col2im_blocks(image_shape, block_shape, strides, padding, dilation)
    if x.shape[1] % k or x.shape[2] != int(np.prod(blocks)) or min(blocks) < 1:
        raise ValueError(f"col2im: input {x.shape} does not hold {list(blocks)} blocks of "
                         f"{list(block_shape)} over an image {list(image_shape)}")
    return TensorType((x.shape[0], x.shape[1] // k) + tuple(int(v) for v in image_shape),
                      x.dtype)


def _legalize_col2im(x: te.Tensor, out_type: TensorType, name: str, image_shape=(),
                     block_shape=(), strides=(), padding=(), dilation=()) -> te.Tensor:
    n = len(image_shape)
    blocks = _col2im_blocks(image_shape, block_shape, strides, padding, dilation)
    rs = tuple(te.reduce_axis(k, f"r{d}") for d, k in enumerate(block_shape))

    def body(b, ch, *p):
        conds, row, col = [], None, None
        for d in range(n):
            i = _strided_source(p[d], rs[d], padding[d], dilation[d], strides[d], blocks[d],
                                conds)
            row = rs[d] if row is None else row * block_shape[d] + rs[d]
            col = i if col is None else col * blocks[d] + i
        k = int(np.prod(block_shape))
        value = x[b, ch * k + row, col]
        return te.sum_of(te.if_then_else(_all_of(conds), value, te.const(0.0, x.dtype)), rs)

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.col2im", REDUCTION, _infer_col2im, _legalize_col2im)
def col2im(x: np.ndarray, image_shape=(), block_shape=(), strides=(), padding=(),
           dilation=()) -> np.ndarray:
    n = len(image_shape)
    blocks = _col2im_blocks(image_shape, block_shape, strides, padding, dilation)
    k = int(np.prod(block_shape))
    cols = x.astype(np.float64).reshape((x.shape[0], x.shape[1] // k) + tuple(block_shape)
                                        + tuple(blocks))
    padded = np.zeros(x.shape[:1] + (x.shape[1] // k,)
                      + tuple(image_shape[d] + padding[d] + padding[n + d] for d in range(n)))
    for offs in itertools.product(*[range(b) for b in block_shape]):
        where = tuple(slice(offs[d] * dilation[d],
                            offs[d] * dilation[d] + (blocks[d] - 1) * strides[d] + 1, strides[d])
                      for d in range(n))
        padded[(slice(None), slice(None)) + where] += cols[(slice(None), slice(None)) + offs]
    crop = tuple(slice(padding[d], padding[d] + image_shape[d]) for d in range(n))
    return padded[(slice(None), slice(None)) + crop].astype(x.dtype)
