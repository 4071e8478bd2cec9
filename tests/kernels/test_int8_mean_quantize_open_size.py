"""A squeeze-and-excitation mean's QuantizeLinear inside the open global-mean kernel (PP-OCR's
classifier with open image sizes: GlobalAveragePool -> Q, nine quantizes of 0.4 us as kernels
of their own): ``quantize(mean(x))`` with run-time extents, each mean quantized as it is stored
(``passes/fuse.py`` ``_is_open_mean_quantize``; ``codegen/pool.py``
``match_global_mean_quantize``). A QDQ graph, batch, height and width open: x -> Q -> DQ -> b,
GlobalAveragePool(b) -> Q (uint8) and ReduceMean(b) -> Q (int8) as the outputs, 40 channels.
One bundle of three levels, each pinned where the host has it, two run-time sizes, 1 and 2
threads, bit for bit against ONNX Runtime running the graph as written."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import X86_V2, X86_V3, X86_V4
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features

ort = pytest.importorskip("onnxruntime")
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86 or "avx2" not in host_features(),
                                reason="runs x86-64-v2 and v3 code: needs an x86-64 host with AVX2")

C = 40
SIZES = ((1, 5, 7), (2, 9, 13))
LEVELS = {"x86-64-v2": X86_V2, "x86-64-v3": X86_V3, "x86-64-v4": X86_V4}


def _graph(path: Path, dims) -> Path:
    q = lambda src, s, z, out: h.make_node("QuantizeLinear", [src, s, z], [out])  # noqa: E731
    nodes = [q("x", "sx", "zx", "xq"), h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["b"]),
             h.make_node("GlobalAveragePool", ["b"], ["m0"]), q("m0", "s0", "z0", "y0"),
             h.make_node("ReduceMean", ["b"], ["m1"], axes=[2, 3], keepdims=1),
             q("m1", "s1", "z1", "y1")]
    inits = {"sx": np.float32(0.05), "zx": np.uint8(120), "s0": np.float32(0.003),
             "z0": np.uint8(128), "s1": np.float32(0.002), "z1": np.int8(-7)}
    outs = [h.make_tensor_value_info("y0", T.UINT8, None),
            h.make_tensor_value_info("y1", T.INT8, None)]
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)], outs, inits, path)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qmeanq")
    src = _graph(folder / "mean.onnx", ["N", C, "H", "W"])
    path = folder / "mean.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target=",".join(LEVELS), check=False))
    return src, path


def test_mean_quantizes_have_no_kernel_of_their_own(tmp_path: Path) -> None:
    """x86-64-v3: both quantizes inside the mean kernels; a fixed shape keeps its quantize
    kernels (static bundles unchanged)."""
    kinds = {}
    for tag, dims in (("open", ["N", C, "H", "W"]), ("fixed", [1, C, 4, 4])):
        mod, _ = import_onnx(str(_graph(tmp_path / f"{tag}.onnx", dims)))
        path = tmp_path / f"{tag}.mlc"
        export_module(mod, path, ExportOptions(target="x86-64-v3", check=False))
        with load(path) as model:
            kinds[tag] = [(k.name, k.kernel) for k in model.schema.plan.kernels]
    quantized = [n for n, kind in kinds["open"] if kind.endswith(", quantized")]
    assert len(quantized) == 2 and len(kinds["open"]) == 3, kinds
    assert not any(kind.endswith(", quantized") for _, kind in kinds["fixed"]), kinds


@pytest.mark.parametrize("level", list(LEVELS))
def test_mean_quantize_in_the_mean_kernel(bundle, level: str, monkeypatch) -> None:
    if level == "x86-64-v4" and "avx512bw" not in host_features():
        pytest.skip("the host lacks AVX-512")
    src, path = bundle
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", LEVELS[level])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            for n, hh, ww in SIZES:
                # a spread whose means reach both clamps
                x = (rng.standard_normal((n, C, hh, ww)) * 4
                     + rng.standard_normal((n, C, 1, 1)) * 3).astype(np.float32)
                got = model.run({"x": x})
                want = dict(zip(("y0", "y1"), sess.run(None, {"x": x})))
                for name in ("y0", "y1"):
                    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
