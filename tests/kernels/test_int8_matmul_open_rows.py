"""``qmatmul`` with run-time rows (``QMatmul._open_rows``, codegen/qgemm_matmul.py): the
float-result products of ``--quantize int8`` graphs (fuse_qdq_float.py: dequantize(x) @
dequantize(W const) [+ float bias] [ReLU], no quantize after) whose batch and sequence length
are open, as the PP-OCRv4 recognizer's transformer and CTC head at its open width. Two layers:
K = 37 (odd) to 19 columns with a bias (one task), to 130 columns with ReLU (split over tasks,
a partial panel). One bundle for x86-64-v2, x86-64-v3 and this host's level, each pinned;
row counts that take every tail tile (1, 2, 4 and 8 past the full tiles), 1 and 2 threads; against
ONNX Runtime and integer numpy. The plan shows the integer kernel, not fp32 contraction; the
VNNI level's code has ``vpdpbusd`` (checked on any host)."""

from __future__ import annotations

import platform
import re
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

K = 37
LAYERS = (("a", 19, True, False), ("b", 130, False, True))     # name, columns, bias, relu
SIZES = ((1, 1), (1, 5), (2, 7), (1, 13), (1, 23), (3, 25), (1, 40))
SX, ZX = 0.05, 120
CHOICE = "integer GEMM, rows read at run time"


def _graph(path: Path) -> Path:
    rng = np.random.default_rng(11)
    nodes = [h.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"])]
    inits = {"sx": np.float32(SX), "zx": np.uint8(ZX)}
    outs = []
    for name, o, bias, relu in LAYERS:
        inits.update({f"w{name}": rng.integers(-127, 128, (K, o)).astype(np.int8),
                      f"ws{name}": rng.uniform(0.002, 0.01, o).astype(np.float32),
                      f"wz{name}": np.zeros(o, np.int8)})
        nodes.append(h.make_node("DequantizeLinear", [f"w{name}", f"ws{name}", f"wz{name}"],
                                 [f"wd{name}"], axis=1))
        nodes.append(h.make_node("MatMul", ["xd", f"wd{name}"], [f"m{name}"]))
        last = f"m{name}"
        if bias:
            inits[f"b{name}"] = rng.standard_normal(o).astype(np.float32)
            nodes.append(h.make_node("Add", [last, f"b{name}"], [f"a{name}"]))
            last = f"a{name}"
        if relu:
            nodes.append(h.make_node("Relu", [last], [f"r{name}"]))
            last = f"r{name}"
        nodes.append(h.make_node("Identity", [last], [f"y{name}"]))
        outs.append(h.make_tensor_value_info(f"y{name}", T.FLOAT, None))
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", "T", K])], outs,
                    inits, path)


def _exact(src: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """float32(int32 sums) * (sx * ws) [+ bias] [ReLU]."""
    import onnx
    from onnx import numpy_helper
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(src)).graph.initializer}
    xq = np.clip(np.round(x / np.float32(SX)) + ZX, 0, 255).astype(np.int64) - ZX
    out = {}
    for name, _, bias, relu in LAYERS:
        acc = (xq @ init[f"w{name}"].astype(np.int64)).astype(np.int32).astype(np.float32)
        f = acc * (np.float32(SX) * init[f"ws{name}"]).astype(np.float32)
        if bias:
            f = f + init[f"b{name}"]
        out[f"y{name}"] = np.maximum(f, np.float32(0)) if relu else f
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qmmopen")
    src = _graph(folder / "mm.onnx")
    path = folder / "mm.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3,host", check=False))
    return src, path


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "host"])
def test_open_rows_matmul_is_integer_and_exact(bundle, level: str, monkeypatch) -> None:
    src, path = bundle
    if level != "host":
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            assert sum(k.startswith(CHOICE) for k in kinds) == len(LAYERS), kinds
            for n, t in SIZES:
                x = (rng.standard_normal((n, t, K)) * 3).astype(np.float32)
                got = model.run({"x": x})
                want = dict(zip([f"y{n_}" for n_, *_ in LAYERS], sess.run(None, {"x": x})))
                for name, exact in _exact(src, x).items():
                    np.testing.assert_allclose(got[name], exact, rtol=1e-6, atol=1e-6,
                                               err_msg=f"{name} {x.shape}")
                    np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4,
                                               err_msg=f"{name} {x.shape} ORT")


def test_open_rows_matmul_emits_vpdpbusd(bundle) -> None:
    """The x86-64-v4+vnni level's code of the open-rows kernels (compiled, not run: any host)."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.vm_emit import main_size_vars
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import UNPACKED
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod, _ = import_onnx(str(bundle[0]))
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    target = resolve_target("x86-64-v4+vnni")
    code = compile_prim_funcs(funcs, target, main_size_vars(mod), UNPACKED)
    assert sum(str(getattr(info, "choice", "")).startswith(CHOICE)
               for info in code.kernels.values()) == len(LAYERS), code.kernels
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    asm = tm.emit_assembly(llvm.parse_assembly(code.llvm_ir))
    assert re.search(r"\bvpdpbusd\s+%zmm", asm)     # 512-bit tiles (2 zmm a row)
