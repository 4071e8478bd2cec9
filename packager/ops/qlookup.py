"""``qlookup``: quantize a float tensor to 8 bits and look each value up in a float32 table, in
one elementwise step (``passes/quantize_lut.py`` makes it from ``dequantize(lut8(quantize(y)))``).

``qlookup(y, scale, zero_point, table, dtype=D, axis=A, unit_scale=U)``: y float32; scale float32 and
zero_point D (int8/uint8) as ``quantize`` takes them (per tensor, or broadcasting to y); table
float32 ``[C, 256]`` (C = y's extent on axis A, or 1 row with A = -1); U: the scale is 1.0 (the
float32-exact chains of ``passes/fuse_qdq.py``), so the code does not divide by it (y / 1.0 is
y). Result float32, y's shape:

    q = quantize(y, scale, zero_point, D)            (ops/quant.py, bit for bit)
    out[..., c, ...] = table[c, q + 128 * (D is int8)]

The table holds ``dequantize(lut8_table, ...)``: what the QDQ chain computes after the 8-bit
value, so the op equals the chain it replaces element for element. A float convolution takes it
as its epilogue (the vector epilogue gathers the table row of the vector's channel,
``codegen/contraction/epilogue.py``): an activation between Q/DQ pairs (YOLO's SiLU, Paddle's
HardSwish) costs one rounding and one gather per 8 values instead of three passes over memory
(quantize, table, dequantize).
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .elementwise import broadcast_read, scalar_of
from .qlinear import lut8
from .quant import dequantize, quantize, saturation_range
from .registry import INJECTIVE, OPAQUE, register_op


def _infer_qlookup(y: TensorType, scale: TensorType, zero_point: TensorType, table: TensorType,
                   dtype: str = "uint8", axis: int = -1, unit_scale: bool = False) -> TensorType:
    if (y.dtype != "float32" or scale.dtype != "float32" or dtype not in ("int8", "uint8")
            or zero_point.dtype != dtype):
        raise ValueError(f"qlookup takes a float32 y and scale and a {dtype} zero point, not "
                         f"{y.dtype}, {scale.dtype}, {zero_point.dtype}")
    if table.dtype != "float32" or len(table.shape) != 2 or table.shape[1] != 256:
        raise ValueError(f"qlookup takes a float32 [C, 256] table, not {table.dtype} "
                         f"{table.shape}")
    if axis >= 0 and (axis >= len(y.shape) or y.shape[axis] != table.shape[0]):
        raise ValueError(f"qlookup: table {table.shape} does not fit axis {axis} of {y.shape}")
    if axis < 0 and table.shape[0] != 1:
        raise ValueError(f"qlookup: a table of {table.shape[0]} rows needs an axis")
    return TensorType(y.shape, "float32")


def _legalize_qlookup(y: te.Tensor, scale: te.Tensor, zero_point: te.Tensor, table: te.Tensor,
                      out_type: TensorType, name: str, dtype: str = "uint8", axis: int = -1,
                      unit_scale: bool = False) -> te.Tensor:
    lo, hi = saturation_range(dtype)
    off = 128.0 if dtype == "int8" else 0.0

    def body(*i: te.IndexVar) -> te.Expr:
        # ops/quant.py's quantize up to its last cast, then the table's column as an int64
        q = broadcast_read(y, i)
        if not unit_scale:   # y / 1.0 is y: no division (vdivps) for the float32-exact chains
            q = te.cast(q / broadcast_read(scale, i), "float32")
        q = te.math("round", q) + te.cast(broadcast_read(zero_point, i), "float32")
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        if off:
            q = q + scalar_of(off, "float32")
        # a NaN (which quantize's clamp lets through) reads column 0: never outside the table
        q = te.if_then_else(te.eq(q, q), q, scalar_of(0.0, "float32"))
        row = i[axis] if axis >= 0 else te.const(0, "int64")
        return table[row, te.cast(q, "int64")]

    return te.compute(out_type.shape, body, name=name, dtype="float32")


@register_op("qlookup", INJECTIVE, _infer_qlookup, _legalize_qlookup)
def qlookup(y: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, table: np.ndarray,
            dtype: str = "uint8", axis: int = -1, unit_scale: bool = False) -> np.ndarray:
    """``table[c, quantize(y) + 128 * (dtype is int8)]`` per element (see the module doc);
    ``unit_scale``: the scale is 1.0 everywhere (the compiled code skips the division)."""
    q = quantize(y, scale, zero_point, dtype)
    idx = q.astype(np.int64) + (128 if dtype == "int8" else 0)
    if axis < 0:
        return table[0][idx]
    shape = [1] * q.ndim
    shape[axis] = q.shape[axis]
    rows = np.arange(q.shape[axis]).reshape(shape)
    return table[rows, idx]


def is_table_read(node: te.Expr) -> bool:
    """``node`` reads a float32 ``[C, 256]`` table at a column computed from float32 values (a
    ``qlookup``'s gather): ``table[row, int64(float32 expression)]``."""
    if not (isinstance(node, te.Read) and node.tensor.dtype == "float32"
            and len(node.indices) == 2 and tuple(node.tensor.shape)[1:] == (256,)):
        return False
    row, col = node.indices
    return (isinstance(row, (te.IndexVar, te.Const)) and isinstance(col, te.Cast)
            and col.dtype == "int64" and col.value.dtype == "float32")


# ---- qtable: quantize, an 8-bit table, dequantize ------------------------------------------------
# ``qtable(y, scale, zero_point, table, out_scale, out_zero_point, dtype=D, axis=A,
# unit_scale=U)``: y float32 (run-time extents allowed); scale float32 and zero_point D
# (int8/uint8) of one value each; table E (int8/uint8) [C, 256] as ``lut8`` takes it (C = y's
# extent on axis A, or one row with A = -1); out_scale float32 and out_zero_point E of one value
# each. Result float32, y's shape:
#
#     dequantize(lut8(quantize(y, scale, zero_point, D), table, A), out_scale, out_zero_point)
#
# bit for bit (ops/quant.py, ops/qlinear.py): what a QDQ model with open image sizes computes
# around each activation between float convolutions (``passes/quantize_lut.py``
# ``fuse_table_chains``), one pass over memory instead of three. Hints for the kernel, facts of
# the table that the pass computes (they never change the result): every row is constant on
# columns 0 .. col_lo and on col_hi .. 255 (a column clamped to [col_lo, col_hi] reads the
# same entry), and with ``affine_shift`` every row holds column + affine_shift on [col_lo,
# col_hi] (the table's values as its dtype's integers). Opaque; its legalized loop nest (the
# generic fallback) carries a reduction tag over one element that hands the function to the
# vector kernel (``codegen/qtable.py`` ``QTableEmitter``: ``vdivps``, ``vcvtps2dq``,
# packs, ``vpshufb`` over the chunks of [col_lo, col_hi], 32 values a step). An optional 7th
# operand, ``gate`` (float32 [N, C, 1, 1] of a rank-4 y [N, C, H, W]), multiplies y first,
# in float32: ``qtable(y * gate, ...)``, the squeeze-and-excitation gate's multiply -> quantize
# -> dequantize (an identity table where the QDQ file has no activation there).

def _infer_qtable(y: TensorType, scale: TensorType, zero_point: TensorType, table: TensorType,
                  out_scale: TensorType, out_zero_point: TensorType,
                  gate: TensorType | None = None, *, dtype: str = "uint8",
                  axis: int = -1, unit_scale: bool = False, col_lo: int = 0, col_hi: int = 255,
                  affine_shift: int | None = None) -> TensorType:
    if (y.dtype != "float32" or scale.dtype != "float32" or out_scale.dtype != "float32"
            or dtype not in ("int8", "uint8") or zero_point.dtype != dtype
            or table.dtype not in ("int8", "uint8") or out_zero_point.dtype != table.dtype):
        raise ValueError(f"qtable takes float32 y and scales and 8-bit zero points matching "
                         f"{dtype} and the table ({table.dtype}), not {y.dtype}, {scale.dtype}, "
                         f"{zero_point.dtype}, {out_scale.dtype}, {out_zero_point.dtype}")
    if any(len(t.shape) and any(d != 1 for d in t.shape)
           for t in (scale, zero_point, out_scale, out_zero_point)):
        raise ValueError("qtable takes one scale and one zero point per side")
    if len(table.shape) != 2 or table.shape[1] != 256:
        raise ValueError(f"qtable takes an 8-bit [C, 256] table, not {table.shape}")
    if axis >= 0 and (axis >= len(y.shape) or y.shape[axis] != table.shape[0]):
        raise ValueError(f"qtable: table {table.shape} does not fit axis {axis} of {y.shape}")
    if axis < 0 and table.shape[0] != 1:
        raise ValueError(f"qtable: a table of {table.shape[0]} rows needs an axis")
    if gate is not None and not gate_fits(tuple(y.shape), tuple(gate.shape), gate.dtype, axis):
        raise ValueError(f"qtable: a gate takes float32 {tuple(y.shape[:2])} + ones on a "
                         f"rank-4 y (and a table per channel 1 or one row), not {gate.dtype} "
                         f"{gate.shape} on {y.shape}")
    return TensorType(y.shape, "float32")


def gate_fits(y_shape: tuple, gate_shape: tuple, dtype: str, axis: int) -> bool:
    """Whether ``gate_shape`` is a ``qtable`` gate of ``y_shape``: float32, y's first two dims
    then ones (a value per image and channel, the squeeze-and-excitation multiply), rank 4,
    the table one row or per channel 1."""
    return (dtype == "float32" and len(y_shape) == 4 and len(gate_shape) == 4
            and tuple(gate_shape[:2]) == tuple(y_shape[:2])
            and tuple(gate_shape[2:]) == (1, 1) and axis in (-1, 1))


def _legalize_qtable(y: te.Tensor, scale: te.Tensor, zero_point: te.Tensor, table: te.Tensor,
                     out_scale: te.Tensor, out_zero_point: te.Tensor,
                     gate: te.Tensor | None = None, *, out_type: TensorType,
                     name: str, dtype: str = "uint8", axis: int = -1,
                     unit_scale: bool = False, col_lo: int = 0, col_hi: int = 255,
                     affine_shift: int | None = None) -> te.Tensor:
    lo, hi = saturation_range(dtype)
    off = 128.0 if dtype == "int8" else 0.0
    one = te.reduce_axis(1, "r")
    operands = (y, scale, zero_point, table, out_scale, out_zero_point)
    tag_reduction(one, "qtable", operands + ((gate,) if gate is not None else ()),
                  dtype=dtype, table_axis=axis, unit_scale=unit_scale, col_lo=col_lo,
                  col_hi=col_hi, affine_shift=affine_shift)

    def scalar(t: te.Tensor) -> te.Expr:
        return t[(0,) * len(t.shape)]

    def body(*i: te.IndexVar) -> te.Expr:
        q = y[i]
        if gate is not None:
            q = q * gate[i[0], i[1], 0, 0]
        if not unit_scale:
            q = te.cast(q / scalar(scale), "float32")
        q = te.math("round", q) + te.cast(scalar(zero_point), "float32")
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        if off:
            q = q + scalar_of(off, "float32")
        # a NaN (which quantize's clamp lets through) reads column 0: never outside the table
        q = te.if_then_else(te.eq(q, q), q, scalar_of(0.0, "float32"))
        row = i[axis] if axis >= 0 else te.const(0, "int64")
        v = te.cast(table[row, te.cast(q, "int64")], "float32")
        v = (v - te.cast(scalar(out_zero_point), "float32")) * scalar(out_scale)
        return te.sum_of(v, (one,))

    return te.compute(out_type.shape, body, name=name, dtype="float32")


@register_op("qtable", OPAQUE, _infer_qtable, _legalize_qtable)
def qtable(y: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, table: np.ndarray,
           out_scale: np.ndarray, out_zero_point: np.ndarray, gate: np.ndarray | None = None,
           *, dtype: str = "uint8", axis: int = -1, unit_scale: bool = False, col_lo: int = 0,
           col_hi: int = 255, affine_shift: int | None = None) -> np.ndarray:
    """See the comment above: the three reference ops in a row, after ``y * gate`` in float32
    with a gate (the hints do not change the result)."""
    if gate is not None:
        y = (y * gate).astype(np.float32)
    q = quantize(y, scale, zero_point, dtype)
    return dequantize(lut8(q, table, axis), out_scale, out_zero_point)
