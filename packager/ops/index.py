"""Indexing and data-movement operators on run-time tensors: take (gather), gather_elements,
strided_slice, broadcast_to, tile, pad (constant/edge/reflect/wrap), cumsum, argmax/argmin.

Indices read from tensors are wrapped (negative counts from the end) and then clamped into
range, so a bad index reads a wrong element rather than memory outside the tensor.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from .elementwise import broadcast_read, scalar_of
from .registry import INJECTIVE, REDUCTION, register_op


def _wrapped_index(value: te.Expr, size: int) -> te.Expr:
    """An index read from a tensor, as int64, negative ones counted from the end, clamped."""
    i = te.cast(value, "int64")
    i = te.if_then_else(i < 0, i + size, i)
    return te.minimum(te.maximum(i, 0), size - 1)


# ---- take (Gather) ------------------------------------------------------------------------------

def _infer_take(data: TensorType, indices: TensorType, axis: int = 0) -> TensorType:
    if indices.dtype not in ("int32", "int64"):
        raise ValueError(f"take: indices must be int32 or int64, not {indices.dtype}")
    axis %= len(data.shape)
    return TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)


def _legalize_take(data: te.Tensor, indices: te.Tensor, out_type: TensorType, name: str,
                   axis: int = 0) -> te.Tensor:
    axis %= data.ndim
    k = indices.ndim

    def body(*i):
        idx = _wrapped_index(indices[tuple(i[axis:axis + k])], data.shape[axis])
        return data[tuple(i[:axis]) + (idx,) + tuple(i[axis + k:])]

    return te.compute(out_type.shape, body, name=name)


@register_op("take", INJECTIVE, _infer_take, _legalize_take)
def take(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.take(data, indices.astype(np.int64), axis=axis, mode="wrap")


# ---- gather_elements ----------------------------------------------------------------------------

def _infer_gather_elements(data: TensorType, indices: TensorType, axis: int = 0) -> TensorType:
    if len(data.shape) != len(indices.shape):
        raise ValueError(f"gather_elements: ranks differ: {data.shape} and {indices.shape}")
    return TensorType(indices.shape, data.dtype)


def _legalize_gather_elements(data: te.Tensor, indices: te.Tensor, out_type: TensorType,
                              name: str, axis: int = 0) -> te.Tensor:
    axis %= data.ndim

    def body(*i):
        idx = _wrapped_index(indices[i], data.shape[axis])
        return data[tuple(idx if d == axis else v for d, v in enumerate(i))]

    return te.compute(out_type.shape, body, name=name)


@register_op("gather_elements", INJECTIVE, _infer_gather_elements, _legalize_gather_elements)
def gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return np.take_along_axis(data, idx, axis=axis)


# ---- strided_slice ------------------------------------------------------------------------------

def slice_ranges(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int],
                 axes: Sequence[int], steps: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, step, length) per axis of ``shape``, with ONNX/numpy clamping of starts and ends."""
    ranges = [(0, 1, n) for n in shape]
    for a, s, e, st in zip(axes, starts, ends, steps):
        a = int(a) % len(shape)
        if int(st) == 0:
            raise ValueError("slice step 0")
        start, stop, step = slice(int(s), int(e), int(st)).indices(shape[a])
        ranges[a] = (start, step, len(range(start, stop, step)))
    return ranges


def _infer_strided_slice(x: TensorType, starts=(), ends=(), axes=(), steps=()) -> TensorType:
    ranges = slice_ranges(x.shape, starts, ends, axes, steps)
    return TensorType(tuple(n for _, _, n in ranges), x.dtype)


def _legalize_strided_slice(x: te.Tensor, out_type: TensorType, name: str, starts=(), ends=(),
                            axes=(), steps=()) -> te.Tensor:
    ranges = slice_ranges(x.shape, starts, ends, axes, steps)
    return te.compute(out_type.shape,
                      lambda *i: x[tuple(v * st + s for v, (s, st, _) in zip(i, ranges))],
                      name=name)


