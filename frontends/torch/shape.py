"""Converters for shape and data-movement ATen operators (view, permute, expand, cat, slicing,
indexing, padding), tensor factories (full, arange: constants at export) and the sizes of
symbolic shapes (``sym_size``: a number, as every shape is static once exported)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...packager.ir.graph import Value
from ...packager.ir.sym import dim, product
from .elementwise import cast_to
from .registry import NodeContext, converter

_INT64_MAX = 2 ** 63 - 1


def _axis(ctx: NodeContext, dim: Any, rank: int) -> int:
    d = int(dim)
    if not -max(rank, 1) <= d < max(rank, 1):
        raise ctx.error(f"dim {d} is out of range for rank {rank}")
    return d % max(rank, 1)


@converter("aten.sym_size.int")
def _sym_size(ctx: NodeContext) -> Any:
    """A size: an int, or a symbolic dim when the input's size is a variable."""
    x = ctx.tensor("self")
    return dim(x.type.shape[_axis(ctx, ctx.arg("dim"), len(x.type.shape))])


@converter("aten.sym_numel.default")
def _sym_numel(ctx: NodeContext) -> Any:
    return product(ctx.tensor("self").type.shape)


# ---- reshapes and permutations ------------------------------------------------------------------

def reshape_target(ctx: NodeContext, x: Value, shape: Sequence[Any]) -> tuple[Any, ...]:
    total = product(x.type.shape)
    dims = [dim(d) for d in shape]
    minus = [i for i, d in enumerate(dims) if isinstance(d, int) and d == -1]
    if len(minus) > 1:
        raise ctx.error(f"shape {dims} has more than one -1")
    if minus:
        known = product(d for i, d in enumerate(dims) if i != minus[0])
        dims[minus[0]] = total // known if known != 0 else 0
    if product(dims) != total:
        raise ctx.error(f"cannot view {x.type.shape} as {dims}")
    return tuple(dims)


@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.reshape(x, reshape_target(ctx, x, ctx.arg("size") if "size" in ctx.args
                                         else ctx.arg("shape")))


