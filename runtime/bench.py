"""Timing a bundle with the runtime alone (``mlcpack bench model.mlc``): load time, first
inference, then steady-state latency over repeated runs on random inputs."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .errors import InputError
from .symbolic import example_shape

from .model import load


@dataclass(frozen=True)
class Timing:
    load_ms: float
    first_ms: float
    median_us: float
    min_us: float
    runs: int
    p90_us: float = 0.0
    p99_us: float = 0.0


def time_runs(fn: Callable[[], object], runs: int | None = None, budget_s: float = 1.0,
              min_runs: int = 5) -> tuple[float, float, int]:
    """Call ``fn`` repeatedly (``runs`` times, or until ``budget_s`` has passed and at least
    ``min_runs`` ran); return (median µs, min µs, number of runs)."""
    times = sample_runs(fn, runs, budget_s, min_runs)
    return float(np.median(times)) * 1e6, float(np.min(times)) * 1e6, len(times)


def sample_runs(fn: Callable[[], object], runs: int | None = None, budget_s: float = 1.0,
                min_runs: int = 5) -> list[float]:
    """The seconds each call of ``fn`` took (as ``time_runs`` decides how many calls)."""
    times = []
    deadline = time.perf_counter() + budget_s
    while True:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        n = len(times)
        if runs is not None:
            if n >= runs:
                break
        elif n >= min_runs and time.perf_counter() > deadline:
            break
    return times


def random_feeds(model, shapes: dict[str, tuple[int, ...]] | None = None
                 ) -> dict[str, np.ndarray]:
    """Seeded random inputs; ``shapes`` gives an input's shape (a symbolic bundle's sizes),
    else every size variable is 1."""
    shapes = shapes or {}
    unknown = sorted(set(shapes) - {s.name for s in model.inputs})
    if unknown:
        raise InputError(f"--shape names no input of the model: {', '.join(unknown)} (inputs: "
                         f"{', '.join(s.name for s in model.inputs)})")
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in model.inputs:
        shape = shapes.get(spec.name) or example_shape(spec.shape)
        if spec.dtype.startswith("float"):
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return feeds


def first_run(model, feeds: dict[str, np.ndarray], shapes_given: bool) -> None:
    """``model.run(feeds)``; a symbolic bundle whose relations the default sizes (every size
    variable 1) break says how to give sizes."""
    try:
        model.run(feeds)
    except InputError as exc:
        # (the schema, not a private attribute: Model's plan objects replaced ``_symbolic``,
        # and the hint had silently gone)
        if shapes_given or getattr(getattr(model, "schema", None), "symbolic", None) is None:
            raise
        from .sizes import smallest_shapes

        smallest = smallest_shapes(model) or {}
        example = " ".join(f"--shape {name}={','.join(map(str, shape))}"
                           for name, shape in smallest.items())
        hint = f", e.g. {example} (the smallest sizes it takes)" if example else ""
        raise InputError(f"{exc}; give the input sizes with --shape NAME=DIMS{hint}") from None


def bench(model_path: str | os.PathLike, runs: int | None = None, threads: int = 1,
          budget_s: float = 1.0, shapes: dict[str, tuple[int, ...]] | None = None) -> Timing:
    """Load ``model_path`` with ``threads`` threads and time it on random inputs (of
    ``shapes``, for a bundle with symbolic sizes)."""
    t0 = time.perf_counter()
    model = load(model_path, threads=threads)
    load_ms = (time.perf_counter() - t0) * 1e3
    try:
        feeds = random_feeds(model, shapes)
        t0 = time.perf_counter()
        first_run(model, feeds, bool(shapes))
        first_ms = (time.perf_counter() - t0) * 1e3
        times = np.array(sample_runs(lambda: model.run(feeds), runs, budget_s)) * 1e6
    finally:
        model.close()
    p50, p90, p99 = (float(v) for v in np.percentile(times, [50, 90, 99]))
    return Timing(load_ms, first_ms, p50, float(times.min()), len(times), p90, p99)
