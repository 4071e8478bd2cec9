"""The accuracy guard of ``--quantize int8`` (packager/calibrate.py ``_accuracy_guard``): when
the int8 model's outputs miss the targets against the float model on the calibration data, the
layers the outputs are most sensitive to stay float. ONNX Runtime runs the QDQ models (graph
optimizations off), so no int8 bundle is compiled here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from mlcpack.packager.calibrate import GUARD_AGREEMENT, quantize_onnx

ort = pytest.importorskip("onnxruntime")


def _near_tie_model(path: Path) -> Path:
    """x [8,16] -> MatMul 32, Relu -> MatMul 10: the second layer's columns share one large
    common part and differ by little, so its logits are nearly tied and quantizing its weights
    (a step of ~1/254 of the common part per element) flips the argmax, while quantizing the
    first layer (an error common to every class) does not."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (16, 32)).astype(np.float32)
    common = rng.uniform(0.5, 1.0, (32, 1)).astype(np.float32)
    w2 = (common + 3e-3 * rng.normal(0, 1, (32, 10))).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Relu", ["m1"], ["r1"]),
             h.make_node("MatMul", ["r1", "w2"], ["y"])]
    g = h.make_graph(nodes, "tie", [h.make_tensor_value_info("x", T.FLOAT, [8, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [8, 10])],
                     [onnx.numpy_helper.from_array(w1, "w1"),
                      onnx.numpy_helper.from_array(w2, "w2")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def _agreement(float_path: Path, qdq: onnx.ModelProto, xs: list[np.ndarray]) -> float:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    f = ort.InferenceSession(str(float_path), opts, providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(qdq.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    same = [f.run(None, {"x": x})[0].argmax(-1) == q.run(None, {"x": x})[0].argmax(-1)
            for x in xs]
    return float(np.mean(same))


@pytest.fixture(scope="module")
def tie(tmp_path_factory) -> tuple[Path, list[np.ndarray], list[np.ndarray]]:
    path = _near_tie_model(tmp_path_factory.mktemp("guard") / "tie.onnx")
    rng = np.random.default_rng(1)
    xs = [rng.normal(0, 1, (8, 16)).astype(np.float32) for _ in range(16)]
    return path, xs[:8], xs[8:]


def test_sensitive_layer_is_kept_float(tie) -> None:
    path, calib, held = tie
    off = quantize_onnx(path, calib, method="minmax", guard=False)
    on = quantize_onnx(path, calib, method="minmax")
    try:
        assert all(layer.quantized for layer in off.report.layers)   # the estimate passes both
        assert _agreement(path, off.model, calib) < GUARD_AGREEMENT
        first, second = on.report.layers
        assert first.quantized and first.sensitive is None
        assert not second.quantized and second.sensitive is not None
        text = "\n".join(on.report.summary())
        assert "accuracy guard" in text and "sweep: with 1 layer float" in text
        assert "left in float: MatMul" in text
        # the first layer's input and weights stay int8 (a few near ties still flip: at most
        # half the layers go float, here one)
        assert _agreement(path, on.model, calib) > 0.9 > _agreement(path, off.model, calib)
        assert _agreement(path, on.model, held) > 0.9 > _agreement(path, off.model, held)
    finally:
        off.close()
        on.close()


def test_accurate_model_keeps_every_layer(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    w1 = rng.normal(0, 0.3, (16, 32)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (32, 10)).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Relu", ["m1"], ["r1"]),
             h.make_node("MatMul", ["r1", "w2"], ["y"])]
    g = h.make_graph(nodes, "ok", [h.make_tensor_value_info("x", T.FLOAT, [8, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [8, 10])],
                     [onnx.numpy_helper.from_array(w1, "w1"),
                      onnx.numpy_helper.from_array(w2, "w2")])
    path = tmp_path / "ok.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    xs = [rng.normal(0, 1, (8, 16)).astype(np.float32) for _ in range(8)]
    q = quantize_onnx(path, xs, method="minmax")
    try:
        assert all(layer.quantized for layer in q.report.layers)
        assert "every layer kept int8" in q.report.guard
    finally:
        q.close()


def _outlier_model(path: Path) -> Path:
    """x [8,16] -> MatMul 32, Relu -> MatMul 10: one of the first layer's 32 outputs is ~200x
    the others, so the second layer's input range (per tensor) leaves the other 31 a few
    steps, and its output, which reads only those 31, loses its argmax; the first layer's own
    quantization error is small."""
    rng = np.random.default_rng(3)
    w1 = rng.normal(0, 0.3, (16, 32)).astype(np.float32)
    w1[:, 0] *= 200
    w2 = rng.normal(0, 0.3, (32, 10)).astype(np.float32)
    w2[0] = 0
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Relu", ["m1"], ["r1"]),
             h.make_node("MatMul", ["r1", "w2"], ["y"])]
    g = h.make_graph(nodes, "outlier", [h.make_tensor_value_info("x", T.FLOAT, [8, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [8, 10])],
                     [onnx.numpy_helper.from_array(w1, "w1"),
                      onnx.numpy_helper.from_array(w2, "w2")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def test_snr_ranking_when_the_sweep_would_not_fit(tmp_path: Path, monkeypatch) -> None:
    """With no budget share for a leave-one-out sweep, the guard ranks the layers by their own
    SNR (one run of the float model beside quantized copies) and floats the lowest first."""
    from mlcpack.packager import calibrate

    monkeypatch.setattr(calibrate, "GUARD_SWEEP_SHARE", 0.0)
    path = _outlier_model(tmp_path / "outlier.onnx")
    rng = np.random.default_rng(4)
    xs = [rng.normal(0, 1, (8, 16)).astype(np.float32) for _ in range(8)]
    off = quantize_onnx(path, xs, method="minmax", guard=False, max_layer_error=1e9)
    on = quantize_onnx(path, xs, method="minmax", max_layer_error=1e9)
    try:
        assert _agreement(path, off.model, xs) < GUARD_AGREEMENT
        first, second = on.report.layers
        assert first.quantized and first.local_snr is None
        assert not second.quantized and second.sensitive is None
        assert second.local_snr is not None and second.local_snr < 30
        text = "\n".join(on.report.summary())
        assert "per-layer SNR ranking: with 1 layer float" in text, text
        assert "its int8 output's SNR" in text
        assert _agreement(path, on.model, xs) > _agreement(path, off.model, xs)
    finally:
        off.close()
        on.close()


def test_percentile_is_exact_from_the_kept_tails() -> None:
    """The percentile method keeps each sample's tails, not a random subsample: its range is
    numpy's percentile of every value, whatever the samples' sizes."""
    from mlcpack.packager.calibrate import PERCENTILE, _Stats

    rng = np.random.default_rng(5)
    for sizes in ([1000] * 5, [40000] * 12, [7, 3000, 20000]):
        stats, values = _Stats(len(sizes)), []
        for n in sizes:
            x = rng.standard_normal(n).astype(np.float32) ** 3
            values.append(x)
            stats.add(x, "percentile", rng)
        every = np.concatenate(values)
        lo, hi = stats.range("percentile")
        assert lo == pytest.approx(min(0.0, np.percentile(every, 100 - PERCENTILE)), rel=1e-6)
        assert hi == pytest.approx(max(0.0, np.percentile(every, PERCENTILE)), rel=1e-6)


def _two_branch_model(path: Path) -> Path:
    """x [8,16] -> MatMul 32 ("big", 16 x 32 weights) + Slice x[:, :4] -> MatMul 32 ("small",
    4 x 32): both read input feature 0, which is ~0.01 of the others, through a weight row
    40x (big) and 60x (small) the rest, so each layer's per-channel int8 steps are coarse for
    the features that carry its output (the recognizer's dead input channel with large weights).
    Int8, big's error is the larger; each alone is within 18 dB of the output, both are not."""
    rng = np.random.default_rng(7)
    wa = rng.normal(0, 0.3, (16, 32)).astype(np.float32)
    wa[0] *= 40
    wb = rng.normal(0, 0.3, (4, 32)).astype(np.float32)
    wb[0] *= 60
    consts = [onnx.numpy_helper.from_array(wa, "wa"), onnx.numpy_helper.from_array(wb, "wb")] + [
        onnx.numpy_helper.from_array(np.array([v], np.int64), k)
        for k, v in (("s0", 0), ("s4", 4), ("ax", 1))]
    nodes = [h.make_node("MatMul", ["x", "wa"], ["ya"], name="big"),
             h.make_node("Slice", ["x", "s0", "s4", "ax"], ["xs"]),
             h.make_node("MatMul", ["xs", "wb"], ["yb"], name="small"),
             h.make_node("Add", ["ya", "yb"], ["y"])]
    g = h.make_graph(nodes, "two", [h.make_tensor_value_info("x", T.FLOAT, [8, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [8, 32])], consts)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def _snr(float_path: Path, qdq: onnx.ModelProto, xs: list[np.ndarray]) -> float:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    f = ort.InferenceSession(str(float_path), opts, providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(qdq.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ref = np.concatenate([f.run(None, {"x": x})[0].ravel() for x in xs]).astype(np.float64)
    got = np.concatenate([q.run(None, {"x": x})[0].ravel() for x in xs]).astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2)))


def test_sweep_floats_the_cheapest_layer_that_meets_the_targets(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """When floating any one of several layers meets the targets, the sweep floats the one
    with the fewest multiply-adds, not the one whose float version gains the most: here the
    small branch (4 x 32 weights), not the big one (16 x 32) whose error is the larger. The
    SNR target is set between the int8 model's and each one-layer-float point's."""
    from mlcpack.packager import calibrate

    monkeypatch.setattr(calibrate, "GUARD_SNR_DB", 18.0)
    monkeypatch.setattr(calibrate, "GUARD_AGREEMENT", 0.0)
    path = _two_branch_model(tmp_path / "two.onnx")
    rng = np.random.default_rng(4)
    xs = [(rng.normal(0, 1, (8, 16)) * np.r_[0.01, np.ones(15)]).astype(np.float32)
          for _ in range(8)]
    off = quantize_onnx(path, xs, method="minmax", guard=False, max_layer_error=1e9)
    on = quantize_onnx(path, xs, method="minmax")
    try:
        assert _snr(path, off.model, xs) < 18.0
        big, small = on.report.layers
        assert (big.node, small.node) == ("big", "small")
        assert big.quantized and not small.quantized
        text = "\n".join(on.report.summary())
        assert "(2 layers each meeting the targets alone float; the fewest multiply-adds " \
               "first): with 1 layer float" in text, text
        assert _snr(path, on.model, xs) >= 18.0
    finally:
        off.close()
        on.close()


def _anchor_head_model(path: Path) -> Path:
    """x [1,3,16,16] -> Conv 8 3x3, Relu -> Conv 6 1x1 -> Reshape [1, 6, 256]: a detector-like
    head (6 rows over 256 "anchors"), its last axis not a class axis: a smooth input makes the
    anchors near ties, so int8 flips the argmax along them at a high SNR."""
    rng = np.random.default_rng(8)
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (6, 8, 1, 1)).astype(np.float32)
    consts = [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2"),
              onnx.numpy_helper.from_array(np.array([1, 6, 256], np.int64), "shape")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]), h.make_node("Conv", ["r1", "w2"], ["c2"]),
             h.make_node("Reshape", ["c2", "shape"], ["y"])]
    g = h.make_graph(nodes, "head", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 6, 256])], consts)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def test_output_without_class_axis_is_judged_by_snr(tmp_path: Path) -> None:
    """A [1, C, anchors] head (no Softmax / Gemm / MatMul before it) has no class axis: the
    guard takes no argmax along its anchors (which flips at a high SNR) and keeps every layer
    int8 when the SNR is met; the report says which criterion the output got."""
    path = _anchor_head_model(tmp_path / "head.onnx")
    rng = np.random.default_rng(9)
    xs = [(1.0 + 0.01 * rng.normal(0, 1, (1, 3, 16, 16))).astype(np.float32)
          for _ in range(8)]
    q = quantize_onnx(path, xs, method="minmax")
    try:
        assert _agreement(path, q.model, xs) < GUARD_AGREEMENT   # the old criterion's miss
        assert _snr(path, q.model, xs) >= 20.0
        assert all(layer.quantized for layer in q.report.layers)
        assert "every layer kept int8" in q.report.guard
        assert "'y' SNR only (no class axis)" in "\n".join(q.report.summary())
    finally:
        q.close()


def test_softmax_classifier_keeps_the_argmax_check(tmp_path: Path) -> None:
    """The near-tie classifier with a Softmax after its logits: the softmax axis is the class
    axis, the guard still floats the layer that flips its argmax."""
    path = _near_tie_model(tmp_path / "tie.onnx")
    m = onnx.load(path)
    m.graph.node[-1].output[0] = "logits"
    m.graph.node.append(h.make_node("Softmax", ["logits"], ["y"], axis=1))
    onnx.save(m, path)
    rng = np.random.default_rng(1)
    xs = [rng.normal(0, 1, (8, 16)).astype(np.float32) for _ in range(8)]
    q = quantize_onnx(path, xs, method="minmax")
    try:
        first, second = q.report.layers
        assert first.quantized and not second.quantized
        assert "'y' SNR and argmax along axis -1 (class axis)" in "\n".join(q.report.summary())
    finally:
        q.close()


def test_class_axes_from_the_graph() -> None:
    from mlcpack.packager.calibrate import class_axes

    def model(nodes, outputs, shapes):
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 5, 7])],
                         [h.make_tensor_value_info(o, T.FLOAT, s)
                          for o, s in zip(outputs, shapes)],
                         [onnx.numpy_helper.from_array(np.ones((7, 4), np.float32), "w")])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])

    ctc = model([h.make_node("Softmax", ["x"], ["p"], axis=2),
                 h.make_node("Softmax", ["x"], ["q"], axis=1),
                 h.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
                 h.make_node("MatMul", ["x", "w"], ["m"]),
                 h.make_node("Relu", ["x"], ["r"]),
                 h.make_node("Concat", ["p", "q"], ["c"], axis=2)],
                ["p", "q", "qt", "m", "r", "c"],
                [[2, 5, 7], [2, 5, 7], [2, 7, 5], [2, 5, 4], [2, 5, 7], [2, 5, 14]])
    assert class_axes(ctc, ["p", "q", "qt", "m", "r", "c"]) == {
        "p": -1, "q": -2, "qt": None, "m": -1, "r": None, "c": None}
