"""An ONNX ``Loop`` whose trip count or condition has no bound at export, run by the VM
(format 1.8: LOOP ... NEXT, ``packager/ops/control.py``): its body is compiled once and runs as
many times as the model's own trip count and condition say, at run time.

The body is converted in place over placeholders (its iteration number, the carried values),
then its bindings are cut out of the current block into a graph function of the module whose
parameters are the iteration number, the carried values and the outside values it reads (the
captures), and whose outputs are its condition and the new carried values. Inside the body the
condition it is given is always true (an iteration runs only while it holds). Carried values
must keep their type (they are double-buffered in the arena: the body reads one buffer, its
results are copied into it before the next iteration). Scan outputs need memory for every
iteration: planned at the trip count where it has a bound at export (input sizes, a constant up
to MAX_ROWS); else (format 1.9) the body gives its rows and the VM appends them to a row store
that grows by doubling, and each such output must be a model output.
"""

from __future__ import annotations

import numpy as np

from ...packager.errors import ExportError
from ...packager.ir.graph import (Binding, Call, CallLibrary, CallTIR, DataflowBlock,
                                  Function, TensorType, Value, Var)
from ...packager.ir.sym import Dim, is_static, product, shape_vars, size_var
from ...packager.ir.te import itemsize
from .registry import NodeContext

INT64_MAX = (1 << 63) - 1
MAX_ROWS = 1 << 16   # scan rows planned for a constant trip count (a larger one: a row store)
STORE_BYTES = 1 << 28   # a row store's rows (format 1.9) stop at this many bytes: an input error
STORED = "stored"   # emit_vm_loop's rows: appended to row stores by the VM (format 1.9)


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
    run time. Scan outputs: with a bound on the iterations at export (a trip count computed
    from input sizes or a constant), their rows planned at it and the rows that ran counted at
    run time; else appended to row stores by the VM (``_stored_rows``)."""
    from .symvalue import SymValue, dims_of, materialize

    from .sequences import SeqValue

    body = ctx.attrs["body"]
    carried = [ctx.input(i) for i in range(2, ctx.num_inputs)]
    carried = [materialize(ctx.bb, v) if isinstance(v, SymValue) else v for v in carried]
    # a carried sequence that starts empty and that the body appends one element to (a list
    # torch.jit.script appends to, stacked after the loop): the elements are a scan output
    seqs = [k for k, v in enumerate(carried) if isinstance(v, SeqValue)]
    for k in seqs:
        if carried[k].items != []:
            raise ctx.error(f"carried value {k} is a sequence that does not start empty: a "
                            "loop whose trip count is known only at run time carries only "
                            "sequences it starts empty and appends to")
    tensors = [v for k, v in enumerate(carried) if k not in seqs]
    n_all = len(carried)
    n_onnx_scan = len(body.output) - 1 - n_all
    carried = tensors
    n = len(carried)
    n_scan = n_onnx_scan + len(seqs)
    bound = None
    if n_scan and ctx.has_input(0):
        dims = dims_of(ctx.inputs[0])
        if dims is not None and len(dims) == 1 and (not isinstance(dims[0], int)
                                                    or 0 <= dims[0] <= MAX_ROWS):
            # a size expression, or a constant: the rows are planned at it
            bound = dims[0]
    if not n and not n_scan:
        raise ctx.error("a loop with neither carried values nor scan outputs computes nothing")
    if not n:   # only sequences: the loop still needs one carried tensor (the iterations)
        raise ctx.error("a loop that carries only sequences is not supported: carry a tensor "
                        "too")
    trip = (_one(ctx, ctx.input(0), "int64", "the trip count") if ctx.has_input(0)
            else ctx.constant(np.array([INT64_MAX], np.int64), "trip"))
    cond = (_one(ctx, ctx.input(1), "bool", "the condition") if ctx.has_input(1)
            else ctx.constant(np.array([True]), "cond"))
    counter = [ctx.constant(np.zeros(1, np.int64), "ran")] if n_scan else []

    def step(number: Var, states: list[Var]) -> tuple[Value, list[Value], list[Value]]:
        given = iter(states[:n])
        placeholders = [SeqValue(ctx.input(2 + k).dtype, [], carried=True) if k in seqs
                        else next(given) for k in range(n_all)]
        outs = ctx.inline(body, [number, ctx.constant(np.array(True), "running")]
                          + placeholders)
        elements = []
        for k in seqs:   # this iteration's element of each carried sequence
            v = outs[1 + k]
            if not (isinstance(v, SeqValue) and v.appended_to is placeholders[k]):
                raise ctx.error(f"carried value {k} is a sequence the body does not append "
                                "one element to (SequenceInsert at its end, once an iteration)")
            elements.append(v.items[0])
        outs = [o for k, o in enumerate(outs) if k - 1 not in seqs]
        outs = [materialize(ctx.bb, v) if isinstance(v, SymValue) else v for v in outs]
        if any(isinstance(v, SeqValue) for v in outs):
            raise ctx.error("a loop whose trip count is known only at run time gives a "
                            "sequence it does not carry")
        again = _one(ctx, outs[0], "bool", "the body's condition")
        ran = [ctx.emit("add", ctx.reshape(number, (1,)),
                        ctx.constant(np.ones(1, np.int64), "one"))] if n_scan else []
        return again, outs[1:1 + n] + ran, outs[1 + n:] + elements

    def ordered(finals: list[Value], scans: list[Value]) -> list[Value]:
        """The Loop's outputs: carried tensors and sequences (their elements stacked) in the
        node's order, then its scan outputs."""
        kept, rows = iter(finals), scans[n_onnx_scan:]
        out = [SeqValue(ctx.input(2 + k).dtype, stack=rows[seqs.index(k)]) if k in seqs
               else next(kept) for k in range(n_all)]
        return out + scans[:n_onnx_scan]

    if n_scan and bound is None:   # format 1.9: rows the VM appends, no bound at export
        got = _stored_rows(ctx, trip, cond, carried + counter, step, n)
        return ordered(got[:n], got[n:])
    finals, stacks = emit_vm_loop(ctx, trip, cond, carried + counter, step, bound)
    if not n_scan:
        return finals
    after, rows = ctx.bb.bind_size(finals[n], bound, "iterations")
    return ordered(finals[:n], [ctx.bb.emit_op("prefix_rows", s, after, count=rows)
                                for s in stacks])


