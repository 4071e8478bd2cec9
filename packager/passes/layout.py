"""Layout of constant weights for the fast kernels: a ``matmul(a, W, transpose_b=True)`` whose W
is a constant (ONNX Gemm with transB, i.e. every torch Linear) gets W transposed once at export,
so the kernel reads contiguous rows of the output's width. One row times a 2-D W (a Linear at
batch 1) keeps W as (N, K): the dot-product kernel (codegen/gemv.py) reads its rows."""

from __future__ import annotations

import contextvars

import numpy as np

from ..ir.graph import Call, Constant, IRModule
from .common import map_functions, rewrite_function


def pretranspose_weights(mod: IRModule) -> IRModule:
    def visit(b, lookup):
        v = b.value
        if (isinstance(v, Call) and v.op == "matmul" and v.attrs.get("transpose_b")
                and isinstance(v.args[1], Constant) and v.args[1].data.ndim >= 2
                and not _one_row(v)):
            w = v.args[1]
            data = np.ascontiguousarray(np.swapaxes(w.data, -1, -2))
            attrs = {**v.attrs, "transpose_b": False}
            return Call(v.op, [v.args[0], Constant(f"{w.name}_t", data)], attrs, v.type)
        return None

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))


# False while a bundle with several batch plans compiles: every plan then reads the same
# transposed W, so the weights stay stored once (a batch-1 plan alone takes the dot product).
ONE_ROW_GEMV = contextvars.ContextVar("one_row_gemv", default=True)


def _one_row(v: Call) -> bool:
    """matmul(x, W) with x one row (every dim but the last a static 1) and W 2-D."""
    shape = getattr(v.args[0].type, "shape", None)
    return (ONE_ROW_GEMV.get() and shape is not None and len(shape) >= 1 and v.args[1].data.ndim == 2
            and all(isinstance(d, int) and d == 1 for d in shape[:-1]))
