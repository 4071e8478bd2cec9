"""Converters for indexing and rearranging ONNX operators on run-time tensors: GatherElements,
Split, Tile, CumSum, ArgMax/ArgMin, Trilu, DepthToSpace/SpaceToDepth."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ...packager.ir.graph import Value
from ...packager.ir.sym import SymExpr, product
from .symvalue import SymValue
from .registry import NodeContext, converter
from . import valueinputs
from .valueinputs import read_as


@converter("GatherElements", since=11, attrs={"axis": 0})
def _gather_elements(ctx: NodeContext) -> Value:
    x, idx = ctx.input(0), ctx.input(1)
    rank = len(x.type.shape)
    axis = int(ctx.attrs["axis"])
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return ctx.emit("gather_elements", x, idx, axis=axis % rank)


# ---- Split --------------------------------------------------------------------------------------

def _split_sizes(ctx: NodeContext) -> list | None:
    if not ctx.has_input(1):
        return None
    if isinstance(ctx.inputs[1], SymValue):   # fed at run time: sizes
        read_as(ctx, 1, "dims")
        return ctx.dims(1, "split")
    return ctx.require_const(1, "split").reshape(-1).tolist()


def _split(ctx: NodeContext, sizes: Sequence[int] | None, num_outputs: int | None) -> list[Value]:
    x = ctx.input(0)
    rank = len(x.type.shape)
    axis = int(ctx.attrs["axis"])
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    total = x.type.shape[axis]
    count = num_outputs or len(ctx.node.output)
    if sizes is None or len(sizes) == 0:
        chunk = -(-total // count)  # the last part may be smaller (opset 18)
        sizes = [min(chunk, total - k * chunk) for k in range(count)]
    if any(isinstance(s, SymExpr) for s in sizes):   # sizes fed at run time: checked then
        ctx.assume("eq", sum(sizes), total, f"split sizes {list(sizes)}")
    else:
        sizes = [int(s) for s in sizes]
        if sum(sizes) != total or any(s < 0 for s in sizes):
            raise ctx.error(f"split sizes {sizes} do not add up to {total} on axis {axis}")
    outs, start = [], 0
    for size in sizes:
        outs.append(_slice_axis(ctx, x, axis, start, start + size))
        start += size
    return outs


def _slice_axis(ctx: NodeContext, x: Value, axis: int, start: int, end: int) -> Value:
    if start == 0 and end == x.type.shape[axis]:
        return x
    return ctx.emit("strided_slice", x, starts=(start,), ends=(end,), axes=(axis,), steps=(1,))


@converter("Split", since=1, attrs={"axis": 0, "split": None})
def _split_v1(ctx: NodeContext) -> list[Value]:
    sizes = ctx.attrs["split"]
    if sizes is None and ctx.has_input(1):
        sizes = ctx.require_const(1, "split").reshape(-1).tolist()
    return _split(ctx, sizes, None)


@converter("Split", since=13, attrs={"axis": 0})
def _split_v13(ctx: NodeContext) -> list[Value]:
    sizes = _split_sizes(ctx)
    return _split(ctx, sizes, None)


@converter("Split", since=18, attrs={"axis": 0, "num_outputs": None})
def _split_v18(ctx: NodeContext) -> list[Value]:
    sizes = _split_sizes(ctx)
    n = ctx.attrs["num_outputs"]
    return _split(ctx, sizes, int(n) if n is not None else None)


# ---- Tile, CumSum, ArgMax/ArgMin ----------------------------------------------------------------

@converter("Tile", since=6)
def _tile(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    if isinstance(ctx.inputs[1], SymValue):   # repeats known at run time: sizes
        read_as(ctx, 1, "dims")
        return _tile_symbolic(ctx, x, ctx.dims(1, "repeats"))
    repeats = tuple(int(r) for r in ctx.require_const(1, "repeats").reshape(-1))
    if len(repeats) != len(x.type.shape) or any(r < 0 for r in repeats):
        raise ctx.error(f"repeats {list(repeats)} do not fit shape {x.type.shape}")
    if all(r == 1 for r in repeats):
        return x
    return ctx.emit("tile", x, repeats=repeats)


def _tile_symbolic(ctx: NodeContext, x: Value, repeats: Sequence) -> Value:
    """Tile by repeats that are size expressions: ``x`` as ``(1, d0, 1, d1, ...)`` broadcast to
    ``(r0, d0, r1, d1, ...)``, then merged to ``(r0 * d0, r1 * d1, ...)``."""
    shape = tuple(x.type.shape)
    if len(repeats) != len(shape):
        raise ctx.error(f"repeats {list(repeats)} do not fit shape {shape}")
    spread = tuple(d for n in shape for d in (1, n))
    wide = tuple(d for r, n in zip(repeats, shape) for d in (r, n))
    out = ctx.emit("broadcast_to", ctx.reshape(x, spread), shape=wide)
    return ctx.reshape(out, tuple(r * n for r, n in zip(repeats, shape)))


@converter("CumSum", since=11, attrs={"exclusive": 0, "reverse": 0})
def _cumsum(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    if valueinputs.run_time_axes(ctx, 1) is not None:   # the axis fed at run time
        return valueinputs.along_chosen_axis(ctx, x, lambda a: ctx.emit(
            "cumsum", x, axis=a, exclusive=bool(ctx.attrs["exclusive"]),
            reverse=bool(ctx.attrs["reverse"])))
    axis = int(ctx.require_const(1, "axis").reshape(()))
    rank = len(x.type.shape)
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return ctx.emit("cumsum", x, axis=axis % rank, exclusive=bool(ctx.attrs["exclusive"]),
                    reverse=bool(ctx.attrs["reverse"]))


def _arg(op: str) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        rank = len(x.type.shape)
        axis = int(ctx.attrs["axis"])
        if not -rank <= axis < rank:
            raise ctx.error(f"axis {axis} is out of range for rank {rank}")
        return ctx.emit(op, x, axis=axis % rank, keepdims=bool(ctx.attrs["keepdims"]),
                        select_last_index=bool(ctx.attrs.get("select_last_index", 0)))
    return convert


for _op_type, _op in {"ArgMax": "argmax", "ArgMin": "argmin"}.items():
    converter(_op_type, since=1, attrs={"axis": 0, "keepdims": 1})(_arg(_op))
    converter(_op_type, since=12, attrs={"axis": 0, "keepdims": 1, "select_last_index": 0}
              )(_arg(_op))


# ---- Trilu, DepthToSpace, SpaceToDepth ----------------------------------------------------------

@converter("Trilu", since=14, attrs={"upper": 1})
def _trilu(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rows, cols = x.type.shape[-2:]
    zeros = ctx.constant(np.zeros((1,) * len(x.type.shape), x.type.dtype), "zero")
    if ctx.has_input(1) and ctx.const(1) is None and isinstance(rows, int) \
            and isinstance(cols, int):   # k fed at run time: keep where col - row >= k (<= k)
        k = ctx.input(1)
        if k.type.dtype != "int64" or int(np.prod(k.type.shape)) != 1:
            raise ctx.error(f"k has type {k.type.dtype}{list(k.type.shape)}; it must be one "
                            "int64")
        diag = np.arange(cols, dtype=np.int64)[None, :] - np.arange(rows, dtype=np.int64)[:, None]
        keep = ctx.emit("greater_equal" if ctx.attrs["upper"] else "less_equal",
                        ctx.constant(diag, "diagonal"), ctx.reshape(k, (1, 1)))
        return ctx.emit("where", keep, x, zeros)
    k = int(ctx.require_const(1, "k").reshape(())) if ctx.has_input(1) else 0
    keep = np.triu(np.ones((rows, cols), bool), k) if ctx.attrs["upper"] \
        else np.tril(np.ones((rows, cols), bool), k)
    return ctx.emit("where", ctx.constant(keep, "mask"), x, zeros)


@converter("DepthToSpace", since=1, attrs={"blocksize": None, "mode": "DCR"})
def _depth_to_space(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    n, c, h, w = x.type.shape
    b = int(ctx.attrs["blocksize"])
    if c % (b * b):
        raise ctx.error(f"{c} channels are not divisible by blocksize^2 = {b * b}")
    if ctx.attrs["mode"] == "DCR":
        t = ctx.reshape(x, (n, b, b, c // (b * b), h, w))
        t = ctx.emit("transpose", t, axes=(0, 3, 4, 1, 5, 2))
    else:
        t = ctx.reshape(x, (n, c // (b * b), b, b, h, w))
        t = ctx.emit("transpose", t, axes=(0, 1, 4, 2, 5, 3))
    return ctx.reshape(t, (n, c // (b * b), h * b, w * b))


@converter("SpaceToDepth", since=1, attrs={"blocksize": None})
def _space_to_depth(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    n, c, h, w = x.type.shape
    b = int(ctx.attrs["blocksize"])
    if h % b or w % b:
        raise ctx.error(f"spatial size {h}x{w} is not divisible by blocksize {b}")
    t = ctx.reshape(x, (n, c, h // b, b, w // b, b))
    t = ctx.emit("transpose", t, axes=(0, 3, 5, 1, 2, 4))
    return ctx.reshape(t, (n, c * b * b, h // b, w // b))


def _axis(ctx: NodeContext, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# ---- CumProd, Hardmax, TopK ---------------------------------------------------------------------

@converter("CumProd", since=26, attrs={"exclusive": 0, "reverse": 0})
def _cumprod(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    if valueinputs.run_time_axes(ctx, 1) is not None:   # the axis fed at run time
        return valueinputs.along_chosen_axis(ctx, x, lambda a: ctx.emit(
            "cumprod", x, axis=a, exclusive=bool(ctx.attrs["exclusive"]),
            reverse=bool(ctx.attrs["reverse"])))
    axis = _axis(ctx, int(ctx.require_const(1, "axis").reshape(())), len(x.type.shape))
    return ctx.emit("cumprod", x, axis=axis, exclusive=bool(ctx.attrs["exclusive"]),
                    reverse=bool(ctx.attrs["reverse"]))


@converter("Hardmax", since=1, attrs={"axis": 1})
def _hardmax_v1(ctx: NodeContext) -> Value:
    # Before opset 13 the input is seen as 2-D: [prod(shape[:axis]), prod(shape[axis:])].
    x = ctx.input(0)
    shape = x.type.shape
    axis = _axis(ctx, int(ctx.attrs["axis"]), len(shape))
    flat = ctx.reshape(x, (int(np.prod(shape[:axis], dtype=np.int64)),
                           int(np.prod(shape[axis:], dtype=np.int64))))
    return ctx.reshape(ctx.emit("hardmax", flat, axis=1), shape)


@converter("Hardmax", since=13, attrs={"axis": -1})
def _hardmax(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.emit("hardmax", x, axis=_axis(ctx, int(ctx.attrs["axis"]), len(x.type.shape)))


def _topk(ctx: NodeContext, k: int) -> list[Value]:
    x = ctx.input(0)
    axis = _axis(ctx, int(ctx.attrs["axis"]), len(x.type.shape))
    if not 0 <= k <= x.type.shape[axis]:
        raise ctx.error(f"k={k} is not in [0, {x.type.shape[axis]}] for axis {axis}")
    indices = ctx.emit("topk", x, k=k, axis=axis, largest=bool(ctx.attrs.get("largest", 1)))
    return [ctx.emit("gather_elements", x, indices, axis=axis), indices]


@converter("TopK", since=1, attrs={"axis": -1, "k": None})
def _topk_v1(ctx: NodeContext) -> list[Value]:
    return _topk(ctx, int(ctx.attrs["k"]))


def _topk_input_k(ctx: NodeContext) -> list[Value]:
    k = ctx.const(1)
    if k is not None:
        return _topk(ctx, int(k.reshape(-1)[0]))
    from .dynamic import topk_runtime   # k computed at run time: a size variable
    x = ctx.input(0)
    return topk_runtime(ctx, x, _axis(ctx, int(ctx.attrs["axis"]), len(x.type.shape)),
                        bool(ctx.attrs.get("largest", 1)))


@converter("TopK", since=10, attrs={"axis": -1})
def _topk_v10(ctx: NodeContext) -> list[Value]:
    return _topk_input_k(ctx)


@converter("TopK", since=11, attrs={"axis": -1, "largest": 1, "sorted": 1})
def _topk_v11(ctx: NodeContext) -> list[Value]:
    # sorted=0 lets any order through; sorted order is one of them.
    return _topk_input_k(ctx)


# ---- ScatterElements / Scatter, ScatterND, GatherND ---------------------------------------------

def _reduction(ctx: NodeContext, allowed: tuple[str, ...]) -> str:
    reduction = ctx.attrs.get("reduction", "none")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in allowed:
        raise ctx.error(f"reduction {reduction!r} is not one of {', '.join(allowed)}")
    return reduction


def _check_indices(ctx: NodeContext, indices: Value) -> None:
    if indices.type.dtype not in ("int32", "int64"):
        raise ctx.error(f"indices must be int32 or int64, not {indices.type.dtype}")


def _scatter_elements(allowed: tuple[str, ...]) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
        _check_indices(ctx, indices)
        rank = len(data.type.shape)
        if len(indices.type.shape) != rank or indices.type.shape != updates.type.shape:
            raise ctx.error(f"indices {indices.type.shape} and updates {updates.type.shape} must "
                            f"have one shape of the rank of data {data.type.shape}")
        return ctx.emit("scatter_elements", data, indices, updates,
                        axis=_axis(ctx, int(ctx.attrs["axis"]), rank),
                        reduction=_reduction(ctx, allowed))
    return convert


converter("Scatter", since=9, attrs={"axis": 0})(_scatter_elements(("none",)))
converter("ScatterElements", since=11, attrs={"axis": 0})(_scatter_elements(("none",)))
converter("ScatterElements", since=16, attrs={"axis": 0, "reduction": "none"})(
    _scatter_elements(("none", "add", "mul")))
converter("ScatterElements", since=18, attrs={"axis": 0, "reduction": "none"})(
    _scatter_elements(("none", "add", "mul", "max", "min")))


def _scatter_nd(allowed: tuple[str, ...]) -> Callable[[NodeContext], Value]:
    def convert(ctx: NodeContext) -> Value:
        data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
        _check_indices(ctx, indices)
        ishape, dshape = indices.type.shape, data.type.shape
        if not ishape or ishape[-1] > len(dshape) or \
                updates.type.shape != ishape[:-1] + dshape[ishape[-1]:]:
            raise ctx.error(f"indices {ishape} and updates {updates.type.shape} do not fit "
                            f"data {dshape}")
        return ctx.emit("scatter_nd", data, indices, updates, reduction=_reduction(ctx, allowed))
    return convert


converter("ScatterND", since=11)(_scatter_nd(("none",)))
converter("ScatterND", since=16, attrs={"reduction": "none"})(_scatter_nd(("none", "add", "mul")))
converter("ScatterND", since=18, attrs={"reduction": "none"})(
    _scatter_nd(("none", "add", "mul", "max", "min")))


def _gather_nd(ctx: NodeContext) -> Value:
    data, indices = ctx.input(0), ctx.input(1)
    _check_indices(ctx, indices)
    b = int(ctx.attrs.get("batch_dims", 0))
    ishape, dshape = indices.type.shape, data.type.shape
    if not ishape or b < 0 or b + ishape[-1] > len(dshape) or ishape[:b] != dshape[:b]:
        raise ctx.error(f"indices {ishape} do not fit data {dshape} with batch_dims={b}")
    return ctx.emit("gather_nd", data, indices, batch_dims=b)


converter("GatherND", since=11)(_gather_nd)
converter("GatherND", since=12, attrs={"batch_dims": 0})(_gather_nd)


# ---- OneHot, EyeLike, Compress ------------------------------------------------------------------

@converter("OneHot", since=9, attrs={"axis": -1})
def _one_hot(ctx: NodeContext) -> Value:
    indices, values = ctx.input(0), ctx.input(2)
    depth = int(np.asarray(ctx.require_const(1, "depth")).reshape(-1)[0])
    if depth < 1:
        raise ctx.error(f"depth {depth} must be positive")
    if values.type.shape not in ((2,), (1, 2)) and int(np.prod(values.type.shape)) != 2:
        raise ctx.error(f"values must hold two elements [off, on], not {values.type.shape}")
    values = ctx.reshape(values, (2,))
    if indices.type.dtype not in ("float32", "float64", "int8", "int16", "int32", "int64",
                                  "uint8", "uint16", "uint32", "uint64"):
        raise ctx.error(f"indices of dtype {indices.type.dtype} are not supported")
    rank = len(indices.type.shape) + 1
    return ctx.emit("one_hot", indices, values, depth=depth,
                    axis=_axis(ctx, int(ctx.attrs["axis"]), rank))


@converter("EyeLike", since=9, attrs={"dtype": None, "k": 0})
def _eye_like(ctx: NodeContext) -> Value:
    from .proto import tensor_dtype_to_np_dtype
    from .shape import _shape_read

    _shape_read(ctx)   # its shape only: a Loop's grown value read so is not only appended to
    x = ctx.input(0)
    if len(x.type.shape) != 2:
        raise ctx.error(f"input must be 2-D, not {x.type.shape}")
    code = ctx.attrs["dtype"]
    dtype = tensor_dtype_to_np_dtype(int(code)) if code is not None \
        else np.dtype(x.type.dtype)
    rows, cols = x.type.shape
    return ctx.constant(np.eye(rows, cols, k=int(ctx.attrs["k"]), dtype=dtype), "eye")


@converter("Compress", since=9, attrs={"axis": None})
def _compress(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    axis = ctx.attrs["axis"]
    if axis is None:
        x = ctx.reshape(x, (product(x.type.shape),))
        axis = 0
    axis = _axis(ctx, int(axis), len(x.type.shape))
    if ctx.const(1) is None:   # a condition computed at run time: kept count bound at run time
        from .dynamic import compress_runtime
        return compress_runtime(ctx, x, axis)
    condition = ctx.const(1).reshape(-1).astype(bool)
    if condition.size > x.type.shape[axis]:
        raise ctx.error(f"condition has {condition.size} entries for an axis of "
                        f"{x.type.shape[axis]}")
    keep = np.nonzero(condition)[0].astype(np.int64)
    return ctx.emit("take", x, ctx.constant(keep, "keep"), axis=axis)


converter("Compress", since=11, attrs={"axis": None})(_compress)
