"""The register-blocked matmul: ``out[m, n] = sum_k a[m, k] * b[k, n]``: rows m are broadcast
from ``a``, the wide operand is a row of ``b`` (masked loads on the last, partial panel), or of
a panel of a constant ``b`` packed at export (``matmul_packed``, ops/layout.py: [ceil(N / 16), K,
16], the last panel zero-filled: plain loads throughout, no copy at run time). M, N, K and the
batch dims may be run-time sizes (symbolic matmuls).

Only the last, partial panel uses masked loads in the reduction loop: masked loads there cost
~25 % of the kernel's speed on Zen 4. At 16 lanes (x86-64-v4) the last panel computes only the
vectors it needs, a matmul of few panels splits its rows over threads too, and weights past L2
are prefetched a panel ahead (``_wide_fp32`` and the methods it gates)."""

from __future__ import annotations

from llvmlite import ir

from ...ir import te
from ..helpers import F32, I32, const_i64, for_range, intrinsic
from ..lower import WORKSPACE_ALIGN
from .geometry import (MAX_TASK_REGIONS, PACK_B_MAX_BYTES, PACK_B_MIN_ROWS, PACK_B_PREFETCH_ROWS,
                       PREFETCH_B_MIN_BYTES,
                       SYMBOLIC_M_HINT, SYMBOLIC_N_HINT, WIDEST_VECTOR, _pick_tile,
                       SPLIT_MIN_ITEMS, few_rows_tile, wide_matmul_tile)
from .match import CONV_KINDS


