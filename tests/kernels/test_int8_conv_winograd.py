"""Exact integer Winograd F(2x2, 3x3) for quantized 3x3 stride-1 convolutions with full-range
int8 weights on x86 sets without VNNI (``qconv2d`` ``winograd``: ops/qlinear.py
``pack_winograd_weights``, codegen/qgemm_conv.py ``_emit_wino``, passes/int8_cost.py
``int_winograd``).

Exact integer math in numpy is the reference: the weights' transform and its inverse, the
selection (on by default for full-range weights, off with the option, for 7-bit weights, odd
small outputs and sets with a VNNI level), and compiled bundles at x86-64-v3 and v2 (host
features pinned with MLCPACK_CPU_FEATURES), 1 and 2 threads, on weights at +-127 / -128 and
activations at their extremes: 8-bit results (with and without a lut8 table), float32 results,
a partial last vector per row, a tail tile of output channels, odd channel counts, uneven
padding and two bands of tile rows."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import X86_V2, X86_V3
from helpers import build_op_module
from mlcpack.packager.ops.qlinear import (pack_conv_weights, pack_winograd_weights,
                                          unpack_winograd_weights)
from test_int8_conv_madd7 import AVX2_HOST, _main_ops
from test_int8_gemm import MASK, _requant


def _case(seed: int, c: int, h: int, w: int, o: int, pads: tuple, xd: str, xz: int,
          out: str = "uint8", table: bool = False):
    """A 3x3 stride-1 qconv2d with full-range weights (rows at +127, -128 and alternating),
    activations mostly at their extremes, and its exact result."""
    rng = np.random.default_rng(seed)
    xi = np.iinfo(xd)
    wd = rng.integers(-128, 128, (o, c, 3, 3))
    wd[0], wd[1] = 127, -128
    wd[2] = np.where(np.arange(c)[:, None, None] % 2, 127, -128)
    x = np.where(rng.random((2, c, h, w)) < 0.5, xi.max, xi.min).astype(xd)
    x[:, :, ::3] = rng.integers(xi.min, xi.max + 1, x[:, :, ::3].shape)
    bias = rng.integers(-30000, 30000, o).astype(np.int32)
    xp = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    acc = np.zeros((2, o, oh, ow), np.int64)
    for ky in range(3):
        for kx in range(3):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + oh, kx:kx + ow], wd[:, :, ky, kx])
    acc += bias.reshape(1, o, 1, 1)
    span = np.maximum(np.abs(acc).max(axis=(0, 2, 3)), 1).astype(np.float64)
    mult = (120.0 / span).astype(np.float32)
    if out == "float32":
        off = rng.normal(0, 1, o).astype(np.float32)
        expect = (acc.astype(np.int32).astype(np.float32) * mult.reshape(1, o, 1, 1)
                  + off.reshape(1, o, 1, 1))
        yz = off
    else:
        expect = _requant(acc, mult.reshape(1, o, 1, 1), 128, "uint8")
        yz = np.array(128, np.float32)
    args = [x, pack_conv_weights(wd), np.array(xz, np.int32), bias, mult, yz]
    if table:
        lut = rng.integers(0, 256, (o, 256)).astype(np.uint8)
        args.append(lut)
        expect = np.take_along_axis(lut[None, :, None, :].repeat(2, 0),
                                    expect.reshape(2, o, 1, -1).astype(np.int64),
                                    axis=3).reshape(expect.shape)
    attrs = dict(out_channels=o, kernel=(3, 3), strides=(1, 1), padding=pads, dtype=out)
    return args, attrs, expect


CASES = {   # seed, C, H, W, O, pads, x dtype, x zp, result, table
    # 10 x 10 outputs (5 tiles a row: a partial vector), 13 outputs (a tail tile), 7 channels
    "u8_odd": (1, 7, 10, 10, 13, (1, 1, 1, 1), "uint8", 3, "uint8", False),
    # 16 x 8 outputs (whole vectors), int8 x, uneven padding, a lut8 table
    "s8_pad_lut": (2, 16, 16, 8, 12, (0, 1, 2, 1), "int8", -5, "uint8", True),
    # float32 results (a quantized product whose result stays float)
    "f32": (3, 12, 8, 12, 8, (1, 1, 1, 1), "uint8", 200, "float32", False),
    # 9 x 11 outputs: odd, a row and a column of the last tiles dropped
    "odd": (5, 9, 9, 11, 7, (1, 1, 1, 1), "uint8", 250, "uint8", False),
    # 40 x 40 outputs on 64 channels: two bands of tile rows (WINO_V_BYTES)
    "bands": (4, 64, 40, 40, 16, (1, 1, 1, 1), "uint8", 77, "uint8", False),
}


def test_weight_transform_roundtrip() -> None:
    """U' = (2G) w (2G)^T is integral within int16 (|U'| <= 9 * 128) and L U' L^T / 4 gives w
    back exactly, at the extremes and at random."""
    rng = np.random.default_rng(0)
    wd = rng.integers(-128, 128, (13, 9, 3, 3))
    wd[0], wd[1] = 127, -128
    u = pack_winograd_weights(wd)
    assert u.dtype == np.int16 and np.abs(u.astype(np.int64)).max() <= 9 * 128
    np.testing.assert_array_equal(unpack_winograd_weights(u, 13, 9), wd)


def test_selection_rule() -> None:
    """Full-range weights on a 3x3 stride-1 layer with outputs of 8 or more take the Winograd
    weights on x86 sets without VNNI on every level; the option off, 7-bit weights, small
    outputs and a set with a VNNI level leave it (the option on: any). The pipeline only."""
    args, attrs, _ = _case(*CASES["bands"])
    for target in ("x86-64-v3", "x86-64-v2,x86-64-v3"):
        (call,) = _main_ops(args, attrs, target)
        assert call.op == "qconv2d" and call.attrs.get("winograd") is True, target
        assert call.args[1].data.dtype == np.int16 and call.args[1].data.shape[1] == 16 * 32
    for target, fields in (("x86-64-v3", {"conv_int_winograd": False}),
                           ("x86-64-v3,x86-64-v4+vnni", {})):
        (call,) = _main_ops(args, attrs, target, **fields)
        assert not call.attrs.get("winograd"), target
    small = list(args)
    small[1] = pack_conv_weights(np.clip(np.random.default_rng(1).integers(-64, 65, (16, 64, 3, 3)),
                                         -64, 64))
    (call,) = _main_ops(small, attrs, "x86-64-v3")
    assert call.op == "qconv2d_quads" and not call.attrs.get("winograd")
    (call,) = _main_ops(small, attrs, "x86-64-v3", conv_int_winograd=True)
    assert call.attrs.get("winograd") is True
    small = _case(5, 16, 7, 7, 16, (1, 1, 1, 1), "uint8", 0)[:2]     # 7 x 7 outputs
    (call,) = _main_ops(*small, "x86-64-v3")
    assert not call.attrs.get("winograd")
    (call,) = _main_ops(*small, "x86-64-v3", conv_int_winograd=True)
    assert call.attrs.get("winograd") is True


def test_numpy_op_matches_direct() -> None:
    """The op's numpy form on the Winograd weights equals the k-pair op's on the originals."""
    from mlcpack.packager.ops.qlinear import qconv2d, unpack_conv_weights

    args, attrs, expect = _case(*CASES["u8_odd"])
    wd = unpack_conv_weights(args[1], 13, 7, 3, 3)
    wino = [args[0], pack_winograd_weights(wd)] + args[2:]
    np.testing.assert_array_equal(qconv2d(*wino, **attrs, winograd=True), expect)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """One x86-64-v2 + v3 bundle per case (the rule takes the Winograd kernel)."""
    from mlcpack.packager.export import ExportOptions, export_module

    out = {}
    root = tmp_path_factory.mktemp("wino")
    for name, spec in CASES.items():
        args, attrs, expect = _case(*spec)
        path = root / f"{name}.mlc"
        mask = MASK + [True] * (len(args) - len(MASK))      # a lut8 table: a constant
        export_module(build_op_module("qconv2d", args, mask, **attrs), path,
                      ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
        out[name] = (path, args[0], expect)
    return out


@AVX2_HOST
@pytest.mark.parametrize("case", list(CASES))
def test_exact_at_v3_v2(case: str, bundles: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlcpack.runtime import load

    path, x, expect = bundles[case]
    assert len(np.unique(expect)) > 3
    for flags in (X86_V3, X86_V2):
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        for threads in (1, 2):
            with load(path, threads=threads) as model:
                got = model.run({"x0": x})["y"]
                np.testing.assert_array_equal(got, expect, err_msg=f"{flags[-20:]} {threads}")
