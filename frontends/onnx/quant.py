"""Converters for quantization ONNX operators: QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear here; the operator-style quantized ops (QLinearConv, QLinearMatMul,
ConvInteger, MatMulInteger, com.microsoft QLinear*, QGemm, MatMulIntegerToFloat,
DynamicQuantizeMatMul, DynamicQuantizeLSTM) in ``quant_ops.py``.

HOW QUANTIZED MODELS LOOK IN THE IR (a contract: the quantized-kernel fusion pass matches it)
------------------------------------------------------------------------------------------
Two IR operators (``packager/ops/quant.py``), elementwise, three operands broadcasting by numpy
rules; scale and zero point are never left out (an absent zero point is a 0-d zero constant):

    quantize(x: float, scale: float (x's dtype), zero_point: D, dtype=D) -> D
        = saturate(round_half_even(x / scale) + zero_point)    (rounding/clamp in float32)
    dequantize(q: D, scale: float, zero_point: D) -> scale's dtype
        = (q - zero_point) * scale                              (int32: subtraction in float64)

D is int8/uint8 (also int16/uint16/int32/uint32/int4/uint4/int2/uint2). Scale and zero point
are 0-d per tensor; per channel they have x's rank with the channel extent on the quantized
axis and 1 elsewhere: [O,1,1,1] (conv weight), [1,C,1,1] (activations), [1,N] (a matmul's
right operand by column), [K,1]... Blocked scales are expanded to x's full shape.

``dequantize`` of constants is NOT folded at import nor by ``fold_constants``: a weight arrives
as ``dequantize(Constant int8, Constant scale, Constant zp)``. The pipeline's ``fold_dequantize``
pass (right after the first ``eliminate_dead_code``) folds what is left into float32 constants;
a fusion pass into integer kernels runs before it. ``quantize`` of constants folds as usual.

Float8 QuantizeLinear/DequantizeLinear stay compositions (cast, clip, multiply).

Every quantized form becomes these around the ordinary float operators the float converters
emit (Conv -> ``nn.conv2d`` (1-D lifted to 2-D with reshapes) or ``nn.conv`` (3-D);
MatMul/Gemm -> ``matmul``), with per-operator results:

- QDQ graphs: exactly the nodes of the file (QuantizeLinear -> quantize, DequantizeLinear ->
  dequantize).
- QLinearConv:  q(add(conv(dq(x, xs, xzp), dq(w, ws, wzp)), dq(B, xs*ws, 0)), ys, yzp).
  The int32 bias B is dequantized in the shape [1,O,1,1] (or [1,O,1] / [1,O,1,1,1]) with scale
  ``xs * ws`` (0-d or [1,O,1,1]) and an int32 0-d zero point: ``add(conv, dequantize(B...))``.
- QLinearMatMul: q(matmul(dq(a), dq(b)), ys, yzp).  com.microsoft.QGemm: q(add(matmul(
  dq(a), dq(b), transpose_b=transB) [* alpha], dq(C, alpha*as*bs, 0)), ys, yzp), or without
  the final q when y_scale is absent (float output).
- ConvInteger / MatMulInteger (int32 output, exact):
  cast(conv|matmul(dq(x, 1, xzp), dq(w, 1, wzp)), dtype=int32), the unit scales float32 when
  every sum is bounded below 2**24 in magnitude (known from the constant weights), else float64.
- com.microsoft.MatMulIntegerToFloat: [add(]matmul(dq(a, as, azp), dq(b, bs, bzp))[, bias)].
- DynamicQuantizeLinear: y = quantize(x, scale, zp, uint8) with scale/zp computed at run time
  (min/max reductions); DynamicQuantizeMatMul: that, then dq(y, scale, zp) @ dq(B, bs, bzp).
- com.microsoft QLinearAdd: q(add(dq(a, as/cs, az), dq(b, bs/cs, bz)), 1, cz); QLinearMul:
  q(multiply(multiply(dq(a, 1, az), dq(b, 1, bz)), as*bs/cs), 1, cz) (ONNX Runtime's rounding,
  bit-exact: the same values as q(add|multiply(dq(a), dq(b)), cs, cz) but for ties); QLinearSigmoid,
  QLinearLeakyRelu: q(sigmoid|leaky_relu(dq(x)), ys, yzp); QLinearAveragePool,
  QLinearGlobalAveragePool: q(avg pool|mean(dq(x)), ys, yzp); QLinearConcat: q(concat(dq(x_i)
  ...), ys, yzp); QLinearSoftmax: q(softmax(dq(x)), ys, yzp); QLinearWhere: q(where(c, dq(x),
  dq(y)), zs, zzp).
- com.microsoft.DynamicQuantizeLSTM: an unrolled LSTM whose weights are dequantized at import
  (float32 constants), X and h at every step round-tripped through DynamicQuantizeLinear (as
  ONNX Runtime quantizes them); no integer kernel.
"""


