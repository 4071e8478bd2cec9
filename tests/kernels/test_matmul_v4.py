"""float32 MatMul / Gemm at x86-64-v4 (16 lanes): a constant B packed at export into the
16-column panels the AVX2 level reads too (passes/layout.py ``pack_matmul_weights``, on for
every target set with a 16-lane level), the last, partial panel computed with only the
vectors it needs (``MatmulMixin._last_panel_vectors``), few panels split into chunks of row
blocks over threads (``_row_chunks``), the next panel of weights past L2 prefetched
(``_prefetches_next_panel``); x86-64-v3 code unchanged. The emitted
code is checked on any x86-64 host (compile only); the runs against ONNX Runtime (odd sizes,
Gemm, one to three rows, run-time rows, attention's batched products of two activations with a
run-time sequence length) need a host with AVX-512."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import avx512_host
from helpers import capture_compiles, self_loops
from onnx import TensorProto, helper
from test_matmul_packed_weights import _check, _feeds, _model

ort = pytest.importorskip("onnxruntime")

V4 = "x86-64-v4"


def _export(tmp_path, model, target=V4):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    mod, _ = import_onnx(model)
    bundle = tmp_path / "m.mlc"
    export_module(mod, bundle, ExportOptions(target=target))
    return bundle


def _product_loops(tmp_path, monkeypatch, model, target=V4) -> tuple[list[str], list]:
    """(kernel names, the FMA loops' instructions) of ``model`` compiled for ``target``."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine

    captured = capture_compiles(monkeypatch)
    monkeypatch.setenv("MLCPACK_CACHE_DIR", "off")   # compile here, not a cached object
    _export(tmp_path, model, target)
    (tgt, code), = captured
    asm = _target_machine(tgt).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    loops = [body for body in self_loops(asm) if any("vfmadd" in i for i in body)]
    return [k.symbol for k in code.kernels.values()], loops


def test_packed_panels_stream_at_16_lanes(tmp_path, monkeypatch):
    """MLP-Mixer's [196, 256] x [256, 1024]: B packed at export, the 4 x 4 zmm tile's loop
    reads each panel's next row 64 bytes on (B in place steps a 4 KB row), no stack access;
    the first row block's loop also prefetches the next panel (a line per vector)."""
    model, _ = _model((196, 256), 256, 1024, relu=False)
    names, loops = _product_loops(tmp_path, monkeypatch, model)
    assert any("matmul_packed" in n for n in names)
    main = [body for body in loops if sum("vfmadd" in i for i in body) == 16]
    assert main
    for body in main:
        assert all("zmm" in i for i in body if "vfmadd" in i)
        assert not any("(%rsp)" in i for i in body)
        assert any(i.startswith("addq\t$64,") for i in body), body
    # 1 MB of weights: the first row block of a panel prefetches the next one's rows
    assert any(sum("prefetcht0" in i for i in body) == 4 for body in main)


def test_last_panel_computes_only_its_vectors(tmp_path, monkeypatch):
    """256 x 196 columns (MLP-Mixer's token MLP): 3 panels of 4 zmm and a last of 4 columns,
    whose loop multiplies one vector a row (4 rows: 4 FMAs a k step, or 8 unrolled twice;
    256 rows leave no partial row block that would)."""
    model, _ = _model((256, 128), 128, 196, relu=False)
    _, loops = _product_loops(tmp_path, monkeypatch, model)
    counts = {sum("vfmadd" in i for i in body) for body in loops}
    assert counts & {4, 8} and 16 in counts, counts


needs_avx512 = pytest.mark.skipif(not avx512_host(), reason="runs x86-64-v4 code: needs "
                                  "an x86-64 host with AVX-512")


@needs_avx512
@pytest.mark.parametrize("a_shape,k,n,gemm,b_input", [
    ((37, 29), 29, 196, False, False),      # odd rows and K; a last panel of one vector
    ((100, 130), 130, 17, True, False),     # Gemm transB: a last panel of 1 column
    ((1, 300), 300, 214, True, False),      # one row (Magika's head): packed, not the dot
    ((3, 70), 70, 130, False, False),       # three rows
    ((2, 20, 24), 24, 72, False, False),    # one B for two matrices
    ((301, 40), 40, 64, False, False),      # one panel: 8 chunks of row blocks, 1 row left
    ((203, 48), 48, 136, False, True),      # B an input, packed per chunk; a partial panel
    ((8, 256), 256, 520, False, False),     # 520 KB of B: the next panel prefetched
])
def test_matches_onnxruntime(tmp_path, a_shape, k, n, gemm, b_input):
    model, w = _model(a_shape, k, n, gemm=gemm, b_input=b_input)
    bundle = _export(tmp_path, model)
    _check(bundle, model, _feeds(a_shape, w if b_input else None), threads=(1, 2, 3))


@needs_avx512
def test_run_time_rows(tmp_path):
    """A run-time row count on the packed panels: fewer rows than the tile, a remainder
    block, many rows; 200 columns (a partial last panel)."""
    model, _ = _model((2, "S", 80), 80, 200)
    bundle = _export(tmp_path, model)
    for rows in (1, 3, 5, 45):
        _check(bundle, model, _feeds((2, rows, 80)), threads=(1, 2))


@needs_avx512
def test_attention_products_with_a_run_time_length(tmp_path):
    """q @ k^T and p @ v of 3 heads of 15 over a run-time sequence length S: both operands
    activations, the columns of the first a run-time size."""
    from mlcpack.runtime import load

    x = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("MatMul", ["s", "v"], ["out"])]
    graph = helper.make_graph(nodes, "att", [
        x("q", TensorProto.FLOAT, [3, "S", 15]), x("kt", TensorProto.FLOAT, [3, 15, "S"]),
        x("v", TensorProto.FLOAT, [3, "S", 15])],
        [x("out", TensorProto.FLOAT, [3, "S", 15])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    bundle = _export(tmp_path, model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for s in (1, 7, 40):
        feeds = {"q": rng.standard_normal((3, s, 15)), "kt": rng.standard_normal((3, 15, s)),
                 "v": rng.standard_normal((3, s, 15))}
        feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
        want = sess.run(None, feeds)[0]
        for threads in (1, 2):
            with load(bundle, threads=threads) as m:
                got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
