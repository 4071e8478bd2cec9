"""Converters for operator-style quantized ONNX operators: QLinearConv, QLinearMatMul,
ConvInteger, MatMulInteger, and the com.microsoft operators ONNX Runtime's quantizer writes
(QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearAveragePool,
QLinearGlobalAveragePool, QLinearConcat, QLinearSoftmax, QLinearWhere, QGemm,
MatMulIntegerToFloat, DynamicQuantizeMatMul, DynamicQuantizeLSTM, and its
QuantizeLinear/DequantizeLinear).

Each becomes ``dequantize`` -> the float operator (through the float converter of Conv, MatMul,
AveragePool, LSTM) -> ``quantize``, as written at the top of ``quant.py``; the quantized-kernel
fusion turns those patterns into integer kernels, and whatever it leaves runs in float.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...packager.ir.graph import Constant, Value
from ...packager.passes.stored_int import make_stored
from .quant import _dequantize_linear, _quantize_linear, dequantize, dynamic_quantize, quantize
from .registry import NodeContext, converter, lookup
from .rnn import convert_lstm

MS = "com.microsoft"
_FLOAT_OPSET = 21   # the float converters these lower to: semantics unchanged since long before
_WINDOW_ATTRS = {"auto_pad": "NOTSET", "kernel_shape": None, "pads": None, "strides": None,
                 "dilations": None}
_EXACT_FLOAT32 = 2 ** 24   # integers below this add exactly in float32


def _float_context(ctx: NodeContext, op_type: str, inputs: Sequence[Value | None],
                   opset: int = _FLOAT_OPSET, **overrides: Any) -> NodeContext:
    """This node seen as the float ONNX operator ``op_type`` (of ``opset``) on ``inputs``, with
    this node's attributes that ``op_type`` knows (and ``overrides``)."""
    conv = lookup("", op_type, opset)
    assert conv is not None
    attrs = dict(conv.attrs)
    attrs.update({k: v for k, v in ctx.attrs.items() if k in conv.attrs})
    attrs.update(overrides)
    return NodeContext(ctx.bb, ctx.node, opset, list(inputs), attrs, ctx.source)


def _float_op(ctx: NodeContext, op_type: str, inputs: Sequence[Value | None],
              opset: int = _FLOAT_OPSET, **overrides: Any) -> Value | list[Value]:
    """Convert this node as the float ONNX operator ``op_type`` (see ``_float_context``)."""
    conv = lookup("", op_type, opset)
    assert conv is not None
    return conv.convert(_float_context(ctx, op_type, inputs, opset, **overrides))


def _opt(ctx: NodeContext, i: int) -> Value | None:
    return ctx.input(i) if ctx.has_input(i) else None


def _out_dtype(zero_point: Value | None, like: Value) -> str:
    return zero_point.type.dtype if zero_point is not None else like.type.dtype


def _requantize(ctx: NodeContext, y: Value, scale_i: int, zp_i: int, like: Value) -> Value:
    zp = _opt(ctx, zp_i)
    return quantize(ctx, y, ctx.input(scale_i), zp, _out_dtype(zp, like))


def _dequantized_bias(ctx: NodeContext, bias: Value, scale: Value, rank: int,
                      channel_axis: int = 1) -> Value:
    """An int32 bias [C] as ``dequantize(bias, scale, 0)`` shaped to broadcast over an output
    of ``rank`` with channels on ``channel_axis``; ``scale`` is 0-d or [C]."""
    shape = tuple(bias.type.shape[0] if d == channel_axis else 1 for d in range(rank))
    q = ctx.reshape(bias, shape)
    s = ctx.reshape(scale, shape) if len(scale.type.shape) else scale
    zero = ctx.constant(np.zeros((), bias.type.dtype), "zero_point")
    return ctx.bb.emit_op("dequantize", q, s, zero)


def _flat_scale(ctx: NodeContext, scale: Value) -> Value:
    """A scale with one element as 0-d, else 1-D."""
    size = int(np.prod(scale.type.shape, dtype=np.int64))
    return ctx.reshape(scale, () if size == 1 else (size,))


# ---- QLinearConv, QLinearMatMul, QGemm ---------------------------------------------------------

