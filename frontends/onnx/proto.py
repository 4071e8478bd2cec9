"""ONNX's protobuf classes, checker and inliner without ``import onnx``.

``import onnx`` costs about 0.9 CPU-s, nearly all of it ml_dtypes registering its dtypes with
numpy (``onnx/_mapping.py`` imports it at module level): more than a whole warm export of a
float32 model, which needs none of it. This module loads onnx's generated protobuf module and its
C++ extension under their own names (``onnx.onnx_ml_pb2``, ``onnx.onnx_cpp2py_export``) without
running the package's ``__init__``; a later ``import onnx`` (onnx.reference, a tensor of a dtype
numpy lacks) finds them in ``sys.modules`` and reuses them, so the classes are the same objects
either way. That package then lacks the two as attributes (``onnx.onnx_ml_pb2``: an import
found in ``sys.modules`` binds no attribute), which nothing in onnx, onnxruntime or torch
reads; ``from onnx import onnx_ml_pb2`` and ``import onnx.onnx_ml_pb2`` still give them.
What needs ml_dtypes or onnx's Python helpers (bfloat16, float8, 4- and 2-bit tensors, string
tensors, external data) goes through onnx itself.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np

_PACKAGE = "onnx"


def _submodule(name: str) -> ModuleType:
    """``onnx.<name>`` from sys.modules, or loaded from onnx's folder without the package."""
    full = f"{_PACKAGE}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    spec = importlib.util.find_spec(_PACKAGE)   # finds the package; runs nothing of it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("onnx is not installed")
    folder = next(iter(spec.submodule_search_locations))
    for suffix in [".py"] + importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, name + suffix)
        if os.path.isfile(path):
            break
    else:
        raise ImportError(f"onnx has no module {name}")
    sub = importlib.util.spec_from_file_location(full, path)
    module = importlib.util.module_from_spec(sub)
    sys.modules[full] = module
    try:
        sub.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    return module


pb = _submodule("onnx_ml_pb2")
ModelProto = pb.ModelProto
GraphProto = pb.GraphProto
NodeProto = pb.NodeProto
TensorProto = pb.TensorProto
AttributeProto = pb.AttributeProto
ValueInfoProto = pb.ValueInfoProto
TypeProto = pb.TypeProto
FunctionProto = pb.FunctionProto


def _cpp() -> ModuleType:
    return _submodule("onnx_cpp2py_export")


def validation_error() -> type[Exception]:
    """onnx.checker.ValidationError (the C++ extension's class)."""
    return _cpp().checker.ValidationError


MAXIMUM_PROTOBUF = 2_147_483_648


def check_model(model: Any) -> None:
    """``onnx.checker.check_model(model)`` with its defaults: a ModelProto or a path."""
    checker = _cpp().checker
    if isinstance(model, (str, os.PathLike)):
        checker.check_model_path(os.fspath(model), False, False, False)
        return
    data = model if isinstance(model, bytes) else model.SerializeToString()
    if len(data) > MAXIMUM_PROTOBUF:
        raise ValueError("This protobuf of onnx model is too large (>2GiB). Call check_model "
                         "with model path instead.")
    checker.check_model(data, False, False, False)


def inline_local_functions(model: Any) -> Any:
    """``onnx.inliner.inline_local_functions(model)``."""
    inlined = ModelProto()
    inlined.ParseFromString(_cpp().inliner.inline_local_functions(model.SerializeToString(),
                                                                  False))
    return inlined


def load_model(path: str | os.PathLike, load_external_data: bool = True) -> Any:
    """``onnx.load(path, load_external_data=...)``: the file parsed here, or by onnx when a
    tensor keeps its data in another file (onnx's external-data reader resolves it)."""
    with open(path, "rb") as f:
        data = f.read()
    model = load_model_from_string(data)
    if load_external_data and any(_external(t) for t in _all_tensors(model)):
        import onnx

        return onnx.load(os.fspath(path))
    return model


def load_model_from_string(data: bytes) -> Any:
    """``onnx.load_from_string(data)``."""
    model = ModelProto()
    model.ParseFromString(data)
    return model


def _external(tensor: Any) -> bool:
    return tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL


