"""A portable bundle's x86-64-v2 fallback compiles with the lean pipeline (-O1, no loop
strength reduction: issue 35 item 3, docs/performance.md "Export time, sixth round") when a
higher x86-64 level is compiled beside it; a level exported alone, and every higher level,
keeps -O2. The lean object is keyed apart in the compile cache, and the code generator's
process-wide LSR switch is set back after it."""

from __future__ import annotations

import pytest
from conftest import ARTIFACTS

from mlcpack.packager.codegen import build
from mlcpack.packager.codegen.build import (DEFAULT_PIPELINE, LEAN_PIPELINE, lsr_skipped,
                                            target_pipelines)
from mlcpack.packager.codegen.parallel import compile_for_targets
from mlcpack.packager.codegen.target import resolve_target, resolve_targets
from mlcpack.packager.options import CompileOptions


@pytest.mark.parametrize("spec, want", [
    ("x86-64-v2", [DEFAULT_PIPELINE]),
    ("x86-64-v2,x86-64-v3", [LEAN_PIPELINE, DEFAULT_PIPELINE]),
    ("x86-64-v2,x86-64-v3,x86-64-v4", [LEAN_PIPELINE, DEFAULT_PIPELINE, DEFAULT_PIPELINE]),
    ("x86-64-v3,x86-64-v4", [DEFAULT_PIPELINE, DEFAULT_PIPELINE]),
    ("x86-64-v2,aarch64", [DEFAULT_PIPELINE, DEFAULT_PIPELINE]),
    ("aarch64,aarch64+dotprod", [DEFAULT_PIPELINE, DEFAULT_PIPELINE]),
])
def test_only_the_fallback_beside_a_higher_level_is_lean(spec, want) -> None:
    assert target_pipelines(resolve_targets(spec)) == want


@pytest.fixture(scope="module")
def cnn_funcs():
    """The demo CNN's kernels (two channel-lane convolutions, a packed matmul, pools) and its
    portable compile (x86-64-v2 + v3)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import compile_variants

    captured = {}

    def capture(funcs, targets, size_vars, options):
        captured["args"] = (list(funcs), tuple(size_vars), options)
        return compile_for_targets(funcs, targets, size_vars, options)

    import mlcpack.packager.export as export
    mod, _ = import_onnx(str(ARTIFACTS / "cnn.onnx"))
    original = export.compile_for_targets
    export.compile_for_targets = capture
    try:
        _, variants, _ = compile_variants(mod, target="x86-64-v2,x86-64-v3",
                                          options=CompileOptions())
    finally:
        export.compile_for_targets = original
    return captured["args"], variants


def test_portable_compile_gives_v2_the_lean_object(cnn_funcs) -> None:
    (funcs, size_vars, options), variants = cnn_funcs
    v2, v3 = resolve_target("x86-64-v2"), resolve_target("x86-64-v3")
    # in this process, one after another: the LSR switch the lean compile sets is set back
    default_v2 = build.compile_in_process(funcs, v2, size_vars, options=options)
    lean_v2 = build.compile_in_process(funcs, v2, size_vars, options=options,
                                       pipeline=LEAN_PIPELINE)
    again = build.compile_in_process(funcs, v2, size_vars, options=options)
    assert lean_v2.object_code != default_v2.object_code
    assert again.object_code == default_v2.object_code
    # the grouped, parallel compile of the portable pair: v2 lean, v3 as when alone
    assert [v.target.name for v in variants] == ["x86-64-v2", "x86-64-v3"]
    # LSR is left out of the channel-lane convolutions only
    skipped = lsr_skipped(variants[0].kernels)
    assert skipped == {k.symbol for k in variants[0].kernels.values()
                       if "conv2d_oc" in k.symbol} and len(skipped) == 2
    alone_v2, alone_v3 = (compile_for_targets(funcs, [t], size_vars, options)[0]
                          for t in (v2, v3))
    assert variants[0].object_code != alone_v2.object_code
    assert variants[1].object_code == alone_v3.object_code
    # keyed apart in the compile cache
    assert build.object_key(funcs, v2, size_vars, True, options, LEAN_PIPELINE) != \
        build.object_key(funcs, v2, size_vars, True, options)
    assert build.object_key(funcs, v2, size_vars, True, options) == \
        build.object_keys(funcs, [v2, v3], size_vars, True, options)[0]
