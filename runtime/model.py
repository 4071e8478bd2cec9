"""Loading a bundle into a runnable model: ``load(path)`` returns a ``Model``.

Order of the checks at load, so nothing runs that should not: read and hash the file, validate the
header, choose a code variant this CPU supports (refusing before any code is mapped), resolve
library functions, map the object code, decode the bytecode.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import cpu, elf, library, vm
from .bundle import (STORAGE_DTYPES, BundleReader, check_disjoint, check_dtype, check_shape,
                     nbytes_of, payload_ref, storage_dtype)
from .errors import BundleError, CodeLoadError, InputError

ARENA_ALIGN = 64


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    tensor: int


def _specs(rows: Any, what: str, num_tensors: int) -> list[TensorSpec]:
    if not isinstance(rows, list) or not rows:
        raise BundleError(f"bundle header: {what} must be a non-empty list")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str):
            raise BundleError(f"bundle header: {what}[{i}] is malformed")
        t = r.get("tensor")
        if not isinstance(t, int) or not 0 <= t < num_tensors:
            raise BundleError(f"bundle header: {what}[{i}] names an invalid tensor")
        out.append(TensorSpec(r["name"], check_shape(r.get("shape"), f"{what}[{i}]"),
                              check_dtype(r.get("dtype"), f"{what}[{i}]"), t))
    return out


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
    executor: Any
    instructions: int
    arena_bytes: int
    views: list[np.ndarray]

    def input_spec(self, name: str) -> TensorSpec:
        return next(s for s in self.inputs if s.name == name)


def _shape_text(shape: tuple) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _plan_rows(h: dict, name: str) -> tuple[list[dict], BatchInfo | None]:
    """The plan rows of a header (the header itself for a one-plan bundle) and the batch info."""
    if "plans" not in h and "batch" not in h:
        return [h], None
    plans, batch = h.get("plans"), h.get("batch")
    if not isinstance(plans, list) or not plans or len(plans) > 64 \
            or not all(isinstance(p, dict) for p in plans) or not isinstance(batch, dict):
        raise BundleError(f"{name}: bundle header: plans/batch are malformed")
    sizes = [p.get("batch") for p in plans]
    if not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b < 1 << 31
               for b in sizes) or sizes != sorted(set(sizes)) or batch.get("sizes") != sizes:
        raise BundleError(f"{name}: bundle header: plan batch sizes {sizes!r} are malformed")
    names = [batch.get("inputs"), batch.get("outputs")]
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in names) \
            or not names[0]:
        raise BundleError(f"{name}: bundle header: batched inputs/outputs are malformed")
    return plans, BatchInfo(tuple(sizes), frozenset(names[0]), frozenset(names[1]))


def _check_batch_specs(batch: BatchInfo, specs: list[tuple[list[TensorSpec], list[TensorSpec]]]
                       ) -> None:
    """Every plan has the same inputs and outputs, every output and each batched input has the
    plan's batch first, and the other dims agree between plans."""
    ref_in, ref_out = specs[0]
    for b, (inputs, outputs) in zip(batch.sizes, specs):
        for mine, ref, what, batched in ((inputs, ref_in, "input", batch.inputs),
                                          (outputs, ref_out, "output", batch.outputs)):
            if [(s.name, s.dtype, len(s.shape)) for s in mine] != \
                    [(s.name, s.dtype, len(s.shape)) for s in ref]:
                raise BundleError(f"bundle header: the plans' {what}s differ")
            for s, r in zip(mine, ref):
                if s.name in batched or what == "output":
                    if s.name not in batched or not s.shape or s.shape[0] != b \
                            or s.shape[1:] != r.shape[1:]:
                        raise BundleError(f"bundle header: {what} {s.name!r} of the batch-{b} "
                                          f"plan does not have the batch first")
                elif s.shape != r.shape:
                    raise BundleError(f"bundle header: {what} {s.name!r} differs between plans")
    if not batch.inputs <= {s.name for s in ref_in}:
        raise BundleError("bundle header: batched inputs name no input")


