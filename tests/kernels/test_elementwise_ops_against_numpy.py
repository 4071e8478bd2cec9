"""Compiled kernels of the bitwise, shift, shrink, prod/cumprod, hardmax, one_hot, topk, scatter
and gather_nd rows against their numpy references, on odd shapes; and ONNX nodes using them
against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from mlcpack.packager.ops import get_op

from helpers import run_op

RNG = np.random.default_rng(3)


def check(op, inputs, tmp_path, const_mask=None, rtol=1e-6, atol=1e-6, **attrs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    got = run_op(op, inputs, tmp_path, const_mask=const_mask, **attrs)
    want = get_op(op).reference(*inputs, **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "uint64"])
def test_bitwise_and_shifts(dtype, tmp_path):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (3, 5, 7), dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, (5, 1), dtype=dtype, endpoint=True)
    for op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        check(op, [a, b], tmp_path / op, rtol=0, atol=0)
    check("bitwise_not", [a], tmp_path / "not", rtol=0, atol=0)
    if dtype.startswith("uint"):
        bits = info.bits
        amount = RNG.integers(0, bits + 3, (5, 7)).astype(dtype)  # some past the width: 0
        for op in ("left_shift", "right_shift"):
            got = check(op, [a, amount], tmp_path / op, rtol=0, atol=0)
            assert np.all(got[:, amount >= bits] == 0)


def test_shrink_thresholded_relu(tmp_path):
    x = RNG.standard_normal((4, 9, 3)).astype(np.float32) * 2
    check("shrink", [x], tmp_path / "s", lambd=0.7, bias=0.3)
    check("thresholded_relu", [x], tmp_path / "t", alpha=0.4)


@pytest.mark.parametrize(("axes", "keepdims"), [(None, True), ((1,), False), ((0, 2), True)])
def test_prod(axes, keepdims, tmp_path):
    x = (RNG.uniform(0.5, 1.5, (3, 7, 5))).astype(np.float32)
    check("prod", [x], tmp_path, rtol=1e-5, axes=axes, keepdims=keepdims)
    xi = RNG.integers(-3, 4, (3, 7, 5)).astype(np.int32)
    check("prod", [xi], tmp_path / "i", rtol=0, atol=0, axes=axes, keepdims=keepdims)


@pytest.mark.parametrize(("exclusive", "reverse"), [(False, False), (True, False), (True, True)])
def test_cumprod(exclusive, reverse, tmp_path):
    x = RNG.uniform(0.5, 1.5, (3, 11)).astype(np.float32)
    check("cumprod", [x], tmp_path, rtol=1e-5, axis=1, exclusive=exclusive, reverse=reverse)
    xi = RNG.integers(-3, 4, (5, 3)).astype(np.int64)
    check("cumprod", [xi], tmp_path / "i", rtol=0, atol=0, axis=0, exclusive=exclusive,
          reverse=reverse)


def test_hardmax_first_of_ties(tmp_path):
    x = RNG.integers(0, 3, (3, 7, 5)).astype(np.float32)  # many ties: the first one wins
    for axis in (0, 1, 2):
        got = check("hardmax", [x], tmp_path / str(axis), axis=axis)
        assert np.all(got.sum(axis=axis) == 1)


def test_one_hot(tmp_path):
    idx = RNG.integers(-5, 7, (3, 4)).astype(np.int64)  # negatives wrap, >= depth: all off
    values = np.array([-1.5, 2.0], np.float32)
    for axis in (-1, 0, 1):
        check("one_hot", [idx, values], tmp_path / str(axis), depth=5, axis=axis)


@pytest.mark.parametrize(("largest", "axis"), [(True, -1), (False, 0), (True, 1)])
def test_topk_indices_with_ties(largest, axis, tmp_path):
    x = RNG.integers(0, 4, (6, 9, 3)).astype(np.float32)
    got = check("topk", [x], tmp_path, rtol=0, atol=0, k=min(4, x.shape[axis]), axis=axis,
                largest=largest)
    assert got.dtype == np.int64
    xu = RNG.integers(0, 2**63, (5, 7), dtype=np.uint64)
    check("topk", [xu], tmp_path / "u", rtol=0, atol=0, k=7, axis=1, largest=largest)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction, tmp_path):
    data = RNG.standard_normal((5, 6, 4)).astype(np.float32)
    # indices smaller than data on the other axes; duplicates only where they are defined
    updates = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    if reduction == "none":
        idx = np.stack([RNG.permutation(6)[:4] for _ in range(3 * 2)]).reshape(3, 2, 4)
        idx = idx.transpose(0, 2, 1).astype(np.int64) - 3  # distinct per row, some negative
    else:
        idx = RNG.integers(-6, 6, (3, 4, 2)).astype(np.int64)
    check("scatter_elements", [data, idx, updates], tmp_path, rtol=1e-5, axis=1,
          reduction=reduction)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction, tmp_path):
    data = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    if reduction == "none":
        flat = RNG.permutation(20)[:6]
        idx = np.stack([flat // 5, flat % 5], -1).reshape(2, 3, 2) - np.array([4, 0])
    else:
        idx = np.stack([RNG.integers(0, 4, (2, 3)), RNG.integers(-5, 5, (2, 3))], -1)
    updates = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    check("scatter_nd", [data, idx.astype(np.int64), updates], tmp_path, rtol=1e-5,
          reduction=reduction)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims, tmp_path):
    data = RNG.standard_normal((3, 4, 5, 2)).astype(np.float32)
    if batch_dims == 0:
        idx = np.stack([RNG.integers(-3, 3, (2, 7)), RNG.integers(0, 4, (2, 7))], -1)
    else:
        idx = np.stack([RNG.integers(0, 4, (3, 7)), RNG.integers(-5, 5, (3, 7))], -1)
    check("gather_nd", [data, idx.astype(np.int64)], tmp_path, batch_dims=batch_dims)


# ---- ONNX nodes against onnxruntime -------------------------------------------------------------

def _onnx_vs_ort(tmp_path, node, inputs, outputs, feeds, initializers=(), opset=18):
    import onnxruntime as ort

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    tmp_path.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "m.mlc", ExportOptions())
    with load(tmp_path / "m.mlc") as m:
        got = m.run(feeds)
    return [got[o.name] for o in outputs], want


def test_onnx_topk_and_scatter_nd_vs_onnxruntime(tmp_path):
    x = RNG.integers(0, 5, (3, 10)).astype(np.float32)
    k = helper.make_tensor("k", TensorProto.INT64, [1], [4])
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0)
    got, want = _onnx_vs_ort(
        tmp_path / "topk", node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 10])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [3, 4]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [3, 4])], {"x": x}, [k])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])

    data = RNG.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([[1], [3], [1]], np.int64)
    upd = RNG.standard_normal((3, 3)).astype(np.float32)
    node = helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction="add")
    got, want = _onnx_vs_ort(
        tmp_path / "snd", node,
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [3, 1]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        {"d": data, "i": idx, "u": upd})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_onnx_bad_bitshift_direction_is_an_export_error(tmp_path):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportError

    node = helper.make_node("BitShift", ["a", "b"], ["y"], direction="UP")
    vi = [helper.make_tensor_value_info(n, TensorProto.UINT8, [3]) for n in "ab"]
    graph = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info(
        "y", TensorProto.UINT8, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ExportError, match="direction 'UP'"):
        import_onnx(model)


# ---- trigonometric and hyperbolic rows ----------------------------------------------------------

TRIG_INPUTS = {
    "sin": (-40.0, 40.0), "cos": (-40.0, 40.0), "tan": (-1.5, 1.5), "asin": (-1.0, 1.0),
    "acos": (-1.0, 1.0), "atan": (-50.0, 50.0), "sinh": (-10.0, 10.0), "cosh": (-10.0, 10.0),
    "asinh": (-1e4, 1e4), "acosh": (1.0, 1e4), "atanh": (-0.999, 0.999),
}


@pytest.mark.parametrize("op", sorted(TRIG_INPUTS))
def test_trig_rows(op, tmp_path):
    lo, hi = TRIG_INPUTS[op]
    x = RNG.uniform(lo, hi, (3, 37)).astype(np.float32)
    check(op, [x], tmp_path, rtol=2e-7, atol=0)


def test_trig_float64_goes_through_float32_kernels(tmp_path):
    x = RNG.uniform(-3.0, 3.0, (5, 7))
    got = run_op("sin", [x], tmp_path)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.sin(x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("target", ["aarch64", "x86-64-v2"])
def test_trig_kernels_import_nothing_on_other_targets(target):
    """Every trig row in one module, cross-compiled: only memcpy/memmove/memset may be imported
    (the 2/pi table is internal read-only data, not a symbol to resolve)."""
    from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
    from mlcpack.packager.codegen.objinfo import undefined_symbols
    from mlcpack.packager.export import compile_module
    from mlcpack.packager.ir import BlockBuilder

    bb = BlockBuilder()
    x = bb.input("x", (4, 9), "float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit_output(bb.emit_op(op, x)) for op in sorted(TRIG_INPUTS)]
        bb.emit_func_output(outs, names=sorted(TRIG_INPUTS))
    _, compiled, _ = compile_module(bb.get(), target=target)
    assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS)
