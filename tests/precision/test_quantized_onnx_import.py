"""Quantized ONNX models as exporters and ``onnxruntime.quantization`` write them (QDQ and
QOperator, per tensor and per channel, uint8/int8, symmetric/asymmetric, reduce_range; dynamic
quantization with ConvInteger/MatMulInteger/DynamicQuantizeLSTM) and a hand-built model with
every other quantized operator, each exported, run by the runtime and compared with ONNX
Runtime: bit-exact where ONNX defines the integers exactly, within one quantization step where a
requantizing kernel rounds (QDQ: two), float32 rounding for integer products scaled to float."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import quant_models as qm
from helpers import ort_int_gemm_exact, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import Call, Constant
from mlcpack.packager.passes import fold_constants
from mlcpack.packager.passes.simplify import fold_dequantize
from mlcpack.runtime import load
from mlcpack.runtime.selftest import compare_output

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _ort(path: Path, feeds: dict, as_written: bool = False) -> dict[str, np.ndarray]:
    return ort_outputs(path, feeds, threads=1, as_written=as_written)


def _bundle(path: Path, feeds: dict, target: str = "host") -> dict[str, np.ndarray]:
    mod, _ = import_onnx(str(path))
    out = path.with_name(f"{path.stem}-{target}.mlc")
    export_module(mod, out, ExportOptions(target=target, check=False))
    with load(out) as model:
        return model.run(feeds)


# (float model, quantization): the forms onnxruntime.quantization writes
CASES = {
    "conv_qdq_per_channel_u8s8": ("conv_net", dict(mode="QDQ", per_channel=True)),
    "conv_qdq_per_tensor_s8s8_symmetric": ("conv_net", dict(mode="QDQ", activation="QInt8",
                                                             symmetric=True)),
    "conv_qop_per_channel_reduce_range": ("conv_net", dict(mode="QOperator", per_channel=True,
                                                            reduce_range=True)),
    "mlp_qop_per_tensor_u8u8": ("mlp", dict(mode="QOperator", weight="QUInt8")),
    "conv_dynamic_per_channel": ("conv_net", dict(mode="dynamic", per_channel=True)),
    "lstm_dynamic": ("lstm", dict(mode="dynamic")),
}


@pytest.fixture(scope="module")
def float_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("float")
    return {"conv_net": qm.conv_net(folder / "conv_net.onnx"), "mlp": qm.mlp(folder / "mlp.onnx"),
            "lstm": qm.lstm(folder / "lstm.onnx")}


@pytest.mark.parametrize("case", list(CASES))
def test_ort_quantized_model_matches_ort(case: str, float_models: dict[str, Path],
                                         tmp_path: Path) -> None:
    base, how = CASES[case]
    path = qm.ort_quantize(float_models[base], tmp_path / f"{case}.onnx", **how)
    feeds = qm.random_feeds(path)[0]
    # full-range u8 x s8 QDQ: where ORT's fused kernel saturates, the model as written
    as_written = how["mode"] == "QDQ" and how.get("activation", "QUInt8") == "QUInt8" \
        and not ort_int_gemm_exact("uint8", "int8")
    ref, got = _ort(path, feeds, as_written)["y"], _bundle(path, feeds)["y"]
    err = np.abs(got.astype(np.float64) - ref)
    step = qm.output_step(path)
    if how["mode"] == "QOperator":        # integer kernels end to end: the same integers
        assert err.max() <= step + 1e-6, (err.max(), step)
    elif how["mode"] == "QDQ":            # ORT fuses QDQ into its own requantization
        assert err.max() <= 2 * step + 1e-6, (err.max(), step)
    else:   # int32 products scaled to float (the LSTM's X and h requantized as ORT does)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.fixture(scope="module")
def handmade_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    path = qm.handmade_model(tmp_path_factory.mktemp("handmade") / "forms.onnx")
    feeds = qm.handmade_feeds()
    return path, feeds, _ort(path, feeds)


@pytest.fixture(scope="module")
def handmade(handmade_model) -> tuple[dict, dict]:
    path, feeds, ref = handmade_model
    return ref, _bundle(path, feeds)


def _check_forms(ref: dict, got: dict, where: str) -> None:
    for name in qm.EXACT_OUTPUTS:
        np.testing.assert_array_equal(got[name].reshape(ref[name].shape), ref[name],
                                      err_msg=f"{name} on {where}")
    for name in qm.REQUANTIZED_OUTPUTS:
        diff = np.abs(got[name].astype(np.int32) - ref[name].astype(np.int32))
        assert diff.max() <= 1, (name, where, diff.max())
    for name in qm.SCALED_OUTPUTS:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-6,
                                   atol=2e-6 * np.abs(ref[name]).max(), err_msg=name)


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_forms_on_older_x86_levels(level: str, handmade_model) -> None:
    path, feeds, ref = handmade_model
    _check_forms(ref, _bundle(path, feeds, level), level)


def test_forms_on_aarch64_under_qemu(handmade_model, tmp_path: Path) -> None:
    from arm64_root import arm64_root_or_fail, run_bundles
    from mlcpack.runtime import elf

    if elf._real_arch() != "x86_64":
        pytest.skip("compares an emulated aarch64 run with ONNX Runtime on x86-64")
    path, feeds, ref = handmade_model
    mod, _ = import_onnx(str(path))
    a64 = tmp_path / "forms-a64.mlc"
    export_module(mod, a64, ExportOptions(target="aarch64+dotprod"))
    report, got = run_bundles(arm64_root_or_fail(), tmp_path, qm.ROOT, {"forms": (a64, feeds)})
    assert report["machine"] == "aarch64"
    _check_forms(ref, got["forms"], "aarch64 under qemu")


def test_exact_forms_are_bit_exact(handmade: tuple[dict, dict]) -> None:
    ref, got = handmade
    assert abs(int(ref["mi_big"][0, 0])) > 2 ** 24   # a sum float32 cannot hold
    for name in qm.EXACT_OUTPUTS:
        assert got[name].dtype == ref[name].dtype, name
        np.testing.assert_array_equal(got[name].reshape(ref[name].shape), ref[name],
                                      err_msg=name)


def test_requantized_forms_within_one_step(handmade: tuple[dict, dict]) -> None:
    ref, got = handmade
    for name in qm.REQUANTIZED_OUTPUTS:
        assert got[name].dtype == ref[name].dtype, name
        diff = np.abs(got[name].astype(np.int32) - ref[name].astype(np.int32))
        assert diff.max() <= 1, (name, diff.max())


def test_scaled_integer_products(handmade: tuple[dict, dict]) -> None:
    ref, got = handmade
    for name in qm.SCALED_OUTPUTS:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-6,
                                   atol=2e-6 * np.abs(ref[name]).max(), err_msg=name)


def test_qdq_weights_reach_the_pipeline_as_int8(float_models: dict[str, Path],
                                                tmp_path: Path) -> None:
    # The contract with the integer-kernel fusion (frontends/onnx/quant.py): a QDQ weight is
    # dequantize(int8 constant, scale, zero point) until fold_dequantize
    path = qm.ort_quantize(float_models["conv_net"], tmp_path / "qdq.onnx", mode="QDQ",
                           per_channel=True)
    mod, _ = import_onnx(str(path))

    def dequantized_constants(m) -> list[Call]:
        return [b.value for b in m.main.bindings() if isinstance(b.value, Call)
                and b.value.op == "dequantize" and isinstance(b.value.args[0], Constant)]

    folded = fold_constants(mod)
    weights = dequantized_constants(folded)
    assert weights and {w.args[0].type.dtype for w in weights} <= {"int8", "int32"}
    conv_weight = next(w for w in weights if len(w.args[0].type.shape) == 4)
    out_channels = conv_weight.args[0].type.shape[0]
    assert conv_weight.args[1].type.shape == (out_channels, 1, 1, 1)    # per-channel scale
    assert conv_weight.args[2].type.dtype == "int8"                      # zero point always there
    ops = [b.value.op for b in folded.main.bindings() if isinstance(b.value, Call)]
    assert "quantize" in ops and "nn.conv2d" in ops
    assert not dequantized_constants(fold_dequantize(folded))


def test_golden_check_rule_for_quantized_outputs() -> None:
    # one step apart on a few values passes; a zero point misread (every value shifted) fails
    rng = np.random.default_rng(0)
    step = 0.05
    ref = (rng.integers(-60, 60, 200) * step).astype(np.float32)
    flipped = ref.copy()
    flipped[::17] += step
    assert compare_output("y", flipped, ref, 1e-3, 1e-4, step=step).ok
    assert not compare_output("y", flipped, ref, 1e-3, 1e-4).ok    # not as a float model
    assert not compare_output("y", ref + 3 * step, ref, 1e-3, 1e-4, step=step).ok
    q = rng.integers(0, 255, 50).astype(np.uint8)
    assert compare_output("q", q + 1, q, 1e-3, 1e-4, step=1.0).ok
    assert not compare_output("q", q + 1, q, 1e-3, 1e-4).ok


def test_cli_export_golden_check_and_verify(float_models: dict[str, Path], tmp_path: Path,
                                            run_cli) -> None:
    path = qm.ort_quantize(float_models["conv_net"], tmp_path / "qdq.onnx", mode="QDQ",
                           per_channel=True)
    out = tmp_path / "qdq.mlc"
    proc = run_cli("export", path, "-o", out, "--target", "host", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed against onnxruntime" in proc.stdout
    assert "quantization steps" in proc.stdout
    proc = run_cli("verify", out)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr


def test_dynamic_quantize_of_zeros(tmp_path: Path) -> None:
    # an all-zero input: ONNX Runtime's scale is 1 (a zero range), not 0
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "dql",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(n, t, None)
         for n, t in (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT),
                      ("z", TensorProto.UINT8))])
    path = tmp_path / "dql.onnx"
    qm.onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    feeds = {"x": np.zeros((2, 3), np.float32)}
    ref, got = _ort(path, feeds), _bundle(path, feeds)
    for name in ("y", "s", "z"):
        np.testing.assert_array_equal(got[name].reshape(ref[name].shape), ref[name])
    assert float(got["s"]) == 1.0


def test_full_range_qdq_model_passes_the_default_export(tmp_path: Path, run_cli) -> None:
    """A QDQ MatMul whose uint8 activations and int8 weights both reach the ends of their
    ranges: ONNX Runtime's fused u8 x s8 kernel saturates on AVX2 without VNNI (many steps
    off), so the golden check runs ORT on the graph as written and the export of this correct
    model passes on every CPU."""
    from onnx import TensorProto as T, helper as h, numpy_helper
    import onnx

    rng = np.random.default_rng(3)
    w = rng.choice(np.array([-128, 127, -127, 126], np.int8), (64, 16))
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("xs", np.float32(1 / 255)), ("xz", np.uint8(0)), ("w", w),
        ("ws", np.float32(0.01)), ("wz", np.int8(0)), ("ys", np.float32(2.0)),
        ("yz", np.uint8(128))]]
    nodes = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("MatMul", ["xd", "wd"], ["m"]),
             h.make_node("QuantizeLinear", ["m", "ys", "yz"], ["mq"]),
             h.make_node("DequantizeLinear", ["mq", "ys", "yz"], ["y"])]
    graph = h.make_graph(nodes, "qdq", [h.make_tensor_value_info("x", T.FLOAT, [4, 64])],
                         [h.make_tensor_value_info("y", T.FLOAT, [4, 16])], inits)
    path = tmp_path / "qdq_full.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    x = np.full((4, 64), 1.0, np.float32)          # every activation quantizes to 255
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "qdq_full.mlc"
    proc = run_cli("export", path, "-o", out, "--check-input", f"x={tmp_path / 'x.npy'}",
                   timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "golden check passed against onnxruntime" in proc.stdout
    assert "the graph as written" in proc.stdout
    expected = np.clip(np.round((255 / 255 * w.astype(np.float64).sum(0) * 0.01) / 2.0) + 128,
                       0, 255)
    with load(out) as model:
        got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got[0], (expected - 128) * 2.0, atol=1e-5)


def test_saturating_qoperator_model_passes_the_default_export(tmp_path: Path, run_cli) -> None:
    """A QLinearMatMul with uint8 activations at 255 and int8 weights at 127 in adjacent
    pairs: ONNX Runtime's u8 x s8 kernel saturates those pair sums on AVX2 without VNNI, so the
    golden check's reference runs the weights stored as uint8 (w + 128, zero point 128: the
    same products, exact on every CPU) and the export of this correct model passes."""
    from onnx import TensorProto as T, helper as h, numpy_helper
    import onnx

    from mlcpack.frontends.onnx.exact_reference import exact_integer_copy

    w = np.full((64, 16), 127, np.int8)
    w[::4] = -128
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("xs", np.float32(1 / 255)), ("xz", np.uint8(0)), ("w", w),
        ("ws", np.float32(0.01)), ("wz", np.int8(0)), ("ys", np.float32(1.0)),
        ("yz", np.uint8(0))]]
    nodes = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             h.make_node("QLinearMatMul", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
                         ["mq"]),
             h.make_node("DequantizeLinear", ["mq", "ys", "yz"], ["y"])]
    graph = h.make_graph(nodes, "qop", [h.make_tensor_value_info("x", T.FLOAT, [4, 64])],
                         [h.make_tensor_value_info("y", T.FLOAT, [4, 16])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    path = tmp_path / "qop_sat.onnx"
    onnx.save(model, path)
    x = np.full((4, 64), 1.0, np.float32)          # every activation quantizes to 255
    exact = np.clip(np.round(255 * w.astype(np.int64).sum(0) * (1 / 255) * 0.01), 0, 255)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    copy = exact_integer_copy(model)
    (ref,) = ort.InferenceSession(copy.SerializeToString(), opts,
                                  providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(ref[0], exact)    # the copy is exact here, whatever the CPU
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "qop_sat.mlc"
    proc = run_cli("export", path, "-o", out, "--check-input", f"x={tmp_path / 'x.npy'}",
                   timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "golden check passed against onnxruntime" in proc.stdout
    assert "exact on every CPU" in proc.stdout
    with load(out) as bundle:
        np.testing.assert_array_equal(bundle.run({"x": x})["y"][0], exact)


def test_exact_integer_check_leaves_uint8_weights_alone_without_onnx(tmp_path: Path) -> None:
    """The golden check's exact copy (``exact_reference.py``) only changes int8 weights of
    u8 x s8 operators: a ConvInteger with uint8 weights (onnxruntime's dynamic quantizer, as in
    ddddocr) needs none, and finding that reads the initializers' data types only: nothing is
    copied and the ``onnx`` package (~1 CPU-s to import, ml_dtypes) is never imported."""
    import subprocess
    import sys

    from onnx import TensorProto as T, helper as h, numpy_helper

    w = np.arange(2 * 3 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3, 3)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.uint8(3), "wz"),
             numpy_helper.from_array(np.uint8(128), "xz")]
    node = h.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"])
    graph = h.make_graph([node], "ci", [h.make_tensor_value_info("x", T.UINT8, [1, 3, 5, 5])],
                         [h.make_tensor_value_info("y", T.INT32, [1, 2, 3, 3])], inits)
    path = tmp_path / "conv_integer_u8.onnx"
    path.write_bytes(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
                     .SerializeToString())
    code = ("import sys\n"
            "from mlcpack.frontends.onnx.exact_reference import has_u8s8_candidates\n"
            "from mlcpack.frontends.reference import exact_integers\n"
            f"data = open({str(path)!r}, 'rb').read()\n"
            "from mlcpack.frontends.onnx import proto\n"
            "assert has_u8s8_candidates(proto.load_model_from_string(data))\n"
            "assert exact_integers(data) is None\n"
            "assert 'onnx.helper' not in sys.modules and 'ml_dtypes' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('onnx', 'ml_dtypes')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
