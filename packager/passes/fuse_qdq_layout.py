"""Layout operations on 8-bit data: what ONNX Runtime's QDQ quantizer writes around every
Reshape, Transpose, Flatten, Squeeze and Slice (it gives the layout op's output the input's
scale and zero point),

    quantize(L(dequantize(a, s, z)), s, z, dtype)  ->  L(a)

with ``L`` a reshape, transpose or strided slice, ``a`` an 8-bit tensor of ``dtype``, and the
quantize's scale and zero point the dequantize's (equal constants). Exact: a layout op moves
elements without changing them, and quantize(dequantize(v, s, z), s, z) == v for every 8-bit
v (``(v - z) * s / s`` rounds back to ``v - z``: the product's relative error is 2**-24, far
below the half step rounding needs). ONNX Runtime drops the same pairs (its QDQ
"drop Q/DQ around layout ops" transform).

MaxPool (``nn.max_pool2d``, which the quantizer also brackets with the input's scale and zero
point: ResNet's stem pool) is taken the same way when the scale is positive: dequantize and
quantize are then non-decreasing, so the maximum commutes with them, and the padding (-inf in
float) is the 8-bit type's least value on the integers (ops/pool.py; a window of padding alone
gives the least value both ways). The pool then runs on the bytes (codegen/pool.py: 4x the
lanes of the float kernel), as ONNX Runtime runs it; mlcpack ran a dequantize, the float pool
and a quantize (0.27 ms of ResNet-18's 24 on an AVX2 host).

The float intermediate ``L(dequantize(a))`` must be read by the quantize alone; the dequantize
may have other readers (it stays for them). A chain of such steps (Reshape, Q/DQ, Flatten,
Q/DQ, ...) becomes a chain of layout ops on the 8-bit tensor: a reshape is a view, a transpose
or slice moves a quarter of the bytes the float one did, and no quantize or dequantize pass
over memory is left.
"""

from __future__ import annotations


import numpy as np

from ..ir.graph import Call, Function, IRModule, TensorType
from ..options import CompileOptions
from .common import map_functions, rewrite_function
from .fuse_qdq_common import calls_and_uses, const_of, quantize_of_dequantized
from .simplify import eliminate_dead_code

LAYOUT_OPS = ("reshape", "transpose", "strided_slice", "nn.max_pool2d")


def fuse_quantized_layout(mod: IRModule, options: CompileOptions) -> IRModule:
    """The rewrite of the module doc, with the integer kernels (``options.int8_kernels``)."""
    if not options.int8_kernels:
        return mod
    return eliminate_dead_code(map_functions(mod, _fuse_in_function))


def _same_const(a, b) -> bool:
    x, y = const_of(a), const_of(b)
    return (x is not None and y is not None and x.size == 1 and y.size == 1
            and x.dtype == y.dtype and np.array_equal(x.reshape(()), y.reshape(())))


def _fuse_in_function(fn: Function) -> Function:
    defs, uses = calls_and_uses(fn)

    plans: dict[int, tuple[Call, Call]] = {}     # quantize's var -> (layout call, dequantize)
    for b in fn.bindings():
        q = b.value
        matched = quantize_of_dequantized(q, defs, uses, LAYOUT_OPS)
        if matched is None:
            continue
        lay, dq = matched
        a = dq.args[0]
        if (a.type.dtype != q.attrs["dtype"] or not _same_const(dq.args[1], q.args[1])
                or not _same_const(dq.args[2], q.args[2])
                or const_of(q.args[1]).dtype != np.float32):
            continue
        if lay.op == "nn.max_pool2d" and not float(const_of(q.args[1]).reshape(())) > 0:
            continue        # a maximum commutes with non-decreasing maps only
        plans[id(b.var)] = (lay, dq)
    if not plans:
        return fn

    def visit(binding, lookup):
        plan = plans.get(id(binding.var))
        if plan is None:
            return None
        lay, dq = plan
        t = TensorType(tuple(lay.type.shape), binding.var.type.dtype)
        return Call(lay.op, [lookup(dq.args[0])] + [lookup(x) for x in lay.args[1:]],
                    dict(lay.attrs), t)

    return rewrite_function(fn, visit)
