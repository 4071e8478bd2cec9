"""Where a bundle's 2-thread time goes: each kernel task's thread CPU time inside the real pool.

Run: .venv/bin/python bench/task_cpu.py MODEL.mlc [--runs N] [--threads 2] [--top K]

A small C shim (compiled here with ``cc``) wraps every kernel call of the plan's native step
table: it calls the kernel between two reads of ``CLOCK_THREAD_CPUTIME_ID`` and keeps, per
task, the CPU time of the thread that ran it. The model then runs as usual (the bundle's own
hand-off, the same tasks), once on 1 thread and once on ``--threads``, ``--runs`` times each.
Thread CPU time does not count time a thread waits descheduled, so on a loaded host it still
shows what running side by side costs the kernels (another core's data, write sharing,
contention): per run, the work (every task's CPU time summed) against the 1-thread run's, and
per kernel the median work at 1 and at N threads and each task's share; the critical path by
home ranges, and with the hand-off's stealing simulated on the measured task times. Needs a
bundle with the native step loop (``mlcpack_pool_steps``) and a static plan.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHIM = r"""
#include <stdint.h>
#include <time.h>
typedef void (*kfn)(void **, int64_t, int64_t);
typedef struct { kfn fn; void **args; int64_t cpu[64]; } call;
static int64_t now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
                           return t.tv_sec * 1000000000LL + t.tv_nsec; }
void timed(void **p, int64_t task, int64_t n) {
    call *c = (call *)p;
    int64_t c0 = now();
    c->fn(c->args, task, n);
    if (task >= 0 && task < 64) c->cpu[task] = now() - c0;
}
"""
MAX_TASKS = 64


class Call(ctypes.Structure):
    _fields_ = [("fn", ctypes.c_void_p), ("args", ctypes.c_void_p),
                ("cpu", ctypes.c_int64 * MAX_TASKS)]


def build_shim(workdir: Path) -> int:
    src, lib = workdir / "shim.c", workdir / "shim.so"
    src.write_text(SHIM)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return ctypes.cast(ctypes.CDLL(str(lib)).timed, ctypes.c_void_p).value


def measure(path: str, threads: int, runs: int, shim: int
            ) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(runs x kernel calls x tasks) thread CPU us, each call's kernel name, and each call's
    task count (0: run on the calling thread alone)."""
    from mlcpack.runtime import load
    from mlcpack.runtime.bench import random_feeds
    from mlcpack.runtime.header import OP_CALL_KERNEL

    model = load(path, threads=threads)
    feeds = random_feeds(model)
    model.run(feeds)
    executor = getattr(model._main, "_executor", None)
    table = getattr(executor, "_table", None)
    if table is None:
        sys.exit(f"{path}: no native step table (a symbolic plan, or a bundle without "
                 "mlcpack_pool_steps)")
    table = table.reshape(-1, 3)
    ntasks = table[:, 2].astype(np.int64).copy()
    calls = []
    for k in range(table.shape[0]):
        c = Call(fn=int(table[k, 0]), args=int(table[k, 1]))
        calls.append(c)
        table[k, 0], table[k, 1] = shim, ctypes.addressof(c)
    kernels = model.schema.plan.kernels
    names = [kernels[ins.target].name for ins in executor.program
             if ins.opcode == OP_CALL_KERNEL]
    cpu = np.zeros((runs, len(calls), MAX_TASKS))
    for r in range(runs):
        for c in calls:
            ctypes.memset(ctypes.addressof(c.cpu), 0, ctypes.sizeof(c.cpu))
        model.run(feeds)
        for k, c in enumerate(calls):
            cpu[r, k] = c.cpu[:]
    model.close()
    return cpu / 1e3, names, ntasks


