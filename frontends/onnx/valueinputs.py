"""Graph inputs whose *values* are shapes: size variables bound from them at run start.

A Reshape's target, an Expand's shape, a ConstantOfShape's shape or a Tile's repeats fed as a
graph input (the ONNX node tests do it; so do models that take an output size) is a small
integer tensor whose values set an output's shape. The importer gives each element a size
variable (``shape_0``, ``shape_1``...), so the input reaches the converters as a ``SymValue``
(``symvalue.py``) and every shape it sets is a size expression over those variables. The bundle
keeps the input as an input (the caller feeds it) and records how its values bind the variables
(``IRModule.value_vars``, the symbolic record's ``values``, docs/format.md section 10.2): the
runtime reads them before it sizes the plan, resolves what ONNX gives them to mean (a Reshape's
``0`` copies the input's dim and ``-1`` is inferred; an Expand's ``1`` keeps the input's dim),
and checks them as it checks input dims (each at least 1; a Reshape keeps the element count).

An input qualifies when it is int32/int64, holds 1 to 16 elements (rank 0 or 1, static), and
every node that reads it is one of ``VALUE_SLOTS`` in the main graph; anything else keeps the
old refusal (a value needed at export: ``--bind``).
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ...packager.ir.graph import Value
from ...packager.ir.sym import is_static, size_var
from . import proto as onnx   # the protobuf classes without `import onnx` (proto.py)
from .symvalue import SymValue

# (operator, input index) whose value is read as sizes
VALUE_SLOTS = frozenset({("Reshape", 1), ("Expand", 1), ("ConstantOfShape", 0), ("Tile", 1),
                         ("Split", 1), ("HannWindow", 0), ("HammingWindow", 0),
                         ("BlackmanWindow", 0), ("Resize", 3)})
MAX_ELEMENTS = 16
_READ = itertools.count()   # the order inputs are read in: a row may use an earlier row's sizes


class ValueInput(SymValue):
    """A graph input read as a shape: its elements are size variables bound from its values.
    ``row`` is its ``IRModule.value_vars`` row, completed by the converter that reads it."""

    def __init__(self, name: str, param: str, variables: list[str], dtype: str,
                 shape: tuple[int, ...]) -> None:
        data = np.array([size_var(v) for v in variables], dtype=object).reshape(shape)
        super().__init__(name, data, dtype)
        self.param = param
        self.variables = variables
        self.row: list = [param, "dims", list(variables)]
        self.readers: set[str] = set()
        self.order = -1


def _consumers(graph: onnx.GraphProto, name: str) -> list[tuple[str, int]]:
    return [(node.op_type if node.domain in ("", "ai.onnx") else "?", i)
            for node in graph.node for i, n in enumerate(node.input) if n == name]


def _in_subgraphs(graph: onnx.GraphProto, name: str) -> bool:
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else \
                list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
            for sub in subs:
                if any(name in n.input for n in sub.node) or _in_subgraphs(sub, name):
                    return True
    return False


def value_inputs(graph: onnx.GraphProto, params: Mapping[str, Value],
                 taken: set[str]) -> dict[str, ValueInput]:
    """The graph inputs read only as shapes, by ONNX name, each as a ``ValueInput``."""
    outputs = {o.name for o in graph.output}
    made: dict[str, ValueInput] = {}
    for onnx_name, p in params.items():
        shape, dtype = tuple(p.type.shape), p.type.dtype
        if dtype not in ("int32", "int64") or len(shape) > 1 or not is_static(shape):
            continue
        count = int(np.prod(shape)) if shape else 1
        users = _consumers(graph, onnx_name)
        if not 1 <= count <= MAX_ELEMENTS or not users or onnx_name in outputs \
                or any(u not in VALUE_SLOTS for u in users) or _in_subgraphs(graph, onnx_name):
            continue
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in p.name)
        base = base if base and not base[0].isdigit() else "v" + base
        names = []
        for i in range(count):
            v = f"{base}_{i}"
            while v in taken:
                v += "_"
            taken.add(v)
            names.append(v)
        made[onnx_name] = ValueInput(p.name, p.name, names, dtype, shape)
    return made


def read_as(ctx: Any, i: int, rule: str, *args: Any) -> None:
    """Input ``i`` of the node, when a ``ValueInput``, is read under ``rule`` (``"reshape"``
    with the data's dims and allowzero, ``"expand"`` with the data's dims, ``"dims"``): one
    rule per input, so two readers that resolve its values differently are refused."""
    v = ctx.inputs[i] if i < len(ctx.inputs) else None
    if not isinstance(v, ValueInput):
        return
    row = [v.param, rule, list(v.variables), *args]
    if v.readers and v.row != row:
        raise ctx.error(f"input {ctx.node.input[i]!r} sets the shape of two operators that read "
                        "it differently; bind it at export with --bind")
    v.row = row
    if not v.readers:
        v.order = next(_READ)
    v.readers.add(ctx.node.name or ctx.node.output[0])


def module_rows(made: Mapping[str, ValueInput]) -> list:
    """``IRModule.value_vars``: one row per input, dims as ``SymExpr``/int."""
    return [list(v.row) for v in sorted(made.values(), key=lambda v: v.order)]



# ---- axes fed at run time ---------------------------------------------------------------------
# A value that selects axes (a reduction's axes, an Unsqueeze's, CumSum's axis) sets which dims
# an output has, not how large a size is. The importer keeps one graph for every choice: the
# output's dims become size variables bound from the axes (an ``axes`` row: each reduced dim 1,
# the others the data's), and the computation is written for any choice: a reduction reduces
# every axis in turn and keeps the result where that axis is chosen (``where`` on a flag the
# sizes give), then cuts the chosen axes to their one element; CumSum computes each axis's
# scan and keeps the chosen one. That is rank-many passes over the data instead of one, which
# only models with axes fed at run time pay (any constant axes take the kernels as before).
# Mode numbers as ``runtime/symbolic.py`` AXES_*.
REDUCE_KEEP, REDUCE_DROP, UNSQUEEZE, SQUEEZE, ONE_AXIS = range(5)


def run_time_axes(ctx: Any, i: int) -> Any:
    """Input ``i`` when its values can be read at run start as axes: a graph input (not a
    constant), int32/int64, rank 0 or 1 with 1 to 16 elements; else None."""
    v = ctx.inputs[i] if ctx.has_input(i) else None
    params = getattr(ctx.bb, "axes_params", {})
    if v is None or id(v) not in params or v.type.dtype not in ("int32", "int64"):
        return None
    shape = tuple(v.type.shape)
    if len(shape) > 1 or not is_static(shape) or not 1 <= int(np.prod(shape)) <= MAX_ELEMENTS:
        return None
    return v


def holds_nothing(ctx: Any, i: int) -> bool:
    """Input ``i`` is a graph input of a static shape with no element (empty axes: known)."""
    v = ctx.inputs[i] if ctx.has_input(i) else None
    return v is not None and id(v) in getattr(ctx.bb, "axes_params", {}) \
        and is_static(v.type.shape) and 0 in tuple(v.type.shape)


def axes_sizes(ctx: Any, v: Any, src: Sequence[Any], mode: int, count: int) -> list:
    """Size variables bound from the axes in ``v`` (see ``run_time_axes``) for data of dims
    ``src`` under ``mode``: ``count`` of them, as ``SymExpr``."""
    rows = ctx.bb.__dict__.setdefault("value_rows", [])
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in v.name) or "axes"
    base = base if not base[0].isdigit() else "v" + base
    names = [f"{base}_{len(rows)}_{j}" for j in range(count)]
    rows.append((next(_READ), [v.name, "axes", names, list(src), mode]))
    return [size_var(n) for n in names]


def scale_sizes(ctx: Any, v: Any, src: Sequence[Any]) -> list:
    """Size variables ``floor(scale * src dim)`` bound from the float scales fed in ``v`` (a
    graph input of ``len(src)`` values): a ``scales`` row (format 1.7, the symbolic record's
    own ``scales`` key)."""
    rows = ctx.bb.__dict__.setdefault("value_rows", [])
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in v.name) or "scales"
    base = base if not base[0].isdigit() else "v" + base
    names = [f"{base}_{len(rows)}_{j}" for j in range(len(src))]
    rows.append((next(_READ), [v.name, "scales", names, list(src)]))
    return [size_var(n) for n in names]


def run_time_scales(ctx: Any, i: int, count: int) -> Any:
    """Input ``i`` when it is float scales fed as a graph input: float32/float64, 1-D of
    ``count`` values; else None."""
    v = ctx.inputs[i] if ctx.has_input(i) else None
    if v is None or id(v) not in getattr(ctx.bb, "axes_params", {}) \
            or v.type.dtype not in ("float32", "float64") or tuple(v.type.shape) != (count,):
        return None
    return v


def flag(ctx: Any, expr: Any, rank: int) -> Any:
    """A bool tensor of shape ``(1,) * rank``, true where the size expression ``expr`` is not
    zero at run time."""
    from .symvalue import materialize
    values = materialize(ctx.bb, SymValue(ctx.bb.fresh_name("axis_flag"),
                                          np.array([expr], dtype=object), "int64"))
    return ctx.reshape(ctx.emit("cast", values, dtype="bool"), (1,) * rank)


def reduce_over(ctx: Any, x: Any, keep: bool, core: Any) -> Any:
    """``x`` reduced over the axes fed in input 1 (``run_time_axes``); ``core(ctx, y, axis)``
    reduces one axis keeping it (sum, mean, max, min, prod, log-sum-exp: each composes over
    axes taken in turn)."""
    shape = tuple(x.type.shape)
    rank = len(shape)
    v = ctx.inputs[1]
    k = int(np.prod(v.type.shape))
    sizes = axes_sizes(ctx, v, shape, REDUCE_KEEP if keep else REDUCE_DROP,
                       rank if keep else 2 * rank - k)
    out = sizes[:rank]
    y = x
    for axis in range(rank):
        if isinstance(shape[axis], int) and shape[axis] == 1:
            continue
        reduced = ctx.emit("broadcast_to", core(ctx, y, axis), shape=shape)
        y = ctx.emit("where", flag(ctx, shape[axis] - out[axis], rank), reduced, y)
    y = ctx.emit("strided_slice", y, starts=(0,) * rank, ends=tuple(out),
                 axes=tuple(range(rank)), steps=(1,) * rank)
    return y if keep else ctx.reshape(y, tuple(sizes[rank:]))


def module_rows_all(bb: Any, made: Mapping[str, ValueInput]) -> list:
    """Every ``value_vars`` row, shape inputs' and axes', in the order the model reads them."""
    rows = [(v.order, list(v.row)) for v in made.values()]
    rows += getattr(bb, "value_rows", [])
    return [r for _, r in sorted(rows, key=lambda t: t[0])]


def along_chosen_axis(ctx: Any, x: Any, scan: Any) -> Any:
    """``scan(axis)`` (an op keeping ``x``'s shape, CumSum's) along the axis fed in input 1:
    each axis's result, the chosen one kept (the axis binds ``axis + 1`` as a size)."""
    shape = tuple(x.type.shape)
    rank = len(shape)
    chosen = axes_sizes(ctx, ctx.inputs[1], shape, ONE_AXIS, 1)[0]
    y = x
    for axis in range(rank):
        if isinstance(shape[axis], int) and shape[axis] == 1:
            continue   # a scan along a size-1 axis is the identity
        y = ctx.emit("where", flag(ctx, chosen - (axis + 1), rank), y, scan(axis))
    return y


