"""The command line a new user meets (issue 14): batched inputs give one result per row (or one
line of refusal), exit codes follow the README table with the cheap checks first, and the
polish (--version, -h, completion, examples, validated options, inspect/bench JSON). The
successes run the real ``mlcpack`` executable in a subprocess; the refusals run the same command
line in this process (tests/cli_in_process.py; test_one_line_error_per_class.py runs every error
class in a real process)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from cli_in_process import run_cli_in_process
from conftest import mlp_reference

USAGE, BAD_INPUT, NO_GOLDEN = 2, 7, 14
LABELS = [str(i) for i in range(10)]


def _ok(proc) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def _refused(proc, code: int, *words: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def digits(paths) -> dict[str, np.ndarray]:
    """The sample PNGs as the bundles' recorded preprocessing reads them (grey, 1/255)."""
    from PIL import Image

    def read(d: str) -> np.ndarray:
        with Image.open(paths["samples"] / f"digit_{d}.png") as img:
            return np.asarray(img.convert("L"), np.float32).reshape(784) / np.float32(255)

    return {d: read(d) for d in "0123456789"}


@pytest.fixture(scope="module")
def batched(tmp_path_factory, run_cli, paths) -> dict[str, Path]:
    """Dynamic-batch bundles from the CLI: the MLP (N, 784) and the CNN (N, 1, 28, 28)."""
    folder = tmp_path_factory.mktemp("batched")
    out = {"mlp": folder / "mlp_b.mlc", "cnn": folder / "cnn_b.mlc"}
    _ok(run_cli("export", paths["mlp_pickle"], "-o", out["mlp"], "--labels", paths["labels"],
                "--batch-sizes", "1,8", timeout=300))
    _ok(run_cli("export", paths["artifacts"] / "cnn.onnx", "-o", out["cnn"], "--labels",
                paths["labels"], "--input-shape", "x=N,1,28,28", "--batch-sizes", "1,8",
                timeout=300))
    return out


def _save(folder: Path, name: str, array: np.ndarray) -> Path:
    path = folder / name
    np.save(path, np.ascontiguousarray(array, dtype=np.float32))
    return path


# ---- 1. batched inputs: one result per row, or one line of refusal ------------------------------

def test_mlp_batch_rank2_prints_one_block_per_row(batched, run_cli, digits, mlp_weights,
                                                  tmp_path) -> None:
    rows = np.stack([digits["7"], digits["3"], digits["0"]])
    x = _save(tmp_path, "three.npy", rows)
    text = _ok(run_cli("infer", batched["mlp"], x, "-k", "2"))
    heads = re.findall(r"^three\.npy\[(\d)\]: (\S+)$", text, re.M)
    assert heads == [("0", "7"), ("1", "3"), ("2", "0")], text
    ref = mlp_reference(mlp_weights, rows)
    scores = [float(v) for v in re.findall(r"score\s+(-?\d+\.\d+)", text)]
    want = [ref[r][i] for r in range(3) for i in np.argsort(-ref[r])[:2]]
    np.testing.assert_allclose(scores, want, atol=1e-3)
    assert not re.search(r": 1\d\b", text)  # never a label past the 10 classes

    doc = json.loads(_ok(run_cli("infer", batched["mlp"], x, "--json", "-k", "3")))
    assert doc["batch"] == 3 and "top_k" not in doc and len(doc["rows"]) == 3
    for r, top in enumerate(doc["rows"]):
        assert [t["index"] for t in top] == list(np.argsort(-ref[r])[:3])
        np.testing.assert_allclose([t["score"] for t in top], np.sort(ref[r])[::-1][:3],
                                   atol=1e-3)
        probs = np.exp(ref[r] - ref[r].max())
        np.testing.assert_allclose(top[0]["probability"], probs.max() / probs.sum(), rtol=1e-4)
    np.testing.assert_allclose(doc["outputs"]["logits"], ref, atol=1e-3)


def test_mlp_batch_of_one_row(batched, run_cli, digits, tmp_path) -> None:
    x = _save(tmp_path, "one.npy", digits["4"][None])
    doc = json.loads(_ok(run_cli("infer", batched["mlp"], x, "--json")))
    assert doc["batch"] == 1 and len(doc["rows"]) == 1 and doc["rows"][0][0]["label"] == "4"


