"""Which primitive functions the contraction kernels take: ``match_contraction`` finds the one
tagged float32 contraction (matmul, conv2d; ``ir.patterns``) a function computes with whatever
elementwise epilogue fusion put after it; ``is_row_matmul`` the one-row linear layers the dot
product kernel (``dot.py``) takes instead."""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import te
from ...ir.graph import PrimFunc
from ...ir.patterns import ReductionTag, reduction_tag
from ..lower import _plan_stages


@dataclass(frozen=True)
class Contraction:
    out: te.Tensor
    body: te.Expr          # the output's expression; ``reduce`` is the contraction inside it
    reduce: te.Reduce
    tag: ReductionTag


# The tags the convolution path takes: ``conv2d`` (weight [O, C, KH, KW]) and ``conv2d_rows``
# (ops/layout.py: the weight packed in blocks of the register tile's rows, [ceil(O / rows), C * KH *
# KW, rows]).
CONV_KINDS = ("conv2d", "conv2d_rows")


def match_contraction(func: PrimFunc,
                      kinds: tuple[str, ...] = ("conv2d", "conv2d_rows", "matmul",
                                                "matmul_packed")
                      ) -> Contraction | None:
    """The tagged float32 contraction ``func`` computes, if it has the form the fast kernels
    handle: one output whose expression holds exactly one tagged reduction (of one of
    ``kinds``) over placeholders."""
    if len(func.outputs) != 1 or func.outputs[0].dtype != "float32":
        return None
    materialized, outputs = _plan_stages(func)
    if materialized:
        return None
    out, body = outputs[0]
    # one reduction (an epilogue that reads it twice, as x * sigmoid(x), shares the node)
    reduces = list({id(n): n for n in te.walk(body) if isinstance(n, te.Reduce)}.values())
    if len(reduces) != 1:
        return None
    tag = reduction_tag(reduces[0])
    inputs = {t.uid for t in func.inputs}
    if tag is None or tag.kind not in kinds \
            or not all(t.uid in inputs and t.dtype in _operand_dtypes(tag.kind, i)
                       for i, t in enumerate(tag.operands)):
        return None
    if tag.kind == "conv2d" and tuple(tag.attrs["dilation"]) != (1, 1):
        return None
    match = Contraction(out, body, reduces[0], tag)
    if tag.kind == "matmul" and tag.attrs.get("transpose_b"):
        return match if is_row_matmul(match) else None
    return match


# The packed weights (``matmul_packed``'s B, ``conv2d_rows``' blocks, codegen/conv_oc.py's
# ``conv2d_oc`` ones) may be stored as bfloat16 (``--precision bf16``): each load widens them to
# float32 (``emitter.load_weights``), exactly.
BF16_WEIGHT_KINDS = ("matmul_packed", "conv2d_rows", "conv2d_oc", "matmul_bf16p",
                     "conv2d_bf16p")


def _operand_dtypes(kind: str, index: int) -> tuple[str, ...]:
    return ("float32", "bfloat16") if index == 1 and kind in BF16_WEIGHT_KINDS else ("float32",)


def is_row_matmul(match: Contraction | None) -> bool:
    """``match`` is ``matmul(x, W, transpose_b=True)`` of one row x (every dim but the last 1)
    by a 2-D W (N, K): a torch Linear at batch 1, whose constant W layout.py leaves untransposed
    for this kernel (each output is one dot product of contiguous rows)."""
    if match is None or match.tag.kind != "matmul" or not match.tag.attrs.get("transpose_b"):
        return False
    x, w = match.tag.operands
    dims = tuple(x.shape[:-1]) + tuple(match.out.shape[:-1])
    return (len(w.shape) == 2 and all(isinstance(d, int) for d in tuple(x.shape) + tuple(w.shape))
            and all(d == 1 for d in dims))
