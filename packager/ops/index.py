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
from ..ir.sym import SymbolicShapeError, assume, dim, is_static
from .registry import INJECTIVE, REDUCTION, broadcast_shape, register_op, size_expr


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
                 axes: Sequence[int], steps: Sequence[int], *, relations: list
                 ) -> list[tuple[int, int, int]]:
    """(start, step, length) per axis of ``shape``, with ONNX/numpy clamping of starts and ends;
    what a symbolic size leaves undecided is added to ``relations``."""
    ranges = [(0, 1, n) for n in shape]
    for a, s, e, st in zip(axes, starts, ends, steps):
        a = int(a) % len(shape)
        if int(st) == 0:
            raise ValueError("slice step 0")
        if not is_static((shape[a], s, e)):
            ranges[a] = _symbolic_range(shape[a], s, e, int(st), relations)
            continue
        start, stop, step = slice(int(s), int(e), int(st)).indices(shape[a])
        ranges[a] = (start, step, len(range(start, stop, step)))
    return ranges


BIG = 2 ** 62   # an end at least this large means "to the end" (exporters write INT64_MAX)
# A bound this large against a size known only at run time is taken as "to the end" too
# (tf2onnx writes 1e9, others INT32_MAX), with the size checked at run time to be no larger.
TO_THE_END = 2 ** 16


def _symbolic_range(n, s, e, st: int, relations: list) -> tuple:
    """(start, step, length) of ``range(n)[s:e:st]`` when a size is known at run time only:
    clamping that the sizes decide is done here, the rest is assumed (``sym.assume``: the
    runtime checks it) instead of refused."""
    def clamp(v, lo_end: bool):
        if isinstance(v, int) and v >= BIG:
            return n if st > 0 else n - 1
        if isinstance(v, int) and v <= -BIG:
            return 0 if st > 0 else -1
        if isinstance(v, int) and v < 0:
            v = v + n
        try:
            if v >= n:          # past the end: clamped to it (decided)
                return n if st > 0 else n - 1
            return v
        except ValueError:      # undecidable
            if isinstance(v, int) and v >= TO_THE_END:   # an exporter's "to the end" (1e9...)
                assume(relations, "le", n, v, "slice bound")
                return n if st > 0 else n - 1
            assume(relations, "le", v, n, "slice bound")           # assume it lies inside
            return v
    start, stop = clamp(s, True), clamp(e, False)
    length = (stop - start + st - 1) // st if st > 0 else (start - stop - st - 1) // (-st)
    if isinstance(length, int) and length < 0:
        length = 0
    elif not isinstance(length, int):
        assume(relations, "le", 0, length, "slice length")
    return (start, st, length)


def _infer_strided_slice(x: TensorType, starts=(), ends=(), axes=(), steps=(), *,
                         relations: list) -> TensorType:
    ranges = slice_ranges(x.shape, starts, ends, axes, steps, relations=relations)
    return TensorType(tuple(n for _, _, n in ranges), x.dtype)


def _legalize_strided_slice(x: te.Tensor, out_type: TensorType, name: str, starts=(), ends=(),
                            axes=(), steps=()) -> te.Tensor:
    # the relations were added when the op's type was inferred
    ranges = slice_ranges(x.shape, starts, ends, axes, steps, relations=[])
    return te.compute(out_type.shape,
                      lambda *i: x[tuple(v * st + size_expr(s) for v, (s, st, _) in zip(i, ranges))],
                      name=name)


@register_op("strided_slice", INJECTIVE, _infer_strided_slice, _legalize_strided_slice)
def strided_slice(x: np.ndarray, starts=(), ends=(), axes=(), steps=()) -> np.ndarray:
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[int(a) % x.ndim] = slice(int(s), int(e), int(st))
    return np.ascontiguousarray(x[tuple(index)])


# ---- broadcast_to and tile ----------------------------------------------------------------------

def _infer_broadcast_to(x: TensorType, shape=(), *, relations: list) -> TensorType:
    shape = tuple(dim(d) for d in shape)
    try:
        out = broadcast_shape(x.shape, shape, relations=relations)
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


