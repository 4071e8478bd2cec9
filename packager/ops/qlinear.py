"""Integer kernels the quantized-pattern fusion (``passes/fuse_qdq.py``) emits.

Both compute, in int32 (exact; wrapping like ONNX Runtime's int32 accumulators),

    acc = sum_k (x - x_zp) * wd + bias            wd = w - w_zp (folded at export)
    y   = saturate(round_half_even(float32(acc) * multiplier) + y_zp)

which is ONNX Runtime's QLinearMatMul / QGemm / QLinearConv requantization (MLAS
``MlasRequantizeOutput``); ``multiplier`` is x_scale * w_scale / y_scale in float32.

``qmatmul(x, wp, x_zp, bias, multiplier, y_zp, n=N, dtype=D)``: x int8/uint8 ``[..., M, K]``;
wp the weights ``wd [K, N]`` *packed* for the integer GEMM (``pack_weights``): int8 (or int16
when ``w - w_zp`` does not fit int8) ``[ceil(N/8), ceil(K/2), 8, 2]``, ``wp[p, j, l, t] =
wd[2j + t, 8p + l]`` zero-padded, so one 16-byte row is the k-pair-interleaved operand of
``vpmaddwd`` for 8 output columns (with ``w_offset=c``, an attribute, the packed values are
wd - c: ``pack_weights_offset`` keeps uint8-minus-zero-point weights int8); x_zp int32 ``()``
(or an int8/uint8 scalar, which may be computed at run time: a DynamicQuantizeLinear's zero
point), bias int32 and multiplier float32 ``[8 * ceil(N/8)]`` (zero-padded; the multiplier may
also be a float32 scalar, run-time too), y_zp float32 ``()``. Result ``[..., M, N]`` of dtype D.

``qconv2d(x, wk, x_zp, bias, multiplier, y_zp, out_channels, kernel, strides, padding,
dtype)``: x int8/uint8 ``[B, C, H, W]``; wk the weights ``wd = w - w_zp [O, C, KH, KW]`` packed
by ``pack_conv_weights``: int8/int16 ``[ceil(O/6), KH*KW*ceil(C/2), 6, 2]``, ``wk[o // 6,
(ky*KW + kx) * ceil(C/2) + c // 2, o % 6, c % 2] = wd[o, c, ky, kx]`` zero-padded (the
broadcast operand of 6 output channels' rows, one reduction step's words adjacent); bias /
multiplier ``[O]`` (the multiplier may be a float32 scalar; x_zp and both may be computed at
run time, as with ``qmatmul``); padding reads x_zp (contributes zero); groups 1, dilation 1.
Result ``[B, O, OH, OW]``. An optional 7th input, a ``lut8`` table ``[O or 1, 256]``
(``passes/quantize_lut.py`` folds one in), maps each 8-bit result through its channel's row.
With ``winograd`` (3x3 stride 1, x86 sets without VNNI: passes/quad_weights.py) wk holds the
weights transformed for the exact integer Winograd F(2x2, 3x3) kernel instead, U' = (2G) wd
(2G)^T packed as a 4x4 window's 16 positions, int16 ``[ceil(O/6), 16*ceil(C/2), 6, 2]``
(``pack_winograd_weights``; wd = L U' L^T / 4 exactly, ``unpack_winograd_weights``).

``qdwconv2d(x, wf, x_zp, bias, multiplier, y_zp, kernel, strides, padding, dtype, relu,
bias_in_float)``: depthwise (one input channel per output channel), x int8/uint8 ``[B, C, H,
W]``, wf = w - w_zp as float32 ``[C, KH*KW]``, x_zp int32 ``()``, bias int32 ``[C]``,
multiplier float32 ``[C]``; the sums are exact in float32 (``passes/fuse_qdq_dw.py`` checks),
the bias added in int32; ``bias_in_float``: it may join the float32 sums (still exact);
``weights_int8``: every weight fits int8 (the VNNI kernel takes them as vpdpbusd quads).
Three more inputs ``table, t_scale, t_zp`` (``passes/quantize_lut.py``
``fold_tables_into_depthwise``: the activation after the layer and the DequantizeLinear after
it): the 8-bit result through ``lut8``'s table (``[C or 1, 256]``, its row per channel or the
one row), dequantized, ``float32(t - t_zp) * t_scale``; the result is float32. ``col_lo`` /
``col_hi``: the table's columns outside which every row is constant (hints for the kernel;
``qconv2d``'s ``table_cols`` say the same of its table).

``lut8(x, table, axis)``: ``table[c, x (+128 for int8)]`` per element, c its index on ``axis``
(-1: one row).

With ``dtype="float32"`` (a quantized product whose result stays float: mlcpack's own
``--quantize int8`` graphs dequantize every product's inputs only) the last argument is a
per-channel float32 offset instead of y_zp, and the result is

    y   = float32(acc) * multiplier + offset           [then max(y, 0) with relu=True]

(float32 operations in that order, no fused multiply-add).

Both ops are opaque: their legalized loop nests are correct (the generic fallback) and carry a
reduction tag that hands the whole function to the integer GEMM kernel (``codegen/qgemm.py``).
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .elementwise import scalar_of
from .quant import saturation_range
from .registry import INJECTIVE, OPAQUE, register_op

PANEL = 8   # output columns per packed weight panel (one 8 x int32 vector)


def pack_weights(wd: np.ndarray) -> np.ndarray:
    """``wd`` [K, N] (integers within int16) -> the packed layout above, int8 when every value
    fits int8, else int16."""
    k, n = wd.shape
    k2, npn = -(-k // 2), -(-n // PANEL)
    dtype = np.int8 if wd.min(initial=0) >= -128 and wd.max(initial=0) <= 127 else np.int16
    full = np.zeros((2 * k2, npn * PANEL), dtype)   # in the stored dtype: 4x less to move
    full[:k, :n] = wd
    # [k2, 2, npn, 8] -> [npn, k2, 8, 2]
    return np.ascontiguousarray(full.reshape(k2, 2, npn, PANEL).transpose(2, 0, 3, 1))


def pack_weights_offset(wd: np.ndarray) -> tuple[np.ndarray, int]:
    """(``pack_weights(wd - c)``, c): c = 0 when ``wd`` fits int8 or cannot be shifted into it,
    else the constant that shifts every value into int8 (possible when max - min <= 255: uint8
    weights minus a zero point, e.g. ONNX Runtime's dynamically quantized MatMulInteger),
    so the weights stay int8 instead of doubling to int16; ``qmatmul``'s ``w_offset=c`` adds
    c * sum_k (x - x_zp) back per row."""
    lo, hi = int(wd.min(initial=0)), int(wd.max(initial=0))
    if (lo >= -128 and hi <= 127) or hi - lo > 255:
        return pack_weights(wd), 0
    c = hi - 127
    # int16 arithmetic where wd and c fit it (the exact result, within int8, does too)
    narrow = -(1 << 15) + 255 <= lo and hi <= (1 << 15) - 1
    wide = np.int16 if narrow else np.int64
    return pack_weights(wd.astype(wide, copy=False) - wide(c)), c


CONV_ROWS = 6   # output channels per packed convolution weight tile (the kernel's register rows)


def pack_conv_weights(wd: np.ndarray) -> np.ndarray:
    """``wd`` [O, C, KH, KW] -> the packed layout of ``qconv2d`` (int8 when it fits)."""
    o, c, kh, kw = wd.shape
    cp, ot = -(-c // 2), -(-o // CONV_ROWS)
    dtype = np.int8 if wd.min(initial=0) >= -128 and wd.max(initial=0) <= 127 else np.int16
    full = np.zeros((ot * CONV_ROWS, 2 * cp, kh, kw), dtype)
    full[:o, :c] = wd
    t = full.transpose(0, 2, 3, 1).reshape(ot, CONV_ROWS, kh * kw, cp, 2)
    return np.ascontiguousarray(t.transpose(0, 2, 3, 1, 4).reshape(ot, kh * kw * cp,
                                                                   CONV_ROWS, 2))


def unpack_conv_weights(wk: np.ndarray, o: int, c: int, kh: int, kw: int) -> np.ndarray:
    ot, steps = wk.shape[:2]
    cp = steps // (kh * kw)
    t = wk.reshape(ot, kh * kw, cp, CONV_ROWS, 2).transpose(0, 3, 1, 2, 4)
    return t.reshape(ot * CONV_ROWS, kh, kw, 2 * cp).transpose(0, 3, 1, 2)[:o, :c]


# Exact integer Winograd F(2x2, 3x3) (``qconv2d`` with ``winograd``; codegen/qgemm_conv.py
# ``_emit_wino``): the weights transformed at export by 2G (U' = (2G) g (2G)^T = 4 G g G^T,
# integral, |U'| <= 9 * 128 = 1152: int16), and back by L (g = L U' L^T / 4, exact)
WINO_G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], np.int64)
WINO_L = np.array([[1, 0, 0, 0], [0, 1, -1, 0], [0, 0, 0, 1]], np.int64)
# the input transform B^T and the output transform A^T of F(2x2, 3x3)
WINO_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.int64)
WINO_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.int64)
# input channels up to which 4 Y (the output transform's result) fits int32 for any uint8 / int8
# x and int8 weights: 4 * 9 * C * 255 * 128 < 2**31 (bench/int8_winograd_study.py: 1827)
WINO_MAX_CHANNELS = 1827


def pack_winograd_weights(wd: np.ndarray) -> np.ndarray:
    """``wd`` [O, C, 3, 3] (integers within int8) -> U' = (2G) wd (2G)^T [O, C, 4, 4] packed as
    ``pack_conv_weights`` packs a 4x4 window (the 16 positions xi = 4a + b as its taps), int16:
    ``[ceil(O/6), 16 * ceil(C/2), 6, 2]``."""
    u = np.einsum("ak,ockl,bl->ocab", WINO_G2, wd.astype(np.int64), WINO_G2)
    return pack_conv_weights(u).astype(np.int16)


def unpack_winograd_weights(wk: np.ndarray, o: int, c: int) -> np.ndarray:
    """``pack_winograd_weights``' inverse: wd [O, C, 3, 3] (int64), g = L U' L^T / 4."""
    u = unpack_conv_weights(wk, o, c, 4, 4).astype(np.int64)
    g4 = np.einsum("ka,ocab,lb->ockl", WINO_L, u, WINO_L)
    return g4 // 4


def unpack_weights(wp: np.ndarray, k: int, n: int) -> np.ndarray:
    npn, k2 = wp.shape[:2]
    return wp.transpose(1, 3, 0, 2).reshape(2 * k2, npn * PANEL)[:k, :n]


def _requantize(acc: np.ndarray, mult: np.ndarray, y_zp, dtype: str,
                relu: bool = False) -> np.ndarray:
    f = acc.astype(np.int32).astype(np.float32) * mult
    if dtype == "float32":
        y = (f + np.asarray(y_zp, np.float32)).astype(np.float32)
        return np.maximum(y, np.float32(0)) if relu else y
    lo, hi = saturation_range(dtype)
    y = np.round(f) + np.float32(y_zp)
    return np.clip(y, lo, hi).astype(dtype)


def _epilogue(acc: te.Tensor, bias: te.Tensor, mult: te.Tensor, y_zp: te.Tensor, channel: int,
              shape, name: str, dtype: str, relu: bool = False) -> te.Tensor:
    def body(*i: te.IndexVar) -> te.Expr:
        c = i[channel]
        a = te.cast(acc[i] + bias[c], "float32") * (mult[()] if mult.shape == () else mult[c])
        if dtype == "float32":
            y = a + y_zp[c]
            return te.maximum(y, scalar_of(0.0, "float32")) if relu else y
        lo, hi = saturation_range(dtype)
        q = te.math("round", a) + y_zp[()]
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        return te.cast(q, dtype)

    return te.compute(shape, body, name=name, dtype=dtype)


# ---- qmatmul ------------------------------------------------------------------------------------

def _infer_qmatmul(x: TensorType, wp: TensorType, x_zp: TensorType, bias: TensorType,
                   multiplier: TensorType, y_zp: TensorType, n: int = 0,
                   dtype: str = "uint8", relu: bool = False, w_offset: int = 0) -> TensorType:
    if x.dtype not in ("int8", "uint8") or wp.dtype not in ("int8", "int16"):
        raise ValueError(f"qmatmul takes int8/uint8 x and packed int8/int16 weights, not "
                         f"{x.dtype} x {wp.dtype}")
    k = x.shape[-1]
    if (len(wp.shape) != 4 or tuple(wp.shape[2:]) != (PANEL, 2) or wp.shape[1] != -(-k // 2)
            or not 0 < n <= wp.shape[0] * PANEL):
        raise ValueError(f"qmatmul: packed weights {wp.shape} do not fit x {x.shape}, n={n}")
    if x_zp.shape != () or x_zp.dtype not in ("int8", "uint8", "int32"):
        raise ValueError(f"qmatmul: x_zp must be an int8/uint8/int32 scalar, not {x_zp}")
    if tuple(multiplier.shape) not in ((), (wp.shape[0] * PANEL,)):
        raise ValueError(f"qmatmul: multiplier {multiplier.shape} is neither a scalar nor "
                         f"one per padded column ({wp.shape[0] * PANEL})")
    return TensorType(tuple(x.shape[:-1]) + (n,), dtype)


def _legalize_qmatmul(x: te.Tensor, wp: te.Tensor, x_zp: te.Tensor, bias: te.Tensor,
                      multiplier: te.Tensor, y_zp: te.Tensor, out_type: TensorType, name: str,
                      n: int = 0, dtype: str = "uint8", relu: bool = False,
                      w_offset: int = 0) -> te.Tensor:
    k = te.reduce_axis(x.shape[-1], "k")
    tag_reduction(k, "qmatmul", (x, wp, x_zp, bias, multiplier, y_zp), n=n, dtype=dtype,
                  relu=relu, w_offset=w_offset)

    def acc_body(*i: te.IndexVar) -> te.Expr:
        c = i[-1]
        xv = te.cast(x[tuple(i[:-1]) + (k,)], "int32") - te.cast(x_zp[()], "int32")
        wv = te.cast(wp[c // PANEL, k // 2, c % PANEL, k % 2], "int32")
        if w_offset:
            wv = wv + te.const(int(w_offset), "int32")
        return te.sum_of(xv * wv, k)

    acc = te.compute(out_type.shape, acc_body, name=name + "_acc", dtype="int32")
    return _epilogue(acc, bias, multiplier, y_zp, len(out_type.shape) - 1, out_type.shape,
                     name, dtype, relu)


@register_op("qmatmul", OPAQUE, _infer_qmatmul, _legalize_qmatmul)
def qmatmul(x: np.ndarray, wp: np.ndarray, x_zp: np.ndarray, bias: np.ndarray,
            multiplier: np.ndarray, y_zp: np.ndarray, n: int = 0,
            dtype: str = "uint8", relu: bool = False, w_offset: int = 0) -> np.ndarray:
    wd = unpack_weights(wp, x.shape[-1], n).astype(np.int64) + int(w_offset)
    acc = np.matmul(x.astype(np.int64) - int(x_zp), wd) + bias[:n]
    mult = multiplier if multiplier.shape == () else multiplier[:n]
    return _requantize(acc, mult, y_zp[:n] if dtype == "float32" else y_zp, dtype, relu)


# ---- qconv2d ------------------------------------------------------------------------------------

def _out_size(size: int, k: int, s: int, lo: int, hi: int) -> int:
    return (size + lo + hi - k) // s + 1


def _infer_table(table: tuple, rows: int, dtype: str) -> str:
    """The result dtype of an 8-bit product followed by its optional ``lut8`` table (a 7th
    input, [rows or 1, 256], folded in by passes/quantize_lut.py)."""
    if not table:
        return dtype
    t = table[0]
    if (len(table) != 1 or dtype not in ("int8", "uint8") or t.dtype not in ("int8", "uint8")
            or len(t.shape) != 2 or t.shape[0] not in (1, rows) or t.shape[1] != 256):
        raise ValueError(f"a table after an 8-bit result is [{rows} or 1, 256] int8/uint8, "
                         f"not {[str(x) for x in table]}")
    return t.dtype


def table_hints(table_cols) -> dict:
    """A product's tag attributes for its table's ``table_cols`` (lo, hi): the columns outside
    which every row of the table is constant (``passes/quantize_lut.py`` sets them on open
    sizes; the kernels clamp to them and look up only their chunks); none when not given."""
    return {} if table_cols is None else {"table_cols": (int(table_cols[0]),
                                                         int(table_cols[1]))}


def _lookup(q: te.Tensor, table: tuple, channel: int, name: str) -> te.Tensor:
    """``q`` through ``lut8``'s table (its row per channel ``channel``), when there is one."""
    if not table:
        return q
    t = table[0]
    off = 128 if q.dtype == "int8" else 0

    def body(*i: te.IndexVar) -> te.Expr:
        v = te.cast(q[i], "int64") + te.const(off, "int64")
        return t[(i[channel] if t.shape[0] != 1 else te.const(0, "int64")), v]

    return te.compute(q.shape, body, name=name, dtype=t.dtype)


def _apply_table(y: np.ndarray, table: tuple) -> np.ndarray:
    if not table:
        return y
    t = table[0]
    return lut8(y, t, 1 if t.shape[0] != 1 else -1)


def _infer_qconv2d(x: TensorType, wk: TensorType, x_zp: TensorType, bias: TensorType,
                   multiplier: TensorType, y_zp: TensorType, *table: TensorType,
                   out_channels: int = 0, kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0),
                   dtype: str = "uint8", relu: bool = False,
                   winograd: bool = False, table_cols=None) -> TensorType:
    if x.dtype not in ("int8", "uint8") or wk.dtype not in ("int8", "int16"):
        raise ValueError(f"qconv2d takes int8/uint8 x and int8/int16 weights, not "
                         f"{x.dtype} x {wk.dtype}")
    b, c, h, w = x.shape
    kh, kw = kernel
    if winograd and (tuple(kernel) != (3, 3) or tuple(strides) != (1, 1) or wk.dtype != "int16"
                     or not isinstance(c, int) or c > WINO_MAX_CHANNELS):
        raise ValueError(f"qconv2d: Winograd weights are int16 of a 3x3 stride-1 window on at "
                         f"most {WINO_MAX_CHANNELS} input channels, not {wk.dtype} {kernel} "
                         f"{strides} on {c}")
    taps = 16 if winograd else kh * kw
    if (len(wk.shape) != 4 or wk.shape[0] != -(-out_channels // CONV_ROWS)
            or wk.shape[1] != taps * -(-c // 2) or tuple(wk.shape[2:]) != (CONV_ROWS, 2)):
        raise ValueError(f"qconv2d: packed weights {wk.shape} do not fit x {x.shape}, "
                         f"{out_channels} outputs, kernel {kernel}")
    if x_zp.shape != () or x_zp.dtype not in ("int8", "uint8", "int32"):
        raise ValueError(f"qconv2d: x_zp must be an int8/uint8/int32 scalar, not {x_zp}")
    if tuple(multiplier.shape) not in ((), (out_channels,)) or bias.dtype != "int32" \
            or tuple(bias.shape) != (out_channels,):
        raise ValueError(f"qconv2d: bias {bias} / multiplier {multiplier} do not fit "
                         f"{out_channels} output channels")
    oh = _out_size(h, kh, strides[0], padding[0], padding[2])
    ow = _out_size(w, kw, strides[1], padding[1], padding[3])
    return TensorType((b, out_channels, oh, ow), _infer_table(table, out_channels, dtype))


def _legalize_qconv2d(x: te.Tensor, wk: te.Tensor, x_zp: te.Tensor, bias: te.Tensor,
                      multiplier: te.Tensor, y_zp: te.Tensor, *table: te.Tensor,
                      out_type: TensorType, name: str,
                      out_channels: int = 0, kernel=(1, 1), strides=(1, 1),
                      padding=(0, 0, 0, 0), dtype: str = "uint8",
                      relu: bool = False, winograd: bool = False,
                      table_cols=None) -> te.Tensor:
    _, c, h, w = x.shape
    kh, kw = kernel
    cp = -(-c // 2)
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    tag_reduction(rc, "qconv2d", (x, wk, x_zp, bias, multiplier, y_zp) + table,
                  out_channels=out_channels, kernel=tuple(kernel), strides=tuple(strides),
                  padding=tuple(padding), dtype=dtype, relu=relu,
                  **({"winograd": True} if winograd else {}),   # others' tags as before
                  **table_hints(table_cols))

    def weight(oc, ky, kx):
        if not winograd:
            return te.cast(wk[oc // CONV_ROWS, (ky * kw + kx) * cp + rc // 2, oc % CONV_ROWS,
                              rc % 2], "int32")

        # 4 g = L U' L^T (WINO_L): L[k, a] is 1 at (0, 0), (1, 1), (2, 3), -1 at (1, 2)
        def coef(k, a):
            kk, sign = {0: (0, 1), 1: (1, 1), 2: (1, -1), 3: (2, 1)}[a]
            return te.if_then_else(te.eq(k, kk), te.const(sign, "int32"), te.const(0, "int32"))

        g4 = te.const(0, "int32")
        for a in range(4):
            for bb in range(4):
                u = te.cast(wk[oc // CONV_ROWS, (a * 4 + bb) * cp + rc // 2, oc % CONV_ROWS,
                               rc % 2], "int32")
                g4 = g4 + coef(ky, a) * coef(kx, bb) * u
        return g4 // te.const(4, "int32")

    def clamp(i, size):
        return te.minimum(te.maximum(i, 0), size - 1)

    def acc_body(b, oc, oy, ox):
        iy = oy * strides[0] - padding[0] + ry
        ix = ox * strides[1] - padding[1] + rx
        inside = te.logical_and(te.logical_and(iy >= 0, iy < h), te.logical_and(ix >= 0, ix < w))
        xv = te.if_then_else(inside, te.cast(x[b, rc, clamp(iy, h), clamp(ix, w)], "int32")
                             - te.cast(x_zp[()], "int32"), te.const(0, "int32"))
        return te.sum_of(xv * weight(oc, ry, rx), (rc, ry, rx))

    acc = te.compute(out_type.shape, acc_body, name=name + "_acc", dtype="int32")
    q = _epilogue(acc, bias, multiplier, y_zp, 1, out_type.shape,
                  name + "_q" if table else name, dtype, relu)
    return _lookup(q, table, 1, name)


@register_op("qconv2d", OPAQUE, _infer_qconv2d, _legalize_qconv2d)
def qconv2d(x: np.ndarray, wk: np.ndarray, x_zp: np.ndarray, bias: np.ndarray,
            multiplier: np.ndarray, y_zp: np.ndarray, *table: np.ndarray, out_channels: int = 0,
            kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0), dtype: str = "uint8",
            relu: bool = False, winograd: bool = False, table_cols=None) -> np.ndarray:
    b, c, h, w = x.shape
    kh, kw = kernel
    o = out_channels
    wd = unpack_winograd_weights(wk, o, c) if winograd else unpack_conv_weights(wk, o, c, kh, kw)
    xz = int(x_zp)
    xp = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (padding[0], padding[2]),
                                          (padding[1], padding[3])))
    oh = _out_size(h, kh, strides[0], padding[0], padding[2])
    ow = _out_size(w, kw, strides[1], padding[1], padding[3])
    acc = np.zeros((b, o, oh, ow), np.int64)
    w64 = wd.astype(np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky:ky + strides[0] * (oh - 1) + 1:strides[0],
                       kx:kx + strides[1] * (ow - 1) + 1:strides[1]]
            acc += np.einsum("nchw,oc->nohw", patch, w64[:, :, ky, kx])
    acc += bias.reshape(1, o, 1, 1)
    off = y_zp.reshape(1, o, 1, 1) if dtype == "float32" else y_zp
    mult = multiplier if multiplier.shape == () else multiplier.reshape(1, o, 1, 1)
    return _apply_table(_requantize(acc, mult, off, dtype, relu), table)


# ---- lut8 ---------------------------------------------------------------------------------------

def _infer_lut8(x: TensorType, table: TensorType, axis: int = -1) -> TensorType:
    if x.dtype not in ("int8", "uint8") or table.dtype not in ("int8", "uint8") \
            or len(table.shape) != 2 or table.shape[1] != 256:
        raise ValueError(f"lut8 takes an int8/uint8 x and an int8/uint8 [C, 256] table, not "
                         f"{x.dtype} {x.shape} and {table.dtype} {table.shape}")
    if axis >= 0 and (axis >= len(x.shape) or x.shape[axis] != table.shape[0]):
        raise ValueError(f"lut8: table {table.shape} does not fit axis {axis} of {x.shape}")
    if axis < 0 and table.shape[0] != 1:
        raise ValueError(f"lut8: a table of {table.shape[0]} rows needs an axis")
    return TensorType(x.shape, table.dtype)


def _legalize_lut8(x: te.Tensor, table: te.Tensor, out_type: TensorType, name: str,
                   axis: int = -1) -> te.Tensor:
    off = 128 if x.dtype == "int8" else 0

    def body(*i: te.IndexVar) -> te.Expr:
        v = te.cast(x[i], "int64")
        if off:
            v = v + te.const(off, "int64")
        return table[(i[axis] if axis >= 0 else te.const(0, "int64")), v]

    return te.compute(out_type.shape, body, name=name, dtype=out_type.dtype)


@register_op("lut8", INJECTIVE, _infer_lut8, _legalize_lut8)
def lut8(x: np.ndarray, table: np.ndarray, axis: int = -1) -> np.ndarray:
    """``y[..., c, ...] = table[c, x + 128 * (x is int8)]``: an 8-bit elementwise function of
    x per channel (one row when ``axis`` is -1), as ``passes/quantize_lut.py`` tabulates a
    chain of quantized elementwise operations."""
    idx = x.astype(np.int64) + (128 if x.dtype == np.int8 else 0)
    if axis < 0:
        return table[0][idx]
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    rows = np.arange(x.shape[axis]).reshape(shape)
    return table[rows, idx]


# ---- qdwconv2d ----------------------------------------------------------------------------------

def _infer_qdwconv2d(x: TensorType, wf: TensorType, x_zp: TensorType, bias: TensorType,
                     multiplier: TensorType, y_zp: TensorType, *looked: TensorType,
                     kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0), dtype: str = "uint8",
                     relu: bool = False, bias_in_float: bool = False,
                     weights_int8: bool = False, col_lo: int = 0,
                     col_hi: int = 255) -> TensorType:
    if x.dtype not in ("int8", "uint8") or wf.dtype != "float32":
        raise ValueError(f"qdwconv2d takes int8/uint8 x and float32 weights, not "
                         f"{x.dtype} x {wf.dtype}")
    b, c, h, w = x.shape
    kh, kw = kernel
    if tuple(wf.shape) != (c, kh * kw) or tuple(bias.shape) != (c,) \
            or tuple(multiplier.shape) != (c,) or bias.dtype != "int32":
        raise ValueError(f"qdwconv2d: weights {wf.shape} / bias {bias} / multiplier "
                         f"{multiplier} do not fit x {x.shape} and kernel {kernel}")
    if x_zp.shape != () or x_zp.dtype != "int32":
        raise ValueError(f"qdwconv2d: x_zp must be an int32 scalar, not {x_zp}")
    oh = _out_size(h, kh, strides[0], padding[0], padding[2])
    ow = _out_size(w, kw, strides[1], padding[1], padding[3])
    if looked:
        return TensorType((b, c, oh, ow), _infer_looked(looked, c, dtype))
    return TensorType((b, c, oh, ow), dtype)


