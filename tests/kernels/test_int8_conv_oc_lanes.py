"""The quad convolution kernel with output channels on the lanes (codegen/qgemm_conv.py
``_emit_oc_lanes``; passes/quad_weights.py ``use_oc_lanes``): x86 quad convolutions whose
output rows are short (the pixel-lane kernel would fill under 93 % of its lanes: 7x7, 14x14 and
28x28 planes) store their quads 16 output channels per step and broadcast one pixel's quad against
two vectors of 8 channels.

Checked: the layout round trip and the numpy reference (no compile); which convolutions take
it; exact integer math at x86-64-v3, v2 and v1 with 7-bit weights (``vpmaddubsw``; SSSE3
``pmaddubsw``; int16 products), on 1 and 2 threads, uint8 and int8 x, a stride-2 layer, a 1x1
layer, a folded lut8 table and a float32 result (bit for bit the op's numpy reference); and
with full-range weights on the VNNI kernel's own code with ``vpdpbusd`` in portable IR
(``vnni_emulate``). test_int8_gemm_vnni.py's emulated 14x14 case
(32 output channels, batch 2, 2 threads) takes this kernel too."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import X86_V2, X86_V3
from helpers import build_op_module
from mlcpack.packager.ops.qconv_quads import (folded_bias, pairs_to_quads, qconv2d_quads,
                                              quads_to_oc_lanes, unpack_quads)
from mlcpack.packager.ops.qlinear import lut8, qconv2d, unpack_conv_weights
from test_int8_conv_madd7 import AVX2_HOST, X86_V1, _case
from test_int8_gemm import MASK

CASES = {   # seed, C, H, W, O, k, stride, pad, x dtype, x zp, worst
    # 7x7 output: 49 pixels as 4 tiles of 6 and 5 of 5 (AVX2), 17 tiles of 3 and 2 (v2, v1);
    # 20 channels: 5 quads
    "3x3_s1_7x7_worst_u8": (11, 20, 7, 7, 32, 3, 1, 1, "uint8", 0, True),
    # 14x14 -> 8x7 with an asymmetric pad, int8 x (shifted by 128), 9 channels: a short quad
    "3x3_s2_14_s8": (12, 9, 14, 14, 16, 3, 2, 1, "int8", -3, False),
    # a 1x1 convolution of a 5x5 image, 48 outputs: three channel tiles
    "1x1_5x5_u8": (13, 64, 5, 5, 48, 1, 1, 0, "uint8", 7, False),
}


def _main_ops(args, attrs, target: str, **fields):
    from mlcpack.packager.ir.graph import Call
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod = build_op_module("qconv2d", args, [False] + [True] * (len(args) - 1), **attrs)
    out = run_pipeline(mod, DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")], options=CompileOptions(target=target, **fields))
    return [b.value for b in out.functions["main"].bindings() if isinstance(b.value, Call)]


@pytest.mark.parametrize("case", list(CASES))
def test_layout_and_reference(case: str) -> None:
    """The channel-lane quads hold the weights (a round trip), and qconv2d_quads on them with
    the folded bias gives qconv2d's bytes (exact integer math)."""
    args, attrs, expect = _case(*CASES[case])
    x, wk, xz, bias = args[:4]
    o, (kh, kw), c = attrs["out_channels"], attrs["kernel"], x.shape[1]
    wq = quads_to_oc_lanes(pairs_to_quads(wk, kh * kw), o)
    assert wq.dtype == np.int8 and wq.shape == (o // 16, kh * kw * -(-c // 4), 16, 4)
    np.testing.assert_array_equal(unpack_quads(wq, o, c, kh, kw),
                                  unpack_conv_weights(wk, o, c, kh, kw))
    shift = 128 if x.dtype == np.int8 else 0
    got = qconv2d_quads(x, wq, xz, folded_bias(bias, wq, int(xz) + shift), *args[4:],
                        shift=shift, oc_lanes=True, **attrs)
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(qconv2d(*args, **attrs), expect)


def test_which_convolutions_take_it() -> None:
    """Small planes with 16k output channels take the channel-lane quads on x86 (portable and
    VNNI sets), with a float32 result too; a 30x30 output (94 % of the pixel lanes used), 24
    output channels and ``conv_oc_lanes=False`` keep the pixel-lane quads. The pipeline
    only."""
    for case in CASES:
        args, attrs, _ = _case(*CASES[case])
        for target in ("x86-64-v2,x86-64-v3", "x86-64-v4+vnni"):
            (call,) = _main_ops(args, attrs, target)
            assert call.op == "qconv2d_quads" and call.attrs.get("oc_lanes") is True, case
            assert call.args[1].data.shape[2:] == (16, 4)
        (call,) = _main_ops(args, attrs, "x86-64-v3", conv_oc_lanes=False)
        assert call.op == "qconv2d_quads" and not call.attrs.get("oc_lanes"), case
    for shape in ((11, 8, 30, 30, 16, 3, 1, 1, "uint8", 0, False),
                  (11, 8, 7, 7, 24, 3, 1, 1, "uint8", 0, False)):
        args, attrs, _ = _case(*shape)
        (call,) = _main_ops(args, attrs, "x86-64-v3")
        assert call.op == "qconv2d_quads" and not call.attrs.get("oc_lanes"), shape
    fargs, fattrs, _ = _float_case()
    (call,) = _main_ops(fargs, fattrs, "x86-64-v3")
    assert call.op == "qconv2d_quads" and call.attrs.get("oc_lanes") is True


def _float_case():
    """A 7x7 convolution with a float32 result (``--quantize int8``'s form: per-channel
    offsets, ReLU) and a per-tensor multiplier."""
    args, attrs, _ = _case(*CASES["3x3_s1_7x7_worst_u8"])
    rng = np.random.default_rng(22)
    args = args[:4] + [np.array(3e-5, np.float32), rng.normal(0, 0.5, 32).astype(np.float32)]
    attrs = {**attrs, "dtype": "float32", "relu": True}
    return args, attrs, qconv2d(*args, **attrs)


def _lut_case():
    """A 7x7 int8-result convolution with a lut8 table per channel folded in."""
    args, attrs, _ = _case(*CASES["3x3_s1_7x7_worst_u8"])
    rng = np.random.default_rng(21)
    args = args[:5] + [np.array(-3, np.float32),
                       rng.integers(0, 256, (32, 256)).astype(np.uint8)]
    attrs = {**attrs, "dtype": "int8"}
    expect = lut8(qconv2d(*args[:6], **attrs), args[6], 1)
    return args, attrs, expect


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """One fat x86-64 (v1) + v2 + v3 bundle per case, 7-bit weights (a few seconds each)."""
    from mlcpack.packager.export import ExportOptions, export_module

    out = {}
    root = tmp_path_factory.mktemp("oclanes")
    cases = {name: _case(*shape) for name, shape in CASES.items()}
    cases["lut8_int8_out"] = _lut_case()
    cases["float32_out"] = _float_case()
    for name, (args, attrs, expect) in cases.items():
        path = root / f"{name}.mlc"
        export_module(build_op_module("qconv2d", args, [False] + [True] * (len(args) - 1),
                                      **attrs), path,
                      ExportOptions(target="x86-64,x86-64-v2,x86-64-v3", check=False))
        out[name] = (path, args[0], expect)
    return out


@AVX2_HOST
@pytest.mark.parametrize("case", list(CASES) + ["lut8_int8_out", "float32_out"])
def test_exact_at_v3_v2_v1(case: str, bundles: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlcpack.runtime import load
    from mlcpack.runtime.bundle import BundleReader

    path, x, expect = bundles[case]
    assert len(np.unique(expect)) > 3
    with BundleReader(path) as reader:
        assert [tuple(c["shape"][2:]) for c in reader.header["constants"]
                if c["dtype"] == "int8"] == [(16, 4)]        # the channel-lane quads
    for flags in (X86_V3, X86_V2, X86_V1):
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        for threads in (1, 2):
            with load(path, threads=threads) as model:
                np.testing.assert_array_equal(model.run({"x0": x})["y"], expect,
                                              err_msg=f"{flags[-20:]} {threads}")


@AVX2_HOST
def test_vnni_emulated_full_range(tmp_path) -> None:
    """Full-range int8 weights (|w| up to 127) on the VNNI kernel's code with vpdpbusd in
    portable IR, for x86-64-v3: exact, 1 and 2 threads."""
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    args, attrs, expect = _case(*CASES["3x3_s2_14_s8"][:-1], True, lim=127)
    path = tmp_path / "vnni.mlc"
    export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                  ExportOptions(target="x86-64-v3", check=False,
                                compile=CompileOptions(vnni_emulate=True)))
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            np.testing.assert_array_equal(model.run({"x0": args[0]})["y"], expect)


def test_instructions_in_assembly() -> None:
    """The channel-lane kernel compiles for x86-64-v3 (vpmaddubsw + vpmaddwd on 7-bit weights)
    and x86-64-v4+vnni (vpdpbusd; its native run needs an avx512_vnni host), with the 16x16
    byte transpose's unpacks; nothing run."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.qgemm import match_qgemm
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    args, attrs, _ = _case(*CASES["3x3_s1_7x7_worst_u8"])
    for name, want in (("x86-64-v3", "vpmaddubsw"), ("x86-64-v4+vnni", "vpdpbusd")):
        target = resolve_target(name)
        opts = CompileOptions(target=target.name)
        mod = run_pipeline(build_op_module("qconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                           options=opts)
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        tags = [match_qgemm(f) for f in funcs]
        assert [t[1].attrs.get("oc_lanes") for t in tags if t] == [True], name
        code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
        asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
        assert want in asm and "punpcklbw" in asm, name
