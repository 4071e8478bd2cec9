"""Operators whose output sizes depend on the data: NonZero, TopK with a run-time k, Compress
with a run-time condition, Unique.

Each one is a few kernels around one size variable bound at run time (``bind_size``): a kernel
counts (the nonzeros, the distinct values, k itself) into an int64 tensor of one element, the VM
instruction BIND_SIZE (docs/format.md section 6) checks that count against the variable's upper
bound (a size expression known at export: NonZero's count is at most the input's size) and
writes it into the sizes array, and the kernels after it read the variable there as any other
size. Memory is planned for the bound. Every kernel that writes a tensor of the new size takes
the bound count as its last input (``after``): that orders it after the binding in the graph,
and no pass can move it before. NonZero (and Compress through it) is one pass
(``nonzero_index``, ``codegen/compact.py``) and a gather of coordinates: linear. Unique is
a stable sort of its items' indices and one pass over them (``unique_table``,
``codegen/unique.py``): O(n log n), then gathers of its parts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.sym import Dim, product
from .elementwise import scalar_of
from .registry import BIND, INJECTIVE, OPAQUE, REDUCTION, register_op, size_expr


# ---- bind_size ----------------------------------------------------------------------------------

def _infer_bind(count: TensorType, var: str = "") -> TensorType:
    if count.dtype != "int64" or count.shape != (1,):
        raise ValueError(f"bind_size: the count must be int64 of shape (1,), not {count}")
    return count


@register_op("bind_size", BIND, _infer_bind)
def bind_size(count: np.ndarray, var: str = "") -> np.ndarray:
    """Identity on the count: the binding itself is the VM's."""
    return count


# ---- counts and prefix counts of the nonzero elements of a flat tensor --------------------------

def _nonzero(x: te.Tensor, j: te.Expr) -> te.Expr:
    return te.ne(x[(j,)], scalar_of(0, x.dtype))


def _infer_flat_count(x: TensorType) -> TensorType:
    if len(x.shape) != 1:
        raise ValueError(f"nonzero_count: input must be flat, not {x.shape}")
    return TensorType((1,), "int64")


def _legalize_count(x: te.Tensor, out_type: TensorType, name: str) -> te.Tensor:
    r = te.reduce_axis(x.shape[0], "r")
    one, zero = te.const(1, "int64"), te.const(0, "int64")
    return te.compute((1,), lambda i: te.sum_of(te.if_then_else(_nonzero(x, r), one, zero), r),
                      name=name, dtype="int64")


@register_op("nonzero_count", REDUCTION, _infer_flat_count, _legalize_count)
def nonzero_count(x: np.ndarray) -> np.ndarray:
    return np.array([np.count_nonzero(x)], dtype=np.int64)


# ---- nonzero_index: the flat indices of the nonzeros, after their count --------------------------

def _infer_nonzero_index(x: TensorType) -> TensorType:
    if len(x.shape) != 1:
        raise ValueError(f"nonzero_index: input must be flat, not {x.shape}")
    return TensorType((1 + x.shape[0],), "int64")


def _legalize_nonzero_index(x: te.Tensor, out_type: TensorType, name: str) -> te.Tensor:
    """A stand-in body: the tag hands the function to the one-pass kernel
    (``codegen/compact.py``)."""
    from ..ir.patterns import tag_reduction
    k = te.reduce_axis(1, "k")
    tag_reduction(k, "nonzero_index", (x,))
    return te.compute(out_type.shape, lambda i: te.sum_of(te.cast(x[(k,)], "int64"), k),
                      name=name, dtype="int64")


@register_op("nonzero_index", OPAQUE, _infer_nonzero_index, _legalize_nonzero_index)
def nonzero_index(x: np.ndarray) -> np.ndarray:
    """[1 + n] int64: the count of nonzero elements, then their flat indices in order (the
    rest zero). One pass in the kernel: NonZero and Compress are linear in the input."""
    at = np.flatnonzero(x)
    out = np.zeros(1 + x.shape[0], np.int64)
    out[0] = len(at)
    out[1:1 + len(at)] = at
    return out


# ---- nonzero_coords: the coordinates of the nonzeros, [rank, count] ----------------------------

