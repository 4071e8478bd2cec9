"""``qdwconv2d`` with a table and a dequantize after it (``passes/quantize_lut.py``
``fold_tables_into_depthwise``, ``_QDepthwise._table_copy``): the activation after an integer
depthwise layer of an ORT QDQ file with open image sizes (PP-OCR's classifier: DW -> Q -> DQ
-> HardSwish -> Q -> DQ, read by a squeeze-and-excitation mean and gate) looked up and
dequantized as the kernel stores each plane, float32 out. Two layers, batch, height and width
open: uint8 activations through HardSwish (one table row; its low columns constant, so the
kernel's clamp and lookup skip them), int8 activations through a per-channel affine and
HardSwish (a row per channel), each also read by a mean and a multiply by it (two readers, as
in the classifier, quantized after). One bundle for x86-64-v2, x86-64-v3 and this host's level, each pinned, sizes
whose planes hold fewer than 32 values, a multiple of 32 and more (the last step overlapping),
1 and 2 threads: bit for bit against ONNX Runtime and against exact numpy (integer sums, the
float32 operations in the graph's order; the products with the mean against the graph's
float32 product of ORT's operands: ORT's QLinearMul rounds otherwise); a fixed shape keeps the
lut8 kernel."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import X86_V2, X86_V3
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features

ort = pytest.importorskip("onnxruntime")
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86 or "avx2" not in host_features(),
                                reason="runs x86-64-v2 and v3 code: needs an x86-64 host with AVX2")

C = 24
SIZES = ((1, 3, 5), (2, 4, 16), (1, 9, 23))      # planes of 15, 64 and 207 values
# name, activation dtype, x's, the depthwise output's and the HardSwish output's (scale, zp)
LAYERS = (("u", np.uint8, (0.05, 120), (0.04, 125), (0.03, 20)),
          ("s", np.int8, (0.05, -3), (0.04, 5), (0.03, -100)))


def _graph(path: Path, dims) -> Path:
    rng = np.random.default_rng(11)
    nodes, outs = [], []
    inits = {"sm": np.float32(0.01), "zm": np.uint8(128)}     # the means' (a gate's) Q / DQ
    for name, dt, (sx, zx), (sy, zy), (sh, zh) in LAYERS:
        ws = rng.uniform(0.002, 0.01, C).astype(np.float32)
        inits.update({f"sx{name}": np.float32(sx), f"zx{name}": dt(zx),
                      f"sy{name}": np.float32(sy), f"zy{name}": dt(zy),
                      f"sh{name}": np.float32(sh), f"zh{name}": dt(zh),
                      f"w{name}": rng.integers(-127, 128, (C, 1, 3, 3)).astype(np.int8),
                      f"ws{name}": ws, f"wz{name}": np.zeros(C, np.int8),
                      f"b{name}": rng.integers(-4000, 4000, C).astype(np.int32),
                      f"bs{name}": (np.float32(sx) * ws).astype(np.float32),
                      f"bz{name}": np.zeros(C, np.int32)})
        nodes += [h.make_node("QuantizeLinear", ["x", f"sx{name}", f"zx{name}"], [f"xq{name}"]),
                  h.make_node("DequantizeLinear", [f"xq{name}", f"sx{name}", f"zx{name}"],
                              [f"xd{name}"]),
                  h.make_node("DequantizeLinear", [f"w{name}", f"ws{name}", f"wz{name}"],
                              [f"wd{name}"], axis=0),
                  h.make_node("DequantizeLinear", [f"b{name}", f"bs{name}", f"bz{name}"],
                              [f"bd{name}"], axis=0),
                  h.make_node("Conv", [f"xd{name}", f"wd{name}", f"bd{name}"], [f"c{name}"],
                              group=C, kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4),
                  h.make_node("QuantizeLinear", [f"c{name}", f"sy{name}", f"zy{name}"],
                              [f"cq{name}"]),
                  h.make_node("DequantizeLinear", [f"cq{name}", f"sy{name}", f"zy{name}"],
                              [f"cd{name}"])]
        act = f"cd{name}"
        if name == "s":     # a per-channel affine first: a table row per channel
            inits["am"] = rng.uniform(0.5, 1.5, (1, C, 1, 1)).astype(np.float32)
            inits["aa"] = rng.uniform(-0.5, 0.5, (1, C, 1, 1)).astype(np.float32)
            nodes += [h.make_node("Mul", [act, "am"], ["am_s"]),
                      h.make_node("Add", ["am_s", "aa"], ["aa_s"])]
            act = "aa_s"
        nodes += [h.make_node("HardSwish", [act], [f"hs{name}"]),
                  h.make_node("QuantizeLinear", [f"hs{name}", f"sh{name}", f"zh{name}"],
                              [f"hq{name}"]),
                  h.make_node("DequantizeLinear", [f"hq{name}", f"sh{name}", f"zh{name}"],
                              [f"f{name}"]),
                  h.make_node("ReduceMean", [f"f{name}"], [f"r{name}"], axes=[2, 3],
                              keepdims=1),
                  h.make_node("QuantizeLinear", [f"r{name}", "sm", "zm"], [f"rq{name}"]),
                  h.make_node("DequantizeLinear", [f"rq{name}", "sm", "zm"], [f"m{name}"]),
                  h.make_node("Mul", [f"f{name}", f"m{name}"], [f"gm{name}"]),
                  h.make_node("QuantizeLinear", [f"gm{name}", f"sh{name}", f"zh{name}"],
                              [f"gq{name}"]),
                  h.make_node("DequantizeLinear", [f"gq{name}", f"sh{name}", f"zh{name}"],
                              [f"g{name}"])]
        outs += [h.make_tensor_value_info(f"{k}{name}", T.FLOAT, None) for k in "fmg"]
    # a 1x1 convolution's table (7-bit weights: the open quad kernel, its copy out through
    # the table's columns, ``QConv._lut_open``)
    ws = rng.uniform(0.002, 0.01, C).astype(np.float32)
    inits.update({"wp": rng.integers(-63, 64, (C, C, 1, 1)).astype(np.int8), "wsp": ws,
                  "wzp": np.zeros(C, np.int8), "bp": rng.integers(-4000, 4000, C).astype(np.int32),
                  "bsp": (np.float32(0.05) * ws).astype(np.float32),
                  "bzp": np.zeros(C, np.int32)})
    nodes += [h.make_node("DequantizeLinear", ["wp", "wsp", "wzp"], ["wdp"], axis=0),
              h.make_node("DequantizeLinear", ["bp", "bsp", "bzp"], ["bdp"], axis=0),
              h.make_node("Conv", ["xdu", "wdp", "bdp"], ["cp"], kernel_shape=[1, 1]),
              h.make_node("QuantizeLinear", ["cp", "syu", "zyu"], ["cqp"]),
              h.make_node("DequantizeLinear", ["cqp", "syu", "zyu"], ["cdp"]),
              h.make_node("HardSwish", ["cdp"], ["hsp"]),
              h.make_node("QuantizeLinear", ["hsp", "shu", "zhu"], ["hqp"]),
              h.make_node("DequantizeLinear", ["hqp", "shu", "zhu"], ["fp"])]
    outs.append(h.make_tensor_value_info("fp", T.FLOAT, None))
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)], outs, inits, path)


def _hardswish(v: np.ndarray) -> np.ndarray:
    """ONNX HardSwish in float32: x * max(0, min(1, x / 6 + 1 / 2))."""
    f = np.float32
    return (v * np.maximum(f(0), np.minimum(f(1), (v * f(1 / 6) + f(0.5)).astype(f)))).astype(f)


def _exact_tables(src: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """Each layer's float32 result in numpy: integer sums, float32(acc) * (sx * ws / sy),
    ties to even, dequantized, HardSwish (after the affine), quantized and dequantized."""
    import onnx
    from onnx import numpy_helper
    f = np.float32
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(src)).graph.initializer}
    out = {}
    for name, dt, (sx, zx), (sy, zy), (sh, zh) in LAYERS:
        info = np.iinfo(dt)
        xq = np.clip(np.round((x / f(sx)).astype(f)) + zx, info.min, info.max).astype(np.int64)
        xp = np.pad(xq - zx, ((0, 0), (0, 0), (1, 1), (1, 1)))
        w = init[f"w{name}"].astype(np.int64)[:, 0]
        acc = np.zeros(x.shape[:1] + (C,) + x.shape[2:], np.int64)
        for ky in range(3):
            for kx in range(3):
                acc += xp[:, :, ky:ky + x.shape[2], kx:kx + x.shape[3]] * \
                    w[:, ky, kx].reshape(1, C, 1, 1)
        acc += init[f"b{name}"].astype(np.int64).reshape(1, C, 1, 1)
        mult = (f(sx) * init[f"ws{name}"] / f(sy)).astype(f).reshape(1, C, 1, 1)
        q = np.clip(np.round(acc.astype(np.int32).astype(f) * mult) + f(zy), info.min, info.max)
        v = ((q - f(zy)) * f(sy)).astype(f)
        if name == "s":
            v = ((v * init["am"]).astype(f) + init["aa"]).astype(f)
        t = np.clip(np.round((_hardswish(v) / f(sh)).astype(f)) + f(zh), info.min, info.max)
        out[f"f{name}"] = ((t - f(zh)) * f(sh)).astype(f)
        if name == "u":     # the 1x1 convolution on the same uint8 x
            acc = np.einsum("oc,nchw->nohw", init["wp"].astype(np.int64)[:, :, 0, 0], xq - zx)
            acc += init["bp"].astype(np.int64).reshape(1, C, 1, 1)
            mult = (f(sx) * init["wsp"] / f(sy)).astype(f).reshape(1, C, 1, 1)
            q = np.clip(np.round(acc.astype(np.int32).astype(f) * mult) + f(zy), 0, 255)
            v = ((q - f(zy)) * f(sy)).astype(f)
            t = np.clip(np.round((_hardswish(v) / f(sh)).astype(f)) + f(zh), 0, 255)
            out["fp"] = ((t - f(zh)) * f(sh)).astype(f)
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qdwtable")
    src = _graph(folder / "dwt.onnx", ["N", C, "H", "W"])
    path = folder / "dwt.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3,host", check=False))
    return src, path


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "host"])
def test_depthwise_table_dequantize_exact(bundle, level: str, monkeypatch) -> None:
    src, path = bundle
    if level != "host":
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            assert kinds.count("integer depthwise, tuple words, planes sized at run time") == 2
            assert "table, dequantize" not in kinds, kinds
            for n, hh, ww in SIZES:
                x = (rng.standard_normal((n, C, hh, ww)) * 3).astype(np.float32)
                got = model.run({"x": x})
                names = [o.name for o in sess.get_outputs()]
                want = dict(zip(names, sess.run(None, {"x": x})))
                exact = _exact_tables(src, x)
                for name in names:
                    if name[0] == "g":     # ORT fuses DQ -> Mul -> Q (QLinearMul's rounding):
                        # the graph's float32 product of ORT's own f and m, quantized
                        _, dt, _, _, (sh, zh) = next(t for t in LAYERS if t[0] == name[1])
                        info, f = np.iinfo(dt), np.float32
                        prod = (want["f" + name[1]] * want["m" + name[1]]).astype(f)
                        q = np.clip(np.round((prod / f(sh)).astype(f)) + f(zh), info.min,
                                    info.max)
                        exact[name] = ((q - f(zh)) * f(sh)).astype(f)
                    else:
                        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
                for name, value in exact.items():
                    np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_tables_fold_into_open_depthwise_only(tmp_path: Path) -> None:
    """Open shapes: both depthwise layers take their table and dequantize (9 operands, the
    columns' hints; the uint8 HardSwish table's low columns are constant); a fixed shape keeps
    the lut8 and dequantize (static bundles unchanged)."""
    got = {}
    for name, dims in (("fixed", [1, C, 4, 4]), ("open", ["N", C, "H", "W"])):
        mod, _ = import_onnx(str(_graph(tmp_path / f"{name}.onnx", dims)))
        passes = DEFAULT_PIPELINE[:[p.name for p in DEFAULT_PIPELINE].index("legalize")]
        mod = run_pipeline(mod, passes, options=CompileOptions(target="x86-64-v3"))
        got[name] = [b.value for b in mod.functions["main"].bindings() if hasattr(b.value, "op")]
    assert sum(c.op == "lut8" for c in got["fixed"]) == 2
    looked = [c for c in got["open"] if c.op == "qdwconv2d"]
    assert [len(c.args) for c in looked] == [9, 9] and not any(c.op == "lut8" for c in got["open"])
    assert [c.args[6].data.shape[0] for c in looked] == [1, C]
    assert looked[0].attrs["col_lo"] > 0 and looked[0].type.dtype == "float32"
    # the 1x1 convolution's table: its columns on open sizes only
    conv = {k: [c for c in v if c.op == "qconv2d_quads"] for k, v in got.items()}
    assert "table_cols" not in conv["fixed"][0].attrs
    assert conv["open"][0].attrs["table_cols"][0] > 0, conv["open"][0].attrs

