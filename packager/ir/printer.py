"""Readable text for an IRModule: graph functions first, then primitive functions.

Constants print as ``const.NAME``; calls print in the form they will run:
``call_tir(fn, (args), out=Tensor(...))``, ``call_library("env.linear", ...)``, or ``op(args, attrs)``.
"""

from __future__ import annotations

from . import te
from .graph import (Binding, Call, CallLibrary, CallTIR, Constant, Function, IRModule, PrimFunc,
                    TensorType, Value, Var)

_BIN_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
               "and": "&&", "or": "||", "xor": "^", "shl": "<<", "shr": ">>"}
_CMP_SYMBOL = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def value_text(v: Value) -> str:
    if isinstance(v, Constant):
        return f"const.{v.name}"
    if isinstance(v, Var):
        return v.name
    raise TypeError(f"not a value: {v!r}")


def _attrs_text(attrs: dict) -> str:
    return "".join(f", {k}={_plain(v)}" for k, v in attrs.items())


def _plain(v: object) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_plain(x) for x in v) + "]"
    if isinstance(v, list):
        return "[" + ", ".join(_plain(x) for x in v) + "]"
    return repr(v)


def binding_text(var: Var, value: object) -> str:
    if isinstance(value, CallTIR):
        args = ", ".join(value_text(a) for a in value.args)
        return f"{var.name} = call_tir({value.func}, ({args}), out={value.type})"
    if isinstance(value, CallLibrary):
        args = ", ".join(value_text(a) for a in value.args)
        return (f"{var.name} = call_library(\"{value.func}\", ({args}), out={value.type}"
                f"{_attrs_text(value.attrs)})")
    if isinstance(value, Call):
        args = ", ".join(value_text(a) for a in value.args)
        return f"{var.name}: {value.type} = {value.op}({args}{_attrs_text(value.attrs)})"
    return f"{var.name} = {value_text(value)}"  # type: ignore[arg-type]


def _source_comment(b: Binding, shown: int = 3) -> str:
    """`  # from Conv_1 (Conv), Relu_2 (Relu)`: the source nodes a binding came from."""
    if not b.source:
        return ""
    names = ", ".join(f"{s.name} ({s.op})" for s in b.source[:shown])
    more = f" +{len(b.source) - shown} more" if len(b.source) > shown else ""
    return f"  # from {names}{more}"


def function_text(fn: Function) -> str:
    params = ", ".join(f"{p.name}: {p.type}" for p in fn.params)
    rets = ", ".join(str(o.type) for o in fn.outputs)
    lines = [f"def {fn.name}({params}) -> ({rets}):"]
    for block in fn.blocks:
        lines.append("    with dataflow():")
        lines += [f"        {binding_text(b.var, b.value)}{_source_comment(b)}"
                  for b in block.bindings]
    lines.append("    return " + ", ".join(value_text(o) for o in fn.outputs))
    return "\n".join(lines)


def expr_text(e: te.Expr) -> str:
    if isinstance(e, te.IndexVar):
        return e.name
    if isinstance(e, te.Const):
        if e.dtype == "float32":
            return f"{float(e.value)!r}f"
        return repr(e.value)
    if isinstance(e, te.Binary):
        if e.op in ("max", "min"):
            return f"{e.op}({expr_text(e.a)}, {expr_text(e.b)})"
        return f"({expr_text(e.a)} {_BIN_SYMBOL[e.op]} {expr_text(e.b)})"
    if isinstance(e, te.Compare):
        return f"({expr_text(e.a)} {_CMP_SYMBOL[e.op]} {expr_text(e.b)})"
    if isinstance(e, te.Select):
        return f"select({expr_text(e.cond)}, {expr_text(e.a)}, {expr_text(e.b)})"
    if isinstance(e, te.Cast):
        return f"{e.dtype}({expr_text(e.value)})"
    if isinstance(e, te.MathCall):
        return f"{e.name}({expr_text(e.arg)})"
    if isinstance(e, te.Reduce):
        axes = ", ".join(f"{a.name} < {a.extent}" for a in e.axes)
        return f"{e.combiner}({expr_text(e.body)}, over {axes})"
    if isinstance(e, te.Read):
        return f"{e.tensor.name}[{', '.join(expr_text(i) for i in e.indices)}]"
    raise TypeError(f"unknown expression {e!r}")


def prim_func_text(fn: PrimFunc) -> str:
    params = ", ".join(f"{t.name}: {TensorType(t.shape, t.dtype)}" for t in fn.inputs)
    outs = ", ".join(f"{t.name}: {TensorType(t.shape, t.dtype)}" for t in fn.outputs)
    lines = [f"def {fn.name}({params}) -> ({outs}):"]
    for stage in te.stages(fn.outputs):
        if stage.body is None:
            continue
        idx = ", ".join(a.name for a in stage.axes)
        lines.append(f"    {stage.name}[{idx}] = {expr_text(stage.body)}")
    return "\n".join(lines)


def module_text(mod: IRModule) -> str:
    """The whole module as text: graph functions, then primitive functions in name order."""
    parts = ["# mlcpack IRModule"]
    graph = [f for f in mod.functions.values() if isinstance(f, Function)]
    prims = sorted(mod.prim_funcs().values(), key=lambda f: f.name)
    parts += ["@function\n" + function_text(f) for f in graph]
    parts += ["@prim_func\n" + prim_func_text(f) for f in prims]
    return "\n\n".join(parts) + "\n"
