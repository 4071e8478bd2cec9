"""Planes whose channel stride is a multiple of ``geometry.ALIAS_BYTES`` (16x16, 32x32, 64x64 and
112x112 images): the register-blocked conv kernel lays them out a cache line apart
(``pstride``), and copies a 1x1 convolution's input into them instead of reading it in place
when it has at least ALIAS_MIN_CHANNELS input and output channels. Partial last panels (their
dropped columns read the gap after each plane), a strided 1x1 by phase, a 3x3 by phase, a batch,
fused epilogues, 1-3 threads (each task copies only the plane rows it reads), against ONNX
Runtime; and the geometry these cases are meant to take."""

from __future__ import annotations

import pytest

from mlcpack.packager.codegen.contraction import geometry
from mlcpack.packager.codegen.contraction.geometry import conv_geometry

from conv_models import assert_matches_onnxruntime, conv_feeds, conv_model, conv_out_size

ort = pytest.importorskip("onnxruntime")
# these tests are of the register-blocked kernel (codegen/contraction/), not conv_oc.py
pytestmark = pytest.mark.usefixtures("register_blocked_conv")


CASES = [   # n, c, h, o, k, s, act, residual, threads
    (1, 576, 16, 96, 1, 1, None, False, 1),       # 11 panels for 256 pixels, chunks of 96
    (1, 64, 32, 64, 1, 1, "silu", True, 2),       # 32x32, residual, 2 threads
    (2, 32, 64, 40, 1, 1, "hsig", False, 3),      # 64x64 (16 KB rows), a batch, 3 threads
    (1, 48, 64, 48, 1, 2, None, False, 2),        # 1x1 stride 2: 32x32 planes by phase
    (1, 40, 30, 24, 3, 1, "silu", True, 2),       # 3x3 by phase: 32x32 planes, 2 columns dropped
    (1, 512, 16, 512, 1, 1, None, False, 2),      # weights past L2
]


def _geometry(n, c, h, o, k, s, vl=8):
    p = k // 2
    oh = conv_out_size(h, k, s)
    return conv_geometry((n, c, h, h), (o, c, k, k), (n, o, oh, oh),
                         dict(strides=(s, s), padding=(p,) * 4, groups=1, dilation=(1, 1)), vl)


@pytest.mark.parametrize("n,c,h,o,k,s,act,residual,threads", CASES)
def test_padded_planes_match_onnxruntime(tmp_path, n, c, h, o, k, s, act, residual, threads):
    for vl in (4, 8, 16):
        g = _geometry(n, c, h, o, k, s, vl)
        assert not g["direct"] and g["pstride"] == g["hq"] * g["wq"] + geometry.PLANE_PAD, \
            "the case no longer takes padded planes"
    model = conv_model(n, c, h, h, o, k, s, act, residual, "alias")
    assert_matches_onnxruntime(tmp_path, model, conv_feeds(n, c, h, h, o, k, s, residual),
                               threads, runs=20 if threads > 1 else 1)


def test_which_convolutions_take_padded_planes():
    # a 1x1 on 112x112 with few channels stays read in place (the copy would cost more)
    for c, o in ((16, 96), (32, 16)):
        g = _geometry(1, c, 112, o, 1, 1)
        assert g["direct"] and g["pstride"] == 112 * 112
    # rows that spread over L1's sets: no gap, read in place
    for h in (14, 15, 17, 28):
        g = _geometry(1, 576, h, 96, 1, 1)
        assert g["pstride"] == h * h
    assert _geometry(1, 576, 16, 96, 1, 1)["pstride"] == 256 + geometry.PLANE_PAD


def test_padding_off_reads_in_place(monkeypatch):
    """With the rule off the same layers read their input in place, unpadded: the cases above
    exercise the padded layout, not the default one."""
    monkeypatch.setattr(geometry, "ALIAS_BYTES", 1 << 40)
    g = _geometry(1, 576, 16, 96, 1, 1)
    assert g["direct"] and g["pstride"] == 256
    g = _geometry(1, 48, 64, 48, 1, 2)
    assert g["pstride"] == g["hq"] * g["wq"]
