"""The bf16 accuracy guard's choice of layers kept in fp32 (packager/precision.py
``sensitive_weights``, docs/precision.md): the reference that models the kernels' rounding
(weights and, where the targets multiply with vdpbf16ps or bfdot, activations), the fewest
layers kept first, the conservative choice second; and the layers a bf16 bundle keeps fp32 on
fp32's channel-lane kernels. The bundle runs natively on an x86-64 host with avx512_bf16
(x86-64-v4+bf16) and on others through the vdpbf16ps emulation (``bf16_emulate``, x86-64-v3):
the same rounding either way."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.runtime.cpu import host_arch, host_features

V4_BF16 = "x86-64-v4+bf16"
NATIVE = host_arch() == "x86_64" and {"avx512f", "avx512_bf16"} <= host_features()
HW = 24


def _style_net(seed: int = 1, layers: int = 5, c: int = 16):
    """A small style-transfer net: Conv + InstanceNorm + ReLU stages (the norm scales each
    channel's rounding errors up by its spread), a 5x5 C = 3 stem, a 3-channel output conv."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = {}, [], "x"
    chans = [3] + [c] * (layers - 1) + [3]
    for i in range(layers):
        ci, co, k = chans[i], chans[i + 1], 5 if i == 0 else 3
        inits[f"w{i}"] = rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)
        inits[f"b{i}"] = 0.1 * rng.standard_normal(co)
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"],
                                      pads=[k // 2] * 4))
        x = f"c{i}"
        if i < layers - 1:
            inits[f"s{i}"] = 1 + 0.2 * rng.standard_normal(co)
            inits[f"t{i}"] = 0.2 * rng.standard_normal(co)
            nodes += [helper.make_node("InstanceNormalization", [x, f"s{i}", f"t{i}"], [f"n{i}"]),
                      helper.make_node("Relu", [f"n{i}"], [f"r{i}"])]
            x = f"r{i}"
    graph = helper.make_graph(
        nodes, "style", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, HW, HW])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, HW, HW])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _image():
    return np.random.default_rng(1).uniform(0, 1, (1, 3, HW, HW)).astype(np.float32)


def _err(got, want) -> float:
    return float(np.abs(got - want).max()) / float(np.abs(want).max())


def test_fewest_tries_few_counts():
    from mlcpack.packager.precision import _fewest

    for n, least in ((1, None), (3, 2), (12, 4), (12, 5), (12, 11), (90, 7), (90, 58)):
        tried = []

        def fits(k, least=least, tried=tried):
            tried.append(k)
            return least is not None and k >= least
        assert _fewest(n, fits) == (least if least is None or least < n else None)
        assert len(tried) <= 5 + max(n, 2).bit_length(), (n, least, tried)
    assert _fewest(12, lambda k: False) is None


