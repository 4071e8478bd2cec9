"""The register-blocked convolution (codegen/contraction/conv.py) emits its fused epilogue once
per form, not once per register-tile vector: a panel that is a contiguous run of outputs runs
the epilogue over a tile row's vectors as a loop (``EPILOGUE_VECTOR_LOOP``: one whole-vector and
one masked copy, where 4 vectors a row were 8 copies), and a reduction in chunks of input
channels runs every chunk in one loop, the last one ending in the epilogue (``CHUNK_LOOP``: one
copy of the register tile's code, not two). Fewer IR instructions for LLVM (an export-time
cost: docs/performance.md, "Export time, round fourteen"); the same sums. Checked in the
emitted code of x86-64-v2, v3 and v4 against the copies' form, and run on the v2 and v3
variants against ONNX Runtime (features pinned), 1 and 2 threads."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conv_models import conv_feeds, conv_model

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("register_blocked_conv")

LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
LANES = {"x86-64-v2": 4, "x86-64-v3": 8, "x86-64-v4": 16}


class _Stop(BaseException):
    pass


def _emitted(tmp_path, monkeypatch, model, flag: str) -> dict[str, dict[bool, str]]:
    """Per level, the kernels' emitted IR text with ``conv.<flag>`` off and on."""
    import onnx

    import mlcpack.packager.codegen.contraction.conv as conv
    import mlcpack.packager.export as export
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen import build
    from mlcpack.packager.export import ExportOptions, export_module

    seen: dict = {}

    def grab(funcs, targets, size_vars=(), options=None):
        seen.update(funcs=funcs, targets=targets, size_vars=size_vars, options=options)
        raise _Stop

    path = tmp_path / "e.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    with monkeypatch.context() as m:
        m.setattr(export, "compile_for_targets", grab)
        with pytest.raises(_Stop):
            export_module(mod, tmp_path / "e.mlc", ExportOptions(target=",".join(LEVELS),
                                                                 check=False))
    texts: dict[str, dict[bool, str]] = {}
    for target in seen["targets"]:
        for on in (False, True):
            with monkeypatch.context() as m:
                m.setattr(conv, flag, on)
                emitted = build.emit_module(seen["funcs"], target, seen["size_vars"], False,
                                            seen["options"])
            assert all((k.choice or "").startswith("register-blocked conv")
                       for k in emitted.kernels.values())
            texts.setdefault(target.name, {})[on] = emitted.text
    return texts


def _runs_like_onnxruntime(tmp_path, monkeypatch, x86_levels, model, feeds) -> None:
    """Exported for the three levels, run on the v2 and v3 variants (features pinned, so
    an AVX2 host runs both), 1 and 2 threads, against ONNX Runtime."""
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target=",".join(LEVELS), check=False))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for level in ("x86-64-v2", "x86-64-v3"):
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", x86_levels[level])
        for threads in (1, 2):
            with load(tmp_path / "m.mlc", threads=threads) as m:
                assert m.code_variant["level"] == level
                for _ in range(3 if threads > 1 else 1):
                    np.testing.assert_allclose(list(m.run(feeds).values())[0], want,
                                               rtol=1e-4, atol=1e-4)


def test_contiguous_panel_epilogue_is_one_loop(tmp_path, monkeypatch, x86_levels):
    # a 1x1 with SiLU and a residual, read in place on 19 x 21 (399 outputs: a last, partial
    # panel and vector), 40 channels (a partial block row): 2 to 3 vectors a tile row
    n, c, h, w, o = 1, 24, 19, 21, 40
    model = conv_model(n, c, h, w, o, 1, 1, "silu", True)
    for level, text in _emitted(tmp_path, monkeypatch, model, "EPILOGUE_VECTOR_LOOP").items():
        lanes = LANES[level]
        copies = {on: len(re.findall(rf"fdiv (?:[a-z]+ )*<{lanes} x float>", t))
                  for on, t in text.items()}
        # SiLU's division on whole vectors: the panels' two forms (the last panel's masked
        # loads and the rest), each a whole-vector and a masked copy; a copy per vector before
        assert copies[True] == 4 and copies[False] >= 8, (level, copies)
    _runs_like_onnxruntime(tmp_path, monkeypatch, x86_levels, model,
                           conv_feeds(n, c, h, w, o, 1, 1, True))


def test_chunked_reduction_is_one_loop(tmp_path, monkeypatch, x86_levels):
    # YOLO-style downsampling: 3x3 stride 2, 32 -> 20 channels on 37 x 41, reduced in chunks
    # of input channels (``test_conv_reduction_in_channel_chunks``' first case)
    n, c, h, w, o = 1, 32, 37, 41, 20
    model = conv_model(n, c, h, w, o, 3, 2, "silu", True)
    for level, text in _emitted(tmp_path, monkeypatch, model, "CHUNK_LOOP").items():
        fmas = {on: len(re.findall(r'@"?llvm\.fmuladd\.v\d+f32"?\(', t)) for on, t in text.items()}
        # the register tile's 4 x 3 x 9 multiply-adds (x86-64-v2) once, not twice
        assert 0 < fmas[True] <= 0.7 * fmas[False], (level, fmas)
    _runs_like_onnxruntime(tmp_path, monkeypatch, x86_levels, model,
                           conv_feeds(n, c, h, w, o, 3, 2, True))
