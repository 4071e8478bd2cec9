"""int8 vs fp32, mlcpack vs ONNX Runtime, 1 thread, engines alternating in one process.

    .venv/bin/python bench/int8.py [--budget 6]

Models (built here, quantized by onnxruntime.quantization.quantize_static, QDQ, per-channel
weights, uint8 activations, calibrated on 8 random feeds):
  mlp:    x [32,256] -> MatMul 512 + Add, Relu, MatMul 512 + Add, Relu, MatMul 10  (BERT-ish FFN)
  resnet: x [1,16,32,32] -> 3x3 conv 32 + Relu, 3x3 conv 32 + Relu, residual Add, 1x1 conv 64,
          GlobalAveragePool, Gemm 10
Prints median / min microseconds per run for: mlcpack int8, mlcpack fp32, ORT int8, ORT fp32.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


def _save(nodes, x_shape, y_shape, inits, path: Path) -> Path:
    graph = h.make_graph(nodes, path.stem, [h.make_tensor_value_info("x", T.FLOAT, x_shape)],
                         [h.make_tensor_value_info("y", T.FLOAT, y_shape)],
                         [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def mlp(path: Path) -> Path:
    rng = np.random.default_rng(0)
    f = lambda *s: (rng.normal(0, 1, s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Add", ["m1", "b1"], ["a1"]),
             h.make_node("Relu", ["a1"], ["r1"]),
             h.make_node("MatMul", ["r1", "w2"], ["m2"]), h.make_node("Add", ["m2", "b2"], ["a2"]),
             h.make_node("Relu", ["a2"], ["r2"]), h.make_node("MatMul", ["r2", "w3"], ["y"])]
    inits = {"w1": f(256, 512), "b1": np.zeros(512, np.float32), "w2": f(512, 512),
             "b2": np.zeros(512, np.float32), "w3": f(512, 10)}
    return _save(nodes, [32, 256], [32, 10], inits, path)


def resnet(path: Path) -> Path:
    rng = np.random.default_rng(1)
    f = lambda *s: (rng.normal(0, 1, s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)  # noqa
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c2"], ["r2"]), h.make_node("Add", ["r1", "r2"], ["a"]),
             h.make_node("Conv", ["a", "w3", "b3"], ["c3"]),
             h.make_node("GlobalAveragePool", ["c3"], ["g"]), h.make_node("Flatten", ["g"], ["fl"]),
             h.make_node("Gemm", ["fl", "wf", "bf"], ["y"], transB=1)]
    inits = {"w1": f(32, 16, 3, 3), "b1": np.zeros(32, np.float32), "w2": f(32, 32, 3, 3),
             "b2": np.zeros(32, np.float32), "w3": f(64, 32, 1, 1), "b3": np.zeros(64, np.float32),
             "wf": f(10, 64), "bf": np.zeros(10, np.float32)}
    return _save(nodes, [1, 16, 32, 32], [1, 10], inits, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of timing per model")
    args = ap.parse_args()

    import onnxruntime as ort

    import quant_models as qm
    from bench import time_interleaved
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    tmp = Path(tempfile.mkdtemp(prefix="int8bench"))
    for name, build in (("mlp", mlp), ("resnet", resnet)):
        fp32 = build(tmp / f"{name}.onnx")
        int8 = qm.ort_quantize(fp32, tmp / f"{name}_int8.onnx", "QDQ", per_channel=True)
        feeds = qm.random_feeds(fp32)[0]
        fns, labels, models = [], [], []
        for label, path in (("mlcpack int8", int8), ("mlcpack fp32", fp32)):
            mod, _ = import_onnx(str(path))
            out = tmp / f"{path.stem}.mlc"
            export_module(mod, out, ExportOptions(target="host", check=False))
            m = load(out, threads=1)
            models.append(m)
            fns.append(lambda m=m, feeds=feeds: m.run(feeds))
            labels.append(label)
        for label, path in (("ORT int8", int8), ("ORT fp32", fp32)):
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            fns.append(lambda s=s, feeds=feeds: s.run(None, feeds))
            labels.append(label)
        ref = fns[2]()[0]
        got = fns[0]()["y"]
        step = qm.output_step(int8)
        print(f"{name}: mlcpack int8 vs ORT int8 max |diff| {np.abs(got - ref).max():.3g} "
              f"(output step {step:.3g})")
        for label, (med, mn, n) in zip(labels, time_interleaved(fns, args.budget)):
            print(f"  {label:14s} median {med:9.1f} us   min {mn:9.1f} us   ({n} runs)")
        for m in models:
            m.close()


if __name__ == "__main__":
    main()
