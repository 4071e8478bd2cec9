"""Models as real exporters write them: weights and shapes as Constant nodes, Identity chains,
shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) on a symbolic batch,
symbolic or -1 dims fixed with --input-shape, NHWC inputs, declared output (and intermediate)
shapes that are wrong, several inputs and outputs, int32/int64 inputs. Each is built to show the
habit, exported, run by the runtime and compared with ONNX Runtime. (tests/corpus/test_pytorch_models.py
runs what torch.onnx.export really writes.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.runtime import load
from test_onnx_frontend import check_against_ort, main_ops, make_model, node, rand

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits=None, opset=17) -> onnx.ModelProto:
    """inputs/outputs: name -> (elem_type, shape or None)."""
    graph = helper.make_graph(
        nodes, "exported",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_weights_and_shapes_as_constant_nodes(tmp_path: Path) -> None:
    # tf2onnx, and torch with do_constant_folding=False, write weights and literals as Constant
    # nodes of every attribute kind instead of initializers; all of them become bound constants
    # (the Cast of one is folded at import) and the bundle takes only the real input.
    w = rand(4, 2, 3, 3, seed=1)
    model = make_model(
        [node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
         node("Constant", [], ["target"], value_ints=[2, 4, 12]),
         node("Constant", [], ["gain"], value_floats=[0.5, -2.0, 1.5, 1.0]),
         node("Constant", [], ["shift"], value_float=0.25),
         node("Constant", [], ["one"], value_int=1),
         node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
         node("Reshape", ["c", "target"], ["r"]),
         node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
         node("Mul", ["t", "gain"], ["m"]),
         node("Cast", ["one"], ["onef"], to=TensorProto.FLOAT),
         node("Add", ["m", "shift"], ["a"]),
         node("Sub", ["a", "onef"], ["y"])],
        {"x": [2, 2, 6, 8]}, ["y"])
    mod, info = import_onnx(model)
    assert [p.name for p in mod.main.params] == ["x"]
    assert info.folded_nodes >= 1
    assert main_ops(model) == ["nn.conv2d", "reshape", "transpose", "multiply", "add", "subtract"]
    got = check_against_ort(model, {"x": rand(2, 2, 6, 8)}, tmp_path)
    assert got["y"].shape == (2, 12, 4)


def test_identity_chains_tied_weights_and_pass_through_outputs(tmp_path: Path) -> None:
    # torch writes an Identity for a parameter used twice (tied embeddings), tf2onnx chains of
    # Identity before outputs; a graph may also return an input unchanged and the same tensor
    # under two output names. No Identity survives as a kernel; every output is still returned.
    w = rand(5, 3, seed=1)
    model = _model(
        [node("Identity", ["w"], ["w_tied"]), node("Identity", ["w_tied"], ["w_tied2"]),
         node("Gemm", ["x", "w"], ["h"], transB=1),
         node("MatMul", ["h", "w_tied2"], ["back"]),
         node("Identity", ["back"], ["i1"]), node("Identity", ["i1"], ["y"]),
         node("Identity", ["back"], ["y_again"]),
         node("Identity", ["x"], ["x_out"])],
        {"x": (TensorProto.FLOAT, [2, 3])},
        {"y": (TensorProto.FLOAT, None), "y_again": (TensorProto.FLOAT, None),
         "x_out": (TensorProto.FLOAT, None), "x": (TensorProto.FLOAT, None)},
        {"w": w})
    assert "identity" not in main_ops(model)
    x = rand(2, 3, seed=2)
    got = check_against_ort(model, {"x": x}, tmp_path)
    assert list(got) == ["y", "y_again", "x_out", "x"]
    np.testing.assert_array_equal(got["x_out"], x)
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["y"], got["y_again"])


def test_shape_arithmetic_on_a_symbolic_batch_folds(tmp_path: Path) -> None:
    # torch's x.view(x.size(0), -1) and x.reshape(b, h, -1) with dynamic_axes: the target shape
    # is computed from Shape(x) in the file. With --input-shape every shape is known,
    # so the whole chain (Shape, Gather, Unsqueeze, Concat, Div) is computed at import and the
    # bundle does only the reshapes.
    model = _model(
        [node("Shape", ["x"], ["shape"]),
         node("Gather", ["shape", "zero"], ["batch"], axis=0),
         node("Gather", ["shape", "one"], ["chan"], axis=0),
         node("Div", ["chan", "two"], ["half"]),
         node("Unsqueeze", ["batch", "axes"], ["batch1"]),
         node("Unsqueeze", ["half", "axes"], ["half1"]),
         node("Concat", ["batch1", "half1", "minus_one"], ["target"], axis=0),
         node("Reshape", ["x", "target"], ["split"]),
         node("Concat", ["batch1", "minus_one"], ["flat_shape"], axis=0),
         node("Relu", ["split"], ["r"]),
         node("Reshape", ["r", "flat_shape"], ["y"])],
        {"x": (TensorProto.FLOAT, ["batch", 4, 3])},
        {"y": (TensorProto.FLOAT, ["batch", 12])},
        {"zero": np.array(0, np.int64), "one": np.array(1, np.int64),
         "two": np.array(2, np.int64), "axes": np.array([0], np.int64),
         "minus_one": np.array([-1], np.int64)}, opset=13)
    # without --input-shape the chain folds to size expressions (batch, 2, -1) and (batch, -1)
    # (issue 12): the same three operators, one bundle for every batch
    assert main_ops(model) == ["reshape", "relu", "reshape"]
    for n in (1, 3):
        got = check_against_ort(model, {"x": rand(n, 4, 3)}, tmp_path)
        assert got["y"].shape == (n, 12)
    mod, info = import_onnx(model, {"x": (5, 4, 3)})
    assert main_ops(model, input_shapes={"x": (5, 4, 3)}) == ["reshape", "relu", "reshape"]
    assert info.folded_nodes == 8
    got = check_against_ort(model, {"x": rand(5, 4, 3)}, tmp_path, input_shapes={"x": (5, 4, 3)})
    assert got["y"].shape == (5, 12)


def test_dim_value_minus_one_fixed_by_input_shape(tmp_path: Path) -> None:
    model = make_model([node("Relu", ["x"], ["y"])], {"x": [1, 3, 4]}, ["y"])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    mod, _ = import_onnx(model)   # the unknown dim stays symbolic (docs/symbolic-shapes.md)
    assert str(mod.main.params[0].type.shape[0]) == "x_0"
    check_against_ort(model, {"x": rand(5, 3, 4)}, tmp_path, input_shapes={"x": (5, 3, 4)})


def test_symbolic_dims_through_the_command_line(tmp_path: Path, run_cli) -> None:
    model = make_model([node("Softmax", ["x"], ["y"], axis=-1)], {"x": ["batch", "seq", 8]},
                       ["y"])
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc")
    assert proc.returncode == 0, proc.stderr   # batch and seq stay symbolic
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


def test_declared_intermediate_shapes_are_wrong_and_ignored(tmp_path: Path) -> None:
    # Exporters also write value_info for intermediate tensors; a stale one (here from a model
    # edited after export) must not change what mlcpack infers.
    model = _model([node("MatMul", ["a", "w"], ["h"]), node("Relu", ["h"], ["y"])],
                   {"a": (TensorProto.FLOAT, [2, 3])}, {"y": (TensorProto.FLOAT, None)},
                   {"w": rand(3, 5, seed=1)})
    model.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [9, 1]))
    got = check_against_ort(model, {"a": rand(2, 3)}, tmp_path)
    assert got["y"].shape == (2, 5)


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