def _all_tensors(model: Any):
    """Every tensor of the model, as onnx's external-data helper walks them: initializers and
    attribute tensors, in subgraphs and functions too."""
    graphs = [model.graph]
    nodes = [n for f in model.functions for n in f.node]
    while graphs or nodes:
        if graphs:
            g = graphs.pop()
            yield from g.initializer
            nodes.extend(g.node)
            continue
        node = nodes.pop()
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                graphs.append(attr.g)
            graphs.extend(attr.graphs)


# TensorProto data types numpy has, and the field their values are in when not raw_data
_NUMPY = {
    TensorProto.FLOAT: (np.float32, "float_data"), TensorProto.UINT8: (np.uint8, "int32_data"),
    TensorProto.INT8: (np.int8, "int32_data"), TensorProto.UINT16: (np.uint16, "int32_data"),
    TensorProto.INT16: (np.int16, "int32_data"), TensorProto.INT32: (np.int32, "int32_data"),
    TensorProto.INT64: (np.int64, "int64_data"), TensorProto.BOOL: (np.bool_, "int32_data"),
    TensorProto.FLOAT16: (np.float16, "int32_data"), TensorProto.DOUBLE: (np.float64, "double_data"),
    TensorProto.UINT32: (np.uint32, "uint64_data"), TensorProto.UINT64: (np.uint64, "uint64_data"),
}
_STORAGE = {"float_data": np.float32, "int32_data": np.int32, "int64_data": np.int64,
            "double_data": np.float64, "uint64_data": np.uint64}


def tensor_dtype_to_np_dtype(code: int) -> np.dtype:
    """``onnx.helper.tensor_dtype_to_np_dtype``: numpy's own dtypes here, the others (ml_dtypes'
    bfloat16, float8...) through onnx; KeyError for a code that is no tensor type."""
    if code in _NUMPY:
        return np.dtype(_NUMPY[code][0])
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(code)


def to_array(tensor: Any) -> np.ndarray:
    """``onnx.numpy_helper.to_array(tensor)``: the same array (read-only when it views the
    raw bytes, as onnx's is); dtypes numpy lacks, strings, external data and segments go
    through onnx."""
    code = tensor.data_type
    if code not in _NUMPY or tensor.HasField("segment") or _external(tensor) \
            or sys.byteorder == "big":
        from onnx import numpy_helper

        return numpy_helper.to_array(tensor)
    dtype, field = _NUMPY[code]
    dims = tuple(tensor.dims)
    if tensor.HasField("raw_data"):
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(dims)
    if code in (TensorProto.FLOAT16, TensorProto.INT16, TensorProto.UINT16):
        return np.array(tensor.int32_data, dtype=np.int32).view(np.uint32).astype(np.uint16) \
            .reshape(dims).view(dtype)
    if code == TensorProto.BOOL:
        return np.array(tensor.int32_data, dtype=np.int32).view(np.uint32).astype(np.uint8) \
            .view(dtype).reshape(dims)
    return np.asarray(getattr(tensor, field), dtype=_STORAGE[field]).astype(dtype).reshape(dims)


_ATTRIBUTE_FIELDS = {
    AttributeProto.FLOAT: "f", AttributeProto.INT: "i", AttributeProto.STRING: "s",
    AttributeProto.TENSOR: "t", AttributeProto.SPARSE_TENSOR: "sparse_tensor",
    AttributeProto.GRAPH: "g", AttributeProto.TYPE_PROTO: "tp",
}
_ATTRIBUTE_LISTS = {
    AttributeProto.FLOATS: "floats", AttributeProto.INTS: "ints",
    AttributeProto.STRINGS: "strings", AttributeProto.TENSORS: "tensors",
    AttributeProto.SPARSE_TENSORS: "sparse_tensors", AttributeProto.GRAPHS: "graphs",
    AttributeProto.TYPE_PROTOS: "type_protos",
}


def get_attribute_value(attr: Any) -> Any:
    """``onnx.helper.get_attribute_value(attr)``."""
    if attr.ref_attr_name:
        raise ValueError(f"Cannot get value of reference attribute: {attr}")
    if attr.type in _ATTRIBUTE_FIELDS:
        return getattr(attr, _ATTRIBUTE_FIELDS[attr.type])
    if attr.type in _ATTRIBUTE_LISTS:
        return list(getattr(attr, _ATTRIBUTE_LISTS[attr.type]))
    if attr.type == AttributeProto.UNDEFINED:
        return None
    raise ValueError(f"Unsupported ONNX attribute: {attr}")
