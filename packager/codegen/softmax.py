"""A vectorized kernel for float32 softmax and log-softmax over the last axis (``nn.softmax``,
``nn.log_softmax``, tagged ``softmax`` by their legalizer in ``ops/nn.py``).

Per row, three passes a vector at a time (the last vector masked), as ONNX Runtime's MLAS does:
the row's maximum m; e = exp(x - m) written to the output while summing it; then the output
scaled by 1 / sum (log-softmax: the second pass only sums, the third writes x - m - log(sum)).
The generic loop nest computed exp twice per element (once in the sum, once in the output) and
took the maximum with a scalar, NaN-propagating loop: DeiT's 3 x 198 x 198 attention softmax
ran 110 us, ORT's 49 us.

NaN: the maximum skips NaN lanes (one vmaxps), but a NaN element makes the sum NaN, so the whole
row comes out NaN, as numpy's reference (whose maximum is NaN) gives. A row of -inf gives NaN
(-inf - -inf) in both.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ir.sym import product
from .helpers import F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .lower import KernelEmitter, KernelInfo
from .vecmath import call_math, exp_nonpositive
from .vecmath_lanes import _LaneOps
from .threads import DEFAULTS, SplitThresholds

def _read_of(e: te.Expr, tensor_uid: int | None = None) -> te.Read | None:
    if isinstance(e, te.Read) and (tensor_uid is None or e.tensor.uid == tensor_uid):
        return e
    return None


def _is_call(e: te.Expr, name: str) -> bool:
    return isinstance(e, te.MathCall) and e.name == name


def match_softmax(func: PrimFunc) -> tuple[te.Tensor, bool] | None:
    """(output, log) if ``func`` is exactly one float32 softmax or log-softmax over the last axis
    of its only input, as ``_softmax_stages`` builds it (nothing fused before or after)."""
    match = match_softmax_axis(func)
    if match is None or match[2] != len(func.inputs[0].shape) - 1:
        return None
    return match[0], match[1]


def match_softmax_axis(func: PrimFunc) -> tuple[te.Tensor, bool, int] | None:
    """(output, log, axis) if ``func`` is exactly one float32 softmax or log-softmax over any
    axis of its only input, as ``_softmax_stages`` builds it (nothing fused before or after)."""
    if len(func.outputs) != 1 or len(func.inputs) != 1:
        return None
    out, x = func.outputs[0], func.inputs[0]
    body = out.body
    if out.dtype != "float32" or x.dtype != "float32" or tuple(out.shape) != tuple(x.shape) \
            or not isinstance(body, te.Binary) or not out.shape:
        return None
    if body.op == "div" and _is_call(body.a, "exp"):
        log, shifted, total = False, _read_of(body.a.arg), _read_of(body.b)
    elif body.op == "sub" and _is_call(body.b, "log"):
        log, shifted, total = True, _read_of(body.a), _read_of(body.b.arg)
    else:
        return None
    if shifted is None or total is None or not isinstance(total.tensor.body, te.Reduce):
        return None
    tag = reduction_tag(total.tensor.body)
    if tag is None or tag.kind != "softmax" or bool(tag.attrs.get("log")) != log:
        return None
    dim = tag.attrs.get("dim")
    if not isinstance(dim, int) or not 0 <= dim < len(x.shape) or tag.operands[0].uid != x.uid:
        return None
    # the shifted stage is x - max, read at the output's own indices
    sb = shifted.tensor.body
    if not (isinstance(sb, te.Binary) and sb.op == "sub" and _read_of(sb.a, x.uid) is not None
            and all(i is a for i, a in zip(shifted.indices, out.axes))
            and all(i is a for i, a in zip(sb.a.indices, shifted.tensor.axes))):
        return None
    return out, log, dim


class SoftmaxEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, out: te.Tensor,
                 log: bool, vl: int, options: SplitThresholds = DEFAULTS) -> None:
        super().__init__(module, func, symbol, options=options)
        self.out, self.log, self.vl = out, log, vl
        self.vty = ir.VectorType(F32, vl)
        self.mty = ir.VectorType(I1, vl)

    def emit(self) -> KernelInfo:
        x_t = self.func.inputs[0]
        body_fn, ptr_types = self._begin_body([x_t, self.out], workspace=False)
        x_ptr, out_ptr, task, ntasks = body_fn.args[:4]
        b = self.builder
        n = x_t.shape[-1]
        rows = int(np.prod(x_t.shape[:-1], dtype=np.int64))
        parallel = rows > 1 and rows * n >= self.options.parallel_min_outputs   # as generic kernels
        lo, hi = const_i64(0), const_i64(rows)
        if parallel:
            lo = b.sdiv(b.mul(task, hi), ntasks)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(rows)), ntasks)
        # Rows in groups whose passes interleave: one row's passes are a chain of dependent
        # steps (maximum, its horizontal reduction, the exps, the sum's reduction, a division),
        # so a short row alone leaves the core waiting on latencies.
        group = self._group(n)
        groups = b.sdiv(b.sub(hi, lo), const_i64(group))
        with for_range(b, const_i64(0), groups, "grp") as g:
            first = b.add(lo, b.mul(g, const_i64(group), flags=("nsw",)), flags=("nsw",))
            self._rows([self._row_ptrs(x_ptr, out_ptr, b.add(first, const_i64(r)), n)
                        for r in range(group)], n)
        if group > 1:
            with for_range(b, b.add(lo, b.mul(groups, const_i64(group))), hi, "row") as row:
                self._rows([self._row_ptrs(x_ptr, out_ptr, row, n)], n)
        b.ret_void()
        self._emit_entry(body_fn, 2, ptr_types)
        return KernelInfo(self.symbol, 1, 1, 0, parallel)

    GROUP_VECTORS = 48        # vectors of all rows of a group, at most
    MAX_GROUP = 4

    def _group(self, n: int) -> int:
        vectors = -(-n // self.vl)
        if vectors > self.UNROLL_MAX:
            return 1
        return max(1, min(self.MAX_GROUP, self.GROUP_VECTORS // vectors))

    def _row_ptrs(self, x_ptr: ir.Value, out_ptr: ir.Value, row: ir.Value, n: int):
        b = self.builder
        start = b.mul(row, const_i64(n), flags=("nsw",))
        return b.gep(x_ptr, [start], inbounds=True), b.gep(out_ptr, [start], inbounds=True)

    # ---- vector helpers ----------------------------------------------------------------------

    def _splat(self, value: float | ir.Value) -> ir.Value:
        if not isinstance(value, ir.Value):
            return ir.Constant(self.vty, [float(value)] * self.vl)
        b = self.builder
        v = b.insert_element(ir.Constant(self.vty, None), value, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(self.vty, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _vptr(self, row: ir.Value, offset: int) -> ir.Value:
        b = self.builder
        return b.bitcast(b.gep(row, [const_i64(offset)], inbounds=True), self.vty.as_pointer())

    def _tail_mask(self, count: int) -> ir.Constant:
        return ir.Constant(self.mty, [i < count for i in range(self.vl)])

    def _load(self, row: ir.Value, offset: int, count: int, fill: float) -> ir.Value:
        """row[offset : offset + vl]; with count < vl only the first count lanes, the others
        ``fill``."""
        b = self.builder
        if count == self.vl:
            return b.load(self._vptr(row, offset), align=4)
        fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}f32.p0", self.vty,
                       [self.vty.as_pointer(), I32, self.mty, self.vty])
        return b.call(fn, [self._vptr(row, offset), ir.Constant(I32, 4), self._tail_mask(count),
                           self._splat(fill)])

    def _store(self, value: ir.Value, row: ir.Value, offset: int, count: int) -> None:
        b = self.builder
        if count == self.vl:
            b.store(value, self._vptr(row, offset), align=4)
            return
        fn = intrinsic(self.module, f"llvm.masked.store.v{self.vl}f32.p0", ir.VoidType(),
                       [self.vty, self.vty.as_pointer(), I32, self.mty])
        b.call(fn, [value, self._vptr(row, offset), ir.Constant(I32, 4), self._tail_mask(count)])

    def _horizontal(self, v: ir.Value, combine) -> ir.Value:
        """combine over the lanes of ``v`` by halving shuffles (log2(vl) steps)."""
        b = self.builder
        width = self.vl
        while width > 1:
            width //= 2
            upper = b.shuffle_vector(v, ir.Constant(self.vty, None), ir.Constant(
                ir.VectorType(I32, self.vl), [width + i if i < width else i
                                              for i in range(self.vl)]))
            v = combine(v, upper)
        return b.extract_element(v, ir.Constant(I32, 0))

    def _vmax(self, a: ir.Value, c: ir.Value) -> ir.Value:
        # skips NaN lanes (one vmaxps); the sum carries a NaN into the row's result
        b = self.builder
        return b.select(b.fcmp_ordered(">", c, a), c, a)

    def _chunks(self, n: int):
        """(offset, lane count) of each vector of a row of n floats; the last may be partial."""
        for offset in range(0, n, self.vl):
            yield offset, min(self.vl, n - offset)

    # ---- a group of rows ---------------------------------------------------------------------

    def _rows(self, rows: list[tuple[ir.Value, ir.Value]], n: int) -> None:
        """Softmax of each row (x, y) of ``rows``, their passes interleaved step by step."""
        b = self.builder
        ops = _LaneOps(b, self.vl)
        ms = self._pass(rows, n, lambda xp, yp, off, cnt, acc, r:
                        self._vmax(acc, self._load(xp, off, cnt, -np.inf)),
                        [self._splat(-np.inf)] * len(rows), combine=self._vmax)
        ms = [self._splat(self._horizontal(m, self._vmax)) for m in ms]

        def exp_step(xp, yp, off, cnt, acc, r):
            e = exp_nonpositive(ops, b.fsub(self._load(xp, off, cnt, -np.inf), ms[r]))
            if not self.log:
                self._store(e, yp, off, cnt)
            return b.fadd(acc, e)

        totals = self._pass(rows, n, exp_step, [self._splat(0.0)] * len(rows), combine=b.fadd)
        totals = [self._horizontal(t, b.fadd) for t in totals]
        if self.log:
            lses = [self._splat(call_math(b, "log", t)) for t in totals]

            def last_step(xp, yp, off, cnt, acc, r):
                shifted = b.fsub(self._load(xp, off, cnt, 0.0), ms[r])
                self._store(b.fsub(shifted, lses[r]), yp, off, cnt)
        else:
            invs = [self._splat(b.fdiv(ir.Constant(F32, 1.0), t)) for t in totals]

            def last_step(xp, yp, off, cnt, acc, r):
                self._store(b.fmul(self._load(yp, off, cnt, 0.0), invs[r]), yp, off, cnt)
        self._pass(rows, n, last_step, [None] * len(rows))

    # Vectors a pass emits straight-line before it loops. Longer straight-line rows spilled:
    # with every pass unrolled, LLVM keeps the maximum pass's loads of x live into the exp
    # pass (one load, reused) and runs out of registers; ViT-S's 197-float rows (25 vectors,
    # then 32 allowed) made about 640 stack accesses per group. As a loop: [1,6,197,197]
    # 271 -> 214 us (ORT 200), DeiT's [1,3,198,198] 136 -> 113 us (ORT 103), 1 thread, min
    # over alternating rounds on a loaded machine; rows up to 16 vectors unchanged.
    UNROLL_MAX = 16
    BLOCK = 4                # vectors per iteration of a looping pass

    PARTIALS = 4             # independent accumulators per row of a maximum or sum fold

    def _pass(self, rows: list[tuple[ir.Value, ir.Value]], n: int, step, accs: list,
              combine=None):
        """Fold ``step(x_ptr, y_ptr, offset, count, acc, row)`` over the vectors of each row,
        the rows interleaved: straight-line for short rows, else (one row) a loop over blocks
        of BLOCK full vectors, then the rest (the last vector masked). With ``combine`` (an
        associative op whose identity the initial accumulators are) a fold keeps PARTIALS
        accumulators per row, vector i folding into i % PARTIALS, combined pairwise at the end:
        the maximum's and the sum's dependent chains are a quarter as long."""
        b = self.builder
        full = n // self.vl
        if full <= self.UNROLL_MAX:
            nparts = min(self.PARTIALS, -(-n // self.vl)) if combine is not None else 1
            parts = [[acc] * nparts for acc in accs]
            for i, (off, cnt) in enumerate(self._chunks(n)):
                for r, (x, y) in enumerate(rows):
                    k = i % len(parts[r])
                    parts[r][k] = step(x, y, off, cnt, parts[r][k], r)
            if combine is None:
                return [p[0] for p in parts]
            out = []
            for p in parts:   # pairwise: (p0 + p1) + (p2 + p3)
                while len(p) > 1:
                    p = [combine(p[j], p[j + 1]) if j + 1 < len(p) else p[j]
                         for j in range(0, len(p), 2)]
                out.append(p[0])
            return out
        assert len(rows) == 1
        (x, y), acc = rows[0], accs[0]
        blocks = full // self.BLOCK
        # with combine: vector u of a block folds into accumulator u % PARTIALS
        nslots = self.PARTIALS if combine is not None and acc is not None else 1
        slots = []
        if acc is not None:
            slots = [alloca_once(b, self.vty, name=f"acc{k}") for k in range(nslots)]
            for sl in slots:
                b.store(acc, sl)
        with for_range(b, const_i64(0), const_i64(blocks), "blk") as blk:
            base = b.mul(blk, const_i64(self.BLOCK * self.vl), flags=("nsw",))
            xp, yp = b.gep(x, [base], inbounds=True), b.gep(y, [base], inbounds=True)
            cur = [b.load(sl) for sl in slots] if slots else [None]
            for u in range(self.BLOCK):
                k = u % len(cur)
                cur[k] = step(xp, yp, u * self.vl, self.vl, cur[k], 0)
            for sl, c in zip(slots, cur):
                b.store(c, sl)
        parts = [b.load(sl) for sl in slots] if slots else [None]
        done = blocks * self.BLOCK * self.vl
        for i, (off, cnt) in enumerate(self._chunks(n - done)):
            k = i % len(parts)
            parts[k] = step(x, y, done + off, cnt, parts[k], 0)
        while len(parts) > 1:
            parts = [combine(parts[j], parts[j + 1]) if j + 1 < len(parts) else parts[j]
                     for j in range(0, len(parts), 2)]
        return parts


def emit_softmax(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                 options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    match = match_softmax(func)
    if match is None:
        strided = _emit_strided_softmax(module, func, symbol, vl, (), options)
        if strided is not None:
            return strided
        q = match_qsoftmax(func)
        return None if q is None else QSoftmaxEmitter(module, func, symbol, q, vl, options).emit()
    return SoftmaxEmitter(module, func, symbol, *match, vl, options).emit()


# ---- 8-bit softmax (ops/qelementwise.py ``qsoftmax``) --------------------------------------------

def match_qsoftmax(func: PrimFunc) -> str | None:
    """The output dtype when ``func`` is exactly one ``qsoftmax`` of static shape (an opaque
    op: its inputs are the op's arguments in order)."""
    if len(func.outputs) != 1 or len(func.inputs) != 4:
        return None
    out = func.outputs[0]
    if any(not isinstance(d, int) for d in out.shape):
        return None
    stack, seen = [out], set()
    while stack:
        t = stack.pop()
        if t.uid in seen or t.body is None:
            continue
        seen.add(t.uid)
        for node in te.walk(t.body):
            if isinstance(node, te.Reduce):
                tag = reduction_tag(node)
                if tag is not None and tag.kind == "qsoftmax":
                    if [o.uid for o in tag.operands] != [i.uid for i in func.inputs]:
                        return None
                    return str(tag.attrs["dtype"])
            if isinstance(node, te.Read):
                stack.append(node.tensor)
    return None


class QSoftmaxEmitter(SoftmaxEmitter):
    """``qsoftmax``: the float kernel's three passes over 8-bit rows. The maximum pass reads
    the bytes (converted to float32, exact); the sum pass writes e = exp((x - max) * x_scale)
    to the workspace (a float row per row) while summing it; the last pass reads e back and
    writes saturate(round_half_even(e * ((1 / sum) / y_scale)) + y_zp) as bytes (one multiply
    per element; the float composition's e / sum / y_scale differs from it only where a
    rounding boundary falls between them: within one quantization step). A quarter of
    the float kernel's input and output traffic, and no dequantize / quantize pass over memory
    of their own."""

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, dtype: str, vl: int,
                 options: SplitThresholds = DEFAULTS) -> None:
        super().__init__(module, func, symbol, func.outputs[0], False, vl, options)
        self.dtype = dtype
        self.bty = ir.VectorType(ir.IntType(8), vl)

    def emit(self) -> KernelInfo:
        x_t, xs_t, ys_t, yz_t = self.func.inputs
        body_fn, ptr_types = self._begin_body([x_t, xs_t, ys_t, yz_t, self.out], workspace=True)
        x_ptr, xs_ptr, ys_ptr, yz_ptr, out_ptr, ws, task, ntasks = body_fn.args[:8]
        b = self.builder
        ws_ptr = b.bitcast(ws, F32.as_pointer())
        self.xs = self._splat(b.load(xs_ptr))
        self.ys = self._splat(b.load(ys_ptr))
        self.yz = self._splat(b.load(yz_ptr))
        n = x_t.shape[-1]
        rows = int(np.prod(x_t.shape[:-1], dtype=np.int64))
        parallel = rows > 1 and rows * n >= self.options.parallel_min_outputs
        lo, hi = const_i64(0), const_i64(rows)
        if parallel:
            lo = b.sdiv(b.mul(task, hi), ntasks)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(rows)), ntasks)

        def ptrs(row):
            start = b.mul(row, const_i64(n), flags=("nsw",))
            return tuple(b.gep(p, [start], inbounds=True) for p in (x_ptr, ws_ptr, out_ptr))

        group = self._group(n)
        groups = b.sdiv(b.sub(hi, lo), const_i64(group))
        with for_range(b, const_i64(0), groups, "grp") as g:
            first = b.add(lo, b.mul(g, const_i64(group), flags=("nsw",)), flags=("nsw",))
            self._rows([ptrs(b.add(first, const_i64(r))) for r in range(group)], n)
        if group > 1:
            with for_range(b, b.add(lo, b.mul(groups, const_i64(group))), hi, "row") as row:
                self._rows([ptrs(row)], n)
        b.ret_void()
        self._emit_entry(body_fn, 6, ptr_types)
        workspace = -(-rows * n * 4 // 64) * 64
        return KernelInfo(self.symbol, 4, 1, workspace, parallel)

    def _bptr(self, row: ir.Value, offset: int) -> ir.Value:
        b = self.builder
        return b.bitcast(b.gep(row, [const_i64(offset)], inbounds=True), self.bty.as_pointer())

    def _qload(self, row: ir.Value, offset: int, count: int, fill: float) -> ir.Value:
        """row[offset : offset + vl] (bytes) as float32 (the first count lanes; the others
        ``fill``)."""
        b = self.builder
        if count == self.vl:
            raw = b.load(self._bptr(row, offset), align=1)
        else:
            fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}i8.p0", self.bty,
                           [self.bty.as_pointer(), I32, self.mty, self.bty])
            raw = b.call(fn, [self._bptr(row, offset), ir.Constant(I32, 1),
                              self._tail_mask(count), ir.Constant(self.bty, None)])
        signed = self.func.inputs[0].dtype == "int8"
        v = b.sitofp(raw, self.vty) if signed else b.uitofp(raw, self.vty)
        if count < self.vl:
            v = b.select(self._tail_mask(count), v, self._splat(fill))
        return v

    def _store_q(self, e: ir.Value, mult: ir.Value, row: ir.Value, offset: int,
                 count: int) -> None:
        """saturate(round_half_even(e * mult) + y_zp) as bytes, mult = (1 / sum) / y_scale."""
        b = self.builder
        lo, hi = (-128.0, 127.0) if self.dtype == "int8" else (0.0, 255.0)
        rint = intrinsic(self.module, f"llvm.rint.v{self.vl}f32", self.vty, [self.vty])
        q = b.fadd(b.call(rint, [b.fmul(e, mult)]), self.yz)
        q = b.select(b.fcmp_ordered("<", q, self._splat(lo)), self._splat(lo), q)
        q = b.select(b.fcmp_ordered(">", q, self._splat(hi)), self._splat(hi), q)
        v = b.trunc(b.fptosi(q, ir.VectorType(I32, self.vl)), self.bty)
        if count == self.vl:
            b.store(v, self._bptr(row, offset), align=1)
            return
        fn = intrinsic(self.module, f"llvm.masked.store.v{self.vl}i8.p0", ir.VoidType(),
                       [self.bty, self.bty.as_pointer(), I32, self.mty])
        b.call(fn, [v, self._bptr(row, offset), ir.Constant(I32, 1), self._tail_mask(count)])

    def _rows(self, rows: list[tuple[ir.Value, ir.Value, ir.Value]], n: int) -> None:
        """rows: (bytes in, float workspace row, bytes out) of each row of a group."""
        b = self.builder
        ops = _LaneOps(b, self.vl)
        xw = [(x, w) for x, w, _ in rows]
        ms = self._pass(xw, n, lambda xp, wp, off, cnt, acc, r:
                        self._vmax(acc, self._qload(xp, off, cnt, -np.inf)),
                        [self._splat(-np.inf)] * len(rows), combine=self._vmax)
        ms = [self._splat(self._horizontal(m, self._vmax)) for m in ms]

        def exp_step(xp, wp, off, cnt, acc, r):
            e = exp_nonpositive(ops, b.fmul(b.fsub(self._qload(xp, off, cnt, -np.inf), ms[r]),
                                            self.xs))
            self._store(e, wp, off, cnt)
            return b.fadd(acc, e)

        totals = self._pass(xw, n, exp_step, [self._splat(0.0)] * len(rows), combine=b.fadd)
        ys = b.extract_element(self.ys, ir.Constant(I32, 0))
        mults = [self._splat(b.fdiv(b.fdiv(ir.Constant(F32, 1.0), self._horizontal(t, b.fadd)),
                                    ys)) for t in totals]

        def last_step(wp, op, off, cnt, acc, r):
            self._store_q(self._load(wp, off, cnt, 0.0), mults[r], op, off, cnt)
        self._pass([(w, o) for _, w, o in rows], n, last_step, [None] * len(rows))


