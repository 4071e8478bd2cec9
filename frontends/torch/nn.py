"""Converters for neural-network ATen operators: convolution (a BatchNorm that follows folded into
its weights, as torch's ONNX exporter does), normalization, pooling, matrix products, softmax,
reductions and upsampling. They emit the same IR operators as the ONNX frontend's converters,
so the same kernels and fusions apply."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ...packager.errors import ExportError
from ...packager.ir.graph import Constant, Value
from ..onnx.nn import normalize_rows
from ..onnx.resize import resample
from .registry import NodeContext, converter

_BN = "aten._native_batch_norm_legit_no_training.default"


def _channel_shaped(ctx: NodeContext, v: Value, rank: int) -> Value:
    """A per-channel vector [C] as [1, C, 1, ...] so it broadcasts over NC... data."""
    return ctx.reshape(v, (1, v.type.shape[0]) + (1,) * (rank - 2))


def _ints(values: Any, n: int) -> list[int]:
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    values = [int(v) for v in values]
    return values * n if len(values) == 1 else values


# ---- convolution --------------------------------------------------------------------------------

def _folded_batch_norm(ctx: NodeContext, w: Value, b: Value | None
                       ) -> tuple[Value, Value | None] | None:
    """When this convolution's only reader is an inference BatchNorm with constant statistics,
    fold it into the weights and bias: (w * s, (b - mean) * s + beta) with s = gamma /
    sqrt(var + eps). The BatchNorm node then takes the convolution's result unchanged."""
    users = list(ctx.node.users)
    if len(users) != 1 or not isinstance(w, Constant) or not (b is None or isinstance(b, Constant)):
        return None
    bn = users[0]
    if str(bn.target) != _BN or bn.args[0] is not ctx.node:
        return None
    stats = [ctx.importer.constant_value(a) if a is not None else None for a in bn.args[1:5]]
    if stats[2] is None or stats[3] is None:
        return None
    if (bn.args[1] is not None and stats[0] is None) or (bn.args[2] is not None and stats[1] is None):
        return None
    channels = w.type.shape[0]
    eps = float(bn.args[6])
    gamma = stats[0] if stats[0] is not None else np.ones(channels)
    beta = stats[1] if stats[1] is not None else np.zeros(channels)
    scale = gamma.astype(np.float64) / np.sqrt(stats[3].astype(np.float64) + eps)
    bias = b.data.astype(np.float64) if b is not None else np.zeros(channels)
    dtype = w.type.dtype
    new_w = (w.data.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.data.ndim - 1)))
    new_b = (bias - stats[2].astype(np.float64)) * scale + beta
    return ctx.constant(new_w.astype(dtype), w.name), ctx.constant(new_b.astype(dtype),
                                                                    f"{w.name}_bias")


@converter("aten.convolution.default")
def _convolution(ctx: NodeContext) -> Value:
    x, w, b = ctx.tensor("input"), ctx.tensor("weight"), ctx.maybe("bias")
    spatial = len(x.type.shape) - 2
    if spatial not in (1, 2, 3):
        raise ctx.error(f"input of shape {x.type.shape}: only 1-D, 2-D and 3-D convolutions")
    strides = _ints(ctx.arg("stride"), spatial)
    pads = _ints(ctx.arg("padding"), spatial)
    dilation = _ints(ctx.arg("dilation"), spatial)
    groups = int(ctx.arg("groups"))
    if ctx.arg("transposed"):
        out_pad = _ints(ctx.arg("output_padding"), spatial)
        args = [x, w, b] if b is not None else [x, w]
        return ctx.emit("nn.conv_transpose", *args, strides=tuple(strides),
                        padding=tuple(pads + pads), dilation=tuple(dilation),
                        output_padding=tuple(out_pad), groups=groups)
    folded = _folded_batch_norm(ctx, w, b)
    bn_node = list(ctx.node.users)[0] if folded else None
    if folded:
        w, b = folded
        with ctx.bb.source(ctx.source, ctx.importer.source_of(bn_node)):  # both nodes' kernel
            y = _conv(ctx, x, w, b, spatial, strides, pads, dilation, groups)
        ctx.absorb(bn_node, (y, None, None))
        return y
    return _conv(ctx, x, w, b, spatial, strides, pads, dilation, groups)


