"""Operator versions the ONNX checker refuses as deprecated although exporters wrote them and ONNX
Runtime runs them (GroupNormalization-18): the command line's default export reads them as
their version says, and the rest of such a model is still checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import assert_runs_match, ort_outputs


def _group_norm_18(path: Path, broken: bool = False) -> Path:
    """x [1, 8, 5, 6] -> GroupNormalization-18 (4 groups, scale and bias per group) -> Relu."""
    rng = np.random.default_rng(18)
    scale = numpy_helper.from_array(rng.uniform(0.5, 2.0, 4).astype(np.float32), "s")
    bias = numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b")
    relu_in = "missing" if broken else "g"
    nodes = [helper.make_node("GroupNormalization", ["x", "s", "b"], ["g"], num_groups=4,
                              epsilon=1e-5),
             helper.make_node("Relu", [relu_in], ["y"])]
    graph = helper.make_graph(
        nodes, "gn18", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 5, 6])], [scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(onnx.checker.ValidationError, match="deprecated"):
        onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_group_norm_18_exports_with_defaults_and_matches_ort(tmp_path, run_cli) -> None:
    model = _group_norm_18(tmp_path / "gn18.onnx")
    bundle = tmp_path / "gn18.mlc"
    proc = run_cli("export", model, "-o", bundle)
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed" in proc.stdout
    x = np.random.default_rng(0).normal(size=(1, 8, 5, 6)).astype(np.float32) * 3 + 1
    want = ort_outputs(model, {"x": x})
    assert want["y"].min() == 0 and want["y"].max() > 0
    assert_runs_match(bundle, {"x": x}, want, rtol=1e-4, atol=1e-5, label="GroupNormalization-18")


def test_rest_of_a_model_with_a_deprecated_op_is_still_checked(tmp_path, run_cli,
                                                                one_line_error) -> None:
    model = _group_norm_18(tmp_path / "broken.onnx", broken=True)
    bundle = tmp_path / "broken.mlc"
    line = one_line_error(run_cli("export", model, "-o", bundle))
    assert "is not a valid ONNX model" in line and "missing" in line, line
    assert not bundle.exists()
