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
from .errors import BundleError, InputError

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
        tensors = h.get("tensors")
        if not isinstance(tensors, list):
            raise BundleError("bundle header: tensors must be a list")
        self.inputs = _specs(h.get("inputs"), "inputs", len(tensors))
        self.outputs = _specs(h.get("outputs"), "outputs", len(tensors))
        self.labels = h.get("labels") if isinstance(h.get("labels"), list) else None
        self.preprocess = h.get("preprocess") if isinstance(h.get("preprocess"), dict) else None
        constants = self._constants(h.get("constants"))
        arena_bytes = self._arena_size(h.get("memory_plan"))

        # CPU features are checked before any code is mapped.
        variants = h.get("code")
        if not isinstance(variants, list) or not variants:
            raise BundleError("bundle header: code must be a non-empty list")
        chosen = cpu.pick_variant(variants, name)
        self.code_variant = variants[chosen]
        kernels_meta = h.get("kernels")
        sites = h.get("library_calls", [])
        if not isinstance(kernels_meta, list) or not isinstance(sites, list):
            raise BundleError("bundle header: kernels and library_calls must be lists")
        site_list = self._sites(sites, library_functions)

        obj = payload_ref(self.code_variant.get("object"), "code object", reader.data_size)
        bytecode = payload_ref(h.get("vm", {}).get("bytecode") if isinstance(h.get("vm"), dict)
                               else None, "bytecode", reader.data_size)
        check_disjoint([("code object", obj), ("bytecode", bytecode)]
                       + [(f"constant {i}", ref) for i, ref in enumerate(self._constant_refs)],
                       name)
        self._image = elf.load_object(reader.payload(obj), elf.default_externals(),
                                      arch=self.code_variant.get("arch"))
        kernels = []
        for i, k in enumerate(kernels_meta):
            if not isinstance(k, dict) or not isinstance(k.get("symbol"), str) \
                    or not all(isinstance(k.get(f, 0), int) and k.get(f, 0) >= 0
                               for f in ("num_inputs", "num_outputs", "workspace_bytes")):
                raise BundleError(f"bundle header: kernel {i} is malformed")
            kernels.append((self._image.address(k["symbol"]), bool(k.get("parallel", False))))

        # The arena holds inputs, intermediates and outputs at the offsets the plan fixed.
        try:
            raw = np.zeros(arena_bytes + ARENA_ALIGN, dtype=np.uint8)
        except MemoryError:  # a damaged or hostile plan may declare an absurd arena
            raise BundleError(f"{name}: its memory plan asks for a {arena_bytes}-byte arena, "
                              "which cannot be allocated here") from None
        start = -raw.ctypes.data % ARENA_ALIGN
        self._arena = raw[start:start + arena_bytes]
        views, addresses = self._tensor_views(tensors, constants, arena_bytes)
        self._views = views
        # Per-call work stays small: the name set and the I/O views are fixed at load.
        self._input_names = frozenset(s.name for s in self.inputs)
        self._input_views = [(s, views[s.tensor]) for s in self.inputs]
        self._output_views = [(s.name, views[s.tensor]) for s in self.outputs]
        program = vm.decode(reader.payload(bytecode), len(tensors), len(kernels), len(site_list),
                            name)
        self._check_arity(program, kernels_meta, tensors)
        self._executor = vm.Executor(program, kernels, site_list, addresses, views, threads)
        self.num_instructions = len(program)

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
        if not isinstance(value, np.ndarray):
            try:
                value = np.asarray(value)
            except Exception:
                raise InputError(f"input {spec.name!r} is not array-like") from None
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
        if self._executor is None:
            raise InputError(f"{self.name} is closed")
        if feeds.keys() != self._input_names:
            unknown = sorted(set(feeds) - self._input_names)
            missing = [s.name for s in self.inputs if s.name not in feeds]
            raise InputError(f"{self.name} takes inputs {sorted(self._input_names)}; "
                             + (f"unknown: {unknown}" if unknown else "")
                             + ("; " if unknown and missing else "")
                             + (f"missing: {missing}" if missing else ""))
        checked = [(view, self._check_input(s, feeds[s.name]))
                   for s, view in self._input_views]
        with self._lock:
            for view, value in checked:
                np.copyto(view, value)
            self._executor.run()
            return {name: view.copy() for name, view in self._output_views}

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
        if getattr(self, "_executor", None) is not None:
            self._executor.close()
            self._executor = None
        if getattr(self, "_image", None) is not None:
            self._image.close()
            self._image = None
        self._views, self._input_views, self._output_views = [], [], []
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
