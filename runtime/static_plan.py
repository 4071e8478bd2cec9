"""Running static plans: every tensor's shape and offset fixed at export.

``StaticCode`` maps the code of a bundle's static plans (one, or one per batch size, or a
symbolic bundle's ``--batch-sizes`` plans) and decodes their bytecode once; ``instantiate``
gives a session its ``ArenaPlan``s over an arena of its own. Two bundle kinds run on them:

- ``FixedPlan`` / ``FixedSession``: one plan, every shape fixed (format 1.0);
- ``BatchPlans`` / ``BatchSession``: one plan per batch size (format 1.1); any batch from 1 up
  runs in chunks of the largest plan, the rest on the smallest plan that holds it.

A run of one plan (``ArenaPlan.run``) reads a large input where it lies and has its kernels
write a large output straight into the array it returns (``Executor.input_binding`` and
``output_binding``): no copy in or out.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import cpu, elf, library, vm
from .bundle import BundleReader, nbytes_of, storage_dtype
from .errors import BundleError, InputError
from .header import ARENA, CONST, OP_CALL_KERNEL, IORow, KernelRow, Plan, TensorRow
from .plan import BatchInfo, Inplace, TensorSpec
from .session import Session, bind_outputs, check_batched_input, check_input, check_out

ARENA_ALIGN = 64


def specs(rows: Sequence[IORow]) -> list[TensorSpec]:
    return [TensorSpec(r.name, r.shape, r.dtype, r.tensor) for r in rows]


def aligned_empty(like: np.ndarray) -> tuple[np.ndarray, int]:
    """A new array of ``like``'s shape and dtype whose data starts on an ARENA_ALIGN boundary
    (the alignment the kernels had in the arena), and that address."""
    raw = np.empty(like.nbytes + ARENA_ALIGN, dtype=np.uint8)
    address = raw.ctypes.data
    start = -address % ARENA_ALIGN
    return raw[start:start + like.nbytes].view(like.dtype).reshape(like.shape), address + start


@dataclass
class _Recipe:
    """What one plan needs that every session shares: its header rows, the mapped code's
    kernel addresses, library calls and decoded bytecode."""
    row: Plan
    tensors: tuple[TensorRow, ...]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    kernels: list[tuple[int, bool]]
    sites: list[tuple[Any, dict]]
    program: list[vm.Instruction]
    image: Any


class ArenaPlan:
    """One static plan over a session's arena: its views, prepared calls and the bindings that
    let a run read inputs and write outputs where the caller's arrays lie."""

    def __init__(self, recipe: _Recipe, arena: np.ndarray, views: list[np.ndarray],
                 executor: vm.Executor, input_bindings: list, output_bindings: dict) -> None:
        self.row = recipe.row
        self.batch = recipe.row.batch
        self.inputs = recipe.inputs
        self.outputs = recipe.outputs
        self.arena = arena      # the session's arena the views lie in (shared by its plans)
        self.views = views
        self.executor = executor
        self.instructions = len(recipe.program)
        self.arena_bytes = recipe.row.memory_plan.arena_bytes
        # Per-call work stays small: the I/O views are fixed here.
        # per input: (spec, arena view, storage dtype, binding or None)
        self.feeds = [(s, views[s.tensor], storage_dtype(s.dtype), b)
                      for s, b in zip(self.inputs, input_bindings)]
        self.output_views = [(s.name, views[s.tensor]) for s in self.outputs]
        self.output_bindings = output_bindings   # output name -> the binding kernels write
        self.all_outputs = [name for name, _ in self.output_views]
        self.output_specs = {s.name: s for s in self.outputs}
        self.views_by_name = dict(self.output_views)

    def input_spec(self, name: str) -> TensorSpec:
        return next(s for s in self.inputs if s.name == name)

    def run(self, values: list[np.ndarray], names: list[str], out: Mapping[str, np.ndarray],
            min_bytes: Callable[[], int]) -> dict[str, np.ndarray]:
        """One run on ``values`` (checked: one per input, in order, of the plan's shapes and
        storage dtypes); the outputs ``names``, into ``out``'s arrays where given (checked).
        ``min_bytes()``: the size from which an input is read in place."""
        views = self.views_by_name
        for (_, view, _, binding), value in zip(self.feeds, values):
            # A large contiguous, aligned array is read where it lies (vm.InputBinding.feed)
            if binding is None:
                np.copyto(view, value)
            else:
                binding.feed(view, value, min_bytes())
        # A large output is written where it is returned (a new array, or the caller's out=
        # array when 64-byte aligned): no copy of the arena's bytes follows.
        arrays: dict[str, np.ndarray] = {}
        bindings = self.output_bindings
        if bindings:
            for name in names:
                binding = bindings.get(name)
                if binding is None:
                    continue
                array = out.get(name)
                if array is None:
                    array, address = aligned_empty(views[name])
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
            self.executor.run()
        finally:   # other runs (profile, batches) read the outputs from the arena
            for name in arrays:
                binding = bindings[name]
                binding.bind(binding.arena)
        return bind_outputs(views, names, out, arrays)


