"""``--quantize int8`` keeps activations 8-bit between layers (packager/calibrate.py
``_chain_plan``), the graph ONNX Runtime's ``quantize_static`` writes: a QDQ pair on every
chosen convolution's output (a Relu alone after it folded into the quantize: its range has
zero point 0), on a residual Add whose input is 8-bit, and on a MaxPool of an 8-bit tensor (the
input's scale and zero point); an 8-bit tensor no integer kernel would read stays float. The
fusions then requantize in the convolutions' epilogues, add and pool on bytes. No compile:
the ranges come from ONNX Runtime runs of the float model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import quant_models as qm
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager import calibrate as C
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory):
    """conv_net (conv+relu, depthwise conv, residual add, max pool, 1x1 conv read by SiLU,
    ..., Gemm) with every layer chosen and min/max ranges from 4 random feeds."""
    path = qm.conv_net(tmp_path_factory.mktemp("chain") / "conv_net.onnx")
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    layers = C._quantizable(model, inits)
    taps = list(dict.fromkeys([n.input[0] for _, n, _ in layers]
                              + C._chain_candidates(model, layers)))
    sess = ort.InferenceSession(C._tapped(model, taps).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    runs = [dict(zip(taps, sess.run(taps, f))) for f in qm.random_feeds(path, seed=5, n=4)]
    params = {t: C.uint8_params(min(float(r[t].min()) for r in runs),
                                max(float(r[t].max()) for r in runs)) for t in taps}
    chosen = [(i, axis, *C.weight_params(inits[n.input[1]], axis)) for i, n, axis in layers]
    return path, model, inits, chosen, params


def _snr(model: onnx.ModelProto, path: Path) -> float:
    x = qm.random_feeds(path, seed=9)[0]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(model.SerializeToString(), opts,
                               providers=["CPUExecutionProvider"]).run(None, x)[0]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, x)[0]
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2)))


def _fused(model: onnx.ModelProto) -> list[tuple[str, str]]:
    mod, _ = import_onnx(model)
    upto = [p.name for p in DEFAULT_PIPELINE].index("fold_dequantize") + 1
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:upto], options=UNPACKED)
    return [(b.value.op, b.value.type.dtype) for b in fused.functions["main"].bindings()
            if hasattr(b.value, "op")]


def test_chain_plan(net) -> None:
    _, model, _, chosen, params = net
    plan, dropped = C._chain_plan(model.graph, chosen, params)
    # r1 = relu(c1): the Relu folded, c1 quantized with r1's range; c3 (read by SiLU) float
    assert {t: src for t, (src, _) in plan.items()} == {"r1": "c1", "c2": "c2", "a2": "a2",
                                                        "p2": "p2"}
    assert [model.graph.node[i].op_type for i in dropped] == ["Relu"]
    assert int(plan["r1"][1][1]) == 0
    assert plan["p2"][1] == plan["a2"][1]        # MaxPool keeps its input's scale


def test_chain_fuses_to_byte_kernels_and_stays_close(net) -> None:
    path, model, inits, chosen, params = net
    flat = C._build_qdq(model, inits, chosen, params, chain=False)
    chained = C._build_qdq(model, inits, chosen, params)
    onnx.checker.check_model(chained)
    ops = [n.op_type for n in chained.graph.node]
    assert ops.count("QuantizeLinear") == 6 and "Relu" not in ops, ops
    assert [n.op_type for n in flat.graph.node].count("QuantizeLinear") == 4
    assert _fused(chained) == [
        ("quantize", "uint8"), ("qconv2d", "uint8"), ("qdwconv2d", "uint8"),
        ("qbinary", "uint8"), ("nn.max_pool2d", "uint8"), ("qconv2d", "float32"),
        ("sigmoid", "float32"), ("multiply", "float32"), ("nn.avg_pool2d", "float32"),
        ("concat", "float32"), ("mean", "float32"), ("reshape", "float32"),
        ("quantize", "uint8"), ("qmatmul", "float32")]
    assert ("add", "float32") in _fused(flat)
    assert _snr(chained, path) > 30 and _snr(flat, path) > 35


def test_chain_off_by_environment(net) -> None:
    _, model, inits, chosen, params = net
    options = CompileOptions.from_environ({"MLCPACK_INT8_CHAIN": "0"})
    assert options.int8_chain is False and CompileOptions.from_environ({}).int8_chain
    ops = [n.op_type for n in C._build_qdq(model, inits, chosen, params,
                                             chain=options.int8_chain).graph.node]
    assert ops.count("QuantizeLinear") == 4 and "Relu" in ops


@pytest.mark.parametrize("top, folds", [(6.0, True), (None, True), (1.0, False)])
def test_relu6_folds_where_its_top_is_past_the_range(top, folds) -> None:
    """conv -> Clip(0, top) -> conv: the Clip folds into the first conv's quantize when the
    calibrated range (here [0, 6]: scale 6 / 255, zero point 0) ends at or below its top."""
    from onnx import TensorProto as T
    from onnx import helper as h

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), w)
             for w in ("w1", "w2")]
    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "lo"))
    clip_in = ["c1", "lo"]
    if top is not None:
        inits.append(numpy_helper.from_array(np.array(top, np.float32), "hi"))
        clip_in.append("hi")
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"]), h.make_node("Clip", clip_in, ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["y"])]
    graph = h.make_graph(nodes, "relu6", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 3, 3])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 3, 3])], inits)
    chosen = [(0, 0, None, None), (2, 0, None, None)]
    params = {"x": C.uint8_params(-1, 1), "c1": C.uint8_params(-6, 6),
              "r1": C.uint8_params(0.0, 6.0)}
    plan, dropped = C._chain_plan(graph, chosen, params)
    # not folded: c1 is read by the float Clip alone, so it stays float (r1 gets the
    # second conv's own input QDQ)
    assert (plan == {"r1": ("c1", params["r1"])} and dropped == {1}) if folds else \
        (plan == {} and not dropped), plan


def test_residual_block_stays_8bit_through_the_folded_relus() -> None:
    """ResNet's block: conv1 -> relu -> conv2 -> add(., relu1) -> relu -> conv3. Both Relus
    fold; conv2's output is chained because the Add (chained under its Relu's name) reads it."""
    from onnx import TensorProto as T
    from onnx import helper as h

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), w)
             for w in ("w1", "w2", "w3")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["c2"]), h.make_node("Add", ["c2", "r1"], ["a"]),
             h.make_node("Relu", ["a"], ["r2"]), h.make_node("Conv", ["r2", "w3"], ["y"])]
    graph = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 3, 3])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 3, 3])], inits)
    chosen = [(0, 0, None, None), (2, 0, None, None), (5, 0, None, None)]
    params = {"x": C.uint8_params(-1, 1), "c1": C.uint8_params(-2, 2), "r1": C.uint8_params(0, 2),
              "c2": C.uint8_params(-3, 3), "a": C.uint8_params(-4, 4), "r2": C.uint8_params(0, 4)}
    plan, dropped = C._chain_plan(graph, chosen, params)
    assert {t: src for t, (src, _) in plan.items()} == {"r1": "c1", "c2": "c2", "r2": "a"}
    assert dropped == {1, 4}
