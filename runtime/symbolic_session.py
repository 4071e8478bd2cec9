"""Running a symbolic bundle: ``SymbolicSession``, the symbolic counterpart of ``model.Session``.

A model with symbolic shapes runs through one of these (``Model.run`` through the model's
own), and ``model.session()`` gives another: a runner forked from the model's
(``SymbolicRunner.fork``: the mapped code, constants and decoded program shared; plans, arenas
and worker threads its own) and, for a bundle with ``--batch-sizes``, its own instances of the
static plans. Several sessions run at the same time from different threads; calls on one
session take turns. ``out=`` arrays are checked against the shapes of this run's outputs.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .errors import InputError


class SymbolicSession:
    """A symbolic bundle with memory of its own (``model.session()``): ``run`` and
    ``__call__`` behave as the model's."""

    def __init__(self, model: Any, runner: Any, specialized: dict,
                 min_bytes: Callable[[], int], main: bool = False) -> None:
        self._model = model
        self._min_bytes = min_bytes   # model.INPLACE_MIN_BYTES, read at each run
        self._runner = runner
        self._specialized = specialized   # input shapes -> a static plan (--batch-sizes)
        self._main = main                 # the model's own: model.last_plan follows it
        self._lock = threading.Lock()
        self.last_plan: str | None = None  # "batch N" (a static plan) or "symbolic"

    @property
    def inputs(self) -> list:
        return self._model.inputs

    @property
    def outputs(self) -> list:
        return self._model.outputs

    @property
    def arena_bytes(self) -> int:
        """The working memory this session holds now: its static plans' arena and the arenas
        of the shapes it has run (the weights are the model's, shared)."""
        static = max((int(p.arena.nbytes) for p in self._specialized.values()), default=0)
        return static + (self._runner.held_bytes if self._runner is not None else 0)

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """See ``Model.run``; ``out`` arrays must have the shapes the outputs have for these
        inputs."""
        model = self._model
        if self._runner is None or model._symbolic is None:
            raise InputError(f"{model.name}: this session is closed")
        if type(feeds) is not dict or feeds.keys() != model._input_names:
            model._check_feed_names(feeds)
        names = None if outputs is None and not out else model._selected_outputs(outputs, out)
        plan = model._specialized_plan(feeds, self._specialized) if self._specialized else None
        min_bytes = self._min_bytes()
        with self._lock:
            if plan is not None:   # as Session.run: large inputs are read where they lie
                for (spec, view, _, binding) in plan.feeds:
                    if binding is None:
                        np.copyto(view, feeds[spec.name])
                    else:
                        binding.feed(view, feeds[spec.name], min_bytes)
                plan.executor.run()
                views = plan.output_views
                self.last_plan = f"batch {plan.batch}"
            else:
                views = self._runner.run_views(feeds, min_bytes)
                self.last_plan = "symbolic"
            if self._main:
                model.last_plan = self.last_plan
            return self._results(dict(views), names, out or {})

    def _results(self, views: dict[str, np.ndarray], names: list[str] | None,
                 out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs named (all, in order, when None) copied out of the arena: into the
        caller's ``out`` arrays, every one checked before any is written, or new arrays."""
        model = self._model
        specs = {s.name: s for s in model.outputs}
        for name, array in out.items():
            model._check_out(name, array, specs[name], tuple(views[name].shape))
        result = {}
        for name in names if names is not None else views:
            if name in out:
                np.copyto(out[name], views[name])
                result[name] = out[name]
            else:
                result[name] = views[name].copy()
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """``session(x)``: as ``model(x)``."""
        return self._model._call(self.run, args, kwargs)

    def close(self) -> None:
        """Stop this session's worker threads and drop its arenas (the model stays open)."""
        if self._runner is not None and not self._main:
            self._runner.close()
            for plan in self._specialized.values():
                plan.executor.close()
        self._runner = None
        self._model._sessions.discard(self)

    def __enter__(self) -> SymbolicSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
