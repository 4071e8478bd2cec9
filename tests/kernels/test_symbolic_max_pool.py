"""Max pools with run-time sizes (issue 12): the static max pool kernel (``codegen/pool.py``:
-inf margined row buffers, planes split over threads) with its extents read at run time. One
bundle per target, H and W (and the batch) symbolic, against ONNX Runtime at odd sizes, for
windows with padding, strides 1 and 2, dilation and ceil_mode, on 1 and 2 threads. A max is
exact: the outputs must be equal."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

# (kernel, strides, pads [t, l, b, r], dilations, ceil_mode)
POOLS = [
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),   # ResNet's stem pool
    ((5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 0),   # YOLOv8's SPPF
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 0),
    ((3, 2), (1, 2), (1, 0, 0, 1), (1, 1), 1),   # uneven window, strides and pads, ceil
    ((3, 3), (2, 1), (2, 1, 2, 1), (2, 3), 0),   # dilated
    ((2, 3), (2, 2), (0, 1, 1, 0), (1, 1), 1),
    ((1, 7), (1, 1), (0, 3, 0, 3), (1, 1), 0),
]
CHANNELS = 24   # 24 planes of 32 x 32 outputs: enough work for two threads


def _model() -> onnx.ModelProto:
    nodes, outputs = [], []
    for i, (k, s, p, d, ceil) in enumerate(POOLS):
        nodes.append(helper.make_node("MaxPool", ["x"], [f"y{i}"], kernel_shape=list(k),
                                      strides=list(s), pads=list(p), dilations=list(d),
                                      ceil_mode=ceil))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "pools",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", CHANNELS, "H", "W"])],
        outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["host", "x86-64-v2"])
def test_symbolic_max_pools_against_ort(target, tmp_path) -> None:
    model = _model()
    mod, _ = import_onnx(model)
    path = tmp_path / "pools.mlc"
    export_module(mod, path, ExportOptions(target=None if target == "host" else target))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    shapes = [(1, CHANNELS, 9, 7), (2, CHANNELS, 31, 45), (1, CHANNELS, 64, 67),
              (1, CHANNELS, 5, 17), (1, CHANNELS, 70, 33)]
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            for shape in shapes:
                x = rng.standard_normal(shape).astype(np.float32)
                x[0, 0, 0, :3] = [np.inf, -np.inf, 0.0]
                expected = session.run(None, {"x": x})
                got = m.run({"x": x})
                for i, ref in enumerate(expected):
                    what = f"pool {POOLS[i]} at {shape}, {threads} threads"
                    assert got[f"y{i}"].shape == ref.shape, what
                    np.testing.assert_array_equal(got[f"y{i}"], ref, err_msg=what)