@register_op("strided_slice", INJECTIVE, _infer_strided_slice, _legalize_strided_slice)
def strided_slice(x: np.ndarray, starts=(), ends=(), axes=(), steps=()) -> np.ndarray:
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[int(a) % x.ndim] = slice(int(s), int(e), int(st))
    return np.ascontiguousarray(x[tuple(index)])


# ---- broadcast_to and tile ----------------------------------------------------------------------

def _infer_broadcast_to(x: TensorType, shape=()) -> TensorType:
    shape = tuple(int(d) for d in shape)
    try:
        out = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        raise ValueError(f"{x.shape} does not broadcast to {shape}") from None
    if tuple(out) != shape:
        raise ValueError(f"{x.shape} does not broadcast to {shape}")
    return TensorType(shape, x.dtype)


@register_op("broadcast_to", INJECTIVE, _infer_broadcast_to,
             lambda x, out_type, name, shape=():
             te.compute(out_type.shape, lambda *i: broadcast_read(x, i), name=name))
def broadcast_to(x: np.ndarray, shape=()) -> np.ndarray:
    return np.broadcast_to(x, tuple(shape)).copy()


def _infer_tile(x: TensorType, repeats=()) -> TensorType:
    if len(repeats) != len(x.shape):
        raise ValueError(f"tile: {len(repeats)} repeats for rank {len(x.shape)}")
    return TensorType(tuple(n * int(r) for n, r in zip(x.shape, repeats)), x.dtype)


@register_op("tile", INJECTIVE, _infer_tile,
             lambda x, out_type, name, repeats=():
             te.compute(out_type.shape, lambda *i: x[tuple(v % n if n > 1 else 0
                                                           for v, n in zip(i, x.shape))],
                        name=name))
def tile(x: np.ndarray, repeats=()) -> np.ndarray:
    return np.tile(x, tuple(int(r) for r in repeats))


# ---- pad ----------------------------------------------------------------------------------------

PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _infer_pad(x: TensorType, pads=(), mode: str = "constant", value: float = 0.0) -> TensorType:
    rank = len(x.shape)
    if len(pads) != 2 * rank:
        raise ValueError(f"pad: {len(pads)} pads for rank {rank}")
    if mode not in PAD_MODES:
        raise ValueError(f"pad mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    shape = tuple(n + int(pads[d]) + int(pads[d + rank]) for d, n in enumerate(x.shape))
    if any(n < 0 for n in shape):
        raise ValueError(f"pads {list(pads)} crop {x.shape} below zero")
    if mode == "reflect" and any(max(int(pads[d]), int(pads[d + rank])) >= n
                                 for d, n in enumerate(x.shape) if n > 0):
        raise ValueError(f"reflect pads {list(pads)} must be smaller than the sizes {x.shape}")
    return TensorType(shape, x.dtype)


def _legalize_pad(x: te.Tensor, out_type: TensorType, name: str, pads=(), mode: str = "constant",
                  value: float = 0.0) -> te.Tensor:
    def body(*i):
        idx, inside = [], None
        for d, v in enumerate(i):
            n = x.shape[d]
            j = v - int(pads[d])
            if mode == "edge":
                j = te.minimum(te.maximum(j, 0), n - 1)
            elif mode == "reflect":
                j = te.if_then_else(j < 0, -j, j)
                j = te.if_then_else(j >= n, 2 * (n - 1) - j, j)
            elif mode == "wrap":
                j = j % n
            else:
                ok = te.logical_and(j >= 0, j < n)
                inside = ok if inside is None else te.logical_and(inside, ok)
                j = te.minimum(te.maximum(j, 0), n - 1)
            idx.append(j)
        read = x[tuple(idx)]
        if inside is None:
            return read
        return te.if_then_else(inside, read, scalar_of(value, x.dtype))

    return te.compute(out_type.shape, body, name=name)


@register_op("pad", INJECTIVE, _infer_pad, _legalize_pad)
def pad(x: np.ndarray, pads=(), mode: str = "constant", value: float = 0.0) -> np.ndarray:
    rank = x.ndim
    begin = [int(p) for p in pads[:rank]]
    end = [int(p) for p in pads[rank:]]
    crop = tuple(slice(max(0, -b), x.shape[d] - max(0, -e)) for d, (b, e) in
                 enumerate(zip(begin, end)))
    x = x[crop]
    widths = [(max(0, b), max(0, e)) for b, e in zip(begin, end)]
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=np.array(value, x.dtype))
    return np.pad(x, widths, mode=mode)


