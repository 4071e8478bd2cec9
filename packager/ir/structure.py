"""Structural identity of primitive functions: two functions with the same key compute the same
thing from the same argument list, whatever their tensors and index variables are called, so one
compiled kernel serves both. Unrolled recurrences (LSTM/GRU steps, Scan and Loop bodies) and
repeated layers (a transformer's blocks, a ResNet's same-shaped convolutions) produce many such
functions; compiling each once cuts export time without changing any result.

The key hash-conses the expression DAG (a subexpression shared by several reads is encoded once),
names tensors and index variables by first appearance, and includes everything a code generator
may look at: shapes, dtypes, extents, constants, operators, reduction tags (which select the
specialized contraction kernels) and the function's attributes.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Hashable

from . import te
from .graph import PrimFunc
from .patterns import reduction_tag


def structural_key(func: PrimFunc) -> Hashable:
    """A hashable value equal for two functions exactly when they differ only in names."""
    nodes: list[tuple] = []
    memo: dict[int, int] = {}      # id(node) -> index in ``nodes``
    tensors: dict[int, int] = {}   # tensor uid -> canonical number
    keep: list[object] = []        # keep nodes alive so their ids stay unique while we run

    def tensor(t: te.Tensor) -> int:
        n = tensors.get(t.uid)
        if n is None:
            n = tensors[t.uid] = len(tensors)
        return n

    def node(e: object) -> int:
        at = memo.get(id(e))
        if at is not None:
            return at
        keep.append(e)
        if isinstance(e, te.IndexVar):
            enc: tuple = ("var", e.extent, e.reduce, e.dtype)
        elif isinstance(e, te.Read):
            enc = ("read", tensor(e.tensor), e.dtype, tuple(node(i) for i in e.indices))
        elif isinstance(e, te.Reduce):
            tag = reduction_tag(e)
            tag_enc = None if tag is None else (
                tag.kind, tuple(tensor(t) for t in tag.operands), repr(sorted(tag.attrs.items())))
            enc = ("reduce", e.combiner, e.dtype, tuple(node(a) for a in e.axes), node(e.body),
                   tag_enc)
        elif isinstance(e, te.Const):
            enc = ("const", type(e.value).__name__, repr(e.value), e.dtype)
        elif isinstance(e, te.Expr):
            parts: list[object] = [type(e).__name__]
            for f in fields(e):
                v = getattr(e, f.name)
                parts.append(node(v) if isinstance(v, te.Expr) else
                             tuple(node(x) for x in v) if isinstance(v, tuple) else v)
            enc = tuple(parts)
        else:
            raise TypeError(f"unknown expression {e!r}")
        memo[id(e)] = len(nodes)
        nodes.append(enc)
        return memo[id(e)]

    signature = []
    for t in func.inputs:
        signature.append(("in", tensor(t), t.shape, t.dtype))
    for stage in te.stages(func.outputs):
        if stage.body is None:
            signature.append(("placeholder", tensor(stage), stage.shape, stage.dtype))
            continue
        signature.append(("stage", tensor(stage), stage.shape, stage.dtype,
                          tuple(node(a) for a in stage.axes), node(stage.body)))
    signature.append(("out", tuple((tensor(t), t.shape, t.dtype) for t in func.outputs)))
    return (tuple(signature), tuple(nodes), repr(sorted(func.attrs.items())))
