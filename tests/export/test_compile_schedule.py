"""The grouped parallel compile's job order (issue 35 item 3, codegen/parallel.py
``_group_order``): the targets' kernel groups in ``_target_order``, but the last two targets'
groups alternating, so that their objects (link jobs) run side by side at the end instead of
the last one alone. The order changes no byte of the objects (a target's groups link in their
own order), and a compile worker keeps Python's cycle collector off (``_one_job_worker``)."""

from __future__ import annotations

import gc

import pytest
from conftest import ARTIFACTS

from mlcpack.packager.codegen import parallel
from mlcpack.packager.codegen.target import resolve_targets
from mlcpack.packager.options import CompileOptions


def test_last_two_targets_groups_alternate() -> None:
    cost = [3.0, 1.0, 2.0]   # groups 0, 2, 1 by cost
    assert parallel._group_order([2, 1, 0], cost) == [
        (2, 0), (2, 2), (2, 1),
        (1, 0), (0, 0), (1, 2), (0, 2), (1, 1), (0, 1)]
    assert parallel._group_order([1, 0], [1.0, 2.0]) == [(1, 1), (0, 1), (1, 0), (0, 0)]
    assert parallel._group_order([0], [1.0, 2.0]) == [(0, 1), (0, 0)]
    four = parallel._group_order([3, 2, 1, 0], [1.0, 1.0])   # stable among equal costs
    assert four == [(3, 0), (3, 1), (2, 0), (2, 1), (1, 0), (0, 0), (1, 1), (0, 1)]


def _cnn_funcs():
    """(prim funcs, size variables, options without a compile cache) of the demo CNN's export."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager import export

    captured = {}

    def capture(funcs, targets, size_vars, options):
        captured["args"] = (list(funcs), tuple(size_vars), options.replace(cache_dir=None))
        raise StopIteration

    mod, _ = import_onnx(str(ARTIFACTS / "cnn.onnx"))
    original = export.compile_for_targets
    export.compile_for_targets = capture
    try:
        with pytest.raises(StopIteration):
            export.compile_variants(mod, target="x86-64-v2,x86-64-v3,x86-64-v4",
                                    options=CompileOptions())
    finally:
        export.compile_for_targets = original
    return captured["args"]


def test_the_order_changes_no_object_and_is_the_one_started(monkeypatch) -> None:
    """The demo CNN at the three x86-64 levels: the jobs start in ``_group_order``'s order
    (v4's groups, then v3's and v2's alternating), and the objects are those of the targets'
    groups run one target after another."""
    funcs, size_vars, options = _cnn_funcs()
    targets = resolve_targets("x86-64-v2,x86-64-v3,x86-64-v4")
    assert len(parallel.kernel_groups(funcs)) > 1
    started: list[tuple[str, str]] = []
    init = parallel._Worker.__init__

    def spy(self, fn, args):
        started.append((fn.__name__, args[1].name))
        init(self, fn, args)

    monkeypatch.setattr(parallel._Worker, "__init__", spy)
    alternating = parallel.compile_for_targets(funcs, targets, size_vars, options)
    groups = [t for fn, t in started if fn == "_group_job"]
    n = len(groups) // 3
    assert groups[:n] == ["x86-64-v4"] * n
    assert groups[n:] == ["x86-64-v3", "x86-64-v2"] * n

    def one_after_another(order, cost):
        return [(t, g) for t in order for g in sorted(range(len(cost)), key=lambda g: -cost[g])]

    monkeypatch.setattr(parallel, "_group_order", one_after_another)
    sequential = parallel.compile_for_targets(funcs, targets, size_vars, options)
    assert [c.object_code for c in alternating] == [c.object_code for c in sequential]


def test_a_compile_worker_runs_without_the_cycle_collector(monkeypatch) -> None:
    monkeypatch.setattr(parallel, "optimize_group", lambda *args: gc.isenabled())
    (outcome,) = parallel._run([(parallel._group_job, ([], None, (), None, None))], 1)
    assert outcome.value is False
    assert gc.isenabled()   # this process's is untouched
