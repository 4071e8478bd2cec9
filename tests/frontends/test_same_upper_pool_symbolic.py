"""TensorFlow-style ``auto_pad=SAME_UPPER`` 2x2 stride-2 pooling over sizes known only at run
time (MTCNN's P-Net, run over an image pyramid of every size): the pad is size % 2 at the end,
so the export reads it as the unpadded window in ceil mode, and the bundle runs odd and even
sizes as ONNX Runtime does. Exported as a user does, with no options."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.runtime import load


def _model(op: str, **attrs) -> onnx.ModelProto:
    """x [1, 3, H, W] -> Conv 3x3 VALID (4 channels) -> op 2x2 s2 SAME_UPPER -> Relu."""
    w = numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="VALID"),
             helper.make_node(op, ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                              auto_pad="SAME_UPPER", **attrs),
             helper.make_node("Relu", ["p"], ["y"])]
    graph = helper.make_graph(
        nodes, "same_pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_same_upper_pooling_at_odd_and_even_run_time_sizes(op, tmp_path, run_cli) -> None:
    model = _model(op)
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc")
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed" in proc.stdout, proc.stdout
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    with load(tmp_path / "m.mlc") as m:
        for h, w in ((3, 3), (4, 5), (12, 12), (13, 17), (30, 21), (47, 64)):
            x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
            want = session.run(None, {"x": x})[0]
            got = m.run({"x": x})["y"]
            assert got.shape == (1, 4, -(-(h - 2) // 2), -(-(w - 2) // 2)) == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{op} {h}x{w}")


def test_counted_pads_keep_their_own_path(tmp_path, run_cli) -> None:
    """AveragePool counting the pad (count_include_pad=1) is not the ceil-mode window: at fixed
    sizes it exports and matches ORT as before."""
    model = _model("AveragePool", count_include_pad=1)
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc", "--input-shape",
                   "x=1,3,9,12")
    assert proc.returncode == 0, proc.stderr
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 12)).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    with load(tmp_path / "m.mlc") as m:
        np.testing.assert_allclose(m.run({"x": x})["y"], session.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)