from __future__ import annotations

import numpy as np

from ...packager.ir.graph import Value
from .proto import tensor_dtype_to_np_dtype
from .registry import NodeContext, converter

# Integer outputs mlcpack quantizes to (rounded, saturated), and float8 ones (cast, saturated).
QUANT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int4", "uint4", "int2",
                "uint2")
FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0,
              "float8_e5m2fnuz": 57344.0}


def fold_cast(data: np.ndarray, dtype: np.dtype | str, saturate: bool) -> np.ndarray:
    """ONNX Cast of a constant, with ONNX's float8 saturation (onnx's reference semantics)."""
    if (dtype if isinstance(dtype, str) else np.dtype(dtype).name) not in FLOAT8_MAX:
        # onnx's cast_to is astype for every other dtype
        return np.asarray(data).astype(dtype)
    from onnx.helper import np_dtype_to_tensor_dtype
    from onnx.reference.ops.op_cast import cast_to as reference_cast

    return np.asarray(reference_cast(data, np_dtype_to_tensor_dtype(np.dtype(dtype)), saturate))


def saturate_for(ctx: NodeContext, x: Value, dtype: str, saturate: bool = True) -> Value:
    """``x`` clamped to the finite range of float8 ``dtype`` when ``saturate`` (ONNX's default:
    out-of-range values and infinities become the largest finite value; NaN stays NaN); the
    cast itself does not saturate (saturate=0: overflow gives inf or NaN)."""
    limit = FLOAT8_MAX.get(dtype)
    if limit is None or not saturate or x.type.dtype not in _FLOAT_SOURCES:
        return x
    return ctx.emit("clip", x, min=-limit, max=limit)


_FLOAT_SOURCES = ("float32", "float64", "float16", "bfloat16")


def _dtype_of(ctx: NodeContext, code: int) -> str:
    try:
        return str(np.dtype(tensor_dtype_to_np_dtype(int(code))))
    except (KeyError, TypeError, ValueError):
        raise ctx.error(f"output_dtype {code} is not a tensor type") from None


