"""Layout-only operators: the forms ``passes/layout.py`` rewrites a float32 ``matmul`` or
``nn.conv2d`` with a constant weight into, that weight packed once at export into the order a
kernel reads it (``matmul_packed``: column panels; ``nn.conv2d_oc``: blocks of output channels
on the vector lanes, Winograd-transformed ones included; ``nn.conv2d_rows``: blocks of the
register tile's rows). No frontend produces them; each row is registered with ``layout=True``
so the operator table tells them from the model-level operators of ``nn.py``. Each computes
what the operator it replaces computes (its numpy reference unpacks the weight and calls that
operator's), and its ``pack_*`` / ``unpack_*`` pair is the packing's definition."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .nn import _infer_conv2d, _window_value, conv2d
from .registry import COMPLEX, register_op


# ---- matmul with a packed constant B ------------------------------------------------------------
# ``passes/layout.py`` rewrites ``matmul(a, B)`` with a constant 2-D float32 B [K, N] into this op,
# B packed once at export into the column panels the register-blocked kernel reads
# (codegen/contraction/): ``bp`` [ceil(N / nr), K, nr], panel p's row k the nr columns p * nr ..
# contiguous, the last panel zero-filled past N (no masked loads in the reduction).

# nr: the kernel's 6 x 2-vector tile on 8-lane (AVX2) vectors; x86-64-v4 reads the same
# panels, a 16-lane vector each (its 4 x 4 tile: four panels, each a sequential stream)
MATMUL_PANEL = 16


def pack_matmul_b(b: np.ndarray, nr: int = MATMUL_PANEL) -> np.ndarray:
    """``b`` [K, N] -> ``bp`` [ceil(N / nr), K, nr] with ``bp[n // nr, k, n % nr] = b[k, n]``."""
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def unpack_matmul_b(bp: np.ndarray, n: int) -> np.ndarray:
    panels, k, nr = bp.shape
    return bp.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n]


