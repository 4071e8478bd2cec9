"""Quantization operators: ``quantize`` (float -> integer) and ``dequantize`` (integer -> float).

Both are elementwise with three operands that broadcast against each other by numpy's rules:
``quantize(x, scale, zero_point, dtype=D)`` and ``dequantize(q, scale, zero_point)``. The scale
and the zero point are () per tensor, or of ``x``'s rank with the channel's extent on the
quantized axis and 1 elsewhere per channel (``[O, 1, 1, 1]`` for a convolution's weight,
``[1, C, 1, 1]`` for activations, ``[1, N]`` for a matmul's right operand by column).

- ``quantize``: ``saturate(round_half_even(x / scale) + zero_point)`` as ``D``; the division in
  ``x``'s float dtype, rounding, the zero point and saturation in float32 (ONNX QuantizeLinear,
  ONNX Runtime's MLAS kernel). ``zero_point`` has dtype ``D``. ``unit_scale=True`` (set by
  ``passes/fuse_qdq.py`` on its float32-exact chains, whose scale is the constant 1.0): the
  compiled code does not divide (x / 1.0 is x for every float32 x, so the result is the same).
- ``dequantize``: ``(q - zero_point) * scale`` in ``scale``'s dtype; the subtraction runs in
  float64 for int32/uint32 (exact), float32 otherwise. ``zero_point`` has ``q``'s dtype.
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from .elementwise import broadcast_read, scalar_of
from .registry import ELEMWISE, broadcast_shape, register_op

# Integer dtypes quantize produces and dequantize reads.
QUANT_INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int4", "uint4",
                    "int2", "uint2")
_SUBBYTE_RANGE = {"int4": (-8.0, 7.0), "uint4": (0.0, 15.0), "int2": (-2.0, 1.0),
                  "uint2": (0.0, 3.0)}


def saturation_range(dtype: str) -> tuple[float, float]:
    """The bounds ``quantize`` clamps to, as float32 values (int32's max is not one: the
    float32 just below it)."""
    if dtype in _SUBBYTE_RANGE:
        return _SUBBYTE_RANGE[dtype]
    info = np.iinfo(dtype)
    hi = np.float32(info.max)
    if float(hi) > info.max:
        hi = np.nextafter(hi, np.float32(0))
    return float(info.min), float(hi)


def _wide(dtype: str) -> str:
    """The float dtype dequantize subtracts the zero point in (exact for every value)."""
    return "float64" if dtype in ("int32", "uint32") else "float32"


def _infer_quantize(x: TensorType, scale: TensorType, zero_point: TensorType,
                    dtype: str = "uint8", unit_scale: bool = False, *,
                    relations: list) -> TensorType:
    if x.dtype not in te.FLOAT_DTYPES or x.dtype in te.FLOAT8_DTYPES:
        raise ValueError(f"quantize takes a float tensor, not {x.dtype}")
    if scale.dtype != x.dtype:
        raise ValueError(f"scale is {scale.dtype}, input is {x.dtype}: they must match")
    if dtype not in QUANT_INT_DTYPES:
        raise ValueError(f"quantize to {dtype} is not supported (only {QUANT_INT_DTYPES})")
    if zero_point.dtype != dtype:
        raise ValueError(f"zero point is {zero_point.dtype}, output is {dtype}: they must match")
    return TensorType(broadcast_shape(x.shape, scale.shape, zero_point.shape,
                                      relations=relations), dtype)


def _legalize_quantize(x: te.Tensor, scale: te.Tensor, zero_point: te.Tensor,
                       out_type: TensorType, name: str, dtype: str = "uint8",
                       unit_scale: bool = False) -> te.Tensor:
    lo, hi = saturation_range(dtype)

    def body(*i: te.IndexVar) -> te.Expr:
        q = broadcast_read(x, i)
        if not unit_scale or x.dtype != "float32":
            q = te.cast(q / broadcast_read(scale, i), "float32")
        q = te.math("round", q) + te.cast(broadcast_read(zero_point, i), "float32")
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        return te.cast(q, dtype)

    return te.compute(out_type.shape, body, name=name, dtype=dtype)


@register_op("quantize", ELEMWISE, _infer_quantize, _legalize_quantize)
def quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray,
             dtype: str = "uint8", unit_scale: bool = False) -> np.ndarray:
    lo, hi = saturation_range(dtype)
    with np.errstate(all="ignore"):
        q = np.round((x / scale).astype(np.float32)) + zero_point.astype(np.float32)
    return np.clip(q, np.float32(lo), np.float32(hi)).astype(dtype)


def _infer_dequantize(q: TensorType, scale: TensorType, zero_point: TensorType, *,
                      relations: list) -> TensorType:
    if q.dtype not in QUANT_INT_DTYPES:
        raise ValueError(f"dequantize takes an integer tensor of {QUANT_INT_DTYPES}, not {q.dtype}")
    if zero_point.dtype != q.dtype:
        raise ValueError(f"zero point is {zero_point.dtype}, input is {q.dtype}: they must match")
    if scale.dtype not in te.FLOAT_DTYPES or scale.dtype in te.FLOAT8_DTYPES:
        raise ValueError(f"scale must be a float tensor, not {scale.dtype}")
    return TensorType(broadcast_shape(q.shape, scale.shape, zero_point.shape,
                                      relations=relations), scale.dtype)


def _legalize_dequantize(q: te.Tensor, scale: te.Tensor, zero_point: te.Tensor,
                         out_type: TensorType, name: str) -> te.Tensor:
    wide = _wide(q.dtype)

    def body(*i: te.IndexVar) -> te.Expr:
        y = te.cast(broadcast_read(q, i), wide) - te.cast(broadcast_read(zero_point, i), wide)
        return te.cast(y, out_type.dtype) * broadcast_read(scale, i)

    return te.compute(out_type.shape, body, name=name, dtype=out_type.dtype)


@register_op("dequantize", ELEMWISE, _infer_dequantize, _legalize_dequantize)
def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    wide = _wide(str(q.dtype))
    y = q.astype(wide) - zero_point.astype(wide)
    return (y.astype(scale.dtype) * scale).astype(scale.dtype)
