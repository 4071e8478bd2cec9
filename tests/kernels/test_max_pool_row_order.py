"""The max pool kernel's row order (codegen/pool.py): per output row, the maximum over the
window's rows of each input column (rows outside the image read a -inf row) into a -inf
margined row buffer (split by column parity for stride 2), then the window's columns with plain
loads. Against ONNX Runtime, static shapes: ResNet's stem pool, SPPF, 2x2/2 (ceil_mode too),
rows narrower than a vector and rows with tails past whole vectors, padding on every side,
dilation, NaN and infinities in the windows (and in the border rows and columns), 1 and 2
threads. A max is exact: the outputs must equal ORT's; with NaN in the windows (ORT's pool
drops or keeps a NaN by where it lies) they must equal a NaN-propagating numpy reference's,
whose other outputs are ORT's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

# (x shape, kernel, strides, pads [t, l, b, r], dilations, ceil_mode)
CASES = [
    ((1, 64, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),   # ResNet's stem pool
    ((1, 16, 75, 75), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),     # tails past 2 vectors
    ((1, 32, 20, 20), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 0),     # YOLOv8's SPPF
    ((1, 24, 64, 64), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 0),
    ((1, 8, 33, 127), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1),     # ceil: a half window
    ((1, 24, 56, 56), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0),
    ((2, 5, 9, 13), (3, 3), (2, 2), (0, 1, 2, 1), (1, 1), 1),       # uneven pads, batch 2
    ((1, 6, 30, 41), (3, 3), (2, 2), (2, 2, 2, 2), (2, 2), 0),      # dilated, stride 2
    ((1, 6, 5, 6), (3, 2), (1, 2), (1, 0, 1, 1), (1, 1), 0),        # rows under a vector
    ((1, 40, 28, 28), (3, 3), (2, 1), (1, 2, 1, 2), (1, 1), 1),
    # at 16 lanes, rows narrower than a vector: narrower vectors and an overlapping last one
    ((1, 16, 10, 10), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 0),     # SPPF at 320x320
    ((1, 8, 11, 23), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),      # odd widths, stride 2
]


def _model(shape, k, s, p, d, ceil) -> onnx.ModelProto:
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=list(k), strides=list(s),
                            pads=list(p), dilations=list(d), ceil_mode=ceil)
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _reference(x, want_shape, k, s, p, d) -> np.ndarray:
    """max over each window, NaN if any value in it is; padding (and ceil_mode's overhang)
    -inf."""
    n, c, oh, ow = want_shape
    ext_h = (oh - 1) * s[0] + (k[0] - 1) * d[0] + 1
    ext_w = (ow - 1) * s[1] + (k[1] - 1) * d[1] + 1
    padded = np.full((n, c, max(ext_h, p[0] + x.shape[2]), max(ext_w, p[1] + x.shape[3])),
                     -np.inf, np.float32)
    padded[:, :, p[0]:p[0] + x.shape[2], p[1]:p[1] + x.shape[3]] = x
    taps = [padded[:, :, ky * d[0]:ky * d[0] + (oh - 1) * s[0] + 1:s[0],
                   kx * d[1]:kx * d[1] + (ow - 1) * s[1] + 1:s[1]]
            for ky in range(k[0]) for kx in range(k[1])]
    return np.max(np.stack(taps), axis=0)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0][1]}x{c[0][2]}x{c[0][3]}_k{c[1][0]}{c[1][1]}"
                                             f"s{c[2][0]}{c[2][1]}c{c[5]}" for c in CASES])
def test_max_pool_against_ort(case, tmp_path) -> None:
    shape = case[0]
    model = _model(*case)
    mod, _ = import_onnx(model)
    path = tmp_path / "pool.mlc"
    export_module(mod, path, ExportOptions(target="host"))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    special = rng.standard_normal(shape).astype(np.float32)
    h, w = shape[2], shape[3]
    # NaN and infinities: in the first and last rows and columns and inside, on a few planes
    # (no window of -inf alone: ORT gives the lowest float there, this kernel -inf)
    for plane, (iy, ix, v) in enumerate([(0, 0, np.nan), (h - 1, w - 1, np.nan),
                                         (h // 2, w // 2, np.nan), (0, w - 1, np.inf),
                                         (h - 1, 1, -np.inf), (h // 3, w - 2, np.inf)]):
        special[0, plane % shape[1], iy, ix] = v
    special[-1, -1, :, w // 3] = np.nan                 # a whole column
    special[0, 1 % shape[1], h // 2, :] = -np.inf       # a whole row
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            for feed in (x, -np.abs(x), special):
                want = session.run(None, {"x": feed})[0]
                got = m.run({"x": feed})["y"]
                assert got.shape == want.shape
                if feed is special:
                    ref = _reference(feed, want.shape, *case[1:5])
                    assert np.isnan(ref).any()
                    np.testing.assert_array_equal(ref[~np.isnan(ref)], want[~np.isnan(ref)])
                    want = ref
                np.testing.assert_array_equal(got, want)
