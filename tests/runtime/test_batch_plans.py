"""Dynamic batch: one bundle, one plan (memory plan, bytecode, kernels) per batch size, the
weights stored once, checked against onnxruntime and the numpy reference.

An ONNX model through the CLI (``--batch-sizes``) gets the symbolic plan with static plans for
those batches beside it (picked when the shapes match exactly; the symbolic plan runs any other
batch). Modules given to ``export_batched`` (and pickled weights) get the older padded form:
any batch from 1 up runs, padded to the next plan, or in chunks of the largest."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
from cli_in_process import run_cli_in_process
from conftest import ARTIFACTS
from mlcpack.runtime import load
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime.bundle import SYMBOLIC_MINOR, BundleReader
from mlcpack.runtime.errors import BundleError, InputError

import fuzzing
from bundle_parts import read_parts, write_parts

SIZES = (1, 8, 32)


@pytest.fixture(scope="module")
def cnn_batched(tmp_path_factory, run_cli):
    """The demo CNN (declared batch 1) exported with x=N and plans for 1, 8, 32 beside the
    symbolic plan (CLI, with the golden check), and the same model exported once with batch 1."""
    folder = tmp_path_factory.mktemp("dynbatch")
    path, single = folder / "cnn_b.mlc", folder / "cnn_1.mlc"
    proc = run_cli("export", ARTIFACTS / "cnn.onnx", "-o", path, "--input-shape", "x=N,1,28,28",
                   "--batch-sizes", "32,1,8", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "plan batch 8:" in proc.stdout and "golden check passed" in proc.stdout
    proc = run_cli("export", ARTIFACTS / "cnn.onnx", "-o", single, "--no-check", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return path, single


@pytest.fixture(scope="module")
def mlp_batched(tmp_path_factory, mlp_weights):
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.packager.export import export_batched

    spec = infer_mlp_spec(mlp_weights)
    mods = {b: build_from_spec(spec, mlp_weights, (b, 784)) for b in (1, 4)}
    path = tmp_path_factory.mktemp("dynmlp") / "mlp_b.mlc"
    report = export_batched(mods, path)
    assert [p["batch"] for p in report.plans] == [1, 4]
    return path


def _ort_rows(x: np.ndarray) -> np.ndarray:
    """onnxruntime on the CNN (declared batch 1), one row at a time."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(ARTIFACTS / "cnn.onnx"), providers=["CPUExecutionProvider"])
    name = sess.get_outputs()[0].name
    return np.concatenate([sess.run([name], {"x": x[i:i + 1]})[0] for i in range(len(x))])


@pytest.mark.parametrize("n", [1, 3, 8, 9, 32, 33, 70])
def test_cnn_any_batch_matches_onnxruntime(cnn_batched, n) -> None:
    path, _ = cnn_batched
    x = np.random.default_rng(n).standard_normal((n, 1, 28, 28)).astype(np.float32)
    with load(path) as model:
        assert model.batch.sizes == SIZES and model.specialized_batches == SIZES
        y = model(x)
        assert model.last_plan == (f"batch {n}" if n in SIZES else "symbolic")
    assert y.shape == (n, 10)
    np.testing.assert_allclose(y, _ort_rows(x), rtol=1e-4, atol=1e-5)


def test_every_batch_gives_each_row_its_own_answer(cnn_batched) -> None:
    """Row i of any batch equals the batch-1 bundle on row i alone."""
    path, single = cnn_batched
    x = np.random.default_rng(5).standard_normal((41, 1, 28, 28)).astype(np.float32)
    with load(path) as model, load(single) as one:
        rows = np.concatenate([one(x[i:i + 1]) for i in range(len(x))])
        for n in (3, 41):
            np.testing.assert_allclose(model(x[:n]), rows[:n], rtol=1e-5, atol=1e-6)


def test_mlp_batches_match_numpy(mlp_batched, mlp_weights, reference_mlp) -> None:
    with load(mlp_batched) as model:
        assert model.inputs[0].shape == (1, 784) and model.batch.sizes == (1, 4)
        for n in (1, 2, 4, 5, 11):
            x = np.random.default_rng(n).random((n, 784), dtype=np.float32)
            np.testing.assert_allclose(model(x), reference_mlp(mlp_weights, x), rtol=1e-4,
                                       atol=1e-4)


def test_bad_batches_are_input_errors(mlp_batched) -> None:
    with load(mlp_batched) as model:
        with pytest.raises(InputError, match=r"batch of 0; the model takes \(N, 784\)"):
            model(np.zeros((0, 784), np.float32))
        with pytest.raises(InputError, match=r"shape \(2, 783\); the model takes \(N, 784\)"):
            model(np.zeros((2, 783), np.float32))
        with pytest.raises(InputError, match=r"shape \(784,\); the model takes \(N, 784\)"):
            model(np.zeros(784, np.float32))
        with pytest.raises(InputError, match="dtype float64"):
            model(np.zeros((2, 784)))
        y = model(np.ones((3, 784), np.float32))  # the model still works afterwards
        assert y.shape == (3, 10)


