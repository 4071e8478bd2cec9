"""bf16 pair words from depthwise convolutions (passes/bf16_pairs.py ``bf16_pair_depthwise``):
a depthwise convolution whose output one bf16 convolution's reduction alone reads (the
depthwise -> 1x1 of a depthwise-separable block, PP-LCNet / MobileNet) rounds each channel's
values in its epilogue into that channel's half of the pair words the reader multiplies
(codegen/depthwise/static.py ``store_pair_half``), and the reader takes them in place instead
of copying the float32 tensor into pair planes.

The words are the ones the copy made (vcvtne2ps2bf16 of the same float32 values), so the bundle
is bit for bit the one without them: checked natively on a host with avx512_bf16 (1 and 2
threads, two images, the depthwise kernel's row, flat-plane and stride-2 plane paths, border
chunks); elsewhere by what the pass chooses and what the kernels emit."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import bf16_option_runs, pipeline_calls
from mlcpack.runtime.cpu import host_arch, host_features

V4_BF16 = "x86-64-v4+bf16"


def _separable():
    """Depthwise-separable blocks on two images of 32 channels at 20x20: depthwise 3x3 (rows,
    20-wide: an interior chunk and a masked border one) -> 1x1 to 48; depthwise 3x3 stride 2
    (10x10 on stride-2 rows of a 16-lane vector) -> 1x1; depthwise 5x5 on 10x10 -> 1x1;
    depthwise 3x3 stride 2 -> 5x5 -> depthwise 3x3 (a flat plane) -> 1x1; each with bias and
    HardSwish; a last depthwise whose output is the model's (float32)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits, nodes = [], []

    def conv(x, y, o, c, k, s=1, group=1, act=True):
        w = (rng.standard_normal((o, c // group, k, k)) / np.sqrt(c // group * k * k)
             ).astype(np.float32)
        b = (rng.standard_normal(o) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, y + "_w"), numpy_helper.from_array(b, y + "_b")])
        nodes.append(helper.make_node("Conv", [x, y + "_w", y + "_b"], [y + "_c" if act else y],
                                      pads=[k // 2] * 4, strides=[s, s], group=group))
        if act:
            nodes.append(helper.make_node("HardSwish", [y + "_c"], [y]))

    conv("x", "d1", 32, 32, 3, group=32)
    conv("d1", "p1", 48, 32, 1)
    conv("p1", "d2", 48, 48, 3, s=2, group=48)
    conv("d2", "p2", 64, 48, 1)
    conv("p2", "d3", 64, 64, 5, group=64)
    conv("d3", "p3", 64, 64, 1)
    conv("p3", "d4", 64, 64, 3, s=2, group=64)
    conv("d4", "d5", 64, 64, 3, group=64)
    conv("d5", "p5", 32, 64, 1)
    conv("p5", "y", 32, 32, 3, group=32, act=False)
    graph = helper.make_graph(
        nodes, "separable",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32, 5, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _pipeline(target: str, **options):
    return pipeline_calls(_separable(), target, **options)


def _pairs(mod, calls):
    return [{k: v for k, v in mod.functions[name].attrs.items() if k.startswith("bf16_pairs")}
            for name in calls]


def test_depthwise_outputs_take_pair_words():
    mod, calls = _pipeline(V4_BF16, precision="bf16")
    dense = (0, 0, 0, 0)
    got = _pairs(mod, calls)
    # d1, d2, d3 and d5 write words for their 1x1; d4 (read by a depthwise), the 1x1s (read
    # by depthwise convolutions) and y (the model's output) stay float32
    assert got.count({"bf16_pairs_out": dense}) == 4, got
    assert got.count({"bf16_pairs_in": True}) == 4, got
    assert len(calls) == 10
    for target, options in ((V4_BF16, dict(precision="bf16", bf16_pair_depthwise=False)),
                            (V4_BF16, dict(precision="bf16", bf16_pair_activations=False)),
                            (V4_BF16, dict(precision="fp32")),
                            (f"x86-64-v4,{V4_BF16}", dict(precision="bf16"))):
        mod, calls = _pipeline(target, **options)
        assert not any(_pairs(mod, calls)), (target, options)


def test_depthwise_pair_kernels_emitted():
    """The v4+bf16 code (any host): the depthwise kernels that write words round with
    vcvtneps2bf16 and store 16-bit lanes, and say so; their 1x1 readers copy nothing."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.options import CompileOptions

    target = resolve_target(V4_BF16)
    opts = CompileOptions(target=V4_BF16, precision="bf16")
    mod, calls = _pipeline(V4_BF16, precision="bf16")
    compiled = compile_prim_funcs([mod.functions[name] for name in calls], target,
                                  options=opts.for_targets([target]))
    attrs = _pairs(mod, calls)
    for name, a in zip(calls, attrs):
        info = compiled.kernels[name]
        if "bf16_pairs_out" in a:
            assert info.choice == "depthwise convolution, bf16 pair-word output"
        if "bf16_pairs_in" in a:   # no planes (pixel lanes), no band copy (channel lanes)
            assert info.workspace_bytes == 0 or "pair-word input" in info.choice, name
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(compiled.llvm_ir))
    assert "vcvtneps2bf16" in asm and "vpmovzxwd" in asm and "vmovdqu16" in asm


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features(),
                    reason="runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16")
def test_depthwise_pairs_native(tmp_path):
    """Bit for bit the bundle without depthwise pair words, 1 and 2 threads; within the bf16
    bound of ONNX Runtime's fp32."""
    import onnxruntime as ort

    x = np.random.default_rng(6).standard_normal((2, 32, 20, 20)).astype(np.float32)
    got = bf16_option_runs(_separable(), tmp_path, x, V4_BF16, "bf16_pair_depthwise")
    np.testing.assert_array_equal(got[True], got[False])
    want = ort.InferenceSession(_separable().SerializeToString()).run(None, {"x": x})[0]
    assert float(np.abs(got[True] - want).max()) < 0.01 * float(np.abs(want).max())