def test_rounded_reference_rounds_weights_and_activations():
    """``_rounded``: the named convolution's weight and (``activations``) its input rounded to
    bf16 (nearest even), the others untouched."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.golden import evaluate_ir
    from mlcpack.packager.passes.layout import to_bfloat16
    from mlcpack.packager.precision import _rounded

    model = _style_net(layers=2)
    mod, _ = import_onnx(model)
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = _image()
    base = evaluate_ir(mod, {"x": x})
    r = lambda a: to_bfloat16(a).astype(np.float32)   # noqa: E731
    for names, act in (({"w1"}, True), ({"w1"}, False), ({"w0", "w1"}, True)):
        got = list(evaluate_ir(_rounded(mod, names, act), {"x": x}).values())[0]
        ws = {k: r(v) if k in names else v for k, v in w.items()}
        xs = r(x) if act and "w0" in names else x
        # the model by hand in float64: conv -> InstanceNorm -> ReLU -> conv
        h = _conv(xs.astype(np.float64), ws["w0"], ws["b0"], 2)
        mu, var = h.mean((2, 3), keepdims=True), h.var((2, 3), keepdims=True)
        h = (h - mu) / np.sqrt(var + 1e-5) * ws["s0"][:, None, None] + ws["t0"][:, None, None]
        h = np.maximum(h, 0).astype(np.float32)
        if act:
            h = r(h)
        want = _conv(h.astype(np.float64), ws["w1"], ws["b1"], 1)
        # float32 rounding where the reference computes in float32 (a bf16 step is 2^-8)
        assert _err(got, want) < 2e-5, (names, act)
        assert _err(got, list(base.values())[0]) > 1e-4, (names, act)


def _conv(x, w, b, p):
    x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    o, c, k, _ = w.shape
    out = np.zeros((1, o, HW, HW))
    for dy in range(k):
        for dx in range(k):
            out += np.einsum("oc,nchw->nohw", w[:, :, dy, dx].astype(np.float64),
                             x[:, :, dy:dy + HW, dx:dx + HW])
    return out + b[None, :, None, None]


def _export(tmp_path, model, name, **kw):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions

    mod, _ = import_onnx(model)
    compile = CompileOptions() if NATIVE else CompileOptions(bf16_emulate=True)
    report = export_module(mod, tmp_path / f"{name}.mlc", ExportOptions(
        target="host" if NATIVE else "x86-64-v3", check_inputs={"x": _image()},
        compile=compile, **kw))
    return tmp_path / f"{name}.mlc", report


def _run(bundle):
    from mlcpack.runtime import load

    with load(bundle, threads=1) as m:
        return list(m.run({"x": _image()}).values())[0].astype(np.float64)


@pytest.mark.skipif(host_arch() != "x86_64", reason="x86-64 bundles (native or emulated bf16)")
def test_guard_keeps_the_fewest_layers(tmp_path):
    """All in bf16 the net errs 0.8 % of its output's scale (the reference's model); under a
    0.7 % bound the guard keeps the two most sensitive convolutions fp32 (the other three
    rounded together err at most 0.75 of the bound), where summing the single layers' errors
    kept four (its second choice). The bundle's error is the model's: the activations'
    rounding counts (without it the model is far off)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.golden import evaluate_ir
    from mlcpack.packager.precision import _rounded, sensitive_weights

    model = _style_net()
    mod, _ = import_onnx(model)
    feeds = {"x": _image()}
    want = list(evaluate_ir(mod, feeds).values())[0]

    def modelled(names, activations=True):
        return _err(list(evaluate_ir(_rounded(mod, names, activations), feeds).values())[0], want)

    assert 0.0075 < modelled({f"w{i}" for i in range(5)}) < 0.0085
    choices = sensitive_weights(mod, None, SimpleNamespace(inputs=feeds), 0.007,
                                activations=True)
    assert choices == [frozenset({"w0", "w1"}), frozenset({"w0", "w1", "w2", "w3"})], choices
    bundle, report = _export(tmp_path, model, "guarded", precision="bf16",
                             bf16_max_error=0.007)
    assert report.precision == "bf16", report.precision_note
    assert report.precision_note.endswith("kept in fp32 (the most sensitive): w0, w1"), \
        report.precision_note
    got, model_err = _err(_run(bundle), want), modelled({"w2", "w3", "w4"})
    assert 0 < got <= 0.007 and model_err <= 0.75 * 0.007
    assert abs(got - model_err) < 0.02 * model_err, (got, model_err)   # summation order
    assert abs(got - modelled({"w2", "w3", "w4"}, False)) > 0.3 * got