# ---- softmax over a static last axis, a run-time number of rows ----------------------------------

def emit_symbolic_softmax(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                          size_vars: tuple[str, ...],
                          options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """The vectorized softmax kernel (``SoftmaxEmitter``) when only the number of rows is a
    run-time size (a recognizer's per-column class scores): the rows loop takes it from the
    size variables; the row length stays static."""
    match = match_softmax(func)
    if match is None:
        return _emit_strided_softmax(module, func, symbol, vl, size_vars, options)
    if not isinstance(func.inputs[0].shape[-1], int):
        return _RowLengthSoftmax(module, func, symbol, *match, vl, size_vars, options).emit()

    class _Emitter(SoftmaxEmitter):
        def __init__(self) -> None:
            super().__init__(module, func, symbol, *match, vl, options)
            self.size_vars = size_vars
            self.symbolic = True

        def emit(self) -> KernelInfo:
            x_t = self.func.inputs[0]
            body_fn, ptr_types = self._begin_body([x_t, self.out], workspace=False)
            x_ptr, out_ptr = body_fn.args[:2]
            b = self.builder
            n = x_t.shape[-1]
            rows = self._dim_value(product(x_t.shape[:-1]))
            group = self._group(n)
            groups = b.sdiv(rows, const_i64(group))
            with for_range(b, const_i64(0), groups, "grp") as g:
                first = b.mul(g, const_i64(group), flags=("nsw",))
                self._rows([self._row_ptrs(x_ptr, out_ptr, b.add(first, const_i64(r)), n)
                            for r in range(group)], n)
            if group > 1:
                with for_range(b, b.mul(groups, const_i64(group)), rows, "row") as row:
                    self._rows([self._row_ptrs(x_ptr, out_ptr, row, n)], n)
            b.ret_void()
            self._emit_entry(body_fn, len(ptr_types), ptr_types)
            return KernelInfo(self.symbol, 1, 1, 0, False, symbolic=True)

    return _Emitter().emit()


class _RowLengthSoftmax(SoftmaxEmitter):
    """Softmax (log-softmax) over a last axis whose length is a run-time size (an
    attention's scores over a symbolic sequence, ``[b, heads, seq, seq]``): per row, the
    static kernel's three passes (maximum; exp written while summing; scale by 1 / sum),
    each a loop over blocks of ``BLOCK`` vectors with ``BLOCK`` accumulators (independent
    chains), then single vectors, then the last vector masked by a mask built from the
    run-time count; rows four at a time, their passes interleaved (one accumulator each). Rows
    split over tasks when there are at least ``options.parallel_min_outputs`` outputs. The generic
    loop nest ran 2.5x the static kernel (encoder seq 128: 125 vs 49 us)."""

    def __init__(self, module, func, symbol, out, log, vl, size_vars,
                 options: SplitThresholds = DEFAULTS) -> None:
        super().__init__(module, func, symbol, out, log, vl, options)
        self.size_vars = size_vars
        self.symbolic = True

    def emit(self) -> KernelInfo:
        x_t = self.func.inputs[0]
        body_fn, ptr_types = self._begin_body([x_t, self.out], workspace=False)
        x_ptr, out_ptr = body_fn.args[:2]
        task, ntasks = body_fn.args[len(ptr_types)], body_fn.args[len(ptr_types) + 1]
        b = self.builder
        n = self._dim_value(x_t.shape[-1])
        rows = self._dim_value(product(x_t.shape[:-1]))
        # fewer outputs than a task's worth: task 0 does every row, the others nothing
        big = b.icmp_signed(">=", b.mul(rows, n), const_i64(self.options.parallel_min_outputs))
        nt = b.select(big, ntasks, const_i64(1))
        lo = b.sdiv(b.mul(task, rows), nt)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), rows), nt)
        hi = b.select(b.icmp_signed("<", task, nt), hi, lo)
        vl = const_i64(self.vl)
        full = b.sdiv(n, vl)
        blocks = b.sdiv(full, const_i64(self.BLOCK))
        tail = b.sub(n, b.mul(full, vl))
        lanes = ir.Constant(ir.VectorType(I64, self.vl), list(range(self.vl)))
        mask = b.icmp_signed("<", lanes, self._splat_i64(tail))
        has_tail = b.icmp_signed(">", tail, const_i64(0))
        args = (blocks, full, mask, has_tail, b.mul(full, vl))

        def ptrs(row):
            start = b.mul(row, n, flags=("nsw",))
            return (b.gep(x_ptr, [start], inbounds=True),
                    b.gep(out_ptr, [start], inbounds=True))

        # GROUP rows at a time, their passes interleaved (one row's passes are chains of
        # dependent steps: a short row alone leaves the core waiting), then the rest singly
        groups = b.sdiv(b.sub(hi, lo), const_i64(self.ROWS))
        with for_range(b, const_i64(0), groups, "grp") as grp:
            first = b.add(lo, b.mul(grp, const_i64(self.ROWS)))
            self._rows_rt([ptrs(b.add(first, const_i64(r))) for r in range(self.ROWS)], *args)
        with for_range(b, b.add(lo, b.mul(groups, const_i64(self.ROWS))), hi, "row") as row:
            self._rows_rt([ptrs(row)], *args)
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        return KernelInfo(self.symbol, 1, 1, 0, True, symbolic=True)

    def _splat_i64(self, value: ir.Value) -> ir.Value:
        b = self.builder
        vty = ir.VectorType(I64, self.vl)
        v = b.insert_element(ir.Constant(vty, None), value, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(vty, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _at(self, row: ir.Value, offset: ir.Value) -> ir.Value:
        b = self.builder
        return b.bitcast(b.gep(row, [offset], inbounds=True), self.vty.as_pointer())

    def _mload(self, row, offset, mask, fill: float) -> ir.Value:
        b = self.builder
        fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}f32.p0", self.vty,
                       [self.vty.as_pointer(), I32, self.mty, self.vty])
        return b.call(fn, [self._at(row, offset), ir.Constant(I32, 4), mask,
                           self._splat(fill)])

    def _mstore(self, value, row, offset, mask) -> None:
        b = self.builder
        fn = intrinsic(self.module, f"llvm.masked.store.v{self.vl}f32.p0", ir.VoidType(),
                       [self.vty, self.vty.as_pointer(), I32, self.mty])
        b.call(fn, [value, self._at(row, offset), ir.Constant(I32, 4), mask])

    ROWS = 4          # rows interleaved
    ACCUMULATORS = 4  # independent chains per pass, over the interleaved rows

    def _loop_pass(self, rows, blocks, full, mask, has_tail, done, step, init, combine):
        """Fold ``step(r, load, store, acc)`` over each row r of ``rows`` (x, y pointers),
        the rows interleaved: ``BLOCK`` vectors per loop iteration, then single vectors, then
        the masked tail; each row has ACCUMULATORS / len(rows) accumulators (at least one),
        used in turn. Returns each row's accumulators combined (None without them)."""
        b = self.builder
        vl = self.vl
        per_row = max(1, self.ACCUMULATORS // len(rows))
        slots = []
        if init is not None:
            slots = [[alloca_once(b, self.vty, name=f"acc{r}_{a}") for a in range(per_row)]
                     for r in range(len(rows))]
            for row_slots in slots:
                for slot in row_slots:
                    b.store(init, slot)

        def body(offset, u, masked):
            for r, (x, y) in enumerate(rows):
                def load(fill, ptr=None, x=x):
                    ptr = x if ptr is None else ptr
                    if masked:
                        return self._mload(ptr, offset, mask, fill)
                    return b.load(self._at(ptr, offset), align=4)

                def store(value, y=y):
                    if masked:
                        self._mstore(value, y, offset, mask)
                    else:
                        b.store(value, self._at(y, offset), align=4)
                slot = slots[r][u % per_row] if slots else None
                acc = step(r, load, store, b.load(slot) if slot is not None else None)
                if slot is not None:
                    b.store(acc, slot)

        with for_range(b, const_i64(0), blocks, "blk") as blk:
            base = b.mul(blk, const_i64(self.BLOCK * vl), flags=("nsw",))
            for u in range(self.BLOCK):
                body(b.add(base, const_i64(u * vl)), u, False)
        with for_range(b, b.mul(blocks, const_i64(self.BLOCK)), full, "vec") as v:
            body(b.mul(v, const_i64(vl), flags=("nsw",)), 0, False)
        with b.if_then(has_tail):
            body(done, 0, True)
        if not slots:
            return None
        out = []
        for row_slots in slots:
            accs = [b.load(slot) for slot in row_slots]
            while len(accs) > 1:
                accs = [combine(accs[i], accs[i + 1]) for i in range(0, len(accs), 2)]
            out.append(accs[0])
        return out

    def _rows_rt(self, rows, blocks, full, mask, has_tail, done) -> None:
        b = self.builder
        ops = _LaneOps(b, self.vl)
        args = (rows, blocks, full, mask, has_tail, done)
        ms = self._loop_pass(*args, lambda r, load, store, acc: self._vmax(acc, load(-np.inf)),
                             self._splat(-np.inf), self._vmax)
        ms = [self._splat(self._horizontal(m, self._vmax)) for m in ms]

        def exp_step(r, load, store, acc):
            e = exp_nonpositive(ops, b.fsub(load(-np.inf), ms[r]))
            if not self.log:
                store(e)
            return b.fadd(acc, e)   # masked lanes: exp(-inf - m) = 0
        totals = [self._horizontal(t, b.fadd)
                  for t in self._loop_pass(*args, exp_step, self._splat(0.0), b.fadd)]
        if self.log:
            lses = [self._splat(call_math(b, "log", t)) for t in totals]

            def last(r, load, store, acc):
                store(b.fsub(b.fsub(load(0.0), ms[r]), lses[r]))
        else:
            invs = [self._splat(b.fdiv(ir.Constant(F32, 1.0), t)) for t in totals]

            def last(r, load, store, acc):
                store(b.fmul(load(0.0, rows[r][1]), invs[r]))
        self._loop_pass(*args, last, None, None)


# ---- softmax over an axis that is not the last -------------------------------------------------

class _StridedSoftmax(_RowLengthSoftmax):
    """Softmax (log-softmax) over an axis with a static length n that is not the last one, the
    input seen as [outer, n, inner] (YOLOv8's distribution focal loss head: [1, 16, 4, anchors]
    over axis 1): the contiguous inner axis on the vector lanes, vl rows of the softmax per
    vector, each of its n bins a vector load inner floats apart. Per vector of lanes, three
    passes over the n bins: the maximum (a pairwise tree, no horizontal step); exp(x - m)
    written to the output while summing; the output scaled by 1 / sum (log-softmax: the second
    pass only sums, the third writes x - m - log(sum)). Up to UNROLL_BINS bins the passes are
    straight-line, beyond it loops over the bins. The last vector of each outer index is masked
    where inner is not a multiple of vl. outer and inner may be run-time sizes (an open-size
    export: [batch, 16, 4, anchors]); the vectors split over tasks when there are at least
    ``options.parallel_min_outputs`` outputs. The generic loop nest took YOLOv8n-320's
    [1, 16, 4, 2100] in 122 us, OpenVINO 45 us (1 thread, AVX-512)."""

    UNROLL_BINS = 32

    def __init__(self, module, func, symbol, out, log, axis, vl, size_vars,
                 options: SplitThresholds = DEFAULTS) -> None:
        super().__init__(module, func, symbol, out, log, vl, size_vars, options)
        self.axis = axis
        self.symbolic = bool(size_vars)

    def emit(self) -> KernelInfo:
        x_t = self.func.inputs[0]
        shape = tuple(x_t.shape)
        n = shape[self.axis]
        body_fn, ptr_types = self._begin_body([x_t, self.out], workspace=False)
        x_ptr, out_ptr = body_fn.args[:2]
        task, ntasks = body_fn.args[len(ptr_types)], body_fn.args[len(ptr_types) + 1]
        b = self.builder
        outer_d, inner_d = product(shape[:self.axis]), product(shape[self.axis + 1:])
        outer, inner = self._dim_value(outer_d), self._dim_value(inner_d)
        vl = const_i64(self.vl)
        full = b.sdiv(inner, vl)
        tail = b.sub(inner, b.mul(full, vl))
        has_tail = b.icmp_signed(">", tail, const_i64(0))
        per_outer = b.add(full, b.zext(has_tail, I64))
        units = b.mul(outer, per_outer)
        if self.symbolic:
            big = b.icmp_signed(">=", b.mul(units, const_i64(n * self.vl)),
                                const_i64(self.options.parallel_min_outputs))
            parallel = True
        else:
            outputs = int(outer_d) * n * int(inner_d)
            big = ir.Constant(I1, outputs >= self.options.parallel_min_outputs)
            parallel = outputs >= self.options.parallel_min_outputs
        nt = b.select(big, ntasks, const_i64(1))
        lo = b.sdiv(b.mul(task, units), nt)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), units), nt)
        hi = b.select(b.icmp_signed("<", task, nt), hi, lo)
        lanes = ir.Constant(ir.VectorType(I64, self.vl), list(range(self.vl)))
        mask = b.icmp_signed("<", lanes, self._splat_i64(tail))
        with for_range(b, lo, hi, "vec") as u:
            o = b.sdiv(u, per_outer)
            j = b.sub(u, b.mul(o, per_outer))
            base = b.add(b.mul(o, b.mul(inner, const_i64(n))), b.mul(j, vl))
            xs, ys = b.gep(x_ptr, [base], inbounds=True), b.gep(out_ptr, [base], inbounds=True)
            if isinstance(inner_d, int) and inner_d % self.vl == 0:   # no masked vector
                self._bins(xs, ys, n, inner, None)
            else:
                with b.if_else(b.icmp_signed("<", j, full)) as (whole, part):
                    with whole:
                        self._bins(xs, ys, n, inner, None)
                    with part:
                        self._bins(xs, ys, n, inner, mask)
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        return KernelInfo(self.symbol, 1, 1, 0, parallel, symbolic=self.symbolic)

    def _bins(self, xs: ir.Value, ys: ir.Value, n: int, stride: ir.Value,
              mask: ir.Value | None) -> None:
        """The softmax of the vl (masked: the mask's) columns at xs / ys over n bins, bin k at
        k * stride."""
        b = self.builder
        ops = _LaneOps(b, self.vl)

        def at(k) -> ir.Value:
            return b.mul(k if isinstance(k, ir.Value) else const_i64(k), stride)

        def load(ptr, k):
            if mask is None:
                return b.load(self._at(ptr, at(k)), align=4)
            return self._mload(ptr, at(k), mask, 0.0)

        def store(value, k):
            if mask is None:
                b.store(value, self._at(ys, at(k)), align=4)
            else:
                self._mstore(value, ys, at(k), mask)

        def tree(values, combine):
            while len(values) > 1:
                values = [combine(values[i], values[i + 1]) if i + 1 < len(values)
                          else values[i] for i in range(0, len(values), 2)]
            return values[0]

        def fold(step, init, combine):
            """combine(step(k)) over the bins: a tree when unrolled, else a loop."""
            if n <= self.UNROLL_BINS:
                values = [step(k) for k in range(n)]
                return None if init is None else tree(values, combine)
            slot = None
            if init is not None:
                slot = alloca_once(b, self.vty, name="acc")
                b.store(init, slot)
            with for_range(b, const_i64(0), const_i64(n), "bin") as k:
                value = step(k)
                if slot is not None:
                    b.store(combine(b.load(slot), value), slot)
            return None if slot is None else b.load(slot)

        m = fold(lambda k: load(xs, k), self._splat(-np.inf), self._vmax)

        def exp_step(k):
            e = exp_nonpositive(ops, b.fsub(load(xs, k), m))
            if not self.log:
                store(e, k)
            return e
        total = fold(exp_step, self._splat(0.0), b.fadd)
        if self.log:
            # one scalar log per softmax row, as the last-axis kernel takes (vecmath's log
            # is not lane-wise)
            lse = ir.Constant(self.vty, None)
            for lane in range(self.vl):
                idx = ir.Constant(I32, lane)
                lse = b.insert_element(lse, call_math(b, "log", b.extract_element(total, idx)),
                                       idx)
            fold(lambda k: store(b.fsub(b.fsub(load(xs, k), m), lse), k), None, None)
        else:
            inv = b.fdiv(self._splat(1.0), total)
            fold(lambda k: store(b.fmul(load(ys, k), inv), k), None, None)


def _emit_strided_softmax(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                          size_vars: tuple[str, ...],
                          options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """``_StridedSoftmax`` when ``func`` is a softmax over a static axis that is not the last."""
    match = match_softmax_axis(func)
    if match is None:
        return None
    out, log, axis = match
    shape = func.inputs[0].shape
    if axis == len(shape) - 1 or not isinstance(shape[axis], int):
        return None
    return _StridedSoftmax(module, func, symbol, out, log, axis, vl, size_vars, options).emit()
