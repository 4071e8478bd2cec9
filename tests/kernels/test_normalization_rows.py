"""The normalization row kernel (ops/norm.py ``nn.normalize``, codegen/norm.py) against ONNX
Runtime: LayerNormalization over the last one or two axes (with and without bias, rows 1 to 4096
wide, odd widths, one row and many), InstanceNormalization, GroupNormalization (opset 18: scale
per group; opset 21: per channel), a sequence length given at run time, long rows of values near
1e3 with a small spread (float32 accuracy), at 1 and 2 threads; and the torch frontend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.codegen.norm import match_normalize
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

RTOL = 1e-5


def _fast_kernels(model: onnx.ModelProto) -> int:
    """How many kernels of the compiled model the normalization kernel takes."""
    mod, _ = import_onnx(model)
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED)
    return sum(match_normalize(f) is not None for f in mod.functions.values()
               if isinstance(f, PrimFunc))


def _check(model: onnx.ModelProto, feeds_list: list[dict], tmp_path: Path,
           threads=(1, 2)) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / "m.mlc"
    export_module(mod, bundle, ExportOptions(target="host", check=False))
    for feeds in feeds_list:
        want = ort_outputs(path, feeds)
        for t in threads:
            with load(bundle, threads=t) as m:
                got = m.run(feeds)
            for name, w in want.items():
                assert got[name].shape == w.shape, name
                scale = max(float(np.abs(w).max()), 1.0)
                err = float(np.abs(got[name].astype(np.float64) - w).max()) / scale
                assert err <= RTOL, (name, t, err)


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "norms", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _out(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _const(rng, name, shape, lo=-1.0, hi=1.0):
    return numpy_helper.from_array(rng.uniform(lo, hi, shape).astype(np.float32), name)


# (name, input shape, axis, bias)
LAYER_NORMS = [
    ("w1", (3, 1), -1, True),
    ("w3_one_row", (1, 3), -1, False),
    ("w7", (5, 7), -1, True),
    ("w8", (4, 8), -1, True),
    ("w33", (2, 3, 33), -1, False),
    ("w192", (1, 197, 192), -1, True),    # DeiT-tiny's rows, split over threads
    ("w768", (2, 9, 768), -1, True),
    ("w1001", (3, 1001), -1, True),
    ("w4096", (5, 4096), -1, False),      # split over threads
    ("axis2_5x13", (3, 5, 13), -2, True),
    ("axis2_4x64", (2, 4, 64), -2, False),
]


def test_layer_norm_matches_onnxruntime(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], []
    for name, shape, axis, bias in LAYER_NORMS:
        pshape = shape[axis:]
        inits.append(_const(rng, f"{name}_s", pshape, 0.5, 1.5))
        ins = [f"{name}_x", f"{name}_s"]
        if bias:
            inits.append(_const(rng, f"{name}_b", pshape))
            ins.append(f"{name}_b")
        nodes.append(helper.make_node("LayerNormalization", ins, [f"{name}_y"], axis=axis,
                                      epsilon=1e-5))
        inputs.append(_f(f"{name}_x", shape))
        outputs.append(_out(f"{name}_y"))
    model = _model(nodes, inputs, outputs, inits)
    assert _fast_kernels(model) == len(LAYER_NORMS)
    feeds = {f"{name}_x": (rng.standard_normal(shape) * 3 + 0.5).astype(np.float32)
             for name, shape, *_ in LAYER_NORMS}
    _check(model, [feeds], tmp_path)


def test_layer_norm_statistics_outputs(tmp_path: Path) -> None:
    """Mean and InvStdDev read: y from the kernel, the statistics from the decomposition."""
    rng = np.random.default_rng(1)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"],
                            axis=-1, epsilon=1e-3)
    model = _model([node], [_f("x", (4, 37))], [_out("y"), _out("mean"), _out("inv")],
                   [_const(rng, "s", (37,)), _const(rng, "b", (37,))])
    assert _fast_kernels(model) == 1
    _check(model, [{"x": rng.standard_normal((4, 37)).astype(np.float32)}], tmp_path)


def test_instance_norm_matches_onnxruntime(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    cases = [("small", (2, 5, 7, 9)), ("large", (1, 32, 56, 56)), ("one_d", (2, 3, 11)),
             ("two_pixels", (1, 4, 1, 2))]
    nodes, inputs, outputs, inits = [], [], [], []
    for name, shape in cases:
        c = shape[1]
        inits += [_const(rng, f"{name}_s", (c,), 0.5, 1.5), _const(rng, f"{name}_b", (c,))]
        nodes.append(helper.make_node("InstanceNormalization",
                                      [f"{name}_x", f"{name}_s", f"{name}_b"], [f"{name}_y"],
                                      epsilon=1e-5))
        inputs.append(_f(f"{name}_x", shape))
        outputs.append(_out(f"{name}_y"))
    # torch's GroupNorm export: Reshape -> InstanceNormalization (ones, zeros) -> Reshape
    inits += [numpy_helper.from_array(np.ones(4, np.float32), "ones"),
              numpy_helper.from_array(np.zeros(4, np.float32), "zeros"),
              numpy_helper.from_array(np.array([1, 4, -1], np.int64), "gshape"),
              numpy_helper.from_array(np.array([1, 8, 6, 6], np.int64), "xshape")]
    nodes += [helper.make_node("Reshape", ["gn_x", "gshape"], ["gn_g"]),
              helper.make_node("InstanceNormalization", ["gn_g", "ones", "zeros"], ["gn_n"]),
              helper.make_node("Reshape", ["gn_n", "xshape"], ["gn_y"])]
    inputs.append(_f("gn_x", (1, 8, 6, 6)))
    outputs.append(_out("gn_y"))
    model = _model(nodes, inputs, outputs, inits)
    assert _fast_kernels(model) == len(cases) + 1
    feeds = {f"{name}_x": (rng.standard_normal(shape) * 2 - 1).astype(np.float32)
             for name, shape in cases}
    feeds["gn_x"] = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    _check(model, [feeds], tmp_path)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm_matches_onnxruntime(opset: int, tmp_path: Path, monkeypatch) -> None:
    if opset == 18:   # the ONNX checker refuses the deprecated opset-18 form; ORT runs it
        import mlcpack.frontends.onnx.importer as importer
        monkeypatch.setattr(importer, "_check_model", lambda *args: None)
    rng = np.random.default_rng(opset)
    # (name, shape, groups)
    cases = [("g3", (2, 6, 5, 5), 3), ("g32", (1, 64, 16, 16), 32), ("g1", (1, 4, 3, 7), 1),
             ("g4_1d", (2, 8, 10), 4)]
    nodes, inputs, outputs, inits = [], [], [], []
    for name, shape, groups in cases:
        pshape = (groups,) if opset == 18 else (shape[1],)
        inits += [_const(rng, f"{name}_s", pshape, 0.5, 1.5), _const(rng, f"{name}_b", pshape)]
        nodes.append(helper.make_node("GroupNormalization",
                                      [f"{name}_x", f"{name}_s", f"{name}_b"], [f"{name}_y"],
                                      num_groups=groups, epsilon=1e-5))
        inputs.append(_f(f"{name}_x", shape))
        outputs.append(_out(f"{name}_y"))
    model = _model(nodes, inputs, outputs, inits, opset=opset)
    assert _fast_kernels(model) == len(cases)
    feeds = {f"{name}_x": (rng.standard_normal(shape) + 0.3).astype(np.float32)
             for name, shape, _ in cases}
    _check(model, [feeds], tmp_path)


def test_run_time_sequence_length(tmp_path: Path) -> None:
    """A dim_param sequence length: the kernel takes its rows at run time (and splits them over
    threads when there are enough); an InstanceNorm over run-time H, W takes its row length at
    run time."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1),
             helper.make_node("InstanceNormalization", ["img", "is", "ib"], ["z"])]
    model = _model(nodes, [_f("x", (1, "seq", 96)), _f("img", (1, 3, "h", "w"))],
                   [_out("y"), _out("z")],
                   [_const(rng, "s", (96,)), _const(rng, "b", (96,)),
                    _const(rng, "is", (3,)), _const(rng, "ib", (3,))])
    assert _fast_kernels(model) == 2
    feeds = [{"x": rng.standard_normal((1, seq, 96)).astype(np.float32),
              "img": rng.standard_normal((1, 3, h, w)).astype(np.float32)}
             for seq, h, w in ((1, 1, 1), (7, 5, 3), (300, 64, 90))]
    _check(model, feeds, tmp_path)


