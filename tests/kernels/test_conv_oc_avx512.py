"""Channel-lane convolutions (codegen/conv_oc.py) on AVX-512 (x86-64-v4, 16 lanes): the export
packs the weights for x86-64-v4 targets as for AVX2 (not under bf16), the kernel's register
tile is 8 pixels x 2 zmm weight vectors (16 accumulators of 32 registers); output channels
not in whole 16-lane vectors keep the register-blocked kernel, and 1x1 convolutions of 256
input channels or more take this one. The emitted code is checked on any x86-64 host (compile
only); the runs against ONNX Runtime need a host with AVX-512."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X86_V3
from conv_models import avx512_host, conv_feeds, conv_model, export_model
from helpers import capture_compiles, self_loops
from mlcpack.runtime.cpu import host_arch, host_features

ort = pytest.importorskip("onnxruntime")

V4 = "x86-64-v4"


def _conv_kernels(bundle) -> list[dict]:
    from mlcpack.runtime.describe import describe

    return [k for k in describe(bundle)["kernels"] if "conv" in k["name"]]


def test_packed_for_avx512_but_not_for_its_bf16():
    from mlcpack.packager.options import CompileOptions

    for target in (V4, "x86-64-v3,x86-64-v4", "x86-64-v2,x86-64-v3,x86-64-v4"):
        assert CompileOptions(target=target).for_targets().pack_conv_weights
        assert not CompileOptions(target=target, precision="bf16").for_targets().pack_conv_weights
    assert CompileOptions(target="x86-64-v3", precision="bf16").for_targets().pack_conv_weights
    assert not CompileOptions(target="x86-64-v3").for_targets().conv_oc_wide


@pytest.mark.parametrize("c,o,k,target,packed", [
    (16, 32, 3, V4, True),
    (16, 40, 3, V4, False),            # 40 channels: not in whole 16-lane vectors
    (16, 40, 3, "x86-64-v3", True),    # ... but in 8-lane ones
    (256, 32, 1, V4, True),            # a 1x1 of 256 input channels
    (128, 32, 1, V4, False),           # fewer: the register-blocked kernel
    (256, 32, 1, "x86-64-v3", False),  # AVX2: its packed 1x1 panels
])
def test_which_convolutions_are_packed(tmp_path, c, o, k, target, packed):
    _, bundle = export_model(tmp_path, conv_model(1, c, 6, 6, o, k, 1), target)
    assert any("conv2d_oc" in kk["name"] for kk in _conv_kernels(bundle)) == packed


@pytest.mark.parametrize("c,o,hw,s,choice,fmas", [
    (64, 64, 28, 1, "Winograd F(2x2, 3x3): 8 tiles x 32 channels", 64),   # 4 channels unrolled
    (64, 128, 28, 2, "direct: 8 pixels x 32 channels", 144),              # 9 taps
])
def test_zmm_tile_stays_in_registers(tmp_path, monkeypatch, c, o, hw, s, choice, fmas):
    """The v4 kernel's product loop: 8 pixels (tiles) x 2 zmm vectors, every multiply-add on
    zmm registers, no stack access (12 pixels spilled: 244 stack accesses per 216 FMAs)."""
    import llvmlite.binding as llvm
    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    export_model(tmp_path, conv_model(1, c, hw, hw, o, 3, s))
    (target, code), = captured
    assert choice in next(iter(code.kernels.values())).choice
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    product = [body for body in self_loops(asm) if sum("vfmadd" in i for i in body) == fmas]
    assert product
    for body in product:
        assert all("zmm" in i for i in body if "vfmadd" in i)
        assert not any("(%rsp)" in i for i in body)


@pytest.mark.parametrize("c,hw,k,s,residual,tile,prefetched", [
    (256, 7, 1, 1, True, 7, True),      # 49 pixels: 7 tiles of 7, no single pixel
    (256, 14, 1, 2, False, 7, False),   # stride 2 to 7x7; no residual: no next-block rows
    (256, 14, 1, 1, True, 8, True),     # groups of 112 and 84 pixels: whole 8-pixel tiles
    (64, 7, 3, 1, False, 8, False),     # a 3x3 keeps its tile
])
def test_1x1_tile_and_next_block_choice(tmp_path, c, hw, k, s, residual, tile, prefetched):
    """A 1x1 at 16 lanes whose row groups are whole 7-pixel tiles (and leave single pixels
    in 8-pixel ones) takes 7-pixel tiles; one with a residual prefetches the next block's
    output and residual rows (``inspect`` says both)."""
    # 256 outputs: 8 blocks, one band (blocks innermost)
    _, bundle = export_model(tmp_path, conv_model(1, c, hw, hw, 256, k, s, residual=residual))
    kernels = _conv_kernels(bundle)
    assert kernels and all(kk["kernel"].startswith(f"channel-lane direct: {tile} pixels")
                           for kk in kernels)
    assert all(("next block's output rows" in kk["kernel"]) == prefetched for kk in kernels)


def test_strided_1x1_subsampled_choice(tmp_path):
    """A strided 1x1 at 16 lanes copies only the pixels it reads (``inspect`` says so); a
    stride-1 one reads its input in place."""
    for s, subsampled in ((2, True), (1, False)):
        _, bundle = export_model(tmp_path, conv_model(1, 256, 14, 14, 64, 1, s))
        kernels = _conv_kernels(bundle)
        assert kernels and all(("subsampled" in kk["kernel"]) == subsampled for kk in kernels)


CASES = [
    (1, 64, 20, 20, 64, 3, 1, None, True),        # Winograd, a residual
    (1, 32, 14, 14, 64, 3, 2, "silu", False),     # direct, stride 2, vector-math epilogue
    (1, 3, 30, 34, 64, 7, 2, None, False),        # a 7x7 stem (its window rows a loop)
    (2, 24, 9, 13, 48, 5, 2, "hsig", True),       # batch 2, a block and one vector
    (1, 256, 9, 7, 32, 1, 1, "silu", True),       # a 1x1 of 256 input channels
    (1, 256, 9, 9, 64, 1, 2, None, False),        # ... stride 2, subsampled by the copy
    (1, 256, 8, 40, 32, 1, 2, "silu", True),      # ... rows of 40: whole and masked loads
    (1, 256, 10, 10, 32, 1, 3, None, False),      # ... stride 3: column by column
    (1, 256, 7, 7, 256, 1, 1, None, True),        # ... 7-pixel tiles, next block prefetched
    (2, 256, 14, 13, 64, 1, 2, "silu", True),     # ... stride 2 to 7x7, batch 2
    (1, 3, 31, 32, 64, 7, 2, None, False),        # a stem on rows of whole tiles: one base
    (1, 32, 9, 9, 48, 3, 1, None, True),          # a block and one 16-lane vector
    (1, 16, 20, 1, 32, 3, 1, None, False),        # 1-pixel rows: tiles span rows
    (1, 16, 17, 19, 32, 3, 1, "silu", False),     # odd sizes: a tail tile, a masked vector
]


@pytest.mark.parametrize("n,c,h,w,o,k,s,act,residual", CASES)
def test_matches_onnxruntime(tmp_path, n, c, h, w, o, k, s, act, residual):
    from mlcpack.runtime import load

    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, k, s, act=act,
                                                residual=residual))
    kernels = _conv_kernels(bundle)
    assert kernels and all("conv2d_oc" in kk["name"] for kk in kernels)
    feeds = conv_feeds(n, c, h, w, o, k, s, residual=residual)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            assert m.code_variant["level"] == V4
            for _ in range(2):   # the task regions' second use
                got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("o,k,s,residual", [(32, 3, 1, True),    # Winograd
                                            (48, 3, 2, False)])  # direct, 16 + 32 channels
def test_open_image_sizes(tmp_path, o, k, s, residual):
    """Run-time height and width at 16 lanes: tiny images (rows of 1-3 pixels, where the row
    groups are cut so the transposes stay in the row buffer) up to a few bands."""
    from mlcpack.runtime import load

    if not avx512_host():
        pytest.skip("runs x86-64-v4 code: needs an x86-64 host with AVX-512")
    c = 16
    model = conv_model(1, c, 8, 8, o, k, s, act="silu", residual=residual)
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        dims[2].dim_param, dims[3].dim_param = ("OH", "OW") if vi in model.graph.output \
            else ("H", "W")
    path, bundle = export_model(tmp_path, model)
    kernels = _conv_kernels(bundle)
    assert kernels and all(kk["kernel"].endswith("planned at run time") for kk in kernels)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            for h, w in [(1, 1), (200, 2), (5, 7), (13, 11), (9, 40)]:
                feeds = conv_feeds(1, c, h, w, o, k, s, residual=residual, seed=h)
                want = sess.run(None, feeds)[0]
                for _ in range(2):
                    got = list(m.run(feeds).values())[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_avx2_variant_of_a_portable_bundle(tmp_path, monkeypatch):
    """A bundle for x86-64-v3 and v4 packs the weights once; its AVX2 variant (8-lane
    kernel) runs where AVX-512 is missing (features pinned: any AVX2 host runs it)."""
    from mlcpack.runtime import load

    if host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features():
        pytest.skip("runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
    n, c, h, w, o, k, s = 1, 32, 12, 12, 48, 3, 1
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, k, s, act="silu"),
                           "x86-64-v3,x86-64-v4")
    assert all("conv2d_oc" in kk["name"] for kk in _conv_kernels(bundle))
    feeds = conv_feeds(n, c, h, w, o, k, s)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    with load(bundle, threads=2) as m:
        assert m.code_variant["level"] == "x86-64-v3"
        np.testing.assert_allclose(list(m.run(feeds).values())[0], want, rtol=1e-4, atol=1e-4)


def test_winograd_bands_of_a_small_image(tmp_path):
    """Winograd at 16 lanes on a 10x10 image whose transformed weights pass L2 (256 -> 64:
    1 MB): one band of all 25 tiles, not 5 bands of one tile row that each read the weights
    from L3 (YOLOv8n 320's head: 240 -> 132 us); against ONNX Runtime where AVX-512 runs."""
    from mlcpack.runtime import load

    n, c, h, w, o, k, s = 1, 256, 10, 10, 64, 3, 1
    path, bundle = export_model(tmp_path, conv_model(n, c, h, w, o, k, s, act="silu"))
    (kernel,) = _conv_kernels(bundle)
    assert "Winograd" in kernel["kernel"] and kernel["kernel"].endswith(" 1 band(s)")
    if not avx512_host():
        return
    feeds = conv_feeds(n, c, h, w, o, k, s)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            for _ in range(2):
                got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
