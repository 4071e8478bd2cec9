"""``qconv2d_quads``: a ``qconv2d`` whose int8 weights are stored in the layout the quad
kernels' inner loop reads (``vpdpbusd`` on x86-64-v4+vnni, ``sdot`` on aarch64+dotprod;
codegen/qgemm.py), packed once at export instead of on every call.

``passes/quad_weights.py`` makes it from a ``qconv2d`` (ops/qlinear.py) with constant int8
weights, x zero point and bias when every level of the bundle runs the quad kernel:

- the weights ``wq [ot, taps * cg, 6, 4]`` int8 (cg = ceil(C / 4) channel quads; ``wq[g, t *
  cg + q, r, e] = w[6g + r, 4q + e, ky, kx]``, tap t = ky * KW + kx, zero past C): each 6-row
  tile's steps, one int32 word per output channel and step, the 4 channels of a quad in its
  bytes, which is what the kernel broadcasts against a vector of 8 pixels' quads;
- the quad kernels read x shifted by ``shift`` (``vpdpbusd`` multiplies uint8: int8 x + 128;
  ``sdot`` int8: uint8 x - 128; else 0) and pad with x's zero point shifted the same way
  (zp' = x_zp + shift), so each output's sum is sum (x' w) = sum (x - x_zp) w + zp' sum w. The
  correction zp' * sum_{c, ky, kx} w[o] is folded into the bias at export: ``bias' = bias - zp'
  sum w`` (int32, wrapping like the kernel's accumulators, so the results are the same bits).

``oc_lanes`` (x86 quad kernels, small output planes; passes/quad_weights.py ``use_oc_lanes``):
the weights are ``wq [ceil(O / 16), taps * cg, 16, 4]`` instead, 16 output channels' quads per
step, which the channel-lane kernel loads as two vectors of 8 output channels and multiplies by
one pixel's broadcast quad (codegen/qgemm_conv.py ``_emit_oc_lanes``): no plane columns past a
row's last output computed. The folded bias is the same.

The value is qconv2d's: ``acc = sum (x' w) + bias'``, then the same requantize epilogue and
optional ``lut8`` table.

Full-range weights on x86 levels without VNNI (``split``, passes/quad_weights.py): ``vpmaddubsw``
adds the two products of a byte pair (channels 4q, 4q+1 or 4q+2, 4q+3 of one tap and output
channel; uint8 x' in [0, 255], int8 w) into one int16 with saturation, which cannot saturate
iff 255 (max(w0, 0) + max(w1, 0)) <= 32767 and 255 (min(w0, 0) + min(w1, 0)) >= -32768
(``pair_overflow``): pairs of opposite signs, or same-sign pairs with |w0| + |w1| <= 128.
``split_quads`` writes w = main + residual, both within that bound (a pair over it keeps a sum
of +-128 in ``wq``, the rest in the residual), and keeps the residual only for the *words*
(output channel, step) that have one: two more inputs after y_zp, before the table,
``res_index`` int32 [6 ot + 1 + nnz] (pointers per output channel row ``ptr[oc] .. ptr[oc +
1]``, then each word's step j) and ``res_quads`` int8 [nnz, 4] (the words).
The kernel runs its main loop on ``wq``, then per row of its tile a short loop over that
row's listed words (finer than the tile's blocks: one word costs its row's two products, not
the tile's twelve).

Full-range weights in [-127, 127] on the same levels, by the sign kernel instead (``signed_x``,
``CompileOptions.conv_signed_x``, off by default): the planes hold *int8* x (``shift`` -128 for
uint8 x, 0 for int8 x, as for ``sdot``; the bias folded with that zero point), and the kernel
multiplies ``vpmaddubsw``(|x|, sign(w, x)) (``vpabsb``, ``vpsignb``: -w where x < 0, 0 where
x = 0): |x| <= 128 times |w| <= 127, so a pair's sum stays within 2 x 128 x 127 = 32512 and
never saturates, whatever the weights; no residual; pixel or channel lanes. Exact, but on the AVX2
host measured 1.3-1.9x the 7-bit kernel's time (``vpsignb`` competes with the multiplies:
docs/performance.md), so it is for comparison and for hosts where that differs."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .qlinear import (CONV_ROWS, _apply_table, _epilogue, _infer_qconv2d, _lookup, _out_size,
                      _requantize, table_hints)
from .registry import OPAQUE, register_op

QUADS_KIND = "qconv2d_quads"
OC_LANE_ROWS = 16   # output channels per step of the channel-lane layout (two 8-lane vectors)


def quad_rows(oc_lanes: bool) -> int:
    """Output channels per weight tile: the pixel-lane kernel's 6 register rows, or the
    channel-lane kernel's 16 lanes."""
    return OC_LANE_ROWS if oc_lanes else CONV_ROWS


