"""A Loop whose trip count and condition are known only at run time runs as the VM's counted
loop (issue 37 item 3, format 1.8: LOOP ... NEXT): the body is compiled once and runs as many
times as the model's trip count and condition say, its carried values double-buffered in the
arena. The model (``loop_models.counted_loop``) takes its trip count and condition as graph
inputs, breaks when a running sum passes a limit, and branches inside its body (an If on the
iteration number: a jump inside the loop's body).

The bundle is exported once per test run with the command line's defaults (golden check on);
tests/runtime/test_c_runtime.py checks the C runtime bit-identical on it and refusing the same
damaged loops."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader, reader_minor
from mlcpack.runtime.errors import BundleError, FormatVersionError
from mlcpack.runtime.header import OP_JUMP_UNLESS, OP_LOOP, OP_NEXT
from onnx import TensorProto, helper, numpy_helper

import loop_models as lm
from conftest import SLOW, assert_one_line_error


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    return lm.exported(tmp_path_factory)


@pytest.mark.parametrize("kind", ["open-scan", "rows-loop", "nested"])
def test_scans_and_nested_loops_match_onnx_runtime(tmp_path_factory, kind) -> None:
    """A Scan over an axis of open length and a Loop over an input's rows (its trip count
    Shape(x)[0]), with no --max-shape: one body, run as the VM's loop; the scan outputs have
    the length (the Scan) or the rows that ran before the break (the Loop). Two nested Loops
    on run-time trip counts (0 and up, each). ONNX Runtime's values and shapes."""
    src, bundle = lm.exported(tmp_path_factory, kind)
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    cases = {"open-scan": [lm.open_scan_feeds(n, seed=n) for n in (1, 2, 9)],
             "rows-loop": [lm.rows_loop_feeds(n, lim, seed=n) for n in (1, 2, 9)
                           for lim in (1e9, 0.5, 2.5)],
             "nested": [lm.nested_feeds(m, k) for m, k in ((0, 3), (1, 0), (2, 3), (5, 4))]}[kind]
    names = [o.name for o in onnx.load(str(src)).graph.output]
    with load(bundle) as model:
        assert lm.opcodes(bundle).count(OP_LOOP) == (2 if kind == "nested" else 1)
        for feeds in cases:
            got = model.run(feeds)
            for name, ref in zip(names, session.run(None, feeds)):
                assert got[name].shape == ref.shape, (name, feeds)
                np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)


# (trip count, condition, limit): zero trips, a false condition, the count running out, a break
CASES = [(0, True, 1e9), (1, True, 1e9), (3, True, 1e9), (7, True, 1e9), (7, False, 1e9),
         (40, True, 1e9), (40, True, 2.0), (-5, True, 1e9), ((1 << 63) - 1, True, 2.0)]


def test_matches_onnx_runtime_at_run_time_trip_counts(counted) -> None:
    """Every trip count (0, negative, 2**63 - 1 with a break), condition and limit, at several
    lengths of the carried value: ONNX Runtime's outputs (within float32 rounding: the sum's
    order is the kernel's)."""
    src, bundle = counted
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with load(bundle) as model:
        for n in (1, 3, 17):
            for m, cond, lim in CASES:
                feeds = lm.feeds(m, cond, lim, n=n, seed=n)
                got = model.run(feeds)
                want = dict(zip(["x", "s"], session.run(None, feeds)))
                for name, ref in want.items():
                    assert got[name].shape == ref.shape, (name, m, cond, lim, n)
                    np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6,
                                               err_msg=f"{name} {m} {cond} {lim} {n}")


def test_bundle_is_format_1_8_and_older_readers_refuse_it(counted, monkeypatch) -> None:
    _, bundle = counted
    with BundleReader(bundle) as reader:
        header = reader.header
        assert header["format"] == [1, 8] and header["min_reader"] == [1, 8]
        assert header["vm"]["loops"] == 1 and header["vm"]["branches"] == 1
        assert reader_minor(header) == 8
    ops = lm.opcodes(bundle)
    assert ops.count(OP_LOOP) == 1 and ops.count(OP_NEXT) == 1
    assert ops.index(OP_LOOP) < ops.index(OP_JUMP_UNLESS) < ops.index(OP_NEXT)
    monkeypatch.setattr(bundle_format, "LOOP_MINOR", 7)   # a 1.7 reader
    with pytest.raises(FormatVersionError, match="1.8"):
        load(bundle).close()


