"""The golden check's reference run is kept in the compile cache (packager/golden_cache.py): a
warm export runs the bundle and compares it as before, but not the reference again, and writes
the same bytes; a change of what the run depends on (the check's seed, the reference) misses;
a reference without an identity is never cached."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mlcpack.frontends.reference import Reference
from mlcpack.packager.options import CompileOptions


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(5)
    return {"w0": rng.standard_normal((8, 6)).astype(np.float32),
            "b0": rng.standard_normal(8).astype(np.float32),
            "w1": rng.standard_normal((3, 8)).astype(np.float32),
            "b1": rng.standard_normal(3).astype(np.float32)}


def _counting_reference(weights, identity):
    calls = []

    def run(feeds):
        calls.append(1)
        x = feeds["x"].astype(np.float64)
        h = np.maximum(x @ weights["w0"].T + weights["b0"], 0)
        return {"logits": (h @ weights["w1"].T + weights["b1"]).astype(np.float32)}

    return Reference(run, "numpy by hand", identity=identity), calls


def _export(weights, path, cache_dir, reference, seed=0):
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.packager.export import ExportOptions, export_module

    mod = build_from_spec(infer_mlp_spec(weights), weights, (2, 6))
    options = CompileOptions.from_environ(os.environ, cache_dir=str(cache_dir))
    return export_module(mod, path, ExportOptions(check=True, check_seed=seed, compile=options,
                                                  reference=reference))


def test_a_warm_export_reuses_the_reference_run(tmp_path, small) -> None:
    reference, calls = _counting_reference(small, "by hand v1")
    first = _export(small, tmp_path / "a.mlc", tmp_path / "cache", reference)
    assert len(calls) == 1 and first.check.startswith("golden check passed")
    second = _export(small, tmp_path / "b.mlc", tmp_path / "cache", reference)
    assert len(calls) == 1, "the warm export ran the reference again"
    assert second.check == first.check
    assert (tmp_path / "a.mlc").read_bytes() == (tmp_path / "b.mlc").read_bytes()
    _export(small, tmp_path / "c.mlc", tmp_path / "cache", reference, seed=1)
    assert len(calls) == 2, "another check seed must run the reference"
    other, other_calls = _counting_reference(small, "by hand v2")
    _export(small, tmp_path / "d.mlc", tmp_path / "cache", other)
    assert len(other_calls) == 1, "another reference must run"


def test_a_reference_without_identity_is_not_cached(tmp_path, small) -> None:
    reference, calls = _counting_reference(small, None)
    for name in ("a.mlc", "b.mlc"):
        _export(small, tmp_path / name, tmp_path / "cache", reference)
    assert len(calls) == 2
