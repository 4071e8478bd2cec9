"""bf16 pair words between bf16 convolutions (passes/bf16_pairs.py): a channel-lane bf16
convolution's epilogue writes the pair words (zero-padded for its reader) that the one bf16
convolution reading it would have made by its copy, and that reader takes them in place.

The words are those the copy made (the same vcvtne2ps2bf16 of the same float32 values), so a
bundle with them is bit for bit the bundle without them: checked by running both on a host with
avx512_bf16 (1 and 2 threads, two images); elsewhere by what the pass chooses and what the
kernels emit."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import pipeline_calls
from mlcpack.runtime.cpu import host_arch, host_features

V4_BF16 = "x86-64-v4+bf16"


def _chain():
    """3x3 -> 3x3 -> 1x1 (16x16, the 1x1s on the pixel-lane kernel) -> a bottleneck of 1x1s
    (its input also the residual) -> 3x3 stride 2 -> 1x1 + residual (8x8, pixel lanes) -> 3x3
    -> a basic block of 3x3s (8x8, channel lanes) -> 1x1, each with bias and (but
    before a residual add) ReLU; two images of 64 channels. (Without the padding words the
    producers write, the run reads stale arena words: checked by hand, it differs.)"""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits, nodes = [], []

    def conv(x, y, o, c, k, s=1, relu=True):
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        b = (rng.standard_normal(o) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, y + "_w"), numpy_helper.from_array(b, y + "_b")])
        nodes.append(helper.make_node("Conv", [x, y + "_w", y + "_b"], [y + "_c" if relu else y],
                                      pads=[k // 2] * 4, strides=[s, s]))
        if relu:
            nodes.append(helper.make_node("Relu", [y + "_c"], [y]))

    def add_relu(a, b, y):
        nodes.append(helper.make_node("Add", [a, b], [y + "_s"]))
        nodes.append(helper.make_node("Relu", [y + "_s"], [y]))

    conv("x", "a", 64, 64, 3)
    conv("a", "b", 64, 64, 3)
    conv("b", "d", 128, 64, 1)
    conv("d", "d1", 64, 128, 1)                  # a bottleneck: d also its residual
    conv("d1", "d2c", 128, 64, 1, relu=False)
    add_relu("d2c", "d", "d2")
    conv("d2", "e", 128, 128, 3, s=2)
    conv("e", "f", 128, 128, 1, relu=False)
    nodes.append(helper.make_node("Add", ["f", "e"], ["g"]))   # one reader, twice: float32
    conv("g", "h", 64, 128, 3)
    conv("h", "h1", 64, 64, 3)                   # a basic block: h also its residual
    conv("h1", "h2c", 64, 64, 3, relu=False)
    add_relu("h2c", "h", "h2")
    conv("h2", "y", 32, 64, 1)
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _pipeline(target: str, **options):
    return pipeline_calls(_chain(), target, **{"bf16_winograd": False, **options})


def _pair_attrs(mod, calls):
    return [(name.split("_")[2], {k: v for k, v in mod.functions[name].attrs.items()
                                  if k.startswith("bf16_pairs")}) for name in calls]


def test_which_tensors_take_pair_words():
    mod, calls = _pipeline(V4_BF16, precision="bf16")
    dense, padded = (0, 0, 0, 0), (1, 1, 1, 1)
    assert _pair_attrs(mod, calls) == [
        ("oc", {"bf16_pairs_out": padded}),              # for the 3x3 after it
        ("oc1", {"bf16_pairs_in": True, "bf16_pairs_out": dense}),
        ("bf16p", {"bf16_pairs_in": True, "bf16_pairs_out": dense}),   # 1x1, pixel lanes
        ("bf16p1", {"bf16_pairs_out": dense, "bf16_pairs_in": True}),
        # the residual d read from its words (input 3), the output padded for the 3x3
        ("bf16p2", {"bf16_pairs_in": True, "bf16_pairs_out": padded,
                    "bf16_pairs_read": ((3, dense),)}),
        ("oc2", {"bf16_pairs_in": True}),   # e: one reader, twice: float32
        ("bf16p3", {"bf16_pairs_out": padded}),
        ("oc3", {"bf16_pairs_in": True, "bf16_pairs_out": padded}),
        ("oc4", {"bf16_pairs_out": padded, "bf16_pairs_in": True}),
        ("oc5", {"bf16_pairs_in": True, "bf16_pairs_out": dense,
                 "bf16_pairs_read": ((3, padded),)}),     # the residual h, padded words
        ("bf16p4", {"bf16_pairs_in": True}),
    ]
    # residuals float32: the bottleneck's and basic block's inputs too
    mod, calls = _pipeline(V4_BF16, precision="bf16", bf16_pair_residuals=False)
    assert not any("bf16_pairs_read" in attrs for _, attrs in _pair_attrs(mod, calls))
    assert dict(_pair_attrs(mod, calls))["bf16p1"] == {"bf16_pairs_out": dense}
    # off, fp32, or a set with a level without vdpbf16ps: nothing
    for target, options in ((V4_BF16, dict(precision="bf16", bf16_pair_activations=False)),
                            (V4_BF16, dict(precision="fp32")),
                            (f"x86-64-v4,{V4_BF16}", dict(precision="bf16"))):
        mod, calls = _pipeline(target, **options)
        assert all(not attrs for _, attrs in _pair_attrs(mod, calls)), (target, options)


def test_kernels_emitted_for_pair_words():
    """The v4+bf16 code (any host): the 1x1 pixel-lane reader copies nothing (no planes in its
    workspace), the 3x3 reader no band (a smaller workspace: the row buffer only), the
    kernels say so."""
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import CompileOptions

    target = resolve_target(V4_BF16)
    code = {}
    for on in (True, False):
        opts = CompileOptions(target=V4_BF16, precision="bf16", bf16_pair_activations=on,
                              bf16_winograd=False)
        mod, calls = _pipeline(V4_BF16, precision="bf16", bf16_pair_activations=on)
        funcs = [mod.functions[name] for name in calls]
        assert all(isinstance(f, PrimFunc) for f in funcs)
        compiled = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
        code[on] = (calls, compiled)
    calls, on = code[True]
    _, off = code[False]
    kind = dict(zip([c.split("_")[2] for c in calls], calls))
    ws = {k: (on.kernels[name].workspace_bytes, off.kernels[name].workspace_bytes)
          for k, name in kind.items()}
    assert ws["bf16p"][0] == 0 < ws["bf16p"][1]      # no pair planes
    assert ws["oc1"][0] < ws["oc1"][1]               # no band copy: the row buffer only
    assert "pair-word input" in on.kernels[kind["oc2"]].choice
    assert "pair-word output" in on.kernels[kind["oc"]].choice
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(on.llvm_ir))
    assert "vdpbf16ps" in asm and "vcvtne2ps2bf16" in asm


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features(),
                    reason="runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16")
def test_native_runs(tmp_path):
    """Pair words between convolutions only: bit for bit the bundle without them; with the
    residuals' words too: the residuals rounded to bf16, within 1 % of that (and of ONNX
    Runtime's fp32); 1 and 2 threads equal."""
    import dataclasses

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    x = np.random.default_rng(4).standard_normal((2, 64, 16, 16)).astype(np.float32)
    got = {}
    for key, flags in (("off", dict(bf16_pair_activations=False)),
                       ("convs", dict(bf16_pair_residuals=False)), ("all", {})):
        mod, _ = import_onnx(_chain())
        path = tmp_path / f"{key}.mlc"
        report = export_module(mod, path, ExportOptions(
            target=V4_BF16, precision="bf16",
            compile=dataclasses.replace(CompileOptions(bf16_winograd=False), **flags)))
        assert report.precision == "bf16", report.precision_note
        with load(path) as one, load(path, threads=2) as two:
            got[key] = one.run({"x": x})["y"]
            np.testing.assert_array_equal(two.run({"x": x})["y"], got[key])
    np.testing.assert_array_equal(got["convs"], got["off"])
    scale = float(np.abs(got["off"]).max())
    assert 0 < float(np.abs(got["all"] - got["off"]).max()) < 0.01 * scale
    import onnxruntime as ort
    want = ort.InferenceSession(_chain().SerializeToString()).run(None, {"x": x})[0]
    assert float(np.abs(got["all"] - want).max()) < 0.02 * float(np.abs(want).max())


