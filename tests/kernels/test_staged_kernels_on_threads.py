"""Generic kernels with materialized stages (a softmax's row max and row sum) split over threads
with their outputs when every task only reads the rows it computed; otherwise they stay on one
thread. Checked against the numpy references with every such kernel forced parallel."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.export import export_module
from mlcpack.packager.ops import get_op
from mlcpack.runtime import load

from helpers import build_op_module, force_parallel_kernels

RNG = np.random.default_rng(12)


@pytest.fixture(autouse=True)
def split_everything(monkeypatch):
    force_parallel_kernels(monkeypatch, macs=False)


CASES = [
    ("nn.softmax", (4, 33, 17), -1, True),       # rows split on dim 0
    ("nn.softmax", (1, 7, 129), 2, True),        # leading 1: split on dim 1
    ("nn.log_softmax", (3, 5, 31), -1, True),
    ("nn.softmax", (6, 9, 5), 1, True),          # reduce the middle axis, split on dim 0
    # a softmax over a leading or middle axis is the strided softmax kernel (codegen/softmax.py:
    # the contiguous kept axis on the lanes), whose tasks split the kept axes: each computes its
    # own columns' max and sum, so it splits too
    ("nn.softmax", (6, 9), 0, True),
    ("nn.log_softmax", (1, 11, 4), 1, True),
]


@pytest.mark.parametrize("op,shape,axis,splits", CASES)
def test_stages_split_with_their_rows(op, shape, axis, splits, tmp_path) -> None:
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    path = tmp_path / "m.mlc"
    export_module(build_op_module(op, [x], axis=axis), path)
    want = get_op(op).reference(x, axis=axis)
    for threads in (1, 2, 3):
        with load(path, threads=threads) as model:
            kernels = model.header["kernels"]
            assert [k["parallel"] for k in kernels] == [splits], kernels
            got = model.run({"x0": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{threads}")
