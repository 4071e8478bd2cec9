"""Channel-lane convolutions (codegen/conv_oc.py) whose output channels are not whole 16-lane
vectors (``geometry.oc_partial_lanes``: at least 48, at most 1/16 of the lanes unused; windows wider
than 1x1): on AVX-512 targets they take nn.conv2d_oc at 16 lanes, the last vector computed on
the packed weights' zeros and its lanes past the output channels not stored (PP-OCRv4
recognizer's 1x3 convolutions to 60 channels on 1x40). Others keep the register-blocked kernel.
Runs against ONNX Runtime at 1 and 2 threads (the same outputs) where the host has AVX-512; the
8-lane variant of a portable bundle (60 = 7.5 vectors of 8) on any AVX2 host."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X86_V3
from conv_models import avx512_host, conv_feeds, conv_model, export_model
from mlcpack.runtime.cpu import host_arch, host_features

ort = pytest.importorskip("onnxruntime")

V4 = "x86-64-v4"


def _conv_kernels(bundle) -> list[dict]:
    from mlcpack.runtime.describe import describe

    return [k for k in describe(bundle)["kernels"] if "conv" in k["name"]]


def _row_conv_model(c: int, w: int, o: int):
    """x (1, c, 1, w) -> Conv 1x3 (pads 0, 1) to ``o`` channels -> BatchNormalization -> x *
    sigmoid(x): the SVTR neck's convolution."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(
                 (rng.standard_normal((o, c, 1, 3)) / np.sqrt(3 * c)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, o).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(o).astype(np.float32) * 0.1, "m"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, o).astype(np.float32), "v")]
    nodes = [helper.make_node("Conv", ["x", "W"], ["y0"], kernel_shape=[1, 3],
                              pads=[0, 1, 0, 1]),
             helper.make_node("BatchNormalization", ["y0", "g", "b", "m", "v"], ["y1"]),
             helper.make_node("Sigmoid", ["y1"], ["s"]),
             helper.make_node("Mul", ["y1", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "rowconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 1, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, 1, w])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("c,o,k,packed", [
    (16, 60, 3, True),     # 4 of 64 lanes unused
    (16, 120, 3, True),    # 8 of 128
    (16, 40, 3, False),    # 8 of 48: too many
    (16, 56, 3, False),    # 8 of 64
    (384, 360, 1, False),  # a 1x1 (of >= 256 input channels): its packed panels
])
def test_which_are_packed(tmp_path, c, o, k, packed):
    _, bundle = export_model(tmp_path, conv_model(1, c, 6, 6, o, k, 1), V4)
    kernels = _conv_kernels(bundle)
    assert any("conv2d_oc" in kk["name"] for kk in kernels) == packed
    if packed:   # 16 lanes: 8 pixels x 2 zmm vectors
        assert all("8 pixels x 32 channels" in kk["kernel"] or "8 tiles x 32 channels"
                   in kk["kernel"] for kk in kernels)


def _check(path, bundle, feeds, threads=(1, 2)):
    from mlcpack.runtime import load

    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    outs = []
    for t in threads:
        with load(bundle, threads=t) as m:
            for _ in range(2):   # the task regions' second use
                got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            outs.append(got)
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])


def test_row_conv_to_60_channels(tmp_path):
    """The SVTR neck's 1x3 convolution (96 -> 60 on 1x40, BatchNormalization and swish fused):
    two blocks of 32 channels, the second's last vector 12 of 16 lanes."""
    import onnx

    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    model = _row_conv_model(96, 40, 60)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    mod, _ = import_onnx(str(path))
    bundle = tmp_path / "m.mlc"
    export_module(mod, bundle, ExportOptions(target=V4))
    (kernel,) = _conv_kernels(bundle)
    assert "conv2d_oc" in kernel["name"]
    x = np.random.default_rng(1).standard_normal((1, 96, 1, 40)).astype(np.float32)
    _check(path, bundle, {"x": x})


@pytest.mark.parametrize("n,c,h,w,o,k,s,act,residual", [
    (2, 24, 9, 13, 60, 5, 2, "hsig", True),     # direct, 2 images, a residual
    (1, 32, 9, 9, 60, 3, 1, "silu", True),      # Winograd
    (1, 16, 5, 7, 120, 3, 1, None, False),      # 4 blocks, the last 24 channels
])
def test_matches_onnxruntime(tmp_path, n, c, h, w, o, k, s, act, residual):
    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, k, s, act=act,
                                                     residual=residual))
    kernels = _conv_kernels(bundle)
    assert kernels and all("conv2d_oc" in kk["name"] for kk in kernels)
    _check(path, bundle, conv_feeds(n, c, h, w, o, k, s, residual=residual))


def test_avx2_variant_of_a_portable_bundle(tmp_path, monkeypatch):
    """A bundle for x86-64-v3 and v4 packs the 60-channel weights once; its AVX2 variant runs
    them at 8 lanes (7 vectors and a half) where AVX-512 is missing (features pinned)."""
    if host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features():
        pytest.skip("runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
    n, c, h, w, o, k, s = 1, 24, 7, 11, 60, 3, 2
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, k, s, act="silu"),
                                "x86-64-v3,x86-64-v4")
    assert all("conv2d_oc" in kk["name"] for kk in _conv_kernels(bundle))
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    from mlcpack.runtime import load

    with load(bundle) as m:
        assert m.code_variant["level"] == "x86-64-v3"
    _check(path, bundle, conv_feeds(n, c, h, w, o, k, s))


def test_open_image_sizes(tmp_path):
    """Run-time height and width (the recognizer's default export): the row groups and bands
    planned at the kernel's entry, the last vector's lanes past 60 channels not stored."""
    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    c, o, k, s = 16, 60, 3, 2
    model = conv_model(1, c, 8, 8, o, k, s, act="silu")
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        dims[2].dim_param, dims[3].dim_param = ("OH", "OW") if vi in model.graph.output \
            else ("H", "W")
    path, bundle = export_model(tmp_path, model)
    (kernel,) = _conv_kernels(bundle)
    assert "conv2d_oc" in kernel["name"] and kernel["kernel"].endswith("planned at run time")
    for h, w in [(1, 1), (5, 7), (9, 40)]:
        _check(path, bundle, conv_feeds(1, c, h, w, o, k, s, seed=h))
