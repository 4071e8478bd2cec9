"""Converters for elementwise ATen operators: arithmetic with torch's type promotion, activations,
comparisons and logic, casts."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...packager.ir.graph import Value
from .registry import NodeContext, converter

_FLOATS = ("float32", "float64", "float16", "bfloat16")


def operand(ctx: NodeContext, value: Any, dtype: str, like: Value) -> Value:
    """``value`` (a tensor or a Python number) as an IR value of ``dtype`` that broadcasts
    against ``like``."""
    if isinstance(value, Value):
        return cast_to(ctx, value, dtype)
    if isinstance(value, bool):
        value = int(value)
    return ctx.constant(np.full((1,) * len(like.type.shape), value, dtype=dtype), "scalar")


def cast_to(ctx: NodeContext, x: Value, dtype: str) -> Value:
    if x.type.dtype == dtype:
        return x
    return ctx.emit("cast", x, dtype=dtype)


def _first_tensor(ctx: NodeContext, *names: str) -> Value:
    for n in names:
        if isinstance(ctx.args.get(n), Value):
            return ctx.args[n]
    raise ctx.error("needs a tensor argument")


def _compute_dtype(ctx: NodeContext, a: Any, b: Any) -> str:
    """The dtype both operands are brought to: torch's promoted result (from the node's
    metadata) for arithmetic; for comparisons, the wider of the two tensors."""
    if ctx.out_dtype is not None and ctx.out_dtype != "bool":
        return ctx.out_dtype
    tensors = [v.type.dtype for v in (a, b) if isinstance(v, Value)]
    if len(tensors) == 2 and tensors[0] != tensors[1]:
        return str(np.result_type(*tensors))
    if any(isinstance(v, float) for v in (a, b)) and tensors[0] not in _FLOATS:
        return "float32"
    return tensors[0]


def binary(ctx: NodeContext, op: str, a: Any, b: Any) -> Value:
    like = a if isinstance(a, Value) else b
    dtype = _compute_dtype(ctx, a, b)
    return ctx.emit(op, operand(ctx, a, dtype, like), operand(ctx, b, dtype, like))


def _scaled(ctx: NodeContext, b: Any, alpha: Any) -> Any:
    if alpha is None or alpha == 1:
        return b
    if isinstance(b, Value):
        return binary(ctx, "multiply", b, alpha)
    return b * alpha


def _arith(op: str, reverse: bool = False) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        a, b = ctx.arg("self"), ctx.arg("other")
        if "alpha" in ctx.args:
            b = _scaled(ctx, b, ctx.arg("alpha"))
        return binary(ctx, op, b, a) if reverse else binary(ctx, op, a, b)
    return convert


converter("aten.add.Tensor", "aten.add.Scalar")(_arith("add"))
converter("aten.sub.Tensor", "aten.sub.Scalar")(_arith("subtract"))
converter("aten.rsub.Tensor", "aten.rsub.Scalar")(_arith("subtract", reverse=True))
converter("aten.mul.Tensor", "aten.mul.Scalar")(_arith("multiply"))
converter("aten.maximum.default")(_arith("maximum"))
converter("aten.minimum.default")(_arith("minimum"))
converter("aten.fmod.Tensor", "aten.fmod.Scalar")(
    lambda ctx: ctx.emit("mod", *_pair(ctx), fmod=True))
converter("aten.remainder.Tensor", "aten.remainder.Scalar")(
    lambda ctx: ctx.emit("mod", *_pair(ctx), fmod=False))


def _pair(ctx: NodeContext) -> tuple[Value, Value]:
    a, b = ctx.arg("self"), ctx.arg("other")
    like = a if isinstance(a, Value) else b
    dtype = _compute_dtype(ctx, a, b)
    return operand(ctx, a, dtype, like), operand(ctx, b, dtype, like)


@converter("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(ctx: NodeContext) -> Value:
    a, b = ctx.arg("self"), ctx.arg("other")
    mode = ctx.args.get("rounding_mode")
    if mode is None:  # true division: integers divide as floats
        q = binary(ctx, "divide", a, b)
        return q
    if mode not in ("trunc", "floor"):
        raise ctx.error(f"rounding_mode={mode!r} is not None, 'trunc' or 'floor'")
    x, y = _pair(ctx)
    if x.type.dtype in _FLOATS:
        q = ctx.emit("divide", x, y)
        if mode == "floor":
            return ctx.emit("floor", q)
        # trunc: floor of |q| with q's sign
        return ctx.emit("multiply", ctx.emit("floor", ctx.emit("abs", q)), ctx.emit("sign", q))
    if mode == "trunc":  # the IR's integer divide truncates (C semantics)
        return ctx.emit("divide", x, y)
    # floor for integers: trunc, minus one where the remainder's sign differs from y's
    q = ctx.emit("divide", x, y)
    r = ctx.emit("mod", x, y, fmod=True)
    zero = ctx.scalar(0, r)
    fix = ctx.emit("logical_and", ctx.emit("not_equal", r, zero),
                   ctx.emit("not_equal", ctx.emit("less", r, zero), ctx.emit("less", y, zero)))
    return ctx.emit("subtract", q, ctx.emit("cast", fix, dtype=q.type.dtype))


# ---- unary --------------------------------------------------------------------------------------

_UNARY = {
    "aten.relu.default": "relu", "aten.sigmoid.default": "sigmoid", "aten.tanh.default": "tanh",
    "aten.exp.default": "exp", "aten.log.default": "log", "aten.sqrt.default": "sqrt",
    "aten.abs.default": "abs", "aten.neg.default": "negative", "aten.erf.default": "erf",
    "aten.sin.default": "sin", "aten.cos.default": "cos", "aten.tan.default": "tan",
    "aten.asin.default": "asin", "aten.acos.default": "acos", "aten.atan.default": "atan",
    "aten.sinh.default": "sinh", "aten.cosh.default": "cosh", "aten.asinh.default": "asinh",
    "aten.acosh.default": "acosh", "aten.atanh.default": "atanh", "aten.floor.default": "floor",
    "aten.ceil.default": "ceil", "aten.round.default": "round", "aten.sign.default": "sign",
    "aten.logical_not.default": "logical_not", "aten.silu.default": "silu",
}
_FLOAT_RESULT = {"sigmoid", "tanh", "exp", "log", "sqrt", "erf", "sin", "cos", "tan", "asin", "acos",
                 "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "silu"}


def _unary(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.tensor("self")
        if op in _FLOAT_RESULT and x.type.dtype not in _FLOATS:
            x = cast_to(ctx, x, ctx.out_dtype or "float32")
        if op == "logical_not" and x.type.dtype != "bool":
            x = ctx.emit("not_equal", x, ctx.scalar(0, x))
        return ctx.emit(op, x)
    return convert


for _target, _op in _UNARY.items():
    converter(_target)(_unary(_op))


@converter("aten.rsqrt.default")
def _rsqrt(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("divide", ctx.scalar(1.0, x), ctx.emit("sqrt", x))


@converter("aten.reciprocal.default")
def _reciprocal(ctx: NodeContext) -> Value:
    x = cast_to(ctx, ctx.tensor("self"), ctx.out_dtype or "float32")
    return ctx.emit("divide", ctx.scalar(1.0, x), x)


@converter("aten.log1p.default")
def _log1p(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("log", ctx.emit("add", x, ctx.scalar(1.0, x)))


@converter("aten.expm1.default")
def _expm1(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("subtract", ctx.emit("exp", x), ctx.scalar(1.0, x))


@converter("aten.gelu.default")
def _gelu(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    mode = ctx.arg("approximate")
    if mode == "none":
        return ctx.emit("gelu", x)
    if mode != "tanh":
        raise ctx.error(f"approximate={mode!r} is not 'none' or 'tanh'")
    # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), as the ONNX frontend
    cube = ctx.emit("multiply", ctx.emit("multiply", x, x), x)
    inner = ctx.emit("add", x, ctx.emit("multiply", cube, ctx.scalar(0.044715, x)))
    inner = ctx.emit("multiply", inner, ctx.scalar(math.sqrt(2.0 / math.pi), x))
    half = ctx.emit("multiply", x, ctx.scalar(0.5, x))
    return ctx.emit("multiply", half, ctx.emit("add", ctx.emit("tanh", inner), ctx.scalar(1.0, x)))


def _bound(value: Any) -> float | None:
    return None if value is None else float(value)


@converter("aten.hardtanh.default")
def _hardtanh(ctx: NodeContext) -> Value:
    return ctx.emit("clip", ctx.tensor("self"), min=float(ctx.arg("min_val")),
                    max=float(ctx.arg("max_val")))


_FLOAT_MAX = float(np.finfo(np.float32).max)


@converter("aten.clamp.default", "aten.clamp.Tensor", "aten.clamp_min.default",
           "aten.clamp_max.default", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def _clamp(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    low = ctx.args.get("min")
    high = ctx.args.get("max")
    if isinstance(low, Value) or isinstance(high, Value):
        out = x
        if low is not None:
            out = ctx.emit("maximum", out, operand(ctx, low, x.type.dtype, x))
        if high is not None:
            out = ctx.emit("minimum", out, operand(ctx, high, x.type.dtype, x))
        return out
    dtype = np.dtype(x.type.dtype)
    floor, ceiling = ((-_FLOAT_MAX, _FLOAT_MAX) if dtype.kind == "f"
                      else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)))
    lo = floor if low is None else float(low)
    hi = ceiling if high is None else float(high)
    return ctx.emit("clip", x, min=lo, max=hi)


@converter("aten.leaky_relu.default")
def _leaky_relu(ctx: NodeContext) -> Value:
    return ctx.emit("leaky_relu", ctx.tensor("self"), alpha=float(ctx.arg("negative_slope")))


@converter("aten.elu.default")
def _elu(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    alpha, scale, input_scale = (float(ctx.arg(n)) for n in ("alpha", "scale", "input_scale"))
    xs = x if input_scale == 1.0 else ctx.emit("multiply", x, ctx.scalar(input_scale, x))
    neg = ctx.emit("exp", ctx.emit("minimum", xs, ctx.scalar(0.0, x)))
    neg = ctx.emit("multiply", ctx.emit("subtract", neg, ctx.scalar(1.0, x)), ctx.scalar(alpha, x))
    y = ctx.emit("add", ctx.emit("relu", x), neg)
    return y if scale == 1.0 else ctx.emit("multiply", y, ctx.scalar(scale, x))


def _hard_sigmoid_of(ctx: NodeContext, x: Value) -> Value:
    # clip(x / 6 + 0.5, 0, 1): the ONNX frontend's HardSigmoid / HardSwish form
    y = ctx.emit("add", ctx.emit("multiply", x, ctx.scalar(1.0 / 6.0, x)), ctx.scalar(0.5, x))
    return ctx.emit("clip", y, min=0.0, max=1.0)


@converter("aten.hardsigmoid.default")
def _hardsigmoid(ctx: NodeContext) -> Value:
    return _hard_sigmoid_of(ctx, ctx.tensor("self"))


@converter("aten.hardswish.default")
def _hardswish(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("multiply", x, _hard_sigmoid_of(ctx, x))


@converter("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(ctx: NodeContext) -> Value:
    base, exponent = ctx.arg("self"), ctx.arg("exponent")
    if isinstance(base, Value) and not isinstance(exponent, Value):
        p = float(exponent)
        x = cast_to(ctx, base, ctx.out_dtype or base.type.dtype)
        if p == 1.0:
            return x
        if p == 0.5:
            return ctx.emit("sqrt", x)
        if p.is_integer() and 0 < p <= 4:
            out = x
            for _ in range(int(p) - 1):
                out = ctx.emit("multiply", out, x)
            return out
    return binary(ctx, "power", base, exponent)


# ---- comparisons, logic, selection --------------------------------------------------------------

_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
            "gt": "greater", "ge": "greater_equal"}

for _name, _op in _COMPARE.items():
    converter(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(
        lambda ctx, op=_op: binary(ctx, op, ctx.arg("self"), ctx.arg("other")))


def _as_bool(ctx: NodeContext, x: Value) -> Value:
    return x if x.type.dtype == "bool" else ctx.emit("not_equal", x, ctx.scalar(0, x))


for _name in ("and", "or", "xor"):
    converter(f"aten.logical_{_name}.default")(
        lambda ctx, op=f"logical_{_name}": ctx.emit(op, _as_bool(ctx, ctx.tensor("self")),
                                                   _as_bool(ctx, ctx.tensor("other"))))


@converter("aten.bitwise_not.default")
def _bitwise_not(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("logical_not" if x.type.dtype == "bool" else "bitwise_not", x)


for _name in ("and", "or", "xor"):
    converter(f"aten.bitwise_{_name}.Tensor")(
        lambda ctx, n=_name: ctx.emit(f"logical_{n}" if ctx.tensor("self").type.dtype == "bool"
                                      else f"bitwise_{n}", *_pair(ctx)))


@converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
           "aten.where.Scalar")
def _where(ctx: NodeContext) -> Value:
    cond = _as_bool(ctx, ctx.tensor("condition"))
    a, b = ctx.arg("self"), ctx.arg("other")
    like = a if isinstance(a, Value) else b if isinstance(b, Value) else cond
    dtype = ctx.out_dtype or (like.type.dtype if like is not cond else "float32")
    return ctx.emit("where", cond, operand(ctx, a, dtype, like), operand(ctx, b, dtype, like))


@converter("aten.isnan.default")
def _isnan(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("not_equal", x, x)


# ---- copies and casts ---------------------------------------------------------------------------

@converter("aten._to_copy.default")
def _to_copy(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    dtype = ctx.args.get("dtype")
    return x if dtype is None else cast_to(ctx, x, dtype)


def _identity(ctx: NodeContext) -> Value:
    return ctx.tensor("self")


converter("aten.clone.default", "aten.alias.default", "aten.detach.default",
          "aten.lift_fresh_copy.default", "aten.contiguous.default")(_identity)
