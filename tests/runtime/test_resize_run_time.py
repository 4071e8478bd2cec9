"""Resize with its sizes, scales (and tf_crop_and_resize's roi) fed at run time (issue 37
item 2): the output dims are size variables bound at run start from the sizes' values (format
1.6 ``values`` rows) or as ``floor(scale * dim)`` from the float scales (format 1.7, the
symbolic record's ``scales`` key), and ``resize_taps`` kernels build each axis's tables for the
run. One export, several sizes and scales, against ONNX Runtime; the C runtime bit-identical;
a bad scale is a one-line input error in both; a 1.6 reader refuses the scales bundle.
Constant scales and sizes on input sizes known at run time only build their tables the same
way (a non-integer scale's output size is ``(dim * p) // q`` with ``p / q`` the float's
value). Antialias (its filter width following the run's scale) and keep_aspect_ratio_policy
(output sizes bound by kernels at run time) with sizes or scales fed at run time too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from bundle_parts import read_parts
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.errors import FormatVersionError, InputError
from test_c_runtime import CC, assert_bit_identical, mlcrun, one_line_error

ort = pytest.importorskip("onnxruntime")

F = np.float32


def sizes_model() -> onnx.ModelProto:
    """Three Resizes of one input to sizes fed at run time (linear half_pixel, cubic
    align_corners with exclude_outside, nearest asymmetric ceil over axes 3, 2) and a
    tf_crop_and_resize whose roi is fed too."""
    nodes = [
        helper.make_node("Resize", ["x", "", "", "sizes"], ["linear"], mode="linear"),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["cubic"], mode="cubic",
                         coordinate_transformation_mode="align_corners", exclude_outside=1,
                         cubic_coeff_a=-0.5),
        helper.make_node("Resize", ["x", "", "", "hw"], ["nearest"], mode="nearest",
                         axes=[3, 2], coordinate_transformation_mode="asymmetric",
                         nearest_mode="ceil"),
        helper.make_node("Resize", ["x", "roi", "", "hw"], ["crop"], mode="linear", axes=[2, 3],
                         coordinate_transformation_mode="tf_crop_and_resize",
                         extrapolation_value=9.0),
    ]
    g = helper.make_graph(nodes, "resize", [
        helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 5]),
        helper.make_tensor_value_info("sizes", T.INT64, [4]),
        helper.make_tensor_value_info("hw", T.INT64, [2]),
        helper.make_tensor_value_info("roi", T.FLOAT, [4])],
        [helper.make_tensor_value_info(n, T.FLOAT, None)
         for n in ("linear", "cubic", "nearest", "crop")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def feeds(sizes, hw, roi) -> dict:
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5)).astype(F)
    return {"x": x, "sizes": np.array(sizes, np.int64), "hw": np.array(hw, np.int64),
            "roi": np.array(roi, F)}


CASES = [feeds([1, 2, 8, 3], [3, 7], [0.1, 0.2, 0.9, 0.7]),
         feeds([1, 2, 2, 11], [1, 2], [-0.2, 0.4, 1.3, 0.6]),
         feeds([1, 2, 4, 5], [9, 1], [0.0, 0.0, 1.0, 1.0])]


def scales_model() -> onnx.ModelProto:
    """Resize by scales fed at run time: linear half_pixel over every axis, cubic
    pytorch_half_pixel over axes 2, 3."""
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["linear"], mode="linear"),
        helper.make_node("Resize", ["x", "", "hw"], ["cubic"], mode="cubic", axes=[2, 3],
                         coordinate_transformation_mode="pytorch_half_pixel")]
    g = helper.make_graph(nodes, "resize_scales", [
        helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 5]),
        helper.make_tensor_value_info("scales", T.FLOAT, [4]),
        helper.make_tensor_value_info("hw", T.FLOAT, [2])],
        [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("linear", "cubic")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def scale_feeds(scales, hw) -> dict:
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 5)).astype(F)
    return {"x": x, "scales": np.array(scales, F), "hw": np.array(hw, F)}


SCALE_CASES = [scale_feeds([1, 1, 2, 0.6], [1.5, 0.8]),
               scale_feeds([1, 1, 0.5, 3], [2.0, 1.0]),
               scale_feeds([1, 1, 1.3, 1.7], [0.75, 2.5])]
def symbolic_model() -> onnx.ModelProto:
    """Constant scales and sizes on an input whose sizes are known at run time only (a
    dynamic-resolution model's bilinear upsampling), and sizes from another input's shape."""
    scales = helper.make_tensor("s", T.FLOAT, [4], [1, 1, 1.5, 0.75])
    sizes = helper.make_tensor("z", T.INT64, [4], [1, 2, 6, 9])
    nodes = [
        helper.make_node("Resize", ["x", "", "s"], ["linear"], mode="linear"),
        helper.make_node("Resize", ["x", "", "", "z"], ["cubic"], mode="cubic"),
        helper.make_node("Shape", ["b"], ["b_shape"]),
        helper.make_node("Resize", ["x", "", "", "b_shape"], ["like_b"], mode="nearest",
                         coordinate_transformation_mode="half_pixel",
                         nearest_mode="round_prefer_ceil")]
    g = helper.make_graph(nodes, "resize_symbolic", [
        helper.make_tensor_value_info("x", T.FLOAT, [1, 2, "h", "w"]),
        helper.make_tensor_value_info("b", T.FLOAT, [1, 2, "H", "W"])],
        [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("linear", "cubic", "like_b")],
        initializer=[scales, sizes])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def symbolic_feeds(h, w, hb, wb) -> dict:
    rng = np.random.default_rng(h * 100 + w)
    return {"x": rng.standard_normal((1, 2, h, w)).astype(F),
            "b": np.zeros((1, 2, hb, wb), F)}


SYMBOLIC_CASES = [symbolic_feeds(4, 5, 7, 3), symbolic_feeds(7, 10, 2, 11),
                  symbolic_feeds(1, 3, 1, 1)]
def policy_model() -> onnx.ModelProto:
    """Antialiased downsampling (linear to sizes, cubic by scales over axes 2, 3, their filter
    width following the run's scale) and keep_aspect_ratio_policy not_larger / not_smaller
    with sizes fed at run time (the output sizes bound by kernels at run time)."""
    nodes = [
        helper.make_node("Resize", ["x", "", "", "sizes"], ["linear"], mode="linear",
                         antialias=1),
        helper.make_node("Resize", ["x", "", "hw_scales"], ["cubic"], mode="cubic", axes=[2, 3],
                         antialias=1, exclude_outside=1),
        helper.make_node("Resize", ["x", "", "", "hw"], ["larger"], mode="nearest", axes=[2, 3],
                         keep_aspect_ratio_policy="not_larger"),
        helper.make_node("Resize", ["x", "", "", "hw"], ["smaller"], mode="linear", axes=[2, 3],
                         keep_aspect_ratio_policy="not_smaller")]
    g = helper.make_graph(nodes, "resize_policy", [
        helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 5]),
        helper.make_tensor_value_info("sizes", T.INT64, [4]),
        helper.make_tensor_value_info("hw_scales", T.FLOAT, [2]),
        helper.make_tensor_value_info("hw", T.INT64, [2])],
        [helper.make_tensor_value_info(n, T.FLOAT, None)
         for n in ("linear", "cubic", "larger", "smaller")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def policy_feeds(sizes, hw_scales, hw) -> dict:
    x = np.random.default_rng(2).standard_normal((1, 2, 4, 5)).astype(F)
    return {"x": x, "sizes": np.array(sizes, np.int64), "hw_scales": np.array(hw_scales, F),
            "hw": np.array(hw, np.int64)}


POLICY_CASES = [policy_feeds([1, 2, 3, 2], [0.5, 0.6], [7, 3]),
                policy_feeds([1, 2, 1, 4], [0.3, 1.5], [2, 9]),
                policy_feeds([1, 2, 4, 5], [1.0, 0.2], [4, 5])]
MODELS = {"sizes": (sizes_model, CASES), "scales": (scales_model, SCALE_CASES),
          "symbolic": (symbolic_model, SYMBOLIC_CASES), "policy": (policy_model, POLICY_CASES)}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("resize")
    out = {}
    for name, (make, _) in MODELS.items():
        mod, _ = import_onnx(make())
        export_module(mod, folder / f"{name}.mlc", ExportOptions(target="host"))
        out[name] = folder / f"{name}.mlc"
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_resize_at_run_time_matches_onnxruntime(bundles, name) -> None:
    make, cases = MODELS[name]
    model = make()
    session = ort.InferenceSession(model.SerializeToString())
    with load(bundles[name]) as b:
        for feed in cases:
            got = b.run(feed)
            for out, want in zip(model.graph.output, session.run(None, feed)):
                g = got[out.name]
                assert g.shape == want.shape, (out.name, g.shape, want.shape)
                np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5, err_msg=out.name)


def test_scales_bundle_is_format_1_7(bundles, monkeypatch) -> None:
    header, _ = read_parts(bundles["scales"])
    assert header["format"] == [1, 7] and header["min_reader"] == [1, 7]
    assert "values" not in header["symbolic"]
    rows = header["symbolic"]["scales"]
    assert [r[0] for r in rows] == ["scales", "hw"] and rows[0][3] == [1, 2, 4, 5]
    assert read_parts(bundles["sizes"])[0]["format"] == [1, 6]
    monkeypatch.setattr(bundle_format, "SCALES_MINOR", 6)   # a 1.6 reader
    with pytest.raises(FormatVersionError, match="needs a runtime that reads"):
        load(bundles["scales"])


def test_bad_scale_is_a_one_line_input_error(bundles) -> None:
    with load(bundles["scales"]) as b:
        with pytest.raises(InputError) as err:
            b.run(scale_feeds([1, 1, 0.2, 1], [1, 1]))
    assert "\n" not in str(err.value) and "scale 0.2" in str(err.value), str(err.value)


@pytest.fixture(scope="module")
def cbuild() -> Path:
    if CC is None:
        pytest.skip("no C compiler (cc or gcc) on this machine: the C runtime cannot be built")
    from test_c_runtime import CDIR, _make
    _make("all")
    return CDIR / "build"


@pytest.mark.parametrize("name", list(MODELS))
def test_c_runtime_bit_identical(cbuild, bundles, tmp_path, name) -> None:
    for k, feed in enumerate(MODELS[name][1][:2]):
        assert_bit_identical(cbuild, bundles[name], feed, tmp_path / str(k), threads=(1,))


def test_c_runtime_refuses_a_bad_scale(cbuild, bundles, tmp_path) -> None:
    feed = scale_feeds([1, 1, 0.2, 1], [1, 1])
    paths = []
    for k, v in enumerate(feed.values()):
        paths.append(tmp_path / f"in{k}.npy")
        np.save(paths[-1], v)
    proc = mlcrun(cbuild, "run", bundles["scales"], *paths, "-o", tmp_path / "out")
    assert proc.returncode == 7, proc.stderr
    message = one_line_error(proc)
    assert "scale 0.2" in message, message