def test_weights_are_stored_once_and_plans_recorded(cnn_batched) -> None:
    path, single = cnn_batched
    with BundleReader(path) as r, BundleReader(single) as s:
        h, h1 = r.header, s.header
    assert len(h["constants"]) == len(h1["constants"])
    assert [p["batch"] for p in h["specialized"]] == list(SIZES)
    assert [p["inputs"][0]["shape"] for p in h["specialized"]] == [[b, 1, 28, 28] for b in SIZES]
    # the header's own fields are the symbolic plan (what a 1.3 reader runs for every batch)
    assert h["inputs"][0]["shape"] == ["N", 1, 28, 28] and h["symbolic"]["vars"] == ["N"]
    assert h["format"] == [bundle_format.FORMAT_MAJOR, SYMBOLIC_MINOR]
    assert "plans" not in h and "batch" not in h and "specialized" not in h1


def test_a_reader_without_specialized_plans_runs_the_symbolic_plan(cnn_batched, tmp_path
                                                                    ) -> None:
    """What a runtime that does not know ``specialized`` sees: the symbolic bundle, right
    answers at every batch."""
    path, _ = cnn_batched
    header, payloads = read_parts(path)
    header.pop("specialized")
    old = write_parts(tmp_path / "symbolic_only.mlc", header, payloads)
    x = np.random.default_rng(9).standard_normal((32, 1, 28, 28)).astype(np.float32)
    with load(old) as model, load(path) as new:
        assert model.batch is None and model.specialized_batches == ()
        for n in (32, 3):
            np.testing.assert_allclose(model(x[:n]), new(x[:n]), rtol=1e-5, atol=1e-6)
        assert model.last_plan == "symbolic"


def test_a_format_1_0_reader_runs_the_largest_plan(mlp_batched, tmp_path) -> None:
    """What a runtime that ignores plans sees in a padded dynamic-batch bundle: a fixed batch-4
    model, right answers."""
    header, payloads = read_parts(mlp_batched)
    assert header["format"] == [bundle_format.FORMAT_MAJOR, bundle_format.FORMAT_MINOR]
    assert header["min_reader"] == [1, 0] and header["vm"] == header["plans"][-1]["vm"]
    for key in ("plans", "batch"):
        header.pop(key)
    old = write_parts(tmp_path / "as_1_0.mlc", header, payloads)
    x = np.random.default_rng(9).random((4, 784), dtype=np.float32)
    with load(old) as model, load(mlp_batched) as new:
        assert model.batch is None and model.inputs[0].shape == (4, 784)
        np.testing.assert_array_equal(model(x), new(x))
        with pytest.raises(InputError, match="takes"):
            model(x[:3])


def test_inspect_shows_the_plans(cnn_batched, mlp_batched, run_cli) -> None:
    path, single = cnn_batched
    proc = run_cli("inspect", path)
    assert proc.returncode == 0, proc.stderr
    assert "specialized plans: batch 1, 8, 32" in proc.stdout
    assert sum(line.startswith("  batch ") for line in proc.stdout.splitlines()) == 3
    info = json.loads(run_cli("inspect", "--json", path).stdout)
    assert [p["batch"] for p in info["specialized"]] == list(SIZES) and info["plans"] is None
    assert all(p["arena_bytes"] > 0 and p["kernels"] > 0 and p["object_bytes"] > 0
               for p in info["specialized"])
    assert info["specialized"][0]["arena_bytes"] < info["specialized"][-1]["arena_bytes"]
    assert json.loads(run_cli("inspect", "--json", single).stdout)["plans"] is None
    proc = run_cli("inspect", mlp_batched)   # the padded form
    assert "batch plans: 1, 4" in proc.stdout
    assert [p["batch"] for p in json.loads(run_cli("inspect", "--json", mlp_batched).stdout)
            ["plans"]] == [1, 4]


def test_cli_batch_errors(tmp_path, one_line_error) -> None:
    out = tmp_path / "m.mlc"
    proc = run_cli_in_process("export", ARTIFACTS / "cnn.onnx", "-o", out, "--batch-sizes",
                              "0,4")
    assert proc.returncode == 2 and "--batch-sizes" in one_line_error(proc)
    # a named batch without --batch-sizes stays symbolic: one bundle, any batch
    proc = run_cli_in_process("export", ARTIFACTS / "cnn.onnx", "-o", out, "--input-shape",
                              "x=N,1,28,28")
    assert proc.returncode == 0, proc.stderr
    with load(out) as m:
        x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
        np.testing.assert_allclose(m.run({"x": x})[m.outputs[0].name][1:2],
                                   m.run({"x": x[1:2]})[m.outputs[0].name], rtol=1e-5,
                                   atol=1e-6)
    out.unlink()
    proc = run_cli_in_process("export", ARTIFACTS / "cnn.onnx", "-o", out, "--batch-sizes",
                              "1,4")
    assert proc.returncode == 11 and "no input of cnn.onnx has a symbolic first" \
        in one_line_error(proc)
    assert not out.exists()


