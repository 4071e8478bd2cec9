"""Per-layer precision on targets without an int8 dot instruction (passes/int8_cost.py): a
quantized 3x3 stride-1 convolution with full-range weights takes the exact integer Winograd
kernel (with it off, ``conv_int_winograd=False``: it stays float, its dequantized weights on the
fp32 Winograd kernel), a strided one takes the integer kernel; a target set with
x86-64-v4+vnni keeps both on the quad kernels. ``--quantize int8`` leaves the first unquantized and says
why. Small model (16 -> 32 channels on 10 x 10): seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import numpy_helper
from onnx import helper as h

import quant_models as qm
from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.calibrate import quantize_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_arch, host_features

pytest.importorskip("onnxruntime")

SHAPE = [1, 16, 10, 10]


def _float_model(path: Path) -> Path:
    """3x3 stride 1 (16 -> 32, Winograd for fp32 on AVX2) + Relu, 3x3 stride 2 (32 -> 32) + Relu."""
    rng = np.random.default_rng(0)
    f = lambda *s, sd=0.2: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv_s1"),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2],
                         name="conv_s2"),
             h.make_node("Relu", ["c2"], ["y"])]
    inits = {"w1": f(32, 16, 3, 3), "b1": f(32, sd=0.1), "w2": f(32, 32, 3, 3),
             "b2": f(32, sd=0.1)}
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, SHAPE)],
                    [h.make_tensor_value_info("y", T.FLOAT, [1, 32, 5, 5])], inits, path)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("int8_choice")
    fp32 = _float_model(tmp / "fp32.onnx")
    qdq = qm.ort_quantize(fp32, tmp / "qdq.onnx", "QDQ", per_channel=True)
    return {"fp32": fp32, "qdq": qdq, "tmp": tmp}


def _products(path: Path, options: CompileOptions) -> list[str]:
    """The convolutions after the passes up to legalization: "int" or "float winograd"/"float"."""
    passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")]
    fn = run_pipeline(import_onnx(str(path))[0], passes, options=options).functions["main"]
    out = []
    for b in fn.bindings():
        op = getattr(b.value, "op", "")
        if op in ("qconv2d", "qconv2d_quads"):      # quads: the vpmaddubsw kernel's weights
            out.append("int winograd" if b.value.attrs.get("winograd") else "int")
        elif op.startswith("nn.conv2d"):
            out.append("float winograd" if b.value.attrs.get("winograd") else "float")
    return out


@pytest.mark.parametrize("target,choice,wino,expect", [
    ("x86-64-v3", True, None, ["int winograd", "int"]),
    ("x86-64-v2,x86-64-v3", True, None, ["int winograd", "int"]),
    ("x86-64-v3", False, None, ["int winograd", "int"]),
    ("x86-64-v3", True, False, ["float winograd", "int"]),
    ("x86-64-v2,x86-64-v3", True, False, ["float winograd", "int"]),
    ("x86-64-v3", False, False, ["int", "int"]),
    ("x86-64-v3,x86-64-v4,x86-64-v4+vnni", True, None, ["int", "int"]),
])
def test_qdq_conv_precision_per_target(models, target: str, choice: bool, wino, expect) -> None:
    options = CompileOptions(target=target, int8_float_convs=choice, conv_int_winograd=wino)
    assert _products(models["qdq"], options) == expect


def test_mixed_bundle_within_one_step_of_ort(models) -> None:
    """The mixed bundle (x86-64-v3: AVX2 hosts, and AVX-512 ones; the integer Winograd kernel
    off) against ORT running the QDQ file as written, and against the all-integer bundle:
    within one output quantization step; the default bundle (integer Winograd) equal to the
    all-integer one bit for bit."""
    tmp, qdq = models["tmp"], models["qdq"]
    step = qm.output_step(qdq)
    x = np.random.default_rng(3).normal(0, 1, SHAPE).astype(np.float32)
    ref = ort_outputs(qdq, {"x": x}, threads=1, as_written=True)["y"]
    got = {}
    for label, choice, wino in (("mixed", True, False), ("integer", False, False),
                                ("default", True, None)):
        mod, _ = import_onnx(str(qdq))
        path = tmp / f"{label}.mlc"
        export_module(mod, path, ExportOptions(target="x86-64-v3", check=False, compile=CompileOptions(
            int8_float_convs=choice, conv_int_winograd=wino)))
        with load(path) as model:
            kernels = [k["kernel"] for k in model.header["kernels"]]
            got[label] = model.run({"x": x})["y"]
        assert any(k.startswith("channel-lane Winograd") for k in kernels) == (label == "mixed"), \
            kernels
        assert any(k.startswith("integer Winograd") for k in kernels) == (label == "default"), \
            kernels
    np.testing.assert_array_equal(got["default"], got["integer"])
    assert np.abs(got["mixed"] - ref).max() <= step * 1.001
    assert np.abs(got["mixed"] - got["integer"]).max() <= step * 1.001
    assert np.mean(got["mixed"] == ref) > 0.95


def test_quantize_leaves_the_slower_layer_float(models) -> None:
    """With full-range weights (the 7-bit kernel off: MLCPACK_INT8_MADD7=0) the Winograd layer
    stays float on AVX2; a VNNI target keeps it integer."""
    samples = [f["x"] for f in qm.random_feeds(models["fp32"], seed=5, n=2)]
    for target, floated in (("x86-64-v3", {"conv_s1"}), ("x86-64-v4+vnni", set())):
        q = quantize_onnx(models["fp32"], samples, guard=False,
                          compile_options=CompileOptions(target=target, conv_quads7=False))
        try:
            kept = {layer.node for layer in q.report.layers if not layer.quantized}
            assert kept == floated, (target, q.report.summary())
            ops = [n.op_type for n in q.model.graph.node]
            assert ops.count("QuantizeLinear") == 2 - len(floated), ops
            if floated:
                assert "left in float: Conv 'conv_s1' (speed: fp32 runs it as Winograd" in \
                    "\n".join(q.report.summary())
        finally:
            q.close()


@pytest.mark.parametrize("target,qmax", [
    ("x86-64-v3", 64), ("x86-64-v2,x86-64-v3", 64), ("x86-64-v2", 64),
    ("x86-64-v3,x86-64-v4,x86-64-v4+vnni", 127), ("x86-64-v4+vnni", 127),
    ("aarch64", 127), ("aarch64+dotprod", 127),
])
def test_quantize_conv_weight_range_per_target(target: str, qmax: int) -> None:
    """7-bit conv weights where no target has an int8 dot instruction (x86: the vpmaddubsw
    kernel), full range where one has (vpdpbusd / sdot take 8 bits) and on aarch64 without
    dotprod (no 7-bit kernel there)."""
    from mlcpack.packager.calibrate import conv_weight_qmax

    assert conv_weight_qmax(CompileOptions(target=target).for_targets()) == qmax
    off = CompileOptions(target=target, conv_quads7=False).for_targets()
    assert conv_weight_qmax(off) == 127


def test_quantize_7bit_weights_keep_every_conv_on_the_quad_kernel(models) -> None:
    """``--quantize int8`` for an AVX2 set: the conv weights fit 7 bits, no layer stays float
    for speed, the report says why, and both convolutions become w7 quad kernels; for a set
    with VNNI the weights keep the full range."""
    samples = [f["x"] for f in qm.random_feeds(models["fp32"], seed=5, n=2)]
    peaks = {}
    for target in ("x86-64-v2,x86-64-v3", "x86-64-v3,x86-64-v4+vnni"):
        q = quantize_onnx(models["fp32"], samples, guard=False,
                          compile_options=CompileOptions(target=target))
        try:
            assert all(layer.quantized for layer in q.report.layers), q.report.summary()
            ws = [numpy_helper.to_array(i) for i in q.model.graph.initializer
                  if i.data_type == T.INT8 and len(i.dims) == 4]
            assert len(ws) == 2
            peaks[target] = max(int(np.abs(w.astype(np.int16)).max()) for w in ws)
            said = "conv weights 7-bit (no int8 dot instruction in the target set)" in \
                q.report.summary()[0]
            assert said == (target == "x86-64-v2,x86-64-v3"), q.report.summary()
            if target == "x86-64-v2,x86-64-v3":
                path = models["tmp"] / "own7.onnx"
                onnx.save(q.model, path)
                passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")]
                fn = run_pipeline(import_onnx(str(path))[0], passes,
                                  options=CompileOptions(target=target)).functions["main"]
                convs = [b.value for b in fn.bindings()
                         if getattr(b.value, "op", "").startswith(("qconv2d", "nn.conv2d"))]
                assert [(v.op, v.attrs.get("w7")) for v in convs] == [("qconv2d_quads", True)] * 2
        finally:
            q.close()
    assert peaks == {"x86-64-v2,x86-64-v3": 64, "x86-64-v3,x86-64-v4+vnni": 127}


@pytest.mark.parametrize("w_shape,strides,out_shape,target,floats", [
    ((64, 64, 3, 3), (1, 1), (1, 64, 56, 56), "x86-64-v2,x86-64-v3", True),   # Winograd
    ((512, 512, 3, 3), (1, 1), (1, 512, 7, 7), "x86-64-v2,x86-64-v3", True),  # 7 wide
    ((512, 512, 3, 3), (1, 1), (1, 512, 7, 7), "x86-64-v3,x86-64-v4+vnni", False),
    ((128, 64, 3, 3), (2, 2), (1, 128, 28, 28), "x86-64-v3", False),          # strided
    ((128, 64, 1, 1), (1, 1), (1, 128, 28, 28), "x86-64-v3", False),          # 1x1
    ((64, 3, 7, 7), (2, 2), (1, 64, 112, 112), "x86-64-v3", False),           # the stem
    ((8, 8, 3, 3), (1, 1), (1, 8, 16, 16), "x86-64-v3", False),               # few channels
    ((64, 64, 3, 3), (1, 1), (1, 64, 56, 56), "aarch64", False),              # no AVX2 kernel
])
def test_cost_rule(w_shape, strides, out_shape, target: str, floats: bool) -> None:
    from mlcpack.packager.passes.int8_cost import float_conv_reason

    options = CompileOptions(target=target).for_targets()
    assert (float_conv_reason(w_shape, strides, out_shape, 1, options) is not None) == floats


def test_cost_rule_7bit_weights() -> None:
    """Weights that fit 7 bits (ORT's reduce_range) take the vpmaddubsw quad kernel on x86
    sets, faster than fp32 on the layers that would otherwise stay float; not with
    ``conv_quads7`` off (MLCPACK_INT8_MADD7=0)."""
    from mlcpack.packager.passes.int8_cost import float_conv_reason

    for w_shape, out_shape in (((64, 64, 3, 3), (1, 64, 56, 56)),
                               ((512, 512, 3, 3), (1, 512, 7, 7))):
        options = CompileOptions(target="x86-64-v2,x86-64-v3").for_targets()
        assert float_conv_reason(w_shape, (1, 1), out_shape, 1, options, w7=True) is None
        assert float_conv_reason(w_shape, (1, 1), out_shape, 1, options) is not None
        off = CompileOptions(target="x86-64-v2,x86-64-v3", conv_quads7=False).for_targets()
        assert float_conv_reason(w_shape, (1, 1), out_shape, 1, off, w7=True) is not None


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features(),
                    reason="runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
def test_reduce_range_qdq_stays_integer_on_the_7bit_kernel(models) -> None:
    """ORT's ``reduce_range=True`` QDQ copy (7-bit weights): on an AVX2 set both convolutions
    take the vpmaddubsw quad kernel (``qconv2d_quads`` marked w7), none stays float, and the
    bundle is within one output step of ORT running the file as written."""
    tmp = models["tmp"]
    rr = qm.ort_quantize(models["fp32"], tmp / "qdq_rr.onnx", "QDQ", per_channel=True,
                         reduce_range=True)
    passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")]
    fn = run_pipeline(import_onnx(str(rr))[0], passes,
                      options=CompileOptions(target="x86-64-v2,x86-64-v3")).functions["main"]
    convs = [b.value for b in fn.bindings()
             if getattr(b.value, "op", "").startswith(("qconv2d", "nn.conv2d"))]
    assert [(v.op, v.attrs.get("w7")) for v in convs] == [("qconv2d_quads", True)] * 2
    x = np.random.default_rng(3).normal(0, 1, SHAPE).astype(np.float32)
    ref = ort_outputs(rr, {"x": x}, threads=1, as_written=True)["y"]
    path = tmp / "rr.mlc"
    export_module(import_onnx(str(rr))[0], path, ExportOptions(target="x86-64-v3", check=False))
    with load(path) as model:
        got = model.run({"x": x})["y"]
    assert np.abs(got - ref).max() <= qm.output_step(rr) * 1.001
