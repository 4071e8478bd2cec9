"""The register-blocked matmul kernel (packager/codegen/contraction/) on the cases that decide how
it walks B's panels (nr = 16 columns on AVX2): several full panels and a partial last one, row
counts that leave a partial row block, a batch of B matrices and a B broadcast over a batch, a
K too long for a panel to be copied onto the stack, fewer rows than a panel copy pays for, and
a fused bias + residual epilogue; against ONNX Runtime on 1, 2 and 3 threads. (MLP-Mixer's and
ViT's MLP matmuls, [196, 256] x [256, 1024] and [197, 1536] x [1536, 384], are this kernel;
issue 11 measured copying each B panel before its row blocks 1.2-1.4x faster on them.)"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

RNG = np.random.default_rng(11)

# (name, A shape, B shape, B constant, residual add)
CASES = [
    ("panels_and_tail", (40, 96), (96, 72), True, False),        # 4 full panels + 8 columns
    ("row_tail_residual", (29, 64), (64, 48), True, True),       # 29 rows: a 5-row block
    ("one_row_tail", (19, 40), (40, 40), True, False),           # packed panels, a 1-row block
    ("batched_b", (3, 33, 40), (3, 40, 48), False, False),        # B an input, per batch
    ("broadcast_b", (2, 20, 24), (24, 32), True, True),          # one B for two matrices
    ("long_k", (16, 2100), (2100, 32), True, False),             # K * 64 B > 128 KB
    ("few_rows", (8, 64), (64, 48), True, False),                # fewer rows than a panel copy
    ("one_panel", (24, 50), (50, 16), True, False),              # N = one panel: nothing to copy
]


def _model(a_shape, b_shape, b_const: bool, residual: bool):
    n = b_shape[-1]
    out_shape = list(np.broadcast_shapes(a_shape[:-1] + (1,), b_shape[:-2] + (1, 1))[:-1]) + [n]
    b_data = (RNG.standard_normal(b_shape) * 0.2).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    inits = [numpy_helper.from_array(bias, "bias")]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))]
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32)}
    if b_const:
        inits.append(numpy_helper.from_array(b_data, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape)))
        feeds["b"] = b_data
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]),
             helper.make_node("Add", ["mm", "bias"], ["y" if residual else "out"])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, out_shape))
        feeds["r"] = RNG.standard_normal(out_shape).astype(np.float32)
        nodes.append(helper.make_node("Add", ["y", "r"], ["out"]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(
        "out", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, feeds


@pytest.mark.parametrize("name,a_shape,b_shape,b_const,residual", CASES,
                         ids=[c[0] for c in CASES])
def test_matmul_panels_match_onnxruntime(name, a_shape, b_shape, b_const, residual, tmp_path):
    model, feeds = _model(a_shape, b_shape, b_const, residual)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    mod, _ = import_onnx(model)
    path = tmp_path / "m.mlc"
    export_module(mod, path, ExportOptions())
    k = a_shape[-1]
    # float32 sums of k products in another order: a few roundings of the sum's magnitude
    atol = 4e-7 * k * float(np.abs(want).max())
    for threads in (1, 2, 3):
        with load(path, threads=threads) as m:
            got = list(m.run(feeds).values())[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol,
                                   err_msg=f"{name}, {threads} threads")
