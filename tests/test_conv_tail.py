"""The conv kernel's tail (``gemm.conv_geometry``'s ``tail``): the outputs a last, partial
panel would hold computed as dot products with the reduction on the vector lanes. Small images
(7x7, 10x10, 1x1), a reduction not a multiple of the vector width, output channels not a
multiple of the tail's block, a padded strided 3x3, fused epilogues, a batch on 2 threads
(each image gathers its tail inputs into a region of its own), all against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.codegen.gemm import conv_geometry
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")


def _model(n, c, h, o, k, s, act, residual):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    p = k // 2
    oh = (h + 2 * p - k) // s + 1
    inits = [numpy_helper.from_array(
                 (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y0"], kernel_shape=[k, k],
                              strides=[s, s], pads=[p] * 4)]
    y = "y0"
    if act == "silu":
        nodes += [helper.make_node("Sigmoid", [y], ["sg"]), helper.make_node("Mul", [y, "sg"], ["y1"])]
        y = "y1"
    elif act == "hsig":
        nodes.append(helper.make_node("HardSigmoid", [y], ["y1"], alpha=1 / 6, beta=0.5))
        y = "y1"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, h])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, o, oh, oh]))
        nodes.append(helper.make_node("Add", [y, "r"], ["y2"]))
        y = "y2"
    graph = helper.make_graph(nodes, "tail", inputs,
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [n, o, oh, oh])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), oh


CASES = [   # n, c, h, o, k, s, act, residual, threads
    (1, 512, 7, 96, 1, 1, None, False, 1),        # one tail pixel (8-channel blocks)
    (1, 64, 10, 85, 1, 1, "silu", True, 2),       # four tail pixels, 85 channels
    (1, 20, 20, 36, 3, 2, "silu", False, 2),      # strided 3x3 by phase, K = 180
    (1, 12, 10, 18, 3, 1, None, True, 1),         # K = 108, shifted planes
    (1, 45, 1, 70, 1, 1, "hsig", False, 2),       # a 1x1 image: every output in the tail
    (2, 30, 7, 40, 1, 1, "silu", False, 2),       # a batch on 2 threads
]


@pytest.mark.parametrize("n,c,h,o,k,s,act,residual,threads", CASES)
def test_conv_tail_matches_onnxruntime(tmp_path, n, c, h, o, k, s, act, residual, threads):
    import onnx

    from mlcpack.frontends.onnx import import_onnx

    p = k // 2
    oh = (h + 2 * p - k) // s + 1
    geom = conv_geometry((n, c, h, h), (o, c, k, k), (n, o, oh, oh),
                         dict(strides=(s, s), padding=(p,) * 4, groups=1, dilation=(1, 1)), 8)
    assert geom["tail"], "the case no longer takes the tail"
    model, oh = _model(n, c, h, o, k, s, act, residual)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host"))
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((n, c, h, h)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((n, o, oh, oh)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with load(tmp_path / "m.mlc", threads=threads) as m:
        for _ in range(20 if threads > 1 else 1):
            got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
