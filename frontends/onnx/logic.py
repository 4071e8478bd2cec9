"""Converters for comparison, logical, selection and rounding ONNX operators, Cast/CastLike on
run-time tensors, Mod, and the integer-friendly forms of the reductions."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...packager.ir.graph import Value
from .common import cast_to, legacy_broadcast
from .registry import NodeContext, converter

# ONNX op_type: (op, first opset)
_COMPARE = {
    "Equal": ("equal", 1),
    "Less": ("less", 1),
    "Greater": ("greater", 1),
    "LessOrEqual": ("less_equal", 12),
    "GreaterOrEqual": ("greater_equal", 12),
    "And": ("logical_and", 1),
    "Or": ("logical_or", 1),
    "Xor": ("logical_xor", 1),
}

_LEGACY_ATTRS = {"broadcast": 0, "axis": None}


def _pairwise(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        a, b = ctx.input(0), ctx.input(1)
        if ctx.opset < 7:
            b = legacy_broadcast(ctx, a, b)
        return ctx.emit(op, a, b)
    return convert


for _op_type, (_op, _since) in _COMPARE.items():
    if _since < 7:
        converter(_op_type, since=_since, attrs=_LEGACY_ATTRS)(_pairwise(_op))
        converter(_op_type, since=7)(_pairwise(_op))
    else:
        converter(_op_type, since=_since)(_pairwise(_op))


@converter("Not", since=1)
def _not(ctx: NodeContext) -> Value:
    return ctx.emit("logical_not", ctx.input(0))


@converter("Where", since=9)
def _where(ctx: NodeContext) -> Value:
    return ctx.emit("where", ctx.input(0), ctx.input(1), ctx.input(2))


def _unary(op: str, float_only: bool = False) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        if x.type.dtype not in ("float32", "float64") and op in ("floor", "ceil", "round"):
            return x  # rounding an integer changes nothing
        return ctx.emit(op, x)
    return convert


converter("Floor", since=1)(_unary("floor"))
converter("Ceil", since=1)(_unary("ceil"))
converter("Round", since=11)(_unary("round"))
converter("Sign", since=9)(_unary("sign"))


@converter("Mod", since=10, attrs={"fmod": 0})
def _mod(ctx: NodeContext) -> Value:
    a, b = ctx.input(0), ctx.input(1)
    fmod = bool(ctx.attrs["fmod"])
    if a.type.dtype.startswith("float") and not fmod:
        raise ctx.error("fmod=0 on floats is not allowed by ONNX")
    return ctx.emit("mod", a, b, fmod=fmod)


@converter("IsNaN", since=9)
def _isnan(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.emit("not_equal", x, x)


@converter("IsInf", since=10, attrs={"detect_negative": 1, "detect_positive": 1})
def _isinf(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    pos = ctx.emit("equal", x, ctx.scalar(np.inf, x))
    neg = ctx.emit("equal", x, ctx.scalar(-np.inf, x))
    if ctx.attrs["detect_positive"] and ctx.attrs["detect_negative"]:
        return ctx.emit("logical_or", pos, neg)
    if ctx.attrs["detect_positive"]:
        return pos
    if ctx.attrs["detect_negative"]:
        return neg
    return ctx.emit("logical_and", pos, neg)  # all false


@converter("CastLike", since=15, attrs={"saturate": 1, "round_mode": "up"})
def _cast_like(ctx: NodeContext) -> Value:
    x, like = ctx.input(0), ctx.input(1)
    from ...packager.ir.graph import Constant

    from .quant import fold_cast, saturate_for

    saturate = bool(ctx.attrs["saturate"])
    if isinstance(x, Constant):
        return ctx.constant(fold_cast(x.data, like.type.dtype, saturate), "cast")
    return cast_to(ctx, saturate_for(ctx, x, like.type.dtype, saturate), like.type.dtype)


# ---- ReduceProd ---------------------------------------------------------------------------------

def _reduce_prod(from_input: bool) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        from . import valueinputs
        from .nn import _reduce_axes, reduce_run_time_axes

        x = ctx.input(0)
        if from_input and valueinputs.run_time_axes(ctx, 1) is not None:
            return reduce_run_time_axes(ctx)
        axes = _reduce_axes(ctx, from_input)
        if axes == ():
            return x
        if x.type.dtype == "bool":
            raise ctx.error("ReduceProd of a bool tensor is not supported")
        rank = len(x.type.shape)
        if axes is not None and not all(-rank <= a < rank for a in axes):
            raise ctx.error(f"axes {list(axes)} are out of range for rank {rank}")
        return ctx.emit("prod", x, axes=axes, keepdims=bool(ctx.attrs["keepdims"]))
    return convert


converter("ReduceProd", since=1, attrs={"axes": None, "keepdims": 1})(_reduce_prod(False))
converter("ReduceProd", since=18, attrs={"keepdims": 1, "noop_with_empty_axes": 0})(
    _reduce_prod(True))
