"""LLVM's loop strength reduction on x86-64 runs at the end of the optimizer, per kernel
(codegen/build.py, ``REDUCED_IN_OPTIMIZER``), not in the code generator: a kernel it runs on
gets the same object bytes as from the code generator's run, and a symbolic convolution with a
stride and a 2-D window (``skips_strength_reduction``) gets none. Numerics of those kernels:
tests/kernels/test_symbolic_conv_code_paths.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen import build
from mlcpack.packager.codegen.target import resolve_targets
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.packager.vm_emit import main_size_vars

V3 = resolve_targets("x86-64-v3", "fp32")[0]


def _funcs():
    """x (1, 8, H, W) -> 3x3/2 conv (8 -> 6) -> 3x3 conv (6 -> 6) -> 1x3/(1, 2) conv
    (6 -> 4): symbolic H, W; 6 output channels keep the first two off the channel-lane
    kernels (conv_oc), on the symbolic contraction kernel (conv_symbolic)."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c2", "w3"], ["y"], strides=[1, 2])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w("w1", 6, 8, 3, 3), w("w2", 6, 6, 3, 3), w("w3", 4, 6, 1, 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = CompileOptions().for_targets([V3])
    mod = run_pipeline(import_onnx(model)[0], DEFAULT_PIPELINE, options=options)
    funcs = {f.name: f for f in mod.prim_funcs().values()}
    return funcs, main_size_vars(mod), options


@pytest.fixture(scope="module")
def kernels():
    return _funcs()


def _by_weights(funcs, shape) -> str:
    (name,) = [n for n, f in funcs.items() if any(t.shape == shape for t in f.inputs)]
    return name


def _strided(funcs) -> tuple[str, str]:
    """(the 3x3/2 conv's prim func name, the 3x3/1 one's)."""
    return _by_weights(funcs, (6, 8, 3, 3)), _by_weights(funcs, (6, 6, 3, 3))


def test_only_the_strided_2d_window_skips_it(kernels) -> None:
    funcs, size_vars, options = kernels
    emitted = build.emit_module(list(funcs.values()), V3, size_vars, False, options)
    strided, plain = _strided(funcs)
    row = _by_weights(funcs, (4, 6, 1, 3))   # strided, a 1-D window: keeps LSR
    assert {emitted.kernels[n].choice for n in (strided, plain)} == {"contraction"}
    assert emitted.no_lsr == {build.SYMBOL_PREFIX + strided}
    assert build.SYMBOL_PREFIX + plain in emitted.text
    assert build.SYMBOL_PREFIX + row in emitted.text


def test_same_object_as_the_code_generators_run(kernels, monkeypatch) -> None:
    funcs, size_vars, options = kernels
    _, plain = _strided(funcs)

    def obj() -> bytes:
        return build.compile_in_process([funcs[plain]], V3, size_vars, use_cache=False,
                                        thread_pool=False, options=options).object_code
    here = obj()
    monkeypatch.setattr(build, "REDUCED_IN_OPTIMIZER", frozenset())
    assert obj() == here


def test_the_skipped_kernel_gets_no_strength_reduction(kernels, monkeypatch) -> None:
    funcs, size_vars, options = kernels
    strided, _ = _strided(funcs)

    def obj() -> bytes:
        return build.compile_in_process([funcs[strided]], V3, size_vars, use_cache=False,
                                        thread_pool=False, options=options).object_code
    skipped = obj()
    monkeypatch.setattr(build, "skips_strength_reduction", lambda func, info: False)
    assert obj() != skipped