def _infer_looked(looked: tuple, rows: int, dtype: str) -> str:
    """The result dtype of a ``qdwconv2d`` with a table and a dequantize after it: float32
    (``table`` [rows or 1, 256] 8-bit, one float32 scale, one zero point of its dtype)."""
    if len(looked) != 3 or dtype not in ("int8", "uint8"):
        raise ValueError(f"qdwconv2d takes a table, its scale and zero point after an 8-bit "
                         f"result, not {[str(t) for t in looked]} after {dtype}")
    table, scale, zp = looked
    if (table.dtype not in ("int8", "uint8") or len(table.shape) != 2
            or table.shape[0] not in (1, rows) or table.shape[1] != 256
            or scale.dtype != "float32" or tuple(scale.shape) != () or zp.dtype != table.dtype
            or tuple(zp.shape) != ()):
        raise ValueError(f"qdwconv2d: a table [{rows} or 1, 256] int8/uint8, a float32 scale "
                         f"and a zero point of its dtype, not {[str(t) for t in looked]}")
    return "float32"


def _legalize_qdwconv2d(x: te.Tensor, wf: te.Tensor, x_zp: te.Tensor, bias: te.Tensor,
                        multiplier: te.Tensor, y_zp: te.Tensor, *looked: te.Tensor,
                        out_type: TensorType, name: str,
                        kernel=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0),
                        dtype: str = "uint8", relu: bool = False,
                        bias_in_float: bool = False, weights_int8: bool = False,
                        col_lo: int = 0, col_hi: int = 255) -> te.Tensor:
    _, c, h, w = x.shape
    kh, kw = kernel
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    extra = {"col_lo": int(col_lo), "col_hi": int(col_hi)} if looked else {}
    tag_reduction(ry, "qdwconv2d", (x, wf, x_zp, bias, multiplier, y_zp, *looked),
                  kernel=tuple(kernel), strides=tuple(strides), padding=tuple(padding),
                  dtype=dtype, relu=relu, bias_in_float=bias_in_float,
                  weights_int8=weights_int8, **extra)

    def clamp(i, size):
        return te.minimum(te.maximum(i, 0), size - 1)

    def acc_body(b, ch, oy, ox):
        iy = oy * strides[0] - padding[0] + ry
        ix = ox * strides[1] - padding[1] + rx
        inside = te.logical_and(te.logical_and(iy >= 0, iy < h), te.logical_and(ix >= 0, ix < w))
        xv = te.if_then_else(inside, te.cast(te.cast(x[b, ch, clamp(iy, h), clamp(ix, w)], "int32")
                                             - x_zp[()], "float32"),
                             te.const(0.0, "float32"))
        return te.sum_of(xv * wf[ch, ry * kw + rx], (ry, rx))

    acc = te.compute(out_type.shape, acc_body, name=name + "_acc", dtype="float32")

    def body(b, ch, oy, ox):
        f = te.cast(te.cast(acc[b, ch, oy, ox], "int32") + bias[ch], "float32") * multiplier[ch]
        if dtype == "float32":
            y = f + y_zp[ch]
            return te.maximum(y, scalar_of(0.0, "float32")) if relu else y
        lo, hi = saturation_range(dtype)
        q = te.math("round", f) + y_zp[()]
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        return te.cast(q, dtype)

    if not looked:
        return te.compute(out_type.shape, body, name=name, dtype=dtype)
    q = te.compute(out_type.shape, body, name=name + "_q", dtype=dtype)
    table, t_scale, t_zp = looked
    t = _lookup(q, (table,), 1, name + "_t")

    def dequantized(*i: te.IndexVar) -> te.Expr:
        diff = te.cast(t[i], "float32") - te.cast(t_zp[()], "float32")
        return diff * t_scale[()]

    return te.compute(out_type.shape, dequantized, name=name, dtype="float32")


