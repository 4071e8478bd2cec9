"""ONNX LSTM, GRU and RNN on the fast path (frontends/onnx/rnn_fast.py: one projection matmul,
then the time loop as one ``nn.recurrence`` kernel, packager/codegen/rnn.py), compared with ONNX
Runtime: directions, initial states, biases, GRU linear_before_reset, layouts, several T/B/H
(H not a multiple of the 16-unit weight blocks included), every output; the generic unrolled
path kept for what the kernel does not compute; 2 and 3 threads; x86-64-v2 run here, v4 and
aarch64 cross-compiled, aarch64 run under qemu."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
from mlcpack.packager.codegen.objinfo import undefined_symbols
from mlcpack.packager.codegen.rnn import register_tile
from mlcpack.packager.export import ExportOptions, compile_module, export_module
from mlcpack.packager.ir.graph import Call, CallTIR, Constant
from mlcpack.packager.ops.sequence import pack_recurrent, unpack_recurrent
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}
RTOL, ATOL = 1e-4, 1e-5


def rnn_model(cell: str, t: int, b: int, i: int, h: int, direction: str = "forward",
              bias: bool = True, h0: bool = True, c0: bool = True, lbr: int = 0,
              layout: int = 0, outputs: Sequence[str] | None = None, seed: int = 0,
              **attrs) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One recurrent node with constant W, R, B and the inputs X (and initial states) fed at run
    time; weights scaled by 1/sqrt(fan-in) so the recurrence stays contractive."""
    rng = np.random.default_rng(seed)
    g, d = GATES[cell], 2 if direction == "bidirectional" else 1
    inits = {"W": rng.standard_normal((d, g * h, i)) / np.sqrt(i),
             "R": rng.standard_normal((d, g * h, h)) / np.sqrt(h)}
    if bias:
        inits["B"] = 0.5 * rng.standard_normal((d, 2 * g * h))
    xs, ss = ((t, b, i), (d, b, h)) if layout == 0 else ((b, t, i), (b, d, h))
    feeds = {"X": rng.standard_normal(xs).astype(np.float32)}
    names = ["X", "W", "R", "B" if bias else "", attrs.pop("lens", ""), "h0" if h0 else ""]
    if h0:
        feeds["h0"] = rng.standard_normal(ss).astype(np.float32)
    if cell == "LSTM":
        names.append("c0" if c0 else "")
        if c0:
            feeds["c0"] = rng.standard_normal(ss).astype(np.float32)
    while names[-1] == "":
        names.pop()
    wanted = list(outputs or OUTPUTS[cell])
    node_outs = [o if o in wanted else "" for o in OUTPUTS[cell]]
    while node_outs[-1] == "":
        node_outs.pop()
    attrs = dict(hidden_size=h, direction=direction, layout=layout, **attrs)
    if cell == "GRU":
        attrs["linear_before_reset"] = lbr
    graph = helper.make_graph(
        [helper.make_node(cell, names, node_outs, **attrs)], "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
         for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in wanted],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    return model, feeds


def ort_outputs(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """ONNX Runtime's outputs; a batch-major (layout 1) node, which ORT refuses, runs as the
    same node in layout 0 on transposed inputs, its outputs transposed back."""
    node = model.graph.node[0]
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    if layout == 1:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.node[0].attribute.remove(
            next(a for a in model.graph.node[0].attribute if a.name == "layout"))
        feeds = {k: (np.swapaxes(v, 0, 1) if k in ("X", "h0", "c0") else v)
                 for k, v in feeds.items()}
        for vi in model.graph.input:
            if vi.name in ("X", "h0", "c0"):
                dims = vi.type.tensor_type.shape.dim
                dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    outs = dict(zip(names, session.run(names, feeds)))
    if layout == 1:
        outs = {k: np.transpose(v, (2, 0, 1, 3)) if v.ndim == 4 else np.swapaxes(v, 0, 1)
                for k, v in outs.items()}
    return outs


def run_mlc(model: onnx.ModelProto, feeds: dict, tmp_path: Path, target: str | None = None,
            threads: int | None = None, name: str = "m.mlc") -> dict[str, np.ndarray]:
    mod, info = import_onnx(model)
    path = tmp_path / name
    export_module(mod, path, ExportOptions(target=target))
    with load(path, threads=threads) as bundle:
        return bundle.run({info.input_names[k]: v for k, v in feeds.items()})


def assert_matches_ort(model: onnx.ModelProto, feeds: dict, tmp_path: Path, **kwargs) -> None:
    got = run_mlc(model, feeds, tmp_path, **kwargs)
    for name, ref in ort_outputs(model, feeds).items():
        assert got[name].shape == ref.shape, name
        np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL, err_msg=name)


