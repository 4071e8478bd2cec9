"""Drop an LSTM's final cell state when nothing reads it.

The ONNX converter asks ``nn.recurrence`` for the final cell state (one row after the T steps)
whenever the node names its Y_c output, and slices Y out of the rows before it. Exporters name
Y_c even when no node reads it (torch always does); once dead-code elimination has removed
those readers, this pass turns such a recurrence back into one without the extra row, so that
Y is the kernel's own output and not a copy of it."""

from __future__ import annotations

from collections import defaultdict

from ..ir.graph import (Binding, Call, DataflowBlock, Expr, Function, IRModule, TensorType, Var,
                        used_values)
from ..ops.index import slice_ranges
from .common import map_functions, with_args


def _steps_read(value: Expr, source: Var, steps: int) -> tuple[bool, bool] | None:
    """For a reader of a recurrence output ``source``: None if it may read a row past the T
    steps, else (whether it reads exactly rows 0..T-1 and everything else, i.e. is a copy of Y,
    True)."""
    if not (isinstance(value, Call) and value.op == "strided_slice" and value.args[0] is source):
        return None
    # the slice's relations were added when its type was inferred
    ranges = slice_ranges(source.type.shape, relations=[],
                          **{k: value.attrs.get(k, ()) for k in ("starts", "ends", "axes",
                                                                  "steps")})
    start, step, length = ranges[0]
    if length and start + step * (length - 1) >= steps:
        return None
    whole = all(r == (0, 1, n) for r, n in zip(ranges[1:], source.type.shape[1:]))
    return (start, step, length) == (0, 1, steps) and whole, True


def drop_unread_cell_state(mod: IRModule) -> IRModule:
    return map_functions(mod, _drop_in_function)


def _drop_in_function(fn: Function) -> Function:
    bindings = list(fn.bindings())
    readers: dict[int, list[Binding]] = defaultdict(list)
    for b in bindings:
        for a in used_values(b.value):
            readers[id(a)].append(b)
    returned = {id(o) for o in fn.outputs}
    trim: set[int] = set()
    for b in bindings:
        v = b.value
        if (isinstance(v, Call) and v.op == "nn.recurrence" and v.attrs.get("states")
                and id(b.var) not in returned):
            steps = v.args[0].type.shape[0]
            if all(_steps_read(r.value, b.var, steps) is not None for r in readers[id(b.var)]):
                trim.add(id(b.var))
    if not trim:
        return fn
    subst: dict[int, Var] = {}
    blocks = []
    for block in fn.blocks:
        new_block = DataflowBlock()
        for b in block.bindings:
            v = b.value
            args = getattr(v, "args", None)
            if args:
                if isinstance(v, Call) and v.op == "strided_slice" and id(args[0]) in trim:
                    steps = subst[id(args[0])].type.shape[0]
                    if _steps_read(v, args[0], steps)[0]:      # Y itself: the new output
                        subst[id(b.var)] = subst[id(args[0])]
                        continue
                v = with_args(v, [subst.get(id(a), a) for a in args])
            if id(b.var) in trim:
                t = v.type
                var = Var(b.var.name, TensorType((v.args[0].type.shape[0],) + t.shape[1:],
                                                 t.dtype))
                subst[id(b.var)] = var
                new_block.bindings.append(Binding(var, Call(v.op, v.args,
                                                            {**v.attrs, "states": False},
                                                            var.type), b.source))
                continue
            new_block.bindings.append(Binding(b.var, v, b.source))
        blocks.append(new_block)
    return Function(fn.name, list(fn.params), blocks, [subst.get(id(o), o) for o in fn.outputs],
                    list(fn.output_names))
