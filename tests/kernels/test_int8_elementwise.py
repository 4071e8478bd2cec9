"""Integer elementwise kernels (codegen/qelementwise.py) for ``qbinary`` (QLinearAdd /
QLinearMul), ``qgavgpool`` (QLinearGlobalAveragePool), ops/qelementwise.py, and ``lut8``
(ops/qlinear.py, AVX2 levels): bit for bit
against exact numpy integer math on this host's level and on x86-64-v2 (a per-channel gate
over rows with a partial last vector, same-shape operands, one value, int8 and uint8 in and
out, saturation at both ends), their code on every level, the same kernels on aarch64 under
qemu, and the fusion of ONNX Runtime's quantized models (QDQ and QOperator) into them, within
one quantization step of ORT."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import SLOW
from helpers import build_op_module, compile_and_run, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.ops.qlinear import lut8
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

X86 = platform.machine().lower() in ("x86_64", "amd64")
TARGETS = ["host"] + (["x86-64-v2"] if X86 else [])
F32 = np.float32


def _ints(rng, dtype: str, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _binary_case(rng, a_shape, b_shape, kind, ad, bd, yd):
    """(args, attrs, expected) of a qbinary; expected from int64 products and float32
    operations in the op's order."""
    a, b = _ints(rng, ad, a_shape), _ints(rng, bd, b_shape)
    # the first two outputs saturate, at the top and at the bottom
    a.flat[:2] = np.iinfo(ad).max, np.iinfo(ad).min
    b.flat[0] = np.iinfo(bd).max
    if b.size > 1:
        b.flat[1] = np.iinfo(bd).min
    za = 131 if ad == "uint8" else -3
    zb = 127 if bd == "uint8" else -1
    yz = 7 if yd == "uint8" else -5
    da, db = a.astype(np.int64) - za, b.astype(np.int64) - zb
    if kind == "mul":
        ma, mb = F32(0.0231), F32(0)
        f = (da * db).astype(F32) * ma
    else:
        ma, mb = F32(1.37), F32(0.61)
        f = da.astype(F32) * ma + db.astype(F32) * mb
    info = np.iinfo(yd)
    expect = np.clip(np.round(np.broadcast_to(f, a_shape)) + F32(yz), info.min, info.max)
    args = [a, b, np.array(za, np.int32), np.array(zb, np.int32), np.array(ma, F32),
            np.array(mb, F32), np.array(yz, F32)]
    return args, {"kind": kind, "dtype": yd}, expect.astype(yd)


