"""Matmuls of one to three rows split over threads by the bytes of the weights they stream, not
by their multiply-adds (codegen/threads.py PARALLEL_MIN_WEIGHT_BYTES): which kernels of a fat
x86-64-v2/v3/v4 bundle split (one parallel flag for all its targets, at least two column panels
on each), and their outputs at 1, 2 and 3 threads, bit-identical to each other and checked
against numpy. The C runtime's outputs for the split demo MLP: tests/runtime/test_c_runtime.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.packager.codegen.contraction.geometry import WIDEST_VECTOR, few_rows_tile
from mlcpack.packager.codegen.threads import PARALLEL_MIN_WEIGHT_BYTES

RNG = np.random.default_rng(5)
# name: (rows, K, N, Gemm with transB (a torch Linear) or MatMul, splits). One kernel each.
CASES = {
    "mlp": (1, 784, 128, True, True),       # the demo MLP's first layer: 392 KiB, 100 K MACs
    "half": (1, 784, 64, True, False),      # 196 KiB: under the threshold
    "narrow": (1, 4096, 20, True, True),    # 320 KiB in 20 columns: 16-column panels on v4
    "dot": (1, 8192, 10, True, True),       # 320 KiB, N < 16: the dot-product kernel, 3 blocks
    "panel": (1, 5120, 16, False, False),   # 320 KiB in one 16-column panel: nothing to share
    "rows2": (2, 784, 128, True, True),     # two rows: 200 K MACs, under the MAC threshold
}


def _model():
    nodes, inputs, outputs, inits = [], [], [], []
    for name, (rows, k, n, gemm, _) in CASES.items():
        w = (RNG.standard_normal((n, k) if gemm else (k, n)) / np.sqrt(k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w_{name}"))
        inputs.append(helper.make_tensor_value_info(f"x_{name}", TensorProto.FLOAT, [rows, k]))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [rows, n]))
        if gemm:
            nodes.append(helper.make_node("Gemm", [f"x_{name}", f"w_{name}"], [f"y_{name}"],
                                          name=name, transB=1))
        else:
            nodes.append(helper.make_node("MatMul", [f"x_{name}", f"w_{name}"], [f"y_{name}"],
                                          name=name))
    graph = helper.make_graph(nodes, "split", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def split_bundle(tmp_path_factory):
    """The cases as one fat bundle for x86-64-v2, v3 and v4 (compiled for each here, whatever
    the host: the export refuses a kernel whose parallel flag differs between targets)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    model = _model()
    mod, _ = import_onnx(model)
    bundle = tmp_path_factory.mktemp("split") / "split.mlc"
    export_module(mod, bundle, ExportOptions(target="x86-64-v2,x86-64-v3,x86-64-v4"))
    return bundle, model


def test_threshold_is_in_bytes_of_weights():
    assert 196 * 1024 < PARALLEL_MIN_WEIGHT_BYTES <= 320 * 1024


def test_split_tiles_leave_two_panels_on_every_target():
    """A split matmul's tile is at most half its columns wide: with more than WIDEST_VECTOR
    columns, two column panels or more at every vector width, so neither thread idles; the
    demo MLP's AVX2 tile (1 x 8 vectors: 2 panels) is the unsplit one."""
    for vl in (4, 8, WIDEST_VECTOR):
        for rows in (1, 2, 3):
            for cols in range(WIDEST_VECTOR + 1, 700):
                _, nv = few_rows_tile(rows, cols, vl, split=True)
                assert -(-cols // (nv * vl)) >= 2, (vl, rows, cols)
    assert few_rows_tile(1, 128, 8, split=True) == few_rows_tile(1, 128, 8, split=False) == (1, 8)
    assert few_rows_tile(1, 128, 16, split=True) == (1, 4)   # 2 panels, not 1 of 128 columns


def test_which_matmuls_split(split_bundle):
    from mlcpack.runtime.describe import describe

    bundle, _ = split_bundle
    flags = {k["source"][0]["name"]: k["parallel"] for k in describe(bundle)["kernels"]}
    assert flags == {name: case[-1] for name, case in CASES.items()}


def test_split_outputs_are_bit_identical_on_threads(split_bundle):
    from mlcpack.runtime import load

    bundle, model = split_bundle
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    feeds = {f"x_{name}": RNG.standard_normal((rows, k)).astype(np.float32)
             for name, (rows, k, *_) in CASES.items()}
    got = {}
    for threads in (1, 2, 3):
        with load(bundle, threads=threads) as m:
            got[threads] = m.run(feeds)
    for name, (*_, gemm, _) in CASES.items():
        w = weights[f"w_{name}"]
        want = feeds[f"x_{name}"].astype(np.float64) @ (w.T if gemm else w).astype(np.float64)
        out = got[1][f"y_{name}"]
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(),
                                   err_msg=name)
        for threads in (2, 3):
            assert got[threads][f"y_{name}"].tobytes() == out.tobytes(), (name, threads)
