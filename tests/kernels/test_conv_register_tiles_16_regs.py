"""Register tiles on 16-register targets (AVX2): for windows past 3x3,
``geometry._conv_tiles_16_regs`` weighs 4 x 3 above 6 x 2 (4 x 3 spills in the unrolled tap loop),
except where 6 x 2 would waste a block row's worth of outputs (16 or 32 channels); and
``conv_geometry`` takes 6-row tiles where the panels run innermost with weights past L2 and
planes past half of it (fewer re-reads of the planes). The chosen tile, static and symbolic,
and the outputs against ONNX Runtime on 1 to 3 threads: a ResNet-style 7x7 stride-2 stem, 5x5
and 9x9 windows, a ViT-style 16x16 stride-16 patch embedding (no padding), ResNet's 128 -> 256
3x3 stride-2 downsampling."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import assert_matches_onnxruntime, conv_feeds, conv_model, conv_out_size

from mlcpack.packager.codegen.contraction.geometry import conv_geometry, symbolic_conv_tile

ort = pytest.importorskip("onnxruntime")
# these tests are of the register-blocked kernel (codegen/contraction/), not conv_oc.py
pytestmark = pytest.mark.usefixtures("register_blocked_conv")


@pytest.mark.parametrize("c,o,k,tile", [
    (3, 64, 7, (6, 2)),     # ResNet's stem: 4 x 3 spills, 6 x 2 wastes nothing on 64
    (32, 64, 5, (6, 2)),
    (3, 16, 9, (4, 3)),     # 6 x 2 would compute 18 rows for 16
    (32, 32, 5, (4, 3)),    # 36 for 32
    (64, 64, 3, (4, 3)),    # a 3x3 window keeps 4 x 3
])
def test_tile_by_window(c, o, k, tile):
    g = conv_geometry((1, c, 40, 40), (o, c, k, k), (1, o, 40, 40),
                      dict(strides=(1, 1), padding=(k // 2,) * 4, groups=1), 8)
    assert (g["mr"], g["nv"]) == tile
    assert symbolic_conv_tile(o, 8, k * k) == tile


@pytest.mark.parametrize("c,h,w,o,s,tall", [
    (128, 28, 28, 256, 2, True),    # ResNet-18's layers.4 conv1: 460 KB of planes by phase
    (128, 8, 32, 128, 1, False),    # crnn: 174 KB of planes, 4 x 3 stays
    (256, 14, 14, 512, 2, False),   # planes at half of L2, not past it
])
def test_tall_tile_when_planes_are_reread_from_l3(c, h, w, o, s, tall):
    oh, ow = conv_out_size(h, 3, s), conv_out_size(w, 3, s)
    g = conv_geometry((1, c, h, w), (o, c, 3, 3), (1, o, oh, ow),
                      dict(strides=(s, s), padding=(1,) * 4, groups=1), 8)
    assert (g["mr"] >= 6) == tall


def _patch_model(c, o, p, size):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((o, c, p, p)) / np.sqrt(c * p * p)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[p, p], strides=[p, p])],
        "patch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                       [1, o, size // p, size // p])],
        [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = [   # n, c, h, w, o, k, s, act, residual
    (1, 3, 64, 64, 64, 7, 2, None, False),     # stem (6 x 2)
    (2, 3, 37, 45, 64, 7, 2, "silu", True),    # odd sizes, a batch
    (1, 32, 21, 19, 64, 5, 1, "silu", False),  # 6 x 2
    (1, 3, 30, 26, 16, 9, 1, None, True),      # 4 x 3, 81 taps
    (1, 32, 17, 23, 32, 5, 1, "hsig", False),  # 4 x 3
    (1, 128, 28, 28, 256, 3, 2, "silu", True),  # tall tile, weights past L2
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("case", CASES + ["patch"])
def test_large_windows_match_onnxruntime(tmp_path, case, threads):
    if case == "patch":
        model = _patch_model(3, 48, 16, 64)
        feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 64, 64))
                 .astype(np.float32)}
    else:
        n, c, h, w, o, k, s, act, residual = case
        model = conv_model(n, c, h, w, o, k, s, act, residual)
        feeds = conv_feeds(n, c, h, w, o, k, s, residual)
    assert_matches_onnxruntime(tmp_path, model, feeds, threads, runs=3 if threads > 1 else 1)
