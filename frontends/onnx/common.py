"""Helpers that converters of several families share (a leaf: it imports no other module of the
ONNX frontend at run time), so that no family imports another family or the importer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...packager.ir.graph import Value
from .dtypes import RUNTIME_DTYPES, UnsupportedCast, numpy_dtype

if TYPE_CHECKING:
    from .registry import NodeContext


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
    """The numpy dtype of a Cast's ``to`` (``dtypes.numpy_dtype``), refused as the node's error."""
    try:
        return numpy_dtype(to)
    except UnsupportedCast as exc:
        raise ctx.error(str(exc)) from None


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
