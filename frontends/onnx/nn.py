"""Converters for neural-network ONNX operators: convolution, pooling, Gemm/MatMul,
normalization, softmax, dropout and reductions."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ...packager.ir.graph import Constant, Value
from ...packager.ir.sym import is_static
from .registry import NodeContext, converter
from . import valueinputs

# ---- convolution and pooling --------------------------------------------------------------------

_WINDOW_ATTRS = {"auto_pad": "NOTSET", "kernel_shape": None, "pads": None, "strides": None,
                 "dilations": None}


def _same_as_ceil(ctx: NodeContext, sizes: Sequence[Any], kernel: Sequence[int],
                  strides: Sequence[int], dilations: Sequence[int]) -> bool:
    """Whether a pooling window's ``auto_pad=SAME_UPPER`` over sizes known only at run time is
    the unpadded window in ceil mode: with a window as wide as its stride 2 (TensorFlow's 2x2
    stride-2 'SAME' pooling, MTCNN's P-Net) the pad is 0 at the start and size % 2 at the end,
    and the ceil-mode output ceil((size - 2) / 2) + 1 = ceil(size / 2) drops the same padded
    elements (a max ignores them; an average without count_include_pad does not count them)."""
    if ctx.attrs["auto_pad"] != "SAME_UPPER" or all(isinstance(d, int) for d in sizes):
        return False
    return all(s == 1 and k == 1 or (k - 1) * d + 1 == s == 2
               for k, s, d in zip(kernel, strides, dilations))


def _resolve_pads(ctx: NodeContext, sizes: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dilations: Sequence[int]
                  ) -> tuple[list[int], list[int]]:
    """(pads at the start, pads at the end) per spatial axis, from ``pads`` or ``auto_pad``."""
    n = len(sizes)
    mode = ctx.attrs["auto_pad"]
    if mode == "NOTSET":
        pads = list(ctx.attrs["pads"] or [0] * (2 * n))
        if len(pads) != 2 * n:
            raise ctx.error(f"pads {pads} should have {2 * n} values")
        return pads[:n], pads[n:]
    if mode == "VALID":
        return [0] * n, [0] * n
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad={mode!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return begin, end


class _Window:
    """Kernel, strides, dilations and pads of a Conv or pooling node, as 2-D values (a 1-D
    node becomes 2-D with a height of one)."""

    def __init__(self, ctx: NodeContext, x: Value, kernel: Sequence[int],
                 pooling: bool = False) -> None:
        spatial = len(x.type.shape) - 2
        if spatial not in (1, 2, 3):
            raise ctx.error(f"input of shape {x.type.shape}: only 1-D, 2-D and 3-D windows "
                            "(rank 3, 4 or 5 inputs) are supported")
        kernel = list(kernel)
        strides = list(ctx.attrs["strides"] or [1] * spatial)
        dilations = list(ctx.attrs.get("dilations") or [1] * spatial)
        if len(kernel) != spatial or len(strides) != spatial or len(dilations) != spatial:
            raise ctx.error(f"kernel {kernel}, strides {strides} and dilations {dilations} "
                            f"should each have {spatial} values")
        # pooling whose SAME padding is ceil mode (see _same_as_ceil): no pads, ceil mode on
        self.ceil = pooling and _same_as_ceil(ctx, x.type.shape[2:], kernel, strides, dilations)
        begin, end = ([0] * spatial, [0] * spatial) if self.ceil else \
            _resolve_pads(ctx, x.type.shape[2:], kernel, strides, dilations)
        # N-D form (any rank) for the nn.pool / nn.conv rows; 2-D form for the 2-D rows.
        self.nd = dict(kernel=tuple(kernel), strides=tuple(strides), dilation=tuple(dilations),
                       padding=tuple(begin) + tuple(end))
        self.three_d = spatial == 3
        if self.three_d:
            return
        self.one_d = spatial == 1
        lift = (lambda v, fill: [fill] + list(v)) if self.one_d else (lambda v, fill: list(v))
        self.kernel = tuple(lift(kernel, 1))
        self.strides = tuple(lift(strides, 1))
        self.dilation = tuple(lift(dilations, 1))
        b, e = lift(begin, 0), lift(end, 0)
        self.padding = (b[0], b[1], e[0], e[1])

    def to_2d(self, ctx: NodeContext, x: Value) -> Value:
        if not self.one_d:
            return x
        n, c, length = x.type.shape
        return ctx.reshape(x, (n, c, 1, length))

    def from_2d(self, ctx: NodeContext, y: Value) -> Value:
        if not self.one_d:
            return y
        n, c, _, length = y.type.shape
        return ctx.reshape(y, (n, c, length))


def _channel_shaped(ctx: NodeContext, v: Value, rank: int) -> Value:
    """A per-channel vector [C] as [1, C, 1, ...] so it broadcasts over NC... data."""
    return ctx.reshape(v, (1, v.type.shape[0]) + (1,) * (rank - 2))


@converter("Conv", since=1, attrs={**_WINDOW_ATTRS, "group": 1})
def _conv(ctx: NodeContext) -> Value:
    x, w = ctx.input(0), ctx.input(1)
    kernel = w.type.shape[2:]
    given = ctx.attrs["kernel_shape"]
    if given is not None and tuple(given) != tuple(kernel):
        raise ctx.error(f"kernel_shape {list(given)} differs from the weight's {list(kernel)}")
    win = _Window(ctx, x, kernel)
    if win.three_d:
        nd = win.nd
        y = ctx.emit("nn.conv", x, w, strides=nd["strides"], padding=nd["padding"],
                     dilation=nd["dilation"], groups=int(ctx.attrs["group"]))
        if ctx.has_input(2):
            y = ctx.emit("add", y, _channel_shaped(ctx, ctx.input(2), 5))
        return y
    w2 = ctx.reshape(w, w.type.shape[:2] + (1,) + w.type.shape[2:]) if win.one_d else w
    y = ctx.emit("nn.conv2d", win.to_2d(ctx, x), w2, strides=win.strides, padding=win.padding,
                 dilation=win.dilation, groups=int(ctx.attrs["group"]))
    if ctx.has_input(2):
        y = ctx.emit("add", y, _channel_shaped(ctx, ctx.input(2), 4))
    return win.from_2d(ctx, y)


def _pool_kernel(ctx: NodeContext) -> list[int]:
    kernel = ctx.attrs["kernel_shape"]
    if not kernel:
        raise ctx.error("kernel_shape is required")
    return list(kernel)


def _wants_output(ctx: NodeContext, i: int) -> bool:
    return len(ctx.node.output) > i and bool(ctx.node.output[i])


@converter("MaxPool", since=1, attrs={**_WINDOW_ATTRS, "ceil_mode": 0, "storage_order": 0})
def _max_pool(ctx: NodeContext) -> Value | list[Value]:
    x = ctx.input(0)
    win = _Window(ctx, x, _pool_kernel(ctx), pooling=True)
    ceil_mode = bool(ctx.attrs["ceil_mode"]) or win.ceil
    if win.three_d:
        y = ctx.emit("nn.pool", x, mode="max", ceil_mode=ceil_mode, **win.nd)
    else:
        y = win.from_2d(ctx, ctx.emit("nn.max_pool2d", win.to_2d(ctx, x), kernel=win.kernel,
                                      strides=win.strides, padding=win.padding,
                                      dilation=win.dilation, ceil_mode=ceil_mode))
    if not _wants_output(ctx, 1):
        return y
    indices = ctx.emit("nn.max_pool_indices", x, ceil_mode=ceil_mode,
                       storage_order=int(ctx.attrs["storage_order"]), **win.nd)
    return [y, indices]


@converter("AveragePool", since=1, attrs={**_WINDOW_ATTRS, "ceil_mode": 0,
                                           "count_include_pad": 0})
def _avg_pool(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    include_pad = bool(ctx.attrs["count_include_pad"])
    win = _Window(ctx, x, _pool_kernel(ctx), pooling=not include_pad)
    ceil_mode = bool(ctx.attrs["ceil_mode"]) or win.ceil
    if win.three_d or any(d != 1 for d in win.nd["dilation"]):
        return ctx.emit("nn.pool", x, mode="avg", ceil_mode=ceil_mode,
                        count_include_pad=include_pad, **win.nd)
    y = ctx.emit("nn.avg_pool2d", win.to_2d(ctx, x), kernel=win.kernel, strides=win.strides,
                 padding=win.padding, ceil_mode=ceil_mode, count_include_pad=include_pad)
    return win.from_2d(ctx, y)


def _global_pool(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        rank = len(x.type.shape)
        if rank < 3:
            raise ctx.error(f"input of shape {x.type.shape} has no spatial axes")
        return ctx.emit(op, x, axes=tuple(range(2, rank)), keepdims=True)
    return convert


converter("GlobalAveragePool", since=1)(_global_pool("mean"))
converter("GlobalMaxPool", since=1)(_global_pool("max"))


@converter("LpPool", since=1, attrs={**_WINDOW_ATTRS, "ceil_mode": 0, "p": 2})
def _lp_pool(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    win = _Window(ctx, x, _pool_kernel(ctx))
    p = ctx.attrs["p"]
    if p is None or float(p) <= 0:
        raise ctx.error(f"p={p} must be positive")
    return ctx.emit("nn.pool", x, mode="lp", p=float(p), ceil_mode=bool(ctx.attrs["ceil_mode"]),
                    **win.nd)


@converter("GlobalLpPool", since=1, attrs={"p": 2})
def _global_lp_pool(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    spatial = x.type.shape[2:]
    if not spatial:
        raise ctx.error(f"input of shape {x.type.shape} has no spatial axes")
    n = len(spatial)
    return ctx.emit("nn.pool", x, mode="lp", p=float(ctx.attrs["p"]), kernel=tuple(spatial),
                    strides=(1,) * n, padding=(0,) * (2 * n), dilation=(1,) * n)


def _conv_transpose_as_pixels(ctx: NodeContext, x: Value, w: Constant, kernel: list) -> Value:
    """A ConvTranspose whose window equals its stride (a 2x2 stride-2 upsampling, as detectors'
    heads write) on sizes known only at run time: each input pixel becomes a kh x kw block, so
    it is a 1x1 convolution to cout*kh*kw channels (the conv kernel with run-time extents)
    whose channels are then placed as the blocks (a transpose)."""
    cin, cout, kh, kw = w.data.shape
    n, _, h, wd = x.type.shape
    w2 = np.ascontiguousarray(w.data.transpose(1, 2, 3, 0).reshape(cout * kh * kw, cin, 1, 1))
    y = ctx.emit("nn.conv2d", x, ctx.constant(w2, "convt_weight"), strides=(1, 1),
                 padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)
    y = ctx.reshape(y, (n, cout, kh, kw, h, wd))
    y = ctx.emit("transpose", y, axes=(0, 1, 4, 2, 5, 3))
    y = ctx.reshape(y, (n, cout, h * kh, wd * kw))
    if ctx.has_input(2):
        y = ctx.emit("add", y, _channel_shaped(ctx, ctx.input(2), 4))
    return y


@converter("ConvTranspose", since=1, attrs={**_WINDOW_ATTRS, "group": 1, "output_padding": None,
                                             "output_shape": None})
def _conv_transpose(ctx: NodeContext) -> Value:
    x, w = ctx.input(0), ctx.input(1)
    spatial = x.type.shape[2:]
    n = len(spatial)
    if n < 1 or len(w.type.shape) != n + 2:
        raise ctx.error(f"input {x.type.shape} and weight {w.type.shape} need the same rank >= 3")
    kernel = list(w.type.shape[2:])
    given = ctx.attrs["kernel_shape"]
    if given is not None and list(given) != kernel:
        raise ctx.error(f"kernel_shape {list(given)} differs from the weight's {kernel}")
    strides = list(ctx.attrs["strides"] or [1] * n)
    dilations = list(ctx.attrs["dilations"] or [1] * n)
    out_pad = list(ctx.attrs["output_padding"] or [0] * n)
    if len(strides) != n or len(dilations) != n or len(out_pad) != n:
        raise ctx.error(f"strides {strides}, dilations {dilations} and output_padding {out_pad} "
                        f"should each have {n} values")
    mode = ctx.attrs["auto_pad"]
    out_shape = ctx.attrs["output_shape"]
    if mode not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad={mode!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    full = [strides[d] * (spatial[d] - 1) + out_pad[d] + (kernel[d] - 1) * dilations[d] + 1
            for d in range(n)]
    if out_shape is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            out_shape = [spatial[d] * strides[d] for d in range(n)]
        out_shape = list(out_shape)[-n:]
        if len(out_shape) != n:
            raise ctx.error(f"output_shape {list(out_shape)} should have {n} values")
        total = [full[d] - int(out_shape[d]) for d in range(n)]
        if mode == "SAME_UPPER":
            begin, end = [t // 2 for t in total], [t - t // 2 for t in total]
        else:
            begin, end = [t - t // 2 for t in total], [t // 2 for t in total]
        pads = begin + end
    elif mode == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = list(ctx.attrs["pads"] or [0] * (2 * n))
        if len(pads) != 2 * n:
            raise ctx.error(f"pads {pads} should have {2 * n} values")
    if not is_static(spatial) and n == 2 and kernel == strides and not any(pads) \
            and dilations == [1, 1] and not any(out_pad) and int(ctx.attrs["group"]) == 1 \
            and isinstance(w, Constant) and out_shape is None:
        return _conv_transpose_as_pixels(ctx, x, w, kernel)
    # The bias goes into the operator: its fast path adds it while placing the outputs.
    args = [x, w, ctx.input(2)] if ctx.has_input(2) else [x, w]
    return ctx.emit("nn.conv_transpose", *args, strides=tuple(strides), padding=tuple(pads),
                    dilation=tuple(dilations), output_padding=tuple(out_pad),
                    groups=int(ctx.attrs["group"]))


@converter("LRN", since=1, attrs={"size": None, "alpha": 1e-4, "beta": 0.75, "bias": 1.0})
def _lrn(ctx: NodeContext) -> Value:
    size = ctx.attrs["size"]
    if size is None or int(size) < 1:
        raise ctx.error(f"size={size} must be a positive integer")
    x = ctx.input(0)
    if len(x.type.shape) < 3:
        raise ctx.error(f"input of shape {x.type.shape} needs a channel axis and spatial axes")
    return ctx.emit("nn.lrn", x, size=int(size), alpha=float(ctx.attrs["alpha"]),
                    beta=float(ctx.attrs["beta"]), bias=float(ctx.attrs["bias"]))


# ---- Gemm and MatMul ----------------------------------------------------------------------------

def _scaled(ctx: NodeContext, v: Value, factor: float) -> Value:
    if factor == 1.0:
        return v
    return ctx.emit("multiply", v, ctx.scalar(factor, v))


@converter("Gemm", since=1, attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0,
                                    "broadcast": 0})
def _gemm(ctx: NodeContext) -> Value:
    a, b = ctx.input(0), ctx.input(1)
    alpha, beta = float(ctx.attrs["alpha"]), float(ctx.attrs["beta"])
    if len(a.type.shape) != 2 or len(b.type.shape) != 2:
        raise ctx.error(f"A {a.type.shape} and B {b.type.shape} must be 2-D")
    if ctx.attrs["transA"]:
        a = ctx.emit("transpose", a, axes=(1, 0))
    b = _scaled(ctx, b, alpha)  # folded into the weights when B is a constant
    y = ctx.emit("matmul", a, b, transpose_b=bool(ctx.attrs["transB"]))
    if ctx.has_input(2) and beta != 0.0:
        y = ctx.emit("add", y, _scaled(ctx, ctx.input(2), beta))
    return y


@converter("MatMul", since=1)
def _matmul(ctx: NodeContext) -> Value:
    a, b = ctx.input(0), ctx.input(1)
    a_vec, b_vec = len(a.type.shape) == 1, len(b.type.shape) == 1
    # numpy semantics for 1-D operands: a vector becomes a row (a) or a column (b), then goes.
    if a_vec:
        a = ctx.reshape(a, (1,) + a.type.shape)
    if b_vec:
        b = ctx.reshape(b, b.type.shape + (1,))
    y = ctx.emit("matmul", a, b)
    shape = y.type.shape
    if a_vec:
        shape = shape[:-2] + shape[-1:]
    if b_vec:
        shape = shape[:-1]
    return ctx.reshape(y, shape)


# ---- normalization, softmax, dropout ------------------------------------------------------------

@converter("BatchNormalization", since=1, attrs={"epsilon": 1e-5, "momentum": 0.9, "spatial": 1,
                                                 "is_test": 0, "training_mode": 0})
def _batch_norm(ctx: NodeContext) -> Value | list[Value]:
    x = ctx.input(0)
    if ctx.attrs["training_mode"]:
        return _batch_norm_training(ctx, x)
    if not ctx.attrs["spatial"]:
        raise ctx.error("spatial=0 (per-activation statistics) is not supported")
    rank = len(x.type.shape)
    shape = (1, x.type.shape[1]) + (1,) * (rank - 2)
    eps = float(ctx.attrs["epsilon"])
    # y = (x - mean) / sqrt(var + eps) * scale + bias = x * s + t
    params = [ctx.const(i) for i in range(1, 5)]
    if all(p is not None for p in params):
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        s = scale / np.sqrt(var + eps)
        t = bias - mean * s
        dtype = x.type.dtype
        s_val = ctx.constant(s.astype(dtype).reshape(shape), "bn_scale")
        t_val = ctx.constant(t.astype(dtype).reshape(shape), "bn_shift")
    else:  # statistics computed at run time: the same formula with operators
        scale, bias, mean, var = (ctx.reshape(ctx.input(i), shape) for i in range(1, 5))
        std = ctx.emit("sqrt", ctx.emit("add", var, ctx.scalar(eps, var)))
        s_val = ctx.emit("divide", scale, std)
        t_val = ctx.emit("subtract", bias, ctx.emit("multiply", mean, s_val))
    return ctx.emit("add", ctx.emit("multiply", x, s_val), t_val)


def _batch_norm_training(ctx: NodeContext, x: Value) -> list[Value]:
    """training_mode=1 (opset 14+): normalize with the batch's own statistics and return the
    running mean and variance updated with ``momentum`` (no state is kept between runs)."""
    if not ctx.attrs["spatial"]:
        raise ctx.error("spatial=0 (per-activation statistics) is not supported")
    rank = len(x.type.shape)
    shape = (1, x.type.shape[1]) + (1,) * (rank - 2)
    axes = (0,) + tuple(range(2, rank))
    eps, momentum = float(ctx.attrs["epsilon"]), float(ctx.attrs["momentum"])
    normalized, mean, inv_std = _normalize(ctx, x, axes, eps)
    scale, bias = (ctx.reshape(ctx.input(i), shape) for i in (1, 2))
    y = ctx.emit("add", ctx.emit("multiply", normalized, scale), bias)
    centered = ctx.emit("subtract", x, mean)
    var = ctx.emit("mean", ctx.emit("multiply", centered, centered), axes=axes, keepdims=False)
    mean = ctx.reshape(mean, (x.type.shape[1],))

    def running(i: int, batch: Value) -> Value:
        old = ctx.emit("multiply", ctx.input(i), ctx.scalar(momentum, batch))
        return ctx.emit("add", old, ctx.emit("multiply", batch, ctx.scalar(1.0 - momentum, batch)))

    return [y, running(3, mean), running(4, var)]


def _normalize(ctx: NodeContext, x: Value, axes: tuple[int, ...], eps: float
               ) -> tuple[Value, Value, Value]:
    """(x - mean) / sqrt(var + eps) over ``axes``; also returns the mean and 1/sqrt(var + eps)."""
    mean = ctx.emit("mean", x, axes=axes, keepdims=True)
    centered = ctx.emit("subtract", x, mean)
    var = ctx.emit("mean", ctx.emit("multiply", centered, centered), axes=axes, keepdims=True)
    inv_std = ctx.emit("divide", ctx.scalar(1.0, var),
                       ctx.emit("sqrt", ctx.emit("add", var, ctx.scalar(eps, var))))
    return ctx.emit("multiply", centered, inv_std), mean, inv_std


def _fits(x: Value, p: Value) -> bool:
    """``p`` broadcasts to ``x`` without changing its shape (same dtype)."""
    xs, ps = x.type.shape, p.type.shape
    if len(ps) > len(xs) or p.type.dtype != x.type.dtype:
        return False
    return all(isinstance(d, int) and d == 1 or d == e or str(d) == str(e)
               for d, e in zip(ps, xs[len(xs) - len(ps):]))


def _is_all(v: Value | None, value: float) -> bool:
    """``v`` is a constant whose every element is ``value`` (torch's GroupNorm export passes
    InstanceNormalization a scale of ones and a bias of zeros)."""
    return isinstance(v, Constant) and bool(np.all(v.data == value))


def normalize_rows(ctx: NodeContext, x: Value, axis: int, eps: float, scale: Value | None,
                   bias: Value | None, groups: int = 1) -> Value | None:
    """``nn.normalize`` (one row kernel, codegen/norm.py) of ``x`` over ``x.shape[axis:]`` (with
    ``groups``: over each of that many slices of it), times ``scale`` plus ``bias`` (None: none;
    constant ones or zeros are dropped); None when a parameter does not broadcast to ``x``
    unchanged (the caller decomposes instead)."""
    if _is_all(scale, 1.0):
        scale = None
    if _is_all(bias, 0.0):
        bias = None
    params = [p for p in (scale, bias) if p is not None]
    if not all(_fits(x, p) for p in params):
        return None
    extra = {"groups": groups} if groups != 1 else {}
    return ctx.emit("nn.normalize", x, *params, axis=axis, eps=float(eps),
                    scale=scale is not None, bias=bias is not None, **extra)


@converter("LayerNormalization", since=17, attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1})
def _layer_norm(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    rank = len(x.type.shape)
    axis = int(ctx.attrs["axis"]) % rank
    eps = float(ctx.attrs["epsilon"])
    bias = ctx.input(2) if ctx.has_input(2) else None
    fast = normalize_rows(ctx, x, axis, eps, ctx.input(1), bias)
    if fast is not None and not (_wants_output(ctx, 1) or _wants_output(ctx, 2)):
        return [fast]
    y, mean, inv_std = _normalize(ctx, x, tuple(range(axis, rank)), eps)
    if fast is not None:   # the statistics are read: they come from the decomposition
        return [fast, mean, inv_std]
    y = ctx.emit("multiply", y, ctx.input(1))  # scale and bias broadcast over x.shape[axis:]
    if bias is not None:
        y = ctx.emit("add", y, bias)
    return [y, mean, inv_std]


@converter("InstanceNormalization", since=1, attrs={"epsilon": 1e-5})
def _instance_norm(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape)
    eps = float(ctx.attrs["epsilon"])
    scale, bias = (_channel_shaped(ctx, ctx.input(i), rank) for i in (1, 2))
    fast = normalize_rows(ctx, x, 2, eps, scale, bias)
    if fast is not None:
        return fast
    y, _, _ = _normalize(ctx, x, tuple(range(2, rank)), eps)
    y = ctx.emit("multiply", y, _channel_shaped(ctx, ctx.input(1), rank))
    return ctx.emit("add", y, _channel_shaped(ctx, ctx.input(2), rank))


def _softmax(op: str, coerce_2d: bool) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        shape = x.type.shape
        rank = len(shape)
        axis = int(ctx.attrs["axis"]) % max(rank, 1)
        if not coerce_2d or axis == rank - 1:
            return ctx.emit(op, x, axis=axis)
        # Opset < 13: the input is seen as 2-D [prod(shape[:axis]), prod(shape[axis:])].
        rows, cols = math.prod(shape[:axis]), math.prod(shape[axis:])
        y = ctx.emit(op, ctx.reshape(x, (rows, cols)), axis=-1)
        return ctx.reshape(y, shape)
    return convert


for _op_type, _op in {"Softmax": "nn.softmax", "LogSoftmax": "nn.log_softmax"}.items():
    converter(_op_type, since=1, attrs={"axis": 1})(_softmax(_op, coerce_2d=True))
    converter(_op_type, since=13, attrs={"axis": -1})(_softmax(_op, coerce_2d=False))


@converter("Dropout", since=1, attrs={"ratio": 0.5, "seed": None, "is_test": 0})
def _dropout(ctx: NodeContext) -> Value | list[Value]:
    x = ctx.input(0)
    if ctx.has_input(2):
        training = ctx.require_const(2, "training_mode")
        if bool(training.reshape(())):
            # Training mode drops at random, except with ratio 0, where it is the identity.
            ratio = ctx.require_const(1, "ratio") if ctx.has_input(1) else np.array(0.5)
            if float(ratio.reshape(())) != 0.0:
                raise ctx.error("training_mode=true with a nonzero ratio drops at random: "
                                "export the model in eval mode")
    if not _wants_output(ctx, 1):
        return x
    # Inference keeps every element: the mask is all true (bool; opset < 10 typed it as x).
    dtype = "bool" if ctx.opset >= 10 else x.type.dtype
    return [x, ctx.constant(np.ones(x.type.shape, dtype=dtype), "dropout_mask")]


def _group_norm(per_channel: bool) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        shape = x.type.shape
        rank = len(shape)
        if rank < 3:
            raise ctx.error(f"input of shape {shape} needs a channel axis and spatial axes")
        groups = ctx.attrs["num_groups"]
        channels = shape[1]
        if groups is None or int(groups) < 1 or channels % int(groups):
            raise ctx.error(f"num_groups={groups} does not divide the {channels} channels")
        groups = int(groups)
        eps = float(ctx.attrs["epsilon"])
        # on x itself, a row per group of channels, so that readers (SiLU) fuse into the
        # kernel; per-group parameters (opset 18) known at export repeat over their channels
        params = [ctx.const(i) for i in (1, 2)]
        if per_channel:
            params = [ctx.input(i) for i in (1, 2)]
        elif all(p is not None for p in params):
            params = [ctx.constant(np.repeat(p, channels // groups), "gn_param")
                      for p in params]
        else:
            params = []
        if params:
            fast = normalize_rows(ctx, x, 1, eps, *(_channel_shaped(ctx, p, rank)
                                                     for p in params), groups=groups)
            if fast is not None:
                return fast
        grouped = ctx.reshape(x, (shape[0], groups, channels // groups) + shape[2:])
        # scale and bias over [N, G, C/G, spatial...]: per channel [G, C/G, 1...] (opset 21),
        # per group [G, 1, 1...] (opset 18)
        param_shape = ((groups, channels // groups) + (1,) * (rank - 2) if per_channel
                       else (groups,) + (1,) * (rank - 1))
        scale, bias = (ctx.reshape(ctx.input(i), param_shape) for i in (1, 2))
        fast = normalize_rows(ctx, grouped, 2, eps, scale, bias)
        if fast is not None:
            return ctx.reshape(fast, shape)
        y, _, _ = _normalize(ctx, grouped, tuple(range(2, rank + 1)), eps)
        if per_channel:  # opset 21: scale and bias per channel
            y = ctx.reshape(y, shape)
            y = ctx.emit("multiply", y, _channel_shaped(ctx, ctx.input(1), rank))
            return ctx.emit("add", y, _channel_shaped(ctx, ctx.input(2), rank))
        # opset 18: scale and bias per group
        y = ctx.emit("multiply", y, _channel_shaped(ctx, ctx.input(1), rank + 1))
        y = ctx.emit("add", y, _channel_shaped(ctx, ctx.input(2), rank + 1))
        return ctx.reshape(y, shape)
    return convert


converter("GroupNormalization", since=18, attrs={"num_groups": None, "epsilon": 1e-5})(
    _group_norm(per_channel=False))
converter("GroupNormalization", since=21, attrs={"num_groups": None, "epsilon": 1e-5,
                                                 "stash_type": 1})(_group_norm(per_channel=True))


# ---- reductions ---------------------------------------------------------------------------------

def _reduce_axes(ctx: NodeContext, from_input: bool) -> tuple[int, ...] | None:
    """The axes to reduce, or None for all; () means 'no reduction' (noop_with_empty_axes)."""
    if from_input:
        axes = [] if not ctx.has_input(1) or valueinputs.holds_nothing(ctx, 1) else \
            ctx.require_const(1, "axes").tolist()
    else:
        axes = ctx.attrs["axes"] or []
    if axes:
        return tuple(int(a) for a in axes)
    return () if ctx.attrs.get("noop_with_empty_axes") else None


def _reduce_body(op: str, before: str | None = None, after: str | None = None
                 ) -> Callable[[NodeContext, Value, tuple[int, ...] | None, bool], Value]:
    def body(ctx: NodeContext, x: Value, axes: tuple[int, ...] | None, keep: bool) -> Value:
        if before == "square":
            x = ctx.emit("multiply", x, x)
        elif before is not None:
            x = ctx.emit(before, x)
        y = ctx.emit(op, x, axes=axes, keepdims=keep)
        return ctx.emit(after, y) if after else y
    return body


def _log_sum_exp(ctx: NodeContext, x: Value, axes: tuple[int, ...] | None, keep: bool) -> Value:
    # log(sum(exp(x - m))) + m, with m the max, so large inputs do not overflow.
    m = ctx.emit("max", x, axes=axes, keepdims=True)
    total = ctx.emit("sum", ctx.emit("exp", ctx.emit("subtract", x, m)), axes=axes, keepdims=keep)
    y = ctx.emit("log", total)
    return ctx.emit("add", y, ctx.reshape(m, y.type.shape))


# ONNX op_type: (body, the opset where axes moved from an attribute to an input)
_REDUCE = {
    "ReduceSum": (_reduce_body("sum"), 13),
    "ReduceMean": (_reduce_body("mean"), 18),
    "ReduceMax": (_reduce_body("max"), 18),
    "ReduceMin": (_reduce_body("min"), 18),
    "ReduceL1": (_reduce_body("sum", before="abs"), 18),
    "ReduceL2": (_reduce_body("sum", before="square", after="sqrt"), 18),
    "ReduceSumSquare": (_reduce_body("sum", before="square"), 18),
    "ReduceLogSum": (_reduce_body("sum", after="log"), 18),
    "ReduceLogSumExp": (_log_sum_exp, 18),
}


# For axes fed at run time (valueinputs.reduce_over): elementwise before, the reduction that
# composes over axes taken one at a time, elementwise after.
_RUN_TIME_AXES = {
    "ReduceSum": (None, "sum", None), "ReduceMean": (None, "mean", None),
    "ReduceMax": (None, "max", None), "ReduceMin": (None, "min", None),
    "ReduceL1": ("abs", "sum", None), "ReduceL2": ("square", "sum", "sqrt"),
    "ReduceSumSquare": ("square", "sum", None), "ReduceLogSum": (None, "sum", "log"),
    "ReduceLogSumExp": (None, "logsumexp", None), "ReduceProd": (None, "prod", None),
}


def reduce_run_time_axes(ctx: NodeContext) -> Value:
    """A reduction whose axes (input 1) are fed at run time (``valueinputs.run_time_axes``)."""
    before, op, after = _RUN_TIME_AXES[ctx.node.op_type]
    x = ctx.input(0)
    if x.type.dtype == "bool":   # max is any, min is all: reduce 0/1 bytes
        if op not in ("max", "min"):
            raise ctx.error(f"{ctx.node.op_type} of a bool tensor is not supported")
        y = valueinputs.reduce_over(ctx, ctx.emit("cast", x, dtype="uint8"),
                                    bool(ctx.attrs["keepdims"]),
                                    lambda c, t, axis: c.emit(op, t, axes=(axis,), keepdims=True))
        return ctx.emit("cast", y, dtype="bool")
    if before == "square":
        x = ctx.emit("multiply", x, x)
    elif before is not None:
        x = ctx.emit(before, x)

    def core(c: NodeContext, y: Value, axis: int) -> Value:
        if op == "logsumexp":
            return _log_sum_exp(c, y, (axis,), True)
        return c.emit(op, y, axes=(axis,), keepdims=True)

    y = valueinputs.reduce_over(ctx, x, bool(ctx.attrs["keepdims"]), core)
    return ctx.emit(after, y) if after else y


def _reduce(body: Callable, from_input: bool) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        if from_input and valueinputs.run_time_axes(ctx, 1) is not None:
            return reduce_run_time_axes(ctx)
        axes = _reduce_axes(ctx, from_input)
        if axes == ():
            return x
        if x.type.dtype == "bool":  # max is any, min is all: reduce 0/1 bytes
            y = body(ctx, ctx.emit("cast", x, dtype="uint8"), axes, bool(ctx.attrs["keepdims"]))
            return ctx.emit("cast", y, dtype="bool")
        return body(ctx, x, axes, bool(ctx.attrs["keepdims"]))
    return convert


for _op_type, (_body, _axes_input_since) in _REDUCE.items():
    converter(_op_type, since=1, attrs={"axes": None, "keepdims": 1})(
        _reduce(_body, from_input=False))
    converter(_op_type, since=_axes_input_since, attrs={"keepdims": 1, "noop_with_empty_axes": 0}
              )(_reduce(_body, from_input=True))


@converter("RMSNormalization", since=23, attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1})
def _rms_norm(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape)
    axis = int(ctx.attrs["axis"]) % rank
    axes = tuple(range(axis, rank))
    mean_square = ctx.emit("mean", ctx.emit("multiply", x, x), axes=axes, keepdims=True)
    eps = ctx.scalar(float(ctx.attrs["epsilon"]), mean_square)
    inv_rms = ctx.emit("divide", ctx.scalar(1.0, mean_square),
                       ctx.emit("sqrt", ctx.emit("add", mean_square, eps)))
    return ctx.emit("multiply", ctx.emit("multiply", x, inv_rms), ctx.input(1))


# ---- losses (inference form) --------------------------------------------------------------------

def _nll(ctx: NodeContext, logp: Value, target: Value, weight: Value | None, reduction: str,
         ignore_index: int | None) -> Value:
    """NegativeLogLikelihoodLoss with a one-hot of the target over the class axis (1)."""
    shape = logp.type.shape
    classes = shape[1]
    dtype = logp.type.dtype
    ids = np.arange(classes, dtype=target.type.dtype).reshape((1, classes) + (1,) * (len(shape) - 2))
    t = ctx.reshape(target, (shape[0], 1) + target.type.shape[1:])
    onehot = ctx.emit("equal", t, ctx.constant(ids, "class_ids"))
    zero = ctx.constant(np.zeros((1,) * len(shape), dtype), "zero")
    picked = ctx.emit("sum", ctx.emit("where", onehot, logp, zero), axes=(1,), keepdims=False)
    if weight is not None:
        w = ctx.reshape(weight, (1, classes) + (1,) * (len(shape) - 2))
        w_t = ctx.emit("sum", ctx.emit("where", onehot, w, zero), axes=(1,), keepdims=False)
    else:
        w_t = ctx.constant(np.ones(picked.type.shape, dtype), "ones")
    if ignore_index is not None:
        keep = ctx.emit("not_equal", target,
                        ctx.constant(np.full((1,) * len(target.type.shape), ignore_index,
                                             target.type.dtype), "ignore_index"))
        w_t = ctx.emit("where", keep, w_t, ctx.constant(np.zeros((1,) * len(w_t.type.shape),
                                                                 dtype), "zero"))
    loss = ctx.emit("negative", ctx.emit("multiply", picked, w_t))
    if reduction == "none":
        return loss
    total = ctx.emit("sum", loss, axes=None, keepdims=False)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise ctx.error(f"reduction={reduction!r} is not one of none, sum, mean")
    return ctx.emit("divide", total, ctx.emit("sum", w_t, axes=None, keepdims=False))


@converter("NegativeLogLikelihoodLoss", since=12, attrs={"reduction": "mean",
                                                         "ignore_index": None})
def _nll_loss(ctx: NodeContext) -> Value:
    weight = ctx.input(2) if ctx.has_input(2) else None
    ii = ctx.attrs["ignore_index"]
    return _nll(ctx, ctx.input(0), ctx.input(1), weight, ctx.attrs["reduction"],
                None if ii is None else int(ii))


@converter("SoftmaxCrossEntropyLoss", since=12, attrs={"reduction": "mean",
                                                       "ignore_index": None})
def _softmax_cross_entropy(ctx: NodeContext) -> list[Value]:
    logp = ctx.emit("nn.log_softmax", ctx.input(0), axis=1)
    weight = ctx.input(2) if ctx.has_input(2) else None
    ii = ctx.attrs["ignore_index"]
    loss = _nll(ctx, logp, ctx.input(1), weight, ctx.attrs["reduction"],
                None if ii is None else int(ii))
    return [loss, logp]


@converter("Col2Im", since=18, attrs={"dilations": None, "pads": None, "strides": None})
def _col2im(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    image = [int(v) for v in ctx.require_const(1, "image_shape").reshape(-1)]
    block = [int(v) for v in ctx.require_const(2, "block_shape").reshape(-1)]
    n = len(image)
    if len(block) != n or n < 1:
        raise ctx.error(f"image_shape {image} and block_shape {block} need the same length")
    strides = list(ctx.attrs["strides"] or [1] * n)
    dilations = list(ctx.attrs["dilations"] or [1] * n)
    pads = list(ctx.attrs["pads"] or [0] * (2 * n))
    if len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ctx.error(f"strides {strides}, dilations {dilations} and pads {pads} do not fit "
                        f"{n} spatial axes")
    return ctx.emit("nn.col2im", x, image_shape=tuple(image), block_shape=tuple(block),
                    strides=tuple(strides), padding=tuple(pads), dilation=tuple(dilations))
