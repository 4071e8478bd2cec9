"""Quad-kernel convolution weights packed at export (passes/quad_weights.py,
ops/qconv_quads.py): a ``qconv2d`` whose bundle runs the quad kernel on every level
(x86-64-v4+vnni's ``vpdpbusd``, aarch64+dotprod's ``sdot``) stores its int8 weights as the
kernel's inner loop reads them, with the zero-point correction folded into the bias, instead
of regrouping them on every call; the results are the same bits.

Checked on any host: the layout and the numpy reference (against qconv2d's, both shifts); which
bundles take it; the x86 kernel's own code with vpdpbusd in portable IR (``vnni_emulate``, run
here) bit for bit against the per-call regrouping kernel and exact integer math; the aarch64
sdot kernel under qemu through the cross-built C runtime (Debian's qemu 7.2 runs sdot, not
vpdpbusd); vpdpbusd in the v4+vnni assembly. The native vpdpbusd run needs a host with
avx512_vnni (tests/kernels/test_int8_gemm_vnni.py ``test_vnni_level_runs_natively`` exports for
x86-64-v4+vnni alone, so it runs this path there)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import build_op_module
from mlcpack.packager.ops.qconv_quads import (folded_bias, pairs_to_quads, qconv2d_quads,
                                              unpack_quads)
from mlcpack.packager.ops.qlinear import qconv2d, unpack_conv_weights
from mlcpack.runtime import elf
from mlcpack.runtime.cpu import host_arch, host_features
from test_int8_gemm import MASK, _conv_case

CASES = {   # batch, C, H, W, O, k, stride, pad, x dtype, x zp, int16 weights
    # C = 3: one quad, its last channel zero; 5 outputs: a partial 6-row tile
    "3x3_s1_p1_c3": (1, 3, 9, 11, 5, 3, 1, 1, "uint8", 128, False),
    # C = 6: an odd number of pairs (a zero pair in the last quad); int8 x; 13 outputs
    "3x3_s2_c6_o13": (2, 6, 10, 10, 13, 3, 2, 1, "int8", -20, False),
    "7x7_s2_p3_stem": (1, 3, 20, 18, 8, 7, 2, 3, "int8", 10, False),
    "1x1_c32_o24": (1, 32, 7, 7, 24, 1, 1, 0, "uint8", 3, False),
}


def _case(name: str):
    rng = np.random.default_rng(sorted(CASES).index(name) + 300)
    return _conv_case(rng, *CASES[name])


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_and_reference(case: str) -> None:
    """The quads hold the k-pairs' weights (a round trip), and qconv2d_quads with the folded
    bias gives qconv2d's bytes for the x86 and the aarch64 shifts."""
    from mlcpack.packager.passes.quad_weights import quad_shift

    args, attrs, expect = _case(case)
    x, wk, xz, bias = args[:4]
    o, (kh, kw), c = attrs["out_channels"], attrs["kernel"], x.shape[1]
    wq = pairs_to_quads(wk, kh * kw)
    assert wq.dtype == np.int8 and wq.shape == (wk.shape[0], kh * kw * -(-c // 4), 6, 4)
    np.testing.assert_array_equal(unpack_quads(wq, o, c, kh, kw),
                                  unpack_conv_weights(wk, o, c, kh, kw))
    want = qconv2d(*args, **attrs)
    np.testing.assert_array_equal(want, expect)
    for arch in ("x86_64", "aarch64"):
        shift = quad_shift(arch, str(x.dtype))
        b2 = folded_bias(bias, wq, int(xz) + shift)
        got = qconv2d_quads(x, wq, xz, b2, *args[4:], shift=shift, **attrs)
        np.testing.assert_array_equal(got, want, err_msg=arch)


def _main_ops(args, attrs, target: str, **compile_fields):
    from mlcpack.packager.ir.graph import Call, Constant
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod = build_op_module("qconv2d", args, MASK, **attrs)
    opts = CompileOptions(target=target, **compile_fields)
    out = run_pipeline(mod, DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")], options=opts)   # up to legalize
    calls = [b.value for b in out.functions["main"].bindings() if isinstance(b.value, Call)]
    consts = {a.name: a.data for v in calls for a in v.args if isinstance(a, Constant)}
    return calls, consts, opts.for_targets()


def test_which_bundles_pack_quads() -> None:
    """Only a target set whose every level runs the quad kernel (one architecture) stores quads:
    x86-64-v4+vnni alone, aarch64+dotprod alone (uint8 x shifted by -128 there); a portable set
    with levels that read the k-pairs, a 1x1 image (the matrix-vector kernel) and int16 weights
    keep qconv2d. The pipeline only: nothing compiled."""
    args, attrs, _ = _case("3x3_s1_p1_c3")
    expect = {"x86-64-v4+vnni": ("x86_64", 0), "x86-64-v4,x86-64-v4+vnni": ("", None),
              "aarch64+dotprod": ("aarch64", -128), "aarch64,aarch64+dotprod": ("", None),
              "x86-64-v3": ("", None), "x86-64-v4+vnni,aarch64+dotprod": ("", None)}
    for target, (arch, shift) in expect.items():
        calls, consts, opts = _main_ops(args, attrs, target)
        assert opts.conv_quads == arch, target
        (call,) = calls
        if shift is None:
            assert call.op == "qconv2d", target
            continue
        assert call.op == "qconv2d_quads" and call.attrs["shift"] == shift, target
        assert [str(d.dtype) for d in consts.values()].count("int8") == 1   # no k-pairs left
    # vnni_emulate (tests): every x86 level runs the quad kernel
    assert _main_ops(args, attrs, "x86-64-v3", vnni_emulate=True)[2].conv_quads == "x86_64"
    for case in ("se_1x1_image_batch2", "3x3_s1_p0_int16w"):
        from test_int8_gemm import CONVS
        rng = np.random.default_rng(1)
        a2, at2, _ = _conv_case(rng, *CONVS[case])
        (call,), _, _ = _main_ops(a2, at2, "x86-64-v4+vnni")
        assert call.op == "qconv2d", case


def _export(args, attrs, path: Path, target: str, **compile_fields) -> Path:
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions

    export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                  ExportOptions(target=target, check=False,
                                compile=CompileOptions(**compile_fields)))
    return path


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features(),
                    reason="runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
def test_emulated_prepacked_kernel_matches_per_call_regrouping(tmp_path: Path) -> None:
    """The VNNI qconv2d's own code with vpdpbusd in portable IR (``vnni_emulate``) for
    x86-64-v3: the weights packed at export (quads, folded bias) and regrouped per call (the
    same kernel with ``conv_quads=""``) give the same bytes, equal to exact integer math, on 1
    and 2 threads. (test_int8_gemm_vnni.py's emulated cases, a strided 7x7 among them, run the
    packed path too: ``vnni_emulate`` makes every x86 level a quad kernel.)"""
    case = "3x3_s2_c6_o13"
    from mlcpack.runtime import load
    from mlcpack.runtime.bundle import BundleReader

    args, attrs, expect = _case(case)
    packed = _export(args, attrs, tmp_path / "packed.mlc", "x86-64-v3", vnni_emulate=True)
    per_call = _export(args, attrs, tmp_path / "call.mlc", "x86-64-v3", vnni_emulate=True,
                       conv_quads="")
    for threads in (1, 2):
        outs = []
        for path in (packed, per_call):
            with load(path, threads=threads) as model:
                outs.append(model.run({"x0": args[0]})["y"])
        np.testing.assert_array_equal(outs[0], expect)
        np.testing.assert_array_equal(outs[1], expect)
    shapes = []
    for path in (packed, per_call):
        with BundleReader(path) as reader:
            shapes.append([tuple(c["shape"][2:]) for c in reader.header["constants"]
                           if c["dtype"] == "int8"])
    assert shapes == [[(6, 4)], [(6, 2)]]   # the quads stored, or the k-pairs


def test_vnni_assembly_has_no_regrouping() -> None:
    """For x86-64-v4+vnni both kernels have vpdpbusd; the packed one is shorter by the
    regrouping loop (its byte shuffles and the weight sums' sign extensions) and needs no
    workspace for the regrouped weights."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    args, attrs, _ = _case("3x3_s2_c6_o13")
    target = resolve_target("x86-64-v4+vnni")
    lines, workspace = {}, {}
    for name, quads in (("packed", None), ("per_call", "")):
        opts = CompileOptions(target=target.name, conv_quads=quads)
        mod = run_pipeline(build_op_module("qconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                           options=opts)
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
        asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
        assert "vpdpbusd" in asm, name
        (kernel,) = code.kernels.values()
        workspace[name] = kernel.workspace_bytes
        lines[name] = [ln for ln in asm.splitlines() if ln.startswith("\t") and
                       not ln.startswith("\t.")]
    assert len(lines["packed"]) < len(lines["per_call"])
    assert workspace["packed"] < workspace["per_call"]


QEMU = shutil.which("qemu-aarch64-static")
CROSS = shutil.which("aarch64-linux-gnu-gcc")


@pytest.mark.skipif(elf._real_arch() != "x86_64" or QEMU is None or CROSS is None,
                    reason="runs aarch64 code under qemu-aarch64-static from an x86-64 host "
                           "with the C runtime cross-built (Debian's qemu-user-static and "
                           "gcc-aarch64-linux-gnu)")
def test_sdot_per_call_under_qemu(tmp_path: Path) -> None:
    """aarch64+dotprod's sdot kernel on weights regrouped per call (``conv_quads=""``; uint8
    x shifted by -128, int8 x not), run by the cross-built C runtime under qemu: bit for bit
    exact integer math. The packed path (the default for aarch64+dotprod alone) runs under
    qemu in test_int8_gemm.py ``test_integer_kernels_on_aarch64_under_qemu``, both shifts."""
    from conftest import ROOT

    cdir = ROOT / "runtime" / "c"
    proc = subprocess.run(["make", "-C", str(cdir), "-j2", "aarch64"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for case in ("3x3_s1_p1_c3", "3x3_s2_c6_o13"):
        args, attrs, expect = _case(case)
        np.save(tmp_path / "x.npy", args[0])
        for name, quads in (("per_call", ""),):
            path = _export(args, attrs, tmp_path / f"{case}-{name}.mlc", "aarch64+dotprod",
                           conv_quads=quads)
            out = tmp_path / f"{case}-{name}"
            proc = subprocess.run([QEMU, str(cdir / "build-aarch64" / "mlcrun"), "run", str(path),
                                   str(tmp_path / "x.npy"), "-o", str(out)],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            np.testing.assert_array_equal(np.load(out / "out0.npy"), expect,
                                          err_msg=f"{case} {name}")


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features(),
                    reason="runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
def test_emulated_prepacked_kernel_with_a_table(tmp_path: Path) -> None:
    """A lut8 table folded into the qconv2d (a 7th input, passes/quantize_lut.py) stays the
    7th input of qconv2d_quads: int8 results looked up per channel, exact against numpy."""
    from mlcpack.packager.ops.qlinear import lut8, pack_conv_weights
    from mlcpack.runtime import load

    rng = np.random.default_rng(44)
    x = rng.integers(-128, 128, (1, 5, 9, 12)).astype(np.int8)
    wd = rng.integers(-127, 128, (7, 5, 3, 3))
    args = [x, pack_conv_weights(wd), np.array(-7, np.int32),
            rng.integers(-3000, 3000, 7).astype(np.int32),
            rng.uniform(1e-4, 1e-3, 7).astype(np.float32), np.array(-3, np.float32),
            rng.integers(0, 256, (7, 256)).astype(np.uint8)]
    attrs = dict(out_channels=7, kernel=(3, 3), strides=(1, 1), padding=(1,) * 4, dtype="int8")
    expect = lut8(qconv2d(*args[:6], **attrs), args[6], 1)
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions
    path = tmp_path / "lut.mlc"
    export_module(build_op_module("qconv2d", args, [False] + [True] * 6, **attrs), path,
                  ExportOptions(target="x86-64-v3", check=False,
                                compile=CompileOptions(vnni_emulate=True)))
    with load(path) as model:
        got = model.run({"x0": x})["y"]
    np.testing.assert_array_equal(got, expect)
    assert len(np.unique(got)) > 40
    from mlcpack.runtime.bundle import BundleReader
    with BundleReader(path) as reader:
        assert [tuple(c["shape"]) for c in reader.header["constants"]
                if c["dtype"] == "int8"] == [(2, 9 * 2, 6, 4)]   # the quads (cg = 2)
