"""float16 / bfloat16 tensors end to end, and ONNX quantization.

float16 and bfloat16 are stored 16-bit and computed in float32; the conversions are integer IR
(round to nearest even, NaN/Inf/subnormals kept), so no ``__truncsfhf2``-like libcall is imported
on any target. The runtime carries bfloat16 as uint16 bits (or takes an ml_dtypes array).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
from mlcpack.packager.codegen.objinfo import undefined_symbols
from mlcpack.packager.export import ExportError, compile_module, export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.runtime import load
from mlcpack.runtime.errors import InputError

BF16 = ml_dtypes.bfloat16
rng = np.random.default_rng(16)


def _special_float32() -> np.ndarray:
    """float32 values at every edge of the float16/bfloat16 conversions, plus random bit patterns."""
    f16_max, f16_tiny, f16_sub = 65504.0, 2.0 ** -14, 2.0 ** -24
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1.0 / 3, f16_max, 65519.99, 65520.0,
            65536.0, 1e10, f16_tiny, f16_tiny * (1 - 2 ** -11), f16_sub, f16_sub / 2,
            f16_sub * 0.5000001, f16_sub * 1.5, f16_sub * 2.5, 1e-30, 1.5e-45, 3.4e38,
            1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 2048 + 1, 2048 + 3]
    special = np.array(vals, np.float32)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # every float16-ish magnitude, with random low bits (ties and near-ties included)
    near = (np.arange(0x10000, dtype=np.uint32) << 13 | rng.integers(0, 1 << 13, 0x10000)
            .astype(np.uint32)).view(np.float32)
    ties = (np.arange(0x8000, dtype=np.uint32) << 13 | np.uint32(0x1000)).view(np.float32)
    out = np.concatenate([special, -special, bits, near, ties, ties + np.float32(0)])
    return np.ascontiguousarray(out, np.float32)


def _cast_module(pairs):
    """``main`` taking one input per (shape, src dtype, dst dtype) and returning its cast."""
    bb = BlockBuilder()
    params = [bb.input(f"x{i}", shape, src) for i, (shape, src, _) in enumerate(pairs)]
    with bb.function("main", params):
        with bb.dataflow():
            outs = [bb.emit_output(bb.emit_op("cast", p, dtype=dst))
                    for p, (_, _, dst) in zip(params, pairs)]
        bb.emit_func_output(outs, names=[f"y{i}" for i in range(len(pairs))])
    return bb.get()


F32_VALUES = _special_float32()
ALL16 = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
CASTS = [((0x10000,), "float16", "float32"), (F32_VALUES.shape, "float32", "float16"),
         ((0x10000,), "bfloat16", "float32"), (F32_VALUES.shape, "float32", "bfloat16"),
         ((64,), "float64", "float16"), ((64,), "int32", "float16"), ((64,), "float16", "int32"),
         ((64,), "float16", "bfloat16")]
FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
CASTS += [c for f8 in FLOAT8 for c in (((256,), f8, "float32"), (F32_VALUES.shape, "float32", f8))]
SUBBYTE = ("int4", "uint4", "int2", "uint2")
CASTS += [c for t in SUBBYTE for c in (((64,), "int32", t), ((64,), "float32", t), ((16,), t, "int32"))]


@pytest.fixture(scope="module")
def cast_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("dtypes") / "casts.mlc"
    export_module(_cast_module(CASTS), path)
    with load(path) as model:
        yield model


def _same_floats(got: np.ndarray, ref: np.ndarray) -> None:
    """Bit-exact, except that any NaN matches any NaN (of the same sign)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    nan = np.isnan(ref.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    ubits = np.dtype(f"u{got.dtype.itemsize}")
    g, r = got.view(ubits), ref.view(ubits)
    bad = np.flatnonzero((g != r) & ~nan)
    assert bad.size == 0, [(ref.astype(np.float32)[i], hex(g[i]), hex(r[i])) for i in bad[:5]]
    sign = np.signbit(ref.astype(np.float32))
    np.testing.assert_array_equal(np.signbit(got.astype(np.float32))[nan], sign[nan])


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_float16_and_bfloat16_conversions_round_trip_bit_exact(cast_model) -> None:
    d64 = rng.standard_normal(64) * np.logspace(-9, 6, 64)
    i32 = rng.integers(-70000, 70000, 64).astype(np.int32)
    h = (rng.standard_normal(64) * 300).astype(np.float16)
    feeds = {"x0": ALL16.view(np.float16), "x1": F32_VALUES, "x2": ALL16,
             "x3": F32_VALUES, "x4": d64, "x5": i32, "x6": h, "x7": h}
    feeds.update({f"x{i}": np.zeros(shape, src) for i, (shape, src, _) in enumerate(CASTS)
                  if f"x{i}" not in feeds})
    got = cast_model.run(feeds)
    # every float16 / bfloat16 bit pattern widens exactly (NaN payloads included)
    _same_floats(got["y0"], ALL16.view(np.float16).astype(np.float32))
    np.testing.assert_array_equal(got["y2"].view(np.uint32),
                                  ALL16.astype(np.uint32) << 16)
    # float32 -> float16 rounds to nearest even like numpy, overflow to inf, subnormals kept
    _same_floats(got["y1"], F32_VALUES.astype(np.float16))
    # bfloat16 comes back as its uint16 bits; same rounding as ml_dtypes
    assert got["y3"].dtype == np.uint16
    _same_floats(got["y3"].view(BF16), F32_VALUES.astype(BF16))
    _same_floats(got["y4"], d64.astype(np.float32).astype(np.float16))
    _same_floats(got["y5"], i32.astype(np.float16))
    np.testing.assert_array_equal(got["y6"], h.astype(np.int32))
    _same_floats(got["y7"].view(BF16), h.astype(np.float32).astype(BF16))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_float8_and_4_bit_conversions_match_ml_dtypes(cast_model) -> None:
    # the cast itself does not saturate (ONNX saturate=0): past the largest finite value is
    # inf (e5m2) or NaN; ONNX's default saturation is a clamp the frontend puts before it
    feeds, checks = {}, []
    i32 = rng.integers(-300, 300, 64).astype(np.int32)
    f32 = (rng.standard_normal(64) * 20).astype(np.float32)
    all8 = np.arange(256, dtype=np.uint16).astype(np.uint8)
    for i, (shape, src, dst) in enumerate(CASTS):
        if src in FLOAT8:
            feeds[f"x{i}"] = all8
            checks.append((i, lambda g, t=src: _same_floats(g, all8.view(t).astype(np.float32))))
        elif dst in FLOAT8:
            feeds[f"x{i}"] = F32_VALUES
            checks.append((i, lambda g, t=dst: _same_floats(g.view(t), F32_VALUES.astype(t))))
        elif dst in SUBBYTE:
            x = i32 if src == "int32" else f32
            feeds[f"x{i}"] = x
            checks.append((i, lambda g, x=x, t=dst: np.testing.assert_array_equal(
                g.view(t), x.astype(np.int64).astype(t))))  # wraps, like ONNX's Cast
        elif src in SUBBYTE:
            info = ml_dtypes.iinfo(src)
            vals = np.resize(np.arange(int(info.min), int(info.max) + 1), 16).astype(src)
            feeds[f"x{i}"] = vals
            checks.append((i, lambda g, v=vals: np.testing.assert_array_equal(
                g, v.astype(np.int32))))
        else:
            feeds[f"x{i}"] = np.zeros(shape, src)
    got = cast_model.run(feeds)
    for i, check in checks:
        check(got[f"y{i}"])


@pytest.mark.parametrize("level", ["x86-64", "aarch64"])
def test_conversion_kernels_import_no_libcall(level: str) -> None:
    # x86-64 baseline has no F16C: LLVM's own fptrunc/fpext to half would call __truncsfhf2
    bb = BlockBuilder()
    x = bb.input("x", (4, 33), "float16")
    y = bb.input("y", (4, 33), "bfloat16")
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit_op("exp", bb.emit_op("add", x, x))
            b = bb.emit_op("cast", bb.emit_op("multiply", y, y), dtype="float16")
            out = bb.emit_output(bb.emit_op("add", a, b))
        bb.emit_func_output(out, names=["z"])
    mods = [bb.get(), _cast_module(CASTS)]
    for mod in mods:
        _, compiled, _ = compile_module(mod, target=level)
        assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS), level


