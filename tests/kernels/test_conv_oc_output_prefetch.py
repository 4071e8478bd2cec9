"""Channel-lane convolutions (codegen/conv_oc.py) at x86-64-v4 whose output passes L2
(``OUT_PREFETCH_MIN_BYTES``, a 7x7 stem's): each row group's tiles prefetch the group's
output lines before its epilogue stores into them; smaller outputs do not. The emitted code is
checked on any x86-64 host (compile only); the run against ONNX Runtime needs AVX-512."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import avx512_host, conv_feeds, conv_model, export_model

ort = pytest.importorskip("onnxruntime")


def _prefetches(tmp_path, monkeypatch, model) -> int:
    import llvmlite.binding as llvm
    from helpers import capture_compiles
    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    export_model(tmp_path, model)
    (target, code), = captured
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    return asm.count("prefetcht0")


def test_large_output_prefetched(tmp_path, monkeypatch):
    """3 -> 64 7x7 stride 2 to 96x96 (2.4 MB): its tiles prefetch output lines into L1; the
    same stem to 48x48 (0.6 MB) does not."""
    assert _prefetches(tmp_path, monkeypatch, conv_model(1, 3, 192, 192, 64, 7, 2)) > 0
    monkeypatch.undo()
    assert _prefetches(tmp_path, monkeypatch, conv_model(1, 3, 96, 96, 64, 7, 2)) == 0


def test_large_output_matches_onnxruntime(tmp_path):
    from mlcpack.runtime import load

    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    n, c, h, w, o, k, s = 1, 3, 190, 194, 64, 7, 2   # 95 x 97 out: groups of whole and short tiles
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, k, s, act="silu",
                                                      residual=True))
    feeds = conv_feeds(n, c, h, w, o, k, s, residual=True)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
