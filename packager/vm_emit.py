"""Lowers the graph function ``main`` (after the pass pipeline) to VM bytecode over a static
memory plan.

Instruction set (little-endian int32 words; the runtime's ``vm.py`` documents the same):

    CALL_KERNEL  1, kernel, n, t_1 .. t_n   call kernel number ``kernel`` with tensors t_1..t_n
                                            (inputs, outputs, then its workspace if it has one)
    CALL_LIB     2, site, n, t_1 .. t_n     call library function of call site ``site``
                                            (inputs then the output, destination-passing)
    COPY         3, src, dst                copy tensor ``src`` into ``dst`` (same byte size)
    BIND_SIZE    4, var, t                  size variable ``var`` (its index in the sizes array)
                                            takes the int64 value of tensor ``t`` (one element,
                                            a count a kernel wrote), checked against its bound
    JUMP_UNLESS  5, t, w                    (format 1.7) unless tensor ``t`` (one bool) is true,
                                            continue at word ``w`` (forward only)
    JUMP         6, w                       (format 1.7) continue at word ``w`` (forward only)
    TRAP         7, reason                  (format 1.7) refuse the run: 0, a branch left out;
                                            1, a size relation of the taken branch fails
    LOOP         8, m, c, i, w              (format 1.8) a counted loop's head: unless count
                                            ``m`` > 0 and ``c`` holds, continue at word ``w``
                                            (after its NEXT); the VM writes the iteration
                                            number into ``i``
    NEXT         9, c, h                    (format 1.8) back to the body of the LOOP at word
                                            ``h`` while the next iteration is below its count
                                            and ``c`` holds
    APPEND      10, s, r                    (format 1.9) append tensor ``r`` as one more row
                                            of STORE row ``s`` (a scan output with no bound)

An ``if`` call (ops/control.py) is laid out as ``JUMP_UNLESS cond -> else; then; copies; JUMP ->
end; else; copies``: each branch's bindings are emitted in place from its graph function, and
its results copied into the If's outputs. Steps number the bindings in that order, so the memory
plan sees the branches one after the other: a buffer of one branch may reuse one of the other
(only one runs), and the outputs and what the branches read live across both.

A ``loop`` call (ops/control.py) is laid out as ``COPY init -> state (each carried value); LOOP
trip, cond, i -> end; body; COPY new -> state; NEXT cond' -> LOOP; end:``. The body's bindings
are emitted once, in place, from its graph function, over the state buffers; a new value that
is itself a state (a carried value passed on or swapped) goes through a buffer of its own
first. The states, the iteration number and what the body reads from outside live from the
LOOP to the NEXT, so no buffer of the body shares their memory; the body's own buffers live
within one iteration, which writes each before it reads it.
A loop with ``rows`` (scan outputs with no bound at export, format 1.9) appends each of the
body's row results to a STORE tensor row (``APPEND s, r``, after the body, before the copies);
its ``loop_rows`` outputs are those STORE rows, which only the model's outputs may name. A
loop with ``grown`` (carried values that grow, format 1.10) has a STORE row for each, named by
the vm record's ``grows``: its initial value appended before the LOOP, the body's piece after
the body (several rows at once).

Tensors are rows of a table: ``[0, arena offset, shape, dtype]`` or ``[1, constant, shape,
dtype]``. A reshape is a second row over the same bytes, so it costs no instruction; so is a
``slice_view`` (a leading-contiguous slice, passes/slice_views.py), at its offset into them. Each
input record lists its ``views``: its own row and those of its reshapes. A ``concat_in_place``
(passes/concat_views.py) has one buffer from its first part's kernel to its last reader: the
kernels of its hosted parts write rows at their offsets in it (a nested one's parts at the
outer one's), the other parts are COPY-ed in where the concat was, and it costs no kernel.

The program's rows are the bundle header's records (``runtime/header.py``: ``TensorRow``,
``IORow``, ``LibraryCall``, ``Symbolic``), which the export puts in the plan as they are
(constants renumbered into the bundle's table). docs/format.md specifies them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .codegen.lower import KernelInfo, symbolic_vars
from .ir.graph import (Call, CallLibrary, CallTIR, Constant, Function, IRModule, Source,
                       TensorType, Value, Var, merge_sources)
from .ir import te
from .ir.sym import (Dim, SymExpr, is_static, nondecreasing_in, product, relation_text, shape_vars,
                     size_var, substitute, to_record)
from .ops import get_op
from .ops.registry import VIEW
from .passes.concat_views import hosted_parts, part_offsets
from .passes.memory_plan import Buffer, plan_memory
# SIZES rows (symbolic programs) hold the int64 values of the size variables
from ..runtime.header import (ARENA, CONST, OP_APPEND, OP_BIND_SIZE, OP_CALL_KERNEL,
                              OP_CALL_LIB, OP_COPY, OP_JUMP, OP_JUMP_UNLESS, OP_LOOP, OP_NEXT,
                              OP_TRAP, SIZES, STORE,
                              IORow,
                              LibraryCall, Symbolic, TensorRow, freeze)



class VMEmitError(Exception):
    """The graph function has a form the VM cannot run (e.g. a high-level op left unlegalized)."""


@dataclass
class Program:
    # CONST rows' refs index ``constants`` (the export renumbers them into the bundle's)
    tensors: list[TensorRow] = field(default_factory=list)
    instructions: list[list[int]] = field(default_factory=list)
    constants: list[Constant] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)       # prim func names, by kernel index
    # by kernel index: the source-model nodes of the calls that use it (a prim func has one
    # call site after the passes; identical kernels share a symbol, never a row)
    kernel_sources: list[tuple[Source, ...]] = field(default_factory=list)
    library_calls: list[LibraryCall] = field(default_factory=list)
    inputs: list[IORow] = field(default_factory=list)
    outputs: list[IORow] = field(default_factory=list)
    arena_bytes: int = 0
    intermediate_bytes: int = 0   # what the tensors would take with no reuse
    branches: int = 0   # JUMP_UNLESS instructions (an If's branch, a size check): format 1.7
    loops: int = 0      # LOOP ... NEXT regions (a Loop run by the VM): format 1.8
    stores: int = 0     # STORE rows (a Loop's scan outputs with no bound): format 1.9
    carried_checks: int = 0   # TRAP 2 (a Loop's carried value whose shape changed): 1.9
    grows: list = field(default_factory=list)   # STORE rows of carried values that grow: 1.10
    # A symbolic program (size variables in main's input shapes): tensor rows hold storage ids,
    # not offsets, and shapes as dim records; the runtime plans memory per concrete shape
    # (runtime/symbolic.py) from its size variables and buffers (no ``bound``: the export adds
    # it when every size has one).
    symbolic: Symbolic | None = None

    @property
    def bytecode(self) -> bytes:
        words = [w for ins in self.instructions for w in ins]
        return struct.pack(f"<{len(words)}i", *words)


def source_records(sources: tuple[Source, ...]) -> tuple[dict[str, str], ...]:
    """How the bundle header lists a call's source nodes: ``[{"name", "op"}, ...]``."""
    return tuple({"name": s.name, "op": s.op} for s in sources)


