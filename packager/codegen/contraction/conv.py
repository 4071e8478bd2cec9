"""The register-blocked conv2d: the input is first copied, zero-padded and split by stride phase
into *planes* in the workspace, so that for every tap (ic, ky, kx) the values needed by a run of
consecutive flattened outputs ``p = oy * Wq + ox`` (Wq >= the padded width / stride) are
contiguous: a convolution becomes a GEMM ``out[oc, p] = sum_k w[oc, k] * planes[off(k) + p]``
with no bounds checks. Columns with ox >= OW are computed and dropped. Alternatively the planes
are *shifted* copies, one per tap column kx, with rows exactly OW long: no dropped columns,
kw/sw times the copying; ``geometry.conv_geometry`` picks the layout and register tile (on
AVX-512 possibly with 256-bit vectors, whose finer granularity wastes fewer lanes on 7x7 or
14x14 images) that computes the fewest multiply-adds, copies counted.

With one group, a block's reduction may run over chunks of input channels, its partial sums
kept in a tile of the task's workspace region between chunks: each chunk runs over all the
block rows of a panel (or all the panels of a block row) while the planes they share stay in L1
(``conv_geometry``'s ``kc_outer`` / ``kc_inner``; ``_conv_chunked``).

A 1x1, stride-1, unpadded convolution on a large image reads its input in place; one with many
groups copies one group at a time into a workspace region of its own task. Depthwise
convolutions (one input channel per group) have a direct kernel of their own
(``codegen/depthwise/``), chosen before this one by the kernel rule table
(``codegen/rules.py``)."""

from __future__ import annotations

from llvmlite import ir

from ...ir import te
from ..helpers import F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .geometry import L2_REUSE_BYTES, MAX_TASK_REGIONS, TAIL_CHAINS, TAIL_PAIRS, conv_geometry

# Whether a 1x1 read in place, block rows innermost, with a partial last panel splits its
# items by output pixels (``_split_last_panel``).
LAST_PANEL_SPLIT = True

# Whether a panel's epilogue over a tile row's vectors (a contiguous run of outputs,
# ``_conv_epilogue``) that calls a math function is a loop over the vectors (its count opaque,
# so that LLVM does not unroll it back), one copy of the fused epilogue and one of its masked
# form, rather than both per vector: a SiLU is ~80 IR instructions a copy, and at 4 vectors a
# row the 8 copies were 60 % of a 1x1 SiLU kernel's emitted IR (yolo11n_seg_nms, x86-64-v4:
# 685 of 1,124 instructions). LLVM merged each vector's two copies itself, so the optimized
# module shrinks less (yolo11n's 29 kernels: 16,308 -> 15,506 instructions at v4): Python's
# emission and LLVM's optimizer each ~0.06-0.1 CPU-s less per level.
EPILOGUE_VECTOR_LOOP = True
# Whether a reduction in chunks (``_conv_chunked``) runs all its chunks in one loop, the last
# chunk's sweep ending in the epilogue at run time, rather than the last sweep as a second
# copy of the register tile's code (~970 IR instructions of a 3x3's at x86-64-v4).
CHUNK_LOOP = True


