"""Pickled weights -> bundle -> runtime, checked against numpy references."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from mlcpack.frontends.arch import ArchError, build_from_spec, infer_mlp_spec, read_spec
from mlcpack.frontends.weights import load_weights
from mlcpack.packager.ops import get_op
from mlcpack.runtime import load

TOL = dict(rtol=1e-5, atol=1e-5)


def test_demo_mlp_matches_numpy_reference(mlp_bundle, reference_mlp) -> None:
    path, weights = mlp_bundle
    rng = np.random.default_rng(0)
    with load(path) as model:
        assert [(s.name, s.shape, s.dtype) for s in model.inputs] == [("x", (1, 784), "float32")]
        assert [(s.name, s.shape) for s in model.outputs] == [("logits", (1, 10))]
        inputs = [rng.random((1, 784), dtype=np.float32) for _ in range(4)]
        inputs += [rng.standard_normal((1, 784)).astype(np.float32) * 3,
                   np.zeros((1, 784), np.float32), np.ones((1, 784), np.float32)]
        outs = []
        for x in inputs:
            y = model(x)
            assert y.shape == (1, 10) and y.dtype == np.float32
            np.testing.assert_allclose(y, reference_mlp(weights, x), **TOL)
            outs.append(y)
        # Different inputs give different outputs (the model is not returning a constant).
        assert not np.allclose(outs[0], outs[1])
        # run() with a feed dict gives the same as __call__.
        np.testing.assert_array_equal(model.run({"x": inputs[0]})["logits"], outs[0])


def test_demo_mlp_on_sample_tensor(mlp_bundle, reference_mlp, paths) -> None:
    path, weights = mlp_bundle
    x = np.load(paths["samples"] / "digit_7.npy").astype(np.float32).reshape(1, 784)
    with load(path) as model:
        y = model(x)
    np.testing.assert_allclose(y, reference_mlp(weights, x), **TOL)
    assert int(np.argmax(y)) == 7


def _mlp_weights(sizes: list[int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {}
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w[f"w{i}"] = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        w[f"b{i}"] = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
    return w


def test_four_layer_mlp_pickle(tmp_path, export_weights, reference_mlp) -> None:
    weights = _mlp_weights([50, 64, 33, 17, 5], seed=1)
    pkl = tmp_path / "mlp4.pkl"
    pkl.write_bytes(pickle.dumps(weights, protocol=4))
    loaded = load_weights(pkl)
    assert sorted(loaded) == sorted(weights)
    spec = infer_mlp_spec(loaded)
    assert [layer["op"] for layer in spec["layers"]] == ["linear", "relu"] * 3 + ["linear"]
    bundle = export_weights(loaded, tmp_path / "mlp4.mlc")
    rng = np.random.default_rng(2)
    with load(bundle) as model:
        assert model.inputs[0].shape == (1, 50) and model.outputs[0].shape == (1, 5)
        for _ in range(5):
            x = rng.standard_normal((1, 50)).astype(np.float32)
            np.testing.assert_allclose(model(x), reference_mlp(weights, x), **TOL)


def test_batched_input_shape_from_cli(tmp_path, run_cli, paths, mlp_weights, reference_mlp
                                      ) -> None:
    out = tmp_path / "batch.mlc"
    proc = run_cli("export", paths["mlp_pickle"], "--input-shape", "x=8,784", "-o", out,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(3)
    x = rng.random((8, 784), dtype=np.float32)
    with load(out) as model:
        assert model.inputs[0].shape == (8, 784)
        assert model.outputs[0].shape == (8, 10)
        y = model(x)
        np.testing.assert_allclose(y, reference_mlp(mlp_weights, x), **TOL)
        # Each row is computed independently of the others.
        x2 = x.copy()
        x2[3] = 0
        y2 = model(x2)
        np.testing.assert_array_equal(np.delete(y2, 3, axis=0), np.delete(y, 3, axis=0))


def test_weights_that_do_not_chain_name_the_layer(tmp_path) -> None:
    weights = _mlp_weights([20, 16, 8], seed=4)
    weights["w1"] = np.zeros((8, 15), np.float32)  # layer 0 gives 16, w1 takes 15
    with pytest.raises(ArchError) as info:
        infer_mlp_spec(weights)
    msg = str(info.value)
    assert "w1" in msg and "15" in msg and "16" in msg and "layer 0" in msg

    weights = _mlp_weights([20, 16, 8], seed=4)
    weights["b1"] = np.zeros(7, np.float32)
    with pytest.raises(ArchError, match="b1"):
        infer_mlp_spec(weights)

    weights = _mlp_weights([20, 16], seed=4)
    weights["w0"] = weights["w0"][None]
    with pytest.raises(ArchError, match="w0"):
        infer_mlp_spec(weights)


def test_weights_that_do_not_chain_fail_the_cli(tmp_path, run_cli, one_line_error) -> None:
    weights = _mlp_weights([20, 16, 8], seed=5)
    weights["w1"] = np.zeros((8, 12), np.float32)
    pkl = tmp_path / "bad.pkl"
    pkl.write_bytes(pickle.dumps(weights))
    proc = run_cli("export", pkl, "-o", tmp_path / "bad.mlc", cwd=tmp_path)
    line = one_line_error(proc)
    assert proc.returncode == ArchError.exit_code
    assert "w1" in line
    assert not (tmp_path / "bad.mlc").exists()


CNN_SPEC = """
output = "probs"

