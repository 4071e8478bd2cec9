"""A kernel with run-time extents computes each size expression (a stride such as H * W, a
plane size, a clamped bound) once, in its body's entry block, where the size variables are
loaded (``KernelEmitter._dim_value``), however many loads and stores ask for it: computed at
each, they were a third of YOLOv8n's instructions. The module stays valid LLVM (every use is
dominated by the entry block) on both x86 vector widths; the symbolic kernels' numeric tests
(test_conv_oc_open_image.py, test_symbolic_*.py) check what the kernels compute."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.build import emit_module
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.packager.vm_emit import main_size_vars


def _model():
    """x (1, 8, H, W) -> 3x3 conv + SiLU -> 3x3/2 conv -> max pool; and a concat of the
    first conv's output with x along the channels, softmax over the channels."""
    rng = np.random.default_rng(3)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c2"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["a1", "x"], ["cat"], axis=1),
        helper.make_node("Softmax", ["cat"], ["z"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "open", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "H", "W"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
        [w("w1", 16, 8, 3, 3), w("b1", 16), w("w2", 16, 16, 3, 3)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def kernels():
    mod, _ = import_onnx(_model())
    targets = [resolve_target("x86-64-v2"), resolve_target("x86-64-v3")]
    options = CompileOptions().for_targets(targets)
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=options)
    return list(mod.prim_funcs().values()), main_size_vars(mod), targets, options


def _bodies(text: str) -> dict[str, list[str]]:
    """Each kernel body function's instruction lines."""
    bodies, current = {}, None
    for line in text.splitlines():
        if line.startswith("define") and '.body"' in line:
            current = bodies.setdefault(line.split("@", 1)[1].split("(", 1)[0], [])
        elif line.startswith("}"):
            current = None
        elif current is not None and line.startswith("  "):
            current.append(line.strip())
    return bodies


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_each_size_expression_once_per_kernel(kernels, level) -> None:
    funcs, size_vars, targets, options = kernels
    assert set(size_vars) >= {"H", "W"}
    target = next(t for t in targets if t.name == level)
    text = emit_module(funcs, target, size_vars, options=options).text
    llvm.initialize_all_targets()
    llvm.parse_assembly(text).verify()   # the hoisted values dominate their uses
    names = "|".join(re.escape(v) for v in size_vars)
    size_only = re.compile(rf'= (?:add|mul) nsw i64 %"(?:{names})", %"(?:{names})"$')
    bodies = _bodies(text)
    symbolic = [name for name, lines in bodies.items()
                if any(re.search(rf'load i64, i64\* %"\.\d+"|%"(?:{names})" = load', ln)
                       for ln in lines)]
    assert len(symbolic) >= 4, sorted(bodies)   # the convs, the pool, the concat, softmax
    products = 0
    for name in symbolic:
        found = [ln.split(" = ", 1)[1] for ln in bodies[name] if size_only.search(ln)]
        assert len(found) == len(set(found)), (name, found)
        products += len(found)
    assert products > 0   # H * W and the like are there, once each
