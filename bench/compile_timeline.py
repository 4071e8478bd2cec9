"""Where a cold compile's wall time goes between the workers: every job of the export's grouped,
parallel compile (``codegen/parallel.py``: each target's kernel groups, then its link + object
job) with its own CPU seconds, and the compile replayed on N idle cores.

    .venv/bin/python bench/compile_timeline.py MODEL.onnx [--input-shape x=1,3,320,320]
        [--target portable] [--cores 2]

The model goes through ``mlcpack export``'s own path up to its first ``compile_for_targets``
call (``bench/codegen_phases.py capture``: golden check off, no compile cache); that call then
runs as the export runs it, with each worker's CPU seconds (``time.process_time`` in the
worker) and wall start / end recorded. Printed: the jobs in start order, the CPU per target
and phase, and a replay of the same jobs in the same start order on ``--cores`` idle cores
(each job as long as its CPU time, a link after its target's groups): the compile's wall time
on a quiet machine of that many cores, against the bound (all CPU / cores). On a loaded host
the recorded wall times stretch; the CPU times and the replay do not, much.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def replay(jobs: list[tuple[str, str, float]], cores: int) -> float:
    """Makespan of ``jobs`` ((kind, target, CPU s) in start order) on ``cores`` idle cores:
    each job on the first free core, a "link" job not before its target's groups end."""
    free = [0.0] * cores
    groups_end: dict[str, float] = {}
    for kind, target, cpu in jobs:
        i = min(range(cores), key=free.__getitem__)
        start = max(free[i], groups_end.get(target, 0.0) if kind == "link" else 0.0)
        free[i] = start + cpu
        if kind == "group":
            groups_end[target] = max(groups_end.get(target, 0.0), free[i])
    return max(free)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--input-shape", action="append", default=[])
    ap.add_argument("--target", default=None, help="default: portable")
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    import codegen_phases
    from mlcpack.packager.codegen import parallel
    from mlcpack.packager.codegen.target import drop_idle_levels, resolve_targets

    shapes = {}
    for s in args.input_shape:
        name, _, dims = s.partition("=")
        shapes[name] = [int(d) for d in dims.split(",")]
    funcs, size_vars, options = codegen_phases.capture(args.model, shapes)
    targets = drop_idle_levels(resolve_targets(args.target), funcs)
    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags")
                    for f in line.split() if f.startswith(("avx2", "avx512", "fma"))})
    print(f"host flags: {' '.join(flags)}; load average {os.getloadavg()[0]:.1f}; "
          f"{len(funcs)} prim funcs; targets {', '.join(t.name for t in targets)}", flush=True)
    log: list[tuple[str, str, float, float, float]] = []
    spool = tempfile.mkdtemp(prefix="mlcpack-timeline-")
    init, end = parallel._Worker.__init__, parallel._Worker._end

    def timed_init(self, fn, fargs):
        kind = {"_group_job": "group", "_link_job": "link"}.get(fn.__name__, fn.__name__)
        self.timeline = (kind, fargs[1].name if kind in ("group", "link") else "",
                         time.perf_counter())

        def job(report, *a, _fn=fn):
            cpu = time.process_time()
            value = _fn(report, *a)
            Path(spool, str(os.getpid())).write_text(str(time.process_time() - cpu))
            return value
        init(self, job, fargs)

    def timed_end(self, died):
        pid = self.process.pid
        end(self, died)
        spent = Path(spool, str(pid))
        cpu = float(spent.read_text()) if spent.exists() else float("nan")
        log.append((*self.timeline[:2], self.timeline[2], time.perf_counter(), cpu))

    parallel._Worker.__init__, parallel._Worker._end = timed_init, timed_end
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        codes = parallel.compile_for_targets(funcs, targets, size_vars,
                                             options.replace(cache_dir=None))
    finally:
        parallel._Worker.__init__, parallel._Worker._end = init, end
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    log.sort(key=lambda r: r[2])
    print("\n| job | target | start s | end s | CPU s |\n|---|---|---|---|---|")
    for kind, target, start, stop, cpu in log:
        print(f"| {kind} | {target} | {start - t0:.2f} | {stop - t0:.2f} | {cpu:.2f} |")
    print("\n| target | emit IR | optimize | object code | total CPU s |\n|---|---|---|---|---|")
    for c in codes:
        phases = dict(c.phases)
        print(f"| {c.target.name} | " + " | ".join(f"{phases.get(p, 0.0):.2f}" for p in
                                                    ("emit IR", "optimize", "object code"))
              + f" | {sum(phases.values()):.2f} |")
    total = sum(r[4] for r in log)
    span = replay([(k, t, c) for k, t, _, _, c in log], args.cores)
    print(f"\nwall {wall:.2f} s here (workers' CPU {children:.2f} s); jobs' CPU {total:.2f} s; "
          f"replayed on {args.cores} idle cores: {span:.2f} s (bound {total / args.cores:.2f}, "
          f"idle core-seconds {args.cores * span - total:.2f})")


if __name__ == "__main__":
    main()
