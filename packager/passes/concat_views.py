"""A concat of a leading-contiguous range (channels at batch 1, or the outer-most axis: every
axis before the concatenated one has extent 1) is made in place: the kernels that produce its
parts write them straight into the concat's buffer at their byte offsets, and the concat kernel
disappears (the mirror of ``passes/slice_views.py``). Only in a static ``main``, after fusion
(a concat that took an elementwise epilogue stays a kernel), and never over an input's or an
output's bytes (the runtimes read inputs and write outputs in place through their rows).

The concat becomes a ``concat_in_place`` call whose ``hosted`` attribute says, per part,
whether that part's value is written in place; ``vm_emit`` gives the concat one buffer, alive
from its first part's kernel to its last reader, and each hosted value (through its reshapes)
a tensor row at its offset in it. A part that is not hosted is copied there (a ``COPY``
instruction) where the concat ran: a graph input, a constant, a slice view (its bytes are
another buffer's), a value a library call or a branch made, a model output, a value another
concat (or an earlier part of this one) already hosts, or one at an offset that is not a whole
64-byte unit (the planner's alignment, which every kernel may assume of its output). A concat
that would host nothing stays a kernel. A nested concat made in place is itself hosted: its
parts land in the outer concat's buffer.

The format does not change: a view at a byte offset is a tensor row (as for slice views)."""

from __future__ import annotations

import re

from ..ir import te
from ..ir.graph import Call, CallTIR, Function, IRModule, PrimFunc, Var
from ..ir.sym import is_static
from ..ops import get_op
from ..ops.registry import INJECTIVE, VIEW
from .common import rewrite_function
from .slice_views import _static_program

PART_ALIGN = 64   # bytes: a hosted part's offset in the concat's buffer is a multiple of this
# A part is written in place only when the kernels between its own and the concat write at most
# this many bytes: the concat's buffer lives from its first part on, and bytes held that long
# come back cold when the later parts are written (layout_cdla's PAN concats, whose backbone
# parts came 8-28 MB of writes earlier: their 1x1 convolutions ran 1.2-1.3x slower writing in
# place, 1210 -> 1570 us, more than the concat kernels saved). Such a part is copied in.
PART_SPAN_BYTES = 4 << 20
_CONCAT_KERNEL = re.compile(r"concat\d*")   # legalize's names for a concat's own kernel


def concat_axis(call: CallTIR, func: PrimFunc) -> int | None:
    """The axis ``call`` (a call of a legalized, unfused ``concat``) concatenates along, when
    the result is the parts one after the other in memory (each axis before it of extent 1),
    else None."""
    if (not _CONCAT_KERNEL.fullmatch(call.func) or func.attrs.get("op_kind") != INJECTIVE
            or len(call.args) < 2):
        return None
    out = tuple(call.type.shape)
    shapes = [tuple(a.type.shape) for a in call.args]
    if not is_static(out) or not all(is_static(s) and len(s) == len(out) for s in shapes):
        return None
    if any(a.type.dtype != call.type.dtype for a in call.args):
        return None
    differ = {d for s in shapes for d in range(len(out)) if s[d] != out[d]}
    if len(differ) > 1:
        return None
    axis = differ.pop() if differ else next((d for d in range(len(out))
                                             if sum(s[d] for s in shapes) == out[d]), None)
    if axis is None or sum(s[axis] for s in shapes) != out[axis]:
        return None
    if any(out[d] != 1 for d in range(axis)):
        return None
    return axis


def part_offsets(call: Call) -> list[int]:
    """Each part's byte offset in the result of a ``concat_in_place`` call."""
    offsets, at = [], 0
    for a in call.args:
        offsets.append(at)
        at += a.type.nbytes
    return offsets


def view_root(v, made: dict):
    """The value whose whole buffer ``v``'s bytes are, through reshapes (None through a slice
    view: its bytes are part of another buffer)."""
    while isinstance(made.get(id(v)), Call) and get_op(made[id(v)].op).kind == VIEW:
        call = made[id(v)]
        if call.op not in ("reshape", "bitcast"):
            return None
        v = call.args[0]
    return v


def slice_of(v, made: dict) -> tuple[Var, int] | None:
    """(the value whose whole buffer it is a slice of, the byte offset there) for a slice view
    of a value (through reshapes), else None."""
    call = made.get(id(v))
    if not (isinstance(call, Call) and call.op == "slice_view"):
        return None
    root = view_root(call.args[0], made)
    if root is None:
        return None
    return root, int(call.attrs["offset"]) * te.itemsize(call.type.dtype)