def _as_array(spec: TensorSpec, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except Exception:
        raise InputError(f"input {spec.name!r} is not array-like") from None


def _pool_code(image: elf.CodeImage) -> vm.PoolCode | None:
    """The object's thread hand-off functions; None for bundles made before they existed."""
    try:
        return vm.PoolCode(*(image.address(name) for name in vm.PoolCode.SYMBOLS), image=image)
    except CodeLoadError:
        return None


def _threads_from_env() -> int:
    value = os.environ.get("MLCPACK_NUM_THREADS", "1")
    try:
        return max(1, int(value))
    except ValueError:
        return 1


class Model:
    """A loaded bundle. ``model(x)`` or ``model.run({"x": x})`` runs one inference.

    Thread-safe: concurrent calls are serialized on one arena.
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True,
                 library_functions: Mapping[str, library.LibraryFunction] | None = None,
                 threads: int | None = None, trusted_keys: Iterable[Any] | None = None) -> None:
        self._reader = BundleReader(path, verify=verify)
        self._image: elf.CodeImage | None = None
        self._executor: vm.Executor | None = None
        self._images: list[elf.CodeImage] = []
        self._executors: list[vm.Executor] = []
        self._plans: list[_Plan] = []
        self._symbolic: Any = None   # a symbolic.SymbolicRunner for format-1.3 bundles
        self.batch: BatchInfo | None = None
        self.signed_by: str | None = None
        try:
            if trusted_keys is not None:  # before anything in the bundle is used
                from .signing import check_signature
                self.signed_by = check_signature(self._reader, trusted_keys)
            self._load(library_functions, threads or _threads_from_env())
        except BaseException:
            self.close()
            raise
        self._lock = threading.Lock()

    # ---- loading --------------------------------------------------------------------------------

    def _load(self, library_functions: Mapping[str, Any] | None, threads: int) -> None:
        reader, name = self._reader, self._reader.name
        h = reader.header
        self.header = h
        self.name = name
        self.labels = h.get("labels") if isinstance(h.get("labels"), list) else None
        self.preprocess = h.get("preprocess") if isinstance(h.get("preprocess"), dict) else None
        constants = self._constants(h.get("constants"))
        if "symbolic" in h:   # symbolic shapes: plans made per input size at run time
            from .symbolic import SymbolicRunner
            check_disjoint([(f"constant {i}", ref) for i, ref in enumerate(self._constant_refs)],
                           name)
            self._symbolic = SymbolicRunner(self, h, constants, library_functions, threads)
            self.inputs, self.outputs = self._symbolic.inputs, self._symbolic.outputs
            self._input_names = frozenset(s.name for s in self.inputs)
            self.num_instructions = len(self._symbolic.program)
            return
        # A dynamic-batch bundle (format 1.1) holds one plan per batch size under "plans"; an
        # older bundle is one plan, the header itself.
        rows, self.batch = _plan_rows(h, name)
        metas = []
        for row in rows:
            tensors = row.get("tensors")
            if not isinstance(tensors, list):
                raise BundleError("bundle header: tensors must be a list")
            metas.append((tensors, _specs(row.get("inputs"), "inputs", len(tensors)),
                          _specs(row.get("outputs"), "outputs", len(tensors)),
                          self._arena_size(row.get("memory_plan"))))
        if self.batch is not None:
            _check_batch_specs(self.batch, [(m[1], m[2]) for m in metas])

        # CPU features are checked before any code is mapped (every plan's code).
        chosen = []
        for row in rows:
            variants = row.get("code")
            if not isinstance(variants, list) or not variants:
                raise BundleError("bundle header: code must be a non-empty list")
            chosen.append(variants[cpu.pick_variant(variants, name)])
        self.code_variant = chosen[-1]
        refs: list[tuple[str, Any]] = [(f"constant {i}", ref)
                                       for i, ref in enumerate(self._constant_refs)]
        prepared = []
        for p, (row, variant) in enumerate(zip(rows, chosen)):
            kernels_meta = row.get("kernels")
            sites = row.get("library_calls", [])
            if not isinstance(kernels_meta, list) or not isinstance(sites, list):
                raise BundleError("bundle header: kernels and library_calls must be lists")
            site_list = self._sites(sites, library_functions)
            vm_row = row.get("vm")
            obj = payload_ref(variant.get("object"), "code object", reader.data_size)
            bytecode = payload_ref(vm_row.get("bytecode") if isinstance(vm_row, dict) else None,
                                   "bytecode", reader.data_size)
            what = f" of plan {p}" if self.batch is not None else ""
            refs += [(f"code object{what}", obj), (f"bytecode{what}", bytecode)]
            prepared.append((kernels_meta, site_list, obj, bytecode))
        check_disjoint(refs, name)

        # One arena, as large as the largest plan needs: calls are serialized, so the plans
        # take turns in it. It holds inputs, intermediates and outputs at the plan's offsets.
        arena_bytes = max(m[3] for m in metas)
        try:
            raw = np.zeros(arena_bytes + ARENA_ALIGN, dtype=np.uint8)
        except MemoryError:  # a damaged or hostile plan may declare an absurd arena
            raise BundleError(f"{name}: its memory plan asks for a {arena_bytes}-byte arena, "
                              "which cannot be allocated here") from None
        start = -raw.ctypes.data % ARENA_ALIGN
        self._arena = raw[start:start + arena_bytes]
        self._plans = []
        for (tensors, inputs, outputs, plan_arena), (kernels_meta, site_list, obj, bytecode), \
                variant, row in zip(metas, prepared, chosen, rows):
            image = elf.load_object(reader.payload(obj), elf.default_externals(),
                                    arch=variant.get("arch"))
            self._images.append(image)
            kernels = []
            for i, k in enumerate(kernels_meta):
                if not isinstance(k, dict) or not isinstance(k.get("symbol"), str) \
                        or not all(isinstance(k.get(f, 0), int) and k.get(f, 0) >= 0
                                   for f in ("num_inputs", "num_outputs", "workspace_bytes")):
                    raise BundleError(f"bundle header: kernel {i} is malformed")
                kernels.append((image.address(k["symbol"]), bool(k.get("parallel", False))))
            views, addresses = self._tensor_views(tensors, constants, plan_arena)
            program = vm.decode(reader.payload(bytecode), len(tensors), len(kernels),
                                len(site_list), name)
            self._check_arity(program, kernels_meta, tensors)
            executor = vm.Executor(program, kernels, site_list, addresses, views, threads,
                                   pool=_pool_code(image))
            self._executors.append(executor)
            bindings = self._bindings(row, inputs, outputs, tensors, kernels_meta, executor,
                                      addresses)
            self._plans.append(_Plan(
                batch=row.get("batch") if self.batch is not None else None,
                inputs=inputs, outputs=outputs,
                # Per-call work stays small: the I/O views are fixed at load.
                output_views=[(s.name, views[s.tensor]) for s in outputs],
                feeds=[(s, views[s.tensor], storage_dtype(s.dtype), b)
                       for s, b in zip(inputs, bindings)],
                executor=executor, instructions=len(program), arena_bytes=plan_arena,
                views=views))
        first, last = self._plans[0], self._plans[-1]
        self._image = self._images[-1]
        self._executor = last.executor
        self._views = last.views
        # model.inputs/outputs: the smallest plan's (batch 1 when the bundle has it).
        self.inputs, self.outputs = first.inputs, first.outputs
        self._input_names = frozenset(s.name for s in self.inputs)
        self._feeds, self._output_views = last.feeds, last.output_views
        self.num_instructions = last.instructions

    def _constants(self, rows: Any) -> list[np.ndarray]:
        if not isinstance(rows, list):
            raise BundleError("bundle header: constants must be a list")
        out = []
        self._constant_refs = []
        for i, c in enumerate(rows):
            if not isinstance(c, dict):
                raise BundleError(f"bundle header: constant {i} is malformed")
            shape = check_shape(c.get("shape"), f"constant {i}")
            dtype = check_dtype(c.get("dtype"), f"constant {i}")
            ref = payload_ref(c.get("data"), f"constant {i}", self._reader.data_size)
            self._constant_refs.append(ref)
            out.append(self._reader.array(ref, shape, dtype))
        return out

    @staticmethod
    def _arena_size(plan: Any) -> int:
        size = plan.get("arena_bytes") if isinstance(plan, dict) else None
        if not isinstance(size, int) or not 0 <= size < 1 << 40:
            raise BundleError("bundle header: memory plan has no valid arena size")
        return size

    def _sites(self, sites: list, extra: Mapping[str, Any] | None) -> list[tuple[Any, dict]]:
        for i, s in enumerate(sites):
            if not isinstance(s, dict) or not isinstance(s.get("func"), str) \
                    or not isinstance(s.get("attrs", {}), dict):
                raise BundleError(f"bundle header: library call {i} is malformed")
        fns = library.resolve([s["func"] for s in sites], extra, self._reader.name)
        return [(fns[s["func"]], dict(s.get("attrs", {}))) for s in sites]

    def _tensor_views(self, tensors: list, constants: list[np.ndarray], arena_bytes: int
                      ) -> tuple[list[np.ndarray], list[int]]:
        views, addresses = [], []
        for i, row in enumerate(tensors):
            if not isinstance(row, list) or len(row) != 4:
                raise BundleError(f"bundle header: tensor {i} is malformed")
            kind, ref = row[0], row[1]
            shape, dtype = check_shape(row[2], f"tensor {i}"), check_dtype(row[3], f"tensor {i}")
            size = nbytes_of(shape, dtype)
            if kind == 0 and isinstance(ref, int) and 0 <= ref and ref + size <= arena_bytes:
                view = self._arena[ref:ref + size].view(storage_dtype(dtype)).reshape(shape)
            elif kind == 1 and isinstance(ref, int) and 0 <= ref < len(constants) \
                    and constants[ref].nbytes == size \
                    and constants[ref].dtype == storage_dtype(dtype):
                view = constants[ref].reshape(shape)
            else:
                raise BundleError(f"bundle header: tensor {i} lies outside its storage")
            views.append(view)
            addresses.append(view.ctypes.data)
        return views, addresses

    @staticmethod
    def _bindings(row: dict, inputs: list[TensorSpec], outputs: list[TensorSpec], tensors: list,
                  kernels_meta: list, executor: vm.Executor, addresses: list[int]) -> list:
        """Per input, the kernel argument slots a run may point at the caller's own array
        instead of copying it into the arena (None: always copy). The header lists each input's
        ``views``, the tensor rows over its bytes (its reshapes). A row listed there must have the
        input's offset and size, and every use of them must be a kernel reading its input, so a
        damaged list can make a kernel read the caller's array in place of equally many arena
        bytes, never write to it. An input that is also an output, or read by a library call or
        a copy, is copied as before."""
        out = []
        rows = row.get("inputs")
        num_inputs = [k.get("num_inputs", 0) for k in kernels_meta]
        output_tensors = {s.tensor for s in outputs}
        for spec, raw in zip(inputs, rows):
            ids = raw.get("views")
            base = tensors[spec.tensor]
            if (not isinstance(ids, list) or spec.tensor not in ids
                    or not all(isinstance(t, int) and 0 <= t < len(tensors) for t in ids)
                    or any(tensors[t][0] != 0 or tensors[t][1] != base[1]
                           or nbytes_of(tuple(tensors[t][2]), tensors[t][3])
                           != nbytes_of(spec.shape, spec.dtype) for t in ids)
                    or output_tensors.intersection(ids)):
                out.append(None)
                continue
            out.append(executor.input_binding(frozenset(ids), num_inputs,
                                              addresses[spec.tensor]))
        return out

    @staticmethod
    def _check_arity(program: list[vm.Instruction], kernels_meta: list, tensors: list) -> None:
        for ins in program:
            if ins.opcode != vm.OP_CALL_KERNEL:
                continue
            k = kernels_meta[ins.target]
            expected = k.get("num_inputs", -1) + k.get("num_outputs", -1) \
                + (1 if k.get("workspace_bytes") else 0)
            if len(ins.operands) != expected:
                raise BundleError(f"bundle header: kernel {k.get('name')} takes {expected} "
                                  f"tensors, bytecode passes {len(ins.operands)}")
            if k.get("workspace_bytes"):
                ws = tensors[ins.operands[-1]]
                if nbytes_of(tuple(ws[2]), ws[3]) < k["workspace_bytes"]:
                    raise BundleError(f"bundle header: kernel {k.get('name')} workspace too small")

    # ---- running ------------------------------------------------------------------------------

    def _check_input(self, spec: TensorSpec, value: Any) -> np.ndarray:
        value = _as_array(spec, value)
        if spec.dtype in STORAGE_DTYPES:  # bfloat16: its uint16 bits, or an ml_dtypes array
            store = storage_dtype(spec.dtype)
            if value.dtype.name == spec.dtype and value.dtype.itemsize == store.itemsize:
                value = value.view(store)
            elif value.dtype != store:
                raise InputError(f"input {spec.name!r} has dtype {value.dtype.name}; the model "
                                 f"takes {spec.dtype}, fed as {store.name} bits (or an ml_dtypes "
                                 f"{spec.dtype} array)")
        elif value.dtype.name != spec.dtype:
            raise InputError(f"input {spec.name!r} has dtype {value.dtype.name}; the model takes "
                             f"{spec.dtype}: convert it with .astype(np.{spec.dtype})")
        if value.ndim != len(spec.shape):
            raise InputError(f"input {spec.name!r} has rank {value.ndim} (shape "
                             f"{tuple(value.shape)}); the model takes rank {len(spec.shape)} "
                             f"shape {spec.shape}")
        if tuple(value.shape) != spec.shape:
            raise InputError(f"input {spec.name!r} has shape {tuple(value.shape)}; the model "
                             f"takes {spec.shape}")
        return value

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run once on ``feeds`` (input name -> array); return output name -> new array."""
        if self._symbolic is not None:
            self._check_names(feeds)
            with self._lock:
                return self._symbolic.run(feeds)
        if self._executor is None:
            raise InputError(f"{self.name} is closed")
        self._check_names(feeds)
        if self.batch is not None:
            return self._run_batched(feeds)
        return self._run_static(feeds)

    def _check_names(self, feeds: Mapping[str, Any]) -> None:
        if feeds.keys() != self._input_names:
            unknown = sorted(set(feeds) - self._input_names)
            missing = [s.name for s in self.inputs if s.name not in feeds]
            raise InputError(f"{self.name} takes inputs {sorted(self._input_names)}; "
                             + (f"unknown: {unknown}" if unknown else "")
                             + ("; " if unknown and missing else "")
                             + (f"missing: {missing}" if missing else ""))

    def _run_static(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        values = []
        for spec, _, store, _ in self._feeds:
            value = feeds[spec.name]
            if type(value) is not np.ndarray or value.dtype != store or value.shape != spec.shape:
                value = self._check_input(spec, value)
            values.append(value)
        with self._lock:
            for (_, view, _, binding), value in zip(self._feeds, values):
                # A contiguous, aligned array is read where it lies (kernels only read it and
                # the call holds a reference to it); anything else is copied into the arena.
                if binding is not None:
                    if value.flags.c_contiguous and value.flags.aligned:
                        binding.bind(value.ctypes.data)
                        continue
                    binding.bind(binding.arena)
                np.copyto(view, value)
            self._executor.run()
            return {name: view.copy() for name, view in self._output_views}

    def _run_batched(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Any batch from 1 up: chunks of the largest plan, the rest on the smallest plan that
        holds it, its input rows padded with zeros and its output rows cut off."""
        batch = self.batch
        assert batch is not None
        values, n = {}, None
        for spec in self._plans[0].inputs:
            value = feeds[spec.name]
            if spec.name not in batch.inputs:
                values[spec.name] = self._check_input(self._plans[-1].input_spec(spec.name),
                                                      value)
                continue
            value = self._check_batched_input(spec, value)
            if n is not None and value.shape[0] != n:
                raise InputError(f"input {spec.name!r} has batch {value.shape[0]}, another "
                                 f"input has {n}: the batched inputs must agree")
            n = value.shape[0]
            values[spec.name] = value
        assert n is not None
        parts: dict[str, list[np.ndarray]] = {s.name: [] for s in self.outputs}
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
                    parts[name].append(view[:m].copy())
                done += m
        return {name: (chunks[0] if len(chunks) == 1 else np.concatenate(chunks))
                for name, chunks in parts.items()}

    def _check_batched_input(self, spec: TensorSpec, value: Any) -> np.ndarray:
        value = _as_array(spec, value)
        want = ("N",) + tuple(spec.shape[1:])
        if value.dtype.name != spec.dtype:
            raise InputError(f"input {spec.name!r} has dtype {value.dtype.name}; the model takes "
                             f"{spec.dtype}: convert it with .astype(np.{spec.dtype})")
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

        if self._symbolic is not None:
            raise InputError(f"{self.name} has symbolic shapes: profiling it is not supported "
                             "yet; export it with --input-shape fixed sizes to profile")
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
        rows, _ = _plan_rows(self.header, self.name)
        with self._lock:
            return profile_executor(self.name, self._plans[index].executor, rows[index], runs)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """``model(x)`` / ``model(x=x)``: the output array, or a tuple for several outputs."""
        if len(args) > len(self.inputs):
            raise InputError(f"{self.name} takes {len(self.inputs)} input(s), got {len(args)}")
        feeds = {s.name: a for s, a in zip(self.inputs, args)}
        for k, v in kwargs.items():
            if k in feeds:
                raise InputError(f"input {k!r} given twice")
            feeds[k] = v
        result = self.run(feeds)
        values = tuple(result[s.name] for s in self.outputs)
        return values[0] if len(values) == 1 else values

    def close(self) -> None:
        """Release the code mapping and the file; the model cannot run afterwards."""
        if getattr(self, "_symbolic", None) is not None:
            self._symbolic.close()
            self._symbolic = None
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
        ins = ", ".join(f"{s.name}{list(s.shape)}:{s.dtype}" for s in self.inputs)
        outs = ", ".join(f"{s.name}{list(s.shape)}:{s.dtype}" for s in self.outputs)
        return f"<mlcpack Model {self.name}: ({ins}) -> ({outs})>"


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
