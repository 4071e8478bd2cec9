"""Tabulate chains of quantized elementwise operations: every 8-bit ``quantize`` whose value is
an elementwise function of one 8-bit tensor (through dequantize, float arithmetic with
constants, activations, and quantize/dequantize round trips) becomes one ``lut8`` lookup.

What ONNX Runtime's QDQ models are full of (a Paddle PP-LCNet block writes HardSwish as
Add/Clip/Mul/Div and a learnable affine as Mul/Add, each step between QuantizeLinear /
DequantizeLinear): ``q = quantize(f(dequantize(s)), ...)`` with ``f`` made of elementwise
operations whose other operands are constants. Such a ``q`` depends on ``s`` alone, element by
element, and on the element's channel where a constant varies along one axis (a per-channel
scale, a ``[1, C, 1, 1]`` multiplier). Its 256 possible values per channel are computed here
with the operators' numpy references (the same definitions constant folding uses), so the
table holds exactly what the chain computes; the run-time cost is one byte load per element
instead of a float round trip per step.

Matched, for each ``quantize`` to int8/uint8: walk back through elementwise
operations (``ops/registry.py`` ELEMWISE) whose results have the quantize's shape; a constant
is a leaf, an int8/uint8 value is a leaf (or, when it is itself tabulated, its source), and
anything else stops the match. It applies when exactly one non-constant leaf ``s`` remains
(int8/uint8, the same shape) and the constants vary along at most one axis (an axis of static
extent: the batch and image sizes may be open, as in Paddle's and YOLO's files, where the table's
lookup runs on the generic loop nest with run-time extents and the chain's float32 quantize ->
dequantize pairs leave the float convolutions' epilogues).

A table whose input is the 8-bit result of a ``qconv2d`` read by it alone goes into that
kernel (a 7th input): it looks each result up as it copies it out, so the activation after a
convolution costs no pass over memory of its own.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Call, Constant, Function, IRModule, Value
from ..ops.qlookup import gate_fits
from ..ops.registry import ELEMWISE, OPS
from ..options import CompileOptions
from .common import map_functions, rebind_calls
from .fuse_qdq_common import calls_and_uses
from .simplify import eliminate_dead_code

_I8 = ("int8", "uint8")


def tabulate_quantized_chains(mod: IRModule, options: CompileOptions) -> IRModule:
    """The tables (see the module doc), with the integer kernels (``options.int8_kernels``) and
    ``options.lut8`` (False: the chains stay as they are, for comparison)."""
    if not (options.int8_kernels and options.lut8):
        return mod
    mod = eliminate_dead_code(map_functions(mod, _tabulate_in_function))
    return eliminate_dead_code(map_functions(mod, _fold_into_products))


# Integer kernels that take a lut8's table as a 7th input and look their 8-bit results up in
# it as they store them: codegen/qgemm.py's qconv2d, in the copy out of its staging rows (a
# byte loop already). Not qdwconv2d: there a lookup per lane cost its packed stores, and the
# recognizer ran no faster (15.8 / 16.1 ms CPU time without / with); on open sizes a table
# read by a dequantize alone goes into it with the dequantize (``_tables_into_depthwise``:
# each plane's bytes staged, then looked up).
_TAKES_TABLE = ("qconv2d",)


def _fold_into_products(fn: Function) -> Function:
    """lut8(p) where p is the 8-bit result of a ``_TAKES_TABLE`` kernel read by this lut8 alone,
    the table per output channel or one row: the product with the table as a 7th input."""
    defs: dict[int, Call] = {}
    uses: dict[int, int] = {}
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
            for a in b.value.args:
                uses[id(a)] = uses.get(id(a), 0) + 1
    for o in fn.outputs:
        uses[id(o)] = uses.get(id(o), 0) + 1
    folded: dict[int, Call] = {}
    for b in fn.bindings():
        c = b.value
        if not (isinstance(c, Call) and c.op == "lut8" and c.attrs.get("axis") in (1, -1)):
            continue
        p = defs.get(id(c.args[0]))
        if (p is None or p.op not in _TAKES_TABLE or len(p.args) != 6
                or p.attrs.get("dtype") not in _I8 or uses.get(id(c.args[0])) != 1):
            continue
        attrs = p.attrs
        if not all(isinstance(d, int) for d in b.var.type.shape):
            # run-time extents: the columns that differ, for the kernel's clamp and lookup
            # (codegen/qgemm_conv.py ``_lut_open``; fixed shapes unchanged)
            hints = _table_hints(c.args[1].data)
            attrs = {**attrs, "table_cols": (hints["col_lo"], hints["col_hi"])}
        folded[id(b.var)] = Call(p.op, list(p.args) + [c.args[1]], attrs, b.var.type)
    return rebind_calls(fn, folded)


def _tabulate_in_function(fn: Function) -> Function:
    defs: dict[int, Call] = {}
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
    # id(tabulated 8-bit var) -> (the one 8-bit value it is a table of, the constants of its cone)
    source: dict[int, tuple[Value, list]] = {}
    tables: dict[int, Call] = {}
    for b in fn.bindings():
        c = b.value
        if not (isinstance(c, Call) and c.op == "quantize" and c.attrs.get("dtype") in _I8):
            continue
        leaves: set[int] = set()
        consts: list[np.ndarray] = []
        src = _leaves(b.var, defs, source, leaves, consts, b.var.type.shape, top=True)
        if src is None or len(leaves) != 1:
            continue
        s = src[next(iter(leaves))]
        if s is b.var:
            continue
        axis = _table_axis(consts, b.var.type.shape)
        if axis is None or axis == -2 or (axis >= 0 and not isinstance(s.type.shape[axis], int)):
            continue
        table = _evaluate(b.var, s, defs, source, axis)
        if table is None:
            continue
        source[id(b.var)] = (s, consts)
        tables[id(b.var)] = Call("lut8", [s, Constant(f"{b.var.name}_lut", table)],
                                 {"axis": axis}, b.var.type)
    return rebind_calls(fn, tables)


def _leaves(v: Value, defs: dict, source: dict, leaves: set, consts: list, shape,
            top: bool = False) -> dict | None:
    """The non-constant leaves of ``v``'s elementwise cone, {id: value}, adding constants to
    ``consts``; None when the cone holds a non-elementwise operation or a non-8-bit leaf."""
    if isinstance(v, Constant):
        consts.append(v.data)
        return {}
    if not top and v.type.dtype in _I8 and tuple(v.type.shape) == tuple(shape):
        s, inner = source.get(id(v), (v, []))
        consts.extend(inner)       # a tabulated value's own constants (its channel axis)
        leaves.add(id(s))
        return {id(s): s}
    c = defs.get(id(v))
    if c is None or OPS.get(c.op) is None or OPS[c.op].kind != ELEMWISE:
        return None
    if tuple(v.type.shape) != tuple(shape):
        # a value computed from constants alone (a DequantizeLinear of a constant) broadcasts
        inner: set[int] = set()
        got = _leaves(v, defs, source, inner, consts, v.type.shape, top=True)
        return {} if got == {} and not inner else None
    out: dict = {}
    for a in c.args:
        got = _leaves(a, defs, source, leaves, consts, shape)
        if got is None:
            return None
        out.update(got)
    return out


def _table_axis(consts: list[np.ndarray], shape) -> int | None:
    """The one axis the constants vary along (-1: none), None when several or when a constant
    is wider than the value; -2 when the shape has no other axis to lay the 256 values on."""
    rank = len(shape)
    axes = set()
    for d in consts:
        if d.ndim > rank:
            return None
        for i, n in enumerate(d.shape):
            if n != 1:
                axes.add(rank - d.ndim + i)
    if len(axes) > 1:
        return None
    if not axes:
        return -1
    axis = axes.pop()
    return axis if rank >= 2 else -2


def _evaluate(out: Value, s: Value, defs: dict, source: dict, axis: int) -> np.ndarray | None:
    """The [C, 256] table of ``out`` as a function of ``s`` (C = s's extent on ``axis``, 1
    without one), by the operators' numpy references."""
    shape = tuple(s.type.shape)
    rank = len(shape)
    lane = 0 if axis != 0 else 1           # the axis the 256 values are laid on
    ev_shape = [1] * rank
    ev_shape[lane] = 256
    rows = 1
    if axis >= 0:
        ev_shape[axis] = rows = shape[axis]
    values = np.arange(256) - (128 if s.type.dtype == "int8" else 0)
    vshape = [1] * rank
    vshape[lane] = 256
    x = np.broadcast_to(values.astype(s.type.dtype).reshape(vshape), ev_shape)
    memo: dict[int, np.ndarray] = {id(s): x}

    def ev(v: Value) -> np.ndarray:
        if isinstance(v, Constant):
            return v.data
        if id(v) in memo:
            return memo[id(v)]
        c = defs[id(v)]
        got = OPS[c.op].reference(*(ev(a) for a in c.args), **c.attrs)
        memo[id(v)] = np.asarray(got)
        return memo[id(v)]

    with np.errstate(all="ignore"):
        try:
            y = ev(out)
        except (KeyError, ValueError, TypeError):
            return None
    if y.dtype.name != out.type.dtype:
        return None
    y = np.broadcast_to(y, ev_shape)
    if axis >= 0:
        y = np.moveaxis(y, (axis, lane), (0, 1))
    else:
        y = np.moveaxis(y, lane, 0)[None]
    return np.ascontiguousarray(y.reshape(rows, 256))



