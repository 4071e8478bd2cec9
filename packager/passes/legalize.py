"""Legalization: every high-level operator call becomes a ``call_tir`` of a primitive function
written in tensor expressions. View operators (reshape) stay: the VM maps them to aliases."""

from __future__ import annotations

from ..ir import te
from ..ir.graph import Call, CallTIR, Constant, Function, IRModule, PrimFunc, Value
from ..ops import get_op
from ..ops.registry import VIEW
from .common import rewrite_function


def _placeholder_name(v: Value, used: set[str]) -> str:
    base = v.name if isinstance(v, Constant) else getattr(v, "name", "x")
    name, n = base, 1
    while name in used:
        name = f"{base}_{n}"
        n += 1
    used.add(name)
    return name


def legalize_call(call: Call) -> PrimFunc:
    """The primitive function computing ``call``; its inputs follow ``call.args`` in order."""
    opdef = get_op(call.op)
    used: set[str] = set()
    inputs = [te.placeholder(a.type.shape, a.type.dtype, _placeholder_name(a, used))
              for a in call.args]
    short = call.op.split(".")[-1]
    out = opdef.legalize(*inputs, out_type=call.type, name=short, **call.attrs)
    return PrimFunc(short, inputs, [out], {"op_kind": opdef.kind})


def legalize(mod: IRModule) -> IRModule:
    out = mod.copy()

    def visit(b, lookup):
        v = b.value
        if not isinstance(v, Call) or get_op(v.op).kind == VIEW:
            return None
        fname = out.add_prim_func(legalize_call(v))
        return CallTIR(fname, list(v.args), v.type)

    for name, fn in mod.functions.items():
        if isinstance(fn, Function):
            out.functions[name] = rewrite_function(fn, visit)
    return out
