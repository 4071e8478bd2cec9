"""Compiling kernels in worker processes, in parallel where there are CPUs for it, and never in
the exporting process.

LLVM's optimizer and code generator dominate a cold export, one module at a time per process.
So a module's distinct kernels are optimized in groups (``kernel_groups``: ``GROUPS`` per
target, balanced by estimated cost), every target's groups side by side, and each target's
groups are then linked and compiled to its object (``build.optimize_group``,
``build.link_groups``); a target whose module has one kernel group compiles whole. A cache hit
(``build.object_key``, taken before any IR exists) needs no worker at all. And llvmlite's
LLVM is built with assertions: a loop shape that trips one (seen: the loop vectorizer's "VPlan
cost model and legacy cost model disagreed" for x86-64-v4) aborts the process that runs it. So
every compile runs in forked workers (which inherit the kernels without pickling them and send
back only bitcode or a ``CompiledCode``), also when there is one target, and a worker that
dies is one compile's failure, not the export's: a target whose group worker died compiles its
module whole in a worker, and when that dies too:

1. find the kernels LLVM aborts on: a worker per CPU compiles a run of the module's kernels,
   each alone, one after another, reporting each; a death names the kernel it was compiling,
   and a fresh worker goes on after it (a fork per culprit, none per kernel);
2. compile the whole module again, the culprits with the first of
   ``build.CONSERVATIVE_PIPELINES`` (the loop vectorizer off): the object then carries them
   (``build.Fallback``), and the export warns about each;
3. if that dies too, compile each culprit alone with each conservative pipeline in turn (then
   -O2 without vectorizers), and the whole module with the first that survives for each; a
   culprit that none compiles is a ``KernelCompileError`` naming it.

A worker writes its stderr (LLVM's assertion text) to a file this process reads, and never
dumps core. Where ``fork`` does not exist, or in a daemonic process (which may not start
processes), everything compiles in this process.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import os
import re
import resource
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from ..ir.graph import PrimFunc
from ..ir.structure import structural_key
from ..options import CompileOptions
from .build import (CONSERVATIVE_PIPELINES, DEFAULT_PIPELINE, CodegenError, CompiledCode,
                    Fallback, KernelCompileError, Pipeline, cached_code, compile_in_process,
                    link_groups, object_keys, optimize_group, target_pipelines)
from .target import Target


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class _Outcome:
    """How a worker ended: ``value`` (its result), ``error`` (an exception it raised, raised
    again here) or ``died`` (what LLVM said, or the signal); ``progress``: what it reported."""
    value: Any = None
    error: BaseException | None = None
    died: str | None = None
    progress: int = 0


class _Worker:
    """A forked process running ``fn(report, *args)``; ``report(n)`` tells this process how
    far it got before it returns (or dies)."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child_end = ctx.Pipe(duplex=False)
        self.stderr = tempfile.TemporaryFile()
        self.process = ctx.Process(target=_worker_main,
                                   args=(child_end, self.stderr.fileno(), fn, args), daemon=True)
        self.process.start()
        child_end.close()
        self.outcome = _Outcome()
        self.finished = False

    def receive(self) -> None:
        """Take one message (the connection is ready); at the end, ``finished``."""
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            self._end(died=True)
            return
        except Exception as exc:  # noqa: BLE001  (a result that does not unpickle: a bug)
            kind, payload = "error", RuntimeError(f"a compile worker's result is unreadable "
                                                  f"({type(exc).__name__}: {exc})")
        if kind == "progress":
            self.outcome.progress = payload
            return
        if kind == "ok":
            self.outcome.value = payload
        else:
            self.outcome.error = payload
        self._end(died=False)

    def _end(self, died: bool) -> None:
        self.process.join()
        self.conn.close()
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        self.stderr.close()
        if died:
            self.outcome.died = death_reason(text, self.process.exitcode)
        elif text:   # a warning the worker printed: pass it on
            sys.stderr.write(text)
        self.finished = True

    def kill(self) -> None:
        if not self.finished:
            self.process.kill()
            self.process.join()
            self.conn.close()
            self.stderr.close()
            self.finished = True


def _worker_main(conn, stderr_fd: int, fn: Callable[..., Any], args: tuple) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # an abort leaves no core file
    faulthandler.disable()   # (pytest's) would print this process's Python stack on the abort
    os.dup2(stderr_fd, 2)
    try:
        conn.send(("ok", fn(lambda n: conn.send(("progress", n)), *args)))
    except BaseException as exc:  # noqa: BLE001  (every failure goes back to the parent)
        try:
            conn.send(("error", exc))
        except Exception:  # noqa: BLE001  (an exception that does not pickle)
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


