"""``helpers.shared_constant``: one llvmlite Constant object per distinct type and value, so
that a vector constant's text is formatted once per process, not at every use (an export-time
cost: docs/performance.md, "Export time, round fourteen"). Values that compare equal but print
differently stay apart, and a module emitted with shared constants is the same text as one
emitted with a fresh Constant at each use."""

from __future__ import annotations

import pytest
from conv_models import conv_model
from llvmlite import ir

from mlcpack.packager.codegen.helpers import F32, I1, I32, shared_constant


def test_one_object_per_type_and_value():
    v4 = ir.VectorType(F32, 4)
    a = shared_constant(v4, [0.5] * 4)
    assert shared_constant(ir.VectorType(F32, 4), [0.5] * 4) is a
    assert str(a) == str(ir.Constant(v4, [0.5] * 4))
    # equal in Python, different in the IR text
    assert shared_constant(v4, [-0.0] * 4) is not shared_constant(v4, [0.0] * 4)
    assert str(shared_constant(v4, [-0.0] * 4)) == str(ir.Constant(v4, [-0.0] * 4))
    assert str(shared_constant(I1, True)) == str(ir.Constant(I1, True))
    assert str(shared_constant(I1, 1)) == str(ir.Constant(I1, 1))
    assert shared_constant(ir.VectorType(I32, 4), None) is not shared_constant(v4, None)


class _Stop(BaseException):
    pass


def test_module_text_unchanged(tmp_path, monkeypatch):
    import onnx

    import mlcpack.packager.codegen.contraction.emitter as emitter
    import mlcpack.packager.codegen.conv_oc as conv_oc
    import mlcpack.packager.codegen.vecmath_lanes as vecmath_lanes
    import mlcpack.packager.export as export
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen import build
    from mlcpack.packager.export import ExportOptions, export_module

    seen: dict = {}

    def grab(funcs, targets, size_vars=(), options=None):
        seen.update(funcs=funcs, targets=targets, size_vars=size_vars, options=options)
        raise _Stop

    # a 3x3 with SiLU (channel-lane or register-blocked convolution, vector epilogue) and a
    # residual: splats, masks, opaque constants, transposes
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(1, 16, 13, 14, 40, 3, 1, "silu", True), str(path))
    mod, _ = import_onnx(str(path))
    with monkeypatch.context() as m:
        m.setattr(export, "compile_for_targets", grab)
        with pytest.raises(_Stop):
            export_module(mod, tmp_path / "m.mlc",
                          ExportOptions(target="x86-64-v2,x86-64-v3,x86-64-v4", check=False))
    for target in seen["targets"]:
        shared = build.emit_module(seen["funcs"], target, seen["size_vars"], True,
                                   seen["options"]).text
        with monkeypatch.context() as m:
            for module in (emitter, conv_oc, vecmath_lanes):
                m.setattr(module, "shared_constant", ir.Constant)
            fresh = build.emit_module(seen["funcs"], target, seen["size_vars"], True,
                                      seen["options"]).text
        assert "splat" in shared or "shufflevector" in shared
        assert shared == fresh, target.name