# ---- cumsum -------------------------------------------------------------------------------------

def _infer_cumsum(x: TensorType, axis: int = 0, exclusive: bool = False,
                  reverse: bool = False) -> TensorType:
    return x


def _legalize_cumsum(x: te.Tensor, out_type: TensorType, name: str, axis: int = 0,
                     exclusive: bool = False, reverse: bool = False) -> te.Tensor:
    axis %= x.ndim
    r = te.reduce_axis(x.shape[axis], "r")

    def body(*i):
        j = i[axis]
        if reverse:
            take_it = r > j if exclusive else r >= j
        else:
            take_it = r < j if exclusive else r <= j
        read = x[tuple(r if d == axis else v for d, v in enumerate(i))]
        return te.sum_of(te.if_then_else(take_it, read, scalar_of(0, x.dtype)), r)

    return te.compute(out_type.shape, body, name=name)


@register_op("cumsum", REDUCTION, _infer_cumsum, _legalize_cumsum)
def cumsum(x: np.ndarray, axis: int = 0, exclusive: bool = False,
           reverse: bool = False) -> np.ndarray:
    y = np.flip(x, axis) if reverse else x
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    if exclusive:
        out = out - y
    return np.ascontiguousarray(np.flip(out, axis) if reverse else out).astype(x.dtype)


# ---- argmax / argmin ----------------------------------------------------------------------------

def _infer_arg(x: TensorType, axis: int = 0, keepdims: bool = True,
               select_last_index: bool = False) -> TensorType:
    axis %= len(x.shape)
    shape = tuple(1 if d == axis else n for d, n in enumerate(x.shape)
                  if keepdims or d != axis)
    return TensorType(shape, "int64")


def _arg_legalizer(combiner: str):
    def legalize(x: te.Tensor, out_type: TensorType, name: str, axis: int = 0,
                 keepdims: bool = True, select_last_index: bool = False) -> te.Tensor:
        axis %= x.ndim
        n = x.shape[axis]
        row_shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape))
        r = te.reduce_axis(n, "r")
        r2 = te.reduce_axis(n, "r2")

        def row(i):  # output indices -> the row's indices with the axis at 0
            if keepdims:
                return tuple(i)
            return tuple(i[:axis]) + (0,) + tuple(i[axis:])

        def along(idx, value):
            return tuple(value if d == axis else v for d, v in enumerate(idx))

        best = te.compute(row_shape, lambda *i: te._reduce(combiner, x[along(i, r)], r),
                          name=f"{name}_best")

        def body(*i):
            at = row(i)
            hit = te.eq(x[along(at, r2)], best[at])
            if select_last_index:
                return te.max_of(te.if_then_else(hit, te.cast(r2, "int64"), te.const(-1, "int64")),
                                 r2)
            return te.min_of(te.if_then_else(hit, te.cast(r2, "int64"), te.const(n, "int64")), r2)

        return te.compute(out_type.shape, body, name=name, dtype="int64")
    return legalize


def _arg_reference(fn):
    def reference(x: np.ndarray, axis: int = 0, keepdims: bool = True,
                  select_last_index: bool = False) -> np.ndarray:
        axis %= x.ndim
        if select_last_index:
            flipped = np.flip(x, axis)
            out = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            out = fn(x, axis=axis)
        if keepdims:
            out = np.expand_dims(out, axis)
        return out.astype(np.int64)
    return reference


register_op("argmax", REDUCTION, _infer_arg, _arg_legalizer("max"))(_arg_reference(np.argmax))
register_op("argmin", REDUCTION, _infer_arg, _arg_legalizer("min"))(_arg_reference(np.argmin))
