"""Outputs written in place: a large output's kernels write the array a run returns (a new,
64-byte aligned one, or the caller's ``out=`` array) instead of the arena, so no copy of the
arena's bytes follows. The slots go back to the arena after every run; an output that a library
call or a copy touches, or that shares its bytes with an input or another output, is copied as
before, and so is any output of a bundle whose header lists no output views."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from mlcpack.packager.export import export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.runtime import load
from mlcpack.runtime import model as runtime_model
from mlcpack.runtime.static_plan import output_bindings

RNG = np.random.default_rng(11)
W1 = RNG.standard_normal((48, 32)).astype(np.float32)
W2 = RNG.standard_normal((32, 7)).astype(np.float32)


def two_output_module(reshape: bool = False):
    """h = relu(x @ W1) and y = h @ W2, both outputs: h is also read by the kernel after it;
    ``reshape``: y is returned through a reshape (a second tensor row over its bytes)."""
    bb = BlockBuilder()
    x = bb.input("x", (4, 48))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_op("relu", bb.emit_op("matmul", x, bb.constant(W1, "w1")))
            y = bb.emit_op("matmul", h, bb.constant(W2, "w2"))
            if reshape:
                y = bb.emit_op("reshape", y, shape=(28,))
            out_h = bb.emit_output(h)
            out_y = bb.emit_output(y)
        bb.emit_func_output([out_h, out_y], names=["h", "y"])
    return bb.get()


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.maximum(x.astype(np.float64) @ W1, 0)
    return h, h @ W2


@pytest.fixture(autouse=True)
def bind_small_outputs(monkeypatch):
    """These outputs are a few hundred bytes, which a run copies out (cheaper than a new
    array's address); the tests here are about binding, so every size binds."""
    monkeypatch.setattr(runtime_model, "OUTPUT_INPLACE_MIN_BYTES", 0)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "through-reshape"])