@register_op("qdwconv2d", OPAQUE, _infer_qdwconv2d, _legalize_qdwconv2d)
def qdwconv2d(x: np.ndarray, wf: np.ndarray, x_zp: np.ndarray, bias: np.ndarray,
              multiplier: np.ndarray, y_zp: np.ndarray, *looked: np.ndarray, kernel=(1, 1),
              strides=(1, 1), padding=(0, 0, 0, 0), dtype: str = "uint8", relu: bool = False,
              bias_in_float: bool = False, weights_int8: bool = False, col_lo: int = 0,
              col_hi: int = 255) -> np.ndarray:
    """Depthwise (one input channel per output channel): acc = sum (x - x_zp) * wf, exact
    (the fusion only emits it where every partial sum stays below 2**24, so the kernel's
    float32 accumulation is exact too), + bias in int32 (wrapping, as ONNX Runtime's int32
    accumulator: ORT's quantizer writes biases near 2**31 for channels of tiny weight
    scale), then ``_requantize``."""
    b, c, h, w = x.shape
    kh, kw = kernel
    xp = np.pad(x.astype(np.int64) - int(x_zp), ((0, 0), (0, 0), (padding[0], padding[2]),
                                                 (padding[1], padding[3])))
    oh = _out_size(h, kh, strides[0], padding[0], padding[2])
    ow = _out_size(w, kw, strides[1], padding[1], padding[3])
    wd = wf.astype(np.int64).reshape(c, kh, kw)
    acc = np.zeros((b, c, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky:ky + strides[0] * (oh - 1) + 1:strides[0],
                       kx:kx + strides[1] * (ow - 1) + 1:strides[1]]
            acc += patch * wd[:, ky, kx].reshape(1, c, 1, 1)
    acc += bias.astype(np.int64).reshape(1, c, 1, 1)
    off = y_zp.reshape(1, c, 1, 1) if dtype == "float32" else y_zp
    y = _requantize(acc, multiplier.reshape(1, c, 1, 1), off, dtype, relu)
    if not looked:
        return y
    table, t_scale, t_zp = looked
    t = _apply_table(y, (table,))
    return ((t.astype(np.float32) - np.float32(t_zp)) * np.float32(t_scale)).astype(np.float32)
