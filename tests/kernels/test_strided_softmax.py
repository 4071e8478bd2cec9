"""Softmax and log-softmax over an axis that is not the last (codegen/softmax.py's
``_StridedSoftmax``: the contiguous axis on the vector lanes, YOLOv8's DFL head) against ONNX
Runtime: static shapes on every x86 vector width with masked last vectors, a bin count over
the straight-line limit (the looping passes), split over threads; and run-time outer and inner
sizes (an open-size export)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager.codegen import softmax
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime.model import load

from helpers import SharedLog, force_parallel_kernels

ort = pytest.importorskip("onnxruntime")

# (op, shape, axis): the DFL layout (inner 148: a masked last vector on AVX2 and AVX-512);
# axis -2 of a 3-D tensor whose inner 48 needs no mask; 40 and 33 bins (looping passes) over
# inner axes of 3 and 10 (masked on every width)
CASES = [("Softmax", (1, 16, 4, 37), 1), ("LogSoftmax", (2, 5, 48), -2),
         ("Softmax", (40, 3), 0), ("LogSoftmax", (3, 33, 2, 5), 1)]


def _model(cases, dims=None):
    nodes, inputs, outputs = [], [], []
    for i, (op, shape, axis) in enumerate(cases):
        nodes.append(helper.make_node(op, [f"x{i}"], [f"y{i}"], axis=axis))
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT,
                                                    list(dims or shape)))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "strided_softmax", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def emitted(monkeypatch, tmp_path) -> SharedLog:
    seen = SharedLog(tmp_path / "emitted")
    seen.count_cache_hits(monkeypatch, "_StridedSoftmax.emit: axis")
    original = softmax._StridedSoftmax.emit
    monkeypatch.setattr(softmax._StridedSoftmax, "emit",
                        lambda self: seen.append(self.axis) or original(self))
    return seen


def _check(path, model, shapes, threads_list, rng) -> None:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for threads in threads_list:
        with load(path, threads=threads) as bundle:
            for shape_set in shapes:
                xs = {f"x{i}": (rng.standard_normal(s) * 5).astype(np.float32)
                      for i, s in enumerate(shape_set)}
                xs["x0"].flat[0] = 80.0       # a large maximum
                xs["x0"].flat[-1] = -1e30     # a vanishing bin
                got, want = bundle.run(xs), sess.run(None, xs)
                for i, s in enumerate(shape_set):
                    np.testing.assert_allclose(got[f"y{i}"], want[i], rtol=1e-5, atol=1e-6,
                                               err_msg=f"{s} threads={threads}")


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "host"])
def test_static_strided_softmax_matches_ort(target, tmp_path, emitted, monkeypatch) -> None:
    force_parallel_kernels(monkeypatch, macs=False)
    model = _model(CASES)
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "s.mlc", ExportOptions(target=target, check=False))
    assert sorted(emitted.items()) == sorted(a % len(s) for _, s, a in CASES)
    _check(tmp_path / "s.mlc", model, [[s for _, s, _ in CASES]], (1, 3),
           np.random.default_rng(5))


def test_run_time_outer_and_inner(tmp_path, emitted) -> None:
    """[batch, 16, 4, anchors] over axis 1, batch and anchors run-time sizes."""
    model = _model([("Softmax", None, 1)], dims=["b", 16, 4, "a"])
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "o.mlc", ExportOptions(target="host", check=False))
    assert emitted.items() == [1]
    _check(tmp_path / "o.mlc", model, [[(1, 16, 4, 2100)], [(2, 16, 4, 5)], [(1, 16, 4, 64)]],
           (1, 2), np.random.default_rng(6))
