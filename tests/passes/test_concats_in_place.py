"""A channel Concat at batch 1 is made in place in a static plan (passes/concat_views.py): the
kernels that produce its parts write them into the concat's buffer at their offsets and the
concat kernel disappears; a part that cannot be written there (a graph input, a constant, a
slice view, a model output, a value another concat or an earlier part already holds) is copied
in; slices that cover a value in its order (a C2f block's Split halves) lie where that
value is written. Two to four parts, a nested concat, a concat read by a kernel before the outer one is
complete, a concat that took an epilogue (stays a kernel), an output concat (stays a kernel).
ONNX Runtime is the oracle; the C runtime gives the Python runtime's bytes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mlcpack.packager.api import Options, export
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.header import Header


def _model(batch) -> onnx.ModelProto:
    rng = np.random.default_rng(35)

    def weight(name, o, c):
        return numpy_helper.from_array(rng.standard_normal((o, c, 1, 1)).astype(np.float32), name)

    inits = [weight("wa", 4, 8), weight("wb", 4, 8), weight("wd", 4, 8), weight("we", 4, 24),
             weight("wf", 4, 20), weight("wy", 4, 20), weight("wg", 4, 8),
             weight("wr", 8, 8), weight("wq", 4, 4), weight("wz", 4, 12),
             numpy_helper.from_array(rng.standard_normal((batch if batch != "N" else 1, 4, 6, 6))
                                     .astype(np.float32), "cst")]
    inits += [numpy_helper.from_array(np.array([v], np.int64), n)
              for v, n in ((0, "s0"), (4, "s1"), (1, "ax"))]
    inits.append(numpy_helper.from_array(np.array([4, 4], np.int64), "halves"))
    conv = lambda x, w, y: helper.make_node("Conv", [x, w], [y])  # noqa: E731
    nodes = [
        conv("x", "wa", "a"), conv("x", "wb", "b"),
        helper.make_node("Sigmoid", ["x"], ["c"]),
        helper.make_node("Concat", ["a", "b"], ["k1"], axis=1),             # 2 parts, b an output
        conv("k1", "wd", "d"),                                               # reads k1 early
        helper.make_node("Slice", ["c", "s0", "s1", "ax"], ["s"]),           # a slice view of c
        helper.make_node("Concat", ["x", "a", "c", "d"], ["k2"], axis=1),    # 4: input, a again
        conv("k2", "we", "e"),
        helper.make_node("Concat", ["k1", "s", "e", "e"], ["k3"], axis=1),   # nested, e twice
        conv("k3", "wf", "f"),
        helper.make_node("Concat", ["f", "cst"], ["k4"], axis=1),            # a constant part
        conv("k4", "wg", "g"),
        conv("k3", "wy", "y1"),
        helper.make_node("Concat", ["b", "e"], ["k5"], axis=1),              # takes an epilogue
        helper.make_node("Sigmoid", ["k5"], ["h"]),
        helper.make_node("Concat", ["d", "e"], ["o"], axis=1),               # an output
        conv("x", "wr", "r"),                                                # C2f: r's halves,
        helper.make_node("Split", ["r", "halves"], ["p", "q"], axis=1),      # views, lie in k6
        conv("q", "wq", "m"),
        helper.make_node("Concat", ["p", "q", "m"], ["k6"], axis=1),
        conv("k6", "wz", "z"),
    ]
    shape = lambda c: [batch, c, 6, 6]  # noqa: E731
    outs = [("b", 4), ("y1", 4), ("g", 4), ("h", 8), ("o", 8), ("z", 4)]
    graph = helper.make_graph(
        nodes, "concats", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape(8))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape(c)) for n, c in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _plans(path) -> list:
    with BundleReader(path) as reader:
        h = Header.from_msgpack(reader.header, reader.data_size, reader.name)
    return list(h.plans) + list(h.specialized or ())


def _concat_kernels(plan) -> list[str]:
    return sorted(k.name for k in plan.kernels
                  if any(s.get("op") == "Concat" for s in (k.source or ())))


def _check(path, onnx_path, batches) -> None:
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            for n in batches:
                x = rng.standard_normal((n, 8, 6, 6)).astype(np.float32)
                got = m.run({"x": x})
                names = [o.name for o in session.get_outputs()]
                for name, ref in zip(names, session.run(None, {"x": x})):
                    np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4,
                                               err_msg=f"{name} at batch {n}")


def test_channel_concats_at_batch_1_are_made_in_place(tmp_path) -> None:
    onnx.save(_model(1), tmp_path / "m.onnx")
    export(tmp_path / "m.onnx", tmp_path / "m.mlc", Options(cache=False, check=False))
    (plan,) = _plans(tmp_path / "m.mlc")
    # k1..k4 in place; k5 took the Sigmoid, o is an output: their kernels stay
    kernels = _concat_kernels(plan)
    assert len(kernels) == 2 and kernels[1].startswith("fused_concat"), kernels
    # the copies: b (an output) into k1; x, a into k2; s, the second e into k3; cst into k4
    with load(tmp_path / "m.mlc") as m:
        steps = [t.step for t in m.profile({"x": np.ones((1, 8, 6, 6), np.float32)},
                                           runs=1).instructions]
    assert [s.kind for s in steps].count("copy") == 6, [s.name for s in steps]
    _check(tmp_path / "m.mlc", tmp_path / "m.onnx", [1, 1])


def _open_batch_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.standard_normal((o, c, 1, 1)).astype(np.float32), n)
             for n, o, c in (("wa", 4, 8), ("wb", 4, 8), ("wy", 4, 12))]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"]),
             helper.make_node("Conv", ["x", "wb"], ["b"]),
             helper.make_node("Concat", ["a", "b", "a"], ["k"], axis=1),
             helper.make_node("Conv", ["k", "wy"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_open_batch_in_place_in_the_batch_1_plan_a_kernel_elsewhere(tmp_path) -> None:
    onnx.save(_open_batch_model(), tmp_path / "m.onnx")
    export(tmp_path / "m.onnx", tmp_path / "m.mlc", Options(cache=False, check=False))
    plans = _plans(tmp_path / "m.mlc")
    static = [p for p in plans if p.symbolic is None]
    symbolic = [p for p in plans if p.symbolic is not None]
    assert static and symbolic
    assert all(_concat_kernels(p) == [] for p in static)
    assert all(_concat_kernels(p) for p in symbolic)
    _check(tmp_path / "m.mlc", tmp_path / "m.onnx", [1, 3, 1])


def test_parts_made_long_before_their_concat_are_copied(monkeypatch) -> None:
    """The flags the pass gives each part (pipeline only, no code): as the export above; with
    no span allowed, only parts made right before their concat are written in place."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.target import resolve_targets
    from mlcpack.packager.ir.graph import Call
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes import concat_views
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    assert DEFAULT_PIPELINE[-1].name == "concats_in_place"
    mod, _ = import_onnx(_model(1))
    mod = run_pipeline(mod, DEFAULT_PIPELINE[:-1],
                       options=CompileOptions().for_targets(resolve_targets("x86-64-v3")))

    def flags() -> list:
        return [b.value.attrs["hosted"] for b in
                concat_views.concats_in_place(mod).functions["main"].bindings()
                if isinstance(b.value, Call) and b.value.op == "concat_in_place"]

    # k1 (b an output), k2 (x an input, a in k1, c, d), k3 (k1, s a view of c, e, e again),
    # k4 (f, a constant), k6 (r's halves p, q in place, m)
    assert flags() == [(True, False), (False, False, True, True), (True, False, True, False),
                       (True, False), (True, True, True)]
    monkeypatch.setattr(concat_views, "PART_SPAN_BYTES", 0)
    # k1's a came before b (an output, copied): k1 stays a kernel; k2's c before d; k3's k1
    # (now a kernel) before d, c and e; k6's r before the m convolution
    assert flags() == [(False, False, False, True), (False, False, True, False), (True, False),
                       (False, False, True)]
