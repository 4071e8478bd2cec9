"""Small float models and the quantized forms ONNX Runtime's quantizer writes of them, plus one
hand-built model holding every quantized operator form the quantizer does not write; shared by
tests/precision/test_quantized_onnx_import.py and the quantization-at-export tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

MS = "com.microsoft"
ROOT = Path(__file__).resolve().parent.parent


def _save(nodes, inputs, outputs, inits, path: Path, opsets=(("", 17),)) -> Path:
    graph = h.make_graph(nodes, path.stem, inputs, outputs,
                         [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid(d, v) for d, v in opsets],
                         ir_version=8)
    onnx.save(model, path)
    return path


def conv_net(path: Path, seed: int = 0) -> Path:
    """conv+relu, depthwise conv, residual add, max pool, 1x1 conv, SiLU as x*sigmoid(x), avg
    pool, concat, global pool, Gemm: x [1,3,16,16] -> y [1,10]."""
    rng = np.random.default_rng(seed)
    f = lambda *s, sd=0.3: rng.normal(0, sd, s).astype(np.float32)  # noqa: E731
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=8),
        h.make_node("Add", ["c2", "r1"], ["a2"]),
        h.make_node("MaxPool", ["a2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p2", "w3", "b3"], ["c3"]),
        h.make_node("Sigmoid", ["c3"], ["s3"]),
        h.make_node("Mul", ["c3", "s3"], ["m3"]),
        h.make_node("AveragePool", ["m3"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Concat", ["ap", "ap"], ["cc"], axis=1),
        h.make_node("GlobalAveragePool", ["cc"], ["g"]),
        h.make_node("Flatten", ["g"], ["f"]),
        h.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    inits = {"w1": f(8, 3, 3, 3), "b1": f(8, sd=0.1), "w2": f(8, 1, 3, 3), "b2": f(8, sd=0.1),
             "w3": f(16, 8, 1, 1), "b3": f(16, sd=0.1), "wf": f(10, 32), "bf": f(10, sd=0.1)}
    return _save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits, path)


def mlp(path: Path, seed: int = 1) -> Path:
    """MatMul + bias, LeakyRelu, MatMul: x [4,32] -> y [4,16]."""
    rng = np.random.default_rng(seed)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Add", ["m1", "b1"], ["a1"]),
             h.make_node("LeakyRelu", ["a1"], ["r1"], alpha=0.1),
             h.make_node("MatMul", ["r1", "w2"], ["y"])]
    inits = {"w1": rng.normal(0, .3, (32, 64)).astype(np.float32),
             "b1": rng.normal(0, .1, 64).astype(np.float32),
             "w2": rng.normal(0, .3, (64, 16)).astype(np.float32)}
    return _save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [4, 32])],
                 [h.make_tensor_value_info("y", T.FLOAT, [4, 16])], inits, path)


def lstm(path: Path, seed: int = 2) -> Path:
    """LSTM (hidden 16) over x [6,1,8], then a MatMul: y [6,1,5]."""
    rng = np.random.default_rng(seed)
    hid, inp = 16, 8
    nodes = [h.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=hid),
             h.make_node("Squeeze", ["Y", "ax"], ["ys"]),
             h.make_node("MatMul", ["ys", "wo"], ["y"])]
    inits = {"W": rng.normal(0, .3, (1, 4 * hid, inp)).astype(np.float32),
             "R": rng.normal(0, .3, (1, 4 * hid, hid)).astype(np.float32),
             "B": rng.normal(0, .1, (1, 8 * hid)).astype(np.float32),
             "wo": rng.normal(0, .3, (hid, 5)).astype(np.float32),
             "ax": np.array([1], np.int64)}
    return _save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [6, 1, inp])],
                 [h.make_tensor_value_info("y", T.FLOAT, [6, 1, 5])], inits, path)


def random_feeds(path: Path, seed: int = 3, n: int = 1) -> list[dict[str, np.ndarray]]:
    """``n`` float feeds of normal noise for the model's (float) inputs."""
    model = onnx.load(str(path))
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feeds = {}
        for vi in model.graph.input:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rng.normal(0, 1, shape).astype(np.float32)
        out.append(feeds)
    return out


