"""Small matchers shared by the QDQ fusion passes (``passes/fuse_qdq*.py``): constants,
static shapes, sole readers, and the per-column / per-channel broadcasting of a quantized
weight's scale and zero point."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir.graph import Binding, Call, Constant, Function, Value, used_values

I8 = ("int8", "uint8")


def const_of(v: Value) -> np.ndarray | None:
    return v.data if isinstance(v, Constant) else None


def calls_and_uses(fn: Function) -> tuple[dict[int, Call], Counter]:
    """The call that defines each variable of ``fn`` (by ``id``) and how many bindings or
    function outputs read each value."""
    defs: dict[int, Call] = {}
    uses: Counter = Counter()
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
        for a in used_values(b.value):
            uses[id(a)] += 1
    for o in fn.outputs:
        uses[id(o)] += 1
    return defs, uses


def quantize_of_dequantized(q, defs: dict[int, Call], uses: Counter,
                            ops) -> tuple[Call, Call] | None:
    """``(op, dequantize)`` where ``q`` is an 8-bit ``quantize(op(dequantize(a, s, z)), ...)``
    with ``op`` in ``ops`` read by nothing but ``q``; None otherwise."""
    if not (isinstance(q, Call) and q.op == "quantize" and len(q.args) == 3
            and q.attrs.get("dtype") in I8 and set(q.attrs) <= {"dtype", "axis"}):
        return None
    mid = defs.get(id(q.args[0]))
    if mid is None or mid.op not in ops or uses[id(q.args[0])] != 1:
        return None
    dq = defs.get(id(mid.args[0]))
    if dq is None or dq.op != "dequantize" or len(dq.args) != 3 or set(dq.attrs) - {"axis"}:
        return None
    return mid, dq


def static_shapes(x: Value, q: Call) -> bool:
    return all(isinstance(d, int) for d in tuple(x.type.shape) + tuple(q.type.shape))


def sole_reader(reader_of: dict, uses: Counter, var) -> Binding | None:
    """The one binding that reads ``var`` when nothing else (no graph output) does."""
    rs = reader_of.get(id(var), [])
    return rs[0] if len(rs) == 1 and uses[id(var)] == 1 else None


def matmul_columns(w: np.ndarray, ws: np.ndarray, wzp: np.ndarray, transpose_b: bool):
    """(wk [K, N], scale [N], zero point [N]) of a matmul weight ``w`` ([K, N], or [N, K]
    with ``transpose_b``) whose scale and zero point are per tensor or per output column;
    None when they are per row."""
    wk = w.T if transpose_b else w
    n = wk.shape[1]
    try:
        ws_n = np.broadcast_to(ws.T if transpose_b else ws, (1, n)).reshape(n)
        wzp_n = np.broadcast_to(wzp.T if transpose_b else wzp, (1, n)).reshape(n)
    except ValueError:
        return None
    for a in (ws, wzp):
        if a.ndim == 2 and a.shape[1 if transpose_b else 0] != 1:
            return None
    return wk, ws_n, wzp_n


def conv_channels(ws: np.ndarray, wzp: np.ndarray, o: int):
    """(scale [O], zero point [O]) of a convolution weight with ``o`` output channels, per
    tensor or per output channel; None otherwise."""
    try:
        return (np.broadcast_to(ws, (o, 1, 1, 1)).reshape(o),
                np.broadcast_to(wzp, (o, 1, 1, 1)).reshape(o))
    except ValueError:
        return None
