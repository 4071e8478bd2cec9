"""Winograd F(2x2, 3x3) in the channel-lane convolution kernel (codegen/conv_oc.py): the export
transforms a 3x3 stride-1 convolution's weights (passes/layout.py ``uses_winograd``,
ops/layout.py ``pack_wino_weights``) and the kernel transforms the input blocks, multiplies and
transforms the outputs back. Checked against ONNX Runtime over odd sizes, partial channel
blocks, padding, bands, batches, fused epilogues, 1-3 threads, the SSE variant and the
operator's own expression (the generic lowering); and which convolutions take it."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import conv_feeds, conv_model

from mlcpack.packager.ops.layout import OC_BLOCK, pack_wino_weights, unpack_wino_weights
from mlcpack.packager.passes.layout import uses_winograd

ort = pytest.importorskip("onnxruntime")


def _export(tmp_path, model, target="x86-64-v3", compile=None):
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target=target, compile=compile))
    return path, tmp_path / "m.mlc"


def _weight_bytes(bundle) -> int:
    from mlcpack.runtime.describe import describe

    return describe(bundle)["weights"]["bytes"]


def _is_wino(bundle, c: int, o: int) -> bool:
    """A one-conv model's weights are the Winograd blocks, the bias and at most a few epilogue
    constants (HardSigmoid's)."""
    extra = _weight_bytes(bundle) - (16 * c * -(-o // OC_BLOCK) * OC_BLOCK + o) * 4
    return 0 <= extra < 64


def _reference(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_packing_round_trip():
    w = np.random.default_rng(0).standard_normal((40, 7, 3, 3)).astype(np.float32)
    wp = pack_wino_weights(w)
    assert wp.shape == (2, 16 * 7, OC_BLOCK)
    assert not wp[1, :, 8:].any()           # the last block's channels past 40 are zeros
    # position (a, b) = (1, 2) of channel 3 for output 35: (G g G^T)[1, 2]
    g = w[35, 3].astype(np.float64)
    G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])
    assert wp[1, (1 * 4 + 2) * 7 + 3, 3] == pytest.approx((G @ g @ G.T)[1, 2], rel=1e-6)
    np.testing.assert_allclose(unpack_wino_weights(wp, 40), w, rtol=0, atol=1e-6)


CASES = [   # n, c, h, w, o, act, residual
    (1, 16, 12, 12, 32, None, False),
    (1, 64, 20, 20, 64, None, True),        # ResNet's block: bias, residual add
    (1, 32, 13, 9, 40, "silu", False),      # odd rows and columns; 40 = a block and a vector
    (2, 24, 16, 10, 64, "hsig", True),      # a batch of 2
    (1, 48, 30, 30, 96, None, False),       # 4 bands, the last one shorter
]


@pytest.mark.parametrize("n,c,h,w,o,act,residual", CASES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_matches_onnxruntime(tmp_path, n, c, h, w, o, act, residual, threads):
    from mlcpack.runtime import load

    assert uses_winograd((o, c, 3, 3), (1, 1), (n, o, h, w))
    model = conv_model(n, c, h, w, o, 3, 1, act=act, residual=residual)
    feeds = conv_feeds(n, c, h, w, o, 3, 1, residual=residual)
    path, bundle = _export(tmp_path, model)
    assert _is_wino(bundle, c, o)
    want = _reference(path, feeds)
    with load(bundle, threads=threads) as m:
        for _ in range(2):   # the task regions' second use
            got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_one_band_when_the_weights_are_large(tmp_path, monkeypatch, threads):
    """Transformed weights past WINO_U_TRAFFIC: the whole image is one band (read once), in
    two items of channel blocks, two task regions; a third task gets no work."""
    from mlcpack.packager.codegen import conv_oc
    from mlcpack.runtime import load

    monkeypatch.setattr(conv_oc, "WINO_U_TRAFFIC", 1)
    monkeypatch.setenv("MLCPACK_CACHE_DIR", "off")   # a patched code generator: not in the cache key
    n, c, h, w, o = 1, 48, 30, 30, 96
    model = conv_model(n, c, h, w, o, 3, 1, residual=True)
    feeds = conv_feeds(n, c, h, w, o, 3, 1, residual=True)
    path, bundle = _export(tmp_path, model)
    assert _is_wino(bundle, c, o)
    with load(bundle, threads=threads) as m:
        np.testing.assert_allclose(list(m.run(feeds).values())[0], _reference(path, feeds),
                                   rtol=1e-4, atol=1e-4)


def _conv_pads(c, h, w, o, pads):
    """One 3x3 stride-1 Conv with explicit ``pads`` (top, left, bottom, right), no bias."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    t, left, b_, r = pads
    oh, ow = h + t + b_ - 2, w + left + r - 2
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3], pads=[t, left, b_, r])],
        "pads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, oh, ow])],
        [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_run_time_batch(tmp_path):
    """A batch known at run time only (the symbolic plan, and the batch-1 plan beside it):
    both take Winograd, its weights stored once; right answers at batch 1, 3 and 5."""
    from mlcpack.runtime import load

    model = conv_model(1, 16, 12, 13, 40, 3, 1, act="silu", residual=True)
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    path, bundle = _export(tmp_path, model)
    assert _is_wino(bundle, 16, 40)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            for n in (1, 3, 5):
                feeds = conv_feeds(n, 16, 12, 13, 40, 3, 1, residual=True, seed=n)
                np.testing.assert_allclose(list(m.run(feeds).values())[0],
                                           sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 0, 0, 1), (2, 2, 2, 2)])
def test_padding(tmp_path, pads):
    from mlcpack.runtime import load

    c, h, w, o = 16, 14, 17, 32
    model = _conv_pads(c, h, w, o, pads)
    x = np.random.default_rng(4).standard_normal((1, c, h, w)).astype(np.float32)
    path, bundle = _export(tmp_path, model)
    assert _weight_bytes(bundle) == 16 * c * o * 4
    want = _reference(path, {"x": x})
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def test_the_sse_variant_of_a_portable_bundle(tmp_path, monkeypatch, x86_levels):
    """4-lane vectors: the input transform on 4 tiles at a time, a block in two passes."""
    from mlcpack.runtime import load

    n, c, h, w, o = 1, 24, 11, 14, 40
    model = conv_model(n, c, h, w, o, 3, 1, act="silu", residual=True)
    feeds = conv_feeds(n, c, h, w, o, 3, 1, residual=True)
    path, bundle = _export(tmp_path, model, "x86-64-v2,x86-64-v3")
    assert _is_wino(bundle, c, o)
    want = _reference(path, feeds)
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", x86_levels["x86-64-v2"])
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            assert m.code_variant["level"] == "x86-64-v2"
            np.testing.assert_allclose(list(m.run(feeds).values())[0], want, rtol=1e-4,
                                       atol=1e-4)


def test_generic_lowering_of_the_operator(tmp_path, monkeypatch):
    """Without the kernel, the operator's expression (the weights recovered as P U P^T)
    compiles through the generic loop nest and gives the same answer."""
    from mlcpack.packager.codegen import rules
    from mlcpack.runtime import load

    monkeypatch.setattr(rules, "KERNEL_RULES", tuple(
        rule for rule in rules.KERNEL_RULES if rule.op != "channel-lane convolution"))
    monkeypatch.setenv("MLCPACK_CACHE_DIR", "off")   # a patched code generator: not in the cache key
    n, c, h, w, o = 1, 16, 9, 8, 32
    model = conv_model(n, c, h, w, o, 3, 1, residual=True)
    feeds = conv_feeds(n, c, h, w, o, 3, 1, residual=True)
    path, bundle = _export(tmp_path, model)
    assert _is_wino(bundle, c, o)
    with load(bundle) as m:
        np.testing.assert_allclose(list(m.run(feeds).values())[0], _reference(path, feeds),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("w_shape,strides,out_shape,takes", [
    ((64, 64, 3, 3), (1, 1), (1, 64, 56, 56), True),
    ((256, 256, 3, 3), (1, 1), (1, 256, 14, 14), True),
    ((384, 384, 3, 3), (1, 1), (1, 384, 10, 10), True),       # 9.4 MB
    ((512, 512, 3, 3), (1, 1), (1, 512, 14, 14), True),       # 16.8 MB
    ((768, 768, 3, 3), (1, 1), (1, 768, 14, 14), False),      # 37.7 MB
    ((64, 64, 3, 3), (1, 1), (1, 64, 7, 7), False),           # 7x7 outputs
    ((64, 64, 3, 3), (2, 2), (1, 64, 28, 28), False),         # stride 2
    ((64, 64, 5, 5), (1, 1), (1, 64, 56, 56), False),         # 5x5
    ((16, 16, 3, 3), (1, 1), (1, 16, 64, 64), False),         # 16 outputs
    ((32, 8, 3, 3), (1, 1), (1, 32, 64, 64), False),          # 8 inputs
    ((64, 64, 3, 3), (1, 1), ("N", 64, 56, 56), True),        # run-time batch
])
def test_which_convolutions_take_it(w_shape, strides, out_shape, takes):
    assert uses_winograd(w_shape, strides, out_shape) == takes


def test_switched_off(tmp_path):
    """``CompileOptions(winograd=False)``: the direct kernel's packing (9 x C rows per block)."""
    from mlcpack.packager.options import CompileOptions

    _, bundle = _export(tmp_path, conv_model(1, 16, 12, 12, 32, 3, 1),
                        compile=CompileOptions(winograd=False))
    assert _weight_bytes(bundle) == (9 * 16 * 32 + 32) * 4


def test_profile_counts_the_direct_convolutions_multiply_adds(tmp_path):
    """The profiler's GFLOP/s of a Winograd kernel divides the direct convolution's
    multiply-adds (O x OH x OW x C x 9), not the 16 taps of its packed weights; `mlcpack
    inspect` names the design."""
    from mlcpack.runtime.describe import describe

    n, c, h, w, o = 1, 16, 12, 12, 32
    _, bundle = _export(tmp_path, conv_model(n, c, h, w, o, 3, 1))
    assert _is_wino(bundle, c, o)
    (kernel,) = [k for k in describe(bundle)["kernels"] if "conv2d_oc" in k["name"]]
    assert kernel["macs"] == n * o * h * w * c * 9
    assert kernel["kernel"].startswith("channel-lane Winograd F(2x2, 3x3)")
