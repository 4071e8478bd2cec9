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

Then (``_regroup_and_fold``) torch's ONNX GroupNorm, reshape(normalize(reshape(x, [N, G, -1])),
x's shape), becomes a grouped normalization of x itself, and a multiply/add by a parameter right
after a normalization becomes its scale/bias, so that what follows (SiLU) fuses into the kernel.

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
    mod = eliminate_dead_code(map_functions(mod, _fuse_in_function))
    return eliminate_dead_code(map_functions(mod, _regroup_and_fold))


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
        for pair in (add.args, add.args[::-1]):   # (the variance, epsilon) in either order
            eps = _eps(pair[1])
            if eps is not None:
                break
        else:
            return None
        var = call(pair[0], "mean")
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


# ---- GroupNorm as torch exports it, and a scale and bias that follow -----------------------------

def _kernel_layout(x: Value, p: Value, axis: int, groups: int) -> bool:
    """``p`` is a per-row-block or per-element parameter of x over the trailing axes from
    ``axis`` (codegen/norm.py's ``_param_layout``): its non-1 dims are a suffix of the leading
    axes and a prefix of the normalized ones, each equal to x's (with ``groups``: no leading
    ones, and the groups split the prefix evenly)."""
    xs = x.type.shape
    ps = (1,) * (len(xs) - len(p.type.shape)) + tuple(p.type.shape)
    lead, trail = ps[:axis], ps[axis:]
    first = next((d for d, n in enumerate(lead) if n != 1), len(lead))
    last = max((d for d, n in enumerate(trail) if n != 1), default=-1) + 1
    if not (all(isinstance(n, int) and n == xs[d] for d, n in enumerate(lead[first:], first))
            and all(isinstance(n, int) and n == xs[axis + d]
                    for d, n in enumerate(trail[:last]))):
        return False
    return groups == 1 or (first == len(lead) and int(np.prod(trail[:last])) % groups == 0)


def _regroup_and_fold(fn: Function) -> Function:
    """torch's ONNX export of GroupNorm, reshape(normalize(reshape(x, [N, G, -1]), axis 2), x's
    shape), becomes normalize(x, axis 1, groups G): no view between the normalization and its
    readers, so they fuse into its kernel. Then a multiply by a parameter, and an add of one,
    that a normalization (without them) is the only input of become its scale and bias, when
    they have a layout the kernel takes (else, fused as an epilogue reading across the row,
    they would leave the kernel for the generic loop nest)."""
    defs: dict[int, Call] = {}
    sources: dict[int, tuple] = {}
    uses: Counter = Counter()
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
        sources[id(b.var)] = b.source
        for a in used_values(b.value):
            uses[id(a)] += 1
    for o in fn.outputs:
        uses[id(o)] += 1
    merged: dict[int, tuple] = {}       # rewritten var -> the source nodes it now stands for

    def src(v: Value) -> tuple:
        return merged.get(id(v), sources.get(id(v), ()))

    def regroup(b, v: Call, lookup):
        n_val = v.args[0]
        norm = defs.get(id(n_val))
        if norm is None or norm.op != "nn.normalize" or uses[id(n_val)] != 1 \
                or norm.attrs.get("scale") or norm.attrs.get("bias") \
                or norm.attrs.get("groups", 1) != 1:
            return None
        g_val = norm.args[0]
        inner = defs.get(id(g_val))
        if inner is None or inner.op != "reshape" or uses[id(g_val)] != 1:
            return None
        x = inner.args[0]
        xs, gs = x.type.shape, g_val.type.shape
        if v.type.shape != xs or len(xs) < 3 or len(gs) != 3 \
                or int(norm.attrs["axis"]) % 3 != 2 or gs[0] != xs[0] \
                or not isinstance(gs[1], int) or not isinstance(xs[1], int) \
                or gs[1] < 1 or xs[1] % gs[1]:
            return None
        merged[id(b.var)] = merge_sources(src(g_val), src(n_val), b.source)
        return Call("nn.normalize", [lookup(x)], {**norm.attrs, "axis": 1, "groups": gs[1]},
                    v.type)

    def fold(b, v: Call, lookup):
        if len(v.args) != 2:
            return None
        for n_val, p in (v.args, v.args[::-1]):
            norm = defs.get(id(n_val))
            if norm is None or norm.op != "nn.normalize" or uses[id(n_val)] != 1:
                continue
            x = norm.args[0]
            attrs = dict(norm.attrs)
            has_scale, has_bias = bool(attrs.get("scale")), bool(attrs.get("bias"))
            if has_bias or (v.op == "multiply" and has_scale) or p.type.dtype != "float32" \
                    or not _fits(x, p) or v.type != x.type:
                continue
            axis = int(attrs["axis"]) % len(x.type.shape)
            if not _kernel_layout(x, p, axis, int(attrs.get("groups", 1))):
                continue
            params = list(norm.args[1:])
            if v.op == "multiply":
                attrs["scale"] = True
                args = [x, p] + params
            else:
                attrs["bias"] = True
                args = [x] + params + [p]
            merged[id(b.var)] = merge_sources(src(n_val), b.source)
            return Call("nn.normalize", [lookup(a) for a in args], attrs, v.type)
        return None

    def visit(b, lookup):
        v = b.value
        if not isinstance(v, Call):
            return None
        if v.op == "reshape":
            new = regroup(b, v, lookup)
        elif v.op in ("multiply", "add"):
            new = fold(b, v, lookup)
        else:
            new = None
        if new is not None:
            defs[id(b.var)] = new     # what later bindings now read through this var
        return new

    out = rewrite_function(fn, visit)
    for b in out.bindings():
        if id(b.var) in merged:
            b.source = merged[id(b.var)]
    return out
