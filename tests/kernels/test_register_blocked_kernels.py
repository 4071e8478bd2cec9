"""The register-blocked matmul/conv2d kernels (codegen/contraction/) and the depthwise kernel
(codegen/depthwise/static.py) against numpy references: odd shapes (not multiples of the vector width
or of the register block), 1x1 and 7x7 windows, stride 2, asymmetric padding, groups and
depthwise, fused epilogues, 2 threads and the narrower vector targets (AArch64 run under
qemu)."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.codegen.depthwise.static import match_depthwise
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.codegen.contraction.geometry import conv_geometry
from mlcpack.packager.codegen.contraction.match import match_contraction
from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.ops import get_op
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline

from helpers import build_op_module, compile_and_run, force_parallel_kernels

RNG = np.random.default_rng(1)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def uses_fast_kernel(mod) -> bool:
    funcs = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values()
    return any(match_contraction(f) is not None for f in funcs)


def uses_depthwise_kernel(mod) -> bool:
    funcs = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values()
    return any(match_depthwise(f) is not None for f in funcs)


def run(mod, feeds, tmp_path, **kw):
    return compile_and_run(mod, feeds, tmp_path, **kw)["y"]


@pytest.fixture(autouse=True)
def split_every_kernel(monkeypatch):
    """Mark every kernel parallel, however small, so the tests with threads > 1 run the task
    splits on these small, odd shapes."""
    force_parallel_kernels(monkeypatch, outputs=False)


CONVS = [
    dict(x=(1, 3, 9, 9), w=(4, 3, 1, 1)),                                     # 1x1, og < MR
    dict(x=(1, 13, 7, 5), w=(17, 13, 1, 1)),                                  # odd everything
    dict(x=(1, 3, 15, 13), w=(5, 3, 7, 7), strides=(2, 2), padding=(3, 3, 3, 3)),  # 7x7 s2
    dict(x=(2, 4, 10, 11), w=(6, 2, 3, 3), groups=2, padding=(1, 0, 2, 1)),   # groups, batch 2
    dict(x=(1, 6, 9, 9), w=(12, 3, 3, 3), groups=2, padding=(1, 1, 1, 1)),    # 2 groups of 3
    dict(x=(1, 8, 12, 12), w=(19, 8, 3, 3), strides=(1, 2), padding=(1, 1, 1, 1)),
    dict(x=(1, 16, 9, 9), w=(33, 16, 1, 1), strides=(2, 2)),                  # 1x1 s2 downsample
    dict(x=(1, 5, 40, 37), w=(7, 5, 3, 3), padding=(1, 1, 1, 1)),            # many panels
    dict(x=(1, 2, 6, 6), w=(3, 2, 5, 2), padding=(0, 2, 1, 0)),              # rectangular window
    # 1x1 stride 1 unpadded on a large image reads the input in place (no plane copy)
    dict(x=(1, 13, 17, 19), w=(7, 13, 1, 1)),                                 # partial last panel
    dict(x=(1, 9, 16, 32), w=(10, 9, 1, 1)),                                  # exact panels
    dict(x=(2, 8, 24, 24), w=(8, 2, 1, 1), groups=4),                         # groups, batch 2
    dict(x=(1, 1, 5, 7), w=(3, 1, 1, 1)),                         # one channel: only the tail
    dict(x=(2, 37, 7, 7), w=(70, 37, 1, 1)),                      # 7x7: one partial panel
    # >= 16 groups of several channels (depthwise ones have their own kernel): each task copies
    # one group's planes at a time into its own region
    dict(x=(1, 32, 11, 9), w=(32, 2, 3, 3), groups=16, padding=(1, 1, 1, 1)),
    dict(x=(2, 36, 13, 12), w=(18, 2, 5, 5), groups=18, strides=(2, 2), padding=(2, 1, 2, 2)),
    # the 4 x 4-vector register block (AVX-512) with a partial block row and panel
    dict(x=(1, 3, 20, 20), w=(10, 3, 3, 3), padding=(1, 1, 1, 1)),
    # planes larger than the L2 reuse bound, small weights: block rows innermost
    dict(x=(1, 64, 48, 48), w=(8, 64, 3, 3), padding=(1, 1, 1, 1)),
]


@pytest.mark.parametrize("cfg", CONVS)
def test_conv2d_fast_kernel(cfg, tmp_path):
    cfg = dict(cfg)
    x, w = rand(*cfg.pop("x")), rand(*cfg.pop("w"))
    mod = build_op_module("nn.conv2d", [x, w], [False, True], **cfg)
    assert uses_fast_kernel(mod) and not uses_depthwise_kernel(mod)
    got = run(mod, {"x0": x}, tmp_path)
    want = get_op("nn.conv2d").reference(x, w, **cfg)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# conv_geometry's choices on AVX-512: (x, w, attrs, planes shifted by tap column?, vector width)
LAYOUTS = [
    # ResNet-18's 7x7 layer shape: shifted planes (no dropped columns), 3 x 7 half vectors
    ((1, 24, 7, 7), (40, 24, 3, 3), dict(padding=(1, 1, 1, 1)), True, 8),
    # 14x14: 4 x 5 half vectors
    ((1, 16, 14, 14), (32, 16, 3, 3), dict(padding=(1, 1, 1, 1)), True, 8),
    # stride 2 shifted: row phases x tap columns; a partial last panel
    ((1, 16, 31, 29), (24, 16, 3, 3), dict(strides=(2, 2), padding=(1, 1, 1, 1)), True, 8),
    # asymmetric padding, 1x3 window, stride (1, 2), full-width vectors
    ((1, 32, 13, 21), (24, 32, 1, 3), dict(strides=(1, 2), padding=(0, 2, 1, 0)), True, 16),
    # large planes stay in the stride-phase layout (copying kw times would not fit L2); the
    # block rows innermost, so each task copies only the plane rows of its panels (and the
    # first rows that the last panel's dropped columns spill into)
    ((1, 64, 58, 58), (16, 64, 3, 3), dict(padding=(1, 1, 1, 1)), False, 16),
    ((1, 32, 91, 83), (9, 32, 3, 3), dict(strides=(2, 2), padding=(1, 0, 1, 1)), False, 8),
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("case", range(len(LAYOUTS)))
def test_conv_plane_layouts(case, threads, tmp_path):
    xs, ws, attrs, shifted, vl = LAYOUTS[case]
    x, w = rand(*xs), rand(*ws)
    want = get_op("nn.conv2d").reference(x, w, **attrs)
    full = {"strides": (1, 1), "padding": (0, 0, 0, 0), "groups": 1, **attrs}
    g = conv_geometry(xs, ws, want.shape, full, 16)
    assert (g["shifted"], g["vl"]) == (shifted, vl)
    assert g["panel_outer"] == (case >= 4)
    mod = build_op_module("nn.conv2d", [x, w], [False, True], **attrs)
    got = run(mod, {"x0": x}, tmp_path, threads=threads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v2"])
def test_conv_plane_layouts_narrow_targets(target, tmp_path):
    """The narrower targets' plan (one tile, both layouts) on the same shapes, 2 threads."""
    for xs, ws, attrs, _, _ in LAYOUTS[:4]:
        x, w = rand(*xs), rand(*ws)
        mod = build_op_module("nn.conv2d", [x, w], [False, True], **attrs)
        got = run(mod, {"x0": x}, tmp_path, target=target, threads=2)
        np.testing.assert_allclose(got, get_op("nn.conv2d").reference(x, w, **attrs),
                                   rtol=1e-4, atol=1e-4)


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


