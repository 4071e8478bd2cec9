"""Window functions (HannWindow, HammingWindow, BlackmanWindow, opset 17), Det and ai.onnx.ml's
Binarizer.

A window's size is a graph input in every model that uses one (the ONNX tests, STFT front
ends): a size variable bound from its value at run start (``valueinputs``: a ``dims`` row), so
the default export takes it and the window is computed at run time for the size fed. A size
known at export folds to a constant.
"""

from __future__ import annotations

import math

import numpy as np

from ...packager.ir.graph import Constant, Value
from ...packager.ir.sym import SymExpr
from .common import onnx_dtype
from .registry import NodeContext, converter
from .valueinputs import read_as

# a0 - a1 cos(2 pi n / D) + a2 cos(4 pi n / D), as ONNX defines each window
_WINDOWS = {"HannWindow": (0.5, 0.5, 0.0), "HammingWindow": (25 / 46, 21 / 46, 0.0),
            "BlackmanWindow": (0.42, 0.5, 0.08)}


def _window(ctx: NodeContext) -> Value:
    from .symvalue import SymValue, materialize

    a0, a1, a2 = _WINDOWS[ctx.node.op_type]
    dtype = str(onnx_dtype(ctx, ctx.attrs["output_datatype"]))
    if dtype not in ("float32", "float64"):
        raise ctx.error(f"output_datatype {dtype} is not supported (float32 or float64)")
    read_as(ctx, 0, "dims")
    size = ctx.dims(0, "size")[0]
    periodic = bool(ctx.attrs["periodic"])
    if not isinstance(size, SymExpr):   # known at export
        n = np.arange(int(size), dtype=np.float64)
        d = int(size) if periodic else int(size) - 1
        w = a0 - a1 * np.cos(2 * math.pi * n / d) + a2 * np.cos(4 * math.pi * n / d)
        return ctx.constant(w.astype(dtype), "window")
    n = ctx.emit("cast", ctx.bb.emit_op("arange", start=0, delta=1, length=size, dtype="int64"),
                 dtype=dtype)
    d = materialize(ctx.bb, SymValue(ctx.bb.fresh_name("window_span"),
                                     np.array([size if periodic else size - 1], dtype=object),
                                     "int64"))
    phase = ctx.emit("divide", ctx.emit("multiply", n, ctx.constant(
        np.array([2 * math.pi], dtype), "two_pi")), ctx.emit("cast", d, dtype=dtype))

    def term(c: float, k: float) -> Value:
        angle = phase if k == 1 else ctx.emit("multiply", phase, ctx.constant(
            np.array([k], dtype), "k"))
        return ctx.emit("multiply", ctx.emit("cos", angle), ctx.constant(np.array([c], dtype), "c"))

    w = ctx.emit("subtract", ctx.constant(np.array([a0], dtype), "a0"), term(a1, 1))
    return ctx.emit("add", w, term(a2, 2)) if a2 else w


for _name in _WINDOWS:
    converter(_name, since=17, attrs={"output_datatype": 1, "periodic": 1})(_window)


@converter("Binarizer", since=1, domain="ai.onnx.ml", attrs={"threshold": 0.0})
def _binarizer(ctx: NodeContext) -> Value:
    """1 where ``x > threshold``, else 0, in ``x``'s dtype."""
    x = ctx.input(0)
    if not x.type.dtype.startswith("float") and x.type.dtype not in ("int32", "int64"):
        raise ctx.error(f"inputs of dtype {x.type.dtype} are not supported")
    threshold = np.array([ctx.attrs["threshold"]], dtype=x.type.dtype)
    if isinstance(x, Constant):
        return ctx.constant((x.data > threshold[0]).astype(x.type.dtype), "binarized")
    above = ctx.emit("greater", x, ctx.constant(threshold, "threshold"))
    return ctx.emit("cast", above, dtype=x.type.dtype)


@converter("Det", since=11)
def _det(ctx: NodeContext) -> Value:
    """Determinants of ``[..., n, n]`` matrices, n at most 4, by the Leibniz formula over the
    matrix's elements (n! products of n elements each, per batch entry)."""
    from itertools import permutations

    x = ctx.input(0)
    shape = tuple(x.type.shape)
    if len(shape) < 2 or not isinstance(shape[-1], int) or shape[-1] != shape[-2]:
        raise ctx.error(f"input of shape {shape} is not a batch of square matrices")
    n, rank = shape[-1], len(shape)
    if n > 4:
        raise ctx.error(f"{n}x{n} determinants are not supported (at most 4x4)")
    if not x.type.dtype.startswith("float"):
        raise ctx.error(f"inputs of dtype {x.type.dtype} are not supported")
    batch = shape[:-2]
    at = [[ctx.reshape(ctx.emit("strided_slice", x, starts=(i, j), ends=(i + 1, j + 1),
                                axes=(rank - 2, rank - 1), steps=(1, 1)), batch)
           for j in range(n)] for i in range(n)]
    total = None
    for perm in permutations(range(n)):
        term = at[0][perm[0]]
        for i in range(1, n):
            term = ctx.emit("multiply", term, at[i][perm[i]])
        odd = sum(perm[i] > perm[j] for i in range(n) for j in range(i + 1, n)) % 2
        if total is None:
            total = ctx.emit("negative", term) if odd else term
        else:
            total = ctx.emit("subtract" if odd else "add", total, term)
    return total
