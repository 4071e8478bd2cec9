"""Concatenations along axes with run-time extents (issue 12): a symbolic kernel splits the
concat's select chain into one copy loop per input, the split points computed and clamped at
run time (``KernelEmitter._run_time_ranges``), on 1 and 2 threads. YOLOv8's head concatenates
its three scales' [N, C, H/8*W/8], [N, C, H/16*W/16], [N, C, H/32*W/32] this way."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import export_module
from mlcpack.runtime import load


def _model():
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=2),
             helper.make_node("Concat", ["a", "a"], ["z"], axis=1),
             helper.make_node("Concat", ["b", "c", "b"], ["w"], axis=-1)]
    graph = helper.make_graph(
        nodes, "cat",
        [helper.make_tensor_value_info("a", f, ["N", 24, "P"]),
         helper.make_tensor_value_info("b", f, ["N", 24, "Q"]),
         helper.make_tensor_value_info("c", f, ["N", 24, "R"])],
        [helper.make_tensor_value_info(n, f, None) for n in ("y", "z", "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_concat_of_run_time_extents_against_ort(threads, tmp_path) -> None:
    model = _model()
    mod, _ = import_onnx(model)
    path = tmp_path / "cat.mlc"
    export_module(mod, path)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with load(path, threads=threads) as m:
        for n, p, q, r in [(1, 1600, 400, 100), (2, 7, 1, 3), (1, 1, 1, 1), (3, 33, 65, 2),
                           (1, 5000, 3, 700)]:
            feeds = {k: rng.standard_normal((n, 24, e)).astype(np.float32)
                     for k, e in (("a", p), ("b", q), ("c", r))}
            got = m.run(feeds)
            for name, ref in zip(("y", "z", "w"), session.run(None, feeds)):
                np.testing.assert_array_equal(got[name], ref, err_msg=f"{name} {(n, p, q, r)}")
