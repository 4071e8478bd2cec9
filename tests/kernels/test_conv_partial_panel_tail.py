"""The conv kernel's tail (``geometry.conv_geometry``'s ``tail``): the outputs a last, partial
panel would hold computed as dot products with the reduction on the vector lanes. Small images
(7x7, 10x10, 1x1), a reduction not a multiple of the vector width, output channels not a
multiple of the tail's block, a padded strided 3x3, fused epilogues, a batch on 2 threads
(each image gathers its tail inputs into a region of its own), all against ONNX Runtime."""

from __future__ import annotations

import pytest

from mlcpack.packager.codegen.contraction.geometry import L2_REUSE_BYTES, conv_geometry

from conv_models import assert_matches_onnxruntime, conv_feeds, conv_model, conv_out_size

ort = pytest.importorskip("onnxruntime")
# these tests are of the register-blocked kernel (codegen/contraction/), not conv_oc.py
pytestmark = pytest.mark.usefixtures("register_blocked_conv")


CASES = [   # n, c, h, o, k, s, act, residual, threads
    (1, 512, 7, 96, 1, 1, None, False, 1),        # one tail pixel (8-channel blocks)
    (1, 64, 10, 85, 1, 1, "silu", True, 2),       # four tail pixels, 85 channels
    (1, 20, 20, 36, 3, 2, "silu", False, 2),      # strided 3x3 by phase, K = 180
    (1, 12, 10, 18, 3, 1, None, True, 1),         # K = 108, shifted planes
    (1, 45, 1, 70, 1, 1, "hsig", False, 2),       # a 1x1 image: every output in the tail
    (2, 30, 7, 40, 1, 1, "silu", False, 2),       # a batch on 2 threads
    # weights past L2: each block row's tail follows its panels (_fuses_tail)
    (1, 320, 7, 1280, 1, 1, "hsig", False, 1),    # reduction in chunks, one tail pixel
    (1, 320, 7, 1278, 1, 1, None, True, 2),       # a partial last block row, 2 threads
    (1, 512, 14, 512, 1, 1, "silu", False, 3),    # no chunks, four tail pixels, 3 threads
    (2, 960, 7, 168, 1, 1, None, False, 2),       # a batch: each image's rows gathered
]


@pytest.mark.parametrize("n,c,h,o,k,s,act,residual,threads", CASES)
def test_conv_tail_matches_onnxruntime(tmp_path, n, c, h, o, k, s, act, residual, threads):
    p = k // 2
    oh = conv_out_size(h, k, s)
    geom = conv_geometry((n, c, h, h), (o, c, k, k), (n, o, oh, oh),
                         dict(strides=(s, s), padding=(p,) * 4, groups=1, dilation=(1, 1)), 8)
    assert geom["tail"], "the case no longer takes the tail"
    fused = geom["direct"] and not geom["panel_outer"] and 4 * o * c > L2_REUSE_BYTES
    assert fused == (o * c >= 160 * 960), "the case no longer fuses (or newly fuses) its tail"
    model = conv_model(n, c, h, h, o, k, s, act, residual, "tail")
    assert_matches_onnxruntime(tmp_path, model, conv_feeds(n, c, h, h, o, k, s, residual),
                               threads, runs=20 if threads > 1 else 1)
