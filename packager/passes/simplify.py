"""Graph passes that change no computation: binding parameters, folding constants, removing dead
bindings and unused primitive functions."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ir.sym import SymExpr, is_static, shape_vars
from ..ir.graph import Call, CallTIR, Constant, Function, IRModule, used_values
from ..ops import get_op
from .common import map_functions, rewrite_function
from .stored_int import derive, stored_dequantize


class BindError(Exception):
    """A parameter given to ``bind_params`` does not match the function's declared type."""


def bind_params(mod: IRModule, params: Mapping[str, np.ndarray], func: str = "main") -> IRModule:
    """Replace the parameters of ``func`` named in ``params`` by constants (BindParams)."""
    fn = mod.functions[func]
    assert isinstance(fn, Function)
    subst: dict[int, Constant] = {}
    kept = []
    for p in fn.params:
        if p.name not in params:
            kept.append(p)
            continue
        data = np.asarray(params[p.name], order="C")
        if tuple(data.shape) != p.type.shape or str(data.dtype) != p.type.dtype:
            raise BindError(f"parameter {p.name} is declared {p.type}, given {data.shape} "
                            f"{data.dtype}")
        subst[id(p)] = Constant(p.name, data)
    rewritten = rewrite_function(Function(fn.name, kept, fn.blocks, fn.outputs, fn.output_names),
                                 lambda b, lookup: None, subst)
    out = mod.copy()
    out.functions[func] = rewritten
    return out


# Calls fold_constants leaves for later: a dequantized constant weight stays integer until the
# quantized-kernel fusion has seen it (``fold_dequantize`` folds the rest after it).
KEPT_UNFOLDED = frozenset({"dequantize"})
# Calls never folded: a binding of a size, an If run as the VM's branch (their work is the VM's)
UNFOLDED = frozenset({"bind_size", "if", "if_output", "check", "loop", "loop_output",
                      "loop_rows"})


def _sized_at_run_time(attrs: Mapping) -> bool:
    """Whether an attribute is a size known only at run time (a ``resize_taps`` input size):
    the call computes at run time even when its arguments are constants."""
    def symbolic(v: object) -> bool:
        return isinstance(v, SymExpr) or isinstance(v, (tuple, list)) and any(map(symbolic, v))
    return any(symbolic(v) for v in attrs.values())


def fold_constants(mod: IRModule, keep: frozenset[str] = KEPT_UNFOLDED) -> IRModule:
    """Evaluate every high-level call whose arguments are all constants, with its numpy
    reference, except calls of the operators in ``keep``."""

    def visit(b, lookup):
        v = b.value
        if isinstance(v, Call) and v.args and v.op not in keep and v.op not in UNFOLDED \
                and all(isinstance(a, Constant) for a in v.args) and is_static(v.type.shape) \
                and not _sized_at_run_time(v.attrs):
            ref = get_op(v.op).reference
            data = np.asarray(ref(*(a.data for a in v.args), **v.attrs), dtype=v.type.dtype,
                              order="C")
            if v.op == "dequantize":
                return Constant(b.var.name, data, stored_dequantize(data, *(a.data for a in v.args)))
            stored = [i for i, a in enumerate(v.args) if a.stored is not None]
            if len(stored) == 1:   # a weight stored as integers, rearranged: keep it stored
                k = stored[0]

                def again(x, args=v.args, k=k):
                    return np.asarray(ref(*(x if i == k else a.data for i, a in enumerate(args)),
                                          **v.attrs), dtype=v.type.dtype)
                return derive(b.var.name, v.args[k], again, data)
            return Constant(b.var.name, data)
        return None

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))


def fold_dequantize(mod: IRModule) -> IRModule:
    """``fold_constants`` folding dequantized constants too (and what then becomes constant):
    weights no integer kernel took run as float32 constants."""
    return fold_constants(mod, keep=frozenset())


def eliminate_dead_code(mod: IRModule) -> IRModule:
    """Drop bindings no output depends on, then primitive functions nothing calls."""
    out = mod.copy()
    called: set[str] = set()
    for name, fn in mod.functions.items():
        if not isinstance(fn, Function):
            continue
        live = {id(o) for o in fn.outputs}
        # a size bound at run time that a kept value's shape names (a Loop's resized carried
        # value, ``carriedK``, bound before the loop and read by the body's kernels)
        named = shape_vars([d for o in fn.outputs for d in o.type.shape])
        kept_rev = []
        for b in reversed(list(fn.bindings())):
            v = b.value
            if id(b.var) in live or (isinstance(v, Call) and (
                    v.op == "check" or v.op == "bind_size" and v.attrs["var"] in named)):
                kept_rev.append(b)
                live.update(id(a) for a in used_values(b.value))
                named |= shape_vars(b.var.type.shape)
                if isinstance(v, Call) and v.op == "loop":   # its states' shapes
                    named |= shape_vars([d for shape, _ in v.attrs["outputs"] for d in shape])
                if isinstance(b.value, CallTIR):
                    called.add(b.value.func)
        new_fn = Function(fn.name, fn.params, [type(fn.blocks[0])(list(reversed(kept_rev)))]
                          if fn.blocks else [], fn.outputs, fn.output_names)
        out.functions[name] = new_fn
    for name in list(out.prim_funcs()):
        if name not in called:
            del out.functions[name]
    return out

