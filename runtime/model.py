"""Loading a bundle into a runnable model: ``load(path)`` returns a ``Model``.

Order of the checks at load, so nothing runs that should not: read and hash the file, validate the
header, choose a code variant this CPU supports (refusing before any code is mapped), resolve
library functions, map the object code, decode the bytecode.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import cpu, elf, library, vm
from .bundle import STORAGE_DTYPES, BundleReader, nbytes_of, storage_dtype
from .errors import BundleError, InputError, UsageError
from .header import (ARENA, CONST, OP_CALL_KERNEL, Header, IORow, KernelRow, LibraryCall, Plan,
                     TensorRow)

ARENA_ALIGN = 64
# An output of at least this many bytes is written by its kernels straight into the array a run
# returns (``Model._output_bindings``); a smaller one is copied out of the arena, which costs
# less than asking numpy for a new array's address (``Session.run``).
OUTPUT_INPLACE_MIN_BYTES = 65536
# vm.INPLACE_MIN_BYTES, read at each run (tests lower or raise it here)
INPLACE_MIN_BYTES = vm.INPLACE_MIN_BYTES


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a bundle. ``shape`` is a concrete shape it runs at (for a
    dynamic-batch bundle: its smallest plan's); ``dims`` is what the bundle accepts, the batch
    dim shown as "N" (any batch from 1 up, run on the plans of ``batch_sizes``), as
    ``mlcpack inspect`` shows it."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    tensor: int
    batch_sizes: tuple[int, ...] | None = None   # the plans' batch sizes, when batched

    @property
    def dims(self) -> tuple[int | str, ...]:
        return ("N", *self.shape[1:]) if self.batch_sizes else self.shape

    def __str__(self) -> str:
        plans = f" (plans for N = {', '.join(map(str, self.batch_sizes))})" \
            if self.batch_sizes else ""
        return f"{self.name} [{', '.join(map(str, self.dims))}] {self.dtype}{plans}"



def _constant_array(reader: Any, row: Any) -> np.ndarray:
    """A constant's array: a read-only view of its payload, or for one stored as integers
    (format 1.5, ``ConstantRow.stored``) the float32 values ``(q - zero_point) * scale``
    expanded once here."""
    if row.stored is None:
        return reader.array(row.data, row.shape, row.dtype)
    st = row.stored
    q = reader.array(row.data, row.shape, st.dtype)
    scale = reader.array(st.scale, st.param_shape, "float32")
    zp = reader.array(st.zero_point, st.param_shape, "float32")
    out = np.empty(row.shape, np.float32)
    np.subtract(q, zp, out=out, dtype=np.float32)
    np.multiply(out, scale, out=out)
    out.flags.writeable = False
    return out

def _specs(rows: Sequence[IORow]) -> list[TensorSpec]:
    return [TensorSpec(r.name, r.shape, r.dtype, r.tensor) for r in rows]


@dataclass(frozen=True)
class BatchInfo:
    """A dynamic-batch bundle's plan sizes (ascending) and its batched inputs and outputs."""
    sizes: tuple[int, ...]
    inputs: frozenset[str]
    outputs: frozenset[str]


@dataclass
class _Plan:
    batch: int | None
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    output_views: list[tuple[str, np.ndarray]]
    # per input: (spec, arena view, storage dtype, binding or None); see Model._bindings
    feeds: list[tuple[TensorSpec, np.ndarray, np.dtype, Any]]
    # output name -> the binding its kernels write through (Model._output_bindings)
    output_bindings: dict[str, Any]
    executor: Any
    instructions: int
    arena_bytes: int
    views: list[np.ndarray]
    arena: np.ndarray     # the session's arena the views lie in (shared by its plans)

    def input_spec(self, name: str) -> TensorSpec:
        return next(s for s in self.inputs if s.name == name)


@dataclass
class _Recipe:
    """What one plan needs that every session shares: its header rows, the mapped code's
    kernel addresses, library calls and decoded bytecode."""
    row: Plan
    tensors: tuple[TensorRow, ...]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    arena_bytes: int
    kernels_meta: tuple[KernelRow, ...]
    kernels: list[tuple[int, bool]]
    sites: list[tuple[Any, dict]]
    program: list[Any]
    image: Any


