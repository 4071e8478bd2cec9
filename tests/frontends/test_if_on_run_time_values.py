"""Shapes of models from the wild (silero-vad's pattern): an ``If`` on a run-time input (the
sample rate) whose branches only work for some sizes, and reflect padding of a run-time length.

- ``--bind NAME=FILE.npy`` of the condition's input inlines one branch, and the golden check
  feeds the bound value to the reference (the ONNX file still takes it): checked, not skipped.
- Without it, a branch that cannot be compiled is one line naming the condition's input and the
  option that fixes it.
- Reflect padding of a symbolic length is a relation checked at run time, not a refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.runtime import load
from mlcpack.runtime.errors import InputError


def _vad_like(path: Path, length: int | str, broken_else: bool = False) -> Path:
    """x [1, 4, L], sr int64 scalar: Pad(x, reflect 3 both sides) -> If(sr == 16000) then
    * 2 else * 3 (or, broken, a MatMul whose inner sizes disagree) -> y [1, 4, L + 6]."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["p", "two"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    if broken_else:
        else_nodes = [helper.make_node("MatMul", ["p", "w5"], ["e"])]
    else:
        else_nodes = [helper.make_node("Mul", ["p", "three"], ["e"])]
    else_g = helper.make_graph(else_nodes, "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        helper.make_node("Equal", ["sr", "sixteen"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    inits = [numpy_helper.from_array(np.array([0, 0, 3, 0, 0, 3], np.int64), "pads"),
             numpy_helper.from_array(np.array(16000, np.int64), "sixteen"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three"),
             numpy_helper.from_array(np.ones((5, 2), np.float32), "w5")]
    graph = helper.make_graph(
        nodes, "vad_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, length]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)
    return path


@pytest.mark.parametrize("rate", [16000, 8000])
def test_bound_condition_input_is_checked_against_onnxruntime(tmp_path, run_cli, rate) -> None:
    model = _vad_like(tmp_path / "m.onnx", "L")
    np.save(tmp_path / "sr.npy", np.array(rate, np.int64))
    bundle = tmp_path / "m.mlc"
    proc = run_cli("export", model, "-o", bundle, "--bind", f"sr={tmp_path / 'sr.npy'}")
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed against onnxruntime" in proc.stdout, proc.stdout
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(rate)
    with load(bundle) as m:
        assert [i.name for i in m.inputs] == ["x"]
        for length in (4, 9, 40):
            x = rng.standard_normal((1, 4, length)).astype(np.float32)
            want = session.run(None, {"x": x, "sr": np.array(rate, np.int64)})[0]
            got = m.run({"x": x})["y"]
            assert got.shape == (1, 4, length + 6)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        # reflect padding needs more samples than the pad: a one-line error at run time
        with pytest.raises(InputError, match="x"):
            m.run({"x": np.zeros((1, 4, 3), np.float32)})


def test_branch_that_cannot_compile_names_the_condition_input(tmp_path, run_cli,
                                                              one_line_error) -> None:
    # ONNX Runtime loads it (L is open there); at L = 8 the else branch's MatMul cannot be built
    model = _vad_like(tmp_path / "m.onnx", "L", broken_else=True)
    line = one_line_error(run_cli("export", model, "-o", tmp_path / "m.mlc", "--input-shape",
                                  "x=1,4,8"))
    assert "If's condition is known only at run time" in line, line
    assert "depends on input 'sr'" in line and "--bind" in line, line
    assert not (tmp_path / "m.mlc").exists()
    # binding the rate to the branch that works exports it, checked against ORT
    np.save(tmp_path / "sr.npy", np.array(16000, np.int64))
    proc = run_cli("export", model, "-o", tmp_path / "m.mlc", "--input-shape", "x=1,4,8",
                   "--bind", f"sr={tmp_path / 'sr.npy'}")
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed against onnxruntime" in proc.stdout, proc.stdout


def test_branch_extents_that_cannot_be_ordered_are_refused_in_one_line() -> None:
    """Branches of different shapes bind the output's extents at run time (issue 37 item 3;
    run in tests/export/test_data_dependent_shapes.py and the C runtime test); memory is
    planned at the larger extent, so extents of which neither is always the larger (L and 8)
    are refused at import, naming the axis and the condition's input."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.errors import ExportError

    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", f, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["eight"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", f, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "ifs",
        [helper.make_tensor_value_info("x", f, [1, "L"]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(np.zeros((1, 8), np.float32), "eight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ExportError, match=r"output 0 axis 1: the branches give L and 8, which "
                       r"cannot be ordered at export.*depends on input 'c'"):
        import_onnx(model)