@converter("QLinearConv", since=10, attrs={**_WINDOW_ATTRS, "group": 1})
def _qlinear_conv(ctx: NodeContext) -> Value:
    x, w = ctx.input(0), ctx.input(3)
    xd = dequantize(ctx, x, ctx.input(1), _opt(ctx, 2))
    wd = dequantize(ctx, w, ctx.input(4), _opt(ctx, 5), axis=0)
    y = _float_op(ctx, "Conv", [xd, wd])
    if ctx.has_input(8):
        scale = ctx.emit("multiply", _flat_scale(ctx, ctx.input(1)),
                         _flat_scale(ctx, ctx.input(4)))
        y = ctx.emit("add", y, _dequantized_bias(ctx, ctx.input(8), scale, len(y.type.shape)))
    return _requantize(ctx, y, 6, 7, x)


@converter("QLinearMatMul", since=10)
def _qlinear_matmul(ctx: NodeContext) -> Value:
    a, b = ctx.input(0), ctx.input(3)
    ad = dequantize(ctx, a, ctx.input(1), _opt(ctx, 2), axis=-2)   # per row of a
    bd = dequantize(ctx, b, ctx.input(4), _opt(ctx, 5), axis=-1)   # per column of b
    return _requantize(ctx, _float_op(ctx, "MatMul", [ad, bd]), 6, 7, a)


@converter("QGemm", since=1, domain=MS, attrs={"alpha": 1.0, "transA": 0, "transB": 0})
def _qgemm(ctx: NodeContext) -> Value:
    a, b = ctx.input(0), ctx.input(3)
    trans_b = bool(ctx.attrs["transB"])
    alpha = float(ctx.attrs["alpha"])
    if len(a.type.shape) != 2 or len(b.type.shape) != 2:
        raise ctx.error(f"A {a.type.shape} and B {b.type.shape} must be 2-D")
    ad = dequantize(ctx, a, ctx.input(1), ctx.input(2))
    bd = dequantize(ctx, b, ctx.input(4), ctx.input(5), axis=0 if trans_b else 1)
    if ctx.attrs["transA"]:
        ad = ctx.emit("transpose", ad, axes=(1, 0))
    y = ctx.emit("matmul", ad, bd, transpose_b=trans_b)
    if alpha != 1.0:
        y = ctx.emit("multiply", y, ctx.scalar(alpha, y))
    if ctx.has_input(6):   # int32 C, added to the accumulator: scale alpha * a_scale * b_scale
        scale = ctx.emit("multiply", _flat_scale(ctx, ctx.input(1)),
                         _flat_scale(ctx, ctx.input(4)))
        scale = ctx.emit("multiply", scale, ctx.constant(np.array(alpha, np.float32), "alpha"))
        zero = ctx.constant(np.zeros((), "int32"), "zero_point")
        y = ctx.emit("add", y, ctx.bb.emit_op("dequantize", ctx.input(6), scale, zero))
    if not ctx.has_input(7):
        return y   # float output
    return _requantize(ctx, y, 7, 8, a)


# ---- integer products: ConvInteger, MatMulInteger, MatMulIntegerToFloat -----------------------

def _difference_dtype(v: Constant, zero_point: Value | None) -> type:
    """int16 when ``v`` and its zero point are 8-bit (their difference fits it: a quarter of
    int64's memory traffic on a large weight), else int64."""
    small = ("int8", "uint8")
    return np.int16 if v.data.dtype.name in small and (
        zero_point is None or zero_point.type.dtype in small) else np.int64


def _max_offset(v: Value, zero_point: Value | None) -> float:
    """The largest |v - zero_point| possible (exact when both are constants)."""
    if isinstance(v, Constant) and (zero_point is None or isinstance(zero_point, Constant)):
        wide = _difference_dtype(v, zero_point)
        zp = 0 if zero_point is None else zero_point.data.astype(wide)
        return float(np.abs(v.data.astype(wide) - zp).max(initial=0))
    return float(np.iinfo(v.type.dtype).max - np.iinfo(v.type.dtype).min)


def _sum_bound(x: Value, x_zp: Value | None, w: Value, w_zp: Value | None,
               reduce_axes: tuple[int, ...], zp_shape: tuple[int, ...]) -> float:
    """A bound on |sum_k (x - x_zp)(w - w_zp)| over every output: the largest |x - x_zp| times
    the largest column sum of |w - w_zp| (from the weights when they are constants)."""
    x_max = _max_offset(x, x_zp)
    if isinstance(w, Constant) and (w_zp is None or isinstance(w_zp, Constant)):
        wide = _difference_dtype(w, w_zp)
        zp = 0 if w_zp is None else w_zp.data.astype(wide).reshape(zp_shape)
        col = np.abs(w.data.astype(wide) - zp).sum(axis=reduce_axes, dtype=np.int64)
        return x_max * float(col.max(initial=0))
    k = int(np.prod([w.type.shape[a] for a in reduce_axes], dtype=np.int64))
    return x_max * k * _max_offset(w, None)


