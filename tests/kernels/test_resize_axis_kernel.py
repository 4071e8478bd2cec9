"""The resize_axis kernel (packager/codegen/resize.py): the innermost axis by permuted row blocks
(upsampling: one vector load and a variable permute per tap; downsampling and the last O % vl
outputs element by element), other axes by weighted rows. Linear (half_pixel, align_corners,
asymmetric), cubic, 2x / 4x / 1.5x / 0.6x, rows split over threads; static extents at x86-64-v3 and
the host, run-time image sizes (tables from resize_taps) at the host, sizes below, at and past
a vector. Against ONNX Runtime; x86-64-v2 keeps the generic loop nest."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mlcpack.packager.export as export
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

RESIZES = [((2, 2), dict(mode="linear")),                        # the GAN upsampler's
           ((1.5, 1.5), dict(mode="linear")),
           ((2, 4), dict(mode="linear", coordinate_transformation_mode="align_corners")),
           ((0.6, 0.6), dict(mode="linear")),
           ((2, 3), dict(mode="cubic")),
           ((1, 2.5), dict(mode="linear", coordinate_transformation_mode="asymmetric"))]


def _model(shape):
    nodes, inits = [], []
    for i, (hw, attrs) in enumerate(RESIZES):
        inits.append(numpy_helper.from_array(np.array((1, 1) + hw, np.float32), f"s{i}"))
        nodes.append(helper.make_node("Resize", ["x", "", f"s{i}"], [f"y{i}"], **attrs))
    graph = helper.make_graph(
        nodes, "resizes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
         for i in range(len(RESIZES))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _export(model, target, tmp_path, monkeypatch):
    captured = []
    real = export.compile_for_targets

    def spy(funcs, targets, *args, **kwargs):
        out = real(funcs, targets, *args, **kwargs)
        captured.extend(out)
        return out

    monkeypatch.setattr(export, "compile_for_targets", spy)
    mod, _ = import_onnx(model)
    path = tmp_path / f"{target}.mlc"
    export_module(mod, path, ExportOptions(target=target, check=False))
    (code,) = captured
    return path, {name: k.choice for name, k in code.kernels.items()
                  if name.startswith("resize_axis")}


def _check(path, model, shapes):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            for shape in shapes:
                x = rng.standard_normal(shape).astype(np.float32)
                got = m.run({"x": x})
                for i, ref in enumerate(session.run(None, {"x": x})):
                    np.testing.assert_allclose(got[f"y{i}"], ref, rtol=1e-5, atol=1e-5,
                                               err_msg=f"y{i} {shape} {threads}")


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "host"])
def test_static_resizes_against_ort(target, tmp_path, monkeypatch) -> None:
    model = _model([2, 3, 9, 37])
    path, choices = _export(model, target, tmp_path, monkeypatch)
    if target == "x86-64-v2":
        assert set(choices.values()) == {"generic loop nest"}, choices
    else:
        assert set(choices.values()) == {"resize: permuted row blocks",
                                         "resize: weighted rows"}, choices
    _check(path, model, [(2, 3, 9, 37)])


def test_run_time_sizes_against_ort(tmp_path, monkeypatch) -> None:
    model = _model([1, 2, "H", "W"])
    path, choices = _export(model, "host", tmp_path, monkeypatch)
    if not any(c.startswith("resize:") for c in choices.values()):
        pytest.skip(f"the host has no x86 AVX2 kernel: {choices}")
    assert set(choices.values()) == {"resize: permuted row blocks",
                                     "resize: weighted rows"}, choices
    _check(path, model, [(1, 2, 1, 1), (1, 2, 3, 5), (1, 2, 8, 16), (1, 2, 17, 40)])
