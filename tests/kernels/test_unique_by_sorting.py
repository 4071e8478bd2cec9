"""Unique by sorting (``codegen/unique.py``: a stable merge sort of the item indices and one pass
over them, O(n log n)): every output of ONNX Unique (values, first indices, inverse indices,
counts) as ONNX Runtime gives them, sorted and in order of first occurrence, for elements (axis
unset) and for slices along the first, a middle and a negative last axis, float and integer
items with many repeats, at run-time sizes from 1 up to 10^5 items (the quadratic kernel it
replaces needed an items x items int64 table: 80 GB there).

One bundle holds the five cases (one export, shared by the module's tests)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mlcpack.runtime import load

from helpers import ort_outputs

F, I64, I8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT8
# input name: (dtype, shape, Unique's attributes)
CASES = {
    "flat_sorted": (F, ["N"], {"sorted": 1}),
    "flat_first": (I64, ["M"], {"sorted": 0}),
    "rows": (I8, ["A", 3], {"axis": 0, "sorted": 1}),
    "middle": (F, [2, "B", 2], {"axis": 1, "sorted": 0}),
    "last": (I64, [3, "C"], {"axis": -1, "sorted": 1}),
}
NP = {F: np.float32, I64: np.int64, I8: np.int8}
PARTS = ("values", "indices", "inverse", "counts")


def _model(path) -> None:
    nodes, inputs, outputs = [], [], []
    for name, (dtype, shape, attrs) in CASES.items():
        outs = [f"{name}_{p}" for p in PARTS]
        nodes.append(helper.make_node("Unique", [name], outs, **attrs))
        inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        outputs += [helper.make_tensor_value_info(o, dtype if o.endswith("values") else I64, None)
                    for o in outs]
    graph = helper.make_graph(nodes, "uniques", inputs, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def uniques(tmp_path_factory):
    from mlcpack.packager.api import Options, export

    folder = tmp_path_factory.mktemp("unique")
    src, bundle = folder / "uniques.onnx", folder / "uniques.mlc"
    _model(src)
    result = export(src, bundle, Options(target="host"))
    assert result.check.startswith("golden check passed"), result.check
    return src, bundle


def _feeds(items: int, seed: int) -> dict[str, np.ndarray]:
    """``items`` items per case, drawn from about items / 4 distinct values (many repeats)."""
    rng = np.random.default_rng(seed)
    top = max(items // 4, 1)
    out = {}
    for name, (dtype, shape, _) in CASES.items():
        dims = [items if isinstance(d, str) else d for d in shape]
        if name in ("rows", "middle", "last"):   # few values per element: items repeat whole
            values = rng.integers(-2, 2, dims)
        else:
            values = rng.integers(-top, top, dims)
        out[name] = (values * 0.5 if dtype == F else values).astype(NP[dtype])
    return out


def _same(got: dict, want: dict) -> None:
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, name
        np.testing.assert_array_equal(got[name], ref, err_msg=name)


@pytest.mark.parametrize("items", [1, 2, 7, 64, 1000])
def test_every_output_matches_onnx_runtime(uniques, items) -> None:
    src, bundle = uniques
    feeds = _feeds(items, seed=items)
    with load(bundle) as model:
        _same(model.run(feeds), ort_outputs(src, feeds))


def test_floats_compare_by_value(uniques) -> None:
    """-0.0 and 0.0 are one value (as ONNX Runtime and numpy have it); the first occurrence's
    bits are the value given back."""
    src, bundle = uniques
    feeds = _feeds(8, seed=1)
    feeds["flat_sorted"] = np.array([0.0, -0.0, 1.5, -1.5, -0.0, 1.5, 3.0, 0.0], np.float32)
    with load(bundle) as model:
        got = model.run(feeds)
    _same(got, ort_outputs(src, feeds))
    assert list(got["flat_sorted_counts"]) == [1, 4, 2, 1]


def test_a_hundred_thousand_items(uniques) -> None:
    """10^5 items of each case: linear memory and n log n work (the quadratic kernel's table
    would have been 80 GB)."""
    src, bundle = uniques
    feeds = _feeds(100_000, seed=5)
    with load(bundle) as model:
        got = model.run(feeds)
    _same(got, ort_outputs(src, feeds))
    assert 20_000 < len(got["flat_sorted_values"]) < 50_000   # repeats and distinct values both
