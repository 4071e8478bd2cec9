"""`infer` over many inputs: 2,000 PNGs of sklearn's digits (28x28, as artifacts/make_artifacts.py
writes them) through the demo MLP (batch plans 1,8,32), one process, alternating nothing (each
mode runs over the whole folder once per round; medians of --rounds).

    .venv/bin/python bench/many.py [--n 2000] [--rounds 3] [--no-ray]

Modes: a plain loop calling the Python API (load_input + Model.run per file, 1 thread); the same
loop with ONNX Runtime (artifacts/mlp.onnx, 1 intra-op thread, same decode); `infer` (many.py:
batches of 32, decode overlapped) with --threads 1 and 2; Ray Data with 1 and 2 local actors
(ray.init(num_cpus=2) once, its start-up not counted). Prints items/s, the scaling 2 vs 1 and
the per-item overhead (time per item minus the model's own time per item at batch 32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT.parent))


def write_pngs(folder: Path, n: int) -> list[str]:
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    out = []
    for i in range(n):
        im = digits.images[i % len(digits.images)]
        small = np.round(im * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
        p = folder / f"d{i:05d}.png"
        Image.fromarray(small).resize((28, 28), Image.BILINEAR).save(p)
        out.append(str(p))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-ray", action="store_true")
    a = ap.parse_args()
    from mlcpack.runtime.many import infer_many
    from mlcpack.runtime.model import load
    from mlcpack.runtime.preprocess import load_input

    tmp = Path(tempfile.mkdtemp(prefix="mlcpack-many-"))
    files = write_pngs(tmp, a.n)
    bundle = tmp / "mlp.mlc"
    subprocess.run([sys.executable, "-m", "mlcpack.packager.cli", "export",
                    str(ROOT / "artifacts" / "mlp_params.pkl"), "--labels",
                    str(ROOT / "artifacts" / "labels.txt"), "--batch-sizes", "1,8,32", "-o",
                    str(bundle)], check=True, capture_output=True)
    times: dict[str, list[float]] = {}

    def timed(name, fn):
        t = time.perf_counter()
        fn()
        times.setdefault(name, []).append(time.perf_counter() - t)

    m = load(bundle, threads=1)
    spec = m.inputs[0]

    def api_loop():
        for f in files:
            m.run({spec.name: load_input(f, spec, m.preprocess)})

    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(ROOT / "artifacts" / "mlp.onnx"), so)
    oname = sess.get_inputs()[0].name

    def ort_loop():
        for f in files:
            x = load_input(f, spec, m.preprocess)
            sess.run(None, {oname: x.reshape([d if isinstance(d, int) else 1
                                              for d in sess.get_inputs()[0].shape])})

    def decode_only():
        for f in files:
            load_input(f, spec, m.preprocess)

    xb = np.concatenate([load_input(f, spec, m.preprocess) for f in files[:32]])

    def compute_only():
        for _ in range(len(files) // 32):
            m.run({spec.name: xb})

    def many(threads):
        return lambda: infer_many(bundle, [str(tmp / "d*.png")], output=str(tmp / "r.jsonl"),
                                  threads=threads, progress=False, warn=lambda s: None)

    ray = None
    if not a.no_ray:
        import logging

        import ray
        import ray.data
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        logging.getLogger("ray.data").setLevel(logging.ERROR)

    def on_ray(workers):
        return lambda: infer_many(bundle, [str(tmp / "d*.png")], output=str(tmp / "ray.jsonl"),
                                  ray="", workers=workers, threads=1, progress=False,
                                  warn=lambda s: None)

    modes = [("decode only (PIL + preprocessing)", decode_only),
             ("model only, batch 32, 1 thread", compute_only),
             ("Python API loop, 1 thread", api_loop), ("ORT loop, 1 thread", ort_loop),
             ("infer --threads 1", many(1)), ("infer --threads 2", many(2))]
    if ray is not None:
        modes += [("Ray, 1 worker", on_ray(1)), ("Ray, 2 workers", on_ray(2))]
    for _ in range(a.rounds):
        for name, fn in modes:
            timed(name, fn)
    comp = statistics.median(times["model only, batch 32, 1 thread"]) / (len(files) // 32 * 32)
    print(f"{a.n} PNGs 28x28, demo MLP (784-...-10), {os.cpu_count()} CPUs, median of "
          f"{a.rounds}")
    print(f"{'mode':36s} {'items/s':>9s} {'us/item':>9s} {'overhead us/item':>17s}")
    for name, _ in modes:
        t = statistics.median(times[name])
        per = t / (len(files) if "model only" not in name else len(files) // 32 * 32)
        print(f"{name:36s} {1 / per:9.0f} {per * 1e6:9.1f} {(per - comp) * 1e6:17.1f}")
    r = statistics.median
    one, two = r(times["infer --threads 1"]), r(times["infer --threads 2"])
    print(f"scaling infer 2 vs 1 threads: {one / two:.2f}x")
    if ray is not None:
        print(f"scaling Ray 2 vs 1 workers: {r(times['Ray, 1 worker']) / r(times['Ray, 2 workers']):.2f}x")
        ray.shutdown()


if __name__ == "__main__":
    main()