@pytest.mark.parametrize("change", lm.DAMAGE)
def test_damaged_loops_are_refused(counted, tmp_path, change) -> None:
    """A NEXT that names no LOOP or one after it, a LOOP whose end is not after its NEXT, a count
    that is not one int64, an iteration number the VM would write into a constant, a jump out
    of the body: refused at load, in one line."""
    _, bundle = counted
    path = lm.damaged_bytecode(bundle, tmp_path / f"{change}.mlc", change)
    with pytest.raises(BundleError) as info:
        load(path).close()
    text = str(info.value)
    assert "\n" not in text and ("invalid bytecode" in text or "LOOP reads" in text), text


def _scan_loop(path, changing: bool = False):
    """A Loop on a trip count fed at run time with a scan output, or (``changing``) a carried
    value that grows each iteration."""
    body_nodes = [helper.make_node("Add", ["y", "one"], ["y2"]),
                  helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    outs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)]
    if changing == "double":   # its extent doubles: a resized carried value
        body_nodes[0] = helper.make_node("Concat", ["y", "y"], ["y2"], axis=0)
    elif changing:   # its rank grows: refused
        body_nodes[0] = helper.make_node("Unsqueeze", ["y", "zero"], ["y2"])
    else:
        body_nodes.append(helper.make_node("Identity", ["y2"], ["row"]))
        outs.append(helper.make_tensor_value_info("row", TensorProto.FLOAT, None))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], outs,
        [numpy_helper.from_array(np.ones(2, np.float32), "one"),
         numpy_helper.from_array(np.zeros(1, np.int64), "zero")])
    names = ["y_out"] if changing else ["y_out", "rows"]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "y0"], names, body=body)], "scan_loop",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_what_a_run_time_loop_cannot_hold_is_refused_in_one_line(tmp_path, run_cli) -> None:
    """A carried value whose rank changes between iterations: one line that says why, the
    export error's exit code, nothing written. One whose extent doubles each iteration runs
    (a resized carried value) and is ONNX Runtime's at 0 to 5 iterations."""
    src = _scan_loop(tmp_path / "m.onnx", changing="rank")
    out = tmp_path / "m.mlc"
    line = assert_one_line_error(run_cli("export", src, "-o", out, timeout=300))
    assert "carried value 0 changes" in line and "Loop" in line and not out.exists(), line
    src = _scan_loop(tmp_path / "d.onnx", changing="double")
    from mlcpack.packager.api import Options, export

    export(src, tmp_path / "d.mlc", Options())
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with load(tmp_path / "d.mlc") as model:
        for m in range(6):
            feeds = {"M": np.array(m, np.int64), "y0": np.array([1.5, -2.0], np.float32)}
            np.testing.assert_array_equal(model.run(feeds)["y_out"], session.run(None, feeds)[0])


# ---- format 1.9: scan outputs with no bound at export (row stores) ------------------------------

def test_a_row_store_read_by_another_node_is_refused_in_one_line(tmp_path, run_cli) -> None:
    """A scan output with no bound at export that another node reads (here an Add): its size
    has no bound to plan the reader's memory at; refused in one line naming --bind, the export
    error's exit code, nothing written."""
    model = onnx.load(_scan_loop(tmp_path / "m.onnx"))
    graph = model.graph
    graph.output[1].name = "rows_plus"
    graph.node.append(helper.make_node("Add", ["rows", "bump"], ["rows_plus"]))
    graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), "bump"))
    onnx.save(model, tmp_path / "m.onnx")
    out = tmp_path / "m.mlc"
    line = assert_one_line_error(run_cli("export", tmp_path / "m.onnx", "-o", out, timeout=300))
    assert "can only be a model output" in line and "--bind" in line and not out.exists(), line


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return lm.exported(tmp_path_factory, "stored")


# (trip count, limit): none, one, a few, up to the test bundle's cap (40 rows), negative, and
# 2**63 - 1 stopped by the break
STORED_CASES = [(0, 1e9), (1, 1e9), (5, 1e9), (40, 1e9), (-2, 1e9), (40, 30.0),
                ((1 << 63) - 1, 30.0)]


