"""com.microsoft.DynamicQuantizeLSTM with its time axis open (issue 12): the node runs as the
fused ``nn.recurrence`` kernel with ``quantize_h`` (h through DynamicQuantizeLinear and back
before every recurrent product, as ONNX Runtime does), so the default export keeps the sequence
length symbolic. Checked: quantized LSTMs exported with no options against ONNX Runtime at many
lengths, and the operator reference's requantization against ONNX's DynamicQuantizeLinear."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from mlcpack.packager.ops.sequence import requantized
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _float_lstm(path: Path, hid: int, inp: int, batch: int, direction: str, seed: int) -> None:
    """x [T, batch, inp] -> LSTM -> y [T, D, batch, hid] (no quantized op after it, whose
    requantization of y would turn a float rounding into a whole quantization step)."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    nodes = [h.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hid,
                         direction=direction)]
    inits = {"W": rng.normal(0, .3, (d, 4 * hid, inp)).astype(np.float32),
             "R": rng.normal(0, .3, (d, 4 * hid, hid)).astype(np.float32),
             "B": rng.normal(0, .1, (d, 8 * hid)).astype(np.float32)}
    graph = h.make_graph(nodes, "lstm", [h.make_tensor_value_info("x", T.FLOAT, ["T", batch, inp])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["T", d, batch, hid])],
                         [nh.from_array(v, k) for k, v in inits.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)


def _quantized(tmp_path: Path, **kw) -> Path:
    """The float LSTM through ``quantize_dynamic``, then its int8 LSTM weights shifted to uint8
    (zero point + 128, the same values): ONNX Runtime's u8 x s8 kernel on AVX2 without VNNI
    saturates int16 pair sums (see packager/golden.py), which would make it the wrong
    reference on such hosts; its u8 x u8 kernel is exact."""
    from onnxruntime.quantization import quantize_dynamic

    src, dst = tmp_path / "lstm.onnx", tmp_path / "lstm_q.onnx"
    _float_lstm(src, **kw)
    quantize_dynamic(str(src), str(dst))
    model = onnx.load(str(dst))
    assert "DynamicQuantizeLSTM" in {n.op_type for n in model.graph.node}
    for init in model.graph.initializer:
        if init.name.split("_")[0] in ("W", "R") and init.data_type == T.INT8:
            v = nh.to_array(init).astype(np.int16) + 128
            init.CopyFrom(nh.from_array(v.astype(np.uint8), init.name))
    onnx.save(model, str(dst))
    return dst


@pytest.mark.parametrize("kw", [dict(hid=16, inp=8, batch=1, direction="forward", seed=2),
                                dict(hid=21, inp=6, batch=2, direction="bidirectional", seed=5)],
                         ids=["forward-h16-b1", "bidirectional-h21-b2"])
def test_default_export_runs_every_length_like_onnxruntime(kw, tmp_path, run_cli) -> None:
    path = _quantized(tmp_path, **kw)
    bundle = tmp_path / "lstm.mlc"
    proc = run_cli("export", path, "-o", bundle, "--target", "host", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "memory planned at run time (symbolic shapes)" in proc.stdout, proc.stdout
    assert "golden check passed" in proc.stdout, proc.stdout
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    with load(bundle) as m:
        assert [str(d) for d in m.inputs[0].dims][0] == "T"
        for t in (1, 2, 3, 7, 16, 33, 64):
            x = rng.normal(0, 1, (t, kw["batch"], kw["inp"])).astype(np.float32)
            got = m.run({"x": x})["y"]
            (ref,) = session.run(None, {"x": x})
            assert got.shape == ref.shape, (t, got.shape, ref.shape)
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{t} steps")


def _dynamic_quantize_linear(x: np.ndarray) -> np.ndarray:
    """ONNX DynamicQuantizeLinear then DequantizeLinear, through ONNX Runtime."""
    graph = h.make_graph([h.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
                          h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "dq",
                         [h.make_tensor_value_info("x", T.FLOAT, list(x.shape))],
                         [h.make_tensor_value_info("y", T.FLOAT, list(x.shape))])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("case", ["mixed", "positive", "negative", "zero", "halves"])
def test_requantized_is_dynamic_quantize_linear(case) -> None:
    rng = np.random.default_rng(1)
    x = {"mixed": rng.normal(0, 1, (3, 40)), "positive": rng.uniform(0.1, 2, (3, 40)),
         "negative": -rng.uniform(0.1, 2, (3, 40)), "zero": np.zeros((3, 40)),
         # values on a rounding midpoint of the scale 1/255 * 2.55 = 0.01
         "halves": np.concatenate([[-1.275, 1.275], np.arange(-50, 50) * 0.01 + 0.005])
         }[case].astype(np.float32)
    np.testing.assert_array_equal(requantized(x), _dynamic_quantize_linear(x))

