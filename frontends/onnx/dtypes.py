"""The ONNX frontend's dtypes: those a bundle takes and returns at run time, and the numpy dtype
of an ONNX tensor type. A leaf: it imports no other module of the frontend but ``proto`` (``common.py``'s
converter helpers and ``symvalue.py``'s shape folding both read it)."""

from __future__ import annotations

import numpy as np

from . import proto as onnx   # onnx's protobuf classes without `import onnx` (proto.py)

# Tensor dtypes a bundle can take and return at run time (the runtime's and the code generator's).
# float16/bfloat16/float8 are stored narrow and computed in float32; the runtime carries the dtypes
# numpy lacks (bfloat16, float8_*, int4/uint4/int2/uint2) as their unsigned bits (uint16/uint8)
# and takes ml_dtypes arrays of them as well.
RUNTIME_DTYPES = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
                  "float8_e5m2", "float8_e5m2fnuz", "int8", "int16", "int32", "int64", "uint8",
                  "uint16", "uint32", "uint64", "int4", "uint4", "int2", "uint2", "bool")


class UnsupportedCast(Exception):
    """A Cast to a type numpy cannot hold (the message a converter reports as the node's error)."""


def numpy_dtype(to: int | str) -> np.dtype:
    """The numpy dtype of a Cast's ``to`` (an ONNX TensorProto type, or its name in opset 1);
    ``UnsupportedCast`` for a type numpy cannot hold."""
    if isinstance(to, str):  # opset 1 names the type: "FLOAT"
        to = onnx.TensorProto.DataType.Value(to.upper())
    try:
        return np.dtype(onnx.tensor_dtype_to_np_dtype(int(to)))
    except (KeyError, TypeError, ValueError):
        raise UnsupportedCast(f"cast to {onnx.TensorProto.DataType.Name(int(to))} is not "
                         "supported") from None
