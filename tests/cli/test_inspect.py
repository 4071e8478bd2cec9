"""`inspect` on well-formed and malformed bundles."""

from __future__ import annotations

import pytest

from mlcpack.packager.bundle_writer import BundleWriter
from mlcpack.runtime.describe import describe, describe_text
from mlcpack.runtime.errors import BundleError


def test_describe_real_bundle(mlp_bundle):
    path, _ = mlp_bundle
    info = describe(path)
    assert info["inputs"][0]["shape"] == [1, 784]
    assert info["code"][0]["selected"] and info["vm_instructions"] == 2
    text = describe_text(info)
    assert "memory plan: arena" in text and "x86_64" in text


@pytest.mark.parametrize("header", [
    {"compiler": None, "code": [], "constants": []},
    {"compiler": {}, "code": "not a list", "constants": []},
    {"compiler": {}, "code": [], "constants": [{"dtype": "float32"}]},
])
def test_describe_malformed_header_is_a_bundle_error(header, tmp_path):
    path = tmp_path / "bad.mlc"
    BundleWriter().write(path, header)
    with pytest.raises(BundleError, match="malformed"):
        describe_text(describe(path))


def test_inspect_prints_symbolic_output_dims_as_text(tmp_path, run_cli):
    """A 2x2 stride-2 MaxPool over open sizes: the output dims are expressions of the input's
    size variables, printed as the IR prints them (not as the header's raw records)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
        "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              tmp_path / "m.onnx")
    assert run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc").returncode == 0
    proc = run_cli("inspect", tmp_path / "m.mlc")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("output:"))
    assert "[1, 2, (H) // 2, (W) // 2]" in line, line