# The products whose float kernels take a ``qlookup`` as their epilogue (the vector epilogue
# gathers the table, codegen/contraction/epilogue.py); the float steps between them and the
# quantize (bias, the requantizing multiplier) fuse too.
_LOOKUP_PRODUCERS = ("nn.conv2d", "matmul")


def lookup_dequantized_tables(mod: IRModule, options: CompileOptions) -> IRModule:
    """``dequantize(lut8(quantize(y)))`` -> ``qlookup(y)`` (ops/qlookup.py) where y is a float
    convolution's or matmul's result (through elementwise steps with constants) and each of
    the three reads the one before it alone: the table's dequantized values precomputed, so
    the product's kernel quantizes, looks up and stores float32 in its epilogue instead of
    three elementwise passes (an 8-bit quantize, the table, a dequantize). What a QDQ model
    whose convolutions run on the float kernels computes around each activation: open image
    sizes (YOLOv8n's and Paddle's files), or layers ``int8_cost.py`` leaves float. Runs after
    the 8-bit fusions (concat, qbinary), which read the tables' 8-bit values themselves. With
    ``options.qlookup`` only (off by default: on Zen 4 with AVX2 the gather cost more than the
    passes it saves, docs/performance.md)."""
    if not (options.int8_kernels and options.lut8 and options.qlookup):
        return mod
    return eliminate_dead_code(map_functions(mod, _lookup_in_function))


