"""x86-64-v4 code copies planes row by row, never with AVX-512 scatters.

LLVM's generic x86-64-v4 tuning prices ``vscatterdps`` as cheap and vectorized a Concat of 20x20
planes across its rows (16 rows a vector: a gather and a scatter per column), 5x slower on Zen 4
than the contiguous copy; the v4 levels now say ``+prefer-no-scatter`` (runtime/cpu.py). Checked
in the assembly, so on every host; the bundle's outputs are checked where the host runs v4."""

from __future__ import annotations

import dataclasses

import llvmlite.binding as llvm
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features, level


def _model():
    a = h.make_tensor_value_info("a", T.FLOAT, [1, 256, 20, 20])
    b = h.make_tensor_value_info("b", T.FLOAT, [1, 128, 20, 20])
    outs = [h.make_tensor_value_info(n, T.FLOAT, [1, 192, 20, 20]) for n in ("s1", "s2")]
    nodes = [h.make_node("Concat", ["a", "b"], ["c"], axis=1),
             h.make_node("Split", ["c"], ["s1", "s2"], axis=1, num_outputs=2)]
    graph = h.make_graph(nodes, "concat_split", [a, b], outs)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def _assembly(target_name: str, features: str | None = None) -> str:
    mod = run_pipeline(import_onnx(_model())[0], DEFAULT_PIPELINE, options=UNPACKED)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    target = resolve_target(target_name)
    if features is not None:
        target = dataclasses.replace(target, llvm_features=features)
    code = compile_prim_funcs(funcs, target, options=UNPACKED)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    return tm.emit_assembly(llvm.parse_assembly(code.llvm_ir))


@pytest.mark.parametrize("name", ["x86-64-v4", "x86-64-v4+vnni", "x86-64-v4+bf16"])
def test_v4_levels_say_no_scatter(name):
    assert "+prefer-no-scatter" in level(name).llvm_features.split(",")


def test_concat_and_split_copy_rows_at_v4():
    asm = _assembly("x86-64-v4")
    assert "vscatter" not in asm and "vgather" not in asm
    assert "zmm" in asm or "ymm" in asm     # still vectorized, along the rows
    # the generic v4 tuning alone scatters (what the feature is there for)
    assert "vscatterdps" in _assembly("x86-64-v4", "-prefer-256-bit")


@pytest.mark.skipif(not level("x86-64-v4").flags <= host_features(),
                    reason="runs x86-64-v4 code: needs a host with AVX-512 (F, BW, CD, DQ, VL)")
def test_concat_and_split_outputs_at_v4(tmp_path):
    path = tmp_path / "cs.mlc"
    export_module(import_onnx(_model())[0], path, ExportOptions(target="x86-64-v4", check=False))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 256, 20, 20)).astype(np.float32)
    b = rng.standard_normal((1, 128, 20, 20)).astype(np.float32)
    with load(path) as model:
        out = model.run({"a": a, "b": b})
    c = np.concatenate([a, b], axis=1)
    got = [out[k] if isinstance(out, dict) else out[i] for i, k in enumerate(("s1", "s2"))]
    np.testing.assert_array_equal(got[0], c[:, :192])
    np.testing.assert_array_equal(got[1], c[:, 192:])
