"""Resize with its sizes (and tf_crop_and_resize's roi) fed at run time (issue 37 item 2): the
output dims are size variables bound from the sizes' values at run start (format 1.6
``values`` rows), and ``resize_taps`` kernels build each axis's tables for the sizes of the
run. One export, several sizes, against ONNX Runtime; the C runtime bit-identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load
from test_c_runtime import CC, assert_bit_identical

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


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("resize") / "resize.mlc"
    mod, _ = import_onnx(sizes_model())
    export_module(mod, path, ExportOptions(target="host"))
    return path


def test_resize_to_run_time_sizes_matches_onnxruntime(bundle) -> None:
    model = sizes_model()
    session = ort.InferenceSession(model.SerializeToString())
    with load(bundle) as b:
        for feed in CASES:
            got = b.run(feed)
            for out, want in zip(model.graph.output, session.run(None, feed)):
                g = got[out.name]
                assert g.shape == want.shape, (out.name, g.shape, want.shape)
                np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5, err_msg=out.name)


def test_c_runtime_bit_identical(bundle, tmp_path) -> None:
    if CC is None:
        pytest.skip("no C compiler (cc or gcc) on this machine: the C runtime cannot be built")
    from test_c_runtime import CDIR, _make
    _make("all")
    for k, feed in enumerate(CASES[:2]):
        assert_bit_identical(CDIR / "build", bundle, feed, tmp_path / str(k), threads=(1,))
