"""``quantize`` (float32 to 8 bits) and ``dequantize`` (8 bits to float32) of run-time extents
as vector kernels on AVX2 (``codegen/qelementwise.py`` ``_QConvertSized``): what ORT's QDQ files
with open image sizes run between a float convolution and an integer kernel (the PP-OCR
classifier's expand 1x1 before its table and integer depthwise, the table's bytes before the
squeeze-and-excitation mean). A QDQ graph with batch, height and width open: q = Q(x), a Relu
between Q/DQ (a lut8 table of q) read twice, once dequantized (a dequantize kernel) and once
through a MaxPool on bytes, and times a gate [N, C, 1, 1] before a quantize (the
squeeze-and-excitation multiply: a "gate, quantize" kernel) and a MaxPool, and the pool's
bytes through a table read by a dequantize alone (the two as one "table, dequantize"
kernel), and a residual add of two dequantized byte tensors quantized (one "dequantize,
add, quantize" kernel); with 8 channels (one task) and 2064 (split between tasks, as the
generic loop nest of the v2 level splits), uint8 and int8. x86-64-v2 and x86-64-v3 (a bundle
each: the header's kernel table names one level's kernels), features pinned, at sizes whose
element counts leave tails past the last 32 values, values at and beside the rounding ties, on
1 and 2 threads: bit for bit against ONNX Runtime running the graph as written and against
exact float32 numpy; the v3 level's kernels are the vector ones."""

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
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features

ort = pytest.importorskip("onnxruntime")
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86 or "avx2" not in host_features(),
                                reason="runs x86-64-v2 and v3 code: needs an x86-64 host with AVX2")

CHANNELS = (8, 2064)
# 8 * 15 = 3 * 32 + 24, 2064 * 15 = 967 * 32 + 16; 2 * 8 * 117 = 58 * 32 + 16, pooled 8 * 2
# = 16 (no whole step), 2 * 8 * 24 = 12 * 32, 2064 * 3 = 193 * 32 + 16, 2 * 2064 * 24 = 3096 * 32
SIZES = ((1, 3, 5), (2, 9, 13), (1, 2, 7))
QUANT = {"a": (np.float32(1.0), np.uint8(3)), "b": (np.float32(0.37), np.int8(-5))}
S2 = {"a": (np.float32(0.5), np.uint8(0)), "b": (np.float32(0.25), np.int8(-128))}
S3 = {"a": (np.float32(0.3), np.uint8(7)), "b": (np.float32(0.2), np.int8(-100))}


