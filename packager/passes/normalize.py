"""Recognize LayerNorm written out with reductions (how exporters before opset 17 and BERT-style
code write it) and make it one ``nn.normalize`` call, as ONNX Runtime's LayerNormFusion does:

    m = mean(x, axes, keepdims)      axes: the trailing axes (any spelling: [-1], [1, 2] of 3-D)
    d = subtract(x, m)
    v = mean(multiply(d, d), axes, keepdims)          (ONNX Pow(d, 2) imports as d * d)
    y = divide(d, sqrt(add(v, eps)))                  (eps a one-element constant; either order)
    then, optionally, multiply(y, gamma) and add(..., beta) (either operand order), when gamma
    and beta broadcast to x without changing its shape: the kernel's scale and bias.

Every intermediate is read only by the next step (d by the square and the division). float32
only (the kernel's dtype; other dtypes keep the operators and their roundings).

Why: the written-out form is five kernels, each a pass over the tensor (mean; subtract; square
and mean; add, sqrt and divide; the affine part); ``codegen/norm.py`` does it in one (DeiT-tiny's
LayerNorms: 590 us -> 342 us at 1 thread, ORT 748 us).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir.graph import Call, Constant, Function, IRModule, Value, merge_sources, used_values
from .common import map_functions, rewrite_function
from .simplify import eliminate_dead_code


def fuse_normalize(mod: IRModule) -> IRModule:
    # a binding matched on the way to a longer match (the division before its scale) is left
    # unread: dropped here
    return eliminate_dead_code(map_functions(mod, _fuse_in_function))


def _eps(v: Value) -> float | None:
    if isinstance(v, Constant) and v.data.size == 1 and v.data.dtype == np.float32:
        value = float(v.data.reshape(()))
        return value if value >= 0.0 else None
    return None


def _trailing_start(axes, rank: int) -> int | None:
    """The first axis when ``axes`` are exactly the trailing axes [k, rank), else None."""
    if axes is None or rank == 0:
        return None
    red = sorted({int(a) % rank for a in axes})
    if not red or red != list(range(red[0], rank)):
        return None
    return red[0]


def _fits(x: Value, p: Value) -> bool:
    xs, ps = x.type.shape, p.type.shape
    if len(ps) > len(xs) or p.type.dtype != x.type.dtype:
        return False
    return all((isinstance(d, int) and d == 1) or d == e or str(d) == str(e)
               for d, e in zip(ps, xs[len(xs) - len(ps):]))


def _fuse_in_function(fn: Function) -> Function:
    defs: dict[int, Call] = {}
    sources: dict[int, tuple] = {}
    uses: Counter = Counter()
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
            sources[id(b.value)] = b.source
        for a in used_values(b.value):
            uses[id(a)] += 1
    for o in fn.outputs:
        uses[id(o)] += 1

    matched: list[Call] = []

    def call(v: Value, op: str, readers: int = 1) -> Call | None:
        c = defs.get(id(v))
        if c is not None and c.op == op and uses[id(v)] == readers:
            matched.append(c)
            return c
        return None

    def core(v: Value) -> tuple[Value, int, float] | None:
        """(x, first axis, eps) when v, read once, is (x - mean) / sqrt(var + eps)."""
        div = call(v, "divide")
        return core_call(div) if div is not None else None

    def core_call(div: Call) -> tuple[Value, int, float] | None:
        if len(div.args) != 2:
            return None
        d_val, s_val = div.args
        sq = call(s_val, "sqrt")
        add = call(sq.args[0], "add") if sq is not None else None
        if add is None or len(add.args) != 2:
            return None
        for var_val, e in (add.args, add.args[::-1]):
            eps = _eps(e)
            if eps is not None:
                break
        else:
            return None
        var = call(var_val, "mean")
        prod = call(var.args[0], "multiply") if var is not None else None
        if prod is None or prod.args[0] is not d_val or prod.args[1] is not d_val:
            return None
        sub = call(d_val, "subtract", readers=3)
        if sub is None:
            return None
        x, m_val = sub.args
        mean = call(m_val, "mean")
        if mean is None or mean.args[0] is not x:
            return None
        rank = len(x.type.shape)
        start = _trailing_start(mean.attrs.get("axes"), rank)
        if start is None or _trailing_start(var.attrs.get("axes"), rank) != start \
                or not mean.attrs.get("keepdims", True) or not var.attrs.get("keepdims", True):
            return None
        if x.type.dtype != "float32" or div.type != x.type:
            return None
        return x, start, eps

    def affine(v: Call) -> tuple[Value, int, float, Value | None, Value | None] | None:
        """Match from the last call: add(multiply(core, gamma), beta), multiply(core, gamma),
        add(core, beta), or core."""
        for with_bias in (True, False):
            for with_scale in (True, False):
                matched.clear()
                top = v
                beta = gamma = None
                inner: Value | None = None
                if with_bias:
                    if top.op != "add" or len(top.args) != 2:
                        continue
                    for a, p in (top.args, top.args[::-1]):
                        c = defs.get(id(a))
                        if c is not None and uses[id(a)] == 1 and \
                                c.op == ("multiply" if with_scale else "divide"):
                            inner, beta = a, p
                            break
                    if inner is None:
                        continue
                    if with_scale:
                        top = call(inner, "multiply")
                        if top is None:
                            continue
                if with_scale:
                    if top.op != "multiply" or len(top.args) != 2:
                        continue
                    got = None
                    for a, p in (top.args, top.args[::-1]):
                        c = defs.get(id(a))
                        if c is not None and c.op == "divide" and uses[id(a)] == 1:
                            got, gamma = a, p
                            break
                    if got is None:
                        continue
                    inner = got
                if inner is None:       # the core is v itself
                    if v.op != "divide":
                        continue
                    matched.append(v)
                    found = core_call(v)
                else:
                    found = core(inner)
                if found is None:
                    continue
                x = found[0]
                if any(p is not None and not _fits(x, p) for p in (gamma, beta)):
                    continue
                return (*found, gamma, beta)
        return None

    fused: dict[int, tuple] = {}

    def visit(b, lookup):
        v = b.value
        if not isinstance(v, Call) or v.op not in ("add", "multiply", "divide"):
            return None
        found = affine(v)
        if found is None or found[0].type != v.type:
            return None
        x, start, eps, gamma, beta = found
        fused[id(b.var)] = merge_sources(*(sources.get(id(c), ()) for c in matched), b.source)
        params = [lookup(p) for p in (gamma, beta) if p is not None]
        return Call("nn.normalize", [lookup(x)] + params,
                    {"axis": start, "eps": eps, "scale": gamma is not None,
                     "bias": beta is not None}, v.type)

    out = rewrite_function(fn, visit)
    for b in out.bindings():
        if id(b.var) in fused:
            b.source = fused[id(b.var)]
    return out
