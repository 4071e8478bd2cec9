"""The per-kernel profiler (``mlcpack bench --profile``) and kernel provenance: each kernel in
the bundle header names the ONNX nodes it came from (fused kernels all of them, shared kernels
per call site) and a contraction's multiply-adds; the profile covers every VM instruction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from mlcpack.runtime import load
from mlcpack.runtime.errors import BundleError
from mlcpack.runtime.profile import read_sources
from onnx import TensorProto, helper, numpy_helper

from bundle_parts import read_parts, write_parts
from cli_in_process import run_cli_in_process

C, H, W, OUT = 8, 12, 12, 10


def _model() -> onnx.ModelProto:
    """x -> conv_a -> relu_a -> conv_b -> relu_b -> flat -> mm_out -> bias_out: two identical
    conv + relu pairs (one compiled kernel, two call sites) and a matmul with a bias."""
    rng = np.random.default_rng(3)

    def init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)

    inits = [init("wa", (C, C, 3, 3)), init("wb", (C, C, 3, 3)), init("m", (C * H * W, OUT)),
             init("bias", (OUT,))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["ca"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["ca"], ["ra"], name="relu_a"),
             helper.make_node("Conv", ["ra", "wb"], ["cb"], name="conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["cb"], ["rb"], name="relu_b"),
             helper.make_node("Flatten", ["rb"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "m"], ["mm"], name="mm_out"),
             helper.make_node("Add", ["mm", "bias"], ["y"], name="bias_out")]
    graph = helper.make_graph(
        nodes, "profiled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, OUT])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, run_cli) -> Path:
    folder = tmp_path_factory.mktemp("profile")
    onnx.save(_model(), folder / "profiled.onnx")
    out = folder / "profiled.mlc"
    proc = run_cli("export", folder / "profiled.onnx", "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


def _profile_json(run_cli, path: Path, *extra: str) -> dict:
    proc = run_cli("bench", path, "--profile", "--json", "--runs", "7", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _sources(row: dict) -> list[tuple[str, str]]:
    return [(s["name"], s["op"]) for s in row.get("source", [])]


def test_header_names_the_onnx_nodes(bundle) -> None:
    with load(bundle) as model:
        kernels = model.header["kernels"]
    assert [_sources(k) for k in kernels] == [
        [("conv_a", "Conv"), ("relu_a", "Relu")],
        [("conv_b", "Conv"), ("relu_b", "Relu")],
        [("mm_out", "MatMul"), ("bias_out", "Add")]]
    # the two conv + relu kernels are one compiled symbol; each call site keeps its own nodes
    assert kernels[0]["symbol"] == kernels[1]["symbol"]
    conv_macs = C * H * W * C * 3 * 3
    assert [k.get("macs") for k in kernels] == [conv_macs, conv_macs, OUT * C * H * W]


def test_ir_text_and_inspect_show_the_sources(bundle, run_cli) -> None:
    proc = run_cli("inspect", "--ir", bundle)
    assert proc.returncode == 0, proc.stderr
    assert "# from conv_a (Conv), relu_a (Relu)" in proc.stdout
    proc = run_cli("inspect", bundle)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "<-" in line]
    assert len(lines) == 3
    assert lines[1].endswith("<- conv_b (Conv), relu_b (Relu)")
    assert lines[2].endswith("<- mm_out (MatMul), bias_out (Add)")


def test_profile_json_covers_every_instruction(bundle, run_cli) -> None:
    prof = _profile_json(run_cli, bundle)
    with load(bundle) as model:
        count = model.num_instructions
        header = model.header
    assert prof["runs"] == 7 and prof["instructions"] == count == len(prof["kernels"])
    rows = prof["kernels"]
    assert sorted(r["index"] for r in rows) == list(range(count))
    assert [r["rank"] for r in rows] == list(range(1, count + 1))
    assert all(a["mean_us"] >= b["mean_us"] for a, b in zip(rows, rows[1:]))
    assert sum(r["share"] for r in rows) == pytest.approx(100, abs=0.01)
    assert all(0 < r["min_us"] <= r["mean_us"] for r in rows)
    # the instructions account for nearly all of a run; what is left is the loop and the timer
    summed = sum(r["mean_us"] for r in rows)
    assert summed == pytest.approx(prof["instructions_sum_us"], rel=1e-3)
    # (the upper bound on the quietest run: one preemption between two instructions of one
    # of the 7 runs adds milliseconds to the mean on a loaded 2-core host)
    assert summed <= prof["total_us"]["mean"]
    assert prof["total_us"]["min"] <= summed + 50 * count
    for r in rows:
        kernel = header["kernels"][[k["symbol"] for k in header["kernels"]].index(r["kernel"])]
        assert r["kind"] == "kernel" and r["sources"]
        assert r["macs"] == kernel["macs"]            # every kernel here is a contraction
        assert r["gflops"] == pytest.approx(2 * r["macs"] / (r["min_us"] * 1e3), rel=1e-2)
    by_node = {r["sources"][0]["name"]: r for r in rows}
    assert set(by_node) == {"conv_a", "conv_b", "mm_out"}


def test_gflops_only_for_contractions(tmp_path, run_cli) -> None:
    """A model with a transpose kernel: no GFLOP/s there, GFLOP/s on the matmul."""
    rng = np.random.default_rng(0)
    m = numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "m")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="swap", perm=[1, 0]),
             helper.make_node("Sigmoid", ["t"], ["s"], name="squash"),
             helper.make_node("MatMul", ["s", "m"], ["y"], name="project")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])], [m])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "t.onnx")
    assert run_cli("export", tmp_path / "t.onnx", "-o", tmp_path / "t.mlc").returncode == 0
    rows = _profile_json(run_cli, tmp_path / "t.mlc")["kernels"]
    names = {r["sources"][-1]["name"]: r for r in rows}
    assert set(names) == {"squash", "project"}
    assert names["squash"]["macs"] is None and names["squash"]["gflops"] is None
    assert [s["name"] for s in names["squash"]["sources"]] == ["swap", "squash"]
    assert names["project"]["macs"] == 4 * 6 * 5 and names["project"]["gflops"] > 0


def test_table_and_trace(bundle, tmp_path, run_cli) -> None:
    trace = tmp_path / "trace.json"
    proc = run_cli("bench", bundle, "--profile", "--runs", "5", "--trace", trace)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in ("mean µs", "min µs", "share", "GFLOP/s", "conv_a (Conv), relu_a (Relu)",
                 "mm_out (MatMul), bias_out (Add)", "5 runs", "trace: "):
        assert text in out, text
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    with load(bundle) as model:
        count = model.num_instructions
    assert len(spans) == 5 * count
    assert {(e["args"]["run"], e["args"]["index"]) for e in spans} == \
        {(r, i) for r in range(5) for i in range(count)}
    assert all(e["dur"] > 0 and e["ts"] >= 0 and e["tid"] == 1 and e["pid"] == 1 for e in spans)
    # one track: the spans follow each other without overlapping
    ordered = sorted(spans, key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(ordered, ordered[1:]))
    assert any(e["args"]["sources"] == ["conv_b (Conv)", "relu_b (Relu)"] for e in spans)


def test_old_header_without_sources_still_profiles(bundle, tmp_path, run_cli) -> None:
    header, payloads = read_parts(bundle)
    for k in header["kernels"]:
        k.pop("source", None)
        k.pop("macs", None)
    old = write_parts(tmp_path / "old.mlc", header, payloads)
    prof = _profile_json(run_cli, old)
    assert len(prof["kernels"]) == prof["instructions"]
    assert all(r["sources"] == [] and r["gflops"] is None for r in prof["kernels"])
    proc = run_cli("inspect", old)
    assert proc.returncode == 0 and "<-" not in proc.stdout


def test_malformed_sources_are_refused(bundle, tmp_path, one_line_error) -> None:
    header, payloads = read_parts(bundle)
    header["kernels"][0]["source"] = [{"name": 3}]
    bad = write_parts(tmp_path / "bad.mlc", header, payloads)
    proc = run_cli_in_process("bench", bad, "--profile", "--runs", "2")
    assert proc.returncode == BundleError.exit_code
    assert "malformed source list" in one_line_error(proc)
    with pytest.raises(BundleError):
        read_sources("conv_a", "kernel 0")


def test_profile_api_and_untouched_run(bundle) -> None:
    x = np.random.default_rng(1).standard_normal((1, C, H, W)).astype(np.float32)
    with load(bundle) as model:
        before = model.run({"x": x})["y"]
        prof = model.profile({"x": x}, runs=3)
        assert prof.runs == 3 and prof.durations_ns.shape == (3, model.num_instructions)
        np.testing.assert_array_equal(model.run({"x": x})["y"], before)
        assert "conv_a (Conv)" in prof.text()


def test_bad_flags_are_one_line_usage_errors(bundle, one_line_error) -> None:
    for flags in (("--runs", "0"), ("--top", "-1"), ("--threads", "0")):
        proc = run_cli_in_process("bench", bundle, "--profile", *flags)
        assert proc.returncode == 2, proc.stderr
        assert flags[0] in one_line_error(proc)


def test_dynamic_batch_profiles_the_plan_that_runs(tmp_path, run_cli) -> None:
    model = _model()
    for vi in (model.graph.input[0], model.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, tmp_path / "dyn.onnx")
    out = tmp_path / "dyn.mlc"
    proc = run_cli("export", tmp_path / "dyn.onnx", "--batch-sizes", "1,4", "-o", out)
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(2)
    with load(out) as m:
        # A batch with a specialized plan profiles that plan, with its contractions' sizes.
        prof = m.profile({"x": rng.standard_normal((4, C, H, W)).astype(np.float32)}, runs=2)
        assert prof.batch == 4 and "(batch-4 plan)" in prof.text()
        conv = next(t for t in prof.instructions if t.step.sources[0].name == "conv_a")
        assert conv.step.macs == 4 * C * H * W * C * 9
        # Any other batch runs (and profiles) the symbolic plan at that size.
        for n in (3, 6):
            prof = m.profile({"x": rng.standard_normal((n, C, H, W)).astype(np.float32)},
                             runs=1)
            assert f"(N={n})" in prof.text()
            assert any(t.step.sources[0].name == "conv_a" for t in prof.instructions)
    assert _profile_json(run_cli, out)["batch"] == 1      # bench feeds batch 1


def test_builder_sources_reach_library_calls(tmp_path) -> None:
    """IR built in Python: ``bb.source(...)`` names the nodes; a library call keeps its own."""
    from mlcpack.packager.export import export_module
    from mlcpack.packager.ir import BlockBuilder, Source, TensorType

    w = np.random.default_rng(4).standard_normal((8, 6)).astype(np.float32)
    bb = BlockBuilder()
    x = bb.input("x", (2, 6))
    with bb.function("main", [x]):
        with bb.dataflow():
            with bb.source(Source("squash", "Tanh")):
                h = bb.emit_op("tanh", x)
            with bb.source(Source("dense", "Gemm")):
                y = bb.call_library("env.linear", [h, bb.constant(w, "w")],
                                    TensorType((2, 8), "float32"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    path = tmp_path / "lib.mlc"
    export_module(bb.get(), path)
    with load(path) as model:
        assert model.header["library_calls"][0]["source"] == [{"name": "dense", "op": "Gemm"}]
        prof = model.profile({"x": np.ones((2, 6), np.float32)}, runs=2)
    kinds = {t.step.kind: t for t in prof.instructions}
    assert kinds["library"].step.symbol == "env.linear"
    assert kinds["library"].step.sources[0].name == "dense" and kinds["library"].gflops is None
    assert kinds["kernel"].step.sources[0].op == "Tanh"