def _infer_matmul_packed(a: TensorType, bp: TensorType, n: int) -> TensorType:
    if len(bp.shape) != 3 or len(a.shape) < 2 or a.shape[-1] != bp.shape[1] \
            or bp.shape[0] != -(-n // bp.shape[2]):
        raise ValueError(f"matmul_packed: packed B {bp.shape} does not match {a.shape} and "
                         f"{n} columns")
    return TensorType(tuple(a.shape[:-1]) + (n,), a.dtype)


def _widened(e: te.Expr) -> te.Expr:
    """A packed weight's element as float32: bfloat16 weights (``--precision bf16``,
    passes/layout.py ``weights_to_bf16``) widen exactly; float32 ones pass through."""
    return te.cast(e, "float32") if e.dtype == "bfloat16" else e


def _legalize_matmul_packed(a: te.Tensor, bp: te.Tensor, out_type: TensorType, name: str,
                            n: int) -> te.Tensor:
    k = te.reduce_axis(a.shape[-1], "k")
    nr = bp.shape[2]
    tag_reduction(k, "matmul_packed", (a, bp), n=n, nr=nr)

    def body(*i: te.IndexVar) -> te.Expr:
        col = i[-1]
        return te.sum_of(a[tuple(i[:-1]) + (k,)] * _widened(bp[col // nr, k, col % nr]), k)

    return te.compute(out_type.shape, body, name=name)


@register_op("matmul_packed", COMPLEX, _infer_matmul_packed, _legalize_matmul_packed,
             layout=True)
def matmul_packed(a: np.ndarray, bp: np.ndarray, n: int) -> np.ndarray:
    return np.matmul(a, unpack_matmul_b(bp, n).astype(a.dtype)).astype(a.dtype)


# ---- conv2d with packed weights (output channels on the vector lanes) ---------------------------
# ``passes/layout.py`` rewrites a float32 ``nn.conv2d`` whose weight is a constant into this
# op, its weight packed once at export for ``codegen/conv_oc.py``: blocks of OC_BLOCK output
# channels, each block's weights ``[cg * kh * kw, OC_BLOCK]`` contiguous (a reduction step's
# OC_BLOCK weights one run of vector loads), the last block zero-filled past ``out_channels``.

OC_BLOCK = 32


def pack_oc_weights(w: np.ndarray) -> np.ndarray:
    """``w`` [O, C, KH, KW] -> ``wp`` [ceil(O / OC_BLOCK), C * KH * KW, OC_BLOCK] with ``wp[o //
    OC_BLOCK, (c * KH + ky) * KW + kx, o % OC_BLOCK] = w[o, c, ky, kx]``: the matmul panels of
    ``w`` as a [C * KH * KW, O] matrix (``pack_matmul_b``)."""
    return pack_matmul_b(w.reshape(w.shape[0], -1).T, OC_BLOCK)


def unpack_oc_weights(wp: np.ndarray, out_channels: int, kernel) -> np.ndarray:
    kh, kw = kernel
    flat = unpack_matmul_b(wp, out_channels).T
    return flat.reshape(out_channels, wp.shape[1] // (kh * kw), kh, kw)


def pack_oc_pairs(w: np.ndarray) -> np.ndarray:
    """``w`` [O, C, KH, KW] (bfloat16, kept as is) -> ``wp`` [ceil(O / OC_BLOCK), ceil(C / 2) *
    KH * KW, OC_BLOCK, 2] with ``wp[o // OC_BLOCK, (c // 2 * KH + ky) * KW + kx, o % OC_BLOCK,
    c % 2] = w[o, c, ky, kx]``, zero past C and O: ``nn.conv2d_oc`` with ``pairs`` (``--precision
    bf16`` on x86-64-v4+bf16): a reduction step's OC_BLOCK 32-bit words, each the pair (w[o, 2j],
    w[o, 2j + 1]) of one output channel, the even channel in the low half (vdpbf16ps's operand
    against a broadcast pair of input channels, codegen/conv_oc.py)."""
    o, c, kh, kw = w.shape
    blocks, cp = -(-o // OC_BLOCK), -(-c // 2)
    padded = np.zeros((blocks * OC_BLOCK, cp * 2, kh, kw), dtype=w.dtype)
    padded[:o, :c] = w
    # [blocks, 32, cp, 2, kh, kw] -> [blocks, cp, kh, kw, 32, 2]
    return np.ascontiguousarray(padded.reshape(blocks, OC_BLOCK, cp, 2, kh, kw).transpose(
        0, 2, 4, 5, 1, 3).reshape(blocks, cp * kh * kw, OC_BLOCK, 2))


def unpack_oc_pairs(wp: np.ndarray, out_channels: int, c: int, kernel) -> np.ndarray:
    kh, kw = kernel
    blocks, steps = wp.shape[:2]
    cp = steps // (kh * kw)
    w = wp.reshape(blocks, cp, kh, kw, OC_BLOCK, 2).transpose(0, 4, 1, 5, 2, 3)
    return w.reshape(blocks * OC_BLOCK, cp * 2, kh, kw)[:out_channels, :c]


def pack_oc_tap_pairs(w: np.ndarray) -> np.ndarray:
    """``w`` [O, C, KH, KW] (bfloat16, kept as is) -> ``wp`` [ceil(O / OC_BLOCK), C * KH *
    ceil(KW / 2), OC_BLOCK, 2] with ``wp[o // OC_BLOCK, (c * KH + ky) * ceil(KW / 2) + kx // 2,
    o % OC_BLOCK, kx % 2] = w[o, c, ky, kx]``, zero past KW and O: ``nn.conv2d_oc`` with
    ``tap_pairs`` (a window's horizontally adjacent taps paired instead of two input channels:
    few, odd input channels, a 7x7 stem of C = 3 computes 8 taps for 7, not 4 channels for 3)."""
    o, c, kh, kw = w.shape
    blocks, kwp = -(-o // OC_BLOCK), -(-kw // 2)
    padded = np.zeros((blocks * OC_BLOCK, c, kh, kwp * 2), dtype=w.dtype)
    padded[:o, :, :, :kw] = w
    # [blocks, 32, c, kh, kwp, 2] -> [blocks, c, kh, kwp, 32, 2]
    return np.ascontiguousarray(padded.reshape(blocks, OC_BLOCK, c, kh, kwp, 2).transpose(
        0, 2, 3, 4, 1, 5).reshape(blocks, c * kh * kwp, OC_BLOCK, 2))


def unpack_oc_tap_pairs(wp: np.ndarray, out_channels: int, c: int, kernel) -> np.ndarray:
    kh, kw = kernel
    kwp = -(-kw // 2)
    blocks = wp.shape[0]
    w = wp.reshape(blocks, c, kh, kwp, OC_BLOCK, 2).transpose(0, 4, 1, 2, 3, 5)
    return w.reshape(blocks * OC_BLOCK, c, kh, kwp * 2)[:out_channels, :, :, :kw]


# Winograd F(2x2, 3x3) (Lavin and Gray, 2016): a 3x3 stride-1 convolution computes each 2x2
# block of outputs from the 4x4 block of inputs under it as Y = A^T [U * V] A, with U = G g G^T
# the 3x3 weights g transformed once at export, V = B^T d B the input block transformed: 16
# products per 2x2 outputs and input channel instead of 36. WINO_P is a left inverse of WINO_G
# (P G = I), so g = P U P^T recovers the weights (the op's numpy reference, its expression).
WINO_G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], dtype=np.float64)
WINO_P = np.array([[1, 0, 0, 0], [0, 1, -1, 0], [0, 0, 0, 1]], dtype=np.float64)


def pack_wino_weights(w: np.ndarray) -> np.ndarray:
    """``w`` [O, C, 3, 3] -> ``wp`` [ceil(O / OC_BLOCK), 16 * C, OC_BLOCK] with ``wp[o //
    OC_BLOCK, (a * 4 + b) * C + c, o % OC_BLOCK] = (G w[o, c] G^T)[a, b]``: for each of the 16
    transform positions, a block's [C, OC_BLOCK] weights contiguous."""
    o, c = w.shape[:2]
    return pack_matmul_b(wino_transform(w).reshape(16 * c, o), OC_BLOCK)


def unpack_wino_weights(wp: np.ndarray, out_channels: int) -> np.ndarray:
    return _wino_untransform(unpack_matmul_b(wp, out_channels).reshape(4, 4, -1, out_channels))


def _wino_untransform(u: np.ndarray) -> np.ndarray:
    """U [4, 4, C, O] (``wino_transform``'s) -> w [O, C, 3, 3] float32 (WINO_P, in float64)."""
    return np.einsum("ia,abco,jb->ocij", WINO_P, u.astype(np.float64), WINO_P).astype(
        np.float32)


def wino_transform(w: np.ndarray) -> np.ndarray:
    """``w`` [O, C, 3, 3] -> U [4, 4, C, O] float32, ``U[a, b, c, o] = (G w[o, c] G^T)[a,
    b]`` (in float64, rounded once)."""
    return np.einsum("ai,ocij,bj->abco", WINO_G, w.astype(np.float64), WINO_G).astype(
        np.float32)


def pack_wino_pairs(u: np.ndarray) -> np.ndarray:
    """``u`` [4, 4, C, O] (``wino_transform``'s, as bfloat16) -> ``wp`` [ceil(O / OC_BLOCK),
    16 * ceil(C / 2), OC_BLOCK, 2] with ``wp[o // OC_BLOCK, (a * 4 + b) * ceil(C / 2) + c //
    2, o % OC_BLOCK, c % 2] = u[a, b, c, o]``, zero past C and O: ``nn.conv2d_oc`` with
    ``winograd`` and ``pairs`` (``--precision bf16``): per transform position, a reduction
    step's OC_BLOCK words (u[.., 2j, o], u[.., 2j + 1, o]), vdpbf16ps's operand against a
    broadcast pair word of the transformed inputs (codegen/conv_oc.py)."""
    _, _, c, o = u.shape
    blocks, cp = -(-o // OC_BLOCK), -(-c // 2)
    padded = np.zeros((16, cp * 2, blocks * OC_BLOCK), dtype=u.dtype)
    padded[:, :c, :o] = u.reshape(16, c, o)
    # [16, cp, 2, blocks, 32] -> [blocks, 16, cp, 32, 2]
    return np.ascontiguousarray(padded.reshape(16, cp, 2, blocks, OC_BLOCK).transpose(
        3, 0, 1, 4, 2).reshape(blocks, 16 * cp, OC_BLOCK, 2))


def unpack_wino_pairs(wp: np.ndarray, out_channels: int, c: int) -> np.ndarray:
    blocks, cp = wp.shape[0], wp.shape[1] // 16
    u = wp.reshape(blocks, 16, cp, OC_BLOCK, 2).transpose(1, 2, 4, 0, 3).reshape(
        4, 4, cp * 2, blocks * OC_BLOCK)[:, :, :c, :out_channels]
    return _wino_untransform(u)


def _infer_conv2d_oc(x: TensorType, wp: TensorType, out_channels: int, kernel=(1, 1),
                     strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                     groups: int = 1, winograd: bool = False, pairs: bool = False,
                     tap_pairs: bool = False, *, relations: list) -> TensorType:
    n, c, h, wd = x.shape
    kh, kw = kernel
    rows = 16 * (-(-c // 2) if pairs else c) if winograd else \
        (-(-c // 2) if pairs else c) * kh * kw
    if tap_pairs:
        rows = c * kh * -(-kw // 2)
    if winograd and (tuple(kernel) != (3, 3) or tuple(strides) != (1, 1) or tap_pairs):
        raise ValueError(f"conv2d_oc: Winograd weights for a {kernel} window, strides {strides}")
    want = (-(-out_channels // OC_BLOCK), rows, OC_BLOCK) + ((2,) if pairs else ())
    if groups != 1 or tuple(wp.shape) != want:
        raise ValueError(f"conv2d_oc: packed weight {wp.shape} does not match input {x.shape}, "
                         f"{out_channels} output channels, window {kernel}")
    return _infer_conv2d(x, TensorType((out_channels, c, kh, kw), wp.dtype), strides, padding,
                         dilation, groups, relations=relations)


def _legalize_conv2d_oc(x: te.Tensor, wp: te.Tensor, out_type: TensorType, name: str,
                        out_channels: int, kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0),
                        dilation=(1, 1), groups: int = 1, winograd: bool = False,
                        pairs: bool = False, tap_pairs: bool = False) -> te.Tensor:
    c = x.shape[1]
    kh, kw = kernel
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    extra = {"pairs": True} if pairs else {}   # (fp32 and unpaired bf16 tags as before)
    if tap_pairs:
        extra["tap_pairs"] = True
    tag_reduction(rc, "conv2d_oc", (x, wp), strides=tuple(strides), padding=tuple(padding),
                  kernel=(kh, kw), out_channels=out_channels, winograd=bool(winograd), **extra)

    def wino_weight(oc: te.IndexVar) -> te.Expr:   # g = P U P^T, P's rows as (a, sign) terms
        terms = [[(0, 1.0)], [(1, 1.0), (2, -1.0)], [(3, 1.0)]]

        def row(i: int, j: int) -> te.Expr:
            value = None
            for a, sa in terms[i]:
                for b_, sb in terms[j]:
                    u = _widened(wp[oc // OC_BLOCK, (a * 4 + b_) * -(-c // 2) + rc // 2,
                                    oc % OC_BLOCK, rc % 2]) if pairs else \
                        _widened(wp[oc // OC_BLOCK, (a * 4 + b_) * c + rc, oc % OC_BLOCK])
                    u = u if sa * sb > 0 else u * -1.0
                    value = u if value is None else value + u
            return value

        def by(var: te.IndexVar, pick) -> te.Expr:
            return te.if_then_else(te.eq(var, 0), pick(0),
                                   te.if_then_else(te.eq(var, 1), pick(1), pick(2)))

        return by(ry, lambda i: by(rx, lambda j: row(i, j)))

    def body(n: te.IndexVar, oc: te.IndexVar, y: te.IndexVar, xx: te.IndexVar) -> te.Expr:
        value = _window_value(x, n, rc, y, xx, ry, rx, strides, padding)
        if tap_pairs:
            weight = _widened(wp[oc // OC_BLOCK, (rc * kh + ry) * -(-kw // 2) + rx // 2,
                                 oc % OC_BLOCK, rx % 2])
        elif winograd:
            weight = wino_weight(oc)
        elif pairs:
            weight = _widened(wp[oc // OC_BLOCK, ((rc // 2) * kh + ry) * kw + rx,
                                 oc % OC_BLOCK, rc % 2])
        else:
            weight = _widened(wp[oc // OC_BLOCK, (rc * kh + ry) * kw + rx, oc % OC_BLOCK])
        return te.sum_of(value * weight, (rc, ry, rx))

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.conv2d_oc", COMPLEX, _infer_conv2d_oc, _legalize_conv2d_oc, layout=True)
def conv2d_oc(x: np.ndarray, wp: np.ndarray, out_channels: int, kernel=(1, 1), strides=(1, 1),
              padding=(0, 0, 0, 0), dilation=(1, 1), groups: int = 1,
              winograd: bool = False, pairs: bool = False, tap_pairs: bool = False
              ) -> np.ndarray:
    wp = wp.astype(x.dtype)   # bfloat16 weights (--precision bf16) widen exactly
    if tap_pairs:
        return conv2d(x, unpack_oc_tap_pairs(wp, out_channels, x.shape[1], kernel), strides,
                      padding, dilation, groups)
    if winograd and pairs:
        return conv2d(x, unpack_wino_pairs(wp, out_channels, x.shape[1]), strides, padding,
                      dilation, groups)
    if pairs:
        return conv2d(x, unpack_oc_pairs(wp, out_channels, x.shape[1], kernel), strides,
                      padding, dilation, groups)
    w = unpack_wino_weights(wp, out_channels) if winograd else \
        unpack_oc_weights(wp, out_channels, kernel)
    return conv2d(x, w, strides, padding, dilation, groups)


# ---- conv2d with weights packed in the register-blocked kernel's row blocks ---------------------
# ``passes/layout.py`` rewrites a float32 ``nn.conv2d`` with a constant weight that the
# register-blocked kernel (codegen/contraction/) computes into this op: the weight [O, C, KH, KW] as
# blocks of ``rows`` output channels (the kernel's register tile rows), each block's weights
# ``[C * KH * KW, rows]``, a reduction step's ``rows`` weights side by side, the last block
# zero-filled past ``out_channels``. The kernel then reads one stream of weights per block row
# instead of ``rows`` strided ones.

def pack_row_weights(w: np.ndarray, rows: int) -> np.ndarray:
    """``w`` [O, C, KH, KW] -> ``wp`` [ceil(O / rows), C * KH * KW, rows] with ``wp[o // rows,
    (c * KH + ky) * KW + kx, o % rows] = w[o, c, ky, kx]``."""
    o = w.shape[0]
    k = int(np.prod(w.shape[1:]))
    blocks = -(-o // rows)
    padded = np.zeros((blocks * rows, k), dtype=w.dtype)
    padded[:o] = w.reshape(o, k)
    return np.ascontiguousarray(padded.reshape(blocks, rows, k).transpose(0, 2, 1))


def unpack_row_weights(wp: np.ndarray, out_channels: int, in_channels: int,
                       kernel=(1, 1)) -> np.ndarray:
    blocks, k, rows = wp.shape
    return wp.transpose(0, 2, 1).reshape(blocks * rows, k)[:out_channels].reshape(
        out_channels, in_channels, *kernel)


def _infer_conv2d_rows(x: TensorType, wp: TensorType, out_channels: int, kernel=(1, 1),
                       rows: int = 4, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                       groups: int = 1, *, relations: list) -> TensorType:
    c = x.shape[1]
    kh, kw = kernel
    if (groups != 1 or tuple(dilation) != (1, 1)
            or tuple(wp.shape) != (-(-out_channels // rows), c * kh * kw, rows)):
        raise ValueError(f"conv2d_rows: packed weight {wp.shape} does not match input {x.shape}, "
                         f"{out_channels} output channels, window {kernel}, {rows} rows")
    return _infer_conv2d(x, TensorType((out_channels, c, kh, kw), wp.dtype), strides, padding,
                         dilation, groups, relations=relations)


def _legalize_conv2d_rows(x: te.Tensor, wp: te.Tensor, out_type: TensorType, name: str,
                          out_channels: int, kernel=(1, 1), rows: int = 4, strides=(1, 1),
                          padding=(0, 0, 0, 0), dilation=(1, 1), groups: int = 1) -> te.Tensor:
    c = x.shape[1]
    kh, kw = kernel
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    tag_reduction(rc, "conv2d_rows", (x, wp), strides=tuple(strides), padding=tuple(padding),
                  dilation=(1, 1), groups=1, out_channels=out_channels, kernel=(kh, kw),
                  rows=rows)

    def body(n: te.IndexVar, oc: te.IndexVar, y: te.IndexVar, xx: te.IndexVar) -> te.Expr:
        value = _window_value(x, n, rc, y, xx, ry, rx, strides, padding)
        return te.sum_of(value * _widened(wp[oc // rows, (rc * kh + ry) * kw + rx, oc % rows]),
                         (rc, ry, rx))

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.conv2d_rows", COMPLEX, _infer_conv2d_rows, _legalize_conv2d_rows,
             layout=True)
def conv2d_rows(x: np.ndarray, wp: np.ndarray, out_channels: int, kernel=(1, 1), rows: int = 4,
                strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                groups: int = 1) -> np.ndarray:
    w = unpack_row_weights(wp, out_channels, x.shape[1], kernel).astype(x.dtype)
    return conv2d(x, w, strides, padding, dilation, groups)
