"""Running bundles with symbolic shapes (format 1.3): one bundle, any input size.

The header's ``symbolic`` record lists the size variables (``["batch", "seq"]``) and, per
storage buffer, its size as a dim record with its first and last step; tensor rows hold a
storage id and their shape as dim records. A dim record is an int, a variable name, or
``["+", ...]`` / ``["*", ...]`` / ``["//", e, c]`` / ``["%", e, c]`` (``packager/ir/sym.py``
writes them).

A run binds the variables from the fed arrays' shapes (the course's ``match_cast``: a dim that
is a variable binds it, any other dim is checked against what it evaluates to), then takes the
plan for those values from a small cache or makes one: offsets by the same first-fit the
packager uses for static bundles (liveness from the export, sizes now known), a fresh arena,
and the prepared calls. Symbolic kernels get the variables' values as one int64 array, their
last argument. ``PLAN_CACHE`` plans are kept (least recently used dropped first): a server
alternating between a few sizes never re-plans.

A bundle exported with ``--max-shape`` bounds on every size variable carries an upper-bound plan
(the symbolic record's ``bound``: each buffer's offset with every buffer at its size for the
bound; the packager checked that each size is largest there). Its runner allocates that one
arena and prepares the calls once; a new shape then only evaluates its dim records, checks
every buffer fits its bounded slot and writes the sizes array (``BOUND_CACHE`` shapes' views
kept): no first fit, no arena, no prepared calls per shape.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from . import cpu, elf, library, vm
from .bundle import BundleReader, nbytes_of, storage_dtype
from .errors import BundleError, InputError
from .header import (ARENA, CONST, OP_BIND_SIZE, OP_CALL_KERNEL, OP_COPY, SIZES, STORE,
                     DimRecord,
                     KernelRow, Plan, SymbolicBound)
from .dims import evaluate
from .values import bind_values

PLAN_CACHE = 4      # per-shape plans kept (arena + prepared calls each), unbounded bundles
BOUND_CACHE = 64    # per-shape views kept over the one arena of a bounded bundle (cheap)
ALIGN = 64


def _names(rec: Any) -> set[str]:
    if isinstance(rec, str):
        return {rec}
    if isinstance(rec, (tuple, list)):
        return set().union(*(_names(r) for r in rec[1:])) if rec else set()
    return set()


def example_shape(shape: Any, size: int = 1) -> tuple[int, ...]:
    """A concrete shape for a (maybe symbolic) shape: every size variable at ``size``."""
    env = _Everything(size)
    return tuple(evaluate(d, env) for d in shape)


class _Everything(dict):
    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def __missing__(self, key: str) -> int:
        return self.value


def dim_text(rec: Any) -> str:
    """A dim record as the IR printer shows it (``batch``, ``batch * seq``, ``M1 - (M1) // 2 -
    5``: a sum's negative terms, ``-5`` or ``-1 * x``, are subtracted)."""
    if isinstance(rec, (int, str)):
        return str(rec)
    op = rec[0]
    if op == "*":
        return " * ".join(dim_text(r) for r in rec[1:])
    if op == "+":
        text = ""
        for i, r in enumerate(rec[1:]):
            negated = _negated(r)
            if i == 0:
                text = dim_text(r)
            elif negated is not None:
                text += f" - {dim_text(negated)}"
            else:
                text += f" + {dim_text(r)}"
        return text
    return f"({dim_text(rec[1])}) {op} {rec[2]}"


def _negated(rec: Any) -> Any:
    """``-rec`` as a record when ``rec`` is a negative int or ``-c * x`` (c > 0), else None."""
    if isinstance(rec, int):
        return -rec if rec < 0 else None
    if isinstance(rec, (list, tuple)) and rec and rec[0] == "*" and isinstance(rec[1], int) \
            and rec[1] < 0:
        rest = rec[2:] if rec[1] == -1 else [-rec[1], *rec[2:]]
        return rest[0] if len(rest) == 1 else ["*", *rest]
    return None


@dataclass(frozen=True)
class SymSpec:
    """An input or output: its name, shape as dim records, dtype and tensor row."""
    name: str
    shape: tuple
    dtype: str
    tensor: int
    max_shape: tuple | None = None   # --max-shape: the largest size of each dim

    batch_sizes = None   # as TensorSpec: no dynamic-batch plans

    @property
    def dims(self) -> tuple:
        """The shape as ``mlcpack inspect`` shows it: ints and size-variable expressions."""
        return tuple(d if isinstance(d, int) else dim_text(d) for d in self.shape)

    def __str__(self) -> str:
        return f"{self.name} [{', '.join(map(str, self.dims))}] {self.dtype}"

    @property
    def shape_text(self) -> str:
        return "(" + ", ".join(dim_text(d) for d in self.shape) + \
            ("," if len(self.shape) == 1 else "") + ")"


def _first_fit(sizes: list[int], spans: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Offsets by size, largest first, each at the lowest offset free during its life (as
    ``packager/passes/memory_plan.py``); returns (offsets, arena bytes)."""
    aligned = [-(-max(s, 1) // ALIGN) * ALIGN for s in sizes]
    order = sorted(range(len(sizes)), key=lambda i: (-aligned[i], spans[i][0], i))
    offsets = [0] * len(sizes)
    placed: list[int] = []
    arena = 0
    for i in order:
        lo_i, hi_i = spans[i]
        busy = sorted((offsets[p], offsets[p] + aligned[p]) for p in placed
                      if spans[p][0] <= hi_i and lo_i <= spans[p][1])
        off = 0
        for lo, hi in busy:
            if off + aligned[i] <= lo:
                break
            off = max(off, hi)
        offsets[i] = off
        placed.append(i)
        arena = max(arena, off + aligned[i])
    return offsets, arena


def _place(plan: Any, values: list, min_bytes: int) -> None:
    """One run's input values where ``plan``'s kernels read them: copied into its arena, or
    the kernels pointed at the caller's array (``vm.InputBinding.feed``)."""
    for (_, view, binding), value in zip(plan.inputs, values):
        if binding is None:
            np.copyto(view, value)
        else:
            binding.feed(view, value, min_bytes)


def _input_bindings(runner: Any, executor: vm.Executor, addresses: list[int]) -> list:
    """Per input, the binding that lets kernels read the caller's array where it lies, or
    None: only for an input that kernels only read (as Model._bindings does for static
    bundles); its reshapes share its storage id."""
    bindings = []
    outs = {s.tensor for s in runner.outputs}
    for spec, ids in zip(runner.inputs, runner.input_views):
        sid = runner.tensors[spec.tensor].ref
        ok = (spec.tensor in ids and not outs.intersection(ids)
              and all(runner.tensors[t].kind == ARENA and runner.tensors[t].ref == sid
                      for t in ids))
        bindings.append(executor.input_binding(frozenset(ids), runner.num_inputs,
                                               addresses[spec.tensor]) if ok else None)
    return bindings


class _Plan:
    """One concrete shape's arena, tensor views and prepared calls."""

    shared = False   # its calls are its own: nothing to activate

    def __init__(self, runner: SymbolicRunner, env: dict[str, int]) -> None:
        self.sizes = np.array([env[v] for v in runner.vars], dtype=np.int64)
        bufs = runner.buffers
        values = [evaluate(rec, env) for rec in runner.dim_records]   # each distinct dim once
        sizes = [values[k] for k in runner.buffer_dims]
        offsets, arena_bytes = _first_fit(sizes, [(b[1], b[2]) for b in bufs])
        raw = np.zeros(arena_bytes + ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGN
        self.arena = raw[start:start + arena_bytes]
        self.arena_bytes = arena_bytes
        views: list[np.ndarray] = []
        for i, (row, dims, storage) in enumerate(zip(runner.tensors, runner.tensor_dims,
                                                     runner.storage)):
            kind, ref, dtype = row.kind, row.ref, row.dtype
            shape = tuple([values[k] for k in dims])
            size = nbytes_of(shape, dtype)
            if kind == ARENA and ref < len(bufs) and size <= sizes[ref]:
                off = offsets[ref]
                view = self.arena[off:off + size].view(storage).reshape(shape)
            elif kind == CONST and ref < len(runner.constants) \
                    and runner.constants[ref].nbytes == size:
                view = runner.constants[ref].reshape(shape)
            elif kind == SIZES and shape == self.sizes.shape and dtype == "int64":
                view = self.sizes
            elif kind == STORE:   # format 1.9: its rows are the VM's (APPEND), never the arena's
                view = np.zeros(0, storage)
            else:
                raise BundleError(f"bundle header: tensor {i} lies outside its storage")
            views.append(view)
        self.views = views
        addresses = [v.__array_interface__["data"][0] for v in views]
        self.limits = np.array([env[v] for v in runner.vars], dtype=np.int64)
        self.executor = vm.Executor(runner.program, runner.kernels, runner.sites,
                                    list(addresses), views, runner.threads, pool=runner.pool,
                                    sizes=self.sizes, limits=self.limits, stores=runner.stores,
                                    extents=runner.row_extents(self.sizes),
                                    macs=runner.macs)
        self.live_sizes = self.sizes   # what BIND_SIZE wrote during the last run
        bindings = _input_bindings(runner, self.executor, addresses)
        self.inputs = [(s, views[s.tensor], b) for s, b in zip(runner.inputs, bindings)]
        self.outputs = [(s.name, views[s.tensor]) for s in runner.outputs]

    def activate(self) -> None:
        """Nothing to do: this plan's arena and calls are its own."""

    def close(self) -> None:
        self.executor.close()


class _Bound:
    """A bounded bundle's one arena, sizes array and prepared calls, shared by every shape: the
    tensors' addresses do not depend on the shape (each buffer has its offset for the bound),
    only the sizes array and the library calls' views (``_BoundPlan.activate``) do."""

    def __init__(self, runner: SymbolicRunner, first: _BoundPlan) -> None:
        arena_bytes = runner.bound_arena
        try:
            raw = np.zeros(arena_bytes + ALIGN, dtype=np.uint8)
        except MemoryError:
            raise BundleError(f"{runner.name}: its bounded memory plan asks for a "
                              f"{arena_bytes}-byte arena, which cannot be allocated here") from None
        start = -raw.ctypes.data % ALIGN
        self.arena = raw[start:start + arena_bytes]
        self.sizes = np.zeros(len(runner.vars), dtype=np.int64)
        self.limits = np.zeros(len(runner.vars), dtype=np.int64)
        base = self.arena.ctypes.data
        addresses = []
        for row in runner.tensors:
            kind, ref = row.kind, row.ref
            if kind == ARENA:
                addresses.append(base + runner.bound_offsets[ref])
            elif kind == CONST:
                addresses.append(runner.constants[ref].ctypes.data)
            else:   # SIZES; a STORE row's address is never read (only APPEND names it)
                addresses.append(self.sizes.ctypes.data)
        self.addresses = addresses
        first.views_over(self)
        views = [None] * len(runner.tensors)
        for t, v in first.views.items():
            views[t] = v
        self.executor = vm.Executor(runner.program, runner.kernels, runner.sites, addresses,
                                    views, runner.threads, pool=runner.pool, sizes=self.sizes,
                                    limits=self.limits, stores=runner.stores,
                                    extents=runner.row_extents(self.sizes),
                                    macs=runner.macs)
        self.bindings = _input_bindings(runner, self.executor, addresses)
        self.current: _BoundPlan | None = None

    def close(self) -> None:
        self.executor.close()


class _BoundPlan:
    """One concrete shape of a bounded bundle: its size values, checked against the bounded
    plan, and the views its inputs, outputs and library calls need; the arena and the calls
    are the runner's ``_Bound``."""

    shared = True   # the calls are shared by every shape: activate() before a run

    def __init__(self, runner: SymbolicRunner, env: dict[str, int]) -> None:
        self.runner = runner
        self.sizes = np.array([env[v] for v in runner.vars], dtype=np.int64)
        values = [evaluate(rec, env) for rec in runner.dim_records]
        self.values = values
        for k, (dim, top) in enumerate(zip(runner.buffer_dims, runner.bound_sizes)):
            if values[dim] > top:   # the packager checked monotonicity; never trust, verify
                raise BundleError(f"{runner.name}: bundle header: buffer {k} needs "
                                  f"{values[dim]} B at these sizes, more than its bounded "
                                  f"{top} B")
        for t in runner.arena_tensors:
            row = runner.tensors[t]
            if nbytes_of(tuple(values[k] for k in runner.tensor_dims[t]), row.dtype) \
                    > runner.bound_sizes[row.ref]:
                raise BundleError(f"bundle header: tensor {t} lies outside its storage")
        self.views: dict[int, np.ndarray] = {}
        if runner._bound is None:
            runner._bound = _Bound(runner, self)
        else:
            self.views_over(runner._bound)
        bound = runner._bound
        self.executor = bound.executor
        self.live_sizes = bound.sizes
        self.arena_bytes = runner.bound_arena
        self.inputs = [(s, self.views[s.tensor], b) for s, b in zip(runner.inputs,
                                                                   bound.bindings)]
        self.outputs = [(s.name, self.views[s.tensor]) for s in runner.outputs]

    def views_over(self, bound: _Bound) -> None:
        """The views of the tensors a run reads or writes from Python, for this shape."""
        runner, values = self.runner, self.values
        for t in runner.view_tensors:
            row = runner.tensors[t]
            kind, ref, dtype = row.kind, row.ref, row.dtype
            shape = tuple([values[k] for k in runner.tensor_dims[t]])
            if kind == ARENA:
                off = runner.bound_offsets[ref]
                view = bound.arena[off:off + nbytes_of(shape, dtype)].view(
                    runner.storage[t]).reshape(shape)
            elif kind == CONST:
                if runner.constants[ref].nbytes != nbytes_of(shape, dtype):
                    raise BundleError(f"bundle header: tensor {t} lies outside its storage")
                view = runner.constants[ref].reshape(shape)
            elif kind == STORE:
                view = np.zeros(0, runner.storage[t])
            else:
                view = bound.sizes
            self.views[t] = view

    def activate(self) -> None:
        """Make the shared calls run this shape: its sizes, its library calls' views."""
        bound = self.runner._bound
        if bound.current is self:
            return
        bound.sizes[:] = self.sizes
        bound.limits[:] = self.sizes   # the run-time sizes' bounds for this shape
        for i, _ in self.runner.lib_instructions:
            bound.executor.set_views(i, self.views)
        bound.current = self

    def close(self) -> None:
        """Nothing to free: the arena and the calls are the runner's."""


class SymbolicRunner:
    """A symbolic bundle's mapped code and decoded program, and the plans (arenas, prepared
    calls) one session made for the shapes it ran (``symbolic_plan.SymbolicPlan`` holds one
    and gives each session a ``fork``)."""

    def __init__(self, reader: BundleReader, plan: Plan, constants: list[np.ndarray],
                 library_functions: Mapping[str, Any] | None, threads: int) -> None:
        """``plan`` is the header's symbolic plan, validated (``Header.from_msgpack``): here
        only what depends on the mapped code and on values is checked. The code image this
        maps (``image``) is closed by its owner, not by ``close``."""
        name = reader.name
        sym = plan.symbolic
        assert sym is not None
        self.record = plan   # the header record (profile.py names the kernels from it)
        self.vars = sym.vars
        # format 1.6: sizes a kernel counts at run time (BIND_SIZE), each with its bound
        self.dynamic = sym.dynamic or ()
        self.values = sym.values or ()
        self.buffers = sym.buffers
        self.checks = sym.checks or ()
        self.scales = sym.scales or ()
        for row in self.scales:   # format 1.7: sizes from float scales
            spec = next((r for r in plan.inputs if r.name == row[0]), None)
            if spec is None or spec.dtype not in ("float32", "float64") \
                    or tuple(spec.shape) != (len(row[2]),):
                raise BundleError(f"{name}: bundle header: symbolic scales row for "
                                  f"{row[0]!r} does not name a float input of its length")
        for row in self.values:
            read = [row[0], *(n for n in row[4:] if n)] if row[1] in ("slice", "pad") \
                else [row[0]]
            for n in read:
                spec = next((r for r in plan.inputs if r.name == n), None)
                if spec is None or spec.dtype not in ("int32", "int64") \
                        or not all(isinstance(d, int) for d in spec.shape) \
                        or int(np.prod(spec.shape)) != len(row[2]) \
                        and row[1] in ("dims", "reshape", "expand"):
                    raise BundleError(f"{name}: bundle header: symbolic values row for "
                                      f"{row[0]!r} does not name a small integer input")
        self.tensors = plan.tensors
        self.storage = [storage_dtype(r.dtype) for r in self.tensors]
        # The distinct dim records of the buffers and tensor shapes (a model repeats a few
        # dozen sizes over hundreds of tensors): a plan evaluates each once.
        index: dict[Any, int] = {}
        self.dim_records: list[DimRecord] = []

        def dim_index(rec: DimRecord) -> int:
            if rec not in index:
                index[rec] = len(self.dim_records)
                self.dim_records.append(rec)
            return index[rec]

        self.buffer_dims = [dim_index(b[0]) for b in self.buffers]
        self.tensor_dims = [tuple(dim_index(d) for d in r.shape) for r in self.tensors]
        self.constants = constants
        self.inputs = [SymSpec(r.name, r.shape, r.dtype, r.tensor, r.max_shape or None)
                       for r in plan.inputs]
        self.outputs = [SymSpec(r.name, r.shape, r.dtype, r.tensor, r.max_shape or None)
                        for r in plan.outputs]
        # outputs whose size a kernel counts: returned at the size of each run
        counted = sym.dynamic_names
        self.counted_outputs = [i for i, r in enumerate(plan.outputs)
                                if any(_names(d) & counted for d in r.shape)]
        variant = plan.code[cpu.pick_variant([v.record() for v in plan.code], name)]
        self.code_variant = variant.record()
        self.sites = library.resolve_calls(plan.library_calls or (), library_functions, name)
        image = elf.load_object(reader.payload(variant.object), elf.default_externals(),
                                arch=variant.arch)
        self.image = image
        self.threads = threads
        self.name = name
        try:
            self._decode(reader, plan, image)
            self._bounded(sym.bound)
        except BaseException:
            image.close()
            raise
        self.plans_made = 0   # memory plans made at run time (first fits, arenas), for tests
        self._plans: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        # input shapes -> their plan (cleared when a plan is dropped from the cache)
        self._by_shape: dict[tuple, Any] = {}
        self._dtypes = [storage_dtype(s.dtype) for s in self.inputs]
        self._names = [s.name for s in self.inputs]
        read = {n for r in self.values
                for n in (r[0], *(r[4:] if r[1] in ("slice", "pad") else ())) if n}
        read |= {r[0] for r in self.scales}
        self._by_value = [s.name in read for s in self.inputs]   # their values set sizes

    def _decode(self, reader: BundleReader, plan: Plan, image: elf.CodeImage) -> None:
        """The kernels' addresses in ``image``, the decoded program and what it is checked
        against."""
        self.kernels = [(image.address(k.symbol), bool(k.parallel)) for k in plan.kernels]
        self.macs = [k.macs for k in plan.kernels]
        self.program = vm.decode(reader.payload(plan.vm.bytecode), len(self.tensors),
                                 len(self.kernels), len(self.sites), reader.name,
                                 len(self.vars))
        vm.check_branches(self.program, self.tensors, reader.name, plan.vm.grows or ())
        counted = plan.symbolic.dynamic_names
        for ins in self.program:
            if ins.opcode == OP_BIND_SIZE:
                row = self.tensors[ins.operands[0]]
                if self.vars[ins.target] not in counted or row.dtype != "int64" \
                        or row.shape not in ((1,), ()):
                    raise BundleError(f"{reader.name}: bundle header: BIND_SIZE binds "
                                      f"{self.vars[ins.target]!r} from tensor "
                                      f"{ins.operands[0]}: a run-time size bound by a "
                                      "one-element int64 tensor expected")
        self.stores = self._stores(plan, reader.name)
        self.appended = {}   # format 1.10: a tensor APPEND appends as rows -> its count's dim
        for ins in self.program:
            if ins.opcode == vm.OP_APPEND and vm.appends_rows(self.tensors[ins.target],
                                                               self.tensors[ins.operands[0]]):
                self.appended[ins.operands[0]] = \
                    self.tensors[ins.operands[0]].shape[self.stores[ins.target][1]]
        self._check_arity(plan.kernels)
        self.num_inputs = [k.num_inputs for k in plan.kernels]
        self.input_views = []
        for r in plan.inputs:
            ids = r.views   # advice: tensor indices, else in place is off for this input
            ok = isinstance(ids, tuple) and all(isinstance(t, int) and 0 <= t < len(self.tensors)
                                                for t in ids)
            self.input_views.append(ids if ok else ())
        self.pool = vm.PoolCode.from_image(image)

    def _stores(self, plan: Plan, name: str) -> dict[int, tuple[int, int, bool]]:
        """Format 1.9: each STORE row -> the size variable that counts its rows, its first dim
        (a variable BIND_SIZE binds), that dim's axis and whether the row holds a carried value
        that grows (format 1.10: the vm record's ``grows``, whose count may follow 1s); an
        output whose tensor is one returns its rows."""
        counted = plan.symbolic.dynamic_names
        grows = plan.vm.grows or ()
        out = {}
        for t, row in enumerate(self.tensors):
            if row.kind != STORE:
                continue
            lead = vm.store_lead(row.shape) if t in grows else 0
            first = row.shape[lead] if lead < len(row.shape) else None
            if not isinstance(first, str) or first not in counted:
                raise BundleError(f"{name}: bundle header: STORE row {t}'s first dim must be a "
                                  "size variable bound at run time")
            out[t] = (self.vars.index(first), lead, t in grows)
        if len(out) != (plan.vm.stores or 0):
            raise BundleError(f"{name}: bundle header: the vm record's stores count "
                              f"{plan.vm.stores} is not its {len(out)} STORE rows")
        if len(set(grows)) != len(grows) or any(t not in out for t in grows):
            raise BundleError(f"{name}: bundle header: the vm record's grows must name "
                              "distinct STORE rows")
        return out

    def row_extents(self, sizes: np.ndarray) -> dict[int, Any]:
        """Format 1.10: each tensor an APPEND appends as several rows -> its row count at run
        time (its dim at the STORE's count axis, over ``sizes``, which BIND_SIZE updates)."""
        out = {}
        for t, rec in self.appended.items():
            if type(rec) is int:
                out[t] = (lambda r: lambda: r)(rec)
            elif isinstance(rec, str):
                out[t] = (lambda i: lambda: int(sizes[i]))(self.vars.index(rec))
            else:
                out[t] = (lambda r: lambda: evaluate(r, dict(zip(self.vars, sizes.tolist())))
                          )(rec)
        return out

    def _bounded(self, rec: SymbolicBound | None) -> None:
        """The upper-bound plan, when the bundle has one (validated by ``Header``): every
        buffer's size at the bound, checked to fit the arena at its offset."""
        self.bound: dict[str, int] | None = None
        self._bound: _Bound | None = None
        if rec is None:
            return
        self.bound = {v: rec.sizes[v] for v in self.vars}
        self.bound_offsets = rec.offsets
        self.bound_arena = arena = rec.arena_bytes
        values = [evaluate(r, self.bound) for r in self.dim_records]
        self.bound_sizes = [values[k] for k in self.buffer_dims]
        for k, (off, size) in enumerate(zip(rec.offsets, self.bound_sizes)):
            if not 0 <= off <= off + size <= arena:
                raise BundleError(f"{self.name}: bundle header: buffer {k} of the bounded plan "
                                  f"lies outside its {arena}-byte arena")
        self.arena_tensors = [t for t, r in enumerate(self.tensors) if r.kind == ARENA]
        self.lib_instructions = [(i, ins) for i, ins in enumerate(self.program)
                                 if ins.opcode != OP_CALL_KERNEL]
        needed = {s.tensor for s in self.inputs} | {s.tensor for s in self.outputs}
        for _, ins in self.lib_instructions:
            needed.update(ins.operands)
            if ins.opcode == OP_COPY:
                needed.add(ins.target)
        self.view_tensors = sorted(needed)

    @property
    def arena_bytes(self) -> int | None:
        """The bounded plan's arena (allocated once), or None: planned per shape."""
        return self.bound_arena if self.bound is not None else None

    def _check_arity(self, kernels: tuple[KernelRow, ...]) -> None:
        for ins in self.program:
            if ins.opcode != OP_CALL_KERNEL:
                continue
            k = kernels[ins.target]
            if len(ins.operands) != k.operands:
                raise BundleError(f"bundle header: kernel {k.name} takes {k.operands} "
                                  f"tensors, bytecode passes {len(ins.operands)}")
            if k.symbolic and self.tensors[ins.operands[-1]].kind != SIZES:
                raise BundleError(f"bundle header: kernel {k.name} is not passed the "
                                  "size variables")

    # ---- binding (match_cast) ---------------------------------------------------------------

    def bind(self, feeds: Mapping[str, Any]) -> tuple[dict[str, int], list[np.ndarray]]:
        """Check the fed arrays and bind the size variables from their shapes."""
        env: dict[str, int] = {}
        where: dict[str, str] = {}
        values = []
        for spec in self.inputs:
            value = feeds[spec.name]
            if not isinstance(value, np.ndarray):
                try:
                    value = np.asarray(value)
                except Exception:
                    raise InputError(f"input {spec.name!r} is not array-like") from None
            store = storage_dtype(spec.dtype)
            if value.dtype != store and value.dtype.name == spec.dtype \
                    and value.dtype.itemsize == store.itemsize:
                value = value.view(store)   # an ml_dtypes array of a narrow dtype: its bits
            if value.dtype != store:
                raise InputError(f"input {spec.name!r} has dtype {value.dtype.name}; the model "
                                 f"takes {spec.dtype}: convert it with .astype(np.{spec.dtype})")
            if value.ndim != len(spec.shape):
                raise InputError(f"input {spec.name!r} has rank {value.ndim} (shape "
                                 f"{tuple(value.shape)}); the model takes {spec.shape_text}")
            for axis, (rec, n) in enumerate(zip(spec.shape, value.shape)):
                if spec.max_shape is not None and n > spec.max_shape[axis]:
                    raise InputError(
                        f"input {spec.name!r} has size {n} at axis {axis}, beyond the bundle's "
                        f"bound {spec.max_shape[axis]} (exported with --max-shape "
                        f"{spec.name}={','.join(map(str, spec.max_shape))})")
                if n == 0:
                    raise InputError(f"input {spec.name!r} has size 0 at axis {axis}; the model "
                                     f"takes {spec.shape_text} with every size at least 1")
                if isinstance(rec, str):
                    if rec in env and env[rec] != n:
                        raise InputError(
                            f"input {spec.name!r} has {rec} = {n} at axis {axis}, but "
                            f"{where[rec]} gives {rec} = {env[rec]}: they must agree")
                    env.setdefault(rec, n)
                    where.setdefault(rec, f"input {spec.name!r} axis {axis}")
            values.append(value)
        if self.values or self.scales:   # sizes set by inputs' values (1.6), scales (1.7)
            bind_values(self.values + self.scales,
                        {s.name: v for s, v in zip(self.inputs, values)}, env,
                        where)
        counted = {name for name, _ in self.dynamic}
        missing = [v for v in self.vars if v not in env and v not in counted]
        if missing:
            raise BundleError(f"{self.name}: size variable(s) {missing} are bound by no input")
        if self.bound is not None:
            for v in self.vars:
                if v not in counted and env[v] > self.bound[v]:
                    raise InputError(f"size {v} = {env[v]} ({where[v]}) is beyond the bundle's "
                                     f"bound {self.bound[v]} (its --max-shape)")
        for op, a, b, text in self.checks:   # relations the model needs between sizes
            av, bv = evaluate(a, env), evaluate(b, env)
            if not (av == bv if op == "eq" else av <= bv):
                got = ", ".join(f"{v} = {env[v]} ({where[v]})" for v in sorted(_names(a) | _names(b)))
                raise InputError(f"{text}, got {got}")
        for spec, value in zip(self.inputs, values):
            want = tuple(evaluate(d, env) for d in spec.shape)
            if tuple(value.shape) != want:
                raise InputError(f"input {spec.name!r} has shape {tuple(value.shape)}; the model "
                                 f"takes {spec.shape_text}, here {want}")
        for name, rec in self.dynamic:   # planned at their bounds; BIND_SIZE sets each run's
            env[name] = evaluate(rec, env)
        return env, values

    def plan(self, env: dict[str, int]) -> _Plan:
        key = tuple(env[v] for v in self.vars)
        plan = self._plans.get(key)
        if plan is None:
            if self.bound is not None:
                plan = _BoundPlan(self, env)
            else:
                plan = _Plan(self, env)
                self.plans_made += 1
            self._plans[key] = plan
            if len(self._plans) > (BOUND_CACHE if self.bound is not None else PLAN_CACHE):
                _, old = self._plans.popitem(last=False)
                old.close()
                self._by_shape.clear()   # it may name the dropped plan
        else:
            self._plans.move_to_end(key)
        return plan

    @property
    def held_bytes(self) -> int:
        """The arena bytes this runner holds now: the bounded arena, or its cached plans'."""
        if self._bound is not None:
            return int(self._bound.arena.nbytes)
        return sum(int(p.arena_bytes) for p in self._plans.values())

    def fork(self, threads: int) -> SymbolicRunner:
        """A runner for a ``model.session()``: this one's mapped code, constants and decoded
        program, shared; plans (arenas, executors, worker threads) of its own, on ``threads``."""
        other = copy.copy(self)
        other.threads = threads
        other.plans_made = 0
        other._plans = OrderedDict()
        other._by_shape = {}
        other._bound = None
        return other

    def run(self, feeds: Mapping[str, Any], min_bytes: int = vm.INPLACE_MIN_BYTES
            ) -> dict[str, np.ndarray]:
        return {name: view.copy() for name, view in self.run_views(feeds, min_bytes)}

    def run_views(self, feeds: Mapping[str, Any], min_bytes: int = vm.INPLACE_MIN_BYTES
                  ) -> list[tuple[str, np.ndarray]]:
        """Run once; the outputs as (name, view of the plan's arena), valid until the next run
        of this runner (the caller copies them out)."""
        # Fast path: arrays of the right dtypes whose shapes were bound before map straight to
        # their plan's key (a dict lookup instead of binding again).
        values = [feeds[name] for name in self._names]
        key: tuple | None = ()
        for v, d, by_value in zip(values, self._dtypes, self._by_value):
            if type(v) is not np.ndarray or v.dtype != d:
                key = None
                break
            key += (v.shape, v.tobytes()) if by_value else (v.shape,)   # values set sizes
        plan = self._by_shape.get(key) if key is not None else None
        if plan is None:
            env, values = self.bind(feeds)
            plan = self.plan(env)
            if key is not None:
                if len(self._by_shape) >= 16 * PLAN_CACHE:
                    self._by_shape.clear()
                self._by_shape[key] = plan
        if plan.shared:
            plan.activate()
        _place(plan, values, min_bytes)
        plan.executor.run()
        if not self.counted_outputs:
            return plan.outputs
        return self._counted(plan)

    def _counted(self, plan: Any) -> list[tuple[str, np.ndarray]]:
        """The outputs at this run's sizes: those a kernel counted are the leading part (C
        order) of the view planned at the bound."""
        env = dict(zip(self.vars, plan.live_sizes.tolist()))
        outputs = list(plan.outputs)
        for i in self.counted_outputs:
            name, view = outputs[i]
            shape = tuple(evaluate(d, env) for d in self.outputs[i].shape)
            store = plan.executor.stores.get(self.outputs[i].tensor)
            if store is not None:   # format 1.9: the rows the VM appended
                rows = store.rows()
                if rows.shape != shape:
                    raise BundleError(f"{self.name}: output {name!r} has {rows.shape[0]} rows "
                                      f"appended, its shape says {shape}")
                outputs[i] = (name, rows)
                continue
            outputs[i] = (name, view.reshape(-1)[:int(np.prod(shape))].reshape(shape))
        return outputs

    def profile(self, feeds: Mapping[str, Any], runs: int = 20, warmup: int = 1) -> Any:
        """``Model.profile`` for a symbolic bundle: the plan of the feeds' sizes (made, and the
        inputs placed, by ``warmup`` runs, at least one), then ``runs`` runs timing every VM
        instruction. The profile's title names the sizes (``model.mlc (W=320, n=1)``)."""
        from .profile import profile_executor

        if runs < 1 or warmup < 0:
            raise InputError(f"profile needs runs >= 1 and warmup >= 0, got {runs} and {warmup}")
        for _ in range(max(1, warmup)):
            self.run(feeds)
        env, values = self.bind(feeds)
        plan = self.plan(env)
        plan.activate()
        sizes = ", ".join(f"{v}={env[v]}" for v in self.vars)
        # the inputs placed before every run, as ``run`` does: the plan may reuse an input's
        # bytes once it is read (a JUMP_UNLESS on silero's sample rate read a stale one)
        return profile_executor(f"{self.name} ({sizes})", plan.executor, self.record, runs,
                                lambda: _place(plan, values, vm.INPLACE_MIN_BYTES))

    def close(self) -> None:
        for plan in self._plans.values():
            plan.close()
        self._plans.clear()
        if self._bound is not None:
            self._bound.close()
            self._bound = None