def test_large_mean_long_rows_accuracy(tmp_path: Path) -> None:
    """Values around 1e3 with a spread of 0.5, rows up to 64K: within 1e-5 of the float64
    reference (a plain float32 sum of the row, or x minus a float32 mean, would not be), and as
    close to ONNX Runtime as ONNX Runtime is to that reference (its own error here is ~1e-5,
    ~6e-5 on 5-wide rows), plus 1e-5."""
    rng = np.random.default_rng(6)
    widths = (5, 1000, 4099, 65536)
    nodes, inputs, outputs, inits = [], [], [], []
    for w in widths:
        inits += [_const(rng, f"s{w}", (w,), 0.5, 1.5), _const(rng, f"b{w}", (w,))]
        nodes.append(helper.make_node("LayerNormalization", [f"x{w}", f"s{w}", f"b{w}"],
                                      [f"y{w}"], axis=-1, epsilon=1e-5))
        inputs.append(_f(f"x{w}", (2, w)))
        outputs.append(_out(f"y{w}"))
    model = _model(nodes, inputs, outputs, inits)
    assert _fast_kernels(model) == len(widths)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host", check=False))
    feeds = {f"x{w}": (1000.0 + 0.5 * rng.standard_normal((2, w))).astype(np.float32)
             for w in widths}
    ort = ort_outputs(path, feeds)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for threads in (1, 2):
        with load(tmp_path / "m.mlc", threads=threads) as m:
            got = m.run(feeds)
        for w in widths:
            x = feeds[f"x{w}"].astype(np.float64)
            mean = x.mean(axis=-1, keepdims=True)
            ref = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
            ref = ref * consts[f"s{w}"] + consts[f"b{w}"]
            scale = np.abs(ref).max()
            err = np.abs(got[f"y{w}"] - ref).max() / scale
            ort_err = np.abs(ort[f"y{w}"] - ref).max() / scale
            assert err <= RTOL, (w, threads, err)
            assert np.abs(got[f"y{w}"] - ort[f"y{w}"]).max() / scale <= ort_err + RTOL


