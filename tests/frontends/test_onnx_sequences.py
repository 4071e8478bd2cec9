"""ONNX sequences inside a graph (issue 37): SequenceConstruct / Insert / Erase / At / Length,
ConcatFromSequence and SplitToSequence are converted at import (``frontends/onnx/sequences.py``:
a sequence of a length known at export is a list of IR values, stacked into one tensor where a
position arrives at run time), so the bundle holds only tensors. Checked against ONNX Runtime
with the positions fed at run time, as users export such models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.errors import ExportError
from mlcpack.packager.export import export_module
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model() -> onnx.ModelProto:
    """seq = [x, y, z] ([2, 3] each); insert w at ``pos``; erase at ``gone``; outputs: the
    element at ``at``, the stack along a new axis 1, the length; and a split of ``v`` [6, 4]
    into rows 1, 2, 3 concatenated back in reverse with its last row-piece of a split into
    single rows (keepdims 0)."""
    nodes = [
        helper.make_node("SequenceConstruct", ["x", "y", "z"], ["s1"]),
        helper.make_node("SequenceInsert", ["s1", "w", "pos"], ["s2"]),
        helper.make_node("SequenceErase", ["s2", "gone"], ["s3"]),
        helper.make_node("SequenceAt", ["s3", "at"], ["picked"]),
        helper.make_node("ConcatFromSequence", ["s3"], ["stacked"], axis=1, new_axis=1),
        helper.make_node("SequenceLength", ["s3"], ["length"]),
        helper.make_node("SplitToSequence", ["v", "sizes"], ["parts"], axis=0),
        helper.make_node("SequenceAt", ["parts", "minus_one"], ["last_part"]),
        helper.make_node("SequenceAt", ["parts", "zero"], ["first_part"]),
        helper.make_node("Concat", ["last_part", "first_part"], ["ends"], axis=0),
        helper.make_node("SplitToSequence", ["v"], ["rows"], axis=1, keepdims=0),
        helper.make_node("SequenceAt", ["rows", "at_row"], ["row"]),
        helper.make_node("ConcatFromSequence", ["rows"], ["rejoined"], axis=0)]
    inputs = [helper.make_tensor_value_info(n, F, [2, 3]) for n in ("x", "y", "z", "w")]
    inputs += [helper.make_tensor_value_info(n, I64, []) for n in ("pos", "gone", "at", "at_row")]
    inputs.append(helper.make_tensor_value_info("v", F, [6, 4]))
    outputs = [helper.make_tensor_value_info(n, F, None)
               for n in ("picked", "stacked", "ends", "row", "rejoined")]
    outputs.append(helper.make_tensor_value_info("length", I64, None))
    graph = helper.make_graph(nodes, "sequences", inputs, outputs, [
        numpy_helper.from_array(np.array([1, 2, 3], np.int64), "sizes"),
        numpy_helper.from_array(np.array(-1, np.int64), "minus_one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_sequences_with_run_time_positions_match_onnx_runtime(tmp_path) -> None:
    """Positions fed at run time, negative ones included, at the ends and in the middle: the
    element picked, the stack, the length and the splits are ONNX Runtime's."""
    model = _model()
    mod, info = import_onnx(model)
    export_module(mod, tmp_path / "seq.mlc")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    names = [o.name for o in model.graph.output]
    with load(tmp_path / "seq.mlc") as bundle:
        for pos, gone, at, at_row in ((0, 0, 0, 0), (3, -1, -1, 3), (-2, 2, 1, -4),
                                      (1, -4, 2, 1), (-3, 3, -3, 2)):
            feeds = {n: rng.standard_normal((2, 3)).astype(np.float32) for n in "xyzw"}
            feeds.update({"pos": np.array(pos, np.int64), "gone": np.array(gone, np.int64),
                          "at": np.array(at, np.int64), "at_row": np.array(at_row, np.int64),
                          "v": rng.standard_normal((6, 4)).astype(np.float32)})
            got = bundle.run(feeds)
            for name, ref in zip(names, session.run(None, feeds)):
                assert got[name].shape == ref.shape, (name, pos, gone, at)
                np.testing.assert_array_equal(got[name], ref, err_msg=f"{name} {pos} {gone}")