def _infer_nonzero_coords(table: TensorType, after: TensorType, shape: Sequence[Dim] = (),
                          count: Dim = 0) -> TensorType:
    if len(table.shape) != 1:
        raise ValueError(f"nonzero_coords: a flat index table expected, not {table.shape}")
    return TensorType((max(len(shape), 1), count), "int64")


def _legalize_nonzero_coords(table: te.Tensor, after: te.Tensor, out_type: TensorType,
                             name: str, shape: Sequence[Dim] = (), count: Dim = 0
                             ) -> te.Tensor:
    """Output (a, p): coordinate a of the p-th nonzero's flat index (its index, at rank 0)."""
    shape = tuple(shape) or (1,)
    strides = [product(shape[d + 1:]) for d in range(len(shape))]

    def body(a, p):
        flat = table[(p + 1,)]
        coord = te.const(0, "int64")
        for d in range(len(shape)):   # coordinate a of the flat index, picked by a select chain
            c = flat
            if not (isinstance(strides[d], int) and strides[d] == 1):
                c = c // size_expr(strides[d])
            if d > 0:
                c = c % size_expr(shape[d])
            coord = te.if_then_else(te.eq(a, d), c, coord)
        return coord

    return te.compute(out_type.shape, body, name=name, dtype="int64")


@register_op("nonzero_coords", INJECTIVE, _infer_nonzero_coords, _legalize_nonzero_coords)
def nonzero_coords(table: np.ndarray, after: np.ndarray, shape: Sequence[Dim] = (),
                   count: Dim = 0) -> np.ndarray:
    shape = tuple(int(d) for d in shape) or (1,)
    flat = table[1:1 + int(after.reshape(-1)[0])]
    return np.array(np.unravel_index(flat, shape), dtype=np.int64).reshape(len(shape), -1)


# ---- topk with a run-time k ---------------------------------------------------------------------

def _along(shape: Sequence, axis: int, value: object) -> tuple:
    return tuple(value if d == axis else s for d, s in enumerate(shape))


def _infer_topk_dynamic(x: TensorType, after: TensorType, k: Dim = 1, axis: int = -1,
                        largest: bool = True) -> TensorType:
    return TensorType(_along(x.shape, axis % len(x.shape), k), "int64")


def _legalize_topk_dynamic(x: te.Tensor, after: te.Tensor, out_type: TensorType, name: str,
                           k: Dim = 1, axis: int = -1, largest: bool = True) -> te.Tensor:
    from .index import _legalize_topk
    return _legalize_topk(x, out_type, name, k=k, axis=axis, largest=largest)


@register_op("topk_dynamic", REDUCTION, _infer_topk_dynamic, _legalize_topk_dynamic)
def topk_dynamic(x: np.ndarray, after: np.ndarray, k: Dim = 1, axis: int = -1,
                 largest: bool = True) -> np.ndarray:
    from .index import topk
    return topk(x, int(after.reshape(-1)[0]), axis, largest)


# ---- unique: items are the slices x3[:, j, :] of x viewed as [outer, length, inner] ------------

def _infer_unique_table(x: TensorType, sort: bool = True) -> TensorType:
    if len(x.shape) != 3:
        raise ValueError(f"unique: input must be [outer, length, inner], not {x.shape}")
    return TensorType((1 + 3 * x.shape[1],), "int64")


def _legalize_unique_table(x: te.Tensor, out_type: TensorType, name: str,
                           sort: bool = True) -> te.Tensor:
    """A stand-in body: the tag hands the function to the sorting kernel
    (``codegen/unique.py``)."""
    from ..ir.patterns import tag_reduction
    k = te.reduce_axis(1, "k")
    tag_reduction(k, "unique_table", (x,), sort=bool(sort))
    return te.compute(out_type.shape, lambda i: te.sum_of(te.cast(x[(0, k, 0)], "int64"), k),
                      name=name, dtype="int64")


