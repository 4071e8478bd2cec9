"""ONNX sequence operators inside a graph (SequenceEmpty, SequenceConstruct, SequenceInsert,
SequenceErase, SequenceAt, SequenceLength, ConcatFromSequence, SplitToSequence): a sequence
whose length is known at export is a Python list of the IR values of its elements
(``SeqValue``), so the bundle holds only tensors and nothing at run time knows a sequence was
there. Positions known at export pick list elements; positions fed or computed at run time
(``SequenceInsert(seq, x, pos)`` with ``pos`` a graph input) need elements of one shape, which
are then stacked into one tensor ``[n, ...]`` and moved by index (``take``), so the length stays
known at export whatever the position. A run-time position out of range wraps (as ``take``,
this project's Gather, does: never a read outside the tensor), where ONNX Runtime refuses the
run. Not handled (refused in one line): sequence-typed graph
inputs and outputs, sequences carried by a Loop or returned by an If, elements of different
shapes at a run-time position, a split into pieces whose sizes are known only at run time
except for its length (``SequenceLength``)."""

from __future__ import annotations

import numpy as np

from ...packager.ir.graph import Constant, Value
from ...packager.ir.sym import is_static
from .common import onnx_dtype
from .registry import NodeContext, converter


class SeqValue:
    """A sequence of tensors of one dtype whose length is known at export: its elements as IR
    values (``items``), or, after a change at a run-time position, stacked along a new first
    axis (``stack``, ``[n, ...]``). ``items`` None and ``stack`` None: only the length is known
    (a split by sizes fed at run time); ``unknown`` says why."""

    def __init__(self, dtype: str, items: list[Value] | None = None, stack: Value | None = None,
                 length: int | None = None, unknown: str = "", carried: bool = False,
                 appended_to: SeqValue | None = None) -> None:
        self.dtype = dtype
        self.items = items
        self.stack = stack
        # a stack's length may be a size known only at run time (a Loop's appended elements)
        self.length = (len(items) if items is not None else
                       stack.type.shape[0] if stack is not None else int(length or 0))
        self.unknown = unknown
        self.carried = carried   # a run-time Loop's carried sequence, in its body
        self.appended_to = appended_to   # this is ``appended_to`` with ``items`` appended

    def elements(self, ctx: NodeContext) -> list[Value]:
        if self.items is not None:
            return list(self.items)
        if self.stack is None:
            raise ctx.error(f"the sequence's elements are {self.unknown}")
        if not isinstance(self.length, int):
            raise ctx.error(f"the sequence's {self.length} elements (a Loop's, known at run "
                            "time) are taken only by ConcatFromSequence, SequenceAt and "
                            "SequenceLength")
        shape = tuple(self.stack.type.shape[1:])
        return [ctx.reshape(ctx.emit("take", self.stack,
                                     ctx.constant(np.array([k], np.int64), "at"), axis=0),
                            shape) for k in range(self.length)]

    def stacked(self, ctx: NodeContext, what: str) -> Value:
        """The elements as one tensor ``[n, ...]`` (they must share a shape known at export)."""
        if self.stack is not None:
            return self.stack
        items = self.elements(ctx)
        if not items:
            raise ctx.error(f"{what} of an empty sequence at a run-time position")
        shape = items[0].type.shape
        if any(v.type.shape != shape for v in items) or not is_static(shape):
            raise ctx.error(f"{what} at a position known only at run time needs elements of "
                            f"one shape known at export, not {[v.type.shape for v in items]}")
        rows = [ctx.reshape(v, (1,) + tuple(shape)) for v in items]
        return rows[0] if len(rows) == 1 else ctx.emit("concat", *rows, axis=0)


def _seq(ctx: NodeContext, i: int, append: bool = False) -> SeqValue:
    v = ctx.inputs[i] if i < len(ctx.inputs) else None
    if not isinstance(v, SeqValue):
        raise ctx.error(f"input {i} must be a sequence")
    if (v.carried or v.appended_to is not None) and not append:
        raise ctx.error("a sequence carried by a Loop whose trip count is known only at run "
                        "time may only be appended to in its body (SequenceInsert at the end, "
                        "once an iteration)")
    return v


def _length_tensor(ctx: NodeContext, seq: SeqValue) -> Value:
    """The sequence's length as an int64 tensor of shape (1,) (a size expression at run time)."""
    from .symvalue import SymValue, make, materialize

    v = make(ctx, np.array([seq.length], dtype=object), "int64", "length")
    return materialize(ctx.bb, v) if isinstance(v, SymValue) else v