def test_torch_layer_norm_and_group_norm(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import mlcpack
    from mlcpack.runtime.describe import describe

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gn = torch.nn.GroupNorm(4, 8)
            self.ln = torch.nn.LayerNorm(36)
            self.ln2 = torch.nn.LayerNorm((6, 6), elementwise_affine=False)

        def forward(self, x):
            y = torch.relu(self.gn(x))
            return self.ln(y.flatten(2)), self.ln2(x)

    torch.manual_seed(0)
    net = Net().eval()
    for p in net.parameters():
        p.data.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 6, 6)
    path = tmp_path / "t.mlc"
    report = mlcpack.export_torch(net, (x,), path, target="host")
    assert report.check.startswith("golden check passed"), report.check
    names = [k["name"] for k in describe(path)["kernels"]]
    assert sum("normalize" in n for n in names) == 3, names
    with torch.no_grad():
        want = [t.numpy() for t in net(x)]
    with load(path) as m:
        got = list(m.run({m.inputs[0].name: x.numpy()}).values())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


def _decomposed_layer_norm(rng, shape, axes, affine=True, extra_reader=False):
    """LayerNorm as exporters before opset 17 write it: ReduceMean, Sub, Pow 2, ReduceMean, Add
    eps, Sqrt, Div (then Mul gamma, Add beta)."""
    n = shape[-len(axes):]
    f = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [f("two", 2.0), f("eps", 1e-5), f("gamma", rng.uniform(0.5, 1.5, n)),
             f("beta", rng.uniform(-1, 1, n))]
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=axes),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p"], ["v"], axes=axes),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"])]
    outputs = [_out("y")]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]),
                  helper.make_node("Add", ["beta", "g"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    if extra_reader:          # d read elsewhere too: the pattern stays operators
        nodes.append(helper.make_node("Relu", ["d"], ["r"]))
        outputs.append(_out("r"))
    return _model(nodes, [_f("x", shape)], outputs, inits, opset=13)


@pytest.mark.parametrize("shape, axes, affine, extra, fused", [
    ((2, 9, 96), [-1], True, False, True),
    ((1, 50, 768), [2], True, False, True),
    ((3, 4, 10), [1, 2], False, False, True),
    ((2, 5, 33), [-1], True, True, False),
])
def test_decomposed_layer_norm_pattern(shape, axes, affine, extra, fused, tmp_path: Path) -> None:
    """passes/normalize.py turns the written-out LayerNorm into one nn.normalize (its scale and
    bias included); a pattern whose centered value has another reader stays as it was."""
    from mlcpack.packager.passes.normalize import fuse_normalize

    rng = np.random.default_rng(len(shape) + shape[-1])
    model = _decomposed_layer_norm(rng, shape, axes, affine, extra)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    mod = fuse_normalize(mod)
    calls = [b.value for f in mod.functions.values() if hasattr(f, "bindings")
             for b in f.bindings() if getattr(b.value, "op", None) == "nn.normalize"]
    assert len(calls) == int(fused)
    if fused:
        assert calls[0].attrs["scale"] is affine and calls[0].attrs["bias"] is affine
        lowered = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED)
        funcs = [f for f in lowered.functions.values() if isinstance(f, PrimFunc)]
        assert sum(match_normalize(f) is not None for f in funcs) == 1
        assert len(funcs) == 1      # nothing else left of the pattern
    bundle = tmp_path / "m.mlc"
    export_module(mod, bundle, ExportOptions(target="host", check=False))
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    want = ort_outputs(path, {"x": x})
    with load(bundle) as m:
        got = m.run({"x": x})
    for name, w in want.items():
        err = float(np.abs(got[name] - w).max()) / max(float(np.abs(w).max()), 1.0)
        assert err <= RTOL, (name, err)


def test_generic_fallback_matches(tmp_path: Path) -> None:
    """What the row kernel does not take compiles through the operator's tensor expressions:
    a float64 LayerNorm, and a scale that broadcasts inside the row ([1, 16] over rows of
    [5, 16]), against ONNX Runtime and the float64 formula."""
    rng = np.random.default_rng(8)
    s16 = rng.uniform(0.5, 1.5, (1, 16)).astype(np.float32)
    s64 = rng.uniform(0.5, 1.5, (24,))
    nodes = [helper.make_node("LayerNormalization", ["x", "s16"], ["y"], axis=-2),
             helper.make_node("LayerNormalization", ["d", "s64"], ["z"], axis=-1)]
    model = _model(nodes, [_f("x", (3, 5, 16)),
                           helper.make_tensor_value_info("d", TensorProto.DOUBLE, [4, 24])],
                   [_out("y"), helper.make_tensor_value_info("z", TensorProto.DOUBLE, None)],
                   [numpy_helper.from_array(s16, "s16"), numpy_helper.from_array(s64, "s64")])
    assert _fast_kernels(model) == 0
    feeds = {"x": rng.standard_normal((3, 5, 16)).astype(np.float32),
             "d": rng.standard_normal((4, 24))}
    _check(model, [feeds], tmp_path)
    with load(tmp_path / "m.mlc") as m:
        z = m.run(feeds)["z"]
    d = feeds["d"]
    ref = (d - d.mean(-1, keepdims=True)) / np.sqrt(d.var(-1, keepdims=True) + 1e-5) * s64
    # float64 sqrt goes through the float32 kernel in the generic lowering (codegen/lower.py)
    np.testing.assert_allclose(z, ref, rtol=1e-6, atol=1e-6)


def test_fused_epilogues(tmp_path: Path) -> None:
    """Elementwise readers fuse into the normalization and the kernel evaluates them before its
    store: InstanceNorm then ReLU, LayerNorm then a residual add and SiLU, GroupNorm (a row per
    group of channels of [N, C, H, W] itself) then a scaled clip; a per-channel add after an
    InstanceNorm broadcasts inside the row, which the kernel does not take: it stays correct
    through the generic fallback."""
    rng = np.random.default_rng(9)
    c = lambda name, shape: _const(rng, name, shape, 0.5, 1.5)  # noqa: E731
    nodes = [helper.make_node("InstanceNormalization", ["a", "as", "ab"], ["a_n"]),
             helper.make_node("Relu", ["a_n"], ["a_y"]),
             helper.make_node("LayerNormalization", ["b", "bs", "bb"], ["b_n"], axis=-1),
             helper.make_node("Add", ["b_n", "b"], ["b_r"]),
             helper.make_node("Sigmoid", ["b_r"], ["b_s"]),
             helper.make_node("Mul", ["b_r", "b_s"], ["b_y"]),
             helper.make_node("GroupNormalization", ["g", "gs", "gb"], ["g_n"], num_groups=2),
             helper.make_node("Mul", ["g_n", "half"], ["g_h"]),
             helper.make_node("Clip", ["g_h", "lo", "hi"], ["g_y"]),
             helper.make_node("InstanceNormalization", ["d", "ds", "db"], ["d_n"]),
             helper.make_node("Add", ["d_n", "dc"], ["d_y"])]
    inits = [c("as", (4,)), c("ab", (4,)), c("bs", (37,)), c("bb", (37,)), c("gs", (6,)),
             c("gb", (6,)), c("ds", (3,)), c("db", (3,)), c("dc", (3, 1, 1)),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(-0.4, np.float32), "lo"),
             numpy_helper.from_array(np.array(0.6, np.float32), "hi")]
    shapes = {"a": (2, 4, 9, 7), "b": (3, 5, 37), "g": (1, 6, 11, 5), "d": (1, 3, 4, 6)}
    model = _model(nodes, [_f(k, v) for k, v in shapes.items()],
                   [_out(n) for n in ("a_y", "b_y", "g_y", "d_y")], inits, opset=21)
    mod, _ = import_onnx(model)
    funcs = [f for f in run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).functions.values()
             if isinstance(f, PrimFunc)]
    names = sorted(f.name for f in funcs)
    taken = sorted(f.name for f in funcs if match_normalize(f) is not None)
    assert len(funcs) == 4 and all(n.startswith("fused_normalize") for n in names), names
    # all but the per-channel add (it broadcasts inside the row: the generic loop nest)
    assert len(taken) == 3 and not any(n.endswith("_add1") for n in taken), taken
    feeds = {k: (rng.standard_normal(v) * 2 + 0.3).astype(np.float32) for k, v in shapes.items()}
    _check(model, [feeds], tmp_path)


