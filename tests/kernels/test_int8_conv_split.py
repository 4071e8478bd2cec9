"""Full-range int8 convolution weights on the AVX2 ``vpmaddubsw`` quad kernel, split in two
(ops/qconv_quads.py ``split_quads``, passes/quad_weights.py ``split``): ``vpmaddubsw`` adds the
products of a byte pair (channels 4q, 4q+1 or 4q+2, 4q+3 of one tap; uint8 x' times int8 w)
into a saturating int16, exact iff 255 (max(w0, 0) + max(w1, 0)) <= 32767 and 255 (min(w0,
0) + min(w1, 0)) >= -32768. The main quads keep every pair within that bound, the residual the
excess of the pairs over it, run as short loops over the (output channel, step) words that
hold one.

Exact integer math in numpy is the reference: an instruction model of the pair sums (the split
exact, the unsplit quads not), and compiled bundles at x86-64-v3, v2 and v1 (host features
pinned with MLCPACK_CPU_FEATURES), 1 and 2 threads, with the activations at their extremes
(255 and 0 after the kernel's shift) against same-sign pairs over the bound; the unsplit quads
run by the same kernel give wrong results (the split is what makes it exact)."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from conftest import X86_V2, X86_V3
from helpers import build_op_module
from mlcpack.packager.ops.qconv_quads import (folded_bias, pair_overflow, pairs_to_quads,
                                              split_quads, with_residual)
from mlcpack.packager.ops.qlinear import pack_conv_weights
from mlcpack.runtime.cpu import host_features
from test_int8_conv_madd7 import AVX2_HOST, X86_V1, _main_ops
from test_int8_gemm import MASK, _requant

X86 = platform.machine().lower() in ("x86_64", "amd64")


def _weights(rng, o: int, c: int, k: int, hot: int) -> np.ndarray:
    """Weights |w| <= 40 with ``hot`` same-sign pairs over the bound (127/-128 extremes among
    them) at random (output channel, channel pair, tap)."""
    wd = rng.integers(-40, 41, (o, c, k, k))
    for n in range(hot):
        oc, cq, ky, kx = (rng.integers(o), rng.integers(c // 2), rng.integers(k),
                          rng.integers(k))
        pair = [(127, 127), (-128, -128), (-128, -1), (100, 29), (-65, -64)][n % 5]
        wd[oc, 2 * cq, ky, kx], wd[oc, 2 * cq + 1, ky, kx] = pair
    return wd


def _case(seed: int, c: int, h: int, w: int, o: int, k: int, s: int, p: int, xd: str, xz: int,
          hot: int):
    """A qconv2d with those weights, activations at 255 / 0 (after the shift) where the
    weight signs make the pair sums largest, and its exact uint8 result."""
    rng = np.random.default_rng(seed)
    xi = np.iinfo(xd)
    wd = _weights(rng, o, c, k, hot)
    x = np.where(rng.random((1, c, h, w)) < 0.8, xi.max, xi.min).astype(xd)
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


CASES = {   # seed, C, H, W, O, k, stride, pad, x dtype, x zp, same-sign pairs over the bound
    # 13 outputs: two 6-row tiles and a partial one; 7 channels: an odd pair, a short quad
    "3x3_s1_u8": (1, 7, 12, 13, 13, 3, 1, 1, "uint8", 0, 3),
    "3x3_s1_s8": (2, 16, 9, 9, 12, 3, 1, 1, "int8", -128, 5),
    "3x3_s2_u8": (3, 12, 10, 10, 8, 3, 2, 1, "uint8", 131, 2),
    "1x1_s1_u8": (4, 64, 7, 7, 24, 1, 1, 0, "uint8", 3, 4),
}


def _sat_sums(xq: np.ndarray, wq: np.ndarray) -> np.ndarray:
    """``vpmaddubsw`` + ``vpmaddwd`` by ones on quads: uint8 x [..., 4] times int8 w [..., 4],
    each byte pair's sum saturated to int16, the two pairs added in int32."""
    p = xq.astype(np.int64) * wq.astype(np.int64)
    pairs = np.clip(p[..., 0::2] + p[..., 1::2], -32768, 32767)
    return pairs.sum(axis=-1)


