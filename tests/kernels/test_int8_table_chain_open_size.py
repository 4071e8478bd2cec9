"""``qtable`` (quantize, an 8-bit table, dequantize in one pass) with run-time extents: what
ORT's QDQ files with open image sizes compute around each activation between float
convolutions. A QDQ graph as ``onnxruntime.quantization`` writes it, batch, height and width
open, 264 channels (the kernels split between tasks): a Sigmoid between Q/DQ pairs (uint8, one
table row, walked flat), a per-channel Mul (int8, a table per channel, walked by rows) and a
Relu (its table constant up to the zero point, then the column itself: clamped, no lookup).
One portable bundle (x86-64-v2 + x86-64-v3), each level run with its features pinned (v3: 32
values a step with ``vpshufb``; v2: value by value), at two sizes whose element counts (whole,
and per row) leave tails of 3 to 24 values past the last 32, values at and beside the
quotient's rounding ties, on 1 and 2 threads, bit for bit against ONNX Runtime running the
graph as written and (the Mul and Relu branches) against exact float32 numpy; the chains are
``qtable`` kernels, and a fixed shape keeps its three kernels."""

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

C = 264
# flat: 264 * 35 = 288 * 32 + 24, 2 * 264 * 117 = 1930 * 32 + 16; rows of 35 and 117: 32 + 3, 96 + 21
SIZES = ((1, 5, 7), (2, 9, 13))
S0, Z0, S1, Z1 = 0.05, 120, 1.0 / 256, 0      # Sigmoid branch (uint8)
S2, Z2, S3, Z3 = 0.07, -3, 0.1, 5             # Mul branch (int8)
MUL = (np.random.default_rng(5).uniform(-2, 2, C)).astype(np.float32)


def _chains(path: Path, dims) -> Path:
    """x -> Q -> DQ -> Sigmoid -> Q -> DQ -> y0, x -> Q -> DQ -> Mul(c) -> Q -> DQ -> y1 and
    x -> Q -> DQ -> Relu -> Q -> DQ -> y2 (its table: constant up to the zero point, then the
    column itself: no lookup)."""
    def qdq(src: str, s: str, z: str, out: str) -> list:
        return [h.make_node("QuantizeLinear", [src, s, z], [out + "_q"]),
                h.make_node("DequantizeLinear", [out + "_q", s, z], [out])]
    nodes = (qdq("x", "s0", "z0", "a") + [h.make_node("Sigmoid", ["a"], ["sg"])]
             + qdq("sg", "s1", "z1", "y0")
             + qdq("x", "s2", "z2", "b") + [h.make_node("Mul", ["b", "c"], ["m"])]
             + qdq("m", "s3", "z3", "y1")
             + qdq("x", "s0", "z0", "r") + [h.make_node("Relu", ["r"], ["rl"])]
             + qdq("rl", "s0", "z0", "y2"))
    inits = {"s0": np.float32(S0), "z0": np.uint8(Z0), "s1": np.float32(S1),
             "z1": np.uint8(Z1), "s2": np.float32(S2), "z2": np.int8(Z2),
             "s3": np.float32(S3), "z3": np.int8(Z3), "c": MUL.reshape(1, C, 1, 1)}
    outs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("y0", "y1", "y2")]
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)], outs, inits, path)


def _exact(x: np.ndarray) -> dict[str, np.ndarray]:
    """The Mul and Relu branches in exact float32 numpy (ONNX QuantizeLinear /
    DequantizeLinear)."""
    f = np.float32

    def q(v, s, z, dtype):
        info = np.iinfo(dtype)
        return np.clip(np.round((v / f(s)).astype(f)) + f(z), info.min, info.max).astype(dtype)

    def dq(v, s, z):
        return ((v.astype(f) - f(z)) * f(s)).astype(f)

    b = dq(q(x, S2, Z2, np.int8), S2, Z2)
    r = np.maximum(dq(q(x, S0, Z0, np.uint8), S0, Z0), f(0))
    return {"y1": dq(q((b * MUL.reshape(1, C, 1, 1)).astype(f), S3, Z3, np.int8), S3, Z3),
            "y2": dq(q(r, S0, Z0, np.uint8), S0, Z0)}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qtable")
    src = _chains(folder / "chains.onnx", ["N", C, "H", "W"])
    path = folder / "chains.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    return src, path


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_table_chains_with_run_time_extents(bundle, level: str, monkeypatch) -> None:
    src, path = bundle
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            assert kinds == ["quantize, table, dequantize"] * 3, kinds
            assert all(k.parallel for k in model.schema.plan.kernels)
            for n, hh, ww in SIZES:
                x = (rng.standard_normal((n, C, hh, ww)) * 6).astype(np.float32)
                # values at and beside the quotient's rounding ties (k + 0.5) * s
                ties = ((np.arange(64, dtype=np.float32) - 32 + np.float32(0.5)) * np.float32(S0))
                x.reshape(-1)[:64] = ties
                x.reshape(-1)[64:128] = np.nextafter(ties, np.float32(np.inf))
                x.reshape(-1)[128:192] = np.nextafter(ties, np.float32(-np.inf))
                got = model.run({"x": x})
                want = dict(zip(("y0", "y1", "y2"), sess.run(None, {"x": x})))
                for name in ("y0", "y1", "y2"):
                    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
                for name, exact in _exact(x).items():
                    np.testing.assert_array_equal(got[name], exact, err_msg=name)


def test_fixed_shapes_keep_three_kernels(tmp_path: Path) -> None:
    """Static shapes keep quantize, lut8 and dequantize apart (static bundles unchanged); the
    open shapes get the three ``qtable`` calls, the Relu's with its table's hints (constant
    up to the zero point's column, then the column itself)."""
    ops = {}
    hints = []
    for name, dims in (("fixed", [1, C, 4, 4]), ("open", ["N", C, "H", "W"])):
        mod, _ = import_onnx(str(_chains(tmp_path / f"{name}.onnx", dims)))
        passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")]
        mod = run_pipeline(mod, passes, options=CompileOptions(target="x86-64-v3"))
        calls = [b.value for b in mod.functions["main"].bindings() if hasattr(b.value, "op")]
        ops[name] = sorted(c.op for c in calls)
        hints += [c.attrs for c in calls if c.op == "qtable"]
    assert "qtable" not in ops["fixed"] and ops["fixed"].count("lut8") == 3, ops["fixed"]
    assert ops["open"].count("qtable") == 3 and "lut8" not in ops["open"], ops["open"]
    relu = [a for a in hints if a.get("affine_shift") is not None]
    assert len(relu) == 1 and (relu[0]["col_lo"], relu[0]["col_hi"]) == (Z0, 255), hints
