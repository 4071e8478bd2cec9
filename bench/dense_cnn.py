"""Whole dense CNNs against the best fp32 peer, on a loaded machine: each ONNX model's bundles
(one or several builds, e.g. before / after a kernel change) beside ONNX Runtime and OpenVINO
f32 (bench/peers.py), at 1 and 2 threads, alternating in one process.

Run: .venv/bin/python bench/dense_cnn.py MODEL.onnx=A.mlc[,B.mlc] ... [--threads 1,2]
                                         [--budget 6] [--shape NAME=1,3,320,320]
Per model and thread count the engines run in turn, blocks of 0.2 s each (bench.py's
``wait_quiet`` before each block, its first run dropped), for about ``--budget`` seconds. Per
run both the wall time and the process's CPU time are kept: on a shared machine a 1-thread run
that loses its core for a while takes longer on the wall clock but not in CPU time, so at 1
thread the CPU time's min and median are what the ratios use (ORT, OpenVINO and mlcpack each
run one thread there; OpenVINO's single worker included, as process time). At 2 threads the
CPU time adds both threads' work, so the ratios use the wall time. Ratios are a bundle's time
over the best fp32 peer's (min over min, median over median).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import wait_quiet  # noqa: E402


def timed(fns: list, budget_s: float, block_s: float = 0.2, min_runs: int = 5) -> list:
    """Per fn: (wall list, CPU list) in seconds, blocks alternating (see the docstring)."""
    runs = [([], []) for _ in fns]
    spent = 0.0
    while min(len(r[0]) for r in runs) < min_runs or spent < budget_s:
        for fn, (wall, cpu) in zip(fns, runs):
            wait_quiet()
            fn()
            start = time.perf_counter()
            while True:
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                t1 = time.perf_counter()
                cpu.append(time.process_time() - c0)
                wall.append(t1 - t0)
                if t1 >= start + block_s:
                    break
            spent += t1 - start
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", help="MODEL.onnx=BUNDLE.mlc[,BUNDLE.mlc...]")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--budget", type=float, default=6.0)
    ap.add_argument("--shape", action="append", default=[], help="NAME=DIMS for dynamic inputs")
    args = ap.parse_args()

    import onnx

    import peers
    from mlcpack.runtime import load

    shapes = {s.split("=")[0]: [int(d) for d in s.split("=")[1].split(",")] for s in args.shape}
    print(f"OpenVINO {peers.openvino_version() or 'not installed'}; times in ms")
    print("| model | threads | engine | CPU min | CPU median | wall min | wall median | "
          "/best peer (min) | /best peer (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.specs:
        path, _, bundles = spec.partition("=")
        graph = onnx.load(path, load_external_data=False).graph
        inits = {i.name for i in graph.initializer}
        rng = np.random.default_rng(0)
        feeds = {}
        for i in graph.input:
            if i.name in inits:
                continue
            dims = shapes.get(i.name) or [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = rng.random(dims, dtype=np.float32)
        for threads in (int(t) for t in args.threads.split(",")):
            engines = [peers.ort_engine(Path(path), feeds, threads)]
            engines += [e for e in peers.openvino_engines(Path(path), feeds, threads) if e.fp32]
            names = [e.label for e in engines]
            fns = [e.run for e in engines]
            models = []
            for b in bundles.split(","):
                m = load(b, threads=threads)
                models.append(m)
                names.append(f"mlcpack {Path(b).stem}")
                fns.append(lambda m=m, feeds=feeds: m.run(feeds))
            runs = timed(fns, args.budget)
            use = 1 if threads == 1 else 0     # CPU time at 1 thread, wall time at 2
            stats = [(min(r[use]), float(np.median(r[use]))) for r in runs]
            n_peers = len(engines)
            best_min = min(s[0] for s in stats[:n_peers])
            best_med = min(s[1] for s in stats[:n_peers])
            for name, (wall, cpu), (s_min, s_med) in zip(names, runs, stats):
                ratio = "" if name in [e.label for e in engines] else \
                    f"{s_min / best_min:.2f} | {s_med / best_med:.2f}"
                print(f"| {Path(path).stem} | {threads} | {name} | {1e3 * min(cpu):.2f} | "
                      f"{1e3 * np.median(cpu):.2f} | {1e3 * min(wall):.2f} | "
                      f"{1e3 * np.median(wall):.2f} | {ratio or ' | '} |", flush=True)
            for m in models:
                m.close()


if __name__ == "__main__":
    main()
