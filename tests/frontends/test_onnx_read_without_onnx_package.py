"""The ONNX frontend reads models without ``import onnx`` (frontends/onnx/proto.py): importing
onnx costs ~0.9 CPU-s, nearly all of it ml_dtypes, more than a warm export of a float32 model.
The stand-ins give what onnx's own helpers give, and a later ``import onnx`` shares the classes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ARTIFACTS
from mlcpack.frontends.onnx import proto


def test_an_onnx_import_and_its_reference_setup_leave_onnx_and_ml_dtypes_unimported() -> None:
    code = (
        "import sys\n"
        "from mlcpack.frontends.loader import load_model\n"
        f"loaded = load_model({str(ARTIFACTS / 'cnn.onnx')!r}, reference=True)\n"
        "assert loaded.modules, loaded\n"
        "print(sorted(m for m in ('onnx', 'ml_dtypes', 'onnx.helper') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out


def test_a_later_import_onnx_shares_the_modules() -> None:
    """onnx imported after the stand-ins loaded its submodules runs on them (onnx.reference
    too), and the documented ways to import them give the same modules."""
    code = (
        "from mlcpack.frontends.onnx import proto\n"
        "proto.validation_error()\n"
        "import onnx, onnx.reference, onnx.checker\n"
        "from onnx import onnx_ml_pb2, onnx_cpp2py_export\n"
        "assert onnx_ml_pb2 is proto.pb and onnx.ModelProto is proto.ModelProto\n"
        "assert onnx.checker.ValidationError is proto.validation_error()\n"
        "assert onnx_cpp2py_export.checker.ValidationError is proto.validation_error()\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "ok", out


def test_the_classes_are_onnx_own() -> None:
    assert proto.ModelProto is onnx.ModelProto
    assert proto.TensorProto is onnx.TensorProto
    assert proto.validation_error() is onnx.checker.ValidationError


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "uint8", "int16",
                                   "uint16", "int32", "int64", "uint32", "uint64", "bool"])
@pytest.mark.parametrize("raw", [True, False])
def test_to_array_matches_onnx(dtype: str, raw: bool) -> None:
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((2, 3, 4)) * 100).astype(dtype)
    if raw:
        tensor = numpy_helper.from_array(data, "t")
    else:   # the typed fields (int32_data, float_data, ...), as older exporters wrote them
        code = helper.np_dtype_to_tensor_dtype(data.dtype)
        tensor = helper.make_tensor("t", code, data.shape, data.ravel().tolist())
    ours, theirs = proto.to_array(tensor), numpy_helper.to_array(tensor)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, data)


def test_dtypes_numpy_lacks_go_through_onnx() -> None:
    tensor = helper.make_tensor("b", TensorProto.BFLOAT16, (3,), [1.0, 2.5, -3.0])
    np.testing.assert_array_equal(proto.to_array(tensor).astype(np.float32),
                                  numpy_helper.to_array(tensor).astype(np.float32))
    assert proto.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16) == \
        helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)


def test_attribute_values_match_onnx() -> None:
    node = helper.make_node("X", ["a"], ["b"], f=1.5, i=3, s="abc", ints=[1, 2], floats=[0.5],
                            strings=["x", "y"], t=numpy_helper.from_array(np.ones(2, np.float32)))
    for attr in node.attribute:
        assert proto.get_attribute_value(attr) == helper.get_attribute_value(attr)


def test_check_model_refuses_as_onnx_does(tmp_path) -> None:
    model = onnx.load(ARTIFACTS / "cnn.onnx")
    proto.check_model(model)
    model.graph.node[0].input[0] = "nowhere"
    with pytest.raises(onnx.checker.ValidationError):
        proto.check_model(model)
