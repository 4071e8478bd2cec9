"""The x86-64-v4+bf16 level and its ``vdpbf16ps`` matmul (codegen/bf16dot.py, ops/bf16.py).

This must pass on hosts without AVX-512 (Debian's qemu cannot run it either), so the v4+bf16
code is checked by what it emits (the kernel is selected, ``vdpbf16ps`` and ``vcvtne2ps2bf16``
are in its assembly) and its arithmetic by an instruction-exact numpy model of vdpbf16ps
(Intel SDM: per lane acc += a_odd * b_odd, then acc += a_even * b_even, each an FMA rounded to
nearest even, denormal inputs read as zero, denormal results flushed to zero) applied to the
weights exactly as the kernel reads them (the K-pair words of the packed constant) and to the
activations as vcvtne2ps2bf16 converts them. The native run, bit for bit against the model,
needs an x86-64 host with avx512_bf16 and skips elsewhere, saying so."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X86_V3, X86_V4

from mlcpack.packager.passes.layout import to_bfloat16
from mlcpack.runtime.cpu import host_arch, host_features

RNG = np.random.default_rng(5)
V4_BF16 = "x86-64-v4+bf16"
X86_V4_BF16 = X86_V4 + ",avx512_vnni,avx512_bf16"    # every avx512_bf16 CPU has VNNI


# ---- the CPU level ----------------------------------------------------------------------------

def test_level_records_avx512_bf16(monkeypatch):
    from mlcpack.packager.codegen.target import portable_levels, resolve_target
    from mlcpack.runtime.cpu import best_level, check_supported, level, pick_variant
    from mlcpack.runtime.errors import CpuFeatureError

    lv = level(V4_BF16)
    assert "avx512_bf16" in lv.flags and level("x86-64-v4").flags < lv.flags
    assert "+avx512bf16" in lv.llvm_features.split(",")
    assert best_level("x86_64", set(X86_V4_BF16.split(","))) == V4_BF16
    assert best_level("x86_64", set(X86_V4.split(","))) == "x86-64-v4"
    # fp32 exports on an avx512_bf16 host stay as they were; bf16 ones add the level
    assert portable_levels("x86_64", V4_BF16) == ["x86-64-v2", "x86-64-v3", "x86-64-v4",
                                                  "x86-64-v4+vnni"]
    assert portable_levels("x86_64", V4_BF16, precision="bf16")[-1] == V4_BF16
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V4_BF16)
    assert resolve_target("host").name == "x86-64-v4+vnni"
    assert resolve_target("host", "bf16").name == V4_BF16
    variants = [{"arch": "x86_64", "level": n, "features": []}
                for n in ("x86-64-v3", V4_BF16, "x86-64-v4")]
    assert pick_variant(variants) == 1
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V4)   # AVX-512 without avx512_bf16
    assert pick_variant(variants) == 2
    with pytest.raises(CpuFeatureError, match="needs avx512_bf16"):
        check_supported("x86_64", V4_BF16, [], "m.mlc")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    assert pick_variant(variants) == 0


def test_c_runtime_knows_the_level():
    """runtime/c/src/cpu.c chooses as runtime/cpu.py: the same level rows (name and flags)."""
    import re
    from pathlib import Path

    from mlcpack.runtime.cpu import LEVELS

    src = (Path(__file__).resolve().parents[2] / "runtime/c/src/cpu.c").read_text()
    rows = re.findall(r'\{"([^"]+)", "(x86_64|aarch64)", "([^"]*)"\}', src)
    c_levels, seen = {}, {}
    for name, arch, flags in rows:
        seen[arch] = seen.get(arch, frozenset()) | frozenset(flags.split())
        c_levels[name] = seen[arch]
    assert c_levels == {lv.name: lv.flags for lv in LEVELS}


# ---- the numpy model of the kernel ---------------------------------------------------------------

TINY = np.float64(2.0 ** -126)


def cvt_bf16(x: np.ndarray) -> np.ndarray:
    """vcvtne2ps2bf16: float32 -> bfloat16 bits, round to nearest even, denormals to signed
    zero (DAZ), NaN quieted."""
    x = np.asarray(x, dtype=np.float32)
    bits = to_bfloat16(x).view(np.uint16)
    denormal = (np.abs(x.astype(np.float64)) < TINY)
    return np.where(denormal, (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000),
                    bits)


def widen(h: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float64, denormals read as zero (DAZ)."""
    f = (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.where(np.abs(f) < TINY, 0.0 * f, f)


def fma_rne_ftz(acc: np.ndarray, p: np.ndarray) -> np.ndarray:
    """float32(acc + p) rounded once to nearest even (p exact in float64), denormal results
    flushed to zero: the float64 sum with its exact error (TwoSum), so that a float64 sum that
    lands on a float32 midpoint rounds the way the exact sum does."""
    s = acc + p
    bb = s - acc
    err = (acc - (s - bb)) + (p - bb)
    r = s.astype(np.float32)
    bits = s.view(np.uint64)
    midpoint = (bits & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    fix = midpoint & (err != 0)
    if fix.any():
        toward = np.where(err > 0, np.inf, -np.inf)
        r = np.where(fix, np.nextafter(s, toward).astype(np.float32), r)
    r64 = r.astype(np.float64)
    return np.where(np.abs(r64) < TINY, 0.0 * r64, r64)


def vdpbf16ps_matmul(a: np.ndarray, bp: np.ndarray, n: int) -> np.ndarray:
    """The kernel's accumulator for a [M, K] float32 times the packed pairs ``bp`` [panels,
    ceil(K / 2), nr, 2] (bfloat16 bits, as stored): per pair row, the odd product first."""
    m, k = a.shape
    pairs = bp.shape[1]
    ah = np.zeros((m, 2 * pairs), dtype=np.uint16)
    ah[:, :k] = cvt_bf16(a)
    # the words of column c: panel c // nr, lane c % nr
    cols = np.arange(n)
    bw = bp[cols // bp.shape[2], :, cols % bp.shape[2], :]   # [n, pairs, 2]
    acc = np.zeros((m, n))
    for j in range(pairs):
        for half in (1, 0):
            p = widen(ah[:, 2 * j + half])[:, None] * widen(bw[None, :, j, half])[0]
            acc = fma_rne_ftz(acc, p)
    return acc.astype(np.float32)


def test_model_of_one_instruction():
    """The model's rules on chosen values: odd product first, a rounding per product, DAZ on
    inputs, FTZ on results, round to nearest even in the conversion."""
    one = np.array([[1.0]])
    half_ulp = 2.0 ** -24   # half a float32 ulp of 1: a tie, rounds to even (1.0)
    # acc 1, products 2^-24 each: each FMA ties back to 1 (exact sum 1 + 2^-23)
    assert fma_rne_ftz(fma_rne_ftz(one, one * half_ulp), one * half_ulp)[0, 0] == 1.0
    # a float64 sum on the midpoint, the exact one past it: 1 + 2^-24 + 2^-70 rounds up
    assert fma_rne_ftz(one, one * (half_ulp + 2.0 ** -70))[0, 0] == 1.0 + 2.0 ** -23
    assert fma_rne_ftz(np.array([[2.0 ** -120]]), np.array([[-2.0 ** -120 + 2.0 ** -130]]))[
        0, 0] == 0.0                                                   # FTZ
    assert widen(np.array([0x0040], dtype=np.uint16))[0] == 0.0        # DAZ
    x = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1e-39, -1e-39], dtype=np.float32)
    np.testing.assert_array_equal(cvt_bf16(x), np.array([0x3F80, 0x3F82, 0, 0x8000], np.uint16))
    # order: acc = 1; odd 2^-24 then even 1 (1 + 2^-24 ties to 1, then 2) vs the other order
    bp = np.zeros((1, 1, 16, 2), np.uint16)
    bp[0, 0, 0] = [0x3F80, 0x3380]          # even row 1.0, odd row 2^-24
    a = np.array([[1.0, 1.0]], np.float32)
    assert vdpbf16ps_matmul(a, bp, 1)[0, 0] == np.float32(1.0)   # 0 + 2^-24, then + 1: 1
    assert vdpbf16ps_matmul(a[:, :1], bp, 1)[0, 0] == 1.0         # odd K: the pair's 0


# ---- the kernel -----------------------------------------------------------------------------------

def _model(batch: int, k: int, n: int):
    from onnx import TensorProto, helper, numpy_helper

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    bias = (RNG.standard_normal(n) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
             helper.make_node("Relu", ["g"], ["y"])]
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, w, bias


# K = 301: two chunks of converted activations (A_CHUNK 256), the second with an odd length
SHAPE = (9, 301, 37)


@pytest.fixture(scope="module")
def compiled():
    """The Gemm + ReLU for x86-64-v4+bf16 and plain x86-64-v4 from one pipeline run (a bf16
    bundle for both), with each level's assembly."""
    import llvmlite.binding as llvm

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import Constant, PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    model, w, bias = _model(*SHAPE)
    mod, _ = import_onnx(model)
    opts = CompileOptions(target=f"x86-64-v4,{V4_BF16}", precision="bf16")
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
    packed = [a for b in mod.functions["main"].bindings() for a in getattr(b.value, "args", ())
              if isinstance(a, Constant) and str(a.data.dtype) == "bfloat16"]
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    asm = {}
    for name in ("x86-64-v4", V4_BF16):
        target = resolve_target(name)
        code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
        asm[name] = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    return {"packed": packed, "funcs": [f.name for f in funcs], "asm": asm, "w": w,
            "bias": bias}


def test_kernel_selected_and_emitted(compiled):
    assert len(compiled["packed"]) == 1 and any("matmul_bf16p" in f for f in compiled["funcs"])
    asm = compiled["asm"]
    assert "vdpbf16ps" in asm[V4_BF16] and "vcvtne2ps2bf16" in asm[V4_BF16]
    # its inner loop: a broadcast activation pair against a vector of weight pairs
    assert "vbroadcastss" in asm[V4_BF16] or "{1to16}" in asm[V4_BF16]
    # without avx512_bf16 the same weights are widened (shift and mask), no bf16 instruction
    assert "vdpbf16ps" not in asm["x86-64-v4"] and "vcvtne2ps2bf16" not in asm["x86-64-v4"]
    assert "vpslld" in asm["x86-64-v4"]


def test_model_on_the_kernels_packing(compiled):
    """The weight words the kernel reads, through the vdpbf16ps model: the product of the
    bf16-rounded operands within float32 summation error, and within 1 % of fp32."""
    m, k, n = SHAPE
    w = compiled["w"]
    bp = compiled["packed"][0].data.view(np.uint16)
    assert bp.shape == (-(-n // 16), -(-k // 2), 16, 2)
    a = RNG.standard_normal((m, k)).astype(np.float32)
    got = vdpbf16ps_matmul(a, bp, n).astype(np.float64)
    a16 = widen(cvt_bf16(a))
    w16 = to_bfloat16(w).astype(np.float64)
    exact = a16 @ w16.T
    scale = float(np.abs(exact).max())
    np.testing.assert_allclose(got, exact, rtol=0, atol=2 ** -24 * k * scale)
    fp32 = a.astype(np.float64) @ w.astype(np.float64).T
    assert float(np.abs(got - fp32).max()) / float(np.abs(fp32).max()) < 0.01


def test_dot_path_emulated_bit_exact(tmp_path):
    """The v4+bf16 matmul's data path (activations converted per chunk, the K-pair panels, the
    loop order, the epilogue) with vcvtne2ps2bf16 and vdpbf16ps in portable IR
    (``CompileOptions.bf16_emulate``) for x86-64-v3, which this host runs: bit for bit the
    numpy model plus the float32 epilogue."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.bf16 import pack_pairs
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    if host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features():
        pytest.skip("runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
    model, w, bias = _model(*SHAPE)
    mod, _ = import_onnx(model)
    path = tmp_path / "emulated.mlc"
    opts = CompileOptions(bf16_emulate=True, bf16_widen_all=True)
    report = export_module(mod, path, ExportOptions(target="x86-64-v3", precision="bf16",
                                                    compile=opts))
    assert report.precision == "bf16", report.precision_note
    bp = pack_pairs(to_bfloat16(w.T)).view(np.uint16)
    a = RNG.standard_normal(SHAPE[:2]).astype(np.float32)
    want = np.maximum(vdpbf16ps_matmul(a, bp, SHAPE[2]) + bias, np.float32(0))
    for threads in (1, 2):
        with load(path, threads=threads) as bundle:
            np.testing.assert_array_equal(bundle.run({"x": a})["y"], want)


def test_native_run_bit_exact(tmp_path):
    if host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features():
        pytest.skip("runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16 "
                    "(Zen 4, Sapphire Rapids, Cooper Lake); this one has neither or not both")
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    model, w, bias = _model(*SHAPE)
    mod, _ = import_onnx(model)
    path = tmp_path / "v4bf16.mlc"
    report = export_module(mod, path, ExportOptions(target=V4_BF16, precision="bf16"))
    assert report.precision == "bf16", report.precision_note
    from mlcpack.packager.ops.bf16 import pack_pairs
    bp = pack_pairs(to_bfloat16(w.T)).view(np.uint16)
    a = RNG.standard_normal(SHAPE[:2]).astype(np.float32)
    with load(path) as bundle:
        got = bundle.run({"x": a})["y"]
    # the epilogue in float32: + bias, ReLU
    want = np.maximum(vdpbf16ps_matmul(a, bp, SHAPE[2]) + bias, np.float32(0))
    np.testing.assert_array_equal(got, want)


# ---- the convolution kernel (codegen/bf16conv.py) ---------------------------------------------------

def _conv_model(c: int, o: int, k: int, hw: int, stride: int):
    """Conv (+ bias) then ReLU, padding k // 2: the fused epilogue of the kernel."""
    from onnx import TensorProto, helper, numpy_helper

    w = (RNG.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    bias = (RNG.standard_normal(o) * 0.1).astype(np.float32)
    pad = k // 2
    out = (hw + 2 * pad - k) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4,
                              strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, out, out])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, w, bias, (stride, stride), (pad,) * 4


# an odd C (the last pair's odd channel is zero), a stride-2 3x3 with padding, 20 output
# channels (a partial block of tile rows); a strided 1x1; a 1x1 on 14x14 (panels of 32 pixels,
# the last one a 1-vector tail panel: 196 = 6 * 32 + 4)
CONV_CASES = {"3x3_s2": (5, 20, 3, 11, 2), "1x1_s2": (6, 16, 1, 9, 2),
              "1x1_tail": (6, 16, 1, 14, 1)}


def vdpbf16ps_conv(x: np.ndarray, wp: np.ndarray, strides, padding) -> np.ndarray:
    """The kernel's accumulators for x [1, C, H, W] float32 and the packed pairs ``wp`` [O,
    ceil(C / 2), KH, KW, 2] (bfloat16 bits, as stored), in its loop order: per channel pair,
    per tap (row-major), one vdpbf16ps (the odd channel's product, then the even one's); the
    activations as the planes hold them (vcvtne2ps2bf16 of each channel, zero padding and a
    zero channel past an odd C)."""
    _, c, h, w = x.shape
    o, cp, kh, kw, _ = wp.shape
    sh, sw = strides
    pt, pl, pb, pr = padding
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    xb = np.zeros((2 * cp, h + pt + pb, w + pl + pr), np.uint16)
    xb[:c, pt:pt + h, pl:pl + w] = cvt_bf16(x[0])
    acc = np.zeros((o, oh, ow))
    for j in range(cp):
        for ky in range(kh):
            for kx in range(kw):
                for half in (1, 0):
                    a = widen(xb[2 * j + half, ky:ky + sh * (oh - 1) + 1:sh,
                                 kx:kx + sw * (ow - 1) + 1:sw])
                    acc = fma_rne_ftz(acc, widen(wp[:, j, ky, kx, half])[:, None, None] * a)
    return acc.astype(np.float32)[None]


@pytest.fixture(scope="module")
def conv_compiled():
    """Each case's Conv + ReLU through the bf16 pipeline for x86-64-v4,x86-64-v4+bf16 (the
    convolution becomes nn.conv2d_bf16p), with both levels' assembly."""
    import llvmlite.binding as llvm

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import Constant, PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    opts = CompileOptions(target=f"x86-64-v4,{V4_BF16}", precision="bf16")
    out = {}
    for case, shape in CONV_CASES.items():
        model, w, bias, strides, padding = _conv_model(*shape)
        mod, _ = import_onnx(model)
        mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
        packed = [a for b in mod.functions["main"].bindings()
                  for a in getattr(b.value, "args", ())
                  if isinstance(a, Constant) and str(a.data.dtype) == "bfloat16"]
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        asm = {}
        for name in ("x86-64-v4", V4_BF16):
            target = resolve_target(name)
            code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
            asm[name] = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
        out[case] = dict(packed=packed, funcs=[f.name for f in funcs], asm=asm, w=w, bias=bias,
                         strides=strides, padding=padding, model=model)
    return out


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_kernel_selected_and_emitted(conv_compiled, case):
    got = conv_compiled[case]
    o, c, kh, kw = got["w"].shape
    assert [p.data.shape for p in got["packed"]] == [(o, -(-c // 2), kh, kw, 2)]
    assert any("conv2d_bf16p" in f for f in got["funcs"])
    asm = got["asm"]
    # the planes converted with vcvtne2ps2bf16, the reduction in vdpbf16ps against broadcast
    # weight pairs
    assert "vdpbf16ps" in asm[V4_BF16] and "vcvtne2ps2bf16" in asm[V4_BF16]
    assert "vbroadcastss" in asm[V4_BF16] or "{1to16}" in asm[V4_BF16]
    # without avx512_bf16 the same pair weights are widened on float32 planes
    assert "vdpbf16ps" not in asm["x86-64-v4"] and "vcvtne2ps2bf16" not in asm["x86-64-v4"]


def test_conv_1x1_tail_panel():
    """vdpbf16ps 1x1 windows: a last panel with fewer vectors than the tile's computes only
    those that hold outputs (the 1x1_tail case: 6 panels of 2 vectors and one of 1)."""
    from mlcpack.packager.codegen.bf16conv import PairConvEmitter, pair_conv_geometry

    g = pair_conv_geometry((1, 6, 14, 14), (16, 3, 1, 1, 2), (1, 16, 14, 14), (1, 1),
                           (0, 0, 0, 0), 16)
    assert (g["mr"], g["nv"], g["panels"]) == (8, 2, 7)
    fake = type("E", (), {"dot": True, "vl": 16})()
    tail = PairConvEmitter._tail_geometry(fake, g)
    assert (tail["nv"], tail["nr"], tail["panel_nr"]) == (1, 16, 32)
    fake.dot = False   # the widened levels (and 3x3 windows) keep whole panels
    assert PairConvEmitter._tail_geometry(fake, g) is None


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_model_on_the_kernels_packing(conv_compiled, case):
    """The packed weight words through the conv model: the convolution of the bf16-rounded
    operands within float32 summation error, and within 1 % of fp32."""
    from mlcpack.packager.ops.nn import conv2d

    got_c = conv_compiled[case]
    w, strides, padding = got_c["w"], got_c["strides"], got_c["padding"]
    wp = got_c["packed"][0].data.view(np.uint16)
    x = RNG.standard_normal((1, w.shape[1], CONV_CASES[case][3], CONV_CASES[case][3])).astype(
        np.float32)
    got = vdpbf16ps_conv(x, wp, strides, padding).astype(np.float64)
    exact = conv2d(widen(cvt_bf16(x)), to_bfloat16(w).astype(np.float64), strides, padding)
    scale = float(np.abs(exact).max())
    k = int(np.prod(w.shape[1:]))
    np.testing.assert_allclose(got, exact, rtol=0, atol=2 ** -24 * k * scale)
    fp32 = conv2d(x.astype(np.float64), w.astype(np.float64), strides, padding)
    err = float(np.abs(got - fp32).max()) / float(np.abs(fp32).max())
    assert 0 < err < 0.01


def test_conv_widened_levels_run_here(tmp_path):
    """A bundle for x86-64-v3 and x86-64-v4+bf16 (its convolution nn.conv2d_bf16p, the weights
    shared) on a host without avx512_bf16 runs its v3 variant: float32 planes, each pair weight
    widened exactly: the convolution of the rounded weights within float32 summation error,
    then bias and ReLU."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.nn import conv2d
    from mlcpack.runtime import load

    if host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features() \
            or "avx512_bf16" in host_features():
        pytest.skip("runs the x86-64-v3 variant: needs an x86-64 host with AVX2 and FMA, "
                    "without avx512_bf16 (which would run the v4+bf16 variant)")
    model, w, bias, strides, padding = _conv_model(*CONV_CASES["3x3_s2"])
    mod, _ = import_onnx(model)
    path = tmp_path / "v3.mlc"
    report = export_module(mod, path, ExportOptions(target=f"x86-64-v3,{V4_BF16}",
                                                    precision="bf16"))
    assert report.precision == "bf16", report.precision_note
    assert "levels without avx512_bf16 (x86-64-v3) widen the bf16 convolution weights" \
        in report.precision_note
    x = RNG.standard_normal((1, 5, 11, 11)).astype(np.float32)
    with load(path) as bundle, load(path, threads=2) as two:
        got = bundle.run({"x": x})["y"].astype(np.float64)
        np.testing.assert_array_equal(two.run({"x": x})["y"], got)
    want = np.maximum(conv2d(x.astype(np.float64), to_bfloat16(w).astype(np.float64), strides,
                             padding) + bias[None, :, None, None], 0)
    k = int(np.prod(w.shape[1:]))
    np.testing.assert_allclose(got, want, rtol=0, atol=2 ** -23 * k * float(np.abs(want).max()))


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_native_run_bit_exact(tmp_path, conv_compiled, case):
    if host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features():
        pytest.skip("runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16 "
                    "(Zen 4, Sapphire Rapids, Cooper Lake); this one has neither or not both")
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.bf16 import pack_conv_pairs
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    got_c = conv_compiled[case]
    w, bias = got_c["w"], got_c["bias"]
    mod, _ = import_onnx(got_c["model"])
    path = tmp_path / "v4bf16.mlc"
    # the pixel-lane pair kernel (small planes otherwise take the channel-lane one)
    report = export_module(mod, path, ExportOptions(
        target=V4_BF16, precision="bf16", compile=CompileOptions(bf16_oc_pixels=0)))
    assert report.precision == "bf16", report.precision_note
    wp = pack_conv_pairs(to_bfloat16(w)).view(np.uint16)
    hw = CONV_CASES[case][3]
    x = RNG.standard_normal((1, w.shape[1], hw, hw)).astype(np.float32)
    with load(path) as bundle:
        got = bundle.run({"x": x})["y"]
    # the epilogue in float32: + bias, ReLU
    acc = vdpbf16ps_conv(x, wp, got_c["strides"], got_c["padding"])
    want = np.maximum(acc + bias[None, :, None, None], np.float32(0))
    np.testing.assert_array_equal(got, want)


def test_which_convolutions_take_pairs():
    """With x86-64-v4+bf16 in the targets a plain convolution's weight becomes input-channel
    pairs; a depthwise one and one of a single output pixel keep fp32 (their own kernels), and
    the bf16 line's account says so. The pipeline only: nothing compiled."""
    from onnx import TensorProto, helper, numpy_helper

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.ir.graph import Constant
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
    from mlcpack.packager.precision import fp32_note

    inits = {"w": RNG.standard_normal((16, 8, 3, 3)), "wd": RNG.standard_normal((16, 1, 3, 3)),
             "wp": RNG.standard_normal((8, 16, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1] * 4),
             helper.make_node("Conv", ["a", "wd"], ["d"], pads=[1] * 4, group=16),
             helper.make_node("GlobalAveragePool", ["d"], ["g"]),
             helper.make_node("Conv", ["g", "wp"], ["y"])]
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mod, _ = import_onnx(model)
    # (bf16_oc_pixels 0: the 9x9 plane on the pair kernel, not on the channel-lane one)
    opts = CompileOptions(target=V4_BF16, precision="bf16", bf16_oc_pixels=0)
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
    consts = {a.name: a.data for b in mod.functions["main"].bindings()
              for a in getattr(b.value, "args", ()) if isinstance(a, Constant)}
    bf16 = {k: v.shape for k, v in consts.items() if str(v.dtype) == "bfloat16"}
    assert bf16 == {"w_bf16": (16, 4, 3, 3, 2)}, bf16
    # its multiply-adds (the profiler's GFLOP/s): 16 x 9 x 9 outputs of 8 channels x 3 x 3 taps
    (pair,) = [f for f in mod.functions.values() if "conv2d_bf16p" in f.name]
    assert pair.attrs["macs"] == 16 * 9 * 9 * 8 * 3 * 3
    note = fp32_note(mod, opts.for_targets(), (V4_BF16,))
    assert note.startswith("; 2 convolutions stay fp32 (grouped, dilated, depthwise or of one "
                           "output pixel: no bf16 kernel; wd"), note
    assert "widen" not in note   # x86-64-v4+bf16 alone: no widened level


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_dot_path_emulated_bit_exact(tmp_path, conv_compiled, case):
    """The v4+bf16 convolution's whole data path (pair planes converted and interleaved, the
    loop order over pairs and taps, the epilogue) compiled with vcvtne2ps2bf16 and vdpbf16ps
    written in portable IR (``CompileOptions.bf16_emulate``: each product one float32 FMA,
    exact for bf16 operands) for x86-64-v3, which this host runs: bit for bit the numpy model
    (normal values: no denormal for DAZ/FTZ to differ on)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.bf16 import pack_conv_pairs
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    if host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features():
        pytest.skip("runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
    got_c = conv_compiled[case]
    w, bias = got_c["w"], got_c["bias"]
    mod, _ = import_onnx(got_c["model"])
    path = tmp_path / "emulated.mlc"
    opts = CompileOptions(bf16_emulate=True, pack_conv_weights=False,
                          conv_row_widths=())
    report = export_module(mod, path, ExportOptions(target="x86-64-v3", precision="bf16",
                                                    compile=opts))
    assert report.precision == "bf16", report.precision_note
    wp = pack_conv_pairs(to_bfloat16(w)).view(np.uint16)
    hw = CONV_CASES[case][3]
    x = RNG.standard_normal((1, w.shape[1], hw, hw)).astype(np.float32)
    acc = vdpbf16ps_conv(x, wp, got_c["strides"], got_c["padding"])
    want = np.maximum(acc + bias[None, :, None, None], np.float32(0))
    for threads in (1, 2):
        with load(path, threads=threads) as bundle:
            np.testing.assert_array_equal(bundle.run({"x": x})["y"], want)


# ---- the channel-lane pair convolution (codegen/conv_oc.py with ``pairs``) --------------------

# (C, O, k, H = W, stride): an odd C over two chunks of 16 pairs (19 pairs) and a block and a
# half of output channels (48: a 16-channel partial block), 14x14 (row groups with a half
# tile and single pixels left); a strided 1x1 to 7x7
OC_CASES = {"3x3_c37": (37, 48, 3, 14, 1), "1x1_s2": (24, 32, 1, 13, 2)}


def _oc_pipeline(shape, target: str, **fields):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    model, w, bias, strides, padding = _conv_model(*shape)
    mod, _ = import_onnx(model)
    targets = [resolve_target(n) for n in target.split(",")]
    opts = CompileOptions(target=target, precision="bf16",
                          **{"bf16_winograd": False, **fields}).for_targets(targets)
    return run_pipeline(mod, DEFAULT_PIPELINE, options=opts), opts, model, w, bias


def test_oc_pairs_chosen_for_small_planes():
    """Planes of at most 14x14 (56x56 from 64 input channels, ``bf16_oc_pixels``; strided stems
    of up to 4 any size; 1x1 windows 7x7) with output channels in 16-lane vectors take
    nn.conv2d_oc with
    pair weights (``pack_oc_pairs``: the pairs of ``pack_conv_pairs`` by blocks of 32 output
    channels) where every target has vdpbf16ps; larger planes, other channel counts and a
    set with a level without avx512_bf16 keep nn.conv2d_bf16p. Pipeline only."""
    from mlcpack.packager.ir.graph import Constant
    from mlcpack.packager.ops.layout import pack_oc_pairs, unpack_oc_pairs

    def picked(shape, target=V4_BF16, **fields):
        mod = _oc_pipeline(shape, target, **fields)[0]
        consts = [a.data for b in mod.functions["main"].bindings()
                  for a in getattr(b.value, "args", ())
                  if isinstance(a, Constant) and str(a.data.dtype) == "bfloat16"]
        kinds = {k for f in mod.functions for k in ("conv2d_oc", "conv2d_bf16p") if k in f}
        return kinds, [c.shape for c in consts]

    assert picked((5, 32, 3, 7, 1)) == ({"conv2d_oc"}, [(1, 3 * 9, 32, 2)])
    assert picked(OC_CASES["3x3_c37"]) == ({"conv2d_oc"}, [(2, 19 * 9, 32, 2)])
    assert picked((5, 32, 3, 15, 1))[0] == {"conv2d_bf16p"}        # 15x15 > 14x14, C < 64
    assert picked((64, 32, 3, 56, 1))[0] == {"conv2d_oc"}          # C 64: up to 56x56
    assert picked((64, 32, 3, 57, 1))[0] == {"conv2d_bf16p"}
    assert picked((3, 16, 3, 40, 2))[0] == {"conv2d_oc"}           # a strided stem, any size
    assert picked((3, 16, 3, 40, 1))[0] == {"conv2d_bf16p"}
    assert picked((5, 32, 1, 8, 1))[0] == {"conv2d_bf16p"}         # a 1x1 on 8x8 > 7x7
    assert picked((5, 32, 1, 7, 1))[0] == {"conv2d_oc"}
    assert picked((5, 20, 3, 7, 1))[0] == {"conv2d_bf16p"}         # 20 channels
    assert picked((5, 32, 3, 7, 1), f"x86-64-v4,{V4_BF16}")[0] == {"conv2d_bf16p"}
    assert picked((5, 32, 3, 7, 1), bf16_oc_pixels=0)[0] == {"conv2d_bf16p"}
    w = to_bfloat16(RNG.standard_normal((48, 37, 3, 3)).astype(np.float32))
    wp = pack_oc_pairs(w)
    assert wp[1, (18 * 3 + 2) * 3 + 1, 15, 0] == w[47, 36, 2, 1]   # o 47: block 1, lane 15
    assert wp[1, (18 * 3 + 2) * 3 + 1, 15, 1] == 0                 # past C
    assert not wp[1, :, 16:].astype(np.float32).any()              # past O
    np.testing.assert_array_equal(unpack_oc_pairs(wp, 48, 37, (3, 3)), w)


@pytest.fixture(scope="module")
def oc_compiled():
    """Each OC case's kernels and their x86-64-v4+bf16 assembly (any host)."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc

    out = {}
    for case, shape in OC_CASES.items():
        mod, opts, model, w, bias = _oc_pipeline(shape, V4_BF16)
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        target = resolve_target(V4_BF16)
        code = compile_prim_funcs(funcs, target, options=opts)
        asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
        out[case] = dict(asm=asm, model=model, w=w, bias=bias, funcs=[f.name for f in funcs])
    return out


@pytest.mark.parametrize("case", sorted(OC_CASES))
def test_oc_pairs_emitted(oc_compiled, case):
    """The channel-lane kernel's planes converted with vcvtne2ps2bf16, its reduction in
    vdpbf16ps of 16 output channels' weight pairs against a broadcast input pair word, on
    zmm registers."""
    got = oc_compiled[case]
    assert any("conv2d_oc" in f for f in got["funcs"]), got["funcs"]
    asm = got["asm"]
    assert "vdpbf16ps" in asm and "vcvtne2ps2bf16" in asm
    assert "{1to16}" in asm or "vpbroadcastd" in asm or "vbroadcastss" in asm
    dots = [ln for ln in asm.splitlines() if "vdpbf16ps" in ln]
    assert all("zmm" in ln for ln in dots)


@pytest.mark.parametrize("case", sorted(OC_CASES))
def test_oc_pairs_native_run_bit_exact(tmp_path, oc_compiled, case):
    """Bit for bit the numpy model of vdpbf16ps (``vdpbf16ps_conv``: per channel pair, per
    tap, the odd product then the even one: the kernel's chunks of pairs keep that order
    through the row buffer), then bias and ReLU in float32; 1 and 2 threads."""
    if host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features():
        pytest.skip("runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16 "
                    "(Zen 4, Sapphire Rapids, Cooper Lake); this one has neither or not both")
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.bf16 import pack_conv_pairs
    from mlcpack.runtime import load

    got_c = oc_compiled[case]
    w, bias = got_c["w"], got_c["bias"]
    c, _, k, hw, stride = OC_CASES[case]
    mod, _ = import_onnx(got_c["model"])
    from mlcpack.packager.options import CompileOptions

    path = tmp_path / "oc.mlc"
    report = export_module(mod, path, ExportOptions(
        target=V4_BF16, precision="bf16", compile=CompileOptions(bf16_winograd=False)))
    assert report.precision == "bf16", report.precision_note
    x = RNG.standard_normal((1, c, hw, hw)).astype(np.float32)
    acc = vdpbf16ps_conv(x, pack_conv_pairs(to_bfloat16(w)).view(np.uint16), (stride,) * 2,
                         (k // 2,) * 4)
    want = np.maximum(acc + bias[None, :, None, None], np.float32(0))
    for threads in (1, 2):
        with load(path, threads=threads) as bundle:
            np.testing.assert_array_equal(bundle.run({"x": x})["y"], want)


# ---- tap pairs: a window row's adjacent taps paired (few, odd input channels) ------------------

# (C, O, k, H = W, stride): a 7x7 stride-2 stem of C = 3 (4 tap pairs per window row, the
# last against a zero weight; a block and a half of output channels); C = 1, 3x3 stride 1
# (pairs at odd columns too), 16 channels
TAP_CASES = {"7x7_s2_c3": (3, 48, 7, 20, 2), "3x3_c1": (1, 16, 3, 9, 1)}


def vdpbf16ps_conv_taps(x: np.ndarray, wp: np.ndarray, out_channels: int, kernel, strides,
                        padding) -> np.ndarray:
    """The tap-pair kernel's accumulators for x [1, C, H, W] float32 and the packed tap pairs
    ``wp`` [blocks, C * KH * ceil(KW / 2), 32, 2] (bfloat16 bits, ``pack_oc_tap_pairs``), in
    its loop order: per input channel, per window row, per tap pair, one vdpbf16ps (the odd
    tap's product, then the even one's); the activations as the planes hold them (the word at
    column j: vcvtne2ps2bf16 of the padded row's columns j and j + 1, zero past it)."""
    _, c, h, w = x.shape
    kh, kw = kernel
    kwp = -(-kw // 2)
    sh, sw = strides
    pt, pl, pb, pr = padding
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    xb = np.zeros((c, h + pt + pb, w + pl + pr + 1), np.uint16)
    xb[:, pt:pt + h, pl:pl + w] = cvt_bf16(x[0])
    o = np.arange(out_channels)
    acc = np.zeros((out_channels, oh, ow))
    for ch in range(c):
        for ky in range(kh):
            for t in range(kwp):
                for half in (1, 0):
                    kx = 2 * t + half
                    a = widen(xb[ch, ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw])
                    wt = widen(wp[o // 32, (ch * kh + ky) * kwp + t, o % 32, half])
                    acc = fma_rne_ftz(acc, wt[:, None, None] * a)
    return acc.astype(np.float32)[None]


def test_tap_pairs_chosen_and_packed():
    """Few odd input channels (C * ceil(KW / 2) < ceil(C / 2) * KW) take nn.conv2d_oc with tap
    pairs at any plane size (``pack_oc_tap_pairs``) where every target has vdpbf16ps; a 3x3 of
    C = 3 (6 steps either way) and ``bf16_tap_pairs`` False keep channel pairs, a portable set
    the pixel-lane kernel. Pipeline only."""
    from mlcpack.packager.ir.graph import Constant
    from mlcpack.packager.ops.layout import pack_oc_tap_pairs, unpack_oc_tap_pairs

    def picked(shape, target=V4_BF16, **fields):
        mod = _oc_pipeline(shape, target, **fields)[0]
        consts = [a.data.shape for b in mod.functions["main"].bindings()
                  for a in getattr(b.value, "args", ())
                  if isinstance(a, Constant) and str(a.data.dtype) == "bfloat16"]
        kinds = {k for f in mod.functions for k in ("conv2d_oc", "conv2d_bf16p") if k in f}
        return kinds, consts

    # (tap pairs: C * KH * ceil(KW / 2) steps; channel pairs 2 * 49 for the 7x7)
    assert picked((3, 64, 7, 56, 2)) == ({"conv2d_oc"}, [(2, 3 * 7 * 4, 32, 2)])
    assert picked((1, 16, 3, 9, 1)) == ({"conv2d_oc"}, [(1, 3 * 2, 32, 2)])
    # a 3x3 of C = 3: channel pairs (6 steps either way)
    assert picked((3, 64, 3, 56, 2)) == ({"conv2d_oc"}, [(2, 2 * 9, 32, 2)])
    assert picked((3, 64, 7, 56, 2), f"x86-64-v4,{V4_BF16}")[0] == {"conv2d_bf16p"}
    assert picked((3, 64, 7, 56, 2), bf16_tap_pairs=False) == ({"conv2d_oc"},
                                                               [(2, 2 * 49, 32, 2)])
    w = to_bfloat16(RNG.standard_normal((48, 3, 7, 7)).astype(np.float32))
    wp = pack_oc_tap_pairs(w)
    assert wp[1, (2 * 7 + 6) * 4 + 2, 15, 1] == w[47, 2, 6, 5]   # o 47: block 1, lane 15
    assert wp[1, (2 * 7 + 6) * 4 + 3, 15, 1] == 0                # past KW
    np.testing.assert_array_equal(unpack_oc_tap_pairs(wp, 48, 3, (7, 7)), w)


@pytest.mark.parametrize("case", sorted(TAP_CASES))
def test_tap_pairs_bit_exact(tmp_path, case):
    """The tap-pair kernel bit for bit against its numpy model (``vdpbf16ps_conv_taps``), then
    bias and ReLU in float32, 1 and 2 threads, on an avx512_bf16 host; elsewhere its emitted
    code (vdpbf16ps on zmm, vcvtne2ps2bf16) and the model against the convolution of the
    rounded operands."""
    from mlcpack.packager.ops.layout import pack_oc_tap_pairs
    from mlcpack.packager.ops.nn import conv2d

    c, o, k, hw, stride = TAP_CASES[case]
    model, w, bias, strides, padding = _conv_model(c, o, k, hw, stride)
    x = RNG.standard_normal((1, c, hw, hw)).astype(np.float32)
    wp = pack_oc_tap_pairs(to_bfloat16(w)).view(np.uint16)
    acc = vdpbf16ps_conv_taps(x, wp, o, (k, k), strides, padding)
    exact = conv2d(widen(cvt_bf16(x)), to_bfloat16(w).astype(np.float64), strides, padding)
    np.testing.assert_allclose(acc, exact, rtol=0,
                               atol=2 ** -24 * c * k * k * float(np.abs(exact).max()))
    want = np.maximum(acc + bias[None, :, None, None], np.float32(0))
    if host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features():
        import llvmlite.binding as llvm

        from mlcpack.packager.codegen.build import _target_machine
        from mlcpack.packager.codegen.parallel import compile_prim_funcs
        from mlcpack.packager.codegen.target import resolve_target
        from mlcpack.packager.ir.graph import PrimFunc

        mod, opts = _oc_pipeline((c, o, k, hw, stride), V4_BF16)[:2]
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        target = resolve_target(V4_BF16)
        code = compile_prim_funcs(funcs, target, options=opts)
        asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
        assert "vcvtne2ps2bf16" in asm
        dots = [ln for ln in asm.splitlines() if "vdpbf16ps" in ln]
        assert dots and all("zmm" in ln for ln in dots)
        return
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    mod, _ = import_onnx(model)
    path = tmp_path / "taps.mlc"
    report = export_module(mod, path, ExportOptions(target=V4_BF16, precision="bf16"))
    assert report.precision == "bf16", report.precision_note
    for threads in (1, 2):
        with load(path, threads=threads) as bundle:
            np.testing.assert_array_equal(bundle.run({"x": x})["y"], want)
