"""com.microsoft.DynamicQuantizeLSTM's recurrence in integers (issues 11, 15): when the
dequantized R is exactly int8 times a scale per row, ``fuse_quantized`` hands the recurrence
kernel int8 R (``int_r``) and the kernel multiplies the uint8-quantized h (minus its zero point)
by it with int32 accumulation, scaled by h_scale * r_scale[row], as ONNX Runtime does.
Checked against ONNX Runtime on DynamicQuantizeLSTM nodes built with onnx.helper: forward and
bidirectional, 1 and 2 threads, batch 1 and 3, odd and even H, per-direction and per-row
scales, uint8 and int8 weights (int8 ones such that no pair sum saturates: ORT's u8 x s8 kernel
on AVX2 without VNNI saturates int16 pair sums, which would make it the wrong reference)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import Call
from mlcpack.packager.ops.sequence import (pack_recurrent_int8, recurrence, requantized,
                                           unpack_recurrent_int8)
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")


def _weights(rng, shape, dtype: str, per_row: bool):
    """(quantized, scale, zero point) with the scale/zero point per direction or per column;
    a quantizer maps each column's (or direction's) largest weight to the largest integer."""
    d, _, cols = shape
    sshape = (d, cols) if per_row else (d,)
    scale = rng.uniform(0.02, 0.06, sshape).astype(np.float32)
    if dtype == "uint8":
        zp = np.full(sshape, 128, np.uint8)
        q = rng.integers(0, 256, shape).astype(np.uint8)
        q[:, rng.integers(0, shape[1]), :] = 255
    else:
        zp = np.zeros(sshape, np.int8)
        # no int16 pair sum of ORT's u8 x s8 kernel saturates: |q| <= 63 but for one row
        # of +-127 whose neighbours in k are 0
        q = rng.integers(-63, 64, shape).astype(np.int8)
        k0 = rng.integers(0, shape[1])
        q[:, max(k0 - 1, 0):k0 + 2, :] = 0
        q[:, k0, :] = rng.choice(np.array([-127, 127], np.int8), (shape[0], cols))
    return q, scale, zp


def dq_lstm(t: int, batch: int, inp: int, hid: int, direction: str, dtype: str,
            per_row: bool, seed: int) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    w, ws, wz = _weights(rng, (d, inp, 4 * hid), dtype, per_row)
    r, rs, rz = _weights(rng, (d, hid, 4 * hid), dtype, per_row)
    inits = {"W": w, "R": r, "B": rng.normal(0, .2, (d, 8 * hid)).astype(np.float32),
             "W_scale": ws, "W_zp": wz, "R_scale": rs, "R_zp": rz}
    node = h.make_node("DynamicQuantizeLSTM",
                       ["X", "W", "R", "B", "", "h0", "c0", "", "W_scale", "W_zp", "R_scale",
                        "R_zp"], ["Y", "Y_h", "Y_c"], domain="com.microsoft", hidden_size=hid,
                       direction=direction)
    vi = h.make_tensor_value_info
    graph = h.make_graph([node], "dq_lstm",
                         [vi("X", T.FLOAT, [t, batch, inp]), vi("h0", T.FLOAT, [d, batch, hid]),
                          vi("c0", T.FLOAT, [d, batch, hid])],
                         [vi("Y", T.FLOAT, [t, d, batch, hid]), vi("Y_h", T.FLOAT, [d, batch, hid]),
                          vi("Y_c", T.FLOAT, [d, batch, hid])],
                         [nh.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                               h.make_opsetid("com.microsoft", 1)], ir_version=8)
    feeds = {"X": rng.normal(0, 1, (t, batch, inp)).astype(np.float32),
             "h0": rng.normal(0, .5, (d, batch, hid)).astype(np.float32),
             "c0": rng.normal(0, .5, (d, batch, hid)).astype(np.float32)}
    return model, feeds


def recurrences(model: onnx.ModelProto) -> list[Call]:
    names = [p.name for p in DEFAULT_PIPELINE]
    fn = run_pipeline(import_onnx(model)[0], DEFAULT_PIPELINE[:names.index("legalize")], options=UNPACKED).main
    return [b.value for b in fn.bindings()
            if isinstance(b.value, Call) and b.value.op == "nn.recurrence"]


def ort_run(model: onnx.ModelProto, feeds: dict, threads: int) -> dict:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(names, feeds)))


# (T, B, I, H, direction, weight dtype, scale per row)
CASES = [
    (7, 1, 5, 16, "bidirectional", "uint8", False),
    (9, 3, 6, 21, "bidirectional", "uint8", True),
    (5, 1, 8, 40, "forward", "int8", True),
    (6, 2, 4, 33, "reverse", "int8", False),
    (12, 1, 24, 64, "bidirectional", "int8", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_recurrence_matches_onnxruntime(case, threads, tmp_path: Path) -> None:
    t, batch, inp, hid, direction, dtype, per_row = case
    model, feeds = dq_lstm(t, batch, inp, hid, direction, dtype, per_row, seed=hid + batch)
    (rec,) = recurrences(model)
    assert rec.attrs.get("int_r") and rec.args[1].data.dtype == np.int8, rec.attrs
    mod, _ = import_onnx(model)
    path = tmp_path / "m.mlc"
    export_module(mod, path, ExportOptions())
    with load(path, threads=threads) as bundle:
        got = bundle.run(feeds)
    # ONNX Runtime at 1 thread: with more, it splits a batch over threads and quantizes h per
    # chunk of rows (its result then depends on the thread count; this kernel's does not)
    ref = ort_run(model, feeds, 1)
    for name, want in ref.items():
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=2e-5, err_msg=name)


def test_reference_operator_matches_onnxruntime() -> None:
    """The operator's numpy reference with ``int_r`` (what the golden check compares the kernel
    with) against ONNX Runtime, from the integer R and scales the pass produced."""
    model, feeds = dq_lstm(6, 2, 5, 19, "bidirectional", "uint8", True, seed=3)
    (rec,) = recurrences(model)
    # the projected inputs as the kernel gets them: X through DynamicQuantizeLinear, W, biases
    nodes = {i.name: nh.to_array(i) for i in model.graph.initializer}
    d, hid = 2, 19
    w = (nodes["W"].astype(np.float32) - nodes["W_zp"].astype(np.float32)[:, None, :]) \
        * nodes["W_scale"][:, None, :]
    xq = requantized(feeds["X"])
    xw = np.concatenate([xq @ w[k] + nodes["B"][k, :4 * hid] + nodes["B"][k, 4 * hid:]
                         for k in range(d)], axis=-1).astype(np.float32)
    out = recurrence(xw, rec.args[1].data, feeds["h0"], feeds["c0"], rec.args[4].data,
                     cell="lstm", hidden=hid, reverse=(False, True), states=True,
                     quantize_h=True, int_r=True)
    ref = ort_run(model, feeds, 1)
    np.testing.assert_allclose(out[:6], ref["Y"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[6], ref["Y_c"], rtol=1e-4, atol=1e-4)


def test_int8_packing_round_trips() -> None:
    rng = np.random.default_rng(0)
    for hid in (1, 16, 21, 40):
        q = rng.integers(-128, 128, (2, 4 * hid, hid)).astype(np.int8)
        np.testing.assert_array_equal(unpack_recurrent_int8(pack_recurrent_int8(q), hid), q)


def test_float_lstm_keeps_the_float_recurrence() -> None:
    """A plain LSTM's R is no int8 grid: no ``int_r`` (and no quantize_h)."""
    rng = np.random.default_rng(1)
    hid, inp = 8, 3
    inits = {"W": rng.normal(0, .3, (1, 4 * hid, inp)).astype(np.float32),
             "R": rng.normal(0, .3, (1, 4 * hid, hid)).astype(np.float32)}
    graph = h.make_graph([h.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=hid)], "l",
                         [h.make_tensor_value_info("X", T.FLOAT, [4, 1, inp])],
                         [h.make_tensor_value_info("Y", T.FLOAT, [4, 1, 1, hid])],
                         [nh.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    (rec,) = recurrences(model)
    assert not rec.attrs.get("int_r") and rec.args[1].data.dtype == np.float32


def test_portable_pair_product_on_x86_64_v2(tmp_path: Path) -> None:
    """Without AVX2 the pair product is sext / mul / even + odd add (no x86 intrinsic)."""
    model, feeds = dq_lstm(5, 2, 6, 21, "bidirectional", "uint8", True, seed=11)
    mod, _ = import_onnx(model)
    path = tmp_path / "v2.mlc"
    export_module(mod, path, ExportOptions(target="x86-64-v2"))
    with load(path, threads=2) as bundle:
        got = bundle.run(feeds)
    for name, want in ort_run(model, feeds, 1).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=2e-5, err_msg=name)
