"""Channel-lane convolutions (codegen/conv_oc.py) whose image size is known at run time only:
the export packs the weights of an ungrouped conv with open height and width as it does for a
fixed size (passes/layout.py), and the kernel plans its bands and row groups at run time.
Checked against ONNX Runtime at sizes from 1 x 1 (smaller than a register tile) to several
bands, odd ones included, on 1-2 threads, with the AVX2 variant and the SSE one of a portable
bundle (features pinned, so any x86-64 host with AVX2 runs both)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X86_V2, X86_V3
from conv_models import conv_feeds, conv_model
from helpers import capture_compiles, self_loops

ort = pytest.importorskip("onnxruntime")

SIZES = [(1, 1), (2, 3), (5, 7), (13, 11), (9, 40)]


def _open(model, batch: bool = False, pads: int | None = None):
    """``model`` with its image dims (and with ``batch`` its batch) named, not fixed; with
    ``pads``, the Conv's padding set to it."""
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        out = vi in model.graph.output
        dims[2].dim_param, dims[3].dim_param = ("OH", "OW") if out else ("H", "W")
        if batch:
            dims[0].dim_param = "N"
    if pads is not None:
        conv = model.graph.node[0]
        for a in conv.attribute:
            if a.name == "pads":
                a.ints[:] = [pads] * 4
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


def _check(path, bundle, cases, threads=(1, 2)):
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    kernels = [k for k in describe(bundle)["kernels"] if "conv" in k["name"]]
    assert kernels and all("conv2d_oc" in k["name"] for k in kernels)
    assert all(k["kernel"].endswith("planned at run time") for k in kernels)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for t in threads:
        with load(bundle, threads=t) as m:
            for feeds in cases:
                want = sess.run(None, feeds)[0]
                for _ in range(2):   # the task regions' second use
                    got = list(m.run(feeds).values())[0]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,o,k,s,act,residual", [
    (8, 16, 3, 1, "silu", True),     # a partial block of 16 channels, vector-math epilogue
    (12, 40, 5, 2, "hsig", False),   # a block and a vector, 5x5 stride 2, chunks of 5 and 7
    (3, 16, 7, 2, None, False),      # a stem: 7x7 window (its rows a loop), stride 2
    (16, 40, 3, 1, "silu", True),    # Winograd: tile counts and bands at run time
])
def test_open_image_matches_onnxruntime(tmp_path, monkeypatch, c, o, k, s, act, residual):
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    path, bundle = _export(tmp_path, _open(conv_model(1, c, 8, 8, o, k, s, act=act,
                                                      residual=residual)), "x86-64-v3")
    _check(path, bundle, [conv_feeds(1, c, h, w, o, k, s, residual=residual, seed=h)
                          for h, w in SIZES])


def test_open_batch_and_no_padding(tmp_path, monkeypatch):
    """No padding: the planes are the input itself, read in place; batch, height and width
    all run-time sizes."""
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    model = _open(conv_model(1, 8, 8, 8, 24, 3, 1), batch=True, pads=0)
    path, bundle = _export(tmp_path, model, "x86-64-v3")
    rng = np.random.default_rng(0)
    _check(path, bundle, [{"x": rng.standard_normal((n, 8, h, w)).astype(np.float32)}
                          for n, h, w in [(1, 3, 3), (2, 4, 9), (3, 17, 6)]])


def test_bands_of_a_large_open_image(tmp_path, monkeypatch):
    """Input rows past BAND_BYTES (direct) and transformed inputs past WINO_V_BYTES
    (Winograd): the run-time plans cut several bands."""
    from mlcpack.packager.codegen import conv_oc

    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    c, h = 64, 72
    assert 4 * c * h * (h + 2) > conv_oc.BAND_BYTES
    assert 2 * 16 * c * 40 * 4 > conv_oc.WINO_V_BYTES   # two tile rows of a 71-wide image
    for o in (16, 32):   # 16 output channels: direct; 32: Winograd
        path, bundle = _export(tmp_path, _open(conv_model(1, c, 8, 8, o, 3, 1)), "x86-64-v3")
        _check(path, bundle, [conv_feeds(1, c, h, h - 1, o, 3, 1)])


@pytest.mark.parametrize("c,o,k,s", [(12, 40, 3, 2), (16, 40, 3, 1)])   # direct, Winograd
def test_the_sse_variant_on_an_open_image(tmp_path, monkeypatch, c, o, k, s):
    """The 4-lane variant of a portable bundle (a block in two passes, 4 x 4 transposes)."""
    from mlcpack.runtime import load

    path, bundle = _export(tmp_path, _open(conv_model(1, c, 8, 8, o, k, s, act="silu")),
                           "x86-64-v2,x86-64-v3")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2)
    with load(bundle) as m:
        assert m.code_variant["level"] == "x86-64-v2"
    _check(path, bundle, [conv_feeds(1, c, h, w, o, k, s, seed=h) for h, w in SIZES])


def test_open_winograd_product_loop_keeps_its_offsets_in_registers(tmp_path, monkeypatch):
    """The open-size Winograd kernel's run-time V stride is opaque in its product loop
    (conv_oc.py ``_opaque_i64``), so LLVM does not hoist the mr x unroll channel offsets out
    of it and spill them: in the x86-64-v3 assembly of a 32 -> 32 layer the loop (the block
    that loops on itself with the 48 FMAs of a 3 tiles x 4 vectors tile, 4 channels unrolled)
    touches the stack at most once (the stride's own reload; main's loop reloaded 3 offsets
    here, 8 in a 64 -> 64 layer with SiLU)."""
    import llvmlite.binding as llvm
    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V3)
    _export(tmp_path, _open(conv_model(1, 32, 8, 8, 32, 3, 1)), "x86-64-v3")
    (target, code), = captured
    assert "Winograd" in next(iter(code.kernels.values())).choice
    loops = self_loops(_target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir)))
    product = [body for body in loops if sum("vfmadd" in i for i in body) == 48]
    assert product
    assert all(sum("(%rsp)" in i for i in body) <= 1 for body in product)
