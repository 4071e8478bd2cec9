"""Integer convolutions with run-time image sizes (codegen/qgemm_conv.py ``_emit_open``): what
``onnxruntime.quantization`` writes of a small conv net per channel (full-range int8 weights),
with its batch, height and width open as in ONNX files from the wild, exports with the default
command (golden check on, portable x86-64-v2 + v3) onto the quad kernels, one of each form: 7-bit
pairs (3x3, stride 1, padded), split in two with a SiLU table folded into its copy out (3x3,
stride 2), split (1x1), instead of the fp32 kernels over exact integers; and the concat before
the 1x1 (of the SiLU's output and a MaxPool of the first conv's) on bytes, the MaxPool too.
At two run-time sizes and on both levels (MLCPACK_CPU_FEATURES pins the host), the bundle
equals ONNX Runtime running the QDQ graph as written and exact integer math in numpy (int64
sums, ORT's requantization, maxima of bytes, the concat's requantization per byte, the SiLU
chain's table from ORT on its 256 inputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import quant_models as qm
from conftest import X86_V2, X86_V3
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features
from mlcpack.runtime.describe import describe

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")

SIZES = ((2, 14, 22), (1, 40, 34))      # (batch, height, width) at run time: even (the concat)
OPEN = "integer quad convolution, pixel lanes, planes sized at run time"


def _net(path: Path) -> Path:
    """x [1, 3, 12, 10] -> 3x3 conv (16) -> Relu -> 3x3/2 conv (32) -> SiLU, concat with a 2x2/2
    MaxPool of the Relu's output (48) -> 1x1 conv (16).
    Weights N(0, 0.04) with one +-1 outlier per output channel, which sets its scale: the rest
    stay within 7 bits; the first conv's outliers sit on channel 2 (paired with the quad's
    padding), a few same-sign pairs of 0.9 in the others go past ``vpmaddubsw``'s bound."""
    rng = np.random.default_rng(0)

    def w(o: int, c: int, k: int, hot: int = 0, at=None) -> np.ndarray:
        a = rng.normal(0, 0.04, (o, c, k, k)).astype(np.float32)
        a[np.arange(o), rng.integers(0, c, o) if at is None else at, 0, 0] = \
            rng.choice([-1.0, 1.0], o)
        for _ in range(hot):
            oc, cq = rng.integers(o), rng.integers(c // 2)
            a[oc, 2 * cq, k // 2, k // 2] = a[oc, 2 * cq + 1, k // 2, k // 2] = 0.9
        return a

    def b(o: int) -> np.ndarray:
        return rng.normal(0, 0.1, o).astype(np.float32)

    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Sigmoid", ["c2"], ["s2"]),
             h.make_node("Mul", ["c2", "s2"], ["r2"]),
             h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Concat", ["r2", "p1"], ["cat"], axis=1),
             h.make_node("Conv", ["cat", "w3", "b3"], ["y"])]
    inits = {"w1": w(16, 3, 3, at=2), "b1": b(16), "w2": w(32, 16, 3, hot=2), "b2": b(32),
             "w3": w(16, 48, 1, hot=1), "b3": b(16)}
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 12, 10])],
                    [h.make_tensor_value_info("y", T.FLOAT, None)], inits, path)


