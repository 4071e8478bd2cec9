"""The symbolic convolution kernel's code paths (codegen/contraction/conv_symbolic.py) against ONNX Runtime
at several image sizes, 1 and 2 threads: large windows looped by (channel, window row) (7x7/2
stem, grouped 5x5), 1x1 reductions unrolled by 4, 2 or not at all (input channels 8, 6, 7;
strided planes, the in-place input, dilated columns), and weights larger than L2 (the panels
innermost when one task fills the planes)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import export_module
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(11)


def _model():
    """x (1, 6, H, W) -> 7x7/2 (6 -> 8) -> 5x5 groups 2 -> 1x1/2 (8 -> 7) -> 1x1 (7 -> 6, read
    in place) -> 3x3 dilation 2 (6 -> 8, columns) -> 3x3 (8 -> 2048, 590 KB of weights)."""
    def w(name, *shape):
        return numpy_helper.from_array((RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:])))
                                       .astype(np.float32), name)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[3, 3, 3, 3]),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], group=2, pads=[2, 2, 2, 2]),
        helper.make_node("Conv", ["c2", "w3", "b3"], ["c3"], strides=[2, 2]),
        helper.make_node("Conv", ["c3", "w4"], ["c4"]),
        helper.make_node("Conv", ["c4", "w5"], ["c5"], dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Conv", ["c5", "w6", "b6"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = [w("w1", 8, 6, 7, 7), w("b1", 8), w("w2", 8, 4, 5, 5), w("w3", 7, 8, 1, 1),
             w("b3", 7), w("w4", 6, 7, 1, 1), w("w5", 8, 6, 3, 3), w("w6", 2048, 8, 3, 3),
             w("b6", 2048)]
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, "H", "W"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("c3", "y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_conv_paths_at_several_sizes_against_ort(tmp_path) -> None:
    model = _model()
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "convs.mlc")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        with load(tmp_path / "convs.mlc", threads=threads) as bundle:
            for shape in [(1, 6, 20, 20), (1, 6, 37, 23), (1, 6, 8, 65), (1, 6, 13, 9)]:
                x = RNG.standard_normal(shape).astype(np.float32)
                got = bundle.run({"x": x})
                for name, want in zip(("c3", "y"), sess.run(None, {"x": x})):
                    np.testing.assert_allclose(got[name], want, rtol=1e-4,
                                               atol=1e-4 * float(np.abs(want).max()),
                                               err_msg=f"{name} {shape} threads={threads}")
