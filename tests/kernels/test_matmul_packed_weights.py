"""Matmuls whose constant B is packed at export (``matmul_packed``: passes/layout.py
pack_matmul_weights, ops/layout.py pack_matmul_b) and read by the register-blocked kernel
(codegen/contraction/) panel by panel with plain loads: against ONNX Runtime over row counts, K and
N (a partial, zero-filled last panel), batched A, Gemm with transB, 1-3 threads, several batch
plans sharing the packed weights, a run-time row count; and which matmuls get packed."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X86_V3, X86_V4
from onnx import TensorProto, helper, numpy_helper

from mlcpack.packager.ops.layout import MATMUL_PANEL, pack_matmul_b, unpack_matmul_b

ort = pytest.importorskip("onnxruntime")

AVX2 = "x86-64-v3"
RNG = np.random.default_rng(23)


def _model(a_shape, k: int, n: int, gemm: bool = False, relu: bool = True, b_input=False):
    """y = relu(a @ B + bias) (MatMul + Add, or Gemm with transB: a torch Linear)."""
    w = (RNG.standard_normal((n, k) if gemm else (k, n)) / np.sqrt(k)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    inits = [numpy_helper.from_array(bias, "bias")]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))]
    if b_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, n]))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    if gemm:
        nodes = [helper.make_node("Gemm", ["a", "w", "bias"], ["y"], transB=1)]
    else:
        nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
                 helper.make_node("Add", ["mm", "bias"], ["y"])]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["y"], ["out"]))
    out_shape = list(a_shape[:-1]) + [n]
    graph = helper.make_graph(nodes, "mm", inputs, [helper.make_tensor_value_info(
        "out", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, w


def _feeds(a_shape, w=None, k=None, n=None):
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32)}
    if w is not None:
        feeds["w"] = w
    return feeds


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _export(tmp_path, model, target=AVX2, input_shapes=None):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    mod, _ = import_onnx(model, input_shapes=input_shapes)
    bundle = tmp_path / "m.mlc"
    export_module(mod, bundle, ExportOptions(target=target))
    return bundle


def _assert_on_threads(bundle, model, feeds) -> None:
    """The bundle's first output against ORT's on 1, 2 and 3 threads."""
    from mlcpack.runtime import load

    want = _ort(model, feeds)
    for t in (1, 2, 3):
        with load(bundle, threads=t) as m:
            got = list(m.run(feeds).values())[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4,
                                   err_msg=f"{t} threads, {feeds['a'].shape}")


def _kernel_names(bundle) -> list[str]:
    from mlcpack.runtime.describe import describe

    return [k["name"] for k in describe(bundle)["kernels"]]


def _check(bundle, model, feeds, threads=(1, 2, 3)):
    from mlcpack.runtime import load

    want = _ort(model, feeds)
    k = feeds["a"].shape[-1]
    atol = 4e-7 * k * float(np.abs(want).max()) + 1e-6
    for t in threads:
        with load(bundle, threads=t) as m:
            for _ in range(2):
                got = list(m.run(feeds).values())[0]
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol,
                                           err_msg=f"{threads} threads")


def test_packing_round_trip():
    b = RNG.standard_normal((7, 37)).astype(np.float32)
    bp = pack_matmul_b(b)
    assert bp.shape == (3, 7, MATMUL_PANEL)
    assert bp[2, 4, 3] == b[4, 35]
    assert not bp[2, :, 5:].any()            # columns past 37 in the last panel are zeros
    np.testing.assert_array_equal(unpack_matmul_b(bp, 37), b)


@pytest.mark.parametrize("a_shape,k,n,gemm", [
    ((64, 784), 784, 128, False),     # bench's mlp_b64 first layer
    ((40, 96), 96, 72, False),        # 4 full panels and 8 columns of a fifth
    ((29, 64), 64, 50, False),        # a 5-row block and a 2-column last panel
    ((16, 33), 33, 20, False),        # the fewest rows packed; 4 columns in the last panel
    ((100, 130), 130, 17, True),      # Gemm transB (a Linear): 1 column in the last panel
    ((2, 20, 24), 24, 40, False),     # one B for two matrices of A
    ((3, 16, 48), 48, 64, False),     # three matrices of A, 4 whole panels
    ((1, 300), 300, 100, True),       # one row (a Linear at batch 1): a 1 x 8-vector tile
    ((2, 40), 40, 24, False),         # two rows: a tile wider than what is left of N
    ((3, 70), 70, 130, False),        # three rows, 9 panels (the last 2 columns)
    ((8, 2100), 2100, 40, False),     # K too long for a per-call panel copy
])
def test_matches_onnxruntime(tmp_path, a_shape, k, n, gemm):
    model, _ = _model(a_shape, k, n, gemm=gemm)
    bundle = _export(tmp_path, model)
    assert any("matmul_packed" in name for name in _kernel_names(bundle))
    _check(bundle, model, _feeds(a_shape))


@pytest.mark.parametrize("a_shape,k,n,gemm,b_input,target,packed", [
    ((32, 64), 64, 48, False, False, AVX2, True),
    ((8, 64), 64, 48, False, False, AVX2, True),          # fewer rows than a copy paid for
    ((1, 64), 64, 48, True, False, AVX2, True),           # one row: not the dot product
    ((1, 64), 64, 10, True, False, AVX2, False),          # one row by a narrow B: dot product
    ((1, 64), 64, 10, False, False, AVX2, False),         # MatMul: B read as it is
    ((32, 2100), 2100, 32, False, False, AVX2, True),     # a panel too long to copy per call
    ((32, 64), 64, 16, False, False, AVX2, True),         # one panel
    ((32, 64), 64, 4, False, False, AVX2, False),         # too narrow: a panel of zeros
    ((32, 64), 64, 48, False, True, AVX2, False),         # B an input
    ((32, 64), 64, 48, False, False, "portable on v3", True),   # the default: v2 and v3
    ((32, 64), 64, 48, False, False, "portable on v4", True),   # v2, v3 and v4: one layout
    ((32, 64), 64, 48, False, False, "x86-64-v2", False),  # 128-bit alone: not measured
    ((32, 64), 64, 48, False, False, "x86-64-v4", True),   # AVX-512 (16 lanes)
])
def test_which_matmuls_are_packed(tmp_path, monkeypatch, a_shape, k, n, gemm, b_input, target,
                                  packed):
    """The portable default's levels depend on the exporting host: it is pinned (an AVX2 or
    an AVX-512 one), and the bundle then runs on this host's own level."""
    model, w = _model(a_shape, k, n, gemm=gemm, b_input=b_input)
    if target.startswith("portable"):
        monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V4 if target.endswith("v4") else X86_V3)
    bundle = _export(tmp_path, model, None if target.startswith("portable") else target)
    monkeypatch.delenv("MLCPACK_CPU_FEATURES", raising=False)
    monkeypatch.delenv("MLCPACK_CPU_ARCH", raising=False)
    assert any("matmul_packed" in name for name in _kernel_names(bundle)) == packed
    if target != "x86-64-v4":   # every other bundle has code this x86-64 host runs
        _check(bundle, model, _feeds(a_shape, w if b_input else None), threads=(1, 2))


