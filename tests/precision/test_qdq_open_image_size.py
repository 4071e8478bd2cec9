"""QDQ models whose image size stays open (Paddle's dynamic H/W, YOLO's dynamic batch): what
``onnxruntime.quantization`` writes of a small detector-style head (3x3 conv, Paddle's HardSwish
as Add / Clip / Mul / Div, two 2x2 stride-2 ConvTranspose upsamplers, sigmoid) exports with H
and W symbolic; its transposed convolutions (DequantizeLinear weights, constants only after
``fold_dequantize``) take the 1x1 convolution and block transpose (``passes/conv_transpose.py``
``_pixels``) instead of the generic loop nest; its HardSwish chain of quantize / dequantize
pairs becomes one ``lut8`` table (``passes/quantize_lut.py``), looked up in one ``qtable``
pass with the quantize before it and the dequantize after it; and the bundle equals ONNX
Runtime running the QDQ graph as written at several sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import SLOW
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")

SIZES = ((12, 10), (5, 9), (17, 3), (32, 24))


def _upsampling_head(path: Path) -> Path:
    """x [1, 3, 12, 10] -> 3x3 conv (8) -> HardSwish as Paddle writes it -> ConvTranspose
    2x2/2 (6) -> Relu -> ConvTranspose 2x2/2 (1) -> Sigmoid -> y [1, 1, 48, 40]."""
    rng = np.random.default_rng(0)
    f = lambda *s, sd=0.3: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    up = dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c1", "three"], ["a1"]),
             h.make_node("Clip", ["a1", "zero", "six"], ["k1"]),
             h.make_node("Mul", ["c1", "k1"], ["m1"]),
             h.make_node("Div", ["m1", "six"], ["r1"]),
             h.make_node("ConvTranspose", ["r1", "w2", "b2"], ["t2"], **up),
             h.make_node("Relu", ["t2"], ["r2"]),
             h.make_node("ConvTranspose", ["r2", "w3", "b3"], ["t3"], **up),
             h.make_node("Sigmoid", ["t3"], ["y"])]
    inits = {"w1": f(8, 3, 3, 3), "b1": f(8, sd=.1), "w2": f(8, 6, 2, 2), "b2": f(6, sd=.1),
             "w3": f(6, 1, 2, 2), "b3": f(1, sd=.1), "three": np.float32(3),
             "zero": np.float32(0), "six": np.float32(6)}
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 12, 10])],
                    [h.make_tensor_value_info("y", T.FLOAT, None)], inits, path)


def _open_size(path: Path) -> Path:
    """``path`` with its input's H and W symbolic (as Paddle writes them) and no shapes kept
    for the values inside."""
    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    del model.graph.value_info[:]
    model.graph.output[0].type.tensor_type.ClearField("shape")
    onnx.save(model, str(path))
    return path


# per channel in the default run (an export: ~20-40 s on 2 loaded cores), per tensor too with
# MLCPACK_SLOW=1
@pytest.fixture(scope="module", params=[True, False] if SLOW else [True],
                ids=["per_channel", "per_tensor"] if SLOW else ["per_channel"])
def head(request, tmp_path_factory) -> tuple[Path, Path]:
    """(QDQ file with open H/W, its bundle from the default export)."""
    folder = tmp_path_factory.mktemp("open_head")
    src = _upsampling_head(folder / "head.onnx")
    qfile = _open_size(qm.ort_quantize(src, folder / "head_qdq.onnx", "QDQ",
                                       per_channel=request.param))
    mod, _ = import_onnx(str(qfile))
    bundle = folder / "head.mlc"
    export_module(mod, bundle, ExportOptions(target="host"))     # golden check on
    return qfile, bundle


def test_conv_transpose_upsamplers_take_the_pixel_rewrite(head) -> None:
    _, bundle = head
    with load(bundle) as model:
        names = [k.name for k in model.schema.plan.kernels]
    assert not any("conv_transpose" in n for n in names), names
    assert sum(n.startswith("transpose") for n in names) == 2, names


def test_hardswish_chain_is_one_table_lookup(head) -> None:
    _, bundle = head
    with load(bundle) as model:
        names = [k.name for k in model.schema.plan.kernels]
    # the table with its quantize and dequantize: one qtable pass (run-time extents)
    assert [n for n in names if "qtable" in n], names
    assert not any("divide" in n or "clip" in n for n in names), names


def test_equals_onnx_runtime_as_written_at_every_size(head) -> None:
    qfile, bundle = head
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(qfile), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    with load(bundle) as model:
        for hh, ww in SIZES:
            x = rng.normal(0, 1, (1, 3, hh, ww)).astype(np.float32)
            got = model.run({"x": x})["y"]
            want = session.run(None, {"x": x})[0]
            assert got.shape == (1, 1, 4 * hh, 4 * ww)
            np.testing.assert_array_equal(got, want)