BINARY = {   # a shape, b shape, kind, a dtype, b dtype, y dtype
    "mul_gate_rows_of_49": ((1, 5, 7, 7), (1, 5, 1, 1), "mul", "uint8", "uint8", "uint8"),
    "add_same_shape_int8": ((2, 3, 5, 7), (2, 3, 5, 7), "add", "int8", "int8", "uint8"),
    "mul_one_value_to_int8": ((3, 37), (1,), "mul", "uint8", "int8", "int8"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(BINARY))
def test_qbinary_kernel_exact(case: str, target: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(sorted(BINARY).index(case))
    args, attrs, expect = _binary_case(rng, *BINARY[case])
    mod = build_op_module("qbinary", args, [False, False] + [True] * 5, **attrs)
    got = compile_and_run(mod, {"x0": args[0], "x1": args[1]}, tmp_path, target=target)["y"]
    np.testing.assert_array_equal(got, expect)
    info = np.iinfo(expect.dtype)
    assert (expect == info.min).any() and (expect == info.max).any()


def _gap_case(rng, shape, xd, yd):
    x = _ints(rng, xd, shape)
    zx = 11 if xd == "uint8" else -3
    yz = 128 if yd == "uint8" else 2
    acc = (x.astype(np.int64) - zx).sum(axis=(2, 3), keepdims=True).astype(np.int32)
    mult = F32(0.9 / np.prod(shape[2:]))
    info = np.iinfo(yd)
    expect = np.clip(np.round(acc.astype(F32) * mult) + F32(yz), info.min, info.max)
    return ([x, np.array(zx, np.int32), np.array(mult, F32), np.array(yz, F32)],
            {"dtype": yd}, expect.astype(yd))


GAP = {"planes_of_49_tail_of_3": ((1, 11, 7, 7), "uint8", "uint8"),
       "int8_batch2_planes_of_20": ((2, 8, 4, 5), "int8", "int8")}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(GAP))
def test_qgavgpool_kernel_exact(case: str, target: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(7 + sorted(GAP).index(case))
    args, attrs, expect = _gap_case(rng, *GAP[case])
    mod = build_op_module("qgavgpool", args, [False, True, True, True], **attrs)
    got = compile_and_run(mod, {"x0": args[0]}, tmp_path, target=target)["y"]
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64"])
def test_code_per_target(target: str) -> None:
    """Every level compiles both kernels (vector code, not the generic loop nest); on AVX2
    levels the rounding is vcvtps2dq and two vectors are stored with the saturating packs."""
    rng = np.random.default_rng(0)
    args, attrs, _ = _binary_case(rng, *BINARY["mul_gate_rows_of_49"])
    mod = run_pipeline(build_op_module("qbinary", args, [False, False] + [True] * 5, **attrs),
                       DEFAULT_PIPELINE, options=UNPACKED)
    gargs, gattrs, _ = _gap_case(rng, *GAP["planes_of_49_tail_of_3"])
    gmod = run_pipeline(build_op_module("qgavgpool", gargs, [False, True, True, True], **gattrs),
                        DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for m in (mod, gmod) for f in m.functions.values() if isinstance(f, PrimFunc)]
    code = compile_prim_funcs(funcs, resolve_target(target))
    assert sorted(code.kernels) == ["qbinary", "qgavgpool"]
    text = str(code.llvm_ir)
    assert "mul <8 x i32>" in text and "llvm.vector.reduce.add.v8i32" in text
    if target in ("x86-64-v3", "x86-64-v4"):
        assert "llvm.x86.avx.cvt.ps2dq.256" in text and "llvm.x86.avx2.packuswb" in text
    x = _ints(rng, "uint8", (1, 3, 5, 13))
    table = _ints(rng, "uint8", (3, 256))
    lmod = run_pipeline(build_op_module("lut8", [x, table], [False, True], axis=1),
                        DEFAULT_PIPELINE, options=UNPACKED)
    lcode = compile_prim_funcs([f for f in lmod.functions.values() if isinstance(f, PrimFunc)],
                               resolve_target(target))
    # the table kernel on every level, its 32-byte lookups on AVX2, 64-byte ones on AVX-512
    assert list(lcode.kernels) == ["lut8"]
    assert ("llvm.x86.avx2.pshuf.b" in str(lcode.llvm_ir)) == (target == "x86-64-v3")
    assert ("llvm.x86.avx512.pshuf.b.512" in str(lcode.llvm_ir)) == (target == "x86-64-v4")


@pytest.mark.skipif(not SLOW, reason="MLCPACK_SLOW=1: a qemu run (~20-75 s); "
                    "test_code_per_target[aarch64] compiles both kernels in the default run")
def test_kernels_on_aarch64_under_qemu(tmp_path: Path) -> None:
    """Both kernels compiled for aarch64 (NEON: the portable rounding) and run by the copied
    runtime under qemu, bit for bit against numpy."""
    from arm64_root import arm64_root_or_fail, run_bundles
    from mlcpack.runtime import elf

    if elf._real_arch() != "x86_64":
        pytest.skip("emulates aarch64 on an x86-64 host")
    rng = np.random.default_rng(41)
    b_args, b_attrs, b_expect = _binary_case(rng, *BINARY["mul_gate_rows_of_49"])
    g_args, g_attrs, g_expect = _gap_case(rng, *GAP["int8_batch2_planes_of_20"])
    bundles = {}
    for name, op, args, mask, attrs in (
            ("qbinary", "qbinary", b_args, [False, False] + [True] * 5, b_attrs),
            ("qgavgpool", "qgavgpool", g_args, [False, True, True, True], g_attrs)):
        path = tmp_path / f"{name}.mlc"
        export_module(build_op_module(op, args, mask, **attrs), path,
                      ExportOptions(target="aarch64", check=False))
        feeds = {f"x{i}": a for i, (a, c) in enumerate(zip(args, mask)) if not c}
        bundles[name] = (path, feeds)
    report, got = run_bundles(arm64_root_or_fail(), tmp_path, Path(__file__).resolve().parents[2],
                              bundles)
    assert report["machine"] == "aarch64"
    np.testing.assert_array_equal(got["qbinary"]["y"], b_expect)
    np.testing.assert_array_equal(got["qgavgpool"]["y"], g_expect)


# ---- ONNX Runtime's quantized models -----------------------------------------------------------

def _se_block(path: Path) -> Path:
    """x [1, 8, 6, 10] -> 1x1 conv + Relu = c; squeeze-and-excitation: GlobalAveragePool(c) ->
    1x1 conv -> HardSigmoid = g; c * g; + c (a residual add); concatenated with c -> y."""
    rng = np.random.default_rng(3)
    f = lambda *s, sd=0.4: rng.normal(0, sd, s).astype(F32)  # noqa: E731
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c0"]), h.make_node("Relu", ["c0"], ["c"]),
             h.make_node("GlobalAveragePool", ["c"], ["p"]),
             h.make_node("Conv", ["p", "w2", "b2"], ["s"]),
             h.make_node("HardSigmoid", ["s"], ["g"], alpha=1 / 6),
             h.make_node("Mul", ["c", "g"], ["m"]), h.make_node("Add", ["m", "c"], ["a"]),
             h.make_node("Concat", ["a", "c"], ["y"], axis=1)]
    inits = {"w1": f(8, 8, 1, 1), "b1": f(8, sd=0.1), "w2": f(8, 8, 1, 1), "b2": f(8, sd=0.1)}
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 6, 10])],
                    [h.make_tensor_value_info("y", T.FLOAT, [1, 16, 6, 10])], inits, path)


