"""The ONNX frontend: models built with onnx.helper, imported, exported to a bundle, run by the
runtime and compared with ONNX Runtime; opset dispatch; refusals with one-line errors."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx, supported_ops
from mlcpack.frontends.onnx.registry import converter, lookup
from mlcpack.packager.export import ExportError, export_module
from mlcpack.packager.ir import Call, module_text
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
TOL = {"rtol": 1e-4, "atol": 1e-4}
_counter = itertools.count()


# ---- helpers ------------------------------------------------------------------------------------

def make_model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, Sequence[int | str]],
               outputs: Sequence[str], initializers: Mapping[str, np.ndarray] | None = None,
               opset: int = 17, extra_opsets: Mapping[str, int] | None = None) -> onnx.ModelProto:
    """A float32 model; outputs have no declared shape (mlcpack infers every shape)."""
    graph = helper.make_graph(
        list(nodes), "test_graph",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()])
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    # IR version 7 keeps old-opset models loadable by onnxruntime.
    return helper.make_model(graph, opset_imports=opsets, ir_version=7 if opset < 13 else 8)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run_bundle(model: onnx.ModelProto | str | Path, feeds: Mapping[str, np.ndarray],
               tmp_path: Path, input_shapes: Mapping[str, Sequence[int]] | None = None
               ) -> dict[str, np.ndarray]:
    mod, info = import_onnx(model, input_shapes)
    path = tmp_path / f"model{next(_counter)}.mlc"
    export_module(mod, path)
    return load(path).run({info.input_names[k]: v for k, v in feeds.items()})


def check_against_ort(model: onnx.ModelProto | str | Path, feeds: Mapping[str, np.ndarray],
                      tmp_path: Path, input_shapes: Mapping[str, Sequence[int]] | None = None
                      ) -> dict[str, np.ndarray]:
    got = run_bundle(model, feeds, tmp_path, input_shapes)
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, dict(feeds))
    for out, ref in zip(proto.graph.output, expected):
        assert got[out.name].shape == ref.shape, out.name
        np.testing.assert_allclose(got[out.name], ref, **TOL, err_msg=out.name)
    return got


def node(op: str, inputs: Sequence[str], outputs: Sequence[str], domain: str = "",
         **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), domain=domain, **attrs)


def main_ops(model: onnx.ModelProto, **kw: object) -> list[str]:
    mod, _ = import_onnx(model, **kw)
    return [b.value.op for b in mod.main.bindings() if isinstance(b.value, Call)]


# ---- whole models -------------------------------------------------------------------------------

def test_gemm_mlp(tmp_path: Path) -> None:
    w0, b0, w1, b1 = rand(32, 20, seed=1), rand(32, seed=2), rand(32, 10, seed=3), rand(10, seed=4)
    model = make_model(
        [node("Gemm", ["x", "w0", "b0"], ["h"], transB=1),
         node("Relu", ["h"], ["r"]),
         node("Gemm", ["r", "w1", "b1"], ["logits"], alpha=0.5, beta=2.0)],
        {"x": [3, 20]}, ["logits"], {"w0": w0, "b0": b0, "w1": w1, "b1": b1})
    check_against_ort(model, {"x": rand(3, 20, seed=5)}, tmp_path)


def test_gemm_trans_a_and_runtime_c(tmp_path: Path) -> None:
    model = make_model([node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=1.5,
                             beta=0.25)],
                       {"a": [6, 4], "c": [1, 5]}, ["y"], {"b": rand(5, 6, seed=1)})
    check_against_ort(model, {"a": rand(6, 4), "c": rand(1, 5, seed=2)}, tmp_path)


def test_cnn(tmp_path: Path) -> None:
    model = make_model(
        [node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         node("Relu", ["c"], ["r"]),
         node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         node("Flatten", ["p"], ["f"], axis=1),
         node("Gemm", ["f", "fw", "fb"], ["g"], transB=1),
         node("Softmax", ["g"], ["probs"], axis=1)],
        {"x": [1, 2, 8, 8]}, ["probs"],
        {"w": rand(4, 2, 3, 3, seed=1), "b": rand(4, seed=2), "fw": rand(10, 64, seed=3),
         "fb": rand(10, seed=4)})
    check_against_ort(model, {"x": rand(1, 2, 8, 8, seed=5)}, tmp_path)


@pytest.mark.parametrize("name, sample", [("mlp", "digit_3"), ("mlp", "digit_7"),
                                          ("cnn", "digit_3_cnn"), ("cnn", "digit_7_cnn")])
def test_artifact_models_on_samples(tmp_path: Path, name: str, sample: str) -> None:
    x = np.load(ARTIFACTS / "samples" / f"{sample}.npy")
    got = check_against_ort(ARTIFACTS / f"{name}.onnx", {"x": x}, tmp_path)
    assert int(np.argmax(next(iter(got.values())))) == int(sample[6])


@pytest.mark.parametrize("name, shape", [("mlp", (1, 784)), ("cnn", (1, 1, 28, 28))])
def test_artifact_models_on_random_input(tmp_path: Path, name: str, shape: tuple) -> None:
    x = np.random.default_rng(7).random(shape, dtype=np.float32)
    check_against_ort(ARTIFACTS / f"{name}.onnx", {"x": x}, tmp_path)


# ---- convolution and pooling --------------------------------------------------------------------

CONV_CASES = {
    "groups": ({"group": 2, "pads": [1, 1, 1, 1]}, (4, 2, 3, 3)),
    "depthwise": ({"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}, (4, 1, 3, 3)),
    "dilations": ({"dilations": [2, 2], "pads": [2, 2, 2, 2]}, (3, 4, 3, 3)),
    "stride2": ({"strides": [2, 2]}, (3, 4, 3, 3)),
    "asymmetric_pads": ({"pads": [0, 1, 2, 0]}, (3, 4, 3, 2)),
    "same_upper": ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (3, 4, 4, 4)),
    "same_lower": ({"auto_pad": "SAME_LOWER"}, (3, 4, 2, 2)),
    "valid": ({"auto_pad": "VALID", "strides": [1, 2]}, (3, 4, 3, 3)),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_attributes(tmp_path: Path, case: str) -> None:
    attrs, wshape = CONV_CASES[case]
    model = make_model([node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": [1, 4, 9, 8]},
                       ["y"], {"w": rand(*wshape, seed=1), "b": rand(wshape[0], seed=2)})
    check_against_ort(model, {"x": rand(1, 4, 9, 8)}, tmp_path)


def test_conv1d_and_pool1d(tmp_path: Path) -> None:
    model = make_model(
        [node("Conv", ["x", "w"], ["c"], pads=[1, 2], dilations=[2]),
         node("MaxPool", ["c"], ["y"], kernel_shape=[3], strides=[2])],
        {"x": [2, 3, 12]}, ["y"], {"w": rand(5, 3, 3, seed=1)})
    check_against_ort(model, {"x": rand(2, 3, 12)}, tmp_path)


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_count_include_pad(tmp_path: Path, count_include_pad: int) -> None:
    model = make_model([node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                             pads=[1, 1, 1, 1], count_include_pad=count_include_pad)],
                       {"x": [1, 2, 7, 6]}, ["y"])
    check_against_ort(model, {"x": rand(1, 2, 7, 6)}, tmp_path)


def test_pooling_variants(tmp_path: Path) -> None:
    model = make_model(
        [node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
         node("AveragePool", ["x"], ["a"], kernel_shape=[2, 2], auto_pad="SAME_UPPER"),
         node("GlobalAveragePool", ["x"], ["ga"]),
         node("GlobalMaxPool", ["x"], ["gm"])],
        {"x": [1, 3, 8, 7]}, ["m", "a", "ga", "gm"])
    check_against_ort(model, {"x": rand(1, 3, 8, 7)}, tmp_path)


def test_batch_normalization(tmp_path: Path) -> None:
    c = 4
    params = {"scale": rand(c, seed=1), "bias": rand(c, seed=2), "mean": rand(c, seed=3),
              "var": np.abs(rand(c, seed=4)) + 0.5}
    model = make_model(
        [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3)],
        {"x": [1, 3, 5, 5]}, ["y"], {"w": rand(c, 3, 3, 3, seed=5), **params})
    check_against_ort(model, {"x": rand(1, 3, 5, 5)}, tmp_path)
    # Folded at import into one multiply and one add by constants.
    assert main_ops(model) == ["nn.conv2d", "multiply", "add"]


# ---- shapes -------------------------------------------------------------------------------------

def test_reshape_zero_and_minus_one(tmp_path: Path) -> None:
    model = make_model(
        [node("Reshape", ["x", "s1"], ["a"]),
         node("Reshape", ["a", "s2"], ["y"])],
        {"x": [2, 3, 4, 5]}, ["y"],
        {"s1": np.array([0, -1, 5], np.int64), "s2": np.array([0, 3, 0, -1], np.int64)})
    got = check_against_ort(model, {"x": rand(2, 3, 4, 5)}, tmp_path)
    assert got["y"].shape == (2, 3, 5, 4)  # 0 copies the dim at the same index of the input


def test_shape_gather_unsqueeze_concat_reshape_folds(tmp_path: Path) -> None:
    # The pattern PyTorch emits for x.view(x.size(0), -1).
    model = make_model(
        [node("Shape", ["x"], ["shape"]),
         node("Gather", ["shape", "zero"], ["batch"], axis=0),
         node("Unsqueeze", ["batch", "axes"], ["batch1"]),
         node("Concat", ["batch1", "minus_one"], ["target"], axis=0),
         node("Reshape", ["x", "target"], ["flat"]),
         node("Relu", ["flat"], ["y"])],
        {"x": [2, 3, 4]}, ["y"],
        {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
         "minus_one": np.array([-1], np.int64)}, opset=13)
    assert main_ops(model) == ["reshape", "relu"]
    mod, info = import_onnx(model)
    assert info.folded_nodes == 4
    check_against_ort(model, {"x": rand(2, 3, 4)}, tmp_path)


def test_squeeze_unsqueeze_transpose_concat_flatten(tmp_path: Path) -> None:
    model = make_model(
        [node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
         node("Squeeze", ["u"], ["s"], axes=[0]),
         node("Transpose", ["s"], ["t"], perm=[2, 0, 1, 3]),
         node("Concat", ["t", "t"], ["c"], axis=-1),
         node("Flatten", ["c"], ["y"], axis=-2)],
        {"x": [2, 3, 4]}, ["y"], opset=11)
    check_against_ort(model, {"x": rand(2, 3, 4)}, tmp_path)


def test_pad_constant(tmp_path: Path) -> None:
    model = make_model([node("Pad", ["x", "pads", "value"], ["y"])], {"x": [1, 2, 3, 4]}, ["y"],
                       {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64),
                        "value": np.array(0.5, np.float32)})
    check_against_ort(model, {"x": rand(1, 2, 3, 4)}, tmp_path)


# ---- softmax, clip, matmul: opset-dependent semantics -------------------------------------------

@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_by_opset(tmp_path: Path, opset: int) -> None:
    # On a 3-D input, axis=1 means "flatten from axis 1" before opset 13, "axis 1" from 13 on.
    model = make_model([node("Softmax", ["x"], ["y"], axis=1),
                        node("LogSoftmax", ["x"], ["z"], axis=1)],
                       {"x": [2, 3, 4]}, ["y", "z"], opset=opset)
    got = check_against_ort(model, {"x": rand(2, 3, 4)}, tmp_path)
    sums = got["y"].sum(axis=(1, 2) if opset < 13 else 1)
    np.testing.assert_allclose(sums, np.ones_like(sums), rtol=1e-5)


@pytest.mark.parametrize("opset", [6, 13])
def test_clip_by_opset(tmp_path: Path, opset: int) -> None:
    if opset < 11:
        nodes = [node("Clip", ["x"], ["y"], min=-0.5, max=0.25),
                 node("Clip", ["x"], ["z"], max=0.1)]
        inits: dict[str, np.ndarray] = {}
    else:
        nodes = [node("Clip", ["x", "lo", "hi"], ["y"]), node("Clip", ["x", "", "hi2"], ["z"])]
        inits = {"lo": np.array(-0.5, np.float32), "hi": np.array(0.25, np.float32),
                 "hi2": np.array(0.1, np.float32)}
    model = make_model(nodes, {"x": [3, 5]}, ["y", "z"], inits, opset=opset)
    if opset >= 7:
        check_against_ort(model, {"x": rand(3, 5)}, tmp_path)
    got = run_bundle(model, {"x": rand(3, 5)}, tmp_path)
    np.testing.assert_allclose(got["y"], np.clip(rand(3, 5), -0.5, 0.25))
    np.testing.assert_allclose(got["z"], np.minimum(rand(3, 5), 0.1))


@pytest.mark.parametrize("a_shape, b_shape", [
    ((2, 3, 4, 5), (2, 3, 5, 6)),      # batched
    ((2, 1, 4, 5), (3, 5, 2)),         # broadcast batch dims
    ((4, 5), (5,)),                    # 1-D right operand
    ((5,), (2, 5, 3)),                 # 1-D left operand
])
def test_matmul_shapes(tmp_path: Path, a_shape: tuple, b_shape: tuple) -> None:
    model = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": a_shape, "b": b_shape}, ["y"])
    check_against_ort(model, {"a": rand(*a_shape, seed=1), "b": rand(*b_shape, seed=2)}, tmp_path)


# ---- elementwise --------------------------------------------------------------------------------

def test_activations_and_arithmetic(tmp_path: Path) -> None:
    model = make_model(
        [node("Sigmoid", ["x"], ["a"]), node("Tanh", ["x"], ["b"]), node("Erf", ["x"], ["c"]),
         node("LeakyRelu", ["x"], ["d"], alpha=0.2), node("Abs", ["x"], ["e"]),
         node("Exp", ["e"], ["f"]), node("Log", ["f"], ["g"]), node("Sqrt", ["f"], ["h"]),
         node("Neg", ["x"], ["i"]), node("Sub", ["a", "b"], ["j"]), node("Div", ["c", "h"], ["k"]),
         node("Max", ["a", "b", "c"], ["l"]), node("Min", ["d", "e"], ["m"]),
         node("Sum", ["g", "h", "i"], ["n"]), node("Mul", ["x", "row"], ["o"]),
         node("Add", ["o", "col"], ["p"]), node("Gelu", ["x"], ["q"]),
         node("Gelu", ["x"], ["r"], approximate="tanh"), node("HardSwish", ["x"], ["s"]),
         node("Elu", ["x"], ["t"], alpha=0.7), node("Softplus", ["x"], ["u"]),
         node("PRelu", ["x", "slope"], ["v"]), node("Pow", ["x", "two"], ["w"]),
         node("Reciprocal", ["h"], ["z"])],
        {"x": [3, 4]}, list("abcdefghijklmnopqrstuvwz"),
        {"row": rand(4, seed=1), "col": rand(3, 1, seed=2), "slope": rand(4, seed=3),
         "two": np.array(2.0, np.float32)}, opset=20)
    check_against_ort(model, {"x": rand(3, 4) * 3}, tmp_path)


def test_reductions(tmp_path: Path) -> None:
    model = make_model(
        [node("ReduceMean", ["x"], ["a"], axes=[1], keepdims=1),
         node("ReduceMax", ["x"], ["b"], axes=[-1], keepdims=0),
         node("ReduceMin", ["x"], ["c"], keepdims=0),
         node("ReduceSum", ["x", "axes"], ["d"], keepdims=0),
         node("ReduceL2", ["x"], ["e"], axes=[0, 2]),
         node("ReduceLogSumExp", ["x"], ["f"], axes=[1], keepdims=0)],
        {"x": [2, 3, 4]}, list("abcdef"), {"axes": np.array([0, 2], np.int64)}, opset=13)
    check_against_ort(model, {"x": rand(2, 3, 4)}, tmp_path)


# ---- graph plumbing -----------------------------------------------------------------------------

def test_weights_as_constant_nodes(tmp_path: Path) -> None:
    w, b = rand(4, 3, seed=1), rand(4, seed=2)
    model = make_model(
        [node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
         node("Constant", [], ["b"], value=numpy_helper.from_array(b)),
         node("Constant", [], ["s"], value_float=0.5),
         node("Gemm", ["x", "w", "b"], ["g"], transB=1),
         node("Mul", ["g", "s"], ["y"])],
        {"x": [2, 3]}, ["y"])
    check_against_ort(model, {"x": rand(2, 3)}, tmp_path)


def test_identity_dropout_chain_and_output_names(tmp_path: Path) -> None:
    model = make_model(
        [node("Identity", ["x"], ["i1"]), node("Identity", ["i1"], ["i2"]),
         node("Dropout", ["i2"], ["d"], ratio=0.3), node("Relu", ["d"], ["out/relu:0"]),
         node("Identity", ["out/relu:0"], ["same"])],
        {"x": [2, 5]}, ["out/relu:0", "same"], opset=11)
    got = check_against_ort(model, {"x": rand(2, 5)}, tmp_path)
    assert set(got) == {"out/relu:0", "same"}
    assert main_ops(model) == ["relu"]


def test_symbolic_dims_need_input_shapes(tmp_path: Path) -> None:
    model = make_model([node("Relu", ["x"], ["y"])], {"x": ["batch", 3, 4]}, ["y"])
    mod, _ = import_onnx(model)   # 'batch' stays symbolic (docs/symbolic-shapes.md)
    assert str(mod.main.params[0].type) == 'Tensor((batch, 3, 4), "float32")'
    with pytest.raises(ExportError, match="does not match the shape"):
        import_onnx(model, {"x": (2, 5, 4)})
    with pytest.raises(ExportError, match="'y', which is not an input"):
        import_onnx(model, {"y": (2, 3, 4)})
    check_against_ort(model, {"x": rand(2, 3, 4)}, tmp_path, input_shapes={"x": (2, 3, 4)})


def test_input_names_kept_or_mapped(tmp_path: Path) -> None:
    model = make_model([node("Add", ["input.1", "input_1"], ["y"])],
                       {"input.1": [2], "input_1": [2]}, ["y"])
    mod, info = import_onnx(model)
    # A valid identifier keeps its exact name; the other is sanitized without taking it.
    assert info.input_names["input_1"] == "input_1"
    assert info.renamed_inputs == {"input.1": info.input_names["input.1"]}
    assert [p.name for p in mod.main.params] == [info.input_names["input.1"], "input_1"]
    check_against_ort(model, {"input.1": rand(2, seed=1), "input_1": rand(2, seed=2)}, tmp_path)


def test_initializer_listed_as_input_is_a_constant() -> None:
    model = make_model([node("Add", ["x", "w"], ["y"])], {"x": [2], "w": [2]}, ["y"],
                       {"w": rand(2)})
    mod, info = import_onnx(model)
    assert [p.name for p in mod.main.params] == ["x"]
    assert "const.w" in module_text(mod)


# ---- refusals -----------------------------------------------------------------------------------

def test_unsupported_ops_are_listed_together_before_converting() -> None:
    model = make_model(
        [node("FusedConv", ["x", "w"], ["a"], domain="com.microsoft"),
         node("Relu", ["a"], ["b"]),
         node("StringNormalizer", ["b"], ["c"]),
         node("Foo", ["c"], ["d"]),
         node("Foo", ["d"], ["y"])],
        {"x": [1, 1, 4, 4]}, ["y"], {"w": rand(1, 1, 1, 1)}, extra_opsets={"com.microsoft": 1})
    with pytest.raises(ExportError) as err:
        import_onnx(model)
    message = str(err.value)
    assert message == ("test_graph uses 3 operators mlcpack does not support: "
                       "com.microsoft.FusedConv (opset 1), StringNormalizer (opset 17), "
                       "Foo (opset 17)")


def test_unsupported_ops_inside_subgraphs_are_listed_with_the_others() -> None:
    """If branches and Loop bodies are checked with the main graph, before anything converts
    (in node order, then attribute order: onnx.helper sorts else_branch before then_branch)."""
    then_g = helper.make_graph([node("Bar", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([node("Loop", ["n", ""], ["e"], body=helper.make_graph(
        [node("Baz", ["c"], ["c2"]), node("Identity", ["x"], ["s"])], "body",
        [helper.make_tensor_value_info(n, t, []) for n, t in (("i", TensorProto.INT64),
                                                              ("c", TensorProto.BOOL))],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [2])]))], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 2])])
    model = make_model([node("Foo", ["x"], ["a"]),
                        node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
                       {"x": [2]}, ["y"], {"cond": np.array(True), "n": np.array(1, np.int64)})
    with pytest.raises(ExportError) as err:
        import_onnx(model)
    assert str(err.value) == ("test_graph uses 3 operators mlcpack does not support: "
                              "Foo (opset 17), Baz (opset 17), Bar (opset 17)")


def test_unsupported_op_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(make_model([node("Foo", ["x"], ["y"])], {"x": [1]}, ["y"]), path)
    with pytest.raises(ExportError, match=r"^model.onnx uses 1 operator mlcpack does not support: "
                                          r"Foo \(opset 17\)$"):
        import_onnx(path)


def test_op_known_only_from_a_later_opset_is_unsupported() -> None:
    model = make_model([node("Gelu", ["x"], ["y"])], {"x": [2]}, ["y"], opset=17)
    with pytest.raises(ExportError, match=r"Gelu \(opset 17\)"):
        import_onnx(model)


@pytest.mark.parametrize("content", [b"this is not a protobuf \xff\xfe", b""])
def test_invalid_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ExportError, match=r"^model.onnx is not a valid ONNX (file|model): ") as err:
        import_onnx(path)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="nothere.onnx: no such file"):
        import_onnx(tmp_path / "nothere.onnx")


def test_shape_computed_at_run_time_is_refused() -> None:
    """A target shape computed from activations is refused; one fed as a graph input is read
    at run start (issue 37 item 2: its values bind size variables, tests/runtime/
    test_shape_inputs.py)."""
    graph = helper.make_graph([node("Cast", ["s"], ["shape"], to=TensorProto.INT64),
                               node("Reshape", ["x", "shape"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ExportError, match=r"Reshape node 'y' \(opset 17\): the target shape "
                                          r"\(input 1\) must be a constant known at export"):
        import_onnx(model)
    fed = helper.make_graph([node("Reshape", ["x", "shape"], ["y"])], "g",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                             helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    mod, _ = import_onnx(helper.make_model(fed, opset_imports=[helper.make_opsetid("", 17)]))
    assert mod.value_vars == [["shape", "reshape", ["shape_0", "shape_1"], [2, 3], 0]]


def test_unhandled_attribute_and_unused_output_refused() -> None:
    stats = {k: np.ones(1, np.float32) for k in ("s", "b", "m", "v")}
    model = make_model([node("BatchNormalization", ["x", "s", "b", "m", "v"],
                             ["y", "mean", "var", "saved_mean", "saved_var"])],
                       {"x": [1, 1, 4, 4]}, ["y", "mean"], stats, opset=9)
    with pytest.raises(ExportError, match="output 1 of BatchNormalization node 'y'"):
        import_onnx(model)
    bad = make_model([node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2],
                           auto_pad="SAME")], {"x": [1, 1, 6, 6]}, ["y"], opset=19)
    with pytest.raises(ExportError, match="auto_pad"):
        import_onnx(bad)


def test_complex_inputs_refused() -> None:
    graph = helper.make_graph([node("Identity", ["ids"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.COMPLEX64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.COMPLEX64, [4])])
    with pytest.raises(ExportError, match="complex64 tensors at run time are not supported yet"):
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


# ---- the registry -------------------------------------------------------------------------------

def test_registry_dispatch_by_opset() -> None:
    assert lookup("", "Softmax", 11).since == 1
    assert lookup("", "Softmax", 13).since == 13
    assert lookup("", "Softmax", 21).since == 13
    assert lookup("ai.onnx", "Clip", 12).since == 11
    assert lookup("", "Clip", 6).since == 1
    assert lookup("", "Gelu", 19) is None
    assert lookup("com.microsoft", "Conv", 1) is None


def test_registry_refuses_duplicates() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        converter("Relu", since=1)(lambda ctx: ctx.input(0))


def test_supported_ops_lists_core_operators() -> None:
    names = {s.op_type for s in supported_ops()}
    assert {"Conv", "Gemm", "MatMul", "Relu", "MaxPool", "Softmax", "Reshape", "Flatten",
            "BatchNormalization", "Concat", "Shape", "Gather"} <= names