def test_split_keeps_the_weights_and_the_bound() -> None:
    """main + residual = w, both within the pair bound, at the extremes (-128, 127) and on
    random full-range weights; the residual lists exactly the (output channel, step) words
    holding a pair over it, by channel."""
    rng = np.random.default_rng(0)
    for wd in (rng.integers(-128, 128, (13, 9, 3, 3)),
               np.full((6, 4, 1, 1), 127), np.full((6, 4, 1, 1), -128),
               _weights(rng, 20, 32, 3, 6)):
        wq = pairs_to_quads(pack_conv_weights(wd), wd.shape[2] * wd.shape[3])
        main, index, res = split_quads(wq)
        np.testing.assert_array_equal(with_residual(main, index, res), wq)
        for part in (main, res):
            assert not pair_overflow(part[..., 0::2], part[..., 1::2]).any()
        over = pair_overflow(wq[..., 0::2], wq[..., 1::2]).any(axis=3)   # [ot, steps, 6]
        rows = over.transpose(0, 2, 1).reshape(-1, wq.shape[1])
        n = rows.shape[0]
        assert index[n] == len(res) == rows.sum()
        assert list(index[n + 1:]) == list(np.nonzero(rows)[1])
        np.testing.assert_array_equal(np.diff(index[:n + 1]), rows.sum(axis=1))


def test_pair_sums_exact_only_split() -> None:
    """The instruction model at 255 everywhere (and on random bytes): the unsplit quads
    saturate where a same-sign pair passes the bound, main + residual (two passes, int32 sums)
    equal the exact sums."""
    rng = np.random.default_rng(1)
    wd = _weights(rng, 12, 16, 3, 8)
    wq = pairs_to_quads(pack_conv_weights(wd), 9)
    main, index, res = split_quads(wq)
    dense_res = with_residual(np.zeros_like(main), index, res).astype(np.int8)
    for xq in (np.full(wq.shape, 255, np.uint8),
               rng.integers(0, 256, wq.shape).astype(np.uint8)):
        exact = (xq.astype(np.int64) * wq).sum(axis=-1)
        split = _sat_sums(xq, main) + _sat_sums(xq, dense_res)
        np.testing.assert_array_equal(split, exact)
    full = np.full(wq.shape, 255, np.uint8)
    assert (_sat_sums(full, wq) != (255 * wq.astype(np.int64)).sum(axis=-1)).any()


def test_selection_rule() -> None:
    """Full-range weights with few words over the bound: quads marked w7 and split (two more
    inputs) on x86 sets without VNNI on every level; a VNNI-only set keeps its quads unsplit;
    aarch64 and ``conv_quads7=False`` keep qconv2d; too many such words (random full-range
    weights) keep qconv2d. The pipeline only: nothing compiled."""
    args, attrs, _ = _case(*CASES["3x3_s1_u8"])
    for target in ("x86-64-v3", "x86-64-v2,x86-64-v3", "x86-64-v4,x86-64-v4+vnni"):
        (call,) = _main_ops(args, attrs, target)
        assert call.op == "qconv2d_quads" and call.attrs.get("split") is True, target
        assert call.attrs.get("w7") is True and len(call.args) == 8, target
    (call,) = _main_ops(args, attrs, "x86-64-v4+vnni")
    assert call.op == "qconv2d_quads" and not call.attrs.get("split") and len(call.args) == 6
    for target, fields in (("aarch64", {}), ("x86-64-v3", {"conv_quads7": False})):
        (call,) = _main_ops(args, attrs, target, **fields)
        assert call.op == "qconv2d", target
    dense = list(args)
    dense[1] = pack_conv_weights(np.random.default_rng(2).integers(-127, 128, (13, 7, 3, 3)))
    (call,) = _main_ops(dense, attrs, "x86-64-v3")
    assert call.op == "qconv2d"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """One fat x86-64 (v1) + v2 + v3 bundle per case (each compile a few seconds)."""
    from mlcpack.packager.export import ExportOptions, export_module

    out = {}
    root = tmp_path_factory.mktemp("split")
    for name, spec in CASES.items():
        args, attrs, expect = _case(*spec)
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


