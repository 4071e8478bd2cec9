"""Converters for indexing and rearranging ONNX operators on run-time tensors: GatherElements,
Split, Tile, CumSum, ArgMax/ArgMin, Trilu, DepthToSpace/SpaceToDepth."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ...packager.ir.graph import Value
from .registry import NodeContext, converter


@converter("GatherElements", since=11, attrs={"axis": 0})
def _gather_elements(ctx: NodeContext) -> Value:
    x, idx = ctx.input(0), ctx.input(1)
    rank = len(x.type.shape)
    axis = int(ctx.attrs["axis"])
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return ctx.emit("gather_elements", x, idx, axis=axis % rank)


# ---- Split --------------------------------------------------------------------------------------

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
    sizes = ctx.require_const(1, "split").reshape(-1).tolist() if ctx.has_input(1) else None
    return _split(ctx, sizes, None)


@converter("Split", since=18, attrs={"axis": 0, "num_outputs": None})
def _split_v18(ctx: NodeContext) -> list[Value]:
    sizes = ctx.require_const(1, "split").reshape(-1).tolist() if ctx.has_input(1) else None
    n = ctx.attrs["num_outputs"]
    return _split(ctx, sizes, int(n) if n is not None else None)


# ---- Tile, CumSum, ArgMax/ArgMin ----------------------------------------------------------------

@converter("Tile", since=6)
def _tile(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    repeats = tuple(int(r) for r in ctx.require_const(1, "repeats").reshape(-1))
    if len(repeats) != len(x.type.shape) or any(r < 0 for r in repeats):
        raise ctx.error(f"repeats {list(repeats)} do not fit shape {x.type.shape}")
    if all(r == 1 for r in repeats):
        return x
    return ctx.emit("tile", x, repeats=repeats)


@converter("CumSum", since=11, attrs={"exclusive": 0, "reverse": 0})
def _cumsum(ctx: NodeContext) -> Value:
    x = ctx.input(0)
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
    k = int(ctx.require_const(1, "k").reshape(())) if ctx.has_input(1) else 0
    rows, cols = x.type.shape[-2:]
    keep = np.triu(np.ones((rows, cols), bool), k) if ctx.attrs["upper"] \
        else np.tril(np.ones((rows, cols), bool), k)
    zeros = ctx.constant(np.zeros((1,) * len(x.type.shape), x.type.dtype), "zero")
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