@pytest.fixture(scope="module")
def se_models(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("onnxruntime.quantization")
    d = tmp_path_factory.mktemp("se")
    src = _se_block(d / "se.onnx")
    return {"src": src, "QDQ": qm.ort_quantize(src, d / "se_qdq.onnx", "QDQ", per_channel=True),
            "QOperator": qm.ort_quantize(src, d / "se_qop.onnx", "QOperator")}


@pytest.mark.parametrize("mode", ["QDQ", "QOperator"])
def test_ort_quantized_se_block_takes_the_kernels(mode: str, se_models, tmp_path: Path) -> None:
    """The squeeze-and-excitation multiply (a per-channel gate), the residual add and the
    global average pool of ORT's quantized model become qbinary / qgavgpool (no float
    multiply, add or mean left), the concat one of 8-bit values (its inputs requantized by
    tables where their scales differ), and the output is within one output step of ORT's: of the
    QDQ graph as written (ORT's own fused run of it is tens of steps away from its unfused
    one), of ORT's QLinearMul / QLinearAdd / QLinearGlobalAveragePool for QOperator."""
    q = se_models[mode]
    mod, _ = import_onnx(str(q))
    upto = [p.name for p in DEFAULT_PIPELINE].index("fuse_quantized_elementwise") + 1
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:upto], options=UNPACKED)
    ops = [getattr(b.value, "op", "") for b in fused.functions["main"].bindings()]
    assert ops.count("qbinary") == 2 and ops.count("qgavgpool") == 1, ops
    assert not {"multiply", "add", "mean"} & set(ops), ops
    concat = next(b for b in fused.functions["main"].bindings()
                  if getattr(b.value, "op", "") == "concat")
    assert concat.value.type.dtype in ("uint8", "int8")
    feeds = qm.random_feeds(se_models["src"], seed=4)[0]
    export_module(mod, tmp_path / "se.mlc", ExportOptions(target="host", check=False))
    with load(tmp_path / "se.mlc", threads=1) as m:
        got = m.run(feeds)["y"]
    step = qm.output_step(q)
    ref = ort_outputs(q, feeds, threads=1, as_written=mode == "QDQ")["y"]
    assert np.abs(got - ref).max() <= step * 1.001, np.abs(got - ref).max() / step


