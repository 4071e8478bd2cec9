"""``packager/api.py``: ``export(model, path, options)`` is what ``mlcpack export`` does, so a
program gets the command's bundle (byte for byte), notes and errors (one line, the command's
exit code, nothing written); the ONNX signature decides the automatic batch-1 plan."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mlcpack
from mlcpack.frontends.onnx.signature import Dim, Signature, TensorSignature, read_signature
from mlcpack.packager import api
from mlcpack.runtime import load
from mlcpack.runtime.errors import MlcpackError


def _classifier(path: Path, batch: str) -> Path:
    """x [batch, 3, 8, 8] -> Conv 3x3 (4) -> Relu -> GlobalAveragePool -> y [batch, 4, 1, 1]."""
    w = numpy_helper.from_array(
        np.random.default_rng(6).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    graph = helper.make_graph(
        nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 1, 1])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _classifier(tmp_path_factory.mktemp("api") / "m.onnx", "N")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_export_writes_the_bundle_the_command_writes(model, tmp_path, run_cli) -> None:
    result = mlcpack.export(model, tmp_path / "api.mlc", target="host")
    proc = run_cli("export", model, "-o", tmp_path / "cli.mlc", "--target", "host")
    assert proc.returncode == 0, proc.stderr
    assert _sha(tmp_path / "api.mlc") == _sha(tmp_path / "cli.mlc")
    # the automatic batch-1 plan beside the symbolic one, checked, as the command prints
    assert [p["batch"] for p in result.plans] == [1] and result.specialized
    assert "plan batch 1:" in proc.stdout and result.check in proc.stdout
    assert result.check.startswith("golden check passed") and result.notes == []
    assert result.import_seconds > 0 and result.path == str(tmp_path / "api.mlc")


def test_a_note_reaches_the_caller_and_the_result(model, tmp_path, monkeypatch) -> None:
    """A batch-1 plan that cannot be made: the symbolic bundle, and why, in a note."""
    from mlcpack.packager import export as export_mod
    from mlcpack.packager.errors import ExportError

    def failing(*args, **kwargs):
        raise ExportError("made to fail")

    monkeypatch.setattr(export_mod, "export_specialized", failing)
    heard: list[str] = []
    result = api.export(model, tmp_path / "m.mlc", api.Options(target="host", check=False),
                        on_note=heard.append)
    assert heard == result.notes and len(heard) == 1
    assert heard[0].startswith("no batch-1 plan (made to fail)")
    assert result.plans == [] and result.check is None
    with load(tmp_path / "m.mlc") as m:
        m.run({"x": np.zeros((2, 3, 8, 8), np.float32)})
        assert m.last_plan == "symbolic"


@pytest.mark.parametrize("options, code, message", [
    (api.Options(check_rtol=-1), 2, "--check-rtol and --check-atol must be >= 0"),
    (api.Options(precision="fp16"), 2, "--precision fp16: choose"),
    (api.Options(precision="bf16", quantize="int8"), 2, "do not combine"),
    (api.Options(quantize="int8"), 2, "--quantize int8 needs --calibration"),
    (api.Options(calibration="data"), 2, "go with --quantize int8"),
    (api.Options(batch_sizes=[0, 2]), 2, "should be positive integers"),
    (api.Options(target="x86-64-v9"), 2, "x86-64-v9"),
    (api.Options(arch="missing.toml"), 7, "missing.toml: no such file"),
    (api.Options(labels=["a", "b"]), 2, "label"),
])
def test_bad_options_are_one_line_errors_and_write_nothing(model, tmp_path, options, code,
                                                           message) -> None:
    out = tmp_path / "m.mlc"
    with pytest.raises(MlcpackError) as info:
        api.export(model, out, options)
    assert info.value.exit_code == code and message in str(info.value)
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_bad_paths(model, tmp_path) -> None:
    for model_path, out, code in ((model, tmp_path / "no" / "m.mlc", 2),
                                  (model, tmp_path, 2),
                                  (tmp_path / "missing.onnx", tmp_path / "m.mlc", 7)):
        with pytest.raises(MlcpackError) as info:
            api.export(model_path, out)
        assert info.value.exit_code == code, str(info.value)
    assert list(tmp_path.iterdir()) == []


def _sig(first: Dim, out_first: Dim) -> Signature:
    rest = (Dim(3), Dim(8), Dim(8))
    return Signature((TensorSignature("x", (first, *rest)),),
                     (TensorSignature("y", (out_first, Dim(4))),))


def test_the_signature_decides_the_batch_1_plan(model, tmp_path) -> None:
    """Read once from the file: the names and shapes of its inputs and outputs."""
    sig = read_signature(model)
    assert sig is not None and sig.inputs[0].dims[0] == Dim(None, "N")
    assert api.only_batch_open(sig, {})
    open_out = Dim(None, "unk__654")
    assert api.only_batch_open(_sig(Dim(None, "unk__653"), open_out), {})
    assert api.only_batch_open(_sig(Dim(None, ""), open_out), {})
    assert not api.only_batch_open(_sig(Dim(None, "T"), open_out), {})   # a time axis
    assert not api.only_batch_open(_sig(Dim(None, "batch"), Dim(1)), {})   # a fixed output
    assert not api.only_batch_open(_sig(Dim(1), open_out), {})             # nothing open
    # --input-shape names the dims: its name is asked, not the file's
    assert api.only_batch_open(_sig(Dim(None, "T"), open_out), {"x": ("N", 3, 8, 8)})
    assert not api.only_batch_open(_sig(Dim(None, "batch"), open_out), {"x": (2, 3, 8, 8)})
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    assert read_signature(tmp_path / "bad.onnx") is None
