"""Convolutions with the output channels on the vector lanes (``nn.conv2d_oc``,
codegen/conv_oc.py): on AVX2 targets the export packs an ungrouped conv's constant weights
(passes/layout.py) and the kernel computes it; checked against ONNX Runtime over windows,
strides, padding, partial channel blocks, batches, fused epilogues and 1-3 threads, and the
rewrite's conditions (what keeps the register-blocked kernel)."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import conv_feeds, conv_model

from mlcpack.packager.ops.layout import OC_BLOCK, pack_oc_weights, unpack_oc_weights

ort = pytest.importorskip("onnxruntime")

AVX2 = "x86-64-v3"


def _export(tmp_path, model, target=AVX2):
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target=target))
    return path, tmp_path / "m.mlc"


def _kernel_names(bundle) -> list[str]:
    from mlcpack.runtime.describe import describe

    return [k["name"] for k in describe(bundle)["kernels"]]


def test_packing_round_trip():
    w = np.random.default_rng(0).standard_normal((40, 3, 5, 5)).astype(np.float32)
    wp = pack_oc_weights(w)
    assert wp.shape == (2, 3 * 25, OC_BLOCK)
    assert wp[1, 7, 3] == w[35].reshape(-1)[7]
    assert not wp[1, :, 8:].any()           # the last block's channels past 40 are zeros
    np.testing.assert_array_equal(unpack_oc_weights(wp, 40, (5, 5)), w)


@pytest.mark.parametrize("n,c,h,w,o,k,s,act,residual", [
    (1, 16, 12, 12, 32, 3, 1, None, False),
    (1, 64, 20, 20, 64, 3, 1, None, True),        # ResNet's block: bias, residual add
    (1, 32, 14, 14, 64, 3, 2, "silu", False),     # stride 2, an epilogue with vector math
    (1, 3, 30, 34, 64, 7, 2, None, False),        # ResNet's stem: 3 input channels, 7x7 s2
    (2, 24, 9, 13, 40, 5, 2, "hsig", True),       # batch 2, 40 = a block and a vector
    (1, 8, 7, 7, 16, 3, 1, None, False),          # 7-wide rows: a 1-pixel tail tile
    (1, 12, 10, 11, 24, 3, 1, None, True),        # 12 channels: a chunk of 8 and one of 4
    (1, 16, 20, 1, 32, 3, 1, None, False),        # 1-pixel rows: tiles span rows
])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_matches_onnxruntime(tmp_path, n, c, h, w, o, k, s, act, residual, threads):
    from mlcpack.runtime import load

    model = conv_model(n, c, h, w, o, k, s, act=act, residual=residual)
    feeds = conv_feeds(n, c, h, w, o, k, s, residual=residual)
    path, bundle = _export(tmp_path, model)
    assert any("conv2d_oc" in name for name in _kernel_names(bundle))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with load(bundle, threads=threads) as m:
        for _ in range(2):   # the task regions' second use (bands copied again)
            got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bands_of_a_large_image(tmp_path):
    """Input rows past BAND_BYTES: several bands, each copied by the task that needs it."""
    from mlcpack.packager.codegen import conv_oc
    from mlcpack.runtime import load

    c, h, o = 64, 72, 32
    assert 4 * c * h * (h + 2) > conv_oc.BAND_BYTES
    model = conv_model(1, c, h, h, o, 3, 1, residual=True)
    feeds = conv_feeds(1, c, h, h, o, 3, 1, residual=True)
    path, bundle = _export(tmp_path, model)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            np.testing.assert_allclose(list(m.run(feeds).values())[0], want, rtol=1e-4,
                                       atol=1e-4)


@pytest.mark.parametrize("n,c,h,w,o,k,s,act", [
    (1, 16, 12, 12, 32, 3, 1, None),
    (2, 24, 9, 13, 40, 5, 2, "silu"),     # a block and one vector, stride 2, vector math
])
def test_the_sse_variant_of_a_portable_bundle(tmp_path, monkeypatch, x86_levels,
                                              n, c, h, w, o, k, s, act):
    """A bundle with an SSE level and AVX2 packs the weights; the 4-lane variant (a block in
    two passes of 4 vectors, 4 x 4 transposes) runs where AVX2 is missing."""
    from mlcpack.runtime import load

    model = conv_model(n, c, h, w, o, k, s, act=act)
    feeds = conv_feeds(n, c, h, w, o, k, s)
    path, bundle = _export(tmp_path, model, "x86-64-v2,x86-64-v3")
    assert any("conv2d_oc" in name for name in _kernel_names(bundle))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", x86_levels["x86-64-v2"])
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            assert m.code_variant["level"] == "x86-64-v2"
            np.testing.assert_allclose(list(m.run(feeds).values())[0], want, rtol=1e-4,
                                       atol=1e-4)


@pytest.mark.parametrize("o,k,target,packed", [
    (32, 3, AVX2, True),
    (32, 3, "x86-64,x86-64-v2,x86-64-v3", True),   # the portable bundle of an AVX2 host
    (20, 3, AVX2, False),             # output channels not in whole vectors
    (32, 1, AVX2, False),             # 1x1: the register-blocked kernel reads it in place
    (32, 3, "x86-64-v4", True),       # AVX-512: 16 lanes (tests/kernels/test_conv_oc_avx512.py)
    (32, 3, "x86-64-v3,x86-64-v4", True),
    (32, 3, "x86-64-v2", False),
    (32, 3, "aarch64", False),
])
def test_which_convolutions_are_packed(tmp_path, o, k, target, packed):
    model = conv_model(1, 16, 10, 10, o, k, 1)
    _, bundle = _export(tmp_path, model, target)
    assert any("conv2d_oc" in name for name in _kernel_names(bundle)) == packed


def test_a_run_time_batch(tmp_path):
    """A batch known at run time only (the symbolic plan, and the batch-1 plan beside it):
    both pack the weights, stored once; right answers at batch 1, 3 and 5 on 1-2 threads."""
    from mlcpack.runtime import load

    model = conv_model(1, 16, 12, 13, 40, 3, 2, act="silu", residual=True)
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    path, bundle = _export(tmp_path, model)
    names = _kernel_names(bundle)
    assert names and all("conv2d_oc" in name for name in names if "conv" in name)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            for n in (1, 3, 5):
                feeds = conv_feeds(n, 16, 12, 13, 40, 3, 2, residual=True, seed=n)
                np.testing.assert_allclose(list(m.run(feeds).values())[0],
                                           sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2])
def test_weights_past_l2_prefetched(tmp_path, n):
    """Weights past PREFETCH_MIN_WEIGHT_BYTES: each chunk's tiles prefetch the next chunk's
    weights (the next block's, then the next image's first block, after a block's last chunk;
    past the last block, lines beyond the weights: a hint, never a fault). 264 output channels:
    8 blocks and a partial one of a vector; a 5 x 6 image, too small for Winograd.
    `mlcpack inspect` names the kernel's design."""
    from mlcpack.packager.codegen import conv_oc
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe, describe_text

    c, h, w, o = 64, 5, 6, 264
    assert 4 * -(-o // OC_BLOCK) * OC_BLOCK * c * 9 > conv_oc.PREFETCH_MIN_WEIGHT_BYTES
    model = conv_model(n, c, h, w, o, 3, 1, act="silu", residual=True)
    feeds = conv_feeds(n, c, h, w, o, 3, 1, residual=True)
    path, bundle = _export(tmp_path, model)
    info = describe(bundle)
    kernel = next(k for k in info["kernels"] if "conv2d_oc" in k["name"])
    assert kernel["kernel"].startswith("channel-lane direct: 3 pixels x 32 channels")
    assert kernel["kernel"].endswith("next weights prefetched")
    assert f"kernel: {kernel['kernel']}" in describe_text(info)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2, 3):
        with load(bundle, threads=threads) as m:
            np.testing.assert_allclose(list(m.run(feeds).values())[0], want, rtol=1e-4,
                                       atol=1e-4)