def _stored_rows(ctx: NodeContext, trip: Value, cond: Value, inits: list[Value], step,
                 n: int) -> list[Value]:
    """A Loop's scan outputs with no bound on the iterations at export (a trip count fed or
    computed at run time, or none): the VM appends each iteration's rows to a row store (format
    1.9: APPEND), the rows that ran counted (carried value ``n``) and bound as a size variable
    ``rowsK`` after the loop, at most STORE_BYTES of rows; each such output may only be a
    model output (``vm_emit`` refuses another use)."""
    finals, loop, row_types = emit_vm_loop(ctx, trip, cond, inits, step, STORED)
    cap = min(max(1, STORE_BYTES // max(1, product(shape) * itemsize(dtype)))
              for shape, dtype in row_types)
    after, count = ctx.bb.bind_size(finals[n], cap, "rows")
    loop.attrs["count"] = str(count)
    first = ctx.bb._block.bindings[_binding_at(ctx, loop)].var
    return finals[:n] + [ctx.bb.emit_op("loop_rows", first, after,
                                        index=loop.attrs["carried"] + k,
                                        count=count, row=(tuple(shape), dtype))
                         for k, (shape, dtype) in enumerate(row_types)]


def _binding_at(ctx: NodeContext, call: Call) -> int:
    """The index of the binding of ``call`` in the current block."""
    return next(i for i, b in enumerate(ctx.bb._block.bindings) if b.value is call)


def run_time_scan(ctx: NodeContext, body, states: list[Value], scans: list[Value],
                  in_axes, in_rev, out_axes, out_rev, steps) -> list[Value]:
    """A Scan over an axis whose length ``steps`` (a size expression) has no bound at export,
    as the VM's loop: iteration ``t`` reads element ``t`` of each scan input (``L - 1 - t``
    backwards) and writes row ``t`` (``L - 1 - t``) of each scan output, planned at ``L`` rows
    for each input size."""
    from .symvalue import SymValue, make, materialize

    length = make(ctx, np.array([steps], dtype=object), "int64", "steps")
    length = materialize(ctx.bb, length) if isinstance(length, SymValue) else length
    n = len(states)

    def step(number: Var, carried: list[Var]) -> tuple[Value, list[Value], list[Value]]:
        t = ctx.reshape(number, (1,))
        back = ctx.emit("subtract", ctx.emit("subtract", length, t),
                        ctx.constant(np.ones(1, np.int64), "one"))
        slices = [ctx.reshape(ctx.emit("take", x, back if r else t, axis=a),
                              x.type.shape[:a] + x.type.shape[a + 1:])
                  for x, a, r in zip(scans, in_axes, in_rev)]
        outs = ctx.inline(body, carried[:n] + slices)
        outs = [materialize(ctx.bb, v) if isinstance(v, SymValue) else v for v in outs]
        return ctx.constant(np.array([True]), "running"), outs[:n], outs[n:]

    finals, stacks = emit_vm_loop(ctx, length, ctx.constant(np.array([True]), "cond"), states,
                                  step, steps, [bool(r) for r in out_rev])
    results = list(finals)
    for stack, axis in zip(stacks, out_axes):
        axis %= len(stack.type.shape)
        if axis:
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(stack.type.shape)))
            stack = ctx.emit("transpose", stack, axes=tuple(perm))
        results.append(stack)
    return results


