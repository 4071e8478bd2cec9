"""With ``CompileOptions.qlookup`` (off by default: slower on Zen 4 with AVX2), an activation
between Q/DQ pairs after a convolution that runs on the float kernels (a QDQ model with open
image sizes, as YOLOv8n's file: Conv -> Q -> DQ -> Sigmoid -> Q -> DQ -> Mul -> Q -> DQ) is one
``qlookup`` (``ops/qlookup.py``, ``passes/quantize_lut.py``
``lookup_dequantized_tables``) in the convolution's epilogue: the value quantized, its
dequantized table entry gathered (``vgatherdps`` on AVX2, a load per lane on SSE), no quantize,
``lut8`` or dequantize pass of its own; and the bundle still equals ONNX Runtime running the
QDQ graph as written, at several image sizes, on the v2 and v3 code alike."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import X86_V2, X86_V3
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.ops import OPS
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.packager.vm_emit import main_size_vars
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")

SIZES = ((1, 16, 12), (1, 9, 5), (2, 7, 13))


# The float convolutions' epilogue is what these tests check: without ``conv_quads7=False``
# the open-size convolutions take the split quad kernel (passes/int8_cost.py
# ``open_split_pays``) and their tables fold into its copy out.


def _silu_block(path: Path) -> Path:
    """YOLO's block: x [1, 3, 16, 12] -> 3x3/2 conv (8) -> SiLU -> 3x3 conv (8) -> SiLU -> add
    of both SiLUs -> 1x1 conv (4) -> SiLU -> y."""
    rng = np.random.default_rng(0)
    f = lambda *s, sd=0.3: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    nodes = []

    def conv_silu(x: str, w: str, b: str, out: str, **attrs) -> None:
        nodes.extend([h.make_node("Conv", [x, w, b], [f"{out}_c"], **attrs),
                      h.make_node("Sigmoid", [f"{out}_c"], [f"{out}_s"]),
                      h.make_node("Mul", [f"{out}_c", f"{out}_s"], [out])])

    conv_silu("x", "w1", "b1", "a", pads=[1, 1, 1, 1], strides=[2, 2])
    conv_silu("a", "w2", "b2", "b", pads=[1, 1, 1, 1])
    nodes.append(h.make_node("Add", ["a", "b"], ["r"]))
    conv_silu("r", "w3", "b3", "y")
    inits = {"w1": f(8, 3, 3, 3), "b1": f(8, sd=.1), "w2": f(8, 8, 3, 3), "b2": f(8, sd=.1),
             "w3": f(4, 8, 1, 1), "b3": f(4, sd=.1)}
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 12])],
                    [h.make_tensor_value_info("y", T.FLOAT, None)], inits, path)


def _open_size(path: Path) -> Path:
    """``path`` with its input's batch, H and W symbolic, no shapes kept inside."""
    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param, dims[2].dim_param, dims[3].dim_param = "batch", "H", "W"
    del model.graph.value_info[:]
    model.graph.output[0].type.tensor_type.ClearField("shape")
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def qfile(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("silu_block")
    src = _silu_block(folder / "block.onnx")
    return _open_size(qm.ort_quantize(src, folder / "block_qdq.onnx", "QDQ", per_channel=True))


@pytest.fixture(scope="module")
def bundle(qfile, tmp_path_factory) -> Path:
    """The bundle with SSE and AVX2 code (the portable default of an AVX2 host), golden check
    on."""
    mod, _ = import_onnx(str(qfile))
    out = tmp_path_factory.mktemp("silu_bundle") / "block.mlc"
    export_module(mod, out, ExportOptions(target="x86-64-v2,x86-64-v3", check=True,
                                          compile=CompileOptions(qlookup=True, conv_quads7=False)))
    return out


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_reference_is_the_chain_it_replaces(dtype) -> None:
    """qlookup(y) == dequantize(lut8(quantize(y))) for a per-channel table and dequantize."""
    rng = np.random.default_rng(2)
    y = rng.normal(0, 3, (2, 4, 5, 6)).astype(np.float32)
    scale, zp = np.float32(0.05), np.asarray(3 if dtype == "int8" else 120, dtype)
    t8 = rng.integers(0, 256, (4, 256)).astype(np.uint8)
    ds = rng.uniform(0.01, 0.1, (1, 4, 1, 1)).astype(np.float32)
    dz = rng.integers(0, 256, (1, 4, 1, 1)).astype(np.uint8)
    want = OPS["dequantize"].reference(OPS["lut8"].reference(
        OPS["quantize"].reference(y, scale, zp, dtype), t8, 1), ds, dz)
    table = OPS["dequantize"].reference(t8, ds.reshape(4, 1), dz.reshape(4, 1))
    got = OPS["qlookup"].reference(y, scale, zp, table, dtype, 1)
    np.testing.assert_array_equal(got, want)


def test_each_silu_is_a_lookup_in_its_convolution(qfile) -> None:
    passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")]
    fn = run_pipeline(import_onnx(str(qfile))[0], passes,
                      options=CompileOptions(target="x86-64-v3", qlookup=True, conv_quads7=False)).functions["main"]
    ops = [getattr(b.value, "op", "") for b in fn.bindings()]
    assert ops.count("qlookup") == 3, ops
    assert "lut8" not in ops, ops
    # off by default (slower on Zen 4 with AVX2): each chain is one qtable pass of its own
    # (open image sizes), or with qtable off the lut8 kernels between quantize and dequantize
    fn = run_pipeline(import_onnx(str(qfile))[0], passes,
                      options=CompileOptions(target="x86-64-v3", conv_quads7=False)).functions["main"]
    ops = [getattr(b.value, "op", "") for b in fn.bindings()]
    # (and the input's Q -> DQ pair, an identity table)
    assert "qlookup" not in ops and ops.count("qtable") == 4 and "lut8" not in ops, ops
    fn = run_pipeline(import_onnx(str(qfile))[0], passes,
                      options=CompileOptions(target="x86-64-v3", qtable=False,
                                                     conv_quads7=False)).functions["main"]
    ops = [getattr(b.value, "op", "") for b in fn.bindings()]
    assert "qlookup" not in ops and ops.count("lut8") == 3, ops


def test_no_kernel_of_its_own_for_quantize_table_or_dequantize(bundle) -> None:
    with load(bundle) as model:
        names = [k.name for k in model.schema.plan.kernels]
    fused = [n for n in names if "qlookup" in n]
    assert len(fused) == 3 and all("conv2d" in n for n in fused), names
    assert not any(n.startswith(("lut8", "fused_lut8", "dequantize")) for n in names), names


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_the_gather_is_vgatherdps(qfile, level) -> None:
    """The 1x1 convolution with its SiLU lookup compiled for AVX2 (8 lanes) and AVX-512 (16
    lanes, two AVX2 gathers): ``vgatherdps``, no sigmoid, and no division (its quantize's scale
    is 1.0: the float32-exact chain of passes/fuse_qdq.py)."""
    import llvmlite.binding as llvm

    options = CompileOptions(target=level, qlookup=True, conv_quads7=False)
    mod = run_pipeline(import_onnx(str(qfile))[0], DEFAULT_PIPELINE, options=options)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc) and "qlookup" in f.name]
    assert len(funcs) == 3, [f.name for f in funcs]
    target = resolve_target(level)
    code = compile_prim_funcs(funcs[-1:], target, main_size_vars(mod), options)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    asm = tm.emit_assembly(llvm.parse_assembly(code.llvm_ir))
    assert "vgatherdps" in asm
    assert "sigmoid" not in code.llvm_ir and "vdivps" not in asm


def _ort_as_written(qfile: Path):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(qfile), opts, providers=["CPUExecutionProvider"])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="runs the bundle's x86-64-v2 and v3 code: needs an x86-64 host with AVX2")
@pytest.mark.parametrize("level", ["v2", "v3"])
def test_equals_onnx_runtime_as_written_at_every_size(qfile, bundle, level, monkeypatch) -> None:
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "v2" else X86_V3)
    step = qm.output_step(qfile)
    session = _ort_as_written(qfile)
    rng = np.random.default_rng(1)
    with load(bundle) as model:
        for n, hh, ww in SIZES:
            x = rng.normal(0, 1, (n, 3, hh, ww)).astype(np.float32)
            got = model.run({"x": x})["y"]
            want = session.run(None, {"x": x})[0]
            assert got.shape == want.shape
            # the residual add's convolution reads a dequantize shared with the add, so it runs
            # in float as ORT's graph does (another summation order): a rounding tie may land
            # one step away
            diff = np.abs(got - want)
            assert diff.max() <= step * 1.001, (diff.max(), step)
            assert np.mean(diff == 0) >= 0.98

