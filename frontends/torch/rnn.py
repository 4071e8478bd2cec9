"""``aten.lstm.input`` and ``aten.gru.input``, kept whole by the decomposition: per layer, the input
projection of every step and direction as one matmul (biases in its epilogue), then the time
loop as one ``nn.recurrence`` kernel reading recurrence weights packed at export, exactly as the
ONNX frontend's fast path (``frontends/onnx/rnn_fast.py``) converts an ONNX LSTM / GRU. torch's
gate order (LSTM i, f, g, o; GRU r, z, n) is permuted to ONNX's (i, o, f, c; z, r, h); a torch
GRU is ONNX's ``linear_before_reset=1``."""

from __future__ import annotations

import numpy as np

from ...packager.ir.graph import Constant, Value
from ...packager.ops.sequence import GATES, pack_recurrent
from .registry import NodeContext, converter

# ONNX gate k comes from torch gate ORDER[cell][k]
_ORDER = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2)}


def _gates(data: np.ndarray, cell: str) -> np.ndarray:
    """Rows of a [G*H, ...] weight (or [G*H] bias) in ONNX gate order."""
    h = data.shape[0] // GATES[cell]
    return np.concatenate([data[g * h:(g + 1) * h] for g in _ORDER[cell]], axis=0)


def _slice(ctx: NodeContext, x: Value, axis: int, start: int, end: int) -> Value:
    return ctx.emit("strided_slice", x, starts=(start,), ends=(end,), axes=(axis,), steps=(1,))


def _recurrent(cell: str):
    def convert(ctx: NodeContext) -> tuple:
        x = ctx.tensor("input")
        if len(x.type.shape) != 3:
            raise ctx.error(f"input of shape {x.type.shape}: only batched 3-D input is supported")
        if x.type.dtype != "float32":
            raise ctx.error(f"input is {x.type.dtype}: only float32 recurrences are supported")
        hx = ctx.arg("hx")
        hx = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        params = list(ctx.arg("params"))
        if not all(isinstance(p, Constant) for p in params):
            raise ctx.error("the weights must be parameters known at export")
        layers, bidir = int(ctx.arg("num_layers")), bool(ctx.arg("bidirectional"))
        biased = bool(ctx.arg("has_biases"))
        batch_first = bool(ctx.arg("batch_first"))
        dirs = 2 if bidir else 1
        per = 4 if biased else 2
        if len(params) != layers * dirs * per:
            raise ctx.error(f"{len(params)} weight tensors for {layers} layers x {dirs} "
                            "directions: projections (proj_size) are not supported")
        if batch_first:
            x = ctx.emit("transpose", x, axes=(1, 0, 2))
        t, batch, _ = x.type.shape
        g = GATES[cell]
        h = params[1].data.shape[1]
        lbr = cell == "gru"
        want_c = cell == "lstm" and ctx.wants(2)
        finals_h, finals_c = [], []
        for layer in range(layers):
            group = [params[(layer * dirs + d) * per:(layer * dirs + d + 1) * per]
                     for d in range(dirs)]
            size = x.type.shape[2]
            w = np.concatenate([_gates(p[0].data, cell) for p in group], axis=0)
            r = np.stack([_gates(p[1].data, cell) for p in group])
            xw = ctx.emit("matmul", ctx.reshape(x, (t * batch, size)),
                          ctx.constant(w, f"{params[0].name}_w"), transpose_b=True)
            extra: list[Value] = []
            if biased:
                b_ih = np.concatenate([_gates(p[2].data, cell) for p in group])
                b_hh = np.stack([_gates(p[3].data, cell) for p in group])
                if lbr:  # the h gate's recurrence bias stays inside the reset product
                    rb = b_hh.copy()
                    rbh = rb[:, 2 * h:].copy()
                    rb[:, 2 * h:] = 0.0
                    bias = b_ih + rb.reshape(-1)
                    extra_gru = ctx.constant(rbh.astype(np.float32), "rbh")
                else:
                    bias = b_ih + b_hh.reshape(-1)
                xw = ctx.emit("add", xw, ctx.constant(bias.astype(np.float32), "bias"))
            elif lbr:
                extra_gru = ctx.constant(np.zeros((dirs, h), np.float32), "rbh")
            xw = ctx.reshape(xw, (t, batch, dirs * g * h))
            packed = ctx.constant(pack_recurrent(r.astype(np.float32), cell, lbr), "r_packed")
            h0 = _layer_state(ctx, hx[0], layer, dirs)
            if cell == "lstm":
                extra.append(_layer_state(ctx, hx[1], layer, dirs))
            else:
                extra.append(extra_gru)
            out = ctx.emit("nn.recurrence", xw, packed, h0, *extra, cell=cell, hidden=h,
                           reverse=(False, True)[:dirs], linear_before_reset=lbr,
                           states=want_c)
            y = _slice(ctx, out, 0, 0, t) if want_c else out           # [T, D, B, H]
            rows = [ctx.emit("strided_slice", y, starts=(t - 1 if d == 0 else 0, d),
                             ends=(t if d == 0 else 1, d + 1), axes=(0, 1), steps=(1, 1))
                    for d in range(dirs)]
            finals_h.append(ctx.reshape(rows[0] if dirs == 1
                                        else ctx.emit("concat", *rows, axis=1),
                                        (dirs, batch, h)))
            if want_c:
                finals_c.append(ctx.reshape(_slice(ctx, out, 0, t, t + 1), (dirs, batch, h)))
            if dirs == 1:
                x = ctx.reshape(y, (t, batch, h))
            else:
                x = ctx.reshape(ctx.emit("transpose", y, axes=(0, 2, 1, 3)), (t, batch, dirs * h))
        output = ctx.emit("transpose", x, axes=(1, 0, 2)) if batch_first else x
        h_n = finals_h[0] if layers == 1 else ctx.emit("concat", *finals_h, axis=0)
        if cell == "gru":
            return output, h_n
        c_n = None
        if want_c:
            c_n = finals_c[0] if layers == 1 else ctx.emit("concat", *finals_c, axis=0)
        return output, h_n, c_n
    return convert


def _layer_state(ctx: NodeContext, state: Value, layer: int, dirs: int) -> Value:
    """Rows [layer * D, (layer + 1) * D) of an initial state [L*D, B, H]."""
    if state.type.shape[0] == dirs:
        return state
    return _slice(ctx, state, 0, layer * dirs, (layer + 1) * dirs)


converter("aten.lstm.input")(_recurrent("lstm"))
converter("aten.gru.input")(_recurrent("gru"))