def emit_vm_loop(ctx: NodeContext, trip: Value, cond: Value, inits: list[Value], step,
                 rows=None, reverse: list[bool] | None = None
                 ) -> tuple[list[Value], list[Value]]:
    """One ``loop`` call: ``step(number, states)`` converts the body in place over placeholders
    (the iteration number, int64 of shape (); the carried values) and gives its condition (one
    bool, shape (1,)), the new carried values and the rows it adds to each scan output. Those
    rows are written into stacks of ``rows`` rows (row ``t`` of iteration ``t``, ``rows - 1 -
    t`` where ``reverse``), carried too. Returns the carried values' and the stacks' finals."""
    bb = ctx.bb
    block = bb._block
    number = Var(bb.fresh_name("iteration"), TensorType((), "int64"))
    states = [Var(bb.fresh_name("carried"), v.type) for v in inits]
    mark = len(block.bindings)
    # carried values whose extents change between iterations in ways the body reads (a KV
    # cache attention reads, a list that shrinks or is recomputed at another size): after a
    # first conversion shows which axes change, the body is converted again over a state whose
    # extent on each such axis is a size variable bound at run time (``carriedK``)
    resized: dict[int, list[tuple[int, str]]] = {}
    # (carried value, axis) -> its sharing key: axes that start at the same extent and change
    # alike in the first conversion (a decoder's key and value caches) share one ``carriedK``,
    # so that the body's relations between them hold (attention's probs @ values); where they
    # then change differently, each takes its own (``separate``)
    plan: dict[tuple[int, int], tuple[str, str]] = {}
    separate: set[tuple[int, int]] = set()
    first_states, first_mark = list(states), mark
    saved = (dict(bb.mod.dynamic_sizes), list(bb.mod.relations))
    for _ in range(6):
        outer_reads = getattr(bb, "shapes_read", None)
        bb.shapes_read = set()   # the values whose shapes the body reads (Shape, Size)
        try:
            again, new, added = step(number, states)
        finally:
            shape_reads, bb.shapes_read = bb.shapes_read, outer_reads
            if outer_reads is not None:
                outer_reads |= shape_reads
        # format 1.10: a carried value that the body only grows by a Concat (``acc =
        # Concat(acc, r)``, read by nothing else) is a row store: its first rows the initial
        # value's (APPEND before the loop), the body's ``r`` appended each iteration, its rows
        # counted
        grown: dict[int, tuple[Binding, Value, int]] = {}
        for k, (a, b) in enumerate(zip(new, states)):
            if a.type != b.type and k not in resized and not {id(a), id(b)} & shape_reads:
                g = _appended(block.bindings[mark:], a, b,
                              [again] + new[:k] + new[k + 1:] + added)
                if g is not None:
                    grown[k] = g
        changing = _changing_axes(new, states, grown, resized, set(bb.mod.dynamic_sizes))
        for k, axes in changing.items():
            for axis in axes:
                plan[(k, axis)] = (str(inits[k].type.shape[axis]), str(new[k].type.shape[axis]))
        split = _diverging(resized, new)
        if not changing and not split:
            break
        separate |= split
        # converted again, from the start, over the resized states
        del block.bindings[first_mark:]
        bb.mod.dynamic_sizes.clear()
        bb.mod.dynamic_sizes.update(saved[0])
        bb.mod.relations[:] = saved[1]
        states, resized = list(first_states), {}
        made: dict[tuple, Dim] = {}
        for (k, axis), key in sorted(plan.items()):
            key = (k, axis) if (k, axis) in separate else key
            if key not in made:
                first = inits[k].type.shape[axis]
                made[key] = bb.bind_size(_size_tensor(ctx, first, (1,)),
                                         _carried_bound(bb.mod, first, states[k].type, axis),
                                         "carried")[1]
            resized.setdefault(k, []).append((axis, str(made[key])))
        for k, axes in resized.items():
            shape = list(states[k].type.shape)
            for axis, name in axes:
                shape[axis] = size_var(name)
            states[k] = Var(bb.fresh_name("carried"), TensorType(tuple(shape),
                                                                 states[k].type.dtype))
        mark = len(block.bindings)
    else:
        raise ctx.error("a carried value of a loop whose trip count is known only at run time "
                        "changes its extents in ways that do not settle after six conversions "
                        "of its body")
    viewed: dict[int, Value] = {}   # a new carried value checked to keep its shape -> the view
    for k, (a, b) in enumerate(zip(new, states)):
        if a.type != b.type and k not in grown and k not in resized:
            new[k] = viewed[id(a)] = _same_shape(ctx, k, a, b.type)
    added = [viewed.get(id(r), r) for r in added]   # a scan output of that value: checked too
    kept = [k for k in range(len(inits)) if k not in grown]
    pieces, prefixes, counters, counted, first_counts = [], [], [], [], []
    for k, (binding, piece, axis) in grown.items():
        block.bindings.remove(binding)
        pieces.append(piece)
        prefixes.append(inits[k])
        at = len(block.bindings)   # the initial value's extent: computed before the loop
        first_counts.append(_size_tensor(ctx, inits[k].type.shape[axis], (1,)))
        moved = block.bindings[at:]
        del block.bindings[at:]
        block.bindings[mark:mark] = moved
        mark += len(moved)
        state = Var(bb.fresh_name("grown"), TensorType((1,), "int64"))
        counters.append(state)
        counted.append(ctx.emit("add", state, _size_tensor(ctx, piece.type.shape[axis], (1,))))
    n_in = len(inits)
    inits = [inits[k] for k in kept] + first_counts
    states = [states[k] for k in kept] + counters
    new = [new[k] for k in kept] + counted
    stored = rows is STORED
    if stored:   # format 1.9: the body gives its rows; the VM appends them (APPEND)
        for k, r in enumerate(added):
            if not is_static(r.type.shape):
                raise ctx.error(f"scan output {k} has rows of shape {r.type.shape}, known only "
                                "at run time, and the loop's trip count has no bound at export: "
                                "give the trip count with --bind NAME=FILE.npy")
        new = new + added
        added = []
    stack_types = [TensorType((rows,) + tuple(r.type.shape), r.type.dtype) for r in added]
    stacks = [Var(bb.fresh_name("rows"), t) for t in stack_types]
    if added:
        t = ctx.reshape(number, (1, 1))
        for k, (stack, row) in enumerate(zip(stacks, added)):
            at = t
            if reverse and reverse[k]:
                last = ctx.constant(np.array([[rows - 1]], np.int64), "last") if \
                    isinstance(rows, int) else _size_tensor(ctx, rows - 1, (1, 1))
                at = ctx.emit("subtract", last, t)
            new.append(ctx.emit("scatter_nd", stack, at,
                                ctx.reshape(row, (1,) + tuple(row.type.shape))))
    if resized:
        _resize_tail(ctx, resized, new, states, kept, [again] + added)
    bindings = block.bindings[mark:]
    del block.bindings[mark:]
    placeholders = [number] + states + stacks
    inside = {id(v) for v in placeholders} | {id(b.var) for b in bindings}
    captures: dict[int, Var] = {}
    for v in [a for b in bindings for a in _reads(b.value)] + [again] + new + pieces:
        if isinstance(v, Var) and id(v) not in inside:
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
    results = [swap.get(id(o), o) for o in [again] + new + pieces]
    mod = bb.mod
    name = mod.unique_name("loop_body")
    mod.functions[name] = Function(name, placeholders + params, [DataflowBlock(bindings)],
                                   results, [f"out{k}" for k in range(len(results))])
    first_rows = [bb.emit_op("full", shape=t.shape, value=0, dtype=t.dtype, name="rows")
                  for t in stack_types]
    carried = list(inits) + first_rows
    # a resized value's type is its state's (its extents the ``carriedK`` bound at run time)
    record = tuple((tuple(v.type.shape), v.type.dtype) for v in states + stacks)
    row_types = tuple((tuple(r.type.shape), r.type.dtype) for r in new[len(carried):])
    extra = {"rows": row_types} if stored else {}
    if resized:   # the carried values (their positions) the body writes into their states
        extra["resized"] = tuple(kept.index(k) for k in resized)
    if grown:   # (axis, the rows' shape past it, dtype, the count's name: set below)
        extra["grown"] = tuple((axis, tuple(p.type.shape[axis + 1:]), p.type.dtype, "")
                               for (_, p, axis) in grown.values())
    first = bb.emit_op("loop", trip, cond, *carried, *outer, *prefixes, body=name,
                       carried=len(carried), outputs=record, name="loop", **extra)
    loop = block.bindings[-1].value
    finals = [first] + [bb.emit_op("loop_output", first, index=k, outputs=record,
                                   name="loop_output") for k in range(1, len(carried))]
    by_k = dict(zip(kept, finals))
    kinds = list(extra.get("grown", ()))
    for j, k in enumerate(grown):
        axis, shape, dtype, _ = kinds[j]
        cap = max(1, STORE_BYTES // max(1, product(shape) * itemsize(dtype)))
        after, count = bb.bind_size(finals[len(kept) + j], cap, "grown")
        kinds[j] = (axis, shape, dtype, str(count))
        by_k[k] = bb.emit_op("loop_rows", first, after, index=len(carried) + len(row_types) + j,
                             count=count, row=(shape, dtype), lead=axis, name="grown")
    if grown:
        loop.attrs["grown"] = tuple(kinds)
    ordered = [by_k[k] for k in range(n_in)]
    if stored:
        return ordered, loop, row_types
    return ordered, finals[len(inits):]


def _changing_axes(new: list[Value], states: list[Var], grown: dict, resized: dict,
                   counted: set[str]) -> dict[int, list[int]]:
    """The axes of each carried value whose new extent differs from its state's in a way that
    neither the row stores (``grown``) nor a check at run time (extents a kernel counts, equal
    each iteration) hold, and that are not resized yet: they become ``carriedK`` sizes. A
    change of dtype or rank is left to ``_same_shape``, which refuses it."""
    carried = {name for axes in resized.values() for _, name in axes}
    plain = counted - carried
    out: dict[int, list[int]] = {}
    for k, (a, b) in enumerate(zip(new, states)):
        shape, want = a.type.shape, b.type.shape
        if k in grown or a.type == b.type or a.type.dtype != b.type.dtype \
                or len(shape) != len(want):
            continue
        done = {axis for axis, _ in resized.get(k, ())}
        axes = [i for i, (x, y) in enumerate(zip(shape, want)) if x != y and i not in done
                and (k in resized or not (shape_vars([x, y]) and shape_vars([x, y]) <= plain))]
        if axes:
            out[k] = axes
    return out


def _diverging(resized: dict, new: list[Value]) -> set[tuple[int, int]]:
    """The (carried value, axis) pairs that share a ``carriedK`` whose new extents differ (each
    then takes its own)."""
    extents: dict[str, set[str]] = {}
    for k, axes in resized.items():
        for axis, name in axes:
            extents.setdefault(name, set()).add(str(new[k].type.shape[axis]))
    bad = {name for name, got in extents.items() if len(got) > 1}
    return {(k, axis) for k, axes in resized.items() for axis, name in axes if name in bad}


def _carried_bound(mod, first, ttype: TensorType, axis: int):
    """The upper bound of a resized carried value's extent on ``axis``: its initial extent
    (over the inputs' sizes) plus as many entries as STORE_BYTES hold of its other extents
    known at export (the state and the body's values over that extent are planned at it: a
    reservation of address space, touched only as far as the loop grows it)."""
    from ...packager.ir.sym import substitute
    from ...packager.vm_emit import dynamic_bounds

    rest = product([d if isinstance(d, int) else 1
                    for i, d in enumerate(ttype.shape) if i != axis])
    cap = max(1, STORE_BYTES // max(1, rest * itemsize(ttype.dtype)))
    if isinstance(first, int):
        return max(first, cap)
    return substitute(first, dynamic_bounds(mod)) + cap


def _resize_tail(ctx: NodeContext, resized: dict, new: list[Value], states: list[Var],
                 kept: list[int], others: list[Value]) -> None:
    """The end of a body with resized carried values: each new extent computed (at this
    iteration's sizes), then bound to its ``carriedK`` (BIND_SIZE), then each new value,
    viewed at its state's shape (now the new extents) where its own shape names those sizes,
    copied by a kernel of its own into the state's buffer (``carried_copy``; vm_emit gives it
    the state's storage). ``new`` and ``states`` are in the loop's carried order (``kept``);
    ``new`` is updated."""
    bb = ctx.bb
    pos = {k: kept.index(k) for k in resized}
    names = {name for axes in resized.values() for _, name in axes}
    if any(shape_vars(o.type.shape) & names for o in others):
        raise ctx.error("a scan output of a loop whose trip count is known only at run time "
                        "has rows whose extents change between iterations (a carried value's "
                        "that grows or shrinks), which rows of one shape cannot hold")
    for k, j in pos.items():
        if any(o is states[j] for i, o in enumerate(new) if i != j) \
                or any(o is states[j] for o in others):
            raise ctx.error(f"carried value {k} changes its extents between iterations and is "
                            "also passed on as another of the loop's values, which a loop "
                            "whose trip count is known only at run time does not run")
    extents, seen = [], set()   # one binding of each (a shared one's extents are equal)
    for k, j in pos.items():
        for axis, name in resized[k]:
            if name not in seen:
                seen.add(name)
                extents.append((_size_tensor(ctx, new[j].type.shape[axis], (1,)), name))
    afters = [bb.emit(Call("bind_size", [e], {"var": name}, e.type), name)
              for e, name in extents]
    for j in pos.values():
        src = new[j]
        if shape_vars(src.type.shape) & names:   # its extents over this iteration's sizes
            src = bb.emit_op("carried_view", src, shape=tuple(states[j].type.shape),
                             name="resized")
        # copied as one flat run of elements (a memcpy), then viewed at the state's shape
        shape = tuple(states[j].type.shape)
        flat = (product(shape),)
        copied = bb.emit_op("carried_copy", ctx.reshape(src, (product(src.type.shape),)),
                            *afters, out=flat, name="resized")
        new[j] = ctx.reshape(copied, shape)


def _appended(bindings: list[Binding], new: Value, state: Var, others: list[Value]
              ) -> tuple[Binding, Value, int] | None:
    """Where carried value ``state``'s new value ``new`` is ``Concat(state, r)`` along an axis
    with only 1s before it (so that each iteration's ``r`` is whole rows after the ones before)
    and the rows' other extents known at export, and neither ``state`` nor ``new`` is read by
    anything else in the body (``bindings``, ``others``: the body's other results): that
    binding, ``r`` and the axis. Such a value grows by ``r`` each iteration (format 1.10)."""
    b = next((b for b in bindings if b.var is new), None)
    v = None if b is None else b.value
    if not (isinstance(v, Call) and v.op == "concat" and len(v.args) == 2
            and v.args[0] is state and v.args[1] is not state):
        return None
    piece = v.args[1]
    shape, rows = tuple(state.type.shape), tuple(piece.type.shape)
    if not shape or len(rows) != len(shape) or piece.type.dtype != state.type.dtype:
        return None
    axis = int(v.attrs.get("axis", 0)) % len(shape)
    if any(not (isinstance(d, int) and d == 1) for d in shape[:axis]) \
            or rows[:axis] != shape[:axis] or rows[axis + 1:] != shape[axis + 1:] \
            or not is_static(rows[axis + 1:]):
        return None
    for o in bindings:
        if o is not b and any(a is state or a is new for a in _reads(o.value)):
            return None
    if any(o is state or o is new for o in others):
        return None
    return b, piece, axis


def _same_shape(ctx: NodeContext, k: int, new: Value, old: TensorType) -> Value:
    """Carried value ``k``'s new value ``new`` as the type it had (``old``) where their extents
    differ only by sizes a kernel counts in the body (a Slice by the iteration number: its
    length is counted): the body checks each such extent equals the old one at run time (TRAP 2
    where not: a carried value whose shape changes between iterations, which this loop does not
    run) and the value keeps its buffer's shape. Any other change is refused at export."""
    from .symvalue import SymValue, materialize

    counted = set(ctx.bb.mod.dynamic_sizes)
    shape, want = new.type.shape, old.shape
    if new.type.dtype != old.dtype or len(shape) != len(want) or any(
            x != y and not (shape_vars([x, y]) and shape_vars([x, y]) <= counted)
            for x, y in zip(shape, want)):
        raise ctx.error(f"carried value {k} changes from {old} to {new.type} between "
                        "iterations: a loop whose trip count is known only at run time needs "
                        "carried values of fixed shape and dtype, or values that only grow by "
                        "a Concat with themselves first, read by nothing else in the body")
    zero = ctx.constant(np.zeros(1, np.int64), "zero")
    for x, y in zip(shape, want):
        if x == y:
            continue
        diff = materialize(ctx.bb, SymValue("extent", np.array([x - y], dtype=object), "int64"))
        bad = ctx.emit("logical_not", ctx.emit("equal", diff, zero))
        ctx.bb.emit(Call("check", [bad], {"where": f"carried value {k}", "trap": 2}, bad.type),
                    "check")
    return ctx.bb.emit_op("carried_view", new, shape=tuple(want), name="carried")


def _size_tensor(ctx: NodeContext, expr, shape: tuple) -> Value:
    """The size expression ``expr`` as an int64 tensor of ``shape`` (one element)."""
    from .symvalue import SymValue, make, materialize

    v = make(ctx, np.array([expr], dtype=object), "int64", "size")
    v = materialize(ctx.bb, v) if isinstance(v, SymValue) else v
    return ctx.reshape(v, shape)


def _reads(value) -> list[Value]:
    if isinstance(value, (Call, CallTIR, CallLibrary)):
        return list(value.args)
    return [value] if isinstance(value, Var) else []


class NeedsRunTimeLoop(ExportError):
    """Unrolling a Loop needs a bound its trip count does not have at export."""


def casts_into_rows(mod) -> None:
    """A Cast of a row-store output (format 1.9) that nothing else reads, as ONNX's Range
    function ends (``Cast(Loop(...)[1])``), done on each row inside the loop's body before the
    VM appends it: a row store is returned as it is, so only the model's outputs may read it,
    and the rows are then already of the output's dtype."""
    fn = mod.functions.get("main")
    if not isinstance(fn, Function):
        return
    blocks = [blk for blk in fn.blocks if blk.bindings]
    producer = {id(b.var): b for blk in blocks for b in blk.bindings}
    reads: dict[int, int] = {}
    for blk in blocks:
        for b in blk.bindings:
            for a in _reads(b.value):
                reads[id(a)] = reads.get(id(a), 0) + 1
    for blk in blocks:
        for b in list(blk.bindings):
            v = b.value
            src = producer.get(id(v.args[0])) if isinstance(v, Call) and v.op == "cast" else None
            if src is None or not (isinstance(src.value, Call) and src.value.op == "loop_rows") \
                    or "lead" in src.value.attrs \
                    or reads.get(id(src.var)) != 1 or any(o is src.var for o in fn.outputs):
                continue
            rows_call = src.value
            loop = producer[id(rows_call.args[0])].value
            body = mod.functions[loop.attrs["body"]]
            k = rows_call.attrs["index"] - loop.attrs["carried"]
            at = 1 + loop.attrs["carried"] + k
            row = body.outputs[at]
            dtype = v.attrs["dtype"]
            cast = Var(f"{row.name}_as_{dtype}", TensorType(row.type.shape, dtype))
            body.blocks[-1].bindings.append(Binding(cast, Call("cast", [row], dict(v.attrs),
                                                               cast.type)))
            body.outputs[at] = cast
            kinds = list(loop.attrs["rows"])
            kinds[k] = (kinds[k][0], dtype)
            loop.attrs["rows"] = tuple(kinds)
            rows_call.attrs["row"] = kinds[k]
            rows_call.type = TensorType(rows_call.type.shape, dtype)
            src.var.type = rows_call.type
            blk.bindings.remove(b)   # the cast's readers read the rows
            fn.outputs = [src.var if o is b.var else o for o in fn.outputs]
            for other in (x for blk2 in blocks for x in blk2.bindings):
                if isinstance(other.value, (Call, CallTIR, CallLibrary)):
                    other.value.args = [src.var if a is b.var else a for a in other.value.args]
                elif other.value is b.var:
                    other.value = src.var
