"""Converters for recurrent and control-flow ONNX operators (LSTM, GRU, RNN, If...) with a
sequence length and conditions fixed at export.

The recurrent operators take the fast path of ``rnn_fast.py`` (one projection matmul, then the
whole time loop as one kernel) whenever it computes them exactly. The others are unrolled over
the (static) sequence length: the input projection of every step is one matmul over the whole
sequence, then each step is a small matmul with the recurrence weights plus elementwise gates.
``sequence_lens`` given at run time is honoured with selects: a step past a batch row's length
keeps that row's state and writes zeros to ``Y``.

Loop and Scan are unrolled where their iterations have a small bound at export; the others run
as the VM's counted loop (``loops.py``, format 1.8).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ...packager.errors import ExportError
from ...packager.ir.graph import Value
from . import rnn_fast
from .recurrence import _RNN_ATTRS, _Recurrence, _slice, _take
from .branches import emit_if, graph_inputs_behind
from .loops import NeedsRunTimeLoop, run_time_loop, run_time_scan
from .registry import NodeContext, converter

# ---- activations --------------------------------------------------------------------------------

# name: (default alpha, default beta)
def _add_bias(ctx: NodeContext, a: Value | None, b: Value | None) -> Value | None:
    if a is None:
        return b
    if b is None:
        return a
    return ctx.emit("add", a, b)


# ---- RNN ----------------------------------------------------------------------------------------

@converter("RNN", since=1, attrs=_RNN_ATTRS)
def _rnn(ctx: NodeContext) -> list[Value | None]:
    rec = _Recurrence(ctx, 1, ["Tanh"])
    if rnn_fast.fits(ctx, rec, "rnn"):
        return rnn_fast.fused_recurrence(ctx, rec, "rnn")
    h0 = rec.state(5, "initial_h")
    hsz = rec.hidden
    ys, finals = [], []
    for d in range(rec.num_dir):
        bias = _add_bias(ctx, rec.bias(d, 0, hsz), rec.bias(d, hsz, 2 * hsz))
        xw = rec.projected(d, bias)
        r = rec.weight(rec.r, d, 0, hsz)
        (f,) = rec.acts[d]
        h = rec.initial(h0, d)
        y = {}
        for t in rec.steps(d):
            pre = ctx.emit("add", xw[t], ctx.emit("matmul", h, r, transpose_b=True))
            h = rec.hold(t, f(rec.clipped(pre)), h)
            y[t] = rec.y_step(t, h)
        ys.append(y)
        finals.append(h)
    return rec.outputs(ys, [finals])


# ---- GRU ----------------------------------------------------------------------------------------

@converter("GRU", since=1, attrs={**_RNN_ATTRS, "linear_before_reset": 0})
def _gru(ctx: NodeContext) -> list[Value | None]:
    rec = _Recurrence(ctx, 3, ["Sigmoid", "Tanh"])
    if rnn_fast.fits(ctx, rec, "gru"):
        return rnn_fast.fused_recurrence(ctx, rec, "gru")
    h0 = rec.state(5, "initial_h")
    hsz = rec.hidden
    linear = bool(ctx.attrs["linear_before_reset"])
    one = ctx.constant(np.ones((1, 1), rec.dtype), "one")
    ys, finals = [], []
    for d in range(rec.num_dir):
        # W biases of all three gates and R biases of z and r (of h too unless it is applied
        # before the reset) add to the input projection once.
        wb = rec.bias(d, 0, 3 * hsz)
        rb_zr = rec.bias(d, 3 * hsz, 5 * hsz)
        rb_h = rec.bias(d, 5 * hsz, 6 * hsz)
        if rb_zr is not None:
            rb_all = ctx.emit("concat", rb_zr, rb_h if not linear else
                              ctx.constant(np.zeros((hsz,), rec.dtype), "zero"), axis=0)
            bias = ctx.emit("add", wb, rb_all)
        else:
            bias = None
        xw = rec.projected(d, bias)
        r_zr = rec.weight(rec.r, d, 0, 2 * hsz)
        r_h = rec.weight(rec.r, d, 2 * hsz, 3 * hsz)
        f, g = rec.acts[d]
        h = rec.initial(h0, d)
        y = {}
        for t in rec.steps(d):
            x_zr = _slice(ctx, xw[t], 1, 0, 2 * hsz)
            x_h = rec.gate(xw[t], 2)
            zr = ctx.emit("add", x_zr, ctx.emit("matmul", h, r_zr, transpose_b=True))
            z = f(rec.clipped(rec.gate(zr, 0)))
            rr = f(rec.clipped(rec.gate(zr, 1)))
            if linear:
                hr = ctx.emit("matmul", h, r_h, transpose_b=True)
                if rb_h is not None:
                    hr = ctx.emit("add", hr, rb_h)
                pre = ctx.emit("add", x_h, ctx.emit("multiply", rr, hr))
            else:
                pre = ctx.emit("add", x_h, ctx.emit("matmul", ctx.emit("multiply", rr, h), r_h,
                                                    transpose_b=True))
            cand = g(rec.clipped(pre))
            # H = (1 - z) * cand + z * H
            new = ctx.emit("add", ctx.emit("multiply", ctx.emit("subtract", one, z), cand),
                           ctx.emit("multiply", z, h))
            h = rec.hold(t, new, h)
            y[t] = rec.y_step(t, h)
        ys.append(y)
        finals.append(h)
    return rec.outputs(ys, [finals])


# ---- LSTM ---------------------------------------------------------------------------------------

@converter("LSTM", since=1, attrs={**_RNN_ATTRS, "input_forget": 0})
def _lstm(ctx: NodeContext) -> list[Value | None]:
    return convert_lstm(ctx)


def convert_lstm(ctx: NodeContext, recurrent_input: Callable[[Value], Value] | None = None,
                 quantize_h: bool = False) -> list[Value | None]:
    """The LSTM node of ``ctx``. ``recurrent_input(h)``, when given, is what multiplies R at
    each step in place of h (com.microsoft.DynamicQuantizeLSTM quantizes h every step); it
    unrolls the steps, unless ``quantize_h`` says the fused recurrence kernel computes the same
    (h through DynamicQuantizeLinear and back) and the node fits that kernel."""
    rec = _Recurrence(ctx, 4, ["Sigmoid", "Tanh", "Tanh"])
    if (recurrent_input is None or quantize_h) and rnn_fast.fits(ctx, rec, "lstm"):
        return rnn_fast.fused_recurrence(ctx, rec, "lstm", quantize_h=quantize_h)
    h0 = rec.state(5, "initial_h")
    c0 = rec.state(6, "initial_c")
    hsz = rec.hidden
    coupled = bool(ctx.attrs["input_forget"])
    peep = ctx.input(7) if ctx.has_input(7) else None
    if peep is not None and peep.type.shape != (rec.num_dir, 3 * hsz):
        raise ctx.error(f"P has shape {peep.type.shape}, expected {(rec.num_dir, 3 * hsz)}")
    one = ctx.constant(np.ones((1, 1), rec.dtype), "one")
    ys, finals_h, finals_c = [], [], []
    for d in range(rec.num_dir):
        bias = _add_bias(ctx, rec.bias(d, 0, 4 * hsz), rec.bias(d, 4 * hsz, 8 * hsz))
        xw = rec.projected(d, bias)
        r = rec.weight(rec.r, d, 0, 4 * hsz)
        if peep is not None:
            pd = _take(ctx, peep, 0, d)
            p_i, p_o, p_f = (_slice(ctx, pd, 0, k * hsz, (k + 1) * hsz) for k in range(3))
        f, g, hact = rec.acts[d]
        h = rec.initial(h0, d)
        c = rec.initial(c0, d)
        y = {}
        for t in rec.steps(d):
            h_in = h if recurrent_input is None else recurrent_input(h)
            pre = ctx.emit("add", xw[t], ctx.emit("matmul", h_in, r, transpose_b=True))
            i_pre, o_pre, f_pre, c_pre = (rec.gate(pre, k) for k in range(4))
            if peep is not None:
                i_pre = ctx.emit("add", i_pre, ctx.emit("multiply", p_i, c))
                f_pre = ctx.emit("add", f_pre, ctx.emit("multiply", p_f, c))
            i = f(rec.clipped(i_pre))
            fg = ctx.emit("subtract", one, i) if coupled else f(rec.clipped(f_pre))
            cand = g(rec.clipped(c_pre))
            c_new = ctx.emit("add", ctx.emit("multiply", fg, c), ctx.emit("multiply", i, cand))
            if peep is not None:
                o_pre = ctx.emit("add", o_pre, ctx.emit("multiply", p_o, c_new))
            o = f(rec.clipped(o_pre))
            h_new = ctx.emit("multiply", o, hact(c_new))
            h = rec.hold(t, h_new, h)
            c = rec.hold(t, c_new, c)
            y[t] = rec.y_step(t, h)
        ys.append(y)
        finals_h.append(h)
        finals_c.append(c)
    return rec.outputs(ys, [finals_h, finals_c])


# ---- control flow: subgraphs inlined at export ---------------------------------------------------

_MAX_UNROLL = 4096   # iterations a Loop or Scan may be unrolled into


def _bool_const(ctx: NodeContext, v: Value, what: str) -> bool | None:
    data = v.data if hasattr(v, "data") else None
    if data is None:
        return None
    if data.size != 1:
        raise ctx.error(f"{what} has {data.size} elements; it must hold one")
    return bool(data.reshape(()))


@converter("If", since=1, attrs={"then_branch": None, "else_branch": None})
def _if(ctx: NodeContext) -> list[Value]:
    """A condition known at export inlines one branch; one known only at run time runs as the
    VM's branch (format 1.7, ``branches.py``): only the taken branch runs, and outputs whose
    extents differ between the branches get size variables that the taken branch binds."""
    then_g, else_g = ctx.attrs["then_branch"], ctx.attrs["else_branch"]
    if then_g is None or else_g is None:
        raise ctx.error("then_branch and else_branch are required")
    cond = ctx.input(0)
    known = _bool_const(ctx, cond, "the condition")
    if known is not None:
        return ctx.inline(then_g if known else else_g, [])
    if cond.type.dtype != "bool":
        raise ctx.error(f"the condition is {cond.type.dtype}, not bool")
    if cond.type.shape not in ((), (1,)):
        raise ctx.error(f"the condition has shape {cond.type.shape}; it must hold one value")
    from .symvalue import SymValue, materialize

    inputs = graph_inputs_behind(ctx, cond)
    hint = _run_time_condition_hint(ctx, inputs)
    if isinstance(cond, SymValue):
        cond = materialize(ctx.bb, cond)

    def mismatch(i: int, a: Value, b: Value) -> str:
        return (f"output {i}: the branches give {a.type.dtype}{list(a.type.shape)} and "
                f"{b.type.dtype}{list(b.type.shape)}; with a condition computed at run time both "
                f"must match (shapes are static); {hint}")

    try:
        return emit_if(ctx, ctx.reshape(cond, (1,)), then_g, else_g, not inputs, hint, mismatch)
    except ExportError as exc:
        if _HINT_MARK in str(exc):   # an inner If said it already
            raise
        raise ExportError(f"{exc}; {hint}") from None


_HINT_MARK = "is known only at run time, so both branches are compiled"


def _run_time_condition_hint(ctx: NodeContext, inputs: list[str]) -> str:
    """What a user can do when a branch of an If with a run-time condition cannot be compiled:
    fix the graph inputs the condition depends on."""
    named = ", ".join(repr(n) for n in inputs)
    what = (f"it depends on input {named}: --bind NAME=FILE.npy fixes an input's value at "
            "export, --input-shape its size" if inputs else
            "--bind NAME=FILE.npy fixes an input's value at export, --input-shape its size")
    return f"the If's condition {_HINT_MARK} ({what})"


def _stack(ctx: NodeContext, parts: list[Value], axis: int) -> Value:
    """Stack same-shaped values along a new ``axis``."""
    shape = parts[0].type.shape
    axis %= len(shape) + 1
    lifted = [ctx.reshape(p, shape[:axis] + (1,) + shape[axis:]) for p in parts]
    return lifted[0] if len(lifted) == 1 else ctx.emit("concat", *lifted, axis=axis)


def _scan_steps(ctx: NodeContext, body, states: list[Value], scans: list[Value],
                in_axes: Sequence[int], in_rev: Sequence[int], out_axes: Sequence[int],
                out_rev: Sequence[int]) -> list[Value]:
    """Unroll one Scan (opset 9 semantics) over static trip counts."""
    lengths = {x.type.shape[a] for x, a in zip(scans, in_axes)}
    if len(lengths) != 1:
        raise ctx.error(f"scan inputs have different lengths along their axes: {sorted(lengths)}")
    (steps,) = lengths
    if not isinstance(steps, int):
        return _scan_masked(ctx, body, states, scans, in_axes, in_rev, out_axes, out_rev, steps)
    if steps > _MAX_UNROLL:
        raise ctx.error(f"{steps} iterations: at most {_MAX_UNROLL} are unrolled")
    n_state = len(states)
    per_step: list[list[Value]] = []
    for t in range(steps):
        slices = [_take(ctx, x, a, steps - 1 - t if r else t)
                  for x, a, r in zip(scans, in_axes, in_rev)]
        outs = ctx.inline(body, states + slices)
        states = outs[:n_state]
        per_step.append(outs[n_state:])
    n_out = len(per_step[0]) if per_step else len(body.output) - n_state
    if steps == 0:
        raise ctx.error("a scan over zero steps is not supported")
    results = list(states)
    for j in range(n_out):
        parts = [step[j] for step in per_step]
        if out_rev[j]:
            parts = parts[::-1]
        results.append(_stack(ctx, parts, out_axes[j]))
    return results


def _scan_masked(ctx: NodeContext, body, states: list[Value], scans: list[Value],
                 in_axes: Sequence[int], in_rev: Sequence[int], out_axes: Sequence[int],
                 out_rev: Sequence[int], steps) -> list[Value]:
    """A Scan over an axis whose length ``steps`` is known only at run time: unrolled to its
    largest value under ``--max-shape``; step ``t`` reads element ``t`` (a run-time index, so
    one past the real length reads inside the input and is discarded), a step past the length
    keeps the states (``where``), and each scan output is stacked at the bound and sliced to
    the real length (its rows the steps that ran, in order, or at the end of the reversed
    stack)."""
    from .symvalue import make, materialize

    try:
        bound = _unroll_bound(ctx, steps, "the scan length")
    except ExportError:   # no bound under --max-shape, or too many to unroll: the VM's loop
        return run_time_scan(ctx, body, states, scans, in_axes, in_rev, out_axes, out_rev, steps)
    length = materialize(ctx.bb, make(ctx, np.array([steps], dtype=object), "int64", "steps"))
    last = ctx.emit("subtract", length, ctx.constant(np.array([1], np.int64), "one"))
    n_state = len(states)
    per_step: list[list[Value]] = []
    for t in range(bound):
        step = ctx.bb.emit_op("full", shape=(1,), value=t, dtype="int64", name="step")
        running = ctx.reshape(ctx.emit("less", step, length), ())
        back = ctx.emit("subtract", last, step)   # negative past the length: clamped by the kernel
        slices = [ctx.reshape(ctx.emit("take", x, back if r else step, axis=a),
                              x.type.shape[:a] + x.type.shape[a + 1:])
                  for x, a, r in zip(scans, in_axes, in_rev)]
        outs = ctx.inline(body, states + slices)
        for k, (a, b) in enumerate(zip(outs[:n_state], states)):
            if a.type != b.type:
                raise ctx.error(f"state {k} changes from {b.type} to {a.type}")
        states = [ctx.emit("where", running, a, b) for a, b in zip(outs[:n_state], states)]
        per_step.append(outs[n_state:])
    results = list(states)
    for j in range(len(body.output) - n_state):
        parts = [step[j] for step in per_step]
        axis = out_axes[j] % (len(parts[0].type.shape) + 1)
        if out_rev[j]:   # the real rows are the last ``steps`` of the reversed stack
            stacked = _stack(ctx, parts[::-1], axis)
            results.append(ctx.emit("strided_slice", stacked, starts=(bound - steps,),
                                    ends=(bound,), axes=(axis,), steps=(1,)))
        else:
            stacked = _stack(ctx, parts, axis)
            results.append(ctx.emit("strided_slice", stacked, starts=(0,), ends=(steps,),
                                    axes=(axis,), steps=(1,)))
    return results


def _scan_attrs(ctx: NodeContext, n_scan: int, n_out: int, opset8: bool = False
                ) -> tuple[list[int], list[int], list[int], list[int]]:
    a = ctx.attrs
    in_axes = list(a.get("scan_input_axes") or [0] * n_scan)
    in_rev = list(a.get("scan_input_directions") or a.get("directions") or [0] * n_scan)
    out_axes = list(a.get("scan_output_axes") or [0] * n_out)
    out_rev = list(a.get("scan_output_directions") or [0] * n_out)
    if len(in_axes) != n_scan or len(in_rev) != n_scan or len(out_axes) != n_out or \
            len(out_rev) != n_out:
        raise ctx.error("scan axes/directions attributes do not match the number of scan "
                        "inputs and outputs")
    return in_axes, in_rev, out_axes, out_rev


@converter("Scan", since=8, attrs={"body": None, "num_scan_inputs": None, "directions": None})
def _scan_v8(ctx: NodeContext) -> list[Value]:
    body, m = ctx.attrs["body"], int(ctx.attrs["num_scan_inputs"])
    if ctx.has_input(0):
        lens = ctx.const(0)
        if lens is None:
            raise ctx.error("sequence_lens must be known at export")
    rest = [ctx.input(i) for i in range(1, ctx.num_inputs)]
    states, scans = rest[:len(rest) - m], rest[len(rest) - m:]
    batch = (states + scans)[0].type.shape[0]
    if ctx.has_input(0):
        seq = scans[0].type.shape[1]
        if np.any(ctx.const(0) != seq):
            raise ctx.error("sequence_lens shorter than the scan inputs is not supported")
    n_out = len(body.output) - len(states)
    _, in_rev, _, _ = _scan_attrs(ctx, m, n_out)
    per_batch = []
    for b in range(batch):
        per_batch.append(_scan_steps(ctx, body, [_take(ctx, s, 0, b) for s in states],
                                     [_take(ctx, x, 0, b) for x in scans], [0] * m, in_rev,
                                     [0] * n_out, [0] * n_out))
    return [_stack(ctx, [pb[j] for pb in per_batch], 0) for j in range(len(per_batch[0]))]


@converter("Scan", since=9, attrs={"body": None, "num_scan_inputs": None,
                                    "scan_input_axes": None, "scan_input_directions": None,
                                    "scan_output_axes": None, "scan_output_directions": None})
def _scan_v9(ctx: NodeContext) -> list[Value]:
    body, m = ctx.attrs["body"], int(ctx.attrs["num_scan_inputs"])
    xs = [ctx.input(i) for i in range(ctx.num_inputs)]
    states, scans = xs[:len(xs) - m], xs[len(xs) - m:]
    n_out = len(body.output) - len(states)
    in_axes, in_rev, out_axes, out_rev = _scan_attrs(ctx, m, n_out)
    in_axes = [a % len(x.type.shape) for a, x in zip(in_axes, scans)]
    return _scan_steps(ctx, body, states, scans, in_axes, in_rev, out_axes, out_rev)


@converter("Loop", since=1, attrs={"body": None})
def _loop(ctx: NodeContext) -> list[Value]:
    """A loop whose trip count is known at export (or bounded under ``--max-shape``), unrolled;
    one whose count has no such bound runs as the VM's loop (format 1.8, ``loops.py``)."""
    bb, mod = ctx.bb, ctx.bb.mod
    mark, rel_mark = len(bb._block.bindings), len(mod.relations)
    dynamic, functions = dict(mod.dynamic_sizes), set(mod.functions)
    try:
        return _loop_unrolled(ctx)
    except NeedsRunTimeLoop:
        del bb._block.bindings[mark:]
        del mod.relations[rel_mark:]
        mod.dynamic_sizes.clear()
        mod.dynamic_sizes.update(dynamic)
        for name in set(mod.functions) - functions:
            del mod.functions[name]
    return run_time_loop(ctx)