def _shape_text(shape: tuple) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _as_array(spec: TensorSpec, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except Exception:
        raise InputError(f"input {spec.name!r} is not array-like") from None


def _as_stored(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    """``value`` as the input's storage dtype: a narrow dtype (bfloat16, float8, 4-bit) is fed
    as its storage bits or as an ml_dtypes array, viewed (never cast) as the bits."""
    if spec.dtype in STORAGE_DTYPES:
        store = storage_dtype(spec.dtype)
        if value.dtype.name == spec.dtype and value.dtype.itemsize == store.itemsize:
            return value.view(store)
        if value.dtype != store:
            raise InputError(f"input {spec.name!r} has dtype {value.dtype.name}; the model "
                             f"takes {spec.dtype}, fed as {store.name} bits (or an ml_dtypes "
                             f"{spec.dtype} array)")
    elif value.dtype.name != spec.dtype:
        raise InputError(f"input {spec.name!r} has dtype {value.dtype.name}; the model takes "
                         f"{spec.dtype}: convert it with .astype(np.{spec.dtype})")
    return value


def _inplace_min_bytes() -> int:
    """INPLACE_MIN_BYTES as it is now (tests lower or raise it)."""
    return INPLACE_MIN_BYTES


def _threads_from_env() -> int:
    """``MLCPACK_NUM_THREADS`` (unset or empty: 1); any value but a whole number >= 1 is
    refused in one line, never taken silently as 1."""
    value = os.environ.get("MLCPACK_NUM_THREADS", "").strip()
    if not value:
        return 1
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise UsageError(f"MLCPACK_NUM_THREADS={value!r}: give a whole number >= 1 (the "
                         "threads parallel kernels run on), or unset it for 1")
    return threads


def checked_threads(threads: int | None) -> int:
    """``threads`` as given to ``load`` or ``session`` (None: ``MLCPACK_NUM_THREADS`` or 1);
    anything but a whole number >= 1 is a ``UsageError``."""
    if threads is None:
        return _threads_from_env()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise UsageError(f"threads={threads!r}: give a whole number >= 1 (or leave it out: "
                         "MLCPACK_NUM_THREADS or 1)")
    return int(threads)


class Model:
    """A loaded bundle. ``model(x)`` or ``model.run({"x": x})`` runs one inference.

    Thread-safe: concurrent calls are serialized on one arena.
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True,
                 library_functions: Mapping[str, library.LibraryFunction] | None = None,
                 threads: int | None = None, trusted_keys: Iterable[Any] | None = None) -> None:
        threads = checked_threads(threads)   # a bad value is refused before the file is read
        self._reader = BundleReader(path, verify=verify)
        self._image: elf.CodeImage | None = None
        self._executor: vm.Executor | None = None
        self._images: list[elf.CodeImage] = []
        self._executors: list[vm.Executor] = []
        self._plans: list[_Plan] = []
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._symbolic: Any = None   # a symbolic.SymbolicRunner for format-1.3 bundles
        # a symbolic bundle's static plans (--batch-sizes), by their inputs' exact shapes
        self._specialized: dict[tuple, _Plan] = {}
        self.specialized_batches: tuple[int, ...] = ()
        self.last_plan: str | None = None   # symbolic bundles: "batch N" or "symbolic"
        self.batch: BatchInfo | None = None
        self.signed_by: str | None = None
        try:
            if trusted_keys is not None:  # before anything in the bundle is used
                from .signing import check_signature
                self.signed_by = check_signature(self._reader, trusted_keys)
            self._load(library_functions, threads)
        except BaseException:
            self.close()
            raise
        # model.run and model.profile take turns in one arena
        self._lock = self._main._lock if self._symbolic is None else self._symbolic_main._lock

    @property
    def has_parallel_kernels(self) -> bool:
        """Some kernel splits its work into tasks when the model runs on several threads."""
        kernels = [k for r in getattr(self, "_recipes", ()) for k in r.kernels]
        if self._symbolic is not None:
            kernels += self._symbolic.kernels
        return any(parallel for _, parallel in kernels)

    # ---- loading --------------------------------------------------------------------------------

    def _load(self, library_functions: Mapping[str, Any] | None, threads: int) -> None:
        reader, name = self._reader, self._reader.name
        self.header = reader.header
        self.name = name
        # Every record checked once, here, before anything is mapped (runtime/header.py).
        schema = Header.from_msgpack(reader.header, reader.data_size, name)
        self.schema = schema
        self.labels = list(schema.labels) if schema.labels is not None else None
        self.preprocess = schema.preprocess
        self._constant_refs = [c.data for c in schema.constants]
        constants = [_constant_array(reader, c) for c in schema.constants]
        if schema.symbolic is not None:   # symbolic shapes: plans made per input size at run time
            from .symbolic import SymbolicRunner
            self._symbolic = SymbolicRunner(self, schema.plan, constants, library_functions,
                                            threads)
            self.inputs, self.outputs = self._symbolic.inputs, self._symbolic.outputs
            self._input_names = frozenset(s.name for s in self.inputs)
            self.num_instructions = len(self._symbolic.program)
            self._threads = threads
            if schema.specialized:   # --batch-sizes: static plans for exact shapes
                self._load_specialized(schema.specialized, constants, library_functions, threads)
            from .symbolic_session import SymbolicSession
            self._symbolic_main = SymbolicSession(self, self._symbolic, self._specialized,
                                                  _inplace_min_bytes, main=True)
            return
        # A dynamic-batch bundle (format 1.1) holds one plan per batch size; an older bundle is
        # one plan, the header itself.
        rows = schema.plans
        if schema.batch is not None:
            self.batch = BatchInfo(schema.batch.sizes, frozenset(schema.batch.inputs),
                                   frozenset(schema.batch.outputs))
        metas = [(_specs(row.inputs), _specs(row.outputs)) for row in rows]

        # CPU features are checked before any code is mapped (every plan's code).
        chosen = [row.code[cpu.pick_variant([v.record() for v in row.code], name)]
                  for row in rows]
        self.code_variant = chosen[-1].record()

        self._recipes = self._make_recipes(rows, metas, chosen, library_functions)
        self._constant_arrays = constants
        self._threads = threads
        self._main = Session(self, self._instantiate(threads))
        self._executors = [p.executor for p in self._main._plans]
        self._plans = self._main._plans
        self._arena = self._main._arena
        first, last = self._plans[0], self._plans[-1]
        self._image = self._images[-1]
        self._executor = last.executor
        self._views = last.views
        # model.inputs/outputs: the smallest plan's (batch 1 when the bundle has it).
        self.inputs, self.outputs = first.inputs, first.outputs
        if self.batch is not None:
            sizes, batch = self.batch.sizes, self.batch
            self.inputs = [dataclasses.replace(s, batch_sizes=sizes) if s.name in batch.inputs
                           else s for s in self.inputs]
            self.outputs = [dataclasses.replace(s, batch_sizes=sizes) if s.name in batch.outputs
                            else s for s in self.outputs]
        self._input_names = frozenset(s.name for s in self.inputs)
        self._feeds, self._output_views = last.feeds, last.output_views
        self.num_instructions = last.instructions

    def _load_specialized(self, rows: Sequence[Plan], constants: list[np.ndarray],
                          library_functions: Mapping[str, Any] | None, threads: int) -> None:
        """A symbolic bundle's static plans (``--batch-sizes``): mapped and prepared at load,
        over one arena, each found by its inputs' exact shapes (``_run_symbolic``)."""
        name = self.name
        metas = [(_specs(row.inputs), _specs(row.outputs)) for row in rows]
        chosen = [row.code[cpu.pick_variant([v.record() for v in row.code], name)]
                  for row in rows]
        self._recipes = self._make_recipes(rows, metas, chosen, library_functions)
        self._constant_arrays = constants
        self._threads = threads
        self._specialized = self._specialized_plans(threads)
        plans = list(self._specialized.values())
        self._executors = [p.executor for p in plans]
        self._specialized_dtypes = [storage_dtype(s.dtype) for s in self.inputs]
        self.specialized_batches = sizes = tuple(p.batch for p in plans)
        # Shown and fed as a dynamic-batch bundle's (`infer` sizes images and batches by it):
        # the inputs and outputs whose first dim is a size variable take any batch N; their
        # other dims, and the other inputs, are the static plans' (the same in every plan).
        batched = [frozenset(s.name for s in specs if s.shape and isinstance(s.shape[0], str))
                   for specs in (self.inputs, self.outputs)]
        if batched[0]:
            self.batch = BatchInfo(sizes, batched[0], batched[1])
            first = plans[0]
            self.inputs = [dataclasses.replace(t, batch_sizes=sizes if t.name in batched[0]
                                               else None) for t in first.inputs]
            self.outputs = [dataclasses.replace(t, batch_sizes=sizes if t.name in batched[1]
                                                else None) for t in first.outputs]

    def _specialized_plans(self, threads: int) -> dict[tuple, _Plan]:
        """The static plans of a symbolic bundle over a new arena, by their inputs' shapes."""
        plans = self._instantiate(threads)
        for plan, row in zip(plans, self.schema.specialized):
            plan.batch = row.batch
        return {tuple(s.shape for s in p.inputs): p for p in plans}

    def _make_recipes(self, rows: Sequence[Plan], metas: list, chosen: list,
                      library_functions: Mapping[str, Any] | None) -> list[_Recipe]:
        reader, name = self._reader, self._reader.name
        # Library functions are resolved before any code is mapped too.
        sites = [self._sites(row.library_calls or (), library_functions) for row in rows]
        recipes = []
        for (inputs, outputs), variant, row, site_list in zip(metas, chosen, rows, sites):
            image = elf.load_object(reader.payload(variant.object), elf.default_externals(),
                                    arch=variant.arch)
            self._images.append(image)
            kernels = [(image.address(k.symbol), bool(k.parallel)) for k in row.kernels]
            program = vm.decode(reader.payload(row.vm.bytecode), len(row.tensors), len(kernels),
                                len(site_list), name)
            self._check_arity(program, row.kernels, row.tensors)
            recipes.append(_Recipe(row, row.tensors, inputs, outputs,
                                   row.memory_plan.arena_bytes, row.kernels, kernels,
                                   site_list, program, image))
        return recipes

    def _instantiate(self, threads: int) -> list[_Plan]:
        """Plans over a new arena and new executors, sharing the mapped code and the weights.

        One arena, as large as the largest plan needs: the plans of one session take turns in
        it (its calls are serialized). It holds inputs, intermediates and outputs at the plan's
        offsets; the weights are views of the mapped file, never copied."""
        arena_bytes = max(r.arena_bytes for r in self._recipes)
        try:
            raw = np.zeros(arena_bytes + ARENA_ALIGN, dtype=np.uint8)
        except MemoryError:  # a damaged or hostile plan may declare an absurd arena
            raise BundleError(f"{self.name}: its memory plan asks for a {arena_bytes}-byte "
                              "arena, which cannot be allocated here") from None
        start = -raw.ctypes.data % ARENA_ALIGN
        arena = raw[start:start + arena_bytes]
        plans = []
        for r in self._recipes:
            views, addresses = self._tensor_views(r.tensors, self._constant_arrays,
                                                  r.arena_bytes, arena)
            executor = vm.Executor(r.program, r.kernels, r.sites, addresses, views, threads,
                                   pool=vm.PoolCode.from_image(r.image))
            bindings = self._bindings(r.row, r.inputs, r.outputs, r.tensors, r.kernels_meta,
                                      executor, addresses)
            output_bindings = self._output_bindings(r.row, r.tensors, executor, addresses)
            plans.append(_Plan(
                batch=r.row.batch if self.batch is not None else None,
                inputs=r.inputs, outputs=r.outputs,
                # Per-call work stays small: the I/O views are fixed at load.
                output_views=[(s.name, views[s.tensor]) for s in r.outputs],
                feeds=[(s, views[s.tensor], storage_dtype(s.dtype), b)
                       for s, b in zip(r.inputs, bindings)],
                output_bindings=output_bindings,
                executor=executor, instructions=len(r.program), arena_bytes=r.arena_bytes,
                views=views, arena=arena))
        return plans

    def _sites(self, sites: Sequence[LibraryCall | dict], extra: Mapping[str, Any] | None
               ) -> list[tuple[Any, dict]]:
        """Each library call's function (``extra``, then the registered ones) and attributes.
        ``runtime/symbolic.py`` passes the calls as header maps."""
        calls = [s if isinstance(s, LibraryCall) else LibraryCall.parse(s, f"library call {i}")
                 for i, s in enumerate(sites)]
        fns = library.resolve([c.func for c in calls], extra, self._reader.name)
        return [(fns[c.func], dict(c.attrs or {})) for c in calls]

    @staticmethod
    def _tensor_views(tensors: Sequence[TensorRow], constants: list[np.ndarray],
                      arena_bytes: int, arena: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
        views, addresses = [], []
        for i, row in enumerate(tensors):
            shape, dtype = row.shape, row.dtype
            size = nbytes_of(shape, dtype)
            if row.kind == ARENA and row.ref + size <= arena_bytes:
                view = arena[row.ref:row.ref + size].view(storage_dtype(dtype)).reshape(shape)
            elif row.kind == CONST and row.ref < len(constants) \
                    and constants[row.ref].nbytes == size \
                    and constants[row.ref].dtype == storage_dtype(dtype):
                view = constants[row.ref].reshape(shape)
            else:
                raise BundleError(f"bundle header: tensor {i} lies outside its storage")
            views.append(view)
            addresses.append(view.ctypes.data)
        return views, addresses

    @staticmethod
    def _bindings(row: Plan, inputs: list[TensorSpec], outputs: list[TensorSpec],
                  tensors: Sequence[TensorRow], kernels_meta: Sequence[KernelRow],
                  executor: vm.Executor, addresses: list[int]) -> list:
        """Per input, the kernel argument slots a run may point at the caller's own array
        instead of copying it into the arena (None: always copy). The header lists each input's
        ``views``, the tensor rows over its bytes (its reshapes). A row listed there must have the
        input's offset and size, and every use of them must be a kernel reading its input, so a
        damaged list can make a kernel read the caller's array in place of equally many arena
        bytes, never write to it. An input that is also an output, or read by a library call or
        a copy, is copied as before."""
        out = []
        num_inputs = [k.num_inputs for k in kernels_meta]
        output_tensors = {s.tensor for s in outputs}
        for spec, raw in zip(inputs, row.inputs):
            ids = raw.views
            if (not _rows_over(ids, spec.tensor, tensors, nbytes_of(spec.shape, spec.dtype))
                    or output_tensors.intersection(ids)):
                out.append(None)
                continue
            out.append(executor.input_binding(frozenset(ids), num_inputs,
                                              addresses[spec.tensor]))
        return out

    @staticmethod
    def _output_bindings(row: Plan, tensors: Sequence[TensorRow], executor: vm.Executor,
                         addresses: list[int]) -> dict[str, Any]:
        """Per output of at least OUTPUT_INPLACE_MIN_BYTES, the kernel argument slots a run may
        point at the array it returns (or the caller's ``out=`` array), so that the kernels
        write it there instead of the arena, and no copy follows. The header lists each
        output's ``views`` (its row and its reshapes; bundles before it list none, and their
        outputs are copied). A listed row must have the output's offset and size, no row may be
        an input's or another output's, and every use must be a kernel call; so a damaged list
        can only make kernels use the returned array in place of equally many arena bytes."""
        taken: dict[int, int] = {}
        for io in row.inputs + row.outputs:
            ids = io.views if isinstance(io.views, tuple) else ()
            for t in {t for t in ids if type(t) is int} | {io.tensor}:
                taken[t] = taken.get(t, 0) + 1
        out = {}
        for io in row.outputs:
            ids, base = io.views, tensors[io.tensor]
            size = nbytes_of(base.shape, base.dtype)
            if (size < OUTPUT_INPLACE_MIN_BYTES or not _rows_over(ids, io.tensor, tensors, size)
                    or any(taken.get(t) != 1 for t in ids)):
                continue
            binding = executor.output_binding(frozenset(ids), addresses[io.tensor])
            if binding is not None:
                out[io.name] = binding
        return out

    @staticmethod
    def _check_arity(program: list[vm.Instruction], kernels_meta: Sequence[KernelRow],
                     tensors: Sequence[TensorRow]) -> None:
        for ins in program:
            if ins.opcode != OP_CALL_KERNEL:
                continue
            k = kernels_meta[ins.target]
            expected = k.num_inputs + k.num_outputs + (1 if k.workspace_bytes else 0)
            if len(ins.operands) != expected:
                raise BundleError(f"bundle header: kernel {k.name} takes {expected} "
                                  f"tensors, bytecode passes {len(ins.operands)}")
            if k.workspace_bytes:
                ws = tensors[ins.operands[-1]]
                if nbytes_of(ws.shape, ws.dtype) < k.workspace_bytes:
                    raise BundleError(f"bundle header: kernel {k.name} workspace too small")

    # ---- running ------------------------------------------------------------------------------

    def _check_input(self, spec: TensorSpec, value: Any) -> np.ndarray:
        value = _as_stored(spec, _as_array(spec, value))
        if value.ndim != len(spec.shape):
            raise InputError(f"input {spec.name!r} has rank {value.ndim} (shape "
                             f"{tuple(value.shape)}); the model takes rank {len(spec.shape)} "
                             f"shape {spec.shape}")
        if tuple(value.shape) != spec.shape:
            raise InputError(f"input {spec.name!r} has shape {tuple(value.shape)}; the model "
                             f"takes {spec.shape}")
        return value

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run once on ``feeds`` (input name -> array); return output name -> array.

        ``outputs`` names the outputs to return (default: all, in the bundle's order); ``out``
        maps output names to arrays to write them into (C-contiguous, writable, the output's
        shape and dtype), which are returned as they are; other outputs are new arrays.
        Safe from several threads: calls on one model take turns in its arena; for calls that
        run at the same time, give each thread its own ``model.session()``."""
        if self._symbolic is not None:
            return self._run_symbolic(feeds, outputs, out)
        return self._main.run(feeds, outputs, out)

    def _run_symbolic(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None,
                      out: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """``run`` for a symbolic bundle: the model's own session (runtime/symbolic_session.py)."""
        return self._symbolic_main.run(feeds, outputs, out)

    def _specialized_plan(self, feeds: Mapping[str, Any], plans: dict | None = None
                          ) -> _Plan | None:
        """The static plan of ``plans`` (default: the model's) whose inputs have exactly the
        fed arrays' shapes (and dtypes)."""
        plans = self._specialized if plans is None else plans
        key = []
        for spec, dtype in zip(self.inputs, self._specialized_dtypes):
            value = feeds[spec.name]
            if type(value) is not np.ndarray or value.dtype != dtype:
                return None
            key.append(value.shape)
        return plans.get(tuple(key))

    def session(self, threads: int | None = None) -> Any:
        """A ``Session``: this model with an arena (and thread pool) of its own, so several
        sessions run at the same time from different threads. They share the mapped code and
        the weights (never copied); each holds only its arena, the model's working memory.
        Every bundle kind has them: fixed shapes and batch plans (``Session``), symbolic shapes,
        bounded or not, with or without batch plans (``symbolic_session.SymbolicSession``:
        its own plans per shape)."""
        threads = self._threads if threads is None else checked_threads(threads)
        if self._symbolic is not None:
            from .symbolic_session import SymbolicSession
            plans = self._specialized_plans(threads) if self._specialized else {}
            symbolic = SymbolicSession(self, self._symbolic.fork(threads), plans,
                                       _inplace_min_bytes)
            self._sessions.add(symbolic)
            return symbolic
        if self._executor is None:
            raise InputError(f"{self.name} is closed")
        session = Session(self, self._instantiate(threads))
        self._sessions.add(session)
        return session

    def _check_feed_names(self, feeds: Mapping[str, Any]) -> None:
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of input name -> array, not "
                             f"{type(feeds).__name__}")
        if feeds.keys() != self._input_names:
            unknown = sorted(set(feeds) - self._input_names)
            missing = [s.name for s in self.inputs if s.name not in feeds]
            raise InputError(f"{self.name} takes inputs {sorted(self._input_names)}; "
                             + (f"unknown: {unknown}" if unknown else "")
                             + ("; " if unknown and missing else "")
                             + (f"missing: {missing}" if missing else ""))

    def _selected_outputs(self, outputs: Sequence[str] | None,
                          out: Mapping[str, np.ndarray] | None) -> list[str]:
        """The output names a run returns, in order; every name known and ``out`` a subset."""
        names = [s.name for s in self.outputs]
        if outputs is None:
            chosen = names
        else:
            if isinstance(outputs, str):
                raise InputError(f"outputs= takes a list of names, e.g. [{outputs!r}]")
            chosen = list(outputs)
            unknown = [n for n in chosen if n not in names]
            if unknown or not chosen or len(set(chosen)) != len(chosen):
                raise InputError(f"outputs={chosen!r}: {self.name} has outputs {names}; name "
                                 "each at most once" + (f" (unknown: {unknown})" if unknown
                                                         else ""))
        if out is not None:
            if not isinstance(out, Mapping):
                raise InputError("out= takes a dict of output name -> numpy array")
            extra = [n for n in out if n not in chosen]
            if extra:
                raise InputError(f"out= names {extra}, which this run does not return "
                                 f"(outputs: {chosen})")
        return chosen

    @staticmethod
    def _check_out(name: str, array: Any, spec: TensorSpec, shape: tuple[int, ...]) -> None:
        """A caller's output array fits: a writable, C-contiguous ndarray of the shape and
        storage dtype the output has (one line naming what differs)."""
        if not isinstance(array, np.ndarray):
            raise InputError(f"out[{name!r}] is a {type(array).__name__}; give a numpy array "
                             f"np.empty({_shape_text(shape)}, np.{storage_dtype(spec.dtype).name})")
        store = storage_dtype(spec.dtype)
        if array.dtype != store:
            raise InputError(f"out[{name!r}] has dtype {array.dtype.name}; output {name!r} is "
                             f"{store.name}")
        if tuple(array.shape) != shape:
            raise InputError(f"out[{name!r}] has shape {tuple(array.shape)}; output {name!r} "
                             f"has shape {shape} for these inputs")
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise InputError(f"out[{name!r}] must be C-contiguous and writable "
                             "(np.ascontiguousarray, or a fresh np.empty)")

    def _check_batched_input(self, spec: TensorSpec, value: Any) -> np.ndarray:
        value = _as_stored(spec, _as_array(spec, value))
        want = ("N",) + tuple(spec.shape[1:])
        if value.ndim != len(spec.shape) or tuple(value.shape[1:]) != tuple(spec.shape[1:]):
            raise InputError(f"input {spec.name!r} has shape {tuple(value.shape)}; the model "
                             f"takes {_shape_text(want)} for any batch N >= 1")
        if value.shape[0] == 0:
            raise InputError(f"input {spec.name!r} has a batch of 0; the model takes "
                             f"{_shape_text(want)} for any batch N >= 1")
        return value

    def profile(self, feeds: Mapping[str, Any], runs: int = 20, warmup: int = 1) -> Any:
        """Run on ``feeds`` ``warmup`` times (at least once: it checks and places the inputs),
        then ``runs`` times timing every VM instruction; return a ``runtime.profile.Profile``.
        ``run`` itself is never timed. A dynamic-batch bundle profiles the plan that a batch of
        the feeds' size runs on (at most the largest plan's batch)."""
        from .profile import profile_executor

        if self._symbolic is not None:   # the plan of the feeds' sizes
            plan = self._specialized_plan(feeds) if self._specialized else None
            if plan is not None:
                for _ in range(max(1, warmup)):
                    self.run(feeds)
                row = next(r for r in self.schema.specialized if r.batch == plan.batch)
                with self._lock:
                    return profile_executor(self.name, plan.executor, row, runs)
            with self._lock:
                return self._symbolic.profile(feeds, runs, warmup)

        if self._executor is None:
            raise InputError(f"{self.name} is closed")
        if runs < 1 or warmup < 0:
            raise InputError(f"profile needs runs >= 1 and warmup >= 0, got {runs} and {warmup}")
        index = 0
        if self.batch is not None:
            spec = next(s for s in self.inputs if s.name in self.batch.inputs)
            n = np.shape(feeds.get(spec.name))[0] if np.ndim(feeds.get(spec.name)) else 0
            largest = self._plans[-1].batch
            if n > largest:
                raise InputError(f"profile runs one plan: give a batch of at most {largest}, "
                                 f"not {n}")
            index = next((i for i, p in enumerate(self._plans) if p.batch >= n), 0)
        for _ in range(max(1, warmup)):
            self.run(feeds)
        row = self.schema.plans[index]
        with self._lock:
            return profile_executor(self.name, self._plans[index].executor, row, runs)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """``model(x)`` / ``model(x=x)``: the output array, or a tuple for several outputs."""
        return self._call(self.run, args, kwargs)

    def _call(self, run: Any, args: tuple, kwargs: dict) -> np.ndarray | tuple[np.ndarray, ...]:
        if len(args) > len(self.inputs):
            raise InputError(f"{self.name} takes {len(self.inputs)} input(s), got {len(args)}")
        feeds = {s.name: a for s, a in zip(self.inputs, args)}
        for k, v in kwargs.items():
            if k in feeds:
                raise InputError(f"input {k!r} given twice")
            feeds[k] = v
        result = run(feeds)
        values = tuple(result[s.name] for s in self.outputs)
        return values[0] if len(values) == 1 else values

    def close(self) -> None:
        """Release the code mapping and the file; the model and its sessions cannot run
        afterwards."""
        if getattr(self, "_symbolic", None) is not None:
            self._symbolic.close()
            self._symbolic = None
        for session in list(getattr(self, "_sessions", ())):
            session.close()
        for executor in getattr(self, "_executors", []):
            executor.close()
        for image in getattr(self, "_images", []):
            image.close()
        self._executors, self._images, self._plans = [], [], []
        self._executor = None
        self._image = None
        self._views, self._feeds, self._output_views = [], [], []
        self._reader.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}{list(s.dims)}:{s.dtype}" for s in self.inputs)
        outs = ", ".join(f"{s.name}{list(s.dims)}:{s.dtype}" for s in self.outputs)
        return f"<mlcpack Model {self.name}: ({ins}) -> ({outs})>"


def _rows_over(ids: Any, tensor: int, tensors: Sequence[TensorRow], size: int) -> bool:
    """Whether a header's ``views`` list ``ids`` is tensor rows over exactly ``tensor``'s bytes:
    in-range indices, ``tensor`` among them, each an arena row at its offset with ``size``
    bytes (anything else turns binding that input or output off)."""
    return (isinstance(ids, tuple) and tensor in ids
            and all(isinstance(t, int) and 0 <= t < len(tensors) for t in ids)
            and all(tensors[t].kind == ARENA and tensors[t].ref == tensors[tensor].ref
                    and nbytes_of(tensors[t].shape, tensors[t].dtype) == size for t in ids))


def _aligned_empty(like: np.ndarray) -> tuple[np.ndarray, int]:
    """A new array of ``like``'s shape and dtype whose data starts on an ARENA_ALIGN boundary
    (the alignment the kernels had in the arena), and that address."""
    raw = np.empty(like.nbytes + ARENA_ALIGN, dtype=np.uint8)
    address = raw.ctypes.data
    start = -address % ARENA_ALIGN
    return raw[start:start + like.nbytes].view(like.dtype).reshape(like.shape), address + start


class Session:
    """A model with an arena of its own: ``model.session()``. Sessions of one model run at
    the same time from different threads; each shares the model's mapped code and weights and
    holds only its working memory (the arena) and, with ``threads`` > 1, its worker threads.
    Calls on one session take turns. ``run`` and ``__call__`` behave as the model's."""

    def __init__(self, model: Model, plans: list[_Plan]) -> None:
        self._model = model
        self._plans = plans
        self._arena = plans[0].arena
        self._lock = threading.Lock()
        last = plans[-1]
        self._executor: vm.Executor | None = last.executor
        self._feeds, self._output_views = last.feeds, last.output_views
        # Built once, so that a run with neither outputs= nor out= does no per-call setup.
        self._all_outputs = [name for name, _ in last.output_views]
        self._output_specs = {s.name: s for s in last.outputs}
        self._views = dict(last.output_views)
        self._output_bindings = last.output_bindings

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._model.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._model.outputs

    @property
    def arena_bytes(self) -> int:
        """The working memory this session holds (the weights are the model's, shared)."""
        return int(self._arena.nbytes)

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """See ``Model.run``."""
        model = self._model
        if self._executor is None or model._executor is None:
            raise InputError(f"{model.name}: this session is closed")
        if type(feeds) is not dict or feeds.keys() != model._input_names:
            model._check_feed_names(feeds)
        if outputs is None and out is None:
            names, out = self._all_outputs, {}
        else:
            names = model._selected_outputs(outputs, out)
            out = out or {}
        if model.batch is not None:
            return self._run_batched(feeds, names, out)
        values = []
        for spec, _, store, _ in self._feeds:
            value = feeds[spec.name]
            if type(value) is not np.ndarray or value.dtype != store or value.shape != spec.shape:
                value = model._check_input(spec, value)
            values.append(value)
        specs = self._output_specs
        for name, array in out.items():
            model._check_out(name, array, specs[name], specs[name].shape)
        views = self._views
        with self._lock:
            for (_, view, _, binding), value in zip(self._feeds, values):
                # A large contiguous, aligned array is read where it lies (vm.InputBinding.feed)
                if binding is None:
                    np.copyto(view, value)
                else:
                    binding.feed(view, value, INPLACE_MIN_BYTES)
            # A large output is written where it is returned (a new array, or the caller's
            # out= array when 64-byte aligned): no copy of the arena's bytes follows.
            arrays: dict[str, np.ndarray] = {}
            if self._output_bindings:
                for name in names:
                    binding = self._output_bindings.get(name)
                    if binding is None:
                        continue
                    array = out.get(name)
                    if array is None:
                        array, address = _aligned_empty(views[name])
                    else:
                        address = array.ctypes.data
                        # kernels must not write where they read an input or another output
                        if address % ARENA_ALIGN or any(
                                np.may_share_memory(array, other)
                                for other in (*values, *arrays.values())):
                            continue
                    binding.bind(address)
                    arrays[name] = array
            try:
                self._executor.run()
            finally:   # other runs (profile, batches) read the outputs from the arena
                for name in arrays:
                    binding = self._output_bindings[name]
                    binding.bind(binding.arena)
            if not arrays and not out:
                return {name: views[name].copy() for name in names}
            result = {}
            for name in names:
                if name in arrays:
                    result[name] = arrays[name]
                elif name in out:
                    np.copyto(out[name], views[name])
                    result[name] = out[name]
                else:
                    result[name] = views[name].copy()
            return result

    def _run_batched(self, feeds: Mapping[str, Any], names: list[str],
                     out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Any batch from 1 up: chunks of the largest plan, the rest on the smallest plan that
        holds it, its input rows padded with zeros and its output rows cut off."""
        model = self._model
        batch = model.batch
        assert batch is not None
        values, n = {}, None
        for spec in self._plans[0].inputs:
            value = feeds[spec.name]
            if spec.name not in batch.inputs:
                values[spec.name] = model._check_input(self._plans[-1].input_spec(spec.name),
                                                       value)
                continue
            value = model._check_batched_input(spec, value)
            if n is not None and value.shape[0] != n:
                raise InputError(f"input {spec.name!r} has batch {value.shape[0]}, another "
                                 f"input has {n}: the batched inputs must agree")
            n = value.shape[0]
            values[spec.name] = value
        assert n is not None
        specs = {s.name: s for s in self._plans[0].outputs}
        for name, array in out.items():
            model._check_out(name, array, specs[name], (n, *specs[name].shape[1:]))
        parts: dict[str, list[np.ndarray]] = {name: [] for name in names if name not in out}
        largest = self._plans[-1]
        with self._lock:
            done = 0
            while done < n:
                m = min(n - done, largest.batch)
                plan = next(p for p in self._plans if p.batch >= m)
                for spec, view, _, _ in plan.feeds:
                    value = values[spec.name]
                    if spec.name not in batch.inputs:
                        np.copyto(view, value)
                        continue
                    np.copyto(view[:m], value[done:done + m])
                    if m < plan.batch:
                        view[m:] = 0
                plan.executor.run()
                for name, view in plan.output_views:
                    if name in out:
                        np.copyto(out[name][done:done + m], view[:m])
                    elif name in parts:
                        parts[name].append(view[:m].copy())
                done += m
        return {name: out[name] if name in out else
                (parts[name][0] if len(parts[name]) == 1 else np.concatenate(parts[name]))
                for name in names}

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """``session(x)``: as ``model(x)``."""
        return self._model._call(self.run, args, kwargs)

    def close(self) -> None:
        """Stop this session's worker threads and drop its arena (the model stays open)."""
        for plan in self._plans:
            plan.executor.close()
        self._executor = None
        self._model._sessions.discard(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | os.PathLike, *, verify: bool = True,
         library: Mapping[str, Any] | None = None, threads: int | None = None,
         trusted_keys: Iterable[Any] | None = None) -> Model:
    """Load a bundle. ``verify`` checks its SHA-256 content hash; ``library`` supplies library
    functions by name; ``threads`` (default ``MLCPACK_NUM_THREADS`` or 1) runs parallel kernels
    on that many threads; ``trusted_keys`` (Ed25519 public keys: key objects, raw 32 bytes, PEM
    or OpenSSH text, or key file paths) refuses, with SignatureError, any bundle not signed by
    one of them (an empty list trusts nothing). Needs ``cryptography`` only when given."""
    return Model(path, verify=verify, library_functions=library, threads=threads,
                 trusted_keys=trusted_keys)


def model_inputs_summary(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{s.name} {list(s.shape)} {s.dtype}" for s in specs)
