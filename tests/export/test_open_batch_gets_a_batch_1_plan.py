"""The default export of an ONNX model whose only open sizes are its batch (most files from the
wild: open-nsfw's ``unk__653``, PP-LCNet's ``DynamicDimension.0``) adds a static plan at batch
1 beside the symbolic plan, as ``--batch-sizes 1`` would: batch 1 runs kernels with every
extent known at export, any other batch the symbolic plan. The golden check runs both plans.
A named time or sequence axis is not taken for a batch."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from mlcpack.runtime import load


def _classifier(batch: str, out_batch: str | int | None = None) -> onnx.ModelProto:
    """x [batch, 3, 8, 8] -> Conv 3x3 (4) -> Relu -> GlobalAveragePool -> y [batch, 4, 1, 1]."""
    w = numpy_helper.from_array(
        np.random.default_rng(6).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    graph = helper.make_graph(
        nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                       [batch if out_batch is None else out_batch, 4, 1, 1])],
        [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("batch", ["batch", "unk__653", "DynamicDimension.0"])
def test_open_batch_gets_a_static_batch_1_plan(tmp_path, run_cli, batch) -> None:
    model = _classifier(batch, "unk__654" if batch == "unk__653" else None)
    onnx.save(model, tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc")
    assert proc.returncode == 0, proc.stderr
    assert "plan batch 1:" in proc.stdout and "golden check passed" in proc.stdout, proc.stdout
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    with load(tmp_path / "m.mlc") as m:
        for n, plan in ((1, "batch 1"), (3, "symbolic"), (1, "batch 1")):
            x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
            got = m.run({"x": x})["y"]
            assert plan in str(m.last_plan), (n, m.last_plan)
            np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5,
                                       atol=1e-6)


def test_a_time_axis_or_a_fixed_output_is_not_a_batch(tmp_path, run_cli) -> None:
    for name, model in (("time", _classifier("T")), ("fixed_out", _classifier("N", 1))):
        onnx.save(model, tmp_path / f"{name}.onnx")
        proc = run_cli("export", tmp_path / f"{name}.onnx", "-o", tmp_path / f"{name}.mlc")
        assert proc.returncode == 0, proc.stderr
        assert "plan batch" not in proc.stdout, (name, proc.stdout)


def test_the_golden_check_runs_the_batch_1_plan_too(tmp_path, monkeypatch) -> None:
    """The check runs the symbolic plan at its sizes (every size variable at 2) and, on the
    first row of the same pair, the static batch-1 plan (runtime/selftest.check_model); then,
    the bundle having parallel kernels, both again on 2 threads."""
    from mlcpack.packager.cli import app
    from mlcpack.runtime.model import Model

    onnx.save(_classifier("N"), tmp_path / "m.onnx")
    seen = []
    original = Model.run

    def recording(self, feeds, *args, **kwargs):
        out = original(self, feeds, *args, **kwargs)
        seen.append((feeds["x"].shape[0], self.last_plan))
        return out

    monkeypatch.setattr(Model, "run", recording)
    result = CliRunner().invoke(app, ["export", str(tmp_path / "m.onnx"), "-o",
                                      str(tmp_path / "m.mlc")])
    assert result.exit_code == 0, result.output
    assert seen == [(2, "symbolic"), (1, "batch 1")] * 2, seen


def test_a_failed_batch_1_plan_falls_back_to_the_symbolic_bundle(tmp_path, monkeypatch) -> None:
    """Whatever stops the batch-1 plan (here: made to fail), the default export still writes
    the symbolic bundle, as without the plan, and says why in a note."""
    from mlcpack.packager import export as export_mod
    from mlcpack.packager.cli import app
    from mlcpack.packager.errors import ExportError

    def failing(*args, **kwargs):
        raise ExportError("made to fail")

    monkeypatch.setattr(export_mod, "export_specialized", failing)
    onnx.save(_classifier("N"), tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["export", str(tmp_path / "m.onnx"), "-o",
                                      str(tmp_path / "m.mlc")])
    assert result.exit_code == 0, result.output
    assert "note: no batch-1 plan (made to fail)" in result.output
    assert "golden check passed" in result.output and "plan batch" not in result.output
    x = np.random.default_rng(8).standard_normal((1, 3, 8, 8)).astype(np.float32)
    with load(tmp_path / "m.mlc") as m:
        m.run({"x": x})
        assert m.last_plan == "symbolic"
