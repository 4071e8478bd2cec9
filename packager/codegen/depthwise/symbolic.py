"""Depthwise convolutions (NCHW float32, one input channel per group, every channel its own
group, any channel multiplier, horizontal stride 1 or 2) whose image size (H, W, and the
batch) is known at run time only.

The static kernel (``static.py``) plans its rows and chunks from the extents at export;
here the channels, the window, the strides and the padding are known at export and the rest
is read from the module's size variables. The kernel is the static kernel's padded form (the
one it uses on AVX2, SSE and NEON) with every extent a run-time value:

* each task (at most ``MAX_TASK_REGIONS``) owns a region of the workspace: a zero-margined
  copy of one input plane at a time, ``pt`` zero rows above it and ``pb`` below, ``pl`` zero
  columns left of every row and at least ``pr + 16`` right of it (rows 64-byte multiples).
  With stride 2 each row is split by the padded column's parity (two *phase* rows of
  ``phase_len`` floats), so that tap kx = 2m + p of the chunk at output column ox0 is one
  plain load from phase p at ox0 + m (no shuffles in the inner loop). The region is zeroed
  once per call; a row's copy reads its last vector (or 2) past the row's end where that
  stays inside the plane and then zeroes the margin it spilled into, else loads it masked;
* no window row or column then needs a bounds check: output rows go ``rows`` at a time,
  their chunks of ``vl`` outputs ``chunks`` at a time (each weight broadcast once per plane,
  each input vector feeding every output row that reads it); a row's last chunk ends at the
  row's end, overlapping the one before it (outputs computed twice, stored whole: a masked
  store, vmaskmovps, is slow on AMD's AVX2 cores), unless the row is narrower than a vector
  or the epilogue reads along it (a residual that could be the output itself, in place):
  then the partial chunk's lanes are stored with a mask. The leftover rows of a plane
  (``OH % rows``, all of a plane shorter than a block) go one at a time, skipping the
  window rows that lie in the padding (a branch each, the same for the whole row);
* a chunk's sums are split over window rows (``ky % split``) until ``CHAINS`` are in flight:
  a row alone was one chain of kh * kw dependent multiply-adds, latency-bound;
* the fused epilogue (bias, folded batch norm, activation, residual) is the static kernel's,
  a vector at a time.

The symbolic convolution kernel (``contraction/conv_symbolic.py``) ran these as a one-row matrix tile
over stride-phase planes: PP-OCRv4's detector's depthwise layers 1.3-2.6x the static kernel's
time (kernels alone, 1 thread); this kernel 1.0-1.3x (the small, late layers: 15 x 20 rows,
where the static kernel also skips the window rows in the padding).
"""

from __future__ import annotations

from llvmlite import ir

from ...ir import te
from ...ir.graph import PrimFunc
from ..contraction.conv_symbolic import SymbolicConvEmitter
from ..contraction.geometry import MAX_TASK_REGIONS
from ..contraction.match import Contraction, match_contraction
from ..helpers import F32, I1, I32, I64, const_i64, for_range, intrinsic
from ..lower import WORKSPACE_ALIGN, KernelInfo
from .static import (PADDED_BLOCK, PADDED_BLOCK_MATH, begin_plane, emit_epilogue,
                     is_depthwise)
from ..threads import DEFAULTS, SplitThresholds

# Columns of right margin beyond the padding: the widest vector of any target (a bundle's
# variants share the workspace size), so that a row's last chunk (up to vl - 1 lanes past the
# output row) and its copy's last, masked vector stay inside the row.
MARGIN = 16

# Independent sums a row block's multiply-adds are spread over (``_emit_chunk``), by vector
# width: 8 with AVX-512's 32 registers (2 FMA pipes x 4 cycles of latency), 4 with 16; a row
# alone 4 (Zen 5, 480 planes 3x80 5x5, 1 thread, min us: 5 sums 70, 4 sums 58).
CHAINS = {16: 8}
CHAINS_NARROW = 4


