"""ConvTranspose on the fast kernels (passes/conv_transpose.py): phase convolutions or one
matmul, then an interleave. Checked against ONNX Runtime over the attribute space, against the
operator's numpy reference, by the IR the pass builds, and cross-compiled for other targets."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.codegen.contraction.match import match_contraction
from mlcpack.packager.codegen.objinfo import undefined_symbols
from mlcpack.packager.export import compile_module
from mlcpack.packager.ir.graph import Call
from mlcpack.packager.ops import get_op
from mlcpack.packager.passes.conv_transpose import axis_phases, decompose_conv_transpose
from mlcpack.packager.passes.pipeline import run_pipeline

from helpers import build_op_module, compile_and_run, run_op

ort = pytest.importorskip("onnxruntime")

from test_onnx_frontend import check_against_ort, make_model, node  # noqa: E402

RNG = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# (attributes, input shape, weight shape [Cin, Cout/group, k...])
ONNX_CASES = {
    "2d_k2s2": (dict(strides=[2, 2]), (1, 6, 5, 7), (6, 4, 2, 2)),
    "2d_k2s2_batch": (dict(strides=[2, 2]), (2, 5, 4, 3), (5, 3, 2, 2)),
    "2d_k4s2p1_gan": (dict(strides=[2, 2], pads=[1, 1, 1, 1]), (1, 8, 6, 5), (8, 4, 4, 4)),
    "2d_k3s2p1_op1": (dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                      (1, 4, 5, 6), (4, 3, 3, 3)),
    "2d_k3s2p1_crop": (dict(strides=[2, 2], pads=[1, 1, 1, 1]), (1, 4, 5, 6), (4, 3, 3, 3)),
    "2d_k3s1p1": (dict(pads=[1, 1, 1, 1]), (1, 5, 7, 6), (5, 6, 3, 3)),
    "2d_k1s2": (dict(strides=[2, 2]), (1, 3, 4, 4), (3, 2, 1, 1)),
    "2d_k3s3_asym_pads": (dict(strides=[3, 2], pads=[0, 1, 2, 0]), (1, 3, 4, 5), (3, 2, 3, 3)),
    "2d_groups2_k4s2p1": (dict(strides=[2, 2], pads=[1, 1, 1, 1], group=2), (1, 6, 5, 4),
                          (6, 2, 4, 4)),
    "2d_depthwise_k2s2": (dict(strides=[2, 2], group=4), (1, 4, 3, 5), (4, 1, 2, 2)),
    "2d_dilation2": (dict(strides=[2, 1], dilations=[2, 2], pads=[1, 0, 1, 2]), (1, 3, 5, 6),
                     (3, 4, 3, 2)),
    "2d_dilation_stride2": (dict(strides=[2, 2], dilations=[2, 3]), (1, 2, 4, 4), (2, 3, 2, 3)),
    "2d_output_shape": (dict(strides=[2, 2], output_shape=[9, 8]), (1, 4, 4, 3), (4, 2, 3, 3)),
    "2d_same_upper": (dict(strides=[2, 2], auto_pad="SAME_UPPER"), (1, 3, 5, 4), (3, 2, 3, 3)),
    "2d_same_lower": (dict(strides=[2, 2], auto_pad="SAME_LOWER"), (1, 3, 5, 4), (3, 2, 3, 3)),
    "2d_valid": (dict(strides=[2, 3], auto_pad="VALID"), (1, 3, 4, 4), (3, 2, 3, 2)),
    "2d_wide_k6s2": (dict(strides=[2, 2], pads=[1, 2, 1, 2]), (1, 3, 4, 5), (3, 2, 3, 6)),
    "1d_k4s2p1": (dict(strides=[2], pads=[1, 1]), (1, 6, 9), (6, 4, 4)),
    "1d_hifigan_k8s4p2": (dict(strides=[4], pads=[2, 2]), (1, 8, 7), (8, 4, 8)),
    "1d_k2s2": (dict(strides=[2]), (2, 3, 7), (3, 5, 2)),
    "1d_groups_op": (dict(strides=[3], pads=[1, 0], output_padding=[2], group=3), (1, 6, 5),
                     (6, 2, 4)),
    "3d_k2s2": (dict(strides=[2, 2, 2]), (1, 4, 3, 4, 5), (4, 3, 2, 2, 2)),
    "3d_k3s2p1_op1": (dict(strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1],
                           output_padding=[1, 1, 1]), (1, 3, 3, 4, 3), (3, 2, 3, 3, 3)),
    "3d_mixed": (dict(strides=[1, 2, 1], pads=[0, 1, 0, 1, 0, 0], group=2), (1, 4, 3, 3, 2),
                 (4, 2, 2, 3, 2)),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", sorted(ONNX_CASES))
def test_against_onnxruntime(case: str, bias: bool, tmp_path) -> None:
    attrs, x_shape, w_shape = ONNX_CASES[case]
    cout = w_shape[1] * attrs.get("group", 1)
    inits = {"w": rand(*w_shape)}
    if bias:
        inits["b"] = rand(cout)
    model = make_model([node("ConvTranspose", ["x", "w", "b"] if bias else ["x", "w"], ["y"],
                             **attrs)], {"x": list(x_shape)}, ["y"], inits)
    check_against_ort(model, {"x": rand(*x_shape)}, tmp_path)


def _kernels(mod) -> tuple[list[str], int]:
    """(kinds of the primitive functions' tagged contractions or their names, count)."""
    funcs = run_pipeline(mod, options=UNPACKED).prim_funcs()
    kinds = []
    for name, f in funcs.items():
        m = match_contraction(f)
        kinds.append(m.tag.kind if m is not None else name)
    return sorted(kinds), len(funcs)


def test_kernel_equal_stride_is_one_gemm_and_an_interleave() -> None:
    mod = build_op_module("nn.conv_transpose", [rand(1, 8, 6, 6), rand(8, 4, 2, 2), rand(4)],
                          [False, True, True], strides=(2, 2), padding=(0, 0, 0, 0),
                          dilation=(1, 1), output_padding=(0, 0))
    kinds, _ = _kernels(mod)
    assert kinds == ["conv2d", "phase_interleave"]


def test_3d_kernel_equal_stride_is_one_gemm() -> None:
    mod = build_op_module("nn.conv_transpose", [rand(1, 4, 3, 4, 5), rand(4, 3, 2, 2, 2)],
                          [False, True], strides=(2, 2, 2), padding=(0,) * 6,
                          dilation=(1, 1, 1), output_padding=(0, 0, 0))
    kinds, _ = _kernels(mod)
    assert kinds == ["conv2d", "phase_interleave"]


def test_3d_overlapping_kernel_is_one_gemm_and_a_col2im() -> None:
    mod = build_op_module("nn.conv_transpose", [rand(1, 3, 3, 4, 3), rand(3, 2, 3, 3, 3)],
                          [False, True], strides=(2, 2, 2), padding=(1,) * 6,
                          dilation=(1, 1, 1), output_padding=(1, 1, 1))
    kinds, _ = _kernels(mod)
    assert kinds == ["conv2d", "pad", "phase_interleave"]


def test_overlapping_kernel_is_fast_convolutions() -> None:
    # k=4, s=2, p=1 (GAN upsampler): two row phases, each one 2x1 convolution on the fast path
    mod = build_op_module("nn.conv_transpose", [rand(1, 8, 6, 6), rand(8, 4, 4, 4)],
                          [False, True], strides=(2, 2), padding=(1, 1, 1, 1),
                          dilation=(1, 1), output_padding=(0, 0))
    kinds, _ = _kernels(mod)
    assert kinds == ["conv2d", "conv2d", "phase_interleave"]


def test_runtime_weight_keeps_the_generic_kernel() -> None:
    mod = build_op_module("nn.conv_transpose", [rand(1, 3, 4, 4), rand(3, 2, 3, 3)],
                          strides=(2, 2), padding=(1, 1, 1, 1), dilation=(1, 1),
                          output_padding=(1, 1))
    after = decompose_conv_transpose(mod)
    assert [b.value.op for b in after.main.bindings() if isinstance(b.value, Call)] == \
        ["nn.conv_transpose"]


def test_runtime_weight_still_correct(tmp_path) -> None:
    x, w, b = rand(1, 3, 4, 4), rand(3, 2, 3, 3), rand(2)
    attrs = dict(strides=(2, 2), padding=(1, 0, 1, 1), dilation=(1, 1), output_padding=(1, 0))
    got = run_op("nn.conv_transpose", [x, w, b], tmp_path, **attrs)
    np.testing.assert_allclose(got, get_op("nn.conv_transpose").reference(x, w, b, **attrs),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,x_shape,w_shape", [
    (dict(strides=(2, 3), padding=(1, 0, 0, -1), dilation=(1, 2), output_padding=(1, 0),
          groups=2), (2, 4, 3, 4), (4, 3, 3, 2)),
    (dict(strides=(3,), padding=(4, 2), dilation=(1,), output_padding=(0,)), (1, 2, 8),
     (2, 3, 5)),
    (dict(strides=(2, 2), padding=(-1, 0, 0, -2), dilation=(1, 1), output_padding=(0, 1)),
     (1, 3, 4, 4), (3, 2, 2, 3)),
])
def test_against_numpy_reference_with_odd_pads(attrs, x_shape, w_shape, tmp_path) -> None:
    x, w, b = rand(*x_shape), rand(*w_shape), rand(w_shape[1] * attrs.get("groups", 1))
    got = run_op("nn.conv_transpose", [x, w, b], tmp_path, const_mask=[False, True, True],
                 **attrs)
    want = get_op("nn.conv_transpose").reference(x, w, b, **attrs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("w_shape,attrs", [
    ((16, 8, 2, 2), dict(strides=(2, 2), padding=(0, 0, 0, 0))),
    ((16, 8, 4, 4), dict(strides=(2, 2), padding=(1, 1, 1, 1))),
])
@pytest.mark.parametrize("threads,target", [(2, None), (1, "x86-64-v2")])
def test_two_threads_and_v2(w_shape, attrs, threads, target, tmp_path) -> None:
    x, w, b = rand(1, 16, 24, 20), rand(*w_shape), rand(8)
    full = dict(attrs, dilation=(1, 1), output_padding=(0, 0))
    mod = build_op_module("nn.conv_transpose", [x, w, b], [False, True, True], **full)
    got = compile_and_run(mod, {"x0": x}, tmp_path, target=target, threads=threads)["y"]
    np.testing.assert_allclose(got, get_op("nn.conv_transpose").reference(x, w, b, **full),
                               rtol=1e-4, atol=1e-4)


def test_axis_phases_cover_every_tap_once() -> None:
    for size, k, s, p, d in [(5, 4, 2, 1, 1), (7, 3, 2, 1, 1), (4, 3, 3, 0, 2), (6, 5, 2, 3, 2),
                             (3, 1, 2, 0, 1)]:
        out = s * (size - 1) + d * (k - 1) + 1 - 2 * p
        blocks = -(-out // s)
        for shared in (False, True):
            seen = []
            for r, ph in enumerate(axis_phases(size, k, s, p, d, blocks, shared)):
                if ph is None:
                    continue
                assert size + ph.pad_begin + ph.pad_end - ph.width + 1 >= blocks + ph.shift
                for tap, t in ph.taps:
                    seen.append(tap)
                    # phase output q reads input q + shift - pad_begin + t, which is where
                    # tap ``tap`` of that input lands on output q * s + r
                    i = 0 + ph.shift - ph.pad_begin + t
                    assert i * s + tap * d - p == r
            assert sorted(seen) == list(range(k))


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v4", "aarch64"])
def test_cross_compiles(target: str) -> None:
    for w_shape, attrs in [((4, 3, 2, 2), dict(strides=(2, 2), padding=(0,) * 4)),
                           ((4, 3, 4, 4), dict(strides=(2, 2), padding=(1,) * 4))]:
        mod = build_op_module("nn.conv_transpose", [rand(1, 4, 5, 6), rand(*w_shape), rand(3)],
                              [False, True, True], dilation=(1, 1), output_padding=(0, 0),
                              **attrs)
        _, compiled, _ = compile_module(mod, target=target)
        assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS)
