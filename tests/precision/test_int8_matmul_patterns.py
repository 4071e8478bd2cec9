"""Integer matrix products (passes/fuse_qdq.py -> ops/qlinear.py's ``qmatmul``): quantized
MatMul / Gemm patterns become int32-accumulating kernels with a fused requantization, equal
bit for bit to ONNX Runtime (and to numpy integer math) on the integer outputs."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import quant_models as qm
from helpers import ort_int_gemm_exact, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import UNPACKED, CompileOptions
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _ort(path: Path, feeds: dict) -> list[np.ndarray]:
    return list(ort_outputs(path, feeds, threads=1).values())


def _bundle(path: Path, feeds: dict, target: str = "host", int8_kernels: bool = True
            ) -> tuple[list[np.ndarray], list[str]]:
    options = UNPACKED.replace(int8_kernels=int8_kernels)
    mod, _ = import_onnx(str(path))
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:5], options=options)
    ops = []   # the ops after fuse_quantized; "int_gemm" / "f32_gemm" for the two integer paths
    for f in fused.functions.values():
        for b in f.bindings() if hasattr(f, "bindings") else ():
            op = getattr(b.value, "op", None)
            if op == "matmul" and getattr(b.value.args[1], "name", "") == "qw_f32":
                op = "f32_gemm"       # w - w_zp as float32, every sum exact below 2**24
            ops.append({"qmatmul": "int_gemm", "qconv2d": "int_conv"}.get(op, op))
    out = path.with_suffix(".mlc")
    # the run's object cache (tests/conftest.py) with this int8 choice
    compile_options = CompileOptions.from_environ(os.environ, int8_kernels=int8_kernels)
    export_module(mod, out, ExportOptions(target=target, check=False, compile=compile_options))
    with load(out) as model:
        res = model.run(feeds)
    return list(res.values()), ops


def _numpy_qmatmul(a, az, w, wz, bias, mult, yz, dtype):
    acc = (a.astype(np.int64) - az) @ (w.astype(np.int64) - wz) + bias
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    y = np.round(acc.astype(np.float32) * mult) + np.float32(yz)
    return np.clip(y, lo, hi).astype(dtype)


# (M, K, N, x dtype, x zero point, w dtype, w zero point, y dtype, y zero point, per column)
EDGES = {
    "u8s8_zp0_odd": (3, 7, 5, "uint8", 0, "int8", 0, "uint8", 0, False),
    "u8s8_zp128_k_not_mult4": (5, 13, 9, "uint8", 128, "int8", 0, "uint8", 128, True),
    "u8u8_zp255_saturating": (4, 33, 6, "uint8", 255, "uint8", 3, "uint8", 255, False),
    "s8s8_per_column": (1, 64, 17, "int8", -3, "int8", 0, "int8", 5, True),
    # sums beyond 2**24 possible: the int32 kernel, not the float32 GEMM
    "u8u8_k600_int32_path": (3, 600, 11, "uint8", 255, "uint8", 0, "uint8", 7, False),
}


def _qlinear_matmul_model(path: Path, case, rng, gemm: bool):
    m, k, n, xd, xz, wd, wz, yd, yz, per_col = case
    wi = np.iinfo(wd)
    w = rng.integers(wi.min, wi.max + 1, (k, n)).astype(wd)
    xs = np.float32(0.02)
    ws = (rng.uniform(0.005, 0.02, n) if per_col else np.array(0.01)).astype(np.float32)
    ys = np.float32(0.05 if "satur" not in path.stem else 0.002)
    t = {"uint8": T.UINT8, "int8": T.INT8}
    inits = {"xs": xs, "xz": np.array(xz, xd), "w": w, "ws": ws, "wz": np.full(n, wz, wd) if per_col else np.array(wz, wd),
             "ys": ys, "yz": np.array(yz, yd)}
    if gemm:   # com.microsoft.QGemm: B transposed, int32 bias at scale xs*ws
        bias = rng.integers(-2000, 2000, n).astype(np.int32)
        inits.update(w=np.ascontiguousarray(w.T), B=bias)
        node = h.make_node("QGemm", ["x", "xs", "xz", "w", "ws", "wz", "B", "ys", "yz"], ["y"],
                           domain="com.microsoft", transB=1)
        opsets = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    else:
        bias = np.zeros(n, np.int32)
        node = h.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
        opsets = [h.make_opsetid("", 17)]
    graph = h.make_graph([node], "q", [h.make_tensor_value_info("x", t[xd], [m, k])],
                         [h.make_tensor_value_info("y", t[yd], [m, n])],
                         [nh.from_array(np.asarray(v), name) for name, v in inits.items()])
    onnx.save(h.make_model(graph, opset_imports=opsets, ir_version=8), path)
    xi = np.iinfo(xd)
    x = rng.integers(xi.min, xi.max + 1, (m, k)).astype(xd)
    x[0, :] = xi.max                       # extreme rows: the largest sums
    mult = ((xs * ws) / ys).astype(np.float32)
    return x, _numpy_qmatmul(x, xz, w, wz, bias, mult, yz, yd)


@pytest.mark.parametrize("gemm", [False, True], ids=["qlinearmatmul", "qgemm"])
@pytest.mark.parametrize("case", list(EDGES))
def test_integer_kernel_bit_exact(case: str, gemm: bool, tmp_path: Path) -> None:
    rng = np.random.default_rng(zlib.crc32(case.encode()) % 1000)   # not hash(): salted per process
    x, expect = _qlinear_matmul_model(tmp_path / f"{case}.onnx", EDGES[case], rng, gemm)
    (got,), ops = _bundle(tmp_path / f"{case}.onnx", {"x": x})
    # an integer graph output: the int32 kernel (the float32 GEMM writes float32 only)
    assert ops == ["int_gemm"], ops
    np.testing.assert_array_equal(got, expect)
    if ort_int_gemm_exact(EDGES[case][3], EDGES[case][5]):
        np.testing.assert_array_equal(got, _ort(tmp_path / f"{case}.onnx", {"x": x})[0])
    if "satur" in case:   # both ends of the range reached
        assert (got == 255).any() and (got == 0).any()


@pytest.mark.parametrize("how,target", [
    (dict(mode="QDQ", per_channel=True), "host"),
    (dict(mode="QDQ", per_channel=True), "x86-64-v2"),
    (dict(mode="QDQ", activation="QInt8", symmetric=True), "host"),
    (dict(mode="QOperator", per_channel=False), "host")],
    ids=["qdq_per_channel_u8s8", "qdq_per_channel_u8s8_v2", "qdq_s8s8_symmetric", "qoperator"])
def test_quantize_static_mlp_matches_ort(how: dict, target: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = qm.ort_quantize(qm.mlp(tmp_path / "mlp.onnx"), tmp_path / "mlp_q.onnx", **how)
    feeds = qm.random_feeds(path)[0]
    (got,), ops = _bundle(path, feeds, target)
    assert ops.count("int_gemm") == 2 and "matmul" not in ops, ops
    ref = _ort(path, feeds)[0]
    if ort_int_gemm_exact("int8" if how.get("activation") == "QInt8" else "uint8", "int8"):
        # the same integers as ONNX Runtime's QLinearMatMul, then the same float dequantize
        np.testing.assert_array_equal(got, ref)
        return
    # ORT's AVX2 u8 x s8 kernel saturates int16 pair sums: mlcpack's exact integers equal its
    # other exact route instead (the float32 GEMM over w - w_zp, sums below 2**24), and ORT
    # within one output step
    other = tmp_path / "mlp_q_f32.onnx"
    other.write_bytes(path.read_bytes())
    (exact,), ops = _bundle(other, feeds, target, int8_kernels=False)
    assert ops.count("f32_gemm") == 2, ops
    np.testing.assert_array_equal(got, exact)
    steps = np.abs(got.astype(np.float64) - ref) / qm.output_step(path)
    assert steps.max() <= 8 and np.median(steps) <= 1, steps


@pytest.mark.parametrize("how", [dict(mode="QDQ", per_channel=True),
                                 dict(mode="QOperator", per_channel=True)],
                         ids=["qdq_per_channel", "qlinearconv"])
def test_quantized_convolutions_fused(how: dict, tmp_path: Path) -> None:
    """conv 3x3 (+ bias), depthwise 3x3, 1x1: quantize(conv(dq, dq) + dq(bias int32)) becomes
    the integer convolution (``qconv2d``, codegen/qgemm.py) for the 3x3 and the 1x1, and the
    depthwise one (groups > 1) the integer depthwise kernel (``qdwconv2d``,
    codegen/qdepthwise.py): no float convolution is left."""
    path = qm.ort_quantize(qm.conv_net(tmp_path / "conv.onnx"), tmp_path / "conv_q.onnx", **how)
    feeds = qm.random_feeds(path)[0]
    (got,), ops = _bundle(path, feeds)
    mod, _ = import_onnx(str(path))
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:5], options=UNPACKED)
    convs = [b.value for f in fused.functions.values() if hasattr(f, "bindings")
             for b in f.bindings() if getattr(b.value, "op", "") in ("nn.conv2d", "qdwconv2d")]
    assert [c.op for c in convs] == ["qdwconv2d"], convs
    assert ops.count("int_conv") == 2, ops
    ref = _ort(path, feeds)[0]
    diff = np.abs(got.astype(np.float64) - ref) / qm.output_step(path)
    if ort_int_gemm_exact("uint8", "int8"):
        # the convolutions give ORT's integers; pools and SiLU in float differ by at most a step
        assert diff.max() <= 1 + 1e-5, diff
    else:   # ORT's AVX2 u8 x s8 kernel saturates pair sums (the kernels' exactness against
        # numpy is tested in test_int8_gemm.py)
        assert diff.max() <= 4 and np.median(diff) <= 1, diff


def test_integer_products_take_the_integer_kernels(tmp_path: Path) -> None:
    """MatMulInteger and ConvInteger (int32 results) import as products of dequantize(x, 1,
    zero point): the integer kernels take them (float32 result of exact sums, then the cast),
    equal to numpy's integer arithmetic (ORT's AVX2 u8 x s8 kernel saturates: not compared)."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (3, 40)).astype(np.uint8)
    w = rng.integers(-128, 128, (40, 7)).astype(np.int8)
    xi = rng.integers(0, 256, (1, 5, 9, 9)).astype(np.uint8)
    wc = rng.integers(-128, 128, (6, 5, 3, 3)).astype(np.int8)
    nodes = [h.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["y"]),
             h.make_node("ConvInteger", ["xi", "wc", "xz"], ["yc"], pads=[1, 1, 1, 1])]
    inits = [nh.from_array(w, "w"), nh.from_array(np.array(7, np.uint8), "xz"),
             nh.from_array(np.array(0, np.int8), "wz"), nh.from_array(wc, "wc")]
    graph = h.make_graph(nodes, "ints", [h.make_tensor_value_info("x", T.UINT8, [3, 40]),
                                         h.make_tensor_value_info("xi", T.UINT8, [1, 5, 9, 9])],
                         [h.make_tensor_value_info("y", T.INT32, [3, 7]),
                          h.make_tensor_value_info("yc", T.INT32, [1, 6, 9, 9])], inits)
    path = tmp_path / "ints.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    (y, yc), ops = _bundle(path, {"x": x, "xi": xi})
    assert "int_gemm" in ops and "int_conv" in ops, ops
    np.testing.assert_array_equal(y, (x.astype(np.int64) - 7) @ w.astype(np.int64))
    xp = np.pad(xi.astype(np.int64) - 7, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 6, 9, 9), np.int64)
    for ky in range(3):
        for kx in range(3):
            ref += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + 9, kx:kx + 9], wc[:, :, ky, kx])
    np.testing.assert_array_equal(yc, ref)
