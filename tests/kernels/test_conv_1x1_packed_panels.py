"""1x1 convolutions whose weights pass L2 (ResNet-50's 14x14 and 7x7 layers, the strided
downsamples) or whose input stays in L2 copy their input into packed panels ([panel][K][nr], ``conv_packed.py``) and run
their block rows in chunks whose weights stay in L2. Against ONNX Runtime on 1-3 threads, with
a residual, a batch, a stride, the tail pixels, a masked partial last panel, weights in row
blocks (the AVX2 default) and plain [O, C] weights; and the geometry these cases take. The
export is pinned to x86-64-v3 (the packed kernel is AVX2's)."""

from __future__ import annotations

import platform

import pytest

from mlcpack.packager.codegen.contraction import geometry
from mlcpack.packager.codegen.contraction.geometry import conv_geometry

from conftest import X86_V3
from conv_models import assert_matches_onnxruntime, conv_feeds, conv_model, conv_out_size

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="runs x86-64-v3 code: needs an x86-64 host with AVX2")

CASES = [   # n, c, h, o, stride, act, residual, threads, tail pixels, partial last panel
    (1, 512, 7, 384, 1, "relu", True, 2, 1, False),     # 7x7: 2 panels and a tail pixel
    (2, 256, 13, 640, 2, None, False, 3, 1, False),     # strided, a batch, 3 threads
    (1, 256, 20, 640, 1, "silu", False, 2, 0, True),    # 400 outputs: a masked last panel
    (1, 128, 16, 256, 1, "hsig", True, 2, 0, True),     # weights and input in L2: one chunk
]


def _geometry(n, c, h, o, s):
    oh = conv_out_size(h, 1, s)
    return conv_geometry((n, c, h, h), (o, c, 1, 1), (n, o, oh, oh),
                         dict(strides=(s, s), padding=(0,) * 4, groups=1, dilation=(1, 1)), 8)


@pytest.fixture()
def v3_host(monkeypatch):
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)


@pytest.mark.parametrize("n,c,h,o,s,act,residual,threads,tail,partial", CASES)
def test_packed_panels_match_onnxruntime(tmp_path, v3_host, n, c, h, o, s, act, residual,
                                         threads, tail, partial):
    g = _geometry(n, c, h, o, s)
    assert g["packed"] and 0 < g["mc_blocks"] <= -(-o // g["mr"])
    # weights past L2: block rows in chunks; else one chunk
    assert (g["mc_blocks"] < -(-o // g["mr"])) == (4 * o * c > geometry.L2_REUSE_BYTES)
    assert len(g["tail"]) == tail
    assert (g["panels"] * g["nr"] > g["pflat"]) == partial
    model = conv_model(n, c, h, h, o, 1, s, act, residual, "pk")
    assert_matches_onnxruntime(tmp_path, model, conv_feeds(n, c, h, h, o, 1, s, residual),
                               threads, runs=5 if threads > 1 else 1)
    from mlcpack.runtime.describe import describe   # `mlcpack inspect` names the design
    kernels = [k["kernel"] for k in describe(tmp_path / "m.mlc")["kernels"]]
    assert any(k.startswith("register-blocked conv:") and "input packed in panels" in k
               for k in kernels), kernels


@pytest.mark.usefixtures("register_blocked_conv")
def test_packed_panels_on_plain_weights_match_onnxruntime(tmp_path, v3_host):
    # weights [O, C] (not packed in row blocks): the tail's dot products along the rows
    n, c, h, o = 1, 512, 7, 384
    model = conv_model(n, c, h, h, o, 1, 1, "relu", True, "pkw")
    assert_matches_onnxruntime(tmp_path, model, conv_feeds(n, c, h, h, o, 1, 1, True), 2, runs=3)


def test_which_1x1_convolutions_are_packed():
    assert _geometry(1, 128, 28, 512, 1)["packed"]        # input in L2 (weights too)
    assert _geometry(1, 256, 56, 512, 2)["packed"]        # strided: copied anyway
    assert not _geometry(1, 64, 56, 256, 1)["packed"]     # large input in place, weights in L2
    assert not _geometry(1, 256, 14, 32, 1)["packed"]     # few outputs: the copy costs more
    oh = 7
    g = conv_geometry((1, 512, 7, 7), (384, 512, 1, 1), (1, 384, oh, oh),
                      dict(strides=(1, 1), padding=(0,) * 4, groups=1, dilation=(1, 1)), 16)
    assert g["packed"] and g["vl"] == 16   # AVX-512: packed where the weights pass L2 ...
    g = conv_geometry((1, 128, 28, 28), (512, 128, 1, 1), (1, 512, 28, 28),
                      dict(strides=(1, 1), padding=(0,) * 4, groups=1, dilation=(1, 1)), 16)
    assert not g["packed"]   # ... not with them in L2 (test_conv_1x1_avx512.py)