def _position(ctx: NodeContext, i: int, n, what: str, end: bool) -> int | Value | None:
    """Input ``i`` (a position in a sequence of ``n``; absent: None), as an int where known at
    export (negative ones from the end, checked in range: ``end`` allows ``n``), else as a
    run-time int64 tensor of shape (1,), negative ones turned from the end."""
    if not ctx.has_input(i):
        return None
    data = ctx.const(i)
    top = n if end else n - 1
    if data is not None and isinstance(n, int):
        p = int(np.asarray(data).reshape(-1)[0])
        if not -n <= p <= top:
            raise ctx.error(f"{what} position {p} is out of range for a sequence of {n}")
        return p + n if p < 0 else p
    p = ctx.input(i)
    if p.type.dtype != "int64":
        p = ctx.emit("cast", p, dtype="int64")
    p = ctx.reshape(p, (1,))
    zero = ctx.constant(np.zeros(1, np.int64), "zero")
    size = ctx.constant(np.array([n], np.int64), "n") if isinstance(n, int) else n
    return ctx.emit("where", ctx.emit("less", p, zero), ctx.emit("add", p, size), p)


@converter("SequenceEmpty", since=11, attrs={"dtype": None})
def _empty(ctx: NodeContext) -> SeqValue:
    dtype = ctx.attrs["dtype"]
    return SeqValue(str(onnx_dtype(ctx, dtype)) if dtype is not None else "float32", [])


@converter("SequenceConstruct", since=11)
def _construct(ctx: NodeContext) -> SeqValue:
    items = [ctx.input(i) for i in range(ctx.num_inputs)]
    if any(v.type.dtype != items[0].type.dtype for v in items):
        raise ctx.error("the elements of a sequence must share a dtype")
    return SeqValue(items[0].type.dtype, items)


@converter("SequenceLength", since=11)
def _length(ctx: NodeContext) -> Value:
    seq = _seq(ctx, 0)
    if not isinstance(seq.length, int):
        return ctx.reshape(_length_tensor(ctx, seq), ())
    return ctx.constant(np.array(seq.length, np.int64), "length")


@converter("SequenceAt", since=11)
def _at(ctx: NodeContext) -> Value:
    seq = _seq(ctx, 0)
    if seq.length == 0:
        raise ctx.error("SequenceAt of an empty sequence")
    n = seq.length if isinstance(seq.length, int) else _length_tensor(ctx, seq)
    p = _position(ctx, 1, n, "SequenceAt", False)
    if isinstance(p, int):
        return seq.elements(ctx)[p]
    stack = seq.stacked(ctx, "SequenceAt")
    return ctx.reshape(ctx.emit("take", stack, p, axis=0), tuple(stack.type.shape[1:]))


@converter("SequenceInsert", since=11)
def _insert(ctx: NodeContext) -> SeqValue:
    seq, x = _seq(ctx, 0, append=not ctx.has_input(2)), ctx.input(1)
    if seq.length and x.type.dtype != seq.dtype:
        raise ctx.error(f"inserting a {x.type.dtype} tensor into a sequence of {seq.dtype}")
    if seq.carried:   # a run-time Loop's carried sequence: this iteration's element
        return SeqValue(x.type.dtype, [x], appended_to=seq)
    if seq.appended_to is not None:
        _seq(ctx, 0)   # refused: one element an iteration
    n = seq.length
    if not isinstance(n, int):
        raise ctx.error("inserting into a Loop's sequence after the loop is not supported")
    p = _position(ctx, 2, n, "SequenceInsert", True)
    if p is None or isinstance(p, int):
        items = seq.elements(ctx)
        items.insert(n if p is None else p, x)
        return SeqValue(x.type.dtype, items)
    if n == 0:   # the only position in range is 0
        return SeqValue(x.type.dtype, [x])
    stack = seq.stacked(ctx, "SequenceInsert")
    if x.type.shape != tuple(stack.type.shape[1:]):
        raise ctx.error(f"SequenceInsert at a position known only at run time needs elements "
                        f"of one shape, not {x.type.shape} into {stack.type.shape[1:]}")
    grown = ctx.emit("concat", stack, ctx.reshape(x, (1,) + tuple(x.type.shape)), axis=0)
    idx = ctx.constant(np.arange(n + 1, dtype=np.int64), "index")
    last = ctx.constant(np.array([n], np.int64), "last")
    before = ctx.emit("less", idx, p)
    src = ctx.emit("where", before, idx, ctx.emit(
        "where", ctx.emit("equal", idx, p), last,
        ctx.emit("subtract", idx, ctx.constant(np.ones(1, np.int64), "one"))))
    return SeqValue(x.type.dtype, stack=ctx.emit("take", grown, src, axis=0))


@converter("SequenceErase", since=11)
def _erase(ctx: NodeContext) -> SeqValue:
    seq = _seq(ctx, 0)
    n = seq.length
    if not isinstance(n, int):
        raise ctx.error("erasing from a Loop's sequence after the loop is not supported")
    if n == 0:
        raise ctx.error("SequenceErase of an empty sequence")
    p = _position(ctx, 1, n, "SequenceErase", False)
    if p is None or isinstance(p, int):
        items = seq.elements(ctx)
        del items[n - 1 if p is None else p]
        return SeqValue(seq.dtype, items)
    stack = seq.stacked(ctx, "SequenceErase")
    if n == 1:
        return SeqValue(seq.dtype, [])
    idx = ctx.constant(np.arange(n - 1, dtype=np.int64), "index")
    src = ctx.emit("where", ctx.emit("less", idx, p), idx,
                   ctx.emit("add", idx, ctx.constant(np.ones(1, np.int64), "one")))
    return SeqValue(seq.dtype, stack=ctx.emit("take", stack, src, axis=0))