def _unit_scale(ctx: NodeContext, bound: float) -> Value:
    """1.0 in float32 when every integer sum stays below 2**24 (exact), else in float64."""
    dtype = np.float32 if bound < _EXACT_FLOAT32 else np.float64
    return ctx.constant(np.ones((), dtype), "unit_scale")


@converter("ConvInteger", since=10, attrs={**_WINDOW_ATTRS, "group": 1})
def _conv_integer(ctx: NodeContext) -> Value:
    x, w = ctx.input(0), ctx.input(1)
    x_zp, w_zp = _opt(ctx, 2), _opt(ctx, 3)
    rank = len(w.type.shape)
    zp_shape = (-1,) + (1,) * (rank - 1) if w_zp is not None and \
        int(np.prod(w_zp.type.shape, dtype=np.int64)) > 1 else ()
    one = _unit_scale(ctx, _sum_bound(x, x_zp, w, w_zp, tuple(range(1, rank)), zp_shape))
    xd = dequantize(ctx, x, one, x_zp)
    wd = dequantize(ctx, w, one, w_zp, axis=0)
    return ctx.emit("cast", _float_op(ctx, "Conv", [xd, wd]), dtype="int32")


@converter("MatMulInteger", since=10)
def _matmul_integer(ctx: NodeContext) -> Value:
    a, b = ctx.input(0), ctx.input(1)
    a_zp, b_zp = _opt(ctx, 2), _opt(ctx, 3)
    per_column = b_zp is not None and int(np.prod(b_zp.type.shape, dtype=np.int64)) > 1
    bound = _sum_bound(a, a_zp, b, b_zp, (len(b.type.shape) - 2,),
                       (1, -1) if per_column else ())
    one = _unit_scale(ctx, bound)
    ad = dequantize(ctx, a, one, a_zp, axis=-2)
    bd = dequantize(ctx, b, one, b_zp, axis=-1)
    return ctx.emit("cast", _float_op(ctx, "MatMul", [ad, bd]), dtype="int32")


def _add_bias(ctx: NodeContext, y: Value, i: int) -> Value:
    return ctx.emit("add", y, ctx.input(i)) if ctx.has_input(i) else y


@converter("MatMulIntegerToFloat", since=1, domain=MS)
def _matmul_integer_to_float(ctx: NodeContext) -> Value:
    a, b = ctx.input(0), ctx.input(1)
    ad = dequantize(ctx, a, ctx.input(2), _opt(ctx, 4), axis=-2)
    bd = dequantize(ctx, b, ctx.input(3), _opt(ctx, 5), axis=-1)
    return _add_bias(ctx, _float_op(ctx, "MatMul", [ad, bd]), 6)


@converter("DynamicQuantizeMatMul", since=1, domain=MS)
def _dynamic_quantize_matmul(ctx: NodeContext) -> Value:
    aq, a_scale, a_zp = dynamic_quantize(ctx, ctx.input(0))
    ad = ctx.bb.emit_op("dequantize", aq, a_scale, a_zp)
    bd = dequantize(ctx, ctx.input(1), ctx.input(2), _opt(ctx, 3), axis=-1)
    return _add_bias(ctx, _float_op(ctx, "MatMul", [ad, bd]), 4)


# ---- com.microsoft elementwise, pools, concat ----------------------------------------------------

def _ratio(ctx: NodeContext, num: Sequence[Value], den: Value) -> Value:
    """prod(num) / den as a 0-d float32 (scales are per tensor here)."""
    r = _flat_scale(ctx, num[0])
    for v in num[1:]:
        r = ctx.emit("multiply", r, _flat_scale(ctx, v))
    return ctx.emit("divide", r, _flat_scale(ctx, den))


def _unit_requantize(ctx: NodeContext, y: Value, zp_i: int, like: Value) -> Value:
    """quantize(y, 1, zero point): ``y`` is already in the output's units."""
    zp = _opt(ctx, zp_i)
    one = ctx.constant(np.ones((), np.float32), "unit_scale")
    return quantize(ctx, y, one, zp, _out_dtype(zp, like))


