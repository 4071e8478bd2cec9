"""The compile cache's key taken before any LLVM IR is emitted (packager/codegen/fingerprint.py,
build.object_key): a warm compile emits no IR at all; the key changes with everything that can
change the code (every CompileOptions field not listed as NOT_CODE, the target, a prim func's
names, shapes, constants and attributes, the compiler's own source, a code generator constant
or function replaced at run time) and with nothing else; a
symbolic module's kernel facts (run-time workspace sizes) come back from an entry exactly; a
bundle exported through a warm cache is byte-identical to a cold one."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen import build, cache, fingerprint
from mlcpack.packager.codegen.target import resolve_targets
from mlcpack.packager.export import compile_variants, export_module
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.packager.vm_emit import main_size_vars


def _w(rng, name, *shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def _conv_model(seed: int = 0, dims=(1, 4, 12, 12)) -> onnx.ModelProto:
    """conv + relu + global pool + matmul: a contraction, a fused elementwise tail, a pool."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_w(rng, "w", 8, 4, 3, 3), _w(rng, "b", 8), _w(rng, "m", 8, 5)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def lowered():
    """(prim funcs, size vars, options, targets) of the conv model after the pipeline."""
    mod, _ = import_onnx(_conv_model())
    targets = resolve_targets("x86-64-v2,x86-64-v3")
    options = CompileOptions().for_targets(targets)
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=options)
    return list(mod.prim_funcs().values()), main_size_vars(mod), options, targets


def _other(value):
    """A different value of a CompileOptions field's type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, frozenset):
        return value | {"some_weight"}
    if isinstance(value, tuple):
        return value + (4,)
    if value is None:
        return "somewhere"
    raise AssertionError(f"no other value for {value!r}")


def test_every_code_option_changes_the_key_and_no_other(lowered):
    funcs, size_vars, options, targets = lowered
    base = build.object_key(funcs, targets[0], size_vars, True, options)
    assert base is not None
    assert build.object_key(funcs, targets[0], size_vars, True, options) == base   # stable
    for f in dataclasses.fields(CompileOptions):
        value = getattr(options, f.name)
        changed = options.replace(**{f.name: _other(value)}) if f.name != "precision" \
            else options.replace(precision="bf16")
        key = build.object_key(funcs, targets[0], size_vars, True, changed)
        if f.name in fingerprint.NOT_CODE:
            assert key == base, f"{f.name} does not change code but changed the key"
        else:
            assert key != base, f"{f.name} can change code but left the key alone"
    assert build.object_key(funcs, targets[1], size_vars, True, options) != base
    assert build.object_key(funcs, targets[0], size_vars, False, options) != base
    assert build.object_key(funcs, targets[0], ("n",), True, options) != base


def test_any_change_to_a_kernel_changes_the_key(lowered, monkeypatch):
    funcs, size_vars, options, targets = lowered
    key = build.object_key(funcs, targets[0], size_vars, True, options)
    renamed = [dataclasses.replace(funcs[0], name=funcs[0].name + "_b")] + funcs[1:]
    attrs = [dataclasses.replace(funcs[0], attrs={**funcs[0].attrs, "macs": -1})] + funcs[1:]
    assert build.object_key(renamed, targets[0], size_vars, True, options) != key
    assert build.object_key(attrs, targets[0], size_vars, True, options) != key
    assert build.object_key(funcs[::-1], targets[0], size_vars, True, options) != key
    # another shape, other weights: the shape is code, the weights are constants (not code)
    for model, same in ((_conv_model(dims=(1, 4, 12, 14)), False), (_conv_model(seed=1), True)):
        mod, _ = import_onnx(model)
        mod = run_pipeline(mod, DEFAULT_PIPELINE, options=options)
        other = build.object_key(list(mod.prim_funcs().values()), targets[0],
                                 main_size_vars(mod), True, options)
        assert (other == key) is same
    # a threshold the emitters read (tests set it to split every kernel) is an option: keyed
    split = options.replace(parallel_min_outputs=0)
    assert build.object_key(funcs, targets[0], size_vars, True, split) != key
    assert build.object_key(funcs, targets[0], size_vars, True,
                            options.replace(parallel_min_macs=0)) != key
    assert build.object_key(funcs, targets[0], size_vars, True,
                            options.replace(parallel_min_weight_bytes=0)) != key
    assert build.object_key(funcs, targets[0], size_vars, True, options) == key
    # the compiler's own code: an edited emitter never reuses an entry
    monkeypatch.setattr(cache, "compiler_fingerprint", lambda: "another compiler")
    assert build.object_key(funcs, targets[0], size_vars, True, options) != key


def test_warm_compile_emits_no_ir_and_gives_the_same_code(tmp_path, monkeypatch):
    mod, _ = import_onnx(_conv_model())
    options = CompileOptions(cache_dir=str(tmp_path / "cache"))
    _, cold, _ = compile_variants(mod, target="x86-64-v2,x86-64-v3", options=options)
    assert all(not c.from_cache for c in cold)

    def no_emission(*args, **kwargs):
        raise AssertionError("IR emitted on a warm compile")
    # llvmlite's module class, which emission starts from
    monkeypatch.setattr(build.ir, "Module", no_emission)
    _, warm, _ = compile_variants(mod, target="x86-64-v2,x86-64-v3", options=options)
    assert all(c.from_cache for c in warm)
    for a, b in zip(cold, warm):
        assert (a.object_code, a.llvm_ir, a.kernels, a.target) == \
            (b.object_code, b.llvm_ir, b.kernels, b.target)
    # an option that changes code is a miss (it reaches emission, patched to fail here)
    with pytest.raises(AssertionError, match="IR emitted"):
        compile_variants(mod, target="x86-64-v2", options=options.replace(vnni_emulate=True))


def test_symbolic_kernel_facts_round_trip(tmp_path):
    """Run-time workspace sizes (size-variable expressions) come back from the entry equal."""
    model = _conv_model(dims=("N", 4, "H", "W"))
    mod, _ = import_onnx(model)
    options = CompileOptions(cache_dir=str(tmp_path / "cache"))
    _, (cold,), _ = compile_variants(mod, target="x86-64-v3", options=options)
    _, (warm,), _ = compile_variants(mod, target="x86-64-v3", options=options)
    assert warm.from_cache and not cold.from_cache
    assert warm.kernels == cold.kernels and warm.object_code == cold.object_code
    assert any(k.symbolic for k in cold.kernels.values())
    exprs = [k.workspace_expr for k in cold.kernels.values() if k.workspace_expr is not None]
    record = fingerprint.kernels_record(cold.kernels)
    assert fingerprint.kernels_from_record(record) == cold.kernels
    assert any(not isinstance(e, int) for e in exprs)   # a size-variable expression


def test_warm_bundle_is_byte_identical_to_a_cold_one(tmp_path):
    mod, _ = import_onnx(_conv_model())
    bundles = []
    for i, directory in enumerate((None, tmp_path / "cache", tmp_path / "cache")):
        out = tmp_path / f"m{i}.mlc"
        from mlcpack.packager.export import ExportOptions
        export_module(mod, out, ExportOptions(
            target="x86-64-v2,x86-64-v3",
            compile=CompileOptions(cache_dir=str(directory) if directory else None)))
        bundles.append(out.read_bytes())
    assert bundles[0] == bundles[1] == bundles[2]