@AVX2_HOST
def test_unsplit_quads_are_wrong(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kernel (``w7``: vpmaddubsw at x86-64-v3) on the unsplit full-range quads
    saturates: its results differ from the exact ones, which the split run matches."""
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    args, attrs, expect = _case(*CASES["3x3_s1_u8"])
    x, wk, xz, bias, mult, yz = args
    wq = pairs_to_quads(wk, 9)
    quad_args = [x, wq, xz, folded_bias(bias, wq, int(xz)), mult, yz]
    main, index, res = split_quads(wq)
    runs = {"unsplit": (quad_args, {}), "split": (
        [x, main, xz, quad_args[3], mult, yz, index, res], {"split": True})}
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    got = {}
    for name, (inputs, extra) in runs.items():
        path = tmp_path / f"{name}.mlc"
        mod = build_op_module("qconv2d_quads", inputs, MASK + [True] * (len(inputs) - 6),
                              **attrs, shift=0, w7=True, **extra)
        export_module(mod, path, ExportOptions(target="x86-64-v3", check=False))
        with load(path) as model:
            got[name] = model.run({"x0": x})["y"]
    np.testing.assert_array_equal(got["split"], expect)
    assert (got["unsplit"] != expect).sum() > 0


def test_split_merged_back_on_512bit_vnni() -> None:
    """A bundle with a level without VNNI and x86-64-v4+vnni (the portable set's top) splits
    full-range weights; its VNNI level merges them back into the int8 weights on each call
    (codegen/qgemm_conv.py ``_merge_residual``) and runs the 512-bit tile: vpdpbusd on zmm
    only, no residual loops on ymm. On any host (the emitted code)."""
    import re

    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    args, attrs, _ = _case(*CASES["1x1_s1_u8"])
    levels = "x86-64-v4,x86-64-v4+vnni"
    opts = CompileOptions(target=levels)
    mod = run_pipeline(build_op_module("qconv2d", args, MASK, **attrs), DEFAULT_PIPELINE,
                       options=opts)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    target = resolve_target("x86-64-v4+vnni")
    code = compile_prim_funcs(funcs, target, options=opts.for_targets(
        [resolve_target(t) for t in levels.split(",")]))
    (kernel,) = code.kernels.values()
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    assert re.search(r"\bvpdpbusd\s+[^\n]*%zmm", asm)
    assert not re.search(r"\bvpdpbusd\s+[^\n]*%ymm", asm)
    assert "vpdpbusd on 512-bit vectors" in kernel.choice


@pytest.mark.skipif(not X86 or "avx512_vnni" not in host_features(),
                    reason="runs 512-bit vpdpbusd natively: needs an x86-64 host with "
                           "avx512_vnni")
def test_split_merged_back_exact_natively(tmp_path) -> None:
    """Each case's split weights (a bundle of x86-64-v4 and v4+vnni) on this host's VNNI
    level, merged back, bit for bit against exact integer math, 1 and 2 threads."""
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    for name, spec in CASES.items():
        args, attrs, expect = _case(*spec)
        path = tmp_path / f"{name}.mlc"
        export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                      ExportOptions(target="x86-64-v4,x86-64-v4+vnni", check=False))
        (kernel,) = describe(path)["kernels"]
        assert kernel["num_inputs"] == 8, kernel        # split: the residual's two inputs
        for threads in (1, 2):
            with load(path, threads=threads) as model:
                np.testing.assert_array_equal(model.run({"x0": args[0]})["y"], expect,
                                              err_msg=f"{name} {threads}")