def test_scan_outputs_with_no_bound_match_onnx_runtime(stored) -> None:
    """A Loop on a fed trip count (and a break) whose scan outputs (float32 rows of the
    carried value, the int64 iteration numbers) have no bound at export: exported by default
    (format 1.9), the VM appends their rows; ONNX Runtime's shapes and values, 0 rows
    included."""
    src, bundle = stored
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = ["acc", "rows", "iters"]
    with load(bundle) as model:
        for k, (m, lim) in enumerate(STORED_CASES):
            feeds = lm.stored_feeds(m, lim, seed=k)
            got = model.run(feeds)
            for name, ref in zip(names, session.run(None, feeds)):
                assert got[name].shape == ref.shape and got[name].dtype == ref.dtype, (name, m)
                np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6,
                                           err_msg=f"{name} {m} {lim}")


def test_loops_with_a_worker_pool_match_one_thread(stored, counted) -> None:
    """The VM's loop with a worker pool (threads=2: each run of kernel calls posted through
    the pool, not the pre-bound single-thread call): the one-thread run's values, bit for
    bit, for the row-store loop and the counted loop with a branch in its body."""
    for (_src, bundle), cases in ((stored, [lm.stored_feeds(m, lim, seed=k)
                                           for k, (m, lim) in enumerate(STORED_CASES)]),
                                 (counted, [lm.feeds(m, c, lim, n=3, seed=3)
                                            for m, c, lim in CASES[:7]])):
        with load(bundle, threads=1) as one, load(bundle, threads=2) as two:
            for feeds in cases:
                want, got = one.run(feeds), two.run(feeds)
                for name, ref in want.items():
                    np.testing.assert_array_equal(got[name], ref, err_msg=name)


def test_row_stores_under_plans_made_per_shape_match_onnx_runtime(tmp_path_factory) -> None:
    """The same loop where an input of open length feeds the break's limit: the memory plan is
    made per input shape at run time (not once at export); its row stores as before, ONNX
    Runtime's outputs at three lengths."""
    src, bundle = lm.exported(tmp_path_factory, "stored-open")
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with load(bundle) as model:
        for k, (m, lim, n) in enumerate(((0, 5.0, 1), (9, 5.0, 2), (50, 100.0, 5), (30, 1e9, 3))):
            feeds = lm.stored_feeds(m, lim, seed=k, n=n)
            got = model.run(feeds)
            assert model.last_plan == "symbolic"
            for name, ref in zip(["acc", "rows", "iters"], session.run(None, feeds)):
                assert got[name].shape == ref.shape, (name, m, n)
                np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6, err_msg=name)


def test_row_stores_are_format_1_9_and_older_readers_refuse_them(stored, monkeypatch,
                                                                  run_cli) -> None:
    from mlcpack.runtime.header import OP_APPEND, STORE

    _, bundle = stored
    shown = run_cli("inspect", bundle).stdout
    assert "rows a Loop appends at run time (memory grown as they come): rows1 <= 40" in shown
    with BundleReader(bundle) as reader:
        header = reader.header
        assert header["format"] == [1, 9] and header["min_reader"] == [1, 9]
        assert header["vm"]["stores"] == 2 and reader_minor(header) == 9
        assert sum(t[0] == STORE for t in header["tensors"]) == 2
    assert lm.opcodes(bundle).count(OP_APPEND) == 2
    monkeypatch.setattr(bundle_format, "STORE_MINOR", 8)   # a 1.8 reader
    with pytest.raises(FormatVersionError, match="1.9"):
        load(bundle).close()


def test_a_loop_past_its_row_cap_is_refused_in_one_line(stored, tmp_path, run_cli) -> None:
    """A loop that would append more rows than the store's cap (here 40 rows, the test bundle's;
    256 MiB by default): an input error in one line, exit code 7, at 41 iterations and at
    2**63 - 1 with no break."""
    _, bundle = stored
    for m in (41, (1 << 63) - 1):
        paths = []
        for name, value in lm.stored_feeds(m).items():   # in the model's input order
            paths.append(tmp_path / f"{name}.npy")
            np.save(paths[-1], value)
        proc = run_cli("infer", bundle, *paths, timeout=120)
        line = assert_one_line_error(proc)
        assert proc.returncode == 7 and "scan output" in line and "cap" in line, line


@pytest.mark.parametrize("change", lm.STORE_DAMAGE)
def test_damaged_row_stores_are_refused(stored, tmp_path, change) -> None:
    """An APPEND into an arena row, an APPEND of a row of another dtype or shape, a COPY that
    reads a STORE row: refused at load, in one line."""
    _, bundle = stored
    path = lm.damaged_bytecode(bundle, tmp_path / f"{change}.mlc", change)
    with pytest.raises(BundleError) as info:
        load(path).close()
    text = str(info.value)
    assert "\n" not in text and ("APPEND" in text or "STORE" in text), text


