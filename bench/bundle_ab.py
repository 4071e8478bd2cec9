"""Inference time of two bundles of the same model, side by side in one process: did a compiler
change (a pipeline, an optimization level) slow the code down?

    .venv/bin/python bench/bundle_ab.py A.mlc B.mlc [A2.mlc B2.mlc ...] [--budget 6]
        [--threads 1] [--level x86-64-v2] [--kernels 8] [--show NAME ...]
        [--dim height=320 ...]

Each pair is loaded once (same random inputs, seeded), warmed up, then timed
in alternating blocks (A, B, A, B, ...; a block is about 0.2 s of runs) until ``--budget``
seconds per pair have passed. Printed per pair: median and min milliseconds per run of each,
and B / A for the medians and the mins. ``--kernels N`` then profiles both (``model.profile``,
alternating rounds of 10 runs) and prints the N kernels whose min time changed most (B / A; the
two bundles must come from one model, so their programs match instruction by instruction).
``--level`` pins the code variant the runtime picks (``MLCPACK_CPU_FEATURES`` with that level's
flags, set before loading), to time a portable bundle's lower variant on this host.
``--show TEXT`` also lists every kernel whose name holds TEXT (the kernels a change touched),
with their sums; ``--dim NAME=N`` gives a symbolic input size (``--dim height=320``).
``--cpu`` times each run in this process's CPU seconds (``time.process_time``) instead of wall
seconds: on a loaded host a run the scheduler preempts counts only what it ran (1 thread
only: with more, the workers' CPU adds up).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

LEVEL_FLAGS = {
    "x86-64-v2": "fpu,cx8,cmov,fxsr,mmx,sse,sse2,cx16,lahf_lm,popcnt,sse4_1,sse4_2,ssse3,pni",
}
LEVEL_FLAGS["x86-64-v3"] = LEVEL_FLAGS["x86-64-v2"] + \
    ",avx,avx2,bmi1,bmi2,f16c,fma,abm,movbe,xsave"


# symbolic input sizes (``--dim batch=1``): name -> value
DIMS: dict[str, int] = {}
# the clock each run is timed with (``--cpu``: time.process_time)
CLOCK = time.perf_counter


def _inputs(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in model.inputs:
        unknown = [d for d in spec.shape if isinstance(d, str) and d not in DIMS]
        if unknown:
            raise SystemExit(f"input {spec.name} has symbolic size(s) {', '.join(unknown)}: "
                             f"give each with --dim NAME=N")
        shape = tuple(DIMS[d] if isinstance(d, str) else int(d) for d in spec.shape)
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[spec.name] = rng.integers(0, 8, shape).astype(dtype)
    return feeds


def _block(model, feeds, seconds: float) -> list[float]:
    """Runs for about ``seconds``; each run's seconds."""
    times = []
    end = time.perf_counter() + seconds
    while True:
        t0 = CLOCK()
        model.run(feeds)
        times.append(CLOCK() - t0)
        if time.perf_counter() > end:
            return times


def compare(path_a: str, path_b: str, budget: float, threads: int) -> tuple[list, list]:
    from mlcpack.runtime.model import load

    a, b = load(path_a, threads=threads), load(path_b, threads=threads)
    feeds = _inputs(a)
    for m in (a, b):
        _block(m, feeds, 0.3)   # warm-up: pages, caches, the thread pool
    ta: list[float] = []
    tb: list[float] = []
    end = time.perf_counter() + budget
    while time.perf_counter() < end:
        ta += _block(a, feeds, 0.2)
        tb += _block(b, feeds, 0.2)
    return ta, tb