@converter("QLinearAdd", since=1, domain=MS)
def _qlinear_add(ctx: NodeContext) -> Value:
    # ONNX Runtime's formula, rounding included: (a - za) * (sa / sc) + (b - zb) * (sb / sc) + zc
    a, b, c_scale = ctx.input(0), ctx.input(3), ctx.input(6)
    ad = dequantize(ctx, a, _ratio(ctx, [ctx.input(1)], c_scale), _opt(ctx, 2))
    bd = dequantize(ctx, b, _ratio(ctx, [ctx.input(4)], c_scale), _opt(ctx, 5))
    return _unit_requantize(ctx, ctx.emit("add", ad, bd), 7, a)


@converter("QLinearMul", since=1, domain=MS)
def _qlinear_mul(ctx: NodeContext) -> Value:
    # ONNX Runtime's formula, rounding included: ((a - za) * (b - zb)) * (sa * sb / sc) + zc
    a, b = ctx.input(0), ctx.input(3)
    one = ctx.constant(np.ones((), np.float32), "unit_scale")
    product = ctx.emit("multiply", dequantize(ctx, a, one, _opt(ctx, 2)),
                       dequantize(ctx, b, one, _opt(ctx, 5)))
    ratio = _ratio(ctx, [ctx.input(1), ctx.input(4)], ctx.input(6))
    return _unit_requantize(ctx, ctx.emit("multiply", product, ratio), 7, a)


