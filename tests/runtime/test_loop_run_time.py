"""Loop whose condition or trip count is computed at run time (issue 37 item 3): every
iteration up to the trip count (known at export, or the largest a trip count computed from the
input sizes takes under ``--max-shape``) is compiled, an iteration after the condition turned false leaves
the carried values as they were, and the scan output comes back with as many rows as the loop
ran (a size variable bound at run time, BIND_SIZE, as NonZero's count). One export, several
stopping points, against ONNX Runtime (rows and values); the C runtime bit-identical. A trip
count from the input sizes or a scan length without ``--max-shape`` runs as the VM's loop
(format 1.8, tests/export/test_run_time_loops.py); a scan output planned at a constant trip count
too large (2**40 rows) is a one-line export error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load
from mlcpack.runtime.errors import InputError
from test_c_runtime import CC, assert_bit_identical

ort = pytest.importorskip("onnxruntime")

F = np.float32
TRIP = 6


def while_model(trip: int = TRIP, cond_input: bool = True) -> onnx.ModelProto:
    """``y = y * 1.5 + x`` while ``sum(y) < limit`` (checked after each step) and the input
    condition held at the start, at most ``trip`` times; scan output: y after each step."""
    body = helper.make_graph([
        helper.make_node("Mul", ["y_in", "k"], ["y1"]),
        helper.make_node("Add", ["y1", "x"], ["y_out"]),
        helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
        helper.make_node("Less", ["s", "limit"], ["cond_out"]),
        helper.make_node("Identity", ["y_out"], ["scan"]),
    ], "body", [
        helper.make_tensor_value_info("i", T.INT64, []),
        helper.make_tensor_value_info("cond_in", T.BOOL, []),
        helper.make_tensor_value_info("y_in", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []),
         helper.make_tensor_value_info("y_out", T.FLOAT, [2, 3]),
         helper.make_tensor_value_info("scan", T.FLOAT, [2, 3])],
        [helper.make_tensor("k", T.FLOAT, [], [1.5])])
    nodes = [helper.make_node("Loop", ["trip", "cond" if cond_input else "yes", "y0"],
                              ["y", "ys"], body=body)]
    inits = [helper.make_tensor("trip", T.INT64, [], [trip]),
             helper.make_tensor("yes", T.BOOL, [], [True])]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [2, 3]),
              helper.make_tensor_value_info("y0", T.FLOAT, [2, 3]),
              helper.make_tensor_value_info("limit", T.FLOAT, [])]
    if cond_input:
        inputs.append(helper.make_tensor_value_info("cond", T.BOOL, []))
    g = helper.make_graph(nodes, "while", inputs,
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("ys", T.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def feeds(limit: float, cond: bool = True) -> dict:
    rng = np.random.default_rng(0)
    return {"x": rng.random((2, 3)).astype(F), "y0": rng.random((2, 3)).astype(F),
            "limit": np.array(limit, F), "cond": np.array(cond)}


# stops after 1 step, after a few, never before the trip count; a false input condition runs
# none (the scan output then has 0 rows)
CASES = [feeds(0.5), feeds(12.0), feeds(1e9), feeds(1e9, False)]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("loop") / "while.mlc"
    mod, _ = import_onnx(while_model())
    export_module(mod, path, ExportOptions(target="host"))
    return path


def test_loop_with_run_time_condition_matches_onnxruntime(bundle) -> None:
    session = ort.InferenceSession(while_model().SerializeToString())
    rows = []
    with load(bundle) as b:
        for feed in CASES:
            got = b.run(feed)
            for name, want in zip(("y", "ys"), session.run(None, feed)):
                assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
                np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)
            rows.append(got["ys"].shape[0])
    assert rows == [1, 2, TRIP, 0], rows   # the cases stop where they were made to


def test_c_runtime_bit_identical(bundle, tmp_path) -> None:
    if CC is None:
        pytest.skip("no C compiler (cc or gcc) on this machine: the C runtime cannot be built")
    from test_c_runtime import CDIR, _make
    _make("all")
    for k, feed in enumerate(CASES):
        assert_bit_identical(CDIR / "build", bundle, feed, tmp_path / str(k), threads=(1,))


def sized_model(stop: bool = False) -> onnx.ModelProto:
    """``for i in range(x.shape[0]): y += x[i]``, scan output ``2 * y`` after each step (as
    torch.jit exports a loop over a dynamic dim); x is [N, 3], N symbolic. With ``stop``, also
    ``if sum(y) >= 6: break``."""
    until = [helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "six"], ["cond_out"])] if stop else \
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = helper.make_graph([
        helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
        helper.make_node("Add", ["y_in", "row"], ["y_out"]),
        helper.make_node("Add", ["y_out", "y_out"], ["scan"]),
        *until,
    ], "body", [
        helper.make_tensor_value_info("i", T.INT64, []),
        helper.make_tensor_value_info("cond_in", T.BOOL, []),
        helper.make_tensor_value_info("y_in", T.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []),
         helper.make_tensor_value_info("y_out", T.FLOAT, [3]),
         helper.make_tensor_value_info("scan", T.FLOAT, [3])],
        [helper.make_tensor("six", T.FLOAT, [], [6.0])] if stop else None)
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Loop", ["n", "", "y0"], ["y", "ys"], body=body)]
    g = helper.make_graph(nodes, "for_range", [
        helper.make_tensor_value_info("x", T.FLOAT, ["N", 3]),
        helper.make_tensor_value_info("y0", T.FLOAT, [3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [3]),
         helper.make_tensor_value_info("ys", T.FLOAT, None)],
        [helper.make_tensor("zero", T.INT64, [], [0])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def sized_feeds(n: int) -> dict:
    rng = np.random.default_rng(n)
    return {"x": rng.random((n, 3)).astype(F), "y0": rng.random(3).astype(F)}


SIZED = [sized_feeds(n) for n in (1, 3, 5)]


@pytest.fixture(scope="module", params=[False, True], ids=["for", "for_break"])
def sized_bundle(request, tmp_path_factory) -> tuple[bool, Path]:
    path = tmp_path_factory.mktemp("loop") / "for_range.mlc"
    mod, _ = import_onnx(sized_model(request.param), max_shapes={"x": (5, 3)})
    export_module(mod, path, ExportOptions(target="host"))
    return request.param, path


def test_trip_count_from_input_sizes_matches_onnxruntime(sized_bundle) -> None:
    stop, path = sized_bundle
    session = ort.InferenceSession(sized_model(stop).SerializeToString())
    rows = []
    with load(path) as b:
        for feed in SIZED:
            rows.append(b.run(feed)["ys"].shape[0])
            got = b.run(feed)
            for name, want in zip(("y", "ys"), session.run(None, feed)):
                assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
                np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)
        with pytest.raises(InputError):   # above --max-shape: refused, not run past the unroll
            b.run(sized_feeds(6))
    assert rows == ([1, 3, 4] if stop else [1, 3, 5]), rows   # the break cut the longer ones


def test_trip_count_from_input_sizes_c_runtime_bit_identical(sized_bundle, tmp_path) -> None:
    if CC is None:
        pytest.skip("no C compiler (cc or gcc) on this machine: the C runtime cannot be built")
    from test_c_runtime import CDIR, _make
    _make("all")
    for k, feed in enumerate(SIZED):
        assert_bit_identical(CDIR / "build", sized_bundle[1], feed, tmp_path / str(k),
                             threads=(1,))


def test_trip_count_from_input_sizes_without_max_shape_is_the_vms_loop() -> None:
    """With no --max-shape the trip count has no bound to unroll to: the loop runs as the VM's
    (format 1.8; tests/export/test_run_time_loops.py runs such a loop against ONNX Runtime),
    its scan output planned at N rows for each shape."""
    mod, _ = import_onnx(sized_model())
    assert "loop" in [b.value.op for b in mod.functions["main"].bindings()
                      if hasattr(b.value, "op")]


def scan_model() -> onnx.ModelProto:
    """Scan (opset 11) over x's first axis of length L (symbolic), x read forward and backward:
    ``s += a * b``; outputs s after each step forward and ``a - s`` in reversed order."""
    body = helper.make_graph([
        helper.make_node("Mul", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["s_in", "ab"], ["s_out"]),
        helper.make_node("Identity", ["s_out"], ["fwd"]),
        helper.make_node("Sub", ["a", "s_out"], ["rev"]),
    ], "body", [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in ("s_in", "a", "b")],
        [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in ("s_out", "fwd", "rev")])
    node = helper.make_node("Scan", ["s0", "x", "x"], ["s", "ys", "zs"], body=body,
                            num_scan_inputs=2, scan_input_directions=[0, 1],
                            scan_output_directions=[0, 1], scan_output_axes=[0, 1])
    g = helper.make_graph([node], "scan", [
        helper.make_tensor_value_info("s0", T.FLOAT, [2]),
        helper.make_tensor_value_info("x", T.FLOAT, ["L", 2])],
        [helper.make_tensor_value_info("s", T.FLOAT, [2]),
         helper.make_tensor_value_info("ys", T.FLOAT, None),
         helper.make_tensor_value_info("zs", T.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])


SCANS = [{"s0": np.random.default_rng(n).random(2).astype(F),
          "x": np.random.default_rng(n + 9).random((n, 2)).astype(F)} for n in (1, 2, 4)]


@pytest.fixture(scope="module")
def scan_bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("loop") / "scan.mlc"
    mod, _ = import_onnx(scan_model(), max_shapes={"x": (4, 2)})
    export_module(mod, path, ExportOptions(target="host"))
    return path


def test_scan_over_a_run_time_length_matches_onnxruntime(scan_bundle) -> None:
    session = ort.InferenceSession(scan_model().SerializeToString())
    with load(scan_bundle) as b:
        for feed in SCANS:
            got = b.run(feed)
            for name, want in zip(("s", "ys", "zs"), session.run(None, feed)):
                assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
                np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)


def test_scan_over_a_run_time_length_c_runtime_bit_identical(scan_bundle, tmp_path) -> None:
    if CC is None:
        pytest.skip("no C compiler (cc or gcc) on this machine: the C runtime cannot be built")
    from test_c_runtime import CDIR, _make
    _make("all")
    for k, feed in enumerate(SCANS):
        assert_bit_identical(CDIR / "build", scan_bundle, feed, tmp_path / str(k), threads=(1,))


def test_scan_over_a_run_time_length_without_max_shape_matches_onnxruntime(tmp_path) -> None:
    """With no --max-shape the scan length has no bound to unroll to: the Scan runs as the VM's
    loop (format 1.8), both directions of its inputs and of its outputs as ONNX Runtime."""
    path = tmp_path / "scan_open.mlc"
    mod, _ = import_onnx(scan_model())
    export_module(mod, path, ExportOptions(target="host"))
    session = ort.InferenceSession(scan_model().SerializeToString())
    with load(path) as b:
        for feed in SCANS + [{"s0": np.ones(2, F), "x": np.arange(14, dtype=F).reshape(7, 2)}]:
            got = b.run(feed)
            for name, want in zip(("s", "ys", "zs"), session.run(None, feed)):
                assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
                np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)


def test_trip_count_too_large_to_plan_appends_rows(tmp_path) -> None:
    """A run-time condition and a trip count too large to unroll or to plan its scan output's
    rows at (2**40): the VM's loop, its scan output a row store (format 1.9) that grows with
    the rows that ran; ONNX Runtime's outputs, 0 rows included."""
    path = tmp_path / "while_large.mlc"
    model = while_model(trip=1 << 40)
    mod, _ = import_onnx(model)
    export_module(mod, path, ExportOptions(target="host"))
    session = ort.InferenceSession(model.SerializeToString())
    with load(path) as b:
        for feed in CASES:
            got = b.run(feed)
            for name, want in zip(("y", "ys"), session.run(None, feed)):
                assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
                np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)
