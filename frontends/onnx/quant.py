"""Converters for reduced-precision and quantization ONNX operators (QuantizeLinear,
DequantizeLinear, DynamicQuantizeLinear).

They are compositions of the operator table's elementwise rows, so scales and zero points may be
run-time tensors: ``QuantizeLinear`` is ``saturate(round_half_even(x / scale) + zero_point)``,
``DequantizeLinear`` is ``(x - zero_point) * scale``. A per-axis scale (1-D, one per channel of
``axis``) is reshaped to broadcast along that axis; a blocked scale (``block_size`` > 0: the same
rank as ``x``, ``ceil(d / block_size)`` along ``axis``) is expanded with a gather of
``i // block_size``. Rounding and saturation run in float32 (float16/bfloat16 inputs included).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from ...packager.ir.graph import Value
from .registry import NodeContext, converter

# Integer outputs mlcpack quantizes to (rounded, saturated), and float8 ones (cast, saturated).
QUANT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int4", "uint4", "int2",
                "uint2")
FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0,
              "float8_e5m2fnuz": 57344.0}
_SUBBYTE_RANGE = {"int4": (-8.0, 7.0), "uint4": (0.0, 15.0), "int2": (-2.0, 1.0),
                  "uint2": (0.0, 3.0)}


def fold_cast(data: np.ndarray, dtype: np.dtype | str, saturate: bool) -> np.ndarray:
    """ONNX Cast of a constant, with ONNX's float8 saturation (onnx's reference semantics)."""
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


def _range(dtype: str) -> tuple[float, float]:
    """The saturation bounds, as float32 values (int32's max is not one: the float32 below)."""
    if dtype in _SUBBYTE_RANGE:
        return _SUBBYTE_RANGE[dtype]
    info = np.iinfo(dtype)
    hi = np.float32(info.max)
    if float(hi) > info.max:
        hi = np.nextafter(hi, np.float32(0))
    return float(info.min), float(hi)


def _dtype_of(ctx: NodeContext, code: int) -> str:
    try:
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(int(code))))
    except (KeyError, TypeError, ValueError):
        raise ctx.error(f"output_dtype {code} is not a tensor type") from None


def _param(ctx: NodeContext, p: Value, x: Value, what: str) -> Value:
    """``p`` (a scale or zero point) made broadcastable against ``x``."""
    xshape, pshape = x.type.shape, p.type.shape
    rank = len(xshape)
    size = int(np.prod(pshape, dtype=np.int64))
    block = int(ctx.attrs.get("block_size") or 0)
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


def quantize(ctx: NodeContext, x: Value, scale: Value, zero_point: Value | None,
             out_dtype: str, saturate: bool = True) -> Value:
    """``saturate(round_half_even(x / scale) + zero_point)`` as ``out_dtype``; for float8,
    ``x / scale + zero_point`` cast (saturating when ``saturate``)."""
    if out_dtype not in QUANT_DTYPES and out_dtype not in FLOAT8_MAX:
        raise ctx.error(f"quantizing to {out_dtype} is not supported (only "
                        f"{', '.join(QUANT_DTYPES + tuple(FLOAT8_MAX))})")
    if scale.type.dtype != x.type.dtype:
        raise ctx.error(f"scale is {scale.type.dtype}, input is {x.type.dtype}: they must match")
    q = ctx.emit("divide", x, _param(ctx, scale, x, "scale"))
    if out_dtype in FLOAT8_MAX:
        q = _to_float32(ctx, q)
        if zero_point is not None:
            q = ctx.emit("add", q, _to_float32(ctx, _param(ctx, zero_point, x, "zero point")))
        return ctx.emit("cast", saturate_for(ctx, q, out_dtype, saturate), dtype=out_dtype)
    q = ctx.emit("round", _to_float32(ctx, q))
    if zero_point is not None:
        q = ctx.emit("add", q, _to_float32(ctx, _param(ctx, zero_point, x, "zero point")))
    lo, hi = _range(out_dtype)
    q = ctx.emit("clip", q, min=lo, max=hi)
    return ctx.emit("cast", q, dtype=out_dtype)


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
    out_dtype = scale.type.dtype
    if ctx.attrs["output_dtype"]:
        out_dtype = _dtype_of(ctx, ctx.attrs["output_dtype"])
        if out_dtype != scale.type.dtype:
            raise ctx.error(f"output_dtype {out_dtype} differs from the scale's "
                            f"{scale.type.dtype}")
    # int32 values (and their differences) are exact in float64, not always in float32
    wide = "float64" if x.type.dtype in ("int32", "uint32") else "float32"
    y = ctx.emit("cast", x, dtype=wide)
    if zp is not None:
        y = ctx.emit("subtract", y, ctx.emit("cast", _param(ctx, zp, x, "zero point"), dtype=wide))
    if wide != out_dtype:
        y = ctx.emit("cast", y, dtype=out_dtype)
    return ctx.emit("multiply", y, _param(ctx, scale, x, "scale"))


@converter("DynamicQuantizeLinear", since=11)
def _dynamic_quantize_linear(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    if x.type.dtype != "float32":
        raise ctx.error(f"input is {x.type.dtype}; DynamicQuantizeLinear takes float32")
    zero = ctx.constant(np.zeros((), np.float32), "zero")
    x_min = ctx.emit("minimum", ctx.emit("min", x, axes=None, keepdims=False), zero)
    x_max = ctx.emit("maximum", ctx.emit("max", x, axes=None, keepdims=False), zero)
    scale = ctx.emit("divide", ctx.emit("subtract", x_max, x_min),
                     ctx.constant(np.array(255.0, np.float32), "qrange"))
    zp_float = ctx.emit("clip", ctx.emit("round", ctx.emit("subtract", zero,
                                                           ctx.emit("divide", x_min, scale))),
                        min=0.0, max=255.0)
    zero_point = ctx.emit("cast", zp_float, dtype="uint8")
    y = ctx.emit("clip", ctx.emit("add", ctx.emit("round", ctx.emit("divide", x, scale)),
                                  zp_float), min=0.0, max=255.0)
    return [ctx.emit("cast", y, dtype="uint8"), scale, zero_point]

