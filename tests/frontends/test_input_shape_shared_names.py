"""``--input-shape`` fixing a named dim that several inputs share fixes it in all of them.
PLCMOS v2 (speechmos 0.0.1.1) has degraded_audio [batch_size, 1, frames, 257] and rater_embed
[batch_size, 64]; ``--input-shape degraded_audio=1,1,249,257`` left rater_embed's batch open,
the golden check fed the two inputs different batches, its reference failed, and the bundle was
written unchecked ("golden check skipped: no reference ran"), without a golden pair."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from mlcpack.runtime import load


def test_a_dim_fixed_in_one_input_is_fixed_in_every_input_that_names_it(tmp_path, run_cli):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "frames", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("ReduceMax", ["a"], ["m"], axes=[1], keepdims=0),
             helper.make_node("Concat", ["m", "b"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "two", [a, b], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              tmp_path / "two.onnx")
    proc = run_cli("export", tmp_path / "two.onnx", "-o", tmp_path / "two.mlc", "--target",
                   "host", "--input-shape", "a=1,5,4")
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    with load(tmp_path / "two.mlc") as m:
        assert [s.shape for s in m.inputs] == [(1, 5, 4), (1, 3)]
        x, z = np.ones((1, 5, 4), np.float32), np.full((1, 3), 2, np.float32)
        np.testing.assert_array_equal(m.run({"a": x, "b": z})["y"], [[1, 1, 1, 1, 2, 2, 2]])
    assert run_cli("verify", tmp_path / "two.mlc").returncode == 0