def test_slice_by_the_iteration_number_matches_onnx_runtime(tmp_path_factory, tmp_path,
                                                            run_cli) -> None:
    """ONNX's test_loop11 with its trip count fed (no --bind): a Slice of a constant by the
    iteration number (its length counted in the body), a carried value whose extent is that
    length (checked at run time to stay 1), a scan output with no bound. ONNX Runtime's
    outputs at trip counts 0 to 5 and a false condition; at 6 the slice is empty and the
    carried value would change shape: ONNX Runtime fails the run, and so do we, in one line
    (TRAP 2, exit code 7)."""
    src, bundle = lm.exported(tmp_path_factory, "loop11")
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with BundleReader(bundle) as reader:
        assert reader.header["format"] == [1, 9]
    with load(bundle) as model:
        for m, cond in ((0, True), (1, True), (3, True), (5, True), (5, False)):
            feeds = lm.loop11_feeds(m, cond)
            got = model.run(feeds)
            for name, ref in zip(["res_y", "res_scan"], session.run(None, feeds)):
                assert got[name].shape == ref.shape, (name, m, cond)
                np.testing.assert_array_equal(got[name], ref, err_msg=f"{name} {m}")
    paths = []
    for name, value in lm.loop11_feeds(6).items():
        paths.append(tmp_path / f"{name}.npy")
        np.save(paths[-1], value)
    proc = run_cli("infer", bundle, *paths, timeout=120)
    line = assert_one_line_error(proc)
    assert proc.returncode == 7 and "changes shape between iterations" in line, line


# ---- format 1.10: carried values that grow between iterations ----------------------------------

@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    return lm.exported(tmp_path_factory, "grown")


# (trip count, limit, prompt tokens, kept0's length): none, one, a few, 40, a break, negative,
# and 2**63 - 1 stopped by the break
GROWN_CASES = [(0, 1e9, 2, 1), (1, 1e9, 1, 3), (5, 1e9, 3, 1), (40, 1e9, 2, 2), (40, 0.5, 2, 1),
               (-3, 1e9, 1, 1), ((1 << 63) - 1, 0.5, 2, 1)]


def test_grown_values_match_onnx_runtime(grown) -> None:
    """A greedy decode on a fed trip count with a break (``loop_models.grown_values``): its
    token list (int64 [1, T + i], Concat along axis 1 after a 1), its hidden states' history
    (float32 [i, 4] from an empty constant) and a value that grows by a number of elements a
    kernel counts each iteration (a Compress) are exported by default (format 1.10) and have
    ONNX Runtime's shapes and values at every trip count, prompts of 1 to 3 tokens; 2 threads
    give the same bytes."""
    src, bundle = grown
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = ["h", "tokens", "hist", "kept"]
    with load(bundle) as model, load(bundle, threads=2) as two:
        for k, (m, lim, t, n) in enumerate(GROWN_CASES):
            feeds = lm.grown_feeds(m, lim, seed=k, t=t, k=n)
            got, again = model.run(feeds), two.run(feeds)
            for name, ref in zip(names, session.run(None, feeds)):
                assert got[name].shape == ref.shape and got[name].dtype == ref.dtype, (name, m)
                np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} {m} {lim}")
                np.testing.assert_array_equal(again[name], got[name], err_msg=name)


def test_grown_values_are_format_1_10_and_older_readers_refuse_them(grown, stored, monkeypatch,
                                                                    run_cli) -> None:
    """Only bundles with a carried value that grows say 1.10 (the vm record's ``grows``: its
    three STORE rows); the row-store bundle stays 1.9 with no ``grows``; a 1.9 reader refuses
    the 1.10 bundle naming its version."""
    from mlcpack.runtime.header import OP_APPEND, STORE

    _, bundle = grown
    with BundleReader(bundle) as reader:
        header = reader.header
        assert header["format"] == [1, 10] and header["min_reader"] == [1, 10]
        assert reader_minor(header) == 10 and len(header["vm"]["grows"]) == 3
        assert all(header["tensors"][t][0] == STORE for t in header["vm"]["grows"])
    assert lm.opcodes(bundle).count(OP_APPEND) == 5   # tokens0 and kept0 before the loop, 3 in it
    shown = run_cli("inspect", bundle).stdout
    assert "rows a Loop appends at run time (memory grown as they come): grown1 <= 128" in shown
    with BundleReader(stored[1]) as reader:
        assert reader.header["format"] == [1, 9] and "grows" not in reader.header["vm"]
    monkeypatch.setattr(bundle_format, "GROW_MINOR", 9)   # a 1.9 reader
    with pytest.raises(FormatVersionError, match="1.10"):
        load(bundle).close()


