"""What every ONNX recurrent operator (RNN, GRU, LSTM) shares, for the converters in ``rnn.py``
and the fused recurrence of ``rnn_fast.py``: the activations, the attributes, and
``_Recurrence`` (shapes, directions, the input projection, ``sequence_lens`` masks, the Y / Y_h
outputs)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ...packager.ir.graph import Value
from ...packager.ir.sym import SymExpr
from .registry import NodeContext

_ACTIVATION_DEFAULTS = {
    "sigmoid": (None, None), "tanh": (None, None), "relu": (None, None),
    "leakyrelu": (0.01, None), "hardsigmoid": (0.2, 0.5), "affine": (1.0, 0.0),
    "scaledtanh": (1.0, 1.0), "softsign": (None, None), "softplus": (None, None),
    "elu": (1.0, None), "thresholdedrelu": (1.0, None),
}


def _activation(ctx: NodeContext, name: str, alpha: float | None, beta: float | None
                ) -> Callable[[Value], Value]:
    key = name.lower()
    if key not in _ACTIVATION_DEFAULTS:
        raise ctx.error(f"activation {name!r} is not supported (supported: Sigmoid, Tanh, Relu, "
                        "LeakyRelu, HardSigmoid, Affine, ScaledTanh, Softsign, Softplus, Elu, "
                        "ThresholdedRelu)")
    da, db = _ACTIVATION_DEFAULTS[key]
    a = da if alpha is None else alpha
    b = db if beta is None else beta

    def mul(x: Value, f: float) -> Value:
        return ctx.emit("multiply", x, ctx.scalar(f, x))

    def add(x: Value, f: float) -> Value:
        return ctx.emit("add", x, ctx.scalar(f, x))

    def apply(x: Value) -> Value:
        if key in ("sigmoid", "tanh", "relu"):
            return ctx.emit(key, x)
        if key == "leakyrelu":
            return ctx.emit("leaky_relu", x, alpha=float(a))
        if key == "hardsigmoid":
            return ctx.emit("clip", add(mul(x, a), b), min=0.0, max=1.0)
        if key == "affine":
            return add(mul(x, a), b)
        if key == "scaledtanh":
            return mul(ctx.emit("tanh", mul(x, b)), a)
        if key == "softsign":
            return ctx.emit("divide", x, add(ctx.emit("abs", x), 1.0))
        if key == "softplus":
            return ctx.emit("log", add(ctx.emit("exp", x), 1.0))
        if key == "elu":
            neg = mul(add(ctx.emit("exp", x), -1.0), a)
            return ctx.emit("where", ctx.emit("greater", x, ctx.scalar(0.0, x)), x, neg)
        # thresholdedrelu
        return ctx.emit("where", ctx.emit("greater", x, ctx.scalar(a, x)), x, ctx.scalar(0.0, x))

    return apply


# ---- shared unrolling ---------------------------------------------------------------------------

_RNN_ATTRS = {"activation_alpha": None, "activation_beta": None, "activations": None,
              "clip": None, "direction": "forward", "hidden_size": None, "layout": 0}


def _slice(ctx: NodeContext, x: Value, axis: int, start: int, end: int) -> Value:
    return ctx.emit("strided_slice", x, starts=(start,), ends=(end,), axes=(axis,), steps=(1,))


def _take(ctx: NodeContext, x: Value, axis: int, index: int) -> Value:
    """``x`` at ``index`` along ``axis``, that axis dropped."""
    part = _slice(ctx, x, axis, index, index + 1)
    shape = x.type.shape[:axis] + x.type.shape[axis + 1:]
    return ctx.reshape(part, shape)


class _Recurrence:
    """What every recurrent operator shares: attributes, shapes, directions, activations, the
    input projection, ``sequence_lens`` masks and the Y / Y_h outputs."""

    def __init__(self, ctx: NodeContext, gates: int, default_acts: Sequence[str]) -> None:
        self.ctx = ctx
        a = ctx.attrs
        direction = a["direction"]
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.error(f"direction={direction!r} is not forward, reverse or bidirectional")
        self.reverse = [direction == "reverse"] if direction != "bidirectional" else [False, True]
        self.num_dir = len(self.reverse)
        self.layout = int(a["layout"] or 0)
        x, w, r = ctx.input(0), ctx.input(1), ctx.input(2)
        self.dtype = x.type.dtype
        if self.dtype not in ("float32", "float64"):
            raise ctx.error(f"X is {self.dtype}: only float32 and float64 are supported")
        if len(x.type.shape) != 3:
            raise ctx.error(f"X has shape {x.type.shape}; it must be 3-D")
        if self.layout == 1:
            x = ctx.emit("transpose", x, axes=(1, 0, 2))
        self.x = x
        self.seq, self.batch, self.input_size = x.type.shape
        hidden = a["hidden_size"]
        self.hidden = int(hidden) if hidden else r.type.shape[-1]
        self.gates = gates
        gh = gates * self.hidden
        if w.type.shape != (self.num_dir, gh, self.input_size):
            raise ctx.error(f"W has shape {w.type.shape}, expected "
                            f"{(self.num_dir, gh, self.input_size)}")
        if r.type.shape != (self.num_dir, gh, self.hidden):
            raise ctx.error(f"R has shape {r.type.shape}, expected "
                            f"{(self.num_dir, gh, self.hidden)}")
        self.w, self.r = w, r
        self.b = ctx.input(3) if ctx.has_input(3) else None
        if self.b is not None and self.b.type.shape != (self.num_dir, 2 * gh):
            raise ctx.error(f"B has shape {self.b.type.shape}, expected "
                            f"{(self.num_dir, 2 * gh)}")
        clip = a["clip"]
        self.clip = float(clip) if clip is not None else None

        names = list(a["activations"] or [])
        per_dir = len(default_acts)
        if not names:
            names = list(default_acts) * self.num_dir
        elif len(names) == per_dir and self.num_dir == 2:
            names = names * 2
        if len(names) != per_dir * self.num_dir:
            raise ctx.error(f"{len(names)} activations given; expected {per_dir} per direction")
        alphas = list(a["activation_alpha"] or [])
        betas = list(a["activation_beta"] or [])
        self.acts = [[_activation(ctx, names[d * per_dir + j],
                                  alphas[d * per_dir + j] if d * per_dir + j < len(alphas) else None,
                                  betas[d * per_dir + j] if d * per_dir + j < len(betas) else None)
                      for j in range(per_dir)] for d in range(self.num_dir)]
        self.started: Value | None = None   # [B, 1] sequence_lens > 0, with masks
        self.masks = self._masks()

    # -- inputs --
    def state(self, index: int, name: str) -> Value | None:
        """An initial state input [D, B, H] (layout 0) / [B, D, H] (layout 1) as [D, B, H]."""
        ctx = self.ctx
        if not ctx.has_input(index):
            return None
        s = ctx.input(index)
        want = ((self.num_dir, self.batch, self.hidden) if self.layout == 0
                else (self.batch, self.num_dir, self.hidden))
        if s.type.shape != want:
            # a state input exported at batch 1 beside an open batch (speechmos' AECMOS: h0
            # [4, 1, 96], input [batch_size, ...]): the model runs at batch 1 only, as ONNX
            # Runtime runs it; the bundle says so when a run binds another batch
            axis = 1 if self.layout == 0 else 0
            if s.type.shape[:axis] + s.type.shape[axis + 1:] == want[:axis] + want[axis + 1:] \
                    and s.type.shape[axis] == 1 and isinstance(want[axis], SymExpr):
                ctx.bb.assume([("eq", want[axis], 1, f"{name} of {ctx.node.name or ctx.node.op_type} "
                                "has batch 1")])
                s = ctx.emit("broadcast_to", s, shape=want)
            elif len(s.type.shape) == 3 and all(a == b or not isinstance(a, int)
                                                or not isinstance(b, int)
                                                for a, b in zip(s.type.shape, want)):
                # a symbolic size of its own (silero's state [2, B', 128] beside the input's
                # batch B): the same size, checked at run time
                for a, b in zip(s.type.shape, want):
                    if a != b:
                        ctx.assume("eq", a, b, f"{name}'s batch")
                s = ctx.reshape(s, want)
            else:
                raise ctx.error(f"{name} has shape {s.type.shape}, expected {want}")
        return s if self.layout == 0 else ctx.emit("transpose", s, axes=(1, 0, 2))

    def initial(self, states: Value | None, d: int) -> Value:
        if states is None:
            return self.ctx.constant(np.zeros((self.batch, self.hidden), self.dtype), "h0")
        return _take(self.ctx, states, 0, d)

    def _masks(self) -> list[Value] | None:
        """Per step, a [B, 1] bool 'this row is still inside its sequence', or None when every
        row runs the whole sequence."""
        ctx = self.ctx
        if not ctx.has_input(4):
            return None
        lens = ctx.input(4)
        if lens.type.shape != (self.batch,):
            raise ctx.error(f"sequence_lens has shape {lens.type.shape}, expected ({self.batch},)")
        known = ctx.const(4)
        if known is not None:
            if np.any(known < 0) or np.any(known > self.seq):
                raise ctx.error(f"sequence_lens {known.tolist()} must lie in [0, {self.seq}]")
            if np.all(known == self.seq):
                return None
        lens2 = ctx.reshape(lens, (self.batch, 1))
        steps = [ctx.emit("less", ctx.constant(np.full((1, 1), t, lens.type.dtype), "step"), lens2)
                 for t in range(self.seq)]
        self.started = steps[0] if steps else None
        return steps

    def weight(self, v: Value, d: int, start: int, end: int) -> Value:
        """Rows [start, end) of direction d of W or R: [end - start, K]."""
        part = _take(self.ctx, v, 0, d)
        if start == 0 and end == part.type.shape[0]:
            return part
        return _slice(self.ctx, part, 0, start, end)

    def bias(self, d: int, start: int, end: int) -> Value | None:
        """Elements [start, end) of direction d's 2*G*H bias vector."""
        if self.b is None:
            return None
        return _slice(self.ctx, _take(self.ctx, self.b, 0, d), 0, start, end)

    def projected(self, d: int, bias: Value | None) -> list[Value]:
        """X @ W[d]^T (+ bias), one [B, G*H] value per step: a single matmul over all steps."""
        ctx = self.ctx
        x2 = ctx.reshape(self.x, (self.seq * self.batch, self.input_size))
        xw = ctx.emit("matmul", x2, self.weight(self.w, d, 0, self.gates * self.hidden),
                      transpose_b=True)
        if bias is not None:
            xw = ctx.emit("add", xw, bias)
        xw = ctx.reshape(xw, (self.seq, self.batch, self.gates * self.hidden))
        return [_take(ctx, xw, 0, t) for t in range(self.seq)]

    def gate(self, pre: Value, index: int) -> Value:
        """Gate ``index`` ([B, H]) of a [B, G*H] pre-activation."""
        h = self.hidden
        return _slice(self.ctx, pre, 1, index * h, (index + 1) * h)

    def clipped(self, v: Value) -> Value:
        if self.clip is None:
            return v
        return self.ctx.emit("clip", v, min=-self.clip, max=self.clip)

    def steps(self, d: int) -> list[int]:
        return list(range(self.seq - 1, -1, -1)) if self.reverse[d] else list(range(self.seq))

    def hold(self, t: int, new: Value, old: Value) -> Value:
        """The new state where row t is inside its sequence, else the old one."""
        if self.masks is None:
            return new
        return self.ctx.emit("where", self.masks[t], new, old)

    def y_step(self, t: int, h: Value) -> Value:
        if self.masks is None:
            return h
        return self.ctx.emit("where", self.masks[t], h, self.ctx.scalar(0.0, h))

    # -- outputs --
    def outputs(self, ys: list[dict[int, Value]], finals: list[list[Value]]) -> list[Value | None]:
        """Y [T, D, B, H] (layout 1: [B, T, D, H]) from each direction's per-step outputs, and
        one [D, B, H] (layout 1: [B, D, H]) value per final-state list."""
        ctx = self.ctx
        out: list[Value | None] = []
        if ctx.node.output and ctx.node.output[0]:
            shape4 = (1, 1, self.batch, self.hidden)
            per_dir = [ctx.emit("concat", *[ctx.reshape(ys[d][t], shape4) for t in range(self.seq)],
                                axis=0) if self.seq > 1 else ctx.reshape(ys[d][0], shape4)
                       for d in range(self.num_dir)]
            y = per_dir[0] if self.num_dir == 1 else ctx.emit("concat", *per_dir, axis=1)
            if self.layout == 1:
                y = ctx.emit("transpose", y, axes=(2, 0, 1, 3))
            out.append(y)
        else:
            out.append(None)
        for states in finals:
            shape3 = (1, self.batch, self.hidden)
            if self.masks is not None and self.started is not None:
                # ONNX Runtime's final states of a row whose sequence_lens is 0 are zeros, not
                # the initial state (the spec does not say; RNN, GRU and LSTM alike)
                states = [ctx.emit("where", self.started, s, ctx.scalar(0.0, s)) for s in states]
            parts = [ctx.reshape(s, shape3) for s in states]
            yh = parts[0] if self.num_dir == 1 else ctx.emit("concat", *parts, axis=0)
            if self.layout == 1:
                yh = ctx.emit("transpose", yh, axes=(1, 0, 2))
            out.append(yh)
        return out