def _loop_unrolled(ctx: NodeContext) -> list[Value]:
    """A loop whose trip count is known at export, unrolled. Its condition may be computed at run
    time (``_loop_run_time_condition``); with one known at export, the loop unrolls only the
    iterations it runs. ``NeedsRunTimeLoop`` when the iterations have no bound at export."""
    body = ctx.attrs["body"]
    trip = None
    carried = [ctx.input(i) for i in range(2, ctx.num_inputs)]
    if ctx.has_input(0):
        try:
            limit = _symbolic_trip_count(ctx)
        except ExportError as exc:   # a size expression with no bound under --max-shape
            raise NeedsRunTimeLoop(str(exc)) from None
        if limit is not None:
            bound, limit = limit
            cond = ctx.input(1) if ctx.has_input(1) else ctx.constant(np.array(True), "cond")
            return _loop_run_time_condition(ctx, bound, cond, 0, carried, [], limit)
        if ctx.const(0) is None:
            raise NeedsRunTimeLoop("the trip count is computed at run time")
        trip = int(np.asarray(ctx.const(0)).reshape(()))
    cond = True
    if ctx.has_input(1):
        known = _bool_const(ctx, ctx.input(1), "the condition")
        if known is None:
            return _loop_run_time_condition(ctx, trip, ctx.input(1), 0, carried, [])
        cond = bool(known)
    if trip is None:
        trip = _MAX_UNROLL + 1
    n_carried = len(carried)
    scans: list[list[Value]] = []
    it = 0
    while cond and it < trip:
        if it >= _MAX_UNROLL:
            raise NeedsRunTimeLoop(f"the loop runs more than {_MAX_UNROLL} iterations")
        outs = ctx.inline(body, [ctx.constant(np.array(it, np.int64), "iter"),
                                   ctx.constant(np.array(cond), "cond")] + carried)
        known = _bool_const(ctx, outs[0], "the body's condition")
        if known is None:
            return _loop_run_time_condition(ctx, trip, outs[0], it + 1, outs[1:1 + n_carried],
                                            scans + [outs[1 + n_carried:]])
        cond = known
        carried = outs[1:1 + n_carried]
        scans.append(outs[1 + n_carried:])
        it += 1
    n_scan = len(body.output) - 1 - n_carried
    if n_scan and not scans:
        raise ctx.error("a loop with scan outputs that runs zero iterations is not supported")
    return carried + [_stack(ctx, [s[j] for s in scans], 0) for j in range(n_scan)]


