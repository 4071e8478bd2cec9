"""The pad kernel (packager/codegen/pad.py): ONNX Pad with reflect, edge and wrap borders on
NCHW planes (style transfer's reflect pads of 1 and 4), asymmetric pads, a padded leading axis,
a last axis without pads (NHWC), rows shorter than a vector, runs with an overlapping last vector
and runs long enough to loop, int32; every x86 vector level, 1 and 2 threads; bit for bit
against ONNX Runtime. A constant Pad stays on the generic loop nest."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader

# (input shape, pads [begin..., end...], mode, dtype)
CASES = [
    ((1, 16, 32, 32), (0, 0, 1, 1, 0, 0, 1, 1), "reflect", "float32"),      # res block's pad
    ((1, 3, 40, 37), (0, 0, 4, 4, 0, 0, 4, 4), "reflect", "float32"),       # 9x9 stem, tail
    ((2, 5, 9, 5), (0, 1, 2, 3, 0, 2, 0, 1), "edge", "float32"),            # channels, short rows
    ((1, 4, 6, 300), (0, 0, 1, 2, 0, 0, 2, 3), "wrap", "float32"),           # a looped run
    ((1, 12, 10, 8), (0, 2, 3, 0, 0, 1, 2, 0), "reflect", "float32"),       # NHWC: last unpadded
    ((3, 20), (1, 2, 1, 5), "edge", "int32"),
]
RNG = np.random.default_rng(5)


def model(cases) -> onnx.ModelProto:
    types = {"float32": TensorProto.FLOAT, "int32": TensorProto.INT32}
    nodes, inputs, outputs, inits = [], [], [], []
    for i, (shape, pads, mode, dtype) in enumerate(cases):
        out = tuple(n + pads[d] + pads[d + len(shape)] for d, n in enumerate(shape))
        inits.append(onnx.numpy_helper.from_array(np.array(pads, np.int64), f"p{i}"))
        nodes.append(h.make_node("Pad", [f"x{i}", f"p{i}"], [f"y{i}"], mode=mode))
        inputs.append(h.make_tensor_value_info(f"x{i}", types[dtype], shape))
        outputs.append(h.make_tensor_value_info(f"y{i}", types[dtype], out))
    graph = h.make_graph(nodes, "pads", inputs, outputs, inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "host"])
def test_pads_exact_against_onnx_runtime(target, tmp_path) -> None:
    proto = model(CASES)
    path = tmp_path / "pad.mlc"
    mod, _ = import_onnx(proto)
    export_module(mod, path, ExportOptions(target=target, check=False))
    with BundleReader(str(path)) as r:
        chosen = [k.get("kernel") for k in r.header["kernels"]]
    assert chosen.count("pad") == len(CASES), chosen
    feeds = {f"x{i}": (RNG.standard_normal(shape) * 100).astype(dtype)
             for i, (shape, _, _, dtype) in enumerate(CASES)}
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([f"y{i}" for i in range(len(CASES))], sess.run(None, feeds)))
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            got = m.run(feeds)
        for name, ref in want.items():
            assert got[name].dtype == ref.dtype
            np.testing.assert_array_equal(got[name], ref, err_msg=f"{name} at {threads}")


def test_constant_pad_is_not_taken(tmp_path) -> None:
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 5, 6))
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, (1, 2, 7, 8))
    pads = onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "p")
    graph = h.make_graph([h.make_node("Pad", ["x", "p"], ["y"], mode="constant")], "c", [x],
                         [y], [pads])
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])
    proto.ir_version = 9
    path = tmp_path / "c.mlc"
    mod, _ = import_onnx(proto)
    export_module(mod, path, ExportOptions(check=False))
    with BundleReader(str(path)) as r:
        assert "pad" not in [k.get("kernel") for k in r.header["kernels"]]
    xv = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    with load(path) as m:
        np.testing.assert_array_equal(m.run({"x": xv})["y"], np.pad(xv, [(0, 0), (0, 0),
                                                                            (1, 1), (1, 1)]))


def test_broadcast_of_unit_axes_is_not_taken() -> None:
    """A nearest Resize's broadcast_to (axes of one repeated) reads like an edge pad of one
    element; it is not a pad."""
    from mlcpack.packager.codegen.pad import match_pad
    from mlcpack.packager.ir import te
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.ops import get_op
    from mlcpack.packager.ir.graph import TensorType

    x = te.placeholder((1, 4, 3, 1, 5, 1), "float32", "x")
    out = get_op("broadcast_to").legalize(x, out_type=TensorType((1, 4, 3, 2, 5, 2), "float32"),
                                          name="b", shape=(1, 4, 3, 2, 5, 2))
    assert match_pad(PrimFunc("b", [x], [out])) is None
    y = te.placeholder((1, 4, 3, 5), "float32", "y")
    out = get_op("pad").legalize(y, out_type=TensorType((1, 4, 5, 7), "float32"), name="p",
                                 pads=(0, 0, 1, 1, 0, 0, 1, 1), mode="edge")
    assert match_pad(PrimFunc("p", [y], [out])) is not None
