"""Quantization at export (packager/calibrate.py, ``mlcpack export --quantize int8
--calibration DATA``): the QDQ model it builds, layers left in float, the report against the
float model, the demo CNN calibrated on its sample digits through the command line, and a
one-line error for each bad option."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

import quant_models as qm
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.calibrate import entropy_threshold, quantize_onnx, read_calibration
from mlcpack.runtime import load
from mlcpack.runtime.errors import UsageError
from mlcpack.runtime.model import TensorSpec

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "artifacts" / "samples"


@pytest.fixture(scope="module")
def conv_net(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    path = qm.conv_net(tmp_path_factory.mktemp("float") / "conv_net.onnx")
    return path, [f["x"] for f in qm.random_feeds(path, seed=5, n=8)]


def _export_and_run(model: onnx.ModelProto, feeds: dict, tmp_path: Path) -> dict:
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "q.mlc", ExportOptions(target="host"))
    with load(tmp_path / "q.mlc") as bundle:
        return bundle.run(feeds)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_qdq_model_close_to_float(method: str, conv_net, tmp_path: Path) -> None:
    path, samples = conv_net
    # entropy clips the tails of these normal activations, which the per-layer estimate
    # counts as error (one layer above 5 %): every layer int8 here, to check their accuracy
    limit = 1.0 if method == "entropy" else 0.05
    q = quantize_onnx(path, samples, method=method, max_layer_error=limit)
    try:
        ops = [n.op_type for n in q.model.graph.node]
        # x, the Gemm's input, and the 8-bit chain (calibrate._chain_plan): conv 1's output
        # (its Relu folded), conv 2's, the residual Add's and the MaxPool's (the convs read
        # those). Entropy's clipped ranges make the chained model miss the guard's 20 dB
        # (19.5), so the guard drops the chain first: x, the two conv inputs, the Gemm's
        assert q.report.chain == (method != "entropy"), q.report.guard
        if q.report.chain:
            assert ops.count("QuantizeLinear") == 6 and "Relu" not in ops, ops
        else:
            assert ops.count("QuantizeLinear") == 4 and "Relu" in ops, ops
        weights = {t.name: t.data_type for t in q.model.graph.initializer}
        assert sum(1 for n, t in weights.items() if n.endswith("_q") and t == onnx.TensorProto.INT8) == 4
        assert all(layer.quantized for layer in q.report.layers)
        x = qm.random_feeds(path, seed=9)[0]["x"]       # not a calibration sample
        with load(q.float_bundle) as fmodel:
            ref = fmodel.run({"x": x})["y"]
        got = _export_and_run(q.model, {"x": x}, tmp_path)["y"]
        snr = 10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2))
        assert snr > 30, snr
        assert got.argmax() == ref.argmax()
    finally:
        q.close()


def test_outlier_layer_left_in_float(conv_net) -> None:
    # one calibration sample with a spike: min/max stretches the input's range, so the first
    # conv's input error is large and it stays float (the spike reaches later layers too)
    path, samples = conv_net
    spiked = [s.copy() for s in samples]
    spiked[0][0, 0, 3, 3] = 5000.0
    q = quantize_onnx(path, spiked, method="minmax", max_layer_error=0.05)  # the gate's
    try:                                    # default where the accuracy guard cannot run
        first = q.report.layers[0]
        assert not first.quantized and first.error > 0.05
        assert all(layer.quantized == (layer.error <= 0.05) for layer in q.report.layers)
        assert "left in float: Conv" in "\n".join(q.report.summary())
        conv = next(n for n in q.model.graph.node if n.op_type == "Conv")
        assert conv.input[0] == "x"     # its input is not quantized in the QDQ model
    finally:
        q.close()


def test_no_quantize_guard_keeps_every_layer_int8(conv_net, tmp_path: Path) -> None:
    # --no-quantize-guard: the spiked sample's first conv, which the per-layer gate (and the
    # guard, by its outputs' accuracy) may keep float, is int8 with the rest, and the report
    # says the guard is off; the speed line times the float model without the calibration's
    # taps (compare: export_int8's plain bundle)
    from mlcpack.packager.api import Options, export

    path, samples = conv_net
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, s in enumerate(samples):
        s = s.copy()
        if i == 0:
            s[0, 0, 3, 3] = 5000.0
        np.save(folder / f"{i}.npy", s)
    report = export(path, tmp_path / "q.mlc", Options(
        target="host", check=False, quantize="int8", calibration=folder,
        calibration_method="minmax", quantize_guard=False, quantize_fallback=True))
    text = "\n".join(report.quantization)
    assert "quantized int8: 4 of 4 layers" in text, text
    assert "accuracy guard: off (--no-quantize-guard)" in text, text
    assert "speed (1 thread" in text


def test_error_threshold_splits_layers(conv_net) -> None:
    path, samples = conv_net
    errors = sorted(layer.error
                    for layer in quantize_onnx(path, samples, method="minmax").report.layers)
    limit = (errors[1] + errors[2]) / 2
    q = quantize_onnx(path, samples, method="minmax", max_layer_error=limit)
    try:
        kept = [layer for layer in q.report.layers if layer.quantized]
        assert len(kept) == 2
        quantized_inputs = {layer.activation for layer in kept}
        ops = [n.op_type for n in q.model.graph.node]
        assert ops.count("QuantizeLinear") == len(quantized_inputs)
    finally:
        q.close()


def test_read_calibration_forms(tmp_path: Path) -> None:
    spec = TensorSpec("x", (1, 3, 4, 4), "float32", 0)
    rng = np.random.default_rng(0)
    stack = rng.normal(size=(5, 3, 4, 4)).astype(np.float32)
    np.save(tmp_path / "stack.npy", stack)
    got = read_calibration(tmp_path / "stack.npy", spec, None)
    assert len(got) == 5 and got[2].shape == (1, 3, 4, 4)
    np.testing.assert_array_equal(got[2][0], stack[2])
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"{i}.npy", stack[i:i + 1])
    assert len(read_calibration(folder, spec, None)) == 3


def test_read_calibration_at_each_files_own_shape_or_resized(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    folder = tmp_path / "lines"
    folder.mkdir()
    sizes = [(48, 160), (48, 320), (32, 100)]
    for i, (h, w) in enumerate(sizes):
        np.save(folder / f"{i}.npy", rng.normal(size=(1, 3, h, w)).astype(np.float32))
    # symbolic batch, height and width (a Paddle OCR model): each sample at its own size
    symbolic = TensorSpec("x", ("batch", 3, "h", "w"), "float32", 0)
    notes: list[str] = []
    got = read_calibration(folder, symbolic, None, notes.append)
    assert [g.shape[2:] for g in got] == sizes
    assert notes == []
    # the height fixed at 48: the other two are resized, bilinearly, and a note says so
    fixed = TensorSpec("x", (1, 3, 48, 160), "float32", 0)
    got = read_calibration(folder, fixed, None, notes.append)
    assert [g.shape for g in got] == [(1, 3, 48, 160)] * 3
    assert notes == ["--calibration: 2 of 3 samples resized bilinearly from (1, 3, 32, 100), "
                     "(1, 3, 48, 320) to (1, 3, 48, 160), the size of input 'x'"], notes
    np.testing.assert_array_equal(got[0], np.load(folder / "0.npy"))
    ramp = np.broadcast_to(np.arange(4, dtype=np.float32), (1, 1, 2, 4))
    np.save(tmp_path / "ramp.npy", ramp)
    wide = read_calibration(tmp_path / "ramp.npy", TensorSpec("x", (1, 1, 2, 8), "float32", 0),
                            None)[0]
    np.testing.assert_allclose(wide[0, 0, 0], [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3])
    # neither fits nor resizes (channels differ): one line naming the file and both shapes
    np.save(folder / "3.npy", np.zeros((1, 4, 48, 160), np.float32))
    with pytest.raises(UsageError, match=r"3\.npy has shape \(1, 4, 48, 160\); input 'x' "
                                          r"takes \(1, 3, 48, 160\)"):
        read_calibration(folder, fixed, None)


def test_entropy_threshold_clips_a_sparse_tail_and_keeps_a_dense_range() -> None:
    rng = np.random.default_rng(0)
    bulk = np.abs(rng.normal(0, 1, 200_000))
    spiky = np.concatenate([bulk, [40.0, 60.0]])      # two outliers far out
    t = entropy_threshold(spiky, 255)
    assert 3.0 < t < 10.0, t
    uniform = rng.uniform(0, 1, 200_000)               # every level used: nothing to clip
    assert entropy_threshold(uniform, 255) > 0.95


def test_paddle_style_model_quantizes_through_the_cli(tmp_path: Path, run_cli) -> None:
    # weights in Constant nodes, opset 11, symbolic batch/height/width; calibration files of
    # three sizes (before: "no Conv, Gemm or MatMul with constant float weights", and with
    # weights found, exit 70 on "the size batch * ... is known only at run time")
    path = qm.paddle_style(tmp_path / "paddle_style.onnx")
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(2)
    for i, (h, w) in enumerate([(16, 16), (20, 24), (24, 16), (16, 32)]):
        np.save(folder / f"{i}.npy", rng.normal(0, 1, (1, 3, h, w)).astype(np.float32))
    out = tmp_path / "q.mlc"
    proc = run_cli("export", path, "-o", out, "--target", "host", "--quantize", "int8",
                   "--calibration", folder, "--quantize-fallback", "--timings", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "quantized int8: 4 of 4 layers (Conv 3, Gemm 1)" in proc.stdout, proc.stdout
    # --timings names the int8 stages (they were a quarter of "other" on PP-OCR's classifier)
    rows = {m[1]: float(m[2]) for m in re.finditer(r"^(\S.*?)\s+(\d+\.\d+)\s",
                                                   proc.stdout, re.M)}
    for stage in ("calibrate", "float bundle", "codegen", "int8 vs float", "total"):
        assert stage in rows, proc.stdout
    named = sum(v for k, v in rows.items() if k not in ("other", "total"))
    assert named >= 0.8 * rows["total"], proc.stdout
    assert "from percentile over 4 calibration samples" in proc.stdout
    assert "golden check passed" in proc.stdout
    assert "symbolic shapes" in proc.stdout
    x = rng.normal(0, 1, (2, 3, 28, 20)).astype(np.float32)
    import onnxruntime as ort
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None,
                                                                                    {"x": x})
    with load(out) as model:
        got = model.run({"x": x})["y"]
    assert got.shape == (2, 10)
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((got - ref) ** 2)) > 25


def test_cli_quantizes_the_demo_cnn_on_its_sample_digits(tmp_path: Path, run_cli) -> None:
    out = tmp_path / "cnn_int8.mlc"
    digits = tmp_path / "digits"      # the ten sample PNGs (the folder also holds .npy files)
    digits.mkdir()
    for d in range(10):
        (digits / f"digit_{d}.png").write_bytes((SAMPLES / f"digit_{d}.png").read_bytes())
    proc = run_cli("export", ROOT / "artifacts" / "cnn.onnx", "-o", out, "--target", "host",
                   "--quantize", "int8", "--calibration", digits, "--quantize-fallback",
                   timeout=180)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "quantized int8:" in text and "from percentile over 10 calibration samples" in text
    line = next(x for x in text.splitlines() if "vs the float model" in x)
    assert "argmax agrees 100.0%" in line, line
    assert "speed (1 thread" in text
    assert "golden check passed" in text
    assert out.exists()
    # the written bundle (int8, or float when int8 was slower) classifies sample digits (all
    # ten: test_int8_digits_match_float_predictions)
    for d in (0, 7):
        proc = run_cli("infer", out, SAMPLES / f"digit_{d}.png")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split("\n")[0].endswith(f": {d}"), proc.stdout


def test_int8_digits_match_float_predictions(tmp_path: Path) -> None:
    # the int8 model itself (whatever the speed gate decides): same class on every sample
    from mlcpack.runtime.preprocess import load_input

    model = ROOT / "artifacts" / "cnn.onnx"
    name = onnx.load(str(model)).graph.input[0].name
    spec = TensorSpec(name, (1, 1, 28, 28), "float32", 0)
    pre = {"size": [28, 28], "color": "L", "scale": 1 / 255, "mean": [0.0], "std": [1.0],
           "layout": "NCHW"}
    images = [load_input(SAMPLES / f"digit_{d}.png", spec, pre) for d in range(10)]
    q = quantize_onnx(model, images)
    try:
        mod, info = import_onnx(q.model)
        export_module(mod, tmp_path / "q.mlc", ExportOptions(target="host"))
        feed = info.input_names[name]
        out = next(iter(q.float_outputs[0]))
        with load(tmp_path / "q.mlc") as qb:
            for d, x in enumerate(images):
                assert qb.run({feed: x})[out].argmax() == d
                assert q.float_outputs[d][out].argmax() == d
    finally:
        q.close()


@pytest.mark.parametrize("args, expect", [
    (["--quantize", "int4", "--calibration", "SAMPLES"], "only int8"),
    (["--quantize", "int8"], "needs --calibration"),
    (["--calibration", "SAMPLES"], "go with --quantize int8"),
    (["--no-quantize-guard"], "go with --quantize int8"),
    (["--quantize", "int8", "--calibration", "SAMPLES", "--calibration-method", "mse"],
     "use percentile or minmax or entropy"),
    (["--quantize", "int8", "--calibration", "MISSING"], "no such file or folder"),
    (["--quantize", "int8", "--calibration", "EMPTY"], "has no images or .npy files"),
    # a sample no resize maps onto the input (was exit 11 where this file promises 2)
    (["--quantize", "int8", "--calibration", "WRONG"], "no resize maps one to the other"),
])
def test_bad_options_are_one_line_errors(args: list[str], expect: str, tmp_path: Path, run_cli,
                                         one_line_error) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "wrong").mkdir()
    np.save(tmp_path / "wrong" / "a.npy", np.zeros((1, 3, 100), np.float32))
    subst = {"SAMPLES": str(SAMPLES), "MISSING": str(tmp_path / "nope"),
             "EMPTY": str(tmp_path / "empty"), "WRONG": str(tmp_path / "wrong")}
    out = tmp_path / "x.mlc"
    proc = run_cli("export", ROOT / "artifacts" / "cnn.onnx", "-o", out, "--target", "host",
                   *[subst.get(a, a) for a in args])
    assert expect in one_line_error(proc)
    assert proc.returncode == 2   # docs/quantization.md: bad options exit 2
    assert not out.exists()


def test_float_output_after_quantized_layers_gets_a_step_from_the_quantization_noise() -> None:
    # x -> Q -> DQ -> Softmax: no dequantize reaches the output directly, so its step comes
    # from the noise the activation's scale puts on it (half its RMS), not 0 (float rules)
    from onnx import TensorProto as T, helper as h, numpy_helper

    from mlcpack.packager.export import ExportOptions
    from mlcpack.packager.golden import prepare_golden

    inits = [numpy_helper.from_array(np.float32(0.05), "s"),
             numpy_helper.from_array(np.uint8(128), "z")]
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             h.make_node("Softmax", ["d"], ["y"], axis=-1)]
    graph = h.make_graph(nodes, "qsm", [h.make_tensor_value_info("x", T.FLOAT, [2, 16])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2, 16])], inits)
    mod, _ = import_onnx(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    golden = prepare_golden(mod, None, ExportOptions(check=True))
    x = golden.inputs["x"]
    assert x.min() >= -128 * 0.05 and x.max() <= 127 * 0.05     # in the quantized range
    e = np.exp(x - x.max(-1, keepdims=True))
    exact = e / e.sum(-1, keepdims=True)
    noise = golden.outputs["y"].astype(np.float64) - exact
    step = golden.steps["y"]
    assert step > 0
    np.testing.assert_allclose(step, np.sqrt(np.mean(noise ** 2)) / 2, rtol=1e-3)


@pytest.mark.parametrize("fallback", [False, True])
def test_int8_slower_than_float_refuses_or_writes_the_float_bundle(
        fallback: bool, conv_net, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the int8 bundle runs slower than the float one (beyond SLOWER_MARGIN): without
    --quantize-fallback one line and nothing written (no temporary file left either); with it
    the float bundle, and the speed line says so. Which is faster is the machine's to say, so
    the measured int8 time is doubled here; everything else is a real export and run."""
    from mlcpack.packager import calibrate
    from mlcpack.packager.api import Options, export
    from mlcpack.packager.errors import ExportError

    real = calibrate.compare

    def slower(quantized, bundle, runs: int = 21):
        report = real(quantized, bundle, runs=3)
        report.int8_ms = 2 * report.float_ms
        return report

    monkeypatch.setattr(calibrate, "compare", slower)
    path, samples = conv_net
    out = tmp_path / "out" / "q.mlc"
    out.parent.mkdir()
    options = Options(target="host", check=False, quantize="int8", calibration=tmp_path / "s.npy",
                      quantize_fallback=fallback)
    np.save(tmp_path / "s.npy", np.concatenate(samples[:4]))
    if not fallback:
        with pytest.raises(ExportError) as exc:
            export(path, out, options)
        assert "runs slower than the float one" in str(exc.value), exc.value
        assert "nothing written" in str(exc.value) and "\n" not in str(exc.value)
        assert list(out.parent.iterdir()) == []
        return
    text = "\n".join(export(path, out, options).quantization)
    assert "--quantize-fallback: the int8 bundle runs slower" in text, text
    assert "wrote the float bundle" in text
    with load(out) as model:
        names = [k["name"] for k in model.header["kernels"]]
    assert not any(n.startswith(("q", "fused_q", "quantize")) for n in names), names
    assert [p.name for p in out.parent.iterdir()] == ["q.mlc"]
