"""fp32 vs ``--precision bf16`` bundles, 1 thread, alternating in one process.

    .venv/bin/python bench/bf16.py [--budget 6] [--models mlp,resnet_small,resnet18]

Models (bench/int8.py's, and ``mlp@ROWS``: the MLP at that many rows): mlp (x [32,256],
256-512-512-10), resnet_small (3x3 convs 16->32->32, a residual Add, a 1x1 conv, a Gemm),
resnet18 (bench/models.py, random weights, 1x3x224x224). Each is exported with ``--target host``
in fp32 and in bf16 (docs/precision.md: on a host with avx512_bf16 the matmul and convolution
weights in bf16 pairs, vdpbf16ps; without it, matmuls of at most 2 rows in bf16, widened, the
rest fp32). Rows: median and min ms per run (bench.time_interleaved: the engines alternate),
least CPU time of a run, the bundle size, the weights' size, and the bf16 bundle's error
against the fp32 bundle (max |diff| over the output's scale). Print the host's CPU flags beside
the numbers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


WIDEN_ALL = False   # --widen-all: every packed matmul in bf16 (how BF16_WIDEN_MAX_ROWS was set)


def _export(path: Path, out: Path, precision: str):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions

    mod, _ = import_onnx(str(path))
    return export_module(mod, out, ExportOptions(
        target="host", precision=precision, compile=CompileOptions(bf16_widen_all=WIDEN_ALL)))


def _flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                      if ln.startswith("flags")), []))
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"]
    return ", ".join(f"{f}{'' if f in flags else ' (no)'}" for f in wanted)


def mlp_rows(path: Path, rows: int, dims=(256, 512, 512, 10)) -> Path:
    """bench/int8.py's MLP (MatMul + Add + ReLU, 256-512-512-10) at ``rows`` rows: where the
    bf16 matmul on AVX2 turns from weight-bound (half the bytes) to compute-bound (the widening
    beside the FMAs); ``mlp@ROWS`` on the command line."""
    import onnx
    from onnx import TensorProto
    from onnx import helper as h

    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i, (k, n) in enumerate(zip(dims[:-1], dims[1:])):
        w = (rng.normal(0, 1, (k, n)) / np.sqrt(k)).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(w, f"w{i}"),
                  onnx.numpy_helper.from_array(np.zeros(n, np.float32), f"b{i}")]
        nodes += [h.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  h.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < len(dims) - 2:
            nodes.append(h.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    graph = h.make_graph(nodes, "mlp",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [rows, dims[0]])],
                         [h.make_tensor_value_info(x, TensorProto.FLOAT, [rows, dims[-1]])],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def bench_model(name: str, tmp: Path, budget: float) -> None:
    from int8 import BUILDERS, _cpu_min

    from bench import time_interleaved
    from mlcpack.runtime import load

    if name.startswith("mlp@"):
        src = mlp_rows(tmp / f"mlp{name[4:]}.onnx", int(name[4:]))
    else:
        src = BUILDERS[name](tmp / f"{name}.onnx")
    reports = {p: _export(src, tmp / f"{name}_{p}.mlc", p) for p in ("fp32", "bf16")}
    print(f"{name}: {reports['bf16'].precision_note}")
    models = {p: load(r.path, threads=1) for p, r in reports.items()}
    spec = models["fp32"].inputs[0]
    feed = {spec.name: np.random.default_rng(3).standard_normal(spec.shape).astype(np.float32)}
    outs = {p: list(m.run(feed).values())[0] for p, m in models.items()}
    scale = float(np.abs(outs["fp32"]).max()) or 1.0
    fns = [lambda m=m: m.run(feed) for m in models.values()]
    res = time_interleaved(fns, budget)
    cpu = [_cpu_min(fn, 5) for fn in fns]
    for (p, r), (med, mn, n), c in zip(reports.items(), res, cpu):
        err = float(np.abs(outs[p] - outs["fp32"]).max()) / scale
        print(f"  {p:5s} median {med / 1e3:8.3f} ms  min {mn / 1e3:8.3f} ms  cpu {c / 1e3:8.3f} "
              f"ms | x{res[0][1] / mn:4.2f} of fp32 (min) | bundle {r.bundle_bytes / 1e6:6.2f} MB"
              f"  weights {r.weights_bytes / 1e6:6.2f} MB | error vs fp32 {100 * err:.3f} % of "
              f"scale | {n} runs")
    for m in models.values():
        m.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=6.0, help="seconds per model")
    ap.add_argument("--models", default="mlp,resnet_small,resnet18")
    ap.add_argument("--widen-all", action="store_true",
                    help="without avx512_bf16, matmuls of any row count in bf16 too (widened)")
    args = ap.parse_args()
    global WIDEN_ALL
    WIDEN_ALL = args.widen_all
    print(f"host CPU flags: {_flags()}; 1 thread")
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            bench_model(name, Path(d), args.budget)


if __name__ == "__main__":
    main()
