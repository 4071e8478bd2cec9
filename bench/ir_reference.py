"""The golden check's IR reference (``packager/golden.py`` ``evaluate_ir``, numpy) on a
DNSMOS-shaped convolution network: 144160 audio samples -> a learned STFT (two 1-D
convolutions, 161 bins, window 320, hop 160) -> log power -> 3x3 convolutions 1 -> 128 -> 64 ->
64 -> 32 with max pooling -> global max -> dense layers. Without onnxruntime the check runs
this reference beside the compile (issue 36: ~110 s on the real DNSMOS sig_bak_ovr).

Each run is a fresh process (``python -c``) timing ``evaluate_ir`` alone (CPU seconds, its
BLAS threads included); with ``--other DIR`` (a folder holding another ``mlcpack``, e.g.
``git archive main | tar -x -C /tmp/base/mlcpack``) the two checkouts alternate.

Run: .venv/bin/python bench/ir_reference.py [--other /tmp/base] [--runs 3] [--samples 144160]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def dnsmos_like(samples: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        scale = 1.0 / np.sqrt(np.prod(shape[1:]))
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale)
                                             .astype(np.float32), name))
        return name

    inits.append(numpy_helper.from_array(np.array([1, 1, samples], np.int64), "shape"))
    nodes.append(helper.make_node("Reshape", ["audio", "shape"], ["wave"]))
    for part in ("re", "im"):
        nodes.append(helper.make_node("Conv", ["wave", weight(f"stft_{part}", (161, 1, 320))],
                                      [part], strides=[160]))
        nodes.append(helper.make_node("Mul", [part, part], [f"{part}2"]))
    nodes += [helper.make_node("Add", ["re2", "im2"], ["power"]),
              helper.make_node("Add", ["power", "eps"], ["power_eps"]),
              helper.make_node("Log", ["power_eps"], ["logpow"]),
              helper.make_node("Unsqueeze", ["logpow", "axis1"], ["spec"])]
    inits += [numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
              numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    x, channels = "spec", 1
    for i, out in enumerate((128, 64, 64, 32)):
        nodes.append(helper.make_node("Conv", [x, weight(f"w{i}", (out, channels, 3, 3)),
                                               weight(f"b{i}", (out,))], [f"c{i}"],
                                      pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x, channels = f"r{i}", out
        if i in (1, 2):
            nodes.append(helper.make_node("MaxPool", [x], [f"p{i}"], kernel_shape=[2, 2],
                                          strides=[2, 2]))
            x = f"p{i}"
    nodes += [helper.make_node("GlobalMaxPool", [x], ["g"]),
              helper.make_node("Flatten", ["g"], ["flat"]),
              helper.make_node("Gemm", ["flat", weight("d0", (64, 32)), weight("e0", (64,))],
                               ["h"], transB=1),
              helper.make_node("Relu", ["h"], ["hr"]),
              helper.make_node("Gemm", ["hr", weight("d1", (3, 64)), weight("e1", (3,))],
                               ["mos"], transB=1)]
    graph = helper.make_graph(nodes, "dnsmos_like",
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT,
                                                             [1, samples])],
                              [helper.make_tensor_value_info("mos", TensorProto.FLOAT, [1, 3])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


RUN = """
import sys, time
import numpy as np
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.golden import evaluate_ir
mod, _ = import_onnx(sys.argv[1])
x = np.random.default_rng(0).standard_normal(mod.main.params[0].type.shape).astype(np.float32)
t = time.process_time()
out = evaluate_ir(mod, {mod.main.params[0].name: x}, None, {}, {})
print(time.process_time() - t, *np.asarray(list(out.values())[0]).ravel())
"""


def run(model: Path, pythonpath: str | None) -> tuple[float, list[float]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", RUN, str(model)], capture_output=True,
                         text=True, env=env, cwd=model.parent, check=True).stdout.split()
    return float(out[0]), [float(v) for v in out[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", default=None, help="directory holding another mlcpack package")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=144160)
    args = ap.parse_args()
    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags")
                    for f in line.split() if f.startswith(("avx2", "avx512", "fma"))})
    print(f"host flags: {' '.join(flags)}; {os.cpu_count()} CPUs; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.samples} samples")
    who = ([("other", args.other)] if args.other else []) + [("this", None)]
    times: dict[str, list[float]] = {w: [] for w, _ in who}
    outputs = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "dnsmos_like.onnx"
        onnx.save(dnsmos_like(args.samples), model)
        for _ in range(args.runs):
            for w, path in who:
                seconds, outputs[w] = run(model, path)
                times[w].append(seconds)
    for w, _ in who:
        print(f"{w:5s}: evaluate_ir CPU s median {statistics.median(times[w]):.2f}, min "
              f"{min(times[w]):.2f} over {args.runs}; output {outputs[w]}")
    if args.other:
        print(f"this / other (median CPU): "
              f"{statistics.median(times['this']) / statistics.median(times['other']):.2f}; "
              f"largest output difference {np.max(np.abs(np.subtract(*outputs.values()))):.3g}")


if __name__ == "__main__":
    main()
