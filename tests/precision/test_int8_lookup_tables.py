"""Chains of quantized elementwise operations as 8-bit lookup tables
(passes/quantize_lut.py, ops/qlinear.py ``lut8``): the ``lut8`` kernel against its numpy
reference; the pass on what ONNX Runtime's quantizer writes around a Paddle-style HardSwish
(Add, Clip, Mul, Div) and a per-channel affine (Mul, Add by [1, C, 1, 1] constants): one table
per chain, the same outputs as the untabulated bundle bit for bit, and against ORT; and what
it leaves alone (two quantized operands, a float result)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from helpers import build_op_module, compile_and_run, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ops.qlinear import lut8, pack_conv_weights, qconv2d
from mlcpack.packager.options import UNPACKED, CompileOptions
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


@pytest.mark.parametrize("xd", ["uint8", "int8"])
@pytest.mark.parametrize("axis", [1, -1])
def test_lut8_kernel(xd: str, axis: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    info = np.iinfo(xd)
    x = rng.integers(info.min, info.max + 1, (2, 5, 3, 7)).astype(xd)
    x.reshape(-1)[:2] = (info.min, info.max)
    table = rng.integers(0, 256, (5 if axis == 1 else 1, 256)).astype(np.uint8)
    mod = build_op_module("lut8", [x, table], [False, True], axis=axis)
    got = compile_and_run(mod, {"x0": x}, tmp_path)["y"]
    np.testing.assert_array_equal(got, lut8(x, table, axis))
    rows = np.arange(5).reshape(1, 5, 1, 1) if axis == 1 else 0
    np.testing.assert_array_equal(got, table[rows, x.astype(np.int64) - info.min])


@pytest.mark.parametrize("target", ["host", "x86-64-v2"])
@pytest.mark.parametrize("rows", [6, 1])
def test_qconv2d_with_a_table(rows: int, target: str, tmp_path: Path) -> None:
    """A lut8 table folded into qconv2d (its 7th input): every 8-bit result looked up in its
    channel's row (or the one row), int8 out through a uint8 table, 1 and 2 threads."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (1, 5, 9, 11)).astype(np.uint8)
    wd = rng.integers(-127, 128, (6, 5, 3, 3))
    args = [x, pack_conv_weights(wd), np.array(120, np.int32),
            rng.integers(-3000, 3000, 6).astype(np.int32),
            rng.uniform(1e-4, 1e-3, 6).astype(np.float32), np.array(-3, np.float32),
            rng.integers(0, 256, (rows, 256)).astype(np.uint8)]
    attrs = dict(out_channels=6, kernel=(3, 3), strides=(2, 1), padding=(1, 1, 1, 1),
                 dtype="int8")
    plain = qconv2d(*args[:6], **attrs)
    expect = lut8(plain, args[6], 1 if rows > 1 else -1)
    np.testing.assert_array_equal(qconv2d(*args, **attrs), expect)
    mod = build_op_module("qconv2d", args, [False] + [True] * 6, **attrs)
    for threads in (1, 2):
        got = compile_and_run(mod, {"x0": x}, tmp_path, target=target, threads=threads,
                              name=f"t{threads}.mlc")["y"]
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, expect)


def _paddle_block(path: Path, sigmoid: bool = False) -> Path:
    """Conv 3x3 -> affine (Mul, Add by [1, C, 1, 1]) -> HardSwish as Paddle writes it
    (x * Clip(x + 3, 0, 6) / 6) [or x * Sigmoid(x)] -> Conv 1x1 -> Add of two branches -> y."""
    rng = np.random.default_rng(2)
    f = lambda *s, sd=0.4: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    act = ([h.make_node("Sigmoid", ["a2"], ["s"]), h.make_node("Mul", ["a2", "s"], ["hs"])]
           if sigmoid else
           [h.make_node("Add", ["a2", "three"], ["p3"]),
            h.make_node("Clip", ["p3", "zero", "six"], ["cl"]),
            h.make_node("Mul", ["a2", "cl"], ["m6"]), h.make_node("Div", ["m6", "six"], ["hs"])])
    nodes = ([h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
              h.make_node("Mul", ["c1", "scale"], ["a1"]),
              h.make_node("Add", ["a1", "shift"], ["a2"])] + act
             + [h.make_node("Conv", ["hs", "w2", "b2"], ["c2"]),
                h.make_node("Add", ["c2", "c1"], ["y"])])
    inits = {"w1": f(6, 3, 3, 3), "b1": f(6, sd=0.1), "w2": f(6, 6, 1, 1), "b2": f(6, sd=0.1),
             "scale": rng.uniform(0.5, 1.5, (1, 6, 1, 1)).astype(np.float32),
             "shift": f(1, 6, 1, 1, sd=0.2), "three": np.array(3, np.float32),
             "zero": np.array(0, np.float32), "six": np.array(6, np.float32)}
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 10, 12])],
                    [h.make_tensor_value_info("y", T.FLOAT, [1, 6, 10, 12])], inits, path)


