"""Symbolic-shape bundle vs the bundle fully specialized for the same size (issue 12).

    python bench/symbolic_vs_static.py [runs]

Exports the MLP and the encoder layer of tests/test_symbolic_shapes.py once without input
shapes (symbolic batch, sequence) and once per size with them fixed, then times both
alternating in one process, 1 thread: median and min in microseconds, ratio of medians.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_symbolic_shapes import encoder_model, mlp_model  # noqa: E402

from mlcpack.frontends.onnx.importer import import_onnx  # noqa: E402
from mlcpack.packager.export import ExportOptions, export_module  # noqa: E402
from mlcpack.runtime.model import load  # noqa: E402


def _bundle(model, shapes, path: Path):
    mod, _ = import_onnx(model, input_shapes=shapes)
    export_module(mod, path, ExportOptions())
    return load(path, threads=1)


def _time(a, b, feeds: dict, runs: int) -> tuple[float, float, float, float]:
    ta, tb = [], []
    for _ in range(5):
        a.run(feeds), b.run(feeds)
    for _ in range(runs):
        t0 = time.perf_counter()
        a.run(feeds)
        t1 = time.perf_counter()
        b.run(feeds)
        ta.append(t1 - t0)
        tb.append(time.perf_counter() - t1)
    return (float(np.median(ta)) * 1e6, min(ta) * 1e6, float(np.median(tb)) * 1e6,
            min(tb) * 1e6)


def main(runs: int = 200) -> None:
    tmp = Path(tempfile.mkdtemp())
    cases = []
    mlp = _bundle(mlp_model(), None, tmp / "mlp.mlc")
    for n in (1, 17, 64):
        x = np.random.default_rng(n).standard_normal((n, 784)).astype(np.float32)
        cases.append((f"MLP batch {n}", mlp, mlp_model(), {"x": (n, 784)}, {"x": x}))
    enc = _bundle(encoder_model(), None, tmp / "enc.mlc")
    for b, s in ((1, 128), (2, 33), (2, 16)):
        ids = np.random.default_rng(s).integers(0, 50, (b, s)).astype(np.int64)
        pos = np.broadcast_to(np.arange(s, dtype=np.int64), (b, s)).copy()
        cases.append((f"encoder batch {b} seq {s}", enc, encoder_model(),
                      {"ids": (b, s), "positions": (b, s)}, {"ids": ids, "positions": pos}))
    print("| model, size | symbolic median (min) us | static median (min) us | ratio |")
    print("|---|---|---|---|")
    for i, (name, sym, model, shapes, feeds) in enumerate(cases):
        static = _bundle(model, shapes, tmp / f"static{i}.mlc")
        sm, smin, st, stmin = _time(sym, static, feeds, runs)
        print(f"| {name} | {sm:.1f} ({smin:.1f}) | {st:.1f} ({stmin:.1f}) | {sm / st:.2f} |")
        static.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