def _model(nodes, inputs, outputs, initializers=(), opset=21) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _export_run(model: onnx.ModelProto, feeds: dict, tmp_path, name: str = "m.mlc") -> dict:
    mod, info = import_onnx(model)
    path = tmp_path / name
    export_module(mod, path)
    with load(path) as bundle:
        return bundle.run({info.input_names[k]: v for k, v in feeds.items()})


def test_float16_model_matches_onnxruntime(tmp_path) -> None:
    f16 = TensorProto.FLOAT16
    w = (rng.standard_normal((16, 8)) * 0.3).astype(np.float16)
    bias = rng.standard_normal(8).astype(np.float16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["r", "s"], ["p"]),
             helper.make_node("ReduceSum", ["p", "axes"], ["y"], keepdims=1),
             helper.make_node("Cast", ["a"], ["a32"], to=TensorProto.FLOAT)]
    model = _model(nodes, [helper.make_tensor_value_info("x", f16, [3, 16])],
                   [helper.make_tensor_value_info("y", f16, [3, 1]),
                    helper.make_tensor_value_info("a32", TensorProto.FLOAT, [3, 8])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b"),
                    numpy_helper.from_array(np.array([1], np.int64), "axes")])
    x = rng.standard_normal((3, 16)).astype(np.float16)
    ref_y, ref_a = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    got = _export_run(model, {"x": x}, tmp_path)
    assert got["y"].dtype == np.float16 and got["a32"].dtype == np.float32
    np.testing.assert_allclose(got["y"].astype(np.float32), ref_y.astype(np.float32),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(got["a32"], ref_a, rtol=2e-3, atol=2e-3)


def test_bfloat16_is_fed_as_uint16_bits_or_ml_dtypes(tmp_path) -> None:
    bf = TensorProto.BFLOAT16
    model = _model([helper.make_node("Mul", ["x", "x"], ["y"])],
                   [helper.make_tensor_value_info("x", bf, [5])],
                   [helper.make_tensor_value_info("y", bf, [5])])
    x = np.array([1.5, -2.0, 3.0, np.inf, 0.1], BF16)
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "bf.mlc")
    ref = (x.astype(np.float32) ** 2).astype(BF16)
    with load(tmp_path / "bf.mlc") as bundle:
        assert bundle.inputs[0].dtype == "bfloat16"
        for feed in (x, x.view(np.uint16)):
            y = bundle.run({"x": feed})["y"]
            assert y.dtype == np.uint16
            np.testing.assert_array_equal(y.view(BF16), ref)
        with pytest.raises(InputError, match="bfloat16, fed as uint16 bits"):
            bundle.run({"x": x.astype(np.float32)})


