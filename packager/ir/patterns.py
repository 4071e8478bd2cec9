"""Tags on reductions that say which operator they came from (``conv2d``, ``matmul``...) and its
attributes, so the code generator can pick a specialized kernel for them. The tag lives in the
IR, on the reduction's first axis (``te.IndexVar.tag``), which keeps its identity through fusion
and rewriting."""

from __future__ import annotations

from . import te
from .te import ReductionTag

__all__ = ["ReductionTag", "reduction_tag", "tag_reduction"]


def tag_reduction(axis: te.IndexVar, kind: str, operands: tuple[te.Tensor, ...], **attrs) -> None:
    axis.tag = ReductionTag(kind, tuple(operands), dict(attrs))


def reduction_tag(reduce: te.Reduce) -> ReductionTag | None:
    return reduce.axes[0].tag if reduce.axes else None
