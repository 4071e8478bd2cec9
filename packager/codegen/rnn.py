"""The kernel of ``nn.recurrence`` (``ops/sequence.py``): the whole time loop of an LSTM, GRU or
RNN layer in one call, both directions of a bidirectional layer on their own task.

Per step, the recurrent product h_prev @ R^T runs one block of UNIT_BLOCK hidden units at a
time: the block's packed weights are one contiguous stream (input unit k, then each gate's
UNIT_BLOCK weights), and a register tile of batch rows x weight vectors accumulates over k
(``fmuladd`` of a broadcast h_prev[k]); at batch 1 on AVX2 every gate of a block sits in
registers. The sums go to a small scratch row; a scalar loop over the hidden units then adds the
projected input (``xw``, biases included), applies sigmoid/tanh from ``vecmath`` (LLVM
vectorizes it) and writes h straight into the output row of step t, which is also where the
next step reads h_prev from. The cell state stays in the workspace. With ``quantize_h``
(com.microsoft.DynamicQuantizeLSTM) h_prev first goes through DynamicQuantizeLinear and back
into a workspace row (``_requantize``), which the product reads instead.

With ``int_r`` as well (``passes/fuse_qdq.py`` found R to be int8 times a scale per row) the
product is ONNX Runtime's integer one: h_prev quantized to uint8 (the same DynamicQuantizeLinear)
and stored as int16 q - zp (k padded to even), R int8 in k-pairs (``pack_recurrent_int8``),
``vpmaddwd`` of a broadcast (h[k], h[k+1]) pair with 8 units' (R[j, k], R[j, k+1]) pairs into
int32 accumulators (exact: |q - zp| <= 255, |R| <= 128), then float32(acc) * (h_scale *
r_scale[row]) into the gate sums. R streams 1 byte per weight instead of 4.

Why one kernel and not one per step: at batch 1 a step is a few microseconds of work, and a VM
call per gate and step (the unrolled graph) cost more than the arithmetic. What bounds a step
now is streaming R from L2 (G*H*H*4 bytes, 192 KB for a GRU with H = 128; measured ~27 bytes per
cycle on Zen 4), then the gates' exp and divisions (about a fifth of the time).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ops.sequence import GATES, UNIT_BLOCK, int8_packed_size, weight_groups
from .helpers import ARITH_FLAGS, F32, I8, I16, I32, alloca_once, const_i64, for_range, intrinsic
from .lower import WORKSPACE_ALIGN, KernelEmitter, KernelInfo, LoweringError
from .vecmath import call_math

# Vector registers by vector width: 16 up to AVX2 (x86-64-v2 has 16 xmm too; NEON's 32 are not
# counted on, as one code path serves both), 32 with AVX-512.
_REGISTERS = {4: 16, 8: 16, 16: 32}


def register_tile(nvec: int, batch: int, registers: int) -> tuple[int, int]:
    """(vectors, batch rows) of one register tile of the recurrent product: as many
    accumulators as fit beside one broadcast and (several rows sharing them) the loaded weight
    vectors, then the fewest loads per multiply-add (a tile of v vectors and r rows loads v
    weights and r broadcasts for v * r multiply-adds). ``vectors`` divides ``nvec``, the
    vectors of one block row."""
    best = (0, 0, 1, 1)
    for vecs in (v for v in range(1, nvec + 1) if nvec % v == 0):
        for rows in range(1, batch + 1):
            if vecs * rows + (vecs if rows > 1 else 0) + 1 <= registers:
                score = (vecs * rows, -(vecs + rows) / (vecs * rows), vecs, rows)
                best = max(best, score)
    return best[2], best[3]


def match_recurrence(func: PrimFunc):
    """(output, tag) if ``func`` is an ``nn.recurrence``; raises if this kernel cannot run it,
    since its stand-in loop nest computes nothing meaningful."""
    if len(func.outputs) != 1:
        return None
    out = func.outputs[0]
    if not isinstance(out.body, te.Reduce):
        return None
    tag = reduction_tag(out.body)
    if tag is None or tag.kind != "recurrence":
        return None
    int_r = bool(tag.attrs.get("int_r", False))
    if any(t.dtype != ("int8" if int_r and i == 1 else "float32")
           for i, t in enumerate(tag.operands)) or out.dtype != "float32":
        raise LoweringError(f"{func.name}: the recurrence kernel computes float32 only")
    if [t.uid for t in tag.operands] != [t.uid for t in func.inputs]:
        raise LoweringError(f"{func.name}: the recurrence's inputs were rewritten")
    return out, tag


class RecurrenceEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, out: te.Tensor, tag,
                 vl: int, size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.out = out
        self.vl = vl
        self.vty = ir.VectorType(F32, vl)
        a = tag.attrs
        self.cell: str = a["cell"]
        self.hidden: int = int(a["hidden"])
        self.reverse: tuple = tuple(bool(r) for r in a["reverse"])
        self.lbr = bool(a.get("linear_before_reset", False))
        self.states = bool(a.get("states", False))
        self.quantize_h = bool(a.get("quantize_h", False))
        self.int_r = bool(a.get("int_r", False))
        self.avx2 = module.triple.startswith("x86_64") and vl >= 8
        xw = func.inputs[0]
        self.steps, self.batch, _ = xw.shape   # steps: a size expression in a symbolic kernel
        if not isinstance(self.batch, int):
            raise LoweringError(f"{func.name}: the recurrence kernel needs a fixed batch")
        self.dirs = len(self.reverse)
        self.gates = GATES[self.cell]
        self.blocks = -(-self.hidden // UNIT_BLOCK)
        self.hpad = self.blocks * UNIT_BLOCK
        # per direction, in floats: gate sums [B, G, Hp], then the cell state or r * h [B, H]
        extra = self.batch * self.hidden if self.cell == "lstm" or (
            self.cell == "gru" and not self.lbr) else 0
        self.kp = self.hidden + self.hidden % 2
        if self.int_r:                                    # then q(h_prev) - zp, int16 [B, kp]
            extra += -(-self.batch * self.kp // 2)
        elif self.quantize_h:                             # then the requantized h_prev
            extra += self.batch * self.hidden
        floats = self.batch * self.gates * self.hpad + extra
        self.ws_dir = -(-floats * 4 // WORKSPACE_ALIGN) * WORKSPACE_ALIGN

    # ---- small helpers ---------------------------------------------------------------------------

    def _at(self, ptr: ir.Value, offset) -> ir.Value:
        off = offset if isinstance(offset, ir.Value) else const_i64(offset)
        return self.builder.gep(ptr, [off], inbounds=True)

    def _ld(self, ptr: ir.Value, offset) -> ir.Value:
        return self.builder.load(self._at(ptr, offset))

    def _st(self, value: ir.Value, ptr: ir.Value, offset) -> None:
        self.builder.store(value, self._at(ptr, offset))

    def _fadd(self, a, c):
        return self.builder.fadd(a, c, flags=ARITH_FLAGS)

    def _fmul(self, a, c):
        return self.builder.fmul(a, c, flags=ARITH_FLAGS)

    def _sig(self, x):
        return call_math(self.builder, "sigmoid", x)

    def _tanh(self, x):
        return call_math(self.builder, "tanh", x)

    def _splat(self, x: ir.Value) -> ir.Value:
        b = self.builder
        v = b.insert_element(ir.Constant(self.vty, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(self.vty, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _mul_i(self, a: ir.Value, n: int) -> ir.Value:
        return self.builder.mul(a, const_i64(n), flags=("nsw",))

    # ---- the kernel ------------------------------------------------------------------------------

    def emit(self) -> KernelInfo:
        params = self.func.inputs + [self.out]
        body_fn, ptr_types = self._begin_body(params, workspace=True)
        n_in = len(self.func.inputs)
        args = body_fn.args
        ins = list(args[:n_in])
        out, ws = args[n_in], args[n_in + 1]
        task, ntasks = args[len(ptr_types)], args[len(ptr_types) + 1]   # after [sizes]
        b = self.builder
        dirs = const_i64(self.dirs)
        lo = b.sdiv(b.mul(task, dirs), ntasks)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), dirs), ntasks)
        wsf = b.bitcast(ws, F32.as_pointer())
        for d in range(self.dirs):
            mine = b.and_(b.icmp_signed("<=", lo, const_i64(d)),
                          b.icmp_signed(">", hi, const_i64(d)))
            with b.if_then(mine):
                self._direction(d, ins, out, self._at(wsf, d * self.ws_dir // 4))
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        if self.symbolic:   # the step count is read from the sizes array (last pointer)
            return KernelInfo(self.symbol, n_in, 1, 0, self.dirs > 1, symbolic=True,
                              workspace_expr=self.dirs * self.ws_dir)
        return KernelInfo(self.symbol, n_in, 1, self.dirs * self.ws_dir, self.dirs > 1)

    def _direction(self, d: int, ins: list[ir.Value], out: ir.Value, ws: ir.Value) -> None:
        b = self.builder
        B, H, G, D = self.batch, self.hidden, self.gates, self.dirs
        T = self._dim_value(self.steps)                   # i64: static or from the sizes
        xw, r, h0 = ins[0], ins[1], ins[2]
        gates = ws
        state = self._at(ws, B * G * self.hpad)           # LSTM: c; GRU (reset first): r * h
        r_d = self._at(r, d * G * self.hpad * H)
        h0_d = self._at(h0, d * B * H)
        if self.cell == "lstm":
            c0_d = self._at(ins[3], d * B * H)
            with for_range(b, const_i64(0), const_i64(B * H), "c0") as i:
                self._st(self._ld(c0_d, i), state, i)
        rbh = self._at(ins[3], d * H) if self.cell == "gru" and self.lbr else None
        rev = self.reverse[d]
        if self.int_r:
            r_d = self._at(b.bitcast(r, I8.as_pointer()), d * int8_packed_size(H))
            s_d = self._at(ins[4], d * G * self.hpad)
            hq = b.bitcast(self._at(state, B * H), I16.as_pointer())
            if self.kp != H:                              # the pad k of each row stays 0
                for row in range(B):
                    self._st(ir.Constant(I16, 0), hq, row * self.kp + H)
        products, at = [], 0          # (packed weights, first gate, gates) per weight group
        for g0, gn in weight_groups(self.cell, self.lbr):
            products.append((self._at(r_d, at), g0, gn))
            at += self.blocks * H * gn * UNIT_BLOCK
        with for_range(b, const_i64(0), T, "step") as s:
            last = const_i64(self.steps - 1) if isinstance(self.steps, int) else \
                b.sub(T, const_i64(1))
            t = b.sub(last, s) if rev else s
            prev_t = b.add(t, const_i64(1)) if rev else b.sub(t, const_i64(1))
            # h_prev: h0 at the first step, else the output row the previous step wrote
            prev_row = b.gep(out, [self._mul_i(b.add(self._mul_i(prev_t, D), const_i64(d)),
                                               B * H)])
            prev = b.select(b.icmp_signed("==", s, const_i64(0)), h0_d, prev_row)
            y = self._at(out, self._mul_i(b.add(self._mul_i(t, D), const_i64(d)), B * H))
            x = self._at(xw, b.add(self._mul_i(t, B * D * G * H), const_i64(d * G * H)))
            src = prev
            if self.int_r:
                hs = self._requantize(prev, hq, B * H)
                self._matvec_int(hq, r_d, s_d, hs, gates)
            else:
                if self.quantize_h:
                    src = self._at(state, B * H)
                    self._requantize(prev, src, B * H)
                self._matvec(src, *products[0], gates)
                if len(products) == 2:                    # GRU resetting before its product
                    self._gru_reset(x, prev, gates, state)
                    self._matvec(state, *products[1], gates)
            self._cell(x, prev, gates, state, rbh, y)
        if self.states and self.cell == "lstm":           # the final cell state: row T
            dst = self._at(out, (self.steps * D + d) * B * H if isinstance(self.steps, int)
                           else self._mul_i(b.add(self._mul_i(T, D), const_i64(d)), B * H))
            with for_range(b, const_i64(0), const_i64(B * H), "fin") as i:
                self._st(self._ld(state, i), dst, i)

    def _requantize(self, src: ir.Value, dst: ir.Value, n: int) -> None:
        """dst[:n] = src[:n] through ONNX DynamicQuantizeLinear (uint8) and dequantized back, as
        ``ops.sequence.requantized``: the range with 0, scale 1 for an all-zero row, rounding
        half to even, the divisions exact (no reciprocal)."""
        b = self.builder
        zero, f255 = ir.Constant(F32, 0.0), ir.Constant(F32, 255.0)
        # minimumnum, not minnum: LLVM 22's loop vectorizer asserts ("VPlan cost model and
        # legacy cost model disagreed") on a minnum/maxnum reduction without nnan for AVX-512
        # at some trip counts (B * H = 63 here); the *num variants ignore NaN alike
        fmin = intrinsic(self.module, "llvm.minimumnum.f32", F32, [F32, F32])
        fmax = intrinsic(self.module, "llvm.maximumnum.f32", F32, [F32, F32])
        rnd = intrinsic(self.module, "llvm.roundeven.f32", F32, [F32])
        lo_p, hi_p = alloca_once(b, F32, "qlo"), alloca_once(b, F32, "qhi")
        b.store(zero, lo_p)
        b.store(zero, hi_p)
        with for_range(b, const_i64(0), const_i64(n), "qr") as i:
            v = self._ld(src, i)
            b.store(b.call(fmin, [b.load(lo_p), v]), lo_p)
            b.store(b.call(fmax, [b.load(hi_p), v]), hi_p)
        lo, hi = b.load(lo_p), b.load(hi_p)
        scale = b.select(b.fcmp_ordered("==", hi, lo), ir.Constant(F32, 1.0),
                         b.fdiv(b.fsub(hi, lo), f255))
        zp = b.call(fmin, [b.call(fmax, [b.call(rnd, [b.fsub(zero, b.fdiv(lo, scale))]), zero]),
                           f255])
        if self.int_r:    # q - zp as int16 into dst [B, kp]
            with for_range(b, const_i64(0), const_i64(self.batch), "qb") as row:
                s_row = self._at(src, self._mul_i(row, self.hidden))
                d_row = self._at(dst, self._mul_i(row, self.kp))
                with for_range(b, const_i64(0), const_i64(self.hidden), "qh") as i:
                    q = b.fadd(b.call(rnd, [b.fdiv(self._ld(s_row, i), scale)]), zp)
                    q = b.call(fmin, [b.call(fmax, [q, zero]), f255])
                    self._st(b.fptosi(b.fsub(q, zp), I16), d_row, i)
            return scale
        with for_range(b, const_i64(0), const_i64(n), "qh") as i:
            q = b.fadd(b.call(rnd, [b.fdiv(self._ld(src, i), scale)]), zp)
            q = b.call(fmin, [b.call(fmax, [q, zero]), f255])
            self._st(b.fmul(b.fsub(q, zp), scale), dst, i)
        return scale

    # ---- the recurrent product --------------------------------------------------------------------

    def _matvec_int(self, hq: ir.Value, w: ir.Value, scales: ir.Value, hs: ir.Value,
                    gates: ir.Value) -> None:
        """gates[b, g, j] = float32(sum_k hq[b, k] * R[g, j, k]) * (hs * scales[g, j]) for the
        int8 k-pair packed R (``pack_recurrent_int8``), every gate and unit (padded to whole
        blocks); tiles as ``_matvec``, with 8 int32 lanes per vector."""
        b = self.builder
        line_len = self.gates * UNIT_BLOCK * 2      # int8 per k-pair within a block
        nvec = line_len // 16
        vecs, rows = register_tile(nvec, self.batch, 16)
        with for_range(b, const_i64(0), const_i64(self.blocks), "jb") as jb:
            blk = self._at(w, self._mul_i(jb, self.kp // 2 * line_len))
            for v0 in range(0, nvec, vecs):
                run = (blk, jb, v0, vecs, line_len, scales, hs)
                self._batch_tiles(rows, partial(self._tile_int, hq, gates, run))

    def _batch_tiles(self, rows: int, tile: Callable[[ir.Value, int], None]) -> None:
        """``tile(row0, n)`` over the batch rows, ``rows`` at a time (``_matvec``,
        ``_matvec_int``): the whole tiles (a loop where there are several), then the rows
        left."""
        b = self.builder
        full = self.batch // rows
        if full == 1:
            tile(const_i64(0), rows)
        elif full:
            with for_range(b, const_i64(0), const_i64(full), "tile") as ti:
                tile(self._mul_i(ti, rows), rows)
        if self.batch % rows:
            tile(const_i64(full * rows), self.batch % rows)

    def _madd(self, a: ir.Value, w: ir.Value) -> ir.Value:
        """Per int32 lane: a.lo * w.lo + a.hi * w.hi of two int16 pairs (``vpmaddwd``)."""
        b = self.builder
        v8i32, v16i16 = ir.VectorType(I32, 8), ir.VectorType(I16, 16)
        if self.avx2:
            f = intrinsic(self.module, "llvm.x86.avx2.pmadd.wd", v8i32, [v16i16, v16i16])
            return b.call(f, [a, w])
        v16i32 = ir.VectorType(I32, 16)
        p = b.mul(b.sext(a, v16i32), b.sext(w, v16i32))
        even = ir.Constant(v8i32, list(range(0, 16, 2)))
        odd = ir.Constant(v8i32, list(range(1, 16, 2)))
        return b.add(b.shuffle_vector(p, p, even), b.shuffle_vector(p, p, odd))

    def _tile_int(self, hq: ir.Value, gates: ir.Value, run: tuple, row0: ir.Value, rows: int
                  ) -> None:
        blk, jb, v0, vecs, line_len, scales, hs = run
        b = self.builder
        G, U = self.gates, UNIT_BLOCK
        v8i32, v16i16, v16i8 = ir.VectorType(I32, 8), ir.VectorType(I16, 16), \
            ir.VectorType(I8, 16)
        v8f32 = ir.VectorType(F32, 8)
        accs = [[alloca_once(b, v8i32, name=f"iacc{r}_{v}") for v in range(vecs)]
                for r in range(rows)]
        pairs = [b.bitcast(self._at(hq, self._mul_i(b.add(row0, const_i64(r)), self.kp)),
                           I32.as_pointer()) for r in range(rows)]
        for a in (a for row in accs for a in row):
            b.store(ir.Constant(v8i32, None), a)
        with for_range(b, const_i64(0), const_i64(self.kp // 2), "kp") as p:
            line = self._at(blk, self._mul_i(p, line_len))
            wv = [b.sext(b.load(b.bitcast(self._at(line, (v0 + v) * 16), v16i8.as_pointer()),
                                align=1), v16i16) for v in range(vecs)]
            for r in range(rows):
                pair = b.load(self._at(pairs[r], p), align=4)
                v = b.insert_element(ir.Constant(v8i32, None), pair, ir.Constant(I32, 0))
                v = b.shuffle_vector(v, ir.Constant(v8i32, None),
                                     ir.Constant(v8i32, [0] * 8))
                hv = b.bitcast(v, v16i16)
                for vi in range(vecs):
                    a = accs[r][vi]
                    b.store(b.add(b.load(a), self._madd(hv, wv[vi])), a)
        hsv = b.insert_element(ir.Constant(v8f32, None), hs, ir.Constant(I32, 0))
        hsv = b.shuffle_vector(hsv, ir.Constant(v8f32, None), ir.Constant(v8i32, [0] * 8))
        for vi in range(vecs):
            g, lane = divmod((v0 + vi) * 8, U)
            unit = b.add(self._mul_i(jb, U), const_i64(g * self.hpad + lane))
            sv = b.load(b.bitcast(self._at(scales, unit), v8f32.as_pointer()), align=4)
            mult = b.fmul(hsv, sv)
            for r in range(rows):
                base = b.add(self._mul_i(b.add(row0, const_i64(r)), G * self.hpad), unit)
                f = b.fmul(b.sitofp(b.load(accs[r][vi]), v8f32), mult)
                b.store(f, b.bitcast(self._at(gates, base), v8f32.as_pointer()), align=4)

    def _matvec(self, src: ir.Value, w: ir.Value, g0: int, gn: int, gates: ir.Value) -> None:
        """gates[b, g0 + g, j] = sum_k src[b, k] * R[g0 + g, j, k] for the group's gates g < gn,
        every hidden unit j (padded to whole blocks). Per block of units and run of vectors of
        its rows, every tile of batch rows, so the weights a run reads (H x vectors) stay in L1
        from one tile to the next."""
        b = self.builder
        H, row_len = self.hidden, gn * UNIT_BLOCK  # floats per input unit within a block
        vecs, rows = register_tile(row_len // self.vl, self.batch, _REGISTERS.get(self.vl, 16))
        with for_range(b, const_i64(0), const_i64(self.blocks), "jb") as jb:
            blk = self._at(w, self._mul_i(jb, H * row_len))
            for v0 in range(0, row_len // self.vl, vecs):
                run = (blk, jb, v0, vecs, row_len, g0)
                self._batch_tiles(rows, partial(self._tile, src, gates, run))

    def _tile(self, src: ir.Value, gates: ir.Value, run: tuple, row0: ir.Value, rows: int
              ) -> None:
        """Batch rows row0 .. row0 + rows x one run of vectors of a block: rows x vecs
        accumulators over the input units k; each loaded weight vector serves every row, each
        broadcast h[k] every vector."""
        blk, jb, v0, vecs, row_len, g0 = run
        b, vl = self.builder, self.vl
        H, G, U = self.hidden, self.gates, UNIT_BLOCK
        fma = intrinsic(self.module, f"llvm.fmuladd.v{vl}f32", self.vty, [self.vty] * 3)
        vptr = self.vty.as_pointer()
        accs = [[alloca_once(b, self.vty, name=f"acc{r}_{v}") for v in range(vecs)]
                for r in range(rows)]
        zero = ir.Constant(self.vty, [0.0] * vl)
        srcs = [self._at(src, self._mul_i(b.add(row0, const_i64(r)), H)) for r in range(rows)]
        for a in (a for row in accs for a in row):
            b.store(zero, a)
        with for_range(b, const_i64(0), const_i64(H), "k") as k:
            line = self._at(blk, self._mul_i(k, row_len))
            wv = [b.load(b.bitcast(self._at(line, (v0 + v) * vl), vptr), align=4)
                  for v in range(vecs)]
            for r in range(rows):
                hk = self._splat(self._ld(srcs[r], k))
                for v in range(vecs):
                    a = accs[r][v]
                    b.store(b.call(fma, [hk, wv[v], b.load(a)]), a)
        for r in range(rows):
            for v in range(vecs):
                g, lane = divmod((v0 + v) * vl, U)
                base = b.add(self._mul_i(b.add(row0, const_i64(r)), G * self.hpad),
                             b.add(self._mul_i(jb, U), const_i64((g0 + g) * self.hpad + lane)))
                b.store(b.load(accs[r][v]), b.bitcast(self._at(gates, base), vptr), align=4)

    # ---- the gates ---------------------------------------------------------------------------------

    def _units(self, name: str):
        """Loop over (batch row, hidden unit): yields (row offset in xw, offset in [B, H],
        offset of gate 0 in the gate sums, j)."""
        b = self.builder
        B, H, G, D = self.batch, self.hidden, self.gates, self.dirs
        with for_range(b, const_i64(0), const_i64(B), f"{name}.b") as bi:
            xrow = self._mul_i(bi, D * G * H)
            hrow = self._mul_i(bi, H)
            grow = self._mul_i(bi, G * self.hpad)
            with for_range(b, const_i64(0), const_i64(H), f"{name}.j") as j:
                yield b.add(xrow, j), b.add(hrow, j), b.add(grow, j), j

    def _pre(self, x: ir.Value, gates: ir.Value, xo: ir.Value, go: ir.Value, g: int) -> ir.Value:
        """The pre-activation of gate g: recurrent sum + projected input (biases included)."""
        H = self.hidden
        return self._fadd(self._ld(gates, self.builder.add(go, const_i64(g * self.hpad))),
                          self._ld(x, self.builder.add(xo, const_i64(g * H))))

    def _gru_reset(self, x, prev, gates, rh) -> None:
        """A GRU resetting before its linear map: z into the gate sums' slot 0, r * h_prev into
        ``rh`` for the second product."""
        for xo, ho, go, _ in self._units("gr"):
            z = self._sig(self._pre(x, gates, xo, go, 0))
            r = self._sig(self._pre(x, gates, xo, go, 1))
            self._st(z, gates, go)
            self._st(self._fmul(r, self._ld(prev, ho)), rh, ho)

    def _cell(self, x, prev, gates, state, rbh, y) -> None:
        """The gates of one step: the new h into ``y`` (and an LSTM's c into ``state``)."""
        b = self.builder
        one = ir.Constant(F32, 1.0)
        for xo, ho, go, j in self._units(self.cell):
            if self.cell == "rnn":
                h = self._tanh(self._pre(x, gates, xo, go, 0))
            elif self.cell == "lstm":
                i = self._sig(self._pre(x, gates, xo, go, 0))
                o = self._sig(self._pre(x, gates, xo, go, 1))
                f = self._sig(self._pre(x, gates, xo, go, 2))
                cand = self._tanh(self._pre(x, gates, xo, go, 3))
                c = self._fadd(self._fmul(f, self._ld(state, ho)), self._fmul(i, cand))
                self._st(c, state, ho)
                h = self._fmul(o, self._tanh(c))
            else:
                if self.lbr:
                    z = self._sig(self._pre(x, gates, xo, go, 0))
                    r = self._sig(self._pre(x, gates, xo, go, 1))
                    lin = self._ld(gates, b.add(go, const_i64(2 * self.hpad)))
                    if rbh is not None:
                        lin = self._fadd(lin, self._ld(rbh, j))
                    xh = self._ld(x, b.add(xo, const_i64(2 * self.hidden)))
                    cand = self._tanh(self._fadd(xh, self._fmul(r, lin)))
                else:
                    z = self._ld(gates, go)
                    cand = self._tanh(self._pre(x, gates, xo, go, 2))
                hp = self._ld(prev, ho)
                h = self._fadd(self._fmul(b.fsub(one, z, flags=ARITH_FLAGS), cand),
                               self._fmul(z, hp))
            self._st(h, y, ho)


def emit_recurrence(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                    size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The recurrence kernel of ``func``, or None. With ``size_vars`` (a symbolic module) the
    step count may be a size expression (a speech model's frames), read at run time."""
    match = match_recurrence(func)
    if match is None:
        return None
    return RecurrenceEmitter(module, func, symbol, *match, vl, size_vars).emit()
