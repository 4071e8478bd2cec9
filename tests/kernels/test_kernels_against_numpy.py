"""Every compiled kernel against its operator's numpy reference, on odd shapes."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.ops import get_op
from mlcpack.packager.options import UNPACKED

from helpers import run_op

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check(op: str, inputs, tmp_path, rtol=1e-5, atol=1e-5, const_mask=None, **attrs):
    got = run_op(op, inputs, tmp_path, const_mask=const_mask, **attrs)
    want = get_op(op).reference(*inputs, **attrs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "maximum", "minimum"])
@pytest.mark.parametrize("shapes", [((3, 17), (3, 17)), ((2, 3, 5), (5,)), ((4, 1, 6), (1, 7, 1))])
def test_binary_broadcast(op, shapes, tmp_path):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    if op == "divide":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    check(op, [a, b], tmp_path)


@pytest.mark.parametrize("op", ["relu", "negative", "abs", "exp", "tanh", "sigmoid", "erf", "gelu",
                                "silu"])
def test_unary(op, tmp_path):
    x = (rand(5, 37) * 4).astype(np.float32)
    check(op, [x], tmp_path, rtol=2e-6, atol=2e-6)


def test_log_sqrt(tmp_path):
    x = (np.abs(rand(3, 41)) + 0.01).astype(np.float32)
    check("log", [x], tmp_path, rtol=1e-6, atol=1e-6)
    check("sqrt", [x], tmp_path, rtol=1e-6, atol=1e-6)


def test_clip_leaky_relu(tmp_path):
    x = rand(2, 33)
    check("clip", [x], tmp_path, min=-0.5, max=0.75)
    check("leaky_relu", [x], tmp_path, alpha=0.1)


def test_nan_propagates_through_relu_and_max(tmp_path):
    x = rand(1, 8)
    x[0, 3] = np.nan
    got = run_op("relu", [x], tmp_path)
    assert np.isnan(got[0, 3]) and not np.isnan(np.delete(got, 3)).any()


@pytest.mark.parametrize("shapes,transpose_b", [
    (((1, 784), (128, 784)), True),
    (((7, 13), (13, 5)), False),
    (((2, 3, 9, 4), (4, 11)), False),
    (((3, 1, 5, 6), (2, 6, 7)), False),
    (((2, 5, 8), (2, 3, 8)), True),
])
def test_matmul(shapes, transpose_b, tmp_path):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    check("matmul", [a, b], tmp_path, rtol=1e-4, atol=1e-4, const_mask=[False, True],
          transpose_b=transpose_b)


@pytest.mark.parametrize("cfg", [
    dict(x=(1, 3, 9, 9), w=(4, 3, 1, 1)),
    dict(x=(1, 3, 15, 13), w=(5, 3, 7, 7), strides=(2, 2), padding=(3, 3, 3, 3)),
    dict(x=(2, 4, 10, 11), w=(6, 2, 3, 3), groups=2, padding=(1, 0, 2, 1)),
    dict(x=(1, 6, 9, 9), w=(6, 1, 3, 3), groups=6, padding=(1, 1, 1, 1)),
    dict(x=(1, 2, 12, 12), w=(3, 2, 3, 3), dilation=(2, 2), strides=(1, 2)),
])
def test_conv2d(cfg, tmp_path):
    cfg = dict(cfg)
    x, w = rand(*cfg.pop("x")), rand(*cfg.pop("w"))
    check("nn.conv2d", [x, w], tmp_path, rtol=1e-4, atol=1e-4, const_mask=[False, True], **cfg)


@pytest.mark.parametrize("op", ["nn.max_pool2d", "nn.avg_pool2d"])
@pytest.mark.parametrize("cfg", [
    dict(kernel=(2, 2), strides=(2, 2)),
    dict(kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),
    dict(kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1), ceil_mode=True),
    dict(kernel=(3, 2), strides=(1, 2), padding=(1, 0, 1, 1), count_include_pad=True),
])
def test_pools(op, cfg, tmp_path):
    check(op, [rand(1, 3, 11, 10)], tmp_path, **cfg)


MAX_POOLS = [
    dict(x=(1, 64, 112, 112), kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),  # ResNet
    dict(x=(2, 3, 37, 35), kernel=(3, 3), strides=(1, 1), padding=(1, 1, 1, 1)),
    dict(x=(1, 2, 19, 41), kernel=(5, 4), strides=(2, 1), padding=(2, 0, 2, 3)),
    dict(x=(1, 3, 23, 40), kernel=(3, 3), strides=(2, 2), dilation=(2, 2), ceil_mode=True),
    dict(x=(1, 2, 9, 7), kernel=(2, 2), strides=(2, 2), padding=(1, 1, 1, 1), ceil_mode=True),
    dict(x=(1, 2, 17, 50), kernel=(5, 5), strides=(2, 2), padding=(2, 2, 2, 2)),  # even pad, s2
    dict(x=(1, 2, 6, 33), kernel=(3, 3), strides=(1, 2), padding=(0, 0, 0, 0)),
]


@pytest.mark.parametrize("cfg", MAX_POOLS)
def test_max_pool_vector_kernel(cfg, tmp_path):
    """The vectorized max pool (codegen/pool.py): strides 1 and 2, padding, dilation, ceil
    mode, rows not multiples of the vector width, NaN propagated like the loop nest's."""
    from mlcpack.packager.codegen.pool import match_max_pool
    from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline

    from helpers import build_op_module

    cfg = dict(cfg)
    x = rand(*cfg.pop("x"))
    x[0, 0, 3, 4] = np.nan
    funcs = run_pipeline(build_op_module("nn.max_pool2d", [x], **cfg),
                         DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values()
    assert any(match_max_pool(f) for f in funcs)
    got = run_op("nn.max_pool2d", [x], tmp_path, **cfg)
    want = get_op("nn.max_pool2d").reference(x, **cfg)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v2"])
def test_max_pool_vector_kernel_narrow_targets(target, tmp_path):
    from helpers import build_op_module, compile_and_run

    x = rand(1, 3, 15, 13)
    attrs = dict(kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1))
    got = compile_and_run(build_op_module("nn.max_pool2d", [x], **attrs), {"x0": x}, tmp_path,
                          target=target)["y"]
    np.testing.assert_array_equal(got, get_op("nn.max_pool2d").reference(x, **attrs))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axes,keepdims", [((1,), True), ((0, 2), False), (None, True)])
