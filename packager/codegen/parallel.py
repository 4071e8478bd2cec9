"""Compiling one set of kernels for several targets (a fat bundle) in parallel processes.

LLVM's optimizer and code generator dominate an export and run one target at a time in one
process, so the default portable bundle (x86-64-v2 up to the host's level) would take about
twice as long as a single-level one. Each extra target compiles in a forked worker, which
inherits the kernels without pickling them and sends back only the object code; the first
target compiles in this process meanwhile.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

from ..ir.graph import PrimFunc
from .build import CompiledCode, compile_prim_funcs
from .target import Target

# What a forked worker compiles: set just before the pool forks, read by _compile_one.
_JOB: tuple[Sequence[PrimFunc], Sequence[Target], tuple[str, ...]] | None = None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _compile_one(index: int) -> CompiledCode:
    assert _JOB is not None
    funcs, targets, size_vars = _JOB
    return compile_prim_funcs(funcs, targets[index], size_vars)


def compile_for_targets(funcs: Sequence[PrimFunc], targets: Sequence[Target],
                        size_vars: tuple[str, ...] = ()) -> list[CompiledCode]:
    """One ``CompiledCode`` per target, in order. Several targets compile in parallel on a
    machine with more than one usable CPU where ``fork`` exists (``MLCPACK_PARALLEL_COMPILE=0``
    turns it off); otherwise one after another."""
    global _JOB
    workers = min(len(targets) - 1, _usable_cpus() - 1)
    parallel = workers > 0 and os.environ.get("MLCPACK_PARALLEL_COMPILE", "1") != "0" \
        and "fork" in multiprocessing.get_all_start_methods()
    if not parallel:
        return [compile_prim_funcs(funcs, t, size_vars) for t in targets]
    _JOB = (funcs, targets, size_vars)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_compile_one, i) for i in range(1, len(targets))]
            first = compile_prim_funcs(funcs, targets[0], size_vars)
            return [first, *(f.result() for f in futures)]
    finally:
        _JOB = None
