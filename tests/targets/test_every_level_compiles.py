"""Every kernel family compiles for every level, whatever the host (issue 31): compiling needs no
CPU features, and llvmlite's LLVM is built with assertions, so a loop shape that trips one for a
level no test compiled (the loop vectorizer's "VPlan cost model and legacy cost model
disagreed" on the int8 LSTM for x86-64-v4) would otherwise only show on a host of that level.

A seeded sweep builds one small ONNX model per (family, shape): sizes 1..70 with odd and prime
extents, batch 1..5; the pipeline lowers each for the level (its layout choices depend on the
level), and every kernel of every model compiles in one module per level, which must need no
conservative pipeline (``CompiledCode.fallbacks``: the worker that compiles it found no kernel
LLVM aborts on). The default run takes a stratified slice (the first case of every family);
``MLCPACK_SLOW=1`` the whole sweep (24 per family) and aarch64+dotprod too;
``MLCPACK_SWEEP_CASES=N`` sets the cases per family.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable
from unittest import mock

import numpy as np
import onnx
import pytest
from conftest import SLOW
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from test_dynamic_quant_lstm_int8_recurrence import dq_lstm
from test_rnn_fast_path import rnn_model

import mlcpack.packager.export as export
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.parallel import compile_for_targets
from mlcpack.packager.codegen.target import resolve_target

LEVELS = ["x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64"] + (["aarch64+dotprod"] if SLOW
                                                                else [])
# Extents the sweep draws from: 1..70, odd and prime ones over-represented.
SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 11, 13, 15, 16, 17, 19, 21, 23, 24, 29, 31, 32, 33, 37, 41,
         43, 47, 48, 53, 59, 61, 63, 64, 67, 70]
CASES_PER_FAMILY = int(os.environ.get("MLCPACK_SWEEP_CASES", 24 if SLOW else 1))


def _size(rng: np.random.Generator, top: int = 70) -> int:
    return int(rng.choice([s for s in SIZES if s <= top]))


def _model(nodes, inputs, outputs, inits=(), opset: int = 18) -> onnx.ModelProto:
    vi = h.make_tensor_value_info
    graph = h.make_graph(nodes, "g", [vi(n, t, s) for n, t, s in inputs],
                         [vi(n, t, None) for n, t in outputs],
                         [nh.from_array(v, k) for k, v in inits])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset),
                                              h.make_opsetid("com.microsoft", 1)],
                        ir_version=8)


def _w(rng, *shape) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


# ---- the families: rng -> (case id, model) -------------------------------------------------


def matmul(rng):
    b, m, k, n = int(rng.integers(1, 6)), _size(rng), _size(rng), _size(rng)
    nodes = [h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Add", ["y", "c"], ["z"]),
             h.make_node("Relu", ["z"], ["out"])]
    return f"{b}x{m}x{k}x{n}", _model(nodes, [("x", T.FLOAT, [b, m, k])], [("out", T.FLOAT)],
                                      [("w", _w(rng, k, n)), ("c", _w(rng, n))])


def batched_matmul(rng):
    b, m, k, n = int(rng.integers(1, 6)), _size(rng), _size(rng), _size(rng)
    return f"{b}x{m}x{k}x{n}", _model([h.make_node("MatMul", ["x", "y"], ["out"])],
                                      [("x", T.FLOAT, [b, m, k]), ("y", T.FLOAT, [b, k, n])],
                                      [("out", T.FLOAT)])


def conv(rng, depthwise: bool = False):
    b, c, hw = int(rng.integers(1, 6)), _size(rng, 48), _size(rng, 40)
    o = c if depthwise else _size(rng, 48)
    kh = int(rng.choice([1, 3, 5])) if hw >= 5 else 1
    stride, pad = int(rng.integers(1, 3)), kh // 2
    node = h.make_node("Conv", ["x", "w", "bias"], ["y"], strides=[stride, stride],
                       pads=[pad] * 4, group=c if depthwise else 1)
    w = _w(rng, o, 1 if depthwise else c, kh, kh)
    return f"{b}x{c}x{hw}x{o}k{kh}s{stride}", _model(
        [node, h.make_node("Relu", ["y"], ["out"])], [("x", T.FLOAT, [b, c, hw, hw + 1])],
        [("out", T.FLOAT)], [("w", w), ("bias", _w(rng, o))])


def depthwise(rng):
    return conv(rng, depthwise=True)


def pool(rng):
    b, c, hw = int(rng.integers(1, 6)), _size(rng, 32), _size(rng, 40)
    k = int(min(hw, rng.choice([2, 3])))
    nodes = [h.make_node("MaxPool", ["x"], ["p"], kernel_shape=[k, k], strides=[k, k]),
             h.make_node("AveragePool", ["p"], ["a"], kernel_shape=[1, 1]),
             h.make_node("GlobalAveragePool", ["a"], ["out"])]
    return f"{b}x{c}x{hw}k{k}", _model(nodes, [("x", T.FLOAT, [b, c, hw, hw])],
                                       [("out", T.FLOAT)])


def softmax_norm(rng):
    b, r, n = int(rng.integers(1, 6)), _size(rng), _size(rng)
    nodes = [h.make_node("Softmax", ["x"], ["s"], axis=-1),
             h.make_node("LayerNormalization", ["s", "g", "beta"], ["out"], axis=-1)]
    return f"{b}x{r}x{n}", _model(nodes, [("x", T.FLOAT, [b, r, n])], [("out", T.FLOAT)],
                                  [("g", _w(rng, n)), ("beta", _w(rng, n))])


def reduce(rng):
    b, r, n = int(rng.integers(1, 6)), _size(rng), _size(rng)
    op = str(rng.choice(["ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum"]))
    axis = int(rng.integers(0, 3))
    nodes = [h.make_node(op, ["x", "axes"], ["out"], keepdims=1)]
    return f"{op}{b}x{r}x{n}a{axis}", _model(nodes, [("x", T.FLOAT, [b, r, n])],
                                             [("out", T.FLOAT)],
                                             [("axes", np.array([axis], np.int64))])


def elementwise(rng):
    b, r, n = int(rng.integers(1, 6)), _size(rng), _size(rng)
    nodes = [h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Tanh", ["x"], ["t"]),
             h.make_node("Mul", ["s", "t"], ["m"]), h.make_node("Erf", ["m"], ["e"]),
             h.make_node("Div", ["e", "c"], ["d"]), h.make_node("Exp", ["d"], ["x2"]),
             h.make_node("Clip", ["x2", "lo", "hi"], ["out"])]
    inits = [("c", np.float32(1.5) + np.abs(_w(rng, n))), ("lo", np.array(-1, np.float32)),
             ("hi", np.array(2, np.float32))]
    return f"{b}x{r}x{n}", _model(nodes, [("x", T.FLOAT, [b, r, n])], [("out", T.FLOAT)], inits)


def transpose_concat(rng):
    b, r, n = int(rng.integers(1, 6)), _size(rng), _size(rng)
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             h.make_node("Concat", ["t", "t"], ["c"], axis=1),
             h.make_node("Pad", ["c", "pads"], ["out"])]
    return f"{b}x{r}x{n}", _model(nodes, [("x", T.FLOAT, [b, r, n])], [("out", T.FLOAT)],
                                  [("pads", np.array([0, 1, 0, 0, 2, 1], np.int64))])


def recurrence(rng):
    cell = str(rng.choice(["LSTM", "GRU", "RNN"]))
    t, b, i, hid = int(rng.integers(1, 10)), int(rng.integers(1, 6)), _size(rng, 40), \
        _size(rng, 70)
    direction = str(rng.choice(["forward", "reverse", "bidirectional"]))
    lbr = int(rng.integers(0, 2)) if cell == "GRU" else 0
    model, _ = rnn_model(cell, t, b, i, hid, direction, lbr=lbr, seed=int(rng.integers(1 << 30)))
    return f"{cell}{t}x{b}x{i}x{hid}{direction[0]}{lbr}", model


def int8_recurrence(rng):
    t, b, i, hid = int(rng.integers(1, 10)), int(rng.integers(1, 6)), _size(rng, 40), \
        _size(rng, 70)
    direction = str(rng.choice(["forward", "reverse", "bidirectional"]))
    dtype, per_row = str(rng.choice(["uint8", "int8"])), bool(rng.integers(0, 2))
    model, _ = dq_lstm(t, b, i, hid, direction, dtype, per_row, seed=int(rng.integers(1 << 30)))
    return f"{t}x{b}x{i}x{hid}{direction[0]}{dtype}{int(per_row)}", model


def integer_matmul(rng):
    b, m, k, n = int(rng.integers(1, 6)), _size(rng), _size(rng), _size(rng)
    nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             h.make_node("MatMulInteger", ["q", "w", "z", "wz"], ["acc"]),
             h.make_node("Cast", ["acc"], ["f"], to=T.FLOAT),
             h.make_node("Mul", ["s", "ws"], ["scale"]),
             h.make_node("Mul", ["f", "scale"], ["out"])]
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    inits = [("w", w), ("wz", np.zeros(n, np.int8)), ("ws", np.float32(0.02))]
    return f"{b}x{m}x{k}x{n}", _model(nodes, [("x", T.FLOAT, [b, m, k])], [("out", T.FLOAT)],
                                      inits)


def symbolic_batch(rng):
    """A batch left symbolic ("N"): the kernels take their extents at run time."""
    c, hw, o, n = _size(rng, 32), _size(rng, 33), _size(rng, 32), _size(rng)
    nodes = [h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["y"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["g"]),
             h.make_node("Flatten", ["g"], ["f"]),
             h.make_node("MatMul", ["f", "m"], ["mm"]),
             h.make_node("Softmax", ["mm"], ["out"], axis=-1)]
    return f"{c}x{hw}x{o}x{n}", _model(nodes, [("x", T.FLOAT, ["N", c, hw, hw])],
                                       [("out", T.FLOAT)],
                                       [("w", _w(rng, o, c, 3, 3)), ("m", _w(rng, o, n))])


FAMILIES: dict[str, Callable] = {f.__name__: f for f in (
    matmul, batched_matmul, conv, depthwise, pool, softmax_norm, reduce, elementwise,
    transpose_concat, recurrence, int8_recurrence, integer_matmul, symbolic_batch)}


def cases() -> list[tuple[str, onnx.ModelProto]]:
    """(id, model) of the sweep: CASES_PER_FAMILY per family, from one seed per family."""
    out = []
    for seed, (name, family) in enumerate(FAMILIES.items()):
        rng = np.random.default_rng(1000 + seed)
        for _ in range(CASES_PER_FAMILY):
            case, model = family(rng)
            out.append((f"{name}_{case}", model))
    return out


class _Captured(Exception):
    pass


def lowered_kernels(model: onnx.ModelProto, level: str):
    """The prim funcs and size variables that ``mlcpack export --target LEVEL`` would hand
    to the code generator for ``model``."""
    got = {}

    def capture(funcs, targets, size_vars=(), options=None):
        got["funcs"], got["size_vars"] = list(funcs), tuple(size_vars)
        raise _Captured

    mod, _ = import_onnx(model)
    with mock.patch.object(export, "compile_for_targets", capture):
        with pytest.raises(_Captured):
            export.compile_variants(mod, target=level)
    return got["funcs"], got["size_vars"]


@pytest.mark.parametrize("level", LEVELS)
def test_every_kernel_family_compiles_for_every_level(level) -> None:
    by_vars: dict[tuple, list] = {}
    for case, model in cases():
        funcs, size_vars = lowered_kernels(model, level)
        by_vars.setdefault(size_vars, []).extend(
            dataclasses.replace(f, name=f"{case}__{f.name}") for f in funcs)
    target = resolve_target(level)
    for size_vars, funcs in by_vars.items():
        (code,) = compile_for_targets(funcs, [target], size_vars)
        assert not code.fallbacks, "LLVM aborted on: " + "; ".join(
            f"{fb.kernel} ({fb.reason})" for fb in code.fallbacks)
        assert code.object_code
        names = {f.name for f in funcs}
        assert set(code.kernels) == names


def _host_runs(level: str) -> bool:
    """Whether this machine really runs code for ``level`` (its own /proc/cpuinfo, whatever
    ``MLCPACK_CPU_FEATURES`` pretends)."""
    import platform

    from mlcpack.runtime import cpu

    lv = cpu.level(level)
    if lv.arch != {"arm64": "aarch64"}.get(platform.machine(), platform.machine()):
        return False
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags |= set(line.split(":", 1)[1].split())
    return lv.flags <= flags


def _corpus_like() -> dict[str, tuple[onnx.ModelProto, dict]]:
    from conftest import ARTIFACTS
    rng = np.random.default_rng(7)
    models = {name: onnx.load(ARTIFACTS / f"{name}.onnx") for name in ("cnn", "mlp")}
    out = {}
    for name, model in models.items():
        feeds = {i.name: rng.standard_normal([d.dim_value or 1 for d in
                                              i.type.tensor_type.shape.dim]).astype(np.float32)
                 for i in model.graph.input}
        out[name] = (model, feeds)
    # the model of issue 31: its int8 recurrence kernel made LLVM assert for x86-64-v4
    out["dq_lstm"] = dq_lstm(9, 3, 6, 21, "bidirectional", "uint8", True, seed=24)
    return out


@pytest.mark.parametrize("level", LEVELS)
def test_corpus_like_models_export_for_every_level(level, tmp_path) -> None:
    """Real exports for the level, without a kernel falling back; run against ONNX Runtime
    (one thread: see test_dq_lstm_int8_recurrence) where this machine runs the level."""
    ort = pytest.importorskip("onnxruntime")
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    for name, (model, feeds) in _corpus_like().items():
        path = tmp_path / f"{name}.mlc"
        report = export_module(import_onnx(model)[0], path, ExportOptions(target=level))
        assert report.compile_warnings == [], name
        if not _host_runs(level):
            continue
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        with load(path) as bundle:
            got = bundle.run(feeds)
        for out_name, want in zip(names, sess.run(names, feeds)):
            np.testing.assert_allclose(got[out_name], want, rtol=1e-4, atol=2e-5,
                                       err_msg=f"{name} {out_name}")
