"""Dynamically quantized matrix products (onnxruntime's quantize_dynamic: DynamicQuantizeLinear
-> MatMulInteger -> Cast -> Mul by x_scale * w_scale -> Add bias, as in ddddocr's vocabulary
projection) take the integer ``qmatmul`` kernel with the run-time zero point and scale
(passes/fuse_qdq.py ``_plan_integer_products``), and give ONNX Runtime's numbers bit for bit
(ORT with its graph optimizations off, so it runs the operators as written; with them on,
its fused DynamicQuantizeMatMul within float32 rounding), and numpy's integer product of ORT's
own quantized x (ORT's u8 x s8 GEMM on AVX2 without VNNI saturates, so there numpy is the
reference: ``helpers.ort_int_gemm_exact``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import ort_int_gemm_exact, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

pytest.importorskip("onnxruntime")


def _model(path: Path, m: int, k: int, n: int, wdtype: str, per_column: bool, bias: bool,
           seed: int) -> Path:
    rng = np.random.default_rng(seed)
    if wdtype == "uint8":
        w = rng.integers(0, 256, (k, n)).astype(np.uint8)
        wzp = np.array(rng.integers(90, 160), np.uint8)
    else:
        w = rng.integers(-128, 128, (k, n)).astype(np.int8)
        wzp = np.array(0, np.int8)
    ws = (rng.uniform(0.5, 2, n) if per_column else np.array(rng.uniform(0.5, 2))) * 1e-3
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(wzp, "W_zp"),
             numpy_helper.from_array(ws.astype(np.float32), "W_scale")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
             helper.make_node("MatMulInteger", ["xq", "W", "xzp", "W_zp"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "W_scale"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y0" if bias else "y"])]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 1, n).astype(np.float32), "B"))
        nodes.append(helper.make_node("Add", ["y0", "B"], ["y"]))
    g = helper.make_graph(nodes, "dqmm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n]),
                           helper.make_tensor_value_info("xq", TensorProto.UINT8, [m, k]),
                           helper.make_tensor_value_info("xs", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("xzp", TensorProto.UINT8, [])],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path, w, wzp, ws.astype(np.float32), (inits[3] if bias else None)


CASES = {   # M, K, N, weight dtype, per-column scale, bias
    "ddddocr_like_u8_zp": (20, 1024, 203, "uint8", False, True),
    "odd_k_u8": (5, 33, 17, "uint8", False, True),
    "s8_per_column_no_bias": (7, 64, 40, "int8", True, False),
    "one_row_s8": (1, 300, 9, "int8", False, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dynamic_matmul_integer_matches_ort(case: str, tmp_path: Path) -> None:
    m, k, n, wdt, per_col, bias = CASES[case]
    path, w, wzp, ws, b = _model(tmp_path / f"{case}.onnx", m, k, n, wdt, per_col, bias,
                  sorted(CASES).index(case))
    mod, _ = import_onnx(str(path))
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:5], options=UNPACKED)
    ops = [b.value.op for b in fused.functions["main"].bindings()
           if hasattr(b.value, "op")]
    assert "qmatmul" in ops and "matmul" not in ops, ops
    out = tmp_path / f"{case}.mlc"
    export_module(mod, out, ExportOptions(target="host", check=False))
    rng = np.random.default_rng(7)
    for feeds in ({"x": rng.normal(0, 1, (m, k)).astype(np.float32)},
                  {"x": rng.uniform(0.2, 3, (m, k)).astype(np.float32)},   # zero point 0
                  {"x": -rng.uniform(0.2, 3, (m, k)).astype(np.float32)}):  # zero point 255
        ref = ort_outputs(path, feeds, threads=1, as_written=True)
        acc = ((ref["xq"].astype(np.int64) - int(ref["xzp"]))
               @ (w.astype(np.int64) - int(wzp))).astype(np.int32)
        want = acc.astype(np.float32) * (ref["xs"] * ws).astype(np.float32)
        if b is not None:
            want = want + numpy_helper.to_array(b)
        if ort_int_gemm_exact("uint8", wdt):
            np.testing.assert_array_equal(want, ref["y"])
        for threads in (1, 2):
            with load(out, threads=threads) as model:
                got = model.run(feeds)
            np.testing.assert_array_equal(got["xq"], ref["xq"])
            np.testing.assert_array_equal(got["y"], want, err_msg=f"{case}, {threads} threads")


def _conv_model(path: Path, c: int, o: int, h: int, w: int, stride: int, bias: bool, seed: int):
    """DynamicQuantizeLinear -> ConvInteger (uint8 W, zero point 127, pads 1) [+ the bias
    quantized at run time: Floor(B / (x_scale * w_scale)) as int32, reshaped, added to the
    int32 result, as ddddocr's quantizer wrote it] -> Cast -> Mul by x_scale * w_scale."""
    rng = np.random.default_rng(seed)
    wq = rng.integers(0, 256, (o, c, 3, 3)).astype(np.uint8)
    wzp, ws = np.array(127, np.uint8), np.array(0.01, np.float32)
    inits = [numpy_helper.from_array(wq, "W"), numpy_helper.from_array(wzp, "W_zp"),
             numpy_helper.from_array(ws, "W_scale"),
             numpy_helper.from_array(rng.normal(0, 2, o).astype(np.float32), "B"),
             numpy_helper.from_array(np.array([1, o, 1, 1], np.int64), "bshape")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
             helper.make_node("ConvInteger", ["xq", "W", "xzp", "W_zp"], ["acc"],
                              pads=[1, 1, 1, 1], strides=[stride, stride]),
             helper.make_node("Mul", ["xs", "W_scale"], ["s"])]
    last = "acc"
    if bias:
        nodes += [helper.make_node("Div", ["B", "s"], ["bd"]),
                  helper.make_node("Floor", ["bd"], ["bf"]),
                  helper.make_node("Cast", ["bf"], ["bi"], to=TensorProto.INT32),
                  helper.make_node("Reshape", ["bi", "bshape"], ["br"]),
                  helper.make_node("Add", ["acc", "br"], ["accb"])]
        last = "accb"
    nodes += [helper.make_node("Cast", [last], ["accf"], to=TensorProto.FLOAT),
              helper.make_node("Mul", ["accf", "s"], ["y0"]),
              helper.make_node("Sigmoid", ["y0"], ["y"])]
    oh = (h + 2 - 3) // stride + 1
    ow = (w + 2 - 3) // stride + 1
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, oh, ow]),
            helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1, o, oh, ow]),
            helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, c, h, w]),
            helper.make_tensor_value_info("xs", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("xzp", TensorProto.UINT8, [])]
    if bias:
        outs.append(helper.make_tensor_value_info("bi", TensorProto.INT32, [o]))
    g = helper.make_graph(nodes, "dqconv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                          outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path, wq.astype(np.int64) - 127, ws


CONVS = {   # C, O, H, W, stride, bias
    "c5_o13_bias": (5, 13, 9, 11, 1, True),
    "c24_o24_stride2_bias": (24, 24, 12, 16, 2, True),
    "c8_o6_no_bias": (8, 6, 7, 7, 1, False),
}


@pytest.mark.parametrize("case", list(CONVS))
def test_dynamic_conv_integer_is_exact(case: str, tmp_path: Path) -> None:
    c, o, h, w, stride, bias = CONVS[case]
    path, wd, ws = _conv_model(tmp_path / f"{case}.onnx", c, o, h, w, stride, bias,
                               sorted(CONVS).index(case))
    mod, _ = import_onnx(str(path))
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:5], options=UNPACKED)
    ops = [b.value.op for b in fused.functions["main"].bindings() if hasattr(b.value, "op")]
    assert "qconv2d" in ops and "nn.conv2d" not in ops, ops
    out = tmp_path / f"{case}.mlc"
    export_module(mod, out, ExportOptions(target="host", check=False))
    rng = np.random.default_rng(3)
    for feeds in ({"x": rng.normal(0, 1, (1, c, h, w)).astype(np.float32)},
                  {"x": rng.uniform(0.2, 3, (1, c, h, w)).astype(np.float32)}):
        ref = ort_outputs(path, feeds, threads=1, as_written=True)
        xp = np.pad(ref["xq"].astype(np.int64) - int(ref["xzp"]),
                    ((0, 0), (0, 0), (1, 1), (1, 1)))
        oh, ow = ref["y"].shape[2:]
        acc = np.zeros((1, o, oh, ow), np.int64)
        for ky in range(3):
            for kx in range(3):
                patch = xp[:, :, ky:ky + stride * (oh - 1) + 1:stride,
                           kx:kx + stride * (ow - 1) + 1:stride]
                acc += np.einsum("nchw,oc->nohw", patch, wd[:, :, ky, kx])
        if bias:
            acc += ref["bi"].reshape(1, o, 1, 1)
        s = (ref["xs"] * ws).astype(np.float32)
        y0 = acc.astype(np.int32).astype(np.float32) * s
        for threads in (1, 2):
            with load(out, threads=threads) as model:
                got = model.run(feeds)
            np.testing.assert_array_equal(got["xq"], ref["xq"])
            np.testing.assert_array_equal(got["y0"], y0, err_msg=f"{case}, {threads} threads")
            np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)
