"""The integer GEMM kernels (codegen/qgemm.py) for ``qmatmul`` / ``qconv2d`` (ops/qlinear.py)
against numpy integer arithmetic, bit for bit: odd M / N / K tails, uint8 and int8
activations, int8 and int16 (w - w_zp beyond int8) weights, per-channel requantization,
saturation at both ends, strides / padding / odd channel counts; on this host's level (AVX2
``vpmaddwd`` where it has AVX2) and on x86-64-v2 (the generic pair product, which runs on any
x86-64 host), one and two threads; object code checked for the instructions."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import build_op_module, compile_and_run
from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.ops.qlinear import (pack_conv_weights, pack_weights, unpack_conv_weights,
                                          unpack_weights)
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime.cpu import host_features

X86 = platform.machine().lower() in ("x86_64", "amd64")
TARGETS = ["host"] + (["x86-64-v2"] if X86 else [])
MASK = [False, True, True, True, True, True]


def _requant(acc: np.ndarray, mult: np.ndarray, yz: float, dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    y = np.round(acc.astype(np.int32).astype(np.float32) * mult) + np.float32(yz)
    return np.clip(y, info.min, info.max).astype(dtype)


def _run(op: str, args: list, attrs: dict, tmp_path: Path, target: str, threads: int = 1):
    mod = build_op_module(op, args, MASK, **attrs)
    return compile_and_run(mod, {"x0": args[0]}, tmp_path, target=target, threads=threads)["y"]


def _matmul_case(rng, shape, n, xd, xz, wide, yd, yz):
    xi = np.iinfo(xd)
    x = rng.integers(xi.min, xi.max + 1, shape).astype(xd)
    x.reshape(-1, shape[-1])[0] = xi.max if xz <= (xi.min + xi.max) // 2 else xi.min
    k = shape[-1]
    lim = 255 if wide else 127
    wd = rng.integers(-lim, lim + 1, (k, n))
    wd[:, 0] = lim            # a column of largest products
    bias = rng.integers(-3000, 3000, n).astype(np.int32)
    dev = max(xz - xi.min, xi.max - xz)      # the extreme row times column 0 saturates
    mult = (rng.uniform(0.5, 1.5, n) * 400 / (k * lim * dev)).astype(np.float32)
    acc = (x.astype(np.int64) - xz) @ wd + bias
    expect = _requant(acc, mult, yz, yd)
    wp = pack_weights(wd)
    npn = wp.shape[0] * 8
    args = [x, wp, np.array(xz, np.int32), np.pad(bias, (0, npn - n)),
            np.pad(mult, (0, npn - n)), np.array(yz, np.float32)]
    return args, {"n": n, "dtype": yd}, expect, wp


MATMULS = {   # x shape, N, x dtype, x zp, int16 weights, y dtype, y zp
    "1x7x5_u8": ((1, 7), 5, "uint8", 0, False, "uint8", 0),
    "7x13x17_u8_zp128": ((7, 13), 17, "uint8", 128, False, "uint8", 128),
    "13x64x33_s8": ((13, 64), 33, "int8", -3, False, "int8", 5),
    "batch_2x5x33x9_int16w": ((2, 5, 33), 9, "uint8", 255, True, "uint8", 7),
    "6x256x40_s8_int16w": ((6, 256), 40, "int8", 100, True, "int8", -20),
    "1x600x16_u8_long_k": ((1, 600), 16, "uint8", 17, False, "uint8", 0),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(MATMULS))
def test_qmatmul_kernel_exact(case: str, target: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(sorted(MATMULS).index(case))
    args, attrs, expect, wp = _matmul_case(rng, *MATMULS[case])
    assert wp.dtype == (np.int16 if MATMULS[case][4] else np.int8)
    got = _run("qmatmul", args, attrs, tmp_path, target)
    np.testing.assert_array_equal(got, expect)
    info = np.iinfo(MATMULS[case][5])
    assert len(np.unique(got)) > 3 and ((got == info.max) | (got == info.min)).any()


def _conv_case(rng, b, c, h, w, o, k, s, p, xd, xz, wide):
    xi = np.iinfo(xd)
    x = rng.integers(xi.min, xi.max + 1, (b, c, h, w)).astype(xd)
    lim = 255 if wide else 127
    wd = rng.integers(-lim, lim + 1, (o, c, k, k))
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    mult = rng.uniform(2e-5, 3e-4, o).astype(np.float32)
    pads = (p, p, p + (1 if s > 1 else 0), p)          # an asymmetric pad too
    xp = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - k) // s + 1
    ow = (w + pads[1] + pads[3] - k) // s + 1
    acc = np.zeros((b, o, oh, ow), np.int64)
    for ky in range(k):
        for kx in range(k):
            patch = xp[:, :, ky:ky + s * (oh - 1) + 1:s, kx:kx + s * (ow - 1) + 1:s]
            acc += np.einsum("nchw,oc->nohw", patch, wd[:, :, ky, kx])
    acc += bias.reshape(1, o, 1, 1)
    expect = _requant(acc, mult.reshape(1, o, 1, 1), 3, "uint8")
    wk = pack_conv_weights(wd)
    args = [x, wk, np.array(xz, np.int32), bias, mult, np.array(3, np.float32)]
    attrs = dict(out_channels=o, kernel=(k, k), strides=(s, s), padding=pads, dtype="uint8")
    return args, attrs, expect


CONVS = {   # batch, C, H, W, O, k, stride, pad, x dtype, x zp, int16 weights
    "3x3_s1_p1_odd_channels": (1, 3, 9, 11, 5, 3, 1, 1, "uint8", 128, False),
    "3x3_s2_batch2_13_out": (2, 8, 10, 10, 13, 3, 2, 1, "uint8", 0, False),
    "1x1_s1_resnet_like": (1, 32, 7, 7, 24, 1, 1, 0, "uint8", 3, False),
    "1x1_s2_downsample": (1, 5, 8, 9, 7, 1, 2, 0, "int8", -5, True),
    "7x7_s2_p3_stem": (1, 3, 20, 18, 8, 7, 2, 3, "int8", 10, False),
    "3x3_s1_p0_int16w": (1, 6, 6, 6, 12, 3, 1, 0, "uint8", 200, True),
    # a 1x1 image (squeeze-and-excitation): the matrix-vector kernel (_emit_vector); names
    # sorted after the others keep their seeds
    "se_1x1_image_batch2": (2, 37, 1, 1, 17, 1, 1, 0, "uint8", 3, False),
    "se_1x1_image_int16w": (1, 9, 1, 1, 8, 1, 1, 0, "int8", -5, True),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CONVS))
def test_qconv2d_kernel_exact(case: str, target: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(sorted(CONVS).index(case) + 10)
    args, attrs, expect = _conv_case(rng, *CONVS[case])
    got = _run("qconv2d", args, attrs, tmp_path, target)
    np.testing.assert_array_equal(got, expect)
    assert len(np.unique(got)) > 3


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_integer_kernels_threads(threads: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    args, attrs, expect, _ = _matmul_case(rng, (64, 96), 70, "uint8", 128, False, "uint8", 128)
    np.testing.assert_array_equal(_run("qmatmul", args, attrs, tmp_path, "host", threads),
                                  expect)
    args, attrs, expect = _conv_case(rng, 2, 16, 14, 14, 32, 3, 1, 1, "uint8", 128, False)
    np.testing.assert_array_equal(_run("qconv2d", args, attrs, tmp_path, "host", threads),
                                  expect)


def test_weight_packing_round_trips() -> None:
    rng = np.random.default_rng(3)
    wd = rng.integers(-255, 256, (13, 7))
    wp = pack_weights(wd)
    assert wp.dtype == np.int16 and wp.shape == (1, 7, 8, 2)
    np.testing.assert_array_equal(unpack_weights(wp, 13, 7), wd)
    wc = rng.integers(-128, 128, (13, 5, 3, 2))
    wk = pack_conv_weights(wc)
    assert wk.dtype == np.int8 and wk.shape == (3, 3 * 2 * 3, 6, 2)
    np.testing.assert_array_equal(unpack_conv_weights(wk, 13, 5, 3, 2), wc)


def _object(target: str) -> bytes:
    rng = np.random.default_rng(0)
    args, attrs, _, _ = _matmul_case(rng, (4, 20), 12, "uint8", 128, False, "uint8", 0)
    mod = run_pipeline(build_op_module("qmatmul", args, MASK, **attrs), DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    code = compile_prim_funcs(funcs, resolve_target(target))
    assert list(code.kernels) == ["qmatmul"]
    return code


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4", "x86-64-v2", "aarch64"])
def test_integer_kernel_code_per_target(target: str) -> None:
    """The AVX2 levels call vpmaddwd; every other level (x86-64-v2, aarch64) gets the portable
    pair product, compiled without libcalls (compile_prim_funcs refuses imports): on SSE2 LLVM
    turns it into pmaddwd (66 [REX] 0F F5)."""
    code = _object(target)
    assert code.object_code
    if target in ("x86-64-v3", "x86-64-v4"):
        assert "llvm.x86.avx2.pmadd.wd" in code.llvm_ir
    if target == "aarch64":
        assert "llvm.x86" not in code.llvm_ir
    if target == "x86-64-v2":
        assert re.search(rb"\x66[\x40-\x4f]?\x0f\xf5", code.object_code)   # [REX] pmaddwd


@pytest.mark.skipif(not X86 or "avx2" not in host_features(), reason="runs AVX2 code")
def test_host_level_uses_vpmaddwd(tmp_path: Path) -> None:
    """Where the host has AVX2 its bundle's integer kernel is the vpmaddwd one (it ran in the
    tests above); where it also has AVX-512 VNNI (the x86-64-v4+vnni level and above), the
    vpdpbusd one."""
    ir = _object("host").llvm_ir
    if "avx512_vnni" in host_features():
        assert "llvm.x86.avx512.vpdpbusd" in ir and "llvm.x86.avx2.pmadd.wd" not in ir
    else:
        assert "llvm.x86.avx2.pmadd.wd" in ir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("relu", [False, True])
def test_float_output_exact(relu: bool, target: str, tmp_path: Path) -> None:
    """dtype float32 (mlcpack's --quantize int8 graphs): float32(acc + bias) * mult + offset
    [relu], bit for bit as numpy computes it in float32 (no fused multiply-add)."""
    rng = np.random.default_rng(7)
    args, attrs, _, _ = _matmul_case(rng, (5, 37), 19, "uint8", 121, False, "uint8", 0)
    npn = args[3].shape[0]
    args[5] = rng.normal(0, 0.5, npn).astype(np.float32)
    attrs.update(dtype="float32", relu=relu)
    x, wp, xz, bias, mult, off = args
    from mlcpack.packager.ops.qlinear import unpack_weights as unpack
    acc = (x.astype(np.int64) - int(xz)) @ unpack(wp, 37, 19) + bias[:19]
    expect = acc.astype(np.int32).astype(np.float32) * mult[:19] + off[:19]
    expect = np.maximum(expect, np.float32(0)) if relu else expect
    got = _run("qmatmul", args, attrs, tmp_path, target)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expect)

    args, attrs, _ = _conv_case(rng, 1, 5, 9, 9, 11, 3, 1, 1, "uint8", 100, False)
    args[5] = rng.normal(0, 0.5, 11).astype(np.float32)
    attrs.update(dtype="float32", relu=relu)
    from mlcpack.packager.ops.qlinear import qconv2d
    expect = qconv2d(*args, **attrs)
    got = _run("qconv2d", args, attrs, tmp_path, target)
    np.testing.assert_array_equal(got, expect)
    assert (got == 0).any() == relu or not relu

    args, attrs, _ = _conv_case(rng, 2, 13, 1, 1, 7, 1, 1, 0, "uint8", 100, False)   # 1x1 image
    args[5] = rng.normal(0, 0.5, 7).astype(np.float32)
    attrs.update(dtype="float32", relu=relu)
    (tmp_path / "image1").mkdir()
    got = _run("qconv2d", args, attrs, tmp_path / "image1", target)
    np.testing.assert_array_equal(got, qconv2d(*args, **attrs))


def test_integer_kernels_on_aarch64_under_qemu(tmp_path: Path) -> None:
    """The integer kernels compiled for aarch64+dotprod (sdot for int8 weights, the pair
    product for int16 ones) and run by the copied runtime under qemu, bit for bit against
    numpy: qmatmul (uint8 and int8 x, int8 and int16 weights) and qconv2d (a strided 3x3 with
    odd channels, uint8 x; a 3x3 with int8 x)."""
    from arm64_root import arm64_root_or_fail, run_bundles
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import elf

    if elf._real_arch() != "x86_64":
        pytest.skip("emulates aarch64 on an x86-64 host")
    rng = np.random.default_rng(21)
    cases = {}
    args, attrs, expect, _ = _matmul_case(rng, (5, 37), 19, "uint8", 128, False, "uint8", 3)
    cases["mm"] = ("qmatmul", args, attrs, expect)
    args, attrs, expect, _ = _matmul_case(rng, (3, 21), 11, "int8", -7, True, "int8", -2)
    cases["mm_s8_int16w"] = ("qmatmul", args, attrs, expect)
    args, attrs, expect = _conv_case(rng, 2, 5, 9, 10, 13, 3, 2, 1, "uint8", 90, False)
    cases["conv"] = ("qconv2d", args, attrs, expect)
    args, attrs, expect = _conv_case(rng, 1, 6, 8, 9, 7, 3, 1, 1, "int8", -5, False)
    cases["conv_s8"] = ("qconv2d", args, attrs, expect)
    bundles = {}
    for name, (op, args, attrs, _expect) in cases.items():
        path = tmp_path / f"{name}.mlc"
        export_module(build_op_module(op, args, MASK, **attrs), path,
                      ExportOptions(target="aarch64+dotprod", check=False))
        bundles[name] = (path, {"x0": args[0]})
    report, got = run_bundles(arm64_root_or_fail(), tmp_path, Path(__file__).resolve().parents[2],
                              bundles)
    assert report["machine"] == "aarch64"
    for name, (_, _, _, expect) in cases.items():
        np.testing.assert_array_equal(got[name]["y"], expect, err_msg=name)


@pytest.mark.skipif(not X86 or "avx2" not in host_features(), reason="runs both x86 variants")
def test_fat_bundle_on_a_simulated_sse_only_host(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One bundle with x86-64-v2 and -v3 code: a host without AVX2 (MLCPACK_CPU_FEATURES
    simulates one) runs the portable pair-product variant, an AVX2 host the vpmaddwd one; both
    bit for bit."""
    from conftest import X86_V2, X86_V3
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    rng = np.random.default_rng(33)
    args, attrs, expect = _conv_case(rng, 1, 7, 12, 12, 10, 3, 1, 1, "uint8", 128, False)
    path = tmp_path / "fat.mlc"
    export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                  ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    for flags in (X86_V2, X86_V3):
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        with load(path) as model:
            np.testing.assert_array_equal(model.run({"x0": args[0]})["y"], expect)


def _vnni_target():
    from dataclasses import replace
    base = resolve_target("x86-64-v4")
    return replace(base, llvm_features=base.llvm_features + ",+avx512vnni")


@pytest.mark.parametrize("case", ["u8_odd", "s8_even"])
def test_vnni_qmatmul_compiles_and_where_possible_runs(case: str) -> None:
    """The AVX-512 VNNI qmatmul (vpdpbusd) is emitted only for a target whose LLVM features
    name avx512vnni (no level does yet: a hand-made one here). It is compiled here and checked
    for the instruction; it runs (JIT, against numpy) only on a CPU with avx512_vnni, which
    this machine is not."""
    import ctypes

    import llvmlite.binding as llvm

    rng = np.random.default_rng(9)
    shape, n, xd, xz = ((7, 29), 21, "uint8", 131) if case == "u8_odd" else ((13, 64), 40,
                                                                              "int8", -9)
    args, attrs, expect, _ = _matmul_case(rng, shape, n, xd, xz, False, "uint8", 5)
    mod = run_pipeline(build_op_module("qmatmul", args, MASK, **attrs), DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    code = compile_prim_funcs(funcs, _vnni_target())
    assert "vpdpbusd" in code.llvm_ir
    plain = compile_prim_funcs(funcs, resolve_target("x86-64-v4"))
    assert "vpdpbusd" not in plain.llvm_ir
    if not X86 or "avx512_vnni" not in host_features():
        return   # nothing more can be checked on this CPU
    info = code.kernels["qmatmul"]
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(code.llvm_ir)
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten())
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        engine.get_function_address(info.symbol))
    # the constants in the pipeline's order are the op's arguments; x first
    y = np.zeros(expect.shape, expect.dtype)
    work = np.zeros(info.workspace_bytes + 64, np.uint8)
    ws = work.ctypes.data + (-work.ctypes.data % 64)
    arrays = [np.ascontiguousarray(a) for a in args]
    ptrs = (ctypes.c_void_p * 8)(*([a.ctypes.data for a in arrays] + [y.ctypes.data, ws]))
    kernel(ctypes.cast(ptrs, ctypes.c_void_p), 0, 1)
    np.testing.assert_array_equal(y, expect)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(MATMULS))