def test_reductions(op, axes, keepdims, tmp_path):
    check(op, [rand(3, 17, 5)], tmp_path, rtol=1e-5, atol=1e-5, axes=axes, keepdims=keepdims)


def test_whole_tensor_min_max_vector_loop_keeps_nan_and_zero_order(tmp_path):
    """A float32 min / max over every axis (DynamicQuantizeLinear's range) runs as a flat
    8-lane loop plus a tail (codegen/lower.py ``_reduce_whole_min_max``); its result is the
    scalar loop's: a NaN anywhere, in a vector block or the tail, propagates, and -0 is below
    +0 in either order."""
    from mlcpack.packager.ir import BlockBuilder, prim_func, te

    from helpers import compile_and_run

    shape = (2, 5, 7, 8)                                     # 560: 17 blocks of 32 + 16
    bb = BlockBuilder()
    x = bb.input("x", shape)
    a = te.placeholder(shape, name="a")
    low = tuple(te.reduce_axis(n, f"r{d}") for d, n in enumerate(shape))
    high = tuple(te.reduce_axis(n, f"s{d}") for d, n in enumerate(shape))
    lo = te.compute((2,), lambda i: te.min_of(a[low], low)
                    - te.max_of(a[high], high) * te.cast(i, "float32"), name="range")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.call_tir(prim_func("range", [a], lo), [x]))
        bb.emit_func_output(y, names=["y"])
    mod = bb.get()
    from llvmlite import ir

    from mlcpack.packager.codegen.lower import emit_kernel

    module = ir.Module("range")
    emit_kernel(module, prim_func("range", [a], lo), "range")
    assert "llvm.minimum.v8f32" in str(module) and "llvm.maximum.v8f32" in str(module)
    cases = []
    v = RNG.standard_normal(shape).astype(np.float32)
    cases.append(v)
    for at in (3, 40 * 8 + 5, 551):                           # block lanes and the tail
        w = v.copy()
        w.reshape(-1)[at] = np.nan
        cases.append(w)
    for first in (-0.0, 0.0):
        z = np.abs(v)                                          # min is a zero, max positive
        z.reshape(-1)[[10, 555]] = [first, -first]
        cases.append(z)
    for case in cases:
        got = compile_and_run(mod, {"x": case}, tmp_path)["y"]
        lo_w, hi_w = np.min(case), np.max(case)
        want = np.array([lo_w, lo_w - hi_w], np.float32)
        np.testing.assert_array_equal(got, want)
        if not np.isnan(lo_w) and lo_w == 0:
            assert np.signbit(got[0])                          # -0 < +0, wherever they are


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(op, axis, tmp_path):
    check(op, [rand(2, 19, 3) * 5], tmp_path, rtol=1e-5, atol=1e-6, axis=axis)


def test_transpose_concat(tmp_path):
    check("transpose", [rand(2, 3, 5)], tmp_path, axes=(2, 0, 1))
    check("concat", [rand(2, 3), rand(2, 5), rand(2, 1)], tmp_path, axis=1)


def test_float_mod_has_c_fmod_semantics_without_libm(tmp_path):
    from mlcpack.packager.ir import BlockBuilder, prim_func, te

    from helpers import compile_and_run

    bb = BlockBuilder()
    x = bb.input("x", (67,))
    a = te.placeholder((67,), name="a")
    out = te.compute((67,), lambda i: a[i] % 0.75, name="m")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.call_tir(prim_func("fmod", [a], out), [x]))
        bb.emit_func_output(y, names=["y"])
    v = RNG.uniform(-5, 5, 67).astype(np.float32)
    got = compile_and_run(bb.get(), {"x": v}, tmp_path)["y"]
    np.testing.assert_allclose(got, np.fmod(v, np.float32(0.75)), atol=1e-6)