def _shared():
    """Tensors with two convolution readers (``bf16_pair_shared``): a 3x3's output (30x30,
    padded words) read by a 3x3 stride 2 (channel lanes) and a 1x1 stride 2 (pixel lanes,
    its planes filled from the words) as a basic block's first block; then a 1x1's output
    (15x15, dense words) read by a 1x1 (in place) and a 1x1 stride 2 (filled), as a
    bottleneck's first block with its downsample; then a 3x3's output (8x8) read by a 3x3
    and a 1x1, both stride 2 on channel lanes, the 1x1 within the 3x3's padded words. Two
    images of 64 channels."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(6)
    inits, nodes = [], []

    def conv(x, y, o, c, k, s=1, relu=True):
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        b = (rng.standard_normal(o) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, y + "_w"), numpy_helper.from_array(b, y + "_b")])
        nodes.append(helper.make_node("Conv", [x, y + "_w", y + "_b"], [y + "_c" if relu else y],
                                      pads=[k // 2] * 4, strides=[s, s]))
        if relu:
            nodes.append(helper.make_node("Relu", [y + "_c"], [y]))

    conv("x", "a", 64, 64, 3)
    conv("a", "c1", 128, 64, 3, s=2)
    conv("c1", "c2", 128, 128, 3, relu=False)
    conv("a", "ds", 128, 64, 1, s=2, relu=False)
    nodes.append(helper.make_node("Add", ["c2", "ds"], ["r"]))
    conv("r", "p", 64, 128, 1)
    conv("p", "b1", 32, 64, 1)
    conv("b1", "b2", 32, 32, 3, s=2)
    conv("b2", "b3", 128, 32, 1, relu=False)
    conv("p", "ds2", 128, 64, 1, s=2, relu=False)
    nodes.append(helper.make_node("Add", ["b3", "ds2"], ["t"]))
    conv("t", "q", 64, 128, 3)
    conv("q", "q1", 64, 64, 3, s=2)
    conv("q", "ds3", 64, 64, 1, s=2, relu=False)
    nodes.append(helper.make_node("Add", ["q1", "ds3"], ["y"]))
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 30, 30])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_shared_tensors_take_pair_words():
    """Both readers of a stage's first block input take the words: in place (the first
    convolution), or through the strided 1x1's plane fill (``bf16_pairs_fill``: the words'
    padding); the producer writes the in-place reader's padding (none where only fills read)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    def attrs(**options):
        mod, _ = import_onnx(_shared())
        mod = run_pipeline(mod, DEFAULT_PIPELINE, options=CompileOptions(
            target=V4_BF16, precision="bf16", bf16_winograd=False, **options))
        calls = [b.value.func for b in mod.functions["main"].bindings()
                 if isinstance(b.value, CallTIR)]
        return _pair_attrs(mod, calls)

    from mlcpack.packager.ir.graph import CallTIR

    dense, padded = (0, 0, 0, 0), (1, 1, 1, 1)
    assert attrs() == [
        ("oc", {"bf16_pairs_out": padded}),                 # a: for c1 (in place) and ds
        ("oc1", {"bf16_pairs_out": padded, "bf16_pairs_in": True}),
        ("bf16p", {"bf16_pairs_fill": padded}),             # ds: 1x1 stride 2, filled
        ("oc2", {"bf16_pairs_in": True, "bf16_pairs_out": dense}),
        ("bf16p1", {"bf16_pairs_in": True, "bf16_pairs_out": dense}),   # p: for b1 and ds2
        ("bf16p2", {"bf16_pairs_out": padded, "bf16_pairs_in": True}),
        ("oc3", {"bf16_pairs_in": True, "bf16_pairs_out": dense}),
        ("bf16p4", {"bf16_pairs_fill": dense}),              # ds2
        ("bf16p3", {"bf16_pairs_in": True, "bf16_pairs_out": padded}),
        ("oc4", {"bf16_pairs_in": True, "bf16_pairs_out": padded}),   # q: for q1 and ds3
        ("oc6", {"bf16_pairs_in": padded}),                  # ds3: its frame in q's words
        ("oc5", {"bf16_pairs_in": True}),
    ]
    off = dict(attrs(bf16_pair_shared=False))
    assert off["oc"] == off["bf16p"] == off["bf16p4"] == off["oc6"] == {}
    assert off["bf16p1"] == {"bf16_pairs_in": True}


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features(),
                    reason="runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16")