@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_in_place_fused_epilogue(threads, tmp_path):
    x, w = rand(1, 19, 20, 21), rand(11, 19, 1, 1)
    bias, scale, shift = rand(1, 11, 1, 1), rand(1, 11, 1, 1), rand(1, 11, 1, 1)
    residual = rand(1, 11, 20, 21)
    mod = _conv_block(x, w, bias, scale, shift, residual)
    got = run(mod, {"x": x}, tmp_path, threads=threads)
    conv = get_op("nn.conv2d").reference(x, w)
    want = np.maximum(((conv + bias) * scale + shift) + residual, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [2, 3, 9])
def test_grouped_task_regions(threads, tmp_path):
    """Many groups of 2 channels, more tasks than workspace regions: the extra tasks get no
    groups."""
    x, w = rand(1, 40, 60, 58), rand(40, 2, 3, 3)
    bias, scale, shift = rand(1, 40, 1, 1), rand(1, 40, 1, 1), rand(1, 40, 1, 1)
    attrs = dict(groups=20, padding=(1, 1, 1, 1))
    mod = _conv_block(x, w, bias, scale, shift, None, **attrs)
    assert uses_fast_kernel(mod) and not uses_depthwise_kernel(mod)
    got = run(mod, {"x": x}, tmp_path, threads=threads)
    conv = get_op("nn.conv2d").reference(x, w, **attrs)
    np.testing.assert_allclose(got, np.maximum((conv + bias) * scale + shift, 0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ["sigmoid", "clip"])
def test_conv_epilogue_scalar_and_vector_paths(act, tmp_path):
    """A math call in the epilogue (sigmoid) takes the scalar path, a clip the vector one; a
    residual read on rows that end mid-vector (masked lanes)."""
    x, w, bias = rand(1, 5, 13, 11), rand(9, 5, 3, 3), rand(1, 9, 1, 1)
    residual = rand(1, 9, 13, 11)
    bb = BlockBuilder()
    xv = bb.input("x", x.shape, "float32")
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_op("nn.conv2d", xv, bb.constant(w, "w"), padding=(1, 1, 1, 1))
            y = bb.emit_op("add", y, bb.constant(bias, "b"))
            y = bb.emit_op("add", y, bb.constant(residual, "r"))
            if act == "clip":
                y = bb.emit_op("clip", y, min=-0.5, max=0.75)
            else:
                y = bb.emit_op(act, y)
            y = bb.emit_output(y)
        bb.emit_func_output(y, names=["y"])
    mod = bb.get()
    funcs = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values()
    assert len([f for f in funcs if match_contraction(f) is not None]) == 1
    got = run(mod, {"x": x}, tmp_path)
    z = get_op("nn.conv2d").reference(x, w, padding=(1, 1, 1, 1)) + bias + residual
    want = np.clip(z, -0.5, 0.75) if act == "clip" else 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_pointwise_epilogue_row_broadcast(tmp_path):
    """An addend broadcast across rows (shape 1 x C x 1 x W) is not contiguous across row ends:
    the in-place 1x1 kernel's epilogue goes row by row."""
    x, w, r = rand(1, 6, 9, 21), rand(11, 6, 1, 1), rand(1, 11, 1, 21)
    bb = BlockBuilder()
    xv = bb.input("x", x.shape, "float32")
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_op("nn.conv2d", xv, bb.constant(w, "w"))
            y = bb.emit_output(bb.emit_op("add", y, bb.constant(r, "r")))
        bb.emit_func_output(y, names=["y"])
    got = run(bb.get(), {"x": x}, tmp_path)
    np.testing.assert_allclose(got, get_op("nn.conv2d").reference(x, w) + r, rtol=1e-4,
                               atol=1e-4)


# Depthwise convolutions (one input channel per group): codegen/depthwise/static.py. Widths below,
# between and above the vector widths (4, 8, 16), not multiples of them.
DEPTHWISE = [
    dict(x=(1, 5, 9, 9), w=(5, 1, 3, 3), padding=(1, 1, 1, 1)),             # one border chunk
    dict(x=(2, 6, 13, 37), w=(6, 1, 3, 3), padding=(1, 1, 1, 1)),           # batch 2
    dict(x=(1, 3, 12, 41), w=(3, 1, 3, 3)),                                 # unpadded
    dict(x=(1, 4, 20, 53), w=(4, 1, 3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),
    dict(x=(1, 3, 17, 70), w=(3, 1, 3, 3), strides=(2, 2), padding=(0, 2, 1, 0)),  # asymmetric
    dict(x=(1, 3, 19, 64), w=(3, 1, 3, 3), strides=(2, 2)),                 # unpadded, stride 2
    dict(x=(1, 4, 16, 64), w=(4, 1, 5, 5), strides=(2, 2), padding=(2, 2, 2, 2)),  # 5x5 s2
    dict(x=(1, 3, 11, 29), w=(3, 1, 5, 5), padding=(2, 2, 2, 2)),           # 5x5 s1
    dict(x=(1, 2, 9, 100), w=(2, 1, 3, 7), strides=(1, 2), padding=(1, 3, 1, 3)),  # wide taps
    dict(x=(1, 2, 7, 40), w=(2, 1, 2, 19), padding=(0, 9, 1, 9)),           # taps > 16 wide
    dict(x=(1, 4, 10, 10), w=(8, 1, 3, 3), padding=(1, 1, 1, 1)),           # multiplier 2
    dict(x=(1, 3, 6, 6), w=(3, 1, 3, 3), strides=(3, 1), padding=(4, 0, 4, 0)),  # empty rows
    dict(x=(1, 2, 5, 7), w=(2, 1, 3, 3), padding=(1, 5, 1, 5)),             # empty chunks
    dict(x=(1, 3, 70, 3), w=(3, 1, 3, 3), padding=(1, 1, 1, 1)),            # 3 wide, tall
    dict(x=(1, 2, 1, 1), w=(2, 1, 1, 1)),                                   # one element
]


@pytest.mark.parametrize("cfg", DEPTHWISE)
def test_depthwise_kernel(cfg, tmp_path, threads=2):
    """2 threads: each task's share of the planes (the fixture makes every kernel parallel)."""
    cfg = dict(cfg)
    x, w = rand(*cfg.pop("x")), rand(*cfg.pop("w"))
    cfg["groups"] = x.shape[1]
    mod = build_op_module("nn.conv2d", [x, w], [False, True], **cfg)
    assert uses_depthwise_kernel(mod)
    got = run(mod, {"x0": x}, tmp_path, threads=threads)
    want = get_op("nn.conv2d").reference(x, w, **cfg)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _depthwise_block(x, w, bias, residual, act, **attrs):
    """depthwise conv -> +bias -> (+residual) -> act, as a fused MobileNet block."""
    bb = BlockBuilder()
    xv = bb.input("x", x.shape, "float32")
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_op("nn.conv2d", xv, bb.constant(w, "w"), groups=x.shape[1], **attrs)
            y = bb.emit_op("add", y, bb.constant(bias, "b"))
            if residual is not None:
                y = bb.emit_op("add", y, bb.constant(residual, "r"))
            y = bb.emit_op("clip", y, min=0.0, max=6.0) if act == "clip" else bb.emit_op(act, y)
            y = bb.emit_output(y)
        bb.emit_func_output(y, names=["y"])
    return bb.get()


def _depthwise_want(x, w, bias, residual, act, **attrs):
    z = get_op("nn.conv2d").reference(x, w, groups=x.shape[1], **attrs) + bias
    z = z if residual is None else z + residual
    return np.clip(z, 0, 6) if act == "clip" else 1 / (1 + np.exp(-z))


DW_EPILOGUES = [
    # (x, w, attrs, residual?, act): MobileNet's 3x3 stride 1 and 2 with bias + ReLU6, a
    # residual read along rows (masked at their ends), a sigmoid (the scalar epilogue)
    ((1, 7, 13, 29), (7, 1, 3, 3), dict(padding=(1, 1, 1, 1)), False, "clip"),
    ((2, 5, 12, 35), (5, 1, 3, 3), dict(strides=(2, 2), padding=(1, 1, 1, 1)), False, "clip"),
    ((1, 6, 9, 21), (6, 1, 3, 3), dict(padding=(1, 1, 1, 1)), True, "clip"),
    ((1, 3, 8, 19), (6, 1, 3, 3), dict(strides=(2, 2), padding=(0, 1, 1, 0)), False, "sigmoid"),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", [None, "x86-64-v3", "x86-64-v2"])
@pytest.mark.parametrize("case", range(len(DW_EPILOGUES)))
def test_depthwise_fused_epilogue(case, target, threads, tmp_path):
    xs, ws, attrs, res, act = DW_EPILOGUES[case]
    x, w = rand(*xs), rand(*ws)
    bias = rand(1, ws[0], 1, 1)
    want_shape = get_op("nn.conv2d").reference(x, w, groups=xs[1], **attrs).shape
    residual = rand(*want_shape) if res else None
    mod = _depthwise_block(x, w, bias, residual, act, **attrs)
    assert uses_depthwise_kernel(mod)
    got = run(mod, {"x": x}, tmp_path, target=target, threads=threads)
    np.testing.assert_allclose(got, _depthwise_want(x, w, bias, residual, act, **attrs),
                               rtol=1e-4, atol=1e-5)


def test_depthwise_on_aarch64_under_qemu(tmp_path):
    """NEON (4 lanes): the stride-2 shuffles, taps out of their reach, masked border chunks,
    the residual and scalar epilogues; run by an emulated arm64 python, against numpy."""
    from arm64_root import arm64_root_or_fail, run_bundles
    from mlcpack.runtime import elf

    from conftest import ROOT

    if elf._real_arch() != "x86_64":
        pytest.skip("the emulated run is set up for x86-64 hosts")
    cases = {f"c{i}": c for i, c in enumerate(DW_EPILOGUES)}
    cases["wide"] = ((1, 2, 9, 30), (2, 1, 3, 7), dict(strides=(1, 2), padding=(1, 3, 1, 3)),
                     False, "clip")
    bundles, want = {}, {}
    for name, (xs, ws, attrs, res, act) in cases.items():
        x, w = rand(*xs), rand(*ws)
        bias = rand(1, ws[0], 1, 1)
        shape = get_op("nn.conv2d").reference(x, w, groups=xs[1], **attrs).shape
        residual = rand(*shape) if res else None
        mod = _depthwise_block(x, w, bias, residual, act, **attrs)
        path = tmp_path / f"{name}.mlc"
        export_module(mod, path, ExportOptions(target="aarch64"))
        bundles[name] = (path, {"x": x})
        want[name] = _depthwise_want(x, w, bias, residual, act, **attrs)
    report, got = run_bundles(arm64_root_or_fail(), tmp_path, ROOT, bundles)
    assert report["machine"] == "aarch64"
    for name in cases:
        np.testing.assert_allclose(got[name]["y"], want[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)


MATMULS = [
    ((1, 784), (784, 128)),
    ((1, 13), (13, 5)),
    ((7, 13), (13, 17)),
    ((64, 31), (31, 130)),
    ((2, 3, 9, 4), (4, 11)),
    ((3, 1, 5, 6), (2, 6, 7)),
    ((1, 4, 19, 8), (1, 4, 8, 19)),
    ((10, 33), (33, 64)),           # 4 x 4-vector block, partial block row
    ((8, 17), (17, 200)),           # 4 x 4-vector block, partial panel
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
