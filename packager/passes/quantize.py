"""Fuse quantized matrix products (QDQ compositions, see ``frontends/onnx/quant.py``) into
integer kernels (``ops/qlinear.py``'s ``qmatmul``: int32 accumulation, fused requantization).

Matched (each intermediate read only by the next step; scales and zero points constants):
    q = quantize(matmul(dequantize(x, xs, xzp), dequantize(W, ws, wzp)[, transpose_b])
                 [+ dequantize(B int32, bs, 0)], ys, yzp, dtype=int8|uint8)
with x int8/uint8 (any rank >= 2, per-tensor), W an int8/uint8 2-D constant (per tensor or per
output column), B an int32 constant with bs == xs * ws (float32: the scale ONNX Runtime's
quantizer writes; otherwise the add stays float). This is what QLinearMatMul, com.microsoft
QGemm and QDQ MatMul/Gemm import as, and what ONNX Runtime runs as QLinearMatMul/QGemm, so
the result is ONNX Runtime's bit for bit (same int32 sums, same float32 requantization).

Everything else stays a float composition (``fold_dequantize`` then folds the weights).
Not done yet: convolutions, ReLU/Clip between the product and the quantize, dynamic
quantization (float output), packed VNNI/AVX2 kernels (``qmatmul`` legalizes to a loop nest).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir.graph import (Binding, Call, Constant, Function, IRModule, TensorType, Value, Var,
                        used_values)
from .common import map_functions, rewrite_function
from .simplify import eliminate_dead_code

_I8 = ("int8", "uint8")


def fuse_quantized(mod: IRModule) -> IRModule:
    # the float products replaced are dropped here, so nothing legalizes them
    return eliminate_dead_code(map_functions(mod, _fuse_in_function))


def _const(v: Value) -> np.ndarray | None:
    return v.data if isinstance(v, Constant) else None


def _fuse_in_function(fn: Function) -> Function:
    defs: dict[int, Call] = {}
    uses: Counter = Counter()
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
        for a in used_values(b.value):
            uses[id(a)] += 1
    for o in fn.outputs:
        uses[id(o)] += 1

    def call(v: Value, op: str, single: bool = True) -> Call | None:
        c = defs.get(id(v))
        if c is not None and c.op == op and (not single or uses[id(v)] == 1):
            return c
        return None

    def match(q: Call):
        if q.op != "quantize" or q.attrs.get("dtype") not in _I8 or len(q.args) != 3:
            return None
        ys, yzp = _const(q.args[1]), _const(q.args[2])
        if ys is None or yzp is None or ys.size != 1 or yzp.size != 1 or ys.dtype != np.float32:
            return None
        inner, bias_dq = q.args[0], None
        add = call(inner, "add")
        if add is not None:
            for mm_v, b_v in (add.args, add.args[::-1]):
                if call(mm_v, "matmul") is not None and call(b_v, "dequantize", False):
                    inner, bias_dq = mm_v, call(b_v, "dequantize", False)
                    break
            else:
                return None
        mm = call(inner, "matmul")
        if mm is None:
            return None
        dx = call(mm.args[0], "dequantize", False)
        dw = call(mm.args[1], "dequantize", False)
        if dx is None or dw is None:
            return None
        x = dx.args[0]
        xs, xzp = _const(dx.args[1]), _const(dx.args[2])
        w, ws, wzp = (_const(a) for a in dw.args)
        if (x.type.dtype not in _I8 or xs is None or xzp is None or xs.size != 1 or xzp.size != 1
                or xs.dtype != np.float32 or w is None or ws is None or wzp is None
                or w.dtype.name not in _I8 or w.ndim != 2 or ws.dtype != np.float32
                or len(x.type.shape) < 2):
            return None
        transpose_b = bool(mm.attrs.get("transpose_b", False))
        if set(mm.attrs) - {"transpose_b"}:
            return None
        k, n = (w.shape[1], w.shape[0]) if transpose_b else w.shape
        try:   # per-tensor or per-output-column scale / zero point, as [N]
            ws_n = np.broadcast_to(ws.T if transpose_b else ws, (1, n)).reshape(n)
            wzp_n = np.broadcast_to(wzp.T if transpose_b else wzp, (1, n)).reshape(n)
        except ValueError:
            return None
        if ws.ndim == 2 and ws.shape[0 if not transpose_b else 1] != 1:
            return None
        wk = w.T if transpose_b else w
        bias = np.zeros(n, np.int32)
        sx = np.float32(xs.reshape(()))
        if bias_dq is not None:
            bq, bs, bzp = (_const(a) for a in bias_dq.args)
            if bq is None or bs is None or bzp is None or bq.dtype != np.int32 or np.any(bzp != 0):
                return None
            try:
                bq_n = np.broadcast_to(bq.reshape(-1) if bq.size == n else bq, (n,))
                bs_n = np.broadcast_to(bs.reshape(-1) if bs.size == n else bs, (n,))
            except ValueError:
                return None
            if not np.array_equal(bs_n.astype(np.float32), (sx * ws_n).astype(np.float32)):
                return None
            bias = bq_n.astype(np.int32)
        multiplier = ((sx * ws_n.astype(np.float32)) / np.float32(ys.reshape(()))).astype(np.float32)
        dtype = q.attrs["dtype"]
        out = TensorType(tuple(x.type.shape[:-1]) + (n,), dtype)
        if out != q.type:
            return None
        args = [x, Constant(f"{getattr(x, 'name', 'x')}_qw", np.ascontiguousarray(wk)),
                Constant("x_zp", np.asarray(int(xzp.reshape(())), np.int32)),
                Constant("w_zp", wzp_n.astype(np.int32).copy()),
                Constant("bias_i32", bias.copy()),
                Constant("requant_scale", multiplier),
                Constant("y_zp", np.asarray(float(yzp.reshape(())), np.float32))]
        return args, dtype, out

    def visit(b, lookup):
        v = b.value
        if not isinstance(v, Call) or v.op != "quantize":
            return None
        m = match(v)
        if m is None:
            return None
        args, dtype, out = m
        return Call("qmatmul", [lookup(args[0])] + args[1:], {"dtype": dtype}, out)

    out = rewrite_function(fn, visit)
    for block in out.blocks:   # exact in float32: the fp32 GEMM with a fused epilogue
        new = []
        for b in block.bindings:
            v = b.value
            if isinstance(v, Call) and v.op == "qmatmul" and _exact_in_float32(v):
                new.extend(_float_chain(b))
            else:
                new.append(b)
        block.bindings[:] = new
    return out


# Sums of integer products are exact in float32 while every partial sum stays below 2**24.
_F32_EXACT = float(2 ** 24)


def _exact_in_float32(c: Call) -> bool:
    x, w, x_zp, w_zp, bias = c.args[0], *(a.data for a in c.args[1:5])
    info = np.iinfo(x.type.dtype)
    x_dev = max(int(x_zp) - info.min, info.max - int(x_zp))
    col = np.abs(w.astype(np.int64) - w_zp.astype(np.int64)).sum(axis=0) * x_dev
    return bool((col + np.abs(bias.astype(np.int64))).max() < _F32_EXACT)


def _float_chain(b: Binding) -> list[Binding]:
    """``qmatmul`` as dequantize(x, 1, x_zp) @ float32(w - w_zp) + bias, times the multiplier,
    quantize(., 1, y_zp): every sum an integer below 2**24, so float32 accumulation in any
    order gives the int32 result exactly, and the requantization is ORT's operation for
    operation (float32(acc) * multiplier, round half to even, + zero point, saturate)."""
    c = b.value
    x, w, x_zp, w_zp, bias, mult, y_zp = c.args
    k, n = w.data.shape
    f32 = "float32"
    one = Constant("one", np.asarray(1.0, np.float32))
    x_t = x.type
    steps = [("dequantize", [x, one, Constant("x_zp", x_zp.data.astype(x_t.dtype))], {},
              TensorType(x_t.shape, f32))]
    mm_t = TensorType(tuple(x_t.shape[:-1]) + (n,), f32)
    wf = (w.data.astype(np.int32) - w_zp.data.astype(np.int32)).astype(np.float32)
    steps.append(("matmul", [None, Constant("qw_f32", wf)], {}, mm_t))
    if np.any(bias.data):
        steps.append(("add", [None, Constant("bias_f32", bias.data.astype(np.float32))], {}, mm_t))
    steps.append(("multiply", [None, mult], {}, mm_t))
    steps.append(("quantize", [None, one, Constant("y_zp", y_zp.data.astype(c.attrs["dtype"]))],
                  {"dtype": c.attrs["dtype"]}, c.type))
    out, prev = [], None
    for i, (op, args, attrs, t) in enumerate(steps):
        args = [prev if a is None else a for a in args]
        var = b.var if i == len(steps) - 1 else Var(f"{b.var.name}_q{i}", t)
        out.append(Binding(var, Call(op, args, attrs, t), b.source))
        prev = var
    return out
