"""An ONNX ``If`` whose condition is known only at run time, as two graph functions that the VM
branches between (format 1.7; ``packager/ops/control.py``): only the taken branch runs.

Each branch is converted in place (``NodeContext.inline``), then its bindings are cut out of the
current block into a graph function of the module whose parameters are the outside values they
read (the captures). The ``if`` call that replaces them takes the condition and the captures.
Outputs whose extents differ between the branches (same dtype and rank) get a size variable
that each branch binds to its own extent (BIND_SIZE) before the VM copies its results out.

A branch may be left out and replaced by a refusal at run time (TRAP) only where the condition
depends on the input *sizes* alone (shape arithmetic, as in silero VAD's ``T == 1 ? Squeeze :
Identity``): a branch that cannot be compiled, or one whose outputs have another rank than the
other branch's. Inputs of those sizes are refused, as a failed size relation would be; with a
condition on input values, such a branch stays an export error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...packager.errors import ExportError
from ...packager.ir.graph import (Binding, Call, CallLibrary, CallTIR, DataflowBlock, Function,
                                  TensorType, Value, Var)
from ...packager.ir.sym import Dim, shape_vars, size_var
from .registry import NodeContext


@dataclass
class Branch:
    """One converted branch: its bindings (cut out of the block) and outputs, or why it could
    not be converted (``error``; then it has neither)."""
    body: list[Binding] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    error: ExportError | None = None
    relations: list = field(default_factory=list)   # the size relations it assumes
    # its bindings of the If's extents: outputs of its function past the If's (which keeps them
    # live), never copied
    binds: list[Var] = field(default_factory=list)


def convert_branch(ctx: NodeContext, graph: Any, keep_error: bool) -> Branch:
    """Convert ``graph`` in place and cut its bindings out of the current block. With
    ``keep_error``, a conversion error is returned in the branch (the block, relations and
    dynamic sizes as before it) instead of raised."""
    from .sequences import SeqValue
    from .symvalue import SymValue, materialize

    bb, mod = ctx.bb, ctx.bb.mod
    block = bb._block
    mark, rel_mark = len(block.bindings), len(mod.relations)
    dynamic = dict(mod.dynamic_sizes)
    try:
        outputs = ctx.inline(graph, [])
        outputs = [materialize(bb, v) if isinstance(v, SymValue) else v for v in outputs]
        if any(isinstance(v, SeqValue) for v in outputs):
            raise ctx.error("a branch gives a sequence: an If whose condition is known only "
                            "at run time gives tensors only")
    except ExportError as exc:
        if not keep_error:
            raise
        del block.bindings[mark:]
        del mod.relations[rel_mark:]
        mod.dynamic_sizes.clear()
        mod.dynamic_sizes.update(dynamic)
        return Branch(error=exc)
    body = block.bindings[mark:]
    del block.bindings[mark:]
    # what the branch assumes of the sizes holds only where it runs: checked in the branch
    relations = mod.relations[rel_mark:]
    del mod.relations[rel_mark:]
    return Branch(body, outputs, relations=relations)


def emit_if(ctx: NodeContext, cond: Value, then_graph: Any, else_graph: Any,
            on_sizes_only: bool, hint: str, mismatch: Callable[[int, Value, Value], str]
            ) -> list[Value]:
    """The outputs of an If on ``cond`` (one bool, shape (1,)), run as the VM's branch.
    ``on_sizes_only``: the condition depends on the input sizes alone (a branch that cannot be
    compiled, or of another rank, becomes a refusal at run time); ``mismatch(i, a, b)`` is the
    error text for output ``i`` whose branches give ``a`` and ``b`` of another dtype or rank."""
    yes = convert_branch(ctx, then_graph, keep_error=on_sizes_only)
    no = convert_branch(ctx, else_graph, keep_error=on_sizes_only)
    if yes.error is not None and no.error is not None:
        raise yes.error
    if yes.error is None and no.error is None:
        if len(yes.outputs) != len(no.outputs):
            raise ctx.error("the branches give different numbers of outputs")
        for i, (a, b) in enumerate(zip(yes.outputs, no.outputs)):
            if a.type.dtype != b.type.dtype or len(a.type.shape) != len(b.type.shape):
                if not on_sizes_only:
                    raise ctx.error(mismatch(i, a, b))
                no = _left_out(ctx, no, ctx.error(mismatch(i, a, b)))
                break
    types = []
    binds: list[tuple[str, int, int]] = []   # (size variable, output, axis) each branch binds
    kept = yes if yes.error is None else no
    for i, out in enumerate(kept.outputs):
        if yes.error is not None or no.error is not None:
            types.append(out.type)
            continue
        shape = []
        for d, (x, y) in enumerate(zip(yes.outputs[i].type.shape, no.outputs[i].type.shape)):
            if x == y:
                shape.append(x)
                continue
            var = _branch_size(ctx, i, d, x, y, hint)
            binds.append((var, i, d))
            shape.append(size_var(var))
        types.append(TensorType(tuple(shape), out.type.dtype))
    for branch in (yes, no):
        if branch.error is None:
            _check_relations(ctx, branch)
            _bind_extents(ctx, branch, binds)
    return _emit(ctx, cond, yes, no, types)


def _left_out(ctx: NodeContext, branch: Branch, why: ExportError) -> Branch:
    """``branch`` left out (a refusal at run time): what it assumed is dropped with it."""
    return Branch(error=why)


def _check_relations(ctx: NodeContext, branch: Branch) -> None:
    """Start ``branch`` with a check of each size relation its conversion assumed (a Squeeze's
    axis of size 1...): the branch refuses the run (TRAP) where one fails, and the other branch
    does not need it. Relations over sizes a kernel counts stay the module's."""
    from .symvalue import SymValue, materialize

    block, mod = ctx.bb._block, ctx.bb.mod
    mark = len(block.bindings)
    counted = set(mod.dynamic_sizes)
    for op, a, b, where in branch.relations:
        if shape_vars([a, b]) & counted:
            ctx.bb.assume([(op, a, b, where)])
            continue
        diff = a - b
        if isinstance(diff, int):
            if diff == 0 or (op == "le" and diff < 0):
                continue   # holds at every size
        x = materialize(ctx.bb, SymValue("relation", np.array([diff], dtype=object), "int64"))
        zero = ctx.constant(np.zeros(1, np.int64), "zero")
        bad = (ctx.emit("greater", x, zero) if op == "le"
               else ctx.emit("logical_not", ctx.emit("equal", x, zero)))
        ctx.bb.emit(Call("check", [bad], {"where": where}, bad.type), "check")
    checks = block.bindings[mark:]
    del block.bindings[mark:]
    branch.body[:0] = checks