@converter("ConcatFromSequence", since=11, attrs={"axis": None, "new_axis": 0})
def _concat_from(ctx: NodeContext) -> Value:
    seq = _seq(ctx, 0)
    if ctx.attrs["axis"] is None:
        raise ctx.error("ConcatFromSequence needs its axis attribute")
    if not isinstance(seq.length, int):   # a Loop's elements, stacked: moved, not split
        return _concat_stack(ctx, seq.stack, int(ctx.attrs["axis"]),
                             bool(ctx.attrs["new_axis"]))
    items = seq.elements(ctx)
    if not items:
        raise ctx.error("ConcatFromSequence of an empty sequence")
    rank = len(items[0].type.shape)
    new = bool(ctx.attrs["new_axis"])
    top = rank + 1 if new else rank
    axis = int(ctx.attrs["axis"])
    if not -top <= axis < top:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis %= top
    if new:
        items = [ctx.reshape(v, tuple(v.type.shape[:axis]) + (1,) + tuple(v.type.shape[axis:]))
                 for v in items]
    if len(items) == 1:
        return items[0]
    if all(isinstance(v, Constant) for v in items):
        return ctx.constant(np.concatenate([v.data for v in items], axis=axis), "concat")
    return ctx.emit("concat", *items, axis=axis)


def _concat_stack(ctx: NodeContext, stack: Value, axis: int, new: bool) -> Value:
    """ConcatFromSequence of elements stacked along axis 0 (``[n, d_0, ...]``): the stack with
    its first axis moved to ``axis`` (``new``), or merged into ``d_axis``."""
    shape = tuple(stack.type.shape)
    rank = len(shape) - 1
    top = rank + 1 if new else rank
    if not -top <= axis < top:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis %= top
    if axis:
        perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank + 1))
        stack = ctx.emit("transpose", stack, axes=tuple(perm))
    if new:
        return stack
    moved = tuple(stack.type.shape)
    return ctx.reshape(stack, moved[:axis] + (moved[axis] * moved[axis + 1],) + moved[axis + 2:])


@converter("SplitToSequence", since=11, attrs={"axis": 0, "keepdims": 1})
def _split_to(ctx: NodeContext) -> SeqValue:
    from .index import _axis, _slice_axis

    x = ctx.input(0)
    rank = len(x.type.shape)
    axis = _axis(ctx, int(ctx.attrs["axis"]), rank)
    total = x.type.shape[axis]
    dtype = x.type.dtype
    if ctx.has_input(1):
        sizes = ctx.const(1)
        if sizes is None:
            split = ctx.input(1)
            if len(split.type.shape) == 1 and is_static(split.type.shape):
                return SeqValue(dtype, length=int(split.type.shape[0]),
                                unknown="pieces of sizes known only at run time")
            raise ctx.error("split (input 1) must be a constant known at export, or a 1-D "
                            "tensor of a length known at export")
        sizes = np.asarray(sizes).astype(np.int64)
        if sizes.ndim == 0:
            if not isinstance(total, int):
                raise ctx.error(f"splitting a run-time extent {total} into pieces of "
                                f"{int(sizes)} needs its size known at export")
            chunk = int(sizes)
            sizes = [min(chunk, total - k) for k in range(0, total, chunk)]
        else:
            sizes = sizes.tolist()
            if isinstance(total, int) and sum(sizes) != total:
                raise ctx.error(f"split sizes {sizes} do not add up to {total} on axis {axis}")
            if not isinstance(total, int):
                ctx.assume("eq", sum(sizes), total, f"split sizes {sizes}")
        items, start = [], 0
        for size in sizes:
            items.append(_slice_axis(ctx, x, axis, start, start + int(size)))
            start += int(size)
        return SeqValue(dtype, items)
    if not isinstance(total, int):
        raise ctx.error(f"splitting a run-time extent {total} into pieces of 1 needs its size "
                        "known at export")
    keep = bool(ctx.attrs["keepdims"])
    shape = tuple(x.type.shape[:axis]) + tuple(x.type.shape[axis + 1:])
    items = []
    for k in range(total):
        piece = _slice_axis(ctx, x, axis, k, k + 1)
        items.append(piece if keep else ctx.reshape(piece, shape))
    return SeqValue(dtype, items)


def refuse_sequences(ctx: NodeContext) -> None:
    """Any other operator given a sequence: refused in one line."""
    for i, v in enumerate(ctx.inputs):
        if isinstance(v, SeqValue):
            raise ctx.error(f"input {i} is a sequence, which only the sequence operators "
                            "take here")


SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceLength", "SequenceAt",
                          "SequenceInsert", "SequenceErase", "ConcatFromSequence",
                          "SplitToSequence"})