def _lookup_in_function(fn: Function) -> Function:
    defs, uses = calls_and_uses(fn)
    new: dict[int, Call] = {}
    for b in fn.bindings():
        c = b.value
        if not (isinstance(c, Call) and c.op == "dequantize" and len(c.args) == 3):
            continue
        t = defs.get(id(c.args[0]))
        if t is None or t.op != "lut8" or uses.get(id(c.args[0])) != 1:
            continue
        q = defs.get(id(t.args[0]))
        if (q is None or q.op != "quantize" or uses.get(id(t.args[0])) != 1
                or q.args[0].type.dtype != "float32" or q.args[1].type.dtype != "float32"
                or not _from_product(q.args[0], defs)):
            continue
        shape = tuple(b.var.type.shape)
        if tuple(q.args[0].type.shape) != shape or tuple(t.args[0].type.shape) != shape:
            continue
        table = _dequantized_table(t, c, len(shape))
        if table is None:
            continue
        rows, axis = table
        scale = q.args[1]
        unit = isinstance(scale, Constant) and bool(np.all(scale.data == 1))
        new[id(b.var)] = Call("qlookup", [q.args[0], scale, q.args[2],
                                          Constant(f"{b.var.name}_table", rows)],
                              {"dtype": q.attrs.get("dtype", "uint8"), "axis": axis,
                               "unit_scale": unit}, b.var.type)
    return rebind_calls(fn, new)


def _from_product(v: Value, defs: dict) -> bool:
    """``v`` is a ``_LOOKUP_PRODUCERS`` result through elementwise steps whose other operands
    are constant (the bias, the multiplier)."""
    for _ in range(8):
        c = defs.get(id(v))
        if c is None:
            return False
        if c.op in _LOOKUP_PRODUCERS:
            return True
        if OPS.get(c.op) is None or OPS[c.op].kind != ELEMWISE:
            return False
        inner = [a for a in c.args if not _constant_valued(a, defs)]
        if len(inner) != 1:
            return False
        v = inner[0]
    return False


def _constant_valued(v: Value, defs: dict, depth: int = 4) -> bool:
    """``v`` is a constant, or computed from constants alone (a DequantizeLinear of an int32
    bias and its reshape, which ``fold_dequantize`` folds later)."""
    if isinstance(v, Constant):
        return True
    c = defs.get(id(v))
    return (c is not None and depth > 0 and bool(c.args)
            and all(_constant_valued(a, defs, depth - 1) for a in c.args))


