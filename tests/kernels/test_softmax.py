"""The vectorized softmax / log-softmax kernel (packager/codegen/softmax.py) against numpy: row
lengths around the vector width (masked last vectors), short rows in interleaved groups with a
remainder, long rows in the looping pass, every x86 vector width, split over threads, and
NaN / infinities as numpy gives them."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.codegen import softmax
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.ops import get_op
from mlcpack.runtime import load

from helpers import SharedLog, force_parallel_kernels

RNG = np.random.default_rng(21)
# rows x row length: under one vector, exactly 16, the attention shape's 198 (groups of 2-4
# rows on AVX-512 and a remainder row), 157 (the looping pass on AVX2 and SSE with 3 whole
# vectors and a masked one after its blocks, the maximum and sum split over 4 accumulators;
# straight-line on AVX-512), long rows that loop on every width
SHAPES = [(3, 5), (7, 16), (5, 198), (2, 157), (2, 3, 37), (3, 700)]


def module(op: str, shapes: list[tuple[int, ...]]):
    bb = BlockBuilder()
    xs = [bb.input(f"x{i}", s) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            outs = [bb.emit_output(bb.emit_op(op, x, axis=-1)) for x in xs]
        bb.emit_func_output(outs, names=[f"y{i}" for i in range(len(shapes))])
    return bb.get()


@pytest.fixture
def emitted(monkeypatch, tmp_path) -> SharedLog:
    """Records every softmax kernel emitted (so a test knows the fast path ran)."""
    seen = SharedLog(tmp_path / "emitted")
    seen.count_cache_hits(monkeypatch, "SoftmaxEmitter.emit: log")
    original = softmax.SoftmaxEmitter.emit

    def spy(self):
        seen.append(self.log)
        return original(self)

    monkeypatch.setattr(softmax.SoftmaxEmitter, "emit", spy)
    return seen


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "host"])
@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_row_lengths_and_widths(op, target, tmp_path, emitted, monkeypatch) -> None:
    force_parallel_kernels(monkeypatch, macs=False)   # every kernel splits its rows
    path = tmp_path / "m.mlc"
    export_module(module(op, SHAPES), path, ExportOptions(target=target))
    assert len(emitted) == len(SHAPES) and set(emitted.items()) == {op == "nn.log_softmax"}
    xs = {f"x{i}": (RNG.standard_normal(s) * 6).astype(np.float32) for i, s in enumerate(SHAPES)}
    reference = get_op(op).reference
    for threads in (1, 3):
        with load(path, threads=threads) as model:
            got = model.run(xs)
        for i, s in enumerate(SHAPES):
            want = reference(xs[f"x{i}"].astype(np.float64), axis=-1)
            # log-softmax's x - max - log(sum) rounds at the scale of its largest |value|
            atol = 1e-7 + 2e-7 * np.abs(want).max() * (op == "nn.log_softmax")
            np.testing.assert_allclose(got[f"y{i}"], want, rtol=2e-6, atol=atol,
                                       err_msg=f"{s}, {threads} threads")


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_special_values_as_numpy(op, tmp_path, emitted) -> None:
    """A NaN anywhere in a row makes the row NaN, a row of -inf is NaN, a +inf element takes
    all the weight (the others NaN for log-softmax's inf - inf), very negative logits give 0."""
    x = (RNG.standard_normal((6, 21)) * 3).astype(np.float32)
    x[0, 3] = np.nan
    x[1] = -np.inf
    x[2, 5] = np.inf
    x[3, 7] = -np.inf
    x[4, ::2] = -200.0
    x[5, 20] = 1e30
    path = tmp_path / "m.mlc"
    export_module(module(op, [x.shape]), path)
    assert emitted
    with load(path) as model:
        got = model.run({"x0": x})["y0"]
    with np.errstate(all="ignore"):
        want = get_op(op).reference(x, axis=-1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-6, atol=1e-7)


def test_fused_softmax_is_not_taken(tmp_path, emitted) -> None:
    """softmax(x) * 2 fused into one function is not a plain softmax: the generic kernel runs."""
    bb = BlockBuilder()
    x = bb.input("x", (4, 40))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit_op("nn.softmax", x, axis=-1)
            y = bb.emit_output(bb.emit_op("multiply", s, bb.constant(np.float32([2.0]), "two")))
        bb.emit_func_output(y, names=["y"])
    path = tmp_path / "m.mlc"
    export_module(bb.get(), path)
    v = RNG.standard_normal((4, 40)).astype(np.float32)
    with load(path) as model:
        got = model.run({"x": v})["y"]
    np.testing.assert_allclose(got, 2 * get_op("nn.softmax").reference(v, axis=-1), rtol=1e-6)


def test_a_cache_hit_is_counted(tmp_path, emitted) -> None:
    """The spy counts with the compile cache on (helpers.SharedLog.count_cache_hits): a module
    it has not seen emitted misses the cache (the spy sees it) and is stored; the next
    exports come from the cache, emit nothing, and count its kernels as they were emitted."""
    mod = module("nn.softmax", SHAPES[:2])
    hits = []
    for name in "abc":
        report = export_module(mod, tmp_path / f"{name}.mlc", ExportOptions(target="x86-64-v2"))
        hits += [hit for _, _, hit in report.compiles]
    assert hits == [False, True, True]
    assert emitted.items() == [False, False] * 3
    assert (tmp_path / "a.mlc").read_bytes() == (tmp_path / "c.mlc").read_bytes()