def test_batch_plans_share_the_packed_weights(tmp_path):
    """export_batched: every plan (batch 1 included, which alone would take the dot-product
    kernel) reads the one packed B; each batch against ORT."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_batched

    k, n = 96, 72
    model, _ = _model(("N", k), k, n, gemm=True)
    mods = {b: import_onnx(model, input_shapes={"a": (b, k)})[0] for b in (1, 5, 32)}
    bundle = tmp_path / "b.mlc"
    report = export_batched(mods, bundle, ExportOptions(target=AVX2))
    packed_bytes = pack_matmul_b(np.zeros((k, n), np.float32)).nbytes
    assert report.weights_bytes == packed_bytes + 4 * n      # packed B once, and the bias
    for batch in (1, 2, 5, 7, 32, 40):
        feeds = _feeds((batch, k))
        _assert_on_threads(bundle, model, feeds)


def test_run_time_rows_read_the_packed_b(tmp_path):
    """A symbolic row count (the batch): the symbolic kernel reads the packed panels, for
    fewer rows than the register tile, a remainder block and many rows."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    k, n = 80, 56
    model, _ = _model((2, "S", k), k, n)
    mod, _ = import_onnx(model)
    bundle = tmp_path / "s.mlc"
    export_module(mod, bundle, ExportOptions(target=AVX2))
    assert any("matmul_packed" in name for name in _kernel_names(bundle))
    for rows in (1, 2, 3, 5, 6, 7, 16, 45):
        feeds = _feeds((2, rows, k))
        _assert_on_threads(bundle, model, feeds)