def _infer_pad(x: TensorType, pads=(), mode: str = "constant", value: float = 0.0, *,
               relations: list) -> TensorType:
    rank = len(x.shape)
    if len(pads) != 2 * rank:
        raise ValueError(f"pad: {len(pads)} pads for rank {rank}")
    if mode not in PAD_MODES:
        raise ValueError(f"pad mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    if mode not in ("constant", "edge") and not is_static(pads):
        raise ValueError(f"pad mode {mode!r} needs pads known at export, not {list(pads)}")
    # pads are dims: a pad computed from a run-time size (a detector padding its kept boxes to
    # a fixed row count: 300 - count) is a size expression, and the padded size often folds
    shape = tuple(n + dim(pads[d]) + dim(pads[d + rank]) for d, n in enumerate(x.shape))
    if any(n < 0 for n in shape):
        raise ValueError(f"pads {list(pads)} crop {x.shape} below zero")
    if mode == "reflect":
        for d, n in enumerate(x.shape):
            widest = max(int(pads[d]), int(pads[d + rank]))
            try:
                too_wide = n > 0 and widest >= n
            except SymbolicShapeError:   # a size known at run time: checked there
                assume(relations, "le", widest + 1, n, f"reflect pad {widest} smaller than the size")
                too_wide = False
            if too_wide:
                raise ValueError(f"reflect pads {list(pads)} must be smaller than the sizes "
                                 f"{x.shape}")
    return TensorType(shape, x.dtype)


def _legalize_pad(x: te.Tensor, out_type: TensorType, name: str, pads=(), mode: str = "constant",
                  value: float = 0.0) -> te.Tensor:
    def body(*i):
        idx, inside = [], None
        for d, v in enumerate(i):
            n = size_expr(x.shape[d])
            run_time = not is_static([pads[d]])
            j = v - (size_expr(pads[d]) if run_time else int(pads[d]))
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
                # a pad computed at run time pads counted rows, which may be none: the read
                # stays at index 0 of the (bound-sized) buffer, never -1
                j = te.maximum(te.minimum(j, n - 1), 0) if run_time else \
                    te.minimum(te.maximum(j, 0), n - 1)
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


def _legalize_scan(x: te.Tensor, out_type: TensorType, name: str, axis: int, exclusive: bool,
                   reverse: bool, combiner: str, identity: int) -> te.Tensor:
    """A cumulative ``combiner`` (sum, prod) along ``axis``: each output combines the elements up
    to it (``exclusive``: before it; ``reverse``: from the end), the others read as ``identity``."""
    axis %= x.ndim
    r = te.reduce_axis(x.shape[axis], "r")

    def body(*i):
        j = i[axis]
        if reverse:
            take_it = r > j if exclusive else r >= j
        else:
            take_it = r < j if exclusive else r <= j
        read = x[tuple(r if d == axis else v for d, v in enumerate(i))]
        return te._reduce(combiner, te.if_then_else(take_it, read, scalar_of(identity, x.dtype)),
                          r)

    return te.compute(out_type.shape, body, name=name)


def _legalize_cumsum(x: te.Tensor, out_type: TensorType, name: str, axis: int = 0,
                     exclusive: bool = False, reverse: bool = False) -> te.Tensor:
    return _legalize_scan(x, out_type, name, axis, exclusive, reverse, "sum", 0)


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


def _lowest(dtype: str) -> te.Const:
    if dtype in te.FLOAT_DTYPES:
        return te.const(float("-inf"), dtype)
    return te.const(int(np.iinfo(dtype).min), dtype)


def _highest(dtype: str) -> te.Const:
    if dtype in te.FLOAT_DTYPES:
        return te.const(float("inf"), dtype)
    return te.const(int(np.iinfo(dtype).max), dtype)


def _along(idx: Sequence[te.Expr], axis: int, value: object) -> tuple:
    return tuple(value if d == axis else v for d, v in enumerate(idx))


# ---- prod (ReduceProd) and cumprod --------------------------------------------------------------

def _register_prod() -> None:
    from .nn import _infer_reduce, _reduce_legalizer

    register_op("prod", REDUCTION, _infer_reduce, _reduce_legalizer("prod"))(
        lambda x, axes=None, keepdims=True:
        np.prod(x, axis=None if axes is None else tuple(axes), keepdims=keepdims).astype(x.dtype))


_register_prod()


def _legalize_cumprod(x: te.Tensor, out_type: TensorType, name: str, axis: int = 0,
                      exclusive: bool = False, reverse: bool = False) -> te.Tensor:
    return _legalize_scan(x, out_type, name, axis, exclusive, reverse, "prod", 1)


@register_op("cumprod", REDUCTION, _infer_cumsum, _legalize_cumprod)
def cumprod(x: np.ndarray, axis: int = 0, exclusive: bool = False,
            reverse: bool = False) -> np.ndarray:
    y = np.flip(x, axis) if reverse else x
    out = np.cumprod(y, axis=axis, dtype=x.dtype)
    if exclusive:
        ones = np.ones_like(np.take(out, [0], axis=axis))
        out = np.concatenate([ones, np.take(out, range(out.shape[axis] - 1), axis=axis)], axis)
    return np.ascontiguousarray(np.flip(out, axis) if reverse else out).astype(x.dtype)


# ---- hardmax ------------------------------------------------------------------------------------

def _infer_hardmax(x: TensorType, axis: int = -1) -> TensorType:
    return x


def _legalize_hardmax(x: te.Tensor, out_type: TensorType, name: str, axis: int = -1
                      ) -> te.Tensor:
    axis %= x.ndim
    n = x.shape[axis]
    row_shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape))
    r, r2 = te.reduce_axis(n, "r"), te.reduce_axis(n, "r2")
    best = te.compute(row_shape, lambda *i: te.max_of(x[_along(i, axis, r)], r),
                      name=f"{name}_best")
    first = te.compute(row_shape, lambda *i: te.min_of(
        te.if_then_else(te.eq(x[_along(i, axis, r2)], best[i]), te.cast(r2, "int64"),
                        te.const(n, "int64")), r2), name=f"{name}_first", dtype="int64")
    return te.compute(out_type.shape, lambda *i: te.if_then_else(
        te.eq(i[axis], first[_along(i, axis, 0)]), scalar_of(1, x.dtype), scalar_of(0, x.dtype)),
        name=name)