def _open_dims(path: Path) -> Path:
    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param, dims[2].dim_param, dims[3].dim_param = "N", "H", "W"
    del model.graph.value_info[:]
    model.graph.output[0].type.tensor_type.ClearField("shape")
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> tuple[Path, Path]:
    """(the QDQ file with open N/H/W, its bundle from the default export: ~5 CPU-s)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    folder = tmp_path_factory.mktemp("open_int_conv")
    qfile = _open_dims(qm.ort_quantize(_net(folder / "net.onnx"), folder / "net_qdq.onnx",
                                       "QDQ", per_channel=True))
    mod, _ = import_onnx(str(qfile))
    bundle = folder / "net.mlc"
    export_module(mod, bundle, ExportOptions())      # golden check on, portable v2 + v3
    return qfile, bundle


def _quantize(x: np.ndarray, s: np.ndarray, zp: np.ndarray) -> np.ndarray:
    info = np.iinfo(zp.dtype)
    q = np.rint(x.astype(np.float32) / np.float32(s)) + np.int64(zp)
    return np.clip(q, info.min, info.max).astype(zp.dtype)


def _int_conv(xq, xs, xzp, wq, ws, wzp, bq, ys, yzp, stride: int, pad: int) -> np.ndarray:
    """ORT's QLinearConv in exact integers: int64 sums of (x - x_zp)(w - w_zp) + bias, then
    saturate(round_half_even(float32(acc) * float32(xs * ws / ys)) + y_zp)."""
    o, _, k, _ = wq.shape
    xp = np.pad(xq.astype(np.int64) - np.int64(xzp), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (xp.shape[2] - k) // stride + 1
    ow = (xp.shape[3] - k) // stride + 1
    wd = wq.astype(np.int64) - wzp.astype(np.int64).reshape(-1, 1, 1, 1)
    acc = np.zeros((xq.shape[0], o, oh, ow), np.int64)
    for ky in range(k):
        for kx in range(k):
            patch = xp[:, :, ky:ky + stride * (oh - 1) + 1:stride,
                       kx:kx + stride * (ow - 1) + 1:stride]
            acc += np.einsum("nchw,oc->nohw", patch, wd[:, :, ky, kx])
    acc += bq.astype(np.int64).reshape(1, o, 1, 1)
    assert np.abs(acc).max() < 2 ** 24     # float32(acc) exact, as in the kernel
    mult = ((np.float32(xs) * ws.astype(np.float32)) / np.float32(ys)).astype(np.float32)
    f = acc.astype(np.float32) * mult.reshape(1, o, 1, 1)
    info = np.iinfo(yzp.dtype)
    return np.clip(np.rint(f) + np.int64(yzp), info.min, info.max).astype(yzp.dtype)


def _silu_table(model: onnx.ModelProto, c: dict, src: str, dst: str, dtype, folder: Path):
    """ORT's bytes at ``dst`` (the SiLU chain's quantized output, the graph as written) for the
    256 bytes at ``src``: the chain's nodes alone, as a model of their own."""
    reached, nodes = {src}, []
    for node in model.graph.node:
        if dst not in reached and reached & set(node.input):
            nodes.append(node)
            reached.update(node.output)
    elem = T.UINT8 if dtype == np.uint8 else T.INT8
    sub = qm._save(nodes, [h.make_tensor_value_info(src, elem, None)],
                   [h.make_tensor_value_info(dst, elem, None)],
                   {k: v for k, v in c.items() if any(k in n.input for n in nodes)},
                   folder / "silu.onnx",
                   opsets=[(o.domain, o.version) for o in model.opset_import])
    levels = (np.arange(256) + np.iinfo(dtype).min).astype(dtype).reshape(1, 1, 256, 1)
    return ort.InferenceSession(str(sub), providers=["CPUExecutionProvider"]).run(
        None, {src: levels})[0].reshape(256)


