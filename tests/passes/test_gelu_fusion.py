"""GELU written out (x * (erf(x / sqrt(2)) + 1) * 0.5, torch's and BERT's forms) becomes one
``gelu`` call (packager/passes/gelu.py), which a matmul's epilogue does not take (fuse.py's
EPILOGUE_EXCLUDED_MATH); anything that is not exactly the pattern is left alone. Numbers
against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from mlcpack.packager.cli import app
from mlcpack.runtime import load
from typer.testing import CliRunner

RNG = np.random.default_rng(3)
W = (RNG.standard_normal((24, 40)) / 5).astype(np.float32)


def graph(form: str, sqrt2: float = 1.4142135381698608, extra_reader: bool = False):
    """x @ W, then GELU in ``form``: "torch" (x*(erf+1))*0.5 or "bert" (x*0.5)*(erf+1)."""
    c = lambda name, v: numpy_helper.from_array(np.float32(v), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Div", ["h", "s2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"])]
    if form == "torch":
        nodes += [helper.make_node("Mul", ["h", "a"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["half", "h"], ["m"]),
                  helper.make_node("Mul", ["a", "m"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 40])]
    if extra_reader:   # erf's output read twice: not the pattern
        nodes.append(helper.make_node("Neg", ["e"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [6, 40]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [6, 24])], outputs,
                          [numpy_helper.from_array(W, "W"), c("s2", sqrt2), c("one", 1.0),
                           c("half", 0.5)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form,sqrt2,extra,fused", [
    ("torch", 1.4142135381698608, False, True),
    ("bert", 1.4142135381698608, False, True),
    ("torch", 1.5, False, False),                 # another constant: not a GELU
    ("torch", 1.4142135381698608, True, False),   # an intermediate read elsewhere
])
def test_gelu_pattern(form, sqrt2, extra, fused, tmp_path) -> None:
    import onnx

    model = graph(form, sqrt2, extra)
    src, dst = tmp_path / "g.onnx", tmp_path / "g.mlc"
    onnx.save(model, src)
    result = CliRunner().invoke(app, ["export", str(src), "-o", str(dst), "--target", "host"])
    assert result.exit_code == 0, result.output
    x = RNG.standard_normal((6, 24)).astype(np.float32) * 3
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with load(dst) as m:
        names = [k["name"] for k in m.header["kernels"]]
        got = m.run({"x": x})
    assert any(n == "gelu" or n.endswith("_gelu") for n in names) == fused, names
    if fused:   # the matmul keeps no erf in its epilogue
        assert not any("matmul" in n and "gelu" in n for n in names), names
    for w, g in zip(want, got.values()):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