[input]
name = "image"
shape = [2, 3, 13, 13]

[[layers]]
op = "conv2d"
weight = "conv1.w"
bias = "conv1.b"
stride = 2
padding = 1

[[layers]]
op = "relu"

[[layers]]
op = "conv2d"
weight = "conv2.w"
bias = "conv2.b"
stride = 1
padding = [1, 0]

[[layers]]
op = "relu"

[[layers]]
op = "maxpool2d"
kernel = 2
stride = 2

[[layers]]
op = "flatten"

[[layers]]
op = "linear"
weight = "fc.w"
bias = "fc.b"

[[layers]]
op = "softmax"
"""


def test_cnn_from_toml_spec_matches_op_references(tmp_path, export_weights) -> None:
    rng = np.random.default_rng(6)
    # conv1: 13x13 -> (13 + 2 - 3) // 2 + 1 = 7; conv2 (pad h=1, w=0): 7x5; pool: 3x2.
    weights = {
        "conv1.w": rng.standard_normal((5, 3, 3, 3)).astype(np.float32) * 0.5,
        "conv1.b": rng.standard_normal(5).astype(np.float32) * 0.1,
        "conv2.w": rng.standard_normal((6, 5, 3, 3)).astype(np.float32) * 0.3,
        "conv2.b": rng.standard_normal(6).astype(np.float32) * 0.1,
        "fc.w": rng.standard_normal((7, 6 * 3 * 2)).astype(np.float32) * 0.2,
        "fc.b": rng.standard_normal(7).astype(np.float32) * 0.1,
    }
    spec_path = tmp_path / "cnn.toml"
    spec_path.write_text(CNN_SPEC)
    spec = read_spec(spec_path)
    bundle = export_weights(weights, tmp_path / "cnn.mlc", spec=spec)

    conv, pool, softmax = (get_op(n).reference for n in ("nn.conv2d", "nn.max_pool2d",
                                                          "nn.softmax"))
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}

    def reference(x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float64)
        h = conv(h, w64["conv1.w"], strides=(2, 2), padding=(1, 1, 1, 1))
        h = np.maximum(h + w64["conv1.b"].reshape(1, -1, 1, 1), 0)
        h = conv(h, w64["conv2.w"], strides=(1, 1), padding=(1, 0, 1, 0))
        h = np.maximum(h + w64["conv2.b"].reshape(1, -1, 1, 1), 0)
        assert h.shape == (2, 6, 7, 5)
        h = pool(h, kernel=(2, 2), strides=(2, 2))
        assert h.shape == (2, 6, 3, 2)
        h = h.reshape(h.shape[0], -1) @ w64["fc.w"].T + w64["fc.b"]
        return softmax(h, axis=-1)

    with load(bundle) as model:
        assert [(s.name, s.shape) for s in model.inputs] == [("image", (2, 3, 13, 13))]
        assert [(s.name, s.shape) for s in model.outputs] == [("probs", (2, 7))]
        for _ in range(3):
            x = rng.standard_normal((2, 3, 13, 13)).astype(np.float32)
            y = model(x)
            ref = reference(x)
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)
            # The outputs are informative (not a uniform distribution).
            assert y.max() - y.min() > 0.05


def test_spec_with_unused_or_missing_weights_is_refused(tmp_path) -> None:
    spec_path = tmp_path / "cnn.toml"
    spec_path.write_text(CNN_SPEC)
    spec = read_spec(spec_path)
    with pytest.raises(ArchError, match="fc.w"):
        build_from_spec(spec, {"conv1.w": np.zeros((5, 3, 3, 3), np.float32),
                               "conv1.b": np.zeros(5, np.float32),
                               "conv2.w": np.zeros((6, 5, 3, 3), np.float32),
                               "conv2.b": np.zeros(6, np.float32)})
    bad = tmp_path / "bad.toml"
    bad.write_text("[[layers]\nop = ")
    with pytest.raises(ArchError, match="TOML"):
        read_spec(bad)
