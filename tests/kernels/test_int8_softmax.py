"""The 8-bit softmax (``qsoftmax``, ops/qelementwise.py; codegen/softmax.py's QSoftmaxEmitter)
and its fusion from QDQ (passes/fuse_qdq_attention.py): against the op's numpy reference on
this host's level and x86-64-v2 (a long row with a partial last vector, short rows grouped,
int8 in / uint8 out and the reverse, saturation), the vector kernel chosen on every x86 level,
and a QDQ Softmax model within one quantization step of ONNX Runtime as written."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from helpers import build_op_module, compile_and_run, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.ops.registry import OPS
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.describe import describe

X86 = platform.machine().lower() in ("x86_64", "amd64")
TARGETS = ["host"] + (["x86-64-v2"] if X86 else [])
F32 = np.float32

CASES = {   # shape, x dtype, y dtype, x scale, y scale, y zp
    "rows_of_203_uint8": ((3, 203), "uint8", "uint8", 0.07, 1 / 255, 0),
    "short_rows_int8_to_uint8": ((2, 5, 12), "int8", "uint8", 0.11, 1 / 256, 0),
    "uint8_to_int8_saturating": ((4, 37), "uint8", "int8", 0.3, 1 / 400, -128),
}


def _case(name: str):
    shape, xd, yd, xs, ys, yz = CASES[name]
    info = np.iinfo(xd)
    x = np.random.default_rng(sorted(CASES).index(name)).integers(
        info.min, info.max + 1, shape).astype(xd)
    args = [x, np.array(xs, F32), np.array(ys, F32), np.array(yz, F32)]
    return args, yd


# every case on this host's level; the long rows (a partial last vector) also on x86-64-v2
RUNS = [(c, "host") for c in CASES] + [("rows_of_203_uint8", t) for t in TARGETS[1:]]


@pytest.mark.parametrize(("case", "target"), RUNS)
def test_qsoftmax_kernel_against_reference(case: str, target: str, tmp_path: Path) -> None:
    args, yd = _case(case)
    expect = OPS["qsoftmax"].reference(*args, dtype=yd)
    mod = build_op_module("qsoftmax", args, [False, True, True, True], dtype=yd)
    got = compile_and_run(mod, {"x0": args[0]}, tmp_path, target=target)["y"]
    diff = np.abs(got.astype(np.int32) - expect.astype(np.int32))
    assert diff.max() <= 1 and diff.mean() < 0.01, (diff.max(), diff.mean())
    if case == "uint8_to_int8_saturating":
        assert (expect == 127).any()


@pytest.mark.skipif(not X86, reason="checks x86 code")
@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3"])
def test_qsoftmax_takes_the_vector_kernel(target: str) -> None:
    args, yd = _case("rows_of_203_uint8")
    mod = run_pipeline(build_op_module("qsoftmax", args, [False, True, True, True], dtype=yd),
                       DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    code = compile_prim_funcs(funcs, resolve_target(target))
    text = str(code.llvm_ir)
    # byte loads and stores of whole vectors, the masked tail, no scalar row loop
    assert re.search(r"load <(4|8) x i8>", text)
    assert re.search(r"llvm\.masked\.store\.v(4|8)i8", text)


def _qdq_softmax(path: Path) -> Path:
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             h.make_node("Softmax", ["d"], ["p"], axis=-1),
             h.make_node("QuantizeLinear", ["p", "ps", "pz"], ["pq"]),
             h.make_node("DequantizeLinear", ["pq", "ps", "pz"], ["y"])]
    inits = [nh.from_array(np.array(0.08, F32), "s"), nh.from_array(np.array(120, np.uint8), "z"),
             nh.from_array(np.array(1 / 255, F32), "ps"),
             nh.from_array(np.array(0, np.uint8), "pz")]
    graph = h.make_graph(nodes, "qdq_softmax", [h.make_tensor_value_info("x", T.FLOAT, [1, 6, 75])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 6, 75])], inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_qdq_softmax_fused_within_one_step_of_ort(tmp_path: Path) -> None:
    model = _qdq_softmax(tmp_path / "m.onnx")
    mod, _ = import_onnx(str(model))
    upto = [p.name for p in DEFAULT_PIPELINE].index("fuse_quantized_attention") + 1
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:upto], options=UNPACKED)
    ops = [getattr(b.value, "op", "") for b in fused.functions["main"].bindings()]
    assert "qsoftmax" in ops and "nn.softmax" not in ops, ops
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host", check=False))
    x = np.random.default_rng(1).normal(0, 4, (1, 6, 75)).astype(F32)
    kernels = {k["name"]: k.get("kernel") for k in describe(tmp_path / "m.mlc")["kernels"]}
    assert kernels.get("qsoftmax") == "softmax", kernels     # the vector kernel
    ours = load(tmp_path / "m.mlc").run({"x": x})["y"]
    ref = ort_outputs(model, {"x": x}, as_written=True)["y"]
    assert np.abs(ours - ref).max() <= 1 / 255 * 1.0001
    assert np.mean(ours != ref) < 0.02
