"""A QDQ model whose image size stays symbolic (ONNX Runtime's ``quantize_static`` of a file with
open height and width, the default export) runs its quantize -> dequantize pairs in float inside
the convolutions' epilogues where no integer kernel takes the layer (here a convolution of 4
groups; the open-size integer kernels take the others). Those epilogues hold casts
(float32 -> uint8 -> float32, a uint8 zero point read as float32); they take the vector epilogue
(codegen/contraction/epilogue.py ``_vector_casts``) instead of the scalar one, element by element
(3-6x slower per convolution on PP-OCR's classifier), and give ONNX Runtime's outputs running
the graph as written."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.contraction import epilogue
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

from helpers import SharedLog

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _float_net(path):
    """x (1, 8, H, W) -> full 3x3 conv + ReLU, grouped 3x3 (4 groups) + residual add, 1x1 conv
    + SiLU."""
    rng = np.random.default_rng(5)

    def w(name, *shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a2"]),
             helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"]),
             helper.make_node("Sigmoid", ["c3"], ["s3"]),
             helper.make_node("Mul", ["c3", "s3"], ["y"])]
    inits = [w("w1", 8, 8, 3, 3), w("b1", 8), w("w2", 8, 2, 3, 3), w("b2", 8), w("w3", 16, 8, 1, 1),
             w("b3", 16)]
    graph = helper.make_graph(
        nodes, "qdq_symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, "H", "W"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture(scope="module")
def qdq_net(tmp_path_factory):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    folder = tmp_path_factory.mktemp("fake_quant")
    rng = np.random.default_rng(6)
    feeds = [{"x": rng.standard_normal((1, 8, 10, 12)).astype(np.float32)} for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    path = folder / "qdq.onnx"
    quantize_static(str(_float_net(folder / "float.onnx")), str(path), Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return path


def test_fake_quant_epilogues_run_a_vector_at_a_time(qdq_net, tmp_path, monkeypatch) -> None:
    made = SharedLog(tmp_path / "made")
    made.count_cache_hits(monkeypatch, "EpilogueMixin._vector_epilogue_ok: casts, vector")
    real = epilogue.EpilogueMixin._vector_epilogue_ok

    def spy(self):
        ok = real(self)
        casts = any(type(n).__name__ == "Cast"
                    for n in epilogue.te.walk(self.match.body, skip=self.match.reduce))
        made.append((casts, ok))
        return ok
    monkeypatch.setattr(epilogue.EpilogueMixin, "_vector_epilogue_ok", spy)
    mod, _ = import_onnx(str(qdq_net))
    bundle = tmp_path / "qdq.mlc"
    export_module(mod, bundle, ExportOptions(target="x86-64-v3", check=False))
    with_casts = [ok for casts, ok in made if casts]
    assert with_casts and all(with_casts), made.items()

    sess = ort.InferenceSession(str(qdq_net), _no_optimizations(),
                                providers=["CPUExecutionProvider"])
    step = _output_step(qdq_net)
    rng = np.random.default_rng(7)
    with load(bundle) as m:
        for shape in [(1, 8, 5, 19), (1, 8, 16, 9)]:   # partial vectors, several row blocks
            x = rng.standard_normal(shape).astype(np.float32)
            got = m.run({"x": x})["y"]
            want = sess.run(None, {"x": x})[0]
            # the float convolutions sum in another order than ORT's: a value on a rounding
            # tie may land one step away
            diff = np.abs(got - want)
            assert diff.max() <= step * 1.001, (shape, diff.max(), step)
            assert np.mean(diff > 0) < 0.01, (shape, np.mean(diff > 0))


def _no_optimizations():
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return opts


def _output_step(path) -> float:
    import onnx
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.output[0] == "y")
    assert node.op_type == "DequantizeLinear"
    return float(inits[node.input[1]])
