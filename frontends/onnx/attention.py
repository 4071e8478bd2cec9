"""Converters for attention and contraction ONNX operators (Attention, Einsum, RotaryEmbedding),
decomposed into the operator table's rows (matmul, softmax, add, where, tanh, concat, reshape,
transpose...)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ...packager.ir.graph import Value
from .registry import NodeContext, converter

# ---- Attention (opset 23/24) --------------------------------------------------------------------

_ATTENTION_ATTRS = {"is_causal": 0, "kv_num_heads": None, "q_num_heads": None,
                    "qk_matmul_output_mode": 0, "scale": None, "softcap": 0.0,
                    "softmax_precision": None}


def _to_heads(ctx: NodeContext, x: Value, heads: int, what: str) -> Value:
    """[B, S, H*D] -> [B, H, S, D]."""
    b, s, hidden = x.type.shape
    if hidden % heads:
        raise ctx.error(f"{what} hidden size {hidden} is not a multiple of {heads} heads")
    x = ctx.reshape(x, (b, s, heads, hidden // heads))
    return ctx.emit("transpose", x, axes=(0, 2, 1, 3))


def _float_bias(ctx: NodeContext, mask: Value, like: Value) -> Value:
    """A bool mask (True = attend) as an additive 0 / -inf bias of ``like``'s dtype."""
    if mask.type.dtype == "bool":
        zero = ctx.constant(np.zeros((), like.type.dtype), "zero")
        neg = ctx.constant(np.array(-np.inf, like.type.dtype), "neg_inf")
        return ctx.emit("where", mask, zero, neg)
    if mask.type.dtype != like.type.dtype:
        raise ctx.error(f"attn_mask is {mask.type.dtype}; it must be bool or {like.type.dtype} "
                        "like Q")
    return mask


def _pad_last(ctx: NodeContext, bias: Value, total: int) -> Value:
    """Pad a bias's last axis with -inf up to ``total`` (a mask shorter than the keys)."""
    shape = bias.type.shape
    if shape[-1] == total:
        return bias
    if shape[-1] > total:
        raise ctx.error(f"attn_mask's last axis ({shape[-1]}) is longer than the keys ({total})")
    fill = ctx.constant(np.full(shape[:-1] + (total - shape[-1],), -np.inf, bias.type.dtype),
                        "mask_pad")
    return ctx.emit("concat", bias, fill, axis=len(shape) - 1)


