"""Helpers the graph passes share: rewriting a function's bindings with substitutions."""

from __future__ import annotations

from typing import Callable

from ..ir.graph import (Binding, Call, CallLibrary, CallTIR, Constant, DataflowBlock, Expr,
                        Function, IRModule, TensorType, Value, Var)


def infer_static(op: str, *types: TensorType, **attrs: object) -> TensorType:
    """``op``'s output type in a rewrite of static shapes only: one that assumed a relation
    between symbolic dims (``OpDef.infer_type``) would lose it, so it is refused."""
    from ..ops import get_op   # the op table imports the passes' IR only
    out, relations = get_op(op).infer_type(*types, **attrs)
    if relations:
        raise AssertionError(f"{op}: a rewrite of static shapes assumed {relations}")
    return out


def with_args(value: Expr, args: list[Value]) -> Expr:
    if isinstance(value, Call):
        return Call(value.op, args, value.attrs, value.type)
    if isinstance(value, CallTIR):
        return CallTIR(value.func, args, value.type)
    if isinstance(value, CallLibrary):
        return CallLibrary(value.func, args, value.attrs, value.type)
    return value


def rewrite_function(fn: Function,
                     visit: Callable[[Binding, Callable[[Value], Value]], Expr | Value | None],
                     subst: dict[int, Value] | None = None) -> Function:
    """Rebuild ``fn`` binding by binding. ``visit(binding, lookup)`` returns the new value for a
    binding (a Value to substitute the var everywhere, an Expr to rebind it, or None to keep it
    with its arguments substituted). ``lookup(v)`` maps a value to its substitute so far;
    ``subst`` seeds that map (keyed by ``id`` of the replaced value)."""
    subst = dict(subst or {})

    def lookup(v: Value) -> Value:
        return subst.get(id(v), v)

    blocks = []
    for block in fn.blocks:
        new_block = DataflowBlock()
        for b in block.bindings:
            args = [lookup(a) for a in getattr(b.value, "args", [])]
            current = Binding(b.var, with_args(b.value, args) if args else b.value, b.source)
            if isinstance(current.value, Var):
                subst[id(b.var)] = lookup(current.value)
                continue
            result = visit(current, lookup)
            if isinstance(result, (Var, Constant)):
                subst[id(b.var)] = result
            elif result is None:
                new_block.bindings.append(current)
            else:
                new_block.bindings.append(Binding(b.var, result, b.source))
        blocks.append(new_block)
    return Function(fn.name, list(fn.params), blocks, [lookup(o) for o in fn.outputs],
                    list(fn.output_names))


def rebind_calls(fn: Function, new: dict[int, Call]) -> Function:
    """``fn`` with each binding whose var's ``id`` is in ``new`` rebound to that call, its
    arguments substituted as the rewrite goes (the form the fusion passes collect)."""
    if not new:
        return fn

    def visit(binding: Binding, lookup):
        call = new.get(id(binding.var))
        if call is None:
            return None
        return with_args(call, [lookup(a) for a in call.args])

    return rewrite_function(fn, visit)


def map_functions(mod: IRModule, fn_pass: Callable[[Function], Function]) -> IRModule:
    out = mod.copy()
    for name, fn in mod.functions.items():
        if isinstance(fn, Function):
            out.functions[name] = fn_pass(fn)
    return out
