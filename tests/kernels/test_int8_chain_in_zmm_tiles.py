"""A fused chain (codegen/qchain.py) on the 512-bit pixel-lane quad kernel whose plane rows are
the output's (1x1 windows, stride 1, no padding across: codegen/qgemm_conv.py ``tile_direct``):
applied to each 16-pixel accumulator as its tile ends and stored straight into the output, no
float32 staging rows. The PP-OCRv4 recognizer's 1x1s: Paddle2ONNX's affine, x * clip(x + 3, 0,
6) / 6, affine, then the next layer's quantize.

On any host: the emitted x86-64-v4+vnni code (the chain's division on zmm in the same function
as the zmm vpdpbusd, a workspace without the staging rows). Natively on a CPU with avx512_vnni:
the bundle against ONNX Runtime running the QDQ model as written, 1 and 2 threads, batch 1 and
2, a pixel count that does not fill the last tile (70 of 96 lanes) and output channels that do
not fill the last 6-row tile (20)."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from helpers import ort_outputs
from mlcpack.runtime.cpu import host_features

pytest.importorskip("onnxruntime")
X86 = platform.machine().lower() in ("x86_64", "amd64")
C, OUT, H, W = 16, 20, 7, 10


def _model(path: Path, dims: list) -> Path:
    rng = np.random.default_rng(3)
    f = lambda *s, sd=0.3: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    inits: dict = {}
    nodes: list = []

    def dq_w(name, w):
        s = (np.abs(w).reshape(w.shape[0], -1).max(1) / 127).astype(np.float32)
        inits.update({name + "_q": np.clip(np.round(w / s.reshape(-1, 1, 1, 1)), -127, 127)
                      .astype(np.int8), name + "_s": s, name + "_z": np.zeros(len(s), np.int8)})
        nodes.append(h.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"],
                                 [name], axis=0))

    def qdq(x, y, scale, zp):
        inits.update({y + "_s": np.float32(scale), y + "_z": np.uint8(zp)})
        nodes.extend([h.make_node("QuantizeLinear", [x, y + "_s", y + "_z"], [y + "_q"]),
                      h.make_node("DequantizeLinear", [y + "_q", y + "_s", y + "_z"], [y])])

    def paddle(x, y, t):
        inits.update({t + "a": np.float32(1.1), t + "b": np.float32(0.05),
                      t + "3": np.float32(3), t + "0": np.float32(0), t + "6": np.float32(6),
                      t + "c": f(1, OUT, 1, 1) + 1, t + "d": np.float32(0.1)})
        nodes.extend([h.make_node("Mul", [t + "a", x], [t + "m"]),
                      h.make_node("Add", [t + "m", t + "b"], [t + "ab"]),
                      h.make_node("Add", [t + "ab", t + "3"], [t + "p3"]),
                      h.make_node("Clip", [t + "p3", t + "0", t + "6"], [t + "cl"]),
                      h.make_node("Mul", [t + "ab", t + "cl"], [t + "mm"]),
                      h.make_node("Div", [t + "mm", t + "6"], [t + "hs"]),
                      h.make_node("Mul", [t + "c", t + "hs"], [t + "m2"]),
                      h.make_node("Add", [t + "m2", t + "d"], [y])])

    qdq("x", "x0", 0.02, 128)
    dq_w("w1", f(OUT, C, 1, 1))
    inits["b1"] = f(OUT, sd=0.1)
    nodes.append(h.make_node("Conv", ["x0", "w1", "b1"], ["c1"]))
    paddle("c1", "h1", "k1")
    qdq("h1", "h1q", 0.03, 20)        # the chain ends in the next layer's quantize
    dq_w("w2", f(OUT, OUT, 1, 1))
    inits["b2"] = f(OUT, sd=0.1)
    nodes.append(h.make_node("Conv", ["h1q", "w2", "b2"], ["c2"]))
    paddle("c2", "y", "k2")           # ... and in float32
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
                    [h.make_tensor_value_info("y", T.FLOAT, None)], inits, path)


@pytest.mark.parametrize("open_dims", [False, True])
def test_chain_in_the_zmm_tiles_emitted(open_dims: bool, tmp_path: Path) -> None:
    """x86-64-v4+vnni: both 1x1 convolutions take the chain into their 512-bit tiles (its
    division on zmm, the quantized result stored by vpmovdb), with no staging rows in their
    workspace (planes only: C x 96 lanes of quads, against 20 x 96 float32 staged before);
    with run-time sizes too (``_emit_open``: 48-lane tiles, no staging rows in the
    workspace's expression)."""
    import llvmlite.binding as llvm

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
    from mlcpack.packager.vm_emit import main_size_vars

    dims = ["N", C, "H", "W"] if open_dims else [1, C, H, W]
    mod, _ = import_onnx(str(_model(tmp_path / "q.onnx", dims)))
    target = resolve_target("x86-64-v4+vnni")
    opts = CompileOptions(target=target.name)
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
    funcs = [f for f in mod.functions.values()
             if isinstance(f, PrimFunc) and "qconv2d" in f.name]
    assert len(funcs) == 2
    code = compile_prim_funcs(funcs, target, main_size_vars(mod),
                              options=opts.for_targets([target]))
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    for name, kernel in code.kernels.items():
        body = asm.split(f"\n{kernel.symbol}:", 1)[1].split("\n.Lfunc_end", 1)[0]
        assert re.search(r"\bvpdpbusd\s+[^\n]*%zmm", body), name
        assert re.search(r"\bvdivps\s+[^\n]*%zmm", body), name
        assert "pixel lanes: 6 x 48" in kernel.choice
        if open_dims:
            assert kernel.symbolic and "sized at run time" in kernel.choice
            # planes (C / 4 words a pixel, 8 task regions) but no [OUT][H * W] float32 rows
            big = kernel.workspace_expr.evaluate({"N": 1, "H": 100, "W": 100})
            assert big < 100 * 100 * (8 * 2 * C + 4 * OUT), kernel.workspace_expr
        else:
            assert kernel.workspace_bytes < OUT * 96 * 4, (name, kernel.workspace_bytes)
    assert "vpmovdb" in asm


@pytest.mark.skipif(not X86 or "avx512_vnni" not in host_features(),
                    reason="runs 512-bit vpdpbusd natively: needs an x86-64 host with "
                           "avx512_vnni")
@pytest.mark.parametrize("case", ["batch1", "batch2", "open"])
def test_chain_in_the_zmm_tiles_matches_ort(case: str, tmp_path: Path) -> None:
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    sizes = {"batch1": [(1, H, W)], "batch2": [(2, H, W)],
             "open": [(1, H, W), (2, 5, 13), (1, 1, 3), (1, 12, 8)]}[case]
    dims = ["N", C, "H", "W"] if case == "open" else [sizes[0][0], C, H, W]
    src = _model(tmp_path / "q.onnx", dims)
    path = tmp_path / "q.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target="host", check=False))
    kernels = [k for k in describe(path)["kernels"] if "qconv2d" in k["symbol"]]
    assert len(kernels) == 2, kernels
    rng = np.random.default_rng(1)
    for n, hh, ww in sizes:
        x = rng.normal(0, 1, (n, C, hh, ww)).astype(np.float32)
        ref = ort_outputs(src, {"x": x}, as_written=True)["y"]
        for threads in (1, 2):
            with load(path, threads=threads) as model:
                got = model.run({"x": x})["y"]
            scale = float(np.abs(ref).max())
            np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * scale + 1e-6,
                                       err_msg=f"{(n, hh, ww)}, {threads} threads")
