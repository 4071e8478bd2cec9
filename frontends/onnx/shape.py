"""Converters for shape and data-movement ONNX operators, and for the constant-only operators
that shape arithmetic uses (Shape, Gather, Cast, Slice...): those are computed with numpy at
import, so ``Shape -> Gather -> Concat -> Reshape`` chains fold away."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ...packager.ir.graph import Constant, Value
from ...packager.ir.sym import SymExpr, dim, is_static
from ...packager.ir.sym import product as sym_product
from ...packager.ops.registry import broadcast_shape
from . import quant, symvalue
from .common import cast_to, onnx_dtype
from .registry import NodeContext, converter
from . import valueinputs
from .valueinputs import read_as


# ---- reshapes -----------------------------------------------------------------------------------

@converter("Flatten", since=1, attrs={"axis": 1})
def _flatten(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    shape = x.type.shape
    axis = int(ctx.attrs["axis"])
    if not -len(shape) <= axis <= len(shape):
        raise ctx.error(f"axis {axis} is out of range for shape {shape}")
    if axis < 0:
        axis += len(shape)
    return ctx.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))


def reshape_target(ctx: NodeContext, in_shape: Sequence[int], shape: Sequence[int],
                   allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's target: 0 copies the input's dim (unless ``allowzero``), -1 is inferred."""
    out = []
    for i, d in enumerate(dim(d) for d in shape):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                raise ctx.error(f"shape {list(shape)} copies dim {i} of a rank-{len(in_shape)} "
                                "input")
            d = in_shape[i]
        out.append(d)
    if out.count(-1) > 1:
        raise ctx.error(f"shape {list(shape)} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(in_shape)
        if known == 0:
            raise ctx.error(f"cannot reshape {tuple(in_shape)} to {list(shape)}")
        rest = total % known if isinstance(total, SymExpr) else \
            (0 if isinstance(known, SymExpr) and total == known else total % known)
        if isinstance(rest, SymExpr):   # divisible for some sizes only: checked at run time
            ctx.assume("eq", total // known * known, total, f"reshape to {list(shape)}")
        elif rest:
            raise ctx.error(f"cannot reshape {tuple(in_shape)} to {list(shape)}")
        out[out.index(-1)] = total // known
    if any(d < 0 for d in out):
        raise ctx.error(f"cannot reshape {tuple(in_shape)} to {list(shape)}")
    if math.prod(out) != math.prod(in_shape):
        if is_static(list(out) + list(in_shape)):
            raise ctx.error(f"cannot reshape {tuple(in_shape)} to {list(shape)}")
        # equal element counts for some sizes only: checked at run time
        ctx.assume("eq", math.prod(out), math.prod(in_shape), f"reshape to {list(shape)}")
    return tuple(out)


@converter("Reshape", since=1, attrs={"shape": None})
def _reshape_v1(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.reshape(x, reshape_target(ctx, x.type.shape, ctx.attrs["shape"] or [], False))


@converter("Reshape", since=5, attrs={"allowzero": 0})
def _reshape_v5(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    shape = ctx.dims(1, "the target shape")
    read_as(ctx, 1, "reshape", list(x.type.shape), int(ctx.attrs["allowzero"]))
    return ctx.reshape(x, reshape_target(ctx, x.type.shape, shape, bool(ctx.attrs["allowzero"])))


def _normalized_axes(ctx: NodeContext, axes: Sequence[int], rank: int) -> list[int]:
    out = []
    for a in axes:
        if not -rank <= int(a) < rank:
            raise ctx.error(f"axis {a} is out of range for rank {rank}")
        out.append(int(a) % rank)
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    return out


def _unsqueeze(ctx: NodeContext, axes: Sequence[int]) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape) + len(axes)
    new_axes = set(_normalized_axes(ctx, axes, rank))
    dims = iter(x.type.shape)
    return ctx.reshape(x, tuple(1 if d in new_axes else next(dims) for d in range(rank)))


def _squeeze(ctx: NodeContext, axes: Sequence[int] | None) -> Value:
    x = ctx.input(0)
    shape = x.type.shape
    if axes is None or len(axes) == 0:
        # every dim of size 1, and a size the model holds at 1 (a state input exported at
        # batch 1 beside an open batch: recurrence.py), as ONNX Runtime drops it at run time
        ones = {r[1] for r in ctx.bb.mod.relations if r[0] == "eq" and r[2] == 1}
        drop = {d for d, n in enumerate(shape) if n == 1 or n in ones}
    else:
        drop = set(_normalized_axes(ctx, axes, len(shape)))
        wrong = [d for d in drop if shape[d] != 1 and is_static([shape[d]])]
        if wrong:
            raise ctx.error(f"cannot squeeze axes {wrong} of shape {shape}: size is not 1")
        for d in sorted(drop):  # a size expression that is 1 for some sizes (a recognizer's
            if shape[d] != 1:   # height after its strided convs): checked at run time
                ctx.assume("eq", shape[d], 1, f"squeeze of axis {d} of {shape}")
    return ctx.reshape(x, tuple(n for d, n in enumerate(shape) if d not in drop))


@converter("Unsqueeze", since=1, attrs={"axes": None})
def _unsqueeze_v1(ctx: NodeContext) -> Value:
    return _unsqueeze(ctx, ctx.attrs["axes"] or [])


@converter("Unsqueeze", since=13)
def _unsqueeze_v13(ctx: NodeContext) -> Value:
    if valueinputs.run_time_axes(ctx, 1) is not None:   # axes fed at run time
        return valueinputs.unsqueeze(ctx, ctx.input(0))
    return _unsqueeze(ctx, ctx.require_const(1, "axes").reshape(-1).tolist())


@converter("Squeeze", since=1, attrs={"axes": None})
def _squeeze_v1(ctx: NodeContext) -> Value:
    return _squeeze(ctx, ctx.attrs["axes"])


@converter("Squeeze", since=13)
def _squeeze_v13(ctx: NodeContext) -> Value:
    if valueinputs.run_time_axes(ctx, 1) is not None:   # axes fed at run time
        return valueinputs.squeeze(ctx, ctx.input(0))
    axes = ctx.require_const(1, "axes").reshape(-1).tolist() if ctx.has_input(1) else None
    return _squeeze(ctx, axes)


# ---- data movement ------------------------------------------------------------------------------

@converter("Transpose", since=1, attrs={"perm": None})
def _transpose(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape)
    perm = ctx.attrs["perm"]
    perm = list(reversed(range(rank))) if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of {rank} axes")
    if perm == list(range(rank)):
        return x
    return ctx.emit("transpose", x, axes=tuple(perm))


@converter("Concat", since=1, attrs={"axis": 1})
def _concat(ctx: NodeContext) -> Value:
    values = [ctx.input(i) for i in range(ctx.num_inputs) if ctx.has_input(i)]
    axis = int(ctx.attrs["axis"])
    if len(values) == 1:
        return values[0]
    if all(isinstance(v, Constant) for v in values):  # shape arithmetic, any dtype
        return ctx.constant(np.concatenate([v.data for v in values], axis=axis), "concat")
    return ctx.emit("concat", *values, axis=axis)


@converter("BitCast", since=26, attrs={"to": None})
def _bitcast(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    dtype = str(onnx_dtype(ctx, ctx.attrs["to"]))
    if dtype == x.type.dtype:
        return x
    if isinstance(x, Constant):
        return ctx.constant(np.ascontiguousarray(x.data).view(dtype), "bitcast")
    return ctx.emit("bitcast", x, dtype=dtype)


@converter("Identity", since=1)
def _identity(ctx: NodeContext) -> Value:
    return ctx.input(0)


@converter("Expand", since=8)
def _expand(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    shape = ctx.dims(1, "the target shape")
    read_as(ctx, 1, "expand", list(x.type.shape))
    relations: list = []
    try:
        out = tuple(broadcast_shape(x.type.shape, tuple(shape), relations=relations))
    except ValueError:
        raise ctx.error(f"shape {x.type.shape} does not broadcast to {shape}") from None
    ctx.bb.assume(relations)
    if out == x.type.shape:
        return x
    if isinstance(x, Constant) and is_static(out):
        return ctx.constant(np.broadcast_to(x.data, out).copy(), "expand")
    if len(out) > len(x.type.shape):
        x = ctx.reshape(x, (1,) * (len(out) - len(x.type.shape)) + x.type.shape)
    return ctx.emit("broadcast_to", x, shape=out)


def _pad(ctx: NodeContext, pads: Sequence[int], mode: str, fill: float,
         axes: Sequence[int] | None = None) -> Value:
    """Pad ``x`` (constant, edge, reflect or wrap); negative pads crop."""
    x = ctx.input(0)
    rank = len(x.type.shape)
    axes = list(range(rank)) if axes is None else _normalized_axes(ctx, axes, rank)
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {list(pads)} should have {2 * len(axes)} values")
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[axis], full[axis + rank] = dim(pads[i]), dim(pads[i + len(axes)])
    if is_static(full) and not any(full):
        return x
    return ctx.emit("pad", x, pads=tuple(full), mode=mode, value=fill)


@converter("Pad", since=1, attrs={"paddings": None, "mode": "constant", "value": 0.0})
def _pad_v1(ctx: NodeContext) -> Value:
    return _pad(ctx, ctx.attrs["paddings"] or [], ctx.attrs["mode"], float(ctx.attrs["value"]))


@converter("Pad", since=2, attrs={"pads": None, "mode": "constant", "value": 0.0})
def _pad_v2(ctx: NodeContext) -> Value:
    return _pad(ctx, ctx.attrs["pads"] or [], ctx.attrs["mode"], float(ctx.attrs["value"]))


@converter("Pad", since=11, attrs={"mode": "constant"})
def _pad_v11(ctx: NodeContext) -> Value:
    pads_in = valueinputs.run_time_axes(ctx, 1)
    axes_in = valueinputs.run_time_axes(ctx, 3) if ctx.has_input(3) else None
    if pads_in is not None and (axes_in is not None or not ctx.has_input(3)):   # fed at run time
        return valueinputs.pad_run_time(ctx, ctx.input(0), ctx.attrs["mode"], pads_in, axes_in)
    # pads computed from sizes known at run time (``Shape`` of a counted tensor): size
    # expressions, read by the kernel from the sizes array
    pads = symvalue.dims_of(ctx.inputs[1]) if isinstance(ctx.inputs[1], symvalue.SymValue) \
        else ctx.require_const(1, "pads").reshape(-1).tolist()
    fill = 0.0
    if ctx.has_input(2):
        value = ctx.require_const(2, "constant_value")
        fill = float(value.reshape(-1)[0]) if value.size else 0.0
    axes = ctx.require_const(3, "axes").reshape(-1).tolist() if ctx.has_input(3) else None
    return _pad(ctx, pads, ctx.attrs["mode"], fill, axes)


# ---- constants and shape arithmetic (computed at import) ----------------------------------------

_CONSTANT_ATTRS: dict[str, Any] = {
    "value": None, "value_float": None, "value_floats": None, "value_int": None,
    "value_ints": None, "sparse_value": None, "value_string": None, "value_strings": None}


@converter("Constant", since=1, attrs=_CONSTANT_ATTRS)
def _constant(ctx: NodeContext) -> Value:
    a = ctx.attrs
    if a["value"] is not None:
        return ctx.constant(a["value"], "const")
    if a["value_float"] is not None:
        return ctx.constant(np.array(a["value_float"], dtype=np.float32), "const")
    if a["value_floats"] is not None:
        return ctx.constant(np.array(a["value_floats"], dtype=np.float32), "const")
    if a["value_int"] is not None:
        return ctx.constant(np.array(a["value_int"], dtype=np.int64), "const")
    if a["value_ints"] is not None:
        return ctx.constant(np.array(a["value_ints"], dtype=np.int64), "const")
    if a["sparse_value"] is not None:
        raise ctx.error("sparse_value is not supported")
    raise ctx.error("string constants are not supported")


def _shape_read(ctx: NodeContext) -> None:
    """Note that input 0's shape is read at import (no binding reads the tensor itself): a
    Loop's body converted by ``loops.emit_vm_loop`` must not treat a carried value whose shape
    it reads as one that only grows (its shape then is the initial one's)."""
    seen = getattr(ctx.bb, "shapes_read", None)
    if seen is not None:
        seen.add(id(ctx.input(0)))


@converter("Shape", since=1, attrs={"start": 0, "end": None})
def _shape(ctx: NodeContext) -> Value:
    _shape_read(ctx)
    shape = ctx.input(0).type.shape
    start, end = ctx.attrs["start"], ctx.attrs["end"]
    # symbolic dims make a SymValue: shape arithmetic on it folds at import (symvalue.py)
    return symvalue.make(ctx, np.array(list(shape[start:end]), dtype=object), "int64", "shape")


@converter("Size", since=1)
def _size(ctx: NodeContext) -> Value:
    _shape_read(ctx)
    return symvalue.make(ctx, np.array(sym_product(ctx.input(0).type.shape), dtype=object),
                         "int64", "size")


@converter("Gather", since=1, attrs={"axis": 0})
def _gather(ctx: NodeContext) -> Value:
    data, indices = ctx.const(0), ctx.const(1)
    x = ctx.input(0)
    axis = int(ctx.attrs["axis"])
    if not -len(x.type.shape) <= axis < len(x.type.shape):
        raise ctx.error(f"axis {axis} is out of range for shape {x.type.shape}")
    size = x.type.shape[axis]
    if indices is not None and isinstance(size, SymExpr):   # a run-time size: at least 1
        outside = any(bool(size <= int(i)) or bool(size + int(i) < 0)
                      for i in np.asarray(indices).reshape(-1))
    else:
        outside = indices is not None and (np.any(indices >= size) or np.any(indices < -size))
    if outside:
        raise ctx.error(f"indices {indices.tolist()} are out of range for size {size}")
    if data is not None and indices is not None:
        return ctx.constant(np.take(data, indices.astype(np.int64), axis=axis), "gather")
    return ctx.emit("take", x, ctx.input(1), axis=axis % len(x.type.shape))


@converter("Cast", since=1, attrs={"to": None, "saturate": 1, "round_mode": "up"})
def _cast(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    dtype = onnx_dtype(ctx, ctx.attrs["to"])
    saturate = bool(ctx.attrs["saturate"])
    if isinstance(x, Constant):
        return ctx.constant(quant.fold_cast(x.data, dtype, saturate), "cast")
    return cast_to(ctx, quant.saturate_for(ctx, x, str(dtype), saturate), dtype)


@converter("ConstantOfShape", since=9, attrs={"value": None})
def _constant_of_shape(ctx: NodeContext) -> Value:
    shape = ctx.dims(0, "the shape")
    read_as(ctx, 0, "dims")
    fill = ctx.attrs["value"]
    fill = np.zeros(1, np.float32) if fill is None else fill.reshape(-1)
    if not is_static(shape):   # sizes known at run time
        value = fill[0].item()
        return ctx.bb.emit_op("full", shape=tuple(shape), value=value, dtype=str(fill.dtype))
    return ctx.constant(np.full(shape, fill[0], dtype=fill.dtype), "filled")


@converter("Range", since=11)
def _range(ctx: NodeContext) -> Value:
    sym = [symvalue.dims_of(ctx.input(i)) for i in range(3)]
    if any(isinstance(v, symvalue.SymValue) for v in ctx.inputs[:3]) \
            and all(d is not None and len(d) == 1 for d in sym):
        start, limit, delta = (d[0] for d in sym)
        if not isinstance(delta, int) or delta == 0:
            raise ctx.error("delta must be a nonzero constant when the limit is a run-time size")
        span = limit - start if delta > 0 else start - limit
        step = abs(delta)
        length = (span + step - 1) // step
        return ctx.bb.emit_op("arange", start=start, delta=delta, length=length,
                              dtype=ctx.input(0).type.dtype)
    start, limit, delta = (ctx.require_const(i, n).reshape(())
                           for i, n in enumerate(("start", "limit", "delta")))
    return ctx.constant(np.arange(start, limit, delta, dtype=start.dtype), "range")


def _slice_const(ctx: NodeContext, starts: Sequence[int], ends: Sequence[int],
                 axes: Sequence[int] | None, steps: Sequence[int] | None) -> Value:
    data = ctx.const(0) if is_static(list(starts) + list(ends)) else None
    if data is None:
        x = ctx.input(0)
        whole = _is_whole_slice(x.type.shape, starts, ends, axes, steps)
        if whole:
            return x
        rank = len(x.type.shape)
        axes = list(range(len(starts))) if axes is None else [int(a) % rank for a in axes]
        steps = [1] * len(starts) if steps is None else [int(st) for st in steps]
        counted = set(ctx.bb.mod.dynamic_sizes)
        along = [k for k, a in enumerate(axes) if x.type.shape[a] is not None
                 and isinstance(x.type.shape[a], SymExpr) and x.type.shape[a].variables()
                 & counted and isinstance(starts[k], int) and isinstance(ends[k], int)]
        if along:   # axes whose extents kernels counted: each slice's length is counted too
            for k in along:
                x = _slice_counted(ctx, x, axes[k], starts[k], ends[k], steps[k])
            keep = [k for k in range(len(axes)) if k not in along]
            if not keep:
                return x
            starts, ends = [starts[k] for k in keep], [ends[k] for k in keep]
            axes, steps = [axes[k] for k in keep], [steps[k] for k in keep]
        return ctx.emit("strided_slice", x, starts=tuple(dim(v) for v in starts),
                        ends=tuple(dim(v) for v in ends), axes=tuple(axes), steps=tuple(steps))
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        # numpy clamps out-of-range starts and ends the way ONNX does (INT64_MAX means "to end")
        index[a] = slice(int(s), int(e), st)
    return ctx.constant(np.ascontiguousarray(data[tuple(index)]), "slice")


# a counted slice's constant span past this many elements is "to the end" (``x[1:2**40]``, as
# exporters write it): its length is bound by the axis's extent, not planned at the span
SPAN_BOUND = 1 << 24


def _slice_counted(ctx: NodeContext, x: Value, axis: int, start: int, end: int,
                   step: int) -> Value:
    """``x[start:end:step]`` along an axis whose extent a kernel counted at run time (the rows
    NonMaxSuppression or NonZero selected): the slice's first index and length are computed
    from that count (ONNX's clamping), the length bound as a new counted size (at most the
    slice's constant span, else the axis's extent), and the rows taken by index."""
    if step == 0:
        raise ctx.error("steps must not be 0")
    bb = ctx.bb
    n = x.type.shape[axis]
    first, length = (bb.emit_op("slice_span", x, axis=axis, start=start, end=end, step=step,
                                part=part) for part in ("first", "length"))
    bound = n
    if step > 0 and 0 <= start <= end < 2 ** 62:
        bound = -(-(end - start) // step)
    elif step < 0 and 0 <= end <= start < 2 ** 62:
        bound = -(-(start - end) // -step)
    if bound is not n and bound > SPAN_BOUND:   # "to the end" written as a large number
        bound = n
    after, d = bb.bind_size(length, bound, "sliced")
    rows = bb.emit_op("counted_range", first, after, count=d, step=step)
    return ctx.emit("take", x, rows, axis=axis)


def _slice_computed(ctx: NodeContext, axes: Sequence[int] | None,
                    steps: Sequence[int] | None) -> Value:
    """``x[starts:ends:steps]`` with starts and ends computed at run time (a Slice by a Loop's
    iteration number inside its body): per axis, a kernel computes the first index and length
    from the tensors as ONNX clamps them (``slice_span_at``), the length is bound as a counted
    size (at most the axis's extent) and the elements taken by index."""
    from .symvalue import SymValue, materialize

    bb = ctx.bb
    x = ctx.input(0)
    rank = len(x.type.shape)
    bounds = []
    for i in (1, 2):
        v = ctx.input(i)
        v = materialize(bb, v) if isinstance(v, SymValue) else v
        if len(v.type.shape) != 1 or not isinstance(v.type.shape[0], int):
            raise ctx.error(f"input {i} must be a vector of known length, not {v.type}")
        bounds.append(v if v.type.dtype == "int64" else ctx.emit("cast", v, dtype="int64"))
    starts, ends = bounds
    k = starts.type.shape[0]
    if ends.type.shape[0] != k or (axes is not None and len(axes) != k) or \
            (steps is not None and len(steps) != k):
        raise ctx.error("starts, ends, axes and steps must have the same length")
    axes = list(range(k)) if axes is None else [int(a) % rank for a in axes]
    steps = [1] * k if steps is None else [int(st) for st in steps]
    for j, (axis, step) in enumerate(zip(axes, steps)):
        if step == 0:
            raise ctx.error("steps must not be 0")
        first, length = (bb.emit_op("slice_span_at", x, starts, ends, index=j, axis=axis,
                                    step=step, part=part) for part in ("first", "length"))
        after, d = bb.bind_size(length, x.type.shape[axis], "sliced")
        rows = bb.emit_op("counted_range", first, after, count=d, step=step)
        x = ctx.emit("take", x, rows, axis=axis)
    return x


def _is_whole_slice(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int],
                    axes: Sequence[int] | None, steps: Sequence[int] | None) -> bool:
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else list(steps)
    def reaches_end(e: object, n: object) -> bool:
        if isinstance(e, SymExpr) or isinstance(n, SymExpr):
            if isinstance(e, int) and e >= 2 ** 62:
                return True
            return e == n or isinstance(e - n, int) and e - n >= 0
        return int(e) >= n

    return all(isinstance(s, int) and s == 0 and reaches_end(e, shape[int(a)]) and int(st) == 1
               for a, s, e, st in zip(axes, starts, ends, steps))


@converter("Slice", since=1, attrs={"starts": None, "ends": None, "axes": None})
def _slice_v1(ctx: NodeContext) -> Value:
    a = ctx.attrs
    return _slice_const(ctx, a["starts"] or [], a["ends"] or [], a["axes"], None)


@converter("Slice", since=10)
def _slice_v10(ctx: NodeContext) -> Value:
    def ints(i: int, what: str) -> list[int] | None:
        if not ctx.has_input(i):
            return None
        return ctx.dims(i, what)

    parts = valueinputs.slice_inputs(ctx)
    if parts is not None:   # starts and ends (axes, steps) fed at run time
        return valueinputs.slice_run_time(ctx, ctx.input(0), parts)
    if any(symvalue.dims_of(ctx.inputs[i]) is None and ctx.const(i) is None for i in (1, 2)):
        # computed at run time (a Slice by a Loop's iteration number)
        return _slice_computed(ctx, ints(3, "axes"), ints(4, "steps"))
    starts, ends = ints(1, "starts"), ints(2, "ends")
    return _slice_const(ctx, starts or [], ends or [], ints(3, "axes"), ints(4, "steps"))