def _branch_size(ctx: NodeContext, i: int, d: int, x: Dim, y: Dim, hint: str) -> str:
    """A new size variable for axis ``d`` of output ``i``, at most the larger of ``x`` and
    ``y`` (which must be comparable at export: the output's memory is planned at it)."""
    bound = _larger(x, y)
    if bound is None:
        raise ctx.error(f"output {i} axis {d}: the branches give {x} and {y}, which cannot be "
                        "ordered at export (the output's memory is planned at the larger); "
                        f"{hint}")
    mod = ctx.bb.mod
    taken = set(mod.dynamic_sizes)
    for p in ctx.bb.params:
        taken |= shape_vars(p.type.shape)
    k = 1
    while f"branch{k}" in taken:
        k += 1
    mod.dynamic_sizes[f"branch{k}"] = bound
    return f"branch{k}"


def _bind_extents(ctx: NodeContext, branch: Branch, binds: list[tuple[str, int, int]]) -> None:
    """Append to ``branch`` the bindings of its outputs' extents to the size variables."""
    from .symvalue import SymValue, make, materialize

    block = ctx.bb._block
    for var, i, d in binds:
        mark = len(block.bindings)
        extent = branch.outputs[i].type.shape[d]
        count = make(ctx, np.array([extent], dtype=object), "int64", "extent")
        if isinstance(count, SymValue):
            count = materialize(ctx.bb, count)
        branch.body += block.bindings[mark:]
        del block.bindings[mark:]
        bound = Var(ctx.bb.fresh_name(var), count.type)
        branch.body.append(Binding(bound, Call("bind_size", [count], {"var": var}, count.type)))
        branch.binds.append(bound)