def test_a_value_past_its_cap_is_refused_in_one_line(grown, tmp_path, run_cli) -> None:
    """A loop whose carried value would grow past its cap (here 64 rows of the history, the
    test bundle's; 256 MiB by default): an input error in one line, exit code 7."""
    _, bundle = grown
    paths = []
    for name, value in lm.grown_feeds(100).items():
        paths.append(tmp_path / f"{name}.npy")
        np.save(paths[-1], value)
    line = assert_one_line_error(proc := run_cli("infer", bundle, *paths, timeout=120))
    assert proc.returncode == 7 and "would grow past its cap" in line, line


@pytest.mark.parametrize("change", lm.GROWN_DAMAGE)
def test_damaged_grows_are_refused(grown, tmp_path, change) -> None:
    """The vm record's ``grows`` leaving out a STORE row that takes several rows at once and
    rows before its loop, naming an arena row, naming a row twice, not a list: refused at load,
    in one line."""
    path = lm.damaged_grows(grown[1], tmp_path / f"{change}.mlc", change)
    with pytest.raises(BundleError) as info:
        load(path).close()
    text = str(info.value)
    assert "\n" not in text and ("APPEND" in text or "grows" in text), text


def test_a_scan_state_that_grows_matches_numpy(tmp_path) -> None:
    """A Scan over an axis of open length whose state is ``Concat(acc, x_t[None])`` (ONNX
    Runtime refuses to run it: its Scan keeps state shapes fixed) runs as the VM's loop with a
    grown value: numpy's concatenation at three lengths and initial sizes."""
    from mlcpack.packager.api import Options, export

    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "zero"], ["xr"]),
         helper.make_node("Concat", ["acc", "xr"], ["acc2"], axis=0),
         helper.make_node("Add", ["s", "x"], ["s2"])], "body",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [None, 2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s2", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("acc2", TensorProto.FLOAT, [None, 2])],
        [numpy_helper.from_array(np.array([0], np.int64), "zero")])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "acc0", "xs"], ["s", "acc"], body=body,
                          num_scan_inputs=1)], "scan_grows",
        [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("acc0", TensorProto.FLOAT, ["A", 2]),
         helper.make_tensor_value_info("xs", TensorProto.FLOAT, ["S", 2])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "scan.onnx")
    export(tmp_path / "scan.onnx", tmp_path / "scan.mlc", Options())
    with load(tmp_path / "scan.mlc") as m:
        for s, a in ((1, 1), (4, 2), (9, 3)):
            xs = np.random.default_rng(s).standard_normal((s, 2)).astype(np.float32)
            acc0 = np.arange(2 * a, dtype=np.float32).reshape(a, 2)
            got = m.run({"s0": np.zeros(2, np.float32), "acc0": acc0, "xs": xs})
            np.testing.assert_array_equal(got["acc"], np.concatenate([acc0, xs]))
            np.testing.assert_allclose(got["s"], xs.sum(0), rtol=1e-6)


@pytest.mark.skipif(not SLOW, reason="MLCPACK_SLOW=1 only (torch's export takes seconds; "
                    "test_grown_values_match_onnx_runtime covers the same path)")
