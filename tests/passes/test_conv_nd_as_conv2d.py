"""N-D convolution and pooling on the fast 2-D kernels (passes/conv_nd.py): a 3-D conv as a depth
unfold + one conv2d (+ a slice), 3-D pools as two separable 2-D pools, 1-D windows as 2-D ones.
Checked against ONNX Runtime over the attribute space, against the operators' numpy references
(runtime weights, the IR rows directly), by the kernels the pipeline builds, and
cross-compiled for other targets."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.codegen.contraction.match import match_contraction
from mlcpack.packager.codegen.objinfo import undefined_symbols
from mlcpack.packager.codegen.pool import match_max_pool
from mlcpack.packager.export import compile_module
from mlcpack.packager.ir.graph import Call
from mlcpack.packager.ops import get_op
from mlcpack.packager.passes.conv_nd import decompose_conv_nd
from mlcpack.packager.passes.pipeline import run_pipeline

from helpers import build_op_module, compile_and_run, run_op

ort = pytest.importorskip("onnxruntime")

from test_onnx_frontend import check_against_ort, make_model, node  # noqa: E402

RNG = np.random.default_rng(17)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# (attributes, input shape, weight shape [Cout, Cin/group, k...])
CONV_CASES = {
    "3d_k3p1": (dict(pads=[1] * 6), (1, 3, 4, 6, 7), (5, 3, 3, 3, 3)),
    "3d_batch2": (dict(pads=[1] * 6), (2, 4, 3, 5, 5), (6, 4, 3, 3, 3)),
    "3d_strides": (dict(strides=[2, 2, 2], pads=[1] * 6), (1, 4, 5, 9, 8), (6, 4, 3, 3, 3)),
    "3d_stride_rows_3": (dict(strides=[1, 3, 2], pads=[0, 1, 0, 1, 2, 1]), (1, 2, 4, 10, 7),
                         (3, 2, 2, 3, 3)),
    "3d_asym_pads": (dict(pads=[0, 1, 2, 2, 0, 1]), (1, 3, 4, 5, 6), (4, 3, 3, 2, 3)),
    "3d_dilation": (dict(dilations=[2, 1, 1], pads=[2, 1, 1, 2, 1, 1]), (1, 3, 6, 5, 5),
                    (4, 3, 3, 3, 3)),
    "3d_dilation_rows": (dict(dilations=[1, 2, 2], pads=[1, 2, 2, 1, 2, 2]), (1, 2, 3, 7, 6),
                         (3, 2, 3, 3, 3)),
    "3d_groups2": (dict(group=2, pads=[1] * 6), (1, 4, 3, 5, 4), (6, 2, 3, 3, 3)),
    "3d_depthwise": (dict(group=6, pads=[1] * 6), (1, 6, 4, 6, 5), (6, 1, 3, 3, 3)),
    "3d_depthwise_s2": (dict(group=4, strides=[2, 2, 2], pads=[1] * 6), (1, 4, 5, 7, 7),
                        (8, 1, 3, 3, 3)),
    "3d_1x1x1": (dict(), (1, 8, 3, 4, 5), (6, 8, 1, 1, 1)),
    "3d_1x1xk": (dict(pads=[0, 0, 1, 0, 0, 1], strides=[1, 1, 2]), (1, 3, 3, 4, 9),
                 (4, 3, 1, 1, 3)),
    "3d_kx1x1_temporal": (dict(pads=[1, 0, 0, 1, 0, 0]), (1, 4, 5, 3, 4), (6, 4, 3, 1, 1)),
    "3d_1xkxk_spatial": (dict(pads=[0, 1, 1, 0, 1, 1]), (1, 4, 3, 6, 6), (5, 4, 1, 3, 3)),
    "3d_depth_stride_only": (dict(strides=[2, 1, 1]), (1, 3, 7, 4, 4), (4, 3, 2, 1, 1)),
    "3d_same_upper": (dict(auto_pad="SAME_UPPER", strides=[2, 2, 1]), (1, 3, 5, 6, 5),
                      (4, 3, 2, 3, 3)),
    "3d_same_lower": (dict(auto_pad="SAME_LOWER"), (1, 3, 4, 5, 5), (4, 3, 2, 2, 3)),
    "3d_valid": (dict(auto_pad="VALID", strides=[1, 2, 2]), (1, 3, 5, 7, 7), (4, 3, 3, 3, 3)),
    "3d_kernel_covers_input": (dict(), (1, 2, 3, 3, 3), (4, 2, 3, 3, 3)),
    "3d_dilation_cols": (dict(dilations=[1, 1, 2], pads=[1, 0, 2, 1, 1, 2], strides=[1, 2, 1]),
                         (1, 2, 3, 6, 7), (3, 2, 3, 2, 3)),
    # stacked slices sharing padding rows (row stride 1, bottom <= top), and not
    "3d_rows_pad_above": (dict(pads=[1, 2, 0, 1, 1, 1]), (1, 2, 6, 5, 4), (3, 2, 3, 3, 2)),
    "3d_rows_pad_below": (dict(pads=[1, 0, 1, 1, 2, 0]), (1, 2, 6, 5, 4), (3, 2, 3, 3, 2)),
    # depth folded into the channels (3 D <= 4 kd: one banded 2-D conv, passes/conv_nd.py)
    "3d_fold_d2_p1": (dict(pads=[1] * 6), (1, 8, 2, 5, 6), (6, 8, 3, 3, 3)),
    "3d_fold_depth_dilated_strided": (dict(strides=[2, 1, 2], dilations=[2, 1, 1],
                                           pads=[2, 1, 0, 2, 0, 1]), (1, 3, 3, 6, 7),
                                      (4, 3, 3, 3, 2)),
    "3d_fold_asym_stride_rows": (dict(strides=[1, 2, 1], pads=[1, 0, 1, 0, 2, 1]),
                                 (2, 3, 2, 7, 5), (5, 3, 2, 2, 3)),
    "3d_fold_1x1_plane": (dict(pads=[1, 0, 0, 2, 0, 0]), (1, 5, 3, 4, 4), (7, 5, 3, 1, 1)),
    "2d_dilation": (dict(dilations=[2, 2], pads=[2, 2, 2, 2]), (1, 4, 9, 8), (5, 4, 3, 3)),
    "2d_dilation_rows_strided": (dict(dilations=[3, 1], strides=[2, 2], pads=[3, 1, 2, 0]),
                                 (1, 3, 11, 9), (4, 3, 3, 3)),
    "2d_dilation_cols_groups": (dict(dilations=[1, 2], group=2, pads=[1, 2, 1, 2]),
                                (1, 4, 7, 9), (6, 2, 3, 3)),
    "2d_dilation_depthwise": (dict(dilations=[2, 2], group=4, pads=[2] * 4), (1, 4, 8, 8),
                              (4, 1, 3, 3)),
    "1d_dilated_tcn": (dict(dilations=[4], pads=[8, 0]), (1, 6, 20), (8, 6, 3)),
    "1d_k5p2": (dict(pads=[2, 2]), (1, 6, 17), (8, 6, 5)),
    "1d_strided_dilated": (dict(strides=[2], dilations=[2], pads=[1, 3]), (2, 4, 19),
                           (5, 4, 3)),
    "1d_groups": (dict(group=3, pads=[1, 1]), (1, 6, 11), (9, 2, 3)),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_against_onnxruntime(case: str, bias: bool, tmp_path) -> None:
    attrs, x_shape, w_shape = CONV_CASES[case]
    inits = {"w": rand(*w_shape)}
    if bias:
        inits["b"] = rand(w_shape[0])
    # a ReLU after the convolution: its epilogue takes the fused path too
    model = make_model([node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], **attrs),
                        node("Relu", ["c"], ["y"])], {"x": list(x_shape)}, ["y"], inits)
    check_against_ort(model, {"x": rand(*x_shape)}, tmp_path)


POOL_CASES = {
    "max_122": ("MaxPool", dict(kernel_shape=[1, 2, 2], strides=[1, 2, 2]), (1, 3, 4, 8, 8)),
    "max_222": ("MaxPool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), (1, 3, 4, 6, 8)),
    "max_333_s2_p1": ("MaxPool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6),
                      (1, 2, 7, 9, 8)),
    "max_asym_pads": ("MaxPool", dict(kernel_shape=[3, 2, 3], strides=[1, 2, 1],
                                      pads=[0, 1, 2, 2, 0, 1]), (1, 2, 5, 6, 7)),
    "max_dilation": ("MaxPool", dict(kernel_shape=[2, 2, 2], dilations=[2, 1, 2],
                                     pads=[1, 0, 1, 1, 0, 1]), (1, 2, 6, 5, 7)),
    "max_ceil": ("MaxPool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], ceil_mode=1),
                 (1, 2, 6, 8, 7)),
    "max_ceil_pads": ("MaxPool", dict(kernel_shape=[2, 3, 2], strides=[2, 2, 3], pads=[1, 0, 1,
                                      0, 1, 1], ceil_mode=1), (1, 2, 5, 8, 8)),
    "max_stride3": ("MaxPool", dict(kernel_shape=[3, 3, 3], strides=[3, 3, 3]), (1, 2, 6, 9, 9)),
    "max_same_upper": ("MaxPool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2],
                                       auto_pad="SAME_UPPER"), (1, 2, 5, 6, 7)),
    "max_depth_only": ("MaxPool", dict(kernel_shape=[3, 1, 1], strides=[2, 1, 1]),
                       (1, 3, 7, 4, 5)),
    "avg_222": ("AveragePool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), (1, 3, 4, 6, 8)),
    "avg_333_p1": ("AveragePool", dict(kernel_shape=[3, 3, 3], pads=[1] * 6), (1, 2, 5, 6, 7)),
    "avg_333_p1_include": ("AveragePool", dict(kernel_shape=[3, 3, 3], pads=[1] * 6,
                                               count_include_pad=1), (1, 2, 5, 6, 7)),
    "avg_asym_ceil": ("AveragePool", dict(kernel_shape=[3, 2, 3], strides=[2, 2, 2],
                                          pads=[1, 0, 0, 0, 1, 1], ceil_mode=1),
                      (1, 2, 6, 7, 8)),
    "avg_asym_ceil_include": ("AveragePool", dict(kernel_shape=[3, 2, 3], strides=[2, 2, 2],
                                                  pads=[1, 0, 0, 0, 1, 1], ceil_mode=1,
                                                  count_include_pad=1), (1, 2, 6, 7, 8)),
    "avg_same_lower": ("AveragePool", dict(kernel_shape=[2, 3, 3], strides=[2, 1, 2],
                                           auto_pad="SAME_LOWER"), (1, 2, 5, 6, 7)),
    "avg_2d_p1": ("AveragePool", dict(kernel_shape=[3, 3], pads=[1] * 4), (1, 4, 9, 10)),
    "avg_2d_s2_ceil_include": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                                   pads=[1, 0, 0, 1], ceil_mode=1,
                                                   count_include_pad=1), (2, 3, 9, 10)),
    "avg_2d_s2_ceil": ("AveragePool", dict(kernel_shape=[2, 3], strides=[3, 2], pads=[0, 1, 1, 1],
                                           ceil_mode=1), (1, 3, 10, 11)),
    "avg_2d_stride3_generic": ("AveragePool", dict(kernel_shape=[3, 3], strides=[3, 3],
                                                   pads=[1] * 4), (1, 2, 10, 10)),
    "avg_2d_one_channel": ("AveragePool", dict(kernel_shape=[3, 3], pads=[1] * 4),
                           (1, 1, 7, 8)),
    "max_1d": ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1]), (1, 4, 15)),
    "max_1d_ceil_dilated": ("MaxPool", dict(kernel_shape=[3], strides=[2], dilations=[2],
                                            ceil_mode=1), (2, 3, 16)),
    "avg_1d": ("AveragePool", dict(kernel_shape=[4], strides=[3], pads=[2, 1]), (1, 4, 17)),
    "avg_1d_include_ceil": ("AveragePool", dict(kernel_shape=[3], strides=[2], pads=[1, 1],
                                                count_include_pad=1, ceil_mode=1), (1, 4, 16)),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool_against_onnxruntime(case: str, tmp_path) -> None:
    op, attrs, x_shape = POOL_CASES[case]
    model = make_model([node(op, ["x"], ["y"], **attrs)], {"x": list(x_shape)}, ["y"])
    check_against_ort(model, {"x": rand(*x_shape)}, tmp_path)


# ---- the IR rows directly (runtime weights, other frontends) ------------------------------------

@pytest.mark.parametrize("const_weight", [True, False])
@pytest.mark.parametrize("attrs,x_shape,w_shape", [
    (dict(strides=(1, 2, 1), padding=(1, 0, 2, 0, 1, 1), dilation=(2, 1, 1), groups=2),
     (1, 4, 6, 5, 5), (6, 2, 2, 3, 3)),
    (dict(strides=(2,), padding=(1, 2), dilation=(1,), groups=1), (2, 3, 13), (4, 3, 4)),
    (dict(strides=(1, 2), padding=(1, 0, 0, 1), dilation=(1, 1), groups=1), (1, 3, 6, 7),
     (4, 3, 3, 2)),
])
def test_conv_row_against_reference(attrs, x_shape, w_shape, const_weight, tmp_path) -> None:
    x, w = rand(*x_shape), rand(*w_shape)
    got = run_op("nn.conv", [x, w], tmp_path, const_mask=[False, const_weight], **attrs)
    want = get_op("nn.conv").reference(x, w, **attrs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,extra", [("max", {}), ("avg", {"count_include_pad": True}),
                                        ("avg", {"ceil_mode": True})])
@pytest.mark.parametrize("x_shape,kernel,strides,padding", [
    ((1, 3, 5, 6, 7), (2, 3, 2), (2, 1, 2), (1, 1, 0, 0, 1, 1)),
    ((2, 3, 11), (3,), (2,), (1, 0)),
    ((1, 2, 7, 6), (3, 2), (2, 2), (1, 0, 1, 1)),
])
def test_pool_row_against_reference(mode, extra, x_shape, kernel, strides, padding,
                                    tmp_path) -> None:
    x = rand(*x_shape)
    attrs = dict(mode=mode, kernel=kernel, strides=strides, padding=padding,
                 dilation=(1,) * len(kernel), **extra)
    got = run_op("nn.pool", [x], tmp_path, **attrs)
    want = get_op("nn.pool").reference(x, **attrs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [
    dict(kernel=(3, 1, 1), strides=(2, 1, 1), dilation=(1, 1, 1), pads=(1, 1, 0),
         sizes=(3, 6, 4)),
    dict(kernel=(2, 3, 2), strides=(1, 2, 3), dilation=(2, 1, 2), pads=(1, 2, 1),
         sizes=(4, 3, 2)),
])
def test_window_unfold_reference_and_kernel(attrs, tmp_path) -> None:
    x = rand(2, 2, 5, 3, 4)
    want = get_op("nn.window_unfold").reference(x, **attrs)
    assert want.shape == (2, 2) + attrs["kernel"] + attrs["sizes"]
    # by definition: y[n, c, t.., j..] = x[n, c, j * s - p + t * d ..], zero outside
    for index in np.ndindex(*want.shape[2:]):
        taps, js = index[:3], index[3:]
        pos = [j * s - p + t * d for j, s, p, t, d in
               zip(js, attrs["strides"], attrs["pads"], taps, attrs["dilation"])]
        inside = all(0 <= q < n for q, n in zip(pos, x.shape[2:]))
        np.testing.assert_array_equal(want[(slice(None), slice(None)) + index],
                                      x[(slice(None), slice(None)) + tuple(pos)] if inside
                                      else np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(run_op("nn.window_unfold", [x], tmp_path, **attrs), want)


# ---- what the pipeline builds -------------------------------------------------------------------

def _kernels(mod) -> list[str]:
    """Per primitive function: the fast kernel it matches (conv2d, matmul, max_pool2d) or its
    name."""
    kinds = []
    for name, f in run_pipeline(mod, options=UNPACKED).prim_funcs().items():
        m = match_contraction(f)
        if m is not None:
            kinds.append(m.tag.kind)
        elif match_max_pool(f) is not None:
            kinds.append("max_pool2d")
        else:
            kinds.append(name)
    return sorted(kinds)


def test_3d_conv_is_an_unfold_and_one_conv2d() -> None:
    mod = build_op_module("nn.conv", [rand(1, 4, 5, 6, 6), rand(8, 4, 3, 3, 3)], [False, True],
                          strides=(1, 1, 1), padding=(1,) * 6, dilation=(1, 1, 1), groups=1)
    assert _kernels(mod) == ["conv2d", "strided_slice", "window_unfold"]


def test_short_clip_folds_its_depth_into_one_conv2d() -> None:
    # 3 D <= 4 kd: every output slice a block of output channels of one 2-D conv over the input's
    # slices as channels (views: no unfold, no slice); runtime weights keep the unfold
    args = dict(strides=(1, 1, 1), padding=(1,) * 6, dilation=(1, 1, 1), groups=1)
    x, w = rand(1, 4, 2, 6, 6), rand(8, 4, 3, 3, 3)
    mod = build_op_module("nn.conv", [x, w], [False, True], **args)
    assert _kernels(mod) == ["conv2d"]
    after = [b.value for b in decompose_conv_nd(mod).main.bindings() if isinstance(b.value, Call)]
    conv = next(v for v in after if v.op == "nn.conv2d")
    assert conv.type.shape == (1, 8 * 2, 6, 6) and conv.args[1].type.shape == (16, 8, 3, 3)
    assert _kernels(build_op_module("nn.conv", [x, w], [False, False], **args)) == \
        ["conv2d", "strided_slice", "window_unfold"]


# a 3-D conv (unfolded: 8 slices) + bias + ReLU, then a pool: (pool attributes, whether the
# pool reads the stacked slices, no slice: its windows never reach the rows between them)
SLICE_POOLS = {
    "max_122": (dict(kernel_shape=[1, 2, 2], strides=[1, 2, 2]), True),
    "avg_222": (dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), True),
    "max_133_p1": (dict(kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1]), False),
}


@pytest.mark.parametrize("case", sorted(SLICE_POOLS))
def test_pool_reads_the_stacked_slices(case: str, tmp_path) -> None:
    attrs, elided = SLICE_POOLS[case]
    op = "AveragePool" if case.startswith("avg") else "MaxPool"
    inits = {"w": rand(6, 3, 3, 3, 3), "b": rand(6)}
    model = make_model([node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 6),
                        node("Relu", ["c"], ["r"]), node(op, ["r"], ["y"], **attrs)],
                       {"x": [1, 3, 8, 6, 7]}, ["y"], inits)
    from mlcpack.frontends.onnx import import_onnx

    after = decompose_conv_nd(import_onnx(model)[0])
    ops = [b.value.op for b in after.main.bindings() if isinstance(b.value, Call)]
    assert ("strided_slice" not in ops) == elided, ops
    check_against_ort(model, {"x": rand(1, 3, 8, 6, 7)}, tmp_path)


def test_dilated_conv_is_an_unfold_and_a_fast_conv2d() -> None:
    mod = build_op_module("nn.conv2d", [rand(1, 4, 9, 9), rand(8, 4, 3, 3)], [False, True],
                          strides=(1, 1), padding=(2, 2, 2, 2), dilation=(2, 2), groups=1)
    assert _kernels(mod) == ["conv2d", "window_unfold"]


def test_3d_pointwise_conv_reads_the_input_as_2d() -> None:
    mod = build_op_module("nn.conv", [rand(1, 4, 3, 6, 6), rand(8, 4, 1, 1, 1)], [False, True],
                          strides=(1, 1, 1), padding=(0,) * 6, dilation=(1, 1, 1), groups=1)
    assert _kernels(mod) == ["conv2d"]


def test_3d_max_pool_is_two_fast_2d_pools() -> None:
    mod = build_op_module("nn.pool", [rand(1, 4, 6, 8, 8)], mode="max", kernel=(3, 3, 3),
                          strides=(2, 2, 2), padding=(1,) * 6, dilation=(1, 1, 1))
    assert _kernels(mod) == ["max_pool2d", "max_pool2d"]


def test_padded_average_pool_is_a_depthwise_conv() -> None:
    # the window counts differ at the borders: a multiply, fused into the conv's epilogue
    mod = build_op_module("nn.avg_pool2d", [rand(1, 4, 8, 8)], kernel=(3, 3), strides=(1, 1),
                          padding=(1, 1, 1, 1))
    after = decompose_conv_nd(mod)
    assert [b.value.op for b in after.main.bindings() if isinstance(b.value, Call)] == \
        ["nn.conv2d", "multiply"]
    assert _kernels(mod) == ["conv2d"]


def test_lp_pool_keeps_the_generic_kernel() -> None:
    mod = build_op_module("nn.pool", [rand(1, 2, 4, 4, 4)], mode="lp", kernel=(2, 2, 2),
                          strides=(1, 1, 1), padding=(0,) * 6, dilation=(1, 1, 1))
    after = decompose_conv_nd(mod)
    assert [b.value.op for b in after.main.bindings() if isinstance(b.value, Call)] == \
        ["nn.pool"]


def test_conv3d_on_two_threads(tmp_path) -> None:
    x, w = rand(2, 8, 4, 10, 12), rand(16, 8, 3, 3, 3)
    attrs = dict(strides=(1, 1, 1), padding=(1,) * 6, dilation=(1, 1, 1), groups=1)
    mod = build_op_module("nn.conv", [x, w], [False, True], **attrs)
    got = compile_and_run(mod, {"x0": x}, tmp_path, threads=2)["y"]
    np.testing.assert_allclose(got, get_op("nn.conv").reference(x, w, **attrs), rtol=1e-4,
                               atol=1e-4)


def test_runs_on_x86_64_v2(tmp_path) -> None:
    x, w = rand(1, 3, 4, 7, 6), rand(5, 3, 3, 3, 3)
    attrs = dict(strides=(1, 2, 1), padding=(1,) * 6, dilation=(1, 1, 1), groups=1)
    mod = build_op_module("nn.conv", [x, w], [False, True], **attrs)
    got = compile_and_run(mod, {"x0": x}, tmp_path, target="x86-64-v2")["y"]
    np.testing.assert_allclose(got, get_op("nn.conv").reference(x, w, **attrs), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v4", "aarch64"])
def test_cross_compiles(target: str) -> None:
    mods = [build_op_module("nn.conv", [rand(1, 4, 3, 6, 6), rand(8, 2, 3, 3, 3)],
                            [False, True], strides=(1, 2, 2), padding=(1,) * 6,
                            dilation=(1, 1, 1), groups=2),
            build_op_module("nn.pool", [rand(1, 4, 6, 8, 8)], mode="max", kernel=(3, 3, 3),
                            strides=(2, 2, 2), padding=(1,) * 6, dilation=(1, 1, 1)),
            build_op_module("nn.pool", [rand(1, 4, 6, 8, 8)], mode="avg", kernel=(2, 3, 3),
                            strides=(2, 1, 1), padding=(0, 1, 1, 1, 1, 1), dilation=(1, 1, 1))]
    for mod in mods:
        _, compiled, _ = compile_module(mod, target=target)
        assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS)
