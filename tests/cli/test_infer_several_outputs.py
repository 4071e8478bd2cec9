"""``infer`` of one image on a model with several outputs and no labels (MTCNN's R-Net and
O-Net: a face box [N, 4] first, then a face/no-face softmax [N, 2]): each output summarized,
as a folder run treats it (``many.is_classifier``), never the first output ranked as class
scores (the box was printed as a top-4 with softmax "probabilities"); a few values are printed
whole; and a channels-last (NHWC) model's maps count their argmax over the last axis (P-Net's
(1, 195, 295, 4) map was counted over its 195 rows)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from cli_in_process import run_cli_in_process
from onnx import TensorProto, helper, numpy_helper
from PIL import Image


def _model() -> onnx.ModelProto:
    """x [1, 8, 8, 3] (channels last) -> box [1, 4] (mean over the image, times W), map
    [1, 8, 8, 2] (a 1x1 "convolution" over the last axis) and score softmax(box[:, :2])."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((3, 2)).astype(np.float32), "wm"),
             numpy_helper.from_array(np.array([0], np.int64), "s0"),
             numpy_helper.from_array(np.array([2], np.int64), "s1"),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1, 2], keepdims=0),
             helper.make_node("MatMul", ["m", "w"], ["box"]),
             helper.make_node("MatMul", ["x", "wm"], ["map"]),
             helper.make_node("Slice", ["box", "s0", "s1", "ax"], ["b2"]),
             helper.make_node("Softmax", ["b2"], ["score"], axis=1)]
    graph = helper.make_graph(
        nodes, "boxes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
         for n in ("box", "map", "score")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def boxes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("boxes")
    onnx.save(_model(), folder / "boxes.onnx")
    proc = run_cli_in_process("export", folder / "boxes.onnx", "-o", folder / "boxes.mlc",
                              "--target", "host", "--no-check")
    assert proc.returncode == 0, proc.stderr
    pixels = np.random.default_rng(3).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "face.png")
    return folder


def test_several_outputs_are_each_summarized_not_the_first_ranked(boxes) -> None:
    proc = run_cli_in_process("infer", boxes / "boxes.mlc", boxes / "face.png")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("face.png: 3 output(s), not class scores (--json or -o FILE.npz for "
                        "the values)")
    assert lines[1].startswith("  box (1, 4) float32 = [") and lines[1].split("= [")[1].count(",") == 3
    assert lines[2].startswith("  map (1, 8, 8, 2) float32: min ")
    assert "; argmax over axis 3: " in lines[2]      # channels last, as the input is
    assert lines[3].startswith("  score (1, 2) float32 = [")


def test_the_json_summary_has_the_values_and_the_argmax_axis(boxes) -> None:
    from mlcpack.runtime import load
    from mlcpack.runtime.preprocess import load_input

    proc = run_cli_in_process("infer", boxes / "boxes.mlc", boxes / "face.png", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "top_k" not in doc and [s["name"] for s in doc["summary"]] == ["box", "map", "score"]
    with load(boxes / "boxes.mlc") as model:
        x = load_input(boxes / "face.png", model.inputs[0], model.preprocess)
        out = model.run({"x": x})
    box, score = doc["summary"][0], doc["summary"][2]
    np.testing.assert_allclose(box["values"], out["box"].reshape(-1), rtol=1e-6)
    np.testing.assert_allclose(score["values"], out["score"].reshape(-1), rtol=1e-6)
    shares = np.bincount(out["map"].argmax(axis=3).reshape(-1), minlength=2) / 64
    got = {a["index"]: a["share"] for a in doc["summary"][1]["argmax"]}
    assert doc["summary"][1]["argmax_axis"] == 3
    assert got == {i: float(s) for i, s in enumerate(shares) if s}
