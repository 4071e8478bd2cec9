"""IR: builder scopes, printer text before/after passes, verifier, fusion."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.ir import (BlockBuilder, BuilderError, CallTIR, TensorType, VerifyError,
                                 module_text, verify_module)
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes import (DEFAULT_PIPELINE, bind_params, fold_constants, legalize,
                                     run_pipeline)


def mlp_module():
    bb = BlockBuilder()
    x = bb.input("x", (1, 4))
    w0, b0 = bb.input("w0", (3, 4)), bb.input("b0", (3,))
    with bb.function("main", [x, w0, b0]):
        with bb.dataflow():
            h = bb.emit_op("matmul", x, w0, transpose_b=True)
            h = bb.emit_op("add", h, b0)
            h = bb.emit_op("relu", h)
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


PARAMS = {"w0": np.ones((3, 4), np.float32), "b0": np.zeros(3, np.float32)}


def test_printer_before_and_after_pipeline():
    mod = mlp_module()
    assert module_text(mod) == '''# mlcpack IRModule

@function
def main(x: Tensor((1, 4), "float32"), w0: Tensor((3, 4), "float32"), b0: Tensor((3,), "float32")) -> (Tensor((1, 3), "float32")):
    with dataflow():
        matmul: Tensor((1, 3), "float32") = matmul(x, w0, transpose_b=True)
        add: Tensor((1, 3), "float32") = add(matmul, b0)
        relu: Tensor((1, 3), "float32") = relu(add)
    return relu
'''
    optimized = run_pipeline(bind_params(mod, PARAMS), verify=True, options=UNPACKED)
    assert module_text(optimized) == '''# mlcpack IRModule

@function
def main(x: Tensor((1, 4), "float32")) -> (Tensor((1, 3), "float32")):
    with dataflow():
        relu = call_tir(fused_matmul_add_relu, (x, const.w0, const.b0), out=Tensor((1, 3), "float32"))
    return relu

@prim_func
def fused_matmul_add_relu(x: Tensor((1, 4), "float32"), w0: Tensor((3, 4), "float32"), b0: Tensor((3,), "float32")) -> (relu: Tensor((1, 3), "float32")):
    matmul[i0, i1] = sum((x[i0, k] * w0[i1, k]), over k < 4)
    add[i0, i1] = (matmul[i0, i1] + b0[i1])
    relu[i0, i1] = max(add[i0, i1], 0.0f)
'''


def test_pipeline_is_named_list():
    assert [p.name for p in DEFAULT_PIPELINE] == [
        "fold_constants", "fuse_gelu", "fuse_normalize", "eliminate_dead_code", "fuse_quantized",
        "tabulate_quantized_chains", "fuse_quantized_layout", "fuse_quantized_attention",
        "fuse_quantized_elementwise", "lookup_dequantized_tables", "fuse_table_chains",
        "fold_dequantize",
        "drop_unread_cell_state", "decompose_conv_transpose", "decompose_conv_nd",
        "strided_frames_as_matmul", "pretranspose_weights", "pack_conv_weights", "pack_conv_rows", "pack_matmul_weights",
        "weights_to_bf16", "pack_conv_quads", "slices_as_views", "legalize", "fuse_ops",
        "bf16_pair_activations", "eliminate_dead_code", "concats_in_place"]


def test_fold_constants_evaluates_constant_subgraphs():
    bb = BlockBuilder()
    x = bb.input("x", (2, 3))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit_op("multiply", bb.constant(np.full((3,), 2, np.float32), "two"),
                           bb.constant(np.arange(3, dtype=np.float32), "r"))
            y = bb.emit_op("add", x, c)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    folded = fold_constants(bb.get())
    text = module_text(folded)
    assert "= multiply(" not in text and "add(x, const.multiply)" in text
    (binding,) = list(folded.main.bindings())
    np.testing.assert_array_equal(binding.value.args[1].data, [0, 2, 4])


def test_legalize_makes_call_tir_and_keeps_views():
    bb = BlockBuilder()
    x = bb.input("x", (2, 6))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit_op("reshape", x, shape=(3, 4))
            y = bb.emit_op("exp", r)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = legalize(bb.get())
    verify_module(mod)
    values = [b.value for b in mod.main.bindings()]
    assert values[0].op == "reshape" and isinstance(values[1], CallTIR)
    assert "exp" in mod.prim_funcs()


def test_builder_scope_errors():
    bb = BlockBuilder()
    x = bb.input("x", (1,))
    with pytest.raises(BuilderError, match="inside a dataflow"):
        with bb.function("main", [x]):
            bb.emit_op("relu", x)
    bb = BlockBuilder()
    with pytest.raises(BuilderError, match="without emit_func_output"):
        with bb.function("main", [x]):
            with bb.dataflow():
                bb.emit_op("relu", x)
    bb = BlockBuilder()
    with pytest.raises(BuilderError, match="dataflow"):
        with bb.dataflow():
            pass
    bb = BlockBuilder()
    with pytest.raises(BuilderError, match="do not match|inner dimensions"):
        with bb.function("main", [x]):
            with bb.dataflow():
                bb.emit_op("matmul", bb.input("a", (2, 3)), bb.input("b", (4, 5)))


def test_verifier_catches_broken_ir():
    mod = legalize(bind_params(mlp_module(), PARAMS))
    verify_module(mod)
    bindings = mod.main.blocks[0].bindings
    bindings[0], bindings[1] = bindings[1], bindings[0]
    with pytest.raises(VerifyError, match="before it is defined"):
        verify_module(mod)

    mod = legalize(bind_params(mlp_module(), PARAMS))
    first = mod.main.blocks[0].bindings[0]
    first.value = CallTIR("no_such_func", first.value.args, first.value.type)
    with pytest.raises(VerifyError, match="missing primitive function"):
        verify_module(mod)

    mod = legalize(bind_params(mlp_module(), PARAMS))
    first = mod.main.blocks[0].bindings[0]
    first.value = CallTIR(first.value.func, first.value.args, TensorType((9, 9), "float32"))
    with pytest.raises(VerifyError, match="output type"):
        verify_module(mod)


def test_fusion_skips_multi_use_producers():
    bb = BlockBuilder()
    x = bb.input("x", (2, 5))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit_op("exp", x)
            a = bb.emit_op("relu", e)
            b = bb.emit_op("tanh", e)
            y = bb.emit_op("add", a, b)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = run_pipeline(bb.get(), verify=True, options=UNPACKED)
    calls = [b.value.func for b in mod.main.bindings()]
    # relu and tanh fuse into the add, which then holds both uses of exp: one kernel (a
    # diamond, see tests/passes/test_fusion_of_diamonds.py)
    assert len(calls) == 1

    bb = BlockBuilder()
    x = bb.input("x", (2, 5))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit_op("exp", x)
            y = bb.emit_op("add", bb.emit_op("relu", e), bb.emit_op("tanh", e))
            out_e, out_y = bb.emit_output(e), bb.emit_output(y)
        bb.emit_func_output([out_e, out_y])
    mod = run_pipeline(bb.get(), verify=True, options=UNPACKED)
    calls = [b.value.func for b in mod.main.bindings()]
    # exp is also an output: it stays; relu and tanh each fuse into the add.
    assert calls[0] == "exp" and len(calls) == 2


def test_reduction_tags_live_in_the_ir() -> None:
    """A reduction's operator tag is an attribute of its first axis (no global table): it
    travels with the expression, and an untagged reduction has none."""
    from mlcpack.packager.ir import patterns, te

    a, b = te.placeholder((2, 3), name="a"), te.placeholder((3, 4), name="b")
    k = te.reduce_axis(3, "k")
    patterns.tag_reduction(k, "matmul", (a, b), transpose_b=False)
    c = te.compute((2, 4), lambda i, j: te.sum_of(a[i, k] * b[k, j], k), name="c")
    tag = patterns.reduction_tag(c.body)
    assert tag == te.ReductionTag("matmul", (a, b), {"transpose_b": False})
    assert c.body.axes[0].tag is tag and not hasattr(patterns, "_TAGS")
    r = te.reduce_axis(3, "r")
    plain = te.compute((2,), lambda i: te.sum_of(a[i, r], r), name="rowsum")
    assert patterns.reduction_tag(plain.body) is None
