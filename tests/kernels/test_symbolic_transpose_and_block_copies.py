"""A decoder's KV cache with a run-time length T (issue 37 follow-up): the tiled transpose
(packager/codegen/transpose.py) takes run-time extents (``cache^T`` for ``q @ K^T``: the plane
loops count whole tiles at run time, the edges copy what is left), and a concatenation whose
piece is a contiguous run from an axis before the last (the cache grown along T) copies it with
one ``llvm.memcpy`` per range (``KernelEmitter._copy_run``). Exact against ONNX Runtime at
x86-64-v2 and the host, 1 and 2 threads, extents below, at and past a tile."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mlcpack.packager.export as export
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load


def _model():
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Concat", ["a", "b"], ["y"], axis=2),       # the cache grows
             helper.make_node("Concat", ["a", "c"], ["z"], axis=-1),      # rows: stay loops
             helper.make_node("Transpose", ["a"], ["t"], perm=[0, 1, 3, 2]),
             helper.make_node("Transpose", ["c"], ["u"], perm=[0, 1, 3, 2])]
    graph = helper.make_graph(
        nodes, "kv",
        [helper.make_tensor_value_info("a", f, [1, 4, "T", 16]),
         helper.make_tensor_value_info("b", f, [1, 4, "S", 16]),
         helper.make_tensor_value_info("c", f, [1, 4, "T", "R"])],
        [helper.make_tensor_value_info(n, f, None) for n in "yztu"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["x86-64-v2", "host"])
def test_kv_cache_transpose_and_concat_against_ort(target, tmp_path, monkeypatch) -> None:
    captured = []
    real = export.compile_for_targets

    def spy(funcs, targets, *args, **kwargs):
        out = real(funcs, targets, *args, **kwargs)
        captured.extend(out)
        return out

    monkeypatch.setattr(export, "compile_for_targets", spy)
    model = _model()
    mod, _ = import_onnx(model)
    path = tmp_path / "kv.mlc"
    export_module(mod, path, ExportOptions(target=target, check=False))
    (code,) = captured
    choices = {name: k.choice for name, k in code.kernels.items()}
    assert choices["transpose"] == choices["transpose1"] == "transpose", choices
    assert "llvm.memcpy" in code.llvm_ir
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            for t, s, r in [(1, 1, 1), (7, 1, 9), (8, 2, 8), (37, 3, 21), (300, 1, 130)]:
                feeds = {"a": rng.standard_normal((1, 4, t, 16)).astype(np.float32),
                         "b": rng.standard_normal((1, 4, s, 16)).astype(np.float32),
                         "c": rng.standard_normal((1, 4, t, r)).astype(np.float32)}
                got = m.run(feeds)
                for name, ref in zip("yztu", session.run(None, feeds)):
                    np.testing.assert_array_equal(got[name], ref, err_msg=f"{name} {(t, s, r)}")