def ort_quantize(src: Path, dst: Path, mode: str, per_channel: bool = False,
                 activation: str = "QUInt8", weight: str = "QInt8",
                 reduce_range: bool = False, symmetric: bool = False) -> Path:
    """``onnxruntime.quantization`` on ``src``: mode ``QDQ`` or ``QOperator`` (static, calibrated
    on 8 random feeds) or ``dynamic``."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)

    if mode == "dynamic":
        quantize_dynamic(str(src), str(dst), per_channel=per_channel,
                         weight_type=getattr(QuantType, weight), reduce_range=reduce_range)
        return dst

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(random_feeds(src, seed=11, n=8))

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, mode),
                    per_channel=per_channel, activation_type=getattr(QuantType, activation),
                    weight_type=getattr(QuantType, weight), reduce_range=reduce_range,
                    extra_options={"ActivationSymmetric": symmetric})
    return dst


def output_step(path: Path) -> float | None:
    """The scale of the DequantizeLinear that writes the graph's first output, if one does."""
    model = onnx.load(str(path))
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    out = model.graph.output[0].name
    for node in model.graph.node:
        if out in node.output and node.op_type == "DequantizeLinear":
            return float(np.max(inits[node.input[1]]))
    return None


# ---- every other quantized operator form, in one model ------------------------------------------

# Outputs whose ONNX semantics are exact (integers, or floats computed exactly): bit-equal to ORT.
EXACT_OUTPUTS = ("q_t", "q_c", "dq_c", "q_nozp", "dq_ms", "xq", "xs", "xzp", "ci", "mi",
                 "mi_big", "qmul", "qadd")
# Integer outputs of ORT's requantizing kernels (QLinear*): within one step of ORT.
REQUANTIZED_OUTPUTS = ("qgemm_q", "ap_l", "gap_l", "cat", "lrelu", "sig", "qconv", "qmm",
                       "qsoftmax", "qwhere")
# Float outputs of integer products scaled to float: float32 rounding of ORT's int32 path.
SCALED_OUTPUTS = ("mitf", "dqmm", "qgemm_f")


