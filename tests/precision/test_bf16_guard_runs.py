"""The bf16 guard's reference runs made cheap without changing its decisions
(packager/precision.py ``_RoundedRuns``, ``sensitive_weights``): a rounding's run recomputes
only the bindings it reaches (the values of the unrounded run or of the last run kept), the
single layers' errors may come from forked workers, numpy's BLAS on one thread; every value
must be a whole run's bit for bit, so the choices are the ones whole runs give (the guard as it
was: ``_whole_runs_choice`` below)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HW = 20


def _branchy_net(seed: int = 3):
    """Conv stem, two branches (conv-relu-conv and a 1x1) added, the sum concatenated with
    the stem, a 3x3 and a Gemm-free 1x1 head, and a second output from the stem's branch (a
    rounding that reaches only one output)."""
    rng = np.random.default_rng(seed)
    inits = {}

    def conv(name, x, ci, co, k, out):
        inits[f"{name}"] = rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)
        inits[f"{name}_b"] = 0.1 * rng.standard_normal(co)
        return helper.make_node("Conv", [x, name, f"{name}_b"], [out], pads=[k // 2] * 4)

    nodes = [conv("stem", "x", 3, 8, 3, "s"), helper.make_node("Relu", ["s"], ["sr"]),
             conv("a1", "sr", 8, 8, 3, "a"), helper.make_node("Relu", ["a"], ["ar"]),
             conv("a2", "ar", 8, 8, 3, "a2o"), conv("b1", "sr", 8, 8, 1, "b"),
             helper.make_node("Add", ["a2o", "b"], ["sum"]),
             helper.make_node("Concat", ["sum", "sr"], ["cat"], axis=1),
             conv("h1", "cat", 16, 8, 3, "h"), helper.make_node("Relu", ["h"], ["hr"]),
             conv("h2", "hr", 8, 4, 1, "y"), conv("side", "ar", 8, 2, 1, "z")]
    graph = helper.make_graph(
        nodes, "branchy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, HW, HW])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, HW, HW]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, HW, HW])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _module():
    from mlcpack.frontends.onnx import import_onnx

    mod, _ = import_onnx(_branchy_net())
    feeds = {"x": np.random.default_rng(5).uniform(-1, 1, (1, 3, HW, HW)).astype(np.float32)}
    return mod, feeds


def _whole_runs_choice(mod, feeds, bound, activations):
    """sensitive_weights as it was: every rounding a whole run of the IR's numpy reference
    (the sets offered from the errors: the same ``_choices``); (the single layers' errors, the
    choices)."""
    from mlcpack.packager.golden import evaluate_ir
    from mlcpack.packager.precision import (SELECT_TARGET, _candidates, _choices, _fewest,
                                            _rounded, output_errors)

    weights = _candidates(mod.functions["main"])
    base = evaluate_ir(mod, feeds)

    def error(names):
        got = evaluate_ir(_rounded(mod, set(names), activations), feeds)
        return max(output_errors(got, base).values())

    costs = {n: error([n]) for n in weights}
    order = sorted(weights, key=lambda n: -costs[n])
    k = _fewest(len(order), lambda k: error(order[k:]) <= SELECT_TARGET * bound)
    fewest = frozenset(order[:k]) if k else None
    return costs, _choices(order, costs, fewest, bound)


def test_cone_runs_are_whole_runs_bit_for_bit():
    """Any sequence of roundings (single layers, the selection's sets, a set and its
    neighbours: the last run kept is the closer start) gives the whole run's outputs exactly,
    with and without the activations rounded; a layer that reaches one output leaves the
    other the unrounded run's array."""
    from mlcpack.packager.golden import evaluate_ir
    from mlcpack.packager.precision import _RoundedRuns, _rounded

    mod, feeds = _module()
    names = ["stem", "a1", "a2", "b1", "h1", "h2", "side"]
    rng = np.random.default_rng(0)
    # single layers, the bisection's sets, random ones; and h2 rounded, then not (h1 neither,
    # against the run before: the closer one), then again (against the run before), where
    # what feeds h2 changed: the last run kept must not lend h2's input's cast from the first
    sets = [[n] for n in names] + [names[k:] for k in range(1, 6)] + [
        ["a2", "h2"], ["a2"], ["h1", "a2"], [], names, ["b1", "side"],
        names, names[:4] + ["side"], names[:4] + ["h2", "side"]] + [
        [n for n in names if rng.random() < 0.5] for _ in range(24)]
    for activations in (True, False):
        runs = _RoundedRuns(mod, feeds, None, activations)
        assert runs.cut
        for s in sets:
            got = runs(s)
            want = evaluate_ir(_rounded(mod, set(s), activations), feeds)
            assert got.keys() == want.keys()
            for n in want:
                assert got[n].dtype == want[n].dtype and np.array_equal(got[n], want[n]), (s, n)
        assert runs(["h2"])["z"] is runs.base["z"]


def test_selection_is_the_whole_runs_selection(monkeypatch):
    """sensitive_weights (cone runs, the single layers' errors in two forked workers) chooses
    what whole runs chose, from the same errors, at bounds that make each choice differ."""
    from mlcpack.packager import precision
    from mlcpack.packager.codegen import parallel

    mod, feeds = _module()
    golden = SimpleNamespace(inputs=feeds)
    runs = precision._RoundedRuns(mod, feeds, None, True)
    singles = [[n] for n in precision._candidates(mod.functions["main"])]
    serial = [runs.error(s) for s in singles]
    monkeypatch.setattr(parallel, "_usable_cpus", lambda: 2)
    assert runs.errors(singles) == serial   # from two workers, bit for bit
    seen = set()
    for activations in (True, False):
        costs, _ = _whole_runs_choice(mod, feeds, 1.0, activations)
        if activations:
            assert list(costs.values()) == serial
        total = sum(costs.values())
        for bound in (0.3 * total, 0.6 * total, 1.2 * total, 2.5 * total):
            _, want = _whole_runs_choice(mod, feeds, bound, activations)
            got = precision.sensitive_weights(mod, None, golden, bound, activations)
            assert got == want, (activations, bound, got, want)
            seen.add(tuple(sorted(len(c) for c in got)))
    assert len(seen) >= 3, seen   # the bounds met different choices
