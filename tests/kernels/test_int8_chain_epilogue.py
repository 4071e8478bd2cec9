"""The elementwise chain after an integer convolution's float32 result (``--quantize int8``'s
form: Paddle's per-channel affine, HardSwish, affine, then the next layer's QuantizeLinear) is
fused into the convolution (passes/fuse.py, codegen/qchain.py) and applied as its results are
stored: the pixel-lane copy out (codegen/qgemm_conv.py), the channel-lane staging rows
(``oc_lanes``, the quad kernel, here with vpdpbusd emulated where the host lacks VNNI), the
depthwise stores (codegen/qdepthwise.py), fixed and run-time image sizes. A small QDQ model
(3x3 conv -> chain -> quantize -> depthwise -> chain -> quantize -> 1x1 conv -> affine + ReLU
-> y) at x86-64-v2, v3 and this host's level: every chain in an integer kernel (no generic
loop nest but the input's quantize), the output ONNX Runtime's (the QDQ model run as written)
to float32 rounding."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import X86_V2, X86_V3
from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.codegen.qchain import kernel_tag
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features
from mlcpack.runtime.describe import describe

pytest.importorskip("onnxruntime")
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86 or "avx2" not in host_features(),
                                reason="runs x86-64-v2 and v3 code: needs an x86-64 host with AVX2")
C, OUT = 16, 24


def _model(path: Path, dims) -> Path:
    rng = np.random.default_rng(0)
    f = lambda *s, sd=0.3: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    inits: dict = {}
    nodes: list = []

    def dq_w(name, w):      # per-channel int8 weights, as --quantize int8 writes them
        s = (np.abs(w).reshape(w.shape[0], -1).max(1) / 127).astype(np.float32)
        inits.update({name + "_q": np.clip(np.round(w / s.reshape(-1, 1, 1, 1)), -127, 127)
                      .astype(np.int8), name + "_s": s, name + "_z": np.zeros(len(s), np.int8)})
        nodes.append(h.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"],
                                 [name], axis=0))

    def qdq(x, y, scale, zp):
        inits.update({y + "_s": np.float32(scale), y + "_z": np.uint8(zp)})
        nodes.extend([h.make_node("QuantizeLinear", [x, y + "_s", y + "_z"], [y + "_q"]),
                      h.make_node("DequantizeLinear", [y + "_q", y + "_s", y + "_z"], [y])])

    def paddle(x, y, t):    # affine per channel, HardSwish, affine per tensor
        inits.update({t + "a": f(1, C, 1, 1, sd=0.5) + 1, t + "b": f(1, C, 1, 1),
                      t + "c": np.float32(1.2), t + "d": np.float32(0.1)})
        nodes.extend([h.make_node("Mul", [x, t + "a"], [t + "m"]),
                      h.make_node("Add", [t + "m", t + "b"], [t + "ab"]),
                      h.make_node("HardSwish", [t + "ab"], [t + "hs"]),
                      h.make_node("Mul", [t + "hs", t + "c"], [t + "m2"]),
                      h.make_node("Add", [t + "m2", t + "d"], [y])])

    qdq("x", "xq", 0.02, 128)
    dq_w("w1", f(C, 8, 3, 3))
    inits["b1"] = f(C, sd=0.1)
    nodes.append(h.make_node("Conv", ["xq", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]))
    paddle("c1", "h1", "k1")
    qdq("h1", "h1q", 0.03, 20)
    dq_w("w2", f(C, 1, 3, 3, sd=0.5))
    inits["b2"] = f(C, sd=0.1)
    nodes.append(h.make_node("Conv", ["h1q", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=C))
    paddle("c2", "h2", "k2")
    qdq("h2", "h2q", 0.03, 20)
    dq_w("w3", f(OUT, C, 1, 1))
    inits.update({"b3": f(OUT, sd=0.1), "s3": f(1, OUT, 1, 1) + 1, "t3": f(1, OUT, 1, 1)})
    nodes.extend([h.make_node("Conv", ["h2q", "w3", "b3"], ["c3"]),
                  h.make_node("Mul", ["c3", "s3"], ["m3"]), h.make_node("Add", ["m3", "t3"], ["a3"]),
                  h.make_node("Relu", ["a3"], ["y"])])
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
                    [h.make_tensor_value_info("y", T.FLOAT, None)], inits, path)


CASES = {   # input dims, export's targets, the quad kernels with vpdpbusd emulated
    "fixed": ([1, 8, 12, 20], "x86-64-v2,x86-64-v3,host", False),
    "fixed_quads": ([1, 8, 12, 20], "x86-64-v3", True),
    "open_quads": (["N", 8, "H", "W"], "x86-64-v3,host", True),
}
SIZES = {"fixed": [(1, 12, 20)], "fixed_quads": [(1, 12, 20)],
         "open_quads": [(1, 12, 20), (2, 5, 7), (1, 1, 3)]}


@pytest.mark.parametrize("case", list(CASES))
def test_chain_in_the_integer_kernels_matches_ort(case: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    dims, targets, emulate = CASES[case]
    src = _model(tmp_path / "q.onnx", dims)
    path = tmp_path / "q.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target=targets, check=False,
                                           compile=CompileOptions(vnni_emulate=emulate)))
    kernels = describe(path)["kernels"]
    # the three convolutions with their chains, fused; the input's quantize alone besides
    chains = [k for k in kernels if k["symbol"].startswith("mlc_fused_q")
              and "conv2d" in k["symbol"] and ("quantize" in k["symbol"] or "relu" in k["symbol"])]
    generic = [k["symbol"] for k in kernels if k.get("kernel") == "generic loop nest"
               and k["symbol"] != "mlc_quantize"]
    assert generic == [] and len({k["symbol"] for k in chains}) == 3, kernels
    if emulate and case.startswith("fixed"):    # the first conv on the channel lanes
        fused = run_pipeline(mod, DEFAULT_PIPELINE,
                             options=CompileOptions(target=targets, vnni_emulate=True))
        tags = [kernel_tag(f) for f in fused.functions.values() if isinstance(f, PrimFunc)]
        assert [bool(t.attrs.get("oc_lanes")) for t in tags if t and t.kind == "qconv2d"] \
            == [True, False]
    rng = np.random.default_rng(1)
    levels = [("x86-64-v2", X86_V2), ("x86-64-v3", X86_V3), ("host", None)]
    for level, flags in levels:
        if level not in targets:
            continue
        if flags:
            monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        else:
            monkeypatch.delenv("MLCPACK_CPU_FEATURES", raising=False)
        for n, hh, ww in SIZES[case]:
            x = rng.normal(0, 1, (n, 8, hh, ww)).astype(np.float32)
            ref = ort_outputs(src, {"x": x}, as_written=True)["y"]
            for threads in (1, 2):
                with load(path, threads=threads) as model:
                    got = model.run({"x": x})["y"]
                scale = float(np.abs(ref).max())
                np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * scale + 1e-6,
                                           err_msg=f"{level} {(n, hh, ww)} {threads}")


def test_chain_math_is_lane_wise() -> None:
    """Every math function a chain may hold (codegen/qchain.py, pure Python) has a lane-wise
    form (codegen/vecmath_lanes.py), which ``QEmitter.chain_vector`` emits."""
    from mlcpack.packager.codegen.qchain import CHAIN_MATH
    from mlcpack.packager.codegen.vecmath_lanes import VECTOR_MATH

    assert CHAIN_MATH <= VECTOR_MATH
