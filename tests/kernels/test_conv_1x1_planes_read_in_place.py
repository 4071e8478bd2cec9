"""1x1 convolutions read in place whose planes take a quarter to half of L2 (PP-LCNet's 256 ->
256 on 14x14, 64 -> 128 on 28x28, 192 -> 64 on 14x14) run panels outermost, like the other
1x1s with weights in L2 and at least CHUNK_MIN_STEPS input channels: each panel's planes stay in
L1 for all its block rows, and the epilogue prefetches the next panel's output (and residual)
runs (``EPILOGUE_PREFETCH_PANELS``). Against ONNX Runtime on 1-3 threads (tasks split panels), with
fused epilogues and a batch; and the geometry these cases are meant to take. On AVX2 (x86-64-v3)
those with 64 channels or more in and out copy their input into packed panels instead
(``geometry.conv_geometry``'s ``packed``, tests/kernels/test_conv_1x1_packed_panels.py); the
last case keeps the in-place kernel there."""

from __future__ import annotations

import pytest

from mlcpack.packager.codegen.contraction import geometry
from mlcpack.packager.codegen.contraction.geometry import conv_geometry

from conv_models import assert_matches_onnxruntime, conv_feeds, conv_model

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("register_blocked_conv")

CASES = [   # n, c, h, o, act, residual, threads
    (1, 256, 14, 256, "hsig", False, 1),    # 200 KB of planes, 4 tail pixels
    (1, 64, 28, 128, "silu", True, 2),      # 200 KB, a residual
    (2, 192, 14, 64, None, False, 3),       # 150 KB, a batch, 3 threads
    (1, 128, 20, 128, None, True, 2),       # 205 KB
    (1, 256, 14, 48, "relu", True, 2),      # 200 KB, 48 outputs: read in place on AVX2 too
]


def _geometry(n, c, h, o, vl=8):
    return conv_geometry((n, c, h, h), (o, c, 1, 1), (n, o, h, h),
                         dict(strides=(1, 1), padding=(0,) * 4, groups=1, dilation=(1, 1)), vl)


@pytest.mark.parametrize("n,c,h,o,act,residual,threads", CASES)
def test_mid_sized_planes_panels_outermost_match_onnxruntime(tmp_path, n, c, h, o, act,
                                                              residual, threads):
    g = _geometry(n, c, h, o)
    plane_bytes = 4 * c * h * h
    assert g["direct"] and g["panel_outer"], "the case no longer runs panels outermost"
    assert g["prefetch_panels"] == geometry.EPILOGUE_PREFETCH_PANELS > 0   # output, residual
    assert not g["prefetch_input"]   # the input stays in L2
    assert geometry.L2_REUSE_BYTES // 4 < plane_bytes <= geometry.L2_REUSE_BYTES // 2
    model = conv_model(n, c, h, h, o, 1, 1, act, residual, "mid")
    assert_matches_onnxruntime(tmp_path, model, conv_feeds(n, c, h, h, o, 1, 1, residual),
                               threads, runs=20 if threads > 1 else 1)


def test_short_reductions_keep_block_rows_outermost():
    # fewer than CHUNK_MIN_STEPS input channels: the block rows' scattered stores cost more
    g = _geometry(1, 32, 56, 192)
    assert g["direct"] and not g["panel_outer"] and not g["prefetch_panels"]


# inputs past L2: the block rows also prefetch the next panel's input rows (odd image with a
# masked last panel, a batch, threads; 256 channels in reduction chunks, 10 block rows over
# 256 channels: the last block row's share clamped)
PREFETCH_CASES = [   # n, c, h, o, act, residual, threads
    (2, 64, 47, 96, "relu", True, 2),
    (1, 256, 24, 40, None, False, 1),
]


@pytest.mark.parametrize("n,c,h,o,act,residual,threads", PREFETCH_CASES)
def test_inputs_past_l2_prefetch_input_rows_match_onnxruntime(tmp_path, n, c, h, o, act,
                                                               residual, threads):
    g = _geometry(n, c, h, o)
    assert g["direct"] and g["panel_outer"] and g["prefetch_panels"] and g["prefetch_input"]
    assert 4 * c * h * h > geometry.L2_REUSE_BYTES
    model = conv_model(n, c, h, h, o, 1, 1, act, residual, "pf")
    assert_matches_onnxruntime(tmp_path, model, conv_feeds(n, c, h, h, o, 1, 1, residual),
                               threads, runs=5 if threads > 1 else 1)
    from mlcpack.runtime.describe import describe   # `mlcpack inspect` names the design
    kernels = [k["kernel"] for k in describe(tmp_path / "m.mlc")["kernels"]]
    assert any(k.startswith("register-blocked conv:") and "input read in place" in k
               and k.endswith("next panel's outputs and input prefetched") for k in kernels)
