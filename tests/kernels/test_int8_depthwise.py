"""Quantized depthwise convolutions: the ``qdwconv2d`` kernel (codegen/qdepthwise.py) against
exact numpy integer math, bit for bit (3x3 / 5x5 / 1x3 windows, strides 1, 2 and mixed,
asymmetric padding, rows narrower than a vector, uint8 / int8 in and out, int32 biases near
2**31 that wrap as ONNX Runtime's accumulator does, float32 results with ReLU) on this host's
level and on x86-64-v2, one and two threads; its code on every level (selected, with the
integer pair product ``vpmaddwd``); the VNNI level's quad kernel (``vpdpbusd`` in its
assembly, its arithmetic run with the instruction emulated); and the depthwise layers of ONNX
Runtime's quantized models (QDQ and QOperator, per tensor and per channel, reduce_range)
taking it (with int8 weights), against ORT."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from helpers import build_op_module, compile_and_run, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features

X86 = platform.machine().lower() in ("x86_64", "amd64")
TARGETS = ["host"] + (["x86-64-v2"] if X86 else [])
MASK = [False, True, True, True, True, True]


def _case(rng, b, c, h_, w, kernel, strides, pads, xd, xz, yd, bias_kind="float"):
    """(args, attrs, expected) of a qdwconv2d; expected from int64 numpy sums. ``bias``:
    "float" (small, added to the float32 sums: ``bias_in_float``), "int32" (small, added in
    int32 after them), "big" (near 2**31, in int32, wrapping)."""
    big_bias = bias_kind == "big"
    xi = np.iinfo(xd)
    x = rng.integers(xi.min, xi.max + 1, (b, c, h_, w)).astype(xd)
    kh, kw = kernel
    wd = rng.integers(-127, 128, (c, kh, kw))
    wd[0] = 127 if xz <= (int(xi.min) + int(xi.max)) // 2 else -127   # a saturating channel
    bias = (rng.integers(-2 ** 31, 2 ** 31 - 1, c) if big_bias
            else rng.integers(-3000, 3000, c)).astype(np.int32)
    mult = rng.uniform(2e-4, 3e-3, c).astype(np.float32)
    xp = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    sh, sw = strides
    oh = (h_ + pads[0] + pads[2] - kh) // sh + 1
    ow = (w + pads[1] + pads[3] - kw) // sw + 1
    acc = np.zeros((b, c, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw]
            acc += patch * wd[:, ky, kx].reshape(1, c, 1, 1)
    total = (acc + bias.reshape(1, c, 1, 1)).astype(np.int32)        # int32 wraps, as ORT's
    f = total.astype(np.float32) * mult.reshape(1, c, 1, 1)
    if yd == "float32":
        off = rng.normal(0, 1, c).astype(np.float32)
        expect = f + off.reshape(1, c, 1, 1)
        last = off
    else:
        yi = np.iinfo(yd)
        yz = 3 if yd == "uint8" else -2
        expect = np.clip(np.round(f) + np.float32(yz), yi.min, yi.max).astype(yd)
        last = np.array(yz, np.float32)
    args = [x, wd.reshape(c, kh * kw).astype(np.float32), np.array(xz, np.int32), bias, mult,
            last]
    attrs = dict(kernel=(kh, kw), strides=strides, padding=pads, dtype=yd,
                 bias_in_float=bias_kind == "float")
    return args, attrs, expect


CASES = {   # batch, C, H, W, kernel, strides, pads, x dtype, x zp, y dtype, bias
    "3x3_s1_rows_of_160": (1, 6, 5, 160, (3, 3), (1, 1), (1, 1, 1, 1), "uint8", 128, "uint8",
                           "float"),
    "5x5_s2_int8_batch2": (2, 5, 9, 13, (5, 5), (2, 2), (2, 2, 3, 2), "int8", -3, "uint8",
                           "int32"),
    "3x3_s21_big_bias": (1, 7, 12, 21, (3, 3), (2, 1), (1, 1, 1, 1), "uint8", 0, "uint8", "big"),
    "5x5_s12_int8_out": (1, 3, 6, 30, (5, 5), (1, 2), (2, 2, 2, 2), "uint8", 255, "int8",
                         "float"),
    "3x3_rows_narrower_than_a_vector": (1, 4, 5, 3, (3, 3), (1, 1), (1, 1, 1, 1), "uint8", 7,
                                        "uint8", "int32"),
    "1x3_p0_rows_of_40": (1, 9, 1, 40, (1, 3), (1, 1), (0, 1, 0, 1), "uint8", 90, "uint8",
                          "float"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_qdwconv2d_kernel_exact(case: str, target: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(sorted(CASES).index(case))
    args, attrs, expect = _case(rng, *CASES[case])
    mod = build_op_module("qdwconv2d", args, MASK, **attrs)
    for threads in (1, 2):
        got = compile_and_run(mod, {"x0": args[0]}, tmp_path, target=target, threads=threads,
                              name=f"t{threads}.mlc")["y"]
        np.testing.assert_array_equal(got, expect)
    if expect.dtype != np.float32:
        info = np.iinfo(expect.dtype)
        assert (expect == info.min).any() or (expect == info.max).any() or case.endswith("bias")


@pytest.mark.parametrize("target", TARGETS)
def test_float_output_with_relu(target: str, tmp_path: Path) -> None:
    """dtype float32 (a depthwise layer of dequantized inputs whose result stays float):
    float32(acc + bias) * multiplier + offset, then ReLU, as numpy computes it."""
    rng = np.random.default_rng(11)
    args, attrs, expect = _case(rng, 1, 7, 12, 21, (3, 3), (2, 1), (1, 1, 1, 1), "uint8", 100,
                                "float32")
    attrs["relu"] = True
    mod = build_op_module("qdwconv2d", args, MASK, **attrs)
    got = compile_and_run(mod, {"x0": args[0]}, tmp_path, target=target)["y"]
    np.testing.assert_array_equal(got, np.maximum(expect, np.float32(0)))
    assert (got == 0).any() and (got > 0).any()


def _code(args, attrs, level: str, emulate: bool = False):
    """(assembly, compiled code) of the qdwconv2d kernel for ``level``."""
    import llvmlite.binding as llvm

    mod = run_pipeline(build_op_module("qdwconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                       options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    target = resolve_target(level)
    code = compile_prim_funcs(funcs, target, options=UNPACKED.replace(vnni_emulate=emulate))
    assert list(code.kernels) == ["qdwconv2d"]
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    return tm.emit_assembly(llvm.parse_assembly(code.llvm_ir)), code


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64"])
def test_qdwconv2d_code_per_target(target: str) -> None:
    """Every level compiles the kernel (the integer pair product, not the generic loop nest,
    no float multiply-add), with no libcall; on x86-64-v3 and v4 the products are
    ``vpmaddwd`` (SSE's ``pmaddwd`` on v2), compiled here whatever the host."""
    rng = np.random.default_rng(0)
    args, attrs, _ = _case(rng, 1, 4, 6, 20, (3, 3), (1, 1), (1, 1, 1, 1), "uint8", 128, "uint8")
    asm, code = _code(args, attrs, target)
    assert "fmuladd" not in str(code.llvm_ir) and "vfmadd" not in asm
    if target == "x86-64-v2":
        assert re.search(r"\bpmaddwd\s", asm)
    elif target != "aarch64":
        assert "llvm.x86.avx2.pmadd.wd" in str(code.llvm_ir)
        assert re.search(r"\bvpmaddwd\s+%ymm", asm)
    else:
        assert re.search(r"\bsmull2?\s", asm)


# ---- the VNNI level: uint8 x int8 quads with vpdpbusd -----------------------------------------

def test_vnni_level_emits_vpdpbusd() -> None:
    """x86-64-v4+vnni with int8 weights: 4 taps per ``vpdpbusd`` (256-bit); weights that do not
    fit int8 keep the int16 pairs (``vpmaddwd``), as does plain v4. The emulated kernel the
    test below runs is the quad one (its workspace: 4 uint8 taps per word, one phase)."""
    rng = np.random.default_rng(3)
    args, attrs, _ = _case(rng, 1, 4, 9, 30, (5, 5), (2, 2), (2, 2, 2, 2), "int8", -5, "uint8")
    asm, code = _code(args, dict(attrs, weights_int8=True), "x86-64-v4+vnni")
    assert re.search(r"\bvpdpbusd\s+%ymm", asm) and "vpmaddwd" not in asm
    wide, _ = _code(args, attrs, "x86-64-v4+vnni")
    assert "vpdpbusd" not in wide and "vpmaddwd" in wide
    plain, _ = _code(args, dict(attrs, weights_int8=True), "x86-64-v4")
    assert "vpdpbusd" not in plain and "vpmaddwd" in plain
    _, emulated = _code(args, dict(attrs, weights_int8=True), "x86-64-v3", emulate=True)
    assert emulated.kernels["qdwconv2d"].workspace_bytes == \
        code.kernels["qdwconv2d"].workspace_bytes


QUAD_CASES = ["5x5_s2_int8_batch2", "3x3_s21_big_bias", "5x5_s12_int8_out",
              "3x3_rows_narrower_than_a_vector", "3x3_s1_rows_of_160"]


@pytest.mark.skipif(not X86, reason="the emulated VNNI kernel is the x86-64 quad kernel")
@pytest.mark.parametrize("case", QUAD_CASES)
def test_vnni_quads_emulated_exact(case: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The VNNI kernel's own code (uint8 quad words with x's zero point in the padding, int8
    x shifted by 128, the zp' * sum(w) correction in the bias, the task split) with vpdpbusd
    written in portable IR (``MLCPACK_VNNI_EMULATE=1``: per lane, the 4 uint8 x int8 products
    added to the int32 accumulator with wrap-around, as the instruction), run here: bit for
    bit against exact numpy integer math, one and two threads."""
    monkeypatch.setenv("MLCPACK_VNNI_EMULATE", "1")
    rng = np.random.default_rng(sorted(CASES).index(case))
    args, attrs, expect = _case(rng, *CASES[case])
    mod = build_op_module("qdwconv2d", args, MASK, **dict(attrs, weights_int8=True))
    for threads in (1, 2):
        got = compile_and_run(mod, {"x0": args[0]}, tmp_path, target="host", threads=threads,
                              name=f"t{threads}.mlc")["y"]
        np.testing.assert_array_equal(got, expect)


@pytest.mark.skipif(not X86 or "avx512_vnni" not in host_features(),
                    reason="runs vpdpbusd natively: needs an x86-64 host with avx512_vnni "
                           "(AVX-512 VNNI, e.g. Zen 4, Ice Lake, Sapphire Rapids)")
def test_vnni_quads_run_natively(tmp_path: Path) -> None:
    for i, case in enumerate(QUAD_CASES):
        rng = np.random.default_rng(sorted(CASES).index(case))
        args, attrs, expect = _case(rng, *CASES[case])
        path = tmp_path / f"{i}.mlc"
        export_module(build_op_module("qdwconv2d", args, MASK, **dict(attrs, weights_int8=True)),
                      path, ExportOptions(target="x86-64-v4+vnni", check=False))
        with load(path, threads=1) as model:
            np.testing.assert_array_equal(model.run({"x0": args[0]})["y"], expect, err_msg=case)


# ---- the depthwise layers of ONNX Runtime's quantized models ----------------------------------

def _dw_net(path: Path) -> Path:
    """x [1, 8, 14, 22] -> depthwise 3x3 (pad 1) -> Relu -> depthwise 5x5 stride 2 (pad 2) ->
    depthwise 1x3 stride (1, 2) -> y."""
    rng = np.random.default_rng(5)
    f = lambda *s, sd=0.4: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=8),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[2, 2, 2, 2], strides=[2, 2],
                         group=8),
             h.make_node("Conv", ["c2", "w3", "b3"], ["y"], pads=[0, 1, 0, 1], strides=[1, 2],
                         group=8)]
    inits = {"w1": f(8, 1, 3, 3), "b1": f(8, sd=0.1), "w2": f(8, 1, 5, 5), "b2": f(8, sd=0.1),
             "w3": f(8, 1, 1, 3), "b3": f(8, sd=0.1)}
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 14, 22])],
                    [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 7, 6])], inits, path)


FORMS = {   # mode, per channel, reduce_range
    "qdq_per_channel": ("QDQ", True, False),
    "qdq_per_tensor": ("QDQ", False, False),
    "qdq_reduce_range": ("QDQ", True, True),
    "qoperator_per_channel": ("QOperator", True, False),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_ort_quantized_depthwise_takes_the_kernel(form: str, tmp_path: Path) -> None:
    """Every depthwise layer of the quantized model becomes a qdwconv2d (no float convolution
    is left), and the output equals ONNX Runtime's (its depthwise kernel is exact integer
    arithmetic with the same requantization)."""
    pytest.importorskip("onnxruntime.quantization")
    mode, per_channel, reduce_range = FORMS[form]
    src = _dw_net(tmp_path / "dw.onnx")
    q = qm.ort_quantize(src, tmp_path / "dw_q.onnx", mode, per_channel=per_channel,
                        reduce_range=reduce_range)
    mod, _ = import_onnx(str(q))
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:6], options=UNPACKED)
    ops = [getattr(b.value, "op", "") for b in fused.functions["main"].bindings()]
    assert ops.count("qdwconv2d") == 3 and "nn.conv2d" not in ops, ops
    # ORT's int8 weights (zero point 0): the VNNI level takes them as vpdpbusd quads
    assert all(b.value.attrs["weights_int8"] for b in fused.functions["main"].bindings()
               if getattr(b.value, "op", "") == "qdwconv2d")
    feeds = qm.random_feeds(src, seed=4)[0]
    export_module(mod, tmp_path / "dw.mlc", ExportOptions(target="host", check=False))
    with load(tmp_path / "dw.mlc", threads=1) as m:
        got = m.run(feeds)["y"]
    ref = ort_outputs(q, feeds, threads=1)["y"]
    np.testing.assert_array_equal(got, ref)


def test_qdwconv2d_on_aarch64_under_qemu(tmp_path: Path) -> None:
    """The depthwise kernel compiled for aarch64 (NEON: the 8-lane vectors split in two, the
    portable requantization) and run by the copied runtime under qemu, bit for bit against
    numpy: a 3x3 stride-2 layer with a partial last vector, a 5x5 with int8 input and output
    and a bias near 2**31."""
    from arm64_root import arm64_root_or_fail, run_bundles
    from mlcpack.runtime import elf

    if elf._real_arch() != "x86_64":
        pytest.skip("emulates aarch64 on an x86-64 host")
    rng = np.random.default_rng(31)
    cases = {"s2": _case(rng, 1, 5, 9, 21, (3, 3), (2, 2), (1, 1, 1, 1), "uint8", 128, "uint8"),
             "int8_big_bias": _case(rng, 2, 3, 8, 12, (5, 5), (1, 1), (2, 2, 2, 2), "int8", -4,
                                    "int8", "big")}
    bundles = {}
    for name, (args, attrs, _) in cases.items():
        path = tmp_path / f"{name}.mlc"
        export_module(build_op_module("qdwconv2d", args, MASK, **attrs), path,
                      ExportOptions(target="aarch64", check=False))
        bundles[name] = (path, {"x0": args[0]})
    report, got = run_bundles(arm64_root_or_fail(), tmp_path, Path(__file__).resolve().parents[2],
                              bundles)
    assert report["machine"] == "aarch64"
    for name, (_, _, expect) in cases.items():
        np.testing.assert_array_equal(got[name]["y"], expect, err_msg=name)


# ---- rows of 1-3 pixels: the spilled last vector stays inside the plane -----------------------

def _run_jit(code, args, out: np.ndarray, level: str) -> None:
    """Calls the compiled ``qdwconv2d`` (JIT, one task) on ``args`` with ``out`` as its output
    buffer (larger than the result: what lies past it is the next tensor)."""
    import ctypes

    import llvmlite.binding as llvm

    target = resolve_target(level)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(code.llvm_ir), tm)
    engine.finalize_object()
    info = code.kernels["qdwconv2d"]
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        engine.get_function_address(info.symbol))
    work = np.zeros(info.workspace_bytes + 64, np.uint8)
    arrays = [np.ascontiguousarray(a) for a in args]
    ptrs = (ctypes.c_void_p * 8)(*([a.ctypes.data for a in arrays] + [
        out.ctypes.data, work.ctypes.data + (-work.ctypes.data % 64)]))
    kernel(ctypes.cast(ptrs, ctypes.c_void_p), 0, 1)


@pytest.mark.skipif(not X86, reason="runs x86-64-v2 / v3 code natively (JIT)")
@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_narrow_rows_store_nothing_past_the_plane(level: str) -> None:
    """A row of 1-3 output pixels (a partial vector): its last vector is stored whole, spilling
    into the rows after it, which are stored later; it used to do so from every row but the
    plane's last, so from the last rows but one it wrote 8 - 2 ow lanes past the plane (into
    the next plane, another task's, or past the tensor: the next live tensor). The kernel
    writes into a buffer that holds a guard after the result: the result exact, the guard
    untouched, 8-bit and float32 results."""
    if level == "x86-64-v3" and "avx2" not in host_features():
        pytest.skip("runs x86-64-v3 code: needs an x86-64 host with AVX2")
    rng = np.random.default_rng(21)
    for ow, yd in ((1, "uint8"), (2, "uint8"), (3, "uint8"), (2, "float32")):
        args, attrs, expect = _case(rng, 1, 3, 5, ow, (3, 3), (1, 1), (1, 1, 1, 1), "uint8", 7,
                                    yd, "int32")
        mod = run_pipeline(build_op_module("qdwconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                           options=UNPACKED)
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        code = compile_prim_funcs(funcs, resolve_target(level), options=UNPACKED)
        guard = np.full(16, 77, expect.dtype)
        out = np.concatenate([np.zeros(expect.size, expect.dtype), guard])
        _run_jit(code, args, out, level)
        np.testing.assert_array_equal(out[:expect.size].reshape(expect.shape), expect,
                                      err_msg=f"ow {ow} {yd}")
        np.testing.assert_array_equal(out[expect.size:], guard, err_msg=f"ow {ow} {yd}")
