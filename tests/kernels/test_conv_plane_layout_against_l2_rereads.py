"""``geometry.conv_geometry``'s plane layout when shifted planes would be re-read from L2 once per
block row (``SHIFTED_REREAD_BYTES``): weights past the L2 bound, shifted planes within it but
past a quarter of it, by phase dropping at most 1/12 of the columns -> the by-phase copy
(crnn's 128 -> 128 3x3 on 8x32). Each such shape runs on both layouts (the rule turned off by
raising the bound gives the shifted one) against ONNX Runtime, 1 and 2 threads, with a fused
ReLU; the shapes beside the rule's edges keep their layout."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.codegen.contraction import geometry
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
# these tests are of the register-blocked kernel (codegen/contraction/), not conv_oc.py
pytestmark = pytest.mark.usefixtures("register_blocked_conv")


def _model(c, h, w, o, s, bias):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    oh, ow = (h - 1) // s + 1, (w - 1) // s + 1
    inits = [numpy_helper.from_array(
        (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "W")]
    ins = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "B"))
        ins.append("B")
    nodes = [helper.make_node("Conv", ins, ["y0"], kernel_shape=[3, 3], strides=[s, s],
                              pads=[1] * 4),
             helper.make_node("Relu", ["y0"], ["y"])]
    graph = helper.make_graph(
        nodes, "layout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, oh, ow])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _geometry(c, h, w, o, s):
    oh, ow = (h - 1) // s + 1, (w - 1) // s + 1
    return geometry.conv_geometry((1, c, h, w), (o, c, 3, 3), (1, o, oh, ow),
                              dict(strides=(s, s), padding=(1,) * 4, groups=1,
                                   dilation=(1, 1)), 8)


SWITCHED = [   # c, h, w, o: by phase with the rule, shifted without it
    (128, 8, 32, 128),    # crnn's 4th conv: 480 KB of shifted planes, 576 KB of weights
    (96, 8, 32, 256),
    (64, 7, 28, 512),     # 1/15 of the columns dropped by phase; 7 rows, a tail
    (64, 10, 40, 512),
]

KEPT = [   # c, h, w, o, s, shifted: the rule does not apply
    (64, 20, 20, 512, 1, True),    # by phase would drop 2 of 22 columns (> 1/12)
    (128, 16, 16, 128, 1, True),   # planes and weights 1018 KB: within 2x the L2 bound
    (64, 8, 32, 128, 1, True),     # weights 288 KB: within the L2 bound (block rows innermost)
    (128, 8, 32, 512, 2, True),    # stride 2
]


@pytest.mark.parametrize("c,h,w,o", SWITCHED)
def test_rule_switches_to_phase(monkeypatch, c, h, w, o):
    g = _geometry(c, h, w, o, 1)
    assert not g["shifted"] and not g["panel_outer"]
    monkeypatch.setattr(geometry, "SHIFTED_REREAD_BYTES", 1 << 60)
    g = _geometry(c, h, w, o, 1)
    assert g["shifted"] and not g["panel_outer"]


@pytest.mark.parametrize("c,h,w,o,s,shifted", KEPT)
def test_rule_keeps_layout(monkeypatch, c, h, w, o, s, shifted):
    assert _geometry(c, h, w, o, s)["shifted"] == shifted
    monkeypatch.setattr(geometry, "SHIFTED_REREAD_BYTES", 1 << 60)
    assert _geometry(c, h, w, o, s)["shifted"] == shifted


@pytest.mark.parametrize("rule", [True, False])
@pytest.mark.parametrize("c,h,w,o", SWITCHED)
def test_both_layouts_match_onnxruntime(tmp_path, monkeypatch, c, h, w, o, rule):
    import onnx

    from mlcpack.frontends.onnx import import_onnx

    if not rule:
        monkeypatch.setattr(geometry, "SHIFTED_REREAD_BYTES", 1 << 60)
        monkeypatch.setenv("MLCPACK_CACHE_DIR", "off")   # a patched code generator: not in the cache key
    assert _geometry(c, h, w, o, 1)["shifted"] == (not rule)
    path = tmp_path / "m.onnx"
    onnx.save(_model(c, h, w, o, 1, bias=(o != 512)), str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host"))
    feeds = {"x": np.random.default_rng(1).standard_normal((1, c, h, w)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None,
                                                                                  feeds)[0]
    assert (want > 0).any() and (want == 0).any()
    for threads in (1, 2):
        with load(tmp_path / "m.mlc", threads=threads) as m:
            for _ in range(3):
                got = list(m.run(feeds).values())[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
