"""``scaled_dot_product_attention``, kept whole by the decomposition: one softmax between two
matmuls, as the ONNX frontend's Attention converter writes it (torch's own decomposition adds a
masked "safe softmax" with reductions and selects that the IR does not need)."""

from __future__ import annotations

import math

import numpy as np

from ...packager.ir.graph import Value
from .registry import NodeContext, converter


def _bias(ctx: NodeContext, mask: Value, dtype: str) -> Value:
    """A bool mask (True = attend) as an additive 0 / -inf bias; a float mask as it is."""
    if mask.type.dtype == "bool":
        zero = ctx.constant(np.zeros((), dtype), "zero")
        neg = ctx.constant(np.array(-np.inf, dtype), "neg_inf")
        return ctx.emit("where", mask, zero, neg)
    if mask.type.dtype != dtype:
        return ctx.emit("cast", mask, dtype=dtype)
    return mask


@converter("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: NodeContext) -> Value:
    q, k, v = ctx.tensor("query"), ctx.tensor("key"), ctx.tensor("value")
    if float(ctx.arg("dropout_p") or 0.0) != 0.0:
        raise ctx.error("dropout_p > 0 drops at random: export the model in eval mode")
    if len(q.type.shape) < 2 or len(k.type.shape) != len(q.type.shape):
        raise ctx.error(f"query {q.type.shape} and key {k.type.shape} need the same rank >= 2")
    dtype = q.type.dtype
    *batch, sq, d = q.type.shape
    skv = k.type.shape[-2]
    scale = ctx.args.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    hq = batch[-1] if batch else 1
    hkv = k.type.shape[-3] if len(k.type.shape) >= 3 else 1
    # K transposed by a kernel of its own: the matmul fast path reads a plain [.., D, S] operand
    # (a transpose_b product of two run-time tensors takes the generic loop nest, ~10x slower)
    rank = len(k.type.shape)
    k = ctx.emit("transpose", k, axes=tuple(range(rank - 2)) + (rank - 1, rank - 2))
    if len(batch) >= 1 and hq != hkv:
        if not ctx.arg("enable_gqa") or hq % hkv:
            raise ctx.error(f"{hq} query heads and {hkv} key heads: grouped-query attention "
                            "needs enable_gqa=True and a multiple")
        # Fold the query heads of each key head into its rows: K and V are never copied.
        reps = hq // hkv
        qg = ctx.reshape(q, tuple(batch[:-1]) + (hkv, reps * sq, d))
        qk = ctx.reshape(ctx.emit("matmul", qg, k),
                         tuple(batch) + (sq, skv))
    else:
        reps = 1
        qk = ctx.emit("matmul", q, k)
    qk = ctx.emit("multiply", qk, ctx.scalar(scale, qk))
    bias = None
    mask = ctx.maybe("attn_mask")
    if mask is not None:
        bias = _bias(ctx, mask, dtype)
    if ctx.arg("is_causal"):
        causal = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None], -np.inf, 0.0)
        causal_c = ctx.constant(causal.astype(dtype), "causal")
        bias = causal_c if bias is None else ctx.emit("add", bias, causal_c)
    scores = qk if bias is None else ctx.emit("add", qk, bias)
    probs = ctx.emit("nn.softmax", scores, axis=len(scores.type.shape) - 1)
    if reps > 1:
        pg = ctx.reshape(probs, tuple(batch[:-1]) + (hkv, reps * sq, skv))
        y = ctx.emit("matmul", pg, v)
        return ctx.reshape(y, tuple(batch) + (sq, v.type.shape[-1]))
    return ctx.emit("matmul", probs, v)
