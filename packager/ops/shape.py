"""Shape operators: views (reshape) and data movement (transpose, concat)."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.sym import dim, product
from .registry import INJECTIVE, VIEW, register_op


def _infer_reshape(x: TensorType, shape=()) -> TensorType:
    shape = tuple(dim(d) for d in shape)
    if product(shape) != product(x.shape):
        raise ValueError(f"cannot reshape {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


@register_op("reshape", VIEW, _infer_reshape)
def reshape(x: np.ndarray, shape=()) -> np.ndarray:
    return x.reshape(shape)


def _infer_transpose(x: TensorType, axes=None) -> TensorType:
    axes = tuple(reversed(range(len(x.shape)))) if axes is None else tuple(axes)
    return TensorType(tuple(x.shape[a] for a in axes), x.dtype)


def _legalize_transpose(x: te.Tensor, out_type: TensorType, name: str, axes=None) -> te.Tensor:
    axes = tuple(reversed(range(x.ndim))) if axes is None else tuple(axes)
    inverse = np.argsort(axes)
    return te.compute(out_type.shape, lambda *i: x[tuple(i[int(a)] for a in inverse)], name=name)


@register_op("transpose", INJECTIVE, _infer_transpose, _legalize_transpose)
def transpose(x: np.ndarray, axes=None) -> np.ndarray:
    return np.asarray(np.transpose(x, axes), order="C")


def _infer_concat(*xs: TensorType, axis: int = 0) -> TensorType:
    ndim = len(xs[0].shape)
    axis %= ndim
    for t in xs[1:]:
        if len(t.shape) != ndim or any(a != b for d, (a, b) in enumerate(zip(t.shape, xs[0].shape))
                                       if d != axis):
            raise ValueError(f"concat: shapes {[t.shape for t in xs]} differ off axis {axis}")
    shape = list(xs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    return TensorType(tuple(shape), xs[0].dtype)


def _legalize_concat(*xs: te.Tensor, out_type: TensorType, name: str, axis: int = 0) -> te.Tensor:
    axis %= xs[0].ndim

    starts = np.cumsum([0] + [t.shape[axis] for t in xs])

    def body(*i):
        # Later inputs win from their start offset on: select(i >= start_k, x_k[...], earlier).
        value: te.Expr | None = None
        for t, start in zip(xs, starts[:-1]):
            local = i[axis] - int(start)
            idx = tuple(te.minimum(te.maximum(local, 0), t.shape[axis] - 1) if d == axis else v
                        for d, v in enumerate(i))
            read = t[idx]
            value = read if value is None else te.if_then_else(i[axis] >= int(start), read, value)
        return value

    return te.compute(out_type.shape, body, name=name)


@register_op("concat", INJECTIVE, _infer_concat, _legalize_concat)
def concat(*xs: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.concatenate(xs, axis=axis)
