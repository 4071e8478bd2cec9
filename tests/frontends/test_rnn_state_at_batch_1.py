"""A recurrent layer whose initial state is a graph input exported at batch 1 beside an open
batch (speechmos' AECMOS: input [batch_size, 3, frames, 160], h0 [4, 1, 96]): it was refused
at import ("initial_h has shape (2, 1, 96), expected (2, batch_size, 96)"); ONNX Runtime runs
it at batch 1 only. Now the bundle holds ``batch_size == 1`` (refusing another batch in one
line), a Squeeze without axes drops that dim as ONNX Runtime does at run time, and the golden
check runs at batch 1 instead of failing at its usual size 2."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_in_process import run_cli_in_process
from onnx import TensorProto, helper, numpy_helper


def _model() -> onnx.ModelProto:
    """x [6, B, 4] and h0 [1, 1, 5] -> GRU (hidden 5) -> Y_h [1, B, 5] -> Squeeze (no axes)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 15, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 15, 5)).astype(np.float32), "R")]
    nodes = [helper.make_node("GRU", ["x", "W", "R", "", "", "h0"], ["", "hy"], hidden_size=5),
             helper.make_node("Squeeze", ["hy"], ["y"])]
    graph = helper.make_graph(
        nodes, "gru", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, "B", 4]),
                       helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gru")
    onnx.save(_model(), folder / "gru.onnx")
    proc = run_cli_in_process("export", folder / "gru.onnx", "-o", folder / "gru.mlc",
                              "--target", "host", env={"MLCPACK_NO_ORT": "1"})
    assert proc.returncode == 0, proc.stderr
    return folder, proc.stdout


def test_it_exports_checked_at_batch_1(bundle) -> None:
    _, out = bundle
    (line,) = [ln for ln in out.splitlines() if ln.startswith("golden check")]
    assert line.startswith("golden check passed against the numpy reference of the IR"), line


def test_it_matches_onnx_runtime_at_batch_1_and_refuses_another_batch(bundle) -> None:
    from mlcpack.runtime import load
    from mlcpack.runtime.errors import InputError

    folder, _ = bundle
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 1, 4)).astype(np.float32)
    h0 = rng.standard_normal((1, 1, 5)).astype(np.float32)
    (want,) = ort.InferenceSession(str(folder / "gru.onnx"), providers=[
        "CPUExecutionProvider"]).run(None, {"x": x, "h0": h0})
    with load(folder / "gru.mlc") as model:
        got = model.run({"x": x, "h0": h0})["y"]
        assert got.shape == want.shape == (5,)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError, match="B must be"):
            model.run({"x": np.zeros((6, 2, 4), np.float32), "h0": h0})


def test_the_check_size_takes_a_pinned_variable_at_its_value() -> None:
    from mlcpack.packager.golden_inputs import check_size
    from mlcpack.packager.ir.sym import SymExpr

    b, t = SymExpr.var("B"), SymExpr.var("T")
    assert check_size([("eq", b, 1, "")], {"B", "T"}) == {"B": 1, "T": 2}
    assert check_size([("eq", b, 1, ""), ("le", 16, t, "")], {"B", "T"}) == {"B": 1, "T": 16}
