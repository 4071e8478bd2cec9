"""Shape computations on symbolic dims: the values exporters compute from ``Shape``.

Exporters write the target of a Reshape, the ends of a Slice, the sizes of a Resize as small
integer tensors computed in the graph (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``).
With static shapes those fold to constants at import. With symbolic dims they fold to a
``SymValue``: a small tensor whose elements are dims (``int`` or ``SymExpr``), so a Reshape gets
``(batch, seq, 4, 8)`` and the kernels compute the sizes at run time from the size variables.

The importer keeps a SymValue as long as the nodes reading it are shape arithmetic it can fold
(``fold``) or operators that take a shape (Reshape, Expand, ConstantOfShape, Range, Slice,
Resize, Tile: ``SHAPE_INPUTS``). Any other reader gets it as a run-time tensor
(``materialize``: an op whose kernel writes the values from the size variables).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ...packager.ir.graph import Constant, TensorType, Value
from ...packager.ir.sym import SymbolicShapeError, SymExpr
from .dtypes import UnsupportedCast, numpy_dtype

# Which inputs of an operator may stay symbolic (the converter reads them with ctx.dims).
SHAPE_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "ConstantOfShape": frozenset({0}),
    "Range": frozenset({0, 1, 2}), "Slice": frozenset({1, 2, 3, 4}),
    "Resize": frozenset({1, 2, 3}), "Tile": frozenset({1}), "Upsample": frozenset({1}),
    "Split": frozenset({1}), "HannWindow": frozenset({0}), "HammingWindow": frozenset({0}),
    "BlackmanWindow": frozenset({0}), "Loop": frozenset({0}), "Pad": frozenset({1}),
}


class SymValue(Value):
    """A small integer (or integer-valued float) tensor whose elements are dims."""

    def __init__(self, name: str, data: np.ndarray, dtype: str) -> None:
        self.name = name
        self.data = data        # dtype object: int or SymExpr elements
        self.dtype = dtype

    @property
    def type(self) -> TensorType:  # type: ignore[override]
        return TensorType(tuple(self.data.shape), self.dtype)

    def __repr__(self) -> str:
        return f"SymValue({self.name}, {self.data.tolist()}, {self.dtype})"


def is_dim_like(x: Any) -> bool:
    return isinstance(x, SymExpr) or isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def known(v: Value | None) -> np.ndarray | None:
    """``v``'s elements as an object array when known at import (a SymValue, or an integer or
    integer-valued constant), else None."""
    if isinstance(v, SymValue):
        return v.data
    if isinstance(v, Constant) and v.data.size <= 64 and v.data.dtype.kind in "iub":
        return np.array(v.data.tolist(), dtype=object).reshape(v.data.shape)
    if isinstance(v, Constant) and v.data.size <= 64 and v.data.dtype.kind == "f" \
            and np.all(np.isfinite(v.data)) and np.all(v.data == np.round(v.data)):
        return np.array([int(x) for x in v.data.reshape(-1)], dtype=object).reshape(v.data.shape)
    return None


def make(ctx: Any, data: Any, dtype: str, name: str = "shape") -> Value:
    """A Constant when every element folded to an int, else a SymValue."""
    data = np.asarray(data, dtype=object) if not isinstance(data, np.ndarray) else data
    if data.dtype != object:
        data = np.array(data.tolist(), dtype=object).reshape(data.shape)
    flat = data.reshape(-1)
    if all(not isinstance(x, SymExpr) for x in flat):
        return ctx.constant(np.array([int(x) if dtype != "bool" else bool(x) for x in flat],
                                     dtype=dtype).reshape(data.shape), name)
    return SymValue(ctx.bb.fresh_name(name), data, dtype)


def _ints(v: np.ndarray) -> list[int]:
    return [int(x) for x in v.reshape(-1)]


def _sym_eq(a: Any, b: Any) -> bool:
    d = a - b
    if isinstance(d, int):
        return d == 0
    lb = d.lower_bound()
    if lb is not None and lb > 0:
        return False
    lb = (-d).lower_bound() if isinstance(-d, SymExpr) else None
    if lb is not None and lb > 0:
        return False
    raise SymbolicShapeError(f"cannot tell whether {a} == {b} at export")


def _cmp_max(a: Any, b: Any) -> Any:
    if not isinstance(a, SymExpr) and not isinstance(b, SymExpr):
        return max(a, b)
    return a if a >= b else b   # raises SymbolicShapeError when undecidable


def _cmp_min(a: Any, b: Any) -> Any:
    if not isinstance(a, SymExpr) and not isinstance(b, SymExpr):
        return min(a, b)
    return a if a <= b else b


def _div(a: Any, b: Any) -> Any:
    if isinstance(b, SymExpr):
        return a // b
    if b == 0:
        raise SymbolicShapeError("division by zero in shape arithmetic")
    if isinstance(a, SymExpr):
        if b < 0:
            return -(a // -b)   # ONNX integer Div truncates; sizes are positive
        return a // b
    return int(a / b) if (a < 0) != (b < 0) else a // b


def _axes(ctx: Any, op: str, rank: int) -> list[int] | None:
    if ctx.opset >= 13 and op in ("Unsqueeze", "Squeeze") or op == "Slice" and ctx.opset >= 10:
        return None
    return ctx.attrs.get("axes")


_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": _div, "Max": _cmp_max, "Min": _cmp_min,
}


def fold(ctx: Any, op: str) -> Value | list[Value] | None:
    """The node's outputs when every input is known at import and at least one is symbolic;
    None when the node cannot be folded (the caller materializes its symbolic inputs)."""
    ins = [known(v) if v is not None else None for v in ctx.inputs]
    present = [i for i, v in enumerate(ctx.inputs) if v is not None]
    if any(ins[i] is None for i in present):
        return None
    first = ctx.inputs[0]
    dtype = first.type.dtype if first is not None else "int64"
    try:
        if op == "Identity":
            return first
        if op in _ELEMENTWISE and len(present) >= 2:
            if any(ctx.inputs[i].type.dtype not in ("int32", "int64") for i in present):
                if op not in ("Add", "Sub", "Mul", "Max", "Min"):
                    return None   # float division of sizes: computed at run time
            fn = _ELEMENTWISE[op]
            out = ins[present[0]]
            for i in present[1:]:
                out = np.frompyfunc(fn, 2, 1)(out, ins[i])
            return make(ctx, out, dtype, op.lower())
        if op == "Neg":
            return make(ctx, np.frompyfunc(lambda a: -a, 1, 1)(ins[0]), dtype, "neg")
        if op == "Mod" and not ctx.attrs.get("fmod", 0):
            return make(ctx, np.frompyfunc(lambda a, b: a % b, 2, 1)(ins[0], ins[1]), dtype, "mod")
        if op == "Equal":
            return make(ctx, np.frompyfunc(_sym_eq, 2, 1)(ins[0], ins[1]), "bool", "equal")
        if op == "Where":
            cond = ins[0].astype(bool)
            return make(ctx, np.where(cond, ins[1], ins[2]), ctx.inputs[1].type.dtype, "where")
        if op == "Cast":
            try:
                to = str(numpy_dtype(ctx.attrs["to"]))
            except UnsupportedCast as exc:
                raise ctx.error(str(exc)) from None
            if to == "bool" or to.startswith("float") and dtype == "bool":
                return None
            return make(ctx, ins[0], to, "cast")
        if op == "Gather":
            axis = int(ctx.attrs.get("axis", 0))
            return make(ctx, np.take(ins[0], np.asarray(_ints(ins[1])).reshape(ins[1].shape),
                                     axis=axis), dtype, "gather")
        if op == "Concat":
            arrays = [ins[i] for i in present]
            return make(ctx, np.concatenate(arrays, axis=int(ctx.attrs["axis"])), dtype,
                        "concat")
        if op in ("Unsqueeze", "Squeeze"):
            axes = _axes(ctx, op, ins[0].ndim)
            if axes is None:
                axes = _ints(ins[1]) if ctx.has_input(1) else None
            data = ins[0]
            if op == "Unsqueeze":
                rank = data.ndim + len(axes)
                for a in sorted(int(a) % rank for a in axes):
                    data = np.expand_dims(data, a)
            else:
                axes = [d for d, n in enumerate(data.shape) if n == 1] if not axes else \
                    [int(a) % data.ndim for a in axes]
                data = np.squeeze(data, axis=tuple(axes)) if axes else data
            return make(ctx, data, dtype, op.lower())
        if op == "Reshape" and ctx.opset >= 5:
            shape = _ints(ins[1])
            shape = [ins[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
            return make(ctx, ins[0].reshape(shape), dtype, "reshape")
        if op == "Slice":
            if ctx.opset >= 10:
                starts, ends = _ints(ins[1]), _ints(ins[2])
                axes = _ints(ins[3]) if ctx.has_input(3) else list(range(len(starts)))
                steps = _ints(ins[4]) if ctx.has_input(4) else [1] * len(starts)
            else:
                a = ctx.attrs
                starts, ends = list(a["starts"]), list(a["ends"])
                axes = list(a["axes"] or range(len(starts)))
                steps = [1] * len(starts)
            index = [slice(None)] * ins[0].ndim
            for ax, s, e, st in zip(axes, starts, ends, steps):
                index[int(ax)] = slice(s, e, st)
            return make(ctx, ins[0][tuple(index)], dtype, "slice")
        if op == "Transpose":   # torch's pad order reversal: pads [2, rank] -> [rank, 2]
            perm = ctx.attrs.get("perm")
            return make(ctx, np.transpose(ins[0], None if not perm else [int(p) for p in perm]),
                        dtype, "transpose")
        if op == "ReduceProd" and ins[0].ndim == 1 and ctx.attrs.get("keepdims", 1) in (0, 1) \
                and len(present) == 1 and not ctx.attrs.get("axes"):
            out = 1
            for x in ins[0]:
                out = out * x
            keep = ctx.attrs.get("keepdims", 1)
            return make(ctx, np.array([out] if keep else out, dtype=object), dtype, "prod")
    except (SymbolicShapeError, TypeError, ValueError, IndexError):
        return None
    return None


def dims_of(v: Value) -> list[Any] | None:
    """The elements of a shape input as dims (ints and SymExprs), or None when not known."""
    data = known(v)
    if data is None:
        return None
    return [x if isinstance(x, SymExpr) else int(x) for x in data.reshape(-1)]


def values_record(data: np.ndarray) -> tuple:
    return tuple(x if isinstance(x, SymExpr) else int(x) for x in data.reshape(-1))


def materialize(bb: Any, v: SymValue) -> Value:
    """``v`` as a run-time tensor: a kernel writes its elements from the size variables."""
    return bb.emit_op("sym_values", values=values_record(v.data), shape=tuple(v.data.shape),
                      dtype=v.dtype, name=v.name)


def any_symbolic(values: Sequence[Value | None]) -> bool:
    return any(isinstance(v, SymValue) for v in values)