def _symbolic_trip_count(ctx: NodeContext) -> tuple[int, Value] | None:
    """A trip count computed from the input sizes (``Shape(x)[0]``, a size expression), as its
    upper bound under ``--max-shape`` and its value as a run-time int64 tensor of shape (1,);
    None when it is a constant or not a size expression."""
    from ...packager.ir.sym import SymExpr
    from .symvalue import dims_of, make, materialize

    if ctx.const(0) is not None:
        return None
    dims = dims_of(ctx.inputs[0])
    if dims is None or len(dims) != 1 or not isinstance(dims[0], SymExpr):
        return None
    trip = dims[0]
    value = make(ctx, np.array([trip], dtype=object), "int64", "trip")
    return _unroll_bound(ctx, trip, "the trip count"), materialize(ctx.bb, value)


def _unroll_bound(ctx: NodeContext, steps, what: str) -> int:
    """The largest value of the size expression ``steps`` under ``--max-shape`` (the importer's
    ``bb.size_bounds``), at most ``_MAX_UNROLL``; a one-line error when it has none."""
    from ...packager.ir.sym import nondecreasing_in, substitute

    bounds = getattr(ctx.bb, "size_bounds", {})
    names = steps.variables()
    bound = None
    if names <= set(bounds) and nondecreasing_in(steps, names):
        bound = substitute(steps, {v: bounds[v] for v in names})
    if not isinstance(bound, int):
        raise ctx.error(f"{what} {steps} is known only at run time, so every iteration up to "
                        "its largest value is compiled: give --max-shape for the inputs whose "
                        f"sizes it depends on ({', '.join(sorted(names))})")
    if bound > _MAX_UNROLL:
        raise ctx.error(f"{what} {steps} is at most {bound} under --max-shape: at most "
                        f"{_MAX_UNROLL} iterations are unrolled")
    return max(bound, 0)