@register_op("unique_table", OPAQUE, _infer_unique_table, _legalize_unique_table)
def unique_table(x: np.ndarray, sort: bool = True) -> np.ndarray:
    """[1 + 3n] int64 for the n items ``x[:, j, :]``: the count d of distinct items, then n
    slots of each distinct item's first index, n of every item's inverse index and n of the
    distinct items' counts (slots from d on zero); distinct items in sorted order
    (lexicographic) or, without ``sort``, in order of first occurrence."""
    n = x.shape[1]
    out = np.zeros(1 + 3 * n, np.int64)
    if n == 0:
        return out
    items = np.moveaxis(x, 1, 0).reshape(n, -1)
    _, firsts, inverse, counts = np.unique(items, axis=0, return_index=True,
                                           return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    if not sort:
        order = np.argsort(firsts, kind="stable")
        pos = np.empty_like(order)
        pos[order] = np.arange(len(order))
        firsts, counts, inverse = firsts[order], counts[order], pos[inverse]
    d = len(firsts)
    out[0] = d
    out[1:1 + d] = firsts
    out[1 + n:1 + 2 * n] = inverse
    out[1 + 2 * n:1 + 2 * n + d] = counts
    return out


_UNIQUE_PARTS = ("values", "indices", "inverse", "counts")


def _infer_unique_select(x: TensorType, table: TensorType, after: TensorType, count: Dim = 0,
                         part: str = "values") -> TensorType:
    if part not in _UNIQUE_PARTS:
        raise ValueError(f"unique_select: part {part!r} is not one of {_UNIQUE_PARTS}")
    if part == "values":
        return TensorType((x.shape[0], count, x.shape[2]), x.dtype)
    return TensorType((x.shape[1] if part == "inverse" else count,), "int64")


def _legalize_unique_select(x: te.Tensor, table: te.Tensor, after: te.Tensor,
                            out_type: TensorType, name: str, count: Dim = 0,
                            part: str = "values") -> te.Tensor:
    """A part of ``unique_table``'s table: the distinct items ([outer, count, inner], each
    gathered at its first index), their first indices, every item's inverse index or the
    distinct items' counts."""
    n = size_expr(x.shape[1])
    if part == "values":
        return te.compute(out_type.shape, lambda o, p, e: x[(o, table[(p + 1,)], e)],
                          name=name, dtype=x.dtype)
    start = {"indices": 1, "inverse": 1 + n, "counts": 1 + 2 * n}[part]
    return te.compute(out_type.shape, lambda p: table[(p + start,)], name=name, dtype="int64")


@register_op("unique_select", INJECTIVE, _infer_unique_select, _legalize_unique_select)
def unique_select(x: np.ndarray, table: np.ndarray, after: np.ndarray, count: Dim = 0,
                  part: str = "values") -> np.ndarray:
    d, n = int(after.reshape(-1)[0]), x.shape[1]
    if part == "values":
        return x[:, table[1:1 + d], :]
    start = {"indices": 1, "inverse": 1 + n, "counts": 1 + 2 * n}[part]
    return table[start:start + (n if part == "inverse" else d)].copy()


# ---- non-maximum suppression --------------------------------------------------------------------

def _infer_nms(boxes: TensorType, scores: TensorType, max_out: TensorType, iou: TensorType,
               score_threshold: TensorType, center_point_box: int = 0,
               has_score_threshold: bool = False, limit: int = 0) -> TensorType:
    """[1 + rows, 3] int64: row 0 holds the count of selected boxes, rows 1.. the selected
    (batch, class, box) triples, ``rows`` = batches * classes * ``limit`` (each class keeps at
    most ``limit`` boxes)."""
    if len(boxes.shape) != 3 or boxes.shape[2] != 4 or len(scores.shape) != 3 \
            or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"nms: boxes {boxes.shape} and scores {scores.shape} do not fit "
                         "[B, N, 4] and [B, C, N]")
    return TensorType((1 + scores.shape[0] * scores.shape[1] * limit, 3), "int64")


def _legalize_nms(boxes: te.Tensor, scores: te.Tensor, max_out: te.Tensor, iou: te.Tensor,
                  score_threshold: te.Tensor, out_type: TensorType, name: str,
                  center_point_box: int = 0, has_score_threshold: bool = False,
                  limit: int = 0) -> te.Tensor:
    """A stand-in body: the tag hands the function to the NMS kernel (``codegen/nms.py``)."""
    from ..ir.patterns import tag_reduction
    k = te.reduce_axis(1, "k")
    tag_reduction(k, "nms", (boxes, scores, max_out, iou, score_threshold),
                  center_point_box=int(center_point_box),
                  has_score_threshold=bool(has_score_threshold))
    return te.compute(out_type.shape, lambda *i: te.sum_of(te.cast(max_out[(k,)], "int64"), k),
                      name=name, dtype="int64")