def _conv(ctx: NodeContext, x: Value, w: Value, b: Value | None, spatial: int,
          strides: list[int], pads: list[int], dilation: list[int], groups: int) -> Value:
    if spatial == 3:
        y = ctx.emit("nn.conv", x, w, strides=tuple(strides), padding=tuple(pads + pads),
                     dilation=tuple(dilation), groups=groups)
    elif spatial == 2:
        y = ctx.emit("nn.conv2d", x, w, strides=tuple(strides), padding=tuple(pads + pads),
                     dilation=tuple(dilation), groups=groups)
    else:  # 1-D as 2-D with a height of one, as the ONNX frontend
        n, c, length = x.type.shape
        w2 = ctx.reshape(w, w.type.shape[:2] + (1,) + w.type.shape[2:])
        y = ctx.emit("nn.conv2d", ctx.reshape(x, (n, c, 1, length)), w2,
                     strides=(1, strides[0]), padding=(0, pads[0], 0, pads[0]),
                     dilation=(1, dilation[0]), groups=groups)
    if b is not None:
        y = ctx.emit("add", y, _channel_shaped(ctx, b, spatial + 2 if spatial != 1 else 4))
    if spatial == 1:
        y = ctx.reshape(y, y.type.shape[:2] + y.type.shape[3:])
    return y


# ---- normalization ------------------------------------------------------------------------------

@converter(_BN)
def _batch_norm(ctx: NodeContext) -> tuple[Value, None, None]:
    x = ctx.tensor("input")
    rank = len(x.type.shape)
    shape = (1, x.type.shape[1]) + (1,) * (rank - 2)
    eps = float(ctx.arg("eps"))
    names = ("weight", "bias", "running_mean", "running_var")
    consts = [ctx.const(n) for n in names]
    channels = x.type.shape[1]
    if consts[2] is not None and consts[3] is not None and all(
            consts[i] is not None or ctx.maybe(names[i]) is None for i in (0, 1)):
        gamma = consts[0] if consts[0] is not None else np.ones(channels)
        beta = consts[1] if consts[1] is not None else np.zeros(channels)
        s = gamma.astype(np.float64) / np.sqrt(consts[3].astype(np.float64) + eps)
        t = beta.astype(np.float64) - consts[2].astype(np.float64) * s
        dtype = x.type.dtype
        s_val = ctx.constant(s.astype(dtype).reshape(shape), "bn_scale")
        t_val = ctx.constant(t.astype(dtype).reshape(shape), "bn_shift")
    else:
        mean, var = (ctx.reshape(ctx.tensor(n), shape) for n in names[2:])
        s_val = ctx.emit("divide", ctx.scalar(1.0, var),
                         ctx.emit("sqrt", ctx.emit("add", var, ctx.scalar(eps, var))))
        if ctx.maybe("weight") is not None:
            s_val = ctx.emit("multiply", s_val, ctx.reshape(ctx.tensor("weight"), shape))
        t_val = ctx.emit("negative", ctx.emit("multiply", mean, s_val))
        if ctx.maybe("bias") is not None:
            t_val = ctx.emit("add", t_val, ctx.reshape(ctx.tensor("bias"), shape))
    return ctx.emit("add", ctx.emit("multiply", x, s_val), t_val), None, None


