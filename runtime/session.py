"""A model with an arena of its own: the ``Session`` every bundle kind's plan makes.

``Session`` holds what is the same for every kind: the checks of a run's arguments (feed names,
``outputs=``, ``out=`` arrays, input dtypes and shapes, each refused in one line), the lock
that makes calls on one session take turns, ``model(x)``-style calls, closing. Each kind's
subclass (``static_plan.FixedSession``, ``BatchSession``, ``symbolic_plan.SymbolicSession``)
implements ``run``, ``profile``, ``arena_bytes`` and ``_release``. ``ModelPlan`` is the protocol of
the plan objects (``plan.py``) that make them, beside the ``Session`` it returns.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from .bundle import STORAGE_DTYPES, storage_dtype
from .errors import InputError
from .plan import BatchInfo, TensorSpec


class ModelPlan(Protocol):
    """One bundle kind's way to run: what ``Model`` reads and calls, and nothing else."""

    name: str                        # the bundle's file name, for messages
    inputs: list[Any]                # TensorSpec (static kinds) or symbolic.SymSpec
    outputs: list[Any]
    batch: BatchInfo | None          # the batch plans' sizes, when the bundle has them
    specialized_batches: tuple[int, ...]   # a symbolic bundle's static plans (--batch-sizes)
    code_variant: dict               # the code variant chosen for this CPU, as a header map
    num_instructions: int            # VM instructions of one run (the largest plan's)
    # the open sessions made by ``session(main=False)``: ``close`` closes them
    sessions: weakref.WeakSet[Session]

    @property
    def has_parallel_kernels(self) -> bool:
        """Some kernel splits its work into tasks when run on several threads."""

    def session(self, threads: int, main: bool = False) -> Session:
        """A session with an arena and ``threads`` of its own (``main``: the model's own,
        which is not listed in ``sessions``)."""

    def close(self) -> None:
        """Close every session and unmap the code; nothing runs afterwards."""


