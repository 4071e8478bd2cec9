"""The depthwise kernel with run-time image sizes (codegen/depthwise/symbolic.py) against ONNX
Runtime: 3x3 and 5x5 windows, stride 1 and 2 (and a vertical stride of 2 with a horizontal
one of 1), symmetric and asymmetric padding, a channel multiplier of 2, epilogues (bias, the
folded batch norm's scale and shift, HardSwish, ReLU, Clip, a residual add, SiLU's math call),
sizes from a row narrower than a vector to rows with every kind of partial last chunk, odd
heights (leftover row blocks of 2 and 1), a batch of 2, 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.depthwise import symbolic as depthwise_symbolic
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

from helpers import SharedLog

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(23)


def _w(name, *shape, scale=None):
    scale = 1 / np.sqrt(np.prod(shape[1:])) if scale is None else scale
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32),
                                   name)


def _model(batch="N"):
    """x (N, 8, H, W) ->
    d1: dw 3x3/1 pad 1 + bias, * scale + shift (a folded batch norm), HardSwish
    d2: dw 5x5/2 pad 2 + bias on d1, ReLU
    d3: dw 3x3/2 pad 1 (no bias), Clip(0, 6)
    d4: dw 5x5/1 pads (2, 1, 2, 3), channel multiplier 2 (8 -> 16) + bias, SiLU (a math call)
    d56: dw 3x3 strides (2, 1) pads (0, 1, 1, 0) + bias, plus another such conv (a residual
         read along the rows: the partial last chunk stored masked, no overlap)
    d7: dw 3x3/1 pad 1 + bias, log(|y| + 1) (no vector log: the epilogue lane by lane)
    d8: dw 1x1/2 + bias (input rows no output row reads)
    """
    def bn(name, src, c):
        return ([helper.make_node("Mul", [src, f"{name}_s"], [f"{name}_m"]),
                 helper.make_node("Add", [f"{name}_m", f"{name}_t"], [name])],
                [_w(f"{name}_s", c, 1, 1, scale=1.0), _w(f"{name}_t", c, 1, 1, scale=1.0)])

    nodes, inits = [], []
    nodes.append(helper.make_node("Conv", ["x", "w1", "b1"], ["d1c"], group=8,
                                  pads=[1, 1, 1, 1]))
    inits += [_w("w1", 8, 1, 3, 3), _w("b1", 8)]
    more, more_i = bn("d1b", "d1c", 8)
    nodes += more
    inits += more_i
    nodes.append(helper.make_node("HardSwish", ["d1b"], ["d1"]))
    nodes.append(helper.make_node("Conv", ["d1", "w2", "b2"], ["d2c"], group=8,
                                  strides=[2, 2], pads=[2, 2, 2, 2]))
    inits += [_w("w2", 8, 1, 5, 5), _w("b2", 8)]
    nodes.append(helper.make_node("Relu", ["d2c"], ["d2"]))
    nodes.append(helper.make_node("Conv", ["x", "w3"], ["d3c"], group=8, strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    inits += [_w("w3", 8, 1, 3, 3)]
    nodes.append(helper.make_node("Clip", ["d3c", "lo", "hi"], ["d3"]))
    inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
              numpy_helper.from_array(np.array(6, np.float32), "hi")]
    nodes.append(helper.make_node("Conv", ["x", "w4", "b4"], ["d4c"], group=8,
                                  pads=[2, 1, 2, 3]))
    inits += [_w("w4", 16, 1, 5, 5), _w("b4", 16)]
    nodes.append(helper.make_node("Sigmoid", ["d4c"], ["d4s"]))
    nodes.append(helper.make_node("Mul", ["d4c", "d4s"], ["d4"]))
    nodes.append(helper.make_node("Conv", ["x", "w5", "b5"], ["d5"], group=8, strides=[2, 1],
                                  pads=[0, 1, 1, 0]))
    inits += [_w("w5", 8, 1, 3, 3), _w("b5", 8)]
    nodes.append(helper.make_node("Conv", ["x", "w6"], ["d6"], group=8, strides=[2, 1],
                                  pads=[0, 1, 1, 0]))
    inits += [_w("w6", 8, 1, 3, 3)]
    nodes.append(helper.make_node("Add", ["d5", "d6"], ["d56"]))
    nodes.append(helper.make_node("Conv", ["x", "w7", "b7"], ["d7c"], group=8, pads=[1, 1, 1, 1]))
    inits += [_w("w7", 8, 1, 3, 3), _w("b7", 8)]
    nodes.append(helper.make_node("Abs", ["d7c"], ["d7a"]))
    nodes.append(helper.make_node("Add", ["d7a", "one"], ["d7b"]))
    nodes.append(helper.make_node("Log", ["d7b"], ["d7"]))
    inits += [numpy_helper.from_array(np.array(1, np.float32), "one")]
    nodes.append(helper.make_node("Conv", ["x", "w8", "b8"], ["d8"], group=8, strides=[2, 2]))
    inits += [_w("w8", 8, 1, 1, 1), _w("b8", 8)]
    outs = ["d1", "d2", "d3", "d4", "d56", "d7", "d8"]
    graph = helper.make_graph(
        nodes, "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, "H", "W"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), outs


SHAPES = [(1, 8, 2, 2), (1, 8, 5, 7), (1, 8, 16, 16), (1, 8, 17, 9), (1, 8, 23, 40),
          (2, 8, 12, 31), (1, 8, 30, 65), (1, 8, 7, 33)]


def _check(bundle, sess, outs, shape, threads) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    got = bundle.run({"x": x})
    for name, want in zip(outs, sess.run(None, {"x": x})):
        assert got[name].shape == want.shape, (name, shape)
        np.testing.assert_allclose(got[name], want, rtol=1e-4,
                                   atol=1e-5 * max(1.0, float(np.abs(want).max())),
                                   err_msg=f"{name} {shape} threads={threads}")


def test_symbolic_depthwise_against_ort(tmp_path) -> None:
    model, outs = _model()
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "dw.mlc")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        with load(tmp_path / "dw.mlc", threads=threads) as bundle:
            # split over threads where a 128 x 128 output would pay for a second task: all
            # but the 1x1 (8 multiply-adds a position)
            parallel = {k["name"]: bool(k.get("parallel")) for k in bundle.header["kernels"]}
            assert sum(parallel.values()) == 7 and not parallel["fused_conv2d7_add9"], parallel
            for shape in SHAPES:
                _check(bundle, sess, outs, shape, threads)


def test_symbolic_depthwise_kernel_is_used(monkeypatch, tmp_path) -> None:
    """Every depthwise convolution of the model gets this kernel (eight: d56 is two)."""
    made = SharedLog(tmp_path / "made")
    made.count_cache_hits(monkeypatch, "SymbolicDepthwiseEmitter.emit: symbol, "
                          "vector_epilogue, overlap")
    real = depthwise_symbolic.SymbolicDepthwiseEmitter.emit

    def spy(self):
        info = real(self)
        made.append((self.symbol, self.vector_epilogue, self.overlap))
        return info
    monkeypatch.setattr(depthwise_symbolic.SymbolicDepthwiseEmitter, "emit", spy)
    mod, _ = import_onnx(_model()[0])
    export_module(mod, tmp_path / "dw.mlc", ExportOptions(target="host", check=False))
    assert len(made) == 8, made
    # paths: a lane-by-lane epilogue (d7), a masked partial chunk (d56's residual)
    assert sum(not vector for _, vector, _ in made) == 1, made
    assert sum(vector and not overlap for _, vector, overlap in made) == 1, made


def test_symbolic_depthwise_sse_vectors(tmp_path) -> None:
    """The x86-64-v2 code (4-lane vectors: other chunk and tail counts) against ORT."""
    model, outs = _model()
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "dw.mlc", ExportOptions(target="x86-64-v2"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(tmp_path / "dw.mlc", threads=2) as bundle:
        for shape in [(1, 8, 2, 2), (1, 8, 3, 5), (1, 8, 17, 9), (2, 8, 12, 31)]:
            _check(bundle, sess, outs, shape, 2)


def test_symbolic_depthwise_compiles_for_avx512_and_neon(tmp_path) -> None:
    """16-lane (4-row blocks, one chunk) and NEON code compile (this host cannot run them)."""
    mod, _ = import_onnx(_model()[0])
    for target in ("x86-64-v4", "aarch64"):
        export_module(mod, tmp_path / f"dw-{target}.mlc", ExportOptions(target=target,
                                                                         check=False))
        assert (tmp_path / f"dw-{target}.mlc").stat().st_size > 0


def test_symbolic_depthwise_many_threads_and_wide_rows(tmp_path) -> None:
    """More tasks than planes' worth and a wide image (several tasks, each with its own
    region, planes split unevenly): 3 threads, 2 images of 8 channels."""
    model, outs = _model()
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "dw.mlc")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(tmp_path / "dw.mlc", threads=3) as bundle:
        for shape in [(2, 8, 45, 130), (1, 8, 64, 3)]:
            _check(bundle, sess, outs, shape, 3)


def _narrow_model():
    """PP-OCRv4's recognizer's late depthwise layers on short planes: x (1, 16, H, W) ->
    a: dw 5x5/1 pad 2 + bias, HardSwish; b: dw 5x5 strides (2, 1) pad 2 + bias, HardSwish;
    c: dw 3x3/1 pads (0, 1, 2, 1) (padding below only, a lone row's bottom check alone)."""
    nodes, inits = [], []
    for name, k, strides, pads in (("a", 5, [1, 1], [2, 2, 2, 2]), ("b", 5, [2, 1], [2, 2, 2, 2]),
                                   ("c", 3, [1, 1], [0, 1, 2, 1])):
        nodes.append(helper.make_node("Conv", ["x", f"w{name}", f"b{name}"], [f"{name}_conv"],
                                      group=16, strides=strides, pads=pads))
        nodes.append(helper.make_node("HardSwish", [f"{name}_conv"], [name]))
        inits += [_w(f"w{name}", 16, 1, k, k), _w(f"b{name}", 16)]
    graph = helper.make_graph(
        nodes, "dwn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, "H", "W"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), list("abc")


@pytest.mark.parametrize("target", ["host", "x86-64-v3"])
def test_symbolic_depthwise_short_planes(tmp_path, target) -> None:
    """Planes shorter than a row block and leftover rows (rows alone: their sums split over
    window rows, window rows in the padding skipped, at the top, the bottom or both) on the
    host's vectors (16 lanes here) and AVX2's, against ORT: heights 1-7, widths 80 (whole
    vectors), 33 and 5 (partial, narrower than a vector)."""
    model, outs = _narrow_model()
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "dwn.mlc", ExportOptions(target=target))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(tmp_path / "dwn.mlc", threads=1) as bundle:
        for h in range(1, 8):
            for w in (80, 33, 5):
                _check(bundle, sess, outs, (1, 16, h, w), 1)
