"""A symbolic convolution with more column phases than ``SymbolicConvEmitter.UNROLLED_PHASES``
(a wide window at a large horizontal stride, as silero VAD v6's STFT conv: 1x256 stride 128)
fills its stride-phase planes by a run-time loop over the phases. Unrolled, the 8 kHz branch's
1x128 stride 64 conv alone took LLVM's code generator minutes for x86-64-v2 (loop strength
reduction over 64 x 5 loops with run-time bounds); here it compiles in about a second. Against
ONNX Runtime at several lengths, 1 and 2 threads: padding on the left only for some phases
(their first column zero), lengths whose last columns fall off some phases, and two rows."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.contraction.conv_symbolic import SymbolicConvEmitter
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(37)


def _model():
    """x (1, 2, H, W) -> 2x128 stride (1, 64), pads (0, 40) -> 10 channels, + bias."""
    w = numpy_helper.from_array((RNG.standard_normal((10, 2, 2, 128)) / 16).astype(np.float32),
                                "w")
    b = numpy_helper.from_array(RNG.standard_normal(10).astype(np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[1, 64], pads=[0, 40, 0, 40])
    graph = helper.make_graph(
        [node], "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_many_phase_conv_against_ort(tmp_path) -> None:
    assert 64 > SymbolicConvEmitter.UNROLLED_PHASES   # 64 column phases: the rolled path
    model = _model()
    mod, _ = import_onnx(model)
    # x86-64-v2 (SSE): where the unrolled phases were slowest to compile; runs on any x86-64
    export_module(mod, tmp_path / "wide.mlc", ExportOptions(target="x86-64-v2"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        with load(tmp_path / "wide.mlc", threads=threads) as bundle:
            for shape in [(1, 2, 2, 576), (1, 2, 3, 200), (1, 2, 2, 97), (1, 2, 5, 1000)]:
                x = RNG.standard_normal(shape).astype(np.float32)
                got = bundle.run({"x": x})["y"]
                want = sess.run(None, {"x": x})[0]
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-4,
                                           atol=1e-4 * float(np.abs(want).max()),
                                           err_msg=f"{shape} threads={threads}")