@pytest.mark.parametrize("shape", [(784,), (2, 1, 784), (1, 2, 1, 784)])
def test_mlp_batch_other_ranks_are_refused(batched, tmp_path, shape) -> None:
    x = _save(tmp_path, "x.npy", np.zeros(shape))
    _refused(run_cli_in_process("infer", batched["mlp"], x), BAD_INPUT, "(N, 784)")


def test_cnn_batch_rank4_prints_one_block_per_row(batched, run_cli, digits, tmp_path) -> None:
    rows = np.stack([digits[d] for d in "72"]).reshape(2, 1, 28, 28)
    x = _save(tmp_path, "two.npy", rows)
    doc = json.loads(_ok(run_cli("infer", batched["cnn"], x, "--json", "-k", "1")))
    assert [top[0]["label"] for top in doc["rows"]] == ["7", "2"]
    # each row as its own batch-of-one call gives the same scores
    for r, d in enumerate("72"):
        one = _save(tmp_path, f"one{d}.npy", rows[r:r + 1])
        alone = json.loads(_ok(run_cli("infer", batched["cnn"], one, "--json")))
        np.testing.assert_allclose(next(iter(doc["outputs"].values()))[r],
                                   next(iter(alone["outputs"].values()))[0], atol=1e-5)
    text = _ok(run_cli("infer", batched["cnn"], x, "-k", "1"))
    assert re.findall(r"^two\.npy\[(\d)\]: (\S+)$", text, re.M) == [("0", "7"), ("1", "2")]


@pytest.mark.parametrize("shape", [(28, 28), (1, 28, 28), (1, 1, 1, 28, 28), (2, 3, 28, 28)])
def test_cnn_batch_other_ranks_and_shapes_are_refused(batched, tmp_path, shape) -> None:
    x = _save(tmp_path, "x.npy", np.zeros(shape))
    _refused(run_cli_in_process("infer", batched["cnn"], x), BAD_INPUT, "(N, 1, 28, 28)")


def test_cnn_batch_bundle_takes_an_image(batched, run_cli, paths) -> None:
    text = _ok(run_cli("infer", batched["cnn"], paths["samples"] / "digit_9.png", "-k", "1"))
    assert text.startswith("digit_9.png: 9\n"), text  # one image is never a batch


def test_fixed_batch_one_bundle_refuses_two_rows(mlp_bundle, digits, tmp_path) -> None:
    x = _save(tmp_path, "two.npy", np.stack([digits["7"], digits["3"]]))
    _refused(run_cli_in_process("infer", mlp_bundle[0], x), BAD_INPUT, "(2, 784)",
             "(1, 784)", "export with --batch-sizes")


# ---- 4. exit codes, cheapest checks first -------------------------------------------------------

@pytest.fixture(scope="module")
def evil(tmp_path_factory) -> Path:
    """A pickle that would be refused (exit 9) once read: an earlier check must answer first."""
    path = tmp_path_factory.mktemp("evil") / "evil.pkl"
    path.write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    return path