def before_legalize(model: onnx.ModelProto):
    """The graph the pipeline hands to legalization: high-level calls, dead code removed."""
    names = [p.name for p in DEFAULT_PIPELINE]
    return run_pipeline(import_onnx(model)[0], DEFAULT_PIPELINE[:names.index("legalize")], options=UNPACKED).main


def recurrences(model: onnx.ModelProto) -> list[Call]:
    return [b.value for b in before_legalize(model).bindings()
            if isinstance(b.value, Call) and b.value.op == "nn.recurrence"]


# (cell, T, B, I, H, direction, bias, h0, c0, lbr, layout)
CASES = [
    ("LSTM", 7, 1, 5, 16, "forward", True, True, True, 0, 0),
    ("LSTM", 5, 3, 7, 20, "reverse", False, False, False, 0, 0),
    ("LSTM", 9, 2, 4, 33, "bidirectional", True, True, False, 0, 0),
    ("LSTM", 4, 5, 6, 8, "bidirectional", True, False, True, 0, 1),
    ("LSTM", 1, 1, 3, 5, "forward", True, True, True, 0, 1),
    ("LSTM", 12, 1, 24, 64, "bidirectional", True, True, True, 0, 0),
    ("LSTM", 6, 8, 9, 32, "forward", True, True, True, 0, 0),
    ("GRU", 6, 1, 5, 16, "forward", True, True, False, 0, 0),
    ("GRU", 6, 1, 5, 16, "forward", True, True, False, 1, 0),
    ("GRU", 5, 2, 7, 20, "reverse", False, True, False, 1, 0),
    ("GRU", 5, 2, 7, 20, "reverse", True, False, False, 0, 1),
    ("GRU", 8, 3, 4, 24, "bidirectional", True, True, False, 1, 1),
    ("GRU", 8, 3, 4, 24, "bidirectional", False, False, False, 0, 0),
    ("GRU", 10, 7, 12, 48, "bidirectional", True, True, False, 1, 0),
    ("RNN", 6, 1, 5, 16, "forward", True, True, False, 0, 0),
    ("RNN", 4, 3, 5, 7, "reverse", False, True, False, 0, 1),
    ("RNN", 9, 2, 6, 40, "bidirectional", True, False, False, 0, 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_matches_onnxruntime(case, tmp_path) -> None:
    cell, t, b, i, h, direction, bias, h0, c0, lbr, layout = case
    model, feeds = rnn_model(cell, t, b, i, h, direction, bias, h0, c0, lbr, layout)
    assert len(recurrences(model)) == 1
    assert_matches_ort(model, feeds, tmp_path)


@pytest.mark.parametrize("cell,outputs", [("LSTM", ("Y_h",)), ("LSTM", ("Y_c",)),
                                          ("LSTM", ("Y", "Y_c")), ("LSTM", ("Y_h", "Y_c")),
                                          ("GRU", ("Y_h",)), ("RNN", ("Y_h",))])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_output_subsets(cell, outputs, direction, tmp_path) -> None:
    model, feeds = rnn_model(cell, 6, 2, 5, 12, direction, outputs=outputs, seed=3)
    assert len(recurrences(model)) == 1
    assert_matches_ort(model, feeds, tmp_path)


def test_unread_cell_state_is_not_computed() -> None:
    """torch names Y_c on every LSTM; when nothing reads it, Y is the kernel's own output (no
    extra row, no copy), and when Y_c is an output the row is there."""
    model, _ = rnn_model("LSTM", 5, 1, 4, 8, outputs=("Y", "Y_c"))
    node = model.graph.node[0]
    del model.graph.output[1:]
    assert list(node.output) == ["Y", "", "Y_c"]
    main = before_legalize(model)
    (binding,) = [b for b in main.bindings() if getattr(b.value, "op", "") == "nn.recurrence"]
    assert binding.value.attrs["states"] is False and binding.var.type.shape == (5, 1, 1, 8)
    assert main.outputs == [binding.var]
    model, _ = rnn_model("LSTM", 5, 1, 4, 8, outputs=("Y", "Y_c"))
    (call,) = recurrences(model)
    assert call.attrs["states"] is True and call.type.shape == (6, 1, 1, 8)


def test_elementwise_reader_does_not_fuse_into_the_recurrence(tmp_path) -> None:
    model, feeds = rnn_model("GRU", 6, 2, 5, 12, "bidirectional", lbr=1, outputs=("Y",))
    node_y = model.graph.node[0].output[0]
    model.graph.node[0].output[0] = "Y_raw"
    model.graph.node.extend([
        helper.make_node("Relu", ["Y_raw"], ["Y_relu"]),
        helper.make_node("Add", ["Y_relu", "Y_raw"], [node_y])])
    assert_matches_ort(model, feeds, tmp_path)
    optimized, _, _ = compile_module(import_onnx(model)[0])
    calls = [b.value.func for b in optimized.main.bindings() if isinstance(b.value, CallTIR)]
    assert any(f.startswith("recurrence") for f in calls), calls


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
@pytest.mark.parametrize("threads", [2, 3])
def test_threads(cell, threads, tmp_path) -> None:
    """A bidirectional layer runs its directions as two tasks."""
    model, feeds = rnn_model(cell, 9, 2, 6, 24, "bidirectional", lbr=1, seed=5)
    assert_matches_ort(model, feeds, tmp_path, threads=threads)


GENERIC = {
    "clip": dict(clip=0.5),
    "activations": dict(activations=["Sigmoid", "Relu"] * 2),
    "relu_cell": dict(activations=["Sigmoid", "Tanh", "Relu"] * 2),
    "input_forget": dict(input_forget=1),
    "lens": dict(lens="lens"),
}


@pytest.mark.parametrize("what", sorted(GENERIC))
def test_generic_path_kept_for_what_the_kernel_does_not_compute(what, tmp_path) -> None:
    attrs = dict(GENERIC[what])
    cell = "GRU" if what == "activations" else "LSTM"
    model, feeds = rnn_model(cell, 5, 2, 4, 6, "bidirectional", **attrs)
    if what == "lens":
        model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [2]))
        feeds["lens"] = np.array([5, 3], np.int32)
    assert recurrences(model) == []
    assert_matches_ort(model, feeds, tmp_path)