def shape_text(shape: tuple) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def as_array(spec: TensorSpec, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except Exception:
        raise InputError(f"input {spec.name!r} is not array-like") from None


def as_stored(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
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


def check_input(spec: TensorSpec, value: Any) -> np.ndarray:
    """A fed value as an array of exactly ``spec``'s shape and storage dtype."""
    value = as_stored(spec, as_array(spec, value))
    if value.ndim != len(spec.shape):
        raise InputError(f"input {spec.name!r} has rank {value.ndim} (shape "
                         f"{tuple(value.shape)}); the model takes rank {len(spec.shape)} "
                         f"shape {spec.shape}")
    if tuple(value.shape) != spec.shape:
        raise InputError(f"input {spec.name!r} has shape {tuple(value.shape)}; the model "
                         f"takes {spec.shape}")
    return value


def check_batched_input(spec: TensorSpec, value: Any) -> np.ndarray:
    """A fed value as an array of ``spec``'s shape but for any batch (its first dim) >= 1."""
    value = as_stored(spec, as_array(spec, value))
    want = ("N",) + tuple(spec.shape[1:])
    if value.ndim != len(spec.shape) or tuple(value.shape[1:]) != tuple(spec.shape[1:]):
        raise InputError(f"input {spec.name!r} has shape {tuple(value.shape)}; the model "
                         f"takes {shape_text(want)} for any batch N >= 1")
    if value.shape[0] == 0:
        raise InputError(f"input {spec.name!r} has a batch of 0; the model takes "
                         f"{shape_text(want)} for any batch N >= 1")
    return value


def check_out(name: str, array: Any, spec: Any, shape: tuple[int, ...]) -> None:
    """A caller's output array fits: a writable, C-contiguous ndarray of the shape and
    storage dtype the output has (one line naming what differs)."""
    if not isinstance(array, np.ndarray):
        raise InputError(f"out[{name!r}] is a {type(array).__name__}; give a numpy array "
                         f"np.empty({shape_text(shape)}, np.{storage_dtype(spec.dtype).name})")
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


def bind_outputs(views: Mapping[str, np.ndarray], names: Iterable[str],
                 out: Mapping[str, np.ndarray],
                 written: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A run's result: each output in ``names``, in order, as the array its kernels wrote it
    in (``written``), copied into the caller's ``out`` array (checked), or copied out of the
    arena view ``views[name]`` into a new array."""
    result = {}
    if not written and not out:   # the common case: one test, then copies
        for name in names:
            result[name] = views[name].copy()
        return result
    for name in names:
        if written and name in written:
            result[name] = written[name]
        elif name in out:
            np.copyto(out[name], views[name])
            result[name] = out[name]
        else:
            result[name] = views[name].copy()
    return result


class Session:
    """A model with an arena of its own: ``model.session()``. Sessions of one model run at
    the same time from different threads; each shares the model's mapped code and weights and
    holds only its working memory (the arena) and, with ``threads`` > 1, its worker threads.
    Calls on one session take turns. ``run``, ``profile`` and ``__call__`` behave as the
    model's (``Model.run`` is its own session's ``run``)."""

    def __init__(self, plan: ModelPlan) -> None:
        self._plan = plan
        self._name = plan.name
        self._input_names = frozenset(s.name for s in plan.inputs)
        self._output_names = [s.name for s in plan.outputs]   # in order; never mutated
        self._open = True
        self._lock = threading.Lock()
        # which plan the last run took: "batch N" (a static plan of a symbolic bundle) or
        # "symbolic"; None for bundles with static shapes only (nothing to choose)
        self.last_plan: str | None = None

    @property
    def inputs(self) -> list[Any]:
        return self._plan.inputs

    @property
    def outputs(self) -> list[Any]:
        return self._plan.outputs

    @property
    def arena_bytes(self) -> int:
        """The working memory this session holds (the weights are the model's, shared)."""
        raise NotImplementedError

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """See ``Model.run``."""
        raise NotImplementedError

    def profile(self, feeds: Mapping[str, Any], runs: int = 20, warmup: int = 1) -> Any:
        """See ``Model.profile``."""
        if not self._open:
            raise self._closed()
        if runs < 1 or warmup < 0:
            raise InputError(f"profile needs runs >= 1 and warmup >= 0, got {runs} and {warmup}")
        return self._profile(feeds, runs, warmup)

    def _profile(self, feeds: Mapping[str, Any], runs: int, warmup: int) -> Any:
        """``profile`` once its arguments are checked."""
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """``session(x)`` / ``session(x=x)``: the output array, or a tuple for several."""
        inputs = self._plan.inputs
        if len(args) > len(inputs):
            raise InputError(f"{self._name} takes {len(inputs)} input(s), got {len(args)}")
        feeds = {s.name: a for s, a in zip(inputs, args)}
        for k, v in kwargs.items():
            if k in feeds:
                raise InputError(f"input {k!r} given twice")
            feeds[k] = v
        result = self.run(feeds)
        values = tuple(result[s.name] for s in self._plan.outputs)
        return values[0] if len(values) == 1 else values

    def close(self) -> None:
        """Stop this session's worker threads and drop its arena (the model stays open)."""
        if self._open:
            self._open = False
            self._release()
        self._plan.sessions.discard(self)

    def _release(self) -> None:
        """Free what this session holds (its executors, arenas)."""
        raise NotImplementedError

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- checks shared by every kind --------------------------------------------------------

    def _closed(self) -> InputError:
        return InputError(f"{self._name}: this session is closed")

    def _check_feed_names(self, feeds: Mapping[str, Any]) -> None:
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of input name -> array, not "
                             f"{type(feeds).__name__}")
        if feeds.keys() != self._input_names:
            unknown = sorted(set(feeds) - self._input_names)
            missing = [s.name for s in self._plan.inputs if s.name not in feeds]
            raise InputError(f"{self._name} takes inputs {sorted(self._input_names)}; "
                             + (f"unknown: {unknown}" if unknown else "")
                             + ("; " if unknown and missing else "")
                             + (f"missing: {missing}" if missing else ""))

    def _selected_outputs(self, outputs: Sequence[str] | None,
                          out: Mapping[str, np.ndarray] | None) -> list[str]:
        """The output names a run returns, in order; every name known and ``out`` a subset."""
        names = self._output_names
        if outputs is None:
            chosen = names
        else:
            if isinstance(outputs, str):
                raise InputError(f"outputs= takes a list of names, e.g. [{outputs!r}]")
            chosen = list(outputs)
            unknown = [n for n in chosen if n not in names]
            if unknown or not chosen or len(set(chosen)) != len(chosen):
                raise InputError(f"outputs={chosen!r}: {self._name} has outputs {names}; name "
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
