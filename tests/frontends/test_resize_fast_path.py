"""Resize and Upsample on the fast path (frontends/onnx/resize.py): nearest at an integer scale
is one broadcast copy; otherwise per-axis tables computed at export, the innermost axis first
when it upsamples. Checked against ONNX Runtime over modes, coordinate transforms, rounding and
scales, by the kernels built, and cross-compiled for other targets."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
from mlcpack.packager.codegen.objinfo import undefined_symbols
from mlcpack.packager.export import compile_module
from mlcpack.packager.ir.graph import Call

ort = pytest.importorskip("onnxruntime")

from test_onnx_frontend import check_against_ort, make_model, node  # noqa: E402

RNG = np.random.default_rng(12)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def resize_model(shape, scales=None, sizes=None, opset: int = 13, **attrs):
    inits = {"roi": np.zeros(0, np.float32)}
    inputs = ["x", "roi"]
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
        inputs.append("scales")
    else:
        inits["scales"] = np.zeros(0, np.float32)
        inits["sizes"] = np.asarray(sizes, np.int64)
        inputs += ["scales", "sizes"]
    return make_model([node("Resize", inputs, ["y"], **attrs)], {"x": list(shape)}, ["y"], inits,
                      opset=opset)


CASES = {
    "nearest_2x_floor": (dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                              nearest_mode="floor"), (1, 1, 2, 2)),
    "nearest_4x_floor": (dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                              nearest_mode="floor"), (1, 1, 4, 4)),
    "nearest_3x_half_pixel": (dict(mode="nearest"), (1, 1, 3, 3)),
    "nearest_2x_half_pixel_ceil": (dict(mode="nearest", nearest_mode="round_prefer_ceil"),
                                   (1, 1, 2, 2)),
    "nearest_2x_align_corners": (dict(mode="nearest",
                                      coordinate_transformation_mode="align_corners"),
                                 (1, 1, 2, 2)),
    "nearest_2x_ceil": (dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                             nearest_mode="ceil"), (1, 1, 2, 2)),
    "nearest_h_only": (dict(mode="nearest"), (1, 1, 2, 1)),
    "nearest_w_only_3x": (dict(mode="nearest"), (1, 1, 1, 3)),
    "nearest_1_5x": (dict(mode="nearest"), (1, 1, 1.5, 1.5)),
    "nearest_down_half": (dict(mode="nearest"), (1, 1, 0.5, 0.5)),
    "nearest_mixed_2x_1_5x": (dict(mode="nearest"), (1, 1, 2, 1.5)),
    "linear_2x_half_pixel": (dict(mode="linear"), (1, 1, 2, 2)),
    "linear_2x_align_corners": (dict(mode="linear",
                                     coordinate_transformation_mode="align_corners"),
                                (1, 1, 2, 2)),
    "linear_2x_asymmetric": (dict(mode="linear", coordinate_transformation_mode="asymmetric"),
                             (1, 1, 2, 2)),
    "linear_4x_pytorch_half_pixel": (dict(mode="linear",
                                          coordinate_transformation_mode="pytorch_half_pixel"),
                                     (1, 1, 4, 4)),
    "linear_1_5x": (dict(mode="linear"), (1, 1, 1.5, 1.5)),
    "linear_down_0_6x": (dict(mode="linear"), (1, 1, 0.6, 0.6)),
    "linear_w_up_h_down": (dict(mode="linear"), (1, 1, 0.5, 2.5)),
    "cubic_2x": (dict(mode="cubic"), (1, 1, 2, 2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resize_against_onnxruntime(case: str, tmp_path) -> None:
    attrs, scales = CASES[case]
    shape = (1, 5, 7, 6)
    check_against_ort(resize_model(shape, scales, **attrs), {"x": rand(*shape)}, tmp_path)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_sizes_and_batch(mode: str, tmp_path) -> None:
    shape = (2, 3, 5, 4)
    check_against_ort(resize_model(shape, sizes=[2, 3, 10, 12], mode=mode),
                      {"x": rand(*shape)}, tmp_path)


def test_resize_5d_nearest_2x(tmp_path) -> None:
    shape = (1, 2, 3, 4, 5)
    check_against_ort(resize_model(shape, [1, 1, 2, 2, 2], mode="nearest",
                                   coordinate_transformation_mode="asymmetric",
                                   nearest_mode="floor"), {"x": rand(*shape)}, tmp_path)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_opset9(mode: str, tmp_path) -> None:
    model = make_model([node("Upsample", ["x", "scales"], ["y"], mode=mode)], {"x": [1, 3, 4, 5]},
                       ["y"], {"scales": np.asarray([1, 1, 2, 3], np.float32)}, opset=9)
    check_against_ort(model, {"x": rand(1, 3, 4, 5)}, tmp_path)


def _ops(model) -> list[str]:
    mod, _ = import_onnx(model)
    return [b.value.op for b in mod.main.bindings() if isinstance(b.value, Call)]


def test_integer_nearest_is_one_broadcast_copy() -> None:
    model = resize_model((1, 4, 8, 8), [1, 1, 2, 2], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    assert [op for op in _ops(model) if op != "reshape"] == ["broadcast_to"]


def test_upsampling_resamples_the_innermost_axis_first() -> None:
    model = resize_model((1, 4, 8, 8), [1, 1, 2, 2], mode="linear")
    mod, _ = import_onnx(model)
    axes = [b.value.attrs["axis"] for b in mod.main.bindings()
            if isinstance(b.value, Call) and b.value.op == "resize_axis"]
    assert axes == [3, 2]


def test_runs_on_v2(tmp_path) -> None:
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    model = resize_model((1, 3, 6, 5), [1, 1, 2, 1.5], mode="linear")
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "v2.mlc", ExportOptions(target="x86-64-v2"))
    x = rand(1, 3, 6, 5)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(tmp_path / "v2.mlc") as bundle:
        np.testing.assert_allclose(bundle.run({"x": x})["y"], session.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v4", "aarch64"])
def test_cross_compiles(target: str) -> None:
    for attrs, scales in [(dict(mode="nearest"), [1, 1, 2, 2]), (dict(mode="linear"),
                                                                  [1, 1, 2, 1.5])]:
        mod, _ = import_onnx(resize_model((1, 3, 6, 5), scales, **attrs))
        _, compiled, _ = compile_module(mod, target=target)
        assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS)
