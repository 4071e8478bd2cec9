"""Library functions called by name from a bundle: refused at load when missing, supplied by
``load(library=...)`` or ``register_library_function``; the built-ins work."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.export import ExportError, export_module
from mlcpack.packager.ir.builder import BlockBuilder
from mlcpack.packager.ir.graph import TensorType
from mlcpack.runtime import (LibraryFunctionError, load, register_library_function)
from mlcpack.runtime import library as runtime_library

SHAPE = (2, 16)
RNG = np.random.default_rng(21)
BIAS = RNG.standard_normal(SHAPE[1]).astype(np.float32)
W = RNG.standard_normal((8, SHAPE[1])).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)


@pytest.fixture(scope="module")
def double_bundle(tmp_path_factory):
    """main(x) = relu(x) -> myapp.double -> + bias (ops on both sides of the library call)."""
    bb = BlockBuilder()
    x = bb.input("x", SHAPE)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_op("relu", x)
            d = bb.call_library("myapp.double", [h], TensorType(SHAPE, "float32"))
            y = bb.emit_op("add", d, bb.constant(BIAS, "bias"))
            out = bb.emit_output(y)
        bb.emit_func_output(out, names=["y"])
    path = tmp_path_factory.mktemp("lib") / "double.mlc"
    export_module(bb.get(), path)
    return path


def _double(x: np.ndarray, *, out: np.ndarray) -> None:
    np.multiply(x, 2, out=out)


def _reference(x: np.ndarray) -> np.ndarray:
    return np.maximum(x.astype(np.float64), 0) * 2 + BIAS


@pytest.fixture()
def clean_registry():
    before = dict(runtime_library._registered)
    yield runtime_library._registered
    runtime_library._registered.clear()
    runtime_library._registered.update(before)


def test_missing_library_function_is_refused_at_load(double_bundle, clean_registry) -> None:
    assert "myapp.double" not in clean_registry
    with pytest.raises(LibraryFunctionError) as info:
        load(double_bundle)
    msg = str(info.value)
    assert "myapp.double" in msg and "double.mlc" in msg
    assert "register_library_function" in msg and "library=" in msg
    assert "\n" not in msg
    # Another name does not help.
    with pytest.raises(LibraryFunctionError, match="myapp.double"):
        load(double_bundle, library={"myapp.triple": _double})


def test_library_function_passed_to_load(double_bundle, clean_registry) -> None:
    calls = []

    def double(x: np.ndarray, *, out: np.ndarray) -> None:
        calls.append((x.shape, out.shape, out.dtype))
        _double(x, out=out)

    x = RNG.standard_normal(SHAPE).astype(np.float32)
    with load(double_bundle, library={"myapp.double": double}) as model:
        y = model(x)
        np.testing.assert_allclose(y, _reference(x), rtol=1e-6, atol=1e-6)
        assert calls == [(SHAPE, SHAPE, np.float32)]
        # the native step loop runs the kernels before and after; the call runs in between
        assert model._main._executor._segments == [(0, 1), (-2, 0), (1, 2)]
        y2 = model(x * -1)
        np.testing.assert_allclose(y2, _reference(-x), rtol=1e-6, atol=1e-6)
    assert len(calls) == 2
    assert "myapp.double" not in clean_registry  # load(library=) registers nothing globally


def test_registered_library_function(double_bundle, clean_registry) -> None:
    register_library_function("myapp.double", _double)
    assert clean_registry["myapp.double"] is _double
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    with load(double_bundle) as model:
        np.testing.assert_allclose(model(x), _reference(x), rtol=1e-6, atol=1e-6)
    # Registering a name twice needs override=True; load(library=) wins over the registry.
    with pytest.raises(ValueError, match="already registered"):
        register_library_function("myapp.double", _double)

    def triple(x: np.ndarray, *, out: np.ndarray) -> None:
        np.multiply(x, 3, out=out)

    with load(double_bundle, library={"myapp.double": triple}) as model:
        np.testing.assert_allclose(model(x), np.maximum(x, 0) * 3 + BIAS, rtol=1e-6, atol=1e-6)
    register_library_function("myapp.double", triple, override=True)
    with load(double_bundle) as model:
        np.testing.assert_allclose(model(x), np.maximum(x, 0) * 3 + BIAS, rtol=1e-6, atol=1e-6)


def test_registry_cleanup_left_nothing(clean_registry) -> None:
    assert "myapp.double" not in clean_registry


def test_register_rejects_bad_names_and_builtins(clean_registry) -> None:
    with pytest.raises(ValueError, match="namespaced"):
        register_library_function("double", _double)
    with pytest.raises(TypeError):
        register_library_function("myapp.x", 42)
    with pytest.raises(ValueError, match="already registered"):
        register_library_function("env.linear", _double)
    assert "double" not in clean_registry and "myapp.x" not in clean_registry


def test_builtin_env_linear(tmp_path) -> None:
    bb = BlockBuilder()
    x = bb.input("x", SHAPE)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_op("tanh", x)
            y = bb.call_library("env.linear", [h, bb.constant(W, "w"), bb.constant(B, "b")],
                                TensorType((SHAPE[0], 8), "float32"))
            z = bb.emit_op("relu", y)
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    path = tmp_path / "linear.mlc"
    export_module(bb.get(), path)
    x_val = RNG.standard_normal(SHAPE).astype(np.float32)
    ref = np.maximum(np.tanh(x_val.astype(np.float64)) @ W.T.astype(np.float64) + B, 0)
    with load(path) as model:
        assert model.header["library_calls"][0]["func"] == "env.linear"
        np.testing.assert_allclose(model(x_val), ref, rtol=1e-5, atol=1e-5)


def test_library_names_must_be_namespaced_at_export(tmp_path) -> None:
    bb = BlockBuilder()
    x = bb.input("x", SHAPE)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.call_library("double", [x], TensorType(SHAPE, "float32"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    with pytest.raises(ExportError, match="namespaced"):
        export_module(bb.get(), tmp_path / "bad.mlc")
    assert not (tmp_path / "bad.mlc").exists()
