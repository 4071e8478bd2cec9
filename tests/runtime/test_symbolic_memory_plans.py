"""Memory plans of symbolic bundles (issue 12 items 4 and 5).

``--max-shape`` on every size variable: the export plans one arena for the bound (every buffer at
its largest size within it), the runtime allocates it once and never plans again; without a
bound on every size, a plan per shape at run time (cached). ``--batch-sizes`` over a symbolic
batch: static plans for those batches beside the symbolic plan, picked on an exact match.
Small hand-made ONNX models, every output against ONNX Runtime.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bundle_parts import read_parts, write_parts
from cli_in_process import run_cli_in_process
from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.passes.memory_plan import box_max, interval, non_decreasing
from mlcpack.runtime.errors import BundleError, InputError
from mlcpack.runtime.model import load

ort = pytest.importorskip("onnxruntime")
BAD_INPUT = 7


def conv_model(batch: str | int = "n", h: str | int = "h", w: str | int = "w") -> onnx.ModelProto:
    """Conv (padded, its workspace size not monotone in the sizes) -> ReLU -> MaxPool -> 1x1
    Conv -> Softmax over channels; x is (batch, 3, h, w)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3)
                                     .astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B"),
             numpy_helper.from_array((rng.standard_normal((5, 8, 1, 1)) * 0.3)
                                     .astype(np.float32), "W2")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "W2"], ["q"]),
             helper.make_node("Softmax", ["q"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def mlp_model() -> onnx.ModelProto:
    """x (N, 12) -> Gemm -> Relu -> Gemm: a symbolic batch only."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((12, 16)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W2")]
    nodes = [helper.make_node("Gemm", ["x", "W1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2"], ["y"])]
    g = helper.make_graph(nodes, "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def _export(model: onnx.ModelProto, path: Path, max_shapes: dict | None = None):
    mod, _ = import_onnx(model, max_shapes=max_shapes)
    return export_module(mod, path, ExportOptions(target="host"))


@pytest.fixture(scope="module")
def conv_bundles(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("symplans")
    out = {"bound": folder / "bound.mlc", "open": folder / "open.mlc"}
    report = _export(conv_model(), out["bound"], {"x": (2, 3, 40, 48)})
    assert report.bound_bytes and "memory planned at export for h <= 40, n <= 2, w <= 48" \
        in report.plan_note
    report = _export(conv_model(), out["open"])
    assert report.bound_bytes is None and report.plan_note is None
    return out


SHAPES = [(1, 3, 8, 8), (2, 3, 40, 48), (1, 3, 17, 33), (2, 3, 5, 2), (1, 3, 40, 2),
          (1, 3, 8, 8)]


def test_bounded_bundle_plans_once_and_runs_every_shape(conv_bundles) -> None:
    """One arena of the bound's size, allocated once; no plan made at run time for any shape;
    every shape within the bound right against ONNX Runtime."""
    rng = np.random.default_rng(2)
    model_proto = conv_model()
    with load(conv_bundles["bound"]) as model, load(conv_bundles["open"]) as open_:
        runner = model._main.runner
        assert runner.bound == {"h": 40, "n": 2, "w": 48}
        assert runner.arena_bytes == model.schema.symbolic.bound.arena_bytes > 0
        arenas = set()
        for shape in SHAPES:
            x = rng.standard_normal(shape).astype(np.float32)
            want = _ort(model_proto, {"x": x})
            _close(model.run({"x": x})["y"], want)
            _close(open_.run({"x": x})["y"], want)
            arenas.add(runner._bound.arena.ctypes.data)
        assert len(arenas) == 1 and runner._bound.arena.nbytes == runner.arena_bytes
        assert runner.plans_made == 0
        # per shape: 5 shapes, the first dropped from the 4-plan cache by the fifth and made again
        assert open_._main.runner.plans_made == 6
        # the bound holds the per-shape plan of the largest shape
        top = open_._main.runner.plan({"n": 2, "h": 40, "w": 48})
        assert top.arena_bytes <= runner.arena_bytes


def test_bounded_profile_runs_the_shape_it_is_given(conv_bundles) -> None:
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 11)).astype(np.float32)
    with load(conv_bundles["bound"]) as model:
        model.run({"x": np.zeros((2, 3, 40, 48), np.float32)})
        prof = model.profile({"x": x}, runs=2)
        assert "h=9" in prof.model and "w=11" in prof.model
        _close(model.run({"x": x})["y"], _ort(conv_model(), {"x": x}))


def test_beyond_the_bound_is_one_line(conv_bundles, tmp_path, one_line_error) -> None:
    with load(conv_bundles["bound"]) as model:
        with pytest.raises(InputError, match="beyond the bundle's bound 48"):
            model.run({"x": np.zeros((1, 3, 8, 49), np.float32)})
        y = model.run({"x": np.ones((1, 3, 8, 48), np.float32)})["y"]   # still runs
        _close(y, _ort(conv_model(), {"x": np.ones((1, 3, 8, 48), np.float32)}))
    big = tmp_path / "big.npy"
    np.save(big, np.zeros((1, 3, 41, 8), np.float32))
    proc = run_cli_in_process("infer", conv_bundles["bound"], big)
    assert proc.returncode == BAD_INPUT
    assert "beyond the bundle's bound 40" in one_line_error(proc)


def test_inspect_shows_the_bound_or_the_formulas(conv_bundles, run_cli) -> None:
    text = run_cli("inspect", conv_bundles["bound"]).stdout
    with load(conv_bundles["bound"]) as model:
        arena = model._main.runner.arena_bytes
    assert f"memory plan: one arena of {arena} B" in text
    assert "planned at export for the bound h <= 40, n <= 2, w <= 48 (--max-shape)" in text
    text = run_cli("inspect", conv_bundles["open"]).stdout
    assert "memory plan: made at run time for each input shape (size variables h, n, w" in text
    assert "the last 4 shapes' plans cached" in text
    formulas = next(line for line in text.splitlines() if "buffer sizes in bytes" in line)
    assert "12 * h * n * w" in formulas   # the input: 3 channels of float32
    info = json.loads(run_cli("inspect", "--json", conv_bundles["bound"]).stdout)
    assert info["symbolic"]["bound"]["sizes"] == {"h": 40, "n": 2, "w": 48}
    assert info["symbolic"]["bound"]["arena_bytes"] == arena


def test_a_bound_on_some_sizes_only_plans_per_shape(tmp_path) -> None:
    """With a size no --max-shape reaches (two inputs, one bounded), memory is planned per
    shape, as without bounds; the bounded input is still checked."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=0),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "two",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    report = _export(proto, tmp_path / "two.mlc", {"a": (6, 4)})
    assert report.bound_bytes is None
    assert "size variable(s) m have no --max-shape bound" in report.plan_note
    with load(tmp_path / "two.mlc") as model:
        for n, m in ((1, 3), (6, 9), (2, 2)):
            a = rng.standard_normal((n, 4)).astype(np.float32)
            b = rng.standard_normal((m, 4)).astype(np.float32)
            _close(model.run({"a": a, "b": b})["y"], _ort(proto, {"a": a, "b": b}))
        assert model._main.runner.arena_bytes is None and model._main.runner.plans_made == 3
        with pytest.raises(InputError, match="bound 6"):
            model.run({"a": np.zeros((7, 4), np.float32), "b": b})


def test_bound_record_is_validated_and_optional(conv_bundles, tmp_path) -> None:
    """The symbolic record's ``bound`` is checked at load (one line); a bundle without it (what
    an older exporter wrote) plans per shape and gives the same answers."""
    from mlcpack.runtime.bundle import BundleReader
    from mlcpack.runtime.header import Header

    with BundleReader(conv_bundles["bound"]) as reader:   # the typed schema round-trips it
        typed = Header.from_msgpack(reader.header, reader.data_size)
        assert typed.symbolic.bound.sizes == {"h": 40, "n": 2, "w": 48}
        assert typed.to_msgpack() == reader.header
    header, payloads = read_parts(conv_bundles["bound"])
    x = np.random.default_rng(5).standard_normal((2, 3, 13, 20)).astype(np.float32)
    plain = copy.deepcopy(header)
    del plain["symbolic"]["bound"]
    with load(write_parts(tmp_path / "plain.mlc", plain, payloads)) as model:
        assert model._main.runner.bound is None
        _close(model.run({"x": x})["y"], _ort(conv_model(), {"x": x}))
        assert model._main.runner.plans_made == 1
    bad = {"offsets": lambda b: b["offsets"].pop(),
           "sizes": lambda b: b["sizes"].pop("h"),
           "arena": lambda b: b.update(arena_bytes=64)}
    for name, edit in bad.items():
        h = copy.deepcopy(header)
        edit(h["symbolic"]["bound"])
        with pytest.raises(BundleError) as info:
            load(write_parts(tmp_path / f"{name}.mlc", h, payloads)).close()
        assert "\n" not in str(info.value) and "bound" in str(info.value)


def test_size_records_monotone_or_bounded_over_the_box() -> None:
    ones = {"h": 1, "w": 1}
    bounds = {"h": 40, "w": 48}
    assert non_decreasing(["+", ["*", 4, "h", "w"], -64], ones)
    assert non_decreasing(["*", 4, ["//", ["+", "w", 3], 4]], ones)
    assert not non_decreasing(["%", "w", 4], ones)
    assert not non_decreasing(["*", -4, "w"], ones)
    # a workspace-like size with a subtracted term: the largest value over the box, exactly
    rec = ["+", ["*", 64, "h", "w"], ["*", -64, ["//", ["*", 13, "h", "w"], 16]], 640]
    exact = max(64 * h * w - 64 * (13 * h * w // 16) + 640 for h in range(1, 41)
                for w in range(1, 49))
    assert box_max(rec, bounds) == exact <= interval(rec, bounds)[1]
    assert box_max(["%", "w", 7], bounds) == 6


# ---- --batch-sizes over a symbolic batch --------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_specialized(tmp_path_factory, run_cli) -> Path:
    folder = tmp_path_factory.mktemp("spec")
    onnx.save(mlp_model(), folder / "mlp.onnx")
    out = folder / "mlp.mlc"
    proc = run_cli("export", folder / "mlp.onnx", "-o", out, "--batch-sizes", "1,4",
                   "--target", "host")
    assert proc.returncode == 0, proc.stderr
    assert "plan batch 4:" in proc.stdout and "golden check passed" in proc.stdout
    return out


def test_batch_sizes_pick_the_specialized_plan_on_an_exact_match(mlp_specialized) -> None:
    rng = np.random.default_rng(6)
    proto = mlp_model()
    with load(mlp_specialized) as model:
        assert model.specialized_batches == (1, 4) and model.batch.sizes == (1, 4)
        assert model.inputs[0].dims == ("N", 12)
        runner = model._main.runner
        for n in (1, 4, 4, 1):
            x = rng.standard_normal((n, 12)).astype(np.float32)
            _close(model.run({"x": x})["y"], _ort(proto, {"x": x}))
            assert model.last_plan == f"batch {n}"
        assert len(runner._plans) == 0   # the symbolic plan was never needed
        for n in (2, 5, 33):
            x = rng.standard_normal((n, 12)).astype(np.float32)
            _close(model.run({"x": x})["y"], _ort(proto, {"x": x}))
            assert model.last_plan == "symbolic"
        assert len(runner._plans) == 3
        assert model.profile({"x": np.ones((4, 12), np.float32)}, runs=1).batch == 4
        with pytest.raises(InputError, match="dtype float64"):
            model.run({"x": np.ones((4, 12))})


def test_batch_sizes_inspect_lists_the_specialized_plans(mlp_specialized, run_cli) -> None:
    text = run_cli("inspect", mlp_specialized).stdout
    assert "specialized plans: batch 1, 4 (static, run when the inputs' shapes match one " \
        "exactly; the symbolic plan runs every other shape)" in text
    assert "  batch     4: x [4, 12]" in text


def test_batch_sizes_with_other_symbolic_dims_is_one_line(tmp_path, one_line_error) -> None:
    onnx.save(conv_model("N"), tmp_path / "conv.onnx")
    out = tmp_path / "conv.mlc"
    proc = run_cli_in_process("export", tmp_path / "conv.onnx", "-o", out, "--batch-sizes",
                              "1,4")
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert "--batch-sizes makes static plans per batch size" in line
    assert "input x is (?,3,?,?): fix them with --input-shape x=N,3,64,64" in line
    assert not out.exists()
    # the other dims fixed: the specialized plans come beside the symbolic one
    proc = run_cli_in_process("export", tmp_path / "conv.onnx", "-o", out, "--input-shape",
                              "x=N,3,12,10", "--batch-sizes", "1,2", "--target", "host")
    assert proc.returncode == 0, proc.stderr
    x = np.random.default_rng(7).standard_normal((3, 3, 12, 10)).astype(np.float32)
    with load(out) as model:
        for n in (1, 2, 3):
            _close(model.run({"x": x[:n]})["y"], _ort(conv_model("N"), {"x": x[:n]}))
            assert model.last_plan == ("symbolic" if n == 3 else f"batch {n}")


def test_batch_sizes_with_a_max_shape(tmp_path, run_cli) -> None:
    """--batch-sizes beside --max-shape: the exact batches run their static plans, every other
    batch up to the bound runs the bounded symbolic plan (one arena, no plan made at run time),
    a batch past the bound is refused; every answer right against ONNX Runtime. Batches 400
    and 512 (19 and 24 KB) are read in place, the others copied (INPLACE_MIN_BYTES)."""
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    out = tmp_path / "mlp.mlc"
    proc = run_cli("export", tmp_path / "mlp.onnx", "-o", out, "--batch-sizes", "1,4",
                   "--max-shape", "x=512,12", "--target", "host")
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(8)
    proto = mlp_model()
    with load(out) as model:
        runner = model._main.runner
        assert model.specialized_batches == (1, 4) and runner.bound == {"N": 512}
        arenas = set()
        for n in (1, 400, 4, 3, 512, 400, 1, 77):
            x = rng.standard_normal((n, 12)).astype(np.float32)
            _close(model.run({"x": x})["y"], _ort(proto, {"x": x}))
            assert model.last_plan == (f"batch {n}" if n in (1, 4) else "symbolic")
            if model.last_plan == "symbolic":
                arenas.add(runner._bound.arena.ctypes.data)
                (binding,) = runner._bound.bindings
                assert binding.current == (x.ctypes.data if n >= 400 else binding.arena), n
        assert runner.plans_made == 0 and len(arenas) == 1
        with pytest.raises(InputError, match="beyond the bundle's bound 512"):
            model.run({"x": np.ones((513, 12), np.float32)})
