"""Convolutions and pools with run-time spatial sizes (issue 12): one bundle, exported with H
and W (and the batch) symbolic, runs every image size, against ONNX Runtime; the kernels take
the sizes as arguments (``codegen/contraction/conv_symbolic.py``). Also the run-time relations a model
needs (``W must be at least 5``) and shape computations written by exporters."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_in_process import run_cli_in_process
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import export_module
from mlcpack.runtime import InputError, load

RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _cnn() -> onnx.ModelProto:
    """Dense 3x3, depthwise stride 2, 1x1s with a residual, a grouped 5x3 conv with uneven
    strides and padding, dilation, max pool, global average pool."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], group=16, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w3"], ["c3"]),
        helper.make_node("Conv", ["c3", "w4", "b4"], ["c4a"]),
        helper.make_node("Add", ["c4a", "c3"], ["c4"]),
        helper.make_node("Conv", ["c4", "w5"], ["c5"], group=3, strides=[1, 2],
                         pads=[2, 1, 2, 0], dilations=[1, 2]),
        helper.make_node("MaxPool", ["c5"], ["mp"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c5"], ["gap"]),
    ]
    inits = [_w("w1", 16, 8, 3, 3), _w("b1", 16), _w("w2", 16, 1, 3, 3), _w("b2", 16),
             _w("w3", 12, 16, 1, 1), _w("w4", 12, 12, 1, 1), _w("b4", 12),
             _w("w5", 6, 4, 5, 3)]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, "H", "W"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("c4", "mp", "gap")],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    model = _cnn()
    path = tmp_path_factory.mktemp("symconv") / "cnn.mlc"
    mod, _ = import_onnx(model)
    export_module(mod, path)
    return model, path


@pytest.mark.parametrize("shape", [(1, 8, 1, 7), (2, 8, 16, 16), (1, 8, 33, 70), (3, 8, 9, 31)])
def test_cnn_any_size_against_ort(cnn, shape) -> None:
    model, path = cnn
    x = RNG.standard_normal(shape).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})
    with load(path) as m:
        assert [str(d) for d in m.inputs[0].dims] == ["N", "8", "H", "W"]
        got = m.run({"x": x})
    for name, ref in zip(("c4", "mp", "gap"), expected):
        assert got[name].shape == ref.shape, name
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_too_small_is_one_line(cnn) -> None:
    # the 5x3 window with dilation 2 needs W >= 7 (ONNX Runtime fails inside the Conv node)
    _, path = cnn
    with load(path) as m, pytest.raises(InputError, match=r"^W must be at least 7, got W = 6 "
                                        r"\(input 'x' axis 3\)$"):
        m.run({"x": np.zeros((1, 8, 4, 6), np.float32)})
    with load(path) as m, pytest.raises(InputError, match="size 0 at axis 2"):
        m.run({"x": np.zeros((1, 8, 0, 9), np.float32)})


