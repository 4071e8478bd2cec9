"""Weights stored as 8-bit integers (format 1.5, ``Constant.stored``, passes/stored_int.py):
dequantized weights no integer kernel takes (dynamic quantization's ConvInteger/MatMulInteger,
grouped convolutions, symbolic-shape models) keep their int8/uint8 values in the bundle and are
expanded to float32 at load, bit for bit the float32 constants the kernels read before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import Constant
from mlcpack.packager.ops.layout import pack_matmul_b, pack_oc_weights, pack_row_weights
from mlcpack.packager.passes.stored_int import derive, expand, make_stored, stored_dequantize
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.errors import BundleError, FormatVersionError
from mlcpack.runtime.header import Header

ort = pytest.importorskip("onnxruntime")


# ---- the transforms (numpy only) ---------------------------------------------------------------

def _stored_weight(shape: tuple[int, ...], dtype: str, axis: int | None, seed: int = 0
                   ) -> Constant:
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
    q = rng.integers(lo, hi, shape).astype(dtype)
    pshape = [1] * len(shape)
    if axis is not None:
        pshape[axis] = shape[axis]
    scale = rng.uniform(0.001, 0.1, pshape).astype(np.float32)
    zp = (np.zeros(pshape) if dtype == "int8" else rng.integers(100, 150, pshape)).astype(dtype)
    from mlcpack.packager.ops.quant import dequantize
    data = dequantize(q, scale, zp)
    stored = stored_dequantize(data, q, scale, zp)
    assert stored is not None
    return Constant("w", data, stored)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("transform", ["transpose", "matmul_panels", "conv_oc", "conv_rows",
                                       "reshape"])
def test_rearrangements_keep_the_integers(transform: str, dtype: str) -> None:
    if transform in ("conv_oc", "conv_rows", "reshape"):
        w = _stored_weight((16, 6, 3, 3), dtype, 0)
        fn = {"conv_oc": pack_oc_weights, "conv_rows": lambda d: pack_row_weights(d, 4),
              "reshape": lambda d: d.reshape(16, 54)}[transform]
    else:
        w = _stored_weight((37, 21), dtype, 1)   # odd sizes: the panels are zero-padded
        fn = {"transpose": lambda d: np.ascontiguousarray(d.T),
              "matmul_panels": pack_matmul_b}[transform]
    got = derive("p", w, fn)
    want = fn(w.data)
    assert got.stored is not None, transform
    assert str(got.stored.q.dtype) == dtype
    assert got.stored.scale.size <= 64   # per channel, not per element
    np.testing.assert_array_equal(expand(got.stored).view(np.uint32),
                                  np.ascontiguousarray(want, np.float32).view(np.uint32))
    np.testing.assert_array_equal(got.data, want)


def test_arithmetic_falls_back_to_float32() -> None:
    w = _stored_weight((16, 32), "int8", 0)
    got = derive("p", w, lambda d: d * np.float32(1.37) + np.float32(0.5))
    assert got.stored is None
    np.testing.assert_array_equal(got.data, w.data * np.float32(1.37) + np.float32(0.5))
    # a stored form that does not reproduce the values is never made
    assert make_stored(w.data + 1, w.stored.q, w.stored.scale, w.stored.zero_point) is None


# ---- whole models: dynamic quantization and a QDQ grouped convolution, symbolic batch ----------

def _float_model(path: Path) -> Path:
    rng = np.random.default_rng(3)
    f = lambda *s: rng.normal(0, 0.2, s).astype(np.float32)  # noqa: E731
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=2),
             h.make_node("GlobalAveragePool", ["c2"], ["g"]),
             h.make_node("Flatten", ["g"], ["fl"]),
             h.make_node("MatMul", ["fl", "wm"], ["y"])]
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in
             {"w1": f(32, 8, 3, 3), "b1": f(32), "w2": f(32, 16, 3, 3), "b2": f(32),
              "wm": f(32, 48)}.items()]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["n", 8, 12, 12])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n", 48])], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


class _Reader:
    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(5)
        self.feeds = iter([{"x": rng.normal(0, 1, (1, 8, 12, 12)).astype(np.float32)}
                           for _ in range(n)])

    def get_next(self):
        return next(self.feeds, None)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    from onnxruntime.quantization import (QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    folder = tmp_path_factory.mktemp("stored")
    src = _float_model(folder / "float.onnx")
    dyn, qdq = folder / "dynamic.onnx", folder / "qdq.onnx"
    quantize_dynamic(str(src), str(dyn), weight_type=QuantType.QUInt8, per_channel=False)
    quantize_static(str(src), str(qdq), _Reader(4), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt8)
    out = {}
    for name, path in (("dynamic", dyn), ("qdq", qdq)):
        mod, _ = import_onnx(str(path))
        bundle = folder / f"{name}.mlc"
        export_module(mod, bundle, ExportOptions(target="host", check=False))
        out[name] = (path, bundle)
    return out


def _int8_weight_bytes(path: Path) -> int:
    m = onnx.load(str(path))
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in m.graph.initializer
               if t.data_type in (T.INT8, T.UINT8))


@pytest.mark.parametrize("name", ["dynamic", "qdq"])
def test_bundle_stores_the_integers_and_matches_ort(models, name: str) -> None:
    onnx_path, bundle = models[name]
    reader = BundleReader(bundle)
    header = Header.from_msgpack(reader.header, reader.data_size)
    reader.close()
    assert tuple(header.format) == (1, 5) and tuple(header.min_reader) == (1, 5)
    stored = [c for c in header.constants if c.stored is not None]
    big_float = [c for c in header.constants if c.stored is None and c.dtype == "float32"
                 and np.prod(c.shape) >= 1024]
    assert stored and not big_float, [(c.name, c.shape) for c in big_float]
    weight_bytes = sum(c.data.size for c in header.constants)
    assert weight_bytes < 1.3 * _int8_weight_bytes(onnx_path) + 4096
    x = np.random.default_rng(1).normal(0, 1, (2, 8, 12, 12)).astype(np.float32)
    with load(bundle) as model:
        got = model.run({"x": x})["y"]
    ref = ort_outputs(onnx_path, {"x": x}, threads=1, as_written=True)["y"]
    tol = 1e-5 if name == "dynamic" else 0.05   # QDQ: one output step; dynamic: float32
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_older_reader_refuses_and_damage_is_one_line(models, monkeypatch, tmp_path) -> None:
    _, bundle = models["dynamic"]
    monkeypatch.setattr(bundle_format, "STORED_MINOR", 4)   # a 1.4 reader
    with pytest.raises(FormatVersionError, match="needs a runtime that reads"):
        load(bundle)
    monkeypatch.undo()
    reader = BundleReader(bundle)
    raw = reader.header
    size = reader.data_size
    reader.close()
    import copy
    for damage in ("param_shape", "dtype", "scale"):
        bad = copy.deepcopy(raw)
        row = next(c for c in bad["constants"] if "stored" in c)
        if damage == "param_shape":
            row["stored"]["param_shape"] = [7] * len(row["shape"])
        elif damage == "dtype":
            row["stored"]["dtype"] = "int16"
        else:
            row["stored"]["scale"] = {"offset": 0, "size": 3}
        with pytest.raises(BundleError) as err:
            Header.from_msgpack(bad, size)
        assert "\n" not in str(err.value) and "stored" in str(err.value)


# ---- tf2onnx-style QDQ: float weights through QuantizeLinear -> DequantizeLinear ----------------

def _tf2onnx_qdq(path: Path) -> Path:
    """What tf2onnx writes for a TF quantization-aware model: FakeQuant nodes become
    QuantizeLinear -> DequantizeLinear pairs on the float weights too (per output channel,
    int8, zero point 0) and on the activations (uint8); the bias stays float."""
    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32)
    ws = (np.abs(w).reshape(16, -1).max(1) / 127).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in {
        "w": w, "ws": ws, "wz": np.zeros(16, np.int8), "b": rng.normal(0, .1, 16).astype(
            np.float32), "xs": np.float32(0.02), "xz": np.uint8(128), "ys": np.float32(0.05),
        "yz": np.uint8(0)}.items()]
    nodes = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             h.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], axis=0),
             h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             h.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "ys", "yz"], ["rq"]),
             h.make_node("DequantizeLinear", ["rq", "ys", "yz"], ["y"])]
    g = h.make_graph(nodes, "tf2onnx", [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 10, 10])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 16, 10, 10])], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def test_tf2onnx_style_qdq_takes_the_integer_kernel(tmp_path: Path) -> None:
    path = _tf2onnx_qdq(tmp_path / "tf2onnx.onnx")
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / "tf2onnx.mlc"
    export_module(mod, bundle, ExportOptions(target="host", check=False))
    x = np.random.default_rng(2).uniform(-2, 2, (1, 8, 10, 10)).astype(np.float32)
    with load(bundle) as model:
        got = model.run({"x": x})["y"]
        kernels = [k.name for k in model.schema.plan.kernels]
    # the integer convolution, alone or with the quantize after it fused in (passes/fuse.py)
    assert any(k.removeprefix("fused_").startswith("qconv2d") for k in kernels), kernels
    ref = ort_outputs(path, {"x": x}, threads=1, as_written=True)["y"]
    steps = np.abs(got - ref) / 0.05
    assert steps.max() <= 1 + 1e-4 and (steps > 0.5).mean() < 0.01
