"""Shape operators: views (reshape) and data movement (transpose, concat)."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.sym import assume, dim, is_static, product
from .registry import INJECTIVE, VIEW, register_op, size_expr


def _infer_reshape(x: TensorType, shape=(), *, relations: list) -> TensorType:
    shape = tuple(dim(d) for d in shape)
    if product(shape) != product(x.shape):
        if is_static(shape + tuple(x.shape)):
            raise ValueError(f"cannot reshape {x.shape} to {shape}")
        assume(relations, "eq", product(shape), product(x.shape), f"reshape to {shape}")
    return TensorType(shape, x.dtype)


@register_op("reshape", VIEW, _infer_reshape)
def reshape(x: np.ndarray, shape=()) -> np.ndarray:
    return x.reshape(shape)


def _infer_bitcast(x: TensorType, dtype: str = "float32") -> TensorType:
    if dtype not in te.DTYPES or np.dtype(dtype).itemsize != np.dtype(x.dtype).itemsize:
        raise ValueError(f"cannot reinterpret {x.dtype} as {dtype}: the element sizes differ")
    return TensorType(x.shape, dtype)


@register_op("bitcast", VIEW, _infer_bitcast)
def bitcast(x: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """The same bytes read as ``dtype`` (an element of the same size): a view, no kernel."""
    return np.ascontiguousarray(x).view(dtype)


def _infer_slice_view(x: TensorType, shape=(), offset: int = 0) -> TensorType:
    shape = tuple(int(d) for d in shape)
    if not is_static(x.shape) or offset < 0 or offset + int(np.prod(shape)) > product(x.shape):
        raise ValueError(f"slice_view {shape} at {offset} does not lie inside {x.shape}")
    return TensorType(shape, x.dtype)


@register_op("slice_view", VIEW, _infer_slice_view)
def slice_view(x: np.ndarray, shape=(), offset: int = 0) -> np.ndarray:
    """The ``prod(shape)`` elements of ``x`` from element ``offset`` on (row-major), as
    ``shape``: a leading-contiguous slice (passes/slice_views.py), a view with no kernel."""
    flat = np.ascontiguousarray(x).reshape(-1)
    return flat[int(offset):int(offset) + int(np.prod(shape))].reshape(shape)


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


def _infer_concat(*xs: TensorType, axis: int = 0, relations: list) -> TensorType:
    ndim = len(xs[0].shape)
    axis %= ndim
    for t in xs[1:]:
        if len(t.shape) != ndim or any(a != b and is_static((a, b))
                                       for d, (a, b) in enumerate(zip(t.shape, xs[0].shape))
                                       if d != axis):
            raise ValueError(f"concat: shapes {[t.shape for t in xs]} differ off axis {axis}")
        for d, (a, b) in enumerate(zip(t.shape, xs[0].shape)):
            if d != axis and a != b:   # equal for some sizes only: checked at run time
                assume(relations, "eq", a, b, f"concat of {[t.shape for t in xs]}")
    shape = list(xs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    return TensorType(tuple(shape), xs[0].dtype)


def _legalize_concat(*xs: te.Tensor, out_type: TensorType, name: str, axis: int = 0) -> te.Tensor:
    axis %= xs[0].ndim

    starts = [0]
    for t in xs:   # a start may be a size known at run time (concat along a symbolic axis)
        starts.append(dim(starts[-1] + t.shape[axis]))

    def body(*i):
        # Later inputs win from their start offset on: select(i >= start_k, x_k[...], earlier).
        value: te.Expr | None = None
        for t, start in zip(xs, starts[:-1]):
            local = i[axis] - size_expr(start)
            idx = tuple(te.minimum(te.maximum(local, 0), size_expr(dim(t.shape[axis] - 1)))
                        if d == axis else v for d, v in enumerate(i))
            read = t[idx]
            value = read if value is None else te.if_then_else(i[axis] >= size_expr(start),
                                                               read, value)
        return value

    return te.compute(out_type.shape, body, name=name)


@register_op("concat", INJECTIVE, _infer_concat, _legalize_concat)
def concat(*xs: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.concatenate(xs, axis=axis)


def _infer_concat_in_place(*xs: TensorType, axis: int = 0, hosted=(), relations: list
                           ) -> TensorType:
    return _infer_concat(*xs, axis=axis, relations=relations)


def _legalize_concat_in_place(*xs: te.Tensor, out_type: TensorType, name: str, axis: int = 0,
                              hosted=()) -> te.Tensor:
    return _legalize_concat(*xs, out_type=out_type, name=name, axis=axis)


@register_op("concat_in_place", INJECTIVE, _infer_concat_in_place, _legalize_concat_in_place)
def concat_in_place(*xs: np.ndarray, axis: int = 0, hosted=()) -> np.ndarray:
    """A ``concat`` whose ``hosted`` parts their kernels wrote in place into its buffer
    (passes/concat_views.py): no kernel; the VM copies the other parts in."""
    return np.concatenate(xs, axis=axis)


# ---- sizes as run-time values (shape arithmetic on symbolic dims, frontends/onnx/symvalue.py) ---

def _infer_sym_values(values=(), shape=(), dtype="int64") -> TensorType:
    if len(values) != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"sym_values: {len(values)} values for shape {shape}")
    return TensorType(tuple(int(d) for d in shape), dtype)


def _legalize_sym_values(out_type: TensorType, name: str, values=(), shape=(),
                         dtype="int64") -> te.Tensor:
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]

    def body(*i):
        flat: te.Expr = te.const(0, "int64")
        for idx, st in zip(i, strides):
            flat = flat + idx * st
        value: te.Expr = te.cast(te.as_expr(size_expr(values[-1]), "int64"), dtype)
        for k in range(len(values) - 2, -1, -1):
            value = te.if_then_else(te.eq(flat, k),
                                    te.cast(te.as_expr(size_expr(values[k]), "int64"), dtype),
                                    value)
        return value

    return te.compute(out_type.shape, body, name=name, dtype=dtype)


@register_op("sym_values", INJECTIVE, _infer_sym_values, _legalize_sym_values)
def sym_values(values=(), shape=(), dtype="int64") -> np.ndarray:
    """Sizes known only at run time have no value at export (only kernels compute them)."""
    return np.array([int(v) for v in values], dtype=dtype).reshape(shape)


def _infer_arange(start=0, delta=1, length=1, dtype="int64") -> TensorType:
    return TensorType((dim(length),), dtype)


def _legalize_arange(out_type: TensorType, name: str, start=0, delta=1, length=1,
                     dtype="int64") -> te.Tensor:
    return te.compute(out_type.shape,
                      lambda i: te.cast(te.as_expr(size_expr(start), "int64")
                                        + i * te.as_expr(size_expr(delta), "int64"), dtype),
                      name=name, dtype=dtype)


@register_op("arange", INJECTIVE, _infer_arange, _legalize_arange)
def arange(start=0, delta=1, length=1, dtype="int64") -> np.ndarray:
    return (int(start) + np.arange(int(length)) * int(delta)).astype(dtype)


def _infer_full(shape=(), value=0.0, dtype="float32") -> TensorType:
    return TensorType(tuple(dim(d) for d in shape), dtype)


@register_op("full", INJECTIVE, _infer_full,
             lambda out_type, name, shape=(), value=0.0, dtype="float32":
             te.compute(out_type.shape, lambda *i: te.const(value, dtype), name=name,
                        dtype=dtype))
def full(shape=(), value=0.0, dtype="float32") -> np.ndarray:
    return np.full(tuple(int(d) for d in shape), value, dtype=dtype)