def concats_in_place(mod: IRModule, func: str = "main") -> IRModule:
    fn = mod.functions.get(func)
    if not isinstance(fn, Function) or not _static_program(mod, fn):
        return mod
    bindings = list(fn.bindings())
    made = {id(b.var): b.value for b in bindings}
    io = {id(p) for p in fn.params}
    for o in fn.outputs:   # an output's bytes, and what they are a view of
        while True:
            io.add(id(o))
            value = made.get(id(o))
            if not (isinstance(value, Call) and get_op(value.op).kind == VIEW):
                break
            o = value.args[0]
    concats = {}
    for b in bindings:
        v = b.value
        if isinstance(v, CallTIR) and id(b.var) not in io:
            func_ = mod.functions.get(v.func)
            if isinstance(func_, PrimFunc):
                axis = concat_axis(v, func_)
                if axis is not None:
                    concats[id(b.var)] = axis
    if not concats:
        return mod

    written = [0]   # bytes the bindings before each one write (views and concats: none)
    for b in bindings:
        v = b.value
        moves = isinstance(v, Call) and get_op(v.op).kind == VIEW or id(b.var) in concats
        written.append(written[-1] + (0 if moves else b.var.type.nbytes))
    index = {id(b.var): i for i, b in enumerate(bindings)}
    first: dict[int, int] = {}   # a concat made in place -> the binding of its first part

    hosted_by: set[int] = set()   # values some concat hosts
    decided: dict[int, tuple[bool, ...]] = {}
    for here, b in enumerate(bindings):   # program order: a value feeding two is the first's
        if id(b.var) not in concats:
            continue
        args = b.value.args
        offsets = part_offsets(b.value)
        total = b.var.type.nbytes

        def free(r, here=here) -> bool:
            """A kernel's output (a nested concat's too: made in place, its parts land here;
            else its kernel writes here) that nothing else holds, made shortly before."""
            if (id(r) in io or id(r) in hosted_by or not isinstance(made.get(id(r)), CallTIR)):
                return False
            start = first.get(id(r), index[id(r)])
            return written[here] - written[start + 1] <= PART_SPAN_BYTES

        flags = [False] * len(args)
        # parts that are slices of one value, in its order, covering all of it (a C2f block's
        # Split halves): that value is written where they lie, and they are in place
        for k, a in enumerate(args):
            sliced = slice_of(a, made)
            if sliced is None or flags[k] or not free(sliced[0]):
                continue
            r, at = sliced[0], offsets[k] - sliced[1]
            end = at + r.type.nbytes
            if at < 0 or at % PART_ALIGN or end > total:
                continue
            cover = [j for j in range(len(args))
                     if offsets[j] < end and offsets[j] + args[j].type.nbytes > at]
            if offsets[cover[0]] == at and all(
                    slice_of(args[j], made) is not None and slice_of(args[j], made)[0] is r
                    and offsets[j] - slice_of(args[j], made)[1] == at for j in cover):
                for j in cover:
                    flags[j] = True
                hosted_by.add(id(r))
        for k, a in enumerate(args):
            r = view_root(a, made) if isinstance(a, Var) else None
            if (not flags[k] and r is not None and free(r) and offsets[k] % PART_ALIGN == 0
                    and r.type.nbytes == a.type.nbytes):
                hosted_by.add(id(r))
                flags[k] = True
        if any(flags):
            decided[id(b.var)] = tuple(flags)
            first[id(b.var)] = min(first.get(id(r), index[id(r)]) for r in (
                (slice_of(a, made) or (view_root(a, made),))[0]
                for a, f in zip(args, flags) if f))
    if not decided:
        return mod

    def visit(b, lookup):
        if id(b.var) not in decided:
            return None
        v = b.value
        return Call("concat_in_place", list(v.args),
                    {"axis": concats[id(b.var)], "hosted": decided[id(b.var)]}, v.type)

    out = mod.copy()
    out.functions[func] = rewrite_function(fn, visit)
    called = {b.value.func for f in out.functions.values() if isinstance(f, Function)
              for b in f.bindings() if isinstance(b.value, CallTIR)}
    for name in [n for n, f in out.functions.items() if isinstance(f, PrimFunc)]:
        if name not in called and _CONCAT_KERNEL.fullmatch(name) and name in mod.functions \
                and any(mod.functions[name] is mod.functions.get(b.value.func)
                        for b in bindings if id(b.var) in decided):
            del out.functions[name]
    return out


def hosted_parts(fn: Function) -> dict[int, tuple[int, int]]:
    """For a function after ``concats_in_place``: each hosted value's id (the buffer a part's
    kernel writes, through its reshapes) -> (the id of the concat that hosts it, its byte
    offset in the concat's result)."""
    made = {id(b.var): b.value for b in fn.bindings()}
    out: dict[int, tuple[int, int]] = {}
    for b in fn.bindings():
        v = b.value
        if not (isinstance(v, Call) and v.op == "concat_in_place"):
            continue
        for a, hosted, offset in zip(v.args, v.attrs["hosted"], part_offsets(v)):
            sliced = slice_of(a, made)
            if hosted and sliced is not None:   # a slice of a value written here whole
                out[id(sliced[0])] = (id(b.var), offset - sliced[1])
            elif hosted:
                out[id(view_root(a, made))] = (id(b.var), offset)
    return out