class SymbolicDepthwiseEmitter(SymbolicConvEmitter):

    def emit(self) -> KernelInfo:
        x_t, w_t = self.match.tag.operands
        attrs = self.match.tag.attrs
        self.c = x_t.shape[1]
        self.o, _, self.kh, self.kw = w_t.shape
        self.sh, self.sw = attrs["strides"]
        self.pt, self.pl, self.pb, self.pr = attrs["padding"]
        h, w = x_t.shape[2], x_t.shape[3]
        # the padded plane: rows_buf rows of row_stride floats (see the module docstring); for
        # a valid convolution (oh - 1) * sh + kh <= h + pt + pb, and the chunks of a row read
        # at most ceil(ow / vl) * vl + kw - 1 <= w + pl + pr + vl - 1 padded columns
        rows_buf = h + self.pt + self.pb
        if self.sw == 1:
            row_stride = (w + self.pl + self.pr + MARGIN + 15) // 16 * 16
            self.phase_len = None
        else:
            self.phase_len = ((w + self.pl + self.pr + 1) // 2 + MARGIN + 1 + 15) // 16 * 16
            row_stride = 2 * self.phase_len
        region = (rows_buf * row_stride + 15) // 16 * 16
        self.rows_buf_d, self.row_stride_d, self.region_d = rows_buf, row_stride, region
        self.vector_epilogue = self._vector_epilogue_ok()
        # the last chunk may overlap the one before it when the epilogue reads nothing along
        # the row (a residual read there could be the output itself, planned in place)
        last = self.match.out.axes[-1]
        self.overlap = self.vector_epilogue and not any(
            isinstance(node, te.Read) and any(i is last for i in node.indices)
            for node in te.walk(self.match.body, skip=self.match.reduce))
        math = any(isinstance(node, te.MathCall)
                   for node in te.walk(self.match.body, skip=self.match.reduce))
        if self.target_vl >= 16:
            self.row_block, self.col_block = 4, 1   # 32 registers: depthwise.ROW_BLOCK
        else:
            self.row_block, self.col_block = PADDED_BLOCK_MATH if math else PADDED_BLOCK
        workspace = region * MAX_TASK_REGIONS * 4 + WORKSPACE_ALIGN
        params = self.func.inputs + self.func.outputs
        body_fn, ptr_types = self._begin_body(params, True)
        n_ptrs = len(ptr_types)
        ws = body_fn.args[len(params)]
        self._emit_tasks(ws, body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1])
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        # parallel when a 128 x 128 output would pay for a second task (a smaller call uses
        # fewer tasks, _tasks_used). 32 x 32 left PP-OCR's detector's first depthwise layers
        # (16-48 channels 3x3, the largest) on one thread
        per_position = self.o * self.kh * self.kw
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), 0,
                          per_position * 128 * 128 >= 2 * self.options.parallel_min_macs, symbolic=True,
                          workspace_expr=workspace)

    # ---- emission -------------------------------------------------------------------------------

    def _emit_tasks(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        x_t = self.match.tag.operands[0]
        out = self.match.out
        self.H, self.W = self._dim_value(x_t.shape[2]), self._dim_value(x_t.shape[3])
        self.OH, self.OW = self._dim_value(out.shape[2]), self._dim_value(out.shape[3])
        self.row_stride = self._dim_value(self.row_stride_d)
        self.phase = None if self.phase_len is None else self._dim_value(self.phase_len)
        N = self._dim_value(x_t.shape[0])
        planes = b.mul(N, const_i64(self.o))
        macs = b.mul(b.mul(planes, b.mul(self.OH, self.OW)), const_i64(self.kh * self.kw))
        nt = self._tasks_used(macs, ntasks, MAX_TASK_REGIONS)
        with b.if_then(b.icmp_signed("<", task, nt)):
            region_floats = self._dim_value(self.region_d)
            region = b.gep(b.bitcast(ws, F32.as_pointer()), [b.mul(task, region_floats)],
                           inbounds=True)
            memset = intrinsic(self.module, "llvm.memset.p0i8.i64", ir.VoidType(),
                               [ir.IntType(8).as_pointer(), ir.IntType(8), I64, I1])
            used = b.mul(self._dim_value(self.rows_buf_d), self.row_stride)
            b.call(memset, [b.bitcast(region, ir.IntType(8).as_pointer()),
                            ir.Constant(ir.IntType(8), 0), b.mul(used, const_i64(4)),
                            ir.Constant(I1, 0)])
            lo, hi = self._split_v(planes, task, nt)
            self._emit_plane_range(lo, hi, region)

    def _emit_plane_range(self, lo, hi, region: ir.Value) -> None:
        b = self.builder
        x_ptr = self.buffers[self.match.tag.operands[0].uid]
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        mult = self.o // self.c
        plane_size = b.mul(self.H, self.W)
        R = self.row_block
        with for_range(b, lo, hi, "plane") as p:
            nb = b.sdiv(p, const_i64(self.o))
            oc = b.srem(p, const_i64(self.o))
            ic = b.sdiv(oc, const_i64(mult)) if mult > 1 else oc
            src = b.gep(x_ptr, [b.mul(b.add(b.mul(nb, const_i64(self.c)), ic), plane_size)],
                        inbounds=True)
            self._copy_plane(src, region)
            begin_plane(self, w_ptr, nb, oc)
            self.plane_memo = self._plane_values() if self.vector_epilogue else {}
            nblk = b.sdiv(self.OH, const_i64(R))
            with for_range(b, const_i64(0), nblk, "oyb") as blk:
                self._emit_rows(region, b.mul(blk, const_i64(R)), R)
            # the leftover rows (fewer than R) one at a time: one more copy of the row code
            # (blocks of 2 and 1 were two; the 2-row block saved one weight load in 2 rows of
            # a plane, and cost its copy's compile time in every kernel)
            with for_range(b, b.mul(nblk, const_i64(R)), self.OH, "oyr") as oy:
                self._emit_rows(region, oy, 1)

    def _plane_values(self) -> dict:
        """The epilogue's reads that do not move along the plane (a bias, a folded batch
        norm's scale and shift), broadcast once per plane: ``_vvalue``'s memo for every chunk
        (evaluated in the chunk loop, their pointers and loads were redone per chunk, the
        pointers reloaded from the stack)."""
        out = self.match.out
        moving = {id(out.axes[2]), id(out.axes[3])}
        memo: dict[int, ir.Value] = {}
        for node in te.walk(self.match.body, skip=self.match.reduce):
            if isinstance(node, te.Read) and id(node) not in memo and all(
                    isinstance(i, te.Const) or (isinstance(i, te.IndexVar)
                                                and id(i) in self.env and id(i) not in moving)
                    for i in node.indices):
                idx = [const_i64(int(i.value)) if isinstance(i, te.Const) else self.env[id(i)]
                       for i in node.indices]
                ptr = self.builder.gep(self.buffers[node.tensor.uid],
                                       [self._offset(node.tensor, idx)], inbounds=True)
                value = self.builder.load(ptr)
                if node.tensor.dtype != "float32":   # a zero point, under a float32 cast
                    value = self.int_to_f32(value, node.tensor.dtype)
                memo[id(node)] = self._splat(value)
        return memo

    def _copy_plane(self, src: ir.Value, dst: ir.Value) -> None:
        """The input plane's rows into rows pt.. of the region: at column ``pl`` (stride 1),
        or split by the padded column's parity (stride 2), a step (vl columns, or 2 vl) at a
        time. A row's last step reads past its end: from the next rows, where those are in
        the plane (then a zero vector stored after the row's data, in its margin, covers what
        they left there), else (the plane's last rows) with masked loads (zero lanes)."""
        b = self.builder
        step = self.vl * self.sw
        steps = b.sdiv(b.add(self.W, const_i64(step - 1)), const_i64(step))
        # rows iy < fast read up to iy * W + steps * step <= H * W: inside the plane
        spare = b.sub(b.mul(self.H, self.W), b.mul(steps, const_i64(step)))
        fast = b.add(b.sdiv(spare, self.W), const_i64(1))
        fast = b.select(b.icmp_signed("<", spare, const_i64(0)), const_i64(0), fast)
        fast = b.select(b.icmp_signed("<", fast, self.H), fast, self.H)
        for lo, hi, masked in ((const_i64(0), fast, False), (fast, self.H, True)):
            with for_range(b, lo, hi, "cpy") as iy:
                s_row = b.gep(src, [b.mul(iy, self.W)], inbounds=True)
                d_row = b.gep(dst, [b.mul(b.add(iy, const_i64(self.pt)), self.row_stride)],
                              inbounds=True)
                if self.sw == 1:
                    self._copy_row(s_row, d_row, steps, masked)
                else:
                    self._copy_row_deinterleaved(s_row, d_row, steps, masked)

    def _load_step(self, s_row, off, masked: bool, v: int = 0) -> ir.Value:
        """Vector ``v`` of the step at s_row[off:] (``masked``: its lanes from the row's end
        on zero, none read)."""
        b = self.builder
        ptr = self._raw_ptr(s_row, b.add(off, const_i64(v * self.vl)))
        if not masked:
            return b.load(ptr, align=4)
        return self._masked_load(ptr, self._lane_mask(b.sub(self.W, off), v))

    def _copy_row(self, s_row: ir.Value, d_row: ir.Value, steps, masked: bool) -> None:
        b, vl = self.builder, self.vl
        d_row = b.gep(d_row, [const_i64(self.pl)], inbounds=True)
        zero = ir.Constant(self.vty, [0.0] * vl)
        if masked:   # whole vectors, then the last one masked
            full = b.sdiv(self.W, const_i64(vl))
            with for_range(b, const_i64(0), full, "cpv") as j:
                off = b.mul(j, const_i64(vl))
                b.store(self._load_step(s_row, off, False), self._vec_ptr(d_row, off), align=4)
            off = b.mul(full, const_i64(vl))
            with b.if_then(b.icmp_signed("<", off, self.W)):
                b.store(self._load_step(s_row, off, True), self._vec_ptr(d_row, off), align=4)
            return
        with for_range(b, const_i64(0), steps, "cpv") as j:
            off = b.mul(j, const_i64(vl))
            b.store(self._load_step(s_row, off, False), self._vec_ptr(d_row, off), align=4)
        b.store(zero, self._vec_ptr(d_row, self.W), align=4)

    def _copy_row_deinterleaved(self, s_row: ir.Value, d_row: ir.Value, steps,
                                masked: bool) -> None:
        """Source column ix -> padded column c = pl + ix -> phase c % 2 at c // 2: of the 2 vl
        columns from an even ix, the lanes of parity p go to phase (pl + p) % 2 from
        (pl + p) // 2 + ix / 2."""
        b, vl = self.builder, self.vl
        dsts = [b.gep(d_row, [b.add(b.mul(const_i64((self.pl + p) % 2), self.phase),
                                    const_i64((self.pl + p) // 2))], inbounds=True)
                for p in (0, 1)]
        lanes = [ir.Constant(ir.VectorType(I32, vl), list(range(p, 2 * vl, 2)))
                 for p in (0, 1)]

        def split(j, masked_step):
            off = b.mul(j, const_i64(2 * vl))
            lo_v = self._load_step(s_row, off, masked_step, 0)
            hi_v = self._load_step(s_row, off, masked_step, 1)
            for p in (0, 1):
                b.store(b.shuffle_vector(lo_v, hi_v, lanes[p]),
                        self._vec_ptr(dsts[p], b.mul(j, const_i64(vl))), align=4)

        if masked:   # whole steps, then the last one masked
            full = b.sdiv(self.W, const_i64(2 * vl))
            with for_range(b, const_i64(0), full, "cpv") as j:
                split(j, False)
            with b.if_then(b.icmp_signed("<", full, steps)):
                split(full, True)
            return
        with for_range(b, const_i64(0), steps, "cpv") as j:
            split(j, False)
        # the columns past the row's end: parity p's from (W - p + 1) // 2 on
        zero = ir.Constant(self.vty, [0.0] * vl)
        for p in (0, 1):
            first = b.sdiv(b.add(self.W, const_i64(1 - p)), const_i64(2))
            b.store(zero, self._vec_ptr(dsts[p], first), align=4)

    def _raw_ptr(self, ptr: ir.Value, offset: ir.Value) -> ir.Value:
        """A vector pointer that may lie past the buffer (a masked load's): no inbounds."""
        b = self.builder
        return b.bitcast(b.gep(ptr, [offset]), self.vty.as_pointer())

    def _emit_rows(self, region, oy0, nrows: int) -> None:
        """Output rows oy0 .. oy0 + nrows - 1, ``col_block`` chunks at a time. Rows at least a
        vector wide whose epilogue reads nothing along them (``overlap``): the last chunk
        ends at the row's end, overlapping the one before it (its outputs computed twice,
        stored whole); else the leftover full chunks, then the partial last one (masked)."""
        b, vl, cb = self.builder, self.vl, self.col_block
        nfull = b.sdiv(self.OW, const_i64(vl))
        nblk = b.sdiv(nfull, const_i64(cb))

        def ox(q):
            return b.mul(q, const_i64(vl))

        def blocks():
            with for_range(b, const_i64(0), nblk, "q") as qb:
                q0 = b.mul(qb, const_i64(cb))
                self._emit_chunk(region, oy0, nrows, [
                    (ox(b.add(q0, const_i64(c)) if c else q0), None) for c in range(cb)])

        def masked_rest():
            q = b.mul(nblk, const_i64(cb))
            for _ in range(cb - 1):   # at most cb - 1 leftover full chunks
                with b.if_then(b.icmp_signed("<", q, nfull)):
                    self._emit_chunk(region, oy0, nrows, [(ox(q), None)])
                q = b.add(q, const_i64(1))
            tail = b.sub(self.OW, ox(nfull))
            with b.if_then(b.icmp_signed(">", tail, const_i64(0))):
                self._emit_chunk(region, oy0, nrows, [(ox(nfull), tail)])

        if not self.overlap:
            blocks()
            masked_rest()
            return
        with b.if_else(b.icmp_signed(">=", self.OW, const_i64(vl))) as (wide, narrow):
            with wide:
                blocks()
                # the chunks left (at most cb): the last one clamped to end at the row's end
                q0 = b.mul(nblk, const_i64(cb))
                left = b.sub(b.sdiv(b.add(self.OW, const_i64(vl - 1)), const_i64(vl)), q0)
                last = b.sub(self.OW, const_i64(vl))
                for size in range(cb, 0, -1):
                    with b.if_then(b.icmp_signed("==", left, const_i64(size))):
                        starts = [ox(b.add(q0, const_i64(c))) for c in range(size)]
                        starts = [b.select(b.icmp_signed("<", x, last), x, last)
                                  for x in starts]
                        self._emit_chunk(region, oy0, nrows, [(x, None) for x in starts])
            with narrow:   # one partial chunk
                self._emit_chunk(region, oy0, nrows, [(const_i64(0), self.OW)])

    def _emit_chunk(self, region, oy0, nrows: int, chunks: list) -> None:
        """``chunks`` ((ox0, tail): the first output column, and tail None for a whole chunk,
        else the run-time number of its lanes stored) of ``nrows`` output rows; each input
        vector is loaded once for every output row and tap that reads it."""
        b = self.builder
        ox0s = [x for x, _ in chunks]
        top = b.mul(oy0, const_i64(self.sh))
        # a row's sum split over window rows (ky % split) where fewer than CHAINS sums are in
        # flight: one row of one chunk was one chain of kh * kw dependent multiply-adds
        chains = CHAINS.get(self.vl, CHAINS_NARROW) if nrows > 1 else CHAINS_NARROW
        split = min(self.kh, -(-chains // (nrows * len(chunks))))
        # one row alone (a plane's leftover rows, all of a plane shorter than a row block)
        # skips its window rows in the padding, a branch per window row (3 of 5 rows of a
        # 5x5 window on a 3-row plane read data): its sums start at zero
        guard = nrows == 1 and self.kh > 1 and (self.pt > 0 or self.pb > 0)
        zero = ir.Constant(self.vty, [0.0] * self.vl)
        accs = [[[zero if guard else None] * split for _ in chunks] for _ in range(nrows)]
        row = None   # the current input row, set at d == 0 and stepped down after
        for d in range((nrows - 1) * self.sh + self.kh):
            users = [(r, d - r * self.sh) for r in range(nrows) if 0 <= d - r * self.sh < self.kh]
            # each row from the one above it (one add; computing each from the block's top
            # row took a multiply per row, redone in the chunk loop for want of registers)
            row = b.gep(region, [b.mul(top, self.row_stride)], inbounds=True) \
                if d == 0 else b.gep(row, [self.row_stride], inbounds=True)
            if not users:   # (a vertical stride wider than the window)
                continue
            if not guard:
                self._emit_taps(row, ox0s, users, accs, split)
                continue
            iy = b.add(top, const_i64(d))   # the padded row: data from pt to pt + H
            inside = b.icmp_signed("<", iy, b.add(self.H, const_i64(self.pt)))
            if d < self.pt:
                inside = b.and_(inside, b.icmp_signed(">=", iy, const_i64(self.pt)))
            g = d % split
            before, pre = [accs[0][c][g] for c in range(len(chunks))], b.block
            with b.if_then(inside):
                self._emit_taps(row, ox0s, users, accs, split)
                then = b.block
            for c, old in enumerate(before):
                phi = b.phi(self.vty)
                phi.add_incoming(accs[0][c][g], then)
                phi.add_incoming(old, pre)
                accs[0][c][g] = phi
        for c, ((_, tail), ox0) in enumerate(zip(chunks, ox0s)):
            mask = None if tail is None else self._lane_mask(tail, 0)
            for r in range(nrows):
                oy = b.add(oy0, const_i64(r)) if r else oy0
                parts = [a for a in accs[r][c] if a is not None]
                while len(parts) > 1:   # pairwise: (p0 + p1) + (p2 + p3), ...
                    parts = [b.fadd(parts[i], parts[i + 1]) if i + 1 < len(parts)
                             else parts[i] for i in range(0, len(parts), 2)]
                self._emit_epilogue(parts[0], oy, ox0, mask, tail)

    def _emit_taps(self, row, ox0s: list, users: list, accs: list, split: int) -> None:
        """The window row of padded row ``row`` for the ``users`` ((output row r, window row
        ky)) of chunks at ``ox0s``: each input vector loaded once, multiply-added into
        ``accs[r][c][ky % split]`` (None: not started)."""
        b = self.builder
        if self.sw == 2:
            phases = [row, b.gep(row, [self.phase], inbounds=True)]
        for kx in range(self.kw):
            if self.sw == 1:
                base, shift = row, kx
            else:
                base, shift = phases[kx % 2], kx // 2
            vs = [b.load(self._vec_ptr(base, b.add(ox0, const_i64(shift))), align=4)
                  for ox0 in ox0s]
            for r, ky in users:
                wv = self.weights[ky][kx]
                for c, v in enumerate(vs):
                    acc = accs[r][c][ky % split]
                    accs[r][c][ky % split] = b.fmul(wv, v) if acc is None \
                        else self._fma(wv, v, acc)

    def _emit_epilogue(self, acc: ir.Value, oy, ox0, mask: ir.Value | None,
                       tail: ir.Value | None = None) -> None:
        """The fused epilogue on the vl outputs of row ``oy`` from column ``ox0`` (``mask``:
        the lanes inside the row, their number ``tail``; None: all): the static kernel's
        (``depthwise.emit_epilogue``), a partial chunk stored masked."""
        emit_epilogue(self, acc, oy, ox0, mask, self.OW, memo=dict(self.plane_memo))


def emit_symbolic_depthwise(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                            size_vars: tuple[str, ...], match: Contraction | None = None,
                            options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """The kernel for a depthwise convolution (``depthwise.is_depthwise``, float32, static
    channels and window) whose batch or image size is a run-time value; None for anything
    else."""
    match = match_contraction(func) if match is None else match
    if not is_depthwise(match):
        return None
    x_t, w_t = match.tag.operands
    if x_t.dtype != "float32" or w_t.dtype != "float32" or match.out.dtype != "float32" \
            or not all(isinstance(d, int) for d in w_t.shape) \
            or not isinstance(x_t.shape[1], int) or len(match.out.axes) != 4:
        return None
    return SymbolicDepthwiseEmitter(module, func, symbol, match, vl, size_vars, options).emit()
