"""Channel-lane convolutions (codegen/conv_oc.py) at x86-64-v4 whose block of output channels
is one 16-lane vector (16 channels, or the last 16 of 48): the direct kernel's register tile is
16 pixels (``ONE_VECTOR_TILE_ROWS``) where the column stride is 1 and the reduction has at
least ``ONE_VECTOR_MIN_STEPS`` steps, a row group's rest half a tile and then single pixels;
8 pixels for C = 3 stems, stride 2 and two-vector blocks. The plan is checked on any host
(export only), the runs against ONNX Runtime where AVX-512 runs: odd widths (rests of 1-15
pixels, tiles across rows), 1-pixel rows, a 5x5 window (its rows a loop), batch 2, fused
epilogues with a residual."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import avx512_host, conv_feeds, conv_model, export_model

ort = pytest.importorskip("onnxruntime")

# (n, c, h, w, o, k, s, act, residual)
CASES = [
    (1, 16, 13, 17, 16, 3, 1, "silu", True),     # 221 pixels: 13 tiles, half, 5 singles
    (2, 3, 12, 15, 16, 5, 1, "hsig", True),      # 75 steps, window rows a loop, batch 2
    (1, 32, 7, 5, 48, 3, 1, "silu", False),      # a block of two vectors and one of one
    (1, 16, 20, 1, 16, 3, 1, None, False),       # 1-pixel rows: tiles span 16 rows
]


@pytest.mark.parametrize("c,s,fmas", [
    (16, 1, 16 * 9),    # 16 pixels x 9 taps per input channel
    (3, 1, 8 * 9),      # C = 3: 27 steps, 8 pixels
    (16, 2, 8 * 9),     # stride 2: 8 pixels
])
def test_one_vector_tile_in_registers(tmp_path, monkeypatch, c, s, fmas):
    """The product loop of a 16-channel 3x3 convolution: ``fmas`` zmm multiply-adds per
    input channel (no larger loop), the accumulators in registers: at 8 pixels no stack access,
    at 16 only the pixels' input pointers (16 of x86's 16 general registers) go through the
    stack (61 accesses per 144 multiply-adds; 3-9 % faster than 8 pixels all the same)."""
    import llvmlite.binding as llvm
    from helpers import capture_compiles, self_loops
    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    export_model(tmp_path, conv_model(1, c, 24, 24, 16, 3, s))
    (target, code), = captured
    assert "direct" in next(iter(code.kernels.values())).choice
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    counts = [sum("vfmadd" in i for i in body) for body in self_loops(asm)]
    assert fmas in counts and max(counts) == fmas, counts
    for body in self_loops(asm):
        if sum("vfmadd" in i for i in body) == fmas:
            assert all("zmm" in i for i in body if "vfmadd" in i)
            stack = [i for i in body if "(%rsp)" in i]
            assert not stack if fmas == 8 * 9 else len(stack) < fmas // 2, len(stack)
            assert not any("zmm" in i for i in stack)   # no vector spilled


@pytest.mark.parametrize("n,c,h,w,o,k,s,act,residual", CASES)
def test_one_vector_tile_matches_onnxruntime(tmp_path, n, c, h, w, o, k, s, act, residual):
    from mlcpack.runtime import load

    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, k, s, act=act,
                                                      residual=residual))
    feeds = conv_feeds(n, c, h, w, o, k, s, residual=residual)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            for _ in range(2):   # the task regions' second use
                got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