def rows_over(ids: Any, tensor: int, tensors: Sequence[TensorRow], size: int) -> bool:
    """Whether a header's ``views`` list ``ids`` is tensor rows over exactly ``tensor``'s bytes:
    in-range indices, ``tensor`` among them, each an arena row at its offset with ``size``
    bytes (anything else turns binding that input or output off)."""
    return (isinstance(ids, tuple) and tensor in ids
            and all(isinstance(t, int) and 0 <= t < len(tensors) for t in ids)
            and all(tensors[t].kind == ARENA and tensors[t].ref == tensors[tensor].ref
                    and nbytes_of(tensors[t].shape, tensors[t].dtype) == size for t in ids))


class StaticCode:
    """The mapped code, library calls and decoded bytecode of a bundle's static plans (header
    ``Plan`` rows), shared by every session. CPU features and library functions are checked
    for every plan before any code is mapped."""

    def __init__(self, reader: BundleReader, rows: Sequence[Plan], constants: list[np.ndarray],
                 library_functions: Mapping[str, Any] | None, inplace: Inplace) -> None:
        name = reader.name
        self.name = name
        self.constants = constants
        self.inplace = inplace
        chosen = [row.code[cpu.pick_variant([v.record() for v in row.code], name)]
                  for row in rows]
        self.code_variant = chosen[-1].record()
        sites = [library.resolve_calls(row.library_calls or (), library_functions, name)
                 for row in rows]
        self.images: list[elf.CodeImage] = []
        self.recipes: list[_Recipe] = []
        try:
            for variant, row, site_list in zip(chosen, rows, sites):
                image = elf.load_object(reader.payload(variant.object),
                                        elf.default_externals(), arch=variant.arch)
                self.images.append(image)
                kernels = [(image.address(k.symbol), bool(k.parallel)) for k in row.kernels]
                program = vm.decode(reader.payload(row.vm.bytecode), len(row.tensors),
                                    len(kernels), len(site_list), name)
                check_arity(program, row.kernels, row.tensors)
                vm.check_branches(program, row.tensors, name)
                self.recipes.append(_Recipe(row, row.tensors, specs(row.inputs), specs(row.outputs), kernels,
                                            site_list, program, image))
        except BaseException:
            self.close()
            raise
        self.kernels = [k for r in self.recipes for k in r.kernels]

    def instantiate(self, threads: int) -> list[ArenaPlan]:
        """Plans over a new arena and new executors, sharing the mapped code and the weights.

        One arena, as large as the largest plan needs: the plans of one session take turns in
        it (its calls are serialized). It holds inputs, intermediates and outputs at the plan's
        offsets; the weights are views of the mapped file, never copied."""
        arena_bytes = max(r.row.memory_plan.arena_bytes for r in self.recipes)
        try:
            raw = np.zeros(arena_bytes + ARENA_ALIGN, dtype=np.uint8)
        except MemoryError:  # a damaged or hostile plan may declare an absurd arena
            raise BundleError(f"{self.name}: its memory plan asks for a {arena_bytes}-byte "
                              "arena, which cannot be allocated here") from None
        start = -raw.ctypes.data % ARENA_ALIGN
        arena = raw[start:start + arena_bytes]
        output_min_bytes = self.inplace.output_min_bytes()
        plans = []
        for r in self.recipes:
            views, addresses = tensor_views(r.tensors, self.constants,
                                            r.row.memory_plan.arena_bytes, arena)
            executor = vm.Executor(r.program, r.kernels, r.sites, addresses, views, threads,
                                   pool=vm.PoolCode.from_image(r.image),
                                   macs=[k.macs for k in r.row.kernels])
            plans.append(ArenaPlan(
                r, arena, views, executor,
                input_bindings(r.row, r.inputs, r.outputs, executor, addresses),
                output_bindings(r.row, r.tensors, executor, addresses, output_min_bytes)))
        return plans

    def close(self) -> None:
        for image in self.images:
            image.close()
        self.images = []


