"""Models as real exporters write them: symbolic or -1 dims fixed with --input-shape, NHWC
inputs, declared output shapes that are wrong, several inputs and outputs, int32/int64 inputs.
Each is built to show the habit, exported, run by the runtime and compared with ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportError
from mlcpack.runtime import load
from test_onnx_frontend import check_against_ort, make_model, node, rand

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits=None, opset=17) -> onnx.ModelProto:
    """inputs/outputs: name -> (elem_type, shape or None)."""
    graph = helper.make_graph(
        nodes, "exported",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_dim_value_minus_one_fixed_by_input_shape(tmp_path: Path) -> None:
    model = make_model([node("Relu", ["x"], ["y"])], {"x": [1, 3, 4]}, ["y"])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    with pytest.raises(ExportError, match=r"an unknown size at axis 0: give its shape with "
                                          r"--input-shape x=1,3,4"):
        import_onnx(model)
    check_against_ort(model, {"x": rand(5, 3, 4)}, tmp_path, input_shapes={"x": (5, 3, 4)})


def test_symbolic_dims_through_the_command_line(tmp_path: Path, run_cli) -> None:
    model = make_model([node("Softmax", ["x"], ["y"], axis=-1)], {"x": ["batch", "seq", 8]},
                       ["y"])
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc")
    assert proc.returncode != 0 and "--input-shape x=1,1,8" in proc.stderr
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc",
                   "--input-shape", "x=2,5,8")
    assert proc.returncode == 0, proc.stderr
    x = rand(2, 5, 8)
    got = load(tmp_path / "m.mlc").run({"x": x})["y"]
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_nhwc_input_transposed_inside_the_model(tmp_path: Path) -> None:
    # tf2onnx/keras2onnx: the graph input is NHWC and the first node transposes it to NCHW.
    model = make_model(
        [node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2]),
         node("Conv", ["nchw", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         node("Relu", ["c"], ["r"]),
         node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])],
        {"image": [1, 6, 5, 3]}, ["y"], {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2)})
    got = check_against_ort(model, {"image": rand(1, 6, 5, 3)}, tmp_path)
    assert got["y"].shape == (1, 6, 5, 4)


def test_declared_output_shape_is_wrong_and_ignored(tmp_path: Path) -> None:
    model = _model([node("MatMul", ["a", "w"], ["y"])],
                   {"a": (TensorProto.FLOAT, [2, 3])},
                   {"y": (TensorProto.FLOAT, [7, 7, 7])},  # wrong: really [2, 5]
                   {"w": rand(3, 5, seed=1)})
    mod, _ = import_onnx(model)
    assert mod.main.outputs[0].type.shape == (2, 5)
    from test_onnx_frontend import run_bundle

    got = run_bundle(model, {"a": rand(2, 3)}, tmp_path)
    np.testing.assert_allclose(got["y"], rand(2, 3) @ rand(3, 5, seed=1), rtol=1e-5)


def test_several_inputs_and_outputs(tmp_path: Path) -> None:
    model = make_model(
        [node("Add", ["a", "b"], ["sum"]), node("Mul", ["a", "c"], ["prod"]),
         node("Concat", ["sum", "prod"], ["both"], axis=1),
         node("ReduceMax", ["both"], ["peak"], axes=[1], keepdims=0)],
        {"a": [2, 3], "b": [1, 3], "c": [2, 1]}, ["peak", "sum", "both"], opset=13)
    feeds = {"a": rand(2, 3, seed=1), "b": rand(1, 3, seed=2), "c": rand(2, 1, seed=3)}
    got = check_against_ort(model, feeds, tmp_path)
    assert list(got) == ["peak", "sum", "both"]


@pytest.mark.parametrize("ids_type", [TensorProto.INT64, TensorProto.INT32])
def test_integer_token_ids_embedding_and_mask(tmp_path: Path, ids_type: int) -> None:
    # A transformer's front: ids -> Gather(embedding), a padding mask from Equal, Where.
    table = rand(10, 4, seed=1)
    model = _model(
        [node("Gather", ["table", "ids"], ["emb"], axis=0),
         node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
         node("Equal", ["ids64", "pad"], ["is_pad"]),
         node("Unsqueeze", ["is_pad", "axes"], ["mask"]),
         node("Where", ["mask", "zero", "emb"], ["y"]),
         node("ArgMax", ["y"], ["best"], axis=-1, keepdims=0)],
        {"ids": (ids_type, [2, 5])},
        {"y": (TensorProto.FLOAT, None), "best": (TensorProto.INT64, None)},
        {"table": table, "pad": np.array(0, np.int64), "axes": np.array([-1], np.int64),
         "zero": np.array(0.0, np.float32)})
    dtype = np.int64 if ids_type == TensorProto.INT64 else np.int32
    ids = np.array([[3, 1, 0, 9, 0], [-1, 2, 2, 0, 7]], dtype)
    got = check_against_ort(model, {"ids": ids}, tmp_path)
    assert got["best"].dtype == np.int64


def test_bool_and_int_outputs(tmp_path: Path) -> None:
    model = _model([node("Greater", ["x", "t"], ["above"]),
                    node("Cast", ["above"], ["count"], to=TensorProto.INT32)],
                   {"x": (TensorProto.FLOAT, [3, 4])},
                   {"above": (TensorProto.BOOL, None), "count": (TensorProto.INT32, None)},
                   {"t": np.array(0.0, np.float32)})
    got = check_against_ort(model, {"x": rand(3, 4)}, tmp_path)
    assert got["above"].dtype == np.bool_ and got["count"].dtype == np.int32