def _dequantized_table(lut: Call, dq: Call, rank: int) -> tuple[np.ndarray, int] | None:
    """(the float32 [C, 256] table of dequantize(lut8(.)), its axis), or None when the
    dequantize's scale or zero point is not constant or varies along another axis than the
    table's."""
    table8, scale, zp = lut.args[1], dq.args[1], dq.args[2]
    if not all(isinstance(a, Constant) for a in (table8, scale, zp)):
        return None
    t8, s, z = table8.data, scale.data, zp.data
    axis = lut.attrs.get("axis", -1)
    rows = t8.shape[0]
    per = {rank - max(d.ndim, 1) + i for d in (s, z) for i, n in enumerate(d.shape) if n != 1}
    if len(per) > 1 or any(d.ndim > rank for d in (s, z)):
        return None
    if per:
        dq_axis = per.pop()
        if axis >= 0 and axis != dq_axis:
            return None
        c = int(max(s.size, z.size))
        if rows not in (1, c):
            return None
        axis, rows = dq_axis, c
        s = np.broadcast_to(s.reshape(-1), (c,)).reshape(c, 1)
        z = np.broadcast_to(z.reshape(-1), (c,)).reshape(c, 1)
        t8 = np.broadcast_to(t8, (c, 256))
    else:
        s, z = s.reshape(()), z.reshape(())
    out = OPS["dequantize"].reference(np.ascontiguousarray(t8), s, z)
    if out.dtype != np.float32:
        return None
    return np.ascontiguousarray(out.reshape(rows, 256)), axis


def fuse_table_chains(mod: IRModule, options: CompileOptions) -> IRModule:
    """``dequantize(lut8(quantize(y)))`` -> ``qtable(y)`` (ops/qlookup.py) where y is float32
    of run-time extents, each of the three is read by the next alone and the quantize's and
    the dequantize's scales and zero points are single constants: one vector pass (float32 in,
    float32 out) instead of three kernels, element for element the same. What ORT's QDQ files
    with open image sizes (Paddle's, YOLO's) compute around each activation between the float
    convolutions. Fixed shapes keep the three kernels (static bundles unchanged). With the
    integer kernels, ``options.lut8`` and ``options.qtable``. A ``multiply(y, gate)`` read by
    the quantize alone, gate [N, C, 1, 1] (the squeeze-and-excitation gate), becomes the op's
    gate operand, so ``dequantize(quantize(y * gate))`` is one pass too (an identity table,
    no lookup), where it ran on a generic loop nest; so is ``dequantize(quantize(y))`` of a
    function input or a max pool's result (a QDQ model's input, 6 us on the generic loop nest
    for PP-OCR's classifier at 48 x 192)."""
    if not (options.int8_kernels and options.lut8 and options.qtable):
        return mod
    mod = eliminate_dead_code(map_functions(mod, _table_chains_in_function))
    return eliminate_dead_code(map_functions(mod, _tables_into_depthwise))


def _tables_into_depthwise(fn: Function) -> Function:
    """``dequantize(lut8(qdwconv2d(...)))`` -> ``qdwconv2d(..., table, scale, zp)`` (a
    float32 result, ops/qlinear.py) where the depthwise's 8-bit result is of run-time extents
    and each of the three is read by the next alone, the dequantize's scale and zero point
    single constants: the activation after an integer depthwise layer (PP-OCR's classifier:
    HardSwish, then the squeeze-and-excitation mean and gate read the float32 values) looked
    up and dequantized as the kernel stores each plane (codegen/qdepthwise.py), one pass over
    memory fewer. Fixed shapes keep the two kernels (static bundles unchanged)."""
    defs, uses = calls_and_uses(fn)
    new: dict[int, Call] = {}
    for b in fn.bindings():
        c = b.value
        if not (isinstance(c, Call) and c.op == "dequantize" and len(c.args) == 3):
            continue
        shape = tuple(b.var.type.shape)
        if all(isinstance(d, int) for d in shape) or not all(_single(a) for a in c.args[1:]):
            continue
        t = defs.get(id(c.args[0]))
        if (t is None or t.op != "lut8" or uses.get(id(c.args[0])) != 1
                or not isinstance(t.args[1], Constant) or t.attrs.get("axis", -1) not in (-1, 1)
                or c.args[2].type.dtype != t.args[1].type.dtype):
            continue
        d = defs.get(id(t.args[0]))
        if (d is None or d.op != "qdwconv2d" or len(d.args) != 6 or uses.get(id(t.args[0])) != 1
                or d.attrs.get("dtype") not in _I8 or tuple(d.type.shape) != shape):
            continue
        hints = _table_hints(t.args[1].data)
        attrs = {**d.attrs, "col_lo": hints["col_lo"], "col_hi": hints["col_hi"]}
        new[id(b.var)] = Call("qdwconv2d", list(d.args) + [t.args[1], c.args[1], c.args[2]],
                              attrs, b.var.type)
    return rebind_calls(fn, new)