def pairs_to_quads(wk: np.ndarray, taps: int) -> np.ndarray:
    """qconv2d's int8 k-pair weights [ot, taps * cp, 6, 2] -> the quads [ot, taps * cg, 6, 4]
    (a zero pair after an odd cp)."""
    ot, steps = wk.shape[:2]
    cp = steps // taps
    cg = -(-cp // 2)
    pairs = np.zeros((ot, taps, 2 * cg, CONV_ROWS, 2), wk.dtype)
    pairs[:, :, :cp] = wk.reshape(ot, taps, cp, CONV_ROWS, 2)
    quads = pairs.reshape(ot, taps, cg, 2, CONV_ROWS, 2).transpose(0, 1, 2, 4, 3, 5)
    return np.ascontiguousarray(quads.reshape(ot, taps * cg, CONV_ROWS, 4))


def quads_to_oc_lanes(wq: np.ndarray, o: int) -> np.ndarray:
    """The 6-row quads [ot, taps * cg, 6, 4] -> the channel-lane layout [ceil(O / 16),
    taps * cg, 16, 4] (``wq[g, t * cg + q, r, e] = w[16g + r, 4q + e, ky, kx]``, zero past O
    and C)."""
    steps = wq.shape[1]
    rows = -(-o // OC_LANE_ROWS) * OC_LANE_ROWS
    full = np.zeros((rows, steps, 4), wq.dtype)
    full[:o] = wq.transpose(0, 2, 1, 3).reshape(-1, steps, 4)[:o]
    t = full.reshape(rows // OC_LANE_ROWS, OC_LANE_ROWS, steps, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(t)


def unpack_quads(wq: np.ndarray, o: int, c: int, kh: int, kw: int) -> np.ndarray:
    """The quads (either layout: 6 or 16 rows per tile) back to weights [O, C, KH, KW]."""
    ot, steps, rows = wq.shape[:3]
    cg = steps // (kh * kw)
    t = wq.reshape(ot, kh * kw, cg, rows, 4).transpose(0, 3, 1, 2, 4)
    return t.reshape(ot * rows, kh, kw, 4 * cg).transpose(0, 3, 1, 2)[:o, :c]


def pair_overflow(w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """Where ``vpmaddubsw``'s int16 sum x0 w0 + x1 w1 can saturate for some uint8 x0, x1."""
    a, b = np.asarray(w0, np.int64), np.asarray(w1, np.int64)
    top = 255 * (np.maximum(a, 0) + np.maximum(b, 0))
    low = 255 * (np.minimum(a, 0) + np.minimum(b, 0))
    return (top > 32767) | (low < -32768)


def split_quads(wq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quads ``wq`` [ot, steps, 6, 4] -> (main quads of the same shape, ``res_index``,
    ``res_quads``; module docstring): each pair over the bound keeps +-128 in main (|m0|, |m1|
    <= |w0|, |w1|), the rest (|r0 + r1| <= 126) in the residual, listed by word (output
    channel row 6 g + r, step j) wherever it is not zero."""
    w = wq.astype(np.int64).reshape(*wq.shape[:3], 2, 2)
    a, b = w[..., 0], w[..., 1]
    over = pair_overflow(a, b)
    sign = np.where(a < 0, -1, 1)
    sa, sb = sign * a, sign * b                     # both > 0 where over
    m0 = np.minimum(sa, 128 - np.minimum(sb, 64))
    main = w.copy()
    main[..., 0] = np.where(over, sign * m0, a)
    main[..., 1] = np.where(over, sign * (128 - m0), b)
    res = (w - main).reshape(wq.shape)
    main = main.reshape(wq.shape)
    assert not pair_overflow(main[..., 0::2], main[..., 1::2]).any()
    assert not pair_overflow(res[..., 0::2], res[..., 1::2]).any()
    rows = res.transpose(0, 2, 1, 3).reshape(-1, wq.shape[1], 4)    # [6 ot, steps, 4]
    words = rows.any(axis=2)
    ptr = np.concatenate([[0], np.cumsum(words.sum(axis=1))])
    oc, j = np.nonzero(words)                       # by output channel row, then step
    index = np.concatenate([ptr, j]).astype(np.int32)
    return main.astype(np.int8), index, rows[oc, j].astype(np.int8)


def word_share(wq: np.ndarray, o: int | None = None) -> float:
    """The share of (output channel, step) words of quads ``wq`` that ``split_quads`` lists
    (what its residual loops cost against the main loop), over the first ``o`` channels."""
    w = wq.reshape(*wq.shape[:3], 2, 2)
    over = pair_overflow(w[..., 0], w[..., 1]).any(axis=3)          # [ot, steps, 6]
    rows = over.transpose(0, 2, 1).reshape(-1, wq.shape[1])[:o]
    return float(rows.mean()) if rows.size else 0.0


def with_residual(wq: np.ndarray, res_index: np.ndarray, res_quads: np.ndarray) -> np.ndarray:
    """The main quads plus the listed residual words, as int16 quads (the weights)."""
    out = wq.astype(np.int16)
    n = wq.shape[0] * CONV_ROWS
    ptr, steps = res_index[:n + 1], res_index[n + 1:]
    oc = np.repeat(np.arange(n), np.diff(ptr))
    out[oc // CONV_ROWS, steps, oc % CONV_ROWS] += res_quads.astype(np.int16)
    return out


def _split_inputs(table: tuple, split: bool) -> tuple[tuple, tuple]:
    """(res_index, res_quads) or (), and the lut table or () from the inputs after y_zp."""
    return (table[:2], table[2:]) if split else ((), table)


def folded_bias(bias: np.ndarray, wq: np.ndarray, zp_shifted: int) -> np.ndarray:
    """``bias - zp' * sum w`` per output channel, int32 with wrap-around (the kernel's)."""
    o = bias.shape[0]
    wsum = wq.astype(np.int64).sum(axis=(1, 3)).reshape(-1)[:o]
    folded = bias.astype(np.int64) - int(zp_shifted) * wsum
    return ((folded + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def _infer(x: TensorType, wq: TensorType, x_zp: TensorType, bias: TensorType,
           multiplier: TensorType, y_zp: TensorType, *table: TensorType, shift: int = 0,
           w7: bool = False, oc_lanes: bool = False, split: bool = False,
           signed_x: bool = False, **attrs) -> TensorType:
    c = x.shape[1]
    res, table = _split_inputs(table, split)
    if split:
        index, quads = (res + (None, None))[:2]
        n = wq.shape[0] * CONV_ROWS
        if (index is None or quads is None or index.dtype != "int32" or len(index.shape) != 1
                or quads.dtype != "int8" or len(quads.shape) != 2 or quads.shape[1] != 4
                or index.shape[0] != n + 1 + quads.shape[0]):
            raise ValueError(f"{QUADS_KIND}: split residual inputs do not fit {n} rows")
        if oc_lanes:
            raise ValueError(f"{QUADS_KIND}: split weights are in 6-row tiles, not oc_lanes")
    if signed_x and (split or not w7 or shift != (-128 if x.dtype == "uint8" else 0)):
        raise ValueError(f"{QUADS_KIND}: signed_x takes unsplit w7 quads of int8 planes "
                         f"(shift {shift}, split {split})")
    kh, kw = attrs.get("kernel", (1, 1))
    o = attrs.get("out_channels", 0)
    rows = quad_rows(oc_lanes)
    if (wq.dtype != "int8" or len(wq.shape) != 4 or wq.shape[0] != -(-o // rows)
            or wq.shape[1] != kh * kw * -(-c // 4) or tuple(wq.shape[2:]) != (rows, 4)):
        raise ValueError(f"{QUADS_KIND}: int8 quads {wq.dtype} {wq.shape} do not fit x "
                         f"{x.shape}, {o} outputs, kernel {(kh, kw)}")
    if shift not in (-128, 0, 128):
        raise ValueError(f"{QUADS_KIND}: shift {shift} is none of -128, 0, 128")
    pairs = TensorType((-(-o // CONV_ROWS), kh * kw * -(-c // 2), CONV_ROWS, 2), "int8")
    return _infer_qconv2d(x, pairs, x_zp, bias, multiplier, y_zp, *table, **attrs)


def _legalize(x: te.Tensor, wq: te.Tensor, x_zp: te.Tensor, bias: te.Tensor,
              multiplier: te.Tensor, y_zp: te.Tensor, *table: te.Tensor,
              out_type: TensorType, name: str, out_channels: int = 0, kernel=(1, 1),
              strides=(1, 1), padding=(0, 0, 0, 0), dtype: str = "uint8", relu: bool = False,
              shift: int = 0, w7: bool = False, oc_lanes: bool = False,
              split: bool = False, signed_x: bool = False, table_cols=None) -> te.Tensor:
    _, c, h, w = x.shape
    kh, kw = kernel
    cg = -(-c // 4)
    rows = quad_rows(oc_lanes)
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    # the kind codegen/qgemm.py emits, with the attributes that say the weights are quads
    tag_reduction(rc, "qconv2d", (x, wq, x_zp, bias, multiplier, y_zp) + table,
                  out_channels=out_channels, kernel=tuple(kernel), strides=tuple(strides),
                  padding=tuple(padding), dtype=dtype, relu=relu, quads=True, shift=shift,
                  w7=w7, oc_lanes=oc_lanes, split=split,
                  **({"signed_x": True} if signed_x else {}),   # others' tags as before
                  **table_hints(table_cols))
    res, table = _split_inputs(table, split)

    def clamp(i, size):
        return te.minimum(te.maximum(i, 0), size - 1)

    def acc_body(b, oc, oy, ox):
        iy = oy * strides[0] - padding[0] + ry
        ix = ox * strides[1] - padding[1] + rx
        inside = te.logical_and(te.logical_and(iy >= 0, iy < h), te.logical_and(ix >= 0, ix < w))
        zp = te.cast(x_zp[()], "int32") + te.const(shift, "int32")
        xv = te.if_then_else(inside, te.cast(x[b, rc, clamp(iy, h), clamp(ix, w)], "int32")
                             + te.const(shift, "int32"), zp)
        wv = wq[oc // rows, (ry * kw + rx) * cg + rc // 4, oc % rows, rc % 4]
        return te.sum_of(xv * te.cast(wv, "int32"), (rc, ry, rx))

    acc = te.compute(out_type.shape, acc_body, name=name + "_acc", dtype="int32")
    if res:
        acc = _residual_acc(acc, x, x_zp, *res, kernel, strides, padding, shift, name)
    q = _epilogue(acc, bias, multiplier, y_zp, 1, out_type.shape,
                  name + "_q" if table else name, dtype, relu)
    return _lookup(q, table, 1, name)


def _residual_acc(acc: te.Tensor, x: te.Tensor, x_zp: te.Tensor, index: te.Tensor,
                  quads: te.Tensor, kernel, strides, padding, shift: int,
                  name: str) -> te.Tensor:
    """``acc`` plus the listed residual words' products (``split``): output channel oc sums
    its words e (ptr[oc] <= e < ptr[oc + 1]), each at its step's tap and quad."""
    _, c, h, w = x.shape
    kh, kw = kernel
    cg = -(-c // 4)
    n = index.shape[0] - 1 - quads.shape[0]
    re, ri = te.reduce_axis(quads.shape[0], "re"), te.reduce_axis(4, "ri")

    def clamp(i, size):
        return te.minimum(te.maximum(i, 0), size - 1)

    def at(i):
        return te.cast(index[i], "int64")

    def body(b, oc, oy, ox):
        mine = te.logical_and(re >= at(oc), re < at(oc + 1))
        step = at(re + n + 1)
        tap, ch = step // cg, (step % cg) * 4 + ri
        iy = oy * strides[0] - padding[0] + tap // kw
        ix = ox * strides[1] - padding[1] + tap % kw
        inside = te.logical_and(te.logical_and(iy >= 0, iy < h), te.logical_and(ix >= 0, ix < w))
        zp = te.cast(x_zp[()], "int32") + te.const(shift, "int32")
        xv = te.if_then_else(inside, te.cast(x[b, clamp(ch, c), clamp(iy, h), clamp(ix, w)],
                                             "int32") + te.const(shift, "int32"), zp)
        wv = te.if_then_else(mine, te.cast(quads[re, ri], "int32"),
                             te.const(0, "int32"))
        return acc[b, oc, oy, ox] + te.sum_of(xv * wv, (re, ri))

    return te.compute(acc.shape, body, name=name + "_acc_res", dtype="int32")


@register_op(QUADS_KIND, OPAQUE, _infer, _legalize)
def qconv2d_quads(x: np.ndarray, wq: np.ndarray, x_zp: np.ndarray, bias: np.ndarray,
                  multiplier: np.ndarray, y_zp: np.ndarray, *table: np.ndarray,
                  out_channels: int = 0, kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0),
                  dtype: str = "uint8", relu: bool = False, shift: int = 0,
                  w7: bool = False, oc_lanes: bool = False, split: bool = False,
                  signed_x: bool = False, table_cols=None) -> np.ndarray:
    b, c, h, w = x.shape
    kh, kw = kernel
    o = out_channels
    res, table = _split_inputs(table, split)
    full = with_residual(wq, *res) if res else wq
    wd = unpack_quads(full, o, c, kh, kw).astype(np.int64)
    zp = int(x_zp) + shift
    xp = np.pad(x.astype(np.int64) + shift, ((0, 0), (0, 0), (padding[0], padding[2]),
                                             (padding[1], padding[3])), constant_values=zp)
    oh = _out_size(h, kh, strides[0], padding[0], padding[2])
    ow = _out_size(w, kw, strides[1], padding[1], padding[3])
    acc = np.zeros((b, o, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky:ky + strides[0] * (oh - 1) + 1:strides[0],
                       kx:kx + strides[1] * (ow - 1) + 1:strides[1]]
            acc += np.einsum("nchw,oc->nohw", patch, wd[:, :, ky, kx])
    acc += bias.reshape(1, o, 1, 1)
    acc = (acc + (1 << 31)) % (1 << 32) - (1 << 31)   # int32 wrap-around, as the kernel's
    off = y_zp.reshape(1, o, 1, 1) if dtype == "float32" else y_zp
    mult = multiplier if multiplier.shape == () else multiplier.reshape(1, o, 1, 1)
    return _apply_table(_requantize(acc, mult, off, dtype, relu), table)

