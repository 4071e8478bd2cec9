"""Converters for ONNX operators whose output sizes depend on the data: NonZero, Unique, and the
run-time forms of TopK (k an input computed at run time) and Compress (a run-time condition).

Each binds a size variable at run time (``BlockBuilder.bind_size``, ``packager/ops/dynamic.py``):
its upper bound, known at export, sizes the memory plan, and the kernels after it read the real
count from the sizes array as they read any input size. A constant input folds at import."""

from __future__ import annotations

import numpy as np

from ...packager.ir.graph import Value
from ...packager.ir.sym import product
from .registry import NodeContext, converter


def nonzero_coords(ctx: NodeContext, x: Value, label: str = "nonzero") -> Value:
    """The coordinates of ``x``'s nonzero elements, [rank, count] int64 in C order, the count a
    size variable bound at run time (at most ``x``'s size)."""
    bb = ctx.bb
    shape = x.type.shape
    n = product(shape)
    flat = ctx.reshape(x, (n,))
    table = bb.emit_op("nonzero_index", flat)   # the count, then the flat indices: one pass
    after, d = bb.bind_size(bb.emit_op("head_count", table), n, label)
    return bb.emit_op("nonzero_coords", table, after, shape=tuple(shape), count=d)


@converter("NonZero", since=9)
def _nonzero(ctx: NodeContext) -> Value:
    data = ctx.const(0)
    if data is not None:
        coords = np.array(np.nonzero(np.atleast_1d(data)), dtype=np.int64)
        return ctx.constant(coords.reshape(max(np.ndim(data), 1), -1), "nonzero")
    # exporters repeat NonZero of one mask (ultralytics' NMS export: one per gathered column);
    # one count for all of them, so the gathered columns have the same run-time length
    x = ctx.input(0)
    memo = getattr(ctx.scope, "memo", None)
    if memo is not None and id(x) in memo:
        return memo[id(x)][1]
    coords = nonzero_coords(ctx, x)
    if memo is not None:
        memo[id(x)] = (x, coords)
    return coords


def topk_runtime(ctx: NodeContext, x: Value, axis: int, largest: bool) -> list[Value]:
    """TopK whose k is computed at run time: k becomes a size variable (at most the axis's
    size; a larger or negative k is refused when the model runs)."""
    k = ctx.input(1)
    if k.type.dtype != "int64" or int(np.prod([int(d) for d in k.type.shape])) != 1:
        raise ctx.error(f"k must be one int64, not {k.type}")
    k = ctx.reshape(k, (1,))
    after, d = ctx.bb.bind_size(k, x.type.shape[axis], "k")
    indices = ctx.bb.emit_op("topk_dynamic", x, after, k=d, axis=axis, largest=largest)
    return [ctx.emit("gather_elements", x, indices, axis=axis), indices]


def compress_runtime(ctx: NodeContext, x: Value, axis: int) -> Value:
    """Compress with a condition computed at run time: the kept positions are the condition's
    nonzeros (a size variable bound at run time), then a gather along ``axis``."""
    condition = ctx.input(1)
    if len(condition.type.shape) != 1:
        raise ctx.error(f"condition must be 1-D, not {condition.type.shape}")
    if not condition.type.shape[0] <= x.type.shape[axis]:
        raise ctx.error(f"condition has {condition.type.shape[0]} entries for an axis of "
                        f"{x.type.shape[axis]}")
    coords = nonzero_coords(ctx, condition, "kept")
    keep = ctx.reshape(coords, (coords.type.shape[1],))
    return ctx.emit("take", x, keep, axis=axis)


@converter("Unique", since=11, attrs={"axis": None, "sorted": 1})
def _unique(ctx: NodeContext) -> list[Value]:
    """Items are the elements (axis unset) or the slices along ``axis``; the count of distinct
    items is bound at run time (at most the number of items)."""
    x = ctx.input(0)
    shape = x.type.shape
    axis = ctx.attrs["axis"]
    if axis is not None:
        axis = int(axis)
        if not -len(shape) <= axis < len(shape):
            raise ctx.error(f"axis {axis} is out of range for rank {len(shape)}")
        axis %= len(shape)
        view = (product(shape[:axis]), shape[axis], product(shape[axis + 1:]))
    else:
        view = (1, product(shape), 1)
    bb = ctx.bb
    x3 = ctx.reshape(x, view)
    table = bb.emit_op("unique_table", x3, sort=bool(ctx.attrs["sorted"]))   # one sort
    after, d = bb.bind_size(bb.emit_op("head_count", table), view[1], "unique")
    values, indices, inverse, counts = (
        bb.emit_op("unique_select", x3, table, after, count=d, part=part)
        for part in ("values", "indices", "inverse", "counts"))
    out_shape = (d,) if axis is None else shape[:axis] + (d,) + shape[axis + 1:]
    return [ctx.reshape(values, out_shape), indices, inverse, counts]


# Where the box count is a run-time size and max_output_boxes_per_class a constant up to this,
# each class's rows are planned at that constant (a detector's 100 or 300), not at the boxes.
NMS_PLANNED_PER_CLASS = 1 << 16


@converter("NonMaxSuppression", since=10, attrs={"center_point_box": 0})
def _non_max_suppression(ctx: NodeContext) -> Value:
    """The selected (batch, class, box) triples, [count, 3], the count bound at run time: at
    most batches * classes * boxes, or * max_output_boxes_per_class when that is a constant
    below the box count (or, where the box count is a run-time size, below
    ``NMS_PLANNED_PER_CLASS``). Batches, classes and boxes may be run-time sizes."""
    boxes, scores = ctx.input(0), ctx.input(1)
    if boxes.type.dtype != "float32" or scores.type.dtype != "float32":
        raise ctx.error(f"boxes and scores must be float32, not {boxes.type.dtype} and "
                        f"{scores.type.dtype}")
    bshape, sshape = boxes.type.shape, scores.type.shape
    if len(bshape) != 3 or len(sshape) != 3 or not (bshape[2] == 4 and sshape[0] == bshape[0]
                                                    and sshape[2] == bshape[1]):
        raise ctx.error(f"boxes {bshape} and scores {sshape} do not fit [B, N, 4] and [B, C, N]")
    center = int(ctx.attrs["center_point_box"])
    if center not in (0, 1):
        raise ctx.error(f"center_point_box must be 0 or 1, not {center}")
    n = bshape[1]
    limit = n

    def scalar(i: int, dtype: str, default: float) -> Value:
        if not ctx.has_input(i):
            return ctx.constant(np.array([default], dtype=dtype), "nms_default")
        v = ctx.input(i)
        if v.type.dtype != dtype or int(np.prod([int(d) for d in v.type.shape])) != 1:
            raise ctx.error(f"input {i} must be one {dtype}, not {v.type}")
        return ctx.reshape(v, (1,))

    max_out = scalar(2, "int64", 0)
    known = ctx.const(2) if ctx.has_input(2) else np.zeros(1, np.int64)
    if known is not None:
        k = max(0, int(np.asarray(known).reshape(-1)[0]))
        if isinstance(n, int):
            limit = min(n, k)
        elif k <= NMS_PLANNED_PER_CLASS:
            limit = k
    bb = ctx.bb
    table = bb.emit_op("nms", boxes, scores, max_out, scalar(3, "float32", 0.0),
                       scalar(4, "float32", 0.0), center_point_box=center,
                       has_score_threshold=ctx.has_input(4), limit=limit)
    count = bb.emit_op("head_count", table)
    after, d = bb.bind_size(count, sshape[0] * sshape[1] * limit, "selected")
    return bb.emit_op("counted_rows", table, after, count=d)
