"""Convolutions with few input channels and many, little-overlapping taps (an STFT written as a
Conv1d, a ViT patch embedding) run as a 1x1 convolution over the im2col of their rows and
columns (passes/conv_nd.py, IM2COL_TAPS): numbers against ONNX Runtime, and the rewrite taken
(or not: a 9x9 stride-1 convolution's im2col would copy its input 81 times)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.export import export_module
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

RNG = np.random.default_rng(8)


def conv_model(x_shape, w_shape, bias: bool, **attrs) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(RNG.standard_normal(w_shape).astype(np.float32) / 8, "W")]
    ins = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(w_shape[0]).astype(np.float32),
                                             "B"))
        ins.append("B")
    g = helper.make_graph([helper.make_node("Conv", ins, ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("x_shape,w_shape,attrs,bias", [
    ((1, 3, 64, 48), (24, 3, 16, 16), dict(strides=[16, 16]), True),   # patch embedding
    ((1, 1, 4000), (42, 1, 100), dict(strides=[40]), False),            # STFT-like, no padding
    ((2, 1, 1000), (16, 1, 64), dict(strides=[16], pads=[32, 32]), True),  # padded, bias, batch
    ((1, 1, 5, 300), (8, 1, 3, 80), dict(strides=[2, 40], pads=[1, 0, 1, 0]), False),  # 2-D
])
def test_long_row_conv_matches_onnxruntime(x_shape, w_shape, attrs, bias, tmp_path) -> None:
    model = conv_model(x_shape, w_shape, bias, **attrs)
    mod, _ = import_onnx(model)
    names = list(run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs())
    assert any("window_unfold" in n for n in names), names
    x = RNG.standard_normal(x_shape).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    path = tmp_path / "m.mlc"
    export_module(mod, path)
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            got = m.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_dense_window_keeps_the_2d_kernel() -> None:
    model = conv_model((1, 3, 32, 32), (8, 3, 9, 9), False, pads=[4, 4, 4, 4])
    mod, _ = import_onnx(model)
    names = list(run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs())
    assert not any("window_unfold" in n for n in names), names