def unsqueeze(ctx: Any, x: Any) -> Any:
    """Unsqueeze by the axes fed in input 1: a reshape to dims the axes bind."""
    shape = tuple(x.type.shape)
    v = ctx.inputs[1]
    rank = len(shape) + int(np.prod(v.type.shape))
    return ctx.reshape(x, tuple(axes_sizes(ctx, v, shape, UNSQUEEZE, rank)))


def squeeze(ctx: Any, x: Any) -> Any:
    """Squeeze the axes fed in input 1 (each must be 1 at run time): a reshape."""
    shape = tuple(x.type.shape)
    v = ctx.inputs[1]
    rank = len(shape) - int(np.prod(v.type.shape))
    if rank < 0:
        raise ctx.error(f"{int(np.prod(v.type.shape))} axes to squeeze from a rank-{len(shape)} "
                        "tensor")
    return ctx.reshape(x, tuple(axes_sizes(ctx, v, shape, SQUEEZE, rank)))


# ---- Slice with starts/ends (axes, steps) fed at run time --------------------------------------

def slice_inputs(ctx: Any) -> list | None:
    """Slice's starts, ends, axes, steps (opset 10+) when starts and ends are fed at run time
    and each present one is a graph input whose values can be read at run start; else None."""
    got = []
    for i in range(1, 5):
        if not ctx.has_input(i):
            if i <= 2:
                return None
            got.append(None)
            continue
        v = run_time_axes(ctx, i)
        if v is None:
            return None
        got.append(v)
    return got


