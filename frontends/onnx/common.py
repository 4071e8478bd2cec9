"""Helpers that converters of several families share (a leaf: it imports no other module of the
ONNX frontend at run time), so that no family imports another family or the importer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import proto as onnx

from ...packager.ir.graph import Value

if TYPE_CHECKING:
    from .registry import NodeContext

# Tensor dtypes a bundle can take and return at run time (the runtime's and the code generator's).
# float16/bfloat16/float8 are stored narrow and computed in float32; the runtime carries the dtypes
# numpy lacks (bfloat16, float8_*, int4/uint4/int2/uint2) as their unsigned bits (uint16/uint8)
# and takes ml_dtypes arrays of them as well.
RUNTIME_DTYPES = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
                  "float8_e5m2", "float8_e5m2fnuz", "int8", "int16", "int32", "int64", "uint8",
                  "uint16", "uint32", "uint64", "int4", "uint4", "int2", "uint2", "bool")


def cast_to(ctx: NodeContext, x: Value, dtype: np.dtype | str) -> Value:
    """``x`` as ``dtype``: folded for constants, a ``cast`` op at run time."""
    dtype = str(np.dtype(dtype))
    if x.type.dtype == dtype:
        return x
    if dtype not in RUNTIME_DTYPES or x.type.dtype not in RUNTIME_DTYPES:
        raise ctx.error(f"casting a run-time tensor from {x.type.dtype} to {dtype}: only "
                        f"{', '.join(RUNTIME_DTYPES)} are supported at run time")
    return ctx.emit("cast", x, dtype=dtype)


def onnx_dtype(ctx: NodeContext, to: int | str) -> np.dtype:
    """The numpy dtype of a Cast's ``to`` (an ONNX TensorProto type, or its name in opset 1)."""
    if isinstance(to, str):  # opset 1 names the type: "FLOAT"
        to = onnx.TensorProto.DataType.Value(to.upper())
    try:
        return np.dtype(onnx.tensor_dtype_to_np_dtype(int(to)))
    except (KeyError, TypeError, ValueError):
        raise ctx.error(f"cast to {onnx.TensorProto.DataType.Name(int(to))} is not "
                        "supported") from None


def legacy_broadcast(ctx: NodeContext, a: Value, b: Value) -> Value:
    """Opset < 7: with ``broadcast=1``, B's dims match A's starting at ``axis`` (default: the
    trailing dims); give B trailing ones so numpy broadcasting lines it up the same way."""
    if not ctx.attrs["broadcast"]:
        if a.type.shape != b.type.shape:
            raise ctx.error(f"shapes {a.type.shape} and {b.type.shape} differ and broadcast=0")
        return b
    rank_a, rank_b = len(a.type.shape), len(b.type.shape)
    axis = ctx.attrs["axis"]
    if axis is None:
        return b
    axis %= rank_a
    trailing = rank_a - axis - rank_b
    if trailing < 0:
        raise ctx.error(f"B {b.type.shape} does not fit A {a.type.shape} at axis {axis}")
    return ctx.reshape(b, b.type.shape + (1,) * trailing)
