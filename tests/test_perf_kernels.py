"""The register-blocked matmul/conv2d kernels (codegen/gemm.py) against numpy references: odd
shapes (not multiples of the vector width or of the register block), 1x1 and 7x7 windows,
stride 2, asymmetric padding, groups and depthwise, fused epilogues, 2 threads and the narrower
vector targets."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.codegen.gemm import match_contraction
from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.ops import get_op
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline

from helpers import build_op_module, compile_and_run

RNG = np.random.default_rng(1)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def uses_fast_kernel(mod) -> bool:
    funcs = run_pipeline(mod, DEFAULT_PIPELINE).prim_funcs().values()
    return any(match_contraction(f) is not None for f in funcs)


def run(mod, feeds, tmp_path, **kw):
    return compile_and_run(mod, feeds, tmp_path, **kw)["y"]


CONVS = [
    dict(x=(1, 3, 9, 9), w=(4, 3, 1, 1)),                                     # 1x1, og < MR
    dict(x=(1, 13, 7, 5), w=(17, 13, 1, 1)),                                  # odd everything
    dict(x=(1, 3, 15, 13), w=(5, 3, 7, 7), strides=(2, 2), padding=(3, 3, 3, 3)),  # 7x7 s2
    dict(x=(2, 4, 10, 11), w=(6, 2, 3, 3), groups=2, padding=(1, 0, 2, 1)),   # groups, batch 2
    dict(x=(1, 6, 9, 9), w=(6, 1, 3, 3), groups=6, padding=(1, 1, 1, 1)),     # depthwise
    dict(x=(1, 24, 14, 14), w=(24, 1, 3, 3), groups=24, strides=(2, 2), padding=(1, 1, 1, 1)),
    dict(x=(1, 8, 12, 12), w=(19, 8, 3, 3), strides=(1, 2), padding=(1, 1, 1, 1)),
    dict(x=(1, 16, 9, 9), w=(33, 16, 1, 1), strides=(2, 2)),                  # 1x1 s2 downsample
    dict(x=(1, 5, 40, 37), w=(7, 5, 3, 3), padding=(1, 1, 1, 1)),            # many panels
    dict(x=(1, 2, 6, 6), w=(3, 2, 5, 2), padding=(0, 2, 1, 0)),              # rectangular window
]


@pytest.mark.parametrize("cfg", CONVS)
def test_conv2d_fast_kernel(cfg, tmp_path):
    cfg = dict(cfg)
    x, w = rand(*cfg.pop("x")), rand(*cfg.pop("w"))
    mod = build_op_module("nn.conv2d", [x, w], [False, True], **cfg)
    assert uses_fast_kernel(mod)
    got = run(mod, {"x0": x}, tmp_path)
    want = get_op("nn.conv2d").reference(x, w, **cfg)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _conv_block(x, w, bias, scale, shift, residual, **attrs):
    """conv -> +bias -> *scale +shift (BatchNorm) -> +residual -> relu, as the ONNX frontend
    emits it."""
    bb = BlockBuilder()
    xv = bb.input("x", x.shape, "float32")
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_op("nn.conv2d", xv, bb.constant(w, "w"), **attrs)
            y = bb.emit_op("add", y, bb.constant(bias, "b"))
            y = bb.emit_op("multiply", y, bb.constant(scale, "s"))
            y = bb.emit_op("add", y, bb.constant(shift, "t"))
            if residual is not None:
                y = bb.emit_op("add", y, bb.constant(residual, "r"))
            y = bb.emit_output(bb.emit_op("relu", y))
        bb.emit_func_output(y, names=["y"])
    return bb.get()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", [None, "x86-64-v3", "x86-64-v2"])
def test_conv_fused_epilogue(threads, target, tmp_path):
    x, w = rand(1, 7, 11, 10), rand(13, 7, 3, 3)
    bias, scale, shift = rand(1, 13, 1, 1), rand(1, 13, 1, 1), rand(1, 13, 1, 1)
    residual = rand(1, 13, 11, 10)
    mod = _conv_block(x, w, bias, scale, shift, residual, padding=(1, 1, 1, 1))
    assert uses_fast_kernel(mod)
    got = run(mod, {"x": x}, tmp_path, target=target, threads=threads)
    conv = get_op("nn.conv2d").reference(x, w, padding=(1, 1, 1, 1))
    want = np.maximum(((conv + bias) * scale + shift) + residual, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


MATMULS = [
    ((1, 784), (784, 128)),
    ((1, 13), (13, 5)),
    ((7, 13), (13, 17)),
    ((64, 31), (31, 130)),
    ((2, 3, 9, 4), (4, 11)),
    ((3, 1, 5, 6), (2, 6, 7)),
    ((1, 4, 19, 8), (1, 4, 8, 19)),
]


@pytest.mark.parametrize("shapes", MATMULS)
@pytest.mark.parametrize("b_const", [True, False])
def test_matmul_fast_kernel(shapes, b_const, tmp_path):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    mod = build_op_module("matmul", [a, b], [False, b_const])
    assert uses_fast_kernel(mod)
    feeds = {"x0": a} if b_const else {"x0": a, "x1": b}
    got = run(mod, feeds, tmp_path)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", [None, "x86-64-v3"])
def test_matmul_transposed_constant_and_epilogue(threads, target, tmp_path):
    a, w, bias = rand(5, 37), rand(29, 37), rand(29)
    bb = BlockBuilder()
    av = bb.input("x", a.shape, "float32")
    with bb.function("main", [av]):
        with bb.dataflow():
            y = bb.emit_op("matmul", av, bb.constant(w, "w"), transpose_b=True)
            y = bb.emit_output(bb.emit_op("relu", bb.emit_op("add", y, bb.constant(bias, "b"))))
        bb.emit_func_output(y, names=["y"])
    mod = bb.get()
    assert uses_fast_kernel(mod)
    got = run(mod, {"x": a}, tmp_path, target=target, threads=threads)
    np.testing.assert_allclose(got, np.maximum(a @ w.T + bias, 0), rtol=1e-4, atol=1e-4)