def _loop_run_time_condition(ctx: NodeContext, trip: int | None, cond: Value, start: int,
                             carried: list[Value], scans: list[list[Value]],
                             limit: Value | None = None) -> list[Value]:
    """The iterations from ``start`` of a loop whose condition ``cond`` is computed at run time
    (iterations ``0 .. start - 1`` already ran, giving ``carried`` and ``scans``): every
    iteration up to the trip count is unrolled, and one that runs after the condition turned
    false leaves the carried values as they were (``where`` on a running flag, the flag and-ed
    with each iteration's condition). The scan outputs are planned for the trip count and
    returned at the number of iterations that ran: a size variable bound at run time
    (BIND_SIZE, as NonZero's count). Carried values must keep their shapes. A trip count
    computed at run time (``limit``, int64 of shape (1,), at most ``trip``) stops the
    iterations the same way."""
    from .sequences import SeqValue

    body = ctx.attrs["body"]
    if any(isinstance(v, SeqValue) for v in carried):   # the VM's loop appends its elements
        raise NeedsRunTimeLoop("a sequence is carried past a condition computed at run time")
    if trip is None or trip > _MAX_UNROLL:
        raise NeedsRunTimeLoop("the loop condition is computed at run time and the trip count "
                               f"is {'absent' if trip is None else trip}")
    n_carried = len(carried)
    running = ctx.reshape(_as_bool(ctx, cond, "the loop condition"), ())
    count = ctx.constant(np.array([start], np.int64), "ran")
    ran: list[list[Value]] = [list(s) for s in scans]
    for it in range(start, trip):
        if limit is not None:   # a trip count computed at run time: iteration it runs if it < limit
            below = ctx.emit("less", ctx.constant(np.array([it], np.int64), "iter"), limit)
            running = ctx.emit("logical_and", running, ctx.reshape(below, ()))
        # past a trip count computed at run time the body runs on discarded values: its
        # iteration number is then a run-time tensor, so an index it takes along a size known at
        # run time only is not checked at export (Gather wraps it into range at run time)
        number = ctx.constant(np.array(it, np.int64), "iter") if limit is None else \
            ctx.bb.emit_op("full", shape=(), value=it, dtype="int64", name="iter")
        outs = ctx.inline(body, [number, running] + carried)
        new = outs[1:1 + n_carried]
        for k, (a, b) in enumerate(zip(new, carried)):
            if a.type != b.type:
                raise ctx.error(f"carried value {k} changes from {b.type} to {a.type}: a loop "
                                "whose condition is computed at run time needs carried values "
                                "of fixed shape")
        carried = [ctx.emit("where", running, a, b) for a, b in zip(new, carried)]
        ran.append(outs[1 + n_carried:])
        count = ctx.emit("add", count, ctx.emit("cast", ctx.reshape(running, (1,)),
                                                dtype="int64"))
        running = ctx.emit("logical_and", running, ctx.reshape(
            _as_bool(ctx, outs[0], "the body's condition"), ()))
    n_scan = len(body.output) - 1 - n_carried
    if not n_scan:
        return carried
    if not ran:
        raise ctx.error("a loop with scan outputs and a trip count of 0 is not supported")
    if start == trip and limit is None:   # the condition turned run-time on the last
        # iteration: every iteration ran
        return carried + [_stack(ctx, [s[j] for s in ran], 0) for j in range(n_scan)]
    after, rows = ctx.bb.bind_size(count, len(ran), "iterations")
    return carried + [ctx.bb.emit_op("prefix_rows", _stack(ctx, [s[j] for s in ran], 0), after,
                                     count=rows) for j in range(n_scan)]


