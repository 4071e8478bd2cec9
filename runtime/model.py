"""Loading a bundle into a runnable model: ``load(path)`` returns a ``Model``.

Order of the checks at load, so nothing runs that should not: read and hash the file, validate the
header, choose a code variant this CPU supports (refusing before any code is mapped), resolve
library functions, map the object code, decode the bytecode.

A ``Model`` delegates to one plan object chosen here by the bundle's kind (``runtime/plan.py``:
``FixedPlan``, ``BatchPlans``, ``SymbolicPlan``); ``model.run`` is the run of the model's own
session, ``model.session()`` another session of the same plan.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import library, vm
from .bundle import BundleReader
from .errors import InputError, UsageError
from .header import Header
from .plan import BatchInfo, Inplace, TensorSpec
from .session import ModelPlan, Session
from .static_plan import ARENA_ALIGN, BatchPlans, FixedPlan, StaticCode
from .static_plan import aligned_empty as _aligned_empty
from .symbolic_plan import SymbolicPlan

__all__ = ["ARENA_ALIGN", "BatchInfo", "Model", "Session", "TensorSpec", "checked_threads",
           "load", "model_inputs_summary", "_aligned_empty"]

# An output of at least this many bytes is written by its kernels straight into the array a run
# returns (``static_plan.output_bindings``); a smaller one is copied out of the arena, which
# costs less than asking numpy for a new array's address. Read when a session is made (tests
# lower or raise it here).
OUTPUT_INPLACE_MIN_BYTES = 65536
# vm.INPLACE_MIN_BYTES, read at each run (tests lower or raise it here)
INPLACE_MIN_BYTES = vm.INPLACE_MIN_BYTES


def _inplace_min_bytes() -> int:
    """INPLACE_MIN_BYTES as it is now (tests lower or raise it)."""
    return INPLACE_MIN_BYTES


def _output_inplace_min_bytes() -> int:
    """OUTPUT_INPLACE_MIN_BYTES as it is now (tests lower or raise it)."""
    return OUTPUT_INPLACE_MIN_BYTES


INPLACE = Inplace(_inplace_min_bytes, _output_inplace_min_bytes)


def _constant_array(reader: BundleReader, row: Any) -> np.ndarray:
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
        self._plan: ModelPlan | None = None
        self._main: Session | None = None   # the model's own session (run, profile)
        self._threads = threads
        self.signed_by: str | None = None
        try:
            if trusted_keys is not None:  # before anything in the bundle is used
                from .signing import check_signature
                self.signed_by = check_signature(self._reader, trusted_keys)
            self._load(library_functions, threads)
        except BaseException:
            self.close()
            raise

    def _load(self, library_functions: Mapping[str, Any] | None, threads: int) -> None:
        reader = self._reader
        self.header = reader.header
        self.name = reader.name
        # Every record checked once, here, before anything is mapped (runtime/header.py).
        schema = Header.from_msgpack(reader.header, reader.data_size, reader.name)
        self.schema = schema
        self.labels = list(schema.labels) if schema.labels is not None else None
        self.preprocess = schema.preprocess
        constants = [_constant_array(reader, c) for c in schema.constants]
        plan: ModelPlan
        if schema.symbolic is not None:   # symbolic shapes: plans made per input size at run
            plan = SymbolicPlan(reader, schema, constants, library_functions, threads, INPLACE)
        else:
            # A dynamic-batch bundle (format 1.1) holds one plan per batch size; an older bundle
            # is one plan, the header itself. CPU features are checked before any code is mapped.
            code = StaticCode(reader, schema.plans, constants, library_functions, INPLACE)
            if schema.batch is None:
                plan = FixedPlan(code)
            else:
                plan = BatchPlans(code, BatchInfo(schema.batch.sizes,
                                                  frozenset(schema.batch.inputs),
                                                  frozenset(schema.batch.outputs)))
        self._plan = plan
        self.inputs, self.outputs = plan.inputs, plan.outputs
        self.batch = plan.batch
        self.specialized_batches = plan.specialized_batches
        self.code_variant = plan.code_variant
        self.num_instructions = plan.num_instructions
        self._sessions = plan.sessions
        # model.run and model.profile take turns in one arena: the model's own session's
        self._main = plan.session(threads, main=True)

    @property
    def has_parallel_kernels(self) -> bool:
        """Some kernel splits its work into tasks when the model runs on several threads."""
        return self._plan is not None and self._plan.has_parallel_kernels

    @property
    def last_plan(self) -> str | None:
        """Which plan the model's last run took, for a symbolic bundle: "batch N" (a static
        plan, ``--batch-sizes``) or "symbolic"; None before any run and for other bundles."""
        return self._main.last_plan if self._main is not None else None

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run once on ``feeds`` (input name -> array); return output name -> array.

        ``outputs`` names the outputs to return (default: all, in the bundle's order); ``out``
        maps output names to arrays to write them into (C-contiguous, writable, the output's
        shape and dtype), which are returned as they are; other outputs are new arrays.
        Safe from several threads: calls on one model take turns in its arena; for calls that
        run at the same time, give each thread its own ``model.session()``."""
        return self._main.run(feeds, outputs, out)

    def profile(self, feeds: Mapping[str, Any], runs: int = 20, warmup: int = 1) -> Any:
        """Run on ``feeds`` ``warmup`` times (at least once: it checks and places the inputs),
        then ``runs`` times timing every VM instruction; return a ``runtime.profile.Profile``.
        ``run`` itself is never timed. A dynamic-batch bundle profiles the plan that a batch of
        the feeds' size runs on (at most the largest plan's batch); a symbolic bundle the plan
        of the feeds' sizes."""
        return self._main.profile(feeds, runs, warmup)

    def session(self, threads: int | None = None) -> Session:
        """A ``Session``: this model with an arena (and thread pool) of its own, so several
        sessions run at the same time from different threads. They share the mapped code and
        the weights (never copied); each holds only its arena, the model's working memory.
        Every bundle kind has them (``FixedSession``, ``BatchSession``, ``SymbolicSession``:
        the symbolic one makes its own plans per shape)."""
        threads = self._threads if threads is None else checked_threads(threads)
        if self._plan is None:
            raise InputError(f"{self.name} is closed")
        return self._plan.session(threads)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """``model(x)`` / ``model(x=x)``: the output array, or a tuple for several outputs."""
        return self._main(*args, **kwargs)

    def close(self) -> None:
        """Release the code mapping and the file; the model and its sessions cannot run
        afterwards."""
        if self._main is not None:
            self._main.close()   # kept: its runs now say the session is closed
        if self._plan is not None:
            self._plan.close()
            self._plan = None
        self._reader.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}{list(s.dims)}:{s.dtype}" for s in self.inputs)
        outs = ", ".join(f"{s.name}{list(s.dims)}:{s.dtype}" for s in self.outputs)
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