def _scaled() -> onnx.ModelProto:
    """y = conv(x, w) * s, s a second graph input, reshaped to (1, 4, W // 2) by Shape
    arithmetic (Shape -> Gather -> Div -> Unsqueeze -> Concat -> Reshape, as exporters write):
    the conv's (W + 1) // 2 columns fit that for even W only."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], strides=[1, 2]),
        helper.make_node("Mul", ["c", "s"], ["m"]),
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "i3"], ["wd"], axis=0),
        helper.make_node("Div", ["wd", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "ax0"], ["half1"]),
        helper.make_node("Concat", ["lead", "half1"], ["target"], axis=0),
        helper.make_node("Reshape", ["m", "target"], ["y"]),
    ]
    inits = [_w("w", 4, 2, 1, 1),
             numpy_helper.from_array(np.array(3, np.int64), "i3"),
             numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([1, 4], np.int64), "lead")]
    graph = helper.make_graph(
        nodes, "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 1, "W"]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 4, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bind_max_shape_and_shape_arithmetic(tmp_path) -> None:
    model = _scaled()
    s = RNG.standard_normal((1, 4, 1, 1)).astype(np.float32)
    out = tmp_path / "m.mlc"
    mod, _ = import_onnx(model, bind={"s": s}, max_shapes={"x": (1, 2, 1, 64)})
    export_module(mod, out)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(out) as m:
        assert [i.name for i in m.inputs] == ["x"]
        for width in (2, 10, 64):   # the Reshape's last dim is W // 2 at run time
            x = RNG.standard_normal((1, 2, 1, width)).astype(np.float32)
            ref = session.run(None, {"x": x, "s": s})[0]
            got = m.run({"x": x})["y"]
            assert got.shape == ref.shape == (1, 4, width // 2)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError, match=r"size 66 at axis 3, beyond the bundle's bound 64 "
                                             r"\(exported with --max-shape x=1,2,1,64\)"):
            m.run({"x": np.zeros((1, 2, 1, 66), np.float32)})
        with pytest.raises(InputError, match="W must be a multiple of 2, got W = 7"):
            m.run({"x": np.zeros((1, 2, 1, 7), np.float32)})
    from mlcpack.packager.errors import ExportError
    for kwargs, text in (({"bind": {"s": s.astype(np.float64)}}, "the model takes float32"),
                         ({"bind": {"t": s}}, "'t', which is not an input"),
                         ({"max_shapes": {"x": (1, 2, 1, 0)}}, "size 0 at axis 3 is below 1")):
        with pytest.raises(ExportError, match=text):
            import_onnx(model, **kwargs)


def test_softmax_rows_at_run_time(tmp_path) -> None:
    # the vectorized softmax kernel with a run-time row count (a recognizer's class scores)
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "s",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, "T", 37])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "s.mlc")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(tmp_path / "s.mlc") as m:
        for t in (1, 5, 40):
            x = (RNG.standard_normal((1, t, 37)) * 5).astype(np.float32)
            np.testing.assert_allclose(m.run({"x": x})["y"], session.run(None, {"x": x})[0],
                                       rtol=1e-5, atol=1e-7)


def test_bind_and_max_shape_flags(tmp_path, run_cli, one_line_error) -> None:
    model = _scaled()
    onnx.save(model, tmp_path / "m.onnx")
    s = RNG.standard_normal((1, 4, 1, 1)).astype(np.float32)
    np.save(tmp_path / "s.npy", s)
    out = tmp_path / "m.mlc"
    proc = run_cli("export", tmp_path / "m.onnx", "-o", out, "--bind", f"s={tmp_path / 's.npy'}",
                   "--max-shape", "x=1,2,1,64", "--target", "host")
    assert proc.returncode == 0, proc.stderr
    with load(out) as m:
        assert [i.name for i in m.inputs] == ["x"]
        x = RNG.standard_normal((1, 2, 1, 10)).astype(np.float32)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(m.run({"x": x})["y"], session.run(None, {"x": x, "s": s})[0],
                                   rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError, match="beyond the bundle's bound 64"):
            m.run({"x": np.zeros((1, 2, 1, 66), np.float32)})
    np.save(tmp_path / "bad.npy", s.astype(np.float64))
    for args, text in ((["--bind", f"s={tmp_path / 'bad.npy'}"], "the model takes float32"),
                       (["--bind", "s=missing.npy"], "cannot read"),
                       (["--max-shape", "x=1,2,1,0"], "size 0 at axis 3 is below 1")):
        proc = run_cli_in_process("export", tmp_path / "m.onnx", "-o", tmp_path / "bad.mlc",
                                  *args)
        assert text in one_line_error(proc)
    assert not (tmp_path / "bad.mlc").exists()


def test_conv_transpose_2x2_stride_2_at_any_size(tmp_path) -> None:
    # a detector head's upsampling: a 1x1 conv to cout*4 channels placed as 2x2 blocks
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[2, 2],
                              strides=[2, 2])]
    graph = helper.make_graph(
        nodes, "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_w("w", 6, 3, 2, 2), _w("b", 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = import_onnx(model)
    export_module(mod, tmp_path / "ct.mlc")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(tmp_path / "ct.mlc") as m:
        for h, w in ((1, 1), (5, 9), (16, 3)):
            x = RNG.standard_normal((1, 6, h, w)).astype(np.float32)
            np.testing.assert_allclose(m.run({"x": x})["y"], session.run(None, {"x": x})[0],
                                       rtol=1e-5, atol=1e-5)


def test_cli_image_model_with_open_height_and_width(tmp_path, run_cli) -> None:
    # an RGB input with H and W open: no image size to record, the golden check runs at a
    # size that meets the model's relations, inspect shows the dims
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], kernel_shape=[3, 3])],
        "rgb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_w("w", 4, 3, 3, 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "rgb.onnx")
    out = tmp_path / "rgb.mlc"
    proc = run_cli("export", tmp_path / "rgb.onnx", "-o", out, "--target", "host")
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed" in proc.stdout
    proc = run_cli("inspect", out)
    assert "x [1, 3, H, W]" in proc.stdout, proc.stdout
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with load(out) as m:
        for h, w in ((3, 3), (20, 11)):
            x = RNG.standard_normal((1, 3, h, w)).astype(np.float32)
            np.testing.assert_allclose(m.run({"x": x})["y"], session.run(None, {"x": x})[0],
                                       rtol=1e-5, atol=1e-5)


def _wide_cnn() -> onnx.ModelProto:
    """Convolutions big enough to run on two threads: dense 3x3 (stride-phase planes), 3x3
    stride 2 (two phases), depthwise 3x3 stride 2, grouped 3x3, 1x1 (read in place), dilated
    3x3 (im2col columns)."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w3", "b3"], ["c3"], group=64, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c3", "w4"], ["c4"], group=4, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c4", "w5"], ["c5"]),
        helper.make_node("Conv", ["c5", "w6"], ["c6"], dilations=[2, 2], pads=[2, 2, 2, 2]),
    ]
    inits = [_w("w1", 64, 16, 3, 3), _w("b1", 64), _w("w2", 64, 64, 3, 3),
             _w("w3", 64, 1, 3, 3), _w("b3", 64), _w("w4", 64, 16, 3, 3),
             _w("w5", 48, 64, 1, 1), _w("w6", 32, 48, 3, 3)]
    graph = helper.make_graph(
        nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, "H", "W"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("c1", "c6")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_symbolic_convs_on_two_threads(tmp_path) -> None:
    """The symbolic conv kernels split their work over tasks (groups, or panels with the plane
    rows each task reads): the same results on 1 and 2 threads as ONNX Runtime, at sizes with
    one task's worth of work and sizes with many, batch 1 and 3."""
    model = _wide_cnn()
    path = tmp_path / "wide.mlc"
    mod, _ = import_onnx(model)
    export_module(mod, path)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in [(1, 16, 64, 80), (3, 16, 37, 51), (1, 16, 5, 7), (2, 16, 96, 33)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        expected = session.run(None, {"x": x})
        for threads in (1, 2):
            with load(path, threads=threads) as m:
                got = m.run({"x": x})
            for name, ref in zip(("c1", "c6"), expected):
                assert got[name].shape == ref.shape, (name, shape)
                np.testing.assert_allclose(got[name], ref, rtol=1e-4,
                                           atol=1e-4 * np.abs(ref).max(),
                                           err_msg=f"{name} {shape} threads={threads}")


def test_symbolic_model_is_checked_without_onnxruntime(tmp_path, monkeypatch) -> None:
    """``mlcpack export`` of a model with run-time sizes and no onnxruntime: the IR's numpy
    reference runs at the check's size (size variables bound from the check inputs), so the
    bundle is checked instead of the check being skipped."""
    from typer.testing import CliRunner

    from mlcpack.packager.cli import app

    path = tmp_path / "cnn.onnx"
    onnx.save(_cnn(), path)
    monkeypatch.setenv("MLCPACK_NO_ORT", "1")
    out = tmp_path / "cnn.mlc"
    result = CliRunner().invoke(app, ["export", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    check = next(ln for ln in result.output.splitlines() if ln.startswith("golden check"))
    assert check.startswith("golden check passed against the numpy reference of the IR"), check


def test_model_profile_on_a_symbolic_bundle(cnn) -> None:
    """``Model.profile`` times the plan of the feeds' sizes: every VM instruction, once per
    run, named in the profile's title by the sizes."""
    _, path = cnn
    x = RNG.standard_normal((1, 8, 21, 30)).astype(np.float32)
    with load(path) as m:
        prof = m.profile({"x": x}, runs=3)
        assert "H=21" in prof.title and "W=30" in prof.title, prof.title
        assert len(prof.instructions) == m.num_instructions
        assert prof.total_min_us > 0 and all(t.min_us >= 0 for t in prof.instructions)
