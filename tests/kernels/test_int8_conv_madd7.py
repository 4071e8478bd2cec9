"""The AVX2 quad kernel for 7-bit convolution weights (passes/quad_weights.py ``w7``,
codegen/qgemm.py ``_dpbusd``'s ``madd7`` branch): on x86 bundles whose levels are not all VNNI,
a ``qconv2d`` whose int8 weights all have |w| <= 64 (ONNX Runtime's ``reduce_range=True``)
stores them as uint8 x int8 quads and runs ``vpmaddubsw`` + ``vpmaddwd`` by ones on AVX2
(x86-64-v2: SSSE3's 128-bit pmaddubsw; x86-64 v1: int16 products in portable IR).

Exact integer math in numpy is the reference, at x86-64-v3, v2 and v1 (the host's features
pinned with MLCPACK_CPU_FEATURES), including the saturation corner: activations 255 (uint8, or
int8 127 shifted by 128) against weights +-64 in both channels of a pair. Weights past 64 whose
byte pairs stay within the bound take the same kernel; pairs over it are split
(test_int8_conv_split.py)."""

from __future__ import annotations


import numpy as np
import pytest

from conftest import X86_V2, X86_V3
from helpers import build_op_module
from mlcpack.packager.ops.qlinear import pack_conv_weights
from mlcpack.runtime.cpu import host_arch, host_features
from test_int8_gemm import MASK, _requant

X86_V1 = "fpu,cx8,cmov,fxsr,mmx,sse,sse2"     # the x86-64 baseline (no SSSE3)
AVX2_HOST = pytest.mark.skipif(
    host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features(),
    reason="runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")


def _case(seed: int, c: int, h: int, w: int, o: int, k: int, s: int, p: int, xd: str, xz: int,
          worst: bool = False, lim: int = 64):
    """A qconv2d with weights in [-lim, lim] and its exact uint8 result. ``worst``: x at its
    largest shifted value (255) in 3 of 4 places, weights +-lim in 3 of 4 places."""
    rng = np.random.default_rng(seed)
    xi = np.iinfo(xd)
    if worst:
        x = np.where(rng.random((1, c, h, w)) < 0.75, xi.max,
                     rng.integers(xi.min, xi.max + 1, (1, c, h, w))).astype(xd)
        wd = np.where(rng.random((o, c, k, k)) < 0.75, rng.choice([-lim, lim], (o, c, k, k)),
                      rng.integers(-lim, lim + 1, (o, c, k, k)))
    else:
        x = rng.integers(xi.min, xi.max + 1, (1, c, h, w)).astype(xd)
        wd = rng.integers(-lim, lim + 1, (o, c, k, k))
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
    # a multiplier per channel that spreads its accumulators over the uint8 range
    span = np.maximum(np.abs(acc).max(axis=(0, 2, 3)), 1).astype(np.float64)
    mult = (120.0 / span).astype(np.float32)
    expect = _requant(acc, mult.reshape(1, o, 1, 1), 128, "uint8")
    args = [x, pack_conv_weights(wd), np.array(xz, np.int32), bias, mult,
            np.array(128, np.float32)]
    attrs = dict(out_channels=o, kernel=(k, k), strides=(s, s), padding=pads, dtype="uint8")
    return args, attrs, expect


CASES = {   # seed, C, H, W, O, k, stride, pad, x dtype, x zp, worst
    # 13 outputs: two 6-row tiles and a partial one; 7 channels: an odd pair, a short quad
    "3x3_s1_worst_u8": (1, 7, 12, 13, 13, 3, 1, 1, "uint8", 0, True),
    "3x3_s1_worst_s8": (2, 8, 9, 9, 6, 3, 1, 1, "int8", -128, True),
    "3x3_s2_u8": (3, 6, 10, 10, 8, 3, 2, 1, "uint8", 131, False),
    "1x1_s1_u8": (4, 32, 7, 7, 24, 1, 1, 0, "uint8", 3, False),
    "7x7_s2_stem_s8": (5, 3, 20, 18, 8, 7, 2, 3, "int8", 10, True),
}


def _main_ops(args, attrs, target: str, **fields):
    from mlcpack.packager.ir.graph import Call
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod = build_op_module("qconv2d", args, MASK, **attrs)
    out = run_pipeline(mod, DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")], options=CompileOptions(target=target, **fields))
    return [b.value for b in out.functions["main"].bindings() if isinstance(b.value, Call)]


def test_selection_rule() -> None:
    """7-bit weights on an x86 set without VNNI on every level: quads marked w7; a weight of
    65 (or -65) too where its byte pair stays within the bound, split where it does not; a set
    of VNNI levels alone keeps its quads unmarked; aarch64 and ``conv_quads7=False`` keep
    qconv2d. The pipeline only: nothing compiled."""
    args, attrs, _ = _case(1, *CASES["3x3_s1_worst_u8"][1:])
    for target in ("x86-64-v3", "x86-64-v2,x86-64-v3", "x86-64-v4,x86-64-v4+vnni"):
        (call,) = _main_ops(args, attrs, target)
        assert call.op == "qconv2d_quads" and call.attrs.get("w7") is True, target
    (call,) = _main_ops(args, attrs, "x86-64-v4+vnni")
    assert call.op == "qconv2d_quads" and not call.attrs.get("w7")
    for target, fields in (("aarch64", {}), ("x86-64-v3", {"conv_quads7": False})):
        (call,) = _main_ops(args, attrs, target, **fields)
        assert call.op == "qconv2d", target
    for edge in (65, -65):
        # the kernel's bound is per byte pair (channels 2k, 2k + 1 of a tap): 255 (|w0| +
        # |w1|) <= 32767 for a same-sign pair. A 65 beside a zero or a 63 keeps it (w7, one
        # pass); beside a 64 of its sign it does not: the pair split (test_int8_conv_split.py)
        args65, attrs65, _ = _case(1, 7, 12, 13, 13, 3, 1, 1, "uint8", 0, lim=64)
        wd = np.zeros((13, 7, 3, 3), np.int64)
        wd[5, 2, 1, 1] = edge
        for partner, split in ((0, False), (63 * np.sign(edge), False),
                               (64 * np.sign(edge), True)):
            wd[5, 3, 1, 1] = partner
            args65[1] = pack_conv_weights(wd)
            (call,) = _main_ops(args65, attrs65, "x86-64-v3")
            assert call.op == "qconv2d_quads" and call.attrs.get("w7") is True, (edge, partner)
            assert bool(call.attrs.get("split")) == split, (edge, partner)
        (call,) = _main_ops(args65, attrs65, "x86-64-v3", conv_quads7=False)
        assert call.op == "qconv2d", edge
        wd[5, 2, 1, 1] = edge - np.sign(edge)     # +-64 beside +-64: one pass
        args65[1] = pack_conv_weights(wd)
        (call,) = _main_ops(args65, attrs65, "x86-64-v3")
        assert call.op == "qconv2d_quads" and not call.attrs.get("split"), edge


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """One fat x86-64 (v1) + v2 + v3 bundle per case (each compile a few seconds)."""
    from mlcpack.packager.export import ExportOptions, export_module

    out = {}
    root = tmp_path_factory.mktemp("madd7")
    for name, (seed, *shape) in CASES.items():
        args, attrs, expect = _case(seed, *shape)
        path = root / f"{name}.mlc"
        export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                      ExportOptions(target="x86-64,x86-64-v2,x86-64-v3", check=False))
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
