"""The golden check's inputs respect what the model's ops imply (packager/golden_inputs.py):
an integer input compared with a constant where the comparison decides an If (silero VAD's
sample rate) takes a value the comparison accepts, and the sizes meet the checks of the branch
that value takes (a reflect pad narrower than the length, one frame for a Squeeze). With zeros
and the smallest sizes ONNX Runtime cannot run such a model and the default export went
unchecked. The same on silero VAD v5 and v6 themselves: tests/corpus/test_silero_vad_v6.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.golden_inputs import steering_values
from mlcpack.runtime import load
from mlcpack.runtime.selftest import verify

import branch_models as bm
from helpers import ort_outputs


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    from mlcpack.packager.api import Options, export

    folder = tmp_path_factory.mktemp("padded")
    src = bm.padded_rate_switch(folder / "padded.onnx")
    bundle = folder / "padded.mlc"
    result = export(src, bundle, Options())   # the command line's defaults
    return src, bundle, result.check


def test_default_export_is_checked_at_a_rate_and_length_the_model_takes(padded) -> None:
    _, bundle, check = padded
    assert check.startswith("golden check passed against onnxruntime"), check
    assert ("check inputs chosen for the model's If: sr = 16000 (a value its condition "
            "accepts); x (2, 4, 128) (sizes the taken branch needs)") in check, check
    assert verify(bundle).ok   # the pair is embedded: verify reruns it with the runtime alone


@pytest.mark.parametrize("n, length, rate", [(1, 65, 16000), (3, 192, 16000), (2, 33, 8000),
                                             (1, 96, 8000)])
def test_both_rates_match_onnx_runtime(padded, n, length, rate) -> None:
    src, bundle, _ = padded
    feeds = {"x": np.random.default_rng(length).standard_normal((n, 4, length))
             .astype(np.float32), "sr": np.array(rate, np.int64)}
    with load(bundle) as model:
        got = model.run(feeds)["y"]
    np.testing.assert_allclose(got, ort_outputs(src, feeds)["y"], rtol=1e-5, atol=1e-5)


def _decides(compare: str, const_first: bool, consumer: str) -> onnx.ModelProto:
    """mode (int32 scalar) compared with 5 by ``compare``; the result decides ``consumer``
    ("If", "Where") or only feeds arithmetic ("Cast")."""
    f = TensorProto.FLOAT
    pair = ["five", "mode"] if const_first else ["mode", "five"]
    nodes = [helper.make_node(compare, pair, ["c"])]
    if consumer == "If":
        branch = [helper.make_graph([helper.make_node("Mul", ["x", k], [f"y{k}"])], f"b{k}", [],
                                    [helper.make_tensor_value_info(f"y{k}", f, None)])
                  for k in ("two", "three")]
        nodes.append(helper.make_node("If", ["c"], ["y"], then_branch=branch[0],
                                      else_branch=branch[1]))
    elif consumer == "Where":
        nodes.append(helper.make_node("Where", ["c", "x", "two"], ["y"]))
    else:
        nodes += [helper.make_node("Cast", ["c"], ["cf"], to=f),
                  helper.make_node("Mul", ["x", "cf"], ["y"])]
    inits = [numpy_helper.from_array(np.array(5, np.int32), "five"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three")]
    graph = helper.make_graph(nodes, "decides",
                              [helper.make_tensor_value_info("x", f, [2, 3]),
                               helper.make_tensor_value_info("mode", TensorProto.INT32, [])],
                              [helper.make_tensor_value_info("y", f, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("compare, const_first, consumer, value", [
    ("Equal", False, "If", 5), ("Equal", True, "Where", 5), ("Greater", False, "If", 6),
    ("Greater", True, "Where", 4), ("LessOrEqual", True, "If", 5), ("Less", False, "Where", 4),
    ("Equal", False, "Cast", None)])
def test_steering_value_makes_the_deciding_comparison_hold(compare, const_first, consumer,
                                                          value) -> None:
    mod, _ = import_onnx(_decides(compare, const_first, consumer))
    assert steering_values(mod) == ({} if value is None else {"mode": value})
