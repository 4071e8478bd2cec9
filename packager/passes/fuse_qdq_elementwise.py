"""Quantized elementwise operations into the integer kernels of ``ops/qelementwise.py``: what
ONNX Runtime runs as QLinearAdd, QLinearMul and QLinearGlobalAveragePool, matched in the forms
its quantizer writes (QDQ) and the importer writes for the com.microsoft ops (QOperator):

    quantize(add(dequantize(a, sa, za), dequantize(b, sb, zb)), ys, yzp)
        -> qbinary(a, b, za, zb, sa / ys, sb / ys, yzp, kind="add")
    quantize(multiply(dequantize(a, sa, za), dequantize(b, sb, zb)) [* r], ys, yzp)
        -> qbinary(a, b, za, zb, sa * sb [* r] / ys, -, yzp, kind="mul")
    quantize(mean(dequantize(x, sx, zx), axes=spatial, keepdims), ys, yzp)
        -> qgavgpool(x, zx, sx / (ys * prod(spatial)), yzp)
    quantize(concat(dequantize(q_1, s_1, z_1), ...), ys, yzp)
        -> concat(q_1 or lut8(q_1, quantize(dequantize(v, s_1, z_1), ys, yzp) for v in 0..255), ...)

a, b int8/uint8, every scale and zero point a per-tensor constant (float32 scales), the
result 8-bit; the float intermediates read by the next step alone. b may broadcast to a as
one value, or one value per row of a's leading axes (the squeeze-and-excitation gate
``[N, C, 1, 1]`` times ``[N, C, H, W]``); the operands are swapped when a is the smaller one.
The scale ratios are computed in float32 in MLAS's order. The result is within one
quantization step of the float composition (see ``ops/qelementwise.py``); the concat's is the
float composition's, bit for bit (each element goes through its own quantize(dequantize)).
Static shapes only, except the concat (its ``lut8`` tables and the concat have run-time-size
kernels): an open-size QDQ YOLOv8n's C2f / SPPF concats then read and write bytes, and the
MaxPools before them run on bytes (``fuse_qdq_layout.py``) instead of a float pool fused with
a dequantize in a generic loop nest.

Runs after ``passes/quantize_lut.py``: a product of a value and a function of itself
(HardSwish as x * HardSigmoid(x)) is one table there, cheaper than this kernel.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.graph import (Binding, Call, Constant, Function, IRModule, TensorType, Value, Var,
                        used_values)
from ..ops.qelementwise import row_broadcast
from ..ops.registry import OPS
from ..options import CompileOptions
from .common import map_functions, rewrite_function
from .fuse_qdq_common import I8, const_of
from .simplify import eliminate_dead_code


def fuse_quantized_elementwise(mod: IRModule, options: CompileOptions) -> IRModule:
    """The patterns of the module doc, with the integer kernels (``options.int8_kernels``)."""
    if not options.int8_kernels:
        return mod
    return eliminate_dead_code(map_functions(mod, _fuse_in_function))


def _scalar(v: Value, dtype=None) -> np.ndarray | None:
    a = const_of(v)
    if a is None or a.size != 1 or (dtype is not None and a.dtype != dtype):
        return None
    return a.reshape(())


def _static(v: Value) -> bool:
    return all(isinstance(d, int) for d in v.type.shape)


def _fuse_in_function(fn: Function) -> Function:
    defs: dict[int, Call] = {}
    uses: dict[int, int] = {}
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
        for a in used_values(b.value):
            uses[id(a)] = uses.get(id(a), 0) + 1
    for o in fn.outputs:
        uses[id(o)] = uses.get(id(o), 0) + 1

    def sole(v: Value, op: str) -> Call | None:
        c = defs.get(id(v))
        return c if c is not None and c.op == op and uses.get(id(v)) == 1 else None

    def dequantized(v: Value, sized: bool = False):
        """(q, scale float32, zero point int) when ``v`` = dequantize(q 8-bit, const, const),
        q of static shape unless ``sized``."""
        d = defs.get(id(v))
        if d is None or d.op != "dequantize" or len(d.args) != 3:
            return None
        q, s, zp = d.args[0], _scalar(d.args[1], np.float32), _scalar(d.args[2])
        if q.type.dtype not in I8 or s is None or zp is None or not (sized or _static(q)):
            return None
        return q, np.float32(s), int(zp)

    fused: dict[int, Call] = {}
    concats: dict[int, list[Binding]] = {}
    for b in fn.bindings():
        q = b.value
        if not (isinstance(q, Call) and q.op == "quantize" and q.attrs.get("dtype") in I8
                and len(q.args) == 3):
            continue
        ys, yzp = _scalar(q.args[1], np.float32), _scalar(q.args[2])
        if ys is None or yzp is None:
            continue
        new = None if not _static(b.var) else (_binary(q, ys, yzp, sole, dequantized)
                                               or _global_average(q, ys, yzp, sole, dequantized))
        if new is not None:
            fused[id(b.var)] = new
            continue
        # a concat of bytes with run-time sizes too: lut8 and concat have run-time-size kernels
        steps = _concat(b, ys, yzp, sole, lambda v: dequantized(v, True))
        if steps is not None:
            concats[id(b.var)] = steps
    if not fused and not concats:
        return fn

    def visit(binding, lookup):
        new = fused.get(id(binding.var))
        if new is None:
            return None
        return Call(new.op, [lookup(a) for a in new.args], new.attrs, new.type)

    out = rewrite_function(fn, visit)
    for block in out.blocks:   # a concat: its inputs' tables, then the concat of 8-bit values
        new_bindings = []
        for b in block.bindings:
            new_bindings.extend(concats.get(id(b.var), [b]))
        block.bindings[:] = new_bindings
    return out


def _concat(b: Binding, ys, yzp, sole, dequantized) -> list[Binding] | None:
    """quantize(concat(dq(q_1), ..., dq(q_n)), ys, yzp) (QLinearConcat, QDQ Concat) as the
    concat of the q_i, each requantized to the output's scale and zero point by a ``lut8``
    (quantize(dequantize(v)) for its 256 values, the float composition's own numbers) where its
    own differ: bindings ending in ``b``'s var."""
    q = b.value
    c = sole(q.args[0], "concat")
    if c is None or c.type.dtype != "float32":
        return None
    ops = [dequantized(a) for a in c.args]
    if any(o is None for o in ops):
        return None
    dtype = q.attrs["dtype"]
    out, parts = [], []
    for i, (qi, si, zi) in enumerate(ops):
        if qi.type.dtype == dtype and si == ys and zi == int(yzp):
            parts.append(qi)
            continue
        values = np.arange(256) - (128 if qi.type.dtype == "int8" else 0)
        with np.errstate(all="ignore"):
            f = OPS["dequantize"].reference(values.astype(qi.type.dtype), np.asarray(si),
                                            np.asarray(zi, qi.type.dtype))
            table = OPS["quantize"].reference(f, np.asarray(ys), np.asarray(yzp, dtype),
                                              dtype=dtype)
        v = Var(f"{b.var.name}_in{i}", TensorType(qi.type.shape, dtype))
        out.append(Binding(v, Call("lut8", [qi, Constant(f"{b.var.name}_lut{i}",
                                                           table.reshape(1, 256))],
                                   {"axis": -1}, v.type), b.source))
        parts.append(v)
    out.append(Binding(b.var, Call("concat", parts, dict(c.attrs), q.type), b.source))
    return out


def _binary(q: Call, ys, yzp, sole, dequantized) -> Call | None:
    inner, extra = q.args[0], np.float32(1)
    scaled = sole(inner, "multiply")
    if scaled is not None:          # multiply(multiply(dq(a), dq(b)), r): QLinearMul's import
        for p, r in (scaled.args, scaled.args[::-1]):
            rc = _scalar(r, np.float32)
            if rc is not None and sole(p, "multiply") is not None:
                inner, extra = p, np.float32(rc)
                break
    c = sole(inner, "add") or sole(inner, "multiply")
    if c is None or len(c.args) != 2 or c.type.dtype != "float32" or c.attrs:
        return None
    ops = [dequantized(a) for a in c.args]
    if ops[0] is None or ops[1] is None:
        return None
    (a, sa, za), (bq, sb, zb) = ops
    if math.prod(a.type.shape) < math.prod(bq.type.shape):
        (a, sa, za), (bq, sb, zb) = (bq, sb, zb), (a, sa, za)
    shape = tuple(q.type.shape)
    if tuple(a.type.shape) != shape or tuple(c.type.shape) != shape:
        return None
    if math.prod(bq.type.shape) != 1 and row_broadcast(shape, tuple(bq.type.shape)) is None:
        return None
    f32 = np.float32
    if c.op == "add":
        if extra != 1:
            return None
        kind, ma, mb = "add", f32(sa / ys), f32(sb / ys)
    else:
        kind, ma, mb = "mul", f32(f32(f32(sa * sb) * extra) / ys), f32(0)
    args = [a, bq, Constant("a_zp", np.asarray(za, np.int32)),
            Constant("b_zp", np.asarray(zb, np.int32)), Constant("mult_a", np.asarray(ma, f32)),
            Constant("mult_b", np.asarray(mb, f32)),
            Constant("y_zp", np.asarray(float(yzp), f32))]
    return Call("qbinary", args, {"kind": kind, "dtype": q.attrs["dtype"]}, q.type)


def _global_average(q: Call, ys, yzp, sole, dequantized) -> Call | None:
    m = sole(q.args[0], "mean")
    if (m is None or len(m.args) != 1 or not m.attrs.get("keepdims", True)
            or m.attrs.get("axes") is None):
        return None
    x = dequantized(m.args[0])
    if x is None:
        return None
    xq, sx, zx = x
    rank = len(xq.type.shape)
    axes = sorted(a % rank for a in m.attrs["axes"])
    if rank < 3 or axes != list(range(2, rank)):
        return None
    count = math.prod(xq.type.shape[2:])
    mult = np.float32(np.float32(sx / ys) / np.float32(count))
    args = [xq, Constant("x_zp", np.asarray(zx, np.int32)),
            Constant("requant_scale", np.asarray(mult, np.float32)),
            Constant("y_zp", np.asarray(float(yzp), np.float32))]
    return Call("qgavgpool", args, {"dtype": q.attrs["dtype"]}, q.type)
