"""Whole-model times of bundles and ONNX files, 1 thread, engines alternating in one process:
CPU time (process time) per run, min and median, and wall min and median.

    .venv/bin/python bench/int8_mixed.py --rounds 30 \
        fp32=r18.mlc int8=r18_int8.mlc qdq=r18_qdq.mlc ort32=resnet18.onnx ortq=r18_qdq.onnx

Each argument is ``LABEL=PATH``: a ``.mlc`` bundle (mlcpack's Python runtime, 1 thread) or an
``.onnx`` file (ONNX Runtime, CPU provider, 1 intra-op and 1 inter-op thread). Every engine
runs the same seeded normal input of the first model's input shape. Each round runs every
engine once, in order; the order rotates every round so none always follows another. The
first label is the baseline of the ratio columns; ``--vs LABEL`` adds a second ratio column.
Runs single-threaded, so CPU time leaves out the slices other jobs took on a loaded machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def _engine(path: Path, shape_of: dict):
    if path.suffix == ".onnx":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        inp = s.get_inputs()[0]
        shape_of.setdefault("shape", [d if isinstance(d, int) else 1 for d in inp.shape])
        return lambda x: s.run(None, {inp.name: x})[0]
    from mlcpack.runtime import load

    m = load(path, threads=1)
    name = m.inputs[0].name
    shape_of.setdefault("shape", list(m.inputs[0].shape))
    return lambda x: next(iter(m.run({name: x}).values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engines", nargs="+", metavar="LABEL=PATH")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--vs", default=None, help="a label for a second ratio column")
    args = ap.parse_args()
    labels, fns = [], []
    shape_of: dict = {}
    for spec in args.engines:
        label, _, path = spec.partition("=")
        if not path:
            ap.error(f"{spec!r}: expected LABEL=PATH")
        labels.append(label)
        fns.append(_engine(Path(path), shape_of))
    x = np.random.default_rng(5).normal(0, 1, shape_of["shape"]).astype(np.float32)
    outs = [np.asarray(f(x), np.float32) for f in fns]    # warm-up, and the outputs compared
    cpu = [[] for _ in fns]
    wall = [[] for _ in fns]
    n = len(fns)
    for r in range(args.rounds):
        for j in range(n):
            i = (j + r) % n
            t0, c0 = time.perf_counter(), time.process_time()
            fns[i](x)
            c1, t1 = time.process_time(), time.perf_counter()
            cpu[i].append(c1 - c0)
            wall[i].append(t1 - t0)
    base = np.median(cpu[0])
    vs = labels.index(args.vs) if args.vs else None
    vs_head = f"  engine / {args.vs} (cpu med, min)" if vs is not None else ""
    print(f"{'engine':10s} {'cpu min':>8s} {'cpu med':>8s} {'wall min':>8s} {'wall med':>8s}"
          f"  {labels[0]} / engine (cpu med){vs_head}  max |y - {labels[0]}|")
    for i, label in enumerate(labels):
        c, w = np.array(cpu[i]) * 1e3, np.array(wall[i]) * 1e3
        line = (f"{label:10s} {c.min():8.2f} {np.median(c):8.2f} {w.min():8.2f} {np.median(w):8.2f}"
                f"  x{base / np.median(cpu[i]):5.3f}")
        if vs is not None:
            line += (f"  {np.median(cpu[i]) / np.median(cpu[vs]):5.3f}, "
                     f"{min(cpu[i]) / min(cpu[vs]):5.3f}")
        line += f"  {np.abs(outs[i] - outs[0]).max():.4g}"
        print(line)
    print(f"{args.rounds} rounds, ms per run, 1 thread")


if __name__ == "__main__":
    main()
