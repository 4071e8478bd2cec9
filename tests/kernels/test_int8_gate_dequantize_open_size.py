"""The squeeze-and-excitation gate's dequantize inside its gate kernel (PP-OCR's classifier with
open image sizes): ``quantize(y * dequantize(g))`` with g [N, C, 1, 1] 8-bit, the gate
dequantized once per row, where the gate's DequantizeLinear was a kernel of its own
(``passes/fuse.py`` ``_is_gate_dequantize``; ``codegen/qelementwise.py``
``match_gated_quantize``). A QDQ graph as ``onnxruntime.quantization`` writes it, batch,
height and width open: x -> Q -> DQ -> b, the gate HardSigmoid(ReduceMean(b)) -> Q, two
DequantizeLinear nodes of it (one per reader), Mul(b, g0) -> Q (uint8) and Mul(g1, b) -> Q
(int8, the operands the other way round) as the outputs, 40 channels. One bundle of three
levels (x86-64-v2: the generic loop nest; v3: the gate kernel; v4), each pinned where the
host has it, two run-time sizes (rows H * W = 35, 117: tails past the last 32 values), on 1
and 2 threads, bit for bit against ONNX Runtime running the graph as written."""

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
    dq = lambda src, s, z, out: h.make_node("DequantizeLinear", [src, s, z], [out])  # noqa: E731
    nodes = [q("x", "sx", "zx", "xq"), dq("xq", "sx", "zx", "b"),
             h.make_node("ReduceMean", ["b"], ["mb"], axes=[2, 3], keepdims=1),
             h.make_node("HardSigmoid", ["mb"], ["hs"], alpha=0.2, beta=0.5),
             q("hs", "sg", "zg", "gq"), dq("gq", "sg", "zg", "g0"), dq("gq", "sg", "zg", "g1"),
             h.make_node("Mul", ["b", "g0"], ["m0"]), q("m0", "s0", "z0", "y0"),
             h.make_node("Mul", ["g1", "b"], ["m1"]), q("m1", "s1", "z1", "y1")]
    inits = {"sx": np.float32(0.05), "zx": np.uint8(120), "sg": np.float32(1.0 / 255),
             "zg": np.uint8(3), "s0": np.float32(0.03), "z0": np.uint8(110),
             "s1": np.float32(0.02), "z1": np.int8(-7)}
    outs = [h.make_tensor_value_info("y0", T.UINT8, None),
            h.make_tensor_value_info("y1", T.INT8, None)]
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)], outs, inits, path)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qgatedq")
    src = _graph(folder / "gate.onnx", ["N", C, "H", "W"])
    path = folder / "gate.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target=",".join(LEVELS), check=False))
    return src, path


def test_gate_dequantizes_have_no_kernel_of_their_own(tmp_path: Path) -> None:
    """x86-64-v3: both gates' dequantizes inside the gate kernels (``gate, quantize``, whose
    plan names the dequantize first); a fixed shape keeps its dequantizes (static bundles
    unchanged)."""
    names = {}
    for tag, dims in (("open", ["N", C, "H", "W"]), ("fixed", [1, C, 4, 4])):
        mod, _ = import_onnx(str(_graph(tmp_path / f"{tag}.onnx", dims)))
        path = tmp_path / f"{tag}.mlc"
        export_module(mod, path, ExportOptions(target="x86-64-v3", check=False))
        with load(path) as model:
            names[tag] = [(k.name, k.kernel) for k in model.schema.plan.kernels]
    gates = [n for n, kind in names["open"] if kind == "gate, quantize"]
    assert len(gates) == 2 and all(n.startswith("fused_dequantize") for n in gates), names
    assert not any(n.startswith("fused_dequantize") for n, _ in names["fixed"]), names


@pytest.mark.parametrize("level", list(LEVELS))
def test_gate_dequantize_in_the_gate_kernel(bundle, level: str, monkeypatch) -> None:
    if level == "x86-64-v4" and "avx512bw" not in host_features():
        pytest.skip("the host lacks AVX-512")
    src, path = bundle
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", LEVELS[level])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            for n, hh, ww in SIZES:
                x = (rng.standard_normal((n, C, hh, ww)) * 4).astype(np.float32)
                got = model.run({"x": x})
                want = dict(zip(("y0", "y1"), sess.run(None, {"x": x})))
                for name in ("y0", "y1"):
                    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