def death_reason(stderr: str, exitcode: int | None) -> str:
    """What LLVM said before the worker died, in one line: an assertion's message, an
    ``LLVM ERROR``, else the signal."""
    found = re.findall(r'&& "\s*([^"]+)"\' failed', stderr) or \
        re.findall(r"Assertion `(.{1,200}?)' failed", stderr) or \
        re.findall(r"LLVM ERROR: (.{1,200})", stderr)
    if found:
        return " ".join(found[-1].split())
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode} without a result"


def _run(jobs: Sequence[tuple[Callable[..., Any], tuple]], at_once: int) -> list[_Outcome]:
    """Run every job in a worker, ``at_once`` at a time; their outcomes in order."""
    pending = list(enumerate(jobs))
    outcomes: dict[int, _Outcome] = {}

    def take():
        if not pending:
            return None
        index, (fn, args) = pending.pop(0)
        return index, fn, args

    _schedule(take, outcomes.__setitem__, at_once)
    return [outcomes[i] for i in range(len(jobs))]


def _schedule(take: Callable[[], tuple[Any, Callable[..., Any], tuple] | None],
              done: Callable[[Any, _Outcome], None], at_once: int) -> None:
    """Workers, ``at_once`` at a time, for the jobs ``take()`` hands out as ``(tag, fn,
    args)`` (None: no job is ready now; once none is running either, the end); each outcome
    goes to ``done(tag, outcome)`` as its worker ends, which may make more jobs ready. An
    exception ``done`` raises ends every running worker."""
    running: dict[Any, _Worker] = {}
    # the workers' garbage collector then skips this process's objects, so it does not copy
    # every page that holds one (copy-on-write) just to look at it
    gc.freeze()
    try:
        while True:
            while len(running) < at_once:
                job = take()
                if job is None:
                    break
                tag, fn, args = job
                running[tag] = _Worker(fn, args)
            if not running:
                return
            ready = wait([w.conn for w in running.values()])
            for tag, worker in list(running.items()):
                if worker.conn in ready:
                    worker.receive()
                    if worker.finished:
                        del running[tag]
                        done(tag, worker.outcome)
    finally:
        gc.unfreeze()
        for worker in running.values():
            worker.kill()