def param(ctx: NodeContext, p: Value, x: Value, what: str, axis: int | None = None) -> Value:
    """``p`` (a scale or zero point) made broadcastable against ``x``: 0-d per tensor, x's rank
    with the channel extent on ``axis`` per axis (``axis`` defaults to the node's attribute)."""
    xshape, pshape = x.type.shape, p.type.shape
    rank = len(xshape)
    size = int(np.prod(pshape, dtype=np.int64))
    block = int(ctx.attrs.get("block_size") or 0)
    if axis is None:
        axis = int(ctx.attrs.get("axis", 1))
    if block == 0 and size == 1 and len(pshape) <= 1:
        return ctx.reshape(p, ())  # per tensor
    if rank == 0 or not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for input shape {xshape}")
    axis %= rank
    if block == 0:
        if len(pshape) != 1 or pshape[0] != xshape[axis]:
            raise ctx.error(f"{what} has shape {pshape}: per-axis quantization along axis {axis} "
                            f"of {xshape} needs a 1-D {what} of {xshape[axis]}")
        return ctx.reshape(p, tuple(xshape[axis] if d == axis else 1 for d in range(rank)))
    if block < 0:
        raise ctx.error(f"block_size {block} must be >= 0")
    want = tuple(-(-xshape[axis] // block) if d == axis else n for d, n in enumerate(xshape))
    if pshape != want:
        raise ctx.error(f"{what} has shape {pshape}: blocked quantization of {xshape} with "
                        f"block_size {block} along axis {axis} needs {want}")
    index = ctx.constant(np.arange(xshape[axis], dtype=np.int64) // block, "block_index")
    return ctx.emit("take", p, index, axis=axis)


def _to_float32(ctx: NodeContext, v: Value) -> Value:
    return v if v.type.dtype == "float32" else ctx.emit("cast", v, dtype="float32")


def zero_point_of(ctx: NodeContext, zero_point: Value | None, x: Value, dtype: str,
                  axis: int | None = None) -> Value:
    """The zero point made broadcastable against ``x``, or a 0-d zero of ``dtype`` when the
    node has none."""
    if zero_point is None:
        return ctx.constant(np.zeros((), dtype), "zero_point")
    return param(ctx, zero_point, x, "zero point", axis)


def quantize(ctx: NodeContext, x: Value, scale: Value, zero_point: Value | None,
             out_dtype: str, saturate: bool = True) -> Value:
    """``saturate(round_half_even(x / scale) + zero_point)`` as ``out_dtype`` (the IR's
    ``quantize``); for float8, ``x / scale + zero_point`` cast (saturating when ``saturate``).
    ``scale`` and ``zero_point`` as the node gives them (per tensor, per axis, blocked)."""
    if out_dtype not in QUANT_DTYPES and out_dtype not in FLOAT8_MAX:
        raise ctx.error(f"quantizing to {out_dtype} is not supported (only "
                        f"{', '.join(QUANT_DTYPES + tuple(FLOAT8_MAX))})")
    if scale.type.dtype != x.type.dtype:
        raise ctx.error(f"scale is {scale.type.dtype}, input is {x.type.dtype}: they must match")
    if out_dtype in FLOAT8_MAX:
        q = _to_float32(ctx, ctx.emit("divide", x, param(ctx, scale, x, "scale")))
        if zero_point is not None:
            q = ctx.emit("add", q, _to_float32(ctx, param(ctx, zero_point, x, "zero point")))
        return ctx.emit("cast", saturate_for(ctx, q, out_dtype, saturate), dtype=out_dtype)
    if x.type.dtype not in _FLOAT_SOURCES:
        raise ctx.error(f"quantizing a {x.type.dtype} input is not supported (only float)")
    zp = zero_point_of(ctx, zero_point, x, out_dtype)
    return ctx.emit("quantize", x, param(ctx, scale, x, "scale"), zp, dtype=out_dtype)


def dequantize(ctx: NodeContext, q: Value, scale: Value, zero_point: Value | None,
               axis: int | None = None) -> Value:
    """``(q - zero_point) * scale`` (the IR's ``dequantize``), never folded at import so a
    constant weight stays integer for the quantized-kernel fusion; float8 as a composition."""
    if q.type.dtype in FLOAT8_MAX:
        y = ctx.emit("cast", q, dtype="float32")
        if zero_point is not None:
            y = ctx.emit("subtract", y, ctx.emit("cast", param(ctx, zero_point, q, "zero point",
                                                              axis), dtype="float32"))
        if scale.type.dtype != "float32":
            y = ctx.emit("cast", y, dtype=scale.type.dtype)
        return ctx.emit("multiply", y, param(ctx, scale, q, "scale", axis))
    zp = zero_point_of(ctx, zero_point, q, q.type.dtype, axis)
    s = param(ctx, scale, q, "scale", axis)
    try:
        return ctx.bb.emit_op("dequantize", q, s, zp)
    except ValueError as exc:
        raise ctx.error(f"dequantize: {exc}") from None


@converter("QuantizeLinear", since=10, attrs={"axis": 1, "saturate": 1, "block_size": 0,
                                               "output_dtype": 0, "precision": 0})
def _quantize_linear(ctx: NodeContext) -> Value:
    x, scale = ctx.input(0), ctx.input(1)
    zp = ctx.input(2) if ctx.has_input(2) else None
    if ctx.attrs["output_dtype"]:
        out_dtype = _dtype_of(ctx, ctx.attrs["output_dtype"])
        if zp is not None and zp.type.dtype != out_dtype:
            raise ctx.error(f"output_dtype {out_dtype} differs from the zero point's "
                            f"{zp.type.dtype}")
    else:
        out_dtype = zp.type.dtype if zp is not None else "uint8"
    if ctx.attrs["precision"]:
        precision = _dtype_of(ctx, ctx.attrs["precision"])
        x = ctx.emit("cast", x, dtype=precision) if x.type.dtype != precision else x
        scale = ctx.emit("cast", scale, dtype=precision) if scale.type.dtype != precision \
            else scale
    return quantize(ctx, x, scale, zp, out_dtype, bool(ctx.attrs["saturate"]))


@converter("DequantizeLinear", since=10, attrs={"axis": 1, "block_size": 0, "output_dtype": 0})
def _dequantize_linear(ctx: NodeContext) -> Value:
    x, scale = ctx.input(0), ctx.input(1)
    zp = ctx.input(2) if ctx.has_input(2) else None
    if x.type.dtype not in QUANT_DTYPES and x.type.dtype not in FLOAT8_MAX:
        raise ctx.error(f"dequantizing {x.type.dtype} is not supported (only "
                        f"{', '.join(QUANT_DTYPES + tuple(FLOAT8_MAX))})")
    if zp is not None and zp.type.dtype != x.type.dtype:
        raise ctx.error(f"zero point is {zp.type.dtype}, input is {x.type.dtype}: they must match")
    if ctx.attrs["output_dtype"]:
        out_dtype = _dtype_of(ctx, ctx.attrs["output_dtype"])
        if out_dtype != scale.type.dtype:
            raise ctx.error(f"output_dtype {out_dtype} differs from the scale's "
                            f"{scale.type.dtype}")
    return dequantize(ctx, x, scale, zp)


def dynamic_quantize(ctx: NodeContext, x: Value) -> list[Value]:
    """ONNX DynamicQuantizeLinear: (y uint8, scale, zero point) from x's range (with 0)."""
    if x.type.dtype != "float32":
        raise ctx.error(f"input is {x.type.dtype}; DynamicQuantizeLinear takes float32")
    zero = ctx.constant(np.zeros((), np.float32), "zero")
    x_min = ctx.emit("minimum", ctx.emit("min", x, axes=None, keepdims=False), zero)
    x_max = ctx.emit("maximum", ctx.emit("max", x, axes=None, keepdims=False), zero)
    scale = ctx.emit("divide", ctx.emit("subtract", x_max, x_min),
                     ctx.constant(np.array(255.0, np.float32), "qrange"))
    # an all-zero x: scale 1 (ONNX Runtime), not 0 (whose zero point would be 0/0)
    scale = ctx.emit("where", ctx.emit("equal", x_max, x_min),
                     ctx.constant(np.array(1.0, np.float32), "one"), scale)
    zp_float = ctx.emit("clip", ctx.emit("round", ctx.emit("subtract", zero,
                                                           ctx.emit("divide", x_min, scale))),
                        min=0.0, max=255.0)
    zero_point = ctx.emit("cast", zp_float, dtype="uint8")
    return [ctx.emit("quantize", x, scale, zero_point, dtype="uint8"), scale, zero_point]


@converter("DynamicQuantizeLinear", since=11)
def _dynamic_quantize_linear(ctx: NodeContext) -> list[Value]:
    return dynamic_quantize(ctx, ctx.input(0))
