"""Converters for elementwise ONNX operators: arithmetic, activations, Clip, Pow."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...packager.ir.graph import Value
from .common import cast_to, legacy_broadcast
from .registry import NodeContext, converter

# ---- unary activations that are one row of the op table ---------------------------------------

# ONNX op_type: (high-level op, first opset)
_UNARY = {
    "Relu": ("relu", 1),
    "Sigmoid": ("sigmoid", 1),
    "Tanh": ("tanh", 1),
    "Exp": ("exp", 1),
    "Log": ("log", 1),
    "Sqrt": ("sqrt", 1),
    "Abs": ("abs", 1),
    "Neg": ("negative", 1),
    "Erf": ("erf", 9),
}


def _unary(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        return ctx.emit(op, ctx.input(0))
    return convert


for _op_type, (_op, _since) in _UNARY.items():
    converter(_op_type, since=_since)(_unary(_op))


# ---- binary arithmetic --------------------------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide"}


def _int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # ONNX integer Div truncates toward zero (C semantics); numpy's // floors.
    q = np.abs(a) // np.abs(b)
    return (q * np.sign(a) * np.sign(b)).astype(np.result_type(a, b))


def _binary(op: str, legacy: bool) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        a, b = ctx.input(0), ctx.input(1)
        if legacy:
            b = legacy_broadcast(ctx, a, b)
        ca, cb = ctx.const(0), ctx.const(1)
        if (op == "divide" and ca is not None and cb is not None
                and np.issubdtype(ca.dtype, np.integer)):
            return ctx.constant(_int_divide(ca, cb), "div")
        return ctx.emit(op, a, b)
    return convert


_LEGACY_BINARY_ATTRS = {"broadcast": 0, "axis": None}

for _op_type, _op in _BINARY.items():
    converter(_op_type, since=1, attrs=_LEGACY_BINARY_ATTRS)(_binary(_op, legacy=True))
    converter(_op_type, since=7)(_binary(_op, legacy=False))


def _variadic(op: str, mean: bool = False) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        operands = [ctx.input(i) for i in range(ctx.num_inputs)]
        out = operands[0]
        for x in operands[1:]:
            out = ctx.emit(op, out, x)
        if mean and len(operands) > 1:
            out = ctx.emit("divide", out, ctx.scalar(len(operands), out))
        return out
    return convert


converter("Max", since=1)(_variadic("maximum"))
converter("Min", since=1)(_variadic("minimum"))
converter("Sum", since=1)(_variadic("add"))
converter("Mean", since=1)(_variadic("add", mean=True))


# ---- parameterized activations ------------------------------------------------------------------

@converter("LeakyRelu", since=1, attrs={"alpha": 0.01})
def _leaky_relu(ctx: NodeContext) -> Value:
    return ctx.emit("leaky_relu", ctx.input(0), alpha=float(ctx.attrs["alpha"]))


_FLOAT_MAX = float(np.finfo(np.float32).max)


def _clip(ctx: NodeContext, x: Value, low: Value | float | None, high: Value | float | None
          ) -> Value:
    """Clip with bounds that are numbers (one ``clip`` op) or run-time values (max/min ops)."""
    if not isinstance(low, Value) and not isinstance(high, Value):
        dtype = np.dtype(x.type.dtype)
        floor, ceiling = ((-_FLOAT_MAX, _FLOAT_MAX) if dtype.kind == "f"
                          else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)))
        lo = floor if low is None else float(low)
        hi = ceiling if high is None else float(high)
        return ctx.emit("clip", x, min=lo, max=hi)
    out = x
    if low is not None:
        out = ctx.emit("maximum", out, low if isinstance(low, Value) else ctx.scalar(low, x))
    if high is not None:
        out = ctx.emit("minimum", out, high if isinstance(high, Value) else ctx.scalar(high, x))
    return out


@converter("Clip", since=1, attrs={"min": None, "max": None})
def _clip_v1(ctx: NodeContext) -> Value:
    return _clip(ctx, ctx.input(0), ctx.attrs["min"], ctx.attrs["max"])


@converter("Clip", since=11)
def _clip_v11(ctx: NodeContext) -> Value:
    bounds: list[Value | float | None] = []
    for i in (1, 2):
        if not ctx.has_input(i):
            bounds.append(None)
            continue
        data = ctx.const(i)
        if data is not None and data.size == 1:
            bounds.append(float(data.reshape(())))
        else:
            bounds.append(ctx.input(i))
    return _clip(ctx, ctx.input(0), bounds[0], bounds[1])


@converter("Elu", since=1, attrs={"alpha": 1.0})
def _elu(ctx: NodeContext) -> Value:
    # elu(x) = max(x, 0) + alpha * (exp(min(x, 0)) - 1), exact on both sides of zero.
    x = ctx.input(0)
    return _elu_of(ctx, x, float(ctx.attrs["alpha"]))


def _elu_of(ctx: NodeContext, x: Value, alpha: float) -> Value:
    pos = ctx.emit("relu", x)
    neg = ctx.emit("exp", ctx.emit("minimum", x, ctx.scalar(0.0, x)))
    neg = ctx.emit("multiply", ctx.emit("subtract", neg, ctx.scalar(1.0, x)), ctx.scalar(alpha, x))
    return ctx.emit("add", pos, neg)


@converter("Selu", since=1, attrs={"alpha": 1.67326319217681884765625,
                                   "gamma": 1.05070102214813232421875})
def _selu(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.emit("multiply", _elu_of(ctx, x, float(ctx.attrs["alpha"])),
                    ctx.scalar(float(ctx.attrs["gamma"]), x))


def _hard_sigmoid_of(ctx: NodeContext, x: Value, alpha: float, beta: float) -> Value:
    y = ctx.emit("add", ctx.emit("multiply", x, ctx.scalar(alpha, x)), ctx.scalar(beta, x))
    return ctx.emit("clip", y, min=0.0, max=1.0)


@converter("HardSigmoid", since=1, attrs={"alpha": 0.2, "beta": 0.5})
def _hard_sigmoid(ctx: NodeContext) -> Value:
    return _hard_sigmoid_of(ctx, ctx.input(0), float(ctx.attrs["alpha"]), float(ctx.attrs["beta"]))


@converter("HardSwish", since=14)
def _hard_swish(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.emit("multiply", x, _hard_sigmoid_of(ctx, x, 1.0 / 6.0, 0.5))


def _softplus_of(ctx: NodeContext, x: Value) -> Value:
    # log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)): no overflow for large x.
    tail = ctx.emit("exp", ctx.emit("negative", ctx.emit("abs", x)))
    tail = ctx.emit("log", ctx.emit("add", tail, ctx.scalar(1.0, x)))
    return ctx.emit("add", ctx.emit("relu", x), tail)


@converter("Softplus", since=1)
def _softplus(ctx: NodeContext) -> Value:
    return _softplus_of(ctx, ctx.input(0))


@converter("Softsign", since=1)
def _softsign(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.emit("divide", x, ctx.emit("add", ctx.emit("abs", x), ctx.scalar(1.0, x)))


@converter("Mish", since=18)
def _mish(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.emit("multiply", x, ctx.emit("tanh", _softplus_of(ctx, x)))


def _prelu(ctx: NodeContext) -> Value:
    x, slope = ctx.input(0), ctx.input(1)
    shape = x.type.shape
    if ctx.opset < 7 and len(slope.type.shape) == 1 and len(shape) >= 2 \
            and slope.type.shape[0] == shape[1] != shape[-1]:
        # Opset < 7: a [C] slope is per channel (axis 1), not numpy-aligned to the last axis.
        slope = ctx.reshape(slope, (shape[1],) + (1,) * (len(shape) - 2))
    neg = ctx.emit("multiply", ctx.emit("minimum", x, ctx.scalar(0.0, x)), slope)
    return ctx.emit("add", ctx.emit("relu", x), neg)


converter("PRelu", since=1)(_prelu)
converter("PRelu", since=7)(_prelu)


@converter("Reciprocal", since=1)
def _reciprocal(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.emit("divide", ctx.scalar(1.0, x), x)


@converter("Gelu", since=20, attrs={"approximate": "none"})
def _gelu(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    mode = ctx.attrs["approximate"]
    if mode == "none":
        return ctx.emit("gelu", x)
    if mode != "tanh":
        raise ctx.error(f"approximate={mode!r} is not one of 'none', 'tanh'")
    # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
    cube = ctx.emit("multiply", ctx.emit("multiply", x, x), x)
    inner = ctx.emit("add", x, ctx.emit("multiply", cube, ctx.scalar(0.044715, x)))
    inner = ctx.emit("multiply", inner, ctx.scalar(math.sqrt(2.0 / math.pi), x))
    half = ctx.emit("multiply", x, ctx.scalar(0.5, x))
    return ctx.emit("multiply", half, ctx.emit("add", ctx.emit("tanh", inner), ctx.scalar(1.0, x)))


# ---- Pow: exponents that the op table can express -----------------------------------------------

def _pow(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    base, exponent = ctx.const(0), ctx.const(1)
    if base is not None and exponent is not None:
        return ctx.constant(np.power(base, exponent).astype(base.dtype), "pow")
    if exponent is None or exponent.size != 1:
        return _general_pow(ctx, x, ctx.input(1))
    p = float(exponent.reshape(()))
    if p == 1.0:
        return x
    if p == 0.5:
        return ctx.emit("sqrt", x)
    if p == -0.5:
        return ctx.emit("divide", ctx.scalar(1.0, x), ctx.emit("sqrt", x))
    if p.is_integer() and 0 < abs(p) <= 4 and (p > 0 or x.type.dtype.startswith("float")):
        out = x
        for _ in range(int(abs(p)) - 1):
            out = ctx.emit("multiply", out, x)
        return ctx.emit("divide", ctx.scalar(1.0, x), out) if p < 0 else out
    if p == 0.0:
        return ctx.constant(np.ones(x.type.shape, dtype=x.type.dtype), "ones")
    return _general_pow(ctx, x, ctx.input(1))


def _general_pow(ctx: NodeContext, x: Value, y: Value) -> Value:
    """x ** y elementwise; integer tensors go through float32 and are rounded back."""
    dtype = x.type.dtype
    if dtype in ("float32", "float64"):
        return ctx.emit("power", x, cast_to(ctx, y, dtype))
    xf, yf = cast_to(ctx, x, "float32"), cast_to(ctx, y, "float32")
    return cast_to(ctx, ctx.emit("round", ctx.emit("power", xf, yf)), dtype)


converter("Pow", since=1, attrs=_LEGACY_BINARY_ATTRS)(_pow)
converter("Pow", since=7)(_pow)


# ---- trigonometric and hyperbolic functions -----------------------------------------------------

_TRIG = {
    "Sin": ("sin", 7), "Cos": ("cos", 7), "Tan": ("tan", 7),
    "Asin": ("asin", 7), "Acos": ("acos", 7), "Atan": ("atan", 7),
    "Sinh": ("sinh", 9), "Cosh": ("cosh", 9),
    "Asinh": ("asinh", 9), "Acosh": ("acosh", 9), "Atanh": ("atanh", 9),
}


def _float_unary(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        if x.type.dtype not in ("float32", "float64", "float16", "bfloat16"):
            raise ctx.error(f"takes a float tensor, not {x.type.dtype}")
        return ctx.emit(op, x)
    return convert


for _op_type, (_op, _since) in _TRIG.items():
    converter(_op_type, since=_since)(_float_unary(_op))


# ---- bitwise operators --------------------------------------------------------------------------

_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _bitwise(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        a, b = ctx.input(0), ctx.input(1)
        if a.type.dtype not in _INT_DTYPES or a.type.dtype != b.type.dtype:
            raise ctx.error(f"needs two integer tensors of one dtype, got {a.type.dtype} and "
                            f"{b.type.dtype}")
        return ctx.emit(op, a, b)
    return convert


for _op_type, _op in {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
                      "BitwiseXor": "bitwise_xor"}.items():
    converter(_op_type, since=18)(_bitwise(_op))


@converter("BitwiseNot", since=18)
def _bitwise_not(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    if x.type.dtype not in _INT_DTYPES:
        raise ctx.error(f"needs an integer tensor, not {x.type.dtype}")
    return ctx.emit("bitwise_not", x)


@converter("BitShift", since=11, attrs={"direction": None})
def _bit_shift(ctx: NodeContext) -> Value:
    direction = ctx.attrs["direction"]
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"direction {direction!r} is not 'LEFT' or 'RIGHT'")
    return _bitwise("left_shift" if direction == "LEFT" else "right_shift")(ctx)


# ---- more activations ---------------------------------------------------------------------------

@converter("Shrink", since=9, attrs={"lambd": 0.5, "bias": 0.0})
def _shrink(ctx: NodeContext) -> Value:
    return ctx.emit("shrink", ctx.input(0), lambd=float(ctx.attrs["lambd"]),
                    bias=float(ctx.attrs["bias"]))


@converter("ThresholdedRelu", since=10, attrs={"alpha": 1.0})
def _thresholded_relu(ctx: NodeContext) -> Value:
    return ctx.emit("thresholded_relu", ctx.input(0), alpha=float(ctx.attrs["alpha"]))


@converter("Celu", since=12, attrs={"alpha": 1.0})
def _celu(ctx: NodeContext) -> Value:
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
    x = ctx.input(0)
    alpha = float(ctx.attrs["alpha"])
    if alpha == 0.0:
        raise ctx.error("alpha must not be 0")
    scaled = ctx.emit("multiply", x, ctx.scalar(1.0 / alpha, x))
    neg = ctx.emit("exp", ctx.emit("minimum", scaled, ctx.scalar(0.0, x)))
    neg = ctx.emit("multiply", ctx.emit("subtract", neg, ctx.scalar(1.0, x)), ctx.scalar(alpha, x))
    return ctx.emit("add", ctx.emit("relu", x), neg)


@converter("Swish", since=24, attrs={"alpha": 1.0})
def _swish(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    alpha = float(ctx.attrs["alpha"])
    inner = x if alpha == 1.0 else ctx.emit("multiply", x, ctx.scalar(alpha, x))
    return ctx.emit("multiply", x, ctx.emit("sigmoid", inner))


# ---- normalizations built from reductions -------------------------------------------------------

@converter("LpNormalization", since=1, attrs={"axis": -1, "p": 2})
def _lp_normalization(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape)
    axis = int(ctx.attrs["axis"])
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    p = int(ctx.attrs["p"])
    if p == 1:
        norm = ctx.emit("sum", ctx.emit("abs", x), axes=(axis % rank,), keepdims=True)
    elif p == 2:
        norm = ctx.emit("sqrt", ctx.emit("sum", ctx.emit("multiply", x, x), axes=(axis % rank,),
                                         keepdims=True))
    else:
        raise ctx.error(f"p={p} is not 1 or 2")
    # A zero norm means the whole slice is zero: divide it by 1 so it stays 0 (as ONNX's
    # reference), not 0/0 = NaN.
    zero = ctx.emit("equal", norm, ctx.scalar(0.0, norm))
    safe = ctx.emit("where", zero, ctx.scalar(1.0, norm), norm)
    return ctx.emit("divide", x, safe)


def _mvn(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape)
    axes = tuple(int(a) % rank for a in (ctx.attrs["axes"] or (0, 2, 3)))
    mean = ctx.emit("mean", x, axes=axes, keepdims=True)
    centered = ctx.emit("subtract", x, mean)
    var = ctx.emit("mean", ctx.emit("multiply", centered, centered), axes=axes, keepdims=True)
    std = ctx.emit("add", ctx.emit("sqrt", var), ctx.scalar(1e-9, x))  # as ONNX's function body
    return ctx.emit("divide", centered, std)


converter("MeanVarianceNormalization", since=9, attrs={"axes": None})(_mvn)
converter("MeanVarianceNormalization", since=13, attrs={"axes": None})(_mvn)