def _quant_model() -> onnx.ModelProto:
    f32, i8, u8, i16 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_axis", "zp_axis"], ["q_axis"], axis=1),
             helper.make_node("DequantizeLinear", ["q_axis", "s_axis", "zp_axis"], ["dq_axis"],
                              axis=1),
             helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
             helper.make_node("QuantizeLinear", ["x", "s_block"], ["q_block"], axis=2,
                              block_size=2, output_dtype=i16),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["dy", "dy_scale", "dy_zp"])]
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (
        ("x", f32, [2, 3, 4]), ("s_axis", f32, [3]), ("zp_axis", i8, [3]), ("s", f32, []),
        ("zp", u8, []), ("s_block", f32, [2, 3, 2]))]
    full = [2, 3, 4]
    outputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (
        ("q_axis", i8, full), ("dq_axis", f32, full), ("q", u8, full), ("q_block", i16, full),
        ("dy", u8, full), ("dy_scale", f32, []), ("dy_zp", u8, []))]
    return _model(nodes, inputs, outputs)


def test_quantize_dequantize_match_onnxruntime(tmp_path) -> None:
    model = _quant_model()
    # ties (x / scale = k + 0.5 round to even) and values that saturate both ends
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e4, -1e4, 0.0, 0.26, -0.74, 3.0],
                 np.float32)
    x = np.concatenate([x, (rng.standard_normal(12) * 40).astype(np.float32)]).reshape(2, 3, 4)
    feeds = {"x": x, "s_axis": np.array([1.0, 0.5, 2.0], np.float32),
             "zp_axis": np.array([0, -3, 100], np.int8), "s": np.array(0.25, np.float32),
             "zp": np.array(128, np.uint8),
             "s_block": ((np.abs(rng.standard_normal((2, 3, 2))) + 0.01) / 500).astype(np.float32)}
    sess = ort.InferenceSession(model.SerializeToString())
    names = [o.name for o in model.graph.output]
    ref = dict(zip(names, sess.run(None, feeds)))
    got = _export_run(model, feeds, tmp_path)
    for name in names:
        assert got[name].dtype == ref[name].dtype, name
        if ref[name].dtype == np.float32:
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


def test_quantize_refuses_a_mismatched_per_axis_scale() -> None:
    f32 = TensorProto.FLOAT
    model = _model([helper.make_node("QuantizeLinear", ["x", "s"], ["q"], axis=1)],
                   [helper.make_tensor_value_info("x", f32, [2, 3]),
                    helper.make_tensor_value_info("s", f32, [2])],
                   [helper.make_tensor_value_info("q", TensorProto.UINT8, [2, 3])])
    with pytest.raises(ExportError, match="per-axis quantization along axis 1") as exc:
        import_onnx(model)
    assert "\n" not in str(exc.value)


def test_cli_infer_takes_a_float16_npy(tmp_path, run_cli) -> None:
    f16 = TensorProto.FLOAT16
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                   [helper.make_tensor_value_info("x", f16, [1, 6])],
                   [helper.make_tensor_value_info("y", f16, [1, 6])])
    onnx.save(model, tmp_path / "sm.onnx")
    x = np.array([[0.5, 2.0, -1.0, 3.0, 0.0, 1.0]], np.float16)
    np.save(tmp_path / "x.npy", x)
    proc = run_cli("export", tmp_path / "sm.onnx", "-o", tmp_path / "sm.mlc")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("infer", tmp_path / "sm.mlc", tmp_path / "x.npy", "--json")
    assert proc.returncode == 0, proc.stderr
    out = np.array(json.loads(proc.stdout)["outputs"]["y"], np.float32)
    e = np.exp(x.astype(np.float32) - x.max())
    np.testing.assert_allclose(out, e / e.sum(), rtol=2e-3, atol=1e-3)
