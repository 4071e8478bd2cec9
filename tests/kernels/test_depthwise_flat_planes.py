"""The depthwise kernel's small planes at AVX-512 (codegen/depthwise/static.py,
``_emit_packed_plane``, which replaced the flat runs of 16-lane vectors): stride-1 planes at
most 8 wide run several rows a vector with constant tap masks, against ONNX Runtime where
this host runs x86-64-v4, and the plan and emitted code on any host. Odd channel counts,
3x3/5x5/7x7 windows, asymmetric padding, a channel multiplier, batch 2, fused SiLU / HardSwish
/ residual (a same-shape tensor read at flat offsets) epilogues, 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from helpers import assert_runs_match, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import UNPACKED
from test_depthwise_padded_rows import _model, _runnable

# (name, x shape, kernel, strides, pads (t, l, b, r), multiplier, epilogue)
CASES = [
    ("f5x5_7x7_c13", (1, 13, 7, 7), 5, 1, (2, 2, 2, 2), 1, "silu"),
    ("f3x3_7x7_b2", (2, 5, 7, 7), 3, 1, (1, 1, 1, 1), 1, "residual"),
    ("f5x5_7x7_hswish", (1, 7, 7, 7), 5, 1, (2, 2, 2, 2), 1, "hswish"),
    ("f7x7_8x8", (1, 3, 8, 8), 7, 1, (3, 3, 3, 3), 1, None),          # 64 outputs: 4 vectors
    ("f3x3_asym_5w", (1, 3, 6, 5), 3, 1, (0, 1, 1, 1), 1, "relu"),      # 5 x 5 of a 6 x 5 plane
    ("f3x3_mult2", (1, 4, 7, 7), 3, 1, (1, 1, 1, 1), 2, "residual"),
    ("f5x5_s2_not_flat", (1, 3, 14, 14), 5, 2, (2, 2, 2, 2), 1, "silu"),
]


def test_flat_planes_match_onnxruntime(tmp_path):
    if not _runnable("x86-64-v4"):
        pytest.skip("this machine does not run x86-64-v4 code (the plan is checked below)")
    rng = np.random.default_rng(11)
    path = tmp_path / "dw.onnx"
    onnx.save(_model(CASES, rng), str(path))
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / "dw.mlc"
    export_module(mod, bundle, ExportOptions(target="x86-64-v4"))
    feeds = {f"{name}_x": rng.standard_normal(shape).astype(np.float32)
             for name, shape, *_ in CASES}
    want = ort_outputs(path, feeds)
    assert_runs_match(bundle, feeds, want, rtol=1e-5, atol=1e-5, label="x86-64-v4",
                      threads=(1, 2))


def _emitter(x_shape, k, s, pad, vl, mult=1):
    from llvmlite import ir

    from mlcpack.packager.codegen.depthwise.static import DepthwiseEmitter, match_depthwise
    from mlcpack.packager.ir import BlockBuilder
    from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline

    bb = BlockBuilder()
    xv = bb.input("x", x_shape, "float32")
    w = np.ones((x_shape[1] * mult, 1, k, k), np.float32)
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit_op("nn.conv2d", xv, bb.constant(w, "w"),
                                          groups=x_shape[1], strides=(s, s),
                                          padding=(pad,) * 4))
        bb.emit_func_output(y, names=["y"])
    funcs = run_pipeline(bb.get(), DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values()
    func, match = next((f, match_depthwise(f)) for f in funcs if match_depthwise(f))
    return DepthwiseEmitter(ir.Module(), func, "k", match, vl)


def test_flat_plan_and_emitted_code():
    """Planes at most 8 wide and as wide as their input take the packed planes at 16 lanes
    (``_emit_packed_plane``, which replaced the flat runs of vectors): two 7-wide rows a
    vector, each input row pair loaded once per window column; the 7x7 5x5 kernel keeps no
    8-lane rows; AVX2's 8 lanes keep the padded rows (their bundles unchanged)."""
    e = _emitter((1, 13, 7, 7), 5, 1, 2, 16)
    e._geometry()
    assert e.packed == 2 and e.vl == 16 and not e.padded
    for shape, k, s, pad, vl in (((1, 13, 7, 7), 5, 1, 2, 8), ((1, 8, 14, 14), 5, 2, 2, 16),
                                 ((1, 8, 7, 7), 3, 1, 0, 16)):
        g = _emitter(shape, k, s, pad, vl)
        g._geometry()
        assert not g.packed, (shape, k, s, pad, vl)
    text = _emitted((1, 13, 7, 7), 5, 2)
    assert "llvm.masked.load.v16f32" in text and "<8 x float>" not in text
    # input rows -1 .. 6 (a row pair each, the pairs wholly outside skipped) x 5 columns,
    # where the flat runs loaded 4 vectors x 25 taps
    taps = [line for line in text.splitlines() if "load <16 x float>" in line
            or ("call" in line and "masked.load.v16f32" in line)]
    assert len(taps) == 40, len(taps)


def _emitted(shape, k, pad) -> str:
    e = _emitter(shape, k, 1, pad, 16)
    e.emit()
    return str(e.module)
