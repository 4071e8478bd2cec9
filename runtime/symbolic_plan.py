"""Running a symbolic bundle (format 1.3): ``SymbolicPlan`` and its ``SymbolicSession``.

The plan holds what every session shares: a ``symbolic.SymbolicRunner`` with the mapped code,
constants and decoded program (planned per input size at run time, or once for the bound of a
``--max-shape`` bundle), and, for a bundle with ``--batch-sizes``, the static plans' code
(``static_plan.StaticCode``), run when the inputs' shapes match one exactly. Each session,
the model's own included, gets a fork of the runner (plans, arenas and worker threads its own)
and its own instances of the static plans. ``out=`` arrays are checked against the shapes of
this run's outputs.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from .bundle import BundleReader, storage_dtype
from .header import Header
from .plan import BatchInfo, Inplace
from .session import Session, bind_outputs, check_out
from .static_plan import ArenaPlan, StaticCode, profile_plan
from .symbolic import SymbolicRunner


class SymbolicPlan:
    """A bundle with symbolic shapes, bounded or not, with or without static batch plans."""

    def __init__(self, reader: BundleReader, schema: Header, constants: list[np.ndarray],
                 library_functions: Mapping[str, Any] | None, threads: int,
                 inplace: Inplace) -> None:
        self.name = reader.name
        self.inplace = inplace
        self.sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self.runner = SymbolicRunner(reader, schema.plan, constants, library_functions, threads)
        self.static: StaticCode | None = None
        if schema.specialized:   # --batch-sizes: static plans for exact shapes
            try:
                self.static = StaticCode(reader, schema.specialized, constants,
                                         library_functions, inplace)
            except BaseException:
                self.runner.image.close()
                raise
        self.code_variant = self.runner.code_variant
        self.num_instructions = len(self.runner.program)
        self.inputs: list[Any] = self.runner.inputs
        self.outputs: list[Any] = self.runner.outputs
        self.input_dtypes = [storage_dtype(s.dtype) for s in self.inputs]
        self.batch: BatchInfo | None = None
        self.specialized_batches: tuple[int, ...] = ()
        if self.static is not None:
            self._show_batches(schema)

    def _show_batches(self, schema: Header) -> None:
        """Shown and fed as a dynamic-batch bundle's (`infer` sizes images and batches by it):
        the inputs and outputs whose first dim is a size variable take any batch N; their other
        dims, and the other inputs, are the static plans' (the same in every plan)."""
        assert self.static is not None
        self.specialized_batches = sizes = tuple(r.batch for r in schema.specialized)
        batched = [frozenset(s.name for s in specs if s.shape and isinstance(s.shape[0], str))
                   for specs in (self.inputs, self.outputs)]
        if batched[0]:
            self.batch = BatchInfo(sizes, batched[0], batched[1])
            first = self.static.recipes[0]
            self.inputs = [dataclasses.replace(t, batch_sizes=sizes if t.name in batched[0]
                                               else None) for t in first.inputs]
            self.outputs = [dataclasses.replace(t, batch_sizes=sizes if t.name in batched[1]
                                                else None) for t in first.outputs]

    @property
    def has_parallel_kernels(self) -> bool:
        kernels = self.runner.kernels + (self.static.kernels if self.static is not None else [])
        return any(parallel for _, parallel in kernels)

    def session(self, threads: int, main: bool = False) -> SymbolicSession:
        static = self.static.instantiate(threads) if self.static is not None else []
        session = SymbolicSession(self, self.runner.fork(threads), static)
        if not main:
            self.sessions.add(session)
        return session

    def close(self) -> None:
        for session in list(self.sessions):
            session.close()
        self.runner.close()
        self.runner.image.close()
        if self.static is not None:
            self.static.close()


class SymbolicSession(Session):
    """A symbolic bundle with memory of its own: ``run`` and ``__call__`` behave as the
    model's. ``runner`` is its fork of the plan's runner."""

    def __init__(self, plan: SymbolicPlan, runner: SymbolicRunner,
                 static: list[ArenaPlan]) -> None:
        super().__init__(plan)
        self.runner = runner
        self._static = static
        # input shapes -> a static plan (--batch-sizes)
        self._specialized = {tuple(s.shape for s in p.inputs): p for p in static}
        self._dtypes = plan.input_dtypes
        self._min_bytes = plan.inplace.input_min_bytes
        self._output_specs = {s.name: s for s in plan.outputs}

    @property
    def arena_bytes(self) -> int:
        """The working memory this session holds now: its static plans' arena and the arenas
        of the shapes it has run (the weights are the model's, shared)."""
        static = max((int(p.arena.nbytes) for p in self._static), default=0)
        return static + self.runner.held_bytes

    def _specialized_plan(self, feeds: Mapping[str, Any]) -> ArenaPlan | None:
        """The static plan whose inputs have exactly the fed arrays' shapes (and dtypes)."""
        key = []
        for spec, dtype in zip(self._plan.inputs, self._dtypes):
            value = feeds[spec.name]
            if type(value) is not np.ndarray or value.dtype != dtype:
                return None
            key.append(value.shape)
        return self._specialized.get(tuple(key))

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """See ``Model.run``; ``out`` arrays must have the shapes the outputs have for these
        inputs."""
        if not self._open:
            raise self._closed()
        if type(feeds) is not dict or feeds.keys() != self._input_names:
            self._check_feed_names(feeds)
        names = None if outputs is None and not out else self._selected_outputs(outputs, out)
        out = out or {}
        plan = self._specialized_plan(feeds) if self._specialized else None
        if plan is not None:   # as a fixed-shape bundle: in place in, in place out
            specs = plan.output_specs
            for name, array in out.items():
                check_out(name, array, specs[name], specs[name].shape)
            values = [feeds[s.name] for s in plan.inputs]
            with self._lock:
                self.last_plan = f"batch {plan.batch}"
                return plan.run(values, plan.all_outputs if names is None else names, out,
                                self._min_bytes)
        min_bytes = self._min_bytes()
        with self._lock:
            views = dict(self.runner.run_views(feeds, min_bytes))
            self.last_plan = "symbolic"
            # the outputs named (all, in order, when None) copied out of the arena: into the
            # caller's out= arrays, every one checked (against this run's shapes) before any is
            # written, or new arrays
            specs = self._output_specs
            for name, array in out.items():
                check_out(name, array, specs[name], tuple(views[name].shape))
            return bind_outputs(views, views if names is None else names, out)

    def _profile(self, feeds: Mapping[str, Any], runs: int, warmup: int) -> Any:
        """The plan of the feeds' sizes: a static plan on an exact match, else the symbolic
        one (its profile's title names the sizes)."""
        plan = self._specialized_plan(feeds) if self._specialized else None
        if plan is None:
            with self._lock:
                return self.runner.profile(feeds, runs, warmup)
        for _ in range(max(1, warmup)):
            self.run(feeds)
        with self._lock:
            return profile_plan(self._name, plan, runs)

    def _release(self) -> None:
        self.runner.close()
        for plan in self._static:
            plan.executor.close()
