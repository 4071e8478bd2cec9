"""Inputs read in place: a contiguous, aligned input array is handed to the kernels that read it
(their argument slots are repointed) instead of being copied into the arena. Anything else is
copied as before, and an input that a library call, a copy or an output needs stays copied."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.export import export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.ir.graph import TensorType
from mlcpack.runtime import load
from mlcpack.runtime import model as runtime_model

from bundle_parts import read_parts, write_parts
from helpers import force_parallel_kernels

RNG = np.random.default_rng(5)
W1 = RNG.standard_normal((48, 32)).astype(np.float32)
W2 = RNG.standard_normal((32, 7)).astype(np.float32)


def mlp_module(flatten: bool = False):
    """relu(x @ W1) @ W2, optionally reading x through a reshape of a (4, 3, 16) input."""
    bb = BlockBuilder()
    x = bb.input("x", (4, 3, 16) if flatten else (4, 48))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_op("reshape", x, shape=(4, 48)) if flatten else x
            h = bb.emit_op("relu", bb.emit_op("matmul", h, bb.constant(W1, "w1")))
            out = bb.emit_output(bb.emit_op("matmul", h, bb.constant(W2, "w2")))
        bb.emit_func_output(out, names=["y"])
    return bb.get()


def reference(x: np.ndarray) -> np.ndarray:
    h = np.maximum(x.reshape(4, 48).astype(np.float64) @ W1, 0)
    return h @ W2


def binding(model):
    return model._main._feeds[0][3]


@pytest.fixture(autouse=True)
def bind_small_inputs(monkeypatch):
    """These models' inputs are a few hundred bytes, which a run copies into the arena (cheaper
    than taking the array's address); the tests here are about binding, so every size binds."""
    monkeypatch.setattr(runtime_model, "INPLACE_MIN_BYTES", 0)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "through-reshape"])