@pytest.mark.parametrize("target", TARGETS)
def test_lut8_kernel_exact(target: str, tmp_path: Path) -> None:
    """A ``lut8`` with one table row per channel (rows of 44 100 bytes: 1378 32-byte vpshufb
    chunks and 4 bytes one by one on AVX2, byte by byte elsewhere; enough bytes to split the
    rows between threads), on one and two threads, and an int8 one with one row, against
    numpy's indexing."""
    rng = np.random.default_rng(17)
    x = _ints(rng, "uint8", (2, 3, 210, 210))
    table = _ints(rng, "int8", (3, 256))
    mod = build_op_module("lut8", [x, table], [False, True], axis=1)
    for threads in (1, 2):
        got = compile_and_run(mod, {"x0": x}, tmp_path, target=target, threads=threads,
                              name=f"t{threads}.mlc")["y"]
        np.testing.assert_array_equal(got, table[np.arange(3).reshape(1, 3, 1, 1), x])
    xs = _ints(rng, "int8", (5, 41))
    one = _ints(rng, "uint8", (1, 256))
    mod = build_op_module("lut8", [xs, one], [False, True], axis=-1)
    got = compile_and_run(mod, {"x0": xs}, tmp_path, target=target, name="one.mlc")["y"]
    np.testing.assert_array_equal(got, one[0][xs.astype(np.int64) + 128])


def _lut64_model(x: np.ndarray, row: np.ndarray) -> np.ndarray:
    """The AVX-512 lookup of ``_QTable._lut_chunk64`` step by step on a row of bytes: for each
    16-byte piece k of the table, ``vpshufb`` of the piece (in every 128-bit lane) by the low
    nibbles, merged where ``vpcmpeqb`` finds the high nibble k."""
    v = x.view(np.uint8) ^ (0x80 if x.dtype == np.int8 else 0)
    lo, hi = v & 0x0F, v >> 4
    res = np.zeros(v.shape, np.uint8)
    for k in range(16):
        part = row.view(np.uint8)[16 * k:16 * k + 16][lo]     # vpshufb: index bit 7 is 0
        res = np.where(hi == k, part, res)
    return res.view(row.dtype)


@pytest.mark.skipif(not X86, reason="the AVX-512 table kernel is x86-64's")
def test_lut8_avx512_lookup(tmp_path: Path) -> None:
    """x86-64-v4 levels look the table up 64 bytes at a time (``_lut_chunk64``): merge-masked
    ``vpshufb`` on zmm registers (one per 16-byte piece of the row), no blend; rows of 64k + r
    bytes (the r tail bytes one by one), uint8 and int8 x. Run natively bit for bit against
    numpy on one and two threads where the host has AVX-512BW; elsewhere its arithmetic is
    checked with an instruction-by-instruction numpy model."""
    import llvmlite.binding as llvm

    from mlcpack.runtime.cpu import host_features

    rng = np.random.default_rng(23)
    cases = {"uint8": (_ints(rng, "uint8", (1, 3, 7, 45)), _ints(rng, "uint8", (3, 256)), 1),
             "int8": (_ints(rng, "int8", (2, 137)), _ints(rng, "int8", (1, 256)), -1)}
    target = resolve_target("x86-64-v4")
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    for name, (x, table, axis) in cases.items():
        expect = lut8(x, table, axis)
        mod = build_op_module("lut8", [x, table], [False, True], axis=axis)
        funcs = [f for f in run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED)
                 .functions.values() if isinstance(f, PrimFunc)]
        asm = tm.emit_assembly(llvm.parse_assembly(compile_prim_funcs(funcs, target).llvm_ir))
        masked = len(re.findall(r"vpshufb\s+%zmm\d+, %zmm\d+, %zmm\d+ \{%k\d\}", asm))
        assert masked and masked % 16 == 0 and "vpblendvb" not in asm, name
        rows = x.reshape(-1, x.shape[-1]) if axis < 0 else x.reshape(3, -1)
        model = np.stack([_lut64_model(r, table[i if axis >= 0 else 0])
                          for i, r in enumerate(rows)]).reshape(x.shape)
        np.testing.assert_array_equal(model, expect)
        if {"avx512bw", "avx512f"} <= host_features():
            for threads in (1, 2):
                got = compile_and_run(mod, {"x0": x}, tmp_path, target="x86-64-v4",
                                      threads=threads, name=f"{name}{threads}.mlc")["y"]
                np.testing.assert_array_equal(got, expect, err_msg=name)