def handmade_model(path: Path) -> Path:
    rng = np.random.default_rng(7)
    c: dict[str, np.ndarray] = {}

    def const(name: str, arr) -> str:
        c[name] = np.asarray(arr)
        return name

    u8 = lambda *s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    # int8 weights in [-64, 64): ONNX Runtime's u8 x s8 kernel on AVX2 without VNNI
    # (vpmaddubsw) saturates pairs of products at int16 (255 * 127 * 2 > 32767), so with
    # full-range weights it is no exact oracle there; 7-bit weights keep every pair sum in
    # range on every x86 level (mlcpack's integer kernels are checked at full range against
    # numpy in test_int8_gemm.py)
    s8 = lambda *s: rng.integers(-64, 64, s).astype(np.int8)  # noqa: E731
    f = lambda *s: rng.uniform(0.01, 0.05, s).astype(np.float32)  # noqa: E731
    big = s8(2048, 6)
    big[:, 0] = -64
    big[0, 0] = -63     # column 0 times a row of 255: -33423105, not a float32 (> 2**24, odd)
    n = [
        # QuantizeLinear per tensor (int8) and per channel (uint8), DequantizeLinear per channel,
        # com.microsoft Q/DQ, DynamicQuantizeLinear
        h.make_node("QuantizeLinear", ["x", const("s1", np.float32(0.05)),
                                       const("z1", np.int8(-3))], ["q_t"]),
        h.make_node("QuantizeLinear", ["x", const("s8c", f(8)), const("z8c", u8(8))], ["q_c"],
                    axis=1),
        h.make_node("DequantizeLinear", ["q_c", "s8c", "z8c"], ["dq_c"], axis=1),
        h.make_node("QuantizeLinear", ["x", "s1"], ["q_nozp"], domain=MS),
        h.make_node("DequantizeLinear", ["q_t", "s1", "z1"], ["dq_ms"], domain=MS),
        h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
        # int32 products: ConvInteger on a run-time zero point, MatMulInteger per-column zero
        # points, and one whose sums exceed float32's exact integers
        h.make_node("ConvInteger", ["xq", const("wci", u8(4, 8, 3, 3)), "xzp",
                                    const("wzci", np.uint8(131))], ["ci"],
                    pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("MatMulInteger", ["a", const("bmi", s8(40, 12)), const("azp", np.uint8(9)),
                                      const("bzp", s8(12))], ["mi"]),
        h.make_node("MatMulInteger", ["a_big", const("bbig", big), const("azpb", np.uint8(0))],
                    ["mi_big"]),
        # integer products scaled to float
        h.make_node("MatMulIntegerToFloat", ["a", "bmi", const("as_", np.float32(0.02)),
                                             const("bs", f(12)), "azp", "bzp",
                                             const("bias", f(12))], ["mitf"], domain=MS),
        h.make_node("DynamicQuantizeMatMul", ["af", "bmi", "bs", "bzp", "bias"], ["dqmm"],
                    domain=MS),
        h.make_node("QGemm", ["a", "as_", "azp", const("bt", s8(12, 40)), "bs",
                              const("bzp0", np.zeros(12, np.int8)),
                              const("cq", rng.integers(-500, 500, 12).astype(np.int32))],
                    ["qgemm_f"], domain=MS, alpha=0.5, transB=1),
        h.make_node("QGemm", ["a", "as_", "azp", "bmi", const("bs1", np.float32(0.01)),
                              const("bzp1", np.int8(0)), "cq", const("ys", np.float32(0.5)),
                              const("yzp", np.uint8(128))], ["qgemm_q"], domain=MS),
        # channels-last pools, concat of differently scaled inputs, int8 activations
        h.make_node("QLinearAveragePool", ["xl", "as_", "azp", const("ys2", np.float32(0.015)),
                                           const("yzp2", np.uint8(100))], ["ap_l"], domain=MS,
                    kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                    count_include_pad=1, channels_last=1),
        h.make_node("QLinearGlobalAveragePool", ["xl", "as_", "azp", "ys2", "yzp2"], ["gap_l"],
                    domain=MS, channels_last=1),
        h.make_node("QLinearConcat", ["ys2", "yzp2", "xq", "xs", "xzp", "q_c",
                                      const("sc2", np.float32(0.03)), const("zc2", np.uint8(77))],
                    ["cat"], domain=MS, axis=1),
        h.make_node("QLinearLeakyRelu", ["q_t", "s1", "z1", const("ys3", np.float32(0.04)),
                                         const("yzp3", np.int8(5))], ["lrelu"], domain=MS,
                    alpha=0.2),
        h.make_node("QLinearSigmoid", ["q_t", "s1", "z1", const("ys4", np.float32(1 / 256)),
                                       const("yzp4", np.int8(-128))], ["sig"], domain=MS),
        h.make_node("QLinearMul", ["q_t", "s1", "z1", "q_t", "s1", "z1",
                                   const("ys5", np.float32(0.1)), const("yzp5", np.int8(0))],
                    ["qmul"], domain=MS),
        h.make_node("QLinearAdd", ["q_t", "s1", "z1", "dq_in", const("sa2", np.float32(0.07)),
                                   const("za2", np.int8(4)), const("ys8", np.float32(0.09)),
                                   const("yzp8", np.int8(-2))], ["qadd"], domain=MS),
        # softmax (ONNX 13 semantics, last axis), where
        h.make_node("QLinearSoftmax", ["q_t", "s1", "z1", const("ys9", np.float32(1 / 256)),
                                       const("yzp9", np.int8(-128))], ["qsoftmax"], domain=MS,
                    axis=-1, opset=13),
        h.make_node("QLinearWhere", ["cond", "q_t", "s1", "z1", "dq_in", "sa2", "za2", "ys8",
                                     "yzp8"], ["qwhere"], domain=MS),
        # int8 x int8 QLinearConv per channel with bias, int8 QLinearMatMul
        h.make_node("QLinearConv", ["q_t", "s1", "z1", const("wq", s8(6, 8, 3, 3)), const("wqs", f(6)),
                                    const("wqz", np.zeros(6, np.int8)),
                                    const("ys6", np.float32(0.2)), const("yzp6", np.int8(2)),
                                    const("bq", rng.integers(-2000, 2000, 6).astype(np.int32))],
                    ["qconv"], pads=[1, 1, 1, 1]),
        h.make_node("QLinearMatMul", ["a_s8", "as_", const("azs", np.int8(1)), const("bqm", s8(40, 5)),
                                      const("bqms", np.float32(0.01)), const("bqmz", np.int8(0)),
                                      const("ys7", np.float32(0.3)), const("yzp7", np.int8(-1))],
                    ["qmm"]),
    ]
    F, U, S, I32 = T.FLOAT, T.UINT8, T.INT8, T.INT32
    outs = {"q_t": S, "q_c": U, "dq_c": F, "q_nozp": U, "dq_ms": F, "xq": U, "xs": F, "xzp": U,
            "ci": I32, "mi": I32, "mi_big": I32, "mitf": F, "dqmm": F, "qgemm_f": F, "qgemm_q": U,
            "ap_l": U, "gap_l": U, "cat": U, "lrelu": S, "sig": S, "qmul": S, "qadd": S,
            "qconv": S, "qmm": S, "qsoftmax": S, "qwhere": S}
    inputs = [h.make_tensor_value_info("x", F, [2, 8, 6, 6]),
              h.make_tensor_value_info("a", U, [4, 40]),
              h.make_tensor_value_info("a_big", U, [2, 2048]),
              h.make_tensor_value_info("af", F, [4, 40]),
              h.make_tensor_value_info("xl", U, [1, 6, 6, 8]),
              h.make_tensor_value_info("a_s8", S, [3, 40]),
              h.make_tensor_value_info("dq_in", S, [2, 8, 6, 6]),
              h.make_tensor_value_info("cond", T.BOOL, [2, 8, 6, 6])]
    return _save(n, inputs, [h.make_tensor_value_info(o, t, None) for o, t in outs.items()], c,
                 path, opsets=(("", 17), (MS, 1)))


def handmade_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"x": rng.normal(0, 1, (2, 8, 6, 6)).astype(np.float32),
            "a": rng.integers(0, 256, (4, 40)).astype(np.uint8),
            "a_big": np.concatenate([np.full((1, 2048), 255, np.uint8),
                                     rng.integers(0, 256, (1, 2048)).astype(np.uint8)]),
            "af": rng.normal(0, 1, (4, 40)).astype(np.float32),
            "xl": rng.integers(0, 256, (1, 6, 6, 8)).astype(np.uint8),
            "a_s8": rng.integers(-128, 128, (3, 40)).astype(np.int8),
            "dq_in": rng.integers(-128, 128, (2, 8, 6, 6)).astype(np.int8),
            "cond": rng.random((2, 8, 6, 6)) < 0.5}


def paddle_style(path: Path, seed: int = 0) -> Path:
    """``conv_net`` as Paddle's exporter writes models: opset 11, every weight in a
    ``Constant`` node (no initializers), and the batch, height and width symbolic."""
    conv_net(path, seed)
    model = onnx.load(str(path))
    constants = [h.make_node("Constant", [], [t.name], value=t) for t in model.graph.initializer]
    nodes = constants + list(model.graph.node)
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", 3, "h", "w"])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", 10])
    graph = h.make_graph(nodes, "paddle_style", [x], [y])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 11)], ir_version=6), path)
    return path