def bundle(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("bind") / "mlp.mlc"
    export_module(mlp_module(flatten=request.param), path)
    return path, (4, 3, 16) if request.param else (4, 48)


def test_contiguous_input_is_read_in_place_and_left_unchanged(bundle) -> None:
    path, shape = bundle
    x = RNG.standard_normal(shape).astype(np.float32)
    before = x.copy()
    with load(path) as model:
        b = binding(model)
        assert b is not None and b.slots, "the kernels reading x should be bindable"
        y = model(x)
        assert b.current == x.ctypes.data
        arena_copy = model._main._feeds[0][1]
        assert not np.shares_memory(arena_copy, x)
        assert not np.array_equal(arena_copy, x), "a bound input is not copied into the arena"
    np.testing.assert_allclose(y, reference(x), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(x, before)


def test_every_layout_alternating_gives_the_right_answer(bundle) -> None:
    """Bound, copied (Fortran order, strided, unaligned), read-only, bound again: each run
    reads the input it was given, whatever the previous run did with the slots."""
    path, shape = bundle
    n = int(np.prod(shape))
    raw = bytearray(4 * n + 1)
    unaligned = np.frombuffer(raw, dtype=np.float32, count=n, offset=1).reshape(shape)
    assert not unaligned.flags.aligned
    readonly = np.frombuffer(RNG.standard_normal(n).astype(np.float32).tobytes(),
                             dtype=np.float32).reshape(shape)
    assert not readonly.flags.writeable
    wide = RNG.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(np.float32)
    cases = [
        ("contiguous", RNG.standard_normal(shape).astype(np.float32), True),
        ("fortran", np.asfortranarray(RNG.standard_normal(shape).astype(np.float32)), False),
        ("strided", wide[..., ::2], False),
        ("contiguous again", RNG.standard_normal(shape).astype(np.float32), True),
        ("unaligned", unaligned, False),
        ("read-only", readonly, True),
    ]
    unaligned[...] = RNG.standard_normal(shape).astype(np.float32)
    with load(path) as model:
        b = binding(model)
        for what, x, in_place in cases:
            y = model(x)
            arr = np.asarray(x, dtype=np.float32)
            np.testing.assert_allclose(y, reference(arr), rtol=1e-4, atol=1e-3, err_msg=what)
            assert (b.current == arr.ctypes.data) == in_place, what
            if not in_place:
                assert b.current == b.arena, what


def test_small_input_is_copied_not_bound(bundle, monkeypatch) -> None:
    """Below INPLACE_MIN_BYTES a run copies the input into the arena (and puts the slots back on
    the arena's copy after a bound run): same answers either way."""
    path, shape = bundle
    monkeypatch.setattr(runtime_model, "INPLACE_MIN_BYTES", 4 * int(np.prod(shape)) + 1)
    with load(path) as model:
        b = binding(model)
        for _ in range(2):
            x = RNG.standard_normal(shape).astype(np.float32)
            np.testing.assert_allclose(model(x), reference(x), rtol=1e-4, atol=1e-3)
            assert b.current == b.arena
        monkeypatch.setattr(runtime_model, "INPLACE_MIN_BYTES", 0)
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(model(x), reference(x), rtol=1e-4, atol=1e-3)
        assert b.current == x.ctypes.data
        monkeypatch.setattr(runtime_model, "INPLACE_MIN_BYTES", 1 << 30)
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(model(x), reference(x), rtol=1e-4, atol=1e-3)
        assert b.current == b.arena


def test_bound_input_with_two_threads(tmp_path, monkeypatch) -> None:
    """Parallel kernel tasks all read the caller's array."""
    force_parallel_kernels(monkeypatch, outputs=False)
    path = tmp_path / "mlp.mlc"
    export_module(mlp_module(), path)
    with load(path, threads=2) as model:
        for _ in range(3):
            x = RNG.standard_normal((4, 48)).astype(np.float32)
            np.testing.assert_allclose(model(x), reference(x), rtol=1e-4, atol=1e-3)
            assert binding(model).current == x.ctypes.data


def test_input_that_is_also_an_output_is_copied(tmp_path) -> None:
    bb = BlockBuilder()
    x = bb.input("x", (4, 48))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit_op("matmul", x, bb.constant(W1, "w1")))
            same = bb.emit_output(bb.emit_op("reshape", x, shape=(48, 4)))
        bb.emit_func_output([y, same], names=["y", "x_again"])
    path = tmp_path / "io.mlc"
    export_module(bb.get(), path)
    x = RNG.standard_normal((4, 48)).astype(np.float32)
    with load(path) as model:
        assert binding(model) is None
        got = model.run({"x": x})
    np.testing.assert_array_equal(got["x_again"], x.reshape(48, 4))
    np.testing.assert_allclose(got["y"], x @ W1, rtol=1e-4, atol=1e-3)


def test_input_read_by_a_library_call_is_copied(tmp_path) -> None:
    bb = BlockBuilder()
    x = bb.input("x", (4, 48))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.call_library("test.double", [x], TensorType((4, 48), "float32"))
            out = bb.emit_output(bb.emit_op("matmul", d, bb.constant(W1, "w1")))
        bb.emit_func_output(out, names=["y"])
    path = tmp_path / "lib.mlc"
    export_module(bb.get(), path)

    def double(a, *, out):
        np.multiply(a, 2, out=out)

    x = RNG.standard_normal((4, 48)).astype(np.float32)
    with load(path, library={"test.double": double}) as model:
        assert binding(model) is None
        np.testing.assert_allclose(model(x), (2 * x) @ W1, rtol=1e-4, atol=1e-3)


def test_header_views_are_checked(tmp_path) -> None:
    """An older bundle (no views) copies; a damaged views list naming a tensor some kernel writes,
    or one of another size or offset, is not trusted: the input is copied and results stay
    right."""
    path = tmp_path / "mlp.mlc"
    export_module(mlp_module(), path)
    header, payloads = read_parts(path)
    rows = header["tensors"]
    entry = header["inputs"][0]
    assert entry["views"] == [entry["tensor"]]
    other = next(i for i, r in enumerate(rows) if r[0] == 0 and i != entry["tensor"])
    damaged = {
        "none": None,
        "not a list": 3,
        "without the input": [],
        "out of range": [entry["tensor"], len(rows)],
        "another tensor": [entry["tensor"], other],
    }
    x = RNG.standard_normal((4, 48)).astype(np.float32)
    for what, views in damaged.items():
        if views is None:
            entry.pop("views")
        else:
            entry["views"] = views
        write_parts(tmp_path / "d.mlc", header, payloads)
        with load(tmp_path / "d.mlc") as model:
            assert binding(model) is None, what
            np.testing.assert_allclose(model(x), reference(x), rtol=1e-4, atol=1e-3,
                                       err_msg=what)


def test_binding_refuses_a_tensor_a_kernel_writes(tmp_path) -> None:
    path = tmp_path / "mlp.mlc"
    export_module(mlp_module(), path)
    with load(path) as model:
        plan = model._main._plans[0]
        ex = plan.executor
        first = ex._program[0]
        x_row = plan.inputs[0].tensor
        num_inputs = [k["num_inputs"] for k in model.header["kernels"]]
        n_in = num_inputs[first.target]
        written = first.operands[n_in]
        assert ex.input_binding(frozenset({x_row}), num_inputs, 0) is not None
        assert ex.input_binding(frozenset({x_row, written}), num_inputs, 0) is None
