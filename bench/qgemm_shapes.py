"""Time the ``qmatmul`` kernel (codegen/qgemm.py) alone at given shapes, int8 and int16 packed
weights, float32 output (the shape of ddddocr_int8's vocabulary projection by default:
M 20, K 1024, N 8210).

Run: .venv/bin/python bench/qgemm_shapes.py [M K N ...] [--threads 1] [--wide] [--runs 200]
Prints median / min ms (process CPU time at 1 thread, wall otherwise) and GOP/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from helpers import build_op_module  # noqa: E402
from mlcpack.packager.export import ExportOptions, export_module  # noqa: E402
from mlcpack.packager.ops.qlinear import pack_weights  # noqa: E402
from mlcpack.runtime import load  # noqa: E402


def case(m: int, k: int, n: int, wide: bool, rng):
    x = rng.integers(0, 256, (m, k)).astype(np.uint8)
    lim = 255 if wide else 127
    wd = rng.integers(-lim, lim + 1, (k, n))
    wp = pack_weights(wd)
    npn = wp.shape[0] * 8
    args = [x, wp, np.array(128, np.int32), np.zeros(npn, np.int32),
            np.full(npn, 1e-3, np.float32), np.zeros(npn, np.float32)]
    return args, wd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dims", nargs="*", type=int, default=[20, 1024, 8210])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wide", action="store_true")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--cold", action="store_true",
                    help="write 64 MB between runs (untimed), as the rest of a model would")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for i in range(0, len(a.dims), 3):
        m, k, n = a.dims[i:i + 3]
        args, wd = case(m, k, n, a.wide, rng)
        mod = build_op_module("qmatmul", args, [False, True, True, True, True, True],
                              n=n, dtype="float32")
        with tempfile.TemporaryDirectory() as td:
            path = Path(td) / "q.mlc"
            export_module(mod, path, ExportOptions(target="host"))
            with load(path, threads=a.threads) as model:
                feeds = {"x0": args[0]}
                y = model.run(feeds)["y"]
                ref = ((args[0].astype(np.int64) - 128) @ wd).astype(np.int32).astype(
                    np.float32) * np.float32(1e-3)
                assert np.array_equal(y, ref), float(np.abs(y - ref).max())
                clock = time.process_time if a.threads == 1 else time.perf_counter
                ts = []
                junk = np.zeros(1 << 24, np.float32)
                for _ in range(a.runs):
                    if a.cold:
                        junk += 1.0
                    t0 = clock()
                    model.run(feeds)
                    ts.append(clock() - t0)
        med, mn = np.median(ts) * 1e3, np.min(ts) * 1e3
        print(f"M={m} K={k} N={n} {'int16' if a.wide else 'int8'} w: median {med:.3f} ms  "
              f"min {mn:.3f} ms  {m * k * n / mn / 1e6:.1f} GOP/s (min)")


if __name__ == "__main__":
    main()
