"""ResNet-18 (bench/'s model) against numpy's one-core sgemm: the GFLOP/s of a whole mlcpack
inference beside those of numpy's float32 matrix product (OpenBLAS or whatever numpy links, held
to one thread) on square matrices, alternating in one process, 1 thread.

Run: .venv/bin/python bench/sgemm.py [--budget SECONDS] [--sizes 512,1024,2048]
Prints each engine's median and best GFLOP/s and mlcpack's share of numpy's best size. The
ResNet-18 ONNX file and bundle are bench.py's (bench/.cache; built and exported if missing).
"""

from __future__ import annotations

import os

# numpy's BLAS reads its thread count when it loads: one core, as the target says
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench import CACHE, onnx_flops, time_interleaved  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=6.0,
                    help="seconds of alternating runs per matrix size")
    ap.add_argument("--sizes", default="512,1024,2048", help="square sgemm sizes")
    args = ap.parse_args()

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import export_module
    from mlcpack.runtime import load

    path = os.path.join(CACHE, "resnet18.onnx")
    bundle = os.path.join(CACHE, "resnet18.mlc")
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        from models import build
        build("resnet18", path)
    if not os.path.exists(bundle) or os.path.getmtime(bundle) < os.path.getmtime(path):
        mod, _ = import_onnx(path)
        export_module(mod, bundle)
    flops = onnx_flops(path)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    rng = np.random.default_rng(1)
    print(f"ResNet-18: {flops / 1e9:.3f} GFLOP per inference; numpy {np.__version__}, 1 thread")
    best_numpy = 0.0
    with load(bundle, threads=1) as model:
        feeds = {model.inputs[0].name: x}
        for n in (int(s) for s in args.sizes.split(",")):
            a = rng.standard_normal((n, n)).astype(np.float32)
            b = rng.standard_normal((n, n)).astype(np.float32)
            (s_med, s_min, _), (m_med, m_min, runs) = time_interleaved(
                [lambda a=a, b=b: a @ b, lambda: model.run(feeds)], args.budget)
            g = 2.0 * n ** 3 / 1e3   # GFLOP/s from microseconds
            best_numpy = max(best_numpy, g / s_med)
            print(f"sgemm {n:5d}: numpy {g / s_med:6.1f} GFLOP/s (best {g / s_min:6.1f}) | "
                  f"ResNet-18 {flops / 1e3 / m_med:6.1f} (best {flops / 1e3 / m_min:6.1f}) "
                  f"= {flops / 1e3 / m_med / (g / s_med) * 100:5.1f} % of this size's median "
                  f"({runs} runs)")
    print(f"numpy's best size (median): {best_numpy:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