def kernel_changes(path_a: str, path_b: str, threads: int, rounds: int = 6
                   ) -> list[tuple[float, float, float, str]]:
    """(B/A, A min us, B min us, kernel) per kernel instruction, from ``rounds`` alternating
    profiles of 10 runs each, min over all of them."""
    from mlcpack.runtime.model import load

    a, b = load(path_a, threads=threads), load(path_b, threads=threads)
    feeds = _inputs(a)
    best: dict[str, list] = {"a": [], "b": []}
    for _ in range(rounds):
        for key, m in (("a", a), ("b", b)):
            best[key].append([t.min_us for t in m.profile(feeds, runs=10).instructions])
    steps = a.profile(feeds, runs=1).instructions
    mins_a = np.min(np.array(best["a"]), axis=0)
    mins_b = np.min(np.array(best["b"]), axis=0)
    rows = [(float(mb / ma), float(ma), float(mb), s.step.name)
            for s, ma, mb in zip(steps, mins_a, mins_b) if s.step.kind == "kernel" and ma > 0]
    return sorted(rows, key=lambda r: -abs(np.log(r[0])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+", help="pairs: A.mlc B.mlc ...")
    ap.add_argument("--budget", type=float, default=6.0, help="seconds per pair")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--level", choices=sorted(LEVEL_FLAGS), default=None,
                    help="pin the code variant the runtime picks")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also list the N kernels whose min time changed most")
    ap.add_argument("--show", action="append", default=[], metavar="TEXT",
                    help="with --kernels, also list every kernel whose name holds TEXT")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                    help="a symbolic input size, e.g. --dim height=320 (repeatable)")
    ap.add_argument("--cpu", action="store_true",
                    help="time runs in CPU seconds of this process (1 thread only)")
    args = ap.parse_args()
    if args.cpu:
        if args.threads != 1:
            raise SystemExit("--cpu times one thread's runs: use it with --threads 1")
        global CLOCK
        CLOCK = time.process_time
    for item in args.dim:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"--dim {item}: give NAME=N, e.g. height=320")
        DIMS[name] = int(value)
    if len(args.bundles) % 2:
        raise SystemExit("give the bundles in pairs: A.mlc B.mlc")
    if args.level:
        os.environ["MLCPACK_CPU_FEATURES"] = LEVEL_FLAGS[args.level]
    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags")
                    for f in line.split() if f.startswith(("avx2", "avx512", "fma"))})
    print(f"host flags: {' '.join(flags)}; {os.cpu_count()} CPUs; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; threads {args.threads}; variant "
          f"{args.level or 'best for this host'}; "
          f"{'CPU' if args.cpu else 'wall'} time per run; blocks of 0.2 s alternating, "
          f"{args.budget:.0f} s per pair", flush=True)
    print(f"{'A':28s} {'B':28s} {'A med ms':>9s} {'B med ms':>9s} {'A min':>8s} {'B min':>8s} "
          f"{'B/A med':>8s} {'B/A min':>8s}")
    for path_a, path_b in zip(args.bundles[::2], args.bundles[1::2]):
        ta, tb = compare(path_a, path_b, args.budget, args.threads)
        ma, mb = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
        na, nb = min(ta) * 1e3, min(tb) * 1e3
        print(f"{os.path.basename(path_a):28s} {os.path.basename(path_b):28s} {ma:9.3f} "
              f"{mb:9.3f} {na:8.3f} {nb:8.3f} {mb / ma:8.3f} {nb / na:8.3f}", flush=True)
        if args.kernels:
            rows = kernel_changes(path_a, path_b, args.threads)
            total_a = sum(r[1] for r in rows)
            total_b = sum(r[2] for r in rows)
            print(f"  kernels' min times summed: A {total_a:.0f} us, B {total_b:.0f} us "
                  f"(B/A {total_b / total_a:.3f}); most changed:")
            for ratio, ma, mb, name in rows[:args.kernels]:
                print(f"    {ratio:6.3f}  {ma:9.1f} -> {mb:9.1f} us  {name[:70]}")
            shown = [r for r in rows if any(t in r[3] for t in args.show)]
            if shown:
                print(f"  kernels named {', '.join(args.show)}: A {sum(r[1] for r in shown):.0f} "
                      f"us, B {sum(r[2] for r in shown):.0f} us")
            for ratio, ma, mb, name in shown:
                print(f"    {ratio:6.3f}  {ma:9.1f} -> {mb:9.1f} us  {name[:70]}")


if __name__ == "__main__":
    sys.exit(main())