@register_op("hardmax", REDUCTION, _infer_hardmax, _legalize_hardmax)
def hardmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    axis %= x.ndim
    first = np.expand_dims(np.argmax(x, axis=axis), axis)
    hits = np.arange(x.shape[axis]).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
    return (hits == first).astype(x.dtype)


# ---- one_hot ------------------------------------------------------------------------------------

def _infer_one_hot(indices: TensorType, values: TensorType, depth: int = 1, axis: int = -1
                   ) -> TensorType:
    rank = len(indices.shape) + 1
    axis %= rank
    shape = indices.shape[:axis] + (int(depth),) + indices.shape[axis:]
    return TensorType(shape, values.dtype)


def _legalize_one_hot(indices: te.Tensor, values: te.Tensor, out_type: TensorType, name: str,
                      depth: int = 1, axis: int = -1) -> te.Tensor:
    axis %= indices.ndim + 1
    last = values.shape[0] - 1

    def body(*i):
        idx = te.cast(indices[tuple(i[:axis]) + tuple(i[axis + 1:])], "int64")
        idx = te.if_then_else(idx < 0, idx + int(depth), idx)
        return te.if_then_else(te.eq(idx, i[axis]), values[min(1, last)], values[0])

    return te.compute(out_type.shape, body, name=name)


@register_op("one_hot", INJECTIVE, _infer_one_hot, _legalize_one_hot)
def one_hot(indices: np.ndarray, values: np.ndarray, depth: int = 1, axis: int = -1
            ) -> np.ndarray:
    axis %= indices.ndim + 1
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hits = np.arange(depth).reshape([-1 if d == axis else 1 for d in range(indices.ndim + 1)])
    return np.where(np.expand_dims(idx, axis) == hits, values[-1], values[0]).astype(values.dtype)


# ---- topk (indices; the values are gather_elements of them) -------------------------------------

def _infer_topk(x: TensorType, k: int = 1, axis: int = -1, largest: bool = True) -> TensorType:
    axis %= len(x.shape)
    if not 0 <= int(k) <= x.shape[axis]:
        raise ValueError(f"topk: k={k} is not in [0, {x.shape[axis]}]")
    return TensorType(_along(x.shape, axis, int(k)), "int64")


def _legalize_topk(x: te.Tensor, out_type: TensorType, name: str, k: int = 1, axis: int = -1,
                   largest: bool = True) -> te.Tensor:
    """The rank of each element (how many come before it: larger, or equal at a lower index),
    then for output position p the index whose rank is p; ties keep the lower index first."""
    axis %= x.ndim
    n = x.shape[axis]
    r, r2 = te.reduce_axis(n, "r"), te.reduce_axis(n, "r2")

    def rank(*i):
        other, mine = x[_along(i, axis, r)], x[i]
        better = other > mine if largest else other < mine
        tie_before = te.logical_and(te.eq(other, mine), r < i[axis])
        return te.sum_of(te.if_then_else(te.logical_or(better, tie_before),
                                         te.const(1, "int64"), te.const(0, "int64")), r)

    ranks = te.compute(x.shape, rank, name=f"{name}_rank", dtype="int64")
    return te.compute(out_type.shape, lambda *i: te.sum_of(te.if_then_else(
        te.eq(ranks[_along(i, axis, r2)], i[axis]), te.cast(r2, "int64"),
        te.const(0, "int64")), r2), name=name, dtype="int64")