class Background:
    """``fn(*args)`` in a forked worker while this process goes on (the golden check's
    reference run beside the passes and the compile); ``result()`` waits for its value and
    raises what it raised. Where a worker cannot be forked (no ``fork``, a daemonic process),
    or when the worker dies without a result, ``result()`` runs ``fn`` here instead, as
    before there was a worker. Start it before this process starts threads of its own."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.worker: _Worker | None = None
        if "fork" in multiprocessing.get_all_start_methods() \
                and not multiprocessing.current_process().daemon:
            gc.freeze()
            try:
                self.worker = _Worker(_call, (fn, args))
            finally:
                gc.unfreeze()

    def result(self) -> Any:
        worker = self.worker
        if worker is None:
            return self.fn(*self.args)
        while not worker.finished:
            wait([worker.conn])
            worker.receive()
        self.worker = None
        outcome = worker.outcome
        if outcome.died is not None:
            return self.fn(*self.args)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def cancel(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None


def _call(report, fn, args):
    return fn(*args)


def _one_job_worker() -> None:
    """Python's cycle collector off for the rest of a compile worker, which emits IR, runs LLVM
    and exits: ``build.emit_module`` holds the collector off while it emits, and once it was
    back on, its first run walked every object emission had made (llvmlite's values point at
    their parents: cycles it cannot free by counting), 0.2-0.25 of the 1.4-1.7 CPU-s
    yolo11n_seg_nms's x86-64-v4 module takes to emit. The worker's memory ends with it."""
    gc.disable()


def _compile_job(report, funcs, target, size_vars, options, fallbacks=(), use_cache=True,
                 key=None, pipeline=DEFAULT_PIPELINE) -> CompiledCode:
    _one_job_worker()
    return compile_in_process(funcs, target, size_vars, fallbacks, use_cache, options=options,
                              key=key, pipeline=pipeline)


def compile_prim_funcs(funcs: Sequence[PrimFunc], target: Target,
                       size_vars: tuple[str, ...] = (),
                       options: CompileOptions = CompileOptions()) -> CompiledCode:
    """Compile ``funcs`` into one object for ``target`` (``build.compile_in_process``) in a
    worker process; kernel symbols are ``mlc_<name>``. ``size_vars`` (a symbolic module's size
    variables, in the order of the runtime's sizes array) gives symbolic kernels their run-time
    extents; ``options`` the kernel choices and the object cache. A kernel LLVM aborts on is
    compiled with a conservative pipeline (the code's ``fallbacks`` say which), or raises
    ``KernelCompileError``."""
    return compile_for_targets(funcs, [target], size_vars, options)[0]


def compile_for_targets(funcs: Sequence[PrimFunc], targets: Sequence[Target],
                        size_vars: tuple[str, ...] = (),
                        options: CompileOptions = CompileOptions()) -> list[CompiledCode]:
    """One ``CompiledCode`` per target, in order, each compiled in a worker process; several at
    once on a machine with more than one usable CPU (``options.parallel_compile`` False,
    ``MLCPACK_PARALLEL_COMPILE=0`` at the command line: one at a time). A kernel LLVM aborts on
    is compiled with a conservative pipeline (the code's ``fallbacks`` say which), or raises
    ``KernelCompileError``. Each target gets ``build.target_pipelines``' pipeline (a portable
    bundle's x86-64-v2 fallback the lean one). Without ``fork``, or in a
    daemonic process (a multiprocessing pool's worker), everything compiles in this process."""
    # a cache hit needs no compile, so no worker: it is looked up here, before any IR exists
    done: dict[int, CompiledCode] = {}
    pipelines = target_pipelines(targets)
    keys = object_keys(funcs, targets, size_vars, True, options, pipelines) \
        if options.cache_dir else [None] * len(targets)
    for i, t in enumerate(targets):
        hit = cached_code(keys[i], t, options)
        if hit is not None:
            done[i] = hit
    missing = [(i, t) for i, t in enumerate(targets) if i not in done]
    if not missing:
        return [done[i] for i in range(len(targets))]
    if "fork" not in multiprocessing.get_all_start_methods() \
            or multiprocessing.current_process().daemon:   # a daemon may not start processes
        done.update((i, compile_in_process(funcs, t, size_vars, options=options, key=keys[i],
                                           pipeline=pipelines[i]))
                    for i, t in missing)
        return [done[i] for i in range(len(targets))]
    cpus = _usable_cpus() if options.parallel_compile else 1
    groups = kernel_groups(funcs)
    whole = missing
    if len(groups) > 1:   # the kernel groups of every target side by side, then each object
        whole = []
        for (i, t), code in zip(missing, _compile_grouped(groups, [t for _, t in missing],
                                                          size_vars, options,
                                                          [keys[i] for i, _ in missing], cpus,
                                                          [pipelines[i] for i, _ in missing])):
            if code is None:
                whole.append((i, t))
            else:
                done[i] = code
    # one module per target (a group died: LLVM aborted, see _recover; or one kernel group)
    outcomes = _run([(_compile_job, (funcs, t, size_vars, options, (), True, keys[i],
                                     pipelines[i]))
                     for i, t in whole], max(1, min(len(whole), cpus)))
    for outcome in outcomes:
        if outcome.error is not None:
            raise outcome.error
    for (i, t), o in zip(whole, outcomes):
        done[i] = o.value if o.died is None else _recover(funcs, t, size_vars, o.died, options,
                                                          pipelines[i])
    return [done[i] for i in range(len(targets))]


# A module's kernels are optimized in this many groups per target (fewer when it has fewer
# distinct kernels), whatever the machine: the object depends on the grouping, so a bundle is
# the same bytes on every machine. Four keep two CPUs busy with one target and balance three.
GROUPS = 4


def kernel_groups(funcs: Sequence[PrimFunc], groups: int = GROUPS
                  ) -> list[tuple[list[PrimFunc], float]]:
    """``funcs`` in at most ``groups`` groups of about equal estimated LLVM time, each with
    that estimate (the size of each distinct kernel's expression DAG, largest first onto the
    lightest group), every function in its structural twin's group; each group in the
    functions' own order, and the groups in the order of their first function."""
    classes: dict[object, list[PrimFunc]] = {}
    for f in funcs:
        classes.setdefault(structural_key(f), []).append(f)
    if len(classes) <= 1:
        return [(list(funcs), 0.0)]
    cost = {key: _estimated_cost(key) for key in classes}
    bins: list[tuple[float, int, list[object]]] = [(0.0, b, []) for b in
                                                   range(min(groups, len(classes)))]
    for key in sorted(classes, key=lambda k: -cost[k]):   # stable: ties keep module order
        load, b, members = min(bins)
        members.append(key)
        bins[b] = (load + cost[key], b, members)
    chosen = {id(f): b for _, b, keys in bins for key in keys for f in classes[key]}
    grouped = [([f for f in funcs if chosen[id(f)] == b], load) for load, b, _ in bins]
    position = {id(f): i for i, f in enumerate(funcs)}
    return sorted((g for g in grouped if g[0]), key=lambda g: position[id(g[0][0])])


def _estimated_cost(key) -> float:
    """LLVM time grows with the kernel's expression DAG (nodes), and a reduction's kernel (a
    contraction's register-blocked microkernel, a pool's window) is several times larger."""
    _, nodes, _ = key
    reductions = sum(1 for n in nodes if n and n[0] == "reduce")
    return len(nodes) * (1 + 4 * reductions)


def _group_job(report, funcs, target, size_vars, options, pipeline):
    _one_job_worker()
    return optimize_group(funcs, target, size_vars, options, pipeline)


def _link_job(report, groups, target, options, key, start, pipeline):
    return link_groups(groups, target, options, key, start, pipeline)


def _compile_grouped(grouped: Sequence[tuple[Sequence[PrimFunc], float]],
                     targets: Sequence[Target],
                     size_vars: tuple[str, ...], options: CompileOptions,
                     keys: Sequence[str | None], cpus: int,
                     pipelines: Sequence[Pipeline]) -> list[CompiledCode | None]:
    """Each target's object from its kernel groups, optimized in parallel workers (``cpus``
    at a time), then linked and compiled to an object in a worker per target, which starts as
    soon as that target's groups are done (beside the other targets' groups): the targets in
    ``_target_order``, each one's groups the costliest first, a ready link before any group.
    The object is one long job per target; started early, it runs beside the next target's
    groups instead of leaving a CPU idle at the end; the last two targets' groups alternate
    (``_group_order``), so their objects run side by side at the end. None for a target where
    a worker died (LLVM aborted): the caller compiles that one whole, which finds the culprit
    (``_recover``)."""
    start = time.perf_counter()
    groups = [g for g, _ in grouped]
    cost = [c for _, c in grouped]
    pending = _group_order(_target_order(targets, pipelines), cost)
    parts: dict[tuple[int, int], Any] = {}
    left = {t: len(groups) for t in range(len(targets))}
    links: list[int] = []
    result: list[CompiledCode | None] = [None] * len(targets)

    def take():
        if links:
            t = links.pop(0)
            return ("link", t), _link_job, ([parts[t, g] for g in range(len(groups))],
                                            targets[t], options, keys[t], start, pipelines[t])
        if pending:
            t, g = pending.pop(0)
            return ("group", t, g), _group_job, (groups[g], targets[t], size_vars, options,
                                                 pipelines[t])
        return None

    def done(tag, outcome: _Outcome) -> None:
        if tag[0] == "link":
            if outcome.error is not None and not isinstance(outcome.error, CodegenError):
                raise outcome.error
            if outcome.died is None and outcome.error is None:
                result[tag[1]] = outcome.value
            return
        _, t, g = tag
        if outcome.error is not None:
            raise outcome.error
        if outcome.died is not None:   # this target compiles whole afterwards: drop the rest
            left[t] = -1
            pending[:] = [tg for tg in pending if tg[0] != t]
            return
        parts[t, g] = outcome.value
        left[t] -= 1
        if left[t] == 0:
            links.append(t)

    _schedule(take, done, max(1, cpus))
    return result


def _target_order(targets: Sequence[Target], pipelines: Sequence[Pipeline]) -> list[int]:
    """The order in which the targets' groups are optimized: the costliest object last to
    start is what the compile waits for at the end, so the targets with the default pipeline
    come first (the highest level first: wider vectors, more code), the lean ones after."""
    return sorted(range(len(targets)),
                  key=lambda t: (pipelines[t] != DEFAULT_PIPELINE, -t))


def _group_order(order: Sequence[int], cost: Sequence[float]) -> list[tuple[int, int]]:
    """The (target, group) jobs in the order they start: the targets in ``order``
    (``_target_order``), each one's groups the costliest first, but the last two targets'
    groups alternating. Each target's object (its link job) starts when its last group ends;
    one after another, the last target's object ran alone at the end, one CPU idle for about
    its length (1-2 s of a three-level portable compile); alternating, the last two objects
    start together and the wait at the end is their difference. The same recorded jobs of a
    portable export (v4, v3, v2) replayed on 2 idle cores in the old and this order
    (docs/performance.md, "Export time, round eleven"): yolo11n_seg_nms 14.9 -> 13.6 s,
    yolov8n_320 13.5 -> 12.3, layout_cdla 10.5 -> 10.1 (bounds, all CPU / 2: 13.6, 12.2, 9.9).
    The objects do not change (a target's groups link in their own order)."""
    each = [[(t, g) for g in sorted(range(len(cost)), key=lambda g: -cost[g])] for t in order]
    head, tail = each[:-2], each[-2:]
    alternating = [job for pair in zip(*tail) for job in pair] if len(tail) == 2 else \
        [job for jobs in tail for job in jobs]
    return [job for jobs in head for job in jobs] + alternating


def _scan_job(report, kernels, target, size_vars, options, pipeline) -> None:
    """Compile ``kernels`` one at a time, each alone, reporting how many are done."""
    for i, kernel in enumerate(kernels):
        compile_in_process([kernel], target, size_vars, use_cache=False, thread_pool=False,
                           options=options, pipeline=pipeline)
        report(i + 1)


def _find_culprits(kernels: Sequence[PrimFunc], target: Target, size_vars: tuple[str, ...],
                   options: CompileOptions, pipeline: Pipeline) -> dict[str, str]:
    """The kernels LLVM aborts on when each is compiled alone, and why: contiguous runs of
    ``kernels`` scanned by parallel workers, a run that dies going on after its culprit."""
    at_once = max(1, min(_usable_cpus(), len(kernels)))
    step = -(-len(kernels) // at_once)
    runs = [(lo, min(lo + step, len(kernels))) for lo in range(0, len(kernels), step)]
    culprits: dict[str, str] = {}
    while runs:
        outcomes = _run([(_scan_job, (kernels[lo:hi], target, size_vars, options, pipeline))
                         for lo, hi in runs], at_once)
        again = []
        for (lo, hi), outcome in zip(runs, outcomes):
            if outcome.error is not None:
                raise outcome.error
            if outcome.died is not None:
                culprit = lo + outcome.progress
                culprits[kernels[culprit].name] = outcome.died
                if culprit + 1 < hi:
                    again.append((culprit + 1, hi))
        runs = again
    return culprits


def _recover(funcs: Sequence[PrimFunc], target: Target, size_vars: tuple[str, ...],
             reason: str, options: CompileOptions,
             pipeline: Pipeline = DEFAULT_PIPELINE) -> CompiledCode:
    """The module's object when compiling it whole with ``pipeline`` made a worker die (see
    the module doc): the kernels that survive keep ``pipeline``."""
    groups: dict[object, list[PrimFunc]] = {}
    for f in funcs:
        groups.setdefault(structural_key(f), []).append(f)
    members = {g[0].name: g for g in groups.values()}
    culprits = _find_culprits([g[0] for g in groups.values()], target, size_vars, options,
                              pipeline)
    if not culprits:   # every kernel compiles alone: give them all the conservative pipelines
        culprits = {name: reason for name in members}
    serves = {name: tuple(f.name for f in members[name]) for name in culprits}
    # first try: every culprit with the first conservative pipeline, in one compile
    fallbacks = [Fallback(name, serves[name], CONSERVATIVE_PIPELINES[0], why)
                 for name, why in culprits.items()]
    (outcome,) = _run([(_compile_job, (funcs, target, size_vars, options, fallbacks, True,
                                       None, pipeline))], 1)
    if outcome.error is not None:
        raise outcome.error
    if outcome.died is None:
        return outcome.value
    # else each culprit alone, with each conservative pipeline in turn
    fallbacks, failed = [], []
    for name, why in culprits.items():
        for pipeline in CONSERVATIVE_PIPELINES:
            fallback = Fallback(name, serves[name], pipeline, why)
            (outcome,) = _run([(_compile_job, (members[name], target, size_vars, options,
                                               [fallback], False))], 1)
            if outcome.error is not None:
                raise outcome.error
            if outcome.died is None:
                fallbacks.append(fallback)
                break
        else:
            failed.append(name)
    if not failed:
        (outcome,) = _run([(_compile_job, (funcs, target, size_vars, options, fallbacks, True,
                                       None, pipeline))], 1)
        if outcome.error is not None:
            raise outcome.error
        if outcome.died is None:
            return outcome.value
        failed = list(culprits)
    raise KernelCompileError(failed, [n for name in failed for n in serves[name]], target.name,
                             culprits[failed[0]])