def _integer_reference(qfile: Path, x: np.ndarray) -> np.ndarray:
    """The net in exact integer math from the QDQ file's constants: the convolutions as ORT's
    QLinearConv, the MaxPool as the maximum of bytes, the concat's inputs requantized
    (quantize(dequantize(v)) per byte), the SiLU chain as a table of ORT's values on its 256
    bytes (the graph as written); the bytes of each quantize's output kept by its name."""
    model = onnx.load(str(qfile))
    c = {t.name: nh.to_array(t) for t in model.graph.initializer}
    by_out = {o: n for n in model.graph.node for o in n.output}
    nodes = list(model.graph.node)

    def quantize_of(name: str) -> onnx.NodeProto:
        return next(n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] == name)

    def source(dq_out: str):          # (bytes, scale, zero point) behind a DequantizeLinear
        dq = by_out[dq_out]
        return ints[dq.input[0]], c[dq.input[1]], c[dq.input[2]]

    ints: dict[str, np.ndarray] = {}
    qx = quantize_of("x")
    ints[qx.output[0]] = _quantize(x, c[qx.input[1]], c[qx.input[2]])
    for node in nodes:
        if node.op_type == "Conv":
            xq, xs, xzp = source(node.input[0])
            wdq, bdq = by_out[node.input[1]], by_out[node.input[2]]
            qn = quantize_of(node.output[0])
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            ints[qn.output[0]] = _int_conv(
                xq, xs, xzp, *(c[i] for i in wdq.input), c[bdq.input[0]], c[qn.input[1]],
                c[qn.input[2]], attrs.get("strides", [1, 1])[0], attrs.get("pads", [0] * 4)[0])
        elif node.op_type == "MaxPool":           # 2x2, stride 2, the input's scale kept
            xq, xs, xzp = source(node.input[0])
            qn = quantize_of(node.output[0])
            assert c[qn.input[1]] == xs and c[qn.input[2]] == xzp
            n, ch, hh, ww = xq.shape
            ints[qn.output[0]] = xq[:, :, :hh // 2 * 2, :ww // 2 * 2].reshape(
                n, ch, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
        elif node.op_type == "Sigmoid":           # SiLU: sigmoid, then its product
            src = by_out[node.input[0]].input[0]
            mul = next(n for n in nodes if n.op_type == "Mul" and node.input[0] in n.input)
            dst = quantize_of(mul.output[0]).output[0]
            table = _silu_table(model, c, src, dst, ints[src].dtype, qfile.parent)
            ints[dst] = table[ints[src].astype(np.int64) - np.iinfo(ints[src].dtype).min]
        elif node.op_type == "Concat":
            qn = quantize_of(node.output[0])
            ys, yzp = c[qn.input[1]], c[qn.input[2]]
            parts = []
            for name in node.input:
                q, s, zp = source(name)
                f = (q.astype(np.float32) - np.float32(zp)) * np.float32(s)
                parts.append(_quantize(f, ys, yzp))
            ints[qn.output[0]] = np.concatenate(parts, axis=1)
    dy = by_out[model.graph.output[0].name]
    q, s, zp = source(dy.output[0])
    return ((q.astype(np.float32) - np.float32(zp)) * np.float32(s)).astype(np.float32)


def test_every_conv_takes_the_open_quad_kernel(net) -> None:
    """Three integer convolutions, none on the fp32 kernels: 7-bit quads (6 inputs), split
    with the SiLU table (9: + residual index and words + table), split (8)."""
    _, bundle = net
    kernels = describe(bundle)["kernels"]
    convs = [k for k in kernels if k["name"].startswith("qconv2d")]
    assert [k["num_inputs"] for k in convs] == [6, 9, 8], convs
    assert all(k["kernel"] == OPEN and k["symbolic"] for k in convs), convs
    assert not any("conv2d" in k["name"] and not k["name"].startswith("qconv2d")
                   for k in kernels)


@pytest.mark.parametrize("level", [
    "x86-64-v3", "x86-64-v2",
    # this host's own level where it is x86-64-v4+vnni (in a VNNI host's default portable
    # set): the 512-bit tiles of the run-time-size kernel, the split weights merged back on
    # each call, 8-bit results by ``_requant_zmm``, the SiLU table on the copy out
    pytest.param("host", marks=pytest.mark.skipif(
        "avx512_vnni" not in host_features(), reason="needs an avx512_vnni host"))])
def test_equals_ort_as_written_and_integer_math(net, level: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    qfile, bundle = net
    if level == "host":
        monkeypatch.delenv("MLCPACK_CPU_FEATURES", raising=False)
        assert any(v["level"] == "x86-64-v4+vnni" and v["selected"]
                   for v in describe(bundle)["code"])
    else:
        monkeypatch.setenv("MLCPACK_CPU_FEATURES",
                           {"x86-64-v3": X86_V3, "x86-64-v2": X86_V2}[level])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(qfile), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    with load(bundle) as model:
        for n, hh, ww in SIZES:
            x = rng.normal(0, 1, (n, 3, hh, ww)).astype(np.float32)
            got = model.run({"x": x})["y"]
            assert got.shape == (n, 16, (hh + 1) // 2, (ww + 1) // 2)
            np.testing.assert_array_equal(got, session.run(None, {"x": x})[0])
            np.testing.assert_array_equal(got, _integer_reference(qfile, x))

