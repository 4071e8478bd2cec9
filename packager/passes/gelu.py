"""Recognize GELU written out as ``x * (erf(x / sqrt(2)) + 1) * 0.5`` (how torch exports
``nn.GELU()`` before opset 20, and how BERT-style code writes it) and make it one ``gelu`` call,
as ONNX Runtime's GeluFusion does.

Why: the written-out form divides by a constant tensor and reads 1 and 0.5 from constant
tensors, so the fused epilogue of the matmul before it computes a vector division and three
broadcast loads per vector; ``gelu`` is legalized with literal constants and x * (1/sqrt(2)),
a multiply (the erf argument differs from x / sqrt(2) by at most one rounding, as in ORT's
fused Gelu). DeiT-tiny's 198x192 @ 192x768 + GELU: the epilogue took 140 us beside 508 us for
the matmul alone.

Matched (x any value; each intermediate read only by the next step):
    d = divide(x, c)            c a one-element float constant within 1e-6 of sqrt(2)
    e = erf(d);  a = add(e, 1) or add(1, e)
    y = multiply(multiply(x, a), 0.5)     or   multiply(multiply(x, 0.5), a)   (any operand order)
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..ir.graph import Call, Constant, Function, IRModule, Value, merge_sources, used_values
from .common import map_functions, rewrite_function

SQRT2 = math.sqrt(2.0)


def _scalar(v: Value, want: float, tol: float = 0.0) -> bool:
    return (isinstance(v, Constant) and v.data.size == 1 and v.data.dtype == np.float32
            and abs(float(v.data.reshape(())) - want) <= tol)


def fuse_gelu(mod: IRModule) -> IRModule:
    return map_functions(mod, _fuse_in_function)


def _fuse_in_function(fn: Function) -> Function:
    defs: dict[int, Call] = {}
    sources: dict[int, tuple] = {}      # per call (by id): its binding's source nodes
    uses: Counter = Counter()
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
            sources[id(b.value)] = b.source
        for a in used_values(b.value):
            uses[id(a)] += 1
    for o in fn.outputs:
        uses[id(o)] += 1

    matched: list[Call] = []            # the calls of the pattern being tried

    def call(v: Value, op: str) -> Call | None:
        """The call defining v if it is ``op`` and v has no other reader."""
        c = defs.get(id(v))
        if c is not None and c.op == op and uses[id(v)] == 1:
            matched.append(c)
            return c
        return None

    def erf_plus_one(v: Value) -> Value | None:
        """x when v = erf(x / sqrt(2)) + 1 (each step read once)."""
        add = call(v, "add")
        if add is None or len(add.args) != 2:
            return None
        for e, one in (add.args, add.args[::-1]):
            erf = call(e, "erf") if _scalar(one, 1.0) else None
            div = call(erf.args[0], "divide") if erf is not None else None
            if div is not None and _scalar(div.args[1], SQRT2, 1e-6):
                return div.args[0]
        return None

    def gelu_input(value: Call) -> Value | None:
        if value.op != "multiply" or len(value.args) != 2 or value.type.dtype != "float32":
            return None
        for m, half in (value.args, value.args[::-1]):
            if _scalar(half, 0.5):                       # (x * (erf + 1)) * 0.5
                inner = call(m, "multiply")
                for x, a in (inner.args, inner.args[::-1]) if inner is not None else ():
                    if erf_plus_one(a) is x:
                        return x
            half_x = call(m, "multiply")                 # (x * 0.5) * (erf + 1)
            if half_x is not None:
                for x, h in (half_x.args, half_x.args[::-1]):
                    if _scalar(h, 0.5) and erf_plus_one(half) is x:
                        return x
        return None

    fused: dict[int, tuple] = {}         # var of each gelu -> the source nodes of its pattern

    def visit(b, lookup):
        v = b.value
        if not isinstance(v, Call):
            return None
        matched.clear()
        x = gelu_input(v)
        if x is None or x.type != v.type:
            return None
        fused[id(b.var)] = merge_sources(*(sources.get(id(c), ()) for c in matched), b.source)
        return Call("gelu", [lookup(x)], {}, v.type)

    out = rewrite_function(fn, visit)
    for b in out.bindings():            # the gelu comes from every node it replaces
        if id(b.var) in fused:
            b.source = fused[id(b.var)]
    return out