def test_full_sequence_lens_and_default_activations_named_keep_the_fast_path(tmp_path) -> None:
    model, feeds = rnn_model("LSTM", 5, 2, 4, 6, "bidirectional", lens="lens",
                             activations=["sigmoid", "Tanh", "tanh"] * 2)
    model.graph.initializer.append(numpy_helper.from_array(np.array([5, 5], np.int32), "lens"))
    assert len(recurrences(model)) == 1
    assert_matches_ort(model, feeds, tmp_path)


def test_recurrence_weights_at_run_time_keep_the_generic_path(tmp_path) -> None:
    model, feeds = rnn_model("GRU", 4, 1, 3, 5)
    r = next(x for x in model.graph.initializer if x.name == "R")
    feeds["R"] = numpy_helper.to_array(r)
    model.graph.initializer.remove(r)
    model.graph.input.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, [1, 15, 5]))
    assert recurrences(model) == []
    assert_matches_ort(model, feeds, tmp_path)


@pytest.mark.parametrize("cell,lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1), ("RNN", 0)])
def test_numpy_reference_folds_constant_inputs_like_onnxruntime(cell, lbr) -> None:
    """With X and the states constants, import folds the node through the operator's numpy
    reference (the same one constant folding uses)."""
    model, feeds = rnn_model(cell, 5, 2, 4, 21, "bidirectional", lbr=lbr, seed=9)
    expected = ort_outputs(model, feeds)
    for name, value in feeds.items():
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    del model.graph.input[:]
    # a bundle needs one run-time input: an unrelated one
    model.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1]))
    model.graph.node.append(helper.make_node("Neg", ["z"], ["nz"]))
    model.graph.output.append(helper.make_tensor_value_info("nz", TensorProto.FLOAT, None))
    mod, _ = import_onnx(model)
    folded = dict(zip(mod.main.output_names, mod.main.outputs))
    for name, want in expected.items():
        assert isinstance(folded[name], Constant), name
        np.testing.assert_allclose(folded[name].data, want, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("cell,lbr", [("lstm", False), ("gru", False), ("gru", True),
                                      ("rnn", False)])
@pytest.mark.parametrize("hidden", [1, 16, 21, 40])
def test_packing_round_trips(cell, lbr, hidden) -> None:
    r = np.random.default_rng(1).standard_normal((2, GATES[cell.upper()] * hidden, hidden))
    packed = pack_recurrent(r.astype(np.float32), cell, lbr)
    assert packed.shape == (2, GATES[cell.upper()] * -(-hidden // 16) * 16 * hidden)
    np.testing.assert_array_equal(unpack_recurrent(packed, cell, hidden, lbr), r.astype(np.float32))


@pytest.mark.parametrize("registers", [16, 32])
def test_register_tiles_fit(registers) -> None:
    for nvec in (1, 2, 3, 4, 6, 8, 12, 16):
        for batch in (1, 2, 3, 5, 8):
            vecs, rows = register_tile(nvec, batch, registers)
            assert nvec % vecs == 0 and 1 <= rows <= batch
            assert vecs * rows + (vecs if rows > 1 else 0) + 1 <= registers
    assert register_tile(8, 1, 16) == (8, 1)   # AVX2 LSTM at batch 1: a block row in registers


def test_x86_64_v2_bundle_runs_here(tmp_path) -> None:
    for cell, lbr in [("LSTM", 0), ("GRU", 0)]:
        model, feeds = rnn_model(cell, 6, 3, 5, 20, "bidirectional", lbr=lbr, seed=4)
        assert_matches_ort(model, feeds, tmp_path, target="x86-64-v2", name=f"{cell}.mlc")


@pytest.mark.parametrize("target", ["x86-64-v4", "aarch64"])
def test_cross_compiles(target) -> None:
    for cell, lbr in [("LSTM", 0), ("GRU", 0), ("GRU", 1), ("RNN", 0)]:
        model, _ = rnn_model(cell, 6, 3, 5, 20, "bidirectional", lbr=lbr)
        optimized, compiled, _ = compile_module(import_onnx(model)[0], target=target)
        assert any(f.startswith("recurrence") for f in optimized.prim_funcs())
        assert undefined_symbols(compiled.object_code) <= set(ALLOWED_EXTERNALS)


def test_aarch64_bundles_match_onnxruntime_under_qemu(tmp_path) -> None:
    from arm64_root import arm64_root_or_fail, run_bundles
    from conftest import ROOT
    from mlcpack.runtime import elf

    if elf._real_arch() != "x86_64":
        pytest.skip("compares an emulated aarch64 run on an x86-64 host")
    root = arm64_root_or_fail()
    bundles, expected = {}, {}
    for cell, lbr, batch in [("LSTM", 0, 1), ("GRU", 0, 3), ("GRU", 1, 2), ("RNN", 0, 2)]:
        model, feeds = rnn_model(cell, 7, batch, 5, 20, "bidirectional", lbr=lbr, seed=8)
        mod, info = import_onnx(model)
        path = tmp_path / f"{cell}{lbr}.mlc"
        export_module(mod, path, ExportOptions(target="aarch64"))
        name = f"{cell}{lbr}"
        bundles[name] = (path, {info.input_names[k]: v for k, v in feeds.items()})
        expected[name] = ort_outputs(model, feeds)
    report, got = run_bundles(root, tmp_path, ROOT, bundles, threads={"LSTM0": 2})
    assert report["machine"] == "aarch64"
    for name, outs in expected.items():
        for out, want in outs.items():
            np.testing.assert_allclose(got[name][out], want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name} {out}")


def test_recurrence_kernel_reports_its_multiply_adds() -> None:
    """The profiler's GFLOP/s for the recurrence: T * B * D * G * H * H multiply-adds."""
    model, _ = rnn_model("GRU", 7, 2, 5, 12, "bidirectional", lbr=1)
    optimized, _, _ = compile_module(import_onnx(model)[0])
    (func,) = [f for n, f in optimized.prim_funcs().items() if n.startswith("recurrence")]
    assert func.attrs["macs"] == 7 * 2 * 2 * 3 * 12 * 12


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_zero_sequence_lens_rows_end_in_zero_states_like_onnxruntime(cell, tmp_path) -> None:
    """A batch row whose sequence_lens is 0 runs no step: Y is zeros and, as ONNX Runtime has
    it, so are its final states (not the initial state); rows of length 1..T beside it."""
    model, feeds = rnn_model(cell, 4, 4, 3, 5, "bidirectional", lens="lens", seed=3)
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [4]))
    mod, info = import_onnx(model)
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host"))
    with load(tmp_path / "m.mlc") as bundle:
        for lens in ([0, 4, 1, 0], [0, 0, 0, 0], [4, 2, 3, 1]):
            feeds["lens"] = np.array(lens, np.int32)
            got = bundle.run({info.input_names[k]: v for k, v in feeds.items()})
            for name, ref in ort_outputs(model, feeds).items():
                np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL,
                                           err_msg=f"{cell} {name} lens={lens}")
                if name != "Y":
                    assert not np.any(got[name][:, np.array(lens) == 0]), (name, lens)
                    assert np.all(np.any(got[name][:, np.array(lens) > 0], axis=-1)), name
