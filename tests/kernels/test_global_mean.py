"""The global-mean kernel (codegen/pool.py: a sum over trailing axes, times or divided by a
constant; GlobalAveragePool, ReduceMean/ReduceSum over H, W or the last axis) against ONNX
Runtime: runs shorter than one vector, between the accumulator blocks, 4-accumulator blocks
with a tail, batch 2, keepdims on and off, 1 and 2 threads (a kernel large enough to split)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers import assert_runs_match, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import best_level

# (name, input shape, op, axes, keepdims, the kernel takes it)
CASES = [
    ("gap_7x7", (1, 37, 7, 7), "GlobalAveragePool", None, 1, True),
    ("gap_14x14_b2", (2, 24, 14, 14), "GlobalAveragePool", None, 1, True),
    ("gap_56x56", (1, 24, 56, 56), "GlobalAveragePool", None, 1, True),   # parallel
    ("gap_1x1", (1, 5, 1, 1), "GlobalAveragePool", None, 1, True),
    ("gap_2x3", (1, 9, 2, 3), "GlobalAveragePool", None, 1, True),
    ("gap_13x11", (1, 3, 13, 11), "GlobalAveragePool", None, 1, True),
    ("mean_hw_nokeep", (2, 6, 9, 10), "ReduceMean", [2, 3], 0, True),
    ("mean_last", (2, 5, 37), "ReduceMean", [-1], 1, True),
    ("sum_hw", (1, 7, 6, 6), "ReduceSum", [2, 3], 1, True),
    ("mean_channels", (1, 6, 5, 5), "ReduceMean", [1], 1, False),   # not trailing: generic
]


def _model():
    nodes, inputs, outputs = [], [], []
    for name, shape, op, axes, keep, _ in CASES:
        x, y = f"{name}_x", f"{name}_y"
        inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, list(shape)))
        if op == "GlobalAveragePool":
            nodes.append(helper.make_node(op, [x], [y]))
        elif op == "ReduceSum":   # opset 13+: axes as an input
            nodes.append(helper.make_node("Constant", [], [f"{name}_axes"],
                                          value=helper.make_tensor(f"{name}_a", TensorProto.INT64,
                                                                   [len(axes)], axes)))
            nodes.append(helper.make_node(op, [x, f"{name}_axes"], [y], keepdims=keep))
        else:
            nodes.append(helper.make_node(op, [x], [y], axes=axes, keepdims=keep))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "means", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "means.onnx"
    onnx.save(_model(), str(path))
    return path


@pytest.mark.parametrize("target", ["host", "x86-64-v2"])
def test_global_mean_matches_onnxruntime(target, model_path, tmp_path):
    if target != "host" and (best_level() or "").startswith("aarch64"):
        pytest.skip("an x86-64 level on an aarch64 host")
    mod, _ = import_onnx(str(model_path))
    bundle = tmp_path / "means.mlc"
    export_module(mod, bundle, ExportOptions(target=target))
    rng = np.random.default_rng(3)
    feeds = {f"{name}_x": (rng.standard_normal(shape) + 0.5).astype(np.float32)
             for name, shape, *_ in CASES}
    want = ort_outputs(model_path, feeds)
    assert sorted(want) == sorted(f"{name}_y" for name, *_ in CASES)
    assert_runs_match(bundle, feeds, want, rtol=2e-6, atol=2e-6, label=target)
    # the choice `mlcpack inspect` shows per kernel: the global mean by its own name (it was
    # shown as the row of the rule that tries it, "max pool")
    with load(bundle) as model:
        choices = [k.get("kernel") for k in model.header["kernels"]]
    assert "max pool" not in choices, choices
    assert sum(str(c).startswith("global mean") for c in choices) == \
        sum(case[-1] for case in CASES), choices


def test_global_mean_matching(model_path):
    """Which of the cases' kernels the global-mean kernel takes (the others: generic)."""
    from mlcpack.packager.codegen.pool import match_global_mean

    mod, _ = import_onnx(str(model_path))
    funcs = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs().values()
    taken = {f.inputs[0].shape: match_global_mean(f) is not None for f in funcs
             if len(f.inputs) == 1}
    for name, shape, _, _, _, expected in CASES:
        assert taken[tuple(shape)] is expected, name
