"""The conv kernel's reduction in chunks of input channels (``geometry.conv_geometry``'s
``kc_outer`` / ``kc_inner``, ``ContractionEmitter._conv_chunked``): each block's partial sums
go to a tile in the task's workspace region between chunks, so that the planes the blocks of a
panel (or the panels of a block row) share stay in L1. Strided 3x3 convolutions (YOLO-style
downsampling) by phase and shifted, with the block rows innermost and the panels innermost, a
1x1 convolution that reads its input in place (masked last panel), odd sizes, partial block
rows, tails, fused SiLU and residual epilogues, batches, 1 to 3 threads; all against ONNX
Runtime. Panels innermost on several tasks, chunked or not, splits the work by panel
(``_conv_panels``' ``by_panel``)."""

from __future__ import annotations

import pytest

from mlcpack.packager.codegen.contraction.geometry import conv_geometry

from conv_models import assert_matches_onnxruntime, conv_feeds
from conv_models import conv_model as _model, conv_out_size as _out_size

ort = pytest.importorskip("onnxruntime")
# these tests are of the register-blocked kernel (codegen/contraction/), not conv_oc.py
pytestmark = pytest.mark.usefixtures("register_blocked_conv")


CASES = [   # n, c, h, w, o, k, s, act, residual, threads, path
    # block rows innermost, 2 chunks of 16 channels, a tail, a partial block row (20 = 5 x 4)
    (1, 32, 37, 41, 20, 3, 2, "silu", False, 1, "outer"),
    (1, 32, 37, 41, 20, 3, 2, "silu", True, 2, "outer"),
    # a batch: every image's planes, the tasks' partial tiles reused image after image
    (2, 64, 23, 21, 76, 3, 2, "silu", True, 2, "outer"),
    (2, 64, 23, 21, 76, 3, 2, None, False, 3, "outer"),
    # weights past the L2 bound: panels innermost, shifted planes, 12 chunks of 8 channels
    (1, 96, 15, 17, 210, 3, 2, "silu", False, 1, "inner"),
    (1, 96, 15, 17, 210, 3, 2, "silu", True, 2, "inner"),
    # panels innermost without chunks (128 -> 128 on 16x16, shifted planes, 11 panels): on
    # several tasks each takes a run of the panels and copies only their plane rows
    (1, 128, 16, 16, 128, 3, 1, "silu", True, 2, "inner_whole"),
    (2, 128, 16, 16, 128, 3, 1, None, False, 3, "inner_whole"),
    # YOLO's last downsampling (128 -> 256 on 20x20) with 250 outputs: by phase, a tail
    (1, 128, 20, 20, 250, 3, 2, "silu", False, 2, "inner"),
    # small planes, small weights: panels innermost on 1 thread, block rows on several
    (1, 96, 9, 10, 60, 3, 1, "silu", True, 1, "split"),
    (1, 96, 9, 10, 60, 3, 1, "silu", True, 2, "split"),
    # 1x1 reading its input in place: the last panel's last channel loads masked
    (1, 256, 9, 10, 37, 1, 1, "silu", True, 1, "direct"),
    (1, 256, 9, 10, 37, 1, 1, None, False, 2, "direct"),
]


def _check_path(g: dict, c: int, path: str) -> None:
    if path == "outer":
        assert g["panel_outer"] and g["kc_outer"] < c and not g["direct"]
    elif path == "inner":
        assert not g["panel_outer"] and g["kc_inner"] < c
        assert 4 * g["o"] * c * g["kh"] * g["kw"] > 512 * 1024   # no block rows on threads
    elif path == "inner_whole":
        assert not g["panel_outer"] and g["kc_inner"] == c and not g["direct"]
        assert 4 * g["o"] * c * g["kh"] * g["kw"] > 512 * 1024
        assert g["panels"] > 3
    elif path == "split":
        assert not g["panel_outer"] and g["kc_inner"] < c and g["kc_outer"] < c
    else:
        assert g["direct"] and g["panel_outer"] and g["kc_outer"] < c and not g["tail"]
        assert g["panels"] * g["nr"] > g["pflat"]
    assert c % g["kc_outer"] == 0 and c % g["kc_inner"] == 0
    tiles = max(-(-g["og"] // g["mr"]) if g["kc_outer"] < c else 0,   # one per block row
                g["panels"] if g["kc_inner"] < c else 0)              # or one per panel
    assert g["part_floats"] >= tiles * g["mr"] * g["nr"] + g["vl"]


@pytest.mark.parametrize("n,c,h,w,o,k,s,act,residual,threads,path", CASES)
def test_conv_chunks_match_onnxruntime(tmp_path, n, c, h, w, o, k, s, act, residual, threads,
                                       path):
    p = k // 2
    oh, ow = _out_size(h, k, s), _out_size(w, k, s)
    geom = conv_geometry((n, c, h, w), (o, c, k, k), (n, o, oh, ow),
                         dict(strides=(s, s), padding=(p,) * 4, groups=1, dilation=(1, 1)), 8)
    _check_path(geom, c, path)
    # several runs on several threads: the tasks' tiles, run after run
    assert_matches_onnxruntime(tmp_path, _model(n, c, h, w, o, k, s, act, residual),
                               conv_feeds(n, c, h, w, o, k, s, residual), threads,
                               runs=10 if threads > 1 else 1)
