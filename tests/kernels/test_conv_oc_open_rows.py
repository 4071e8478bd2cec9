"""Channel-lane convolutions (codegen/conv_oc.py) with run-time image sizes on 16 lanes: a
register tile whose pixels lie in one output row reads them from one base pointer (a window
row's broadcasts shared by neighbouring pixels where the registers allow, else one opaque
pointer per tap), a tile that wraps into the next row keeps a pointer per pixel; the band copy
writes whole padded rows from masked loads. The PP-OCRv4 recognizer's 1x3 convolutions to 60
channels on 1x40 (its default export, open dims) ran 1.5x their fixed-shape time. Checked
against ONNX Runtime on sizes where tiles wrap and where they do not, rows above and below the
image padded, 1 and 2 threads (AVX-512 hosts), and by the x86-64-v4 assembly of the tile loops
(any x86-64 host: compiled, not run)."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import avx512_host, conv_feeds, conv_model
from helpers import capture_compiles, self_loops

ort = pytest.importorskip("onnxruntime")


def _row_conv(c: int, o: int):
    """x (N, c, H, W) -> Conv 1x3 (pads 0, 1) to ``o`` channels, bias -> x * sigmoid(x):
    the SVTR neck's convolution, its sizes named."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(
                 (rng.standard_normal((o, c, 1, 3)) / np.sqrt(3 * c)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y0"], kernel_shape=[1, 3],
                              pads=[0, 1, 0, 1]),
             helper.make_node("Sigmoid", ["y0"], ["s"]),
             helper.make_node("Mul", ["y0", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "rowconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["N", c, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", o, "H", "W"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _open(model):
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        dims[2].dim_param, dims[3].dim_param = \
            ("OH", "OW") if vi in model.graph.output else ("H", "W")
    return model


def _export(tmp_path, model, check: bool = True):
    import onnx
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="x86-64-v4", check=check))
    return path, tmp_path / "m.mlc"


def _check(path, bundle, cases):
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    kernels = [k for k in describe(bundle)["kernels"] if "conv" in k["name"]]
    assert kernels and all("conv2d_oc" in k["name"] for k in kernels)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for t in (1, 2):
        with load(bundle, threads=t) as m:
            for feeds in cases:
                want = sess.run(None, feeds)[0]
                for _ in range(2):   # the task regions' second use
                    got = list(m.run(feeds).values())[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_row_conv_to_60_channels_open(tmp_path):
    """8-pixel tiles on rows of 40 (none wraps), 37 and 13 (some wrap), 1 (a pixel), two
    images; the band copy's last vector past a row of 42 or 39 padded columns."""
    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    path, bundle = _export(tmp_path, _row_conv(96, 60))
    rng = np.random.default_rng(3)
    _check(path, bundle, [{"x": rng.standard_normal((n, 96, h, w)).astype(np.float32)}
                          for n, h, w in [(1, 1, 40), (1, 1, 37), (2, 3, 13), (1, 2, 1)]])


SIZES = [(1, 1), (2, 20), (5, 33), (3, 48)]


@pytest.mark.parametrize("c,o,k,s,sizes", [
    (32, 16, 3, 1, SIZES),    # 16-pixel tiles: a tap's broadcasts through an opaque pointer
    (16, 48, 5, 1, SIZES),    # rows above and below the image zeroed (2 of a 5-row window)
    (24, 64, 3, 2, SIZES),    # stride 2: 8 pixels 2 columns apart
    (3, 256, 3, 1, [(40, 33), (9, 5)]),   # C = 3: bands of at most OPEN_BAND_ROWS rows
])
def test_open_tiles_match_onnxruntime(tmp_path, c, o, k, s, sizes):
    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    path, bundle = _export(tmp_path, _open(conv_model(1, c, 8, 8, o, k, s, act="silu")))
    _check(path, bundle, [conv_feeds(1, c, h, w, o, k, s, seed=h) for h, w in sizes])


def test_static_rest_half_tile(tmp_path):
    """A fixed 13x13 image in bands of 4, 4, 4 and 1 rows (52 pixels: 6 tiles and half a
    tile; 13: a tile, half a tile and a single pixel)."""
    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    path, bundle = _export(tmp_path, conv_model(1, 32, 13, 13, 64, 3, 1, act="hsig",
                                                residual=True))
    _check(path, bundle, [conv_feeds(1, 32, 13, 13, 64, 3, 1, residual=True)])


def test_static_group_rows():
    """``_group_rows`` on PP-LCNet's 256 -> 256 1x1 on 14x14 (one band): 8 rows a group
    (112 and 84 pixels, no single pixel), not the row buffer's 9."""
    from types import SimpleNamespace

    from mlcpack.packager.codegen import conv_oc

    em = conv_oc.ChannelLaneConvEmitter.__new__(conv_oc.ChannelLaneConvEmitter)
    em.vl, em.pairs, em.o, em.oh, em.ow, em.band, em.sw = 16, False, 256, 14, 14, 14, 1
    em.wino, em.c, em.kh, em.kw = False, 256, 1, 1
    em.match = SimpleNamespace(tag=SimpleNamespace(attrs={}))
    assert em._group_rows(9) == 8
    em.vl = 8   # AVX2: unchanged
    assert em._group_rows(9) == 9


@pytest.mark.parametrize("model,fmas,stack", [
    (lambda: _row_conv(480, 60), 48, 1),      # 8 pixels x 2 vectors x 3 taps, shared
    (lambda: _open(conv_model(1, 32, 8, 8, 16, 3, 1)), 144, 4),   # 16 x 1 x 9, opaque taps
])
def test_one_row_tile_loops_keep_to_registers(tmp_path, monkeypatch, model, fmas, stack):
    """The x86-64-v4 assembly of the one-row tile's reduction step (the loop holding its
    multiply-adds) touches the stack at most ``stack`` times (main's tile, a pointer per
    pixel, reloaded 8 of them per 48 multiply-adds on the 1x3, 82 per 144 on the 3x3) and, on
    the 1x3, loads each of its 10 distinct inputs once (24 broadcasts on main)."""
    import llvmlite.binding as llvm
    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    _export(tmp_path, model(), check=False)
    (target, code), = captured
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    loops = [body for body in self_loops(asm) if sum("vfmadd" in i for i in body) == fmas]
    assert loops
    best = min(sum("(%rsp)" in i for i in body) for body in loops)
    assert best <= stack
    if fmas == 48:
        assert min(sum("vbroadcastss" in i or "{1to16}" in i for i in body)
                   for body in loops) <= 10
