"""Elementwise operators: broadcasting binary arithmetic and unary activations."""

from __future__ import annotations

import math

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from .registry import ELEMWISE, broadcast_shape, register_op


def broadcast_read(t: te.Tensor, axes: tuple[te.IndexVar, ...]) -> te.Read:
    """Read ``t`` at output indices ``axes`` with numpy broadcasting (size-1 dims read index 0)."""
    offset = len(axes) - t.ndim
    idx = [axes[offset + d] if t.shape[d] != 1 or axes[offset + d].extent == 1 else 0
           for d in range(t.ndim)]
    return t[tuple(idx)]


def _infer_broadcast(a: TensorType, b: TensorType, *, relations: list, **attrs: object
                     ) -> TensorType:
    if a.dtype != b.dtype:
        raise ValueError(f"operands have different dtypes: {a.dtype} and {b.dtype}")
    return TensorType(broadcast_shape(a.shape, b.shape, relations=relations), a.dtype)


def _infer_unary(a: TensorType, **attrs: object) -> TensorType:
    return a


def scalar_of(value: float, dtype: str) -> te.Const:
    """A constant of ``dtype`` (integer dtypes truncate ``value``)."""
    if dtype == "bool":
        return te.const(bool(value), dtype)
    if dtype in te.FLOAT_DTYPES:
        return te.const(float(value), dtype)
    return te.const(int(value), dtype)


def _divide(x: te.Expr, y: te.Expr) -> te.Expr:
    if x.dtype in te.FLOAT_DTYPES:
        return x / y
    # Integers: truncate toward zero, as C and ONNX do (te's integer div floors, as Python).
    q = x // y
    zero = scalar_of(0, x.dtype)
    inexact = te.ne(x - q * y, zero)
    signs_differ = te.ne(x < zero, y < zero)
    return te.if_then_else(te.logical_and(inexact, signs_differ), q + scalar_of(1, x.dtype), q)


def _int_divide_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
        return (q * np.sign(a) * np.sign(b)).astype(a.dtype)
    return np.divide(a, b)


def _binary_legalizer(fn):
    def legalize(a: te.Tensor, b: te.Tensor, out_type: TensorType, name: str) -> te.Tensor:
        return te.compute(out_type.shape,
                          lambda *i: fn(broadcast_read(a, i), broadcast_read(b, i)), name=name)
    return legalize


def _unary_legalizer(fn):
    def legalize(a: te.Tensor, out_type: TensorType, name: str, **attrs: object) -> te.Tensor:
        return te.compute(out_type.shape, lambda *i: fn(a[i], **attrs), name=name)
    return legalize


_BINARY = {
    "add": (lambda x, y: x + y, np.add),
    "subtract": (lambda x, y: x - y, np.subtract),
    "multiply": (lambda x, y: x * y, np.multiply),
    "divide": (_divide, _int_divide_np),
    "maximum": (te.maximum, np.maximum),
    "minimum": (te.minimum, np.minimum),
}

for _name, (_te_fn, _np_fn) in _BINARY.items():
    register_op(_name, ELEMWISE, _infer_broadcast, _binary_legalizer(_te_fn))(
        lambda a, b, _f=_np_fn: _f(a, b))