def test_vnni_qmatmul_emulated_exact(case: str, threads: int, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The VNNI qmatmul's data path (uint8 packing with the +128 shift for int8 x, k-quads
    interleaved from the bundle's k-pair panels, column sums, zero-point correction, tails,
    task split) with vpdpbusd written in portable IR (MLCPACK_VNNI_EMULATE=1), so it runs on
    this CPU: bit for bit against numpy. int16 weights keep the vpmaddwd kernel."""
    monkeypatch.setenv("MLCPACK_VNNI_EMULATE", "1")
    rng = np.random.default_rng(sorted(MATMULS).index(case))
    args, attrs, expect, _ = _matmul_case(rng, *MATMULS[case])
    if case == "1x600x16_u8_long_k":
        args[0] = np.repeat(args[0], 40, axis=0)          # enough work for the task split
        expect = np.repeat(expect, 40, axis=0)
    np.testing.assert_array_equal(_run("qmatmul", args, attrs, tmp_path, "host", threads),
                                  expect)


@pytest.mark.parametrize("xd,xz", [("uint8", 131), ("int8", -7)])
def test_qmatmul_kernel_weight_offset(xd: str, xz: int, tmp_path: Path) -> None:
    """uint8 weights minus a zero point (range 255, beyond int8) packed int8 with
    ``w_offset`` (pack_weights_offset), the kernel adding w_offset * sum_k (x - x_zp) back per
    row: exact against numpy, float32 and uint8 results, 1 and 2 threads, odd K and N."""
    from mlcpack.packager.ops.qlinear import pack_weights_offset

    rng = np.random.default_rng(11)
    m, k, n = 9, 77, 45
    info = np.iinfo(xd)
    x = rng.integers(info.min, info.max + 1, (m, k)).astype(xd)
    wd = rng.integers(0, 256, (k, n)) - 119
    wp, c = pack_weights_offset(wd)
    assert wp.dtype == np.int8 and c != 0
    np.testing.assert_array_equal(unpack_weights(wp, k, n).astype(np.int64) + c, wd)
    npn = wp.shape[0] * 8
    bias = np.pad(rng.integers(-3000, 3000, n).astype(np.int32), (0, npn - n))
    mult = np.pad((rng.uniform(0.5, 1.5, n) * 1e-4).astype(np.float32), (0, npn - n))
    acc = (x.astype(np.int64) - xz) @ wd + bias[:n]
    for dtype, yz in (("float32", np.zeros(npn, np.float32)), ("uint8", np.array(3, np.float32))):
        args = [x, wp, np.array(xz, np.int32), bias, mult, yz]
        for threads in (1, 2):
            (tmp_path / f"{dtype}{threads}").mkdir()
            got = _run("qmatmul", args, {"n": n, "dtype": dtype, "w_offset": c},
                       tmp_path / f"{dtype}{threads}", "host", threads)
            if dtype == "float32":
                want = acc.astype(np.int32).astype(np.float32) * mult[:n]
            else:
                want = _requant(acc, mult[:n], 3.0, "uint8")
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype}, {threads} threads")


LUT_CONVS = {   # x shape, O, kernel, stride, pad, dtype, table rows, threads
    "rows_of_70_int8": ((1, 5, 9, 70), 6, 3, 1, 1, "int8", 6, 1),
    "channels_of_42_uint8_one_row": ((1, 8, 6, 7), 7, 1, 1, 0, "uint8", 1, 2),
    "channels_of_64_uint8": ((2, 4, 8, 8), 9, 1, 1, 0, "uint8", 9, 1),
    "vector_1x1_image_int8": ((2, 40, 1, 1), 50, 1, 1, 0, "int8", 50, 1),     # _emit_vector
}


@pytest.mark.parametrize("case", list(LUT_CONVS))
def test_qconv2d_table_vectorized(case: str, tmp_path: Path) -> None:
    """A lut8 table folded into qconv2d with rows (or whole channels, where the staging rows
    are the output's) of 32 bytes or more: looked up 32 at a time with vpshufb on AVX2 (the
    last vector overlapping), int8 and uint8 results, exact against numpy."""
    from mlcpack.packager.ops.qlinear import lut8, qconv2d

    shape, o, k, s, p, dtype, rows, threads = LUT_CONVS[case]
    rng = np.random.default_rng(sorted(LUT_CONVS).index(case) + 40)
    x = rng.integers(0, 256, shape).astype(np.uint8)
    wd = rng.integers(-127, 128, (o, shape[1], k, k))
    args = [x, pack_conv_weights(wd), np.array(120, np.int32),
            rng.integers(-3000, 3000, o).astype(np.int32),
            rng.uniform(1e-4, 1e-3, o).astype(np.float32), np.array(-3 if dtype == "int8" else 100,
                                                                   np.float32),
            rng.integers(0, 256, (rows, 256)).astype(np.uint8)]
    attrs = dict(out_channels=o, kernel=(k, k), strides=(s, s), padding=(p,) * 4, dtype=dtype)
    expect = lut8(qconv2d(*args[:6], **attrs), args[6], 1 if rows > 1 else -1)
    mod = build_op_module("qconv2d", args, [False] + [True] * 6, **attrs)
    got = compile_and_run(mod, {"x0": x}, tmp_path, target="host", threads=threads)["y"]
    np.testing.assert_array_equal(got, expect)
    assert len(np.unique(got)) > 40
