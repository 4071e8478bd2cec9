"""Symbolic shapes (issue 12, phase 1): one bundle runs every batch and sequence length.

An MLP with a symbolic batch and a small transformer encoder (embedding, self-attention,
layer norms, GELU MLP) with symbolic batch and sequence length, built with onnx.helper and
seeded, each exported once without --input-shape and run at many sizes against ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import onnx_mlp
from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.printer import module_text
from mlcpack.packager.ir.sym import SymbolicShapeError, size_var
from mlcpack.runtime.errors import InputError
from mlcpack.runtime.model import load

ort = pytest.importorskip("onnxruntime")


def _const(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(a, name)


def mlp_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((784, 64)).astype(np.float32) * 0.05
    b1 = rng.standard_normal(64).astype(np.float32)
    w2 = rng.standard_normal((10, 64)).astype(np.float32) * 0.1
    b2 = rng.standard_normal(10).astype(np.float32)
    return onnx_mlp(w1, b1, w2, b2, "batch")


def encoder_model(vocab: int = 50, d: int = 32, heads: int = 4, max_len: int = 128
                  ) -> onnx.ModelProto:
    """One BERT-style encoder layer: token + position embeddings, LayerNorm, multi-head
    self-attention (Reshape with 0 and -1, Transpose, batched MatMul, Softmax), residuals, a
    GELU (Erf) MLP. Inputs: ids (batch, seq) int64 and positions (batch, seq) int64."""
    rng = np.random.default_rng(1)
    hd = d // heads
    f = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    inits = [_const("tok", f(vocab, d)), _const("pos_emb", f(max_len, d)),
             _const("g0", 1 + f(d)), _const("be0", f(d)),
             _const("Wq", f(d, d)), _const("Wk", f(d, d)), _const("Wv", f(d, d)),
             _const("Wo", f(d, d)), _const("bo", f(d)),
             _const("g1", 1 + f(d)), _const("be1", f(d)),
             _const("W1", f(d, 4 * d)), _const("c1", f(4 * d)),
             _const("W2", f(4 * d, d)), _const("c2", f(d)),
             _const("split", np.array([0, 0, heads, hd], np.int64)),
             _const("merge", np.array([0, 0, d], np.int64)),
             _const("scale", np.array(1 / np.sqrt(hd), np.float32)),
             _const("sqrt2", np.array(np.sqrt(2), np.float32)),
             _const("one", np.array(1, np.float32)), _const("half", np.array(0.5, np.float32))]
    n = helper.make_node
    nodes = [
        n("Gather", ["tok", "ids"], ["te"]), n("Gather", ["pos_emb", "positions"], ["pe"]),
        n("Add", ["te", "pe"], ["e"]),
        n("LayerNormalization", ["e", "g0", "be0"], ["x0"], axis=-1, epsilon=1e-5),
        n("MatMul", ["x0", "Wq"], ["q"]), n("MatMul", ["x0", "Wk"], ["k"]),
        n("MatMul", ["x0", "Wv"], ["v"]),
        n("Reshape", ["q", "split"], ["q4"]), n("Reshape", ["k", "split"], ["k4"]),
        n("Reshape", ["v", "split"], ["v4"]),
        n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qh", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s1"]),
        n("Softmax", ["s1"], ["a"], axis=-1), n("MatMul", ["a", "vh"], ["ctx"]),
        n("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]), n("Reshape", ["ct", "merge"], ["cm"]),
        n("MatMul", ["cm", "Wo"], ["o0"]), n("Add", ["o0", "bo"], ["o1"]),
        n("Add", ["o1", "x0"], ["r1"]),
        n("LayerNormalization", ["r1", "g1", "be1"], ["x1"], axis=-1, epsilon=1e-5),
        n("MatMul", ["x1", "W1"], ["m0"]), n("Add", ["m0", "c1"], ["m1"]),
        n("Div", ["m1", "sqrt2"], ["m2"]), n("Erf", ["m2"], ["m3"]), n("Add", ["m3", "one"], ["m4"]),
        n("Mul", ["m1", "m4"], ["m5"]), n("Mul", ["m5", "half"], ["m6"]),
        n("MatMul", ["m6", "W2"], ["m7"]), n("Add", ["m7", "c2"], ["m8"]),
        n("Add", ["m8", "x1"], ["out"]),
    ]
    g = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _export(model: onnx.ModelProto, tmp_path: Path, name: str,
            shapes: dict | None = None) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    mod, _ = import_onnx(str(path), input_shapes=shapes)
    out = tmp_path / f"{name}.mlc"
    export_module(mod, out, ExportOptions())
    return out


def test_symbolic_dims_in_the_ir() -> None:
    n, s = size_var("n"), size_var("s")
    assert (n * s * 768) // 768 == n * s and (n * s * 768) // (n * s) == 768
    assert n * s == s * n and hash(n * s) == hash(s * n) and n != 1
    assert n >= 1 and n * 4 > 3
    with pytest.raises(SymbolicShapeError):
        int(n)
    with pytest.raises(SymbolicShapeError):
        _ = n > 1
    assert str(n * 784 + 3) == "n * 784 + 3"
    # canonical floor division: the sizes a chain of strided convs computes compare equal
    h = size_var("h")
    assert (h - 1) // 2 + 1 == (h + 1) // 2 and str((h + 1) // 2) == "(h + 1) // 2"
    assert ((h + 1) // 2 - 1) // 2 + 1 == (h + 3) // 4 and (h * 3 + 1) // 2 == h + (h + 1) // 2
    assert h % 4 == h - h // 4 * 4 and ((h + 1) // 2) >= 1
    from mlcpack.packager.ir.sym import relation_text
    assert relation_text("eq", h // 4 * 4, h) == "h must be a multiple of 4"
    assert relation_text("le", 1, (h + 3) // 8) == "h must be at least 5"
    assert relation_text("eq", h, s) == "h == s must hold"


def test_mlp_symbolic_batch_1_to_64(tmp_path: Path) -> None:
    model = mlp_model()
    mod, _ = import_onnx(model)
    assert 'x: Tensor((batch, 784), "float32")' in module_text(mod)
    bundle = _export(model, tmp_path, "mlp")
    sess = ort.InferenceSession(model.SerializeToString())
    with load(bundle) as m:
        assert m.header["format"] == [1, 3] and m.header["min_reader"] == [1, 3]
        for batch in (1, 2, 3, 8, 17, 64, 5, 1):
            x = np.random.default_rng(batch).standard_normal((batch, 784)).astype(np.float32)
            got = m(x)
            want = sess.run(None, {"x": x})[0]
            assert got.shape == (batch, 10)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        with pytest.raises(InputError, match=r"size 0 at axis 0"):
            m(np.zeros((0, 784), np.float32))
        with pytest.raises(InputError, match=r"takes \(batch, 784\)"):
            m(np.zeros((3, 785), np.float32))


def test_input_shape_name_keeps_a_dim_symbolic(tmp_path: Path) -> None:
    model = mlp_model()
    mod, _ = import_onnx(model, {"x": ("N", 784)})
    assert 'Tensor((N, 784), "float32")' in module_text(mod)
    mod, _ = import_onnx(model, {"x": (4, 784)})
    assert 'Tensor((4, 784), "float32")' in module_text(mod)


@pytest.mark.parametrize("batch,seq", [(1, 1), (2, 5), (1, 16), (3, 33), (2, 128)])
def test_encoder_symbolic_batch_and_sequence(tmp_path: Path, batch: int, seq: int) -> None:
    model = encoder_model()
    bundle = _export(model, tmp_path, "enc")
    sess = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(seq)
    ids = rng.integers(0, 50, (batch, seq)).astype(np.int64)
    pos = np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)).copy()
    with load(bundle) as m:
        got = m.run({"ids": ids, "positions": pos})["out"]
        want = sess.run(None, {"ids": ids, "positions": pos})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
        with pytest.raises(InputError, match=r"must agree"):
            m.run({"ids": ids, "positions": np.zeros((batch, seq + 1), np.int64)})


def conv_model() -> onnx.ModelProto:
    w = np.random.default_rng(2).standard_normal((8, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_const("W", w)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_conv_with_symbolic_batch_runs_every_batch(tmp_path: Path) -> None:
    # phase 1 refused it; codegen/contraction/conv_symbolic.py takes the batch at run time
    import onnxruntime as ort
    model = conv_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(_export(model, tmp_path, "conv")) as m:
        for n in (1, 3):
            x = np.random.default_rng(n).standard_normal((n, 3, 16, 16)).astype(np.float32)
            np.testing.assert_allclose(m.run({"x": x})["y"], session.run(None, {"x": x})[0],
                                       rtol=1e-4, atol=1e-4)


def test_cli_named_dim_and_inspect(tmp_path: Path, run_cli) -> None:
    onnx.save(mlp_model(), tmp_path / "m.onnx")
    proc = run_cli("export", tmp_path / "m.onnx", "-o", tmp_path / "m.mlc",
                   "--input-shape", "x=N,784")
    assert proc.returncode == 0, proc.stderr
    assert "memory planned at run time" in proc.stdout
    proc = run_cli("inspect", tmp_path / "m.mlc")
    assert "bundle format 1.3" in proc.stdout and "size variables N" in proc.stdout
    with load(tmp_path / "m.mlc") as m:
        for n in (1, 9):
            assert m(np.ones((n, 784), np.float32)).shape == (n, 10)


def test_plans_are_cached_per_shape(tmp_path: Path) -> None:
    from mlcpack.runtime import symbolic
    bundle = _export(mlp_model(), tmp_path, "mlp")
    with load(bundle) as m:
        runner = m._main.runner
        for n in (1, 2, 3, 4, 5, 6, 1):
            m(np.ones((n, 784), np.float32))
        assert len(runner._plans) == symbolic.PLAN_CACHE
        assert list(runner._plans)[-1] == (1,)


def test_older_reader_refuses_symbolic_bundle(tmp_path: Path, monkeypatch) -> None:
    from mlcpack.runtime import bundle as bundle_format
    from mlcpack.runtime.errors import FormatVersionError
    bundle = _export(mlp_model(), tmp_path, "mlp")
    monkeypatch.setattr(bundle_format, "SYMBOLIC_MINOR", 2)   # a 1.2 reader
    with pytest.raises(FormatVersionError, match=r"needs a runtime that reads \[1, 3\]"):
        load(bundle)


def test_symbolic_bundles_split_over_threads(tmp_path: Path) -> None:
    model = encoder_model()
    bundle = _export(model, tmp_path, "enc")
    sess = ort.InferenceSession(model.SerializeToString())
    with load(_export(mlp_model(), tmp_path, "mlp"), threads=2) as m:
        assert any(k.get("parallel") for k in m.header["kernels"])
        mlp = ort.InferenceSession(mlp_model().SerializeToString())
        for batch in (1, 5, 64):
            x = np.random.default_rng(batch).standard_normal((batch, 784)).astype(np.float32)
            np.testing.assert_allclose(m(x), mlp.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    with load(bundle, threads=2) as m:
        for batch, seq in ((1, 3), (3, 64)):
            ids = np.random.default_rng(seq).integers(0, 50, (batch, seq)).astype(np.int64)
            pos = np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)).copy()
            got = m.run({"ids": ids, "positions": pos})["out"]
            want = sess.run(None, {"ids": ids, "positions": pos})[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


def test_slice_to_a_large_end_over_a_run_time_size(tmp_path: Path) -> None:
    """tf2onnx writes Slice ends of 1e9 for "to the end" (magika's model does, over its open
    batch): the slice keeps the run-time size (checked at run time to be no larger), instead
    of a dim of 1e9 that made a bundle the runtime refused to load."""
    import onnxruntime as ort

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a"], ["y0"]),
         helper.make_node("Relu", ["y0"], ["y"])], "slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [ints("s", [0, 1]), ints("e", [1_000_000_000, 1_000_000_000]), ints("a", [0, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = import_onnx(model)
    path = tmp_path / "slice.mlc"
    export_module(mod, path, ExportOptions(check=False))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(path) as m:
        assert [str(d) for d in m.outputs[0].dims] == ["n", "5", "5"]
        for n in (1, 3):
            x = np.random.default_rng(n).standard_normal((n, 5, 6)).astype(np.float32)
            np.testing.assert_array_equal(m.run({"x": x})["y"], session.run(None, {"x": x})[0])
