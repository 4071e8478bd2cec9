"""Comparison, logical and selection operators, casts and integer/float remainders: the bool and
integer arithmetic that shape and index computations use at run time."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from .elementwise import broadcast_read, scalar_of
from .registry import ELEMWISE, broadcast_shape, register_op


def _infer_compare(a: TensorType, b: TensorType, *, relations: list) -> TensorType:
    if a.dtype != b.dtype:
        raise ValueError(f"operands have different dtypes: {a.dtype} and {b.dtype}")
    return TensorType(broadcast_shape(a.shape, b.shape, relations=relations), "bool")


def _infer_logical(a: TensorType, b: TensorType, *, relations: list) -> TensorType:
    if a.dtype != "bool" or b.dtype != "bool":
        raise ValueError(f"logical operators take bool tensors, got {a.dtype} and {b.dtype}")
    return TensorType(broadcast_shape(a.shape, b.shape, relations=relations), "bool")


def _pairwise(fn):
    def legalize(a: te.Tensor, b: te.Tensor, out_type: TensorType, name: str) -> te.Tensor:
        return te.compute(out_type.shape,
                          lambda *i: fn(broadcast_read(a, i), broadcast_read(b, i)), name=name)
    return legalize


# name: (infer, tensor-expression body, numpy reference)
_PAIRWISE = {
    "equal": (_infer_compare, te.eq, np.equal),
    "not_equal": (_infer_compare, te.ne, np.not_equal),
    "less": (_infer_compare, lambda x, y: x < y, np.less),
    "less_equal": (_infer_compare, lambda x, y: x <= y, np.less_equal),
    "greater": (_infer_compare, lambda x, y: x > y, np.greater),
    "greater_equal": (_infer_compare, lambda x, y: x >= y, np.greater_equal),
    "logical_and": (_infer_logical, te.logical_and, np.logical_and),
    "logical_or": (_infer_logical, te.logical_or, np.logical_or),
    "logical_xor": (_infer_logical, te.ne, np.logical_xor),
}

for _name, (_infer, _te_fn, _np_fn) in _PAIRWISE.items():
    register_op(_name, ELEMWISE, _infer, _pairwise(_te_fn))(lambda a, b, _f=_np_fn: _f(a, b))


def _infer_not(a: TensorType) -> TensorType:
    if a.dtype != "bool":
        raise ValueError(f"logical_not takes a bool tensor, got {a.dtype}")
    return a


@register_op("logical_not", ELEMWISE, _infer_not,
             lambda a, out_type, name: te.compute(out_type.shape,
                                                  lambda *i: te.eq(a[i], te.const(False, "bool")),
                                                  name=name))
def logical_not(a: np.ndarray) -> np.ndarray:
    return np.logical_not(a)


def _infer_where(cond: TensorType, a: TensorType, b: TensorType, *, relations: list
                 ) -> TensorType:
    if cond.dtype != "bool":
        raise ValueError(f"where: the condition is {cond.dtype}, not bool")
    if a.dtype != b.dtype:
        raise ValueError(f"where: branches have different dtypes: {a.dtype} and {b.dtype}")
    return TensorType(broadcast_shape(cond.shape, a.shape, b.shape, relations=relations),
                      a.dtype)


def _legalize_where(cond: te.Tensor, a: te.Tensor, b: te.Tensor, out_type: TensorType,
                    name: str) -> te.Tensor:
    return te.compute(out_type.shape,
                      lambda *i: te.if_then_else(broadcast_read(cond, i), broadcast_read(a, i),
                                                 broadcast_read(b, i)), name=name)


@register_op("where", ELEMWISE, _infer_where, _legalize_where)
def where(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(cond, a, b)


def _infer_cast(a: TensorType, dtype: str = "float32") -> TensorType:
    if dtype not in te.DTYPES:
        raise ValueError(f"cast to {dtype} is not supported")
    return TensorType(a.shape, dtype)


@register_op("cast", ELEMWISE, _infer_cast,
             lambda a, out_type, name, dtype="float32":
             te.compute(out_type.shape, lambda *i: te.cast(a[i], dtype), name=name,
                        dtype=dtype))
def cast(a: np.ndarray, dtype: str = "float32") -> np.ndarray:
    return a.astype(dtype)


def _infer_same_dtype(a: TensorType, b: TensorType, *, relations: list, **attrs: object
                      ) -> TensorType:
    if a.dtype != b.dtype:
        raise ValueError(f"operands have different dtypes: {a.dtype} and {b.dtype}")
    return TensorType(broadcast_shape(a.shape, b.shape, relations=relations), a.dtype)


def _mod_expr(x: te.Expr, y: te.Expr, fmod: bool) -> te.Expr:
    if x.dtype in te.FLOAT_DTYPES:
        # fmod: x - trunc(x / y) * y (the sign of x); numpy mod: the sign of y.
        # x - trunc(x / y) * y, without libm's fmod (the runtime resolves no libm symbols)
        q = x / y
        trunc = te.if_then_else(q < scalar_of(0, x.dtype), te.math("ceil", q), te.math("floor", q))
        r = x - trunc * y
        if fmod:
            return r
        zero = scalar_of(0, x.dtype)
        fix = te.logical_and(te.ne(r, zero), te.ne(r < zero, y < zero))
        return te.if_then_else(fix, r + y, r)
    r = x % y  # te's integer mod takes the sign of y (Python), as ONNX fmod=0
    if not fmod:
        return r
    zero = scalar_of(0, x.dtype)
    fix = te.logical_and(te.ne(r, zero), te.ne(x < zero, y < zero))
    return te.if_then_else(fix, r - y, r)


@register_op("mod", ELEMWISE, _infer_same_dtype,
             lambda a, b, out_type, name, fmod=False:
             te.compute(out_type.shape, lambda *i: _mod_expr(broadcast_read(a, i),
                                                             broadcast_read(b, i), fmod),
                        name=name))
def mod(a: np.ndarray, b: np.ndarray, fmod: bool = False) -> np.ndarray:
    return (np.fmod(a, b) if fmod else np.mod(a, b)).astype(a.dtype)


def _pow_expr(x: te.Expr, y: te.Expr) -> te.Expr:
    """x ** y for float x and y: exp(y log|x|), negative when x < 0 and y is an odd integer;
    0 ** y is 0 (y > 0), 1 (y == 0) or inf (y < 0)."""
    zero, one = scalar_of(0, x.dtype), scalar_of(1, x.dtype)
    magnitude = te.exp(y * te.log(te.math("abs", x)))
    y_int = te.eq(te.math("floor", y), y)
    half = y * scalar_of(0.5, x.dtype)
    y_odd = te.logical_and(y_int, te.ne(te.math("floor", half), half))
    negative = te.logical_and(x < zero, y_odd)
    value = te.if_then_else(negative, -magnitude, magnitude)
    nan = scalar_of(float("nan"), x.dtype)
    y_fraction = te.eq(y_int, te.const(False, "bool"))
    value = te.if_then_else(te.logical_and(x < zero, y_fraction), nan, value)
    at_zero = te.if_then_else(y > zero, zero,
                              te.if_then_else(te.eq(y, zero), one,
                                              scalar_of(float("inf"), x.dtype)))
    value = te.if_then_else(te.eq(x, zero), at_zero, value)
    return te.if_then_else(te.eq(y, zero), one, value)


@register_op("power", ELEMWISE, _infer_same_dtype,
             lambda a, b, out_type, name:
             te.compute(out_type.shape, lambda *i: _pow_expr(broadcast_read(a, i),
                                                             broadcast_read(b, i)), name=name))
def power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.power(a, b).astype(a.dtype)