def home_path(cpu: np.ndarray, ntasks: np.ndarray, threads: int) -> np.ndarray:
    """Per run and call, the larger of the threads' home ranges (thread t: tasks ``[t * n / T,
    (t + 1) * n / T)``, codegen/threadpool.py): the call's critical path when the threads keep
    pace; a call run on one thread (``ntasks`` 0) counts whole."""
    out = cpu.sum(2).copy()
    for k, n in enumerate(ntasks):
        if n > 1:
            parts = [cpu[:, k, t * n // threads:(t + 1) * n // threads].sum(1)
                     for t in range(threads)]
            out[:, k] = np.max(parts, axis=0)
    return out


def steal_path(cpu: np.ndarray, ntasks: np.ndarray, threads: int) -> np.ndarray:
    """``home_path`` with the hand-off's stealing (codegen/threadpool.py): each thread runs its
    home range from the bottom, then the others' from the top, whichever thread is free first
    claiming next (a late or idle thread's share is taken over: a kernel whose few work items
    all lie in one thread's range still runs on both)."""
    out = cpu.sum(2).copy()
    for k, n in enumerate(ntasks):
        if n <= 1:
            continue
        for r in range(cpu.shape[0]):
            ranges = [list(cpu[r, k, t * n // threads:(t + 1) * n // threads])
                      for t in range(threads)]
            clock = [0.0] * threads
            while any(ranges):
                t = min(range(threads), key=lambda i: clock[i])
                if ranges[t]:
                    clock[t] += ranges[t].pop(0)
                else:
                    other = next(ranges[(t + j) % threads] for j in range(1, threads)
                                 if ranges[(t + j) % threads])
                    clock[t] += other.pop()
            out[r, k] = max(clock)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(Path(tmp))
        t0 = time.perf_counter()
        one, names, _ = measure(args.bundle, 1, args.runs, shim)
        many, _, ntasks = measure(args.bundle, args.threads, args.runs, shim)
    w1, wn = one.sum(2), many.sum(2)              # per run and call: the work
    crit = many.max(2)                             # the longest task of each call
    print(f"{args.bundle}: {args.runs} runs at 1 and {args.threads} threads "
          f"({time.perf_counter() - t0:.0f} s); thread CPU ms, min / median over runs")
    print(f"  work at 1 thread:  {w1.sum(1).min() / 1e3:7.2f} / {np.median(w1.sum(1)) / 1e3:7.2f}")
    print(f"  work at {args.threads} threads: {wn.sum(1).min() / 1e3:7.2f} / "
          f"{np.median(wn.sum(1)) / 1e3:7.2f}")
    print(f"  longest task per call, summed ({args.threads} threads): "
          f"{crit.sum(1).min() / 1e3:7.2f} / {np.median(crit.sum(1)) / 1e3:7.2f}")
    home = home_path(many, ntasks, args.threads)
    serial = ntasks <= 1
    print(f"  critical path by home ranges ({args.threads} threads): "
          f"{home.sum(1).min() / 1e3:7.2f} / {np.median(home.sum(1)) / 1e3:7.2f}; half the "
          f"1-thread work {w1.sum(1).min() / 2e3:7.2f} / {np.median(w1.sum(1)) / 2e3:7.2f}")
    steal = steal_path(many, ntasks, args.threads)
    print(f"  critical path with stealing ({args.threads} threads): "
          f"{steal.sum(1).min() / 1e3:7.2f} / {np.median(steal.sum(1)) / 1e3:7.2f}")
    hm, h1 = np.median(home, 0), np.median(w1, 0)
    print(f"  of the path (medians): {int(serial.sum())} calls on one thread "
          f"{hm[serial].sum() / 1e3:6.2f} ms (1 thread {h1[serial].sum() / 1e3:6.2f}); "
          f"{int((~serial).sum())} split calls {hm[~serial].sum() / 1e3:6.2f} ms against half "
          f"their 1-thread work {h1[~serial].sum() / 2e3:6.2f}")
    hw = np.median(wn, 0)
    print(f"  split calls: uneven split {(hm - hw / 2)[~serial].sum() / 1e3:6.2f} ms (path "
          f"beyond half their {args.threads}-thread work), work grown "
          f"{(hw - h1)[~serial].sum() / 2e3:6.2f} ms (half the growth)")
    gap = hm - np.where(serial, 0.0, h1 / 2)
    print("calls with the longest path beyond half their 1-thread work (us; serial calls "
          "whole):")
    for k in np.argsort(-gap)[:args.top]:
        print(f"  {k:4d} {h1[k]:8.1f} -> path {hm[k]:8.1f}  ntasks {ntasks[k]:2d}  "
              f"{names[k][:60]}")
    m1, mn = np.median(w1, 0), np.median(wn, 0)
    print(f"kernel calls whose median work grew most at {args.threads} threads (us):")
    for k in np.argsort(-(mn - m1))[:args.top]:
        tasks = np.median(many[:, k], 0)
        used = tasks[:max(1, int(np.flatnonzero(tasks).max(initial=0)) + 1)]
        print(f"  {k:4d} {m1[k]:8.1f} -> {mn[k]:8.1f} ({mn[k] / max(m1[k], 1e-9):4.2f}x)  "
              f"tasks {' '.join(f'{t:.0f}' for t in used)}  {names[k][:48]}")


if __name__ == "__main__":
    main()
