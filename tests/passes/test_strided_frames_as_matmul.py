"""A Conv1d over a run-time length whose stride divides its window and has many phases (an STFT:
silero VAD's 258 x 256 taps at stride 128) runs as frames, one matmul with the channels on the
vector lanes and an overlap sum (passes/strided_frames.py): which convolutions the pass takes,
and the bundle against ONNX Runtime at lengths and batches that change the frame count.

One bundle holds two such convolutions (one export for the module)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.passes import DEFAULT_PIPELINE
from mlcpack.packager.passes.strided_frames import strided_frames_as_matmul
from mlcpack.runtime import load

from helpers import ort_outputs

F = TensorProto.FLOAT
# input: (channels, out channels, window, stride); "x" is silero's 16 kHz STFT, "z" has two
# input channels and a window of three hops
CONVS = {"x": (1, 258, 256, 128), "z": (2, 24, 96, 32)}


def _model(length: int | str = "L", convs=CONVS) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], []
    for name, (c, o, k, s) in convs.items():
        nodes.append(helper.make_node("Conv", [name, f"{name}_w"], [f"{name}_y"], strides=[s]))
        inputs.append(helper.make_tensor_value_info(name, F, ["N", c, length]))
        outputs.append(helper.make_tensor_value_info(f"{name}_y", F, None))
        inits.append(numpy_helper.from_array(rng.standard_normal((o, c, k)).astype(np.float32),
                                             f"{name}_w"))
    graph = helper.make_graph(nodes, "frames", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ops_after_pass(model: onnx.ModelProto) -> list[str]:
    from mlcpack.packager.passes import run_pipeline
    from mlcpack.packager.options import CompileOptions

    mod, _ = import_onnx(model)
    names = [p.name for p in DEFAULT_PIPELINE]
    upto = DEFAULT_PIPELINE[:names.index("strided_frames_as_matmul") + 1]
    mod = run_pipeline(mod, upto, options=CompileOptions())
    return [b.value.op for b in mod.main.bindings() if hasattr(b.value, "op")]


def test_the_pass_takes_run_time_lengths_with_a_dividing_stride_only() -> None:
    ops = _ops_after_pass(_model())
    assert ops.count("nn.frames") == 2 and "nn.conv2d" not in ops and ops.count("matmul") == 2 and ops.count("nn.frame_sum") == 2
    # a fixed length keeps its kernels (fixed-shape bundles stay as they were)
    assert "nn.frames" not in _ops_after_pass(_model(length=640))
    # a stride that does not divide the window, or few phases: the convolution kernel
    assert "nn.frames" not in _ops_after_pass(_model(convs={"x": (1, 16, 100, 32)}))
    assert "nn.frames" not in _ops_after_pass(_model(convs={"x": (1, 16, 32, 16)}))


def test_pass_returns_the_module_itself_when_nothing_matches() -> None:
    mod, _ = import_onnx(_model(length=640))
    assert strided_frames_as_matmul(mod) is mod


@pytest.fixture(scope="module")
def framed(tmp_path_factory):
    from mlcpack.packager.api import Options, export

    folder = tmp_path_factory.mktemp("frames")
    src, bundle = folder / "frames.onnx", folder / "frames.mlc"
    onnx.save(_model(), src)
    result = export(src, bundle, Options(target="host"))
    assert result.check.startswith("golden check passed"), result.check
    return src, bundle


@pytest.mark.parametrize("n, length", [(1, 256), (1, 576), (4, 640), (3, 1000)])
def test_matches_onnx_runtime(framed, n, length) -> None:
    src, bundle = framed
    rng = np.random.default_rng(length)
    feeds = {name: rng.standard_normal((n, c, length)).astype(np.float32)
             for name, (c, *_) in CONVS.items()}
    want = ort_outputs(src, feeds)
    with load(bundle) as model:
        got = model.run(feeds)
    for name, ref in want.items():
        assert got[name].shape == ref.shape, name
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=2e-4, err_msg=name)