@register_op("topk", REDUCTION, _infer_topk, _legalize_topk)
def topk(x: np.ndarray, k: int = 1, axis: int = -1, largest: bool = True) -> np.ndarray:
    axis %= x.ndim
    n = x.shape[axis]
    if largest:  # descending, ties by index: reverse a stable ascending sort of the flipped axis
        order = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        order = n - 1 - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    return np.ascontiguousarray(np.take(order, range(int(k)), axis=axis)).astype(np.int64)


# ---- scatter_elements, scatter_nd, gather_nd ----------------------------------------------------

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _combine(name: str, data: te.Expr, match: te.Expr, update: te.Expr,
             axes: Sequence[te.IndexVar]) -> te.Expr:
    """data combined with every update whose ``match`` holds, for reduction add/mul/max/min."""
    dtype = data.dtype
    if name == "add":
        return data + te.sum_of(te.if_then_else(match, update, scalar_of(0, dtype)), axes)
    if name == "mul":
        return data * te._reduce("prod", te.if_then_else(match, update, scalar_of(1, dtype)),
                                 axes)
    if name == "max":
        return te.maximum(data, te.max_of(te.if_then_else(match, update, _lowest(dtype)), axes))
    return te.minimum(data, te.min_of(te.if_then_else(match, update, _highest(dtype)), axes))


def _infer_scatter_elements(data: TensorType, indices: TensorType, updates: TensorType,
                            axis: int = 0, reduction: str = "none") -> TensorType:
    if indices.shape != updates.shape:
        raise ValueError(f"scatter: indices {indices.shape} and updates {updates.shape} differ")
    if len(indices.shape) != len(data.shape):
        raise ValueError(f"scatter: ranks differ: {data.shape} and {indices.shape}")
    if reduction not in SCATTER_REDUCTIONS:
        raise ValueError(f"scatter: reduction {reduction!r} is not one of "
                         f"{', '.join(SCATTER_REDUCTIONS)}")
    return data


def _legalize_scatter_elements(data: te.Tensor, indices: te.Tensor, updates: te.Tensor,
                               out_type: TensorType, name: str, axis: int = 0,
                               reduction: str = "none") -> te.Tensor:
    axis %= data.ndim
    r = te.reduce_axis(indices.shape[axis], "r")

    def source(p, along_value):
        # p's coordinates on the other axes, clamped into indices' shape (matched only inside)
        return tuple(along_value if d == axis else te.minimum(v, max(n - 1, 0))
                     for d, (v, n) in enumerate(zip(p, indices.shape)))

    def match(p):
        ok = te.eq(_wrapped_index(indices[source(p, r)], data.shape[axis]), p[axis])
        for d, (v, n) in enumerate(zip(p, indices.shape)):
            if d != axis and n < data.shape[d]:
                ok = te.logical_and(ok, v < n)
        return ok

    if reduction != "none":
        return te.compute(out_type.shape, lambda *p: _combine(
            reduction, data[p], match(p), updates[source(p, r)], (r,)), name=name)
    last = te.compute(out_type.shape, lambda *p: te.max_of(
        te.if_then_else(match(p), te.cast(r, "int64"), te.const(-1, "int64")), r),
        name=f"{name}_last", dtype="int64")
    return te.compute(out_type.shape, lambda *p: te.if_then_else(
        last[p] >= 0, updates[source(p, te.maximum(last[p], 0))], data[p]), name=name)


_NP_COMBINE = {"none": lambda current, update: update, "add": np.add, "mul": np.multiply,
               "max": np.maximum, "min": np.minimum}


@register_op("scatter_elements", INJECTIVE, _infer_scatter_elements, _legalize_scatter_elements)
def scatter_elements(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int = 0,
                     reduction: str = "none") -> np.ndarray:
    axis %= data.ndim
    out = data.copy()
    for u in np.ndindex(*indices.shape):
        j = int(indices[u])
        j = j + data.shape[axis] if j < 0 else j
        p = _along(u, axis, j)
        out[p] = _NP_COMBINE[reduction](out[p], updates[u])
    return out


