"""The register-tile transpose kernel (packager/codegen/transpose.py): permutations that move the
last axis, extents that are and are not multiples of the tile (edge copies), every x86 vector
level, split over threads; exact against numpy. A permutation that keeps the last axis in
place stays on the generic loop nest."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.codegen import transpose
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.runtime import load

from helpers import SharedLog

RNG = np.random.default_rng(17)
CASES = [
    ((196, 256), (1, 0)),               # Mixer's token mixing, whole tiles
    ((1, 37, 21), (0, 2, 1)),           # both edges partial
    ((1, 128, 4, 64), (0, 2, 3, 1)),    # attention's k^T: a strided plane per head
    ((4, 130, 129), (2, 0, 1)),         # outer axis split over threads (>= 64K elements)
    ((2, 8, 3, 9), (3, 2, 0, 1)),
]


def module(cases):
    bb = BlockBuilder()
    xs = [bb.input(f"x{i}", shape) for i, (shape, _) in enumerate(cases)]
    with bb.function("main", xs):
        with bb.dataflow():
            outs = [bb.emit_output(bb.emit_op("transpose", x, axes=perm))
                    for x, (_, perm) in zip(xs, cases)]
        bb.emit_func_output(outs, names=[f"y{i}" for i in range(len(cases))])
    return bb.get()


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "host"])
def test_transposes_exact(target, tmp_path, monkeypatch) -> None:
    used = SharedLog(tmp_path / "used")
    used.count_cache_hits(monkeypatch, "TransposeEmitter.emit: perm")
    original = transpose.TransposeEmitter.emit
    monkeypatch.setattr(transpose.TransposeEmitter, "emit",
                        lambda self: used.append(self.perm) or original(self))
    path = tmp_path / "t.mlc"
    export_module(module(CASES), path, ExportOptions(target=target))
    assert len(used) == len(CASES)
    xs = {f"x{i}": RNG.standard_normal(shape).astype(np.float32)
          for i, (shape, _) in enumerate(CASES)}
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            got = m.run(xs)
        for i, (_, perm) in enumerate(CASES):
            np.testing.assert_array_equal(got[f"y{i}"], xs[f"x{i}"].transpose(perm))


def test_last_axis_in_place_is_not_taken(tmp_path, monkeypatch) -> None:
    used = SharedLog(tmp_path / "used")
    used.count_cache_hits(monkeypatch, "TransposeEmitter.emit: none taken", pure=False)
    monkeypatch.setattr(transpose.TransposeEmitter, "emit",
                        lambda self: used.append(1) or None)
    cases = [((1, 198, 3, 64), (0, 2, 1, 3))]
    path = tmp_path / "t.mlc"
    export_module(module(cases), path)
    assert not used
    x = RNG.standard_normal(cases[0][0]).astype(np.float32)
    with load(path) as m:
        np.testing.assert_array_equal(m.run({"x0": x})["y0"], x.transpose(0, 2, 1, 3))
