"""``matmul_bf16p``: a matmul by a constant B stored as bfloat16 in K pairs (``mlcpack export
--precision bf16``; docs/precision.md).

``passes/layout.py weights_to_bf16`` turns ``matmul_packed`` (B in column panels [ceil(N / nr),
K, nr], ops/layout.py) into this op, B rounded to bfloat16 (round to nearest even) and packed as
``bp`` [ceil(N / nr), ceil(K / 2), nr, 2]: ``bp[n // nr, k // 2, n % nr, k % 2] = B[k, n]``, zero
past N and past K. Each 32-bit word holds the pair (B[2j, n], B[2j + 1, n]), the even row in the
low half: the operand ``vdpbf16ps`` multiplies by a pair of activations (x86-64-v4 with
avx512_bf16, codegen/bf16dot.py), and without it one 32-bit load gives the two float32 weights by
a shift left of 16 (the even row) and a mask of the high half (the odd row)."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .layout import MATMUL_PANEL
from .registry import COMPLEX, register_op

PAIR_KIND = "matmul_bf16p"


def pack_pairs(b: np.ndarray, nr: int = MATMUL_PANEL) -> np.ndarray:
    """``b`` [K, N] (bfloat16 or float32, kept as is) -> [ceil(N / nr), ceil(K / 2), nr, 2]."""
    k, n = b.shape
    panels, pairs = -(-n // nr), -(-k // 2)
    padded = np.zeros((pairs * 2, panels * nr), dtype=b.dtype)
    padded[:k, :n] = b
    # [pairs, 2, panels, nr] -> [panels, pairs, nr, 2]
    return np.ascontiguousarray(padded.reshape(pairs, 2, panels, nr).transpose(2, 0, 3, 1))


def unpack_pairs(bp: np.ndarray, k: int, n: int) -> np.ndarray:
    panels, pairs, nr, _ = bp.shape
    return bp.transpose(1, 3, 0, 2).reshape(pairs * 2, panels * nr)[:k, :n]


def _infer(a: TensorType, bp: TensorType, n: int) -> TensorType:
    if (len(bp.shape) != 4 or len(a.shape) < 2 or bp.shape[3] != 2
            or bp.shape[1] != -(-a.shape[-1] // 2) or bp.shape[0] != -(-n // bp.shape[2])):
        raise ValueError(f"{PAIR_KIND}: packed B {bp.shape} does not match {a.shape} and "
                         f"{n} columns")
    return TensorType(tuple(a.shape[:-1]) + (n,), a.dtype)


def _legalize(a: te.Tensor, bp: te.Tensor, out_type: TensorType, name: str, n: int
              ) -> te.Tensor:
    k = te.reduce_axis(a.shape[-1], "k")
    nr = bp.shape[2]
    tag_reduction(k, PAIR_KIND, (a, bp), n=n, nr=nr)

    def body(*i: te.IndexVar) -> te.Expr:
        col = i[-1]
        w = bp[col // nr, k // 2, col % nr, k % 2]
        return te.sum_of(a[tuple(i[:-1]) + (k,)] * te.cast(w, "float32"), k)

    return te.compute(out_type.shape, body, name=name)


@register_op(PAIR_KIND, COMPLEX, _infer, _legalize, layout=True)
def matmul_bf16p(a: np.ndarray, bp: np.ndarray, n: int) -> np.ndarray:
    b = unpack_pairs(bp, a.shape[-1], n).astype(np.float32)
    return np.matmul(a, b).astype(a.dtype)


# ---- conv2d_bf16p: a convolution by weights in input-channel pairs ------------------------------

CONV_PAIR_KIND = "conv2d_bf16p"


def pack_conv_pairs(w: np.ndarray) -> np.ndarray:
    """``w`` [O, C, KH, KW] (bfloat16 or float32, kept as is) -> ``wp`` [O, ceil(C / 2), KH, KW,
    2] with ``wp[o, c // 2, ky, kx, c % 2] = w[o, c, ky, kx]``, zero past C: each 32-bit word the
    pair (w[o, 2j, ky, kx], w[o, 2j + 1, ky, kx]), the even channel in the low half (the
    operand ``vdpbf16ps`` multiplies by a pair of activation channels, codegen/bf16conv.py)."""
    o, c, kh, kw = w.shape
    padded = np.zeros((o, -(-c // 2) * 2, kh, kw), dtype=w.dtype)
    padded[:, :c] = w
    return np.ascontiguousarray(padded.reshape(o, -1, 2, kh, kw).transpose(0, 1, 3, 4, 2))


def unpack_conv_pairs(wp: np.ndarray, c: int) -> np.ndarray:
    o, pairs, kh, kw, _ = wp.shape
    return wp.transpose(0, 1, 4, 2, 3).reshape(o, pairs * 2, kh, kw)[:, :c]


def _infer_conv(x: TensorType, wp: TensorType, strides=(1, 1), padding=(0, 0, 0, 0), *,
                relations: list) -> TensorType:
    from .nn import _infer_conv2d
    if len(wp.shape) != 5 or wp.shape[4] != 2 or len(x.shape) != 4 \
            or wp.shape[1] != -(-x.shape[1] // 2):
        raise ValueError(f"{CONV_PAIR_KIND}: packed weight {wp.shape} does not match input "
                         f"{x.shape}")
    o, _, kh, kw, _ = wp.shape
    return _infer_conv2d(x, TensorType((o, x.shape[1], kh, kw), wp.dtype), strides, padding,
                         relations=relations)


def _legalize_conv(x: te.Tensor, wp: te.Tensor, out_type: TensorType, name: str,
                   strides=(1, 1), padding=(0, 0, 0, 0)) -> te.Tensor:
    from .layout import _widened
    from .nn import _window_value
    c = x.shape[1]
    _, _, kh, kw, _ = wp.shape
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    tag_reduction(rc, CONV_PAIR_KIND, (x, wp), strides=tuple(strides), padding=tuple(padding))

    def body(n: te.IndexVar, oc: te.IndexVar, y: te.IndexVar, xx: te.IndexVar) -> te.Expr:
        value = _window_value(x, n, rc, y, xx, ry, rx, strides, padding)
        return te.sum_of(value * _widened(wp[oc, rc // 2, ry, rx, rc % 2]), (rc, ry, rx))

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.conv2d_bf16p", COMPLEX, _infer_conv, _legalize_conv, layout=True)
def conv2d_bf16p(x: np.ndarray, wp: np.ndarray, strides=(1, 1),
                 padding=(0, 0, 0, 0)) -> np.ndarray:
    from .nn import conv2d
    w = unpack_conv_pairs(wp, x.shape[1]).astype(x.dtype)
    return conv2d(x, w, strides, padding)