def suppressed(a: np.ndarray, b: np.ndarray, center_point_box: int, threshold: float) -> bool:
    """Whether box ``b`` suppresses box ``a``: ONNX Runtime's SuppressByIOU, in float32."""
    f = np.float32
    if center_point_box:
        ax0, ax1 = a[0] - a[2] / f(2), a[0] + a[2] / f(2)
        bx0, bx1 = b[0] - b[2] / f(2), b[0] + b[2] / f(2)
        ay0, ay1 = a[1] - a[3] / f(2), a[1] + a[3] / f(2)
        by0, by1 = b[1] - b[3] / f(2), b[1] + b[3] / f(2)
    else:
        ax0, ax1 = sorted((a[1], a[3]))
        bx0, bx1 = sorted((b[1], b[3]))
        ay0, ay1 = sorted((a[0], a[2]))
        by0, by1 = sorted((b[0], b[2]))
    ix0, ix1 = max(ax0, bx0), min(ax1, bx1)
    iy0, iy1 = max(ay0, by0), min(ay1, by1)
    if ix1 <= ix0 or iy1 <= iy0:
        return False
    inter = f((ix1 - ix0) * (iy1 - iy0))
    area_a, area_b = f((ax1 - ax0) * (ay1 - ay0)), f((bx1 - bx0) * (by1 - by0))
    union = f(area_a + area_b - inter)
    if inter <= 0 or area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return bool(f(inter / union) > f(threshold))


@register_op("nms", OPAQUE, _infer_nms, _legalize_nms)
def nms(boxes: np.ndarray, scores: np.ndarray, max_out: np.ndarray, iou: np.ndarray,
        score_threshold: np.ndarray, center_point_box: int = 0,
        has_score_threshold: bool = False, limit: int = 0) -> np.ndarray:
    """ONNX NonMaxSuppression as ONNX Runtime computes it (scores above the threshold, best
    first, ties by lower index; a box is kept unless one kept before it overlaps it by more
    than the IoU threshold; at most ``max_out`` per class)."""
    batches, classes, n = scores.shape
    k = int(max_out.reshape(-1)[0])
    rows = []
    for b in range(batches):
        for c in range(classes):
            s = scores[b, c]
            cand = [i for i in range(n) if not has_score_threshold
                    or s[i] > score_threshold.reshape(-1)[0]]
            cand.sort(key=lambda i: (-s[i], i))
            kept: list[int] = []
            for i in cand:
                if len(kept) >= k:
                    break
                if not any(suppressed(boxes[b, i], boxes[b, j], center_point_box,
                                      iou.reshape(-1)[0]) for j in kept):
                    kept.append(i)
            rows += [(b, c, i) for i in kept]
    out = np.zeros((1 + batches * classes * limit, 3), np.int64)
    out[0, 0] = len(rows)
    if rows:
        out[1:1 + len(rows)] = rows
    return out


def _infer_head_count(x: TensorType) -> TensorType:
    return TensorType((1,), "int64")


def _legalize_head_count(x: te.Tensor, out_type: TensorType, name: str) -> te.Tensor:
    return te.compute((1,), lambda i: x[(0,) * len(x.shape)], name=name, dtype="int64")


@register_op("head_count", INJECTIVE, _infer_head_count, _legalize_head_count)
def head_count(x: np.ndarray) -> np.ndarray:
    """The first element of a [1 + rows, ...] table whose row 0 holds its count."""
    return x.reshape(-1)[:1].astype(np.int64)


def _infer_counted_rows(x: TensorType, after: TensorType, count: Dim = 0) -> TensorType:
    return TensorType((count,) + tuple(x.shape[1:]), x.dtype)


def _legalize_counted_rows(x: te.Tensor, after: te.Tensor, out_type: TensorType, name: str,
                           count: Dim = 0) -> te.Tensor:
    return te.compute(out_type.shape, lambda p, *rest: x[(p + 1,) + tuple(rest)], name=name,
                      dtype=x.dtype)


@register_op("counted_rows", INJECTIVE, _infer_counted_rows, _legalize_counted_rows)
def counted_rows(x: np.ndarray, after: np.ndarray, count: Dim = 0) -> np.ndarray:
    """Rows 1 .. count of a table whose row 0 holds its count."""
    return x[1:1 + int(after.reshape(-1)[0])]


