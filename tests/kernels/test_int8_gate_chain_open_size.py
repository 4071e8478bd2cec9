"""``qtable`` with a gate: the squeeze-and-excitation multiply of ORT's QDQ files with open
image sizes (PP-OCR's classifier), ``dequantize(quantize(y * gate))`` with gate [N, C, 1, 1],
one vector pass (an identity table, no lookup) instead of a generic loop nest. A QDQ graph as
``onnxruntime.quantization`` writes it, batch, height and width open: x -> Q -> DQ -> b, the
gate HardSigmoid(ReduceMean(b)) -> Q -> DQ -> g, Mul(b, g) -> Q -> DQ (uint8) and Mul(g, b)
-> Q -> DQ (int8, the operands the other way round), 40 channels. One portable bundle
(x86-64-v2 + x86-64-v3), each level pinned, two run-time sizes whose rows (H * W = 35, 117)
leave tails past the last 32 values, on 1 and 2 threads, bit for bit against ONNX Runtime
running the graph as written and against exact float32 numpy (ONNX's QuantizeLinear /
DequantizeLinear on ORT's gate); the two chains are ``qtable`` kernels with a gate."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import X86_V2, X86_V3
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features

ort = pytest.importorskip("onnxruntime")
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86 or "avx2" not in host_features(),
                                reason="runs x86-64-v2 and v3 code: needs an x86-64 host with AVX2")

C = 40
SIZES = ((1, 5, 7), (2, 9, 13))
SX, ZX = 0.05, 120                 # x (uint8)
SG, ZG = 1.0 / 255, 0              # the gate (uint8)
S0, Z0 = 0.03, 110                 # Mul(b, g) (uint8)
S1, Z1 = 0.02, -7                  # Mul(g, b) (int8)


def _graph(path: Path, dims) -> Path:
    def qdq(src: str, s: str, z: str, out: str) -> list:
        return [h.make_node("QuantizeLinear", [src, s, z], [out + "_q"]),
                h.make_node("DequantizeLinear", [out + "_q", s, z], [out])]
    nodes = (qdq("x", "sx", "zx", "b")
             + [h.make_node("ReduceMean", ["b"], ["mb"], axes=[2, 3], keepdims=1),
                h.make_node("HardSigmoid", ["mb"], ["hs"], alpha=0.2, beta=0.5)]
             + qdq("hs", "sg", "zg", "g")
             + [h.make_node("Mul", ["b", "g"], ["m0"])] + qdq("m0", "s0", "z0", "y0")
             + [h.make_node("Mul", ["g", "b"], ["m1"])] + qdq("m1", "s1", "z1", "y1"))
    inits = {"sx": np.float32(SX), "zx": np.uint8(ZX), "sg": np.float32(SG),
             "zg": np.uint8(ZG), "s0": np.float32(S0), "z0": np.uint8(Z0),
             "s1": np.float32(S1), "z1": np.int8(Z1)}
    outs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("y0", "y1", "g")]
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)], outs, inits, path)


def _exact(x: np.ndarray, g: np.ndarray) -> dict[str, np.ndarray]:
    """Both chains in exact float32 numpy on the gate ``g`` (ONNX QuantizeLinear /
    DequantizeLinear)."""
    f = np.float32

    def qdq(v, s, z, dtype):
        info = np.iinfo(dtype)
        q = np.clip(np.round((v / f(s)).astype(f)) + f(z), info.min, info.max).astype(dtype)
        return ((q.astype(f) - f(z)) * f(s)).astype(f)

    b = qdq(x, SX, ZX, np.uint8)
    return {"y0": qdq((b * g).astype(f), S0, Z0, np.uint8),
            "y1": qdq((g * b).astype(f), S1, Z1, np.int8)}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qgate")
    src = _graph(folder / "gate.onnx", ["N", C, "H", "W"])
    path = folder / "gate.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    return src, path


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_gate_chains_with_run_time_extents(bundle, level: str, monkeypatch) -> None:
    src, path = bundle
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            # the two gated chains, and the input's Q -> DQ pair (an identity table)
            assert kinds.count("quantize, table, dequantize") == 3, kinds
            for n, hh, ww in SIZES:
                x = (rng.standard_normal((n, C, hh, ww)) * 4).astype(np.float32)
                got = model.run({"x": x})
                want = dict(zip(("y0", "y1", "g"), sess.run(None, {"x": x})))
                for name in ("g", "y0", "y1"):
                    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
                for name, exact in _exact(x, want["g"]).items():
                    np.testing.assert_array_equal(got[name], exact, err_msg=name)


def test_gates_become_qtable_operands_open_shapes_only(tmp_path: Path) -> None:
    """Open shapes: both chains one ``qtable`` with the gate as its 7th operand (identity
    table, no lookup: an ``affine_shift``); a fixed shape keeps multiply, quantize and
    dequantize (static bundles unchanged)."""
    got = {}
    for name, dims in (("fixed", [1, C, 4, 4]), ("open", ["N", C, "H", "W"])):
        mod, _ = import_onnx(str(_graph(tmp_path / f"{name}.onnx", dims)))
        passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")]
        mod = run_pipeline(mod, passes, options=CompileOptions(target="x86-64-v3"))
        got[name] = [b.value for b in mod.functions["main"].bindings() if hasattr(b.value, "op")]
    assert not any(c.op == "qtable" for c in got["fixed"])
    gated = [c for c in got["open"] if c.op == "qtable" and len(c.args) == 7]
    assert len(gated) == 2, [c.op for c in got["open"]]
    # the identity table: column + 0 (uint8 entries), column - 128 (int8 entries)
    shifts = {c.attrs["dtype"]: c.attrs.get("affine_shift") for c in gated}
    assert shifts == {"uint8": 0, "int8": -128}, [c.attrs for c in gated]
