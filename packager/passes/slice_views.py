"""Slices of a leading-contiguous range (a Split or Slice of channels at batch 1: every axis
before the sliced one has extent 1, step 1) become ``slice_view`` calls: a view at a byte offset
into the sliced tensor's buffer, with no kernel and no copy (vm_emit gives the view a tensor row
at the buffer's offset plus the slice's). Only in a static ``main`` (a symbolic program's rows
hold storage ids, not offsets, so a view there would need a format change), never over an
input's or an output's bytes (the runtimes read inputs and write outputs in place through the
rows at their offsets), and only at offsets of whole 16-byte units (what a caller's array gives
a kernel reading in place)."""

from __future__ import annotations

from ..ir import te
from ..ir.graph import Call, Constant, Function, IRModule, Var
from ..ir.sym import is_static
from ..ops import get_op
from ..ops.index import slice_ranges
from ..ops.registry import VIEW
from .common import rewrite_function

VIEW_ALIGN = 16   # bytes: a view's offset into its buffer is a multiple of this


def contiguous_offset(shape: tuple, call: Call) -> int | None:
    """The element offset of ``call``'s (a strided_slice of a tensor of ``shape``) result in
    its input when that result is one contiguous run of it, else None."""
    ranges = slice_ranges(shape, **call.attrs, relations=[])
    sliced = [a for a, (s, st, n) in enumerate(ranges) if (s, st, n) != (0, 1, shape[a])]
    if not sliced:
        return 0
    a = sliced[0]
    start, step, n = ranges[a]
    if step != 1 or n <= 0 or any(shape[k] != 1 for k in range(a)):
        return None
    if len(sliced) > 1:
        return None   # a later axis sliced too: not one run
    inner = 1
    for d in shape[a + 1:]:
        inner *= d
    return start * inner


def _static_program(mod: IRModule, fn: Function) -> bool:
    return (not mod.dynamic_sizes and not getattr(mod, "value_vars", None)
            and all(is_static(p.type.shape) for p in fn.params))


def slices_as_views(mod: IRModule, func: str = "main") -> IRModule:
    fn = mod.functions.get(func)
    if not isinstance(fn, Function) or not _static_program(mod, fn):
        return mod
    made = {id(b.var): b.value for b in fn.bindings()}

    def root(v):   # the value whose buffer ``v``'s bytes are (through views)
        while isinstance(made.get(id(v)), Call) and get_op(made[id(v)].op).kind == VIEW:
            v = made[id(v)].args[0]
        return v

    params = {id(p) for p in fn.params}
    io_roots = {id(root(o)) for o in fn.outputs} | params

    def visit(b, lookup):
        v = b.value
        if not (isinstance(v, Call) and v.op == "strided_slice"):
            return None
        x = v.args[0]
        if isinstance(x, Constant) or not isinstance(x, Var) or id(root(x)) in io_roots:
            return None
        if id(root(b.var)) in io_roots or id(b.var) in io_roots:
            return None
        shape = tuple(x.type.shape)
        if not is_static(shape) or not is_static(v.type.shape):
            return None
        offset = contiguous_offset(shape, v)
        if offset is None or (offset * te.itemsize(v.type.dtype)) % VIEW_ALIGN:
            return None
        return Call("slice_view", [x], {"shape": tuple(int(d) for d in v.type.shape),
                                        "offset": int(offset)}, v.type)

    out = mod.copy()
    out.functions[func] = rewrite_function(fn, visit)
    return out