def test_shared_native_runs(tmp_path):
    """Words for both readers: bit for bit the bundle without them, 1 and 2 threads."""
    import dataclasses

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    x = np.random.default_rng(4).standard_normal((2, 64, 30, 30)).astype(np.float32)
    got = {}
    for on in (False, True):
        mod, _ = import_onnx(_shared())
        path = tmp_path / f"{on}.mlc"
        export_module(mod, path, ExportOptions(target=V4_BF16, precision="bf16", compile=(
            dataclasses.replace(CompileOptions(bf16_winograd=False), bf16_pair_shared=on))))
        with load(path) as one, load(path, threads=2) as two:
            got[on] = one.run({"x": x})["y"]
            np.testing.assert_array_equal(two.run({"x": x})["y"], got[on])
    np.testing.assert_array_equal(got[True], got[False])


def _stem_pool(h: int, w: int, relu: bool):
    """A ResNet stem: 7x7 stride 2 of C = 3 (tap pairs) to 32 channels, with bias (and ReLU),
    a 3x3 stride 2 max pool (padding 1), a 3x3 convolution of 32 channels; two images."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((32, 3, 7, 7)) / np.sqrt(147)).astype(np.float32)
    w2 = (rng.standard_normal((32, 32, 3, 3)) / np.sqrt(288)).astype(np.float32)
    b1 = (rng.standard_normal(32) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["s" if relu else "r"], pads=[3] * 4,
                              strides=[2, 2])]
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["r"]))
    nodes += [helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                               pads=[1] * 4),
              helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1] * 4)]
    graph = helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_stem_pool_reads_pair_words():
    """With ``bf16_pair_pools`` the stem's output, read by nothing but a max pool, is written
    as dense pair words that the pool widens as it loads them (any host: the pass's choice,
    and the pool kernel's code for v4+bf16); by default float32."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import CallTIR
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    for on in (True, False):
        opts = CompileOptions(target=V4_BF16, precision="bf16", bf16_pair_pools=on,
                              bf16_winograd=False)
        mod, _ = import_onnx(_stem_pool(72, 76, relu=False))
        mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
        calls = [b.value.func for b in mod.functions["main"].bindings()
                 if isinstance(b.value, CallTIR)]
        pool = next(c for c in calls if "max_pool" in c)
        stem = calls[calls.index(pool) - 1]
        words = mod.functions[pool].attrs.get("bf16_pairs_in")
        assert words is (True if on else None)
        assert mod.functions[stem].attrs.get("bf16_pairs_out") == ((0, 0, 0, 0) if on else None)
        if on:
            target = resolve_target(V4_BF16)
            compiled = compile_prim_funcs([mod.functions[pool]], target,
                                          options=opts.for_targets([target]))
            assert "shl <16 x i32>" in compiled.llvm_ir   # the loads widened


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features(),
                    reason="runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16")
@pytest.mark.parametrize("h, w, relu", [(40, 42, False), (72, 76, True)])
def test_stem_pool_native_runs(tmp_path, h, w, relu):
    """The pool of pair words (rows of 21 columns: element by element; of 38: whole vectors
    and an overlapping last one; negative values at the -inf padding): bit for bit the bundle
    without the words (the next convolution rounds the pool's output to the same bf16), 1 and
    2 threads."""
    import dataclasses

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    x = np.random.default_rng(5).standard_normal((2, 3, h, w)).astype(np.float32)
    got = {}
    for on in (False, True):
        mod, _ = import_onnx(_stem_pool(h, w, relu))
        path = tmp_path / f"{on}.mlc"
        export_module(mod, path, ExportOptions(target=V4_BF16, precision="bf16", compile=(
            dataclasses.replace(CompileOptions(bf16_winograd=False), bf16_pair_pools=on))))
        with load(path) as one, load(path, threads=2) as two:
            got[on] = one.run({"x": x})["y"]
            np.testing.assert_array_equal(two.run({"x": x})["y"], got[on])
    np.testing.assert_array_equal(got[True], got[False])
