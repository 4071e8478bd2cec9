"""Single-operator models with run-time sizes against the same models fully specialized, and
ONNX Runtime: max pools, convolutions + SiLU (1x1 and 3x3, YOLOv8n's at 320x320), a
three-scale concat (issue 12: the symbolic kernels' cost over the static ones).

    python bench/symbolic_kernels.py [rounds] [pool|conv|concat|all]

Each case is exported twice (H and W symbolic; then with every size fixed), and the three
engines run alternating, 1 thread, timed in CPU time (``time.process_time``: steadier than
wall time on a shared machine); median and min of ``rounds`` rounds, in microseconds per run
(each round runs enough calls for a few milliseconds), and the symbolic / static ratio of
medians. A run is the whole ``Model.run`` call: its per-call overhead is included. Then the
kernels alone (each VM instruction's minimum over the rounds, ``Model.profile``) of both
bundles, and their ratio.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime.model import load

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT

# (channels, H = W, kernel, stride, pad)
POOLS = [(64, 112, 3, 2, 1), (128, 20, 5, 1, 2), (256, 10, 5, 1, 2), (32, 75, 3, 2, 1),
         (16, 160, 2, 2, 0)]
# (in, out, kernel, stride, H = W)
CONVS = [(3, 16, 3, 2, 320), (16, 32, 3, 2, 160), (64, 64, 3, 1, 40), (64, 64, 1, 1, 40),
         (128, 128, 1, 1, 20), (256, 256, 1, 1, 10), (512, 256, 1, 1, 10), (128, 256, 3, 2, 20)]


def _pool(c: int, k: int, s: int, p: int):
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s],
                            pads=[p] * 4)
    graph = helper.make_graph([node], "pool",
                              [helper.make_tensor_value_info("x", F, [1, c, "H", "W"])],
                              [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv(ci: int, co: int, k: int, s: int):
    w = numpy_helper.from_array((RNG.standard_normal((co, ci, k, k)) * 0.1).astype(np.float32),
                                "w")
    b = numpy_helper.from_array(RNG.standard_normal(co).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4,
                              strides=[s, s]),
             helper.make_node("Sigmoid", ["c"], ["g"]), helper.make_node("Mul", ["c", "g"], ["y"])]
    graph = helper.make_graph(nodes, "conv",
                              [helper.make_tensor_value_info("x", F, [1, ci, "H", "W"])],
                              [helper.make_tensor_value_info("y", F, None)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _concat():
    node = helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=2)
    graph = helper.make_graph([node], "concat",
                              [helper.make_tensor_value_info(k, F, [1, 144, k.upper()])
                               for k in "abc"],
                              [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _bundle(model, shapes, path: Path):
    mod, _ = import_onnx(model, input_shapes=shapes)
    export_module(mod, path, ExportOptions(target="host", check=False))
    return load(path, threads=1)


def _time(label: str, model, feeds: dict, rounds: int, tmp: Path) -> None:
    sym = _bundle(model, None, tmp / "sym.mlc")
    static = _bundle(model, {k: v.shape for k, v in feeds.items()}, tmp / "static.mlc")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    a, b = list(sym.run(feeds).values())[0], list(static.run(feeds).values())[0]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
    runs = [lambda: sym.run(feeds), lambda: static.run(feeds), lambda: sess.run(None, feeds)]
    t0 = time.process_time()
    runs[1]()
    inner = max(1, int(0.003 / max(time.process_time() - t0, 1e-6)))
    times: list[list[float]] = [[], [], []]
    for _ in range(rounds):
        for f, t in zip(runs, times):
            t0 = time.process_time()
            for _ in range(inner):
                f()
            t.append((time.process_time() - t0) / inner * 1e6)
    cells = "  ".join(f"{np.median(t):8.1f} {min(t):8.1f}" for t in times)
    kernels = [_kernel_min(m, feeds, rounds) for m in (sym, static)]
    print(f"{label:<28} {cells}   {np.median(times[0]) / np.median(times[1]):5.2f}  "
          f"{kernels[0]:8.1f} {kernels[1]:8.1f}  {kernels[0] / kernels[1]:5.2f}", flush=True)
    sym.close()
    static.close()


def _kernel_min(model, feeds: dict, rounds: int) -> float:
    """The model's kernels alone: the sum over its VM instructions of each one's minimum time
    (``Model.profile``, wall clock; the minimum is what the code takes when it has the core)."""
    best: dict[int, float] = {}
    for _ in range(rounds):
        for i, t in enumerate(model.profile(feeds, runs=5).instructions):
            best[i] = min(best.get(i, t.min_us), t.min_us)
    return sum(best.values())


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    print(f"{'case':<28} {'symbolic run':>17}  {'static run':>17}  {'onnxruntime':>17}   "
          f"sym/st  {'kernels (min)':>17}  sym/st")
    print(f"{'':<28} {'median':>8} {'min':>8}  {'median':>8} {'min':>8}  {'median':>8} "
          f"{'min':>8}          {'sym':>8} {'static':>8}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if which in ("pool", "all"):
            for c, hw, k, s, p in POOLS:
                x = RNG.standard_normal((1, c, hw, hw)).astype(np.float32)
                _time(f"maxpool {c}ch {hw}^2 {k}x{k}/{s}", _pool(c, k, s, p), {"x": x}, rounds,
                      tmp)
        if which in ("conv", "all"):
            for ci, co, k, s, hw in CONVS:
                x = RNG.standard_normal((1, ci, hw, hw)).astype(np.float32)
                _time(f"conv {ci}->{co} {k}x{k}/{s} {hw}^2", _conv(ci, co, k, s), {"x": x},
                      rounds, tmp)
        if which in ("concat", "all"):
            feeds = {k: RNG.standard_normal((1, 144, n)).astype(np.float32)
                     for k, n in (("a", 1600), ("b", 400), ("c", 100))}
            _time("concat 1600+400+100", _concat(), feeds, rounds, tmp)


if __name__ == "__main__":
    main()