def bundle(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("outbind") / "two.mlc"
    export_module(two_output_module(reshape=request.param), path)
    return path, request.param


def check(h, y, x, reshape) -> None:
    rh, ry = reference(x)
    np.testing.assert_allclose(h, rh, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(y, ry.reshape(28) if reshape else ry, rtol=1e-4, atol=1e-3)


def test_outputs_are_written_where_returned_and_survive_the_next_run(bundle) -> None:
    path, reshape = bundle
    x1, x2 = (RNG.standard_normal((4, 48)).astype(np.float32) for _ in range(2))
    with load(path) as model:
        assert set(model._main._output_bindings) == {"h", "y"}
        h1, y1 = model(x1)
        h1_before, y1_before = h1.copy(), y1.copy()
        h2, y2 = model(x2)
        for b in model._main._output_bindings.values():   # back on the arena after each run
            assert b.current == b.arena
        arena = model._main._views
        assert not np.array_equal(arena["y"], y2), "a bound output is not written to the arena"
    check(h1, y1, x1, reshape)
    check(h2, y2, x2, reshape)
    np.testing.assert_array_equal(h1, h1_before)
    np.testing.assert_array_equal(y1, y1_before)
    for a, b in ((h1, h2), (y1, y2), (h2, y2)):
        assert not np.shares_memory(a, b)
    for a in (h1, y1, h2, y2):
        assert a.ctypes.data % runtime_model.ARENA_ALIGN == 0


def test_out_arrays_are_written_in_place_or_copied(bundle) -> None:
    """An aligned out= array is the kernels' destination; an unaligned one, or one that shares
    memory with the input, is filled by a copy: either way it holds the answer."""
    path, reshape = bundle
    x = RNG.standard_normal((4, 48)).astype(np.float32)
    y_shape = (28,) if reshape else (4, 7)
    with load(path) as model:
        h_out = runtime_model._aligned_empty(np.empty((4, 32), np.float32))[0]
        raw = np.empty(4 * 28 + 68, np.uint8)
        skip = (-raw.ctypes.data % 64) + 4           # 4 bytes past a 64-byte boundary
        y_out = raw[skip:skip + 4 * 28].view(np.float32).reshape(y_shape)
        result = model.run({"x": x}, out={"h": h_out, "y": y_out})
        assert result["h"] is h_out and result["y"] is y_out
        check(h_out, y_out, x, reshape)
        # out= overlapping the input: the kernels must not write where they read
        big = np.zeros(4 * 48 + 4 * 32, np.float32)
        xin = big[:4 * 48].reshape(4, 48)
        xin[:] = x
        h_alias = big[4 * 48:].reshape(4, 32)
        y = model.run({"x": xin}, out={"h": h_alias})
        check(h_alias, y["y"], x, reshape)
        assert list(y) == ["h", "y"]


def test_profile_and_other_runs_after_a_bound_run_leave_returned_arrays_alone(bundle) -> None:
    path, reshape = bundle
    x1, x2 = (RNG.standard_normal((4, 48)).astype(np.float32) for _ in range(2))
    with load(path) as model:
        h1, y1 = model(x1)
        keep = (h1.copy(), y1.copy())
        model.profile({"x": x2}, runs=2)
        only_y = model.run({"x": x2}, outputs=["y"])
        np.testing.assert_array_equal(h1, keep[0])
        np.testing.assert_array_equal(y1, keep[1])
        check(reference(x2)[0], only_y["y"], x2, reshape)


def test_sessions_in_threads_each_get_their_own_answers(bundle) -> None:
    path, reshape = bundle
    xs = [RNG.standard_normal((4, 48)).astype(np.float32) for _ in range(4)]
    errors: list[BaseException] = []
    with load(path) as model:
        def work(x):
            try:
                with model.session() as s:
                    for _ in range(20):
                        h, y = s(x)
                        check(h, y, x, reshape)
            except BaseException as exc:   # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(x,)) for x in xs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_no_binding_without_output_views_or_when_bytes_are_shared(bundle) -> None:
    path, _ = bundle
    with load(path) as model:
        plan = model._main._plans[-1]
        recipe = model._plan.code.recipes[-1]
        row = recipe.row
        none = dataclasses.replace(row, outputs=tuple(dataclasses.replace(o, views=None)
                                                      for o in row.outputs))
        assert output_bindings(none, recipe.tensors, plan.executor,
                               [v.ctypes.data for v in plan.views], 0) == {}
        # y listing h's row too: the two outputs would share bytes, so neither binds
        h_row, y_row = row.outputs
        shared = dataclasses.replace(row, outputs=(
            h_row, dataclasses.replace(y_row, views=tuple(sorted({*y_row.views, h_row.tensor})))))
        assert "y" not in output_bindings(shared, recipe.tensors, plan.executor,
                                          [v.ctypes.data for v in plan.views], 0)


def test_small_outputs_are_copied_at_the_default_size(bundle, monkeypatch) -> None:
    monkeypatch.setattr(runtime_model, "OUTPUT_INPLACE_MIN_BYTES", 65536)
    path, reshape = bundle
    x = RNG.standard_normal((4, 48)).astype(np.float32)
    with load(path) as model:
        assert model._main._output_bindings == {}
        h, y = model(x)
    check(h, y, x, reshape)


@pytest.mark.parametrize("threads", [1, 2])
def test_large_conv_output_matches_onnxruntime(tmp_path, monkeypatch, threads) -> None:
    """The path users take: an ONNX model whose output (128 KB) binds at the default size."""
    monkeypatch.setattr(runtime_model, "OUTPUT_INPLACE_MIN_BYTES", 65536)
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from mlcpack.frontends.onnx import import_onnx

    w = (RNG.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])],
        [numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "c.onnx")
    mod, _ = import_onnx(str(tmp_path / "c.onnx"))
    export_module(mod, tmp_path / "c.mlc")
    sess = ort.InferenceSession(str(tmp_path / "c.onnx"), providers=["CPUExecutionProvider"])
    with load(tmp_path / "c.mlc", threads=threads) as model:
        assert "y" in model._main._output_bindings
        results = []
        for _ in range(3):
            x = RNG.standard_normal((1, 16, 32, 32)).astype(np.float32)
            results.append((x, model(x)))
        for x, y in results:
            np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
