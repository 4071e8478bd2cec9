"""The default pipeline leaves loop strength reduction (LSR) out of the channel-lane
convolutions (issue 35 item 3: at x86-64-v4 it was 0.6 of their object time, for no speed;
docs/performance.md "Export time at x86-64-v4: no loop strength reduction in the channel-lane
convolutions"): a module with one is made without the code generator's LSR and the pass runs
on its other functions after linking; a module without one is made exactly as before. The
code generator's process-wide LSR switch is set back afterwards, and the bundle still matches
ONNX Runtime (the golden check)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import ARTIFACTS

from mlcpack.packager import api
from mlcpack.packager.codegen.build import DEFAULT_PIPELINE, compile_in_process, lsr_skipped
from mlcpack.packager.codegen.parallel import compile_for_targets
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.options import CompileOptions

WITH_LSR = replace(DEFAULT_PIPELINE, channel_lane_lsr=True)


@pytest.fixture(scope="module")
def cnn_funcs():
    """The demo CNN's kernels (two channel-lane convolutions, a packed matmul, pools)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import compile_variants

    captured = {}

    def capture(funcs, targets, size_vars, options):
        captured["args"] = (list(funcs), tuple(size_vars), options.replace(cache_dir=None))
        return compile_for_targets(funcs, targets, size_vars, options.replace(cache_dir=None))

    import mlcpack.packager.export as export
    mod, _ = import_onnx(str(ARTIFACTS / "cnn.onnx"))
    original = export.compile_for_targets
    export.compile_for_targets = capture
    try:
        _, variants, _ = compile_variants(mod, target="x86-64-v3", options=CompileOptions())
    finally:
        export.compile_for_targets = original
    return captured["args"], variants[0]


def test_channel_lane_kernels_get_no_lsr(cnn_funcs) -> None:
    (funcs, size_vars, options), grouped = cnn_funcs
    v3 = resolve_target("x86-64-v3")
    # in this process, one after another: the LSR switch is set back after each object
    everywhere = compile_in_process(funcs, v3, size_vars, options=options, pipeline=WITH_LSR)
    default = compile_in_process(funcs, v3, size_vars, options=options)
    again = compile_in_process(funcs, v3, size_vars, options=options, pipeline=WITH_LSR)
    skipped = lsr_skipped(default.kernels)
    assert skipped == {k.symbol for k in default.kernels.values() if "conv2d_oc" in k.symbol}
    assert len(skipped) == 2
    assert default.object_code != everywhere.object_code
    assert again.object_code == everywhere.object_code
    # the grouped, parallel compile (link job: the same _finish) makes the default's object
    # too: its kernels optimized in groups, then linked; LSR after linking
    assert grouped.target.name == "x86-64-v3" and lsr_skipped(grouped.kernels) == skipped
    # a module without channel-lane kernels: the same bytes as with LSR everywhere
    rest = [f for f in funcs if default.kernels[f.name].symbol not in skipped]
    assert compile_in_process(rest, v3, size_vars, options=options).object_code == \
        compile_in_process(rest, v3, size_vars, options=options,
                           pipeline=WITH_LSR).object_code


def test_bundle_without_lsr_matches_onnxruntime(tmp_path) -> None:
    """The user's command on the demo CNN at x86-64-v3 (runs on AVX2 and AVX-512 hosts), no
    compile cache, golden check on: the bundle's outputs against ONNX Runtime's."""
    result = api.export(ARTIFACTS / "cnn.onnx", tmp_path / "cnn.mlc",
                        api.Options(target="x86-64-v3", cache=False))
    assert result.check and "passed" in result.check, result.check
