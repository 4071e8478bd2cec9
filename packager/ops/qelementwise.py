"""Integer elementwise kernels the QDQ fusion (``passes/fuse_qdq_elementwise.py``) emits: ONNX
Runtime's QLinearAdd / QLinearMul / QLinearGlobalAveragePool on 8-bit tensors, without a float
round trip through memory.

``qbinary(a, b, a_zp, b_zp, mult_a, mult_b, y_zp, kind, dtype)``: a, b int8/uint8, b of a's
shape, of one element, or of a's shape with every axis after some axis k of extent 1 (a value
per *row* of the first k axes: the squeeze-and-excitation gate ``[N, C, 1, 1]`` of an
``[N, C, H, W]`` tensor); a_zp, b_zp int32 ``()``, mult_a, mult_b, y_zp float32 ``()``;
result a's shape, dtype D:

    add:  f = float32(a - a_zp) * mult_a + float32(b - b_zp) * mult_b
    mul:  f = float32((a - a_zp) * (b - b_zp)) * mult_a          (the product exact in int32)
    y   = saturate(round_half_even(f) + y_zp)

float32 operations in that order, no fused multiply-add: MLAS's QLinearAdd (ScaleA / ScaleC,
ScaleB / ScaleC) and QLinearMul (ScaleA * ScaleB / ScaleC) formulas, and what the importer
writes for the com.microsoft ops. For a QDQ ``quantize(dequantize(a) op dequantize(b))`` it is
within one quantization step of the float composition (they differ only where the float
composition's roundings move a value across a rounding boundary).

``qgavgpool(x, x_zp, mult, y_zp, dtype)``: x int8/uint8 ``[N, C, *S]``, y ``[N, C, 1, ...]``:
acc = sum over S of (x - x_zp) in int32, y = saturate(round_half_even(float32(acc) * mult) +
y_zp), mult = x_scale / (y_scale * prod(S)) (MLAS's QLinearGlobalAveragePool).

Both ops are opaque, and their legalized loop nests (correct, the generic fallback) carry a
reduction tag (over one element for ``qbinary``) that hands the function to the vector kernel
``codegen/qelementwise.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .elementwise import broadcast_read, scalar_of
from .quant import saturation_range
from .registry import OPAQUE, register_op

_I8 = ("int8", "uint8")


def row_broadcast(a_shape: tuple, b_shape: tuple) -> int | None:
    """The number of leading axes of ``a_shape`` that ``b_shape`` (of the same rank) keeps,
    when every axis after them is 1 in b (b holds one value per row of those axes; a's shape
    itself: ``len(a_shape)``); None for any other broadcast."""
    if len(a_shape) != len(b_shape):
        return None
    k = len(a_shape)
    while k > 0 and b_shape[k - 1] == 1:
        k -= 1
    if tuple(b_shape[:k]) != tuple(a_shape[:k]):
        return None
    return k


def _requant(f: np.ndarray, y_zp, dtype: str) -> np.ndarray:
    lo, hi = saturation_range(dtype)
    return np.clip(np.round(f) + np.float32(y_zp), lo, hi).astype(dtype)


def _infer_qbinary(a: TensorType, b: TensorType, a_zp: TensorType, b_zp: TensorType,
                   mult_a: TensorType, mult_b: TensorType, y_zp: TensorType,
                   kind: str = "add", dtype: str = "uint8") -> TensorType:
    if a.dtype not in _I8 or b.dtype not in _I8 or dtype not in _I8 or kind not in ("add", "mul"):
        raise ValueError(f"qbinary takes int8/uint8 operands (not {a.dtype}, {b.dtype}), kind "
                         f"add or mul (not {kind}) and an 8-bit dtype (not {dtype})")
    numel = math.prod(b.shape)
    if numel != 1 and row_broadcast(tuple(a.shape), tuple(b.shape)) is None:
        raise ValueError(f"qbinary: b {b.shape} is neither one value, a's shape {a.shape}, "
                         "nor a value per row of a's leading axes")
    return TensorType(a.shape, dtype)


def _legalize_qbinary(a: te.Tensor, b: te.Tensor, a_zp: te.Tensor, b_zp: te.Tensor,
                      mult_a: te.Tensor, mult_b: te.Tensor, y_zp: te.Tensor,
                      out_type: TensorType, name: str, kind: str = "add",
                      dtype: str = "uint8") -> te.Tensor:
    one = te.reduce_axis(1, "r")
    tag_reduction(one, "qbinary", (a, b, a_zp, b_zp, mult_a, mult_b, y_zp), binary=kind,
                  dtype=dtype)

    def acc_body(*i: te.IndexVar) -> te.Expr:
        da = te.cast(a[i], "int32") - a_zp[()]
        db = te.cast(broadcast_read(b, i), "int32") - b_zp[()]
        if kind == "mul":
            f = te.cast(da * db, "float32") * mult_a[()]
        else:
            f = te.cast(da, "float32") * mult_a[()] + te.cast(db, "float32") * mult_b[()]
        return te.sum_of(f, (one,))

    acc = te.compute(out_type.shape, acc_body, name=name + "_f", dtype="float32")
    lo, hi = saturation_range(dtype)

    def body(*i: te.IndexVar) -> te.Expr:
        q = te.math("round", acc[i]) + y_zp[()]
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        return te.cast(q, dtype)

    return te.compute(out_type.shape, body, name=name, dtype=dtype)


@register_op("qbinary", OPAQUE, _infer_qbinary, _legalize_qbinary)
def qbinary(a: np.ndarray, b: np.ndarray, a_zp: np.ndarray, b_zp: np.ndarray,
            mult_a: np.ndarray, mult_b: np.ndarray, y_zp: np.ndarray, kind: str = "add",
            dtype: str = "uint8") -> np.ndarray:
    """See the module docstring."""
    da = a.astype(np.int32) - np.int32(a_zp)
    db = b.astype(np.int32) - np.int32(b_zp)
    if kind == "mul":
        f = (da * db).astype(np.float32) * np.float32(mult_a)
    else:
        f = (da.astype(np.float32) * np.float32(mult_a)
             + db.astype(np.float32) * np.float32(mult_b))
    return _requant(np.broadcast_to(f, a.shape).astype(np.float32), y_zp, dtype)


def _infer_qgavgpool(x: TensorType, x_zp: TensorType, mult: TensorType, y_zp: TensorType,
                     dtype: str = "uint8") -> TensorType:
    if x.dtype not in _I8 or dtype not in _I8 or len(x.shape) < 3:
        raise ValueError(f"qgavgpool takes an int8/uint8 [N, C, ...] x (not {x.dtype} "
                         f"{x.shape}) and an 8-bit dtype (not {dtype})")
    return TensorType(tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2), dtype)


def _legalize_qgavgpool(x: te.Tensor, x_zp: te.Tensor, mult: te.Tensor, y_zp: te.Tensor,
                        out_type: TensorType, name: str, dtype: str = "uint8") -> te.Tensor:
    spatial = x.shape[2:]
    axes = [te.reduce_axis(n, f"r{d}") for d, n in enumerate(spatial)]
    tag_reduction(axes[0], "qgavgpool", (x, x_zp, mult, y_zp), dtype=dtype)

    def acc_body(n, c, *_):
        return te.sum_of(te.cast(x[(n, c) + tuple(axes)], "int32") - x_zp[()], tuple(axes))

    acc = te.compute(out_type.shape, acc_body, name=name + "_acc", dtype="int32")
    lo, hi = saturation_range(dtype)

    def body(*i: te.IndexVar) -> te.Expr:
        q = te.math("round", te.cast(acc[i], "float32") * mult[()]) + y_zp[()]
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        return te.cast(q, dtype)

    return te.compute(out_type.shape, body, name=name, dtype=dtype)


@register_op("qgavgpool", OPAQUE, _infer_qgavgpool, _legalize_qgavgpool)
def qgavgpool(x: np.ndarray, x_zp: np.ndarray, mult: np.ndarray, y_zp: np.ndarray,
              dtype: str = "uint8") -> np.ndarray:
    """See the module docstring."""
    axes = tuple(range(2, x.ndim))
    acc = (x.astype(np.int64) - int(x_zp)).sum(axis=axes, keepdims=True).astype(np.int32)
    return _requant(acc.astype(np.float32) * np.float32(mult), y_zp, dtype)


# ---- softmax of 8-bit values to 8-bit values ----------------------------------------------------
# ``qsoftmax(x, x_scale, y_scale, y_zp, dtype)``: x int8/uint8 (any shape, the softmax over its
# last axis), x_scale, y_scale, y_zp float32 ``()``; QDQ's quantize(softmax(dequantize(x)),
# y_scale, y_zp) with the row maximum taken on the integers (x's zero point cancels):
#     e = exp(float32(x - max(row)) * x_scale),   y = saturate(round_half_even(e / sum(e) /
#     y_scale) + y_zp)
# (passes/fuse_qdq_attention.py; the vector kernel is codegen/softmax.py's QSoftmaxEmitter,
# which multiplies by (1 / sum) / y_scale: within one quantization step of the float
# composition).

def _infer_qsoftmax(x: TensorType, x_scale: TensorType, y_scale: TensorType, y_zp: TensorType,
                    dtype: str = "uint8") -> TensorType:
    if x.dtype not in _I8 or dtype not in _I8 or not x.shape:
        raise ValueError(f"qsoftmax takes an int8/uint8 tensor (not {x.dtype} {x.shape}) and "
                         f"an 8-bit dtype (not {dtype})")
    return TensorType(x.shape, dtype)


def _legalize_qsoftmax(x: te.Tensor, x_scale: te.Tensor, y_scale: te.Tensor, y_zp: te.Tensor,
                       out_type: TensorType, name: str, dtype: str = "uint8") -> te.Tensor:
    last = x.ndim - 1
    r = te.reduce_axis(x.shape[last], "r")
    row_shape = tuple(x.shape[:last]) + (1,)

    def along(i, index):
        return tuple(i[:last]) + (index,)

    tag_reduction(r, "qsoftmax", (x, x_scale, y_scale, y_zp), dtype=dtype)
    row_max = te.compute(row_shape, lambda *i: te.max_of(te.cast(x[along(i, r)], "float32"), r),
                         name=f"{name}_max")
    e = te.compute(x.shape, lambda *i: te.exp((te.cast(x[i], "float32") - row_max[along(i, 0)])
                                              * x_scale[()]), name=f"{name}_exp")
    total = te.compute(row_shape, lambda *i: te.sum_of(e[along(i, r)], r), name=f"{name}_sum")
    lo, hi = saturation_range(dtype)

    def body(*i: te.IndexVar) -> te.Expr:
        q = te.math("round", e[i] / total[along(i, 0)] / y_scale[()]) + y_zp[()]
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        return te.cast(q, dtype)

    return te.compute(out_type.shape, body, name=name, dtype=dtype)


@register_op("qsoftmax", OPAQUE, _infer_qsoftmax, _legalize_qsoftmax)
def qsoftmax(x: np.ndarray, x_scale: np.ndarray, y_scale: np.ndarray, y_zp: np.ndarray,
             dtype: str = "uint8") -> np.ndarray:
    """See the comment above."""
    d = (x.astype(np.int32) - x.max(axis=-1, keepdims=True).astype(np.int32)).astype(np.float32)
    e = np.exp(d * np.float32(x_scale)).astype(np.float32)
    y = e / e.sum(axis=-1, keepdims=True, dtype=np.float32) / np.float32(y_scale)
    return _requant(y.astype(np.float32), y_zp, dtype)