class MatmulMixin:
    """The matmul part of ``kernel.ContractionEmitter``."""

    def _matmul_shape(self) -> tuple[int, int, int, int]:
        out = self.match.out
        a = self.match.tag.operands[0]
        batch = 1
        for n in out.shape[:-2]:
            batch *= n
        return batch, out.shape[-2], a.shape[-1], out.shape[-1]

    def _workspace_bytes(self) -> int:
        if self.match.tag.kind not in CONV_KINDS:
            if self.symbolic or not self._packs_b():
                return 0
            return -(-self._packed_panel_bytes() * MAX_TASK_REGIONS // WORKSPACE_ALIGN) \
                * WORKSPACE_ALIGN
        g = self._conv_geometry()
        if g.get("packed"):   # each image's packed panels and tail inputs (conv_packed.py)
            batch = self.match.tag.operands[0].shape[0]
            nbytes = (g["pack_floats"] + len(g["tail"]) * g["tail_kp"]) * 4 * batch
            return -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        nbytes = 0 if g["direct"] else (g["planes_floats"] + g["slack_total"]) * 4
        if not g["per_group"]:
            # Tasks share the planes of one image and run without a barrier, so a task that
            # moves on to the next image must not overwrite planes another task still reads:
            # every image of the batch has planes of its own (and tail inputs, after them).
            batch = self.match.tag.operands[0].shape[0]
            nbytes = (nbytes + len(g["tail"]) * g["tail_kp"] * 4) * batch
            nbytes += g["part_floats"] * MAX_TASK_REGIONS * 4   # reduction chunks' partial sums
        return -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN

    def _batch_offset(self, t: te.Tensor, bidx: list[ir.Value]) -> ir.Value:
        """Element offset of matrix number ``bidx`` (out's batch indices) in operand ``t``,
        broadcasting its size-1 batch dimensions."""
        b = self.builder
        out = self.match.out
        nb_out, nb = len(out.shape) - 2, len(t.shape) - 2
        offset: ir.Value = const_i64(0)
        stride = t.shape[-1] * t.shape[-2]
        for d in range(nb - 1, -1, -1):
            if t.shape[d] != 1:
                offset = b.add(offset, b.mul(bidx[nb_out - nb + d], self._dim_value(stride)))
            stride *= t.shape[d]
        return offset

    def _matmul_tile(self) -> tuple[int, int]:
        """(rows, vectors per row) of the register block."""
        _, M, K, N = self._matmul_shape()
        if not isinstance(M, int):   # a run-time M: the large-M tile, a 1-row remainder path
            n_hint = N if isinstance(N, int) else SYMBOLIC_N_HINT
            if self._wide_fp32():
                return wide_matmul_tile(SYMBOLIC_M_HINT, n_hint)
            return _pick_tile(SYMBOLIC_M_HINT, n_hint, self.vl)
        if M >= 4:
            if self._wide_fp32():
                return wide_matmul_tile(M, N)
            return _pick_tile(M, N, self.vl)
        # a run-time N (attention scores over a cache that grows): as wide as a large N
        return few_rows_tile(M, N if isinstance(N, int) else SYMBOLIC_N_HINT, self.vl,
                             self._splits_by_weights())

    def _wide_fp32(self) -> bool:
        """A float32 matmul on 16-lane vectors (x86-64-v4): its own tile table and a last,
        partial panel of only the vectors it needs (geometry.wide_matmul_tile); the bf16 pair
        kernels and the narrower targets keep theirs."""
        return self.vl == WIDEST_VECTOR and self.match.tag.kind in ("matmul", "matmul_packed")

    def _last_panel_vectors(self, N, nv: int) -> int:
        """Vectors of the last, partial panel's tile: at 16 lanes (``_wide_fp32``) with a
        static N, only those that hold its columns; else the whole tile's ``nv``."""
        if not (self._wide_fp32() and isinstance(N, int)):
            return nv
        rest = N % (nv * self.vl)
        return -(-rest // self.vl) if rest else nv

    def _splits_by_weights(self) -> bool:
        """A static matmul of fewer than 4 rows that splits over threads for the bytes of its
        second operand (the weights it streams once per call, codegen/threads.py
        PARALLEL_MIN_WEIGHT_BYTES), not for its multiply-adds: its column panels, or the
        matrices of its batch, are the work items, at least two on every target (the
        kernel's parallel flag is one for all of a bundle's targets)."""
        if self.symbolic:
            return False
        batch, M, _, N = self._matmul_shape()
        return (M < 4 and self._macs() < self.options.parallel_min_macs
                and (batch > 1 or N > WIDEST_VECTOR) and self._weight_bytes_split(2))

    def _emit_matmul_symbolic(self, task: ir.Value, ntasks: ir.Value) -> None:
        """A matmul with a run-time M: fewer rows than the register tile (a batch of one, a
        short sequence) take a tile of exactly that many rows, wider as the static path picks
        it for such an M; more take the full tile and a remainder block."""
        b = self.builder
        _, M_dim, _, N = self._matmul_shape()
        mr, nv = self._matmul_tile()
        M = self._dim_value(M_dim)
        with b.if_else(b.icmp_signed("<", M, const_i64(mr))) as (small, big):
            with small:
                for r in range(1, mr):
                    n_hint = N if isinstance(N, int) else SYMBOLIC_N_HINT
                    nv_r = max(1, min(8 // r, -(-n_hint // self.vl))) if r < 4 else nv
                    with b.if_then(b.icmp_signed("==", M, const_i64(r))):
                        self._matmul_panels(task, ntasks, r, nv_r, exact=True)
            with big:
                self._matmul_panels(task, ntasks, mr, nv, exact=False)

    def _matmul_panels(self, task: ir.Value, ntasks: ir.Value, mr: int, nv: int,
                       exact: bool) -> None:
        """The panel loop of ``_emit_matmul`` for a symbolic matmul with an (mr, nv) tile;
        ``exact``: M is mr."""
        b = self.builder
        batch, _, K_dim, N = self._matmul_shape()
        K = self._dim_value(K_dim)
        nr = nv * self.vl
        panels_dim = -(-N // nr)   # N may be a run-time size
        panels = self._dim_value(panels_dim)
        lo, hi = self._split(batch * panels_dim, task, ntasks)
        with for_range(b, lo, hi, "work") as work:
            bidx, a_base, b_base, n0, remaining, masks = self._panel_work(work, panels, N, nv)

            def panel(masked: bool) -> None:
                nv_p = self._last_panel_vectors(N, nv) if masked else nv
                if exact:
                    self._matmul_rows(const_i64(0), mr, nv_p, K, a_base, b_base, bidx, n0,
                                      remaining, masks[:nv_p], masked)
                else:
                    self._matmul_panel_symbolic(a_base, b_base, bidx, n0, remaining,
                                                masks[:nv_p], masked, nv=nv_p)
            if isinstance(N, int) and N % nr == 0:
                panel(False)
            else:
                with b.if_else(b.icmp_signed(">=", remaining, const_i64(nr))) as (full, part):
                    with full:
                        panel(False)
                    with part:
                        panel(True)

    def _panel_work(self, work: ir.Value, panels: ir.Value, N: object, nv: int) -> tuple:
        """Where work item ``work`` (batch-major over ``panels`` panels of nv vectors a row)
        starts: the output's batch indices (outermost first), A's and B's bases for them, the
        panel's first column n0, the columns left from n0 (of ``N``, an int or a size) and
        their lane masks."""
        b = self.builder
        out = self.match.out
        a_t, b_t = self.match.tag.operands
        a_ptr, b_ptr = self.buffers[a_t.uid], self.buffers[b_t.uid]
        bi = b.sdiv(work, panels)
        jp = b.srem(work, panels)
        bidx, rest = [], bi
        for n in reversed(out.shape[:-2]):
            bidx.append(b.srem(rest, self._dim_value(n)))
            rest = b.sdiv(rest, self._dim_value(n))
        bidx.reverse()
        a_base = b.gep(a_ptr, [self._batch_offset(a_t, bidx)], inbounds=True)
        b_base = b_ptr if self._const_panels else \
            b.gep(b_ptr, [self._batch_offset(b_t, bidx)], inbounds=True)
        n0 = b.mul(jp, const_i64(nv * self.vl))
        remaining = b.sub(self._dim_value(N), n0)
        masks = [self._lane_mask(remaining, v) for v in range(nv)]
        return bidx, a_base, b_base, n0, remaining, masks

    def _emit_matmul(self, task: ir.Value, ntasks: ir.Value, ws: ir.Value | None = None) -> None:
        if self.symbolic:
            self._emit_matmul_symbolic(task, ntasks)
            return
        b = self.builder
        if ws is not None:   # packed B panels: one workspace region per task, as many tasks
            ntasks = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                              const_i64(MAX_TASK_REGIONS))
            region_floats = self._packed_panel_bytes() // 4
            self._pack_region = b.gep(b.bitcast(ws, F32.as_pointer()),
                                      [b.mul(task, const_i64(region_floats))], inbounds=True)
            with b.if_then(b.icmp_signed("<", task, ntasks)):
                self._emit_matmul_tasks(task, ntasks)
            return
        self._emit_matmul_tasks(task, ntasks)

    def _emit_matmul_tasks(self, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        batch, M, K, N = self._matmul_shape()
        mr, nv = self._matmul_tile()
        nr = nv * self.vl
        panels = -(-N // nr)
        chunks = self._row_chunks()
        lo, hi = self._split(batch * panels * chunks, task, ntasks)
        with for_range(b, lo, hi, "work") as work:
            if chunks > 1:   # work item: (panel, chunk of its row blocks)
                self._row_chunk = (b.srem(work, const_i64(chunks)), chunks)
                work = b.sdiv(work, const_i64(chunks))
            bidx, a_base, b_base, n0, remaining, masks = self._panel_work(
                work, const_i64(panels), N, nv)
            if N % nr == 0:
                self._matmul_full_panel(b_base, n0, a_base, bidx, remaining, masks)
            else:  # plain loads on full panels, masked ones on the last, partial panel
                with b.if_else(b.icmp_signed(">=", remaining, const_i64(nr))) as (full, part):
                    with full:
                        self._matmul_full_panel(b_base, n0, a_base, bidx, remaining, masks)
                    with part:
                        self._matmul_panel(a_base, b_base, bidx, n0, remaining, masks, True,
                                           nv=self._last_panel_vectors(N, nv))

    def _row_chunks(self) -> int:
        """Chunks of row blocks each panel's rows are split into, as separate work items: at
        16 lanes (``_wide_fp32``), a static matmul that splits over threads but has fewer than
        SPLIT_MIN_ITEMS panels (Magika's [2048, 257] x [257, 64]: one panel of 64 columns,
        which a second thread could not share) gets enough chunks for SPLIT_MIN_ITEMS items,
        at most one a row block; 1 elsewhere."""
        if not self._wide_fp32() or self.symbolic:
            return 1
        batch, M, _, N = self._matmul_shape()
        mr, nv = self._matmul_tile()
        items = batch * -(-N // (nv * self.vl))
        blocks = M // mr
        if items >= SPLIT_MIN_ITEMS or blocks < 2 or not self._parallel():
            return 1
        return min(blocks, -(-SPLIT_MIN_ITEMS // items))

    def _packs_b(self) -> bool:
        """Copy each full panel of B (K rows x nr columns, row stride N) into a contiguous
        buffer as its first row block reads it (the task's region of the kernel's workspace,
        one of MAX_TASK_REGIONS: not the stack, whose size a worker thread may not have to
        spare, e.g. musl's 128 KB): a strided panel hits few L1 sets (a 1-4 KB row
        stride maps its K lines onto 4-16 sets) and a new page every k step or few, so every
        row block streams it from L2 through the TLB; packed it stays in L1 (K <= 512) or
        streams sequentially. Worth it when the panel is reused by enough row blocks (M >=
        PACK_B_MIN_ROWS), B has more than one panel, and the buffer fits PACK_B_MAX_BYTES."""
        if self._const_panels:   # packed at export already
            return False
        _, M, K, N = self._matmul_shape()
        mr, nv = self._matmul_tile()
        nr = nv * self.vl
        return (M >= PACK_B_MIN_ROWS and N > nr and K * nr * 4 <= PACK_B_MAX_BYTES
                and mr >= 4)

    def _packed_panel_bytes(self) -> int:
        _, _, K, _ = self._matmul_shape()
        _, nv = self._matmul_tile()
        return -(-K * nv * self.vl * 4 // WORKSPACE_ALIGN) * WORKSPACE_ALIGN

    def _const_panel_vector(self, b_base, n0, nv: int):
        """With B packed at export (``matmul_packed``: panels [ceil(N / nrp), K, nrp], the last
        zero-filled past N), ``load(k, v)``: the vector of row k at columns n0 + v * vl, a plain
        load (nrp a multiple of vl, so a vector never straddles two panels; a vector wholly
        past the last panel, of a tile wider than what is left of N, reads panel 0 instead:
        computed, never stored). None for a B read as [K, N]."""
        if not self._const_panels:
            return None
        b = self.builder
        _, _, K, N = self._matmul_shape()
        nrp = int(self.match.tag.attrs["nr"])
        assert nrp % self.vl == 0, (nrp, self.vl)
        bases = self._const_panel_offsets(n0, nv)

        def load(k, v):
            return self._weight_vector(b_base, b.add(bases[v], b.mul(k, const_i64(nrp))),
                                       self.vl)
        return load

    def _const_panel_offsets(self, n0, nv: int) -> list:
        """Element offsets in the packed B (``_const_panel_vector``) of row 0 of the vectors
        at columns n0 + v * vl, v < nv; panel 0's for a vector wholly past the last panel."""
        b = self.builder
        _, _, K, N = self._matmul_shape()
        nrp = int(self.match.tag.attrs["nr"])
        padded = -(-N // nrp) * nrp
        bases = []
        for v in range(nv):
            col = b.add(n0, const_i64(v * self.vl))
            off = b.add(b.mul(b.sdiv(col, const_i64(nrp)), const_i64(K * nrp)),
                        b.srem(col, const_i64(nrp)))
            bases.append(b.select(b.icmp_signed("<", col, const_i64(padded)), off, const_i64(0)))
        return bases

    def _prefetches_next_panel(self) -> bool:
        """At 16 lanes (``_wide_fp32``), a static matmul whose float32 B, packed at export,
        has at least PREFETCH_B_MIN_BYTES (weights that come from L3 or memory, not from L2,
        on every call: MLP-Mixer's 1 MB layers, PP-OCR's 3.2 MB CTC head): the first row block
        of each panel prefetches the next panel's rows (into L1: measured better than L2 on
        both), one line per vector and k step, while the other row blocks of this panel run
        (none with row chunks, whose next work item is the same panel). Zen 5, 1 thread,
        kernel min in the model: the CTC head [40, 120] x [120, 6625] 312 -> 284 us, the
        Mixer's 1 MB layers 1-2 % faster."""
        if not (self._wide_fp32() and self._const_panels and not self.symbolic
                and not self._bf16_weights() and self._row_chunks() == 1):
            return False
        _, _, K, N = self._matmul_shape()
        return K * N * 4 >= PREFETCH_B_MIN_BYTES

    def _matmul_full_panel(self, b_base, n0, a_base, bidx, remaining, masks) -> None:
        """A panel of nr columns, all present: packed on the way if ``_packs_b`` (the first row
        block writes each vector of B it loads into the task's workspace region, row k at
        k * nr, and the other row blocks read that copy)."""
        if not self._packs_b() or self._pack_region is None:
            self._matmul_panel(a_base, b_base, bidx, n0, remaining, masks, False)
            return
        self._packed_b = self._pack_region   # this task's workspace region (_emit_matmul)
        try:
            self._matmul_panel(a_base, b_base, bidx, n0, remaining, masks, False)
        finally:
            self._packed_b = None

    def _matmul_panel(self, a_base, b_base, bidx, n0, remaining, masks, masked: bool,
                      nv: int | None = None) -> None:
        """All M rows of one panel: blocks of the tile's mr rows, then one block of the M % mr
        rows left, with a tile of exactly that many rows (none computed past M). With a packed
        panel (``_packed_b``) the first block fills it, the strided reads of B overlapping its
        multiply-adds: measured on bench/'s mlp_b64, [64, 784] x [784, 128] + bias + ReLU (Zen 4
        AVX2, 1 thread, profiler minimum), 131 us (98 GFLOP/s, this core's FMA peak) against
        145 us with a copy loop before the row blocks and 11 blocks of 6 rows."""
        if self.symbolic:
            self._matmul_panel_symbolic(a_base, b_base, bidx, n0, remaining, masks, masked,
                                        nv=nv)
            return
        b = self.builder
        _, M, _, _ = self._matmul_shape()
        mr, tile_nv = self._matmul_tile()
        nv = tile_nv if nv is None else nv   # the last, partial panel's may be narrower
        full, rest = divmod(M, mr)
        args = (nv, a_base, b_base, bidx, n0, remaining, masks[:nv], masked)
        if self._row_chunk is not None:
            self._matmul_chunk(mr, full, rest, args)
            return
        first = 0
        if self._packed_b is not None:   # _packs_b: M >= PACK_B_MIN_ROWS, at least one block
            assert full >= 1
            self._matmul_block(const_i64(0), mr, *args, fill=True)
            first = 1
        elif not masked and full >= 2 and self._prefetches_next_panel():
            self._matmul_block(const_i64(0), mr, *args, ahead=True)
            first = 1
        if full > first:
            with for_range(b, const_i64(first), const_i64(full), "mb") as mb:
                self._matmul_block(b.mul(mb, const_i64(mr)), mr, *args)
        if rest:
            self._matmul_block(const_i64(full * mr), rest, *args)

    def _matmul_chunk(self, mr: int, full: int, rest: int, args: tuple) -> None:
        """The row blocks of chunk ``_row_chunk`` of a panel (``_row_chunks``): whole blocks
        c * full / chunks .. (c + 1) * full / chunks (at least one), the first filling a
        packed panel as ``_matmul_panel``'s does; the last chunk also the M % mr rows left."""
        b = self.builder
        c, chunks = self._row_chunk
        b0 = b.sdiv(b.mul(c, const_i64(full)), const_i64(chunks))
        b1 = b.sdiv(b.mul(b.add(c, const_i64(1)), const_i64(full)), const_i64(chunks))
        if self._packed_b is not None:
            self._matmul_block(b.mul(b0, const_i64(mr)), mr, *args, fill=True)
            b0 = b.add(b0, const_i64(1))
        with for_range(b, b0, b1, "mb") as mb:
            self._matmul_block(b.mul(mb, const_i64(mr)), mr, *args)
        if rest:
            with b.if_then(b.icmp_signed("==", c, const_i64(chunks - 1))):
                self._matmul_block(const_i64(full * mr), rest, *args)

    def _prefetch(self, ptr: ir.Value) -> None:
        """Hint the cache line at ``ptr`` (a float pointer) into L1 for reading."""
        b = self.builder
        i8p = ir.IntType(8).as_pointer()
        fn = intrinsic(self.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, I32, I32, I32])
        b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3),
                    ir.Constant(I32, 1)])

    def _matmul_block(self, m0, rows: int, nv: int, a_base, b_base, bidx, n0, remaining, masks,
                      masked: bool, fill: bool = False, ahead: bool = False) -> None:
        """Rows m0 .. m0 + rows (all present) of one panel: the microkernel, then the epilogue.
        B's rows come from the packed panel ``_packed_b`` if set, else from B (row stride N);
        ``fill``: from B, each vector also stored into ``_packed_b``, and the line
        PACK_B_PREFETCH_ROWS rows ahead prefetched (a strided read the hardware prefetcher
        does not run ahead of: measured 1-2 % on the MLP above)."""
        b = self.builder
        _, M, K, N = self._matmul_shape()
        nr = nv * self.vl
        packed = self._packed_b
        line_floats = 64 // 4
        const_panel = self._const_panel_vector(b_base, n0, nv)
        # ``ahead`` (_prefetches_next_panel): the next panel's vectors, prefetched row by row
        nxt = self._const_panel_offsets(b.add(n0, const_i64(nr)), nv) if ahead else None

        def a_scalar(k, u, i):
            return b.load(b.gep(a_base, [b.add(b.mul(b.add(m0, const_i64(i)), const_i64(K)), k)],
                                inbounds=True))

        def b_vector(k, u, v):
            if const_panel is not None:
                if nxt is not None:
                    nrp = int(self.match.tag.attrs["nr"])
                    self._prefetch(b.gep(b_base, [b.add(nxt[v], b.mul(k, const_i64(nrp)))],
                                         inbounds=True))
                return const_panel(k, v)
            in_panel = b.add(b.mul(k, const_i64(nr)), const_i64(v * self.vl))
            if packed is not None and not fill:   # the panel, contiguous: row k at k * nr
                return b.load(self._vec_ptr(packed, in_panel), align=4)
            off = b.add(b.add(b.mul(k, const_i64(N)), n0), const_i64(v * self.vl))
            ptr = self._vec_ptr(b_base, off)
            if masked:
                return self._masked_load(ptr, masks[v])
            value = b.load(ptr, align=4)
            if fill:
                if (v * self.vl) % line_floats == 0:
                    ahead = b.add(k, const_i64(PACK_B_PREFETCH_ROWS))
                    ahead = b.select(b.icmp_signed("<", ahead, const_i64(K)), ahead,
                                     const_i64(K - 1))
                    self._prefetch(b.gep(b_base, [b.add(b.add(b.mul(ahead, const_i64(N)), n0),
                                                        const_i64(v * self.vl))],
                                         inbounds=True))
                b.store(value, self._vec_ptr(packed, in_panel), align=4)
            return value

        tile = self._microkernel(rows, nv, K, a_scalar, b_vector)
        self._store_matmul_tile(tile, bidx, m0, rows, nv, n0, remaining, masks, masked)

    def _matmul_panel_symbolic(self, a_base, b_base, bidx, n0, remaining, masks,
                               masked: bool, nv: int | None = None) -> None:
        """A panel of a matmul whose M (and K, batch dims) are known at run time: blocks of the
        register tile's rows while whole ones fit, then one block of the rows left (a
        microkernel for each possible count, 1 .. rows - 1)."""
        b = self.builder
        _, M_dim, K_dim, _ = self._matmul_shape()
        M, K = self._dim_value(M_dim), self._dim_value(K_dim)
        mr, tile_nv = self._matmul_tile()
        nv = tile_nv if nv is None else nv
        full = b.mul(b.sdiv(M, const_i64(mr)), const_i64(mr))
        with for_range(b, const_i64(0), b.sdiv(M, const_i64(mr)), "mb") as mb:
            self._matmul_rows(b.mul(mb, const_i64(mr)), mr, nv, K, a_base, b_base, bidx, n0,
                              remaining, masks, masked)
        # the last M % mr rows: one block of exactly that many (a branch per count)
        rest = b.sub(M, full)
        for r in range(1, mr):
            with b.if_then(b.icmp_signed("==", rest, const_i64(r))):
                self._matmul_rows(full, r, nv, K, a_base, b_base, bidx, n0, remaining, masks,
                                  masked)

    def _matmul_rows(self, m0, mr: int, nv: int, K, a_base, b_base, bidx, n0, remaining, masks,
                     masked: bool) -> None:
        """Rows m0 .. m0+mr (all present) of one panel: the microkernel, then the epilogue."""
        b = self.builder
        _, _, K_dim, N = self._matmul_shape()

        def a_scalar(k, u, i):
            return b.load(b.gep(a_base, [b.add(b.mul(b.add(m0, const_i64(i)), K), k)],
                                inbounds=True))

        const_panel = self._const_panel_vector(b_base, n0, nv)

        def b_vector(k, u, v):
            if const_panel is not None:
                return const_panel(k, v)
            ptr = self._vec_ptr(b_base, b.add(b.add(b.mul(k, self._dim_value(N)), n0),
                                              const_i64(v * self.vl)))
            return self._masked_load(ptr, masks[v]) if masked else b.load(ptr, align=4)

        tile = self._microkernel(mr, nv, K_dim, a_scalar, b_vector)
        self._store_matmul_tile(tile, bidx, m0, mr, nv, n0, remaining, masks, masked)

    def _store_matmul_tile(self, tile, bidx, m0, rows: int, nv: int, n0, remaining, masks,
                           masked: bool) -> None:
        """The fused epilogue of a matmul tile (rows m0 .. m0 + rows of the panel from column
        n0; ``remaining`` columns left from n0, ``masks`` their lanes when ``masked``): a vector
        at a time along the row where it is plain arithmetic, else element by element."""
        b = self.builder
        out = self.match.out
        nr = nv * self.vl
        env = {id(ax): idx for ax, idx in zip(out.axes[:-2], bidx)}
        cols = b.select(b.icmp_signed("<", remaining, const_i64(nr)), remaining, const_i64(nr))
        vector = self._vector_epilogue_ok()
        with for_range(b, const_i64(0), const_i64(rows), "ti") as i:
            env[id(out.axes[-2])] = b.add(m0, i)
            if not vector:
                with for_range(b, const_i64(0), cols, "tj") as j:
                    env[id(out.axes[-1])] = b.add(n0, j)
                    self._store_epilogue(env, tile, b.add(b.mul(i, const_i64(nr)), j))
            for v in range(nv if vector else 0):
                env[id(out.axes[-1])] = b.add(n0, const_i64(v * self.vl))
                self._store_tile_vector(env, tile, i, nr, v, masked, remaining, masks)
