"""The AVX-512 VNNI integer kernels (codegen/qgemm.py, level ``x86-64-v4+vnni``) on any host.

- The level: a bundle made for it needs avx512_vnni (refused on a plain v4 host, picked over
  v4 where the flag is), portable bundles include it on a VNNI host (flags pinned).
- The emitted code: ``qconv2d`` and ``qmatmul`` compiled for the level have ``vpdpbusd`` in
  their assembly; for plain v4 they do not.
- The arithmetic: an instruction-exact numpy model of the VNNI convolution (the same uint8
  channel-quad planes, the same int8 weight quads regrouped from the bundle's k-pairs, one
  vpdpbusd per step in the kernel's order with int32 wrap-around, the zero-point correction,
  the float32 requantize with the 1.5 * 2**23 rounding) against exact integer math and ONNX
  Runtime's ConvInteger; the kernel itself with vpdpbusd written in portable IR
  (``MLCPACK_VNNI_EMULATE=1``), bit for bit.
- The native run: only on a CPU with avx512_vnni (skipped elsewhere, saying so). Debian's
  qemu 7.2 cannot run AVX-512, so this host (AVX2 only) cannot run it.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import X86_V3, X86_V4

from helpers import build_op_module
from mlcpack.packager.ops.qlinear import CONV_ROWS, PANEL, unpack_conv_weights
from mlcpack.runtime.cpu import host_features
from test_int8_gemm import MASK, _conv_case, _matmul_case, _requant, _run

X86 = platform.machine().lower() in ("x86_64", "amd64")
X86_VNNI = X86_V4 + ",avx512_vnni"
_MAGIC = np.float32(12582912.0)


# ---- the level --------------------------------------------------------------------------------

def test_vnni_level_is_recorded_checked_and_picked(monkeypatch) -> None:
    from mlcpack.packager.codegen.contraction.geometry import vector_width
    from mlcpack.packager.codegen.target import portable_levels, resolve_target
    from mlcpack.runtime.cpu import CpuFeatureError, best_level, check_supported, pick_variant

    t = resolve_target("x86-64-v4+vnni")
    assert "+avx512vnni" in t.llvm_features and "avx512_vnni" in t.required_flags
    assert vector_width(t.name) == 16
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    variants = [{"arch": "x86_64", "level": lv, "features": []}
                for lv in ("x86-64-v3", "x86-64-v4+vnni", "x86-64-v4")]
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V4)
    assert best_level() == "x86-64-v4"
    assert pick_variant(variants) == 2
    with pytest.raises(CpuFeatureError, match=r"needs avx512_vnni\); this CPU is x86-64-v4"):
        check_supported("x86_64", "x86-64-v4+vnni", [], "m.mlc")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_VNNI)
    assert best_level() == "x86-64-v4+vnni"
    assert pick_variant(variants) == 1
    assert portable_levels() == ["x86-64-v2", "x86-64-v3", "x86-64-v4", "x86-64-v4+vnni"]
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3 + ",avx512_vnni")   # no AVX-512F
    assert pick_variant(variants) == 0


# ---- the emitted code -------------------------------------------------------------------------

def _assembly(op: str, args, attrs, level: str, emulate: bool = False) -> tuple[str, object]:
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import UNPACKED
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod = run_pipeline(build_op_module(op, args, MASK, **attrs), DEFAULT_PIPELINE,
                       options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    target = resolve_target(level)
    code = compile_prim_funcs(funcs, target, options=UNPACKED.replace(vnni_emulate=emulate))
    assert list(code.kernels) == [op]
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    return tm.emit_assembly(llvm.parse_assembly(code.llvm_ir)), code


@pytest.mark.parametrize("op", ["qconv2d", "qmatmul"])
def test_vnni_level_emits_vpdpbusd(op: str) -> None:
    rng = np.random.default_rng(4)
    if op == "qconv2d":
        args, attrs, _ = _conv_case(rng, 1, 6, 8, 9, 7, 3, 2, 1, "int8", -3, False)
    else:
        args, attrs, _, _ = _matmul_case(rng, (5, 37), 19, "uint8", 7, False, "uint8", 3)
    asm, code = _assembly(op, args, attrs, "x86-64-v4+vnni")
    # both on 512-bit vectors (tests/kernels/test_int8_conv_zmm.py; the matmul's tile rows
    # are two zmm of two panels each)
    assert re.search(r"\bvpdpbusd\s+%zmm", asm)
    assert not re.search(r"\bvpdpbusd\s+%ymm", asm)
    assert code.object_code
    plain, plain_code = _assembly(op, args, attrs, "x86-64-v4")
    assert "vpdpbusd" not in plain and "vpmaddwd" in plain
    # the emulated kernel the tests below run is the VNNI one (its workspace layout), on AVX2
    _, emulated = _assembly(op, args, attrs, "x86-64-v3", emulate=True)
    ws = {c.kernels[op].workspace_bytes for c in (code, plain_code, emulated)}
    assert emulated.kernels[op].workspace_bytes == code.kernels[op].workspace_bytes
    assert len(ws) == 2


# ---- an instruction-exact numpy model of the VNNI convolution ---------------------------------

def vnni_conv_model(x, wk, xz, bias, mult, yz, attrs, nv: int = 2):
    """qconv2d as the VNNI kernel computes it, step for step (uint8 results)."""
    b, c, h, w = x.shape
    o = attrs["out_channels"]
    kh, kw = attrs["kernel"]
    sh, sw = attrs["strides"]
    pt, pl, pb, pr = attrs["padding"]
    hp, wpd = h + pt + pb, w + pl + pr
    oh, ow = (hp - kh) // sh + 1, (wpd - kw) // sw + 1
    hq, wq = -(-hp // sh), -(-wpd // sw)
    cp, cg = -(-c // 2), -(-c // 4)
    phases = sorted({(ky % sh, kx % sw) for ky in range(kh) for kx in range(kw)})
    taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
    lanes = PANEL * nv
    qpad = -(-(oh * wq) // lanes) * lanes
    offmax = ((kh - 1) // sh) * wq + (kw - 1) // sw
    prow = max(hq, -(-(qpad + offmax) // wq))
    psz = prow * wq
    shift = 128 if x.dtype == np.int8 else 0
    zpq = int(xz) + shift
    # weights: the bundle's int8 k-pairs [ot][taps * cp][6][2] -> quads [ot][taps * cg][6][4]
    ot = wk.shape[0]
    pairs = wk.reshape(ot, len(taps), cp, CONV_ROWS, 2)
    pairs = np.concatenate([pairs, np.zeros((ot, len(taps), 2 * cg - cp, CONV_ROWS, 2),
                                            np.int8)], axis=2)
    quads = pairs.reshape(ot, len(taps), cg, 2, CONV_ROWS, 2).transpose(0, 1, 2, 4, 3, 5)
    quads = quads.reshape(ot, len(taps) * cg, CONV_ROWS, 4)
    wsum = quads.astype(np.int32).sum(axis=(1, 3)).reshape(-1)          # per output channel
    wquad = quads.transpose(0, 2, 1, 3).reshape(ot * CONV_ROWS, len(taps) * cg, 4)
    table = [(phases.index((ky % sh, kx % sw)) * cg + q) * psz + (ky // sh) * wq + kx // sw
             for ky, kx in taps for q in range(cg)]
    out = np.zeros((b, o, oh, ow), np.uint8)
    lo, hi = np.float32(0 - yz), np.float32(255 - yz)
    for n in range(b):
        xu = (x[n].astype(np.int32) + shift).astype(np.uint8)        # int8 x ^ 0x80
        xp = np.full((4 * cg, prow * sh + kh, wq * sw + kw), zpq, np.uint8)
        xp[:c, pt:pt + h, pl:pl + w] = xu
        planes = np.zeros((len(phases), cg, psz, 4), np.uint8)
        for pi, (py, px) in enumerate(phases):
            sub = xp[:, py::sh, px::sw][:, :prow, :wq]
            grid = np.full((4 * cg, prow, wq), zpq, np.uint8)
            grid[:, :sub.shape[1], :sub.shape[2]] = sub
            planes[pi] = grid.reshape(cg, 4, psz).transpose(0, 2, 1)
        words = planes.reshape(-1, 4)
        acc = np.zeros((o, qpad), np.int32)
        for j, off in enumerate(table):        # one vpdpbusd per step, wrapping int32 lanes
            a = words[off:off + qpad].astype(np.int64)                   # [q, 4] uint8
            wv = wquad[:o, j].astype(np.int64)                           # [o, 4] int8
            acc = (acc.astype(np.int64) + wv @ a.T).astype(np.int32)
        acc = (acc.astype(np.int64) - zpq * wsum[:o, None]).astype(np.int32)
        f = (acc + bias[:, None]).astype(np.float32) * mult[:, None]
        f = np.minimum(np.maximum(f, lo), hi)
        f = ((f + _MAGIC) - _MAGIC) + np.float32(yz)
        y = f.astype(np.int32).astype(np.uint8)
        out[n] = y[:, :oh * wq].reshape(o, oh, wq)[:, :, :ow]
    return out, acc


def _ort_conv_integer(x, wd, xz, attrs) -> np.ndarray:
    """ONNX Runtime's ConvInteger (u8 x u8: x and w shifted by +128 where int8, exact)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    xu = (x.astype(np.int32) + (128 if x.dtype == np.int8 else 0)).astype(np.uint8)
    xzu = int(xz) + (128 if x.dtype == np.int8 else 0)
    wu = (wd + 128).astype(np.uint8)
    pads = attrs["padding"]
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"],
                            strides=list(attrs["strides"]),
                            pads=[pads[0], pads[1], pads[2], pads[3]])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, xu.shape)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [onnx.numpy_helper.from_array(wu, "w"),
         onnx.numpy_helper.from_array(np.array(xzu, np.uint8), "xz"),
         onnx.numpy_helper.from_array(np.array(128, np.uint8), "wz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": xu})[0]