def test_export_exit_codes_follow_the_table(tmp_path, evil, paths) -> None:
    def export(*args):
        return run_cli_in_process("export", *args, cwd=tmp_path)

    _refused(export("missing.pkl"), BAD_INPUT, "missing.pkl", "no such file")
    _refused(export(tmp_path), BAD_INPUT, "is a directory")
    _refused(export(paths["mlp_pickle"], "--target", "pentium4"), USAGE, "pentium4",
             "x86-64-v3")
    _refused(export(paths["mlp_pickle"], "--target", "x86-64-v3,"), USAGE, "empty entry")
    _refused(export(paths["mlp_pickle"], "--arch", "nope.toml"), BAD_INPUT, "nope.toml")
    _refused(export(paths["mlp_pickle"], "-o", tmp_path), USAGE, "is a directory")
    # the weights file would be refused (9) when read: the cheap checks answer before that
    _refused(export(evil, "-o", tmp_path / "no" / "dir" / "m.mlc"), USAGE, "does not exist")
    _refused(export(evil, "-o", "m.mlc", "--target", "pentium4"), USAGE, "pentium4")
    _refused(export(evil, "-o", "m.mlc", "--check-input", "x=nope.npy"), BAD_INPUT, "nope.npy")
    _refused(export("missing.pkl", "-o", tmp_path / "no" / "m.mlc"), USAGE, "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_infer_checks_inputs_before_loading(tmp_path, paths) -> None:
    # the bundle is missing too: the missing input is reported first (7, not 3)
    _refused(run_cli_in_process("infer", tmp_path / "missing.mlc", tmp_path / "nope.png"),
             BAD_INPUT, "nope.png")
    _refused(run_cli_in_process("infer", tmp_path / "missing.mlc",
                                paths["samples"] / "digit_1.png"), 3, "missing.mlc")


# ---- 5. polish ------------------------------------------------------------------------------------

def test_version(run_cli) -> None:
    assert re.fullmatch(r"mlcpack \d+\.\d+\.\d+\S*\n", _ok(run_cli("--version")))


@pytest.mark.parametrize("command", ["export", "infer", "inspect", "verify", "bench", "keygen"])
def test_short_help_with_an_example(run_cli, command) -> None:
    text = _ok(run_cli(command, "-h"))
    assert f"Example: mlcpack {command} " in text
    if command in ("infer", "inspect", "verify", "bench"):
        assert "<list[" not in text.split("Options:")[1]  # option values are named


def test_top_level_help(run_cli) -> None:
    text = _ok(run_cli("-h"))
    assert "--install-completion" in text and "--version" in text
    for command in ("export", "infer", "inspect", "verify", "bench", "keygen"):
        assert command in text


def test_completion_installs_and_completes(run_cli, tmp_path) -> None:
    proc = run_cli("--install-completion", "bash", env={"HOME": str(tmp_path),
                                                        "SHELL": "/bin/bash"})
    _ok(proc)
    script = (tmp_path / ".bash_completions" / "mlcpack.sh").read_text()
    assert "_MLCPACK_COMPLETE=complete_bash" in script
    assert "mlcpack.sh" in (tmp_path / ".bashrc").read_text()
    env = {"_MLCPACK_COMPLETE": "complete_bash", "COMP_WORDS": "mlcpack inf", "COMP_CWORD": "1"}
    assert run_cli(env=env).stdout.split() == ["infer"]
    env = {"_MLCPACK_COMPLETE": "complete_bash", "COMP_WORDS": "mlcpack bench m.mlc --ru",
           "COMP_CWORD": "3"}
    assert run_cli(env=env).stdout.split() == ["--runs"]


@pytest.mark.parametrize("args,flag", [
    (["infer", "{b}", "{x}", "-k", "0"], "-k/--top-k must be >= 1, got 0"),
    (["infer", "{b}", "{x}", "-k", "-2"], "-k/--top-k must be >= 1, got -2"),
    (["infer", "{b}", "{x}", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["bench", "{b}", "--runs", "-3"], "--runs must be >= 1, got -3"),
    (["bench", "{b}", "--runs", "0"], "--runs must be >= 1, got 0"),
    (["bench", "{b}", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["bench", "{b}", "--budget", "-1"], "--budget must be >= 0, got -1"),
    (["verify", "{b}", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["verify", "{b}", "--atol", "-1"], "--atol must be >= 0, got -1"),
])
def test_option_values_are_validated(mlp_bundle, paths, args, flag) -> None:
    fill = {"{b}": str(mlp_bundle[0]), "{x}": str(paths["samples"] / "digit_7.npy")}
    proc = run_cli_in_process(*[fill.get(a, a) for a in args])
    assert _refused(proc, USAGE) == f"error: {flag}"
    assert proc.stdout == ""


def test_k_larger_than_the_classes_prints_them_all(run_cli, mlp_bundle, paths) -> None:
    text = _ok(run_cli("infer", mlp_bundle[0], paths["samples"] / "digit_7.npy", "-k", "50"))
    assert len(re.findall(r"^\s+\d+\. ", text, re.M)) == 10


def test_inspect_json_lists_the_labels(run_cli, mlp_bundle, paths) -> None:
    info = json.loads(_ok(run_cli("inspect", mlp_bundle[0], "--json")))
    assert info["labels"] == paths["labels"].read_text().split()
    assert "labels: 10 (0, 1, 2" in _ok(run_cli("inspect", mlp_bundle[0]))


def test_inspect_ir_json(run_cli, mlp_bundle) -> None:
    text = _ok(run_cli("inspect", mlp_bundle[0], "--ir"))
    doc = json.loads(_ok(run_cli("inspect", mlp_bundle[0], "--ir", "--json")))
    assert doc["file"] == str(mlp_bundle[0])
    assert doc["ir"].rstrip("\n") == text.rstrip("\n") and "main" in doc["ir"]


def test_bench_percentiles_and_json(run_cli, mlp_bundle) -> None:
    doc = json.loads(_ok(run_cli("bench", mlp_bundle[0], "--runs", "40", "--json")))
    assert doc["runs"] == 40 and doc["threads"] == 1
    assert 0 < doc["min_us"] <= doc["p50_us"] <= doc["p90_us"] <= doc["p99_us"]
    assert doc["load_ms"] > 0 and doc["first_ms"] > 0
    text = _ok(run_cli("bench", mlp_bundle[0], "--runs", "7", "--threads", "2"))
    assert re.search(r"p50 [\d.]+ us, p90 [\d.]+ us, p99 [\d.]+ us, min [\d.]+ us \(7 runs, "
                     r"2 threads\)", text), text


def test_bench_budget_bounds_the_runs(run_cli, mlp_bundle) -> None:
    doc = json.loads(_ok(run_cli("bench", mlp_bundle[0], "--budget", "0", "--json")))
    assert doc["runs"] == 5  # the minimum when the budget is spent at once
    doc = json.loads(_ok(run_cli("bench", mlp_bundle[0], "--budget", "0.3", "--json")))
    assert doc["runs"] > 5


def test_verify_without_golden_data(export_weights, mlp_weights, tmp_path) -> None:
    bundle = export_weights(mlp_weights, tmp_path / "plain.mlc")
    _refused(run_cli_in_process("verify", bundle), NO_GOLDEN)


def test_non_finite_output_is_flagged(run_cli, mlp_bundle, tmp_path) -> None:
    x = _save(tmp_path, "nan.npy", np.full((1, 784), np.nan))
    proc = run_cli("infer", mlp_bundle[0], x)
    assert proc.returncode == 0
    assert proc.stderr.startswith("warning: output 'logits' has 10 non-finite value(s)")
    assert os.linesep not in proc.stderr.rstrip()


def test_export_help_names_its_values_not_python_types():
    """Every export option shows what to write (NAME=DIMS, L|RGB, ...), never `<list[str]>`."""
    from typer.testing import CliRunner

    from mlcpack.packager.cli import app

    result = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "NAME=DIMS" in result.output and "L|RGB" in result.output
    assert "list[" not in result.output and "<str>" not in result.output and "<float>" not in result.output


def test_one_image_is_never_a_batch(batched, mlp_bundle, paths, tmp_path) -> None:
    """The same image through a fixed-shape bundle and a dynamic-batch one: the same text, the
    same JSON keys (top_k, no batch), and .npz results of the same shape."""
    from mlcpack.runtime import commands

    image = paths["samples"] / "digit_9.png"

    def infer(bundle, **kw):
        lines = []
        commands.infer(bundle, [image], echo=lines.append, warn=lambda _t: None, **kw)
        return "\n".join(lines)

    texts = [infer(b, top_k=2) for b in (mlp_bundle[0], batched["mlp"])]
    assert texts[0] == texts[1] and texts[0].startswith("digit_9.png: 9\n"), texts
    assert infer(batched["cnn"], top_k=1).startswith("digit_9.png: 9\n")
    docs = [json.loads(infer(b, as_json=True)) for b in (mlp_bundle[0], batched["mlp"])]
    for doc in docs:
        assert doc["batch"] is None and len(doc["rows"]) == 1 and doc["top_k"] == doc["rows"][0]
    assert docs[0]["top_k"][0]["label"] == docs[1]["top_k"][0]["label"] == "9"
    shapes = []
    for b in (mlp_bundle[0], batched["mlp"]):
        out = tmp_path / f"{b.stem}.npz"
        commands.infer(b, [paths["samples"] / "digit_9.png", paths["samples"] / "digit_7.png"],
                       output=out, echo=lambda _t: None, warn=lambda _t: None)
        shapes.append(np.load(out)["logits"].shape)
    assert shapes == [(2, 10), (2, 10)], shapes