@converter("QLinearSigmoid", since=1, domain=MS)
def _qlinear_sigmoid(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    xd = dequantize(ctx, x, ctx.input(1), _opt(ctx, 2))
    return _requantize(ctx, ctx.emit("sigmoid", xd), 3, 4, x)


@converter("QLinearLeakyRelu", since=1, domain=MS, attrs={"alpha": 0.01})
def _qlinear_leaky_relu(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    xd = dequantize(ctx, x, ctx.input(1), _opt(ctx, 2))
    y = ctx.emit("leaky_relu", xd, alpha=float(ctx.attrs["alpha"]))
    return _requantize(ctx, y, 3, 4, x)


def _to_channels_first(ctx: NodeContext, x: Value) -> Value:
    rank = len(x.type.shape)
    return ctx.emit("transpose", x, axes=(0, rank - 1) + tuple(range(1, rank - 1)))


def _to_channels_last(ctx: NodeContext, y: Value) -> Value:
    rank = len(y.type.shape)
    return ctx.emit("transpose", y, axes=(0,) + tuple(range(2, rank)) + (1,))


@converter("QLinearAveragePool", since=1, domain=MS,
           attrs={**_WINDOW_ATTRS, "ceil_mode": 0, "count_include_pad": 0, "channels_last": 0})
def _qlinear_average_pool(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    xd = dequantize(ctx, x, ctx.input(1), _opt(ctx, 2))
    last = bool(ctx.attrs["channels_last"])
    y = _float_op(ctx, "AveragePool", [_to_channels_first(ctx, xd) if last else xd])
    return _requantize(ctx, _to_channels_last(ctx, y) if last else y, 3, 4, x)


@converter("QLinearGlobalAveragePool", since=1, domain=MS, attrs={"channels_last": 0})
def _qlinear_global_average_pool(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape)
    if rank < 3:
        raise ctx.error(f"input of shape {x.type.shape} has no spatial axes")
    xd = dequantize(ctx, x, ctx.input(1), _opt(ctx, 2))
    axes = tuple(range(1, rank - 1)) if ctx.attrs["channels_last"] else tuple(range(2, rank))
    return _requantize(ctx, ctx.emit("mean", xd, axes=axes, keepdims=True), 3, 4, x)


@converter("QLinearConcat", since=1, domain=MS, attrs={"axis": None})
def _qlinear_concat(ctx: NodeContext) -> Value:
    if ctx.attrs["axis"] is None:
        raise ctx.error("axis is required")
    if (ctx.num_inputs - 2) % 3 or ctx.num_inputs < 5:
        raise ctx.error(f"{ctx.num_inputs} inputs: expected Y_scale, Y_zero_point, then "
                        "(tensor, scale, zero point) triples")
    parts = [dequantize(ctx, ctx.input(i), ctx.input(i + 1), _opt(ctx, i + 2))
             for i in range(2, ctx.num_inputs, 3)]
    y = _float_op(ctx, "Concat", parts)
    return _requantize(ctx, y, 0, 1, ctx.input(2))


@converter("QLinearSoftmax", since=1, domain=MS, attrs={"axis": None, "opset": None})
def _qlinear_softmax(ctx: NodeContext) -> Value:
    # ``opset``: the ONNX opset of the Softmax it replaces (before 13: over the flattened
    # trailing axes from ``axis``, default 1; from 13: one axis, default -1)
    opset = int(ctx.attrs["opset"] or 13)
    x = ctx.input(0)
    xd = dequantize(ctx, x, ctx.input(1), _opt(ctx, 2))
    axis = ctx.attrs["axis"]
    overrides = {} if axis is None else {"axis": int(axis)}
    y = _float_op(ctx, "Softmax", [xd], opset=max(1, min(opset, _FLOAT_OPSET)), **overrides)
    return _requantize(ctx, y, 3, 4, x)


@converter("QLinearWhere", since=1, domain=MS)
def _qlinear_where(ctx: NodeContext) -> Value:
    x = ctx.input(1)
    xd = dequantize(ctx, x, ctx.input(2), ctx.input(3))
    yd = dequantize(ctx, ctx.input(4), ctx.input(5), ctx.input(6))
    return _requantize(ctx, ctx.emit("where", ctx.input(0), xd, yd), 7, 8, x)


# ---- DynamicQuantizeLSTM -----------------------------------------------------------------------

def _lstm_weight(ctx: NodeContext, i: int, scale_i: int) -> Value:
    """W [dirs, in, 4H] (or R), with per-direction or per-column scale (input ``scale_i``) and
    zero point (the next input), dequantized at import and transposed to the LSTM's
    [dirs, 4H, in]."""
    q = ctx.require_const(i, "the quantized weight")
    scale = np.asarray(ctx.require_const(scale_i, "the weight scale"), np.float32)
    zp = ctx.require_const(scale_i + 1, "the weight zero point").astype(np.float32)
    dirs = q.shape[0]
    w = (q.astype(np.float32) - zp.reshape(dirs, 1, -1)) * scale.reshape(dirs, 1, -1)
    w = np.ascontiguousarray(w.transpose(0, 2, 1))
    # kept as its integers in the bundle (expanded at load): passes/stored_int.py
    stored = make_stored(w, np.ascontiguousarray(q.transpose(0, 2, 1)),
                         scale.reshape(dirs, -1, 1), zp.reshape(dirs, -1, 1))
    return Constant(ctx.bb.fresh_name("lstm_weight"), w, stored)


@converter("DynamicQuantizeLSTM", since=1, domain=MS,
           attrs={"activation_alpha": None, "activation_beta": None, "activations": None,
                  "clip": None, "direction": "forward", "hidden_size": None, "input_forget": 0})
def _dynamic_quantize_lstm(ctx: NodeContext) -> list[Value | None]:
    inputs = [_opt(ctx, i) for i in range(8)]
    inputs[0] = _requantized(ctx, ctx.input(0))
    inputs[1] = _lstm_weight(ctx, 1, 8)
    inputs[2] = _lstm_weight(ctx, 2, 10)
    sub = _float_context(ctx, "LSTM", inputs)
    return convert_lstm(sub, lambda h: _requantized(ctx, h), quantize_h=True)


def _requantized(ctx: NodeContext, x: Value) -> Value:
    """x through DynamicQuantizeLinear and back: what ONNX Runtime's DynamicQuantizeLSTM
    multiplies its int8 weights with (X once over the whole sequence, h at every step)."""
    xq, x_scale, x_zp = dynamic_quantize(ctx, x)
    return ctx.bb.emit_op("dequantize", xq, x_scale, x_zp)


# ---- com.microsoft QuantizeLinear / DequantizeLinear (ORT's QDQ contrib ops) --------------------

converter("QuantizeLinear", since=1, domain=MS, attrs={"axis": 1, "saturate": 1, "block_size": 0,
                                                       "output_dtype": 0, "precision": 0})(
    _quantize_linear)
converter("DequantizeLinear", since=1, domain=MS, attrs={"axis": 1, "block_size": 0,
                                                         "output_dtype": 0})(_dequantize_linear)