def test_a_torch_exported_greedy_decode_matches_onnx_runtime(tmp_path) -> None:
    """A greedy decode as torch exports it (torch.jit.script of ``for i in range(int(n)): tok,
    h = step(tok, h); tokens = torch.cat([tokens, tok.unsqueeze(1)], 1)``, the TorchScript
    exporter, seeded weights; the prompt's length open): exported by default, ONNX Runtime's
    tokens and state at 0, 1, 6 and 50 steps."""
    import torch
    from mlcpack.packager.api import Options, export
    from torch import nn

    torch.manual_seed(0)

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.inp = nn.Embedding(12, 8), nn.Linear(8, 8)
            self.rec, self.out = nn.Linear(8, 8), nn.Linear(8, 12)

        def forward(self, tok: torch.Tensor, h: torch.Tensor):
            h = torch.tanh(self.inp(self.emb(tok)) + self.rec(h))
            return self.out(h).argmax(-1), h

    class Greedy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = Step()

        def forward(self, prompt: torch.Tensor, h: torch.Tensor, n: torch.Tensor):
            tokens, tok = prompt, prompt[:, -1]
            for _ in range(int(n)):
                tok, h = self.step(tok, h)
                tokens = torch.cat([tokens, tok.unsqueeze(1)], 1)
            return tokens, h

    src = tmp_path / "greedy.onnx"
    torch.onnx.export(torch.jit.script(Greedy().eval()),
                      (torch.tensor([[3, 5]]), torch.zeros(1, 8), torch.tensor(4)), str(src),
                      input_names=["prompt", "h0", "n"], output_names=["tokens", "h"],
                      dynamic_axes={"prompt": {1: "T"}}, opset_version=17, dynamo=False)
    export(src, tmp_path / "greedy.mlc", Options())
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with load(tmp_path / "greedy.mlc") as model:
        for k, t in ((0, 2), (1, 1), (6, 3), (50, 2)):
            feeds = {"prompt": np.arange(1, t + 1, dtype=np.int64)[None],
                     "h0": np.full((1, 8), 0.1, np.float32), "n": np.array(k, np.int64)}
            got, (tokens, h) = model.run(feeds), session.run(None, feeds)
            assert got["tokens"].shape == tokens.shape, (k, got["tokens"].shape)
            np.testing.assert_array_equal(got["tokens"], tokens)
            np.testing.assert_allclose(got["h"], h, rtol=1e-5, atol=1e-6)


def test_a_grown_value_whose_shape_the_body_reads_matches_onnx_runtime(tmp_path) -> None:
    """The body reads the token list's length (``Shape(tokens)[1]``, as a decoder computes its
    position): the token list is no row store (the body would see its initial length) but a
    resized carried value (``carriedK`` bound at run time); its lengths, returned as a scan
    output, and every value are ONNX Runtime's, open prompt lengths included."""
    model = onnx.load(lm.grown_values(tmp_path / "m.onnx"))
    loop = model.graph.node[0]
    body = loop.attribute[0].g
    body.node.extend([helper.make_node("Shape", ["tokens_in"], ["tshape"]),
                      helper.make_node("Gather", ["tshape", "one"], ["tlen"], axis=0)])
    body.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
    body.output.append(helper.make_tensor_value_info("tlen", TensorProto.INT64, []))
    loop.output.append("lens")
    model.graph.output.append(helper.make_tensor_value_info("lens", TensorProto.INT64, None))
    src, bundle = tmp_path / "lens.onnx", tmp_path / "lens.mlc"
    onnx.save(model, src)
    from mlcpack.packager.api import Options, export

    export(src, bundle, Options())
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = ["h", "tokens", "hist", "kept", "lens"]
    with load(bundle) as m:
        for k, (trips, lim, t, n) in enumerate(GROWN_CASES[:5]):
            feeds = lm.grown_feeds(trips, lim, seed=k, t=t, k=n)
            got = m.run(feeds)
            for name, ref in zip(names, session.run(None, feeds)):
                assert got[name].shape == ref.shape, (name, trips)
                np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} {trips}")


# ---- carried values whose extents change and that the body reads (no new format) ----------------

@pytest.fixture(scope="module")
def kv(tmp_path_factory):
    return lm.exported(tmp_path_factory, "kv")


# (trip count, limit, seed, cache rows, queue length, sel length): none, one, a few, 40 (past the
# queue's length: it stays empty), a one-row cache and queue, breaks, negative, 2**63 - 1 broken
KV_CASES = [(0, 1e9, 0, 2, 3, 1), (1, 1e9, 1, 1, 2, 2), (5, 1e9, 2, 3, 3, 1),
            (40, 1e9, 3, 2, 5, 4), (7, 1e9, 4, 1, 1, 1), (40, 1.0, 0, 2, 3, 1),
            (-3, 1e9, 5, 2, 1, 1), ((1 << 63) - 1, 2.0, 4, 3, 2, 2)]


