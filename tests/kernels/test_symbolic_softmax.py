"""Softmax and log-softmax over a last axis whose length is a run-time size (an attention's
scores over a symbolic sequence): the vectorized kernel of codegen/softmax.py
(``_RowLengthSoftmax``), against ONNX Runtime, every tail length, 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager.codegen import softmax
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime.model import load

from helpers import SharedLog

ort = pytest.importorskip("onnxruntime")

# (b, 3, s, t): one element; tails of every length; 128 (blocks only); long rows (blocks,
# single vectors and a tail); many rows (split over tasks)
SHAPES = [(1, 3, 1, 1), (2, 3, 5, 7), (1, 3, 9, 33), (2, 3, 3, 8), (1, 3, 16, 128),
          (1, 3, 4, 301), (1, 3, 700, 17)]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_runtime_row_length_softmax_matches_ort(op, tmp_path, monkeypatch) -> None:
    emitted = SharedLog(tmp_path / "emitted")
    emitted.count_cache_hits(monkeypatch, "_RowLengthSoftmax.emit: symbol")
    emit = softmax._RowLengthSoftmax.emit
    monkeypatch.setattr(softmax._RowLengthSoftmax, "emit",
                        lambda self: emitted.append(self.symbol) or emit(self))
    node = helper.make_node(op, ["x"], ["y"], axis=-1)
    graph = helper.make_graph(
        [node], "softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["b", 3, "s", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "s.mlc", ExportOptions(target="host", check=False))
    assert emitted, "the run-time row length softmax kernel was not used"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for threads in (1, 2):
        with load(tmp_path / "s.mlc", threads=threads) as bundle:
            for shape in SHAPES:
                x = (rng.standard_normal(shape) * 5).astype(np.float32)
                x[0, 0, 0, 0] = 80.0     # a large maximum: exp of x - max stays finite
                x[-1, -1, -1, -1] = -1e30
                np.testing.assert_allclose(bundle.run({"x": x})["y"],
                                           sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{shape} threads={threads}")
