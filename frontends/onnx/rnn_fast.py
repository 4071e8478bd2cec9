"""The fast path of ONNX LSTM, GRU and RNN: the input projection of every step and direction as
one matmul ([T*B, I] x [I, D*G*H], biases in its epilogue), then the time loop as one
``nn.recurrence`` kernel (``packager/codegen/rnn.py``) that reads the recurrence weights packed
at export.

Taken when the node is float32 with its recurrence weights known at export and uses nothing the
kernel does not compute: default activations, no clip, no ``sequence_lens`` shorter than the
sequence, no LSTM peepholes or coupled input-forget gate. Anything else keeps the unrolled graph
of ``rnn.py``, with its numerics unchanged.
"""

from __future__ import annotations

import numpy as np

from ...packager.ir.graph import Value
from ...packager.ops.sequence import GATES, pack_recurrent
from .recurrence import _Recurrence
from .registry import NodeContext

_DEFAULT_ACTIVATIONS = {"lstm": ["sigmoid", "tanh", "tanh"], "gru": ["sigmoid", "tanh"],
                        "rnn": ["tanh"]}


def _slice(ctx: NodeContext, x: Value, axis: int, start: int, end: int) -> Value:
    return ctx.emit("strided_slice", x, starts=(start,), ends=(end,), axes=(axis,), steps=(1,))


def fits(ctx: NodeContext, rec: _Recurrence, cell: str) -> bool:
    """Whether the recurrence kernel computes this node exactly as ONNX defines it."""
    a = ctx.attrs
    if rec.dtype != "float32" or rec.clip is not None or rec.masks is not None:
        return False
    if any(d < 1 for d in (rec.seq, rec.batch, rec.hidden, rec.input_size)) or \
            ctx.const(2) is None:
        return False
    if not all(isinstance(d, int) for d in (rec.batch, rec.hidden, rec.input_size)):
        return False   # the kernel takes a run-time step count only (a symbolic time axis)
    names = [n.lower() for n in (a["activations"] or [])]
    if names and names not in (_DEFAULT_ACTIVATIONS[cell],
                               _DEFAULT_ACTIVATIONS[cell] * rec.num_dir):
        return False
    if a["activation_alpha"] or a["activation_beta"]:
        return False
    if cell == "lstm":
        if a["input_forget"]:
            return False
        if ctx.has_input(7):
            peep = ctx.const(7)
            if peep is None or np.any(peep != 0):
                return False
    return True


def _biases(ctx: NodeContext, rec: _Recurrence, cell: str, linear_before_reset: bool
            ) -> tuple[Value | None, Value | None]:
    """(what the projection adds [D*G*H], the h gate's recurrence bias [D, H] that a GRU with
    linear_before_reset applies inside the reset product)."""
    if rec.b is None:
        return None, None
    h, d = rec.hidden, rec.num_dir
    gh = GATES[cell] * h
    wb = _slice(ctx, rec.b, 1, 0, gh)
    if cell == "gru" and linear_before_reset:
        zeros = ctx.constant(np.zeros((d, h), rec.dtype), "zero")
        rb = ctx.emit("concat", _slice(ctx, rec.b, 1, gh, gh + 2 * h), zeros, axis=1)
        rbh = _slice(ctx, rec.b, 1, gh + 2 * h, 2 * gh)
    else:
        rb, rbh = _slice(ctx, rec.b, 1, gh, 2 * gh), None
    return ctx.reshape(ctx.emit("add", wb, rb), (d * gh,)), rbh


def _state(ctx: NodeContext, rec: _Recurrence, index: int, name: str) -> Value:
    given = rec.state(index, name)
    if given is not None:
        return given
    return ctx.constant(np.zeros((rec.num_dir, rec.batch, rec.hidden), rec.dtype), name)


def fused_recurrence(ctx: NodeContext, rec: _Recurrence, cell: str, quantize_h: bool = False
                     ) -> list[Value | None]:
    """Y, Y_h (and for an LSTM Y_c) of the node, through ``nn.recurrence`` (``quantize_h``: h
    requantized before each product, com.microsoft.DynamicQuantizeLSTM)."""
    t, batch, size, h, d = rec.seq, rec.batch, rec.input_size, rec.hidden, rec.num_dir
    g = GATES[cell]
    lbr = cell == "gru" and bool(ctx.attrs["linear_before_reset"])
    xw = ctx.emit("matmul", ctx.reshape(rec.x, (t * batch, size)),
                  ctx.reshape(rec.w, (d * g * h, size)), transpose_b=True)
    bias, rbh = _biases(ctx, rec, cell, lbr)
    if bias is not None:
        xw = ctx.emit("add", xw, bias)
    xw = ctx.reshape(xw, (t, batch, d * g * h))
    packed = ctx.constant(pack_recurrent(np.asarray(ctx.const(2), np.float32), cell, lbr),
                          "r_packed")
    extra: list[Value] = []
    if cell == "lstm":
        extra.append(_state(ctx, rec, 6, "initial_c"))
    elif lbr:
        extra.append(rbh if rbh is not None else
                     ctx.constant(np.zeros((d, h), rec.dtype), "rbh"))
    outputs = ctx.node.output
    want_c = cell == "lstm" and len(outputs) > 2 and bool(outputs[2])
    out = ctx.emit("nn.recurrence", xw, packed, _state(ctx, rec, 5, "initial_h"), *extra,
                   cell=cell, hidden=h, reverse=tuple(rec.reverse), linear_before_reset=lbr,
                   states=want_c, **({"quantize_h": True} if quantize_h else {}))
    y = _slice(ctx, out, 0, 0, t) if want_c else out
    # the final hidden state is the last step's row of each direction (step 0 when reversed)
    rows = [ctx.emit("strided_slice", y, starts=(0 if rev else t - 1, k),
                     ends=(1 if rev else t, k + 1), axes=(0, 1), steps=(1, 1))
            for k, rev in enumerate(rec.reverse)]
    y_h = ctx.reshape(rows[0] if d == 1 else ctx.emit("concat", *rows, axis=1), (d, batch, h))
    states = [y_h]
    if cell == "lstm":
        states.append(ctx.reshape(_slice(ctx, out, 0, t, t + 1), (d, batch, h))
                      if want_c else None)
    if rec.layout == 1:
        y = ctx.emit("transpose", y, axes=(2, 0, 1, 3))
        states = [s if s is None else ctx.emit("transpose", s, axes=(1, 0, 2)) for s in states]
    return [y if outputs and outputs[0] else None] + states
