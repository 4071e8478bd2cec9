"""A Split or Slice of a leading-contiguous range (channels at batch 1) is a view into the
sliced tensor's buffer: no kernel for it in a static plan (passes/slice_views.py), its tensor
row at an offset into the buffer. At batch > 1, in a symbolic plan, or over an input's bytes it
stays a kernel. The buffer stays alive while its views are read: later kernels that write
tensors of its size (which could otherwise take its memory) cannot change what a view reads.
ONNX Runtime is the oracle."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.api import Options, export
from mlcpack.packager.ir.graph import Call
from mlcpack.packager.passes.slice_views import slices_as_views
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.header import Header


def _model(batch) -> onnx.ModelProto:
    """c = Conv(x) [b, 8, 6, 6]; Split(c) into 2/3/3 channels, Slice(c) channels 4..8; tensors
    of c's size written after c's last kernel read (two Convs, x still alive: the planner's
    candidates for c's memory were c dead) before the views are read last."""
    rng = np.random.default_rng(35)
    w = numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w2")
    split = numpy_helper.from_array(np.array([2, 3, 3], np.int64), "split")
    st, en, ax = (numpy_helper.from_array(np.array([v], np.int64), n)
                  for v, n in ((4, "st"), (8, "en"), (1, "ax")))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Split", ["c", "split"], ["a", "b", "d"], axis=1, name="split"),
        helper.make_node("Slice", ["c", "st", "en", "ax"], ["s"], name="slice"),
        helper.make_node("Neg", ["c"], ["n1"]),
        helper.make_node("Mul", ["n1", "x"], ["n2"]),
        helper.make_node("Relu", ["n2"], ["n3"]),
        helper.make_node("Conv", ["n3", "w"], ["p"], name="conv_p"),
        helper.make_node("Conv", ["p", "w"], ["q"], name="conv_q"),
        helper.make_node("Conv", ["q", "w"], ["q2"], name="conv_q2"),
        helper.make_node("Conv", ["q2", "w"], ["q3"], name="conv_q3"),
        helper.make_node("Add", ["q3", "x"], ["r"]),
        helper.make_node("Conv", ["b", "w2"], ["g"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["d"], ["d1"]),
        helper.make_node("Concat", ["r", "g", "d1", "a"], ["y"], axis=1),
        helper.make_node("Tanh", ["s"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes, "splits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 17, 6, 6]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 4, 6, 6])],
        [w, w2, split, st, en, ax])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _plans(path) -> list:
    with BundleReader(path) as reader:
        h = Header.from_msgpack(reader.header, reader.data_size, reader.name)
    return list(h.plans) + list(h.specialized or ())


def _slicing_kernels(plan) -> list[str]:
    return [k.name for k in plan.kernels
            if any(s.get("op") in ("Split", "Slice") for s in (k.source or ()))]


def _check(path, onnx_path, batches) -> None:
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    with load(path) as m:
        for n in batches:
            x = rng.standard_normal((n, 8, 6, 6)).astype(np.float32)
            got = m.run({"x": x})
            want = session.run(None, {"x": x})
            for name, ref in zip(("y", "z"), want):
                np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{name} at batch {n}")


def test_channel_splits_at_batch_1_are_views(tmp_path) -> None:
    onnx.save(_model(1), tmp_path / "m.onnx")
    export(tmp_path / "m.onnx", tmp_path / "m.mlc", Options(cache=False, check=False))
    (plan,) = _plans(tmp_path / "m.mlc")
    assert plan.symbolic is None
    assert _slicing_kernels(plan) == [], [k.source for k in plan.kernels]
    arena = [t for t in plan.tensors if t.kind == 0]
    # the views: rows at c's offset plus 2, 5 and 4 planes of 6x6 floats
    c_rows = [t for t in arena if tuple(t.shape) == (1, 8, 6, 6)]
    offsets = {t.ref for t in arena}
    assert any({r.ref + 288, r.ref + 720, r.ref + 576} <= offsets for r in c_rows)
    _check(tmp_path / "m.mlc", tmp_path / "m.onnx", [1, 1])


def test_open_batch_views_in_the_batch_1_plan_kernels_elsewhere(tmp_path) -> None:
    onnx.save(_model("N"), tmp_path / "m.onnx")
    export(tmp_path / "m.onnx", tmp_path / "m.mlc", Options(cache=False, check=False))
    plans = _plans(tmp_path / "m.mlc")
    static = [p for p in plans if p.symbolic is None]
    symbolic = [p for p in plans if p.symbolic is not None]
    assert static and symbolic
    assert all(_slicing_kernels(p) == [] for p in static)
    assert all(_slicing_kernels(p) for p in symbolic)
    _check(tmp_path / "m.mlc", tmp_path / "m.onnx", [1, 3, 1])


def _views(model: onnx.ModelProto) -> list[dict]:
    mod, _ = import_onnx(model)
    return [b.value.attrs for b in slices_as_views(mod).functions["main"].bindings()
            if isinstance(b.value, Call) and b.value.op == "slice_view"]


def test_only_leading_contiguous_slices_of_kernel_outputs_become_views() -> None:
    assert [v["offset"] for v in _views(_model(1))] == [0, 72, 180, 144]
    assert _views(_model(2)) == []   # batch 2: each channel range is two runs
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "st", "en", "ax"], ["h"]),    # rows 1..3 of H
             helper.make_node("Slice", ["x", "c0", "c1", "c2"], ["i"]),    # channels of x
             helper.make_node("Slice", ["r", "c1", "c3", "c2"], ["j"])]    # channels of r
    nodes += [helper.make_node("Relu", [n], [n + "r"]) for n in "hij"]
    inits = [numpy_helper.from_array(np.array([v], np.int64), n) for v, n in
             ((1, "st"), (3, "en"), (2, "ax"), (0, "c0"), (4, "c1"), (1, "c2"), (8, "c3"))]
    graph = helper.make_graph(nodes, "g", [x], [
        helper.make_tensor_value_info(n + "r", TensorProto.FLOAT, shape)
        for n, shape in (("h", [1, 8, 2, 6]), ("i", [1, 4, 6, 6]), ("j", [1, 4, 6, 6]))], inits)
    only_j = _views(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert only_j == [{"shape": (1, 4, 6, 6), "offset": 144}], only_j
