"""The Python API next to ONNX Runtime's session (issue 14, item 6): ``run(feeds, outputs=...)``
returns only those outputs, ``run(feeds, out=...)`` writes into the caller's arrays (checked
in one line), ``model.session()`` objects run at the same time from several threads sharing the
mapped code and the weights, ``model.run`` itself is safe from several threads, and
``TensorSpec.dims`` shows the batch a bundle accepts. Every result is compared with numpy."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_reference

import mlcpack.runtime
from mlcpack.runtime import InputError, load

RNG = np.random.default_rng(7)
W = RNG.standard_normal((16, 8)).astype(np.float32)


def _two_output_onnx() -> bytes:
    """x (2, 16) -> h = x @ W; outputs relu(h) and sigmoid(h)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["relu"]),
         helper.make_node("Sigmoid", ["h"], ["sig"])],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("relu", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("sig", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _reference(x: np.ndarray) -> dict[str, np.ndarray]:
    h = x.astype(np.float64) @ W.astype(np.float64)
    return {"relu": np.maximum(h, 0), "sig": 1 / (1 + np.exp(-h))}


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory) -> Path:
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    mod, _ = import_onnx(_two_output_onnx())
    path = tmp_path_factory.mktemp("two") / "two.mlc"
    export_module(mod, path, ExportOptions(target="host", check=False))
    return path


@pytest.fixture(scope="module")
def batched_mlp(tmp_path_factory, run_cli, paths) -> Path:
    out = tmp_path_factory.mktemp("bmlp") / "mlp_b.mlc"
    proc = run_cli("export", paths["mlp_pickle"], "-o", out, "--target", "host",
                   "--batch-sizes", "1,4", "--no-check", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_outputs_selects_and_orders(two_outputs) -> None:
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    ref = _reference(x)
    with load(two_outputs) as model:
        both = model.run({"x": x})
        assert list(both) == ["relu", "sig"]
        only = model.run({"x": x}, outputs=["sig"])
        assert list(only) == ["sig"]
        np.testing.assert_allclose(only["sig"], ref["sig"], rtol=1e-5, atol=1e-6)
        swapped = model.run({"x": x}, outputs=["sig", "relu"])
        assert list(swapped) == ["sig", "relu"]
        np.testing.assert_allclose(swapped["relu"], ref["relu"], rtol=1e-5, atol=1e-5)
        for bad, words in ((["nope"], "unknown: ['nope']"), ([], "has outputs"),
                           (["sig", "sig"], "at most once"), ("sig", "a list of names")):
            with pytest.raises(InputError, match=words.replace("[", r"\[").replace("]", r"\]")):
                model.run({"x": x}, outputs=bad)


def test_out_writes_into_the_callers_arrays(two_outputs) -> None:
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    ref = _reference(x)
    with load(two_outputs) as model:
        buf = np.full((2, 8), -1, np.float32)
        result = model.run({"x": x}, out={"relu": buf})
        assert result["relu"] is buf
        np.testing.assert_allclose(buf, ref["relu"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(result["sig"], ref["sig"], rtol=1e-5, atol=1e-6)
        sig = np.empty((2, 8), np.float32)
        assert model.run({"x": x}, outputs=["sig"], out={"sig": sig})["sig"] is sig
        cases = [({"relu": np.empty((2, 9), np.float32)}, "has shape (2, 9); output 'relu'"),
                 ({"relu": np.empty((2, 8), np.float64)}, "dtype float64; output 'relu' is "
                                                          "float32"),
                 ({"relu": np.empty((8, 2), np.float32).T}, "C-contiguous and writable"),
                 ({"relu": [[0.0] * 8] * 2}, "is a list; give a numpy array"),
                 ({"nope": np.empty((2, 8), np.float32)}, "does not return")]
        ro = np.empty((2, 8), np.float32)
        ro.flags.writeable = False
        cases.append(({"relu": ro}, "writable"))
        for out, words in cases:
            with pytest.raises(InputError) as err:
                model.run({"x": x}, outputs=["relu"] if "nope" in out else None, out=out)
            assert words in str(err.value) and "\n" not in str(err.value)


def test_batched_bundle_specs_and_out(batched_mlp, mlp_weights, run_cli) -> None:
    x = RNG.random((6, 784), dtype=np.float32)  # one chunk of 4, then the batch-4 plan padded
    with load(batched_mlp) as model:
        (spec,) = model.inputs
        assert spec.dims == ("N", 784) and spec.batch_sizes == (1, 4) and spec.shape == (1, 784)
        assert str(spec) == "x [N, 784] float32 (plans for N = 1, 4)"
        assert model.outputs[0].dims[0] == "N"
        name = model.outputs[0].name
        buf = np.empty((6, 10), np.float32)
        assert model.run({"x": x}, out={name: buf})[name] is buf
        np.testing.assert_allclose(buf, mlp_reference(mlp_weights, x), rtol=1e-4, atol=1e-4)
        with pytest.raises(InputError, match=r"has shape \(4, 10\).*\(6, 10\) for these inputs"):
            model.run({"x": x}, out={name: np.empty((4, 10), np.float32)})
    shown = run_cli("inspect", batched_mlp).stdout  # inspect shows the dims TensorSpec does
    assert "batch plans: 1, 4" in shown and " input: x [N, 784] float32" in shown
    import json
    (row,) = json.loads(run_cli("inspect", batched_mlp, "--json").stdout)["inputs"]
    assert row["dims"] == ["N", 784] and row["shape"] == [4, 784]


def test_sessions_run_concurrently_and_share_the_weights(batched_mlp, mlp_weights) -> None:
    inputs = [RNG.random((n, 784), dtype=np.float32) for n in (1, 3, 4, 5, 2, 7, 1, 4)]
    with load(batched_mlp) as model:
        sequential = [model.run({"x": x}) for x in inputs]
        sessions = [model.session() for _ in range(4)]
        # weights: the same memory in every session; arenas: each its own
        const = [i for i, v in enumerate(model._main._plans[0].views)
                 if not np.shares_memory(v, model._main._plans[0].arena)]
        assert const
        for s in sessions:
            assert not np.shares_memory(s._arena, model._main._arena)
            for i in const:
                assert np.shares_memory(s._plans[0].views[i], model._main._plans[0].views[i])
        start = threading.Barrier(len(sessions))

        def work(k: int) -> list[dict[str, np.ndarray]]:
            start.wait()
            return [sessions[k].run({"x": x}) for _ in range(25) for x in inputs]

        with ThreadPoolExecutor(len(sessions)) as pool:
            results = list(pool.map(work, range(len(sessions))))
        for per_thread in results:
            for got, want in zip(per_thread, sequential * 25):
                for name in want:
                    np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_allclose(sequential[5]["y"] if "y" in sequential[5] else
                                   next(iter(sequential[5].values())),
                                   mlp_reference(mlp_weights, inputs[5]), rtol=1e-4, atol=1e-4)
        with sessions[0] as s:
            assert s(inputs[0]).shape == (1, 10)
        with pytest.raises(InputError, match="session is closed"):
            sessions[0].run({"x": inputs[0]})
    with pytest.raises(InputError, match="session is closed"):  # the model closed its sessions
        sessions[1].run({"x": inputs[0]})


def test_model_run_is_safe_from_several_threads(two_outputs) -> None:
    xs = [RNG.standard_normal((2, 16)).astype(np.float32) for _ in range(16)]
    with load(two_outputs) as model:
        want = [model.run({"x": x}) for x in xs]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda i: model.run({"x": xs[i % 16]}), range(400)))
    for i, g in enumerate(got):
        for name in ("relu", "sig"):
            np.testing.assert_array_equal(g[name], want[i % 16][name])


def test_versions() -> None:
    import mlcpack
    import mlcpack.packager

    assert mlcpack.runtime.__version__ == mlcpack.__version__ == mlcpack.packager.__version__
    assert mlcpack.__version__.count(".") >= 1


def test_versions_match_the_distributions(paths) -> None:
    import tomllib

    for pyproject in (paths["root"] / "pyproject.toml", paths["root"] / "runtime/pyproject.toml"):
        with open(pyproject, "rb") as f:
            assert tomllib.load(f)["project"]["version"] == mlcpack.runtime.__version__
    # mlcpack/__init__.py of the runtime-only wheel
    top = (paths["root"] / "runtime/mlcpack_top/__init__.py").read_text()
    assert f'__version__ = "{mlcpack.runtime.__version__}"' in top