def _erf_np(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _sigmoid_np(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


def _gelu_np(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf_np(x / np.sqrt(2.0)))).astype(x.dtype)


# name: (tensor-expression body, numpy reference); attrs pass through to both.
_UNARY = {
    "relu": (lambda x: te.maximum(x, scalar_of(0, x.dtype)),
             lambda x: np.maximum(x, 0).astype(x.dtype)),
    "negative": (lambda x: -x, np.negative),
    "abs": (lambda x: te.math("abs", x) if x.dtype in te.FLOAT_DTYPES
            else te.if_then_else(x < scalar_of(0, x.dtype), -x, x), np.abs),
    "floor": (lambda x: te.math("floor", x), np.floor),
    "ceil": (lambda x: te.math("ceil", x), np.ceil),
    "round": (lambda x: te.math("round", x), np.round),   # half to even, as ONNX Round
    "sign": (lambda x: te.if_then_else(x > scalar_of(0, x.dtype), scalar_of(1, x.dtype),
                                       te.if_then_else(x < scalar_of(0, x.dtype),
                                                       scalar_of(-1, x.dtype),
                                                       scalar_of(0, x.dtype))), np.sign),
    "exp": (te.exp, np.exp),
    "log": (te.log, np.log),
    "sqrt": (te.sqrt, np.sqrt),
    "tanh": (te.tanh, np.tanh),
    "erf": (te.erf, _erf_np),
    "sigmoid": (te.sigmoid, _sigmoid_np),
    "gelu": (lambda x: 0.5 * x * (1.0 + te.erf(x * (1.0 / math.sqrt(2.0)))), _gelu_np),
    "silu": (lambda x: x * te.sigmoid(x), lambda x: x * _sigmoid_np(x)),
}

for _name, (_te_fn, _np_fn) in _UNARY.items():
    register_op(_name, ELEMWISE, _infer_unary, _unary_legalizer(_te_fn))(
        lambda a, _f=_np_fn: _f(a))


@register_op("clip", ELEMWISE, _infer_unary,
             _unary_legalizer(lambda x, min, max: te.minimum(te.maximum(x, scalar_of(min, x.dtype)),
                                                             scalar_of(max, x.dtype))))
def clip(a: np.ndarray, min: float, max: float) -> np.ndarray:
    return np.clip(a, min, max).astype(a.dtype)


@register_op("leaky_relu", ELEMWISE, _infer_unary,
             _unary_legalizer(lambda x, alpha: te.if_then_else(x > 0.0, x, x * float(alpha))))
def leaky_relu(a: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(a > 0, a, a * np.float32(alpha)).astype(a.dtype)


# ---- trigonometric and hyperbolic functions (vecmath kernels, no libm) --------------------------

def _vector_math(name: str):
    # A MathCall the code generator sends to packager/codegen/vecmath.py (mlc.math.<name>).
    return lambda x: te.MathCall(name, x, x.dtype)


_TRIG = {
    "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
}


def _float_math_np(fn):
    def reference(a: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(a.astype(np.float64)).astype(a.dtype)
    return reference


def _infer_float_unary(a: TensorType, **attrs: object) -> TensorType:
    if a.dtype not in te.FLOAT_DTYPES:
        raise ValueError(f"takes a float tensor, not {a.dtype}")
    return a


for _name, _np_fn in _TRIG.items():
    register_op(_name, ELEMWISE, _infer_float_unary, _unary_legalizer(_vector_math(_name)))(
        _float_math_np(_np_fn))


# ---- bitwise operators on integers --------------------------------------------------------------

def _infer_int_binary(a: TensorType, b: TensorType, *, relations: list, **attrs: object
                      ) -> TensorType:
    if a.dtype != b.dtype:
        raise ValueError(f"operands have different dtypes: {a.dtype} and {b.dtype}")
    if a.dtype not in te.INT_DTYPES:
        raise ValueError(f"bitwise operators take integer tensors, not {a.dtype}")
    return TensorType(broadcast_shape(a.shape, b.shape, relations=relations), a.dtype)


def _shift_np(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    amount = b.astype(np.uint64)
    too_far = amount >= bits
    safe = np.where(too_far, 0, amount).astype(a.dtype)
    out = np.left_shift(a, safe) if left else np.right_shift(a, safe)
    return np.where(too_far, np.zeros_like(out), out).astype(a.dtype)


_BITWISE = {
    "bitwise_and": ("and", np.bitwise_and),
    "bitwise_or": ("or", np.bitwise_or),
    "bitwise_xor": ("xor", np.bitwise_xor),
    "left_shift": ("shl", lambda a, b: _shift_np(a, b, left=True)),
    "right_shift": ("shr", lambda a, b: _shift_np(a, b, left=False)),
}

for _name, (_te_op, _np_fn) in _BITWISE.items():
    register_op(_name, ELEMWISE, _infer_int_binary,
                _binary_legalizer(lambda x, y, _op=_te_op: te.Binary(_op, x, y, x.dtype)))(
        lambda a, b, _f=_np_fn: _f(a, b).astype(a.dtype))


def _infer_int_unary(a: TensorType) -> TensorType:
    if a.dtype not in te.INT_DTYPES:
        raise ValueError(f"bitwise_not takes an integer tensor, not {a.dtype}")
    return a


@register_op("bitwise_not", ELEMWISE, _infer_int_unary,
             _unary_legalizer(lambda x: te.Binary("xor", x, te.const(-1, x.dtype), x.dtype)))
def bitwise_not(a: np.ndarray) -> np.ndarray:
    return np.invert(a)


# ---- Shrink, ThresholdedRelu --------------------------------------------------------------------

def _shrink_expr(x: te.Expr, lambd: float = 0.5, bias: float = 0.0) -> te.Expr:
    lo, hi = scalar_of(-lambd, x.dtype), scalar_of(lambd, x.dtype)
    b = scalar_of(bias, x.dtype)
    return te.if_then_else(x < lo, x + b,
                           te.if_then_else(x > hi, x - b, scalar_of(0, x.dtype)))


@register_op("shrink", ELEMWISE, _infer_unary, _unary_legalizer(_shrink_expr))
def shrink(a: np.ndarray, lambd: float = 0.5, bias: float = 0.0) -> np.ndarray:
    lo, hi, b = (np.asarray(v).astype(a.dtype) for v in (-lambd, lambd, bias))
    return np.where(a < lo, a + b, np.where(a > hi, a - b, 0)).astype(a.dtype)


@register_op("thresholded_relu", ELEMWISE, _infer_unary,
             _unary_legalizer(lambda x, alpha=1.0: te.if_then_else(
                 x > scalar_of(alpha, x.dtype), x, scalar_of(0, x.dtype))))
def thresholded_relu(a: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    return np.where(a > np.asarray(alpha).astype(a.dtype), a, 0).astype(a.dtype)
