"""The ``mlcpack`` command line: export, infer, inspect, and its one-line errors with one exit
code per error class. The successes run the real executable; the error paths and the per-digit
runs run the same command line in this process (tests/cli_in_process.py: no interpreter start
and compiler import per case), and test_one_line_error_per_class.py runs every error class in a
real process."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from mlcpack.frontends.arch import ArchError
from mlcpack.frontends.weights import WeightsError
from mlcpack.packager.export import ExportError
from mlcpack.runtime import load
from mlcpack.runtime.errors import (BundleError, CodeLoadError, CpuFeatureError,
                                    FormatVersionError, InputError, LibraryFunctionError,
                                    MlcpackError)
from cli_in_process import run_cli_in_process

ERROR_CLASSES = [BundleError, FormatVersionError, CpuFeatureError, CodeLoadError, InputError,
                 LibraryFunctionError, WeightsError, ArchError, ExportError]
USAGE = 2


@pytest.fixture(scope="module")
def cli_bundle(tmp_path_factory, run_cli, paths) -> Path:
    """The demo MLP exported by the CLI itself, with labels."""
    folder = tmp_path_factory.mktemp("cli")
    out = folder / "mlp.mlc"
    proc = run_cli("export", paths["mlp_pickle"], "--labels", paths["labels"], "-o", out,
                   cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out}") and "2 kernels" in proc.stdout
    assert proc.stderr == ""
    return out


def test_exit_codes_are_distinct_per_class() -> None:
    codes = [cls.exit_code for cls in ERROR_CLASSES]
    assert len(set(codes)) == len(codes), codes
    assert all(c not in (0, 1, USAGE, 70) for c in codes)
    assert all(issubclass(cls, MlcpackError) for cls in ERROR_CLASSES)


@pytest.mark.parametrize("digit", range(10))
def test_infer_every_sample_png(cli_bundle, paths, digit) -> None:
    png = paths["samples"] / f"digit_{digit}.png"
    proc = run_cli_in_process("infer", cli_bundle, png)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"digit_{digit}.png: {digit}"
    assert len(lines) == 1 + 5  # top-5 by default
    assert lines[1].split()[:2] == ["1.", str(digit)]


def test_infer_json(cli_bundle, run_cli, paths, mlp_weights, reference_mlp) -> None:
    proc = run_cli("infer", "--json", "--top-k", "3", cli_bundle, paths["samples"] / "digit_7.png")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) >= {"outputs", "top_k"}
    logits = np.asarray(result["outputs"]["logits"], dtype=np.float32)
    assert logits.shape == (1, 10)
    top = result["top_k"]
    assert [t["index"] for t in top] == list(np.argsort(-logits[0])[:3])
    assert top[0]["label"] == "7" and top[0]["index"] == 7
    assert top[0]["score"] == pytest.approx(float(logits[0, 7]))
    assert 0.5 < top[0]["probability"] <= 1
    assert sum(t["probability"] for t in top) <= 1 + 1e-6


def test_infer_npy_matches_the_reference(cli_bundle, run_cli, paths, mlp_weights,
                                         reference_mlp) -> None:
    npy = paths["samples"] / "digit_3.npy"
    proc = run_cli("infer", "--json", cli_bundle, npy)
    assert proc.returncode == 0, proc.stderr
    logits = np.asarray(json.loads(proc.stdout)["outputs"]["logits"])
    np.testing.assert_allclose(logits, reference_mlp(mlp_weights, np.load(npy)), rtol=1e-5,
                               atol=1e-5)
    proc = run_cli("infer", cli_bundle, npy, "-k", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "digit_3.npy: 3"
    assert len(proc.stdout.splitlines()) == 2


def test_inspect(cli_bundle, run_cli) -> None:
    proc = run_cli("inspect", cli_bundle)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for words in ("bundle format 1.2", "input: x [1, 784] float32", "output: logits [1, 10]",
                  "target: ", "-linux-gnu level ", "kernels: 2", "fused_matmul", "weights: 4 tensors", "397.5 KiB",
                  "memory plan: arena", "vm: 2 instructions", "labels: 10", "selected"):
        assert words in out, (words, out)

    proc = run_cli("inspect", "--json", cli_bundle)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["format"] == "1.2" and info["runs_here"] is True
    assert info["inputs"][0]["shape"] == [1, 784]
    assert info["weights"] == {"count": 4, "bytes": 4 * (128 * 784 + 128 + 10 * 128 + 10)}
    assert info["vm_instructions"] == 2 and len(info["kernels"]) == 2
    assert info["memory_plan"]["arena_bytes"] > 0


def test_inspect_ir(cli_bundle, run_cli) -> None:
    proc = run_cli("inspect", "--ir", cli_bundle)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "@function" in out and "def main(" in out
    assert "call_tir" in out and "@prim_func" in out
    assert out.count("@prim_func") == 2


def test_export_twice_to_the_same_path(tmp_path, paths) -> None:
    out = tmp_path / "again.mlc"
    first = run_cli_in_process("export", paths["mlp_pickle"], "-o", out, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    data = out.read_bytes()
    second = run_cli_in_process("export", paths["mlp_pickle"], "-o", out, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert out.read_bytes() == data  # deterministic, and replaced in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.mlc"]
    with load(out) as model:
        assert model.inputs[0].shape == (1, 784)


def test_export_default_output_name(tmp_path, run_cli, paths) -> None:
    shutil.copy(paths["mlp_pickle"], tmp_path / "digits.pkl")
    proc = run_cli("export", "digits.pkl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "digits.mlc").is_file()


# ---- errors ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def odd_input_bundle(tmp_path_factory, export_weights) -> Path:
    """An MLP over 10 features: no image maps to that input."""
    rng = np.random.default_rng(5)
    weights = {"w0": rng.standard_normal((4, 10)).astype(np.float32),
               "b0": np.zeros(4, np.float32)}
    return export_weights(weights, tmp_path_factory.mktemp("odd") / "odd.mlc")


def _check(proc, cls_or_code, one_line_error, *words: str) -> str:
    line = one_line_error(proc)
    code = cls_or_code if isinstance(cls_or_code, int) else cls_or_code.exit_code
    assert proc.returncode == code, (proc.returncode, code, line)
    for w in words:
        assert w in line, (w, line)
    assert proc.stdout == ""
    return line


def test_infer_errors(tmp_path, cli_bundle, odd_input_bundle, paths,
                      one_line_error) -> None:
    def infer(*args):
        return run_cli_in_process("infer", *args)

    png = paths["samples"] / "digit_7.png"
    _check(infer(tmp_path / "missing.mlc", png), BundleError, one_line_error,
           "missing.mlc", "no such file")
    _check(infer(tmp_path, png), BundleError, one_line_error, "directory")
    text = tmp_path / "notes.mlc"
    text.write_text("hello, this is not a bundle at all\n" * 3)
    _check(infer(text, png), BundleError, one_line_error, "not an mlcpack bundle")

    corrupt = tmp_path / "corrupt.mlc"
    data = bytearray(cli_bundle.read_bytes())
    data[-100] ^= 1
    corrupt.write_bytes(data)
    _check(infer(corrupt, png), BundleError, one_line_error, "SHA-256")

    newer = tmp_path / "newer.mlc"
    data = cli_bundle.read_bytes()
    version = b"\xa6format\x92\x01\x02"
    assert data.count(version) == 1
    newer.write_bytes(data.replace(version, b"\xa6format\x92\x02\x00"))
    _check(infer(newer, png), FormatVersionError, one_line_error, "2.0", "upgrade")

    wrong_shape = tmp_path / "wrong.npy"
    np.save(wrong_shape, np.zeros((1, 783), np.float32))
    _check(infer(cli_bundle, wrong_shape), InputError, one_line_error, "(1, 783)",
           "(1, 784)")
    wrong_dtype = tmp_path / "wrong_dtype.npy"
    np.save(wrong_dtype, np.zeros((1, 784), np.float64))
    _check(infer(cli_bundle, wrong_dtype), InputError, one_line_error, "float64",
           "float32")
    not_npy = tmp_path / "bad.npy"
    not_npy.write_text("nope")
    _check(infer(cli_bundle, not_npy), InputError, one_line_error, "bad.npy")

    fake_png = tmp_path / "x.png"
    fake_png.write_text("this is not a PNG\n")
    _check(infer(cli_bundle, fake_png), InputError, one_line_error, "x.png",
           "not a readable image")
    _check(infer(cli_bundle, tmp_path / "nope.png"), InputError, one_line_error,
           "nope.png")
    _check(infer(odd_input_bundle, png), InputError, one_line_error, "(1, 10)",
           ".npy")
    _check(infer(cli_bundle, png, png), InputError, one_line_error, "1 input")


def test_infer_missing_library_function(tmp_path, paths, one_line_error) -> None:
    from mlcpack.packager.export import export_module
    from mlcpack.packager.ir.builder import BlockBuilder
    from mlcpack.packager.ir.graph import TensorType

    bb = BlockBuilder()
    x = bb.input("x", (1, 784))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.call_library("myapp.swish", [x], TensorType((1, 784), "float32"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    path = tmp_path / "lib.mlc"
    export_module(bb.get(), path)
    _check(run_cli_in_process("infer", path, paths["samples"] / "digit_7.npy"),
           LibraryFunctionError, one_line_error, "myapp.swish")


def test_export_errors(tmp_path, one_line_error) -> None:
    def export(*args):
        return run_cli_in_process("export", *args, cwd=tmp_path)

    line = _check(export("missing.pkl"), InputError, one_line_error, "missing.pkl")
    assert "no such file" in line
    (tmp_path / "folder.pkl").mkdir()
    _check(export("folder.pkl"), InputError, one_line_error, "directory")
    (tmp_path / "model.xyz").write_bytes(b"\0" * 16)
    _check(export("model.xyz"), USAGE, one_line_error, "unknown model type", ".xyz")
    (tmp_path / "notes.pkl").write_text("plain text\n")
    _check(export("notes.pkl", "-o", "m.mlc"), WeightsError, one_line_error, "notes.pkl")
    weights = {"w0": np.zeros((4, 6), np.float32), "w1": np.zeros((2, 5), np.float32)}
    (tmp_path / "nochain.pkl").write_bytes(pickle.dumps(weights))
    _check(export("nochain.pkl", "-o", "m.mlc"), ArchError, one_line_error, "w1")
    (tmp_path / "ok.pkl").write_bytes(pickle.dumps({"w0": np.zeros((4, 6), np.float32)}))
    _check(export("ok.pkl", "--input-shape", "x=1;6"), USAGE, one_line_error,
           "--input-shape")
    _check(export("ok.pkl", "--target", "pentium4", "-o", "m.mlc"), USAGE,
           one_line_error, "pentium4")
    _check(export("ok.pkl", "-o", tmp_path / "no" / "dir" / "m.mlc"), USAGE,
           one_line_error, "does not exist")
    assert not (tmp_path / "m.mlc").exists()
    assert not list(tmp_path.glob(".mlcpack-*"))


def test_export_text_file_named_onnx(tmp_path, one_line_error) -> None:
    onnx_frontend = pytest.importorskip("mlcpack.frontends.onnx")
    if not hasattr(onnx_frontend, "import_onnx"):
        pytest.skip("the ONNX frontend (frontends/onnx) is not there yet")
    (tmp_path / "model.onnx").write_text("not really an onnx model\n")
    proc = run_cli_in_process("export", "model.onnx", "-o", "m.mlc", cwd=tmp_path)
    line = _check(proc, ExportError, one_line_error, "model.onnx")
    assert "internal error" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