def _quantize_inputs(scale: float) -> np.ndarray:
    """float32 values at and around every rounding boundary of x / scale in the 8-bit range
    (the half-way points k + 0.5 rounded to float32 and 2 ulps either side), zeros, tiny and
    huge values, infinities; 3111 values (a tail past the 32-value steps and the 8-lane
    vectors)."""
    s = F32(scale)
    halves = (np.arange(-300, 300, dtype=np.float64) + 0.5) * float(s)
    at = halves.astype(F32)
    near = [at]
    for d in (1, 2):
        up, down = at.copy(), at.copy()
        for _ in range(d):
            up, down = np.nextafter(up, F32(np.inf)), np.nextafter(down, F32(-np.inf))
        near += [up, down]
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-30, 3e38, -3e38, np.inf, -np.inf],
                       F32)
    x = np.concatenate(near + [special])
    rng = np.random.default_rng(5)
    x = np.concatenate([x, (rng.standard_normal(3111 - x.size) * 200 * s).astype(F32)])
    return rng.permutation(x).reshape(3, 17, 61)


@pytest.mark.parametrize("dtype,scale,zero", [("uint8", 0.0186, 128), ("int8", 0.25, -3)])
def test_quantize_kernel_exact(dtype: str, scale: float, zero: int, tmp_path: Path) -> None:
    """A model input's quantize (float32 to 8 bits, one scale and zero point): the AVX2 kernel
    (codegen/qelementwise.py ``_QQuantize``) on this host's level equals ops/quant.py's numpy
    definition (float32 x / s, round half to even, + z, saturation) at every rounding
    boundary, ties included (scale 0.25: the half-way points are exact)."""
    from mlcpack.packager.ops.quant import quantize
    x = _quantize_inputs(scale)
    s, z = np.array(scale, F32), np.array(zero, dtype)
    expect = quantize(x, s, z, dtype)
    mod = build_op_module("quantize", [x, s, z], [False, True, True], dtype=dtype)
    got = compile_and_run(mod, {"x0": x}, tmp_path)["y"]
    np.testing.assert_array_equal(got, expect)
    info = np.iinfo(dtype)
    assert (expect == info.min).any() and (expect == info.max).any()
    if scale == 0.25:   # ties to even on both sides of zero
        assert quantize(np.array([0.125, 0.375, -0.125], F32), s, z, dtype).tolist() == \
            [zero, zero + 2, zero]


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3"])
def test_quantize_kernel_code(target: str) -> None:
    """The quantize kernel on AVX2 levels (vdivps, vcvtps2dq, the saturating packs), the
    generic loop nest elsewhere."""
    x = np.zeros((1, 3, 8, 9), F32)
    mod = run_pipeline(build_op_module("quantize", [x, np.array(0.02, F32),
                                                    np.array(128, np.uint8)],
                                       [False, True, True], dtype="uint8"),
                       DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    text = str(compile_prim_funcs(funcs, resolve_target(target)).llvm_ir)
    avx2 = "llvm.x86.avx2.packuswb" in text and "llvm.x86.avx.cvt.ps2dq.256" in text
    assert avx2 == (target == "x86-64-v3")
