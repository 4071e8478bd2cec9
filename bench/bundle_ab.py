"""Inference time of two bundles of the same model, side by side in one process: did a compiler
change (a pipeline, an optimization level) slow the code down?

    .venv/bin/python bench/bundle_ab.py A.mlc B.mlc [A2.mlc B2.mlc ...] [--budget 6]
        [--threads 1] [--level x86-64-v2] [--kernels 8] [--show NAME ...]
        [--dim height=320 ...]

Each pair is loaded once (same random inputs, seeded), warmed up, then timed
in alternating blocks (A, B, A, B, ...; a block is about 0.2 s of runs) until ``--budget``
seconds per pair have passed. Printed per pair: median and min milliseconds per run of each,
and B / A for the medians and the mins. ``--kernels N`` then profiles both (``model.profile``,
alternating rounds of 10 runs) and prints the N kernels whose min time changed most (B / A;
kernels are paired by their source-model nodes, else by name, so a change that removes or adds
kernels pairs the rest right), then the kernels only one bundle has and both bundles' copies.
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


def step_keys(steps) -> list[str]:
    """A key per profiled instruction that names the same work in two bundles of one model:
    a kernel by its source-model nodes (its name where the header has none), a library call by
    its name; the n-th repeat of a key gets `` #n``. Instruction indices do not pair them once
    a change removes or adds instructions (a concat made in place, a fusion)."""
    seen: dict[str, int] = {}
    keys = []
    for s in steps:
        key = " + ".join(n.name or n.op for n in s.sources) if s.sources else s.name
        seen[key] = seen.get(key, 0) + 1
        keys.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
    return keys


def kernel_changes(path_a: str, path_b: str, threads: int, rounds: int = 6) -> dict:
    """From ``rounds`` alternating profiles of 10 runs each, min over all of them: ``pairs``,
    (B/A, A min us, B min us, kernel) per kernel of A matched to one of B (``step_keys``; a key
    only one side has pairs by kernel name when that name is left on both sides once); the
    kernels ``only_a`` and ``only_b`` ((min us, name, key), the work a change removed or
    added); ``copies``: per bundle, (how many COPY / APPEND instructions, their min us)."""
    from mlcpack.runtime.model import load

    a, b = load(path_a, threads=threads), load(path_b, threads=threads)
    feeds = _inputs(a)
    best: dict[str, list] = {"a": [], "b": []}
    steps = {}
    for _ in range(rounds):
        for key, m in (("a", a), ("b", b)):
            prof = m.profile(feeds, runs=10).instructions
            best[key].append([t.min_us for t in prof])
            steps[key] = [t.step for t in prof]
    mins = {k: np.min(np.array(v), axis=0) for k, v in best.items()}
    kernels = {}
    for k in ("a", "b"):
        rows = [(key, s, float(t)) for key, s, t in zip(step_keys(steps[k]), steps[k], mins[k])
                if s.kind == "kernel"]
        kernels[k] = {key: (s.name, t) for key, s, t in rows}
    only_a = {k: v for k, v in kernels["a"].items() if k not in kernels["b"]}
    only_b = {k: v for k, v in kernels["b"].items() if k not in kernels["a"]}
    names_b: dict[str, list[str]] = {}
    for key, (name, _) in only_b.items():
        names_b.setdefault(name, []).append(key)
    names_a = [name for name, _ in only_a.values()]
    renamed = {}   # a key of A -> the key of B of the same kernel name (each unique on both sides)
    for key, (name, _) in only_a.items():
        if names_a.count(name) == 1 and len(names_b.get(name, ())) == 1:
            renamed[key] = names_b[name][0]
    pairs = []
    for key, (name, ta) in kernels["a"].items():
        kb = key if key in kernels["b"] else renamed.get(key)
        if kb is not None and ta > 0:
            pairs.append((kernels["b"][kb][1] / ta, ta, kernels["b"][kb][1], name))
    matched_b = set(kernels["a"]) | set(renamed.values())
    copies = {k: (sum(1 for s in steps[k] if s.kind == "copy"),
                  float(sum(t for s, t in zip(steps[k], mins[k]) if s.kind == "copy")))
              for k in ("a", "b")}
    return {"pairs": sorted(pairs, key=lambda r: -abs(np.log(r[0]) if r[0] > 0 else 0)),
            "only_a": sorted(((t, name, key) for key, (name, t) in only_a.items()
                              if key not in renamed), reverse=True),
            "only_b": sorted(((t, name, key) for key, (name, t) in kernels["b"].items()
                              if key not in matched_b), reverse=True),
            "copies": copies}


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
            changes = kernel_changes(path_a, path_b, args.threads)
            rows = changes["pairs"]
            (na, ta), (nb, tb) = changes["copies"]["a"], changes["copies"]["b"]
            total_a = sum(r[1] for r in rows) + sum(r[0] for r in changes["only_a"]) + ta
            total_b = sum(r[2] for r in rows) + sum(r[0] for r in changes["only_b"]) + tb
            print(f"  kernels' and copies' min times summed: A {total_a:.0f} us, B "
                  f"{total_b:.0f} us (B/A {total_b / total_a:.3f}); {len(rows)} kernels matched "
                  "by source nodes or name; most changed:")
            for ratio, ma, mb, name in rows[:args.kernels]:
                print(f"    {ratio:6.3f}  {ma:9.1f} -> {mb:9.1f} us  {name[:70]}")
            for side, label in (("only_a", "only in A (removed)"), ("only_b", "only in B (added)")):
                gone = changes[side]
                if gone:
                    print(f"  {len(gone)} kernels {label}, {sum(r[0] for r in gone):.0f} us:")
                    for t, name, key in gone[:args.kernels]:
                        print(f"    {t:9.1f} us  {name[:40]}  ({key[:60]})")
            if na or nb:
                print(f"  copies: A {na} ({ta:.0f} us), B {nb} ({tb:.0f} us)")
            shown = [r for r in rows if any(t in r[3] for t in args.show)]
            if shown:
                print(f"  kernels named {', '.join(args.show)}: A {sum(r[1] for r in shown):.0f} "
                      f"us, B {sum(r[2] for r in shown):.0f} us")
            for ratio, ma, mb, name in shown:
                print(f"    {ratio:6.3f}  {ma:9.1f} -> {mb:9.1f} us  {name[:70]}")

if __name__ == "__main__":
    sys.exit(main())
