"""IR invariants, checked between passes in tests (and by ``run_pipeline(verify=True)``)."""

from __future__ import annotations

from . import te
from .graph import (Call, CallLibrary, CallTIR, Constant, Function, IRModule, PrimFunc,
                    TensorType, Var)


class VerifyError(Exception):
    """The IR broke an invariant; the message names the function and the binding."""


def verify_module(mod: IRModule) -> None:
    for fn in mod.functions.values():
        if isinstance(fn, Function):
            _verify_function(mod, fn)
        else:
            verify_prim_func(fn)


def _verify_function(mod: IRModule, fn: Function) -> None:
    from ..ops import OPS

    defined: set[int] = {id(p) for p in fn.params}
    where = f"function {fn.name}"

    def check_use(v: object, ctx: str) -> None:
        if isinstance(v, Constant):
            return
        if not isinstance(v, Var):
            raise VerifyError(f"{where}: {ctx} uses a non-value {v!r}")
        if id(v) not in defined:
            raise VerifyError(f"{where}: {ctx} uses {v.name} before it is defined")

    for b in fn.bindings():
        ctx = f"binding {b.var.name}"
        if id(b.var) in defined:
            raise VerifyError(f"{where}: {b.var.name} is bound twice")
        value = b.value
        args = getattr(value, "args", [value])
        for a in args:
            check_use(a, ctx)
        if isinstance(value, CallTIR):
            callee = mod.functions.get(value.func)
            if not isinstance(callee, PrimFunc):
                raise VerifyError(f"{where}: {ctx} calls missing primitive function {value.func}")
            if len(callee.inputs) != len(value.args):
                raise VerifyError(f"{where}: {ctx} passes {len(value.args)} args to "
                                  f"{value.func}, which takes {len(callee.inputs)}")
            for a, p in zip(value.args, callee.inputs):
                if a.type != TensorType(p.shape, p.dtype):
                    raise VerifyError(f"{where}: {ctx} passes {a.type} for {p.name} "
                                      f"{TensorType(p.shape, p.dtype)}")
            out = callee.outputs[0]
            if value.type != TensorType(out.shape, out.dtype):
                raise VerifyError(f"{where}: {ctx} output type {value.type} differs from "
                                  f"{value.func}'s output")
        elif isinstance(value, Call):
            if value.op not in OPS:
                raise VerifyError(f"{where}: {ctx} calls unknown operator {value.op}")
            # the relations it holds under were kept when the call was made
            inferred, _ = OPS[value.op].infer_type(*(a.type for a in value.args),
                                                   **value.attrs)
            if inferred != value.type:
                raise VerifyError(f"{where}: {ctx} is typed {value.type}, infers {inferred}")
        elif not isinstance(value, (CallLibrary, Var, Constant)):
            raise VerifyError(f"{where}: {ctx} has an unknown value {type(value).__name__}")
        if b.var.type != value.type:
            raise VerifyError(f"{where}: {ctx} var type {b.var.type} != value type {value.type}")
        defined.add(id(b.var))
    for o in fn.outputs:
        check_use(o, "return")


def verify_prim_func(fn: PrimFunc) -> None:
    inputs = {t.uid for t in fn.inputs}
    for stage in te.stages(fn.outputs):
        if stage.body is None:
            if stage.uid not in inputs:
                raise VerifyError(f"prim_func {fn.name}: reads {stage.name}, not an input")
            continue
        _verify_expr(fn.name, stage, stage.body, set(id(a) for a in stage.axes))


def _verify_expr(fname: str, stage: te.Tensor, e: te.Expr, bound: set[int]) -> None:
    where = f"prim_func {fname}, stage {stage.name}"
    if isinstance(e, te.IndexVar) and id(e) not in bound:
        raise VerifyError(f"{where}: index {e.name} is not bound here")
    if isinstance(e, te.Reduce):
        bound = bound | {id(a) for a in e.axes}
    if isinstance(e, te.Read) and len(e.indices) != e.tensor.ndim:
        raise VerifyError(f"{where}: {e.tensor.name} read with {len(e.indices)} indices")
    for c in te.children(e):
        _verify_expr(fname, stage, c, bound)
