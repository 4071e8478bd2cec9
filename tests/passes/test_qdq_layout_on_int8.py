"""Layout ops between QDQ pairs (passes/fuse_qdq_layout.py): ONNX Runtime's quantizer writes
Reshape / Transpose / Slice / Flatten / Squeeze between DequantizeLinear and QuantizeLinear
with the same scale and zero point; they run on the 8-bit tensor, no quantize or dequantize
pass left between them, and the outputs equal ORT's (graph optimizations off: the model as
written) bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import onnx
from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load


def _model(path: Path) -> Path:
    """x [1, 4, 6, 10] float -> Q -> DQ -> Reshape [1, 24, 10] -> Q/DQ -> Transpose (0, 2, 1)
    -> Q/DQ -> Slice rows 1..9 of axis 1 -> Q/DQ -> Flatten -> Q/DQ (another scale: stays)
    -> y; a second reader of the first DQ (Relu) keeps that dequantize."""
    s, z = "s", "z"
    nodes = [h.make_node("QuantizeLinear", ["x", s, z], ["q0"]),
             h.make_node("DequantizeLinear", ["q0", s, z], ["d0"]),
             h.make_node("Reshape", ["d0", "shape"], ["r"]),
             h.make_node("QuantizeLinear", ["r", s, z], ["q1"]),
             h.make_node("DequantizeLinear", ["q1", s, z], ["d1"]),
             h.make_node("Transpose", ["d1"], ["t"], perm=[0, 2, 1]),
             h.make_node("QuantizeLinear", ["t", s, z], ["q2"]),
             h.make_node("DequantizeLinear", ["q2", s, z], ["d2"]),
             h.make_node("Slice", ["d2", "st", "en", "ax"], ["sl"]),
             h.make_node("QuantizeLinear", ["sl", s, z], ["q3"]),
             h.make_node("DequantizeLinear", ["q3", s, z], ["d3"]),
             h.make_node("Flatten", ["d3"], ["f"], axis=1),
             h.make_node("QuantizeLinear", ["f", "s2", z], ["q4"]),
             h.make_node("DequantizeLinear", ["q4", "s2", z], ["y"]),
             h.make_node("Relu", ["d0"], ["r2"])]
    inits = [nh.from_array(np.array(0.05, np.float32), s),
             nh.from_array(np.array(0.11, np.float32), "s2"),
             nh.from_array(np.array(131, np.uint8), z),
             nh.from_array(np.array([1, 24, 10], np.int64), "shape"),
             nh.from_array(np.array([1], np.int64), "st"),
             nh.from_array(np.array([9], np.int64), "en"),
             nh.from_array(np.array([1], np.int64), "ax")]
    graph = h.make_graph(nodes, "qdq_layout", [h.make_tensor_value_info("x", T.FLOAT,
                                                                        [1, 4, 6, 10])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 192]),
                          h.make_tensor_value_info("r2", T.FLOAT, [1, 4, 6, 10])], inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return _model(tmp_path_factory.mktemp("qdq_layout") / "m.onnx")


def test_layout_ops_take_the_8bit_tensor(model: Path) -> None:
    mod, _ = import_onnx(str(model))
    upto = [p.name for p in DEFAULT_PIPELINE].index("fuse_quantized_layout") + 1
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:upto], options=UNPACKED)
    calls = [b.value for b in fused.functions["main"].bindings() if hasattr(b.value, "op")]
    ops = [c.op for c in calls]
    # one quantize of x, one to the other scale after the flatten; dequantizes for the Relu,
    # before that flatten (its scales differ: it stays float) and for y
    assert ops.count("quantize") == 2 and ops.count("dequantize") == 3, ops
    assert ops.count("reshape") == 2 and ops.count("transpose") == 1, ops
    for c in calls:
        if c.op in ("reshape", "transpose", "strided_slice") and c.type.shape != (1, 192):
            assert c.type.dtype == "uint8", (c.op, c.type)


def test_layout_ops_on_8bit_equal_ort(model: Path, tmp_path: Path) -> None:
    mod, _ = import_onnx(str(model))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host", check=False))
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, (1, 4, 6, 10)).astype(np.float32)   # saturates at both ends
    ours = load(tmp_path / "m.mlc").run({"x": x})
    ref = ort_outputs(model, {"x": x}, as_written=True)
    for k in ("y", "r2"):
        np.testing.assert_array_equal(ours[k], ref[k])
