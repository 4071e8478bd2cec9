"""Fusion of elementwise consumers that read their producer's output more than once (diamonds:
HardSwish as ``y * clip(y + 3, 0, 6) / 6``, HardSigmoid * y, SiLU ``y * sigmoid(y)``, GELU)
into the epilogue of a convolution, depthwise convolution or matmul: one kernel per block,
numerics against ONNX Runtime on the host, and the same kernels cross-compiled for the other
targets."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
from mlcpack.packager.codegen.depthwise.static import match_depthwise
from mlcpack.packager.codegen.contraction.kernel import ContractionEmitter
from mlcpack.packager.codegen.contraction.match import match_contraction
from mlcpack.packager.codegen.objinfo import undefined_symbols
from mlcpack.packager.export import ExportOptions, compile_module, export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

RNG = np.random.default_rng(11)
ACTIVATIONS = ("hardswish_ops", "hardswish", "hardsigmoid_mul", "silu", "gelu")


def _activation(act: str, y: str, inits: list) -> list[onnx.NodeProto]:
    """Nodes computing ``act`` of tensor ``y`` into ``out``, the way exporters write them."""
    if act == "hardswish_ops":   # Paddle/torch exports of HardSwish before opset 14
        inits += [numpy_helper.from_array(np.array(v, np.float32), n)
                  for v, n in ((3, "three"), (0, "zero"), (6, "six"))]
        return [helper.make_node("Add", [y, "three"], ["a"]),
                helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
                helper.make_node("Mul", [y, "c"], ["m"]),
                helper.make_node("Div", ["m", "six"], ["out"])]
    if act == "hardswish":
        return [helper.make_node("HardSwish", [y], ["out"])]
    if act == "hardsigmoid_mul":  # PP-LCNet's SE gate times its input
        return [helper.make_node("HardSigmoid", [y], ["h"], alpha=0.2, beta=0.5),
                helper.make_node("Mul", [y, "h"], ["out"])]
    if act == "silu":            # YOLO's SiLU
        return [helper.make_node("Sigmoid", [y], ["sig"]),
                helper.make_node("Mul", [y, "sig"], ["out"])]
    assert act == "gelu"
    return [helper.make_node("Gelu", [y], ["out"])]


def _rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(kind: str, act: str, extra_use: bool = False) -> tuple[onnx.ModelProto, np.ndarray]:
    """Conv+BN (``conv``), depthwise Conv+BN (``depthwise``) or MatMul+bias (``matmul``), then
    ``act``; ``extra_use`` also returns the pre-activation tensor (no fusion of it then)."""
    inits: list = []
    if kind == "matmul":
        x = _rand(13, 37)
        inits += [numpy_helper.from_array(_rand(37, 21, scale=0.4), "W"),
                  numpy_helper.from_array(_rand(21), "bias")]
        nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
                 helper.make_node("Add", ["mm", "bias"], ["y"])]
        channels = 21
    else:
        c = 12 if kind == "depthwise" else 7
        channels = 12 if kind == "depthwise" else 10
        x = _rand(1, c, 13, 11)
        w = _rand(channels, 1, 3, 3) if kind == "depthwise" else _rand(channels, c, 3, 3,
                                                                          scale=0.5)
        inits += [numpy_helper.from_array(w, "W"),
                  numpy_helper.from_array(RNG.random(channels).astype(np.float32) + 0.5, "s"),
                  numpy_helper.from_array(_rand(channels), "b"),
                  numpy_helper.from_array(_rand(channels, scale=0.1), "mean"),
                  numpy_helper.from_array(RNG.random(channels).astype(np.float32) + 0.5, "var")]
        stride = 2 if kind == "depthwise" else 1
        nodes = [helper.make_node("Conv", ["x", "W"], ["conv"], pads=[1, 1, 1, 1],
                                  strides=[stride, stride],
                                  group=channels if kind == "depthwise" else 1),
                 helper.make_node("BatchNormalization", ["conv", "s", "b", "mean", "var"],
                                  ["y"])]
    x = x * 3   # reach both ends of clip's range
    nodes += _activation(act, "y", inits)
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x.shape))], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model, x


def _kernels(model: onnx.ModelProto):
    mod, _ = import_onnx(model)
    return mod, list(run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values())


def _ort(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _run(mod, x: np.ndarray, tmp_path, target: str | None = None, threads: int = 1) -> dict:
    path = tmp_path / "m.mlc"
    export_module(mod, path, ExportOptions(target=target))
    with load(path, threads=threads) as model:
        return model.run({"x": x})


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("kind", ["conv", "depthwise", "matmul"])
def test_block_is_one_kernel_with_a_vector_epilogue(kind, act):
    """Conv+BN+activation (or MatMul+bias+activation) compiles to exactly one kernel, the
    register-blocked (or depthwise) one, whose epilogue runs a vector at a time."""
    model, _ = _model(kind, act)
    _, funcs = _kernels(model)
    if kind == "matmul" and act == "gelu":   # fuse.py's EPILOGUE_EXCLUDED_MATH: erf runs apart
        assert sorted(f.name for f in funcs) == ["fused_matmul_add", "gelu"], funcs
        funcs = [f for f in funcs if f.name != "gelu"]
    assert len(funcs) == 1, [f.name for f in funcs]
    match = match_contraction(funcs[0])
    assert match is not None
    assert (match_depthwise(funcs[0]) is not None) == (kind == "depthwise")
    from llvmlite import ir
    emitter = ContractionEmitter(ir.Module(), funcs[0], "k", match, 8)
    assert emitter._vector_epilogue_ok()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("kind", ["conv", "depthwise", "matmul"])
def test_fused_epilogue_matches_onnxruntime(kind, act, threads, tmp_path):
    model, x = _model(kind, act)
    mod, _ = _kernels(model)
    (want,) = _ort(model, x)
    got = _run(mod, x, tmp_path, threads=threads)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("act", ["hardswish_ops", "silu", "gelu"])
def test_x86_64_v2_runs_the_same(act, tmp_path):
    model, x = _model("conv", act)
    mod, _ = _kernels(model)
    (want,) = _ort(model, x)
    got = _run(mod, x, tmp_path, target="x86-64-v2")["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("target", ["x86-64-v4", "aarch64"])
@pytest.mark.parametrize("act", ["hardswish_ops", "silu", "gelu"])
def test_other_targets_compile_without_libm(target, act):
    """The lane-wise sigmoid/erf and the clip selects compile for AVX-512 and NEON and import
    nothing the runtime does not provide."""
    for kind in ("conv", "depthwise", "matmul"):
        mod, _ = _kernels(_model(kind, act)[0])
        _, compiled, _ = compile_module(mod, target=target)
        assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS)


@pytest.mark.parametrize("kind", ["conv", "matmul"])
def test_no_fusion_when_the_tensor_has_another_reader(kind, tmp_path):
    """The pre-activation tensor is also a model output: the activation stays a kernel of its
    own and both outputs are right."""
    model, x = _model(kind, "hardswish_ops", extra_use=True)
    mod, funcs = _kernels(model)
    assert len(funcs) == 2
    want_out, want_y = _ort(model, x)
    got = _run(mod, x, tmp_path)
    np.testing.assert_allclose(got["out"], want_out, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-4)


def test_elementwise_diamond_chain_is_one_kernel(tmp_path):
    """Elementwise ops only: a = x + c; y = a * sigmoid(a); z = y * clip(y + 3, 0, 6) / 6 (two
    diamonds in a row) become one kernel."""
    x = _rand(3, 40, 17, scale=3)
    c = _rand(17)
    bb = BlockBuilder()
    xv = bb.input("x", x.shape, "float32")
    with bb.function("main", [xv]):
        with bb.dataflow():
            a = bb.emit_op("add", xv, bb.constant(c, "c"))
            y = bb.emit_op("multiply", a, bb.emit_op("sigmoid", a))
            h = bb.emit_op("clip", bb.emit_op("add", y, bb.constant(np.float32(3), "three")),
                           min=0.0, max=6.0)
            z = bb.emit_op("divide", bb.emit_op("multiply", y, h),
                           bb.constant(np.float32(6), "six"))
            out = bb.emit_output(z)
        bb.emit_func_output(out, names=["y"])
    mod = bb.get()
    assert len(run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs()) == 1
    got = _run(mod, x, tmp_path)["y"]
    a = x + c
    y = a / (1 + np.exp(-a))
    want = y * np.clip(y + 3, 0, 6) / 6
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_residual_add_of_another_activation_fuses(tmp_path):
    """conv + BN + (another activation tensor) + relu: one convolution kernel, the other
    tensor an extra epilogue input."""
    inits = [numpy_helper.from_array(_rand(8, 8, 3, 3, scale=0.3), "W"),
             numpy_helper.from_array(_rand(8, 8, 1, 1, scale=0.3), "W2")]
    nodes = [helper.make_node("Conv", ["x", "W2"], ["skip"]),
             helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "skip"], ["s"]),
             helper.make_node("Relu", ["s"], ["out"])]
    x = _rand(1, 8, 9, 12)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x.shape))], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    mod, funcs = _kernels(model)
    assert len(funcs) == 2 and all(match_contraction(f) is not None for f in funcs)
    (want,) = _ort(model, x)
    np.testing.assert_allclose(_run(mod, x, tmp_path)["out"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["conv", "depthwise"])
def test_math_call_without_lane_form_keeps_the_scalar_epilogue(kind, tmp_path):
    """sin has no lane-wise form: the epilogue ``y * sin(y)`` (a diamond too) runs element by
    element, still fused into one kernel, and still right."""
    model, x = _model(kind, "silu")
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.op_type = "Sin"
    mod, funcs = _kernels(model)
    assert len(funcs) == 1
    from llvmlite import ir
    match = match_contraction(funcs[0])
    assert not ContractionEmitter(ir.Module(), funcs[0], "k", match, 8)._vector_epilogue_ok()
    x = x / 3   # sin amplifies the convolution's rounding by |y|: keep y small
    (want,) = _ort(model, x)
    np.testing.assert_allclose(_run(mod, x, tmp_path)["out"], want, rtol=1e-4,
                               atol=1e-5 * float(np.abs(want).max()))


def _head_model(batch: int, k: int, o: int, act: str) -> tuple[onnx.ModelProto, np.ndarray]:
    """GlobalAveragePool -> 1x1 Conv (+bias) -> ``act``: a squeeze-and-excitation or
    classifier head, whose convolution has one pixel."""
    inits = [numpy_helper.from_array(_rand(o, k, 1, 1, scale=0.3), "W"),
             numpy_helper.from_array(_rand(o), "B")]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("Conv", ["g", "W", "B"], ["y"])]
    nodes += _activation(act, "y", inits)
    x = _rand(batch, k, 5, 3, scale=3)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x.shape))], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model, x


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch,k,o,act", [(1, 512, 1280, "hardswish_ops"), (2, 37, 45, "silu"),
                                           (1, 7, 3, "hardsigmoid_mul"), (3, 64, 256, "gelu")])
def test_one_pixel_convolution_dot_product_kernel(batch, k, o, act, threads, tmp_path):
    """1x1 convolutions on a 1x1 image take the dot-product kernel (contraction/dot.py): reduction
    lengths with a masked tail, output channels not a multiple of its block, batches."""
    from mlcpack.packager.codegen.contraction.dot import is_dot_product

    model, x = _head_model(batch, k, o, act)
    mod, funcs = _kernels(model)
    assert sum(is_dot_product(match_contraction(f)) for f in funcs) == 1
    (want,) = _ort(model, x)
    got = _run(mod, x, tmp_path, threads=threads)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v4", "aarch64"])
def test_dot_product_kernel_other_targets(target, tmp_path):
    model, x = _head_model(2, 37, 45, "silu")
    mod, _ = _kernels(model)
    if target == "x86-64-v2":   # runs here
        (want,) = _ort(model, x)
        got = _run(mod, x, tmp_path, target=target)["out"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
        return
    _, compiled, _ = compile_module(mod, target=target)
    assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS)


def _linear_model(rows: tuple[int, ...], k: int, o: int, act: str | None, gemm: bool
                  ) -> tuple[onnx.ModelProto, np.ndarray]:
    """One row times a constant weight: Gemm(transB=1) + bias with W stored (o, k) (torch's
    Linear), or MatMul of a row by a (k, o) initializer, + bias."""
    inits = [numpy_helper.from_array(_rand(o, k, scale=0.3) if gemm else _rand(k, o, scale=0.3),
                                     "W"), numpy_helper.from_array(_rand(o), "B")]
    nodes = ([helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)] if gemm else
             [helper.make_node("MatMul", ["x", "W"], ["m"]),
              helper.make_node("Add", ["m", "B"], ["y"])])
    nodes += _activation(act, "y", inits) if act else [helper.make_node("Identity", ["y"],
                                                                        ["out"])]
    x = _rand(*rows, k, scale=3)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x.shape))], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model, x


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows,k,o,act,gemm,dot", [
    ((1,), 576, 1024, "hardswish_ops", True, True),   # MobileNetV3's classifier head
    ((1,), 37, 45, None, True, True),                 # masked tail, o not a multiple of 4
    ((1, 1), 64, 30, "silu", False, False),           # MatMul by a (k, o) initializer
    ((3,), 40, 24, "gelu", True, False),              # three rows: the register-blocked kernel
])
def test_one_row_linear_takes_the_dot_product_kernel(rows, k, o, act, gemm, dot, threads,
                                                     tmp_path):
    """A Linear at batch 1 (one row times a constant W stored (o, k), ONNX Gemm transB=1)
    keeps W untransposed (passes/layout.py) and takes the dot-product kernel; more rows, or
    a W stored (k, o), the register-blocked one. Numbers against ORT either way."""
    from mlcpack.packager.codegen.contraction.dot import is_dot_product

    model, x = _linear_model(rows, k, o, act, gemm)
    mod, funcs = _kernels(model)
    assert sum(is_dot_product(match_contraction(f)) for f in funcs) == int(dot)
    (want,) = _ort(model, x)
    got = _run(mod, x, tmp_path, threads=threads)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads", [1, 2, 9])
@pytest.mark.parametrize("cfg", [
    dict(x=(1, 128, 10, 10), kernel=(5, 5), strides=(1, 1), padding=(2, 2, 2, 2)),  # SPPF
    dict(x=(1, 40, 40, 43), kernel=(5, 5), strides=(1, 1), padding=(2, 2, 2, 2)),  # parallel
    dict(x=(2, 5, 13, 21), kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),
    dict(x=(1, 3, 17, 9), kernel=(4, 2), strides=(1, 2), padding=(0, 1, 2, 0),
         dilation=(2, 1)),
])
def test_separable_max_pool_on_threads(cfg, threads, tmp_path):
    """The separable max pool (row maxima in per-task workspace regions, then column maxima)
    on 1, 2 and 9 threads (more tasks than regions: the extra ones get no planes), NaN
    propagated."""
    from mlcpack.packager.ops import get_op

    from helpers import build_op_module

    cfg = dict(cfg)
    x = _rand(*cfg.pop("x"))
    x[0, 1, 2, 3] = np.nan
    mod = build_op_module("nn.max_pool2d", [x], **cfg)
    path = tmp_path / "m.mlc"
    export_module(mod, path, ExportOptions())
    with load(path, threads=threads) as model:
        got = model.run({"x0": x})["y"]
    np.testing.assert_array_equal(got, get_op("nn.max_pool2d").reference(x, **cfg))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat_loops_split_per_input(axis, threads, tmp_path):
    """Concatenation (a chain of selects on the axis) is emitted as one copy loop per input
    range, also on the axis split over tasks; YOLOv8's head concatenates along the last axis."""
    shapes = [tuple(n if d == axis else (3, 144, 40)[d] for d, n in enumerate(s))
              for s in [(2, 100, 40), (5, 17, 17), (1, 27, 5)]]
    xs = [_rand(*s) for s in shapes]
    bb = BlockBuilder()
    params = [bb.input(f"x{i}", s, "float32") for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_op("concat", *params, axis=axis))
        bb.emit_func_output(out, names=["y"])
    path = tmp_path / "m.mlc"
    export_module(bb.get(), path, ExportOptions())
    with load(path, threads=threads) as model:
        got = model.run({f"x{i}": x for i, x in enumerate(xs)})["y"]
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


