"""The depthwise kernel's stride-2 rows at AVX-512 (codegen/depthwise/static.py,
``_emit_s2_plane``): planes whose output rows fit one 16-lane vector (two rows per vector when
at most 8 wide) read from input rows of at most two vectors, each tap one permute of whole
row vectors, against ONNX Runtime where this host runs x86-64-v4, and the plan and emitted code
on any host. Odd widths and channel counts, 2x2/3x3/5x5/7x7 windows, asymmetric padding, a
plane whose last row vector runs past its end, a channel multiplier, batch 2, fused SiLU /
HardSwish / residual (a same-shape tensor read at flat offsets) epilogues, 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from helpers import assert_runs_match, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from test_depthwise_flat_planes import _emitter
from test_depthwise_padded_rows import _model, _runnable

# (name, x shape, kernel, strides, pads (t, l, b, r), multiplier, epilogue)
CASES = [
    ("r5x5_14_c13", (1, 13, 14, 14), 5, 2, (2, 2, 2, 2), 1, "silu"),        # 7x7: 2 rows
    ("r3x3_28_b2", (2, 5, 28, 28), 3, 2, (1, 1, 1, 1), 1, "residual"),      # 14x14: 1 row
    ("r5x5_13_hswish", (1, 7, 13, 13), 5, 2, (2, 2, 2, 2), 1, "hswish"),
    ("r3x3_15_odd", (1, 3, 15, 15), 3, 2, (1, 1, 1, 1), 1, "residual"),     # 8 wide
    ("r3x3_31_two_vectors", (1, 3, 9, 31), 3, 2, (1, 1, 1, 1), 1, "relu"),  # 16 wide
    ("r2x2_16_unpadded", (1, 3, 6, 16), 2, 2, (0, 0, 0, 0), 1, None),       # 8 wide, 1 row
    ("r2x2_14_unpadded", (1, 3, 5, 14), 2, 2, (0, 0, 0, 0), 1, "silu"),     # past the end
    ("r3x3_17_asym", (1, 3, 11, 17), 3, 2, (0, 1, 1, 0), 1, "silu"),        # 9 wide
    ("r7x7_22", (1, 3, 12, 22), 7, 2, (3, 3, 3, 3), 1, None),
    ("r3x3_mult2", (1, 4, 14, 14), 3, 2, (1, 1, 1, 1), 2, "residual"),
    ("r3x3_w2", (1, 3, 5, 2), 3, 2, (1, 1, 1, 1), 1, "hswish"),        # 1 wide: rows
    ("f3x3_7x1", (1, 4, 7, 1), 3, 1, (1, 1, 1, 1), 1, None),   # stride 1, 1 wide: not flat
]


def test_stride2_rows_match_onnxruntime(tmp_path):
    if not _runnable("x86-64-v4"):
        pytest.skip("this machine does not run x86-64-v4 code (the plan is checked below)")
    rng = np.random.default_rng(13)
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


def test_stride2_rows_plan_and_emitted_code():
    """Stride 2 at 16 lanes only, output rows <= 16 wide from input rows < 32 (two rows per
    vector: <= 8 wide from < 16); the 14x14 -> 7x7 5x5 kernel permutes whole 16-lane row
    vectors, each row loaded once (masked to its 14 columns), one permute index per window
    column; AVX2's 8 lanes keep the padded rows."""
    for shape, k, pad, rows in (((1, 8, 14, 14), 5, 2, 2), ((1, 8, 28, 28), 3, 1, 1),
                                ((1, 8, 15, 15), 3, 1, 2), ((1, 8, 9, 31), 3, 1, 1),
                                ((1, 8, 17, 17), 3, 1, 1), ((1, 8, 56, 56), 3, 1, 0),
                                ((1, 8, 9, 34), 3, 1, 0), ((1, 8, 40, 28), 3, 1, 0),
                                ((1, 8, 16, 16), 3, 1, 1), ((1, 8, 10, 32), 3, 1, 0)):
        e = _emitter(shape, k, 2, pad, 16)
        e._geometry()
        assert (e.s2_rows, e.vl) == (rows, 16) and not e.packed, (shape, k, pad)
    e = _emitter((1, 8, 14, 14), 5, 2, 2, 8)
    e._geometry()
    assert not e.s2_rows and e.padded
    e = _emitter((1, 13, 14, 14), 5, 2, 2, 16)
    e.emit()
    text = str(e.module)
    assert "<8 x float>" not in text and "shufflevector <16 x float>" in text
    # 14 input rows, one masked load each; 5 permute indices
    assert "load <16 x float>" not in text
    assert text.count('call <16 x float> @"llvm.masked.load.v16f32') == 14
    shuffles = [line.split("<16 x i32>")[-1] for line in text.splitlines()
                if "shufflevector <16 x float>" in line and "<16 x i32> <i32 0, i32 0" not in line]
    assert len(set(shuffles)) == 5 + 1, set(shuffles)   # and the two rows' packing
