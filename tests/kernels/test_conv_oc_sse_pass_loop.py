"""The SSE (x86-64-v2) variant of a portable bundle's channel-lane convolutions
(codegen/conv_oc.py ``_pass_loops``): a block's 8 four-lane channel vectors run in two passes
of a 4-vector register tile, and the passes are one loop, not two copies of the tile code. So
the v2 module holds no more multiply-add code than the AVX2 one (one pass of 4 eight-lane
vectors), where the copies doubled it (an export-time cost: docs/performance.md, "Export time,
round thirteen"). The direct kernel and the Winograd one, each run on the v2 variant against
ONNX Runtime (features pinned, so any x86-64 host runs it)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conv_models import conv_feeds, conv_model
from helpers import capture_compiles

ort = pytest.importorskip("onnxruntime")


def _fmas(text: str, lanes: int) -> int:
    return len(re.findall(rf"call <{lanes} x float> @llvm\.fmuladd\.v{lanes}f32\(", text))


@pytest.mark.parametrize("s, design", [(1, "channel-lane Winograd"), (2, "channel-lane direct")])
def test_sse_passes_are_one_loop(tmp_path, monkeypatch, x86_levels, s, design):
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    n, c, h, w, o = 1, 24, 13, 14, 72   # two whole blocks of 32 and a last one of 8 channels
    model = conv_model(n, c, h, w, o, 3, s)
    feeds = conv_feeds(n, c, h, w, o, 3, s)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    compiles = capture_compiles(monkeypatch)
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="x86-64-v2,x86-64-v3",
                                                         check=False))
    codes = {t.name: code for t, code in compiles}
    for code in codes.values():
        assert any((k.choice or "").startswith(design) for k in code.kernels.values())
    v2, v3 = _fmas(codes["x86-64-v2"].llvm_ir, 4), _fmas(codes["x86-64-v3"].llvm_ir, 8)
    assert 0 < v2 <= 1.25 * v3, (v2, v3)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", x86_levels["x86-64-v2"])
    for threads in (1, 2):
        with load(tmp_path / "m.mlc", threads=threads) as m:
            assert m.code_variant["level"] == "x86-64-v2"
            np.testing.assert_allclose(list(m.run(feeds).values())[0], want, rtol=1e-4,
                                       atol=1e-4)