def test_generic_reduction_read_twice_is_computed_once(tmp_path):
    """A reduction the generic loop nest lowers (a matmul with a transposed runtime operand)
    followed by SiLU: the epilogue reads it twice, the kernel computes it once per element,
    and the result is right."""
    a, bt = _rand(6, 19), _rand(7, 19)
    bb = BlockBuilder()
    av, bv = bb.input("a", a.shape, "float32"), bb.input("b", bt.shape, "float32")
    with bb.function("main", [av, bv]):
        with bb.dataflow():
            y = bb.emit_op("matmul", av, bv, transpose_b=True)
            out = bb.emit_output(bb.emit_op("multiply", y, bb.emit_op("sigmoid", y)))
        bb.emit_func_output(out, names=["y"])
    mod = bb.get()
    funcs = list(run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values())
    assert len(funcs) == 1 and match_contraction(funcs[0]) is None
    from llvmlite import ir

    from mlcpack.packager.codegen.lower import KernelEmitter
    module = ir.Module()
    KernelEmitter(module, funcs[0], "k").emit()
    loops = re.findall(r'^"?[\w.]*cond[\w.]*"?:', str(module), re.M)
    assert len(loops) == 3, loops   # i, j and one k loop, not two
    path = tmp_path / "m.mlc"
    export_module(mod, path, ExportOptions())
    with load(path) as model:
        got = model.run({"a": a, "b": bt})["y"]
    z = a @ bt.T
    np.testing.assert_allclose(got, z / (1 + np.exp(-z)), rtol=1e-5, atol=1e-5)