def main_size_vars(mod: IRModule, func: str = "main") -> tuple[str, ...]:
    """The size variables of ``func``'s input shapes and those bound at run time by kernels
    (``IRModule.dynamic_sizes``), in the order of the runtime's sizes array (sorted by name);
    () for a fully static model."""
    fn = mod.functions.get(func)
    if not isinstance(fn, Function):
        return ()
    names = set(mod.dynamic_sizes).union(*(shape_vars(p.type.shape) for p in fn.params))
    if func == "main":   # bound from inputs' values (a Reshape's shape fed at run time)
        names |= {v for row in getattr(mod, "value_vars", ()) for v in row[2]}
    return tuple(sorted(names))


def dynamic_bounds(mod: IRModule) -> dict[str, Dim]:
    """Each run-time-bound size variable's upper bound over the inputs' size variables only
    (a bound that names an earlier such variable takes that one's bound)."""
    out: dict[str, Dim] = {}
    for name, bound in mod.dynamic_sizes.items():
        out[name] = substitute(bound, out)
    return out


def value_rows(mod: IRModule, rules: str = "all") -> tuple | None:
    """The symbolic record's ``values``: how inputs' values bind size variables (format
    1.6, docs/format.md section 10.8), dims as records; None when no input does. ``rules``:
    ``"values"`` leaves out the ``scales`` rows (format 1.7's own key), ``"scales"`` keeps only
    them, ``"all"`` (what the runtime binds) keeps every row."""
    rows = []
    for param, rule, names, *args in getattr(mod, "value_vars", ()):
        if rules != "all" and (rule == "scales") != (rules == "scales"):
            continue
        extra = [[to_record(d) for d in a] if isinstance(a, (list, tuple)) else a for a in args]
        rows.append(freeze([param, rule, list(names), *extra]))
    return tuple(rows) or None