@converter("Attention", since=23, attrs=_ATTENTION_ATTRS)
def _attention(ctx: NodeContext) -> list[Value]:
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    rank = len(q.type.shape)
    if rank not in (3, 4) or len(k.type.shape) != rank or len(v.type.shape) != rank:
        raise ctx.error(f"Q, K, V of shapes {q.type.shape}, {k.type.shape}, {v.type.shape}: "
                        "all must be 3-D or all 4-D")
    dtype = q.type.dtype
    if dtype not in ("float32", "float64", "float16"):
        raise ctx.error(f"Q is {dtype}: only float32, float64 and float16 attention is "
                        "supported")
    if ctx.attrs["softmax_precision"] not in (None, 1, 11):
        raise ctx.error(f"softmax_precision={ctx.attrs['softmax_precision']} is not supported")
    if rank == 3:
        hq, hkv = ctx.attrs["q_num_heads"], ctx.attrs["kv_num_heads"]
        if not hq or not hkv:
            raise ctx.error("3-D inputs need the q_num_heads and kv_num_heads attributes")
        q = _to_heads(ctx, q, int(hq), "Q")
        k = _to_heads(ctx, k, int(hkv), "K")
        v = _to_heads(ctx, v, int(hkv), "V")
    batch, hq, sq, d = q.type.shape
    hkv = k.type.shape[1]
    if v.type.shape[1] != hkv or hq % hkv:
        raise ctx.error(f"{hq} query heads and {hkv} key / {v.type.shape[1]} value heads: the "
                        "query heads must be a multiple of equal key and value heads")

    if ctx.has_input(4):
        k = ctx.emit("concat", ctx.input(4), k, axis=2)
    if ctx.has_input(5):
        v = ctx.emit("concat", ctx.input(5), v, axis=2)
    present_k, present_v = k, v
    past = ctx.input(4).type.shape[2] if ctx.has_input(4) else 0
    skv = k.type.shape[2]

    scale = ctx.attrs["scale"]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)

    # Grouped heads: query head h reads key/value head h // reps. Fold the reps query heads of
    # each key head into its rows so K and V are never copied: [B, Hkv, reps*Sq, D].
    reps = hq // hkv
    qg = ctx.reshape(q, (batch, hkv, reps * sq, d))
    qk = ctx.emit("matmul", qg, k, transpose_b=True)
    qk = ctx.reshape(qk, (batch, hq, sq, skv))
    qk = ctx.emit("multiply", qk, ctx.scalar(scale, qk))
    softcap = float(ctx.attrs["softcap"] or 0.0)
    if softcap > 0:
        capped = ctx.emit("tanh", ctx.emit("multiply", qk, ctx.scalar(1.0 / softcap, qk)))
        qk = ctx.emit("multiply", capped, ctx.scalar(softcap, qk))

    bias: Value | None = None
    if ctx.has_input(3):
        bias = _pad_last(ctx, _float_bias(ctx, ctx.input(3), qk), skv)
    if ctx.attrs["is_causal"]:
        rows = np.arange(sq)[:, None] + past
        causal = np.where(np.arange(skv)[None, :] > rows, -np.inf, 0.0).astype(dtype)
        causal_c = ctx.constant(causal, "causal")
        bias = causal_c if bias is None else ctx.emit("add", bias, causal_c)
    if ctx.has_input(6):
        seqlen = ctx.input(6)
        if seqlen.type.shape != (batch,):
            raise ctx.error(f"nonpad_kv_seqlen has shape {seqlen.type.shape}, not ({batch},)")
        positions = ctx.constant(np.arange(skv, dtype=seqlen.type.dtype).reshape(1, 1, 1, skv),
                                 "positions")
        valid = ctx.emit("less", positions, ctx.reshape(seqlen, (batch, 1, 1, 1)))
        pad_bias = _float_bias(ctx, valid, qk)
        bias = pad_bias if bias is None else ctx.emit("add", bias, pad_bias)
    scores = qk if bias is None else ctx.emit("add", qk, bias)

    probs = ctx.emit("nn.softmax", scores, axis=-1)
    pg = ctx.reshape(probs, (batch, hkv, reps * sq, skv))
    y = ctx.emit("matmul", pg, v)
    dv = v.type.shape[3]
    y = ctx.reshape(y, (batch, hq, sq, dv))
    if rank == 3:
        y = ctx.emit("transpose", y, axes=(0, 2, 1, 3))
        y = ctx.reshape(y, (batch, sq, hq * dv))

    mode = int(ctx.attrs["qk_matmul_output_mode"])
    if mode in (0, 1):
        qk_out = qk        # the scaled product, soft-capped when softcap is set
    elif mode == 2:
        qk_out = scores    # ... plus the mask and causal bias
    elif mode == 3:
        qk_out = probs
    else:
        raise ctx.error(f"qk_matmul_output_mode={mode} is not 0, 1, 2 or 3")
    return [y, present_k, present_v, qk_out]


# ---- RotaryEmbedding (opset 23) -----------------------------------------------------------------

def _last_slice(ctx: NodeContext, x: Value, start: int, end: int, step: int = 1) -> Value:
    axis = len(x.type.shape) - 1
    return ctx.emit("strided_slice", x, starts=(start,), ends=(end,), axes=(axis,), steps=(step,))


@converter("RotaryEmbedding", since=23, attrs={"interleaved": 0, "num_heads": 0,
                                                "rotary_embedding_dim": 0})