class ConvMixin:
    """The conv2d part of ``kernel.ContractionEmitter``."""

    def _conv_geometry(self) -> dict:
        if self._geom_cache is None:
            x = self.match.tag.operands[0]
            self._geom_cache = conv_geometry(x.shape, self._weight_shape(), self.match.out.shape,
                                           self.match.tag.attrs, self.target_vl)
        return self._geom_cache

    def _fill_planes(self, g: dict, x_img: ir.Value, planes: ir.Value,
                     nchan: int | None = None, rows: list | None = None) -> None:
        """planes[ic, py, px, u, v] = x[ic, u*sh + py - pt, v*sw + px - pl], 0 outside, for
        the first ``nchan`` channels of ``x_img`` (default all), then zero slack after them;
        py < ny row phases, px < nx column phases (or tap columns, shifted layout); only the
        plane rows u in the ``rows`` ranges ([(lo, hi), ...] of i64 values; default all).
        Each (ic, py, px) plane starts ``pstride`` floats after the previous one; the gap after
        its hq * wq values (see ALIAS_BYTES) is zeroed."""
        b = self.builder
        zero = ir.Constant(F32, 0.0)
        nchan = g["c"] if nchan is None else nchan
        sh, sw, hq, wq, w, pl = g["sh"], g["sw"], g["hq"], g["wq"], g["w"], g["pl"]
        ny, nx = g["ny"], g["nx"]
        pstride = g["pstride"]
        # columns v whose source x = v*sw + px - pl lies inside the row, per phase px; and the
        # columns where it does for every phase (copied by one interleaved loop that reads the
        # source row contiguously, which LLVM vectorizes: stride-phase gathers would not be)
        v_lo = [min(wq, max(0, -(-(pl - px) // sw))) for px in range(nx)]
        v_hi = [max(v_lo[px], min(wq, (w - 1 + pl - px) // sw + 1)) for px in range(nx)]
        c_lo = max(v_lo)
        c_hi = max(c_lo, min(v_hi))
        with for_range(b, const_i64(0), const_i64(nchan), "pc") as ic:
            if pstride > hq * wq:   # the gap after each plane: read by dropped columns only
                for ph in range(ny * nx):
                    self._zero_run(planes, b.mul(b.add(b.mul(ic, const_i64(ny * nx)),
                                                       const_i64(ph)), const_i64(pstride)),
                                   hq * wq, pstride)
            for py, (r_lo, r_hi) in ((py, r) for py in range(ny)
                                     for r in rows or [(const_i64(0), const_i64(hq))]):
                with for_range(b, r_lo, r_hi, "pu") as u:
                    yy = b.sub(b.add(b.mul(u, const_i64(sh)), const_i64(py)), const_i64(g["pt"]))
                    row_ok = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                                    b.icmp_signed("<", yy, const_i64(g["h"])))
                    dst_rows = [b.add(b.mul(b.add(b.mul(ic, const_i64(ny * nx)),
                                                  const_i64(py * nx + px)), const_i64(pstride)),
                                      b.mul(u, const_i64(wq))) for px in range(nx)]
                    with b.if_else(row_ok) as (inside, outside):
                        with inside:
                            src_row = b.add(b.mul(ic, const_i64(g["h"] * w)),
                                            b.mul(yy, const_i64(w)))

                            def copy(v, px, src_row=src_row, dst_rows=dst_rows):
                                xx = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                                val = b.load(b.gep(x_img, [b.add(src_row, xx)], inbounds=True))
                                b.store(val, b.gep(planes, [b.add(dst_rows[px], v)],
                                                   inbounds=True))

                            for px in range(nx):
                                self._zero_run(planes, dst_rows[px], 0, v_lo[px])
                                if c_lo > v_lo[px]:
                                    with for_range(b, const_i64(v_lo[px]), const_i64(c_lo),
                                                   "pv") as v:
                                        copy(v, px)
                            if c_hi > c_lo:
                                with for_range(b, const_i64(c_lo), const_i64(c_hi), "pv") as v:
                                    for px in range(nx):
                                        copy(v, px)
                            for px in range(nx):
                                if v_hi[px] > c_hi:
                                    with for_range(b, const_i64(c_hi), const_i64(v_hi[px]),
                                                   "pv") as v:
                                        copy(v, px)
                                self._zero_run(planes, dst_rows[px], v_hi[px], wq)
                        with outside:
                            for px in range(nx):
                                self._zero_run(planes, dst_rows[px], 0, wq)
        # the slack after the last plane is read only by dropped columns; keep it finite
        filled = nchan * ny * nx * pstride
        with for_range(b, const_i64(0), const_i64(g["slack"]), "ps") as s:
            b.store(zero, b.gep(planes, [b.add(const_i64(filled), s)], inbounds=True))

    def _task_rows(self, g: dict, task: ir.Value, ntasks: ir.Value, outer: bool
                   ) -> list | None:
        """The plane rows a task reads, when its work is a run of whole panels' columns (one
        group, block rows innermost): rows [u_lo, u_hi) of every channel's planes, and rows
        [0, ov) that reads past the last row spill into (they feed only dropped columns, but
        must be finite). None: all rows."""
        if g["groups"] != 1 or not outer:
            return None
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])
        hq, wq = g["hq"], g["wq"]
        lo, hi = self._split(mblocks * g["panels"], task, ntasks)
        busy = b.icmp_signed(">", hi, lo)
        p_lo = b.mul(b.sdiv(lo, const_i64(mblocks)), const_i64(g["nr"]))
        jp_end = b.add(b.sdiv(b.sub(hi, const_i64(1)), const_i64(mblocks)), const_i64(1))
        p_end = b.add(b.mul(jp_end, const_i64(g["nr"])), const_i64(g["shift_max"]))

        def clamp(v: ir.Value) -> ir.Value:
            v = b.select(b.icmp_signed("<", v, const_i64(hq)), v, const_i64(hq))
            v = b.select(b.icmp_signed(">", v, const_i64(0)), v, const_i64(0))
            return b.select(busy, v, const_i64(0))

        def rows_up_to(end: ir.Value) -> ir.Value:   # ceil(end / wq), clamped
            return clamp(b.sdiv(b.add(end, const_i64(wq - 1)), const_i64(wq)))

        u_lo = clamp(b.sdiv(p_lo, const_i64(wq)))
        u_hi = rows_up_to(p_end)
        ov = rows_up_to(b.sub(p_end, const_i64(hq * wq)))
        return [(u_lo, u_hi), (const_i64(0), ov)]

    def _zero_run(self, ptr: ir.Value, row: ir.Value, lo: int, hi: int) -> None:
        b = self.builder
        if hi > lo:
            with for_range(b, const_i64(lo), const_i64(hi), "pz") as v:
                b.store(ir.Constant(F32, 0.0), b.gep(ptr, [b.add(row, v)], inbounds=True))

    def _emit_conv(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        g = self._conv_geometry()
        if g.get("packed"):
            self._emit_conv_packed(g, ws, task, ntasks)
            return
        x_t = self.match.tag.operands[0]
        x_ptr = self.buffers[x_t.uid]
        planes = None if ws is None else b.bitcast(ws, F32.as_pointer())
        n_batch = x_t.shape[0]
        mblocks = -(-g["og"] // g["mr"])
        cg = g["cg"]
        if g["part_floats"]:
            self._part_base = b.gep(planes, [const_i64(n_batch * (
                g["planes_floats"] + g["slack_total"] + len(g["tail"]) * g["tail_kp"]))],
                inbounds=True)
        with for_range(b, const_i64(0), const_i64(n_batch), "n") as n:
            x_img = b.gep(x_ptr, [b.mul(n, const_i64(g["c"] * g["h"] * g["w"]))], inbounds=True)
            if g["per_group"]:
                nt = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                              const_i64(MAX_TASK_REGIONS))
                with b.if_then(b.icmp_signed("<", task, nt)):
                    region = b.gep(planes, [b.mul(task, const_i64(g["region"]))], inbounds=True)
                    glo, ghi = self._split(g["groups"], task, nt)
                    with for_range(b, glo, ghi, "grp") as grp:
                        x_grp = b.gep(x_img, [b.mul(grp, const_i64(cg * g["h"] * g["w"]))],
                                      inbounds=True)
                        self._fill_planes(g, x_grp, region, cg)
                        with for_range(b, const_i64(0), const_i64(mblocks * g["panels"]),
                                       "work") as work:
                            jp = b.srem(work, const_i64(g["panels"]))
                            mb = b.sdiv(work, const_i64(g["panels"]))
                            self._conv_block(g, n, grp, mb, jp, region, const_i64(0))
            else:
                if g["direct"]:
                    src = x_img
                elif g["panels"] == 0:   # every output is in the tail
                    src = None
                elif g["panels"]:
                    src = b.gep(planes, [b.mul(n, const_i64(g["planes_floats"] + g["slack_total"]))],
                                inbounds=True)
                tail_ws = None
                if g["tail"]:
                    tail_ws = b.gep(planes, [b.add(
                        const_i64(n_batch * (g["planes_floats"] + g["slack_total"])),
                        b.mul(n, const_i64(len(g["tail"]) * g["tail_kp"])))], inbounds=True)
                fused = g["panels"] and self._fuses_tail(g)
                self._fused_tail = (n, tail_ws) if fused else None
                if fused:   # every task gathers the rows its block rows' tails read
                    self._gather_tail(g, x_img, tail_ws)
                if g["panels"] and self._panels_inner_on_copies(g):
                    # Several tasks split the work by panel, each copying only its panels'
                    # plane rows: split by block row, every task copied all the planes into
                    # the same buffer at once, the two cores' caches passing its lines back
                    # and forth (128 -> 128 3x3 on 16x16, 2 threads: each half 440 -> 640
                    # us). With the weights in L2 a task runs its share block rows innermost
                    # (the planes copied once in all, the weights re-read from L2); past L2,
                    # panels innermost (``by_panel``). One task keeps the panels innermost.
                    in_l2 = 4 * g["og"] * g["cg"] * g["kh"] * g["kw"] <= L2_REUSE_BYTES
                    with b.if_else(b.icmp_signed(">", ntasks, const_i64(1))) as (multi, single):
                        with multi:
                            self._conv_panels(g, n, x_img, src, task, ntasks, in_l2,
                                              by_panel=not in_l2)
                        with single:
                            self._conv_panels(g, n, x_img, src, task, ntasks, False)
                elif g["panels"]:
                    self._conv_panels(g, n, x_img, src, task, ntasks, g["panel_outer"])
                if g["tail"] and not fused:
                    self._conv_tail(g, n, x_img, tail_ws, task, ntasks)

    def _weighs_last_panel(self, g: dict) -> bool:
        """A 1x1 read in place, block rows innermost, whose last panel is partial: its tasks
        split the work by output pixels (``_split_last_panel``) rather than by panels."""
        return (LAST_PANEL_SPLIT and g["direct"] and g["groups"] == 1
                and g["panels"] * g["nr"] > g["pflat"] and g["panels"] > 1)

    def _split_last_panel(self, g: dict, mblocks: int, task: ir.Value, ntasks: ir.Value
                          ) -> tuple[ir.Value, ir.Value]:
        """This task's run of the (panel, block row) items, block rows innermost, such that
        the tasks get equal shares of output pixels: the last panel's items weigh its pixels,
        the others ``nr`` each (MobileNetV2's 1x1s on 14x14: 7 panels of 32 pixels, the last
        with 4; split by items, one thread ran 3.5 panels, the other 2.5 and the last, 1.4x
        the time of the first)."""
        b = self.builder
        nr, last = g["nr"], g["pflat"] - (g["panels"] - 1) * g["nr"]
        full = (g["panels"] - 1) * mblocks
        total = full * nr + mblocks * last

        def item_at(t: ir.Value) -> ir.Value:   # the first item at weight t * total / ntasks
            w = b.sdiv(b.mul(t, const_i64(total)), ntasks)
            in_full = b.sdiv(b.add(w, const_i64(nr - 1)), const_i64(nr))
            in_last = b.add(const_i64(full), b.sdiv(
                b.add(b.sub(w, const_i64(full * nr)), const_i64(last - 1)), const_i64(last)))
            return b.select(b.icmp_signed("<=", w, const_i64(full * nr)), in_full, in_last)

        return item_at(task), item_at(b.add(task, const_i64(1)))

    def _panels_inner_on_copies(self, g: dict) -> bool:
        """Panels innermost on copied planes of one group, where several tasks split the work
        by panel instead (see ``_emit_conv``)."""
        return not g["direct"] and not g["panel_outer"] and g["groups"] == 1

    def _panel_range(self, g: dict, mb: ir.Value, lo: ir.Value, hi: ir.Value
                     ) -> tuple[ir.Value, ir.Value]:
        """The panels jp of block row ``mb`` whose work item ``jp * mblocks + mb`` (block
        rows innermost) lies in [lo, hi): [ceil((lo - mb) / mblocks), ceil((hi - mb) /
        mblocks)), clamped to [0, panels]."""
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])

        def bound(v: ir.Value) -> ir.Value:
            q = b.sdiv(b.add(b.sub(v, mb), const_i64(mblocks - 1)), const_i64(mblocks))
            q = b.select(b.icmp_signed(">", q, const_i64(0)), q, const_i64(0))
            return b.select(b.icmp_signed("<", q, const_i64(g["panels"])), q,
                            const_i64(g["panels"]))

        return bound(lo), bound(hi)

    def _conv_panels(self, g: dict, n, x_img, src, task, ntasks, outer: bool,
                     by_panel: bool = False) -> None:
        """The panels' blocks of one image (one group or many, not ``per_group``): fill the
        plane rows this task reads (unless the input is read in place), then its run of the
        work, block rows innermost (``outer``) or panels innermost. ``by_panel`` (one group,
        panels innermost): the task's share is a run of the work in the block-rows-innermost
        order, as with ``outer``, so that it copies only its panels' plane rows, but it runs
        that share block row by block row, panels innermost."""
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])
        kcg = g["kc_outer"] if outer else g["kc_inner"]
        if kcg < g["cg"]:
            self._conv_chunked(g, n, x_img, src, task, ntasks, outer, kcg, by_panel)
            return
        if not g["direct"]:
            # Every task fills the plane rows its panels read (identical values where
            # tasks overlap): no barrier. Each image has its own planes (see
            # _workspace_bytes), so no task overwrites rows another still reads.
            self._fill_planes(g, x_img, src,
                              rows=self._task_rows(g, task, ntasks, outer or by_panel))
        if outer and not by_panel and self._weighs_last_panel(g):
            lo, hi = self._split_last_panel(g, mblocks, task, ntasks)
        else:
            lo, hi = self._split(g["groups"] * mblocks * g["panels"], task, ntasks)
        if by_panel:
            with for_range(b, const_i64(0), const_i64(mblocks), "mb") as mb:
                j_lo, j_hi = self._panel_range(g, mb, lo, hi)
                with for_range(b, j_lo, j_hi, "jp") as jp:
                    self._conv_block(g, n, const_i64(0), mb, jp, src, const_i64(0))
            return
        with for_range(b, lo, hi, "work") as work:
            if outer:   # block row innermost: a planes panel is reused
                mb = b.srem(work, const_i64(mblocks))
                rest = b.sdiv(work, const_i64(mblocks))
                jp = b.srem(rest, const_i64(g["panels"]))
                grp = b.sdiv(rest, const_i64(g["panels"]))
            else:       # panel innermost: a block of weight rows is reused
                jp = b.srem(work, const_i64(g["panels"]))
                rest = b.sdiv(work, const_i64(g["panels"]))
                mb = b.srem(rest, const_i64(mblocks))
                grp = b.sdiv(rest, const_i64(mblocks))
            self._conv_block(g, n, grp, mb, jp, src, b.mul(grp, const_i64(g["cg"])))
            if not outer and self._fused_tail is not None:   # the block row's last panel
                with b.if_then(b.icmp_signed("==", jp, const_i64(g["panels"] - 1))):
                    self._tail_block(g, self._fused_tail[0], self._fused_tail[1],
                                     b.mul(mb, const_i64(g["mr"])), g["mr"])

    def _conv_chunked(self, g: dict, n, x_img, src, task, ntasks, outer: bool, kcg: int,
                      by_panel: bool = False) -> None:
        """``_conv_panels`` with the reduction in chunks of ``kcg`` input channels (one group):
        for every panel (``outer``; else block row) of the task's work, each chunk runs over
        all the task's block rows (panels) of it, their partial sums kept in tiles of the
        task's workspace region, so that the planes they share stay in L1; the last chunk
        ends in the epilogue. Tasks past MAX_TASK_REGIONS get no work."""
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])
        panels, mr, nr = g["panels"], g["mr"], g["nr"]
        nt = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                      const_i64(MAX_TASK_REGIONS))
        with b.if_then(b.icmp_signed("<", task, nt)):
            region = b.gep(self._part_base, [b.mul(task, const_i64(g["part_floats"]))],
                           inbounds=True)
            if not g["direct"]:
                self._fill_planes(g, x_img, src,
                                  rows=self._task_rows(g, task, nt, outer or by_panel))
            yc = mblocks if outer else panels
            lo, hi = self._split(mblocks * panels, task, nt)
            if by_panel:   # every block row x, the panels of the task's share (see _conv_panels)
                x_lo, x_hi = const_i64(0), const_i64(mblocks)
            else:
                x_lo = b.sdiv(lo, const_i64(yc))
                x_hi = b.sdiv(b.add(hi, const_i64(yc - 1)), const_i64(yc))
            nch = g["cg"] // kcg
            with for_range(b, x_lo, x_hi, "cx") as x:
                if by_panel:
                    y_lo, y_hi = self._panel_range(g, x, lo, hi)
                else:
                    base = b.mul(x, const_i64(yc))
                    y_lo = b.sub(lo, base)
                    y_lo = b.select(b.icmp_signed(">", y_lo, const_i64(0)), y_lo, const_i64(0))
                    y_hi = b.sub(hi, base)
                    y_hi = b.select(b.icmp_signed("<", y_hi, const_i64(yc)), y_hi,
                                    const_i64(yc))

                def sweep(kc: ir.Value, init: ir.Value, final) -> None:
                    with for_range(b, y_lo, y_hi, "cy") as y:
                        mb, jp = (y, x) if outer else (x, y)
                        tile = b.gep(region, [b.mul(y, const_i64(mr * nr))], inbounds=True)
                        self._conv_block(g, n, const_i64(0), mb, jp, src, const_i64(0),
                                         chunk=(b.mul(kc, const_i64(kcg)), kcg, init, tile),
                                         final=final)

                if CHUNK_LOOP and nch > 1 and not self._masks_last_panel(g):
                    # every chunk in one loop, the last one's sweep ending in the epilogue
                    with for_range(b, const_i64(0), const_i64(nch), "kc") as kc:
                        sweep(kc, b.icmp_signed(">", kc, const_i64(0)),
                              b.icmp_signed("==", kc, const_i64(nch - 1)))
                else:
                    if nch > 1:
                        with for_range(b, const_i64(0), const_i64(nch - 1), "kc") as kc:
                            sweep(kc, b.icmp_signed(">", kc, const_i64(0)), False)
                    sweep(const_i64(nch - 1), ir.Constant(I1, nch > 1), True)
                if not outer and not by_panel and self._fused_tail is not None:
                    # the task that ran the block row's last panel: its tail outputs
                    with b.if_then(b.icmp_signed("==", y_hi, const_i64(yc))):
                        self._tail_block(g, self._fused_tail[0], self._fused_tail[1],
                                         b.mul(x, const_i64(mr)), mr)

    def _masks_last_panel(self, g: dict) -> bool:
        """Whether a block's last reduction step masks its loads in a last, partial panel
        (the input itself read, ``_conv_block``)."""
        return bool(g["direct"]) and g["panels"] * g["nr"] > g["pflat"]

    def _conv_block(self, g: dict, n, grp, mb, jp, src, ic_base, chunk=None,
                    final: bool | ir.Value = True) -> None:
        """One mr x nr block of outputs: group ``grp``, block row ``mb``, panel ``jp``; ``src``
        holds the planes, the group's first channel at plane channel ``ic_base``. ``chunk``:
        (first channel, channels, init, tile) of a reduction chunk (``_conv_chunked``) whose
        partial sums go to ``tile``, starting from its values when ``init``; the epilogue
        only when ``final`` (an i1 value: when it is true at run time; then no load is
        masked, ``_masks_last_panel`` false)."""
        b = self.builder
        out = self.match.out
        mr, nv, nr, og, cg = g["mr"], g["nv"], g["nr"], g["og"], g["cg"]
        taps = [(ky, kx) for ky in range(g["kh"]) for kx in range(g["kw"])]
        khw = len(taps)
        plane = g["pstride"]
        sh, sw, wq = g["sh"], g["sw"], g["wq"]
        p0 = b.mul(jp, const_i64(nr))
        if g["direct"]:
            masks = [self._lane_mask(b.sub(const_i64(g["pflat"]), p0), v)
                     for v in range(nv)]
        oc0 = b.add(b.mul(grp, const_i64(og)), b.mul(mb, const_i64(mr)))
        local0 = b.mul(mb, const_i64(mr))
        a_scalar = self._conv_weight(oc0, local0, og, khw)
        ny, nx, shifted = g["ny"], g["nx"], g["shifted"]
        k_extent, tile_buf, init = cg, None, None
        if chunk is not None:
            k0, k_extent, init, tile_buf = chunk
            ic_base = b.add(ic_base, k0)
            whole = a_scalar

            def a_scalar(k, u, i):
                return whole(b.add(k, k0), u, i)

        def off(k, u, v):
            ky, kx = taps[u]
            px, dx = (kx, 0) if shifted else (kx % sw, kx // sw)
            plane_idx = b.add(b.mul(b.add(ic_base, k), const_i64(ny * nx)),
                              const_i64((ky % sh) * nx + px))
            return b.add(b.mul(plane_idx, const_i64(plane)),
                         const_i64((ky // sh) * wq + dx + v * self.vl))

        def block(masked: bool) -> None:
            def plain(k, u, v):
                return b.load(self._vec_ptr(src, b.add(off(k, u, v), p0)), align=4)

            def b_masked(k, u, v):
                return self._masked_load(self._vec_ptr(src, b.add(off(k, u, v), p0)), masks[v])

            # Only the last channel's loads could run past the input (the reduction's last
            # step, in the last chunk): the lanes past the plane read the next channel, and
            # only feed outputs that are dropped.
            tile = self._microkernel(mr, nv, k_extent, a_scalar, plain, list(range(khw)),
                                     b_last=b_masked if masked and final is True else None,
                                     tile=tile_buf, init=init)

            def epilogue() -> None:
                self._conv_epilogue(g, out, n, oc0, local0, p0, tile)
                if g.get("prefetch_panels", 0) and g.get("prefetch_input"):
                    self._prefetch_input_rows(g, src, ic_base if chunk is None else
                                              b.sub(ic_base, chunk[0]), mb, p0)

            if isinstance(final, ir.Value):
                with b.if_then(final):
                    epilogue()
            elif final:
                epilogue()

        if not self._masks_last_panel(g):
            block(False)
        else:  # the input itself is read: mask the last loads of the last, partial panel
            full = b.icmp_signed("<=", b.add(p0, const_i64(nr)), const_i64(g["pflat"]))
            with b.if_else(full) as (then, otherwise):
                with then:
                    block(False)
                with otherwise:
                    block(True)

    def _hsum(self, v: ir.Value) -> ir.Value:
        """The sum of a vector's lanes (a tree of shuffles and adds)."""
        b = self.builder
        n = self.vl
        while n > 1:
            half = n // 2
            hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half),
                                                    list(range(half, n))))
            lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half))))
            v = b.fadd(lo, hi)
            n = half
        return b.extract_element(v, ir.Constant(I32, 0))

    def _conv_tail(self, g: dict, n, x_img, xt, task, ntasks) -> None:
        """The outputs of the tail pixels (``conv_geometry``: those a last, partial panel
        would hold), one group: each pixel's inputs (channel, tap) are gathered into ``xt`` (a
        row of ``tail_kp`` floats, zero-padded), then every output is the dot product of its
        weight row with that row, vl products at a time; a block of mo channels x rp pixels
        keeps mo * rp vector accumulators. The tasks split the channel blocks; each task with
        some gathers the rows (the same values where tasks overlap, as the planes)."""
        b = self.builder
        mo = self._row_block() or (8 if len(g["tail"]) == 1 else 4)
        oblocks = -(-g["og"] // mo)
        lo, hi = self._split(oblocks, task, ntasks)
        with b.if_then(b.icmp_signed(">", hi, lo)):
            self._gather_tail(g, x_img, xt)
            with for_range(b, lo, hi, "tob") as ob:
                self._tail_block(g, n, xt, b.mul(ob, const_i64(mo)), mo)

    def _fuses_tail(self, g: dict) -> bool:
        """Whether each block row's tail outputs follow its panels (``_conv_panels``), its
        weight rows still in cache, instead of a pass of their own after all the panels: a
        direct (1x1) convolution, panels innermost, whose weights do not stay in L2 (the
        separate pass read them all again from L3: MobileNetV2's 320 -> 1280 on 7x7, 1.6 MB,
        one tail pixel)."""
        return (bool(g["tail"]) and g["direct"] and not g["panel_outer"] and g["groups"] == 1
                and 4 * g["og"] * g["cg"] > L2_REUSE_BYTES)

    def _gather_tail(self, g: dict, x_img, xt) -> None:
        """Every tail pixel's inputs (channel, tap) into its row of ``xt``, zero-padded."""
        b = self.builder
        tail, kp = g["tail"], g["tail_kp"]
        kh, kw, cg, h, w = g["kh"], g["kw"], g["cg"], g["h"], g["w"]
        khw = kh * kw
        zero = ir.Constant(F32, 0.0)
        with for_range(b, const_i64(0), const_i64(cg), "tc") as ic:
            src = b.mul(ic, const_i64(h * w))
            for t, (oy, ox) in enumerate(tail):
                for ky in range(kh):
                    for kx in range(kw):
                        iy = oy * g["sh"] + ky - g["pt"]
                        ix = ox * g["sw"] + kx - g["pl"]
                        dst = b.add(b.mul(ic, const_i64(khw)), const_i64(t * kp + ky * kw + kx))
                        val = zero
                        if 0 <= iy < h and 0 <= ix < w:
                            val = b.load(b.gep(x_img, [b.add(src, const_i64(iy * w + ix))],
                                               inbounds=True))
                        b.store(val, b.gep(xt, [dst], inbounds=True))
        for t in range(len(tail)):
            for k in range(cg * khw, kp):
                b.store(zero, b.gep(xt, [const_i64(t * kp + k)], inbounds=True))

    def _tail_block(self, g: dict, n, xt, o0, mo: int) -> None:
        """The tail outputs of channels o0 .. o0 + mo - 1 (those below og), from the gathered
        rows ``xt``: dot products of their weight rows with them, rp pixels at a time."""
        b = self.builder
        tail, kp, og, vl = g["tail"], g["tail_kp"], g["og"], self.vl
        k_taps = g["cg"] * g["kh"] * g["kw"]
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        rp = 1 if len(tail) == 1 else 2
        if self._row_block() is not None:
            self._tail_block_rows(g, n, xt, o0, mo, rp)
            return
        chunks, rem = divmod(k_taps, vl)
        rem_mask = ir.Constant(ir.VectorType(I1, vl), [i < rem for i in range(vl)])
        rows = [b.mul(b.select(b.icmp_signed("<", b.add(o0, const_i64(i)), const_i64(og)),
                               b.add(o0, const_i64(i)), const_i64(og - 1)),
                      const_i64(k_taps)) for i in range(mo)]
        for j0 in range(0, len(tail), rp):
            r = min(rp, len(tail) - j0)
            accs = [alloca_once(b, self.vty, name=f"tacc{i}_{j}")
                    for i in range(mo) for j in range(r)]
            for a in accs:
                b.store(ir.Constant(self.vty, [0.0] * vl), a)

            def step(kc, masked: bool, j0=j0, r=r, accs=accs) -> None:
                k0 = b.mul(kc, const_i64(vl))
                xv = [b.load(self._vec_ptr(xt, b.add(k0, const_i64((j0 + j) * kp))),
                             align=4) for j in range(r)]
                for i in range(mo):
                    ptr = self._vec_ptr(w_ptr, b.add(rows[i], k0))
                    wv = self._masked_load(ptr, rem_mask) if masked \
                        else b.load(ptr, align=4)
                    for j in range(r):
                        a = accs[i * r + j]
                        b.store(self._fma(wv, xv[j], b.load(a)), a)

            if chunks:
                with for_range(b, const_i64(0), const_i64(chunks), "tk") as kc:
                    step(kc, False)
            if rem:
                step(const_i64(chunks), True)
            self._begin_epilogue()
            tile = alloca_once(b, ir.ArrayType(F32, mo * r), name="ttile")
            tile_f = b.bitcast(tile, F32.as_pointer())
            for q, a in enumerate(accs):
                b.store(self._hsum(b.load(a)), b.gep(tile_f, [const_i64(q)], inbounds=True))
            self._store_tail_tile(n, o0, mo, tail[j0:j0 + r], tile_f)

    def _store_tail_tile(self, n, o0, mo: int, pixels, tile_f: ir.Value) -> None:
        """The epilogue of a tail block: channels o0 .. o0 + mo - 1 (those below og) at the tail
        ``pixels`` ((oy, ox) each), channel i's value at pixel j in ``tile_f[i * len(pixels) +
        j]``."""
        b, out, r = self.builder, self.match.out, len(pixels)
        for i in range(mo):
            oc = b.add(o0, const_i64(i))
            with b.if_then(b.icmp_signed("<", oc, const_i64(self._conv_geometry()["og"]))):
                for j, (oy, ox) in enumerate(pixels):
                    env = {id(out.axes[0]): n, id(out.axes[1]): oc,
                           id(out.axes[2]): const_i64(oy), id(out.axes[3]): const_i64(ox)}
                    self._store_epilogue(env, tile_f, const_i64(i * r + j))

    def _tail_block_rows(self, g: dict, n, xt, o0, mo: int, rp: int) -> None:
        """``_tail_block`` on weights packed in blocks of ``mo`` rows (``conv2d_rows``; ``o0`` a
        block's first channel): the block's ``mo`` channels on the lanes of one accumulator per
        pixel, each reduction step one load of its ``mo`` weights times the pixel's input (no
        horizontal sums)."""
        b = self.builder
        tail, kp = g["tail"], g["tail_kp"]
        k_taps = g["cg"] * g["kh"] * g["kw"]
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        lanes = ir.VectorType(F32, mo)
        fma = intrinsic(self.module, f"llvm.fmuladd.v{mo}f32", lanes, [lanes] * 3)
        block = b.gep(w_ptr, [b.mul(b.sdiv(o0, const_i64(mo)), const_i64(k_taps * mo))],
                      inbounds=True)
        if TAIL_PAIRS and 2 * mo == self.vl and k_taps >= 2 and len(tail) == 1:
            self._tail_block_pairs(g, n, xt, o0, mo, rp, block)
            return
        for j0 in range(0, len(tail), rp):
            r = min(rp, len(tail) - j0)
            # TAIL_CHAINS independent accumulators in all (steps k interleaved), so that the
            # multiply-adds do not wait on each other's latency
            chains = max(1, TAIL_CHAINS // r)
            accs = [[alloca_once(b, lanes, name=f"tracc{j}_{c}") for c in range(chains)]
                    for j in range(r)]
            for a in (a for row in accs for a in row):
                b.store(ir.Constant(lanes, [0.0] * mo), a)

            def step(k, c: int, j0=j0, r=r, accs=accs) -> None:
                wv = self._weight_vector(block, b.mul(k, const_i64(mo)), mo)
                for j in range(r):
                    x = b.load(b.gep(xt, [b.add(k, const_i64((j0 + j) * kp))], inbounds=True))
                    xv = b.shuffle_vector(
                        b.insert_element(ir.Constant(lanes, None), x, ir.Constant(I32, 0)),
                        ir.Constant(lanes, None),
                        ir.Constant(ir.VectorType(I32, mo), [0] * mo))
                    b.store(b.call(fma, [wv, xv, b.load(accs[j][c])]), accs[j][c])

            full, rem = divmod(k_taps, chains)
            with for_range(b, const_i64(0), const_i64(full), "trk") as kk:
                for c in range(chains):
                    step(b.add(b.mul(kk, const_i64(chains)), const_i64(c)), c)
            for c in range(rem):
                step(const_i64(full * chains + c), c)
            self._begin_epilogue()
            tile = alloca_once(b, ir.ArrayType(F32, mo * r), name="trtile")
            tile_f = b.bitcast(tile, F32.as_pointer())
            for j in range(r):
                acc = b.load(accs[j][0])
                for c in range(1, chains):
                    acc = b.fadd(acc, b.load(accs[j][c]))
                for i in range(mo):
                    b.store(b.extract_element(acc, ir.Constant(I32, i)),
                            b.gep(tile_f, [const_i64(i * r + j)], inbounds=True))
            self._store_tail_tile(n, o0, mo, tail[j0:j0 + r], tile_f)

    def _tail_block_pairs(self, g: dict, n, xt, o0, mo: int, rp: int, block) -> None:
        """``_tail_block_rows`` two reduction steps a vector: the ``mo`` weights of steps k and
        k + 1 are one contiguous vector of 2 * mo = vl lanes, multiplied by the pixel's inputs
        k and k + 1 each on its half (one 8-byte load and a permute), so that each multiply-add
        is a full vector and each weight load serves it (the 4-lane form loads a weight vector
        and broadcasts an input for every half-width multiply-add: load-bound, ~4x the
        microkernel's cost per multiply-add on Zen 4). An odd last step: the 4-lane form."""
        b = self.builder
        tail, kp = g["tail"], g["tail_kp"]
        k_taps = g["cg"] * g["kh"] * g["kw"]
        vl = self.vl
        half = ir.VectorType(F32, mo)
        pair = ir.VectorType(F32, 2)
        spread = ir.Constant(ir.VectorType(I32, vl), [i // mo for i in range(vl)])
        lo_idx = ir.Constant(ir.VectorType(I32, mo), list(range(mo)))
        hi_idx = ir.Constant(ir.VectorType(I32, mo), list(range(mo, vl)))
        fma4 = intrinsic(self.module, f"llvm.fmuladd.v{mo}f32", half, [half] * 3)
        for j0 in range(0, len(tail), rp):
            r = min(rp, len(tail) - j0)
            chains = max(1, TAIL_CHAINS // r)
            accs = [[alloca_once(b, self.vty, name=f"tpacc{j}_{c}") for c in range(chains)]
                    for j in range(r)]
            for a in (a for row in accs for a in row):
                b.store(ir.Constant(self.vty, [0.0] * vl), a)

            def step(kk, c: int, j0=j0, r=r, accs=accs) -> None:
                k = b.mul(kk, const_i64(2))
                wv = self._weight_vector(block, b.mul(k, const_i64(mo)), vl)
                for j in range(r):
                    ptr = b.bitcast(b.gep(xt, [b.add(k, const_i64((j0 + j) * kp))],
                                          inbounds=True), pair.as_pointer())
                    xv = b.shuffle_vector(b.load(ptr, align=4), ir.Constant(pair, None), spread)
                    b.store(self._fma(wv, xv, b.load(accs[j][c])), accs[j][c])

            pairs = k_taps // 2
            full, rem = divmod(pairs, chains)
            with for_range(b, const_i64(0), const_i64(full), "tpk") as kk:
                for c in range(chains):
                    step(b.add(b.mul(kk, const_i64(chains)), const_i64(c)), c)
            for c in range(rem):
                step(const_i64(full * chains + c), c)
            self._begin_epilogue()
            tile = alloca_once(b, ir.ArrayType(F32, mo * r), name="tptile")
            tile_f = b.bitcast(tile, F32.as_pointer())
            for j in range(r):
                acc = b.load(accs[j][0])
                for c in range(1, chains):
                    acc = b.fadd(acc, b.load(accs[j][c]))
                row = b.fadd(b.shuffle_vector(acc, acc, lo_idx), b.shuffle_vector(acc, acc, hi_idx))
                if k_taps % 2:
                    k = const_i64(k_taps - 1)
                    wv = self._weight_vector(block, b.mul(k, const_i64(mo)), mo)
                    x = b.load(b.gep(xt, [b.add(k, const_i64((j0 + j) * kp))], inbounds=True))
                    xv = b.shuffle_vector(
                        b.insert_element(ir.Constant(half, None), x, ir.Constant(I32, 0)),
                        ir.Constant(half, None), ir.Constant(ir.VectorType(I32, mo), [0] * mo))
                    row = b.call(fma4, [wv, xv, row])
                for i in range(mo):
                    b.store(b.extract_element(row, ir.Constant(I32, i)),
                            b.gep(tile_f, [const_i64(i * r + j)], inbounds=True))
            self._store_tail_tile(n, o0, mo, tail[j0:j0 + r], tile_f)

    def _conv_epilogue(self, g: dict, out: te.Tensor, n, oc0, local0, p0, tile) -> None:
        b = self.builder
        mr, nr, wq = g["mr"], g["nr"], g["wq"]
        rows = b.sub(const_i64(g["og"]), local0)
        rows = b.select(b.icmp_signed("<", rows, const_i64(mr)), rows, const_i64(mr))
        p1 = b.add(p0, const_i64(nr))
        oy_lo = b.sdiv(p0, const_i64(wq))
        oy_hi = b.sdiv(b.sub(p1, const_i64(1)), const_i64(wq))
        oy_hi = b.add(b.select(b.icmp_signed("<", oy_hi, const_i64(g["oh"] - 1)), oy_hi,
                               const_i64(g["oh"] - 1)), const_i64(1))
        env = {id(out.axes[0]): n}
        if wq == g["ow"] and self._vector_epilogue_ok() and self._rows_contiguous():
            # a panel is a contiguous run of outputs: vectors across row ends
            ahead = g.get("prefetch_panels", 0) * nr
            with for_range(b, const_i64(0), rows, "ti") as i:
                env[id(out.axes[1])] = b.add(oc0, i)
                if ahead:
                    self._prefetch_run(env, out, b.add(p0, const_i64(ahead)), nr)
                if EPILOGUE_VECTOR_LOOP and g["nv"] > 1 and self._costly_epilogue():
                    # the count through an empty asm: LLVM's full unrolling copied the
                    # epilogue back per vector (the optimized module as large as before)
                    nv = b.asm(ir.FunctionType(I64, [I64]), "", "=r,0", [const_i64(g["nv"])],
                               side_effect=True)
                    with for_range(b, const_i64(0), nv, "tv") as v:
                        self._epilogue_vector(g, env, tile, i, p0, b.mul(v, const_i64(self.vl)))
                else:
                    for v in range(g["nv"]):
                        self._epilogue_vector(g, env, tile, i, p0, const_i64(v * self.vl))
            return
        with for_range(b, const_i64(0), rows, "ti") as i:
            env[id(out.axes[1])] = b.add(oc0, i)
            with for_range(b, oy_lo, oy_hi, "oy") as oy:
                row0 = b.mul(oy, const_i64(wq))
                start = b.sub(p0, row0)
                x_lo = b.select(b.icmp_signed(">", start, const_i64(0)), start, const_i64(0))
                end = b.sub(p1, row0)
                x_hi = b.select(b.icmp_signed("<", end, const_i64(g["ow"])), end,
                                const_i64(g["ow"]))
                env[id(out.axes[2])] = oy
                self._store_row_span(env, out.axes[3], tile, i, nr, row0, p0, x_lo, x_hi,
                                     self._vector_epilogue_ok())

    def _costly_epilogue(self) -> bool:
        """Whether the fused epilogue calls a math function (SiLU's sigmoid, GELU's erf): a
        copy per vector is then most of the kernel's code; a bias or residual add stays a
        copy per vector (a loop's index arithmetic would be most of its work)."""
        return any(isinstance(e, te.MathCall) for e in te.walk(self.match.body))

    def _epilogue_vector(self, g: dict, env: dict, tile, i, p0, at) -> None:
        """The epilogue on the vector ``at`` floats into tile row ``i`` of a panel that is a
        contiguous run of outputs from ``p0`` (vectors across row ends): whole, or its lanes
        before the image's end, or none past it."""
        b, out = self.builder, self.match.out
        wq = g["wq"]
        p = b.add(p0, at)
        left = b.sub(const_i64(g["pflat"]), p)
        env[id(out.axes[2])] = b.sdiv(p, const_i64(wq))
        env[id(out.axes[3])] = b.srem(p, const_i64(wq))
        t_idx = b.add(b.mul(i, const_i64(g["nr"])), at)
        with b.if_else(b.icmp_signed(">=", left, const_i64(self.vl))) as (full, part):
            with full:
                self._store_vector(env, tile, t_idx, None)
            with part:
                with b.if_then(b.icmp_signed(">", left, const_i64(0))):
                    self._store_vector(env, tile, t_idx, self._lane_mask(left, 0))

    def _prefetch_input_rows(self, g: dict, src, ic_base, mb, p0) -> None:
        """Direct 1x1, block rows innermost: block row ``mb`` prefetches its share (the
        channels ``mb * per`` on) of the input rows' runs that the panel ``prefetch_panels``
        ahead reads, so that all the block rows of a panel together fetch its input."""
        b = self.builder
        i8p = ir.IntType(8).as_pointer()
        fn = intrinsic(self.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, I32, I32, I32])
        mblocks = -(-g["og"] // g["mr"])
        per = -(-g["cg"] // mblocks)
        nr = g["nr"]
        k_lo = b.mul(mb, const_i64(per))
        k_hi = b.add(k_lo, const_i64(per))
        k_hi = b.select(b.icmp_signed("<", k_hi, const_i64(g["cg"])), k_hi, const_i64(g["cg"]))
        p = b.add(p0, const_i64(g["prefetch_panels"] * nr))
        with for_range(b, k_lo, k_hi, "pk") as k:
            row = b.add(b.mul(b.add(ic_base, k), const_i64(g["pstride"])), p)
            for d in sorted({*range(0, nr, 16), nr - 1}):
                ptr = b.gep(src, [b.add(row, const_i64(d))])
                b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3),
                            ir.Constant(I32, 1)])

    def _prefetch_run(self, env: dict, out: te.Tensor, p: ir.Value, count: int) -> None:
        """Prefetch the ``count`` flattened outputs from ``p`` of the output row ``env`` names
        (for writing) and of every epilogue operand read along it (a residual; for reading):
        a line per 16 floats, and the run's last one. Past the row's end the lines belong to
        the next row (or past the buffer: a prefetch does not fault)."""
        b = self.builder
        i8p = ir.IntType(8).as_pointer()
        fn = intrinsic(self.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, I32, I32, I32])
        wq = self._conv_geometry()["wq"]
        tensors = [(out, 1)]
        seen = {out.uid}
        for e in te.reads(self.match.body):
            if (e.tensor.uid not in seen and len(e.indices) == len(out.axes)
                    and all(i is a for i, a in zip(e.indices, out.axes))):
                seen.add(e.tensor.uid)
                tensors.append((e.tensor, 0))
        env = dict(env)
        for t, rw in tensors:
            for d in sorted({*range(0, count, 16), count - 1}):
                q = b.add(p, const_i64(d))
                env[id(out.axes[2])] = b.sdiv(q, const_i64(wq))
                env[id(out.axes[3])] = b.srem(q, const_i64(wq))
                ptr = b.gep(self.buffers[t.uid], [self._offset(t, [env[id(a)] for a in out.axes])])
                b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, rw), ir.Constant(I32, 3),
                            ir.Constant(I32, 1)])