def _ops(path: Path, tables: bool = True) -> list[str]:
    mod, _ = import_onnx(str(path))
    passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index(
        "tabulate_quantized_chains") + 1]
    fused = run_pipeline(mod, passes, options=UNPACKED.replace(lut8=tables))
    return [getattr(b.value, "op", "") for b in fused.functions["main"].bindings()]


def _run(path: Path, feeds: dict, out: Path, tables: bool = True) -> np.ndarray:
    mod, _ = import_onnx(str(path))
    export_module(mod, out, ExportOptions(target="host", check=False,
                                          compile=CompileOptions(lut8=tables)))
    with load(out, threads=1) as m:
        return m.run(feeds)["y"]


@pytest.mark.parametrize("sigmoid", [False, True])
def test_quantized_chains_become_tables(sigmoid: bool, tmp_path: Path) -> None:
    """ORT's QDQ copy: the affine + activation between the two convolutions (8 quantize /
    dequantize pairs around 6 float operations) is one lut8; the residual Add of two quantized
    tensors is not a function of one of them and stays. Outputs: equal to the bundle without
    the pass for HardSwish (float arithmetic numpy and the kernels do alike); with a sigmoid
    (numpy's exp against the kernels' own) within one step of it; and within one output step
    of ONNX Runtime running the QDQ operators as written."""
    src = _paddle_block(tmp_path / "blk.onnx", sigmoid)
    q = qm.ort_quantize(src, tmp_path / "blk_q.onnx", "QDQ", per_channel=True)
    ops = _ops(q)
    assert ops.count("lut8") == 1, ops
    assert not {"multiply", "divide", "clip", "sigmoid"} & set(ops), ops
    assert ops.count("add") == 1 and ops.count("qconv2d") == 2, ops
    feeds = qm.random_feeds(src, seed=6)[0]
    got = _run(q, feeds, tmp_path / "lut.mlc")
    assert "lut8" not in _ops(q, tables=False)
    plain = _run(q, feeds, tmp_path / "plain.mlc", tables=False)
    step = qm.output_step(q)
    if sigmoid:
        assert np.abs(got - plain).max() <= step * 1.001
    else:
        np.testing.assert_array_equal(got, plain)
    # ORT as written (graph optimizations off): its fused u8 x s8 convolution saturates int16
    # pair sums on AVX2 without VNNI (docs/quantization.md), the QDQ operators do not
    ref = ort_outputs(q, feeds, threads=1, as_written=True)["y"]
    assert np.abs(got - ref).max() <= step * 1.001


def test_what_is_not_tabulated(tmp_path: Path) -> None:
    """QLinearAdd of two quantized tensors (QOperator) and a chain whose result stays float
    are left as they are."""
    src = _paddle_block(tmp_path / "blk.onnx")
    q = qm.ort_quantize(src, tmp_path / "blk_op.onnx", "QOperator", per_channel=True)
    ops = _ops(q)
    assert "add" in ops      # the residual QLinearAdd: dequantize, add, quantize
    assert ops.count("lut8") >= 1, ops


def test_table_after_a_convolution_goes_into_it(tmp_path: Path) -> None:
    """Conv -> HardSwish (Paddle's form) -> Conv: the table of the activation is the first
    qconv2d's 7th input (no lut8 left); the output equals the untabulated bundle's."""
    rng = np.random.default_rng(8)
    f = lambda *s, sd=0.4: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c1", "three"], ["p3"]),
             h.make_node("Clip", ["p3", "zero", "six"], ["cl"]),
             h.make_node("Mul", ["c1", "cl"], ["m6"]), h.make_node("Div", ["m6", "six"], ["hs"]),
             h.make_node("Conv", ["hs", "w2", "b2"], ["y"])]
    inits = {"w1": f(6, 3, 3, 3), "b1": f(6, sd=0.1), "w2": f(4, 6, 1, 1), "b2": f(4, sd=0.1),
             "three": np.array(3, np.float32), "zero": np.array(0, np.float32),
             "six": np.array(6, np.float32)}
    src = qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 10, 12])],
                   [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 10, 12])], inits,
                   tmp_path / "hs.onnx")
    q = qm.ort_quantize(src, tmp_path / "hs_q.onnx", "QDQ", per_channel=True)
    mod, _ = import_onnx(str(q))
    passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index(
        "tabulate_quantized_chains") + 1]
    calls = [b.value for b in run_pipeline(mod, passes, options=UNPACKED).functions["main"].bindings()
             if getattr(b.value, "op", "") in ("qconv2d", "lut8")]
    assert [(c.op, len(c.args)) for c in calls] == [("qconv2d", 7), ("qconv2d", 6)]
    feeds = qm.random_feeds(src, seed=9)[0]
    got = _run(q, feeds, tmp_path / "lut.mlc")
    np.testing.assert_array_equal(got, _run(q, feeds, tmp_path / "plain.mlc", tables=False))