def _emit(ctx: NodeContext, cond: Value, yes: Branch, no: Branch, types: list[TensorType]
          ) -> list[Value]:
    """The ``if`` call (and ``if_output``s) over the branches' functions."""
    captures: dict[int, Var] = {}
    for branch in (yes, no):
        defined = {id(b.var) for b in branch.body}
        for v in [a for b in branch.body for a in _reads(b.value)] + branch.outputs:
            if isinstance(v, Var) and id(v) not in defined:
                captures.setdefault(id(v), v)
    outer = list(captures.values())
    names = [_outline(ctx, b, label, outer) if b.error is None else ""
             for b, label in ((yes, "then"), (no, "else"))]
    record = tuple((tuple(t.shape), t.dtype) for t in types)
    first = ctx.bb.emit_op("if", cond, *outer, branches=tuple(names), outputs=record, name="if")
    return [first] + [ctx.bb.emit_op("if_output", first, index=k, outputs=record,
                                     name="if_output") for k in range(1, len(types))]


def _reads(value: Any) -> list[Value]:
    if isinstance(value, (Call, CallTIR, CallLibrary)):
        return list(value.args)
    return [value] if isinstance(value, Var) else []


def _outline(ctx: NodeContext, branch: Branch, label: str, outer: list[Var]) -> str:
    """``branch`` as a graph function of the module taking ``outer`` (fresh parameters in
    their place); returns its name."""
    params = [Var(ctx.bb.fresh_name(f"{label}_{v.name}"), v.type) for v in outer]
    swap = {id(v): p for v, p in zip(outer, params)}

    def sub(v: Value) -> Value:
        return swap.get(id(v), v)

    for b in branch.body:
        v = b.value
        if isinstance(v, (Call, CallTIR, CallLibrary)):
            v.args = [sub(a) for a in v.args]
        elif isinstance(v, Var):
            b.value = sub(v)
    outputs = [sub(o) for o in branch.outputs] + branch.binds
    mod = ctx.bb.mod
    name = mod.unique_name(f"if_{label}")
    mod.functions[name] = Function(name, params, [DataflowBlock(branch.body)], outputs,
                                   [f"out{k}" for k in range(len(outputs))])
    return name


def _larger(x, y):
    """The larger of two extents when one is never smaller for any sizes >= 1, else None."""
    for big, small in ((x, y), (y, x)):
        diff = big - small
        low = diff if isinstance(diff, int) else diff.lower_bound()
        if low is not None and low >= 0:
            return big
    return None


def graph_inputs_behind(ctx: NodeContext, cond: Value) -> list[str]:
    """The graph inputs whose values ``cond`` (an If's condition, a Loop's trip count) depends
    on (found through the bindings emitted so far); none when it is computed from the input
    sizes alone."""
    fn = ctx.bb._func
    producers = {id(b.var): b.value for blk in (fn.blocks if fn else []) for b in blk.bindings}
    if ctx.bb._block is not None:
        producers.update((id(b.var), b.value) for b in ctx.bb._block.bindings)
    params = {id(p): p.name for p in (fn.params if fn else ctx.bb.params)}
    seen, stack, inputs = set(), [cond], []
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) in params:
            inputs.append(params[id(v)])
        value = producers.get(id(v))
        stack.extend(a for a in getattr(value, "args", ()) if isinstance(a, Value))
    return sorted(inputs)