MODEL_CASES = {   # batch, C, H, W, O, k, stride, pad, x dtype, x zp
    "3x3_s1_p1_c3": (1, 3, 9, 11, 5, 3, 1, 1, "uint8", 128),
    "3x3_s2_c8_o13": (2, 8, 10, 10, 13, 3, 2, 1, "uint8", 0),
    "1x1_c32_o24": (1, 32, 7, 7, 24, 1, 1, 0, "uint8", 3),
    "7x7_s2_p3_s8": (1, 3, 20, 18, 8, 7, 2, 3, "int8", 10),
    "5x5_c6_s8_extremes": (1, 6, 8, 8, 9, 5, 1, 2, "int8", -128),
}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_vnni_conv_model_exact(case: str) -> None:
    """The numpy model of the VNNI kernel equals exact integer math (outputs, with both
    saturation ends reached) and ONNX Runtime's ConvInteger (the int32 sums)."""
    rng = np.random.default_rng(sorted(MODEL_CASES).index(case) + 70)
    args, attrs, expect = _conv_case(rng, *MODEL_CASES[case], False)
    x, wk, xz, bias, mult, yz = args
    if case.endswith("extremes"):       # the largest quads: 255 * 127 * 4 per lane
        wk[:] = np.where(wk >= 0, 127, -128)
        x[:] = np.int8(127)
        o, c, k = attrs["out_channels"], x.shape[1], attrs["kernel"][0]
        wd = unpack_conv_weights(wk, o, c, k, k).astype(np.int64)
        xp = np.pad(x.astype(np.int64) - int(xz), ((0, 0), (0, 0), (2, 2), (2, 2)))
        acc = np.zeros((1, o, 8, 8), np.int64)
        for ky in range(k):
            for kx in range(k):
                acc += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + 8, kx:kx + 8], wd[:, :, ky, kx])
        expect = _requant(acc + bias.reshape(1, o, 1, 1), mult.reshape(1, o, 1, 1), 3, "uint8")
    got, acc_last = vnni_conv_model(x, wk, xz, bias, mult, float(yz), attrs)
    np.testing.assert_array_equal(got, expect)
    o, c, k = attrs["out_channels"], x.shape[1], attrs["kernel"][0]
    wd = unpack_conv_weights(wk, o, c, k, k).astype(np.int32)
    ref = _ort_conv_integer(x[-1:], wd, xz, attrs)[0]
    oh, ow = ref.shape[1:]
    wq = -(-(x.shape[3] + attrs["padding"][1] + attrs["padding"][3]) // attrs["strides"][1])
    mine = acc_last[:, :oh * wq].reshape(o, oh, wq)[:, :, :ow]
    np.testing.assert_array_equal(mine, ref)


# ---- the kernel, vpdpbusd in portable IR ------------------------------------------------------

EMULATED = {   # batch, C, H, W, O, k, stride, pad, x dtype, x zp, threads
    "3x3_s1_p1_c3": (1, 3, 9, 11, 5, 3, 1, 1, "uint8", 128, 1),
    "7x7_s2_p3_s8": (1, 3, 20, 18, 8, 7, 2, 3, "int8", 10, 1),
    "3x3_c16_o32_threads": (2, 16, 14, 14, 32, 3, 1, 1, "int8", -20, 2),
}


@pytest.mark.parametrize("case", list(EMULATED))
def test_vnni_conv_kernel_emulated_exact(case: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The VNNI qconv2d's own code (quad planes, regrouped weights, correction, epilogue,
    task split) with vpdpbusd written in portable IR, run here: bit for bit against numpy
    and the numpy model."""
    monkeypatch.setenv("MLCPACK_VNNI_EMULATE", "1")
    *shape, threads = EMULATED[case]
    rng = np.random.default_rng(sorted(EMULATED).index(case) + 90)
    args, attrs, expect = _conv_case(rng, *shape, False)
    got = _run("qconv2d", args, attrs, tmp_path, "host", threads)
    np.testing.assert_array_equal(got, expect)
    model, _ = vnni_conv_model(*args[:5], float(args[5]), attrs)
    np.testing.assert_array_equal(got, model)
    assert len(np.unique(got)) > 3


@pytest.mark.skipif(not X86 or "avx512_vnni" not in host_features(),
                    reason="runs vpdpbusd natively: needs an x86-64 host with avx512_vnni "
                           "(AVX-512 VNNI, e.g. Zen 4, Ice Lake, Sapphire Rapids)")
def test_vnni_level_runs_natively(tmp_path: Path) -> None:
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    rng = np.random.default_rng(5)
    cases = [("qconv2d",) + _conv_case(rng, 2, 16, 14, 14, 32, 3, 1, 1, "int8", -20, False),
             ("qconv2d",) + _conv_case(rng, 1, 3, 20, 18, 8, 7, 2, 3, "uint8", 10, False),
             ("qmatmul",) + _matmul_case(rng, (13, 64), 40, "int8", -9, False, "uint8", 5)[:3]]
    for i, (op, args, attrs, expect) in enumerate(cases):
        path = tmp_path / f"{i}.mlc"
        export_module(build_op_module(op, args, MASK, **attrs), path,
                      ExportOptions(target="x86-64-v4+vnni", check=False))
        for threads in (1, 2):
            with load(path, threads=threads) as model:
                np.testing.assert_array_equal(model.run({"x0": args[0]})["y"], expect)


@pytest.mark.parametrize("rows,tile", [(40, 10), (25, 9)])
def test_vnni_qmatmul_tile_rows_on_avx512(rows: int, tile: int, tmp_path: Path) -> None:
    """x86-64-v4+vnni has 32 vector registers: qmatmul's VNNI tile takes up to 12 rows (x 2
    panels), the rows split evenly (40 rows: 4 tiles of 10; 25: 9, 9 and 7), where the AVX2
    levels keep 6. Checked in the emitted code on any host; run natively, bit for bit against numpy with uint8 and int8 x, where the
    host has avx512_vnni."""
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    rng = np.random.default_rng(rows)
    cases = [_matmul_case(rng, (rows, 120), 37, "uint8", 131, False, "uint8", 3),
             _matmul_case(rng, (rows, 61), 70, "int8", -9, False, "int8", 5)]
    def widest_step(asm: str) -> int:
        """The most vpdpbusd of one basic block: whole tile steps of tile x 2 + 2 (the column
        sums) each (LLVM unrolls the step loop)."""
        return max(len(re.findall(r"\bvpdpbusd\s", block))
                   for block in re.split(r"\n\.LBB\w*:", asm))

    for args, attrs, expect, _ in cases:
        asm, _ = _assembly("qmatmul", args, attrs, "x86-64-v4+vnni")
        steps = widest_step(asm)
        assert steps % (2 * tile + 2) == 0 and steps % (2 * 6 + 2), steps   # not 6-row tiles
        if not X86 or "avx512_vnni" not in host_features():
            continue
        path = tmp_path / "m.mlc"
        export_module(build_op_module("qmatmul", args, MASK, **attrs), path,
                      ExportOptions(target="x86-64-v4+vnni", check=False))
        with load(path, threads=1) as model:
            np.testing.assert_array_equal(model.run({"x0": args[0]})["y"], expect)


def test_vnni_bundle_refused_without_vnni(tmp_path: Path, monkeypatch) -> None:
    """A bundle with only x86-64-v4+vnni code refuses to load on a host without avx512_vnni
    (flags pinned: a plain AVX-512 CPU), with the one-line advice."""
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load
    from mlcpack.runtime.errors import CpuFeatureError

    rng = np.random.default_rng(6)
    args, attrs, _, _ = _matmul_case(rng, (3, 9), 5, "uint8", 7, False, "uint8", 3)
    path = tmp_path / "vnni.mlc"
    export_module(build_op_module("qmatmul", args, MASK, **attrs), path,
                  ExportOptions(target="x86-64-v4+vnni", check=False))
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V4)
    with pytest.raises(CpuFeatureError, match=r"needs avx512_vnni.*this CPU is x86-64-v4"):
        load(path)


def test_vnni_variant_only_for_integer_kernels(monkeypatch) -> None:
    """On a VNNI host the portable levels end with x86-64-v4+vnni; an export keeps that variant
    only where the model has an integer kernel (an fp32 model would get a copy of v4)."""
    from mlcpack.packager.codegen.target import drop_idle_levels, resolve_targets
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import UNPACKED
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_VNNI)
    targets = resolve_targets(None)
    assert [t.name for t in targets][-2:] == ["x86-64-v4", "x86-64-v4+vnni"]
    rng = np.random.default_rng(8)
    args, attrs, _, _ = _matmul_case(rng, (3, 9), 5, "uint8", 7, False, "uint8", 3)
    quantized = run_pipeline(build_op_module("qmatmul", args, MASK, **attrs), DEFAULT_PIPELINE,
                             options=UNPACKED)
    fp32 = run_pipeline(build_op_module("pad", [rng.random((4, 8), dtype=np.float32)],
                                        pads=(0, 1, 0, 2)),
                        DEFAULT_PIPELINE, options=UNPACKED)

    def funcs(mod):
        return [f for f in mod.functions.values() if isinstance(f, PrimFunc)]

    assert drop_idle_levels(targets, funcs(quantized)) == targets
    assert [t.name for t in drop_idle_levels(targets, funcs(fp32))] == [
        "x86-64-v2", "x86-64-v3", "x86-64-v4"]
    alone = resolve_targets("x86-64-v4+vnni")
    assert drop_idle_levels(alone, funcs(fp32)) == alone       # asked for by name, alone


@pytest.mark.parametrize("op", ["qconv2d", "qmatmul"])
def test_dotprod_level_emits_sdot(op: str) -> None:
    """aarch64+dotprod: the same quad kernels with sdot (int8 x int8: uint8 x shifted by -128,
    the zero point corrected likewise); plain aarch64 keeps the pair product. They run under
    qemu in test_int8_gemm.py's test_integer_kernels_on_aarch64_under_qemu."""
    rng = np.random.default_rng(12)
    if op == "qconv2d":
        args, attrs, _ = _conv_case(rng, 1, 6, 8, 9, 7, 3, 2, 1, "uint8", 100, False)
    else:
        args, attrs, _, _ = _matmul_case(rng, (5, 37), 19, "uint8", 7, False, "uint8", 3)
    asm, _ = _assembly(op, args, attrs, "aarch64+dotprod")
    assert re.search(r"\bsdot\s+v\d+\.4s", asm)
    if op == "qmatmul":     # (one plain compile is enough: the choice is one flag)
        plain, _ = _assembly(op, args, attrs, "aarch64")
        assert "sdot" not in plain