def _branches(path: Path) -> Path:
    """For each of a (uint8, scale 1) and b (int8), on x0 (8 channels) and x1 (2064):
    q = Q(x), q2 = Q(Relu(DQ(q))) (a lut8 table of q, read twice), y = DQ(q2) and
    yp = DQ(Q(MaxPool 2x2/2 (DQ(q2)))) (the pool on bytes, a dequantize fused after it)."""
    nodes, inits, outs = [], {}, []
    for i in range(len(CHANNELS)):
        for key, (s, z) in QUANT.items():
            t = f"{key}{i}"
            inits[f"s_{t}"], inits[f"z_{t}"] = s, z
            inits[f"s2_{t}"], inits[f"z2_{t}"] = S2[key]
            nodes += [h.make_node("QuantizeLinear", [f"x{i}", f"s_{t}", f"z_{t}"], [f"q_{t}"]),
                      h.make_node("DequantizeLinear", [f"q_{t}", f"s_{t}", f"z_{t}"], [f"d_{t}"]),
                      h.make_node("Relu", [f"d_{t}"], [f"r_{t}"]),
                      h.make_node("QuantizeLinear", [f"r_{t}", f"s2_{t}", f"z2_{t}"], [f"q2_{t}"]),
                      h.make_node("DequantizeLinear", [f"q2_{t}", f"s2_{t}", f"z2_{t}"],
                                  [f"y_{t}"]),
                      h.make_node("DequantizeLinear", [f"q2_{t}", f"s2_{t}", f"z2_{t}"],
                                  [f"e_{t}"]),
                      h.make_node("MaxPool", [f"e_{t}"], [f"p_{t}"], kernel_shape=[2, 2],
                                  strides=[2, 2]),
                      h.make_node("QuantizeLinear", [f"p_{t}", f"s2_{t}", f"z2_{t}"],
                                  [f"pq_{t}"]),
                      h.make_node("DequantizeLinear", [f"pq_{t}", f"s2_{t}", f"z2_{t}"],
                                  [f"yp_{t}"])]
            # the pool's bytes through a table (Relu, another scale) read by a dequantize alone
            inits[f"s3_{t}"], inits[f"z3_{t}"] = S3[key]
            nodes += [h.make_node("Relu", [f"yp_{t}"], [f"pr_{t}"]),
                      h.make_node("QuantizeLinear", [f"pr_{t}", f"s3_{t}", f"z3_{t}"],
                                  [f"prq_{t}"]),
                      h.make_node("DequantizeLinear", [f"prq_{t}", f"s3_{t}", f"z3_{t}"],
                                  [f"yl_{t}"])]
            outs.append(h.make_tensor_value_info(f"yl_{t}", T.FLOAT, None))
            # the squeeze-and-excitation multiply read by a quantize alone, then bytes
            nodes += [h.make_node("Mul", [f"y_{t}", f"g{i}"], [f"m_{t}"]),
                      h.make_node("QuantizeLinear", [f"m_{t}", f"s_{t}", f"z_{t}"], [f"mq_{t}"]),
                      h.make_node("DequantizeLinear", [f"mq_{t}", f"s_{t}", f"z_{t}"],
                                  [f"md_{t}"]),
                      h.make_node("MaxPool", [f"md_{t}"], [f"mp_{t}"], kernel_shape=[2, 2],
                                  strides=[2, 2]),
                      h.make_node("QuantizeLinear", [f"mp_{t}", f"s_{t}", f"z_{t}"],
                                  [f"mpq_{t}"]),
                      h.make_node("DequantizeLinear", [f"mpq_{t}", f"s_{t}", f"z_{t}"],
                                  [f"ym_{t}"])]
            outs += [h.make_tensor_value_info(f"y_{t}", T.FLOAT, None),
                     h.make_tensor_value_info(f"yp_{t}", T.FLOAT, None),
                     h.make_tensor_value_info(f"ym_{t}", T.FLOAT, None)]
            # a residual add of two dequantized byte tensors (the gated bytes and q2), quantized,
            # then bytes
            nodes += [h.make_node("DequantizeLinear", [f"mq_{t}", f"s_{t}", f"z_{t}"],
                                  [f"ad_{t}"]),
                      h.make_node("DequantizeLinear", [f"q2_{t}", f"s2_{t}", f"z2_{t}"],
                                  [f"bd_{t}"]),
                      h.make_node("Add", [f"ad_{t}", f"bd_{t}"], [f"ra_{t}"]),
                      h.make_node("QuantizeLinear", [f"ra_{t}", f"s_{t}", f"z_{t}"], [f"raq_{t}"]),
                      h.make_node("DequantizeLinear", [f"raq_{t}", f"s_{t}", f"z_{t}"],
                                  [f"rad_{t}"]),
                      h.make_node("MaxPool", [f"rad_{t}"], [f"rap_{t}"], kernel_shape=[2, 2],
                                  strides=[2, 2]),
                      h.make_node("QuantizeLinear", [f"rap_{t}", f"s_{t}", f"z_{t}"],
                                  [f"rapq_{t}"]),
                      h.make_node("DequantizeLinear", [f"rapq_{t}", f"s_{t}", f"z_{t}"],
                                  [f"yr_{t}"])]
            outs.append(h.make_tensor_value_info(f"yr_{t}", T.FLOAT, None))
    ins = [h.make_tensor_value_info(f"x{i}", T.FLOAT, ["N", c, "H", "W"])
           for i, c in enumerate(CHANNELS)]
    ins += [h.make_tensor_value_info(f"g{i}", T.FLOAT, ["N", c, 1, 1])
            for i, c in enumerate(CHANNELS)]
    return qm._save(nodes, ins, outs, inits, path)


