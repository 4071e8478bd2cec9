"""The golden check's reference run (``packager/golden.py`` ``prepare_golden``: ONNX Runtime
and the IR's numpy reference) with numpy's BLAS on all its threads (before) and held to one
(``packager/blas_threads.py``, after), alternating in one process on a real model's export.

The model's IR, weights and check options are those ``mlcpack export MODEL`` builds: the
export runs until it would start the reference, which then runs here ``--runs`` times each way
(CPU seconds of this process, BLAS threads included: ``time.process_time``); the export stops
there. Also checks that both ways give the same golden outputs, magnitudes and steps, bit for
bit.

Run: .venv/bin/python bench/golden_blas.py MODEL.onnx [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import numpy as np


class _Captured(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import mlcpack.packager.export as export
    from mlcpack.packager import golden as g
    from mlcpack.packager.blas_threads import blas_threads
    from mlcpack.packager.cli import main as cli_main

    times: dict[str, list[float]] = {"all threads": [], "one thread": []}
    results = {}

    class Run:
        def __init__(self, mod, params, opts, cache_dir=None, cache_max_bytes=0):
            ways = {"all threads": g._prepare_golden, "one thread": g.prepare_golden}
            print(f"OpenBLAS threads: {blas_threads()}")
            for _ in range(args.runs):
                for way, fn in ways.items():
                    t = time.process_time()
                    golden = fn(mod, params, opts)
                    times[way].append(time.process_time() - t)
                    results[way] = golden
            raise _Captured

    export._GoldenRun = Run
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = ["mlcpack", "export", args.model, "-o", f"{tmp}/m.mlc", "--no-cache"]
        try:
            cli_main()
        except (_Captured, SystemExit):
            pass
    if not results:
        sys.exit("the export did not reach the golden check")
    for way, ts in times.items():
        print(f"{way:12s} prepare_golden CPU-s: median {statistics.median(ts):.2f} "
              f"min {min(ts):.2f}  ({', '.join(f'{t:.2f}' for t in ts)})")
    a, b = results["all threads"], results["one thread"]
    same = (a.magnitudes == b.magnitudes and a.steps == b.steps and a.reference == b.reference
            and a.outputs.keys() == b.outputs.keys()
            and all(np.array_equal(a.outputs[k], b.outputs[k], equal_nan=True)
                    for k in a.outputs))
    print(f"reference {a.reference!r}; outputs, magnitudes and steps identical: {same}")
    for k in a.outputs:
        print(f"{k}: magnitude {a.magnitudes.get(k)!r} / {b.magnitudes.get(k)!r}, step "
              f"{a.steps.get(k)!r} / {b.steps.get(k)!r}, output equal "
              f"{np.array_equal(a.outputs[k], b.outputs[k], equal_nan=True)}")


if __name__ == "__main__":
    main()