def _normalize(ctx: NodeContext, x: Value, axes: tuple[int, ...], eps: float
               ) -> tuple[Value, Value, Value]:
    """(x - mean) / sqrt(var + eps) over ``axes``, the mean and 1/sqrt(var + eps) (the ONNX
    frontend's LayerNormalization form)."""
    mean = ctx.emit("mean", x, axes=axes, keepdims=True)
    centered = ctx.emit("subtract", x, mean)
    var = ctx.emit("mean", ctx.emit("multiply", centered, centered), axes=axes, keepdims=True)
    inv_std = ctx.emit("divide", ctx.scalar(1.0, var),
                       ctx.emit("sqrt", ctx.emit("add", var, ctx.scalar(eps, var))))
    return ctx.emit("multiply", centered, inv_std), mean, inv_std


@converter("aten.native_layer_norm.default")
def _layer_norm(ctx: NodeContext) -> tuple[Value, Value | None, Value | None]:
    x = ctx.tensor("input")
    rank = len(x.type.shape)
    n = len(ctx.arg("normalized_shape"))
    eps = float(ctx.arg("eps"))
    # one row kernel (ops/norm.py); the statistics, when read, from the decomposition
    fast = normalize_rows(ctx, x, rank - n, eps, ctx.maybe("weight"), ctx.maybe("bias"))
    if fast is not None and not (ctx.wants(1) or ctx.wants(2)):
        return fast, None, None
    y, mean, inv_std = _normalize(ctx, x, tuple(range(rank - n, rank)), eps)
    if fast is not None:
        return fast, mean, inv_std
    if ctx.maybe("weight") is not None:
        y = ctx.emit("multiply", y, ctx.tensor("weight"))
    if ctx.maybe("bias") is not None:
        y = ctx.emit("add", y, ctx.tensor("bias"))
    return y, mean, inv_std