def tensor_views(tensors: Sequence[TensorRow], constants: list[np.ndarray], arena_bytes: int,
                 arena: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
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


def input_bindings(row: Plan, inputs: list[TensorSpec], outputs: list[TensorSpec],
                   executor: vm.Executor, addresses: list[int]) -> list:
    """Per input, the kernel argument slots a run may point at the caller's own array instead
    of copying it into the arena (None: always copy). The header lists each input's ``views``,
    the tensor rows over its bytes (its reshapes). A row listed there must have the input's
    offset and size, and every use of them must be a kernel reading its input, so a damaged
    list can make a kernel read the caller's array in place of equally many arena bytes, never
    write to it. An input that is also an output, or read by a library call or a copy, is
    copied as before."""
    out = []
    num_inputs = [k.num_inputs for k in row.kernels]
    output_tensors = {s.tensor for s in outputs}
    for spec, raw in zip(inputs, row.inputs):
        ids = raw.views
        if (not rows_over(ids, spec.tensor, row.tensors, nbytes_of(spec.shape, spec.dtype))
                or output_tensors.intersection(ids)):
            out.append(None)
            continue
        out.append(executor.input_binding(frozenset(ids), num_inputs, addresses[spec.tensor]))
    return out


def output_bindings(row: Plan, tensors: Sequence[TensorRow], executor: vm.Executor,
                    addresses: list[int], min_bytes: int) -> dict[str, Any]:
    """Per output of at least ``min_bytes`` (``model.OUTPUT_INPLACE_MIN_BYTES``), the kernel
    argument slots a run may point at the array it returns (or the caller's ``out=`` array), so
    that the kernels write it there instead of the arena, and no copy follows. The header lists
    each output's ``views`` (its row and its reshapes; bundles before it list none, and their
    outputs are copied). A listed row must have the output's offset and size, no row may be an
    input's or another output's, and every use must be a kernel call; so a damaged list can
    only make kernels use the returned array in place of equally many arena bytes."""
    taken: dict[int, int] = {}
    for io in row.inputs + row.outputs:
        ids = io.views if isinstance(io.views, tuple) else ()
        for t in {t for t in ids if type(t) is int} | {io.tensor}:
            taken[t] = taken.get(t, 0) + 1
    out = {}
    for io in row.outputs:
        ids, base = io.views, tensors[io.tensor]
        size = nbytes_of(base.shape, base.dtype)
        if (size < min_bytes or not rows_over(ids, io.tensor, tensors, size)
                or any(taken.get(t) != 1 for t in ids)):
            continue
        binding = executor.output_binding(frozenset(ids), addresses[io.tensor])
        if binding is not None:
            out[io.name] = binding
    return out


def check_arity(program: list[vm.Instruction], kernels_meta: Sequence[KernelRow],
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


def profile_plan(name: str, plan: ArenaPlan, runs: int) -> Any:
    """``runs`` runs of ``plan``'s prepared calls, every VM instruction timed."""
    from .profile import profile_executor

    return profile_executor(name, plan.executor, plan.row, runs)


class _StaticPlans:
    """What the two static kinds share: the code, the sessions, closing."""

    def __init__(self, code: StaticCode) -> None:
        self.code = code
        self.name = code.name
        self.code_variant = code.code_variant
        self.specialized_batches: tuple[int, ...] = ()
        self.sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        recipe = code.recipes[-1]
        self.num_instructions = len(recipe.program)

    @property
    def has_parallel_kernels(self) -> bool:
        return any(parallel for _, parallel in self.code.kernels)

    def close(self) -> None:
        for session in list(self.sessions):
            session.close()
        self.code.close()


class FixedPlan(_StaticPlans):
    """A bundle with every shape fixed: one plan, its offsets known at export."""

    def __init__(self, code: StaticCode) -> None:
        super().__init__(code)
        self.batch: BatchInfo | None = None
        first = code.recipes[0]
        self.inputs, self.outputs = first.inputs, first.outputs

    def session(self, threads: int, main: bool = False) -> FixedSession:
        session = FixedSession(self, self.code.instantiate(threads))
        if not main:
            self.sessions.add(session)
        return session


class FixedSession(Session):
    """A fixed-shape bundle's session: one plan over its arena."""

    def __init__(self, plan: FixedPlan, plans: list[ArenaPlan]) -> None:
        super().__init__(plan)
        self._plans = plans
        self._arena = plans[0].arena
        self._min_bytes = plan.code.inplace.input_min_bytes
        last = plans[-1]
        self._plan_run = last
        self._executor: vm.Executor = last.executor
        self._feeds = last.feeds
        # Built once, so that a run with neither outputs= nor out= does no per-call setup.
        self._all_outputs = last.all_outputs
        self._output_specs = last.output_specs
        self._views = last.views_by_name
        self._output_bindings = last.output_bindings

    @property
    def arena_bytes(self) -> int:
        return int(self._arena.nbytes)

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        if not self._open:
            raise self._closed()
        if type(feeds) is not dict or feeds.keys() != self._input_names:
            self._check_feed_names(feeds)
        if outputs is None and out is None:
            names, out = self._all_outputs, {}
        else:
            names = self._selected_outputs(outputs, out)
            out = out or {}
        values = []
        for spec, _, store, _ in self._feeds:
            value = feeds[spec.name]
            if type(value) is not np.ndarray or value.dtype != store or value.shape != spec.shape:
                value = check_input(spec, value)
            values.append(value)
        specs = self._output_specs
        for name, array in out.items():
            check_out(name, array, specs[name], specs[name].shape)
        with self._lock:
            return self._plan_run.run(values, names, out, self._min_bytes)

    def _profile(self, feeds: Mapping[str, Any], runs: int, warmup: int) -> Any:
        for _ in range(max(1, warmup)):
            self.run(feeds)
        with self._lock:
            return profile_plan(self._name, self._plan_run, runs)

    def _release(self) -> None:
        for plan in self._plans:
            plan.executor.close()


class BatchPlans(_StaticPlans):
    """A dynamic-batch bundle: one static plan per batch size (ascending)."""

    def __init__(self, code: StaticCode, batch: BatchInfo) -> None:
        super().__init__(code)
        self.batch = batch
        first = code.recipes[0]
        sizes = batch.sizes
        # model.inputs/outputs: the smallest plan's (batch 1 when the bundle has it).
        self.inputs = [dataclasses.replace(s, batch_sizes=sizes) if s.name in batch.inputs
                       else s for s in first.inputs]
        self.outputs = [dataclasses.replace(s, batch_sizes=sizes) if s.name in batch.outputs
                        else s for s in first.outputs]

    def session(self, threads: int, main: bool = False) -> BatchSession:
        session = BatchSession(self, self.code.instantiate(threads))
        if not main:
            self.sessions.add(session)
        return session


class BatchSession(Session):
    """A dynamic-batch bundle's session: its plans take turns in one arena."""

    def __init__(self, plan: BatchPlans, plans: list[ArenaPlan]) -> None:
        super().__init__(plan)
        self._batch = plan.batch
        self._plans = plans
        self._arena = plans[0].arena
        self._min_bytes = plan.code.inplace.input_min_bytes

    @property
    def arena_bytes(self) -> int:
        return int(self._arena.nbytes)

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Any batch from 1 up: a batch that is a plan's size runs on it as a fixed-shape
        bundle does (large inputs read and outputs written in place); any other in chunks of
        the largest plan, the rest on the smallest plan that holds it, its input rows padded
        with zeros and its output rows cut off."""
        if not self._open:
            raise self._closed()
        if type(feeds) is not dict or feeds.keys() != self._input_names:
            self._check_feed_names(feeds)
        names = self._selected_outputs(outputs, out)
        out = out or {}
        batch = self._batch
        values, n = {}, None
        for spec in self._plans[0].inputs:
            value = feeds[spec.name]
            if spec.name not in batch.inputs:
                values[spec.name] = check_input(self._plans[-1].input_spec(spec.name), value)
                continue
            value = check_batched_input(spec, value)
            if n is not None and value.shape[0] != n:
                raise InputError(f"input {spec.name!r} has batch {value.shape[0]}, another "
                                 f"input has {n}: the batched inputs must agree")
            n = value.shape[0]
            values[spec.name] = value
        assert n is not None
        specs = {s.name: s for s in self._plans[0].outputs}
        for name, array in out.items():
            check_out(name, array, specs[name], (n, *specs[name].shape[1:]))
        exact = next((p for p in self._plans if p.batch == n), None)
        with self._lock:
            if exact is not None:
                return exact.run([values[s.name] for s in exact.inputs], names, out,
                                 self._min_bytes)
            return self._run_chunks(values, n, names, out)

    def _run_chunks(self, values: dict[str, np.ndarray], n: int, names: list[str],
                    out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = self._batch
        parts: dict[str, list[np.ndarray]] = {name: [] for name in names if name not in out}
        largest = self._plans[-1]
        done = 0
        while done < n:
            m = min(n - done, largest.batch)
            plan = next(p for p in self._plans if p.batch >= m)
            for spec, view, _, binding in plan.feeds:
                if binding is not None:   # a previous exact-size run may have moved it
                    binding.bind(binding.arena)
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

    def _profile(self, feeds: Mapping[str, Any], runs: int, warmup: int) -> Any:
        """The plan that a batch of the feeds' size runs on (at most the largest plan's)."""
        spec = next(s for s in self._plan.inputs if s.name in self._batch.inputs)
        n = np.shape(feeds.get(spec.name))[0] if np.ndim(feeds.get(spec.name)) else 0
        largest = self._plans[-1].batch
        if n > largest:
            raise InputError(f"profile runs one plan: give a batch of at most {largest}, "
                             f"not {n}")
        plan = next((p for p in self._plans if p.batch >= n), self._plans[0])
        for _ in range(max(1, warmup)):
            self.run(feeds)
        with self._lock:
            return profile_plan(self._name, plan, runs)

    def _release(self) -> None:
        for plan in self._plans:
            plan.executor.close()
