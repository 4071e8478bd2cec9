"""The packed 1x1 convolution (``conv_packed.py``) when its pixel count is known at run time
only (open image sizes, ``conv_symbolic.py``; ``geometry.packs_open_1x1``): a GEMM ``out[oc,
p] = sum_k w[oc, k] * x[k, p]`` whose input each task first copies, for the panels it runs,
into ``[panel][K][nr]`` in the image's workspace region (the last panel's columns past the
pixel count are zeros: masked loads), then runs its block rows in chunks whose weights stay in
L2 (``PACK_A_BYTES``), every panel of the task per chunk. The microkernel reads one contiguous
packed panel and one block of the weights packed in row blocks (``conv2d_rows``), as the static
kernel's; the last panel's outputs past the pixel count are computed on the zeros and not
stored (the epilogue's lanes masked).

Tasks split the (panel, chunk) work items, panel-major, so that each task copies only its own
panels (tasks that share the boundary panel copy the same values into it: no barrier). The
panel count, the split and the masks are computed at the kernel's entry from the sizes."""

from __future__ import annotations

from llvmlite import ir

from ..helpers import F32, alloca_once, const_i64, for_range
from .geometry import PACK_A_BYTES

# (panel, chunk) work items per task at least, where the panels allow (``_runtime_chunks``).
ITEMS_PER_TASK = 4


