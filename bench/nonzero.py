"""NonZero, Unique and NMS over a run-time size beside ONNX Runtime (issue 37): whether the
counted-size kernels grow linearly with the input (NonZero, Compress), as n log n (Unique: a
sort; ns/elem grows with log N only) and how NMS compares.

    python bench/nonzero.py [runs] [nonzero|unique|nms ...]

One bundle per model with its size open (N), exported for the host with no golden check;
each size run alternating with an ONNX Runtime session (1 thread, both), medians and mins in
microseconds, and our time per input element (a linear kernel keeps it flat as N grows).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime.model import load


def nonzero_model() -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("NonZero", ["x"], ["nz"])], "nonzero",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                          [helper.make_tensor_value_info("nz", TensorProto.INT64, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def unique_model() -> onnx.ModelProto:
    """Unique of a float vector, sorted, all four outputs."""
    outs = ["y", "first", "inverse", "counts"]
    g = helper.make_graph([helper.make_node("Unique", ["x"], outs, sorted=1)], "unique",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT if o == "y"
                                                         else TensorProto.INT64, None)
                           for o in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def nms_model() -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array([100], np.int64), "k"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.3], np.float32), "score")]
    g = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou", "score"],
                          ["sel"])], "nms",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, "N", 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, "N"])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds_for(name: str, n: int) -> dict:
    rng = np.random.default_rng(n)
    if name == "nonzero":
        return {"x": np.where(rng.random(n) < 0.5, rng.normal(size=n), 0).astype(np.float32)}
    if name == "unique":   # about n / 4 distinct values, each repeated
        return {"x": (rng.integers(0, max(n // 4, 1), n) * 0.5).astype(np.float32)}
    corner = rng.uniform(0, 100, (1, n, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(1, 8, (1, n, 2))], -1)
    return {"boxes": boxes.astype(np.float32),
            "scores": rng.random((1, 2, n)).astype(np.float32)}


def main() -> None:
    import onnxruntime as ort

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    chosen = set(sys.argv[2:]) or {"nonzero", "unique", "nms"}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sizes = {"nonzero": (1000, 10000, 100000, 1000000), "unique": (1000, 10000, 100000),
             "nms": (250, 1000, 4000)}
    print(f"{'model':8} {'N':>8} {'ours med':>10} {'ours min':>10} {'ORT med':>10} "
          f"{'ORT min':>10} {'ours/ORT':>8} {'ns/elem':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in (("nonzero", nonzero_model()), ("unique", unique_model()),
                            ("nms", nms_model())):
            if name not in chosen:
                continue
            mod, _ = import_onnx(model)
            path = Path(tmp) / f"{name}.mlc"
            export_module(mod, path, ExportOptions(target="host", check=False))
            sess = ort.InferenceSession(model.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            with load(path, threads=1) as ours:
                for n in sizes[name]:
                    feeds = feeds_for(name, n)
                    got, want = ours.run(feeds), sess.run(None, feeds)
                    for a, b in zip(got.values(), want):
                        assert np.array_equal(a, b), (name, n)
                    ta, tb = [], []
                    for _ in range(runs):
                        t = time.perf_counter()
                        ours.run(feeds)
                        ta.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        sess.run(None, feeds)
                        tb.append(time.perf_counter() - t)
                    a, b = np.median(ta) * 1e6, np.median(tb) * 1e6
                    print(f"{name:8} {n:>8} {a:>10.1f} {min(ta) * 1e6:>10.1f} {b:>10.1f} "
                          f"{min(tb) * 1e6:>10.1f} {a / b:>8.2f} {min(ta) * 1e9 / n:>8.2f}")


if __name__ == "__main__":
    main()
