"""Export checks every preprocessing and label option against the model's input and output
shapes before any compile work (issue 14, item 2): one line naming the option and what it
allows, exit 2. At infer time an image the recorded preprocessing must resize or convert gets a
note (``--strict``: exit 7), and non-finite outputs are flagged, never ranked as if fine. The
refusals run the command line in this process (tests/cli_in_process.py), the rest the real
executable."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from cli_in_process import run_cli_in_process

from mlcpack.runtime.model import TensorSpec
from mlcpack.runtime.preprocess import (PreprocessError, check_labels, check_preprocess,
                                        normalize_preprocess)

USAGE, BAD_INPUT = 2, 7


def _refused(proc, code: int, *words: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize("model, args, words", [
    ("cnn.onnx", ["--color", "XYZ"], ["--color 'XYZ'", "allowed: L, RGB"]),
    ("cnn.onnx", ["--color", "RGBA"], ["--color 'RGBA'", "allowed: L, RGB"]),
    ("cnn.onnx", ["--color", "RGB"], ["--color RGB", "has 1", "allowed --color L"]),
    ("cnn.onnx", ["--layout", "NWHC"], ["--layout 'NWHC'", "allowed: NCHW, NHWC, flat"]),
    ("cnn.onnx", ["--layout", "NHWC"], ["--layout NHWC", "then --layout NCHW"]),
    ("cnn.onnx", ["--input-size", "32x32"], ["--input-size 32x32", "allowed --input-size 28x28"]),
    ("cnn.onnx", ["--labels", "a,b,c"], ["--labels has 3", "10 classes", "exactly 10"]),
    ("cnn.onnx", ["--mean", "0.1,0.2"], ["--mean has 2 values", "give 1"]),
    ("cnn.onnx", ["--std", "0"], ["--std", "has a 0"]),
    ("cnn.onnx", ["--input-size", "ax2"], ["--input-size 'ax2'", "224x224"]),
    ("mlp_params.pkl", ["--input-size", "32x32"], ["--input-size 32x32", "1024 values",
                                                   "784 per row"]),
    ("mlp_params.pkl", ["--layout", "NCHW"], ["--layout NCHW needs a rank-4 input",
                                              "allowed layout for it: flat"]),
    ("mlp_params.pkl", ["--labels", "a,b"], ["--labels has 2", "exactly 10"]),
])
def test_option_that_does_not_fit_is_refused_before_compiling(paths, tmp_path, model, args,
                                                              words) -> None:
    out = tmp_path / "m.mlc"
    t0 = time.perf_counter()
    proc = run_cli_in_process("export", paths["artifacts"] / model, "-o", out, "--target",
                              "host", *args)
    _refused(proc, USAGE, *words)
    assert not out.exists()
    assert time.perf_counter() - t0 < 30  # no compile, no golden check ran


def test_missing_labels_file_is_a_missing_input(paths, tmp_path) -> None:
    proc = run_cli_in_process("export", paths["artifacts"] / "cnn.onnx", "-o",
                              tmp_path / "m.mlc", "--labels", tmp_path / "nope.txt")
    _refused(proc, BAD_INPUT, "nope.txt: no such file", "--labels")


def test_fitting_options_are_recorded_canonically(run_cli, paths, tmp_path) -> None:
    out = tmp_path / "m.mlc"
    proc = run_cli("export", paths["artifacts"] / "cnn.onnx", "-o", out, "--target", "host",
                   "--no-check", "--color", "l", "--layout", "nchw", "--input-size", "28x28",
                   "--mean", "0.5", "--std", "0.25", "--labels", paths["labels"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(run_cli("inspect", out, "--json").stdout)
    pre = info["preprocess"]
    assert (pre["color"], pre["layout"], pre["size"], pre["mean"], pre["std"]) == \
        ("L", "NCHW", [28, 28], [0.5], [0.25])


def test_checks_as_functions() -> None:
    nchw = TensorSpec("x", (1, 3, 224, 224), "float32", 0)
    nhwc = TensorSpec("x", (1, 224, 224, 3), "float32", 0)
    pre = normalize_preprocess({"size": [224, 224], "color": "rgb", "layout": "nhwc",
                                "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]})
    check_preprocess(pre, nhwc)
    with pytest.raises(PreprocessError, match="then --layout NHWC"):
        check_preprocess({**pre, "layout": "NCHW"}, nhwc)
    check_preprocess({**pre, "layout": "NCHW"}, nchw)
    with pytest.raises(PreprocessError, match="--input-size 200x224 does not fit"):
        check_preprocess({**pre, "layout": "NCHW", "size": [200, 224]}, nchw)
    check_labels(["a", "b"], TensorSpec("y", (2,), "float32", 0))
    check_labels([str(i) for i in range(1000)], TensorSpec("y", (1, 1000), "float32", 0))
    with pytest.raises(PreprocessError, match="has 1000 classes"):
        check_labels(["a"], TensorSpec("y", (1, 1000), "float32", 0))


# ---- infer: images that do not match, non-finite outputs -------------------------------------------

@pytest.fixture(scope="module")
def cnn_bundle(tmp_path_factory, run_cli, paths):
    out = tmp_path_factory.mktemp("cnn") / "cnn.mlc"
    proc = run_cli("export", paths["artifacts"] / "cnn.onnx", "-o", out, "--target", "host",
                   "--labels", paths["labels"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_image_of_another_size_and_colour_gets_a_note(cnn_bundle, run_cli, tmp_path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    photo = tmp_path / "photo.png"
    Image.fromarray((rng.random((48, 64, 3)) * 255).astype(np.uint8)).save(photo)
    proc = run_cli("infer", cnn_bundle, photo, "-k", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "note: photo.png was resized from 64x48 to 28x28 (WxH) and converted from colour (RGB) "
        "to greyscale (L), as the bundle's recorded preprocessing says"]
    _refused(run_cli("infer", cnn_bundle, photo, "--strict"), BAD_INPUT, "photo.png is 64x48",
             "not 28x28", "--strict refuses")
    grey = tmp_path / "grey.png"
    Image.fromarray((rng.random((28, 28)) * 255).astype(np.uint8)).save(grey)
    proc = run_cli("infer", cnn_bundle, grey, "--strict")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_non_finite_output_is_flagged_not_ranked(cnn_bundle, run_cli, tmp_path) -> None:
    x = tmp_path / "nan.npy"
    np.save(x, np.full((1, 1, 28, 28), np.nan, np.float32))
    proc = run_cli("infer", cnn_bundle, x, "-k", "2")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == "nan.npy: no result (its scores are not finite)"
    assert "10 non-finite value(s)" in proc.stderr
    doc = json.loads(run_cli("infer", cnn_bundle, x, "--json").stdout)
    assert doc["non_finite"] == 10
    ok = tmp_path / "zeros.npy"
    np.save(ok, np.zeros((1, 1, 28, 28), np.float32))
    assert json.loads(run_cli("infer", cnn_bundle, ok, "--json").stdout)["non_finite"] == 0