def slice_run_time(ctx: Any, x: Any, parts: list) -> Any:
    """``x`` sliced by starts/ends/axes/steps read at run start: a ``slice`` row binds, per axis
    of ``x``, its output size, its first index + 1 and the step as ``p - q`` (each at least 1),
    clamped as ONNX says; each sliced axis is a ``take`` of ``first + step * arange(size)``."""
    from .symvalue import materialize
    starts, ends, axes, steps = parts
    shape = tuple(x.type.shape)
    rank = len(shape)
    k = int(np.prod(starts.type.shape))
    if int(np.prod(ends.type.shape)) != k or any(
            v is not None and int(np.prod(v.type.shape)) != k for v in (axes, steps)):
        raise ctx.error("starts, ends, axes and steps must have the same length")
    if axes is None and k > rank:
        raise ctx.error(f"{k} starts for a rank-{rank} input")
    rows = ctx.bb.__dict__.setdefault("value_rows", [])
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in starts.name) or "starts"
    base = base if not base[0].isdigit() else "v" + base
    names = [f"{base}_{len(rows)}_{j}" for j in range(4 * rank)]
    rows.append((next(_READ), [starts.name, "slice", names, list(shape), ends.name,
                               axes.name if axes is not None else "",
                               steps.name if steps is not None else ""]))
    sizes = [size_var(n) for n in names]
    y = x
    for axis in range(rank if axes is not None else k):
        n, first, p, q = sizes[4 * axis:4 * axis + 4]
        at = ctx.bb.emit_op("arange", start=0, delta=1, length=n, dtype="int64")
        offs = materialize(ctx.bb, SymValue(ctx.bb.fresh_name("slice_first"),
                                            np.array([first - 1], dtype=object), "int64"))
        step = materialize(ctx.bb, SymValue(ctx.bb.fresh_name("slice_step"),
                                            np.array([p - q], dtype=object), "int64"))
        index = ctx.emit("add", ctx.emit("multiply", at, step), offs)
        y = ctx.emit("take", y, index, axis=axis)
    return y