def test_kept_convolutions_take_fp32_kernels():
    """With x86-64-v4+bf16 the convolutions the guard keeps fp32 take fp32's channel-lane
    kernel (``nn.conv2d_oc``, its packed float32 weight), the others bf16 pairs; without
    bf16_keep every one is bf16, and x86-64-v4 (no vdpbf16ps) keeps nn.conv2d with plain
    float32 weights as before. The pipeline only."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import CallTIR, Constant
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    def weights(target, keep=frozenset()):   # w0..w4 -> the constant its kernel reads
        mod, _ = import_onnx(_style_net())
        opts = CompileOptions(target=target, precision="bf16", bf16_keep=keep).for_targets(
            [resolve_target(t) for t in target.split(",")])
        mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
        return {a.name.split("_")[0]: (a.name, str(a.data.dtype))
                for b in mod.functions["main"].bindings() if isinstance(b.value, CallTIR)
                for a in b.value.args if isinstance(a, Constant) and a.name.startswith("w")}

    kept = weights(V4_BF16, frozenset({"w1", "w2"}))
    assert kept == {"w0": ("w0_bf16", "bfloat16"), "w1": ("w1_oc", "float32"),
                    "w2": ("w2_oc", "float32"), "w3": ("w3_bf16", "bfloat16"),
                    "w4": ("w4_bf16", "bfloat16")}, kept
    assert {v[1] for v in weights(V4_BF16).values()} == {"bfloat16"}
    assert weights("x86-64-v4") == {f"w{i}": (f"w{i}", "float32") for i in range(5)}


@pytest.mark.skipif(host_arch() != "x86_64", reason="x86-64 bundles (native or emulated bf16)")
def test_guard_refuses_bf16_that_gains_nothing(tmp_path):
    """Under a 0.5 % bound the guard's fewest choice keeps w0, w1, w2 fp32: 32 % of the net's
    multiply-adds would stay bf16 (under BF16_MIN_SHARE), no speed to gain, so the model is
    exported in fp32 without compiling that choice, and the line says why; the bundle is the
    fp32 export's, byte for byte. Under 0.7 % (w0, w1 kept, 59 % in bf16) it stays bf16."""
    from mlcpack.packager import precision

    macs = {"w0": 1200, "w1": 2304, "w2": 2304, "w3": 2304, "w4": 432}   # per pixel, 24x24
    work = ({f"{k}_bf16": v for k, v in macs.items()}, sum(macs.values()))
    assert precision.bf16_share(work, frozenset()) == 1.0
    assert abs(precision.bf16_share(work, frozenset({"w0", "w1", "w2"})) - 2736 / 8544) < 1e-9
    assert precision.bf16_share(({}, 0), frozenset()) is None

    bundle, report = _export(tmp_path, _style_net(), "low", precision="bf16",
                             bf16_max_error=0.005)
    assert report.precision == "fp32", report.precision_note
    note = report.precision_note
    assert note.startswith("bf16: error against fp32") and "(3 of 5 kept in fp32) leave 32 %" \
        in note and "no speed to gain), so the model is exported in fp32" in note, note
    # the time of the bf16 attempt and the guard counts in the report (--timings), not only the
    # fp32 export's
    assert report.stages.get("bf16 guard", 0) > 0 and "codegen" in report.stages
    assert sum(report.stages.values()) <= report.seconds
    fp32, _ = _export(tmp_path, _style_net(), "fp32", precision="fp32")
    assert bundle.read_bytes() == fp32.read_bytes()


@pytest.mark.skipif(host_arch() != "x86_64", reason="x86-64 bundles (native or emulated bf16)")
def test_guard_retries_reuse_the_reference_run(tmp_path, monkeypatch):
    """The exports the guard starts again (its choice of layers kept fp32, or fp32 with the
    check on) take the first export's reference run instead of running the reference again:
    one reference per export, the same bundle as before (the reference depends on the source
    model and the check's options only), and the check still runs on the fp32 fallback."""
    from mlcpack.packager import export

    made = []

    class Counted(export._GoldenRun):
        def __init__(self, *args, **kw):
            made.append(args[2].precision)
            super().__init__(*args, **kw)

    monkeypatch.setattr(export, "_GoldenRun", Counted)
    _, report = _export(tmp_path, _style_net(), "kept", precision="bf16", bf16_max_error=0.007)
    assert report.precision_note.endswith("kept in fp32 (the most sensitive): w0, w1")
    assert made == ["bf16"], made   # the retry keeping w0, w1 ran no reference of its own
    made.clear()
    _, report = _export(tmp_path, _style_net(), "fp32", precision="bf16",
                        bf16_max_error=0.005, check=True)
    assert report.precision == "fp32" and made == ["bf16"], made
    assert report.check is not None and "passed" in report.check, report.check
