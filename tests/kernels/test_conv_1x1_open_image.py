"""1x1 convolutions whose batch and image size are known at run time only, on packed input
panels (codegen/contraction/conv_packed_symbolic.py): the export packs their weights in the
tile's row blocks (passes/layout.py), the AVX2 kernel copies each task's panels of the input
(the last one partial, masked) and runs its block rows in chunks. Checked against ONNX Runtime
at pixel counts below one panel, between panels and in whole panels, batch 1-2, 1-2 threads;
the AVX2 variant and the SSE one (the same row-packed weights, the input read in place) of one
portable bundle, features pinned."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X86_V2, X86_V3
from conv_models import conv_feeds, conv_model

ort = pytest.importorskip("onnxruntime")

# pixels: 1, 6 (under a 24-pixel panel), 35, 100 (a partial last panel), 143, 360 (15 panels)
SIZES = [(1, 1), (2, 3), (5, 7), (10, 10), (13, 11), (9, 40)]


def _open(model):
    """``model`` with its batch, height and width named, not fixed."""
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        dims[0].dim_param, dims[2].dim_param, dims[3].dim_param = "N", "H", "W"
    return model


def _export(tmp_path, model, target):
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target=target))
    return path, tmp_path / "m.mlc"


def _check(path, bundle, cases, level, packed):
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    kernels = [k for k in describe(bundle)["kernels"] if "conv" in k["name"]]
    assert kernels and all("conv2d_rows" in k["name"] for k in kernels)
    if packed:
        assert all("input packed in panels" in k["kernel"]
                   and k["kernel"].endswith("planned at run time") for k in kernels)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for t in (1, 2):
        with load(bundle, threads=t) as m:
            assert m.code_variant["level"] == level
            for feeds in cases:
                want = sess.run(None, feeds)[0]
                for _ in range(2):   # the workspace's second use
                    got = list(m.run(feeds).values())[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """64 -> 64 with SiLU and a residual, exported for x86-64-v2 and v3."""
    tmp = tmp_path_factory.mktemp("open1x1")
    return _export(tmp, _open(conv_model(1, 64, 8, 8, 64, 1, 1, act="silu", residual=True)),
                   "x86-64-v2,x86-64-v3")


def _cases(c, o, residual):
    return [conv_feeds(n, c, h, w, o, 1, 1, residual=residual, seed=h * w + n)
            for n in (1, 2) for h, w in SIZES if n == 1 or h * w in (6, 100)]


@pytest.mark.parametrize("features,level,packed", [(X86_V3, "x86-64-v3", True),
                                                   (X86_V2, "x86-64-v2", False)])
def test_open_1x1_matches_onnxruntime(portable, monkeypatch, features, level, packed):
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", features)
    path, bundle = portable
    _check(path, bundle, _cases(64, 64, True), level, packed)


def test_chunks_and_a_partial_block_row(tmp_path, monkeypatch):
    """1024 -> 66: block rows in two chunks (their weights past PACK_A_BYTES), the last block
    row two channels of four."""
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    path, bundle = _export(tmp_path, _open(conv_model(1, 1024, 8, 8, 66, 1, 1)), "x86-64-v3")
    from mlcpack.runtime.describe import describe
    kernel = [k for k in describe(bundle)["kernels"] if "conv" in k["name"]][0]["kernel"]
    assert "chunks of 16" in kernel
    _check(path, bundle, _cases(1024, 66, False)[:4], "x86-64-v3", True)


def test_partial_panel_narrow_tiles_odd_channels(tmp_path, monkeypatch):
    """65 -> 64 with SiLU: the last, partial panel's narrow tiles (1, 6 and 100 pixels: one
    vector, its two accumulator sets over an odd input-channel count; 35: two vectors; 143:
    the whole tile)."""
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    path, bundle = _export(tmp_path, _open(conv_model(1, 65, 8, 8, 64, 1, 1, act="silu")),
                           "x86-64-v3")
    cases = [conv_feeds(1, 65, h, w, 64, 1, 1, seed=h * w) for h, w in SIZES]
    _check(path, bundle, cases, "x86-64-v3", True)
