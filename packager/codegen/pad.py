"""A kernel for Pad with reflect, edge or wrap borders (static shapes, any layout): rows of the
output's last axis, each an interior run copied from one input row with whole vectors (the
last one overlapping the one before it where the run is not a multiple of the vector) and the
border elements of the last axis as single loads and stores; the rows split over threads.

The generic loop nest computed every element's source index through the pad's selects and
stored one element at a time: style transfer's 12 reflect pads (NCHW, pads of 1 and 4 on H and
W) took ~510 us together. Constant pads are folded into the convolutions that read them, or
stay on the generic loop nest (their body is a select on the value, which this kernel does not
take).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from .helpers import STORAGE_TYPES, const_i64, for_range
from .lower import KernelEmitter, KernelInfo, is_symbolic
from .threads import DEFAULTS, SplitThresholds

PAD_MODES = ("reflect", "edge", "wrap")
# Border elements of a row past this many stay on the generic loop nest (each is one unrolled
# load and store per row here).
MAX_BORDER = 64
# Interior runs of up to this many vectors are unrolled; longer ones loop.
UNROLLED_VECTORS = 16


def _index_map(e: te.Expr, axis: te.IndexVar, extent: int) -> np.ndarray | None:
    """``e`` (an index expression of ``axis`` and constants only) at every value of ``axis``;
    None for any other expression."""
    i = np.arange(extent, dtype=np.int64)

    def ev(n: te.Expr):
        if n is axis:
            return i
        if isinstance(n, te.Const) and isinstance(n.value, (int, bool, np.integer)):
            return np.int64(n.value)
        if isinstance(n, te.Binary):
            a, b = ev(n.a), ev(n.b)
            if a is None or b is None:
                return None
            ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                   "max": np.maximum, "min": np.minimum}
            if n.op in ops:
                return ops[n.op](a, b)
            if n.op in ("floordiv", "mod") and np.all(b != 0):
                return np.floor_divide(a, b) if n.op == "floordiv" else np.mod(a, b)
            return None
        if isinstance(n, te.Compare):
            a, b = ev(n.a), ev(n.b)
            if a is None or b is None:
                return None
            return {"lt": np.less, "le": np.less_equal, "gt": np.greater,
                    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}[n.op](a, b)
        if isinstance(n, te.Select):
            c, a, b = ev(n.cond), ev(n.a), ev(n.b)
            if c is None or a is None or b is None:
                return None
            return np.where(c, a, b)
        if isinstance(n, te.Cast) and n.dtype in ("int32", "int64"):
            return ev(n.value)
        return None

    out = ev(e)
    if out is None:
        return None
    return np.broadcast_to(np.asarray(out, dtype=np.int64), (extent,)).copy()


def _pad_of(m: np.ndarray, n: int) -> tuple[int, int] | None:
    """(before, after) if the index map ``m`` is ``np.pad(arange(n), (before, after), mode)``
    for a mode of PAD_MODES (no pad: the identity), on an axis of at least two elements (a
    nearest Resize's ``broadcast_to`` repeats axes of one, which are not pads)."""
    total = len(m) - n
    ident = np.arange(n, dtype=np.int64)
    if total == 0:
        return (0, 0) if np.array_equal(m, ident) else None
    if total < 0 or n < 2:   # an edge or wrap "pad" of one element is a broadcast
        return None
    for before in range(total + 1):
        if not np.array_equal(m[before:before + n], ident):
            continue
        for mode in PAD_MODES:
            if mode == "reflect" and max(before, total - before) >= n:
                continue
            if np.array_equal(m, np.pad(ident, (before, total - before), mode=mode)):
                return before, total - before
    return None


def match_pad(func: PrimFunc) -> tuple[te.Tensor, te.Tensor, list[tuple[int, int]],
                                       np.ndarray] | None:
    """(input, output, (before, after) per axis, the last axis's index map) when ``func`` is
    exactly ``out[i...] = x[m_0(i_0), ..., m_k(i_k)]`` with static shapes, each ``m_d`` a
    reflect, edge or wrap pad of axis d (or the identity), at least one axis padded."""
    if len(func.inputs) != 1 or len(func.outputs) != 1 or is_symbolic(func):
        return None
    x, out = func.inputs[0], func.outputs[0]
    body = out.body
    if not isinstance(body, te.Read) or body.tensor.uid != x.uid or x.dtype != out.dtype \
            or x.dtype not in STORAGE_TYPES or len(x.shape) != len(out.shape) or not x.shape:
        return None
    pads, last = [], None
    for d, (axis, idx) in enumerate(zip(out.axes, body.indices)):
        if any(isinstance(n, te.IndexVar) and n is not axis for n in te.walk(idx)):
            return None
        m = _index_map(idx, axis, int(out.shape[d]))
        if m is None:
            return None
        pad = _pad_of(m, int(x.shape[d]))
        if pad is None:
            return None
        pads.append(pad)
        last = m
    if all(p == (0, 0) for p in pads) or sum(pads[-1]) > MAX_BORDER:
        return None
    return x, out, pads, last


class PadEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match, vl: int,
                 options: SplitThresholds = DEFAULTS) -> None:
        super().__init__(module, func, symbol, options=options)
        self.x, self.out, self.pads, self.last_map = match
        self.elem = STORAGE_TYPES[self.out.dtype]
        self.lanes = max(1, vl * 4 // te.itemsize(self.out.dtype))   # a vl-float vector's bytes

    def emit(self) -> KernelInfo:
        x, out = self.x, self.out
        body_fn, ptr_types = self._begin_body([x, out], workspace=False)
        x_ptr, out_ptr = body_fn.args[:2]
        task, ntasks = body_fn.args[len(ptr_types):]
        b = self.builder
        shape = [int(n) for n in out.shape]
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        parallel = rows > 1 and int(np.prod(shape, dtype=np.int64)) >= \
            self.options.parallel_min_outputs
        lo, hi = const_i64(0), const_i64(rows)
        if parallel:
            lo = b.sdiv(b.mul(task, hi), ntasks)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(rows)), ntasks)
        indices = out.body.indices
        with for_range(b, lo, hi, "row") as row:
            env: dict[int, ir.Value] = {}
            rest = row
            for d in reversed(range(len(shape) - 1)):
                if shape[d] == 1:
                    env[id(out.axes[d])] = const_i64(0)
                    continue
                env[id(out.axes[d])] = b.urem(rest, const_i64(shape[d]))
                rest = b.udiv(rest, const_i64(shape[d]))
            src = [self._value(indices[d], env) for d in range(len(shape) - 1)]
            x_row = b.gep(x_ptr, [self._offset(x, src + [const_i64(0)])], inbounds=True)
            o_row = b.gep(out_ptr, [b.mul(row, const_i64(shape[-1]), flags=("nsw",))],
                          inbounds=True)
            self._row(x_row, o_row)
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        return KernelInfo(self.symbol, 1, 1, 0, parallel)

    def _row(self, x_row: ir.Value, o_row: ir.Value) -> None:
        """One output row: the interior run with vectors, the borders element by element."""
        b = self.builder
        before, after = self.pads[-1]
        n = int(self.x.shape[-1])
        width = self.lanes
        while width > n:
            width //= 2
        vty = ir.VectorType(self.elem, width) if width > 1 else self.elem
        align = te.itemsize(self.out.dtype)

        def copy(s: ir.Value) -> None:
            src = b.bitcast(b.gep(x_row, [s], inbounds=True), vty.as_pointer())
            dst = b.bitcast(b.gep(o_row, [b.add(s, const_i64(before))], inbounds=True),
                            vty.as_pointer())
            b.store(b.load(src, align=align), dst, align=align)

        whole = n // width
        if whole > UNROLLED_VECTORS:
            with for_range(b, const_i64(0), const_i64(whole), "vec") as k:
                copy(b.mul(k, const_i64(width), flags=("nsw",)))
        else:
            for k in range(whole):
                copy(const_i64(k * width))
        if n % width:
            copy(const_i64(n - width))   # the last vector overlaps the one before it
        for j in list(range(before)) + list(range(before + n, before + n + after)):
            v = b.load(b.gep(x_row, [const_i64(int(self.last_map[j]))], inbounds=True))
            b.store(v, b.gep(o_row, [const_i64(j)], inbounds=True))


def emit_pad(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
             options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """The row-copy pad kernel for a reflect, edge or wrap Pad with static shapes."""
    match = match_pad(func)
    if match is None:
        return None
    return PadEmitter(module, func, symbol, match, vl, options).emit()