def test_an_output_that_does_not_grow_with_the_batch_is_refused(tmp_path) -> None:
    from mlcpack.packager.export import ExportError, export_batched
    from mlcpack.packager.ir.builder import BlockBuilder

    def build(b):
        bb = BlockBuilder()
        x = bb.input("x", (b, 4), "float32")
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(bb.emit_op("mean", x, axes=(0,), keepdims=True))
            bb.emit_func_output([out], names=["y"])
        return bb.get()

    with pytest.raises(ExportError, match="'y'.*do not grow with the batch"):
        export_batched({1: build(1), 4: build(4)}, tmp_path / "m.mlc")
    assert not (tmp_path / "m.mlc").exists()


def test_malformed_plans_are_bundle_errors(mlp_batched, tmp_path) -> None:
    header, payloads = read_parts(mlp_batched)
    cases = []
    for edit in ("sizes", "order", "shape", "missing_batch", "plans_type"):
        h = copy.deepcopy(header)
        if edit == "sizes":
            h["batch"]["sizes"] = [1, 5]
        elif edit == "order":
            h["plans"] = h["plans"][::-1]
        elif edit == "shape":
            h["plans"][0]["inputs"][0]["shape"] = [2, 784]
        elif edit == "missing_batch":
            del h["batch"]
        else:
            h["plans"] = {"a": 1}
        cases.append(write_parts(tmp_path / f"{edit}.mlc", h, payloads))
    for path in cases:
        with pytest.raises(BundleError) as info:
            load(path).close()
        assert "\n" not in str(info.value)


def test_fuzzed_batched_bundle_refuses_or_runs_right(mlp_batched, tmp_path) -> None:
    """The fuzz property (tests/fuzzing.py) on a dynamic-batch bundle: 600 seeded mutations."""
    seed = fuzzing.make_seed(mlp_batched)
    scratch = tmp_path / "case.mlc"
    rng = random.Random(7)
    paths = fuzzing.header_paths(seed.header)
    assert any(p[:1] == ("plans",) for p in paths)
    plan_paths = [p for p in paths if p[:1] in (("plans",), ("batch",))]
    outcomes = set()
    for i in range(600):
        if i % 3 == 0:
            case = fuzzing.random_byte_case(seed, rng)
        else:
            case = fuzzing.random_header_case(seed, rng, plan_paths if i % 3 == 1 else paths)
        if case is not None:
            outcomes.add(fuzzing.check(seed, case, scratch))
    assert "BundleError" in outcomes and "loaded" in outcomes


def test_narrow_dtype_inputs_are_copied_bit_for_bit(tmp_path) -> None:
    """bfloat16 and float8 inputs of a dynamic-batch bundle, fed as their storage bits or as
    ml_dtypes arrays, reach the kernels bit for bit (padded plan and chunks alike)."""
    import ml_dtypes
    from mlcpack.packager.export import export_batched
    from mlcpack.packager.ir import BlockBuilder

    def module(b: int):
        bb = BlockBuilder()
        x, f = bb.input("x", (b, 3), "bfloat16"), bb.input("f", (b, 4), "float8_e4m3fn")
        with bb.function("main", [x, f]):
            with bb.dataflow():
                outs = [bb.emit_output(bb.emit_op("cast", x, dtype="float32")),
                        bb.emit_output(bb.emit_op("cast", f, dtype="float32")),
                        bb.emit_output(bb.emit_op("add", x, x))]
            bb.emit_func_output(outs, names=["xf", "ff", "x2"])
        return bb.get()

    path = tmp_path / "narrow.mlc"
    export_batched({1: module(1), 4: module(4)}, path)
    rng = np.random.default_rng(12)
    with load(path) as model:
        assert model.batch.sizes == (1, 4)
        for n in (3, 6):
            x = rng.standard_normal((n, 3)).astype(ml_dtypes.bfloat16)
            f = rng.standard_normal((n, 4)).astype(ml_dtypes.float8_e4m3fn)
            want = {"xf": x.astype(np.float32), "ff": f.astype(np.float32),
                    "x2": (x.astype(np.float32) * 2).astype(ml_dtypes.bfloat16).view(np.uint16)}
            for feeds in ({"x": x, "f": f}, {"x": x.view(np.uint16), "f": f.view(np.uint8)}):
                got = model.run(feeds)
                for name, ref in want.items():
                    assert got[name].dtype == ref.dtype
                    np.testing.assert_array_equal(got[name], ref)
        with pytest.raises(InputError, match="bfloat16, fed as uint16 bits"):
            model.run({"x": x.astype(np.float32), "f": f})
        with pytest.raises(InputError, match="float8_e4m3fn, fed as uint8 bits"):
            model.run({"x": x, "f": f.view(np.int8)})
