"""Two or more bundles of one model side by side in thread CPU time: ``bench/task_cpu.py``'s
shim (each kernel task's ``CLOCK_THREAD_CPUTIME_ID`` inside the real pool) on each bundle in
turn, round after round, so that all see the same host load.

Run: .venv/bin/python bench/task_cpu_ab.py A.mlc B.mlc [...] [--rounds 3] [--runs 40] [--top 14]

Per bundle: the 1-thread work and the 2-thread critical path by home ranges (ms; median and
min over runs, and the sums of the per-call medians and minima), the 2-thread work. Then, for
bundles with the same kernel calls as the first, the calls whose 2-thread path moved most
against the first bundle's, with their 1-thread work. Thread CPU time leaves out the time a
thread waits descheduled, so on a loaded host this still compares what the kernels and their
splits cost (a wall-clock A/B there swings more than the bundles differ).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import task_cpu  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shim = task_cpu.build_shim(Path(tmp))
        one = {b: [] for b in args.bundles}
        two = {b: [] for b in args.bundles}
        names, ntasks = {}, {}
        for _ in range(args.rounds):
            for b in args.bundles:
                c1, names[b], _ = task_cpu.measure(b, 1, args.runs, shim)
                c2, _, ntasks[b] = task_cpu.measure(b, 2, args.runs, shim)
                one[b].append(c1)
                two[b].append(c2)
    res = {}
    for b in args.bundles:
        c1, c2 = np.concatenate(one[b]), np.concatenate(two[b])
        w1, w2 = c1.sum(2), c2.sum(2)
        home = task_cpu.home_path(c2, ntasks[b], 2)
        res[b] = (w1, home)
        print(f"{b}: 1-thread work {np.median(w1.sum(1)) / 1e3:.3f} / {w1.sum(1).min() / 1e3:.3f}"
              f" (median / min); 2-thread path {np.median(home.sum(1)) / 1e3:.3f} / "
              f"{home.sum(1).min() / 1e3:.3f}, per-call medians {np.median(home, 0).sum() / 1e3:.3f}"
              f" / minima {home.min(0).sum() / 1e3:.3f}; 2-thread work "
              f"{np.median(w2.sum(1)) / 1e3:.3f} ms")
    a = args.bundles[0]
    for b in args.bundles[1:]:
        if names[a] != names[b]:
            print(f"{b}: other kernel calls than {a}; no per-call comparison")
            continue
        print(f"calls whose 2-thread path moved most, {a} -> {b} (us, medians; 1-thread work)")
        ha, hb = np.median(res[a][1], 0), np.median(res[b][1], 0)
        oa, ob = np.median(res[a][0], 0), np.median(res[b][0], 0)
        for k in np.argsort(-np.abs(hb - ha))[:args.top]:
            print(f"  {k:4d} path {ha[k]:8.1f} -> {hb[k]:8.1f}   1 thread {oa[k]:8.1f} -> "
                  f"{ob[k]:8.1f}  {names[a][k][:48]}")


if __name__ == "__main__":
    main()