class SymbolicPackedMixin:
    """The packed 1x1 part of ``conv_symbolic.SymbolicConvEmitter`` (its plan ``self.g``)."""

    def _packed_chunks(self) -> tuple[int, int]:
        """(block rows per chunk, chunks): a chunk's weights fit in PACK_A_BYTES."""
        g = self.g
        mblocks = -(-g["og"] // g["mr"])
        mcb = max(1, min(mblocks, PACK_A_BYTES // (4 * g["mr"] * g["cg"])))
        return mcb, -(-mblocks // mcb)

    def packed_choice(self) -> str:
        """The design, in words (``KernelInfo.choice``, shown by ``mlcpack inspect``): the
        same text from every variant of a bundle (the header keeps one per kernel)."""
        g = self.g
        return (f"register-blocked conv: {g['mr']} channels x {g['nv']} vectors register "
                f"tile, input packed in panels (8 lanes; read in place at 4), block rows in "
                f"chunks of {self._packed_chunks()[0]} (weights in L2), panels planned at "
                "run time")

    def _emit_packed_sym(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        b, g = self.builder, self.g
        x_t = self.match.tag.operands[0]
        x_ptr = self.buffers[x_t.uid]
        nr = g["nv"] * self.vl
        _, nch = self._packed_chunks()
        OW = self._dim_value(g["ow"])
        P = b.mul(self._dim_value(g["oh"]), OW)   # stride 1, unpadded: the input's pixels too
        N = self._dim_value(x_t.shape[0])
        region = self._dim_value(g["region"])
        base = b.bitcast(ws, F32.as_pointer())
        panels = b.sdiv(b.add(P, const_i64(nr - 1)), const_i64(nr))
        macs = b.mul(b.mul(N, P), const_i64(g["og"] * g["cg"]))
        nt = self._tasks_used(macs, ntasks)
        with b.if_then(b.icmp_signed("<", task, nt)):
            mcb, nch = self._runtime_chunks(nch, panels, nt)
            lo, hi = self._split_v(b.mul(panels, nch), task, nt)
            j_lo = b.sdiv(lo, nch)
            j_hi = b.sdiv(b.add(hi, b.sub(nch, const_i64(1))), nch)
            with for_range(b, const_i64(0), N, "n") as n:
                x_img = b.gep(x_ptr, [b.mul(n, b.mul(P, const_i64(g["c"])))], inbounds=True)
                packed = b.gep(base, [b.mul(n, region)], inbounds=True)
                self._pack_panels_sym(x_img, packed, j_lo, j_hi, P)
                with for_range(b, const_i64(0), nch, "mc") as c:
                    self._packed_chunk_sym(n, c, lo, hi, packed, panels, P, OW, mcb, nch)

    def _runtime_chunks(self, nch: int, panels: ir.Value, nt: ir.Value
                        ) -> tuple[ir.Value, ir.Value]:
        """(block rows per chunk, chunks) at run time: the static plan's chunks, or more of
        them (each fewer block rows) where the image has too few panels for ``nt`` tasks to
        get ITEMS_PER_TASK (panel, chunk) items each (a 256 -> 256 on 10 x 10 has 5 panels:
        3 and 2 on two threads, one chunk a panel)."""
        b = self.builder
        mblocks = -(-self.g["og"] // self.g["mr"])
        want = b.sdiv(b.add(b.mul(nt, const_i64(ITEMS_PER_TASK)), b.sub(panels, const_i64(1))),
                      b.select(b.icmp_signed(">", panels, const_i64(0)), panels, const_i64(1)))
        want = b.select(b.icmp_signed("<", want, const_i64(mblocks)), want, const_i64(mblocks))
        chunks = b.select(b.icmp_signed(">", want, const_i64(nch)), want, const_i64(nch))
        mcb = b.sdiv(b.add(const_i64(mblocks - 1), chunks), chunks)
        return mcb, b.sdiv(b.add(const_i64(mblocks - 1), mcb), mcb)

    def _pack_panels_sym(self, x_img, packed, j_lo, j_hi, P) -> None:
        """packed[jp][k][i] = x[k, p] for p = jp * nr + i < P (zero past it), panels [j_lo,
        j_hi): vector copies of the input rows' runs, masked in the last, partial panel."""
        b, g = self.builder, self.g
        cg, nv, vl = g["cg"], g["nv"], self.vl
        nr = nv * vl
        with for_range(b, j_lo, j_hi, "pj") as jp:
            p0 = b.mul(jp, const_i64(nr))
            dst = b.gep(packed, [b.mul(jp, const_i64(cg * nr))], inbounds=True)
            left = b.sub(P, p0)
            with b.if_else(b.icmp_signed(">=", left, const_i64(nr))) as (whole, part):
                for block, masked in ((whole, False), (part, True)):
                    with block:
                        masks = [self._lane_mask(left, v) for v in range(nv)] if masked else None
                        with for_range(b, const_i64(0), const_i64(cg), "pk") as k:
                            src = b.add(b.mul(k, P), p0)
                            for v in range(nv):
                                ptr = self._vec_ptr(x_img, b.add(src, const_i64(v * vl)))
                                val = (self._masked_load(ptr, masks[v]) if masked
                                       else b.load(ptr, align=4))
                                out = b.add(b.mul(k, const_i64(nr)), const_i64(v * vl))
                                b.store(val, self._vec_ptr(dst, out), align=4)

    def _packed_chunk_sym(self, n, c, lo, hi, packed, panels, P, OW, mcb, nch) -> None:
        """Chunk ``c`` (of ``nch``, ``mcb`` block rows each) of block rows over the task's
        panels (items ``jp * nch + c`` in [lo, hi)), each block's reduction then its epilogue
        (masked in the last panel)."""
        b, g = self.builder, self.g
        mr, nv, og, cg = g["mr"], g["nv"], g["og"], g["cg"]
        nr = nv * self.vl
        mblocks = -(-og // mr)

        def bound(v: ir.Value) -> ir.Value:   # ceil((v - c) / nch), clamped to [0, panels]
            q = b.sdiv(b.add(b.sub(v, c), b.sub(nch, const_i64(1))), nch)
            q = b.select(b.icmp_signed(">", q, const_i64(0)), q, const_i64(0))
            return b.select(b.icmp_signed("<", q, panels), q, panels)

        jl, jh = bound(lo), bound(hi)
        mb_lo = b.mul(c, mcb)
        mb_hi = b.add(mb_lo, mcb)
        mb_hi = b.select(b.icmp_signed("<", mb_hi, const_i64(mblocks)), mb_hi,
                         const_i64(mblocks))
        with for_range(b, jl, jh, "jp") as jp:
            p0 = b.mul(jp, const_i64(nr))
            panel = b.gep(packed, [b.mul(jp, const_i64(cg * nr))], inbounds=True)
            remaining = b.sub(P, p0)

            def b_vector(k, u, v):
                off = b.add(b.mul(k, const_i64(nr)), const_i64(v * self.vl))
                return b.load(self._vec_ptr(panel, off), align=4)

            with for_range(b, mb_lo, mb_hi, "mb") as mb:
                oc0 = b.mul(mb, const_i64(mr))
                a_scalar = self._conv_weight(oc0, oc0, og, 1)
                with b.if_else(b.icmp_signed(">=", remaining, const_i64(nr))) as (full, part):
                    with full:
                        tile = self._microkernel(mr, nv, cg, a_scalar, b_vector, [0])
                        self._epilogue(n, oc0, oc0, p0, remaining, tile, OW, None, False)
                    with part:
                        tile = self._partial_tile(remaining, a_scalar, b_vector)
                        self._masked_epilogue(n, oc0, oc0, p0, remaining, tile, OW)

    def _masked_epilogue(self, n, oc0, local0, p0, remaining, tile, OW) -> None:
        """The epilogue of the last, partial panel (``remaining`` < nr pixels): one copy of
        it in a loop over the tile's rows and the vectors that hold pixels (each masked to its
        pixels), where the full panels' epilogue is unrolled (mr x nv copies, the tile in
        registers). It runs once per block row, a small part of the panel's time: the copies
        cost only compile time (a SiLU: ~60 instructions each, 12 of them on a 4 x 3 tile).
        (The same loop in the SSE variant's in-place kernel, ``_products``, made YOLOv8n's
        SiLU 1x1s 1.10-1.16x slower there: not used.)"""
        b, g = self.builder, self.g
        if not (self._vector_epilogue_ok() and self._rows_contiguous()):
            masks = [self._lane_mask(remaining, v) for v in range(g["nv"])]
            self._epilogue(n, oc0, local0, p0, remaining, tile, OW, masks, True)
            return
        out = self.match.out
        mr, og, vl = g["mr"], g["og"], self.vl
        nr = g["nv"] * vl
        rows = b.sub(const_i64(og), local0)
        rows = b.select(b.icmp_signed("<", rows, const_i64(mr)), rows, const_i64(mr))
        nvec = b.sdiv(b.add(remaining, const_i64(vl - 1)), const_i64(vl))
        flat = self._flat_positions_ok()
        env = {id(out.axes[0]): n}
        with for_range(b, const_i64(0), rows, "ti") as i:
            env[id(out.axes[1])] = b.add(oc0, i)
            with for_range(b, const_i64(0), nvec, "tv") as v:
                col = b.mul(v, const_i64(vl))
                p = b.add(p0, col)
                if flat:   # (row 0, column p) is position p: no division by the run-time OW
                    env[id(out.axes[2])], env[id(out.axes[3])] = const_i64(0), p
                else:
                    env[id(out.axes[2])] = b.sdiv(p, OW)
                    env[id(out.axes[3])] = b.srem(p, OW)
                t_idx = b.add(b.mul(i, const_i64(nr)), col)
                self._store_vector(env, tile, t_idx, self._lane_mask(b.sub(remaining, col), 0))

    def _partial_tile(self, remaining, a_scalar, b_vector) -> ir.Value:
        """The last, partial panel's tile (mr x nv vectors, the epilogue's layout): only the
        vectors that hold pixels are computed (``remaining`` <= vl: one vector, <= 2 vl: two;
        the others zero, their lanes not stored). A 10 x 10 image's last panel holds 4
        pixels: one vector of 8 columns instead of 24. One vector per row gives mr FMA
        chains, fewer than the FMA units' latency hides: two sets of accumulators (even and
        odd k), added at the end."""
        b, g = self.builder, self.g
        mr, nv, cg, vl = g["mr"], g["nv"], g["cg"], self.vl
        tile = alloca_once(b, ir.ArrayType(F32, (mr * nv + 1) * vl), name="ptile")
        tile_f = b.bitcast(tile, F32.as_pointer())
        if nv == 1:
            small = self._microkernel(mr, nv, cg, a_scalar, b_vector, [0])
            for q in range(mr):
                off = const_i64(q * vl)
                b.store(b.load(self._vec_ptr(small, off), align=4),
                        self._vec_ptr(tile_f, off), align=4)
            return tile_f
        zero = ir.Constant(self.vty, [0.0] * vl)
        cases = [(1, b.icmp_signed("<=", remaining, const_i64(vl)))]
        if nv > 2:
            cases.append((2, b.icmp_signed("<=", remaining, const_i64(2 * vl))))
        cases.append((nv, None))

        def fill(nt: int) -> None:
            if nt == 1:
                small = self._two_chain_vector(mr, cg, a_scalar, b_vector)
            else:
                small = self._microkernel(mr, nt, cg, a_scalar, b_vector, [0])
            for i in range(mr):
                for v in range(nv):
                    val = (b.load(self._vec_ptr(small, const_i64((i * nt + v) * vl)), align=4)
                           if v < nt else zero)
                    b.store(val, self._vec_ptr(tile_f, const_i64((i * nv + v) * vl)), align=4)

        def chain(k: int) -> None:
            nt, cond = cases[k]
            if cond is None:
                fill(nt)
                return
            with b.if_else(cond) as (yes, no):
                with yes:
                    fill(nt)
                with no:
                    chain(k + 1)

        chain(0)
        self._begin_epilogue()   # the epilogue's opaque zero, where every branch has joined
        return tile_f

    def _two_chain_vector(self, mr, cg, a_scalar, b_vector) -> ir.Value:
        """mr x 1 vector tile over cg steps, even and odd steps in separate accumulators."""
        b, vl = self.builder, self.vl
        zero = ir.Constant(self.vty, [0.0] * vl)
        accs = [[alloca_once(b, self.vty, name=f"nacc{s}_{i}") for i in range(mr)]
                for s in range(2)]
        for row in accs:
            for a in row:
                b.store(zero, a)

        def step(k, s) -> None:
            x = b_vector(k, 0, 0)
            for i in range(mr):
                acc = accs[s][i]
                b.store(self._fma(self._splat(a_scalar(k, 0, i)), x, b.load(acc)), acc)

        with for_range(b, const_i64(0), const_i64(cg // 2), "k2") as k2:
            k = b.mul(k2, const_i64(2))
            step(k, 0)
            step(b.add(k, const_i64(1)), 1)
        if cg % 2:
            step(const_i64(cg - 1), 0)
        small = alloca_once(b, ir.ArrayType(F32, (mr + 1) * vl), name="ntile")
        small_f = b.bitcast(small, F32.as_pointer())
        for i in range(mr):
            b.store(b.fadd(b.load(accs[0][i]), b.load(accs[1][i])),
                    self._vec_ptr(small_f, const_i64(i * vl)), align=4)
        return small_f
