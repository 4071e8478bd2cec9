"""The depthwise kernel's padded-row path (codegen/depthwise/static.py) against ONNX Runtime.

Targets with vectors narrower than AVX-512 (x86-64-v3's 8 lanes, x86-64-v2's 4) copy each input
plane into a zero-margined row buffer of the task (split by column parity for stride 2) and
store a row's last, partial chunk in pieces. Exported for those targets explicitly, so these
run the path on AVX-512 machines too. Odd widths around the vector widths, 3x3/5x5/7x7 windows,
stride 1 and 2, asymmetric padding, a channel multiplier, batch 2, fused SiLU / HardSwish /
residual epilogues (the residual read masked on the tail chunk), 1 and 2 threads.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import assert_runs_match, force_parallel_kernels, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime.cpu import best_level, host_features, level

# (name, x shape, kernel, strides, pads (t, l, b, r), multiplier, epilogue)
CASES = [
    ("s1_3x3_w13", (1, 5, 11, 13), 3, 1, (1, 1, 1, 1), 1, "silu"),
    ("s1_5x5_w14", (1, 6, 14, 14), 5, 1, (2, 2, 2, 2), 1, "hswish"),
    ("s1_5x5_w7", (1, 9, 7, 7), 5, 1, (2, 2, 2, 2), 1, "residual"),
    ("s1_7x7_w29", (1, 3, 9, 29), 7, 1, (3, 3, 3, 3), 1, None),
    ("s1_3x3_w3", (1, 4, 17, 3), 3, 1, (1, 1, 1, 1), 1, "relu"),
    ("s1_asym_w20", (2, 3, 8, 20), 3, 1, (0, 2, 1, 0), 1, "silu"),
    ("s1_mult2_w10", (1, 4, 10, 10), 3, 1, (1, 1, 1, 1), 2, "residual"),
    ("s1_unpadded_w19", (1, 3, 6, 19), 3, 1, (0, 0, 0, 0), 1, None),
    ("s1_h7_two_left", (1, 3, 7, 17), 3, 1, (1, 1, 1, 1), 1, "hswish"),   # 5 rows: 3 + 2
    ("s2_3x3_w15", (1, 5, 15, 15), 3, 2, (1, 1, 1, 1), 1, "hswish"),
    ("s2_5x5_w28", (1, 4, 28, 28), 5, 2, (2, 2, 2, 2), 1, "silu"),
    ("s2_5x5_w13", (1, 3, 13, 13), 5, 2, (2, 2, 2, 2), 1, "residual"),
    ("s2_3x3_w37_asym", (2, 2, 9, 37), 3, 2, (0, 1, 1, 0), 1, None),
    ("s2_3x3_w64_unpadded", (1, 3, 8, 64), 3, 2, (0, 0, 0, 0), 1, "relu"),
    ("s2_7x7_w22", (1, 3, 12, 22), 7, 2, (3, 3, 3, 3), 1, None),
    ("s2_3x3_w2", (1, 3, 5, 2), 3, 2, (1, 1, 1, 1), 1, "hswish"),
    # regions of LAZY_COPY_BYTES or more: rows copied block by block, right before their use
    ("s1_3x3_lazy_w100", (1, 3, 42, 100), 3, 1, (1, 1, 1, 1), 1, "silu"),
    ("s1_5x5_lazy_asym", (1, 2, 45, 97), 5, 1, (0, 2, 2, 1), 1, "residual"),
    ("s2_5x5_lazy_w121", (1, 2, 37, 121), 5, 2, (2, 1, 1, 2), 1, "residual"),
    ("s2_7x7_lazy_mult2", (2, 2, 31, 150), 7, 2, (3, 3, 3, 3), 2, None),
    ("s2_2x2_lazy_unpadded", (1, 3, 40, 130), 2, 2, (0, 0, 0, 0), 1, "relu"),
]


def _out_hw(shape, k, s, pads):
    h, w = shape[2:]
    return (h + pads[0] + pads[2] - k) // s + 1, (w + pads[1] + pads[3] - k) // s + 1


def _model(cases, rng):
    """One ONNX model with every case as an independent input -> depthwise conv -> output."""
    nodes, inputs, outputs, inits = [], [], [], []
    for name, shape, k, s, pads, mult, epi in cases:
        n, c = shape[:2]
        oh, ow = _out_hw(shape, k, s, pads)
        w = (rng.standard_normal((c * mult, 1, k, k)) / k).astype(np.float32)
        b = (rng.standard_normal(c * mult) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
        inputs.append(helper.make_tensor_value_info(f"{name}_x", TensorProto.FLOAT, list(shape)))
        conv = f"{name}_c"
        nodes.append(helper.make_node("Conv", [f"{name}_x", f"{name}_w", f"{name}_b"], [conv],
                                      kernel_shape=[k, k], strides=[s, s],
                                      pads=[pads[0], pads[1], pads[2], pads[3]], group=c))
        y = f"{name}_y"
        if epi is None:
            nodes.append(helper.make_node("Identity", [conv], [y]))
        elif epi == "relu":
            nodes.append(helper.make_node("Relu", [conv], [y]))
        elif epi == "hswish":
            nodes.append(helper.make_node("HardSwish", [conv], [y]))
        elif epi == "silu":
            nodes.append(helper.make_node("Sigmoid", [conv], [f"{name}_sg"]))
            nodes.append(helper.make_node("Mul", [conv, f"{name}_sg"], [y]))
        elif epi == "residual":
            r = rng.standard_normal((n, c * mult, oh, ow)).astype(np.float32)
            inits.append(numpy_helper.from_array(r, f"{name}_r"))
            nodes.append(helper.make_node("Add", [conv, f"{name}_r"], [f"{name}_a"]))
            nodes.append(helper.make_node("Relu", [f"{name}_a"], [y]))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT,
                                                     [n, c * mult, oh, ow]))
    graph = helper.make_graph(nodes, "depthwise", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _runnable(target: str) -> bool:
    """This host runs ``target``'s code: an x86-64 host with every flag the level needs (on an
    AVX-512 host the best level is a named variant such as x86-64-v4+bf16, not a plain vN)."""
    best = best_level()
    if best is None or level(best).arch != "x86_64":
        return False
    return level(target).flags <= host_features()


@pytest.fixture
def split_every_kernel(monkeypatch):
    """Every kernel parallel however small, so 2 threads split these small layers' planes."""
    force_parallel_kernels(monkeypatch, outputs=False)


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v2"])
def test_depthwise_padded_rows_match_onnxruntime(target, tmp_path, split_every_kernel):
    if not _runnable(target):
        pytest.skip(f"this machine does not run {target} code")
    rng = np.random.default_rng(7)
    model = _model(CASES, rng)
    path = tmp_path / "dw.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / "dw.mlc"
    export_module(mod, bundle, ExportOptions(target=target))
    feeds = {f"{name}_x": rng.standard_normal(shape).astype(np.float32)
             for name, shape, *_ in CASES}
    want = ort_outputs(path, feeds)
    assert sorted(want) == sorted(f"{name}_y" for name, *_ in CASES)
    # 3 threads: shares of planes that end mid-case and tasks left without a plane
    assert_runs_match(bundle, feeds, want, rtol=1e-5, atol=1e-5, label=target,
                      threads=(1, 2, 3))