def _rotary_embedding(ctx: NodeContext) -> Value:
    x, cos, sin = ctx.input(0), ctx.input(1), ctx.input(2)
    shape = x.type.shape
    if x.type.dtype not in ("float32", "float64"):
        raise ctx.error(f"input is {x.type.dtype}: only float32 and float64 are supported")
    if len(shape) == 4:                               # [B, H, S, D] -> [B, S, H, D]
        xs = ctx.emit("transpose", x, axes=(0, 2, 1, 3))
    elif len(shape) == 3:                             # [B, S, H*D] -> [B, S, H, D]
        heads = int(ctx.attrs["num_heads"] or 0)
        if heads <= 0 or shape[2] % heads:
            raise ctx.error(f"a 3-D input of shape {shape} needs num_heads dividing {shape[2]}")
        xs = ctx.reshape(x, (shape[0], shape[1], heads, shape[2] // heads))
    else:
        raise ctx.error(f"input of shape {shape}: it must be 3-D or 4-D")
    batch, seq, heads, head = xs.type.shape
    rot = int(ctx.attrs["rotary_embedding_dim"] or 0) or head
    if rot % 2 or rot > head:
        raise ctx.error(f"rotary_embedding_dim {rot} must be even and at most the head size "
                        f"{head}")
    half = rot // 2
    if ctx.has_input(3):
        pos = ctx.input(3)
        if pos.type.shape != (batch, seq):
            raise ctx.error(f"position_ids has shape {pos.type.shape}, expected {(batch, seq)}")
        if len(cos.type.shape) != 2 or len(sin.type.shape) != 2:
            raise ctx.error("with position_ids, cos_cache and sin_cache must be 2-D "
                            "[max_position, rotary_dim / 2]")
        cos = ctx.emit("take", cos, pos, axis=0)
        sin = ctx.emit("take", sin, pos, axis=0)
    for name, c in (("cos_cache", cos), ("sin_cache", sin)):
        if c.type.shape != (batch, seq, half):
            raise ctx.error(f"{name} gives shape {c.type.shape} per position, expected "
                            f"{(batch, seq, half)}")
        if c.type.dtype != x.type.dtype:
            raise ctx.error(f"{name} is {c.type.dtype}, the input {x.type.dtype}")
    cos = ctx.reshape(cos, (batch, seq, 1, half))
    sin = ctx.reshape(sin, (batch, seq, 1, half))
    if ctx.attrs["interleaved"]:
        x1 = _last_slice(ctx, xs, 0, rot, 2)
        x2 = _last_slice(ctx, xs, 1, rot, 2)
    else:
        x1 = _last_slice(ctx, xs, 0, half)
        x2 = _last_slice(ctx, xs, half, rot)
    real = ctx.emit("subtract", ctx.emit("multiply", cos, x1), ctx.emit("multiply", sin, x2))
    imag = ctx.emit("add", ctx.emit("multiply", sin, x1), ctx.emit("multiply", cos, x2))
    if ctx.attrs["interleaved"]:
        pair = (batch, seq, heads, half, 1)
        both = ctx.emit("concat", ctx.reshape(real, pair), ctx.reshape(imag, pair), axis=4)
        rotated = ctx.reshape(both, (batch, seq, heads, rot))
    else:
        rotated = ctx.emit("concat", real, imag, axis=3)
    if rot < head:
        rotated = ctx.emit("concat", rotated, _last_slice(ctx, xs, rot, head), axis=3)
    if len(shape) == 4:
        return ctx.emit("transpose", rotated, axes=(0, 2, 1, 3))
    return ctx.reshape(rotated, shape)


# ---- Einsum (opset 12) --------------------------------------------------------------------------

def _parse_einsum(ctx: NodeContext, equation: str, ranks: Sequence[int]
                  ) -> tuple[list[list[str]], list[str]]:
    """Each operand's axis labels and the output's, with '...' expanded into private labels
    (aligned from the right, as numpy broadcasts) and implicit output filled in."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.error(f"equation {equation!r} names {len(terms)} operands, the node has "
                        f"{len(ranks)}")
    ell_rank = 0
    parsed: list[tuple[str, str, bool]] = []
    for term, rank in zip(terms, ranks):
        before, dots, after = term.partition("...")
        letters = before + after
        if not all(c.isalpha() for c in letters) or "." in after:
            raise ctx.error(f"equation {equation!r}: term {term!r} is not letters with at most "
                            "one '...'")
        extra = rank - len(letters)
        if (extra != 0 and not dots) or extra < 0:
            raise ctx.error(f"equation {equation!r}: term {term!r} does not match an operand "
                            f"of rank {rank}")
        ell_rank = max(ell_rank, extra)
        parsed.append((before, after, bool(dots)))
    ell = [chr(0x100 + k) for k in range(ell_rank)]   # private labels for '...' axes
    labels = []
    for (before, after, dots), rank in zip(parsed, ranks):
        extra = rank - len(before) - len(after)
        labels.append(list(before) + (ell[ell_rank - extra:] if dots else []) + list(after))
    if arrow:
        before, dots, after = rhs.partition("...")
        if not all(c.isalpha() for c in before + after) or "." in after:
            raise ctx.error(f"equation {equation!r}: output {rhs!r} is not letters with at most "
                            "one '...'")
        out = list(before) + (ell if dots else []) + list(after)
        seen = {c for ls in labels for c in ls}
        missing = [c for c in out if c not in seen]
        if missing or len(set(out)) != len(out):
            raise ctx.error(f"equation {equation!r}: output labels must be distinct input labels")
    else:
        counts: dict[str, int] = {}
        for ls in labels:
            for c in ls:
                counts[c] = counts.get(c, 0) + 1
        out = ell + sorted(c for c, n in counts.items() if n == 1 and c not in ell)
    return labels, out


def _diagonal(ctx: NodeContext, x: Value, labels: list[str]) -> tuple[Value, list[str]]:
    """Take the diagonal over every repeated label of one operand."""
    while True:
        dup = next((c for c in labels if labels.count(c) > 1), None)
        if dup is None:
            return x, labels
        a, b = [i for i, c in enumerate(labels) if c == dup][:2]
        n = x.type.shape[a]
        rest = [i for i in range(len(labels)) if i not in (a, b)]
        x = ctx.emit("transpose", x, axes=tuple(rest) + (a, b))
        lead = tuple(x.type.shape[:-2])
        x = ctx.reshape(x, lead + (n * n,))
        idx = ctx.constant(np.arange(n, dtype=np.int64) * (n + 1), "diag")
        x = ctx.emit("take", x, idx, axis=len(lead))
        labels = [labels[i] for i in rest] + [dup]


def _permute(ctx: NodeContext, x: Value, labels: list[str], order: list[str]) -> Value:
    axes = tuple(labels.index(c) for c in order)
    return x if axes == tuple(range(len(axes))) else ctx.emit("transpose", x, axes=axes)


@converter("Einsum", since=12, attrs={"equation": None})
def _einsum(ctx: NodeContext) -> Value:
    equation = ctx.attrs["equation"]
    if not equation:
        raise ctx.error("the equation attribute is required")
    xs = [ctx.input(i) for i in range(ctx.num_inputs)]
    if not xs:
        raise ctx.error("Einsum needs at least one input")
    dtype = xs[0].type.dtype
    labels, out = _parse_einsum(ctx, str(equation), [len(x.type.shape) for x in xs])
    sizes: dict[str, int] = {}
    for x, ls in zip(xs, labels):
        if x.type.dtype != dtype:
            raise ctx.error(f"inputs have different dtypes: {dtype} and {x.type.dtype}")
        for c, n in zip(ls, x.type.shape):
            if sizes.get(c, 1) != 1 and n not in (1, sizes[c]):
                raise ctx.error(f"equation {equation!r}: label sizes {sizes[c]} and {n} differ")
            sizes[c] = max(sizes.get(c, 1), n)

    ops: list[tuple[Value, list[str]]] = []
    for x, ls in zip(xs, labels):
        x, ls = _diagonal(ctx, x, list(ls))
        full = tuple(sizes[c] for c in ls)
        if x.type.shape != full:   # a size-1 (broadcast) axis
            x = ctx.emit("broadcast_to", x, shape=full)
        ops.append((x, ls))

    def needed_after(k: int) -> set[str]:
        return set(out).union(*[set(ls) for _, ls in ops[k + 1:]])

    def sum_unneeded(x: Value, ls: list[str], keep: set[str]) -> tuple[Value, list[str]]:
        drop = [i for i, c in enumerate(ls) if c not in keep]
        if not drop:
            return x, ls
        x = ctx.emit("sum", x, axes=tuple(drop), keepdims=False)
        return x, [c for c in ls if c in keep]

    acc, acc_ls = ops[0]
    acc, acc_ls = sum_unneeded(acc, acc_ls, needed_after(0))
    for k in range(1, len(ops)):
        b, b_ls = ops[k]
        later = needed_after(k)
        b, b_ls = sum_unneeded(b, b_ls, later | set(acc_ls))
        acc, acc_ls = sum_unneeded(acc, acc_ls, later | set(b_ls))
        batch = [c for c in acc_ls if c in b_ls and c in later]
        contract = [c for c in acc_ls if c in b_ls and c not in later]
        a_only = [c for c in acc_ls if c not in b_ls]
        b_only = [c for c in b_ls if c not in acc_ls]

        def prod(cs: list[str]) -> int:
            return int(np.prod([sizes[c] for c in cs], dtype=np.int64))

        a3 = ctx.reshape(_permute(ctx, acc, acc_ls, batch + a_only + contract),
                         (prod(batch), prod(a_only), prod(contract)))
        b3 = ctx.reshape(_permute(ctx, b, b_ls, batch + b_only + contract),
                         (prod(batch), prod(b_only), prod(contract)))
        c3 = ctx.emit("matmul", a3, b3, transpose_b=True)
        acc_ls = batch + a_only + b_only
        acc = ctx.reshape(c3, tuple(sizes[c] for c in acc_ls))
    acc, acc_ls = sum_unneeded(acc, acc_ls, set(out))
    return _permute(ctx, acc, acc_ls, out)


# ---- LinearAttention (opset 27): through ONNX's own function body (a Scan over the sequence) ----

@converter("LinearAttention", since=27, attrs={"chunk_size": None, "kv_num_heads": None,
                                                "q_num_heads": None, "scale": None,
                                                "update_rule": None})
def _linear_attention(ctx: NodeContext) -> list[Value | None]:
    from .rnn import expand_function

    return expand_function(ctx)


@converter("FlexAttention", since=1, domain="ai.onnx.preview",
           attrs={"prob_mod": None, "score_mod": None, "softmax_precision": None, "scale": None})
def _flex_attention(ctx: NodeContext) -> list[Value | None]:
    """FlexAttention with its score_mod / prob_mod subgraphs, through ONNX's function body."""
    from .rnn import expand_function

    return expand_function(ctx)
