"""Operator-table rows needed by attention, recurrent and quantization operators that the other
tables do not cover.

``nn.recurrence``: the time loop of an ONNX LSTM, GRU or RNN with default activations, no clip
and no ``sequence_lens``, as one kernel (``codegen/rnn.py``). The frontend computes the input
projection of every step, biases included, as one matmul beforehand (``xw``); this operator does
only what must run step by step: the recurrent product of the previous hidden state with the
recurrence weights, and the gates. The recurrence weights come packed at export
(``pack_recurrent``) in the order the kernel streams them.
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from .registry import OPAQUE, register_op

# Hidden units per block of the packed recurrence weights: a multiple of every vector width the
# kernels use (4, 8, 16 floats), so one block is whole vectors on every target.
UNIT_BLOCK = 16

GATES = {"lstm": 4, "gru": 3, "rnn": 1}


def weight_groups(cell: str, linear_before_reset: bool) -> list[tuple[int, int]]:
    """(first gate, gate count) of each product with the hidden state a step computes: a GRU
    that resets before its linear map multiplies ``r * h`` by the h-gate weights only after z
    and r are known, so its recurrence weights form two groups."""
    if cell == "gru" and not linear_before_reset:
        return [(0, 2), (2, 1)]
    return [(0, GATES[cell])]


def packed_size(cell: str, hidden: int) -> int:
    blocks = -(-hidden // UNIT_BLOCK)
    return GATES[cell] * blocks * UNIT_BLOCK * hidden


def pack_recurrent(r: np.ndarray, cell: str, linear_before_reset: bool) -> np.ndarray:
    """ONNX recurrence weights R [D, G*H, H] packed as [D, P]: per direction and weight group,
    per block of UNIT_BLOCK hidden units (zero-padded past H), per input unit k, the group's
    gates' UNIT_BLOCK weights side by side, so that a block's product reads one contiguous
    stream and keeps every gate of its units in registers."""
    d, gh, h = r.shape
    blocks = -(-h // UNIT_BLOCK)
    parts = []
    for g0, gn in weight_groups(cell, linear_before_reset):
        w = np.zeros((d, gn, blocks * UNIT_BLOCK, h), r.dtype)
        w[:, :, :h, :] = r[:, g0 * h:(g0 + gn) * h, :].reshape(d, gn, h, h)
        w = w.reshape(d, gn, blocks, UNIT_BLOCK, h).transpose(0, 2, 4, 1, 3)  # [D, NB, K, gn, U]
        parts.append(w.reshape(d, -1))
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def unpack_recurrent(packed: np.ndarray, cell: str, hidden: int, linear_before_reset: bool
                     ) -> np.ndarray:
    """The inverse of ``pack_recurrent``: R [D, G*H, H]."""
    d = packed.shape[0]
    h = hidden
    blocks = -(-h // UNIT_BLOCK)
    out = np.zeros((d, GATES[cell] * h, h), packed.dtype)
    at = 0
    for g0, gn in weight_groups(cell, linear_before_reset):
        size = blocks * h * gn * UNIT_BLOCK
        w = packed[:, at:at + size].reshape(d, blocks, h, gn, UNIT_BLOCK).transpose(0, 3, 1, 4, 2)
        out[:, g0 * h:(g0 + gn) * h, :] = w.reshape(d, gn, blocks * UNIT_BLOCK, h)[:, :, :h, :] \
            .reshape(d, gn * h, h)
        at += size
    return out


def int8_packed_size(hidden: int) -> int:
    """Elements per direction of ``pack_recurrent_int8``."""
    blocks = -(-hidden // UNIT_BLOCK)
    return GATES["lstm"] * blocks * UNIT_BLOCK * (hidden + hidden % 2)


def pack_recurrent_int8(q: np.ndarray) -> np.ndarray:
    """An LSTM's integer recurrence weights [D, 4H, H] (|q| <= 127) packed int8 as [D, P] for
    the integer product (``quantize_h`` with ``int_r``): per direction, per block of
    UNIT_BLOCK hidden units (zero-padded past H), per pair of input units (k, k+1) (k padded to
    even), per gate, per unit, the pair (q[.., k], q[.., k+1]) side by side, so one 16-byte
    load is 8 units' k-pairs for ``vpmaddwd``."""
    d, gh, h = q.shape
    g = GATES["lstm"]
    blocks = -(-h // UNIT_BLOCK)
    kp = h + h % 2
    w = np.zeros((d, g, blocks * UNIT_BLOCK, kp), np.int8)
    w[:, :, :h, :h] = q.reshape(d, g, h, h)
    w = w.reshape(d, g, blocks, UNIT_BLOCK, kp // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(w.reshape(d, -1))


def unpack_recurrent_int8(packed: np.ndarray, hidden: int) -> np.ndarray:
    """The inverse of ``pack_recurrent_int8``: the integers [D, 4H, H] as int32."""
    d, h, g = packed.shape[0], hidden, GATES["lstm"]
    blocks = -(-h // UNIT_BLOCK)
    kp = h + h % 2
    w = packed.reshape(d, blocks, kp // 2, g, UNIT_BLOCK, 2).transpose(0, 3, 1, 4, 2, 5)
    w = w.reshape(d, g, blocks * UNIT_BLOCK, kp)[:, :, :h, :h]
    return w.reshape(d, g * h, h).astype(np.int32)


def state_rows(cell: str, states: bool) -> int:
    """Rows after the T steps of the output: an LSTM's final cell state when ``states`` (the
    final hidden state is a row of Y)."""
    return 1 if states and cell == "lstm" else 0


def _check(xw: TensorType, r: TensorType, h0: TensorType, extra: list[TensorType], cell: str,
           hidden: int, reverse: tuple, linear_before_reset: bool, quantize_h: bool = False,
           int_r: bool = False) -> tuple[int, int, int]:
    if cell not in GATES:
        raise ValueError(f"recurrence: cell {cell!r} is not lstm, gru or rnn")
    if quantize_h and cell != "lstm":
        raise ValueError(f"recurrence: quantize_h is for an lstm, not a {cell}")
    if int_r and not quantize_h:
        raise ValueError("recurrence: int_r (int8 R) needs quantize_h")
    d = len(reverse)
    if len(xw.shape) != 3 or xw.shape[2] != d * GATES[cell] * hidden:
        raise ValueError(f"recurrence: xw has shape {xw.shape}, expected [T, B, "
                         f"{d * GATES[cell] * hidden}]")
    t, b, _ = xw.shape
    want_r = (d, int8_packed_size(hidden) if int_r else packed_size(cell, hidden))
    if r.shape != want_r or (r.dtype == "int8") != int_r:
        raise ValueError(f"recurrence: packed R has shape {r.shape} ({r.dtype}), expected "
                         f"{want_r} ({'int8' if int_r else 'float'})")
    if h0.shape != (d, b, hidden):
        raise ValueError(f"recurrence: h0 has shape {h0.shape}, expected {(d, b, hidden)}")
    want = [(d, b, hidden)] if cell == "lstm" else \
        [(d, hidden)] if cell == "gru" and linear_before_reset else []
    if int_r:   # the scale of each recurrence weight row (gate, unit), units padded to blocks
        want.append((d, GATES[cell] * -(-hidden // UNIT_BLOCK) * UNIT_BLOCK))
    if [e.shape for e in extra] != want:
        raise ValueError(f"recurrence: extra inputs {[e.shape for e in extra]}, expected {want}")
    return t, b, d


def _infer(xw: TensorType, r: TensorType, h0: TensorType, *extra: TensorType, cell: str = "lstm",
           hidden: int = 0, reverse: tuple = (False,), linear_before_reset: bool = False,
           states: bool = False, quantize_h: bool = False, int_r: bool = False) -> TensorType:
    t, b, d = _check(xw, r, h0, list(extra), cell, hidden, reverse, linear_before_reset,
                     quantize_h, int_r)
    return TensorType((t + state_rows(cell, states), d, b, hidden), xw.dtype)


def _legalize(xw: te.Tensor, r: te.Tensor, h0: te.Tensor, *extra: te.Tensor,
              out_type: TensorType, name: str, **attrs) -> te.Tensor:
    """A stand-in body no loop nest could compute a recurrence from: the tag hands the whole
    function to the recurrence kernel (the op is opaque, so nothing fuses into it)."""
    k = te.reduce_axis(1, "k")
    tag_reduction(k, "recurrence", (xw, r, h0) + extra, **attrs)
    return te.compute(out_type.shape, lambda *i: te.sum_of(xw[0, 0, k], k), name=name)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


def requantized(h: np.ndarray) -> np.ndarray:
    """h through ONNX DynamicQuantizeLinear (uint8, range with 0; scale 1 when h is all zero) and
    dequantized back, in float32: what the recurrence multiplies with ``quantize_h``."""
    q, zp, scale = quantized_h(h)
    return ((q - zp) * scale).astype(np.float32)


def quantized_h(h: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32]:
    """(q as float32, zero point, scale) of h through ONNX DynamicQuantizeLinear (uint8)."""
    f = np.float32
    lo, hi = min(f(h.min()), f(0)), max(f(h.max()), f(0))
    scale = f(1) if hi == lo else f((hi - lo) / f(255))
    zp = np.clip(np.round(f(0) - f(lo / scale)), f(0), f(255))
    with np.errstate(all="ignore"):
        q = np.clip(np.round((h / scale).astype(f)) + zp, f(0), f(255))
    return q.astype(f), f(zp), f(scale)


@register_op("nn.recurrence", OPAQUE, _infer, _legalize)
def recurrence(xw: np.ndarray, r: np.ndarray, h0: np.ndarray, *extra: np.ndarray,
               cell: str = "lstm", hidden: int = 0, reverse: tuple = (False,),
               linear_before_reset: bool = False, states: bool = False,
               quantize_h: bool = False, int_r: bool = False) -> np.ndarray:
    """Y [T, D, B, H] of the recurrence over the projected inputs ``xw`` [T, B, D*G*H], then
    (``states``, LSTM) the final cell state as one more row. With ``int_r`` (LSTM with
    ``quantize_h``) R is int8 (``pack_recurrent_int8``) with a scale per row (the last extra
    input, [D, 4 * Hpad]): the product is the int32 sum of (q(h) - zp) * R scaled by
    float32(h_scale * r_scale[row]), ONNX Runtime's DynamicQuantizeLSTM."""
    t_len, batch, _ = xw.shape
    h = hidden
    g = GATES[cell]
    if int_r:
        hpad = -(-h // UNIT_BLOCK) * UNIT_BLOCK
        rq = unpack_recurrent_int8(r, h).astype(np.int64)
        rs = extra[-1].reshape(len(reverse), g, hpad)[:, :, :h].reshape(len(reverse), g * h)
    else:
        rr = unpack_recurrent(r, cell, h, linear_before_reset)
    out = np.zeros((t_len + state_rows(cell, states), len(reverse), batch, h), xw.dtype)
    for d, rev in enumerate(reverse):
        x_d = xw[:, :, d * g * h:(d + 1) * g * h]
        hid = h0[d]
        c = extra[0][d] if cell == "lstm" else None
        for t in (range(t_len - 1, -1, -1) if rev else range(t_len)):
            x = x_d[t]
            if cell == "gru":
                zr = _sigmoid(x[:, :2 * h] + hid @ rr[d, :2 * h].T)
                z, rg = zr[:, :h], zr[:, h:]
                if linear_before_reset:
                    cand = np.tanh(x[:, 2 * h:] + rg * (hid @ rr[d, 2 * h:].T + extra[0][d]))
                else:
                    cand = np.tanh(x[:, 2 * h:] + (rg * hid) @ rr[d, 2 * h:].T)
                hid = (1 - z) * cand + z * hid
            else:
                if int_r:
                    q, zp, hs = quantized_h(hid)
                    acc = (q.astype(np.int64) - np.int64(zp)) @ rq[d].T
                    pre = x + acc.astype(np.float32) * (hs * rs[d]).astype(np.float32)
                else:
                    pre = x + (requantized(hid) if quantize_h else hid) @ rr[d].T
                if cell == "rnn":
                    hid = np.tanh(pre)
                else:
                    i, o, f = (_sigmoid(pre[:, k * h:(k + 1) * h]) for k in range(3))
                    c = f * c + i * np.tanh(pre[:, 3 * h:])
                    hid = o * np.tanh(c)
            out[t, d] = hid
        if states and cell == "lstm":
            out[t_len, d] = c
    return out.astype(xw.dtype)
