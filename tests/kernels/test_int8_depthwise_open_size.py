"""``qdwconv2d`` with run-time image sizes (``_QDepthwise._emit_open``, codegen/qdepthwise.py):
QDQ depthwise convolutions as ``onnxruntime.quantization`` writes them (uint8 x, int8
per-channel weights, int32 bias, uint8 out) in a graph whose batch, height and width are open:
3x3 stride 1 and 2, 5x5 stride 1 (pairs of taps / quads), and a float32 result with ReLU
(``--quantize int8``'s form, fuse_qdq_float.py), as is a 1x1 convolution's (7-bit weights:
the open quad kernel, ``QConv._emit_open``). One bundle for x86-64-v2,
x86-64-v3 and this host's level, each level pinned, several run-time sizes (odd widths, rows
and planes smaller than one vector), 1 and 2 threads, bit for bit against ONNX Runtime and
exact integer numpy; the plan shows the integer depthwise kernel (not fp32 depthwise)."""

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

C = 24
SIZES = ((1, 1, 1), (1, 3, 5), (2, 7, 13), (1, 9, 40), (1, 6, 83))
SX, ZX, SY, ZY = 0.05, 120, 0.04, 125
LAYERS = (("a", 3, 1, 1), ("b", 3, 2, 1), ("c", 5, 1, 2))     # name, kernel, stride, pad


def _graph(path: Path) -> Path:
    rng = np.random.default_rng(7)
    nodes = [h.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"])]
    inits = {"sx": np.float32(SX), "zx": np.uint8(ZX), "sy": np.float32(SY), "zy": np.uint8(ZY)}
    outs = []
    for name, k, s, p in LAYERS:
        ws = rng.uniform(0.002, 0.01, C).astype(np.float32)
        inits.update({f"w{name}": rng.integers(-127, 128, (C, 1, k, k)).astype(np.int8),
                      f"ws{name}": ws, f"wz{name}": np.zeros(C, np.int8),
                      f"b{name}": rng.integers(-4000, 4000, C).astype(np.int32),
                      f"bs{name}": (np.float32(SX) * ws).astype(np.float32),
                      f"bz{name}": np.zeros(C, np.int32)})
        nodes += [h.make_node("DequantizeLinear", [f"w{name}", f"ws{name}", f"wz{name}"],
                              [f"wd{name}"], axis=0),
                  h.make_node("DequantizeLinear", [f"b{name}", f"bs{name}", f"bz{name}"],
                              [f"bd{name}"], axis=0),
                  h.make_node("Conv", ["xd", f"wd{name}", f"bd{name}"], [f"c{name}"],
                              group=C, kernel_shape=[k, k], strides=[s, s], pads=[p] * 4),
                  h.make_node("QuantizeLinear", [f"c{name}", "sy", "zy"], [f"q{name}"]),
                  h.make_node("DequantizeLinear", [f"q{name}", "sy", "zy"], [f"y{name}"])]
        outs.append(h.make_tensor_value_info(f"y{name}", T.FLOAT, None))
    # a float32 result (``--quantize int8``'s form: BN / activations after it): ReLU fused
    ws = rng.uniform(0.002, 0.01, C).astype(np.float32)
    inits.update({"wf": rng.integers(-127, 128, (C, 1, 3, 3)).astype(np.int8), "wsf": ws,
                  "wzf": np.zeros(C, np.int8),
                  "bf": rng.integers(-4000, 4000, C).astype(np.int32),
                  "bsf": (np.float32(SX) * ws).astype(np.float32), "bzf": np.zeros(C, np.int32)})
    nodes += [h.make_node("DequantizeLinear", ["wf", "wsf", "wzf"], ["wdf"], axis=0),
              h.make_node("DequantizeLinear", ["bf", "bsf", "bzf"], ["bdf"], axis=0),
              h.make_node("Conv", ["xd", "wdf", "bdf"], ["cf"], group=C, kernel_shape=[3, 3],
                          strides=[1, 1], pads=[1] * 4),
              h.make_node("Relu", ["cf"], ["yf"])]
    outs.append(h.make_tensor_value_info("yf", T.FLOAT, None))
    # and a 1x1 convolution's (7-bit weights): the open quad kernel (QConv._emit_open)
    ws = rng.uniform(0.002, 0.01, C).astype(np.float32)
    inits.update({"wp": rng.integers(-63, 64, (C, C, 1, 1)).astype(np.int8), "wsp": ws,
                  "wzp": np.zeros(C, np.int8),
                  "bp": rng.integers(-4000, 4000, C).astype(np.int32),
                  "bsp": (np.float32(SX) * ws).astype(np.float32), "bzp": np.zeros(C, np.int32)})
    nodes += [h.make_node("DequantizeLinear", ["wp", "wsp", "wzp"], ["wdp"], axis=0),
              h.make_node("DequantizeLinear", ["bp", "bsp", "bzp"], ["bdp"], axis=0),
              h.make_node("Conv", ["xd", "wdp", "bdp"], ["cp"], kernel_shape=[1, 1]),
              h.make_node("Relu", ["cp"], ["yp"])]
    outs.append(h.make_tensor_value_info("yp", T.FLOAT, None))
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", C, "H", "W"])], outs,
                    inits, path)