# ---- a slice along an axis whose extent a kernel counted ----------------------------------------

def _span(n, start: int, end: int, step: int, part: str, lo, hi, where):
    """ONNX Slice's first index or length along an axis of ``n`` (ints, or tensor expressions
    with ``lo``/``hi`` as max/min and ``where`` as a select)."""
    def norm(v: int, low, high):
        at = n + v if v < 0 else v + 0 * n
        return hi(lo(at, low), high)

    if step > 0:
        first, last = norm(start, 0, n), norm(end, 0, n)
        length = lo((last - first + (step - 1)) // step, 0)
    else:
        first, last = norm(start, 0, n - 1), norm(end, -1, n - 1)
        length = lo((first - last + (-step - 1)) // -step, 0)
    return where(n > 0, first if part == "first" else length, 0 * n)


def _infer_slice_span(x: TensorType, axis: int = 0, start: int = 0, end: int = 0, step: int = 1,
                      part: str = "length") -> TensorType:
    if part not in ("first", "length") or step == 0:
        raise ValueError(f"slice_span: part {part!r}, step {step}")
    return TensorType((1,), "int64")


def _legalize_slice_span(x: te.Tensor, out_type: TensorType, name: str, axis: int = 0,
                         start: int = 0, end: int = 0, step: int = 1,
                         part: str = "length") -> te.Tensor:
    """Reads ``x``'s extent along ``axis`` (a size variable) and nothing of its data."""
    def body(i):
        n = te.cast(te.as_expr(size_expr(x.shape[axis]), "int64"), "int64")
        c = lambda v: te.const(v, "int64")   # noqa: E731
        return _span(n, start, end, step, part, lambda a, b: te.maximum(a, c(b)) if isinstance(
            b, int) else te.maximum(a, b), lambda a, b: te.minimum(a, b if not isinstance(
                b, int) else c(b)), lambda k, a, b: te.if_then_else(k, a, b))
    return te.compute((1,), body, name=name, dtype="int64")


@register_op("slice_span", INJECTIVE, _infer_slice_span, _legalize_slice_span)
def slice_span(x: np.ndarray, axis: int = 0, start: int = 0, end: int = 0, step: int = 1,
               part: str = "length") -> np.ndarray:
    """The first index (``part`` "first") or the length of ``x[start:end:step]`` along
    ``axis``, as ONNX Slice clamps them: a slice along an axis whose extent a kernel counted
    (NMS's selected rows) binds its length as a new counted size."""
    v = _span(int(x.shape[axis]), int(start), int(end), int(step), part, max, min,
              lambda k, a, b: a if k else b)
    return np.array([v], np.int64)


# ---- a slice whose starts and ends are computed at run time (a Slice by a Loop's iteration) ----

def _infer_slice_span_at(x: TensorType, starts: TensorType, ends: TensorType, index: int = 0,
                         axis: int = 0, step: int = 1, part: str = "length") -> TensorType:
    if part not in ("first", "length") or step == 0:
        raise ValueError(f"slice_span_at: part {part!r}, step {step}")
    for t in (starts, ends):
        if t.dtype != "int64" or len(t.shape) != 1 or not 0 <= index < t.shape[0]:
            raise ValueError(f"slice_span_at: element {index} of int64 vectors, not {t}")
    return TensorType((1,), "int64")


def _legalize_slice_span_at(x: te.Tensor, starts: te.Tensor, ends: te.Tensor,
                            out_type: TensorType, name: str, index: int = 0, axis: int = 0,
                            step: int = 1, part: str = "length") -> te.Tensor:
    """Reads element ``index`` of ``starts`` and ``ends`` and ``x``'s extent along ``axis``,
    nothing of ``x``'s data."""
    def c(v: int) -> te.Expr:
        return te.const(v, "int64")

    def body(i):
        n = te.cast(te.as_expr(size_expr(x.shape[axis]), "int64"), "int64")

        def norm(v, low, high):
            return te.minimum(te.maximum(te.if_then_else(v < c(0), n + v, v), low), high)

        s, e = starts[(index,)], ends[(index,)]
        if step > 0:
            first, last = norm(s, c(0), n), norm(e, c(0), n)
            length = te.maximum((last - first + c(step - 1)) // c(step), c(0))
        else:
            first, last = norm(s, c(0), n - c(1)), norm(e, c(-1), n - c(1))
            length = te.maximum((first - last + c(-step - 1)) // c(-step), c(0))
        return te.if_then_else(n > c(0), first if part == "first" else length, c(0))
    return te.compute((1,), body, name=name, dtype="int64")


@register_op("slice_span_at", INJECTIVE, _infer_slice_span_at, _legalize_slice_span_at)
def slice_span_at(x: np.ndarray, starts: np.ndarray, ends: np.ndarray, index: int = 0,
                  axis: int = 0, step: int = 1, part: str = "length") -> np.ndarray:
    """The first index (``part`` "first") or the length of ``x[s:e:step]`` along ``axis``, as
    ONNX Slice clamps them, ``s`` and ``e`` element ``index`` of ``starts`` and ``ends``
    (tensors computed at run time: a Slice by a Loop's iteration number). The length is bound
    as a counted size."""
    s, e = int(starts.reshape(-1)[index]), int(ends.reshape(-1)[index])
    v = _span(int(x.shape[axis]), s, e, int(step), part, max, min,
              lambda k, a, b: a if k else b)
    return np.array([v], np.int64)


def _infer_counted_range(first: TensorType, after: TensorType, count: Dim = 0,
                         step: int = 1) -> TensorType:
    return TensorType((count,), "int64")


def _legalize_counted_range(first: te.Tensor, after: te.Tensor, out_type: TensorType,
                            name: str, count: Dim = 0, step: int = 1) -> te.Tensor:
    return te.compute(out_type.shape, lambda p: first[(0,)] + te.cast(p, "int64") * step,
                      name=name, dtype="int64")


@register_op("counted_range", INJECTIVE, _infer_counted_range, _legalize_counted_range)
def counted_range(first: np.ndarray, after: np.ndarray, count: Dim = 0,
                  step: int = 1) -> np.ndarray:
    """first, first + step, ... (``after`` of them: a size bound at run time)."""
    return int(first[0]) + np.arange(int(after.reshape(-1)[0]), dtype=np.int64) * int(step)


# ---- carried_copy: a Loop's carried value whose extents change, into its state's buffer -------

def _infer_carried_copy(x: TensorType, *after: TensorType, out: tuple = ()) -> TensorType:
    if len(out) != len(x.shape):
        raise ValueError(f"carried_copy: {x} as rank {len(out)}")
    return TensorType(tuple(out), x.dtype)


def _legalize_carried_copy(x: te.Tensor, *after: te.Tensor, out_type: TensorType,
                           name: str, out: tuple = ()) -> te.Tensor:
    return te.compute(out_type.shape, lambda *i: x[tuple(i)], name=name, dtype=x.dtype)


@register_op("carried_copy", OPAQUE, _infer_carried_copy, _legalize_carried_copy)
def carried_copy(x: np.ndarray, *after: np.ndarray, out: tuple = ()) -> np.ndarray:
    """``x`` (a Loop body's new carried value; its extents, where its shape names the sizes
    ``after`` rebinds, through a view at the state's shape) as the state's shape ``out`` (the
    new extents ``after`` bound), copied by a kernel of its own that vm_emit points at the
    state's buffer: the elements at this iteration's extents, where a VM COPY would move the
    bytes planned at their bounds. Opaque: nothing fuses into it."""
    return np.array(x, copy=True)


# ---- prefix_rows: the rows a Loop computed at run time ran for ---------------------------------

def _infer_prefix_rows(x: TensorType, after: TensorType, count: Dim = 0) -> TensorType:
    return TensorType((count,) + tuple(x.shape[1:]), x.dtype)


def _legalize_prefix_rows(x: te.Tensor, after: te.Tensor, out_type: TensorType, name: str,
                          count: Dim = 0) -> te.Tensor:
    return te.compute(out_type.shape, lambda *i: x[tuple(i)], name=name, dtype=x.dtype)


@register_op("prefix_rows", INJECTIVE, _infer_prefix_rows, _legalize_prefix_rows)
def prefix_rows(x: np.ndarray, after: np.ndarray, count: Dim = 0) -> np.ndarray:
    """Rows 0 .. count - 1 of ``x`` (planned at its upper bound of rows): a Loop's scan output
    when the loop stops at a condition computed at run time."""
    return np.ascontiguousarray(x[:int(after.reshape(-1)[0])])