def _exact(x: np.ndarray, g: np.ndarray, key: str) -> tuple[np.ndarray, ...]:
    """(y, yp, ym) of a branch in exact float32 numpy (ONNX's definitions)."""
    f = np.float32

    def q(v, s, z):
        info = np.iinfo(z.dtype)
        return np.clip(np.round((v / s).astype(f)) + f(z), info.min, info.max).astype(z.dtype)

    def dq(v, s, z):
        return ((v.astype(f) - f(z)) * s).astype(f)

    (s, z), (s2, z2) = QUANT[key], S2[key]
    def pool(v):
        n, c, hh, ww = v.shape
        oh, ow = hh // 2, ww // 2
        return v[:, :, :2 * oh, :2 * ow].reshape(n, c, oh, 2, ow, 2).max(axis=(3, 5))

    (s3, z3) = S3[key]
    q2 = q(np.maximum(dq(q(x, s, z), s, z), f(0)), s2, z2)
    y, yp = dq(q2, s2, z2), dq(pool(q2), s2, z2)
    mq = q((y * g).astype(f), s, z)
    return (y, yp, dq(pool(mq), s, z), dq(q(np.maximum(yp, f(0)), s3, z3), s3, z3),
            dq(pool(q((dq(mq, s, z) + y).astype(f), s, z)), s, z))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return _branches(tmp_path_factory.mktemp("qconvert") / "branches.onnx")


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_quantize_dequantize_with_run_time_extents(source, level: str, monkeypatch) -> None:
    """Each level a bundle of its own (the header's kernel table names one level's kernels)."""
    src = source
    path = src.with_name(f"branches-{level}.mlc")
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target=level, check=False))
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(7)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            if level == "x86-64-v3":
                for kind in ("quantize", "dequantize", "gate, quantize", "table, dequantize",
                             "dequantize, add, quantize"):
                    assert kinds.count(kind) >= 4, kinds
                split = {k.parallel for k in model.schema.plan.kernels
                         if k.kernel in ("quantize", "dequantize", "gate, quantize",
                                         "table, dequantize", "dequantize, add, quantize")}
                assert split == {False, True}, split
            for n, hh, ww in SIZES:
                feed = {}
                for i, c in enumerate(CHANNELS):
                    x = (rng.standard_normal((n, c, hh, ww)) * 40).astype(np.float32)
                    flat = x.reshape(-1)
                    # values at and beside the rounding ties (k + 0.5) * s of both scales
                    k = min(32, flat.size // 4)
                    for j, (sc, _) in enumerate(QUANT.values()):
                        ties = (np.arange(k, dtype=np.float32) - 16 + np.float32(0.5)) * sc
                        flat[2 * j * k:(2 * j + 1) * k] = ties
                        flat[(2 * j + 1) * k:(2 * j + 2) * k] = np.nextafter(ties, np.float32(0))
                    feed[f"x{i}"] = x
                    feed[f"g{i}"] = rng.uniform(0, 3, (n, c, 1, 1)).astype(np.float32)
                got = model.run(feed)
                want = dict(zip(names, sess.run(None, feed)))
                for i in range(len(CHANNELS)):
                    for key in QUANT:
                        outs = [f"{o}_{key}{i}" for o in ("y", "yp", "ym", "yl", "yr")]
                        for name, exact in zip(outs, _exact(feed[f"x{i}"], feed[f"g{i}"], key)):
                            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
                            np.testing.assert_array_equal(got[name], exact, err_msg=name)