@converter("aten.permute.default")
def _permute(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    rank = len(x.type.shape)
    axes = tuple(_axis(ctx, d, rank) for d in ctx.arg("dims"))
    if axes == tuple(range(rank)):
        return x
    return ctx.emit("transpose", x, axes=axes)


@converter("aten.transpose.int")
def _transpose(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    rank = len(x.type.shape)
    axes = list(range(rank))
    a, b = _axis(ctx, ctx.arg("dim0"), rank), _axis(ctx, ctx.arg("dim1"), rank)
    if a == b:
        return x
    axes[a], axes[b] = axes[b], axes[a]
    return ctx.emit("transpose", x, axes=tuple(axes))


@converter("aten.t.default")
def _t(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return x if len(x.type.shape) < 2 else ctx.emit("transpose", x, axes=(1, 0))


@converter("aten.unsqueeze.default")
def _unsqueeze(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    shape = list(x.type.shape)
    shape.insert(_axis(ctx, ctx.arg("dim"), len(shape) + 1), 1)
    return ctx.reshape(x, shape)


@converter("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    shape = x.type.shape
    dims = ctx.args.get("dim", ctx.args.get("dims"))
    if dims is None:
        axes = {i for i, d in enumerate(shape) if d == 1}
    else:
        dims = dims if isinstance(dims, (list, tuple)) else [dims]
        axes = {_axis(ctx, d, len(shape)) for d in dims if shape[int(d) % max(len(shape), 1)] == 1}
    return ctx.reshape(x, [d for i, d in enumerate(shape) if i not in axes])


@converter("aten.expand.default")
def _expand(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    size = [dim(s) for s in ctx.arg("size")]
    shape = (1,) * (len(size) - len(x.type.shape)) + tuple(x.type.shape)
    target = tuple(d if isinstance(s, int) and s == -1 else s for s, d in zip(size, shape))
    if target == x.type.shape:
        return x
    x = ctx.reshape(x, shape)
    if target == shape:
        return x
    return ctx.emit("broadcast_to", x, shape=target)


@converter("aten.repeat.default")
def _repeat(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    reps = [int(r) for r in ctx.arg("repeats")]
    x = ctx.reshape(x, (1,) * (len(reps) - len(x.type.shape)) + tuple(x.type.shape))
    if all(r == 1 for r in reps):
        return x
    return ctx.emit("tile", x, repeats=tuple(reps))


@converter("aten.cat.default")
def _cat(ctx: NodeContext) -> Value:
    parts = [t for t in ctx.arg("tensors") if isinstance(t, Value)]
    nonempty = [t for t in parts if 0 not in t.type.shape or len(t.type.shape) != 1]
    if not nonempty:
        raise ctx.error("all tensors are empty")
    rank = len(nonempty[0].type.shape)
    axis = _axis(ctx, ctx.arg("dim"), rank)
    dtype = ctx.out_dtype or nonempty[0].type.dtype
    nonempty = [cast_to(ctx, t, dtype) for t in nonempty if t.type.shape[axis] > 0]
    if len(nonempty) == 1:
        return nonempty[0]
    return ctx.emit("concat", *nonempty, axis=axis)


# ---- slicing and indexing -----------------------------------------------------------------------

def slice_axis(ctx: NodeContext, x: Value, axis: int, start: int, end: int, step: int = 1
               ) -> Value:
    if start == 0 and end >= x.type.shape[axis] and step == 1:
        return x
    return ctx.emit("strided_slice", x, starts=(start,), ends=(end,), axes=(axis,),
                    steps=(step,))


@converter("aten.slice.Tensor")
def _slice(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    axis = _axis(ctx, ctx.arg("dim"), len(x.type.shape))
    size = x.type.shape[axis]
    start = ctx.args.get("start")
    end = ctx.args.get("end")
    step = int(ctx.args.get("step") or 1)
    start = 0 if start is None else int(start)
    end = size if end is None or int(end) >= _INT64_MAX else int(end)
    start = min(max(start + size if start < 0 else start, 0), size)
    end = min(max(end + size if end < 0 else end, 0), size)
    end = max(end, start)
    return slice_axis(ctx, x, axis, start, end, step)


@converter("aten.select.int")
def _select(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    shape = x.type.shape
    axis = _axis(ctx, ctx.arg("dim"), len(shape))
    index = int(ctx.arg("index"))
    if not -shape[axis] <= index < shape[axis]:
        raise ctx.error(f"index {index} is out of range for size {shape[axis]}")
    index %= shape[axis]
    part = slice_axis(ctx, x, axis, index, index + 1)
    return ctx.reshape(part, shape[:axis] + shape[axis + 1:])


@converter("aten.split_with_sizes.default", "aten.split.Tensor", "aten.unbind.int")
def _split(ctx: NodeContext) -> tuple[Value, ...]:
    x = ctx.tensor("self")
    shape = x.type.shape
    axis = _axis(ctx, ctx.arg("dim"), len(shape))
    if "unbind" in ctx.target:
        sizes = [1] * shape[axis]
    elif "split_sizes" in ctx.args:
        sizes = [int(s) for s in ctx.arg("split_sizes")]
    else:
        step = int(ctx.arg("split_size"))
        sizes = [min(step, shape[axis] - i) for i in range(0, shape[axis], step)]
    parts, start = [], 0
    for i, n in enumerate(sizes):
        part = slice_axis(ctx, x, axis, start, start + n) if ctx.wants(i) else None
        if part is not None and "unbind" in ctx.target:
            part = ctx.reshape(part, shape[:axis] + shape[axis + 1:])
        parts.append(part)
        start += n
    return tuple(parts)


@converter("aten.flip.default")
def _flip(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    rank = len(x.type.shape)
    axes = tuple(sorted(_axis(ctx, d, rank) for d in ctx.arg("dims")))
    axes = tuple(a for a in axes if x.type.shape[a] > 1)
    if not axes:
        return x
    return ctx.emit("strided_slice", x, starts=tuple(-1 for _ in axes),
                    ends=tuple(-_INT64_MAX for _ in axes), axes=axes,
                    steps=tuple(-1 for _ in axes))


@converter("aten.index_select.default")
def _index_select(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("take", x, ctx.tensor("index"),
                    axis=_axis(ctx, ctx.arg("dim"), len(x.type.shape)))


@converter("aten.embedding.default")
def _embedding(ctx: NodeContext) -> Value:
    return ctx.emit("take", ctx.tensor("weight"), ctx.tensor("indices"), axis=0)


@converter("aten.index.Tensor")
def _index(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    indices = list(ctx.arg("indices"))
    given = [i for i, v in enumerate(indices) if v is not None]
    if len(given) != 1:
        raise ctx.error("indexing with more than one index tensor is not supported (only "
                        "x[..., idx, ...] with one integer tensor)")
    index = indices[given[0]]
    if index.type.dtype == "bool":
        raise ctx.error("boolean-mask indexing gives a data-dependent shape; it is not supported")
    return ctx.emit("take", x, index, axis=given[0])


@converter("aten.gather.default")
def _gather(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    return ctx.emit("gather_elements", x, ctx.tensor("index"),
                    axis=_axis(ctx, ctx.arg("dim"), len(x.type.shape)))


@converter("aten.constant_pad_nd.default")
def _constant_pad(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    rank = len(x.type.shape)
    pad = [int(p) for p in ctx.arg("pad")]
    # torch pads the last axis first, (begin, end) pairs; ONNX-style: all begins then all ends
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if not any(begins) and not any(ends):
        return x
    if any(p < 0 for p in begins + ends):
        crop = [slice(max(-b, 0), x.type.shape[a] - max(-e, 0))
                for a, (b, e) in enumerate(zip(begins, ends))]
        x = ctx.emit("strided_slice", x, starts=tuple(c.start for c in crop),
                     ends=tuple(c.stop for c in crop), axes=tuple(range(rank)),
                     steps=(1,) * rank)
        begins, ends = [max(b, 0) for b in begins], [max(e, 0) for e in ends]
        if not any(begins) and not any(ends):
            return x
    return ctx.emit("pad", x, pads=tuple(begins + ends), mode="constant",
                    value=float(ctx.arg("value")))


# ---- factories: constants at export -------------------------------------------------------------

def _fill_dtype(ctx: NodeContext, value: Any) -> str:
    if ctx.args.get("dtype"):
        return ctx.args["dtype"]
    if ctx.out_dtype:
        return ctx.out_dtype
    return "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else "float32"


@converter("aten.full.default")
def _full(ctx: NodeContext) -> Value:
    value = ctx.arg("fill_value")
    return ctx.constant(np.full([int(s) for s in ctx.arg("size")], value,
                                dtype=_fill_dtype(ctx, value)), "full")


@converter("aten.full_like.default")
def _full_like(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    value = ctx.arg("fill_value")
    dtype = ctx.args.get("dtype") or ctx.out_dtype or x.type.dtype
    return ctx.constant(np.full(x.type.shape, value, dtype=dtype), "full")


@converter("aten.zeros.default", "aten.ones.default", "aten.empty.memory_format")
def _zeros(ctx: NodeContext) -> Value:
    value = 1 if "ones" in ctx.target else 0
    return ctx.constant(np.full([int(s) for s in ctx.arg("size")], value,
                                dtype=ctx.args.get("dtype") or ctx.out_dtype or "float32"),
                        "ones" if value else "zeros")


@converter("aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default")
def _zeros_like(ctx: NodeContext) -> Value:
    x = ctx.tensor("self")
    value = 1 if "ones" in ctx.target else 0
    dtype = ctx.args.get("dtype") or ctx.out_dtype or x.type.dtype
    return ctx.constant(np.full(x.type.shape, value, dtype=dtype), "ones" if value else "zeros")


@converter("aten.scalar_tensor.default")
def _scalar_tensor(ctx: NodeContext) -> Value:
    value = ctx.arg("s")
    return ctx.constant(np.array(value, dtype=ctx.args.get("dtype") or ctx.out_dtype
                                 or "float32"), "scalar")


@converter("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(ctx: NodeContext) -> Value:
    start = ctx.args.get("start", 0) if "start" in ctx.args else 0
    end = ctx.arg("end")
    step = ctx.args.get("step", 1) or 1
    values = [v for v in (start, end, step)]
    dtype = ctx.args.get("dtype") or ctx.out_dtype or (
        "float32" if any(isinstance(v, float) for v in values) else "int64")
    return ctx.constant(np.arange(start, end, step).astype(dtype), "arange")
