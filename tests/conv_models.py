"""A one-Conv ONNX model with the conv kernel's fused epilogues (bias, an optional SiLU or
HardSigmoid, an optional residual Add), same-padded (``k // 2`` each side); shared by
tests/kernels/test_conv_partial_panel_tail.py and tests/kernels/test_conv_reduction_in_channel_chunks.py."""

from __future__ import annotations

import numpy as np


def conv_out_size(h: int, k: int, s: int) -> int:
    """Output extent of a same-padded (``k // 2``) window ``k``, stride ``s``, over ``h``."""
    return (h + 2 * (k // 2) - k) // s + 1


def conv_model(n, c, h, w, o, k, s, act=None, residual=False, name="conv"):
    """x (n, c, h, w) -> Conv (o outputs, k x k window, stride s, bias; weights and bias from
    ``default_rng(0)``) -> ``act`` (None, "silu": x * sigmoid(x), "hsig": HardSigmoid(1/6,
    1/2)) -> + r (an input of the output's shape) when ``residual``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    p = k // 2
    oh, ow = conv_out_size(h, k, s), conv_out_size(w, k, s)
    inits = [numpy_helper.from_array(
                 (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y0"], kernel_shape=[k, k],
                              strides=[s, s], pads=[p] * 4)]
    y = "y0"
    if act == "silu":
        nodes += [helper.make_node("Sigmoid", [y], ["sg"]),
                  helper.make_node("Mul", [y, "sg"], ["y1"])]
        y = "y1"
    elif act == "hsig":
        nodes.append(helper.make_node("HardSigmoid", [y], ["y1"], alpha=1 / 6, beta=0.5))
        y = "y1"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, o, oh, ow]))
        nodes.append(helper.make_node("Add", [y, "r"], ["y2"]))
        y = "y2"
    graph = helper.make_graph(nodes, name, inputs,
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT,
                                                             [n, o, oh, ow])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_feeds(n, c, h, w, o, k, s, residual=False, seed=1):
    """Inputs for ``conv_model``: x (n, c, h, w) and, when ``residual``, r of the output's
    shape, standard normal from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal(
            (n, o, conv_out_size(h, k, s), conv_out_size(w, k, s))).astype(np.float32)
    return feeds


def assert_matches_onnxruntime(tmp_path, model, feeds, threads, runs=1):
    """Export ``model`` (``--target host``), run it on ``threads`` threads ``runs`` times (a
    parallel kernel's task regions, run after run) and compare each first output with ONNX
    Runtime's (rtol = atol = 1e-4)."""
    import onnx
    import onnxruntime as ort

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host"))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with load(tmp_path / "m.mlc", threads=threads) as m:
        for _ in range(runs):
            got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def avx512_host() -> bool:
    """This host runs x86-64-v4 code (AVX-512 F, BW, DQ, VL)."""
    from mlcpack.runtime.cpu import host_arch, host_features

    return host_arch() == "x86_64" and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= \
        host_features()


def export_model(tmp_path, model, target="x86-64-v4"):
    """(ONNX path, bundle path) of ``model`` saved and exported for ``target`` in ``tmp_path``."""
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target=target))
    return path, tmp_path / "m.mlc"
