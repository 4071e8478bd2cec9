"""A float convolution between quantized layers (what ``--quantize int8``'s accuracy guard leaves
when it keeps a layer float, as PP-OCRv4 recognizer's 480x480 1x1 ``p2o.Conv.28``): its epilogue
ends in the next layer's QuantizeLinear, which the float contraction kernels (float32 out) do not
take. passes/fuse.py leaves that quantize its own elementwise kernel, so the convolution (with the
rest of its epilogue) gets the same kernel as in the float model, not the generic loop nest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

pytest.importorskip("onnxruntime")

C, SHAPE = 32, [1, 8, 6, 20]


def _model(path: Path, qdq: bool) -> Path:
    """quantized 1x1 conv + relu -> float 1x1 conv (C x C) * k + c, hardswish (written out as
    PaddlePaddle exports it) -> quantized 1x1 conv; ``qdq=False``: the same model all float (the
    weights dequantized, no activation Q/DQ pairs)."""
    rng = np.random.default_rng(0)
    f = lambda *s, sd=0.3: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    w1q = rng.integers(-100, 100, (C, 8, 1, 1)).astype(np.int8)
    w3q = rng.integers(-100, 100, (8, C, 1, 1)).astype(np.int8)
    inits = {"b1": f(C, sd=0.1), "w2": f(C, C, 1, 1), "b2": f(C, sd=0.1), "k": f(C, 1, 1, sd=1),
             "c": f(C, 1, 1, sd=0.1), "b3": f(8, sd=0.1), "three": np.float32(3),
             "zero": np.float32(0), "six": np.float32(6)}
    n = h.make_node
    nodes = []

    def qdq(x: str, scale: float) -> str:
        if not qdq_on:
            return x
        inits[x + "_s"], inits[x + "_z"] = np.float32(scale), np.int8(0)
        nodes.extend([n("QuantizeLinear", [x, x + "_s", x + "_z"], [x + "_q"]),
                      n("DequantizeLinear", [x + "_q", x + "_s", x + "_z"], [x + "_d"])])
        return x + "_d"

    def weight(name: str, q: np.ndarray) -> str:
        if not qdq_on:
            inits[name] = q.astype(np.float32) * np.float32(0.003)
            return name
        inits[name + "_q"], inits[name + "_s"], inits[name + "_z"] = q, np.float32(0.003), \
            np.int8(0)
        nodes.append(n("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name]))
        return name

    qdq_on = qdq
    nodes.append(n("Conv", [qdq("x", 0.02), weight("w1", w1q), "b1"], ["c1"]))
    nodes.append(n("Relu", ["c1"], ["r1"]))
    nodes += [n("Conv", [qdq("r1", 0.05), "w2", "b2"], ["c2"]), n("Mul", ["k", "c2"], ["m2"]),
              n("Add", ["m2", "c"], ["a2"]), n("Add", ["a2", "three"], ["a3"]),
              n("Clip", ["a3", "zero", "six"], ["cl"]), n("Mul", ["a2", "cl"], ["m3"]),
              n("Div", ["m3", "six"], ["hs"])]
    nodes.append(n("Conv", [qdq("hs", 0.05), weight("w3", w3q), "b3"], ["y"]))
    graph = h.make_graph(nodes, path.stem, [h.make_tensor_value_info("x", T.FLOAT, SHAPE)],
                         [h.make_tensor_value_info("y", T.FLOAT, SHAPE)],
                         [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    tmp = tmp_path_factory.mktemp("float_conv_qdq")
    out = {}
    for label, qdq in (("int8", True), ("fp32", False)):
        onnx_path = _model(tmp / f"{label}.onnx", qdq)
        mod, _ = import_onnx(str(onnx_path))
        export_module(mod, tmp / f"{label}.mlc", ExportOptions(target="host", check=False))
        out[label] = (onnx_path, tmp / f"{label}.mlc")
    return out


def _float_conv(bundle: Path) -> dict:
    """The kernel row of the float convolution (the one reading node ``c2``)."""
    with load(bundle) as model:
        rows = [k for k in model.header["kernels"]
                if any(s.get("name") == "c2" for s in k.get("source") or ())]
    assert len(rows) == 1, rows
    return rows[0]


def test_float_conv_gets_the_float_models_kernel(bundles) -> None:
    q, f = _float_conv(bundles["int8"][1]), _float_conv(bundles["fp32"][1])
    assert q["kernel"] != "generic loop nest"
    assert q["kernel"] == f["kernel"]
    assert q["name"] == f["name"]   # the same epilogue fused (the quantize is not in it)
    with load(bundles["int8"][1]) as model:
        names = [k["name"] for k in model.header["kernels"]]
    # the quantized convolutions are integer kernels (qconv2d, or qconv2d_quads where the
    # host's level multiplies byte quads: VNNI's vpdpbusd takes these full-range weights)
    assert any(name.startswith("qconv2d") for name in names), names
    assert any(name.startswith("quantize") for name in names), names


def test_outputs_match_ort(bundles) -> None:
    onnx_path, bundle = bundles["int8"]
    x = np.random.default_rng(1).uniform(-1, 2.5, SHAPE).astype(np.float32)
    ref = ort_outputs(onnx_path, {"x": x}, threads=1, as_written=True)["y"]
    with load(bundle) as model:
        got = model.run({"x": x})["y"]
    # a float32 rounding may move one activation across a quantization step (0.05) where ORT
    # rounds it the other way: one step times one weight column of the last conv at most
    step = 0.05 * 0.003 * 100
    assert np.mean(np.abs(got - ref) > 1e-4) < 0.02
    np.testing.assert_allclose(got, ref, rtol=0, atol=2 * step)