def _nonnegative(d: Dim) -> bool:
    """Whether ``d`` is at least 0 wherever its variables are: positive coefficients over
    variables and floor divisions or remainders of such sums."""
    if isinstance(d, int):
        return d >= 0
    return all(c > 0 and all(isinstance(a, str) or _nonnegative(a[1]) for a in m)
               for m, c in d.terms.items())


def _dropping_negative_terms(d: Dim) -> Dim | None:
    """An upper bound of ``d`` (``-(-n // 64) * 64``, a workspace rounded up, is
    ``64 n' - 64 (n'' // 64)`` in canonical form, which does not show that it grows with n):
    ``d`` without its negative terms, where each of those is a nonnegative value; else None."""
    if isinstance(d, int):
        return d
    kept: Dim = 0
    for m, c in d.terms.items():
        term = SymExpr({m: c})
        if c > 0:
            kept = kept + term
        elif not _nonnegative(SymExpr({m: 1})):
            return None
    return kept


def _shape_record(shape: tuple) -> list:
    return [to_record(d) for d in shape]


def emit_program(mod: IRModule, kernels: dict[str, KernelInfo], func: str = "main") -> Program:
    fn = mod.functions[func]
    if not isinstance(fn, Function):
        raise VMEmitError(f"{func} is not a graph function")
    prog = Program()
    rows: list[list] = []   # the tensor table as it is built: [kind, ref, shape, dtype]
    inputs: list[dict] = []
    outputs: list[dict] = []
    size_vars = main_size_vars(mod, func)
    sizes_row: list[int] = []   # the tensor row of the sizes array (symbolic kernels' last arg)
    tensor_of: dict[int, int] = {}          # id(value) -> tensor row
    storage_of_tensor: dict[int, int] = {}  # tensor row -> storage id (arena rows only)
    view_delta: dict[int, int] = {}   # tensor row -> bytes past its storage's start (slice_view)
    buffers: dict[int, Buffer] = {}
    kernel_index: dict[str, int] = {}
    const_index: dict[int, int] = {}
    dynamic = dynamic_bounds(mod)   # sizes bound at run time -> their bounds (input sizes)
    bound_now: set[str] = set()

    def new_storage(ttype: TensorType, step: int) -> int:
        sid = len(buffers)
        size = ttype.nbytes if is_static(ttype.shape) else \
            product(ttype.shape) * te.itemsize(ttype.dtype)
        if dynamic and shape_vars(ttype.shape) & dynamic.keys():
            # a size a kernel counts at run time: allocated at its bound
            if not nondecreasing_in(size, dynamic):
                size = _dropping_negative_terms(size)   # a workspace rounded up to 64 bytes
            if size is None or not nondecreasing_in(size, dynamic):
                raise VMEmitError(f"a tensor of shape {ttype.shape} would not fit the memory "
                                  "planned for its sizes' upper bounds")
            size = substitute(size, dynamic)
        buffers[sid] = Buffer(sid, size, step, step)
        return sid

    def arena_tensor(ttype: TensorType, sid: int) -> int:
        rows.append([ARENA, sid, _shape_record(ttype.shape), ttype.dtype])
        storage_of_tensor[len(rows) - 1] = sid
        return len(rows) - 1

    # concats made in place (passes/concat_views.py): a hosted value's id -> (its concat's id,
    # its byte offset there); the outer-most concat's storage, made by its first part's kernel
    hosts = hosted_parts(fn) if func == "main" and not size_vars else {}
    var_of = {id(b.var): b.var for b in fn.bindings()} if hosts else {}
    host_storage: dict[int, int] = {}

    def placed_row(var: Var, step: int) -> int:
        """A tensor row for ``var`` at its place in the outer-most concat hosting it."""
        top, delta = id(var), 0
        while top in hosts:
            top, offset = hosts[top]
            delta += offset
        if top not in host_storage:
            host_storage[top] = new_storage(var_of[top].type, step)
        t = arena_tensor(var.type, host_storage[top])
        if delta:
            view_delta[t] = delta
        return t

    def use(v: Value, step: int, output: bool = False) -> int:
        if isinstance(v, Constant):
            if id(v) not in const_index:
                const_index[id(v)] = len(prog.constants)
                prog.constants.append(v)
                rows.append([CONST, const_index[id(v)], list(v.type.shape), v.type.dtype])
                tensor_of[id(v)] = len(rows) - 1
            return tensor_of[id(v)]
        t = tensor_of.get(id(v))
        if t is None:
            raise VMEmitError(f"{getattr(v, 'name', v)} is used before it is defined")
        if rows[t][0] == STORE and not output:
            raise VMEmitError("a Loop's scan output, or a carried value that grows, whose "
                              "trip count has no bound at export can only be a model output, "
                              "not read by other nodes: give the trip count with --bind "
                              "NAME=FILE.npy")
        sid = storage_of_tensor.get(t)
        if sid is not None:
            buffers[sid].end = max(buffers[sid].end, step)
        return t

    for p in fn.params:
        t = arena_tensor(p.type, new_storage(p.type, 0))
        tensor_of[id(p)] = t
        inputs.append({"name": p.name, "shape": _shape_record(p.type.shape),
                       "dtype": p.type.dtype, "tensor": t})
        bound = getattr(mod, "max_shapes", {}).get(p.name)
        if bound is not None and not is_static(p.type.shape):   # --max-shape, checked at run
            inputs[-1]["max_shape"] = list(bound)

    clock = [0]   # steps: one per binding and per copy, in the order the program runs them
    jumps: list[tuple[list[int], int, int]] = []   # (instruction, its slot, target instruction)

    def tick() -> int:
        clock[0] += 1
        return clock[0]

    def emit_bindings(body: Function) -> None:
        for b in body.bindings():
            emit_binding(b, tick())

    def emit_binding(b, step: int) -> None:
        v = b.value
        if isinstance(v, Call) and get_op(v.op).kind == VIEW:
            src = use(v.args[0], step)
            if rows[src][0] == CONST:
                raise VMEmitError(f"{b.var.name}: view of a constant should have been folded")
            t = tensor_of[id(b.var)] = arena_tensor(b.var.type, storage_of_tensor[src])
            delta = view_delta.get(src, 0)
            if v.op == "slice_view":   # a leading-contiguous slice: its offset in the buffer
                delta += int(v.attrs["offset"]) * te.itemsize(v.type.dtype)
            if delta:
                if size_vars:
                    raise VMEmitError(f"{b.var.name}: a view at an offset in a symbolic "
                                      "program (its rows hold storage ids, not offsets)")
                view_delta[t] = delta
            return
        if isinstance(v, (Var, Constant)):
            tensor_of[id(b.var)] = use(v, step)
            return
        if isinstance(v, Call) and v.op == "concat_in_place":   # its hosted parts are in place
            if size_vars:
                raise VMEmitError(f"{b.var.name}: a concat in place in a symbolic program")
            t = tensor_of[id(b.var)] = placed_row(b.var, step)
            at = view_delta.get(t, 0)
            for a, hosted, offset in zip(v.args, v.attrs["hosted"], part_offsets(v)):
                src = use(a, step)
                if hosted:
                    if (storage_of_tensor.get(src) != storage_of_tensor[t]
                            or view_delta.get(src, 0) != at + offset):
                        raise VMEmitError(f"{b.var.name}: a part written in place is not at "
                                          "its place in the concat's buffer")
                    continue
                dst = arena_tensor(a.type, storage_of_tensor[t])
                if at + offset:
                    view_delta[dst] = at + offset
                prog.instructions.append([OP_COPY, src, dst])
            return
        if isinstance(v, Call) and v.op == "bind_size":   # no kernel: the VM binds the size
            count = use(v.args[0], step)
            name = v.attrs["var"]
            prog.instructions.append([OP_BIND_SIZE, size_vars.index(name), count])
            tensor_of[id(b.var)] = count
            bound_now.add(name)
            return
        if isinstance(v, Call) and v.op == "if":
            emit_if(b, step)
            return
        if isinstance(v, Call) and v.op == "check":   # JUMP_UNLESS bad -> on; TRAP 1 (or 2)
            bad = use(v.args[0], step)
            over = [OP_JUMP_UNLESS, bad, -1]
            trap = v.attrs.get("trap", 1)
            prog.instructions += [over, [OP_TRAP, trap]]
            prog.carried_checks += trap == 2
            jumps.append((over, 2, len(prog.instructions)))
            tensor_of[id(b.var)] = bad
            prog.branches += 1
            return
        if isinstance(v, Call) and v.op in ("if_output", "loop_output"):
            use(v.args[0], step)
            tensor_of[id(b.var)] = if_outputs[id(v.args[0])][v.attrs["index"]]
            return
        if isinstance(v, Call) and v.op == "loop":
            emit_loop(b, step)
            return
        if isinstance(v, Call) and v.op == "loop_rows":   # a STORE row, named by outputs only
            use(v.args[0], step)
            use(v.args[1], step)
            tensor_of[id(b.var)] = if_outputs[id(v.args[0])][v.attrs["index"]]
            return
        late = shape_vars(v.type.shape) & dynamic.keys() - bound_now
        if not late and dynamic and isinstance(v, CallTIR):   # a size read inside the kernel
            late = symbolic_vars(mod.functions[v.func]) & dynamic.keys() - bound_now
        if late:
            raise VMEmitError(f"{b.var.name}: its shape {v.type.shape} uses {', '.join(late)} "
                              "before the kernel that counts it ran")
        args = [use(a, step) for a in v.args]
        into = into_state.pop(id(b.var), None)   # a resized carried value's copy (below)
        if into is None and id(b.var) in hosts:   # written in place into a concat's buffer
            out = placed_row(b.var, step)
        else:
            out = arena_tensor(v.type, new_storage(v.type, step) if into is None else into)
        tensor_of[id(b.var)] = out
        if isinstance(v, CallTIR):
            info = kernels[v.func]
            k = kernel_index.setdefault(v.func, len(prog.kernels))
            if k == len(prog.kernels):
                prog.kernels.append(v.func)
                prog.kernel_sources.append(())
            prog.kernel_sources[k] = merge_sources(prog.kernel_sources[k], b.source)
            operands = args + [out]
            if info.workspace_bytes or info.workspace_expr is not None:
                ws = TensorType((info.workspace_expr if info.symbolic
                                 else info.workspace_bytes,), "uint8")
                operands.append(arena_tensor(ws, new_storage(ws, step)))
            if info.symbolic:
                if not sizes_row:
                    rows.append([SIZES, 0, [len(size_vars)], "int64"])
                    sizes_row.append(len(rows) - 1)
                operands.append(sizes_row[0])
            prog.instructions.append([OP_CALL_KERNEL, k, len(operands), *operands])
        elif isinstance(v, CallLibrary):
            prog.library_calls.append(LibraryCall(
                v.func, v.attrs, source_records(b.source) if b.source else None))
            operands = args + [out]
            prog.instructions.append([OP_CALL_LIB, len(prog.library_calls) - 1, len(operands),
                                      *operands])
        else:
            raise VMEmitError(f"{b.var.name}: operator {getattr(v, 'op', v)} was not legalized")

    def emit_if(b, step: int) -> None:
        """JUMP_UNLESS cond -> else; then's bindings, its copies out; JUMP -> end; else's
        bindings, its copies out (or TRAP for a branch left out). Both branches' steps come
        after the If's: their buffers live within them, the outputs' across both."""
        v = b.value
        cond = use(v.args[0], step)
        captured = [use(a, step) for a in v.args[1:]]
        outs = []
        for shape, dtype in v.attrs["outputs"]:
            ttype = TensorType(tuple(shape), dtype)
            outs.append(arena_tensor(ttype, new_storage(ttype, step)))
        tensor_of[id(b.var)] = outs[0]
        if_outputs[id(b.var)] = outs
        prog.branches += 1
        skip = [OP_JUMP_UNLESS, cond, -1]
        prog.instructions.append(skip)
        done = [OP_JUMP, -1]
        for k, name in enumerate(v.attrs["branches"]):
            if k == 1:
                prog.instructions.append(done)
                jumps.append((skip, 2, len(prog.instructions)))
            if not name:
                prog.instructions.append([OP_TRAP, 0])
                continue
            fn_branch = mod.functions[name]
            for p, t in zip(fn_branch.params, captured):
                tensor_of[id(p)] = t
            emit_bindings(fn_branch)
            at = tick()
            for o, dst in zip(fn_branch.outputs, outs):   # (past them: its extents' binds)
                src = use(o, at)
                sid = storage_of_tensor[dst]
                buffers[sid].end = max(buffers[sid].end, at)
                if tuple(rows[src][2]) != tuple(rows[dst][2]):   # this branch's extents
                    dst = arena_tensor(o.type, sid)
                prog.instructions.append([OP_COPY, src, dst])
        jumps.append((done, 1, len(prog.instructions)))
        for shape, _ in v.attrs["outputs"]:
            bound_now.update(shape_vars(shape) & dynamic.keys())

    def emit_loop(b, step: int) -> None:
        """COPY inits -> states; LOOP; the body over the states; its new values copied into
        the states; NEXT. What the loop reads lives until its NEXT."""
        v = b.value
        n = v.attrs["carried"]
        grown = v.attrs.get("grown", ())
        body = mod.functions[v.attrs["body"]]
        trip, cond = use(v.args[0], step), use(v.args[1], step)
        inits = [use(a, step) for a in v.args[2:2 + n]]
        captured = [use(a, step) for a in v.args[2 + n:len(v.args) - len(grown)]]
        prefixes = [use(a, step) for a in v.args[len(v.args) - len(grown):]]
        states = [arena_tensor(p.type, new_storage(p.type, step)) for p in body.params[1:1 + n]]
        for src, dst, a in zip(inits, states, v.args[2:2 + n]):
            if tuple(rows[src][2]) != tuple(rows[dst][2]):   # resized: the initial extents
                dst = arena_tensor(a.type, storage_of_tensor[dst])
            prog.instructions.append([OP_COPY, src, dst])
        # a carried value whose extents change (``resized``): the body's last kernel copies its
        # new value into the state's buffer, after every read of the state in the iteration
        made = {id(x.var): x.value for x in body.bindings()}
        for j in v.attrs.get("resized", ()):
            out = body.outputs[1 + j]   # (through its views: the copy kernel's output)
            while isinstance(made.get(id(out)), Call) and get_op(made[id(out)].op).kind == VIEW:
                out = made[id(out)].args[0]
            into_state[id(out)] = storage_of_tensor[states[j]]
        # format 1.10: a carried value that only grows is a STORE row, its initial value's
        # rows appended before the loop (from a buffer of their own if a constant)
        grown_stores = []
        for (axis, shape, dtype, count), src, a in zip(grown, prefixes,
                                                       v.args[len(v.args) - len(grown):]):
            rows.append([STORE, 0, [1] * axis + [to_record(size_var(count))]
                         + _shape_record(shape), dtype])
            grown_stores.append(len(rows) - 1)
            if a.type.shape[axis] == 0:
                continue
            if rows[src][0] != ARENA:
                tmp = arena_tensor(a.type, new_storage(a.type, step))
                prog.instructions.append([OP_COPY, src, tmp])
                src = tmp
            prog.instructions.append([OP_APPEND, len(rows) - 1, src])
        number = arena_tensor(body.params[0].type, new_storage(body.params[0].type, step))
        head = [OP_LOOP, trip, cond, number, -1]
        prog.instructions.append(head)
        head_index = len(prog.instructions) - 1
        for p, t in zip(body.params, [number] + states + captured):
            tensor_of[id(p)] = t
        emit_bindings(body)
        at = tick()
        again = use(body.outputs[0], at)
        kept = {storage_of_tensor[t] for t in states}

        def own_buffer(src: int, ttype: TensorType) -> int:
            tmp = arena_tensor(ttype, new_storage(ttype, at))
            prog.instructions.append([OP_COPY, src, tmp])
            return tmp

        if storage_of_tensor.get(again) in kept:   # the condition is a carried value
            again = own_buffer(again, body.outputs[0].type)
        stores = []
        for o, (shape, dtype) in zip(body.outputs[1 + n:], v.attrs.get("rows", ())):
            # format 1.9: a row of a scan output with no bound, appended by the VM
            rows.append([STORE, 0, [to_record(size_var(v.attrs["count"]))]
                         + _shape_record(shape), dtype])
            store = len(rows) - 1
            stores.append(store)
            row = use(o, at)
            if rows[row][0] != ARENA:   # a constant row: appended from a buffer of its own
                row = own_buffer(row, o.type)
            prog.instructions.append([OP_APPEND, store, row])
        for o, store in zip(body.outputs[1 + n + len(stores):], grown_stores):
            row = use(o, at)   # format 1.10: what a grown value appends each iteration
            if rows[row][0] != ARENA:
                row = own_buffer(row, o.type)
            prog.instructions.append([OP_APPEND, store, row])
        prog.stores += len(stores) + len(grown_stores)
        prog.grows += grown_stores
        moves = []
        for o, dst in zip(body.outputs[1:1 + n], states):
            src = use(o, at)
            sid = storage_of_tensor.get(src)
            if sid == storage_of_tensor[dst]:
                continue   # passed on unchanged
            moves.append((own_buffer(src, o.type) if sid in kept else src, dst))
        prog.instructions += [[OP_COPY, src, dst] for src, dst in moves]
        nxt = [OP_NEXT, again, -1]
        prog.instructions.append(nxt)
        jumps.append((nxt, 2, head_index))
        jumps.append((head, 4, len(prog.instructions)))
        end = tick()
        for t in [number, again] + states + captured:
            sid = storage_of_tensor.get(t)
            if sid is not None:
                buffers[sid].end = max(buffers[sid].end, end)
        tensor_of[id(b.var)] = states[0]
        if_outputs[id(b.var)] = states + stores + grown_stores
        prog.loops += 1

    if_outputs: dict[int, list[int]] = {}
    into_state: dict[int, int] = {}   # a body result's var id -> the state storage it writes
    emit_bindings(fn)
    end = tick()
    for name, o in zip(fn.output_names, fn.outputs):
        t = use(o, end, output=True)
        outputs.append({"name": name, "shape": _shape_record(o.type.shape),
                        "dtype": o.type.dtype, "tensor": t})
    # jump targets: instruction indices to words
    offsets = [0]
    for ins in prog.instructions:
        offsets.append(offsets[-1] + len(ins))
    for ins, slot, target in jumps:
        ins[slot] = offsets[target]

    # Each input and output lists the rows over its bytes (itself and its reshapes): the
    # runtime may point the kernels that read an input at the caller's array instead of copying
    # it in, and those that write an output at the array it returns instead of copying it out.
    for row in inputs + outputs:
        sid = storage_of_tensor.get(row["tensor"])
        if sid is not None:
            row["views"] = sorted(t for t, s in storage_of_tensor.items() if s == sid)
    prog.inputs = [_io_row(r) for r in inputs]
    prog.outputs = [_io_row(r) for r in outputs]

    if size_vars:
        prog.tensors = [_tensor_row(r) for r in rows]
        checks = []
        relations = list(mod.relations)   # what shape inference assumed (ir/sym.py)
        # the ones over one size variable first: a failing input is then named by the sentence
        # about that size ("h must be between 33 and 80"), not by a relation over several sizes
        # that the same cause broke too (a reshape's element counts)
        for op, a, b_, _ in sorted(relations, key=lambda r: len(shape_vars([r[1], r[2]])) > 1):
            if shape_vars([a, b_]) & dynamic.keys():
                raise VMEmitError(f"the model needs {a} {'==' if op == 'eq' else '<='} {b_}, "
                                  "a relation between sizes known only after a kernel ran")
            row = [op, to_record(a), to_record(b_), relation_text(op, a, b_, relations)]
            if row not in checks:
                checks.append(row)
        # relations shape inference assumed: the runtime checks them when it binds
        prog.symbolic = Symbolic(
            size_vars, tuple(freeze([to_record(b.size), b.start, b.end])
                             for _, b in sorted(buffers.items())),
            tuple(freeze(c) for c in checks) if checks else None,
            dynamic=tuple(freeze([name, to_record(bound)]) for name, bound in dynamic.items())
            or None, values=value_rows(mod, "values"), scales=value_rows(mod, "scales"))
        return prog
    offsets, prog.arena_bytes = plan_memory(list(buffers.values()))
    prog.intermediate_bytes = sum(b.size for b in buffers.values())
    for t, row in enumerate(rows):
        if row[0] == ARENA:
            row[1] = offsets[row[1]] + view_delta.get(t, 0)
    prog.tensors = [_tensor_row(r) for r in rows]
    return prog


def _tensor_row(row: list) -> TensorRow:
    return TensorRow(row[0], row[1], freeze(row[2]), row[3])


def _io_row(row: dict) -> IORow:
    return IORow(row["name"], freeze(row["shape"]), row["dtype"], row["tensor"],
                 freeze(row.get("max_shape")), freeze(row.get("views")))
