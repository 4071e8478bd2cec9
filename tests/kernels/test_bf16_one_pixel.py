"""bf16 pair weights for 1x1 convolutions on a 1x1 image (passes/layout.py ``_bf16_one_pixel``,
``CompileOptions.bf16_one_pixel``): a classifier head after global pooling (PP-LCNet's 512 ->
1280) takes the channel-lane bf16 kernel where every target has vdpbf16ps, instead of fp32's
dot-product kernel; those of fewer than 16 input channels or output channels not in 16-lane
vectors (squeeze-and-excitation blocks' small ones) stay fp32. Checked by what the passes
choose on any host, and natively (1 and 2 threads, two images, against ONNX Runtime) on a host
with avx512_bf16. And the pair fill of an odd-channel (C = 3) stem, channel- and pixel-lane,
with its input just before inaccessible pages: the same output, at the fp32 bundle's speed."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import bf16_option_runs
from mlcpack.runtime.cpu import host_arch, host_features

V4_BF16 = "x86-64-v4+bf16"


def _headed():
    """Two images of 16 channels at 8x8: 3x3 conv to 64, global average pool, then on the 1x1
    image 1x1s 64 -> 160 (HardSwish: bf16), 160 -> 8 (8 outputs: fp32), 8 -> 32 (8 inputs:
    fp32)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    inits, nodes = [], []

    def conv(x, y, o, c, k, act=True):
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        b = (rng.standard_normal(o) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, y + "_w"), numpy_helper.from_array(b, y + "_b")])
        nodes.append(helper.make_node("Conv", [x, y + "_w", y + "_b"], [y + "_c" if act else y],
                                      pads=[k // 2] * 4))
        if act:
            nodes.append(helper.make_node("HardSwish", [y + "_c"], [y]))

    conv("x", "c1", 64, 16, 3)
    nodes.append(helper.make_node("GlobalAveragePool", ["c1"], ["g"]))
    conv("g", "head", 160, 64, 1)
    conv("head", "sq", 8, 160, 1)
    conv("sq", "y", 32, 8, 1, act=False)
    graph = helper.make_graph(
        nodes, "headed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32, 1, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _bf16_weights(**options):
    """The source weights the module after the passes holds as bfloat16."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.ir.graph import CallTIR, Constant
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod, _ = import_onnx(_headed())
    mod = run_pipeline(mod, DEFAULT_PIPELINE,
                       options=CompileOptions(target=V4_BF16, precision="bf16", **options))
    return sorted(a.name.split("_w")[0] for b in mod.functions["main"].bindings()
                  if isinstance(b.value, CallTIR) for a in b.value.args
                  if isinstance(a, Constant) and str(a.data.dtype) == "bfloat16")


def test_one_pixel_head_takes_bf16():
    assert _bf16_weights() == ["c1", "head"]
    assert _bf16_weights(bf16_one_pixel=False) == ["c1"]


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features(),
                    reason="runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16")
def test_one_pixel_head_native(tmp_path):
    """Within the bf16 bound of ONNX Runtime's fp32, 1 and 2 threads alike; closer than 1 %
    to the bundle without it (only the head's weights and inputs rounded besides)."""
    import onnxruntime as ort

    x = np.random.default_rng(8).standard_normal((2, 16, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(_headed().SerializeToString()).run(None, {"x": x})[0]
    got = bf16_option_runs(_headed(), tmp_path, x, V4_BF16, "bf16_one_pixel")
    for on in (True, False):
        assert float(np.abs(got[on] - want).max()) < 0.01 * float(np.abs(want).max())
    assert not np.array_equal(got[True], got[False])   # the head did change


def _stem():
    """A C = 3 stem: 3x3 stride 2 to 16 channels on 3 x 96 x 96 (odd C: the pair fill's last
    pair has no second channel)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    w = (rng.standard_normal((16, 3, 3, 3)) / 5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, strides=[2, 2])], "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 96, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 48, 48])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _before_guard_page(x: np.ndarray):
    """``x`` copied to end where inaccessible pages begin, as many as it fills; (the copy,
    its mapping)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    size = -(-x.nbytes // page) * page
    m = mmap.mmap(-1, 2 * size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + size), ctypes.c_size_t(size), 0) == 0
    y = np.frombuffer(m, dtype=x.dtype, count=x.size, offset=size - x.nbytes).reshape(x.shape)
    y[...] = x
    return y, m


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features(),
                    reason="runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16")
@pytest.mark.parametrize("oc_pixels", [56 * 56, 0])   # channel-lane, pixel-lane
def test_odd_channel_stem_before_guard_page(tmp_path, oc_pixels):
    """The pair fill of a C = 3 stem (channel-lane conv_oc.py and pixel-lane bf16conv.py)
    with its input ending at an inaccessible page: the same output as from an ordinary array,
    and no slower than 3x the fp32 bundle by CPU minima (the last pair's absent channel once
    read masked-off lanes past the input: a microcode assist per vector on Zen, 8-14x)."""
    import dataclasses
    import time

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    x = np.random.default_rng(10).standard_normal((1, 3, 96, 96)).astype(np.float32)
    guarded, mapping = _before_guard_page(x)
    paths = {}
    for precision in ("bf16", "fp32"):
        mod, _ = import_onnx(_stem())
        paths[precision] = tmp_path / f"{precision}.mlc"
        report = export_module(mod, paths[precision], ExportOptions(
            target=V4_BF16, precision=precision,
            compile=dataclasses.replace(CompileOptions(), bf16_oc_pixels=oc_pixels)))
        assert report.precision == precision, report.precision_note
    with load(paths["bf16"]) as bf16, load(paths["fp32"]) as fp32:
        np.testing.assert_array_equal(bf16.run({"x": guarded})["y"], bf16.run({"x": x})["y"])
        best = {"bf16": 1e9, "fp32": 1e9}
        for _ in range(30):
            for name, model in (("bf16", bf16), ("fp32", fp32)):
                t = time.process_time()
                for _ in range(5):
                    model.run({"x": guarded})
                best[name] = min(best[name], time.process_time() - t)
    del guarded
    mapping.close()
    assert best["bf16"] < 3 * best["fp32"], best
