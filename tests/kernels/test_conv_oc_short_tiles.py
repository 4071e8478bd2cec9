"""Channel-lane convolutions (codegen/conv_oc.py) at x86-64-v4 with windows wider than 1x1:
a row group's pixels run as 8-pixel tiles and as many 7-pixel ones as make the count whole
(``SHORT_TILES``: 7x7 planes 7 tiles of 7, 14x14 planes in groups of 98 pixels 7 + 7 tiles),
not 8-pixel tiles and a rest of a half tile and single pixels; groups of fewer than 49 pixels
keep the half tile and single pixels. The emitted code is checked on any x86-64 host
(compile only); the runs against ONNX Runtime need a host with AVX-512."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import avx512_host, conv_feeds, conv_model, export_model

ort = pytest.importorskip("onnxruntime")

# (n, c, h, w, o, k, s, act, residual)
CASES = [
    (1, 64, 14, 14, 64, 3, 2, None, True),      # 7x7 out: 7 tiles of 7 (a residual)
    (1, 32, 28, 28, 32, 3, 2, "silu", False),   # 14x14 out: 7 tiles of 8 and 6 of 7 per group
    (1, 48, 9, 11, 48, 3, 1, None, False),      # 99 pixels: 8 + 5 tiles; a block of one vector
    (2, 16, 10, 9, 32, 3, 2, "hsig", True),     # 25 pixels: half tile, single pixel; batch 2
]


def test_short_tile_in_registers(tmp_path, monkeypatch):
    """A 7x7-output stride-2 3x3 (one band, one row group): its product loop is the 7-pixel tile's (7 x 2 zmm
    accumulators, 126 multiply-adds per input channel), no stack access; no 8-pixel tile is
    left (49 pixels are 7 tiles of 7)."""
    import llvmlite.binding as llvm
    from helpers import capture_compiles, self_loops
    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    export_model(tmp_path, conv_model(1, 16, 14, 14, 256, 3, 2))   # 8 blocks: one band
    (target, code), = captured
    assert "direct" in next(iter(code.kernels.values())).choice
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    counts = [sum("vfmadd" in i for i in body) for body in self_loops(asm)]
    assert 7 * 2 * 9 in counts and 8 * 2 * 9 not in counts, counts
    for body in self_loops(asm):
        if sum("vfmadd" in i for i in body) == 7 * 2 * 9:
            assert all("zmm" in i for i in body if "vfmadd" in i)
            assert not any("(%rsp)" in i for i in body)


@pytest.mark.parametrize("n,c,h,w,o,k,s,act,residual", CASES)
def test_short_tiles_match_onnxruntime(tmp_path, n, c, h, w, o, k, s, act, residual):
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
