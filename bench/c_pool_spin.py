"""Two builds of `mlcrun` (e.g. the C thread pool's SPIN_ITERATIONS 20000 against 2000) on the
same bundles, alternating, one process per round and build.

    .venv/bin/python bench/c_pool_spin.py A/mlcrun B/mlcrun MODEL.mlc [...] [--threads 2]
                                          [--rounds 8] [--runs 10]

Each round runs ``mlcrun bench MODEL --threads N --runs R`` with each build in turn (the order
flips every round). Per build and model it prints the median of the rounds' p50s and the
smallest min (wall, timed inside mlcrun around each mlc_run) and the process's CPU time (user +
sys of the child, load and first run included) per timed run: median and min over rounds. On a
loaded host the CPU time shows what spinning costs; the wall minimum what the code does when it
has the cores.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess

LINE = re.compile(r"first ([\d.]+) ms, p50 ([\d.]+) us, .* min ([\d.]+) us \((\d+) runs")


def one(exe: str, model: str, threads: int, runs: int) -> tuple[float, float, float]:
    """(p50 us, min us, child CPU us per run) of one `mlcrun bench` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([exe, "bench", model, "--threads", str(threads), "--runs", str(runs)],
                         capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = LINE.search(out)
    if not m:
        raise SystemExit(f"error: unexpected mlcrun output: {out.strip()}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e6
    return float(m[2]), float(m[3]), cpu / (int(m[4]) + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    exes = [args.a, args.b]
    res = {(e, m): [] for e in exes for m in args.models}
    for r in range(args.rounds):
        for m in args.models:
            for e in (exes if r % 2 == 0 else exes[::-1]):
                res[e, m].append(one(e, m, args.threads, args.runs))
    print(f"{args.threads} threads, {args.rounds} rounds x {args.runs} runs, alternating; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':24s} {'build':28s} {'p50 med us':>10s} {'min us':>8s} "
          f"{'CPU us/run med':>14s} {'min':>9s}")
    for m in args.models:
        for e in exes:
            rows = res[e, m]
            print(f"{os.path.basename(m)[:24]:24s} {e[-28:]:28s} "
                  f"{statistics.median(x[0] for x in rows):10.1f} {min(x[1] for x in rows):8.1f} "
                  f"{statistics.median(x[2] for x in rows):14.1f} {min(x[2] for x in rows):9.1f}")


if __name__ == "__main__":
    main()
