"""1x1 convolutions that the register-blocked kernel keeps on AVX-512 (x86-64-v4, 16 lanes:
fewer than 256 input channels, codegen/contraction/geometry.py): a 16-lane register tile
whatever the image size (the half-width tiles run at half Zen 5's FMA rate), and the input
packed in panels (codegen/contraction/conv_packed.py) where the weights pass L2. The emitted
code is checked on any x86-64 host (compile only: zmm multiply-adds, no stack access in the
product loop); the runs against ONNX Runtime need a host with AVX-512."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import avx512_host, conv_feeds, conv_model, export_model
from helpers import capture_compiles, self_loops


ort = pytest.importorskip("onnxruntime")

V4 = "x86-64-v4"
ONE = dict(strides=(1, 1), padding=(0, 0, 0, 0), groups=1)


def _geometry(c, o, hw, vl):
    from mlcpack.packager.codegen.contraction.geometry import conv_geometry

    return conv_geometry((1, c, hw, hw), (o, c, 1, 1), (1, o, hw, hw), ONE, vl)


@pytest.mark.parametrize("c,o,hw,packed", [
    (96, 576, 7, False),     # MobileNetV3: weights in L2, read in place, was 3 x 7 ymm
    (40, 240, 14, False),    # ... was 4 x 5 ymm
    (16, 16, 56, False),
    (192, 1152, 7, True),    # EfficientNet-B0: 884 KB of weights, packed panels
    (128, 1152, 14, True),
])
def test_16_lane_tiles_packed_past_l2(c, o, hw, packed):
    g = _geometry(c, o, hw, 16)
    assert g["vl"] == 16 and g["nv"] * g["mr"] <= 24 and g["packed"] == packed
    # AVX2 keeps its choices: packed from 64 channels with the input in L2
    assert _geometry(c, o, hw, 8)["packed"] == (min(c, o) >= 64)


@pytest.mark.parametrize("c,o,hw,choice", [
    (192, 768, 7, "4 channels x 64 pixels register tile, input packed in panels"),
    (96, 240, 7, "4 channels x 64 pixels register tile, input read in place"),
])
def test_zmm_product_loop_without_spills(tmp_path, monkeypatch, c, o, hw, choice):
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    export_model(tmp_path, conv_model(1, c, hw, hw, o, 1, 1))
    (target, code), = captured
    assert choice in next(iter(code.kernels.values())).choice
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    product = [body for body in self_loops(asm) if sum("vfmadd" in i for i in body) >= 16]
    assert product
    for body in product:
        assert all("zmm" in i for i in body if "vfmadd" in i)
        assert not any("(%rsp)" in i for i in body)


@pytest.mark.parametrize("n,c,h,w,o,s,act,residual", [
    (1, 192, 7, 7, 768, 1, "silu", True),     # packed panels, one partial panel
    (2, 176, 9, 11, 800, 1, None, False),     # packed, batch 2, a masked last panel
    (1, 40, 14, 14, 240, 1, "hsig", False),   # read in place, 16-lane tile
    (1, 24, 13, 13, 88, 2, None, True),       # stride 2
])
def test_matches_onnxruntime(tmp_path, n, c, h, w, o, s, act, residual):
    from mlcpack.runtime import load

    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, 1, s, act=act,
                                                residual=residual))
    feeds = conv_feeds(n, c, h, w, o, 1, s, residual=residual)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            assert m.code_variant["level"] == V4
            for _ in range(2):
                got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