# ---- Pad with pads (axes) fed at run time ------------------------------------------------------

def pad_run_time(ctx: Any, x: Any, mode: str, pads: Any, axes: Any) -> Any:
    """``x`` padded by pads (and axes) read at run start: a ``pad`` row binds, per axis, the
    output size and the leading pad as ``p - q`` (negative crops); each padded axis is a
    ``take`` of source indices ``arange(size) - lead`` mapped as the mode says (edge: clamped,
    wrap: modulo, reflect: folded, constant: clamped and masked to the fill value)."""
    from .symvalue import materialize
    shape = tuple(x.type.shape)
    rank = len(shape)
    k = int(np.prod(pads.type.shape))
    if k % 2 or axes is None and k != 2 * rank or axes is not None and \
            int(np.prod(axes.type.shape)) * 2 != k:
        raise ctx.error(f"{k} pads for a rank-{rank} input")
    if mode not in ("constant", "edge", "wrap", "reflect"):
        raise ctx.error(f"mode {mode!r} is not supported")
    rows = ctx.bb.__dict__.setdefault("value_rows", [])
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in pads.name) or "pads"
    base = base if not base[0].isdigit() else "v" + base
    names = [f"{base}_{len(rows)}_{j}" for j in range(3 * rank)]
    rows.append((next(_READ), [pads.name, "pad", names, list(shape),
                               axes.name if axes is not None else ""]))
    sizes = [size_var(n) for n in names]

    def scalar(expr: Any) -> Any:
        return materialize(ctx.bb, SymValue(ctx.bb.fresh_name("pad_size"),
                                            np.array([expr], dtype=object), "int64"))

    y = x
    fill = ctx.input(2) if mode == "constant" and ctx.has_input(2) else None
    for axis in range(rank):
        n, p, q = sizes[3 * axis:3 * axis + 3]
        d = shape[axis]
        at = ctx.bb.emit_op("arange", start=0, delta=1, length=n, dtype="int64")
        src = ctx.emit("add", at, scalar(q - p))   # output i reads input i - lead
        size = scalar(d)
        zero = ctx.constant(np.zeros(1, np.int64), "zero")
        last = scalar(d - 1)
        if mode == "wrap":
            index = ctx.emit("mod", src, size, fmod=False)
        elif mode == "reflect":
            period = ctx.emit("maximum", scalar(2 * d - 2), ctx.constant(np.ones(1, np.int64)))
            m = ctx.emit("mod", src, period, fmod=False)
            index = ctx.emit("minimum", m, ctx.emit("subtract", period, m))
            index = ctx.emit("minimum", index, last)
        else:
            index = ctx.emit("minimum", ctx.emit("maximum", src, zero), last)
        y = ctx.emit("take", y, index, axis=axis)
        if mode == "constant":
            inside = ctx.emit("logical_and", ctx.emit("greater_equal", src, zero),
                              ctx.emit("less", src, size))
            inside = ctx.reshape(inside, tuple(n if a == axis else 1 for a in range(rank)))
            value = fill if fill is not None else ctx.constant(np.zeros(1, x.type.dtype), "zero")
            value = ctx.reshape(value, (1,) * rank)
            y = ctx.emit("where", inside, y, value)
    return y