def _as_bool(ctx: NodeContext, v: Value, what: str) -> Value:
    n = 1
    for d in v.type.shape:
        n = n * d if isinstance(d, int) else -1
    if n != 1:
        raise ctx.error(f"{what} must hold one element, not {v.type}")
    return v if v.type.dtype == "bool" else ctx.emit("cast", v, dtype="bool")


# ---- operators defined by an ONNX function body --------------------------------------------------

_ONNX_DTYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6,
                "int64": 7, "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13,
                "bfloat16": 16}


def _resolve_refs(node, attrs: dict, missing: set[str]):
    """A copy of function-body ``node`` with attribute references replaced by the calling node's
    attributes and inputs the caller left out blanked, also inside its subgraphs."""
    import onnx

    out = onnx.NodeProto()
    out.CopyFrom(node)
    del out.input[:]
    out.input.extend("" if name in missing else name for name in node.input)
    del out.attribute[:]
    for a in node.attribute:
        if a.HasField("ref_attr_name"):
            if a.ref_attr_name in attrs:
                new = onnx.AttributeProto()
                new.CopyFrom(attrs[a.ref_attr_name])
                new.name = a.name
                out.attribute.append(new)
            continue
        new = onnx.AttributeProto()
        new.CopyFrom(a)
        graphs = [new.g] if new.type == onnx.AttributeProto.GRAPH else list(new.graphs)
        for g in graphs:
            nodes = [_resolve_refs(n, attrs, missing) for n in g.node]
            del g.node[:]
            g.node.extend(nodes)
        out.attribute.append(new)
    return out


