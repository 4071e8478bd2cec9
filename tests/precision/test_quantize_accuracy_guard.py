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