def test_carried_values_the_body_reads_match_onnx_runtime(kv) -> None:
    """A decoder loop (``loop_models.kv_cache``) whose body reads key and value caches that
    grow along their third axis (two heads before it: attention over the whole caches each
    step, sharing one ``carriedK``; the length read by Shape), a queue that shrinks to empty and a value recomputed at a counted size each
    iteration, with a reader of the cache after the loop: ONNX Runtime's shapes and values at
    every trip count, 2 threads the same bytes. The bundle needs no new format (LOOP, BIND_SIZE
    inside the body, kernels over the resized extents: 1.8)."""
    src, bundle = kv
    with BundleReader(bundle) as reader:
        assert reader.header["format"] == [1, 8], reader.header["format"]
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = ["h", "cache", "queue", "sel", "cache_mean", "vals"]
    with load(bundle) as model, load(bundle, threads=2) as two:
        for m, lim, seed, p, q, n in KV_CASES:
            feeds = lm.kv_feeds(m, lim, seed=seed, p=p, q=q, s=n)
            got, again = model.run(feeds), two.run(feeds)
            for name, ref in zip(names, session.run(None, feeds)):
                assert got[name].shape == ref.shape and got[name].dtype == ref.dtype, (name, m)
                np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} {m} {lim}")
                np.testing.assert_array_equal(again[name], got[name], err_msg=name)


def test_a_carried_value_past_its_bound_is_refused_in_one_line(kv, tmp_path, run_cli) -> None:
    """A loop whose KV cache would pass its bound (here 64 rows past the prompt, the test
    bundle's; 256 MiB of them by default): an input error in one line, exit code 7."""
    paths = []
    for name, value in lm.kv_feeds(100).items():
        paths.append(tmp_path / f"{name}.npy")
        np.save(paths[-1], value)
    line = assert_one_line_error(proc := run_cli("infer", kv[1], *paths, timeout=120))
    assert proc.returncode == 7 and "grown past its cap" in line, line


@pytest.mark.skipif(not SLOW, reason="MLCPACK_SLOW=1 only (torch's export takes seconds; "
                    "test_carried_values_the_body_reads_match_onnx_runtime covers the same path)")
def test_a_torch_exported_kv_cache_decode_matches_onnx_runtime(tmp_path) -> None:
    """A greedy decode with a KV cache as torch exports it (torch.jit.script of a loop whose
    step attends over key and value caches ``[1, 2, T, 4]`` grown by ``torch.cat(.., 2)``
    each step, the prompt's cache of open length, seeded weights; the TorchScript exporter):
    exported by default, ONNX Runtime's tokens and caches at 0, 1, 6 and 40 steps."""
    import torch
    from mlcpack.packager.api import Options, export
    from torch import nn

    torch.manual_seed(0)

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.qkv, self.out = nn.Embedding(12, 8), nn.Linear(8, 24), nn.Linear(8, 12)

        def forward(self, tok: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
            q, k, v = self.qkv(self.emb(tok)).reshape(1, 3, 2, 1, 4).unbind(1)
            keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
            att = torch.softmax(q @ keys.transpose(2, 3) * 0.5, -1) @ values
            return self.out(att.reshape(1, 8)).argmax(-1), keys, values

    class Decode(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = Step()

        def forward(self, tok: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    n: torch.Tensor):
            tokens = tok.unsqueeze(1)
            for _ in range(int(n)):
                tok, keys, values = self.step(tok, keys, values)
                tokens = torch.cat([tokens, tok.unsqueeze(1)], 1)
            return tokens, keys, values

    src = tmp_path / "kv.onnx"
    torch.onnx.export(torch.jit.script(Decode().eval()),
                      (torch.tensor([3]), torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4),
                       torch.tensor(4)), str(src),
                      input_names=["tok", "keys0", "values0", "n"],
                      output_names=["tokens", "keys", "values"],
                      dynamic_axes={"keys0": {2: "T"}, "values0": {2: "T"}}, opset_version=17,
                      dynamo=False)
    export(src, tmp_path / "kv.mlc", Options())
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with load(tmp_path / "kv.mlc") as model:
        for k, t in ((0, 2), (1, 1), (6, 3), (40, 2)):
            feeds = {"tok": np.array([k % 12], np.int64),
                     "keys0": rng.standard_normal((1, 2, t, 4)).astype(np.float32),
                     "values0": rng.standard_normal((1, 2, t, 4)).astype(np.float32),
                     "n": np.array(k, np.int64)}
            got = model.run(feeds)
            for name, ref in zip(["tokens", "keys", "values"], session.run(None, feeds)):
                assert got[name].shape == ref.shape, (name, k, got[name].shape)
                np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5,
                                           err_msg=f"{name} {k}")