def expand_function(ctx: NodeContext) -> list[Value | None]:
    """Convert a node through the function body its ONNX schema defines (fixed for the node's
    input types when the body depends on them), as ONNX's ``*_expanded`` test models do."""
    import onnx
    from onnx import defs, helper

    node = ctx.node
    try:
        schema = defs.get_schema(node.op_type, ctx.opset, node.domain)
    except defs.SchemaError:
        raise ctx.error("no ONNX schema defines this operator") from None
    attrs = {a.name: a for a in node.attribute}
    full = onnx.NodeProto()
    full.CopyFrom(node)
    for name, attr in schema.attributes.items():
        if name not in attrs and attr.default_value and attr.default_value.type:
            full.attribute.append(attr.default_value)
            attrs[name] = attr.default_value
    types = []
    for v in ctx.inputs:
        if v is None:
            types.append(onnx.TypeProto())
        else:
            types.append(helper.make_tensor_type_proto(_ONNX_DTYPES[v.type.dtype],
                                                       list(v.type.shape)))
    fproto = onnx.FunctionProto()
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= ctx.opset]
        if not versions:
            raise ctx.error("its ONNX function body needs a newer opset")
        fproto.ParseFromString(schema.get_function_with_opset_version(max(versions)))
    elif schema.has_context_dependent_function:
        versions = [v for v in schema.context_dependent_function_opset_versions
                    if v <= ctx.opset]
        if not versions:
            raise ctx.error("its ONNX function body needs a newer opset")
        body = schema.get_context_dependent_function_with_opset_version(
            max(versions), full.SerializeToString(), [t.SerializeToString() for t in types])
        if not body:
            raise ctx.error("ONNX defines no function body for these input types")
        fproto.ParseFromString(body)
    else:
        raise ctx.error("ONNX defines no function body for this operator")
    values: dict[str, Value] = {}
    missing: set[str] = set()
    for i, name in enumerate(fproto.input):
        if i < len(ctx.inputs) and ctx.inputs[i] is not None:
            values[name] = ctx.inputs[i]
        else:
            missing.add(name)
    nodes = [_resolve_refs(n, attrs, missing) for n in fproto.node]
    wanted = [name for i, name in enumerate(fproto.output)
              if i < len(node.output) and node.output[i]]
    graph = helper.make_graph(nodes, f"{node.op_type}_function", [],
                              [helper.make_value_info(name, onnx.TypeProto()) for name in wanted])
    opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version
              for o in fproto.opset_import}
    got = iter(ctx.inline(graph, [], isolated=values, opsets=opsets))
    return [next(got) if i < len(node.output) and node.output[i] else None
            for i in range(len(fproto.output))]
