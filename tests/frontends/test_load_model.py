"""``mlcpack.frontends.loader.load_model``: the Python API reads a model file as ``mlcpack
export`` does (frontend by file type, one module per batch size, the golden reference)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ARTIFACTS

from mlcpack.frontends.loader import ModelOptionError, load_model
from mlcpack.packager.errors import ExportError
from mlcpack.runtime.errors import MlcpackError


def _input_shapes(mod) -> list[tuple]:
    return [tuple(p.type.shape) for p in mod.main.params]


def test_onnx_with_batch_sizes_is_reimported_per_batch() -> None:
    loaded = load_model(ARTIFACTS / "cnn.onnx", {"x": ("N", 1, 28, 28)}, [8, 1],
                        reference=False)
    assert sorted(loaded.modules) == [1, 8] and loaded.reference is None
    assert _input_shapes(loaded.modules[1]) == [(1, 1, 28, 28)]
    assert _input_shapes(loaded.modules[8]) == [(8, 1, 28, 28)]


def test_onnx_reference_runs_the_original_model() -> None:
    loaded = load_model(ARTIFACTS / "cnn.onnx")
    assert list(loaded.modules) == [None] and loaded.reference_name
    x = np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32)
    outputs = loaded.reference({"x": x})
    assert next(iter(outputs.values())).shape == (1, 10)


def test_pickled_weights_take_the_batch_from_batch_sizes() -> None:
    loaded = load_model(ARTIFACTS / "mlp_params.pkl", batch_sizes=[1, 4])
    assert sorted(loaded.modules) == [1, 4] and loaded.reference is None
    assert _input_shapes(loaded.modules[4]) == [(4, 784)]


def test_mistakes_are_one_line_export_errors(tmp_path) -> None:
    (tmp_path / "model.txt").write_text("x")
    with pytest.raises(ModelOptionError, match="unknown model type .txt") as err:
        load_model(tmp_path / "model.txt")
    assert err.value.exit_code == 2
    with pytest.raises(ModelOptionError, match="only the first dimension may be named"):
        load_model(ARTIFACTS / "cnn.onnx", {"x": ("N", "C", 28, 28)}, [1, 2])
    with pytest.raises(ExportError, match="no input of cnn.onnx has a symbolic first"):
        load_model(ARTIFACTS / "cnn.onnx", {"x": (1, 1, 28, 28)}, [1, 2])
    with pytest.raises(MlcpackError, match="no such file"):
        load_model(tmp_path / "missing.onnx")