def test_fused_epilogue_run_time_rows(tmp_path: Path) -> None:
    """LayerNorm + residual add + ReLU with a run-time sequence length."""
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["n"], axis=-1),
             helper.make_node("Add", ["n", "x"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    model = _model(nodes, [_f("x", (1, "seq", 80))], [_out("y")],
                   [_const(rng, "s", (80,)), _const(rng, "b", (80,))])
    assert _fast_kernels(model) == 1
    _check(model, [{"x": rng.standard_normal((1, t, 80)).astype(np.float32)}
                   for t in (1, 13, 260)], tmp_path)


def test_group_norm_run_time_plane_and_graph_input_scale(tmp_path: Path, monkeypatch) -> None:
    """GroupNorm-21 then SiLU over a run-time H x W (rows of C/G x H x W read at run time, the
    SiLU fused); GroupNorm-18 whose per-group scale is a graph input (the grouped form)."""
    import mlcpack.frontends.onnx.importer as importer
    monkeypatch.setattr(importer, "_check_model", lambda *args: None)   # opset 18's form
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("GroupNormalization", ["x", "s", "b"], ["n"], num_groups=4),
             helper.make_node("Sigmoid", ["n"], ["sg"]),
             helper.make_node("Mul", ["n", "sg"], ["y"])]
    model = _model(nodes, [_f("x", (1, 8, "h", "w"))], [_out("y")],
                   [_const(rng, "s", (8,)), _const(rng, "b", (8,))], opset=21)
    assert _fast_kernels(model) == 1
    _check(model, [{"x": (rng.standard_normal((1, 8, h, w)) + 1).astype(np.float32)}
                   for h, w in ((1, 1), (5, 7), (64, 40))], tmp_path)
    node = helper.make_node("GroupNormalization", ["x", "gs", "gb"], ["y"], num_groups=3)
    model = _model([node], [_f("x", (2, 6, 4, 5)), _f("gs", (3,))], [_out("y")],
                   [_const(rng, "gb", (3,))], opset=18)
    assert _fast_kernels(model) == 1
    _check(model, [{"x": rng.standard_normal((2, 6, 4, 5)).astype(np.float32),
                    "gs": rng.uniform(0.5, 1.5, 3).astype(np.float32)}], tmp_path)


def test_torch_group_norm_export_pattern(tmp_path: Path) -> None:
    """torch's ONNX GroupNorm (Reshape to [N, G, -1], InstanceNormalization with ones and zeros,
    Reshape back, Mul and Add per channel) then SiLU: passes/normalize.py makes it one
    normalization of [N, C, H, W] in groups with the Mul and Add as its scale and bias, and the
    SiLU fuses in: one kernel, the row kernel."""
    rng = np.random.default_rng(12)
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Reshape", ["x", "gshape"], ["g"]),
             helper.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["n"]),
             helper.make_node("Reshape", ["n", "xshape"], ["r"]),
             helper.make_node("Mul", ["r", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["a", "s"], ["y"])]
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "ones"),
             numpy_helper.from_array(np.zeros(4, np.float32), "zeros"),
             ints("gshape", [2, 4, -1]), ints("xshape", [2, 16, 7, 5]),
             _const(rng, "w", (16, 1, 1), 0.5, 1.5), _const(rng, "b", (16, 1, 1))]
    model = _model(nodes, [_f("x", (2, 16, 7, 5))], [_out("y")], inits)
    mod, _ = import_onnx(model)
    funcs = [f for f in run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).functions.values()
             if isinstance(f, PrimFunc)]
    assert len(funcs) == 1 and match_normalize(funcs[0]) is not None, [f.name for f in funcs]
    assert match_normalize(funcs[0]).scale is not None
    _check(model, [{"x": (rng.standard_normal((2, 16, 7, 5)) * 3 + 1).astype(np.float32)}],
           tmp_path)
