"""onnx.reference's advice in the golden check without onnxruntime (packager/golden.py):
asked by default only where mlcpack's estimate of its cost (``AdviceWork``, counted from the
shapes the IR's reference meets) is small, always with --check-advice, never with
--no-check-advice; the summary says when and why it was not asked. On DNSMOS sig_bak_ovr
(speechmos) it took 37 of the export's 75 CPU-s and 5.7 GB before this rule."""

from __future__ import annotations

import numpy as np
import pytest
from cli_in_process import run_cli_in_process


def _model(path, n=2, groups=1):
    """x [n, 4, 8, 8] -> 3x3 conv (pad 1, 4 out channels) -> 2x2 max pool, stride 2."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((4, 4 // groups, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                          group=groups),
         helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
        "advice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4, 4, 4])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _golden(path, monkeypatch, **opts):
    """prepare_golden as a plain install's export runs it (onnxruntime hidden), with a spy on
    the advice: (golden, number of times onnx.reference was asked)."""
    from mlcpack.frontends.loader import load_model
    from mlcpack.packager import golden
    from mlcpack.packager.export import ExportOptions

    monkeypatch.setenv("MLCPACK_NO_ORT", "1")
    loaded = load_model(path, {}, None, None, reference=True)
    asked = []
    real = golden.advise
    monkeypatch.setattr(golden, "advise", lambda *a: asked.append(1) or real(*a))
    g = golden.prepare_golden(loaded.modules[None], None, ExportOptions(
        check=True, reference=loaded.reference, reference_name=loaded.reference_name, **opts))
    return g, len(asked)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("advice") / "m.onnx")


def test_the_work_is_counted_from_the_shapes_the_reference_meets() -> None:
    from mlcpack.packager.golden import AdviceWork

    x = np.zeros((2, 4, 8, 8), np.float32)
    work = AdviceWork()
    work.add("nn.conv2d", {"padding": (1, 1, 1, 1)}, [x, np.zeros((6, 4, 3, 3), np.float32)],
             np.zeros((2, 6, 8, 8), np.float32))
    assert work.gathered == 2 * 4 * 9 * 64          # every window of every image, gathered
    assert work.peak_bytes == 2 * 2 * 4 * 9 * 64 * 4 + 2 * 8 * 4 * 9 * 64
    assert work.loops == 0 and work.calls == 0
    work.add("nn.max_pool2d", {"kernel": (2, 2)}, [x], np.zeros((2, 4, 4, 4), np.float32))
    assert work.loops == 2 * 4 * 16 * 4             # a Python step per window element
    work.add("nn.conv2d", {"groups": 4}, [x, np.zeros((4, 1, 3, 3), np.float32)],
             np.zeros((2, 4, 6, 6), np.float32))
    assert work.calls == 2 * 4                      # one call per image and group
    work.add("nn.conv", {"dilation": (2,)}, [np.zeros((1, 3, 20), np.float32),
                                              np.zeros((5, 3, 3), np.float32)],
             np.zeros((1, 5, 16), np.float32))      # a dilated 3-tap kernel spans 5
    assert work.gathered == 2 * 4 * 9 * 64 + 2 * 4 * 9 * 36 + 3 * 5 * 16
    work.add("add", {}, [x, x], x)                  # whole-array numpy: not counted
    assert work.gathered == 2 * 4 * 9 * 64 + 2 * 4 * 9 * 36 + 3 * 5 * 16


def test_a_small_model_is_advised_by_default(model, monkeypatch) -> None:
    g, asked = _golden(model, monkeypatch)
    assert asked == 1 and "advice" not in (g.note or "")
    assert g.reference == "the numpy reference of the IR"


def test_a_model_over_the_estimate_is_not_advised_and_the_summary_says_why(
        model, monkeypatch) -> None:
    from mlcpack.packager import golden

    monkeypatch.setattr(golden, "ADVICE_MAX_SECONDS", 1e-9)
    g, asked = _golden(model, monkeypatch)
    assert asked == 0 and g.warnings == []
    assert g.note.startswith("the ONNX import was not independently checked")
    assert "onnx.reference was not asked for advice: at the check size it would take about " \
        in g.note and "--check-advice asks it" in g.note
    assert g.outputs and not g.skipped            # the IR's reference still checks the bundle
    monkeypatch.setattr(golden, "ADVICE_MAX_SECONDS", 1e9)
    monkeypatch.setattr(golden, "ADVICE_MAX_BYTES", 1)
    g, asked = _golden(model, monkeypatch)
    assert asked == 0 and "GiB for one convolution (limit 0 GiB)" in g.note


def test_check_advice_asks_always_and_no_check_advice_never(model, monkeypatch) -> None:
    from mlcpack.packager import golden

    monkeypatch.setattr(golden, "ADVICE_MAX_SECONDS", 1e-9)
    g, asked = _golden(model, monkeypatch, check_advice=True)
    assert asked == 1 and "advice" not in g.note
    g, asked = _golden(model, monkeypatch, check_advice=False)
    assert asked == 0
    assert g.note.endswith("; onnx.reference was not asked for advice (--no-check-advice)")


def test_the_golden_cache_keeps_advised_and_unadvised_runs_apart(model, monkeypatch) -> None:
    from mlcpack.frontends.loader import load_model
    from mlcpack.packager.export import ExportOptions
    from mlcpack.packager.golden_cache import golden_key

    monkeypatch.setenv("MLCPACK_NO_ORT", "1")
    loaded = load_model(model, {}, None, None, reference=True)
    keys = {golden_key(loaded.modules[None], None, ExportOptions(
        check=True, reference=loaded.reference, check_advice=a)) for a in (None, True, False)}
    assert len(keys) == 3 and None not in keys


def test_no_check_advice_on_the_command_line(model, tmp_path) -> None:
    out = tmp_path / "m.mlc"
    proc = run_cli_in_process("export", model, "-o", out, "--no-check-advice",
                              env={"MLCPACK_NO_ORT": "1"})
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("golden check")]
    assert line.startswith("golden check passed against the numpy reference of the IR")
    assert line.endswith("onnx.reference was not asked for advice (--no-check-advice)")


def test_the_largest_magnitude_skips_non_finite_values() -> None:
    from mlcpack.packager.golden import _largest

    assert _largest(np.array([-3.0, 2.0], np.float32)) == 3.0
    assert _largest(np.array([-1.0, -2.0])) == 2.0
    assert _largest(np.array([np.nan, -5.0, np.inf, 4.0])) == 5.0
    assert _largest(np.array([np.nan])) == 0.0
    assert _largest(np.array([], np.float32)) == 0.0 and _largest(np.array([7])) == 0.0


def _onnx_file(path, nodes, inputs, outputs, inits, opset=11):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "spec", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def _advice_of(path, monkeypatch, feeds):
    from mlcpack.frontends.reference import onnx_reference

    monkeypatch.setenv("MLCPACK_NO_ORT", "1")
    reference, name = onnx_reference(path, {k: k for k in feeds})
    assert name == "onnx.reference" and not reference.refuses
    return reference(feeds)


@pytest.mark.parametrize("auto_pad,stride,size", [("VALID", 1, 5), ("SAME_UPPER", 2, 4),
                                                   ("SAME_LOWER", 2, 4)])
def test_the_advice_pads_auto_pad_convolutions_as_the_spec_says(tmp_path, monkeypatch, auto_pad,
                                                                stride, size) -> None:
    """onnx 1.22's Conv pads VALID as SAME and takes SAME's pads from the batch and channel
    dims: MTCNN's P-Net (a Keras model) gave an 8x8 map for 3x3, a false alarm."""
    from onnx import helper

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 7, 7)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    path = _onnx_file(tmp_path / "c.onnx", [helper.make_node(
        "Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[stride, stride],
        auto_pad=auto_pad)], [("x", [1, 2, 7, 7])], ["y"], {"w": w})
    y = _advice_of(path, monkeypatch, {"x": x})["y"]
    assert y.shape == (1, 3, size, size)
    total = (size - 1) * stride + 3 - 7          # SAME: the padding the spec asks for
    lo = {"VALID": 0, "SAME_UPPER": total // 2, "SAME_LOWER": total - total // 2}[auto_pad]
    xp = np.pad(x, ((0, 0), (0, 0), (lo, max(total - lo, 0)), (lo, max(total - lo, 0))))
    want = np.array([[[(xp[0, :, i * stride:i * stride + 3, j * stride:j * stride + 3]
                        * w[o]).sum() for j in range(size)] for i in range(size)]
                     for o in range(3)])[None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_the_advice_runs_an_inference_batch_norm_with_its_momentum_in_test_mode(
        tmp_path, monkeypatch) -> None:
    """onnx 1.22 runs BatchNormalization 9-14 that carries a momentum attribute (Paddle writes
    one on every node) with the batch's statistics: PP-OCR's classifier gave 0.73 for ONNX
    Runtime's 0.06. One output Y is test mode by the spec."""
    from onnx import helper

    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    p = {k: rng.uniform(0.5, 2.0, 3).astype(np.float32) for k in ("s", "b", "m", "v")}
    path = _onnx_file(tmp_path / "bn.onnx", [helper.make_node(
        "BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-5, momentum=0.9)],
        [("x", [2, 3, 4, 4])], ["y"], p)
    y = _advice_of(path, monkeypatch, {"x": x})["y"]
    c = (slice(None), None, None)
    want = (x - p["m"][c]) / np.sqrt(p["v"][c] + 1e-5) * p["s"][c] + p["b"][c]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def _golden_pair():
    from mlcpack.packager.golden import Golden

    return Golden({"x": np.ones((1, 2), np.float32)}, {"y": np.ones((1, 3, 3), np.float32)},
                  "the numpy reference of the IR", 0, 1e-3, 1e-4,
                  note="the ONNX import was not independently checked")


def test_advice_of_another_shape_names_both_shapes() -> None:
    from mlcpack.frontends.reference import Reference
    from mlcpack.packager.golden import advise

    golden = _golden_pair()
    ref = Reference(lambda feeds: {"y": np.ones((1, 8, 8), np.float32)}, "onnx.reference",
                    refuses=False)
    (line,) = advise(ref, golden)
    assert line.startswith("onnx.reference disagrees on output 'y' (it gives shape (1, 8, 8), "
                           "mlcpack (1, 3, 3)). "), line
    assert "inf" not in line


def test_advice_that_cannot_run_says_so_in_the_summary() -> None:
    from mlcpack.frontends.reference import Reference, ReferenceUnavailable
    from mlcpack.packager.golden import advise

    def fails(feeds):
        raise ReferenceUnavailable("onnx's ReferenceEvaluator cannot run it (MatMul shapes)")

    golden = _golden_pair()
    assert advise(Reference(fails, "onnx.reference", refuses=False), golden) == []
    assert golden.note == ("the ONNX import was not independently checked; no advice: onnx's "
                           "ReferenceEvaluator cannot run it (MatMul shapes)")