def test_padded_geometry_on_narrow_targets():
    """The plan: a border chunk or stride 2 takes the padded rows below AVX-512's width (the
    16-lane path keeps its masked border chunks); stride-2 taps read their parity row with
    one plain load each; the region holds every row of the plane and the zero rows its windows
    reach past it."""
    from mlcpack.packager.codegen.depthwise.static import PADDED_BELOW_VL, DepthwiseEmitter, \
        match_depthwise
    from mlcpack.packager.ir import BlockBuilder
    from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
    from llvmlite import ir

    def plan(x_shape, k, s, pad, vl):
        bb = BlockBuilder()
        xv = bb.input("x", x_shape, "float32")
        w = np.ones((x_shape[1], 1, k, k), np.float32)
        with bb.function("main", [xv]):
            with bb.dataflow():
                y = bb.emit_output(bb.emit_op("nn.conv2d", xv, bb.constant(w, "w"),
                                              groups=x_shape[1], strides=(s, s),
                                              padding=(pad,) * 4))
            bb.emit_func_output(y, names=["y"])
        funcs = run_pipeline(bb.get(), DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values()
        func, match = next((f, match_depthwise(f)) for f in funcs if match_depthwise(f))
        e = DepthwiseEmitter(ir.Module(), func, "k", match, vl)
        e._geometry()
        return e

    assert PADDED_BELOW_VL == 16
    e = plan((1, 8, 14, 14), 5, 1, 2, 8)
    assert e.padded and e.row_stride >= 2 + 14 and (e.q_lo, e.q_hi, e.nq) == (0, 1, 2)
    # the zero rows above and below the plane's: every window inside the region, one
    # group of output rows (one copy of the row block's code)
    assert e.pad_rows == 2 and e.region_floats >= (2 + 14 + 2) * e.row_stride
    assert e.segments == [(0, 14, 0, 5)]
    e = plan((1, 8, 14, 14), 5, 2, 2, 8)
    assert e.padded and e.x_step == 1 and e.row_stride == 2 * e.phase_len
    assert e.segments == [(0, 7, 0, 5)] and e.region_floats >= (2 + 14 + 1) * e.row_stride
    assert e.recipes == {kx: ("load", kx % 2 * e.phase_len + kx // 2) for kx in range(5)}
    e = plan((1, 8, 14, 40), 5, 1, 2, 16)   # 14 wide: a packed plane (its own test)
    assert not e.padded and len(e.segments) == 5                # AVX-512: masked borders
    assert not plan((1, 8, 6, 16), 1, 1, 0, 8).padded          # no border chunk: in place
