"""Full-range int8 convolution weights on the sign kernel (ops/qconv_quads.py ``signed_x``,
``CompileOptions.conv_signed_x``): the planes hold int8 x (uint8 x - 128) and the kernel
multiplies ``vpmaddubsw``(|x|, sign(w, x)), whose byte pairs (|x| <= 128, |w| <= 127) never
saturate, so any weights in [-127, 127] run exact with no residual.

Exact integer math in numpy is the reference: an instruction model of the pair sums (exact on
every (x, w) pair at the extremes, where the unsigned form saturates), the selection (the
option on and off, a -128 weight, 7-bit weights), and compiled bundles at x86-64-v3, v2 and v1
(host features pinned with MLCPACK_CPU_FEATURES), 1 and 2 threads, on random full-range
weights with rows of +127 and of -127 (every pair of them over ``vpmaddubsw``'s bound) and
activations at their extremes."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import X86_V2, X86_V3
from helpers import build_op_module
from mlcpack.packager.ops.qlinear import pack_conv_weights
from test_int8_conv_madd7 import AVX2_HOST, X86_V1, _main_ops
from test_int8_gemm import MASK, _requant


def _weights(rng, o: int, c: int, k: int) -> np.ndarray:
    """Uniform weights in [-127, 127] (about 40 % of the quad words hold a pair over the
    bound), output channel 0 all +127, 1 all -127, 2 alternating +-127."""
    wd = rng.integers(-127, 128, (o, c, k, k))
    wd[0], wd[1] = 127, -127
    wd[2] = np.where(np.arange(c)[:, None, None] % 2, 127, -127)
    return wd


def _case(seed: int, c: int, h: int, w: int, o: int, k: int, s: int, p: int, xd: str,
          xz: int):
    """A qconv2d with those weights, activations mostly at their extremes, and its exact
    result."""
    rng = np.random.default_rng(seed)
    xi = np.iinfo(xd)
    wd = _weights(rng, o, c, k)
    x = np.where(rng.random((1, c, h, w)) < 0.5, xi.max, xi.min).astype(xd)
    x[:, :, ::3] = rng.integers(xi.min, xi.max + 1, x[:, :, ::3].shape)
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    pads = (p, p, p + (1 if s > 1 else 0), p)
    xp = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - k) // s + 1
    ow = (w + pads[1] + pads[3] - k) // s + 1
    acc = np.zeros((1, o, oh, ow), np.int64)
    for ky in range(k):
        for kx in range(k):
            patch = xp[:, :, ky:ky + s * (oh - 1) + 1:s, kx:kx + s * (ow - 1) + 1:s]
            acc += np.einsum("nchw,oc->nohw", patch, wd[:, :, ky, kx])
    acc += bias.reshape(1, o, 1, 1)
    span = np.maximum(np.abs(acc).max(axis=(0, 2, 3)), 1).astype(np.float64)
    mult = (120.0 / span).astype(np.float32)
    expect = _requant(acc, mult.reshape(1, o, 1, 1), 128, "uint8")
    args = [x, pack_conv_weights(wd), np.array(xz, np.int32), bias, mult,
            np.array(128, np.float32)]
    attrs = dict(out_channels=o, kernel=(k, k), strides=(s, s), padding=pads, dtype="uint8")
    return args, attrs, expect


CASES = {   # seed, C, H, W, O, k, stride, pad, x dtype, x zp
    # 13 outputs: tiles of 6 and a partial one; 7 channels: an odd pair, a short quad
    "3x3_s1_u8": (1, 7, 12, 13, 13, 3, 1, 1, "uint8", 0),
    "3x3_s2_s8": (2, 16, 9, 9, 12, 3, 2, 1, "int8", -5),
    "1x1_s1_u8": (3, 64, 7, 7, 24, 1, 1, 0, "uint8", 131),
    # 7x7 outputs, 32 channels: the channel-lane kernel (passes/quad_weights.py use_oc_lanes)
    "3x3_s1_7x7_u8": (4, 24, 7, 7, 32, 3, 1, 1, "uint8", 7),
}


def _signed_sums(xs: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, bool]:
    """The kernel's step on quads: int8 x [..., 4], int8 w [..., 4] -> (vpmaddubsw(|x|,
    sign(w, x)) + vpmaddwd by ones, whether some int16 pair sum saturated)."""
    x64, w64 = xs.astype(np.int64), w.astype(np.int64)
    ua = np.abs(x64)                                   # vpabsb: 128 for -128 (as uint8)
    sw = np.sign(x64) * w64                            # vpsignb: |w| <= 127, no wrap
    assert sw.min() >= -128 and sw.max() <= 127
    p = ua * sw
    pairs = p[..., 0::2] + p[..., 1::2]
    saturated = bool((pairs > 32767).any() or (pairs < -32768).any())
    return np.clip(pairs, -32768, 32767).sum(axis=-1), saturated


def test_pair_sums_never_saturate() -> None:
    """Every int8 x against every weight pair at the extremes (and random quads): the sign
    step's sums equal the exact ones and no pair saturates; the unsigned form (uint8 x + 128)
    saturates on the same weights."""
    ext = np.array([-128, -127, -1, 0, 1, 127], np.int64)
    wext = np.array([-127, -100, -1, 0, 1, 100, 127], np.int64)
    grid = np.stack(np.meshgrid(ext, ext, wext, wext, indexing="ij"), -1).reshape(-1, 4)
    xs = np.concatenate([grid[:, :2], grid[:, :2]], axis=1).astype(np.int8)
    w = np.concatenate([grid[:, 2:], grid[:, 2:]], axis=1).astype(np.int8)
    rng = np.random.default_rng(0)
    for xq, wq in ((xs, w), (rng.integers(-128, 128, (4096, 4)).astype(np.int8),
                             rng.integers(-127, 128, (4096, 4)).astype(np.int8))):
        got, saturated = _signed_sums(xq, wq)
        assert not saturated
        np.testing.assert_array_equal(got, (xq.astype(np.int64) * wq).sum(axis=-1))
    xu = (xs.astype(np.int64) + 128)
    pu = xu * w.astype(np.int64)
    assert ((pu[:, 0::2] + pu[:, 1::2]) > 32767).any()


def test_selection_rule() -> None:
    """With ``conv_signed_x`` (and by default on planes of outputs 4-7 wide) full-range
    weights in [-127, 127] become quads marked w7 and signed_x (shift -128 for uint8 x, 0
    for int8 x; six inputs: no residual; channel lanes on small planes) on x86 sets without
    VNNI on every level; a -128 weight, the option off, 7-bit weights or a VNNI-only set
    leave it unmarked. The pipeline only: nothing compiled."""
    for name, shift in (("3x3_s1_u8", -128), ("3x3_s2_s8", 0)):
        args, attrs, _ = _case(*CASES[name])
        for target in ("x86-64-v3", "x86-64,x86-64-v2,x86-64-v3"):
            (call,) = _main_ops(args, attrs, target, conv_signed_x=True)
            assert call.op == "qconv2d_quads" and call.attrs.get("signed_x") is True, target
            assert call.attrs["shift"] == shift and call.attrs.get("w7") is True
            assert len(call.args) == 6 and not call.attrs.get("oc_lanes")
        for fields in ({}, {"conv_signed_x": False}):    # 12-13 wide outputs, or off
            (call,) = _main_ops(args, attrs, "x86-64-v3", **fields)
            assert not call.attrs.get("signed_x")
        (call,) = _main_ops(args, attrs, "x86-64-v4+vnni", conv_signed_x=True)
        assert call.op == "qconv2d_quads" and not call.attrs.get("signed_x")
    # by default on small planes only (outputs 4-7 wide: passes/quad_weights.py use_signed_x)
    small_plane = _case(*CASES["3x3_s1_7x7_u8"])[:2]
    for fields in ({}, {"conv_signed_x": True}):
        (call,) = _main_ops(*small_plane, "x86-64-v3", **fields)
        assert call.attrs.get("signed_x") is True and call.attrs.get("oc_lanes") is True
    for target, fields in (("x86-64-v3", {"conv_signed_x": False}),
                           ("x86-64-v3,x86-64-v4+vnni", {})):   # a VNNI level: vpdpbusd alone
        (call,) = _main_ops(*small_plane, target, **fields)
        assert not call.attrs.get("signed_x"), target
    args, attrs, _ = _case(*CASES["3x3_s1_u8"])
    low = list(args)
    low[1] = args[1].copy()
    low[1][0, 0, 0, 0] = -128
    (call,) = _main_ops(low, attrs, "x86-64-v3", conv_signed_x=True)
    assert not call.attrs.get("signed_x")
    small = list(args)
    small[1] = np.clip(args[1], -64, 64)
    (call,) = _main_ops(small, attrs, "x86-64-v3", conv_signed_x=True)
    assert call.attrs.get("w7") is True and not call.attrs.get("signed_x")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """One fat x86-64 (v1) + v2 + v3 bundle per case with the sign kernel."""
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions

    out = {}
    root = tmp_path_factory.mktemp("signed")
    for name, spec in CASES.items():
        args, attrs, expect = _case(*spec)
        path = root / f"{name}.mlc"
        export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                      ExportOptions(target="x86-64,x86-64-v2,x86-64-v3", check=False,
                                    compile=CompileOptions(conv_signed_x=True)))
        out[name] = (path, args[0], expect)
    return out


@AVX2_HOST
@pytest.mark.parametrize("case", list(CASES))
def test_exact_at_v3_v2_v1(case: str, bundles: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlcpack.runtime import load

    path, x, expect = bundles[case]
    assert len(np.unique(expect)) > 3
    for flags in (X86_V3, X86_V2, X86_V1):
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        for threads in (1, 2):
            with load(path, threads=threads) as model:
                np.testing.assert_array_equal(model.run({"x0": x})["y"], expect,
                                              err_msg=f"{flags[-20:]} {threads}")


@pytest.mark.parametrize("case", ["3x3_s1_u8", "3x3_s1_7x7_u8"])
def test_instructions_in_assembly(case: str) -> None:
    """The sign kernel (pixel and channel lanes) compiles for x86-64-v3 with vpabsb, vpsignb
    and vpmaddubsw, for x86-64-v2 with their SSSE3 forms, and for a VNNI level with vpdpbusd;
    nothing run."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.qgemm import match_qgemm
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    args, attrs, _ = _case(*CASES[case])
    # a VNNI level beside AVX2 ones (one graph for all): vpdpbusd on (|x|, sign(w, x)), whose
    # native run needs an avx512_vnni host
    for name, want in (("x86-64-v3", ("vpabsb", "vpsignb", "vpmaddubsw")),
                       ("x86-64-v2", ("pabsb", "psignb", "pmaddubsw")),
                       ("x86-64-v3,x86-64-v4+vnni", ("vpabsb", "vpsignb", "vpdpbusd"))):
        target = resolve_target(name.split(",")[-1])
        opts = CompileOptions(target=name, conv_signed_x=True)
        mod = run_pipeline(build_op_module("qconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                           options=opts)
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        tags = [match_qgemm(f) for f in funcs]
        assert [t[1].attrs.get("signed_x") for t in tags if t] == [True], name
        code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
        asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
        assert all(op in asm for op in want), name


def test_small_planes_stay_integer() -> None:
    """The layer choice (passes/int8_cost.py ``float_conv_reason``): a 3x3 stride-1 layer of
    7x7 outputs with full-range weights over the bound stays float unless its weights lie in
    [-127, 127] (the channel-lane sign kernel takes it: 1.35x fp32's speed measured there),
    with 16k output channels and the sign kernel not turned off; 14x14 outputs take the integer
    Winograd kernel (passes/int8_cost.py ``int_winograd``), or with it off stay float."""
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.int8_cost import float_conv_reason

    options = CompileOptions(target="x86-64-v2,x86-64-v3").for_targets()
    off = CompileOptions(target="x86-64-v2,x86-64-v3", conv_signed_x=False).for_targets()
    w, s7 = (512, 512, 3, 3), (1, 512, 7, 7)
    assert float_conv_reason(w, (1, 1), s7, 1, options, split_share=0.4, signed_ok=True) is None
    assert float_conv_reason(w, (1, 1), s7, 1, options, split_share=0.4) is not None
    assert float_conv_reason(w, (1, 1), s7, 1, off, split_share=0.4, signed_ok=True) is not None
    assert float_conv_reason((500, 512, 3, 3), (1, 1), (1, 500, 7, 7), 1, options,
                             split_share=0.4, signed_ok=True) is not None
    # 14x14 outputs: the integer Winograd kernel, else (turned off) fp32's Winograd
    assert float_conv_reason((256, 256, 3, 3), (1, 1), (1, 256, 14, 14), 1, options,
                             split_share=0.4, signed_ok=True) is None
    nowino = CompileOptions(target="x86-64-v2,x86-64-v3", conv_int_winograd=False).for_targets()
    assert float_conv_reason((256, 256, 3, 3), (1, 1), (1, 256, 14, 14), 1, nowino,
                             split_share=0.4, signed_ok=True) is not None
