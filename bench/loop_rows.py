"""A Loop's scan output with no bound at export (format 1.9: a row store the VM appends to)
beside ONNX Runtime (issue 37 item 3): whether its cost per iteration stays flat as the trip
count grows (the store doubles: amortised O(1) copies per row) and how it compares.

    python bench/loop_rows.py [runs] [trip counts ...]
    python bench/loop_rows.py --grown [runs] [trip counts ...]

``--kv``: a decoder step over a KV cache that the body reads (a resized carried value, no new
format): ``cache = Concat(cache, k, axis=2)`` ([1, 4, T, 16], heads before T), attention of
``q`` over the whole cache, from an empty cache; the time per iteration grows with T in both
(each iteration reads the cache; ours copies it once more than ONNX Runtime).

``--grown`` (format 1.10): the rows are a carried value that grows instead of a scan output,
``hist = Concat(hist, acc[None])`` from an empty [0, 16], as a greedy decode grows its tokens
(ONNX Runtime allocates each iteration's value anew: its copies grow with the rows).

The model: ``for i in range(M): acc = acc * 0.5 + i; rows += [acc]`` with ``acc`` float32 [16]
and M fed at run time (no bound at export). One bundle exported for the host with no golden
check; each trip count run alternating with an ONNX Runtime session (1 thread, both), medians
and mins in microseconds (wall, and CPU time of the process), and the CPU time per
iteration of both.
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

WIDTH = 16


def grown_model() -> onnx.ModelProto:
    """The same loop with its rows a carried value that grows (format 1.10)."""
    F = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["acc", "half"], ["scaled"]),
         helper.make_node("Add", ["scaled", "fi"], ["acc2"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Unsqueeze", ["acc2", "zero"], ["row"]),
         helper.make_node("Concat", ["hist", "row"], ["hist2"], axis=0)],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", F, [WIDTH]),
         helper.make_tensor_value_info("hist", F, [None, WIDTH])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc2", F, [WIDTH]),
         helper.make_tensor_value_info("hist2", F, [None, WIDTH])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array([0], np.int64), "zero")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x0", "hist0"], ["acc", "rows"], body=body)],
        "loop_grown",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("x0", F, [WIDTH])],
        [helper.make_tensor_value_info("acc", F, None),
         helper.make_tensor_value_info("rows", F, None)],
        [numpy_helper.from_array(np.zeros((0, WIDTH), np.float32), "hist0")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def kv_model() -> onnx.ModelProto:
    """A decoder step loop over a KV cache the body reads (``--kv``)."""
    F = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    wk, wq = (rng.standard_normal((2, WIDTH * 4, WIDTH * 4)) * 0.1).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "wk"], ["hk"]),
         helper.make_node("Reshape", ["hk", "heads"], ["k"]),
         helper.make_node("Concat", ["cache", "k"], ["cache2"], axis=2),
         helper.make_node("MatMul", ["h", "wq"], ["hq"]),
         helper.make_node("Reshape", ["hq", "heads"], ["q"]),
         helper.make_node("Transpose", ["cache2"], ["kt"], perm=[0, 1, 3, 2]),
         helper.make_node("MatMul", ["q", "kt"], ["scores"]),
         helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
         helper.make_node("MatMul", ["probs", "cache2"], ["att"]),
         helper.make_node("Reshape", ["att", "row"], ["att_row"]),
         helper.make_node("Tanh", ["att_row"], ["h2"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", F, [1, WIDTH * 4]),
         helper.make_tensor_value_info("cache", F, [1, 4, None, WIDTH])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h2", F, [1, WIDTH * 4]),
         helper.make_tensor_value_info("cache2", F, [1, 4, None, WIDTH])],
        [numpy_helper.from_array(wk, "wk"), numpy_helper.from_array(wq, "wq"),
         numpy_helper.from_array(np.array([1, 4, 1, WIDTH], np.int64), "heads"),
         numpy_helper.from_array(np.array([1, WIDTH * 4], np.int64), "row")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x0", "cache0"], ["acc", "rows"], body=body)],
        "loop_kv",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("x0", F, [1, WIDTH * 4])],
        [helper.make_tensor_value_info("acc", F, None),
         helper.make_tensor_value_info("rows", F, None)],
        [numpy_helper.from_array(np.zeros((1, 4, 0, WIDTH), np.float32), "cache0")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def rows_model() -> onnx.ModelProto:
    F = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["acc", "half"], ["scaled"]),
         helper.make_node("Add", ["scaled", "fi"], ["acc2"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["acc2"], ["row"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", F, [WIDTH])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc2", F, [WIDTH]),
         helper.make_tensor_value_info("row", F, [WIDTH])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x0"], ["acc", "rows"], body=body)], "loop_rows",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("x0", F, [WIDTH])],
        [helper.make_tensor_value_info("acc", F, None),
         helper.make_tensor_value_info("rows", F, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def timed(fn, runs: int) -> tuple[float, float, float]:
    """(median wall, min wall, min CPU time of this process) of ``runs`` calls, in us."""
    times, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        t1, c1 = time.perf_counter(), time.process_time()
        times.append(t1 - t0)
        cpu.append(c1 - c0)
    return float(np.median(times)) * 1e6, float(np.min(times)) * 1e6, float(np.min(cpu)) * 1e6


def main(argv: list[str]) -> None:
    import onnxruntime as ort

    grown, kv = "--grown" in argv, "--kv" in argv
    argv = [a for a in argv if a not in ("--grown", "--kv")]
    runs = int(argv[0]) if argv else 20
    trips = [int(a) for a in argv[1:]] or [10, 100, 1000, 10000]
    model = kv_model() if kv else grown_model() if grown else rows_model()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.mlc"
        mod, _ = import_onnx(model)
        export_module(mod, path, ExportOptions(target="host", check=False))
        print("| trip count | ours median | ours min | ours CPU min | ORT median | ORT min | "
              "ORT CPU min | ours CPU us / iteration | ORT CPU us / iteration |")
        print("|---|---|---|---|---|---|---|---|---|")
        with load(path, threads=1) as bundle:
            for m in trips:
                x0 = np.linspace(-1, 1, WIDTH * (4 if kv else 1)).astype(np.float32)
                feeds = {"M": np.array(m, np.int64), "x0": x0.reshape(1, -1) if kv else x0}
                got, want = bundle.run(feeds), session.run(None, feeds)
                assert got["rows"].shape == want[1].shape
                np.testing.assert_allclose(got["rows"], want[1], rtol=1e-5, atol=1e-5)
                ours, peer = [], []
                for _ in range(3):   # alternating rounds
                    ours.append(timed(lambda f=feeds: bundle.run(f), runs))
                    peer.append(timed(lambda f=feeds: session.run(None, f), runs))
                om, omin = np.median([o[0] for o in ours]), min(o[1] for o in ours)
                pm, pmin = np.median([p[0] for p in peer]), min(p[1] for p in peer)
                ocpu, pcpu = min(o[2] for o in ours), min(p[2] for p in peer)
                print(f"| {m:,} | {om:,.1f} | {omin:,.1f} | {ocpu:,.1f} | {pm:,.1f} | "
                      f"{pmin:,.1f} | {pcpu:,.1f} | {ocpu / max(m, 1):.3f} | "
                      f"{pcpu / max(m, 1):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
