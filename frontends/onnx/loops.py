"""An ONNX ``Loop`` whose trip count or condition has no bound at export, run by the VM
(format 1.8: LOOP ... NEXT, ``packager/ops/control.py``): its body is compiled once and runs as
many times as the model's own trip count and condition say, at run time.

The body is converted in place over placeholders (its iteration number, the carried values),
then its bindings are cut out of the current block into a graph function of the module whose
parameters are the iteration number, the carried values and the outside values it reads (the
captures), and whose outputs are its condition and the new carried values. Inside the body the
condition it is given is always true (an iteration runs only while it holds). Carried values
must keep their type (they are double-buffered in the arena: the body reads one buffer, its
results are copied into it before the next iteration). Scan outputs would need memory for
every iteration, and the count has no bound at export: refused, naming what to bound.
"""

from __future__ import annotations

import numpy as np

from ...packager.errors import ExportError
from ...packager.ir.graph import (Call, CallLibrary, CallTIR, DataflowBlock, Function,
                                  TensorType, Value, Var)
from .registry import NodeContext

INT64_MAX = (1 << 63) - 1


def _one(ctx: NodeContext, v: Value, dtype: str, what: str) -> Value:
    """``v`` as one ``dtype`` element of shape (1,), as a run-time tensor."""
    from .symvalue import SymValue, materialize

    if isinstance(v, SymValue):
        v = materialize(ctx.bb, v)
    n = 1
    for d in v.type.shape:
        n = n * d if isinstance(d, int) else -1
    if n != 1:
        raise ctx.error(f"{what} must hold one element, not {v.type}")
    if v.type.dtype != dtype:
        v = ctx.emit("cast", v, dtype=dtype)
    return ctx.reshape(v, (1,))


def run_time_loop(ctx: NodeContext) -> list[Value]:
    """The outputs of the Loop node of ``ctx`` as one ``loop`` call over its body's function:
    the trip count (absent: 2**63 - 1, as ONNX Runtime runs it) and the condition are read at
    run time."""
    from .symvalue import SymValue, materialize

    body = ctx.attrs["body"]
    carried = [ctx.input(i) for i in range(2, ctx.num_inputs)]
    carried = [materialize(ctx.bb, v) if isinstance(v, SymValue) else v for v in carried]
    n = len(carried)
    n_scan = len(body.output) - 1 - n
    if n_scan:
        raise ctx.error(
            f"its {n_scan} scan output(s) stack one row per iteration, and the number of "
            "iterations is known only at run time with no bound at export: give the trip count "
            "(and condition) with --bind NAME=FILE.npy, or compute the trip count from input "
            "sizes bounded with --max-shape")
    if not n:
        raise ctx.error("a loop with neither carried values nor scan outputs computes nothing")
    trip = (_one(ctx, ctx.input(0), "int64", "the trip count") if ctx.has_input(0)
            else ctx.constant(np.array([INT64_MAX], np.int64), "trip"))
    cond = (_one(ctx, ctx.input(1), "bool", "the condition") if ctx.has_input(1)
            else ctx.constant(np.array([True]), "cond"))

    bb = ctx.bb
    block = bb._block
    number = Var(bb.fresh_name("iteration"), TensorType((), "int64"))
    states = [Var(bb.fresh_name("carried"), v.type) for v in carried]
    mark = len(block.bindings)
    outs = ctx.inline(body, [number, ctx.constant(np.array(True), "running")] + states)
    outs = [materialize(bb, v) if isinstance(v, SymValue) else v for v in outs]
    again = _one(ctx, outs[0], "bool", "the body's condition")
    new = outs[1:1 + n]
    for k, (a, b) in enumerate(zip(new, states)):
        if a.type != b.type:
            raise ctx.error(f"carried value {k} changes from {b.type} to {a.type} between "
                            "iterations: a loop whose trip count is known only at run time "
                            "needs carried values of fixed shape and dtype")
    bindings = block.bindings[mark:]
    del block.bindings[mark:]
    placeholders = {id(v) for v in [number] + states}
    defined = {id(b.var) for b in bindings}
    captures: dict[int, Var] = {}
    for v in [a for b in bindings for a in _reads(b.value)] + [again] + new:
        if isinstance(v, Var) and id(v) not in defined and id(v) not in placeholders:
            captures.setdefault(id(v), v)
    outer = list(captures.values())
    params = [Var(bb.fresh_name(f"loop_{v.name}"), v.type) for v in outer]
    swap = {id(v): p for v, p in zip(outer, params)}
    for b in bindings:
        v = b.value
        if isinstance(v, (Call, CallTIR, CallLibrary)):
            v.args = [swap.get(id(a), a) for a in v.args]
        elif isinstance(v, Var):
            b.value = swap.get(id(v), v)
    results = [swap.get(id(o), o) for o in [again] + new]
    mod = bb.mod
    name = mod.unique_name("loop_body")
    mod.functions[name] = Function(name, [number] + states + params, [DataflowBlock(bindings)],
                                   results, [f"out{k}" for k in range(len(results))])
    record = tuple((tuple(v.type.shape), v.type.dtype) for v in carried)
    first = bb.emit_op("loop", trip, cond, *carried, *outer, body=name, carried=n,
                       outputs=record, name="loop")
    return [first] + [bb.emit_op("loop_output", first, index=k, outputs=record,
                                 name="loop_output") for k in range(1, n)]


def _reads(value) -> list[Value]:
    if isinstance(value, (Call, CallTIR, CallLibrary)):
        return list(value.args)
    return [value] if isinstance(value, Var) else []


class NeedsRunTimeLoop(ExportError):
    """Unrolling a Loop needs a bound its trip count does not have at export."""