def _single(v: Value) -> bool:
    """``v`` is a constant holding one value (a per-tensor scale or zero point)."""
    return isinstance(v, Constant) and v.data.size == 1


def _table_chains_in_function(fn: Function) -> Function:
    defs, uses = calls_and_uses(fn)
    new: dict[int, Call] = {}
    for b in fn.bindings():
        c = b.value
        if not (isinstance(c, Call) and c.op == "dequantize" and len(c.args) == 3):
            continue
        shape = tuple(b.var.type.shape)
        if all(isinstance(d, int) for d in shape):
            continue
        t = defs.get(id(c.args[0]))
        if t is None or t.op not in ("lut8", "quantize") or uses.get(id(c.args[0])) != 1:
            continue
        if t.op == "lut8":
            q = defs.get(id(t.args[0]))
            if q is None or uses.get(id(t.args[0])) != 1 or not isinstance(t.args[1], Constant):
                continue
            table, axis = t.args[1], t.attrs.get("axis", -1)
        else:   # dequantize(quantize(...)): the identity table, taken with a gate only
            q, table, axis = t, None, -1
        if (q.op != "quantize" or q.attrs.get("dtype", "uint8") not in _I8
                or q.args[0].type.dtype != "float32" or q.args[1].type.dtype != "float32"
                or c.args[1].type.dtype != "float32"
                or not all(_single(a) for a in (q.args[1], q.args[2], c.args[1], c.args[2]))
                or tuple(q.args[0].type.shape) != shape or tuple(c.args[0].type.shape) != shape):
            continue
        y, gate = q.args[0], _gate_of(defs.get(id(q.args[0])), shape, axis)
        if gate is not None and uses.get(id(q.args[0])) == 1:
            y = gate[0]
        else:
            gate = None
        if table is None:
            # without a gate: where no kernel before it takes the pair as its epilogue (an
            # input of the function, a max pool's result; the float convolutions do)
            src = defs.get(id(q.args[0]))
            if gate is None and src is not None and src.op != "nn.max_pool2d":
                continue
            dtype = q.attrs.get("dtype", "uint8")
            ident = np.arange(256) - (128 if dtype == "int8" else 0)
            table = Constant("qtable_identity", ident.astype(dtype).reshape(1, 256))
        scale = q.args[1]
        unit = bool(np.all(scale.data == 1))
        args = [y, scale, q.args[2], table, c.args[1], c.args[2]] + (
            [gate[1]] if gate is not None else [])
        new[id(b.var)] = Call("qtable", args,
                              {"dtype": q.attrs.get("dtype", "uint8"),
                               "axis": axis, "unit_scale": unit,
                               **_table_hints(table.data)}, b.var.type)
    return rebind_calls(fn, new)


def _gate_of(m: Call | None, shape: tuple, axis: int) -> tuple[Value, Value] | None:
    """(y, gate) when ``m`` is ``multiply(y, gate)`` (either order) of float32 y of ``shape``
    and a ``qtable`` gate (ops/qlookup.py ``gate_fits``: [N, C, 1, 1], the squeeze-and-
    excitation multiply); else None."""
    if m is None or m.op != "multiply" or len(m.args) != 2:
        return None
    for y, g in (m.args, m.args[::-1]):
        if (y.type.dtype == "float32" and tuple(y.type.shape) == shape
                and gate_fits(shape, tuple(g.type.shape), g.type.dtype, axis)):
            return y, g
    return None


def _table_hints(table: np.ndarray) -> dict:
    """``qtable``'s hints (ops/qlookup.py) for a [C, 256] table: the columns col_lo .. col_hi
    outside which every row is constant (a row's first and last runs of equal entries), and
    the shift when every row is column + shift between them."""
    rows = table.astype(np.int64).reshape(-1, 256)
    lo, hi = 255, 0
    for row in rows:
        first = int(np.argmax(row != row[0])) - 1 if np.any(row != row[0]) else 255
        last = 256 - int(np.argmax(row[::-1] != row[-1])) if np.any(row != row[-1]) else 0
        lo, hi = min(lo, first), max(hi, last)
    hi = max(hi, lo)   # every row constant: one column reads them all
    hints: dict = {"col_lo": lo, "col_hi": hi}
    shifts = rows[:, lo:hi + 1] - np.arange(lo, hi + 1)
    if np.all(shifts == shifts[0, 0]):
        hints["affine_shift"] = int(shifts[0, 0])
    return hints