@converter("aten.native_group_norm.default")
def _group_norm(ctx: NodeContext) -> tuple[Value, Value | None, Value | None]:
    x = ctx.tensor("input")
    shape = x.type.shape
    rank = len(shape)
    groups = int(ctx.arg("group"))
    channels = shape[1]
    if groups < 1 or channels % groups:
        raise ctx.error(f"{groups} groups do not divide the {channels} channels")
    eps = float(ctx.arg("eps"))
    grouped = ctx.reshape(x, (shape[0], groups, channels // groups) + shape[2:])
    # on x itself, a row per group of channels (readers fuse into the kernel); the per-channel
    # weight and bias as [1, C, 1...]
    params = [_channel_shaped(ctx, v, rank) if v is not None else None
              for v in (ctx.maybe("weight"), ctx.maybe("bias"))]
    fast = normalize_rows(ctx, x, 1, eps, *params, groups=groups)
    if fast is not None and not (ctx.wants(1) or ctx.wants(2)):
        return fast, None, None
    y, mean, inv_std = _normalize(ctx, grouped, tuple(range(2, rank + 1)), eps)
    stats = (shape[0], groups)
    if fast is not None:
        return fast, ctx.reshape(mean, stats), ctx.reshape(inv_std, stats)
    y = ctx.reshape(y, shape)
    if ctx.maybe("weight") is not None:
        y = ctx.emit("multiply", y, _channel_shaped(ctx, ctx.tensor("weight"), rank))
    if ctx.maybe("bias") is not None:
        y = ctx.emit("add", y, _channel_shaped(ctx, ctx.tensor("bias"), rank))
    return y, ctx.reshape(mean, stats), ctx.reshape(inv_std, stats)


# ---- pooling ------------------------------------------------------------------------------------

def _window(ctx: NodeContext, spatial: int) -> tuple[list[int], list[int], list[int]]:
    kernel = _ints(ctx.arg("kernel_size"), spatial)
    stride = ctx.arg("stride")
    strides = _ints(stride, spatial) if stride else list(kernel)
    pads = _ints(ctx.arg("padding"), spatial)
    return kernel, strides, pads


def _max_pool(spatial: int) -> Callable[[NodeContext], tuple[Value, Value | None]]:
    def convert(ctx: NodeContext) -> tuple[Value, Value | None]:
        x = ctx.tensor("self")
        kernel, strides, pads = _window(ctx, spatial)
        dilation = _ints(ctx.arg("dilation"), spatial)
        ceil_mode = bool(ctx.arg("ceil_mode"))
        nd = dict(kernel=tuple(kernel), strides=tuple(strides), padding=tuple(pads + pads),
                  dilation=tuple(dilation))
        if spatial == 2:
            y = ctx.emit("nn.max_pool2d", x, kernel=tuple(kernel), strides=tuple(strides),
                         padding=tuple(pads + pads), dilation=tuple(dilation),
                         ceil_mode=ceil_mode)
        else:
            y = ctx.emit("nn.pool", x, mode="max", ceil_mode=ceil_mode, **nd)
        indices = None
        if ctx.wants(1):  # torch's indices are flat over each plane (ONNX storage_order 0)
            indices = ctx.emit("nn.max_pool_indices", x, ceil_mode=ceil_mode, storage_order=0,
                               **nd)
            n, c = x.type.shape[:2]
            plane = math.prod(x.type.shape[2:])
            base = np.arange(n * c, dtype=np.int64).reshape((n, c) + (1,) * spatial) * plane
            indices = ctx.emit("subtract", indices, ctx.constant(base, "plane_base"))
        return y, indices
    return convert


converter("aten.max_pool2d_with_indices.default")(_max_pool(2))
converter("aten.max_pool3d_with_indices.default")(_max_pool(3))


def _avg_pool(spatial: int) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.tensor("self")
        kernel, strides, pads = _window(ctx, spatial)
        if ctx.args.get("divisor_override") is not None:
            raise ctx.error("divisor_override is not supported")
        ceil_mode = bool(ctx.arg("ceil_mode"))
        include = bool(ctx.arg("count_include_pad"))
        if spatial == 2:
            return ctx.emit("nn.avg_pool2d", x, kernel=tuple(kernel), strides=tuple(strides),
                            padding=tuple(pads + pads), ceil_mode=ceil_mode,
                            count_include_pad=include)
        return ctx.emit("nn.pool", x, mode="avg", kernel=tuple(kernel), strides=tuple(strides),
                        padding=tuple(pads + pads), dilation=(1,) * spatial,
                        ceil_mode=ceil_mode, count_include_pad=include)
    return convert


converter("aten.avg_pool2d.default")(_avg_pool(2))
converter("aten.avg_pool1d.default")(_avg_pool(1))
converter("aten.avg_pool3d.default")(_avg_pool(3))


@converter("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    spatial = x.type.shape[2:]
    out = _ints(ctx.arg("output_size"), len(spatial))
    if all(o == 1 for o in out):
        return ctx.emit("mean", x, axes=tuple(range(2, len(x.type.shape))), keepdims=True)
    if any(s % o for s, o in zip(spatial, out)):
        raise ctx.error(f"adaptive pooling from {list(spatial)} to {out}: only output sizes "
                        "that divide the input are supported")
    kernel = tuple(s // o for s, o in zip(spatial, out))
    if len(spatial) == 2:
        return ctx.emit("nn.avg_pool2d", x, kernel=kernel, strides=kernel, padding=(0,) * 4)
    return ctx.emit("nn.pool", x, mode="avg", kernel=kernel, strides=kernel,
                    padding=(0,) * (2 * len(spatial)), dilation=(1,) * len(spatial))


# ---- matrix products ----------------------------------------------------------------------------

_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _unflattened(ctx: NodeContext, a: Value, arg_index: int) -> tuple[Value, Any] | None:
    """A Linear on an N-D input is ``view(x, [M, K]) -> addmm -> view(y, [..., N])`` in ATen.
    When both views only merge / split the leading dims, return (x, the closing view node):
    the product is emitted on x itself, as the ONNX path's MatMul, so the add, an activation
    or a residual after it fuse into its kernel (a reshape between them would stop fusion)."""
    opening = ctx.node.args[arg_index]
    users = list(ctx.node.users)
    if getattr(opening, "op", None) != "call_function" or str(opening.target) not in _VIEWS:
        return None
    if len(users) != 1 or str(users[0].target) not in _VIEWS:
        return None
    x = ctx.importer.values.get(opening.args[0])
    closing = users[0]
    if not isinstance(x, Value) or len(x.type.shape) < 3 or len(closing.args) < 2:
        return None
    try:  # its sizes may be symbolic sizes computed before this node
        sizes = [int(d) for d in ctx.importer.resolve(closing.args[1])]
    except (TypeError, ValueError, ExportError):
        return None
    out_shape = tuple(sizes)
    if -1 in out_shape:
        return None
    if x.type.shape[-1] != a.type.shape[-1] or out_shape[:-1] != x.type.shape[:-1]:
        return None
    return x, closing


def _matmul_2d(ctx: NodeContext, a: Value, b: Value, bias: Value | None) -> Value:
    nd = _unflattened(ctx, a, 1 if bias is not None else 0)
    y = ctx.emit("matmul", nd[0] if nd else a, b)
    if bias is not None:
        y = ctx.emit("add", y, bias)
    if nd:
        ctx.absorb(nd[1], y)
    return y


@converter("aten.addmm.default")
def _addmm(ctx: NodeContext) -> Value:
    bias, a, b = ctx.tensor("self"), ctx.tensor("mat1"), ctx.tensor("mat2")
    beta, alpha = float(ctx.arg("beta")), float(ctx.arg("alpha"))
    if alpha != 1.0:
        b = ctx.emit("multiply", b, ctx.scalar(alpha, b))
    if beta == 0.0:
        return _matmul_2d(ctx, a, b, None)
    if beta != 1.0:
        bias = ctx.emit("multiply", bias, ctx.scalar(beta, bias))
    return _matmul_2d(ctx, a, b, bias)


@converter("aten.mm.default")
def _mm(ctx: NodeContext) -> Value:
    return _matmul_2d(ctx, ctx.tensor("self"), ctx.tensor("mat2"), None)


@converter("aten.bmm.default")
def _bmm(ctx: NodeContext) -> Value:
    return ctx.emit("matmul", ctx.tensor("self"), ctx.tensor("mat2"))


@converter("aten._softmax.default", "aten._log_softmax.default")
def _softmax(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    op = "nn.log_softmax" if "log" in ctx.target else "nn.softmax"
    return ctx.emit(op, x, axis=int(ctx.arg("dim")) % max(len(x.type.shape), 1))


# ---- reductions ---------------------------------------------------------------------------------

def _axes(ctx: NodeContext, x: Value, dims: Any) -> tuple[int, ...] | None:
    rank = max(len(x.type.shape), 1)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return None
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return tuple(sorted(int(d) % rank for d in dims))


def _reduce(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.tensor("self")
        dtype = ctx.args.get("dtype") or (ctx.out_dtype if op in ("sum", "mean", "prod") else None)
        if dtype and dtype != x.type.dtype:
            x = ctx.emit("cast", x, dtype=dtype)
        keep = bool(ctx.args.get("keepdim", False))
        axes = _axes(ctx, x, ctx.args.get("dim"))
        if x.type.dtype == "bool":
            y = ctx.emit(op, ctx.emit("cast", x, dtype="uint8"), axes=axes, keepdims=keep)
            return ctx.emit("cast", y, dtype="bool")
        return ctx.emit(op, x, axes=axes, keepdims=keep)
    return convert


converter("aten.mean.dim", "aten.mean.default")(_reduce("mean"))
converter("aten.sum.dim_IntList", "aten.sum.default")(_reduce("sum"))
converter("aten.amax.default")(_reduce("max"))
converter("aten.amin.default")(_reduce("min"))
converter("aten.prod.dim_int", "aten.prod.default")(_reduce("prod"))
converter("aten.any.dim", "aten.any.dims", "aten.any.default")(_reduce("max"))
converter("aten.all.dim", "aten.all.dims", "aten.all.default")(_reduce("min"))


@converter("aten.var.correction", "aten.var_mean.correction")
def _var(ctx: NodeContext) -> Value | tuple[Value, Value]:
    x = ctx.tensor("self")
    axes = _axes(ctx, x, ctx.args.get("dim"))
    keep = bool(ctx.args.get("keepdim", False))
    correction = ctx.args.get("correction")
    correction = 1.0 if correction is None else float(correction)
    count = math.prod(x.type.shape[a] for a in (axes or range(len(x.type.shape))))
    mean = ctx.emit("mean", x, axes=axes, keepdims=True)
    centered = ctx.emit("subtract", x, mean)
    total = ctx.emit("sum", ctx.emit("multiply", centered, centered), axes=axes, keepdims=keep)
    var = ctx.emit("divide", total, ctx.scalar(max(count - correction, 0.0), total))
    if "var_mean" in ctx.target:
        return var, ctx.reshape(mean, var.type.shape)
    return var


def _arg_reduce(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.tensor("self")
        dim = ctx.args.get("dim")
        keep = bool(ctx.args.get("keepdim", False))
        if dim is None:
            x, dim, keep = ctx.reshape(x, (math.prod(x.type.shape),)), 0, False
        return ctx.emit(op, x, axis=int(dim) % len(x.type.shape), keepdims=keep)
    return convert


converter("aten.argmax.default")(_arg_reduce("argmax"))
converter("aten.argmin.default")(_arg_reduce("argmin"))


@converter("aten.max.dim", "aten.min.dim")
def _max_dim(ctx: NodeContext) -> tuple[Value, Value | None]:
    x = ctx.tensor("self")
    dim = int(ctx.arg("dim")) % len(x.type.shape)
    keep = bool(ctx.arg("keepdim"))
    big = ctx.target.startswith("aten.max")
    values = ctx.emit("max" if big else "min", x, axes=(dim,), keepdims=keep)
    indices = ctx.emit("argmax" if big else "argmin", x, axis=dim, keepdims=keep) \
        if ctx.wants(1) else None
    return values, indices


# ---- upsampling ---------------------------------------------------------------------------------

def _upsample_plan(ctx: NodeContext, x: Value, scales: Sequence[float] | None
                   ) -> tuple[list[int], list[float] | None]:
    shape = list(x.type.shape)
    spatial = len(shape) - 2
    size = ctx.args.get("output_size")
    if size:
        out = shape[:2] + [int(s) for s in size]
        return out, None
    if not scales:
        raise ctx.error("needs output_size or scale_factors")
    scales = [float(s) for s in scales]
    scales = scales * spatial if len(scales) == 1 else scales
    out = shape[:2] + [int(math.floor(n * s)) for n, s in zip(shape[2:], scales)]
    return out, [1.0, 1.0] + scales


def _upsample(mode: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.tensor("input") if "input" in ctx.args else ctx.tensor("self")
        scales = ctx.args.get("scale_factors")
        if scales is None and ctx.args.get("scales_h") is not None:
            scales = [ctx.args[k] for k in ("scales_d", "scales_h", "scales_w") if k in ctx.args]
        out, factors = _upsample_plan(ctx, x, scales)
        if mode == "nearest":
            return resample(ctx, x, out, "nearest", "asymmetric", factors, nearest_mode="floor")
        coord = "align_corners" if ctx.arg("align_corners") else "pytorch_half_pixel"
        return resample(ctx, x, out, mode, coord, factors if coord != "align_corners" else None,
                        cubic_a=-0.75)
    return convert


converter("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default",
          "aten.upsample_nearest1d.vec", "aten.upsample_nearest3d.vec")(_upsample("nearest"))
converter("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default",
          "aten.upsample_linear1d.vec", "aten.upsample_trilinear3d.vec")(_upsample("linear"))
converter("aten.upsample_bicubic2d.vec", "aten.upsample_bicubic2d.default")(_upsample("cubic"))
