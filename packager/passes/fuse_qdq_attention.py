"""Attention pieces of QDQ models on 8-bit data: the softmax between a DequantizeLinear and a
QuantizeLinear (ONNX Runtime's quantizer writes it around every attention softmax and a
recognizer's class softmax),

    quantize(nn.softmax(dequantize(a, s, z), axis=last), ys, yz, dtype)
        -> qsoftmax(a, s, ys, yz, dtype)                 (ops/qelementwise.py)

a an 8-bit tensor of static shape, every scale and zero point a per-tensor constant (float32
scales), the softmax over the last axis and read by the quantize alone (the dequantize may
have other readers: it stays for them). The kernel reads bytes and writes bytes (no float
tensor, no dequantize or quantize pass over memory); its result is within one quantization
step of the float composition (exp of (a - max) * s instead of (a - z) * s - max, 1 / sum).
"""

from __future__ import annotations


import numpy as np

from ..ir.graph import Call, Constant, Function, IRModule
from ..options import CompileOptions
from .common import map_functions, rebind_calls
from .fuse_qdq_common import I8, calls_and_uses, const_of, quantize_of_dequantized
from .simplify import eliminate_dead_code


def fuse_quantized_attention(mod: IRModule, options: CompileOptions) -> IRModule:
    """The rewrite of the module doc, with the integer kernels (``options.int8_kernels``)."""
    if not options.int8_kernels:
        return mod
    return eliminate_dead_code(map_functions(mod, _fuse_in_function))


def _scalar(v, dtype=None):
    a = const_of(v)
    if a is None or a.size != 1 or (dtype is not None and a.dtype != dtype):
        return None
    return a.reshape(())


def _fuse_in_function(fn: Function) -> Function:
    defs, uses = calls_and_uses(fn)

    plans: dict[int, Call] = {}
    for b in fn.bindings():
        q = b.value
        matched = quantize_of_dequantized(q, defs, uses, ("nn.softmax",))
        if matched is None:
            continue
        sm, dq = matched
        a = dq.args[0]
        shape = tuple(a.type.shape)
        if (a.type.dtype not in I8 or not shape or any(not isinstance(d, int) for d in shape)
                or sm.attrs.get("axis", -1) % len(shape) != len(shape) - 1):
            continue
        s, ys, yz = _scalar(dq.args[1], np.float32), _scalar(q.args[1], np.float32), \
            _scalar(q.args[2])
        if s is None or ys is None or yz is None or _scalar(dq.args[2]) is None \
                or not (s > 0 and ys > 0):
            continue
        plans[id(b.var)] = Call("qsoftmax", [a, Constant("x_scale", s.astype(np.float32)),
                                             Constant("y_scale", ys.astype(np.float32)),
                                             Constant("y_zp", np.asarray(float(yz), np.float32))],
                                {"dtype": q.attrs["dtype"]}, q.type)
    return rebind_calls(fn, plans)