def _exact(src: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """Each layer in integer numpy: int32 sums, float32(acc) * (sx * ws / sy), ties to even."""
    import onnx
    from onnx import numpy_helper
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(src)).graph.initializer}
    xq = np.clip(np.round(x / np.float32(SX)) + ZX, 0, 255).astype(np.int64) - ZX
    out = {}
    for name, k, s, p in LAYERS + (("f", 3, 1, 1), ("p", 1, 1, 0)):
        if name == "p":
            w = init["wp"].astype(np.int64)[:, :, 0, 0]
            acc = np.einsum("oc,nchw->nohw", w, xq) + init["bp"].astype(np.int64).reshape(1, C, 1, 1)
            mult = (np.float32(SX) * init["wsp"]).astype(np.float32)
            f = acc.astype(np.int32).astype(np.float32) * mult.reshape(1, C, 1, 1)
            out["yp"] = np.maximum(f, np.float32(0))
            continue
        w = init[f"w{name}"].astype(np.int64)[:, 0]
        xp = np.pad(xq, ((0, 0), (0, 0), (p, p), (p, p)))
        oh = (x.shape[2] + 2 * p - k) // s + 1
        ow = (x.shape[3] + 2 * p - k) // s + 1
        acc = np.zeros((x.shape[0], C, oh, ow), np.int64)
        for ky in range(k):
            for kx in range(k):
                acc += xp[:, :, ky:ky + s * (oh - 1) + 1:s, kx:kx + s * (ow - 1) + 1:s] * \
                    w[:, ky, kx].reshape(1, C, 1, 1)
        acc += init[f"b{name}"].astype(np.int64).reshape(1, C, 1, 1)
        if name == "f":     # float32(acc) * (sx * ws), ReLU
            mult = (np.float32(SX) * init["wsf"]).astype(np.float32)
            f = acc.astype(np.int32).astype(np.float32) * mult.reshape(1, C, 1, 1)
            out["yf"] = np.maximum(f, np.float32(0))
            continue
        mult = (np.float32(SX) * init[f"ws{name}"] / np.float32(SY)).astype(np.float32)
        f = acc.astype(np.int32).astype(np.float32) * mult.reshape(1, C, 1, 1)
        q = np.clip(np.round(f) + np.float32(ZY), 0, 255)
        out[f"y{name}"] = ((q - np.float32(ZY)) * np.float32(SY)).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qdwopen")
    src = _graph(folder / "dw.onnx")
    path = folder / "dw.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3,host", check=False))
    return src, path


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "host"])
def test_open_size_depthwise_is_integer_and_exact(bundle, level: str, monkeypatch) -> None:
    src, path = bundle
    if level != "host":
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            assert sum(k.startswith("integer depthwise") for k in kinds) == len(LAYERS) + 1, kinds
            assert sum(k.startswith("integer quad convolution") for k in kinds) == 1, kinds
            for n, hh, ww in SIZES:
                x = (rng.standard_normal((n, C, hh, ww)) * 3).astype(np.float32)
                got = model.run({"x": x})
                names = [f"y{n_}" for n_, *_ in LAYERS] + ["yf", "yp"]
                want = dict(zip(names, sess.run(None, {"x": x})))
                for name, exact in _exact(src, x).items():
                    np.testing.assert_array_equal(got[name], exact, err_msg=f"{name} {x.shape}")
                    if name in ("yf", "yp"):    # ORT: a float32 convolution of the dequantized values
                        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
                    else:
                        np.testing.assert_array_equal(got[name], want[name],
                                                      err_msg=f"{name} {x.shape} ORT")


def test_open_int8_bundle_keeps_the_vnni_level(bundle, monkeypatch) -> None:
    """The portable levels of a VNNI host end with x86-64-v4+vnni; an open-size int8 model's
    kernels (run-time sizes) count as integer kernels, so the export keeps that variant."""
    from mlcpack.packager.codegen.target import drop_idle_levels, resolve_targets
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import UNPACKED
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V4 + ",avx512_vnni")
    targets = resolve_targets(None)
    assert targets[-1].name == "x86-64-v4+vnni"
    mod, _ = import_onnx(str(bundle[0]))
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    assert drop_idle_levels(targets, funcs) == targets
