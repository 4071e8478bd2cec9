"""The default pipeline leaves loop strength reduction (LSR) out of the channel-lane Winograd
convolutions (issue 35 item 3: at x86-64-v4 LSR was 0.57 of their object time, for no speed;
docs/performance.md "Export time at x86-64-v4: no loop strength reduction in the channel-lane
Winograd convolutions"): a module with one is made without the code generator's LSR and the
pass runs on its other functions after linking; a module without one is made exactly as
before. The code generator's process-wide LSR switch is set back afterwards, and the bundle
still matches ONNX Runtime (the golden check)."""

from __future__ import annotations

from dataclasses import replace

import onnx
import pytest
from conftest import ARTIFACTS
from conv_models import conv_model

from mlcpack.packager import api
from mlcpack.packager.codegen.build import (DEFAULT_PIPELINE, compile_in_process,
                                            winograd_kernels)
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.options import CompileOptions

WITH_LSR = replace(DEFAULT_PIPELINE, winograd_lsr=True)
V3 = "x86-64-v3"


def _funcs(path):
    """(prim funcs, size variables, options without a compile cache) of ``path``'s export at
    x86-64-v3."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager import export

    captured = {}

    def capture(funcs, targets, size_vars, options):
        captured["args"] = (list(funcs), tuple(size_vars), options.replace(cache_dir=None))
        raise StopIteration

    mod, _ = import_onnx(str(path))
    original = export.compile_for_targets
    export.compile_for_targets = capture
    try:
        with pytest.raises(StopIteration):
            export.compile_variants(mod, target=V3, options=CompileOptions())
    finally:
        export.compile_for_targets = original
    return captured["args"]


@pytest.fixture(scope="module")
def wino_model(tmp_path_factory):
    """A 3x3 convolution of 16 -> 32 channels at 12 x 12 with SiLU: a channel-lane Winograd
    kernel at x86-64-v3."""
    path = tmp_path_factory.mktemp("wino") / "wino.onnx"
    onnx.save(conv_model(1, 16, 12, 12, 32, 3, 1, act="silu"), str(path))
    return path


def test_winograd_kernels_get_no_lsr(wino_model) -> None:
    funcs, size_vars, options = _funcs(wino_model)
    v3 = resolve_target(V3)
    # in this process, one after another: the LSR switch is set back after each object
    everywhere = compile_in_process(funcs, v3, size_vars, options=options, pipeline=WITH_LSR)
    default = compile_in_process(funcs, v3, size_vars, options=options)
    again = compile_in_process(funcs, v3, size_vars, options=options, pipeline=WITH_LSR)
    assert len(winograd_kernels(default.kernels)) == 1
    assert default.object_code != everywhere.object_code
    assert again.object_code == everywhere.object_code


def test_a_module_without_winograd_is_unchanged() -> None:
    """The demo CNN (two channel-lane direct convolutions, a matmul, pools): the same bytes
    as with LSR everywhere."""
    funcs, size_vars, options = _funcs(ARTIFACTS / "cnn.onnx")
    v3 = resolve_target(V3)
    default = compile_in_process(funcs, v3, size_vars, options=options)
    assert not winograd_kernels(default.kernels)
    assert default.object_code == compile_in_process(funcs, v3, size_vars, options=options,
                                                     pipeline=WITH_LSR).object_code


def test_bundle_without_lsr_matches_onnxruntime(wino_model, tmp_path) -> None:
    """The user's command at x86-64-v3 (runs on AVX2 and AVX-512 hosts), no compile cache,
    golden check on: the bundle's outputs against ONNX Runtime's."""
    result = api.export(wino_model, tmp_path / "wino.mlc",
                        api.Options(target=V3, cache=False))
    assert result.check and "passed" in result.check, result.check