def test_a_sequence_graph_output_is_refused_in_one_line() -> None:
    """A bundle's outputs are tensors: a sequence-typed graph output is refused at import,
    naming it."""
    graph = helper.make_graph(
        [helper.make_node("SplitToSequence", ["v"], ["parts"], axis=0)], "seq_out",
        [helper.make_tensor_value_info("v", F, [4, 2])],
        [helper.make_value_info("parts", helper.make_sequence_type_proto(
            helper.make_tensor_type_proto(F, None)))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ExportError) as info:
        import_onnx(model)
    text = str(info.value)
    assert "\n" not in text and "'parts' is a sequence" in text, text


def _list_loop(new_axis: int, axis: int, trips: int | None = None) -> onnx.ModelProto:
    """``outs = []; for i in range(M) while sum(h) < lim: h = tanh(h); outs.append(2 h)``, then
    ``ConcatFromSequence(outs, axis, new_axis)`` (torch.stack: new_axis 1, axis 0): M fed, or
    the constant ``trips``."""
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
    body = helper.make_graph(
        [helper.make_node("Tanh", ["h_in"], ["h_out"]),
         helper.make_node("Mul", ["h_out", "two"], ["el"]),
         helper.make_node("SequenceInsert", ["s_in", "el"], ["s_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "lim"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, [2, 3]), helper.make_value_info("s_in", seq)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", F, [2, 3]), helper.make_value_info("s_out", seq)],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    inputs = [helper.make_tensor_value_info("h0", F, [2, 3]),
              helper.make_tensor_value_info("lim", F, [])]
    consts = []
    if trips is None:
        inputs.insert(0, helper.make_tensor_value_info("M", I64, []))
    else:
        consts.append(numpy_helper.from_array(np.array(trips, np.int64), "M"))
    graph = helper.make_graph(
        [helper.make_node("SequenceEmpty", [], ["s0"], dtype=F),
         helper.make_node("Loop", ["M", "", "h0", "s0"], ["h", "s"], body=body),
         helper.make_node("ConcatFromSequence", ["s"], ["out"], axis=axis, new_axis=new_axis)],
        "list_loop", inputs,
        [helper.make_tensor_value_info("h", F, None), helper.make_tensor_value_info("out", F, None)],
        consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("new_axis, axis, trips", [(1, 0, None), (0, 1, 4)])
def test_a_list_a_loop_appends_to_matches_onnx_runtime(tmp_path, new_axis, axis, trips) -> None:
    """A Loop carrying a sequence it starts empty and appends one element to each iteration
    (torch.jit.script's ``outs.append(x)``): with a fed trip count its elements are a scan
    output the VM appends (format 1.9's row store), returned stacked (torch.stack); with a
    constant one and a condition computed at run time, planned rows any node may read
    (torch.cat along axis 1). ONNX Runtime's values at several trip counts and a break."""
    model = _list_loop(new_axis, axis, trips)
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "list.mlc")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(tmp_path / "list.mlc") as bundle:
        for m, lim in ((1, 1e9), (3, 1e9), (7, 1e9), (7, 0.0)):
            feeds = {"h0": np.random.default_rng(m).standard_normal((2, 3)).astype(np.float32),
                     "lim": np.array(lim, np.float32)}
            if trips is None:
                feeds["M"] = np.array(m, np.int64)
            got = bundle.run(feeds)
            for name, ref in zip(["h", "out"], session.run(None, feeds)):
                assert got[name].shape == ref.shape, (name, m, lim)
                np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6, err_msg=name)


def test_a_loop_sequence_the_body_reads_is_refused_in_one_line() -> None:
    """A body that reads its carried sequence (its length) instead of only appending: refused
    at import in one line, not run with a wrong length."""
    model = _list_loop(1, 0)
    body = model.graph.node[1].attribute[0].g
    body.node.append(helper.make_node("SequenceLength", ["s_in"], ["n_in"]))
    body.output.append(helper.make_tensor_value_info("n_in", I64, []))
    model.graph.node[1].output.append("lens")
    with pytest.raises(ExportError) as info:
        import_onnx(model)
    text = str(info.value)
    assert "\n" not in text and "may only be appended to" in text, text


def test_an_if_giving_a_sequence_at_run_time_is_refused_in_one_line() -> None:
    """An If on a run-time condition whose branches give sequences: refused in one line (a
    condition known at export inlines its branch, sequences included)."""
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], [name])],
                                 name, [], [helper.make_value_info(name, seq)])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["s"], then_branch=branch("a"), else_branch=branch("b")),
         helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], "if_seq",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ExportError) as info:
        import_onnx(model)
    text = str(info.value)
    assert "\n" not in text and "a branch gives a sequence" in text, text
