"""Weights stored as 8-bit integers (format 1.5) against the same model's float32-stored bundle:
file size, load time (open + first run) and run time, 1 thread, the two bundles alternating in
one process (medians and minimums, ms).

    python bench/stored_int8.py STORED.mlc FLOAT.mlc [--runs 30] [--input-shape 1,1,64,160]

The float bundle is the same model exported by a build without stored constants (e.g. main
before format 1.5); both must take the same inputs."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from mlcpack.runtime import load


def _feeds(model, shape: tuple[int, ...] | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for s in model.inputs:
        dims = shape or tuple(d if isinstance(d, int) else 1 for d in s.dims)
        out[s.name] = rng.random(dims, dtype=np.float32).astype(s.dtype)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stored")
    ap.add_argument("float")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--loads", type=int, default=7)
    ap.add_argument("--input-shape", default=None)
    args = ap.parse_args()
    shape = tuple(int(v) for v in args.input_shape.split(",")) if args.input_shape else None
    paths = {"stored": args.stored, "float": args.float}
    load_ms: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(args.loads):
        for name, path in paths.items():
            t = time.perf_counter()
            with load(path, threads=1) as m:
                m.run(_feeds(m, shape))
            load_ms[name].append((time.perf_counter() - t) * 1e3)
    models = {k: load(p, threads=1) for k, p in paths.items()}
    feeds = _feeds(models["stored"], shape)
    outs = {k: m.run(feeds) for k, m in models.items()}
    same = all(np.array_equal(outs["stored"][n], outs["float"][n]) for n in outs["float"])
    run_ms: dict[str, list[float]] = {k: [] for k in paths}
    cpu_ms: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(args.runs):
        for name, m in models.items():
            t, c = time.perf_counter(), time.process_time()
            m.run(feeds)
            run_ms[name].append((time.perf_counter() - t) * 1e3)
            cpu_ms[name].append((time.process_time() - c) * 1e3)
    print(f"outputs bit-identical: {same}")
    print(f"{'bundle':8} {'MB':>8} {'load+1st med/min':>18} {'run med/min':>16} {'run CPU med':>12}")
    for name, path in paths.items():
        print(f"{name:8} {os.path.getsize(path) / 1e6:8.2f} "
              f"{statistics.median(load_ms[name]):8.1f}/{min(load_ms[name]):8.1f} "
              f"{statistics.median(run_ms[name]):7.2f}/{min(run_ms[name]):7.2f} "
              f"{statistics.median(cpu_ms[name]):12.2f}")
    for m in models.values():
        m.close()


if __name__ == "__main__":
    main()
