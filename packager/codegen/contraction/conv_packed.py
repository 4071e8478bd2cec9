"""The packed 1x1 convolution (``geometry.conv_geometry``'s ``packed``; see ``PACK_A_BYTES``):
a GEMM ``out[oc, p] = sum_k w[oc, k] * x[k, p * stride]`` whose input is first copied, by each
task for the panels it runs, into ``[panel][K][nr]`` in the workspace (zeros past the last
output), and whose block rows then run in chunks of ``mc_blocks`` (their weights stay in L2),
every panel of the task per chunk. The microkernel reads one contiguous packed panel and one
block of the weights packed in row blocks (``conv2d_rows``); a partial last panel may be the
tail (dot products, after the chunk's panels, while its weights are still in cache).

Tasks split the (panel, chunk) work items, panel-major, so that each task copies only its own
panels (tasks that share the boundary panel copy the same values into it: no barrier), and
runs them chunk by chunk."""

from __future__ import annotations

from llvmlite import ir

from ..helpers import F32, const_i64, for_range


class PackedConvMixin:
    """The packed 1x1 conv2d part of ``kernel.ContractionEmitter``."""

    def _emit_conv_packed(self, g: dict, ws: ir.Value, task: ir.Value, ntasks: ir.Value
                          ) -> None:
        b = self.builder
        x_t = self.match.tag.operands[0]
        x_ptr = self.buffers[x_t.uid]
        ws_f = b.bitcast(ws, F32.as_pointer())
        panels, nch = g["panels"], g["mchunks"]
        per_image = g["pack_floats"] + len(g["tail"]) * g["tail_kp"]
        lo, hi = self._split(panels * nch, task, ntasks)
        j_lo = b.sdiv(lo, const_i64(nch))
        j_hi = b.sdiv(b.add(hi, const_i64(nch - 1)), const_i64(nch))
        with b.if_then(b.icmp_signed(">", hi, lo)):
            with for_range(b, const_i64(0), const_i64(x_t.shape[0]), "n") as n:
                x_img = b.gep(x_ptr, [b.mul(n, const_i64(g["c"] * g["h"] * g["w"]))],
                              inbounds=True)
                packed = b.gep(ws_f, [b.mul(n, const_i64(per_image))], inbounds=True)
                xt = b.gep(packed, [const_i64(g["pack_floats"])], inbounds=True)
                self._pack_panels(g, x_img, packed, j_lo, j_hi)
                owns_tail = b.icmp_signed("==", j_hi, const_i64(panels))
                if g["tail"]:
                    with b.if_then(owns_tail):
                        self._gather_tail(g, x_img, xt)
                with for_range(b, const_i64(0), const_i64(nch), "mc") as c:
                    self._packed_chunk(g, n, c, lo, hi, packed, xt)

    def _packed_chunk(self, g: dict, n, c, lo, hi, packed, xt) -> None:
        """Chunk ``c`` of block rows over the task's panels (items ``jp * nch + c`` in [lo,
        hi)), then, for the task that has the last panel's item, the chunk's tail outputs."""
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])
        mcb, nch = g["mc_blocks"], g["mchunks"]

        def bound(v: ir.Value) -> ir.Value:   # ceil((v - c) / nch), clamped to [0, panels]
            q = b.sdiv(b.add(b.sub(v, c), const_i64(nch - 1)), const_i64(nch))
            q = b.select(b.icmp_signed(">", q, const_i64(0)), q, const_i64(0))
            return b.select(b.icmp_signed("<", q, const_i64(g["panels"])), q,
                            const_i64(g["panels"]))

        jl, jh = bound(lo), bound(hi)
        mb_lo = b.mul(c, const_i64(mcb))
        mb_hi = b.add(mb_lo, const_i64(mcb))
        mb_hi = b.select(b.icmp_signed("<", mb_hi, const_i64(mblocks)), mb_hi,
                         const_i64(mblocks))
        with for_range(b, jl, jh, "jp") as jp:
            with for_range(b, mb_lo, mb_hi, "mb") as mb:
                self._packed_block(g, n, mb, jp, packed)
        if g["tail"]:
            last = b.and_(b.icmp_signed("==", jh, const_i64(g["panels"])),
                          b.icmp_signed(">", jh, jl))
            with b.if_then(last):
                with for_range(b, mb_lo, mb_hi, "tmb") as mb:
                    self._tail_block(g, n, xt, b.mul(mb, const_i64(g["mr"])), g["mr"])

    def _packed_block(self, g: dict, n, mb, jp, packed) -> None:
        """One mr x nr block of outputs from packed panel ``jp``, then its epilogue."""
        b = self.builder
        mr, nv, nr, cg = g["mr"], g["nv"], g["nr"], g["cg"]
        oc0 = b.mul(mb, const_i64(mr))
        a_scalar = self._conv_weight(oc0, oc0, g["og"], 1)
        panel = b.gep(packed, [b.mul(jp, const_i64(cg * nr))], inbounds=True)

        def b_vector(k, u, v):
            off = b.add(b.mul(k, const_i64(nr)), const_i64(v * self.vl))
            return b.load(self._vec_ptr(panel, off), align=4)

        # The block's output runs, and the residual's (or any output-shaped operand's), are
        # fetched while its reduction runs: ResNet-50's 1x1s with a residual, 1 thread, 74-84
        # -> 86-89 % of the FMA peak (bench/conv_peak.py); the others unchanged.
        env = {id(self.match.out.axes[0]): n}
        with for_range(b, const_i64(0), const_i64(min(mr, g["og"])), "pfi") as i:
            env[id(self.match.out.axes[1])] = b.add(oc0, i)
            self._prefetch_run(env, self.match.out, b.mul(jp, const_i64(nr)), nr)
        tile = self._microkernel(mr, nv, cg, a_scalar, b_vector, [0])
        self._conv_epilogue(g, self.match.out, n, oc0, oc0, b.mul(jp, const_i64(nr)), tile)

    def _pack_panels(self, g: dict, x_img, packed, j_lo, j_hi) -> None:
        """packed[jp][k][i] = x[k, oy * sh, ox * sw] for output p = jp * nr + i = oy * ow + ox
        (zero past the last output), panels [j_lo, j_hi). Stride 1: vector copies of the input
        rows' runs (masked in a partial panel); else one element at a time."""
        b = self.builder
        with for_range(b, j_lo, j_hi, "pj") as jp:
            p0 = b.mul(jp, const_i64(g["nr"]))
            dst = b.gep(packed, [b.mul(jp, const_i64(g["cg"] * g["nr"]))], inbounds=True)
            if (g["sh"], g["sw"]) == (1, 1):
                self._pack_runs(g, x_img, dst, p0)
            else:
                self._pack_gather(g, x_img, dst, p0)

    def _pack_runs(self, g: dict, x_img, dst, p0) -> None:
        b = self.builder
        cg, nr, nv, vl, pflat = g["cg"], g["nr"], g["nv"], self.vl, g["pflat"]
        full = b.icmp_signed("<=", b.add(p0, const_i64(nr)), const_i64(pflat))
        masks = [self._lane_mask(b.sub(const_i64(pflat), p0), v) for v in range(nv)]
        with b.if_else(full) as (whole, part):
            for block, masked in ((whole, False), (part, True)):
                with block:
                    with for_range(b, const_i64(0), const_i64(cg), "pk") as k:
                        src = b.add(b.mul(k, const_i64(g["h"] * g["w"])), p0)
                        for v in range(nv):
                            ptr = self._vec_ptr(x_img, b.add(src, const_i64(v * vl)))
                            val = (self._masked_load(ptr, masks[v]) if masked
                                   else b.load(ptr, align=4))
                            out = b.add(b.mul(k, const_i64(nr)), const_i64(v * vl))
                            b.store(val, self._vec_ptr(dst, out), align=4)

    def _pack_gather(self, g: dict, x_img, dst, p0) -> None:
        b = self.builder
        cg, nr, pflat, ow = g["cg"], g["nr"], g["pflat"], g["ow"]
        zero = ir.Constant(F32, 0.0)
        offs, oks = [], []    # each pixel's offset in a channel's plane (0 past the outputs)
        for i in range(nr):
            p = b.add(p0, const_i64(i))
            ok = b.icmp_signed("<", p, const_i64(pflat))
            src = b.add(b.mul(b.sdiv(p, const_i64(ow)), const_i64(g["sh"] * g["w"])),
                        b.mul(b.srem(p, const_i64(ow)), const_i64(g["sw"])))
            offs.append(b.select(ok, src, const_i64(0)))
            oks.append(ok)
        with for_range(b, const_i64(0), const_i64(cg), "pk") as k:
            row = b.mul(k, const_i64(g["h"] * g["w"]))
            for i in range(nr):
                val = b.load(b.gep(x_img, [b.add(row, offs[i])], inbounds=True))
                b.store(b.select(oks[i], val, zero),
                        b.gep(dst, [b.add(b.mul(k, const_i64(nr)), const_i64(i))],
                              inbounds=True))