def _infer_scatter_nd(data: TensorType, indices: TensorType, updates: TensorType,
                      reduction: str = "none") -> TensorType:
    k = indices.shape[-1] if indices.shape else 0
    if not indices.shape or k > len(data.shape):
        raise ValueError(f"scatter_nd: indices {indices.shape} do not fit data {data.shape}")
    want = indices.shape[:-1] + data.shape[k:]
    if updates.shape != want:
        raise ValueError(f"scatter_nd: updates are {updates.shape}, expected {want}")
    if reduction not in SCATTER_REDUCTIONS:
        raise ValueError(f"scatter_nd: reduction {reduction!r} is not one of "
                         f"{', '.join(SCATTER_REDUCTIONS)}")
    return data


def _legalize_scatter_nd(data: te.Tensor, indices: te.Tensor, updates: te.Tensor,
                         out_type: TensorType, name: str, reduction: str = "none") -> te.Tensor:
    k = indices.shape[-1]
    lead = indices.shape[:-1]
    us = tuple(te.reduce_axis(n, f"u{d}") for d, n in enumerate(lead))

    def match(p):
        ok = None
        for t in range(k):
            hit = te.eq(_wrapped_index(indices[us + (t,)], data.shape[t]), p[t])
            ok = hit if ok is None else te.logical_and(ok, hit)
        return ok if ok is not None else te.const(True, "bool")

    if reduction != "none":
        return te.compute(out_type.shape, lambda *p: _combine(
            reduction, data[p], match(p), updates[us + tuple(p[k:])], us), name=name)

    def flat(idx):
        out, stride = te.const(0, "int64"), 1
        for v, n in reversed(list(zip(idx, lead))):
            out = out + te.cast(v, "int64") * stride
            stride *= n
        return out

    last = te.compute(out_type.shape, lambda *p: te.max_of(
        te.if_then_else(match(p), flat(us), te.const(-1, "int64")), us),
        name=f"{name}_last", dtype="int64")

    def body(*p):
        at = te.maximum(last[p], 0)
        strides = [int(np.prod(lead[d + 1:], dtype=np.int64)) for d in range(len(lead))]
        src = tuple((at // s) % n for s, n in zip(strides, lead))
        return te.if_then_else(last[p] >= 0, updates[src + tuple(p[k:])], data[p])

    return te.compute(out_type.shape, body, name=name)


@register_op("scatter_nd", INJECTIVE, _infer_scatter_nd, _legalize_scatter_nd)
def scatter_nd(data: np.ndarray, indices: np.ndarray, updates: np.ndarray,
               reduction: str = "none") -> np.ndarray:
    out = data.copy()
    for u in np.ndindex(*indices.shape[:-1]):
        p = tuple(int(i) + (data.shape[t] if i < 0 else 0) for t, i in enumerate(indices[u]))
        out[p] = _NP_COMBINE[reduction](out[p], updates[u])
    return out


def _infer_gather_nd(data: TensorType, indices: TensorType, batch_dims: int = 0) -> TensorType:
    b = int(batch_dims)
    if not indices.shape:
        raise ValueError("gather_nd: indices must have rank >= 1")
    k = indices.shape[-1]
    if b + k > len(data.shape) or data.shape[:b] != indices.shape[:b]:
        raise ValueError(f"gather_nd: indices {indices.shape} do not fit data {data.shape} "
                         f"with batch_dims={b}")
    if indices.dtype not in ("int32", "int64"):
        raise ValueError(f"gather_nd: indices must be int32 or int64, not {indices.dtype}")
    return TensorType(indices.shape[:-1] + data.shape[b + k:], data.dtype)


def _legalize_gather_nd(data: te.Tensor, indices: te.Tensor, out_type: TensorType, name: str,
                        batch_dims: int = 0) -> te.Tensor:
    b = int(batch_dims)
    k = indices.shape[-1]
    n_lead = indices.ndim - 1

    def body(*i):
        lead = tuple(i[:n_lead])
        picked = tuple(_wrapped_index(indices[lead + (t,)], data.shape[b + t]) for t in range(k))
        return data[tuple(i[:b]) + picked + tuple(i[n_lead:])]

    return te.compute(out_type.shape, body, name=name)


@register_op("gather_nd", INJECTIVE, _infer_gather_nd, _legalize_gather_nd)
def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int = 0) -> np.ndarray:
    b = int(batch_dims)
    k = indices.shape[-1]
    out = np.empty(indices.shape[:-1] + data.shape[b + k:], data.dtype)
    for u in np.ndindex(*indices.shape[:-1]):
        idx = tuple(int(v) + (data.shape[b + t] if v < 0 else 0)
                    for t, v in enumerate(indices[u]))
        out[u] = data[tuple(u[:b]) + idx]
    return out
