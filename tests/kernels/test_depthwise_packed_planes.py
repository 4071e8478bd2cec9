"""The depthwise kernel's packed planes at AVX-512 (codegen/depthwise/static.py,
``_emit_packed_plane``): stride-1 planes whose output rows take one or two 16-lane vectors (or
several rows a vector where they are at most 8 wide and as wide as the input rows) run unrolled
in bands of accumulators, a window column at a time, each input row loaded once per column with
constant masks; and the row path's border chunks, now each at a constant column. Against ONNX
Runtime where this host runs x86-64-v4; the plan and the emitted code on any host; the bf16 pair
words these kernels write bit for bit those of the float32 copy where the host has avx512_bf16.
Odd channel counts, 3x3/5x5/7x7 windows, asymmetric and no padding, a channel multiplier, batch
2, fused SiLU / HardSwish / residual (read at flat offsets) epilogues, 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from helpers import assert_runs_match, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime.cpu import host_arch, host_features
from test_depthwise_flat_planes import _emitter
from test_depthwise_padded_rows import _model, _runnable

# (name, x shape, kernel, strides, pads (t, l, b, r), multiplier, epilogue)
CASES = [
    ("p5x5_14", (1, 7, 14, 14), 5, 1, (2, 2, 2, 2), 1, "hswish"),           # 14 vectors, 1 band
    ("p3x3_28_b2", (2, 3, 28, 28), 3, 1, (1, 1, 1, 1), 1, "silu"),          # 16 + 12, 4 bands
    ("p3x3_asym_20", (1, 3, 17, 20), 3, 1, (0, 2, 1, 0), 1, "residual"),    # 16 + 4 lanes
    ("p7x7_mult2", (1, 2, 12, 9), 7, 1, (3, 3, 3, 3), 2, None),
    ("p3x3_valid_15", (1, 3, 10, 15), 3, 1, (0, 0, 0, 0), 1, "relu"),       # 13 of 15 columns
    ("p3x3_g2_7w", (1, 3, 20, 7), 3, 1, (1, 1, 1, 1), 1, "residual"),       # 2 rows a vector
    ("p5x5_g3_5w", (1, 5, 14, 5), 5, 1, (2, 2, 2, 2), 1, "hswish"),         # 3 rows, 15 lanes
    ("p3x3_g4_4w", (2, 3, 18, 4), 3, 1, (1, 1, 1, 1), 1, "silu"),           # 4 rows, all lanes
    ("r3x3_56", (1, 3, 9, 56), 3, 1, (1, 1, 1, 1), 1, "hswish"),            # rows: 4 chunks
    ("r5x5_asym_40", (1, 2, 11, 40), 5, 1, (2, 1, 2, 3), 1, "residual"),    # rows, 3 chunks
]


def test_packed_planes_match_onnxruntime(tmp_path):
    if not _runnable("x86-64-v4"):
        pytest.skip("this machine does not run x86-64-v4 code (the plan is checked below)")
    rng = np.random.default_rng(13)
    path = tmp_path / "dw.onnx"
    onnx.save(_model(CASES, rng), str(path))
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / "dw.mlc"
    export_module(mod, bundle, ExportOptions(target="x86-64-v4"))
    feeds = {f"{name}_x": rng.standard_normal(shape).astype(np.float32)
             for name, shape, *_ in CASES}
    want = ort_outputs(path, feeds)
    assert_runs_match(bundle, feeds, want, rtol=1e-5, atol=1e-5, label="x86-64-v4",
                      threads=(1, 2))


def test_packed_plan_and_emitted_code():
    """Packed at 16 lanes, stride 1, rows of at most two vectors (several rows a vector only
    where the input rows are as wide), at most 64 vectors a plane; not at stride 2 nor on
    AVX2's padded rows. The 14x14 5x5 plane: straight-line code,
    one load per input row and window column (70, 5 constant masks), no weights spilled."""
    for shape, k, s, pad, vl, g in (((1, 8, 14, 14), 5, 1, 2, 16, 1),
                                    ((1, 8, 28, 28), 3, 1, 1, 16, 1),
                                    ((1, 8, 20, 7), 3, 1, 1, 16, 2),
                                    ((1, 8, 14, 5), 5, 1, 2, 16, 3),
                                    ((1, 8, 7, 7), 5, 1, 2, 16, 2),      # two rows of 7
                                    ((1, 8, 14, 14), 5, 2, 2, 16, 0),    # stride 2
                                    ((1, 8, 56, 56), 3, 1, 1, 16, 0),    # 4 chunks: rows
                                    ((1, 8, 40, 28), 3, 1, 1, 16, 0),    # 80 vectors: rows
                                    ((1, 8, 20, 7), 3, 1, 0, 16, 0),     # 5 of 7 columns
                                    ((1, 8, 14, 14), 5, 1, 2, 8, 0)):    # AVX2
        e = _emitter(shape, k, s, pad, vl)
        e._geometry()
        assert e.packed == g, (shape, k, s, pad, vl, e.packed)
        assert not (e.packed and e.padded)
    e = _emitter((1, 13, 14, 14), 5, 1, 2, 16)
    e.emit()
    text = str(e.module)
    loads = [line for line in text.splitlines() if "load <16 x float>" in line
             or ("call" in line and "masked.load.v16f32" in line)]
    assert len(loads) == 70, len(loads)
    masks = {line.split("<16 x i1>")[1].split(">")[0] for line in loads if "<16 x i1>" in line}
    assert len(masks) == 5, masks
    asm = _assembly(text)
    assert "rsp" not in "\n".join(line for line in asm.splitlines()
                                  if "vfmadd" in line or "vbroadcastss" in line)


def _assembly(text: str) -> str:
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.target import resolve_target

    return _target_machine(resolve_target("x86-64-v4")).emit_assembly(llvm.parse_assembly(text))


def _separable():
    """Depthwise -> 1x1 blocks on two images of 16 channels: the depthwise layers on packed
    planes (14x14 5x5, 28x28 3x3 in two vectors a row, 7-wide rows two a vector) and on rows
    (56 wide), each with bias and HardSwish, its output read by a 1x1 alone."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    inits, nodes = [], []

    def conv(x, y, o, c, k, group=1, act=True):
        w = (rng.standard_normal((o, c // group, k, k)) / np.sqrt(c // group * k * k)
             ).astype(np.float32)
        b = (rng.standard_normal(o) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, y + "_w"), numpy_helper.from_array(b, y + "_b")])
        nodes.append(helper.make_node("Conv", [x, y + "_w", y + "_b"], [y + "_c" if act else y],
                                      pads=[k // 2] * 4, group=group))
        if act:
            nodes.append(helper.make_node("HardSwish", [y + "_c"], [y]))

    outs = []
    for i, (h, w, k) in enumerate(((14, 14, 5), (28, 28, 3), (20, 7, 3), (6, 56, 3))):
        x = f"x{i}"
        conv(x, f"d{i}", 16, 16, k, group=16)
        conv(f"d{i}", f"y{i}", 32, 16, 1, act=False)
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 32, h, w]))
    ins = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [2, 16, h, w])
           for i, (h, w) in enumerate(((14, 14), (28, 28), (20, 7), (6, 56)))]
    graph = helper.make_graph(nodes, "separable", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _bf16_runs(tmp_path, feeds: dict, pairs: bool) -> dict:
    """``_separable`` exported --precision bf16 for x86-64-v4+bf16 with depthwise pair words
    on or off: its outputs, checked bit for bit alike at 1 and 2 threads."""
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    mod, _ = import_onnx(_separable())
    path = tmp_path / f"{pairs}.mlc"
    report = export_module(mod, path, ExportOptions(
        target="x86-64-v4+bf16", precision="bf16",
        compile=CompileOptions(bf16_pair_depthwise=pairs)))
    assert report.precision == "bf16", report.precision_note
    with load(path) as one, load(path, threads=2) as two:
        got = one.run(feeds)
        for name, value in two.run(feeds).items():
            np.testing.assert_array_equal(value, got[name])
    return got


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx512f", "avx512_bf16"} <= host_features(),
                    reason="runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16")
def test_packed_pairs_native(tmp_path):
    """bf16 pair words from the packed planes (and rows): bit for bit the bundle that copies
    the float32 output into words, 1 and 2 threads; within the bf16 bound of ONNX Runtime."""
    import onnxruntime as ort

    rng = np.random.default_rng(4)
    feeds = {f"x{i}": rng.standard_normal((2, 16, h, w)).astype(np.float32)
             for i, (h, w) in enumerate(((14, 14), (28, 28), (20, 7), (6, 56)))}
    got = {on: _bf16_runs(tmp_path, feeds, on) for on in (True, False)}
    want = ort.InferenceSession(_separable().SerializeToString()).run(None, feeds)
    for i, ref in enumerate(want):
        np.testing.assert_array_equal(got[True][f"y{i}"], got[False][f"y{i}"])
        assert float(np.abs(got[True][f"y{i}"] - ref).max()) < 0.01 * float(np.abs(ref).max())
