"""Tags on reductions that say which operator they came from (``conv2d``, ``matmul``) and its
attributes, so the code generator can pick a specialized kernel for them. A tag is keyed by the
reduction's first axis, which keeps its identity through fusion and rewriting."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from . import te


@dataclass(frozen=True)
class ReductionTag:
    kind: str                      # "conv2d" or "matmul"
    operands: tuple[te.Tensor, ...]  # the placeholders it contracts: (x, w) or (a, b)
    attrs: dict = field(default_factory=dict)


_TAGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tag_reduction(axis: te.IndexVar, kind: str, operands: tuple[te.Tensor, ...], **attrs) -> None:
    _TAGS[axis] = ReductionTag(kind, tuple(operands), dict(attrs))


def reduction_tag(reduce: te.Reduce) -> ReductionTag | None:
    return _TAGS.get(reduce.axes[0]) if reduce.axes else None
