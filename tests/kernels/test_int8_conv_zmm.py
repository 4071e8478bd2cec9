"""The quad convolution kernels on 512-bit ``vpdpbusd`` (x86-64-v4+vnni; codegen/qgemm_conv.py
``_tile_dp16``, ``_emit_oc_lanes``' ``tile_zmm``, ``_requant_zmm``, ``_fill_pixel_block``).

On any host: the emitted code (zmm vpdpbusd, the 512-bit epilogue's vpmovdb, the design in
``KernelInfo.choice``; the 256-bit levels without them), the tile choice (``zmm_vectors``), and
the instruction-exact numpy model of the VNNI kernel at the zmm tiles' widths (a lane's
arithmetic does not depend on how many lanes a tile has: 16-pixel vectors change only the
padding of the plane columns). Natively, on a CPU with avx512_vnni only (Debian's qemu 7.2
cannot run AVX-512): the kernels bit for bit against exact integer math on 1 and 2 threads,
pixel lanes (6 x 32, 48, 64 tiles) and channel lanes (16 to 64 channels a tile, the 16 x 16
block fill with strides 1 and 2 and a channel remainder).
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import build_op_module
from mlcpack.packager.codegen.qgemm_conv import zmm_vectors
from mlcpack.runtime.cpu import host_features
from test_int8_gemm import MASK, _conv_case
from test_int8_gemm_vnni import vnni_conv_model

X86 = platform.machine().lower() in ("x86_64", "amd64")

CASES = {   # batch, C, H, W, O, k, stride, pad, x dtype, x zp, int16 weights
    "pixel_3x3_c16_o32_b2": (2, 16, 14, 14, 32, 3, 1, 1, "int8", -20, False),
    "pixel_stem_7x7_s2": (1, 3, 20, 18, 8, 7, 2, 3, "uint8", 10, False),
    "pixel_3x3_c64_o13": (1, 64, 28, 28, 13, 3, 1, 1, "uint8", 7, False),
    "pixel_1x1_s2_o20": (1, 40, 9, 30, 20, 1, 2, 0, "uint8", 0, False),
    "lanes_3x3_c64_o64_7x7": (1, 64, 7, 7, 64, 3, 1, 1, "uint8", 5, False),
    "lanes_3x3_c32_o48_14x14": (1, 32, 14, 14, 48, 3, 1, 1, "int8", -3, False),
    "lanes_3x3_s2_c20_b2": (2, 20, 9, 9, 32, 3, 2, 1, "uint8", 9, False),
    "lanes_block_c40_28x28": (1, 40, 28, 28, 16, 3, 1, 1, "int8", 2, False),
    "lanes_block_s2_c32": (1, 32, 34, 34, 32, 3, 2, 1, "uint8", 200, False),
}


def _case(name: str):
    return _conv_case(np.random.default_rng(sorted(CASES).index(name) + 500), *CASES[name])


def _compiled(case: str, level: str):
    """(assembly, the kernel's KernelInfo) of the case's qconv2d exported for ``level`` alone
    (weights packed as that level's bundle packs them)."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    args, attrs, _ = _case(case)
    target = resolve_target(level)
    opts = CompileOptions(target=target.name)
    mod = run_pipeline(build_op_module("qconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                       options=opts)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
    (kernel,) = code.kernels.values()
    return _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir)), kernel


@pytest.mark.parametrize("case, design", [("pixel_3x3_c64_o13", "pixel lanes: 6 x 48"),
                                          ("lanes_3x3_c64_o64_7x7",
                                           "output channels on lanes: 6 x 64")])
def test_zmm_kernels_emitted(case: str, design: str) -> None:
    """x86-64-v4+vnni: vpdpbusd on zmm registers (none on ymm), the 512-bit epilogue's
    vpmovdb, and the design named for ``mlcpack inspect``; x86-64-v3 (the 7-bit quad kernel
    where the weights allow, else the k-pairs) has neither."""
    asm, kernel = _compiled(case, "x86-64-v4+vnni")
    assert re.search(r"\bvpdpbusd\s+[^\n]*%zmm", asm)
    assert not re.search(r"\bvpdpbusd\s+[^\n]*%ymm", asm)
    assert "vpmovdb" in asm
    assert kernel.choice.startswith("integer quad convolution, vpdpbusd on 512-bit")
    assert design in kernel.choice
    asm3, kernel3 = _compiled(case, "x86-64-v3")
    assert "zmm" not in asm3 and "vpdpbusd" not in asm3
    assert kernel3.choice is None or "512-bit" not in kernel3.choice


def test_zmm_tile_widths() -> None:
    """6 rows x nz 16-pixel vectors: the widest tile within 2 % of the least padding
    (ResNet-18: 56x56 outputs of planes 58 wide, 28x28 of 30, 14x14 of 16, 7x7 of 9)."""
    assert zmm_vectors(56 * 58) == 4
    assert zmm_vectors(28 * 30) == 3
    assert zmm_vectors(14 * 16) == 2
    assert zmm_vectors(7 * 9) == 4
    assert zmm_vectors(112 * 115) == 4


@pytest.mark.parametrize("case", ["pixel_3x3_c16_o32_b2", "pixel_stem_7x7_s2"])
def test_zmm_tile_model_exact(case: str) -> None:
    """The numpy model of the VNNI kernel (one vpdpbusd per step, wrapping int32 lanes, the
    float32 requantize) at the zmm tiles' 32, 48 and 64 pixel lanes equals exact integer math."""
    args, attrs, expect = _case(case)
    for nz in (2, 3, 4):
        got, _ = vnni_conv_model(*args[:5], float(args[5]), attrs, nv=2 * nz)
        np.testing.assert_array_equal(got, expect)


@pytest.mark.skipif(not X86 or "avx512_vnni" not in host_features(),
                    reason="runs 512-bit vpdpbusd natively: needs an x86-64 host with "
                           "avx512_vnni (AVX-512 VNNI, e.g. Zen 4/5, Ice Lake, Sapphire Rapids)")
def test_zmm_kernels_run_natively(tmp_path: Path) -> None:
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    for name in CASES:
        args, attrs, expect = _case(name)
        path = tmp_path / f"{name}.mlc"
        export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                      ExportOptions(target="x86-64-v4+vnni", check=False))
        for threads in (1, 2):
            with load(path, threads=threads) as model:
                got = model.run({"x0": args[0]})["y"]
            np.testing.assert_array_equal(got, expect, err_msg=f"{name}, {threads} threads")
        assert len(np.unique(expect)) > 3
