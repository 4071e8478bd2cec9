"""The ``qconv2d`` integer convolution kernel (groups 1, dilation 1, any kernel / stride /
padding; no im2col: int16 pair planes on AVX2 / generic targets, uint8 quad planes with VNNI /
sdot; a 1x1 image as a matrix-vector product; an optional ``lut8`` table on the copy out); the
family's design, packing and epilogue are described in ``codegen/qgemm.py``.

3x3 stride-1 convolutions with full-range int8 weights on x86 sets without VNNI: the exact
integer Winograd F(2x2, 3x3) kernel (``_emit_wino``; weights transformed at export, ``qconv2d``
``winograd``).

Run-time image sizes (an ONNX file's open batch, height or width): the pixel-lane quad kernel
(weights packed as quads at export, 7-bit or split, a lut8 table folded in or not) with its
size-dependent plan computed at the kernel's entry (``_emit_open``); ``passes/int8_cost.py``
``open_conv_integer`` decides which convolutions take it. The channel-lane (``oc_lanes``) and
k-pair kernels stay static-only: their choice or layout depends on the image size."""

from __future__ import annotations

from dataclasses import replace

from llvmlite import ir

from ..ir import te
from ..ops.qlinear import CONV_ROWS, PANEL
from ..ops.quant import saturation_range
from .helpers import (F32, I8, I16, I32, I64, STORAGE_TYPES, alloca_once, const_i64, for_range,
                      intrinsic)
from .contraction.geometry import MAX_TASK_REGIONS, PARALLEL_MIN_MACS
from .conv_oc import OPEN_IMAGE_PIXELS
from .lower import WORKSPACE_ALIGN, KernelInfo, LoweringError
from .qgemm import V8F32, V8I32, V16I8, V16I16, V16I32, QEmitter, align_workspace

ZMM_LANES = 16      # int32 lanes of a 512-bit vector: pixels per vector of the zmm quad tile
ZMM_TILES = (4, 3, 2)   # 16-pixel vectors per tile row (6 rows: 24, 18, 12 accumulators)
# the run-time-size kernel's (``_emit_open``): its plane width is not known at export; 48
# lanes pad whole rows of 16 k pixels to a multiple of 48 at most 32 lanes (64: up to 48)
OPEN_ZMM_VECTORS = 3
# The integer Winograd kernel (``_emit_wino``): a band's transformed inputs (16 x C x its tiles,
# int16) at most this many bytes, in L2 while every tile of output channels reads them
WINO_V_BYTES = 256 * 1024


def zmm_vectors(qn: int) -> int:
    """The zmm quad tile's 16-pixel vectors per row for ``qn`` plane columns of output
    (``oh * wq``): the most of ``ZMM_TILES`` (fewest steps per multiply-add: 6 weight
    broadcasts and nz plane loads per 6 nz vpdpbusd) whose padding to a whole tile wastes no
    more than 2 % more lanes than the least wasteful one's."""
    def waste(nz: int) -> float:
        lanes = ZMM_LANES * nz
        return (-(-qn // lanes) * lanes - qn) / qn
    least = min(waste(nz) for nz in ZMM_TILES)
    return next(nz for nz in ZMM_TILES if waste(nz) <= least + 0.02)


def _inside_image(py: int, px: int, h: int, w: int, prow: int, wq: int, sh: int, sw: int,
                  pt: int, pl: int) -> tuple[int, int, int, int] | None:
    """(u_lo, u_hi, v_lo, v_hi): the plane cells of stride phase (py, px) whose pixel
    (u*sh + py - pt, v*sw + px - pl) lies inside the h x w image; None when none does."""
    u_lo = max(0, -(-(pt - py) // sh))
    u_hi = min(prow, (h + pt - py - 1) // sh + 1)
    v_lo = max(0, -(-(pl - px) // sw))
    v_hi = min(wq, (w + pl - px - 1) // sw + 1)
    if u_hi <= u_lo or v_hi <= v_lo:
        return None
    return u_lo, u_hi, v_lo, v_hi


def _i64(v) -> ir.Value:
    """An extent as an i64: a constant for an int, else the value itself."""
    return const_i64(v) if isinstance(v, int) else v


class QConv(QEmitter):
    @staticmethod
    def takes_open(func, tag) -> bool:
        """Whether ``_emit_open`` takes a ``qconv2d`` with run-time extents: quads packed at
        export for the pixel-lane kernel (passes/quad_weights.py; not the sign kernel's
        ``signed_x``, a channel-lane form), 8-bit x; or a 1x1 convolution of 1x1 images with
        a run-time batch (``_open_vector``)."""
        if QConv._open_vector(func, tag):
            return True
        return (bool(tag.attrs.get("quads")) and not tag.attrs.get("oc_lanes")
                and not tag.attrs.get("signed_x")
                and func.inputs[0].dtype in ("int8", "uint8")
                and func.inputs[1].dtype == "int8")

    @staticmethod
    def _open_vector(func, tag) -> bool:
        """A 1x1 convolution of 1x1 images (a squeeze-and-excitation block's) whose batch
        alone is a run-time size: ``_emit_vector`` with the batch read at run time (its
        k-pair weights: passes/quad_weights.py leaves the 1x1-image case unpacked)."""
        x, y = func.inputs[0], func.outputs[0]
        return (not tag.attrs.get("quads") and not tag.attrs.get("split")
                and func.inputs[0].dtype in ("int8", "uint8")
                and tuple(x.shape[1:]) == (x.shape[1], 1, 1) and isinstance(x.shape[1], int)
                and tuple(y.shape[2:]) == (1, 1) and isinstance(y.shape[1], int)
                and tuple(tag.attrs["kernel"]) == (1, 1) and not any(tag.attrs["padding"]))

    def emit(self) -> KernelInfo:
        if self.symbolic and self._open_vector(self.func, self.tag):
            x, wk, x_zp, bias, mult, y_zp = self.func.inputs[:6]
            lut = self.func.inputs[6] if len(self.tag.operands) > 6 else None
            return self._emit_vector(x, wk, x_zp, bias, mult, y_zp, lut, self.func.outputs[0],
                                     x.shape[0], int(x.shape[1]),
                                     int(self.tag.attrs["out_channels"]))
        if self.symbolic:
            return self._emit_open()
        x, wk, x_zp, bias, mult, y_zp = self.func.inputs[:6]
        # full-range weights split for vpmaddubsw (ops/qconv_quads.py ``split``): the residual
        # words' index and quads come next, before the table
        split = bool(self.tag.attrs.get("split", False))
        res = self.func.inputs[6:8] if split else ()
        n_in = 8 if split else 6
        # the op's own arguments (an elementwise chain's follow them: codegen/qchain.py)
        lut = self.func.inputs[n_in] if len(self.tag.operands) > n_in else None
        y = self.func.outputs[0]
        batch, c, h, w = (int(d) for d in x.shape)
        o = int(self.tag.attrs["out_channels"])
        kh, kw = self.tag.attrs["kernel"]
        _, _, oh, ow = (int(d) for d in y.shape)
        sh, sw = self.tag.attrs["strides"]
        pt, pl, pb, pr = self.tag.attrs["padding"]
        vector = (h, w, kh, kw, oh, ow) == (1, 1, 1, 1, 1, 1) and not any(self.tag.attrs["padding"])
        if self.chain is not None and vector:
            raise LoweringError(f"{self.func.name}: no chain after a 1x1 image's kernel "
                                "(qchain.chain_paths)")
        if vector:
            return self._emit_vector(x, wk, x_zp, bias, mult, y_zp, lut, y, batch, c, o)
        if self.tag.attrs.get("oc_lanes"):
            return self._emit_oc_lanes(x, wk, x_zp, bias, mult, y_zp, lut, y)
        if self.tag.attrs.get("winograd"):
            return self._emit_wino(x, wk, x_zp, bias, mult, y_zp, lut, y)
        hp, wpd = h + pt + pb, w + pl + pr
        hq, wq = -(-hp // sh), -(-wpd // sw)
        cp = -(-c // 2)
        # AVX-512 VNNI (int8 weights): planes of uint8 channel quads and vpdpbusd, else int16
        # channel pairs and vpmaddwd
        vnni = bool(getattr(self, "vnni", False)) and wk.dtype == "int8"
        # weights packed at export as the quad loop reads them, the correction in the bias
        # (ops/qconv_quads.py): no regrouping here
        quads = bool(self.tag.attrs.get("quads", False))
        if quads and (not vnni or self._quad_shift(x.dtype) != self.tag.attrs["shift"]):
            raise LoweringError(f"{self.func.name}: weights packed for another quad kernel")
        cg = -(-c // 4) if vnni else cp                  # channel groups of a plane word
        phases = sorted({(ky % sh, kx % sw) for ky in range(kh) for kx in range(kw)})
        taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
        qn = oh * wq
        # native vpdpbusd on a 512-bit level: tiles of 6 rows x nz 16-pixel vectors (``_zmm``);
        # split weights there are merged back (main + residual: the int8 weights) into the
        # workspace on each call (``_merge_residual``), no residual loops
        merged = split and vnni and self._zmm()
        if merged:
            split = False
        nz = zmm_vectors(qn) if vnni and self._zmm() and not split else 0
        lanes = ZMM_LANES * nz if nz else PANEL * self.nv
        qpad = -(-qn // lanes) * lanes
        offmax = ((kh - 1) // sh) * wq + (kw - 1) // sw
        prow = max(hq, -(-(qpad + offmax) // wq))       # plane rows, reads stay inside
        psz = prow * wq                                  # int32 words per (phase, pair) plane
        steps = len(taps) * cp                           # k-pair steps of the packed weights
        ksteps = len(taps) * cg                          # steps of the kernel's loop
        rows6 = CONV_ROWS
        ot = int(wk.shape[0])
        n_words = ot * steps * rows6
        if quads:
            w_bytes = align_workspace(ot * ksteps * rows6 * 4) if merged else 0
        elif vnni:    # the weights as s8 quads [ot][ksteps][6] words, then sum_c,t w per row
            wsum_at = align_workspace(ot * ksteps * rows6 * 4)
            w_bytes = wsum_at + align_workspace(ot * rows6 * 4)
        else:
            w_bytes = align_workspace(n_words * 4) if wk.dtype == "int8" else 0
        p_bytes = align_workspace(len(phases) * cg * psz * 4)
        # a fused chain on 512-bit tiles whose plane rows are the output's (wq == ow: 1x1
        # windows, stride 1, no padding across): applied in the tile's epilogue, stored
        # straight into the output (``tile_direct``), no staging rows
        direct = (bool(nz) and self.chain is not None and self.float_out and wq == ow
                  and quads and lut is None)
        s_bytes = 0 if direct else align_workspace(o * qpad * (4 if self.float_out else 1))
        # Split over tasks by tiles of output channels when there is work enough: the widened
        # weights and the staging rows are shared (each task writes its own rows), the planes
        # are per task (a task may run ahead to the next image).
        parallel = batch * o * oh * ow * c * kh * kw >= PARALLEL_MIN_MACS
        regions = MAX_TASK_REGIONS if parallel else 1
        workspace = w_bytes + s_bytes + p_bytes * regions
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        mr = self.mr
        full, tail = o // mr, o % mr
        n_tiles = full + (1 if tail else 0)
        lo, hi, region = self._task_span(parallel, regions, n_tiles, task, ntasks)
        xzp = self._zero_points(x_zp, y_zp)
        tile_words = steps * rows6 * 2                      # int16 values per 6-row tile
        if vnni:
            shift = self._quad_shift(x.dtype)
            zpq = b.add(xzp, ir.Constant(I32, shift))    # x's zero point as the planes hold it
            if merged:
                wexp32, wsum = self._merge_residual(ws, buf[wk.uid], res, lo, hi, mr, ot,
                                                    ksteps), None
            elif quads:
                wexp32, wsum = b.bitcast(buf[wk.uid], I32.as_pointer()), None
            else:
                wexp32, wsum = self._vnni_weights(ws, buf[wk.uid], lo, hi, mr, ot, len(taps),
                                                  cp, cg, steps, ksteps, wsum_at)
        elif w_bytes:   # int8 weights (the bundle's) widened to int16, this task's tiles
            wexp = b.bitcast(ws, I16.as_pointer())
            # 6-row tiles of the packed weights are mr-row tiles' groups (mr divides 6)
            g_lo = b.sdiv(b.mul(lo, const_i64(mr)), const_i64(rows6))
            g_hi = b.sdiv(b.add(b.mul(hi, const_i64(mr)), const_i64(rows6 - 1)),
                          const_i64(rows6))
            with for_range(b, b.mul(g_lo, const_i64(tile_words)),
                           b.mul(g_hi, const_i64(tile_words)), "we") as i:
                b.store(b.sext(b.load(b.gep(buf[wk.uid], [i])), I16), b.gep(wexp, [i]))
            wexp32 = b.bitcast(ws, I32.as_pointer())
        else:
            wexp32 = b.bitcast(buf[wk.uid], I32.as_pointer())
        stage = b.bitcast(b.gep(ws, [const_i64(w_bytes)]),              # [o][qpad] results
                          self.out_ty.as_pointer())
        planes = b.bitcast(b.gep(ws, [b.add(const_i64(w_bytes + s_bytes),
                                            b.mul(region, const_i64(p_bytes)))]),
                           I16.as_pointer())
        planes32 = b.bitcast(planes, I32.as_pointer())
        # step j = t * cg + p reads plane (phase(t), p) at offset off(t): a table of word
        # offsets into the planes
        table = [(phases.index((ky % sh, kx % sw)) * cg + p) * psz + (ky // sh) * wq + kx // sw
                 for ky, kx in taps for p in range(cg)]
        tbl_ty = ir.ArrayType(I64, len(table))
        gv = ir.GlobalVariable(self.module, tbl_ty, name=f"{self.symbol}.steps")
        gv.global_constant = True
        gv.linkage = "internal"
        gv.initializer = ir.Constant(tbl_ty, table)
        with for_range(b, const_i64(0), const_i64(batch), "b") as bi:
            xb = b.gep(buf[x.uid], [b.mul(bi, const_i64(c * h * w))])
            yb = b.gep(buf[y.uid], [b.mul(bi, const_i64(o * oh * ow))])
            if vnni:
                self._fill_quads(xb, b.bitcast(planes, I8.as_pointer()), phases, c, h, w, cg,
                                 prow, wq, psz, sh, sw, pt, pl, zpq, shift,
                                 zero=any(self.tag.attrs["padding"]))
            else:
                self._fill_planes(xb, planes, phases, c, h, w, cp, prow, wq, psz, sh, sw, pt,
                                  pl, xzp, x.dtype,
                                  zero=any(self.tag.attrs["padding"]) or c % 2 == 1)

            def a_word_at(oc0):
                # word ((oc // 6) * steps + j) * 6 + oc % 6; a tile never crosses a 6-row group
                base = b.add(b.mul(b.sdiv(oc0, const_i64(rows6)), const_i64(ksteps * rows6)),
                             b.srem(oc0, const_i64(rows6)))

                def a_word(r, j):
                    return b.load(b.gep(wexp32, [b.add(b.add(base, const_i64(r)),
                                                       b.mul(j, const_i64(rows6)))]))
                return a_word

            def b_vec_at(q0):
                def b_vec(v, j):
                    off = b.load(b.gep(gv, [const_i64(0), j]))
                    p = b.add(b.add(off, q0), const_i64(v * PANEL))
                    return b.load(self._ptr(planes32, p, V16I16), align=4)

                def b_vec16(v, j):     # 16 pixels' quads (``nz``)
                    off = b.load(b.gep(gv, [const_i64(0), j]))
                    p = b.add(b.add(off, q0), const_i64(v * ZMM_LANES))
                    return b.load(self._ptr(planes32, p, V16I32), align=4)
                return b_vec16 if nz else b_vec

            def dp_tile(nrows, q0, oc0, init, whole: bool = False):
                """The quad tile's accumulators, as 8-lane vectors per row (``nz``: each
                16-lane one's halves, in pixel order; ``whole``: the 16-lane ones)."""
                if not nz:
                    return self._tile_dp(nrows, self.nv, ksteps, a_word_at(oc0), b_vec_at(q0),
                                         residual(nrows, init, q0, oc0))
                init16 = None if init is None else [self._widen_splat(v) for v in init]
                accs = self._tile_dp16(nrows, nz, ksteps, a_word_at(oc0), b_vec_at(q0),
                                       init16)
                if whole:
                    return accs
                return [[h for a in row for h in self._halves(a)] for row in accs]

            def residual(nrows, init, q0, oc0):
                """The split weights' residual (``split``): per row of the tile, a loop over
                its listed words e, each its step's plane vectors against one word, from
                ``init`` (per row, else zero); the main loop starts from its sums (run first,
                the main loop's 12 accumulators keep their registers). Without ``split``,
                ``init``."""
                if not split:
                    return init
                zero = ir.Constant(V8I32, None)
                accs = [[zero if init is None else init[r]] * self.nv for r in range(nrows)]
                index = buf[res[0].uid]
                words = b.bitcast(buf[res[1].uid], I32.as_pointer())
                first = const_i64(ot * rows6 + 1)     # the words' steps follow the pointers

                def b_vec(v, e):
                    j = b.sext(b.load(b.gep(index, [b.add(e, first)])), I64)
                    return b_vec_at(q0)(v, j)
                out = []
                for r, row in enumerate(accs):
                    ocr = b.add(oc0, const_i64(r))
                    e_lo = b.sext(b.load(b.gep(index, [ocr])), I64)
                    e_hi = b.sext(b.load(b.gep(index, [b.add(ocr, const_i64(1))])), I64)
                    out.append(self._row_dp(row, e_lo, e_hi,
                                            lambda e: b.load(b.gep(words, [e])), b_vec))
                return out

            def tile(q0, oc0, nrows):
                if direct:
                    return tile_direct(q0, oc0, nrows)
                if packed:
                    return tile_packed(q0, oc0, nrows)
                if vnni:
                    accs = dp_tile(nrows, q0, oc0, None)
                else:
                    accs = self._tile(nrows, self.nv, steps, a_word_at(oc0), b_vec_at(q0))
                for r in range(nrows):
                    ocr = b.add(oc0, const_i64(r))
                    if vnni and wsum is not None:
                        # sum (x_q - zp') w = sum (x - x_zp) w + zp' sum w (wrapping)
                        corr = self._splat(b.mul(zpq, b.load(b.gep(wsum, [ocr]))), V8I32)
                        accs[r] = [b.sub(a, corr) for a in accs[r]]
                    bv = self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V8I32)
                    mv = self._splat(b.load(buf[mult.uid] if tuple(mult.shape) == ()
                                            else b.gep(buf[mult.uid], [ocr])), V8F32)
                    ov = (self._splat(b.load(b.gep(buf[y_zp.uid], [ocr])), V8F32)
                          if self.float_out else None)
                    for v in range(len(accs[r])):
                        q = self._requant(accs[r][v], bv, mv, ov)
                        dst = b.add(b.mul(ocr, const_i64(qpad)), b.add(q0, const_i64(v * PANEL)))
                        b.store(q, self._ptr(stage, dst, self.out_vec), align=4)

            def tile_packed(q0, oc0, nrows):
                """AVX2, 8-bit result: the accumulators start from the bias (less the VNNI
                zero-point correction), the epilogue rounds with vcvtps2dq, adds the zero
                point in int32 and packs the row's two vectors into 16 bytes with saturating
                packs (``_requant_int``, ``_pack``): per row 11 vector operations fewer than
                ``_requant``'s twice, the same bytes."""
                ocs = [b.add(oc0, const_i64(r)) for r in range(nrows)]
                init = []
                for ocr in ocs:
                    start = b.load(b.gep(buf[bias.uid], [ocr]))
                    if vnni and wsum is not None:   # zp' sum w (wrapping); quads: in the bias
                        start = b.sub(start, b.mul(zpq, b.load(b.gep(wsum, [ocr]))))
                    init.append(self._splat(start, V8I32))
                if vnni:
                    accs = dp_tile(nrows, q0, oc0, init, whole=bool(nz))
                else:
                    accs = self._tile(nrows, self.nv, steps, a_word_at(oc0), b_vec_at(q0), init)
                if nz:      # 512-bit: each 16 pixels' bytes by ``_requant_zmm``
                    for r, ocr in enumerate(ocs):
                        m = b.load(buf[mult.uid] if tuple(mult.shape) == ()
                                   else b.gep(buf[mult.uid], [ocr]))
                        dst = b.add(b.mul(ocr, const_i64(qpad)), q0)
                        for v, a in enumerate(accs[r]):
                            at = b.add(dst, const_i64(v * ZMM_LANES)) if v else dst
                            b.store(self._requant_zmm(a, m), self._ptr(stage, at, V16I8),
                                    align=4)
                    return
                for r, ocr in enumerate(ocs):
                    mv = self._splat(b.load(buf[mult.uid] if tuple(mult.shape) == ()
                                            else b.gep(buf[mult.uid], [ocr])), V8F32)
                    wide = [self._requant_int(b.fmul(b.sitofp(a, V8F32), mv), None, True)
                            for a in accs[r]]
                    dst = b.add(b.mul(ocr, const_i64(qpad)), q0)
                    # 4 vectors (32 bytes) a store, the last 2 (16 bytes) where left
                    for g in range(0, len(wide), 4):
                        part = wide[g:g + 4]
                        ty = V16I8 if len(part) == 2 else ir.VectorType(I8, 4 * PANEL)
                        at = b.add(dst, const_i64(g * PANEL)) if g else dst
                        b.store(self._pack(part), self._ptr(stage, at, ty), align=4)

            def tile_direct(q0, oc0, nrows):
                """512-bit, a fused chain, plane rows that are the output's (``direct``): each
                16-pixel accumulator's epilogue (float32(acc + bias) * mult + y's offset
                [relu]) and chain (``chain_vector``) on its 16 lanes as the tile ends, the
                chain's result stored straight into the output (no float32 staging rows
                written and read back by the copy out); the lanes past the image's last
                pixel (``qpad`` > ``qn``) through a copy."""
                accs = dp_tile(nrows, q0, oc0, None, whole=True)
                for r in range(nrows):
                    ocr = b.add(oc0, const_i64(r))
                    self._chain_row(accs[r], ocr, bias, lambda ocr=ocr: b.load(
                        buf[mult.uid] if tuple(mult.shape) == () else b.gep(buf[mult.uid],
                                                                            [ocr])),
                                    y_zp, yb, const_i64(qn), q0,
                                    None if qpad == qn else const_i64(qn))

            packed = self.avx2 and not self.float_out and self.nv == 2
            # pixels outer: one chunk's plane columns (all steps) stay in L1 for every tile
            with for_range(b, const_i64(0), const_i64(qpad // lanes), "qc") as qc:
                q0 = b.mul(qc, const_i64(lanes))
                with for_range(b, lo, hi, "ot") as t:
                    oc0 = b.mul(t, const_i64(mr))
                    if tail:
                        with b.if_else(b.icmp_signed("<", t, const_i64(full))) as (whole, part):
                            with whole:
                                tile(q0, oc0, mr)
                            with part:
                                tile(q0, oc0, tail)
                    else:
                        tile(q0, oc0, mr)
            if not direct:      # else the tiles stored the output
                # compact this task's rows of ow out of the staging rows of wq
                oc_hi = b.mul(hi, const_i64(mr))
                oc_hi = b.select(b.icmp_signed("<", oc_hi, const_i64(o)), oc_hi, const_i64(o))
                # rows of ow, or whole channels where the staging rows are the output's (wq == ow)
                per, n = (1, oh * ow) if wq == ow else (oh, ow)
                with for_range(b, b.mul(b.mul(lo, const_i64(mr)), const_i64(per)),
                               b.mul(oc_hi, const_i64(per)), "cr") as r:
                    oc = b.sdiv(r, const_i64(per))
                    oy = b.srem(r, const_i64(per))
                    src = b.gep(stage, [b.add(b.mul(oc, const_i64(qpad)), b.mul(oy, const_i64(wq)))])
                    dst = b.gep(yb, [b.mul(r, const_i64(n))])
                    # a lut8 folded in (passes/quantize_lut.py): the row's table
                    tb = None if lut is None else b.gep(buf[lut.uid], [
                        b.mul(oc, const_i64(256)) if int(lut.shape[0]) != 1 else const_i64(0)])
                    if self.chain is not None:   # the fused chain (codegen/qchain.py)
                        self.chain_copy(src, dst, n, oc)
                    elif tb is None:
                        with for_range(b, const_i64(0), const_i64(n), "cx") as i:
                            b.store(b.load(b.gep(src, [i])), b.gep(dst, [i]))
                    elif self.avx2 and n >= 32:
                        self._lut_bytes(src, dst, tb, n)
                    else:
                        with for_range(b, const_i64(0), const_i64(n), "cx") as i:
                            v = b.load(b.gep(src, [i]))
                            idx = (b.add(b.sext(v, I64), const_i64(128)) if self.dtype == "int8"
                                   else b.zext(v, I64))
                            b.store(b.load(b.gep(tb, [idx])), b.gep(dst, [i]))
        info = self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)
        if nz:      # `mlcpack inspect`: which quad kernel (the 256-bit ones keep the rule's row)
            return replace(info, choice=f"integer quad convolution, vpdpbusd on 512-bit "
                                        f"vectors, pixel lanes: 6 x {ZMM_LANES * nz} tile")
        return info

    def _emit_open(self) -> KernelInfo:
        """``emit``'s pixel-lane quad kernel (weights packed as quads at export, with a split's
        residual loops and a folded lut8 table) with run-time image sizes: the batch, the
        image's and the output's height and width are read from the sizes, and the plan that
        depends on them (plane width ``wq``, plane rows, the padded pixel count ``qpad``, the
        step table's word offsets, the workspace's regions) is computed at the kernel's entry
        by ``emit``'s rules; the workspace is a size expression that bounds it. The planes'
        windows inside the image and their vector fills are counted at run time
        (``_fill_quads_open``); the tiles, their epilogue and the copy out are ``emit``'s."""
        x, wk, x_zp, bias, mult, y_zp = self.func.inputs[:6]
        split = bool(self.tag.attrs.get("split", False))
        res = self.func.inputs[6:8] if split else ()
        n_in = 8 if split else 6
        # the op's own arguments (an elementwise chain's follow them: codegen/qchain.py)
        lut = self.func.inputs[n_in] if len(self.tag.operands) > n_in else None
        y = self.func.outputs[0]
        if (not self.takes_open(self.func, self.tag) or not getattr(self, "vnni", False)
                or self._quad_shift(x.dtype) != self.tag.attrs["shift"]):
            raise LoweringError(f"{self.func.name}: run-time image sizes need the quad "
                                "kernel's weights")
        n_dim, c, h_dim, w_dim = x.shape
        c = int(c)
        o = int(self.tag.attrs["out_channels"])
        kh, kw = self.tag.attrs["kernel"]
        _, _, oh_dim, ow_dim = y.shape
        sh, sw = self.tag.attrs["strides"]
        pt, pl, pb, pr = self.tag.attrs["padding"]
        cg = -(-c // 4)
        phases = sorted({(ky % sh, kx % sw) for ky in range(kh) for kx in range(kw)})
        taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
        # native vpdpbusd on a 512-bit level: emit's 6-row tiles of OPEN_ZMM_VECTORS 16-pixel
        # vectors (the plane's width is not known here), split weights merged back
        nz = OPEN_ZMM_VECTORS if self._zmm() else 0
        merged = split and bool(nz)
        if merged:
            split = False
        lanes = ZMM_LANES * nz if nz else PANEL * self.nv
        rows6 = CONV_ROWS
        ksteps = len(taps) * cg
        ot = int(wk.shape[0])
        esize = 4 if self.float_out else 1
        tbl_bytes = align_workspace(ksteps * 8)
        wm_bytes = align_workspace(ot * ksteps * rows6 * 4) if merged else 0
        whole_rows = (kw, sw, pl + pr) == (1, 1, 0)
        # emit's ``direct``: the chain in the 512-bit tiles' epilogue, stored into the output
        direct = (bool(nz) and self.chain is not None and self.float_out and whole_rows
                  and lut is None)
        # the workspace's bound, a size expression: emit's plan with qpad <= oh * wq + lanes
        # and plane rows x wq <= hq * wq + qpad + offmax + wq, each part aligned
        wq_e = (w_dim + (pl + pr + sw - 1)) // sw
        hq_e = (h_dim + (pt + pb + sh - 1)) // sh
        qpad_e = oh_dim * wq_e + lanes
        psz_e = hq_e * wq_e + qpad_e + wq_e * ((kh - 1) // sh + 1) + (kw - 1) // sw
        # a run-time batch: one image's work decides; a run-time image size: 128 x 128's
        parallel = o * c * kh * kw * OPEN_IMAGE_PIXELS >= PARALLEL_MIN_MACS
        regions = MAX_TASK_REGIONS if parallel else 1
        region_e = psz_e * (len(phases) * cg * 4) + (WORKSPACE_ALIGN + tbl_bytes)
        workspace_e = qpad_e * (o * esize) + WORKSPACE_ALIGN + region_e * regions
        if direct:      # no staging rows
            workspace_e = region_e * regions + (wm_bytes + WORKSPACE_ALIGN)
        elif merged:
            workspace_e = workspace_e + wm_bytes
        body_fn, ptr_types = self._begin_body(self.func.inputs + self.func.outputs, True)
        n_ptrs = len(ptr_types)
        ws = body_fn.args[len(self.func.inputs) + 1]
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        one = const_i64(1)

        def cdiv(v, k: int):
            return b.udiv(b.add(v, const_i64(k - 1)), const_i64(k))

        def aligned(v):
            return b.mul(cdiv(v, WORKSPACE_ALIGN), const_i64(WORKSPACE_ALIGN))

        batch, h, w, oh, ow = (self._dim_value(d) for d in (n_dim, h_dim, w_dim, oh_dim, ow_dim))
        wq = cdiv(b.add(w, const_i64(pl + pr)), sw)
        hq = cdiv(b.add(h, const_i64(pt + pb)), sh)
        qpad = b.mul(cdiv(b.mul(oh, wq), lanes), const_i64(lanes))
        offmax = b.add(b.mul(const_i64((kh - 1) // sh), wq), const_i64((kw - 1) // sw))
        need = b.udiv(b.add(b.add(qpad, offmax), b.sub(wq, one)), wq)   # reads stay inside
        prow = b.select(b.icmp_signed(">", hq, need), hq, need)
        psz = b.mul(prow, wq)
        p_bytes = aligned(b.mul(psz, const_i64(len(phases) * cg * 4)))
        s_bytes = const_i64(0) if direct else aligned(b.mul(qpad, const_i64(o * esize)))
        mr = self.mr
        full, tail = o // mr, o % mr
        n_tiles = full + (1 if tail else 0)
        lo, hi, region = self._task_span(parallel, regions, n_tiles, task, ntasks)
        shift = self._quad_shift(x.dtype)
        zpq = self._zero_points(x_zp, y_zp, shift)
        if merged:      # the merged weights first, shared by the tasks (each its tiles')
            wexp32 = self._merge_residual(ws, buf[wk.uid], res, lo, hi, mr, ot, ksteps)
            ws = b.gep(ws, [const_i64(wm_bytes)])
        else:
            wexp32 = b.bitcast(buf[wk.uid], I32.as_pointer())
        stage = b.bitcast(ws, self.out_ty.as_pointer())               # [o][qpad] results
        planes = b.gep(ws, [b.add(s_bytes, b.mul(region, b.add(p_bytes,
                                                                const_i64(tbl_bytes))))])
        planes32 = b.bitcast(planes, I32.as_pointer())
        # step j = t * cg + p reads word (phase(t) * cg + p) * psz + (ky // sh) * wq + kx // sw:
        # this task's table of them, after its planes
        table = b.bitcast(b.gep(planes, [p_bytes]), I64.as_pointer())
        parts = [k for ky, kx in taps for p in range(cg)
                 for k in (phases.index((ky % sh, kx % sw)) * cg + p, ky // sh, kx // sw)]
        parts_ty = ir.ArrayType(I64, len(parts))
        gv = ir.GlobalVariable(self.module, parts_ty, name=f"{self.symbol}.steps")
        gv.global_constant = True
        gv.linkage = "internal"
        gv.initializer = ir.Constant(parts_ty, parts)
        with for_range(b, const_i64(0), const_i64(ksteps), "st") as j:
            at = b.mul(j, const_i64(3))
            pa, pu, pv = (b.load(b.gep(gv, [const_i64(0), b.add(at, const_i64(k))]))
                          for k in range(3))
            b.store(b.add(b.add(b.mul(pa, psz), b.mul(pu, wq)), pv), b.gep(table, [j]))
        per_channel = tuple(mult.shape) != ()

        def a_word_at(oc0):
            # word ((oc // 6) * steps + j) * 6 + oc % 6; a tile never crosses a 6-row group
            base = b.add(b.mul(b.sdiv(oc0, const_i64(rows6)), const_i64(ksteps * rows6)),
                         b.srem(oc0, const_i64(rows6)))

            def a_word(r, j):
                return b.load(b.gep(wexp32, [b.add(b.add(base, const_i64(r)),
                                                   b.mul(j, const_i64(rows6)))]))
            return a_word

        def b_vec_at(q0):
            def b_vec(v, j):
                p = b.add(b.add(b.load(b.gep(table, [j])), q0), const_i64(v * PANEL))
                return b.load(self._ptr(planes32, p, V16I16), align=4)

            def b_vec16(v, j):     # 16 pixels' quads (``nz``)
                p = b.add(b.add(b.load(b.gep(table, [j])), q0), const_i64(v * ZMM_LANES))
                return b.load(self._ptr(planes32, p, V16I32), align=4)
            return b_vec16 if nz else b_vec

        def residual(nrows, init, q0, oc0):
            """``emit``'s residual loops of a split's words (else ``init``)."""
            if not split:
                return init
            zero = ir.Constant(V8I32, None)
            accs = [[zero if init is None else init[r]] * self.nv for r in range(nrows)]
            index = buf[res[0].uid]
            words = b.bitcast(buf[res[1].uid], I32.as_pointer())
            first = const_i64(ot * rows6 + 1)

            def b_vec(v, e):
                j = b.sext(b.load(b.gep(index, [b.add(e, first)])), I64)
                return b_vec_at(q0)(v, j)
            out = []
            for r, row in enumerate(accs):
                ocr = b.add(oc0, const_i64(r))
                e_lo = b.sext(b.load(b.gep(index, [ocr])), I64)
                e_hi = b.sext(b.load(b.gep(index, [b.add(ocr, one)])), I64)
                out.append(self._row_dp(row, e_lo, e_hi,
                                        lambda e: b.load(b.gep(words, [e])), b_vec))
            return out

        def mult_at(ocr):
            return self._splat(b.load(b.gep(buf[mult.uid], [ocr]) if per_channel
                                      else buf[mult.uid]), V8F32)

        def tile(q0, oc0, nrows):
            ocs = [b.add(oc0, const_i64(r)) for r in range(nrows)]
            if nz:
                return tile_zmm(q0, oc0, ocs)
            if packed:    # emit's tile_packed: from the bias, vcvtps2dq and saturating packs
                init = [self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V8I32) for ocr in ocs]
                accs = self._tile_dp(nrows, self.nv, ksteps, a_word_at(oc0), b_vec_at(q0),
                                     residual(nrows, init, q0, oc0))
                for r, ocr in enumerate(ocs):
                    mv = mult_at(ocr)
                    wide = [self._requant_int(b.fmul(b.sitofp(a, V8F32), mv), None, True)
                            for a in accs[r]]
                    dst = b.add(b.mul(ocr, qpad), q0)
                    b.store(self._pack(wide), self._ptr(stage, dst, V16I8), align=4)
                return
            accs = self._tile_dp(nrows, self.nv, ksteps, a_word_at(oc0), b_vec_at(q0),
                                 residual(nrows, None, q0, oc0))
            for r, ocr in enumerate(ocs):
                bv = self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V8I32)
                mv = mult_at(ocr)
                ov = (self._splat(b.load(b.gep(buf[y_zp.uid], [ocr])), V8F32)
                      if self.float_out else None)
                for v in range(self.nv):
                    q = self._requant(accs[r][v], bv, mv, ov)
                    dst = b.add(b.mul(ocr, qpad), b.add(q0, const_i64(v * PANEL)))
                    b.store(q, self._ptr(stage, dst, self.out_vec), align=4)

        def tile_zmm(q0, oc0, ocs):
            """emit's 512-bit tiles: the chain stored into the output (``direct``), 8-bit
            results by ``_requant_zmm`` from the bias, else float32 results staged."""
            nrows = len(ocs)
            if direct or self.float_out:
                accs = self._tile_dp16(nrows, nz, ksteps, a_word_at(oc0), b_vec_at(q0))
            else:
                init = [self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V16I32)
                        for ocr in ocs]
                accs = self._tile_dp16(nrows, nz, ksteps, a_word_at(oc0), b_vec_at(q0), init)
            for r, ocr in enumerate(ocs):
                m = b.load(b.gep(buf[mult.uid], [ocr]) if per_channel else buf[mult.uid])
                if not self.float_out:
                    dst = b.add(b.mul(ocr, qpad), q0)
                    for v, a in enumerate(accs[r]):
                        at = b.add(dst, const_i64(v * ZMM_LANES)) if v else dst
                        b.store(self._requant_zmm(a, m), self._ptr(stage, at, V16I8), align=4)
                    continue
                if not direct:
                    bv = self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V8I32)
                    ov = self._splat(b.load(b.gep(buf[y_zp.uid], [ocr])), V8F32)
                    halves = [hv for a in accs[r] for hv in self._halves(a)]
                    for v, a in enumerate(halves):
                        q = self._requant(a, bv, self._splat(m, V8F32), ov)
                        dst = b.add(b.mul(ocr, qpad), b.add(q0, const_i64(v * PANEL)))
                        b.store(q, self._ptr(stage, dst, self.out_vec), align=4)
                    continue
                self._chain_row(accs[r], ocr, bias, lambda m=m: m, y_zp, yb, ohw, q0, ohw)

        packed = self.avx2 and not self.float_out and self.nv == 2
        chw = b.mul(b.mul(h, w), const_i64(c))
        ohw = b.mul(oh, ow)
        with for_range(b, const_i64(0), batch, "b") as bi:
            xb = b.gep(buf[x.uid], [b.mul(bi, chw)])
            yb = b.gep(buf[y.uid], [b.mul(bi, b.mul(ohw, const_i64(o)))])
            self._fill_quads_open(xb, planes, phases, c, h, w, cg, prow, wq, psz, sh, sw,
                                  pt, pl, zpq, shift, zero=any(self.tag.attrs["padding"]))
            with for_range(b, const_i64(0), b.udiv(qpad, const_i64(lanes)), "qc") as qc:
                q0 = b.mul(qc, const_i64(lanes))
                with for_range(b, lo, hi, "ot") as t:
                    oc0 = b.mul(t, const_i64(mr))
                    if tail:
                        with b.if_else(b.icmp_signed("<", t, const_i64(full))) as (whole, part):
                            with whole:
                                tile(q0, oc0, mr)
                            with part:
                                tile(q0, oc0, tail)
                    else:
                        tile(q0, oc0, mr)
            if not direct:      # else the tiles stored the output
                # this task's rows of ow out of the staging rows of wq, or whole channels where
                # the staging rows are the output's (wq == ow: 1 x 1 windows, stride 1, no padding)
                oc_hi = b.mul(hi, const_i64(mr))
                oc_hi = b.select(b.icmp_signed("<", oc_hi, const_i64(o)), oc_hi, const_i64(o))
                per, n = (one, ohw) if whole_rows else (oh, ow)
                with for_range(b, b.mul(b.mul(lo, const_i64(mr)), per), b.mul(oc_hi, per),
                               "cr") as r:
                    oc = b.udiv(r, per)
                    oy = b.sub(r, b.mul(oc, per))
                    src = b.gep(stage, [b.add(b.mul(oc, qpad), b.mul(oy, wq))])
                    dst = b.gep(yb, [b.mul(r, n)])
                    tb = None if lut is None else b.gep(buf[lut.uid], [
                        b.mul(oc, const_i64(256)) if int(lut.shape[0]) != 1 else const_i64(0)])
                    if self.chain is not None:   # the fused chain (codegen/qchain.py)
                        self.chain_copy(src, dst, n, oc)
                    elif tb is None:
                        with for_range(b, const_i64(0), n, "cx") as i:
                            b.store(b.load(b.gep(src, [i])), b.gep(dst, [i]))
                    else:
                        self._lut_open(src, dst, tb, n)
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        choice = "integer quad convolution, pixel lanes, planes sized at run time"
        if nz:
            choice = (f"integer quad convolution, vpdpbusd on 512-bit vectors, pixel lanes: "
                      f"6 x {ZMM_LANES * nz} tile, planes sized at run time")
        return KernelInfo(self.symbol, len(self.func.inputs), 1, 0, parallel, symbolic=True,
                          workspace_expr=workspace_e, choice=choice)

    def _chain_row(self, accs: list[ir.Value], ocr: ir.Value, bias: te.Tensor, mult_of,
                   y_zp: te.Tensor, y: ir.Value, stride: ir.Value, q0: ir.Value, n) -> None:
        """A 512-bit tile row's epilogue stored into the output (``direct``, static and
        run-time sizes): float32(acc + bias) * mult + y's offset [relu] on each 16-pixel
        accumulator of output channel ``ocr``, the fused chain (``chain_vector``), then
        ``_store_row`` into the channel's row ``y + ocr * stride`` from ``q0``, below ``n``.
        ``mult_of()`` loads the multiplier (after the bias, as the kernels always did)."""
        b, buf = self.builder, self.buffers
        v16f = ir.VectorType(F32, ZMM_LANES)
        bv = self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V16I32)
        mv = self._splat(mult_of(), v16f)
        ov = self._splat(b.load(b.gep(buf[y_zp.uid], [ocr])), v16f)
        row = b.gep(y, [b.mul(ocr, stride)])
        vals = []
        for a in accs:
            f = b.fadd(b.fmul(b.sitofp(b.add(a, bv), v16f), mv), ov)
            if self.relu:
                zero = ir.Constant(v16f, None)
                f = b.select(b.fcmp_ordered(">", f, zero), f, zero)
            vals.append(self.chain_vector(f, ocr))
        self._store_row(vals, row, q0, n)

    def _store_row(self, vals: list[ir.Value], row: ir.Value, q0: ir.Value, n) -> None:
        """row[q0 + 16 v + k] = vals[v][k] (16-lane vectors) where below ``n`` (an i64; None:
        all): masked stores (AVX-512: vmovdqu8 / vmovups under a k mask), no branch (a branch
        around the stores made LLVM spill an accumulator of the tile's loop: 195 against 136
        us on a 240-channel 1x1 at 12x80)."""
        b = self.builder
        if n is None:
            for v, val in enumerate(vals):
                at = b.add(q0, const_i64(v * ZMM_LANES)) if v else q0
                b.store(val, self._ptr(row, at, val.type), align=1)
            return
        i1 = ir.IntType(1)
        v16i32 = ir.VectorType(I32, ZMM_LANES)
        left = b.trunc(b.sub(n, q0), I32)          # lanes of this row still inside
        for v, val in enumerate(vals):
            iota = ir.Constant(v16i32, list(range(v * ZMM_LANES, (v + 1) * ZMM_LANES)))
            mask = b.icmp_signed("<", iota, self._splat(left, v16i32))
            kind = "f32" if val.type.element == F32 else "i8"
            store = intrinsic(self.module, f"llvm.masked.store.v{ZMM_LANES}{kind}.p0",
                              ir.VoidType(), [val.type, val.type.as_pointer(), I32,
                                              ir.VectorType(i1, ZMM_LANES)])
            at = b.add(q0, const_i64(v * ZMM_LANES)) if v else q0
            b.call(store, [val, self._ptr(row, at, val.type), ir.Constant(I32, 1), mask])

    def _lut_open(self, src, dst, tb, n) -> None:
        """dst[i] = tb[src[i]] for i < n (a run-time count): ``_lut_bytes``' 32-byte chunks
        on AVX2 where n >= 32 (the last overlapping), else byte by byte."""
        b = self.builder
        signed = self.dtype == "int8"

        def bytewise():
            with for_range(b, const_i64(0), n, "cx") as i:
                v = b.load(b.gep(src, [i]))
                idx = b.add(b.sext(v, I64), const_i64(128)) if signed else b.zext(v, I64)
                b.store(b.load(b.gep(tb, [idx])), b.gep(dst, [i]))
        if not self.avx2:
            bytewise()
            return
        cols = self.tag.attrs.get("table_cols")
        if cols is None:
            chunk = lambda at: self._lut_chunk(src, dst, tb, at, signed)  # noqa: E731
        else:   # the columns that differ (passes/quantize_lut.py): clamped, their chunks
            v32i8 = ir.VectorType(I8, 32)
            lo_v = ir.Constant(v32i8, [cols[0]] * 32)
            hi_v = ir.Constant(v32i8, [cols[1]] * 32)

            def chunk(at) -> None:
                v = b.load(self._ptr(src, at, v32i8), align=1)
                if signed:
                    v = b.xor(v, ir.Constant(v32i8, [0x80] * 32))
                v = b.select(b.icmp_unsigned("<", v, lo_v), lo_v, v)
                v = b.select(b.icmp_unsigned(">", v, hi_v), hi_v, v)
                b.store(self._lookup_cols(v, tb, cols, False), self._ptr(dst, at, v32i8),
                        align=1)
        with b.if_else(b.icmp_signed(">=", n, const_i64(32))) as (wide, short):
            with wide:
                with for_range(b, const_i64(0), b.udiv(n, const_i64(32)), "lx") as i:
                    chunk(b.mul(i, const_i64(32)))
                chunk(b.sub(n, const_i64(32)))
            with short:
                bytewise()

    def _fill_quads_open(self, xb, planes, phases, c: int, h, w, cg: int, prow, wq, psz,
                         sh: int, sw: int, pt: int, pl: int, zpq, shift: int,
                         zero: bool) -> None:
        """``_fill_quads`` with run-time sizes (``h``, ``w``, ``prow``, ``wq``, ``psz``
        values): each phase's window inside the image, and on AVX2 its columns filled 8 at a
        time (``_fill_quad_vectors``), counted at run time."""
        b = self.builder

        def vmin(p, q):
            return b.select(b.icmp_signed("<", p, q), p, q)

        if zero:
            self._fill_zero_point(planes, b.mul(psz, const_i64(len(phases) * cg * 4)), zpq)
        hw = b.mul(h, w)
        for pi, (py, px) in enumerate(phases):
            u_lo = max(0, -(-(pt - py) // sh))
            v_lo = max(0, -(-(pl - px) // sw))
            # floor((h + pt - py - 1) / sh) + 1, the numerator + sh >= 0
            u_hi = vmin(prow, b.udiv(b.add(h, const_i64(pt - py - 1 + sh)), const_i64(sh)))
            v_hi = vmin(wq, b.udiv(b.add(w, const_i64(pl - px - 1 + sw)), const_i64(sw)))
            dx = px - pl
            nvec = None
            if self.avx2:
                span = b.sub(v_hi, const_i64(v_lo))
                by_cols = b.select(b.icmp_signed(">", span, const_i64(0)),
                                   b.udiv(span, const_i64(PANEL)), const_i64(0))
                room = b.sub(w, const_i64(v_lo * sw + dx))
                by_row = b.select(b.icmp_signed(">", room, const_i64(0)),
                                  b.udiv(room, const_i64(PANEL * sw)), const_i64(0))
                nvec = vmin(by_cols, by_row)
            v_rest = const_i64(v_lo) if nvec is None else \
                b.add(const_i64(v_lo), b.mul(nvec, const_i64(PANEL)))
            for q_lo, q_hi, chans in ((0, c // 4, 4), (c // 4, cg, c % 4)):
                if q_hi <= q_lo:
                    continue
                with for_range(b, const_i64(q_lo), const_i64(q_hi), "fq") as q:
                    base = b.mul(b.add(const_i64(pi * cg), q), b.mul(psz, const_i64(4)))
                    with for_range(b, const_i64(u_lo), u_hi, "fu") as u:
                        iy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
                        row = b.add(base, b.mul(u, b.mul(wq, const_i64(4))))
                        if nvec is not None:
                            self._fill_quad_vectors(xb, planes, q, chans, iy, row, v_lo, nvec,
                                                    h, w, sw, dx, shift)
                        with for_range(b, v_rest, v_hi, "fv") as v:
                            ix = b.add(b.mul(v, const_i64(sw)), const_i64(dx))
                            dst = b.add(row, b.mul(v, const_i64(4)))
                            for j in range(chans):
                                ch = b.add(b.mul(q, const_i64(4)), const_i64(j))
                                src = b.add(b.mul(ch, hw), b.add(b.mul(iy, w), ix))
                                val = b.load(b.gep(xb, [src]))
                                if shift:
                                    val = b.xor(val, ir.Constant(I8, 0x80))
                                b.store(val, b.gep(planes, [b.add(dst, const_i64(j))]))

    def _emit_oc_lanes(self, x, wk, x_zp, bias, mult, y_zp, lut, y) -> KernelInfo:
        """The quad kernel with output channels on the lanes, for small output planes
        (``oc_lanes``: passes/quad_weights.py ``use_oc_lanes``; weights [O / 16][steps][16][4],
        ops/qconv_quads.py). The planes hold the pixel-lane kernel's quads pixel-major
        (``_fill_pixel_quads``: a pixel's channel quads in a row, so that every stream of the
        loop is sequential; channel-major, ResNet-18's 7x7 layers ran 1.8x slower), and a
        register tile is 6 output pixels (3 on the generic targets) x 16 output channels: per
        step one pixel's channel quad is broadcast (a word of the planes) against two vectors of
        8 output channels' quads, so only outputs are computed (the pixel-lane kernel computes
        whole plane rows: 64 lanes for a 7x7 output's 49 pixels, 224 for 14x14's 196). The n
        outputs of a channel are split into ceil(n / 6) tiles of 6 or 5 (49: 4 x 6 + 5 x 5);
        tiles of 16 channels outer (their 64 bytes a step stay in L2 for every pixel tile),
        split over tasks. The epilogue rounds each 16-channel row as ``tile_packed`` does into a
        pixel-major staging buffer [n][O] (float32 results: with y's offset, as ``tile``),
        transposed into the output by 16 x 16 byte or 8 x 8 float blocks
        (``_transpose_block``), or byte by byte through the lut8 table when one is folded in."""
        rows = 16
        batch, c, h, w = (int(d) for d in x.shape)
        o = int(self.tag.attrs["out_channels"])
        kh, kw = self.tag.attrs["kernel"]
        _, _, oh, ow = (int(d) for d in y.shape)
        sh, sw = self.tag.attrs["strides"]
        pt, pl, pb, pr = self.tag.attrs["padding"]
        if (o % rows or not self.tag.attrs.get("quads") or not getattr(self, "vnni", False)
                or self._quad_shift(x.dtype) != self.tag.attrs["shift"]):
            raise LoweringError(f"{self.func.name}: channel-lane quads need a quad kernel "
                                f"and output channels a multiple of {rows}")
        hq, wq = -(-(h + pt + pb) // sh), -(-(w + pl + pr) // sw)
        cg = -(-c // 4)
        phases = sorted({(ky % sh, kx % sw) for ky in range(kh) for kx in range(kw)})
        taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
        n = oh * ow
        offmax = ((kh - 1) // sh) * wq + (kw - 1) // sw
        prow = max(hq, -(-((oh - 1) * wq + ow + offmax) // wq))   # reads stay inside
        psz = prow * wq
        ksteps = len(taps) * cg
        ot = o // rows
        mr = self.mr
        n_tiles = -(-n // mr)
        small, extra = divmod(n, n_tiles)       # `extra` tiles of small + 1, then of small
        # native 512-bit vpdpbusd: a tile is 6 pixels x gz weight tiles of 16 output channels
        # (one zmm each, up to 24 accumulators), the groups of gz tiles split over tasks
        gz = next((g for g in (4, 3, 2) if ot % g == 0), 1) if self._zmm() else 1
        p_bytes = align_workspace(len(phases) * cg * psz * 4)
        # the staging rows hold what is stored: a fused chain's result (codegen/qchain.py)
        s_ty = STORAGE_TYPES[self.chain.out.dtype] if self.chain is not None else self.out_ty
        esize = 4 if s_ty == F32 else 1
        s_bytes = align_workspace(n * o * esize)
        parallel = batch * o * n * c * kh * kw >= PARALLEL_MIN_MACS
        regions = MAX_TASK_REGIONS if parallel else 1
        workspace = s_bytes + p_bytes * regions
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        glo, ghi, region = self._task_span(parallel, regions, ot // gz, task, ntasks)
        lo, hi = ((glo, ghi) if gz == 1 else
                  (b.mul(glo, const_i64(gz)), b.mul(ghi, const_i64(gz))))   # weight tiles
        shift = self._quad_shift(x.dtype)
        zpq = self._zero_points(x_zp, y_zp, shift)
        w32 = b.bitcast(buf[wk.uid], I32.as_pointer())
        stage = b.bitcast(ws, s_ty.as_pointer())                    # [n][o] results
        planes = b.gep(ws, [b.add(const_i64(s_bytes), b.mul(region, const_i64(p_bytes)))])
        planes32 = b.bitcast(planes, I32.as_pointer())
        # pixel-major planes [phase][u][v][quad]: step j = t * cg + q reads word
        # (pixel + off(t)) * cg + q, so each pixel's steps walk its quads in order
        table = [(phases.index((ky % sh, kx % sw)) * psz + (ky // sh) * wq + kx // sw) * cg + p
                 for ky, kx in taps for p in range(cg)]
        tbl_ty = ir.ArrayType(I64, len(table))
        gv = ir.GlobalVariable(self.module, tbl_ty, name=f"{self.symbol}.steps")
        gv.global_constant = True
        gv.linkage = "internal"
        gv.initializer = ir.Constant(tbl_ty, table)
        v32i8 = ir.VectorType(I8, 32)
        per_channel = tuple(mult.shape) != ()

        def positions(i0, size: int) -> list:
            pos = []
            for r in range(size):
                i = b.add(i0, const_i64(r))
                cell = b.add(b.mul(b.sdiv(i, const_i64(ow)), const_i64(wq)),
                             b.srem(i, const_i64(ow)))
                pos.append(b.mul(cell, const_i64(cg)))
            return pos

        def tile(oc0, wbase, i0, size: int) -> None:
            if gz > 1 or self._zmm():
                return tile_zmm(oc0, wbase, i0, size)
            pos = positions(i0, size)
            bvs = [b.load(self._ptr(buf[bias.uid], b.add(oc0, const_i64(8 * v)), V8I32),
                          align=4) for v in range(2)]
            accs = [[alloca_once(b, V8I32, f"cacc{r}_{v}") for v in range(2)]
                    for r in range(size)]
            for row in accs:
                for v, a in enumerate(row):
                    b.store(bvs[v], a)
            with for_range(b, const_i64(0), const_i64(ksteps), "kc") as j:
                off = b.load(b.gep(gv, [const_i64(0), j]))
                at = b.add(wbase, b.mul(j, const_i64(rows)))
                wv = [b.bitcast(b.load(self._ptr(w32, b.add(at, const_i64(8 * v)), V8I32),
                                       align=4), v32i8) for v in range(2)]
                for r in range(size):
                    word = b.load(b.gep(planes32, [b.add(off, pos[r])]))
                    a = b.bitcast(self._splat(word, V8I32), v32i8)
                    for v in range(2):
                        b.store(self._dpbusd(b.load(accs[r][v]), a, wv[v]), accs[r][v])
            finish(oc0, i0, size, [[b.load(a) for a in row] for row in accs])

        def tile_zmm(oc0, wbase, i0, size: int) -> None:
            """``tile`` on 512-bit vectors: ``size`` pixels x ``gz`` weight tiles of 16 output
            channels (oc0, oc0 + 16, ..; their weights ksteps * 16 words apart), one zmm
            accumulator each, from the bias; ``finish`` per weight tile on the halves."""
            v64i8 = ir.VectorType(I8, 64)
            dp = intrinsic(self.module, "llvm.x86.avx512.vpdpbusd.512", V16I32,
                           [V16I32, v64i8, v64i8])
            pos = positions(i0, size)
            bvs = [b.load(self._ptr(buf[bias.uid], b.add(oc0, const_i64(rows * g)), V16I32),
                          align=4) for g in range(gz)]
            accs = [[alloca_once(b, V16I32, f"zcacc{r}_{g}") for g in range(gz)]
                    for r in range(size)]
            for row in accs:
                for g, a in enumerate(row):
                    b.store(bvs[g], a)
            with for_range(b, const_i64(0), const_i64(ksteps), "kz") as j:
                off = b.load(b.gep(gv, [const_i64(0), j]))
                at = b.add(wbase, b.mul(j, const_i64(rows)))
                wv = [b.bitcast(b.load(self._ptr(w32, b.add(at, const_i64(g * ksteps * rows)),
                                                 V16I32), align=4), v64i8) for g in range(gz)]
                for r in range(size):
                    word = b.load(b.gep(planes32, [b.add(off, pos[r])]))
                    a = b.bitcast(self._splat(word, V16I32), v64i8)
                    for g in range(gz):
                        b.store(b.call(dp, [b.load(accs[r][g]), a, wv[g]]), accs[r][g])
            for g in range(gz):
                ocg = b.add(oc0, const_i64(rows * g))
                if self.float_out or not self.avx2:
                    finish(ocg, i0, size, [self._halves(b.load(row[g])) for row in accs])
                    continue
                # 8-bit results: ``_requant_zmm`` on the 16 channels' vector
                m = (b.load(self._ptr(buf[mult.uid], ocg, ir.VectorType(F32, 16)), align=4)
                     if per_channel else b.load(buf[mult.uid]))
                for r in range(size):
                    dst = b.add(b.mul(b.add(i0, const_i64(r)), const_i64(o)), ocg)
                    b.store(self._requant_zmm(b.load(accs[r][g]), m),
                            self._ptr(stage, dst, V16I8), align=1)

        def finish(oc0, i0, size: int, accs) -> None:
            """The epilogue of ``size`` pixels' 16 output channels from oc0 (two <8 x i32>
            accumulators per pixel) into the pixel-major staging rows."""
            if per_channel:
                mvs = [b.load(self._ptr(buf[mult.uid], b.add(oc0, const_i64(8 * v)), V8F32),
                              align=4) for v in range(2)]
            else:
                mvs = [self._splat(b.load(buf[mult.uid]), V8F32)] * 2
            ovs = ([b.load(self._ptr(buf[y_zp.uid], b.add(oc0, const_i64(8 * v)), V8F32),
                           align=4) for v in range(2)] if self.float_out else [None] * 2)
            for r in range(size):
                dst = b.add(b.mul(b.add(i0, const_i64(r)), const_i64(o)), oc0)
                fs = [b.fmul(b.sitofp(accs[r][v], V8F32), mvs[v]) for v in range(2)]
                if self.float_out:      # float32(acc) * mult + y's offset [relu] [chain]
                    for v in range(2):
                        f = self._requant_float(fs[v], ovs[v])
                        if self.chain is not None:
                            f = self.chain_vector(f, b.add(oc0, const_i64(8 * v)), True)
                        b.store(f, self._ptr(stage, b.add(dst, const_i64(8 * v)), f.type),
                                align=4 if esize == 4 else 1)
                elif self.avx2:
                    wide = [self._requant_int(f, None, True) for f in fs]
                    b.store(self._pack(wide), self._ptr(stage, dst, V16I8), align=1)
                else:
                    for v in range(2):
                        b.store(self._requant_float(fs[v]),
                                self._ptr(stage, b.add(dst, const_i64(8 * v)), self.out_vec),
                                align=1)

        with for_range(b, const_i64(0), const_i64(batch), "b") as bi:
            xb = b.gep(buf[x.uid], [b.mul(bi, const_i64(c * h * w))])
            self._fill_pixel_quads(xb, planes, phases, c, h, w, cg, prow, wq, psz, sh, sw,
                                   pt, pl, zpq, shift, zero=any(self.tag.attrs["padding"]))
            with for_range(b, glo, ghi, "ct") as t:
                oc0 = b.mul(t, const_i64(rows * gz))
                wbase = b.mul(t, const_i64(ksteps * rows * gz))
                with for_range(b, const_i64(0), const_i64(n_tiles), "pt") as p:
                    if extra:
                        with b.if_else(b.icmp_signed("<", p, const_i64(extra))) as (big, rest):
                            with big:
                                tile(oc0, wbase, b.mul(p, const_i64(small + 1)), small + 1)
                            with rest:
                                i0 = b.add(const_i64(extra * (small + 1)),
                                           b.mul(b.sub(p, const_i64(extra)), const_i64(small)))
                                tile(oc0, wbase, i0, small)
                    else:
                        tile(oc0, wbase, b.mul(p, const_i64(small)), small)
            # this task's channels out of the pixel-major staging rows
            yb = b.gep(buf[y.uid], [b.mul(bi, const_i64(o * n))])
            blk = 8 if esize == 4 else 16           # a block: 8 x 8 floats, 16 x 16 bytes
            if lut is None and n >= blk:
                # blocks transposed in registers (the last block of pixels overlapping the one
                # before when blk does not divide n)
                starts = len(range(0, n - blk + 1, blk)) + (1 if n % blk else 0)
                with for_range(b, b.mul(lo, const_i64(rows // blk)),
                               b.mul(hi, const_i64(rows // blk)), "cb") as t:
                    oc0 = b.mul(t, const_i64(blk))
                    with for_range(b, const_i64(0), const_i64(starts), "pb") as k:
                        p0 = b.mul(k, const_i64(blk))
                        if n % blk:
                            p0 = b.select(b.icmp_signed("<", p0, const_i64(n - blk)), p0,
                                          const_i64(n - blk))
                        self._transpose_block(
                            b.gep(stage, [b.add(b.mul(p0, const_i64(o)), oc0)]), o,
                            b.gep(yb, [b.add(b.mul(oc0, const_i64(n)), p0)]), n, blk)
            else:
                with for_range(b, b.mul(lo, const_i64(rows)), b.mul(hi, const_i64(rows)),
                               "co") as oc:
                    src = b.gep(stage, [oc])
                    dst = b.gep(yb, [b.mul(oc, const_i64(n))])
                    tb = None if lut is None else b.gep(buf[lut.uid], [
                        b.mul(oc, const_i64(256)) if int(lut.shape[0]) != 1 else const_i64(0)])
                    with for_range(b, const_i64(0), const_i64(n), "cx") as i:
                        val = b.load(b.gep(src, [b.mul(i, const_i64(o))]))
                        if tb is not None:
                            idx = (b.add(b.sext(val, I64), const_i64(128))
                                   if self.dtype == "int8" else b.zext(val, I64))
                            val = b.load(b.gep(tb, [idx]))
                        b.store(val, b.gep(dst, [i]))
        info = self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)
        if self._zmm():
            return replace(info, choice=f"integer quad convolution, vpdpbusd on 512-bit "
                                        f"vectors, output channels on lanes: {mr} x "
                                        f"{rows * gz} tile")
        return info

    def _emit_wino(self, x, wk, x_zp, bias, mult, y_zp, lut, y) -> KernelInfo:
        """Exact integer Winograd F(2x2, 3x3) for a 3x3 stride-1 ``qconv2d`` whose weights were
        transformed at export (``winograd``: U' = (2G) w (2G)^T as int16 k-pairs of 16
        positions, ops/qlinear.py ``pack_winograd_weights``; passes/int8_cost.py
        ``int_winograd``). Per image the k-pair kernel's int16 planes of x - x_zp, zero-padded
        (``_fill_planes``); per band of tile rows the input transform V = B^T d B of every
        4x4 block (2x2 output tile; int16, |V| <= 1020) into [16][C / 2][tiles] pair words,
        8 tiles a vector (a tile row padded to whole vectors); per tile of output channels
        (the k-pair kernel's 6 rows, split over tasks) and 16 tiles, the 16 products M[xi] =
        sum_c U'[xi] V[xi] with the k-pair kernel's register tile (``_tile``: ``vpmaddwd``,
        int32 sums) into a small buffer, then per row the output transform A^T M A = 4 Y
        (int32, exact while |4 Y| < 2**31: ``WINO_MAX_CHANNELS``), Y = 4 Y >> 2, plus the bias,
        and the k-pair kernel's epilogue (8-bit, or float32 with a fused chain; a lut8 table
        lane by lane), two output rows of 16 columns stored (a partial last vector of a row
        through a copy). 16 products per tile and channel pair against the direct kernel's 36."""
        batch, c, h, w = (int(d) for d in x.shape)
        o = int(self.tag.attrs["out_channels"])
        _, _, oh, ow = (int(d) for d in y.shape)
        pt, pl, pb, pr = self.tag.attrs["padding"]
        if (tuple(self.tag.attrs["kernel"]) != (3, 3) or tuple(self.tag.attrs["strides"]) != (1, 1)
                or wk.dtype != "int16"):
            raise LoweringError(f"{self.func.name}: Winograd weights need a 3x3 stride-1 "
                                "window and int16 weights")
        buf = self.buffers
        mr, nv = self.mr, self.nv
        lanes = PANEL * nv                              # tiles per chunk of the register tile
        nt, ntr = -(-ow // 2), -(-oh // 2)              # 2x2 tiles (odd sizes: one row /
        # column of outputs past the last computed and dropped)
        ntp = -(-nt // PANEL) * PANEL                   # tiles per row of V: whole vectors
        cp = -(-c // 2)
        wq = max(w + pl + pr, 2 * ntp + 2)              # plane row width: reads stay inside
        prow = max(h + pt + pb, 2 * ntr + 2)
        psz = prow * wq
        row_bytes = 16 * cp * ntp * 4
        nbr = max(1, min(ntr, WINO_V_BYTES // row_bytes))   # tile rows per band
        nbands = -(-ntr // nbr)
        vt = -(-nbr * ntp // lanes) * lanes             # V's tiles per (xi, pair), whole chunks
        p_bytes = align_workspace(cp * psz * 4)
        xs = cp * vt + lanes                            # V's words per position xi
        v_bytes = align_workspace(16 * xs * 4)
        m_bytes = align_workspace(16 * mr * lanes * 4)
        region_bytes = p_bytes + v_bytes + m_bytes
        parallel = batch * o * oh * ow * c * 9 >= PARALLEL_MIN_MACS
        regions = MAX_TASK_REGIONS if parallel else 1
        workspace = region_bytes * regions
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        full, tail = o // mr, o % mr
        n_tiles = full + (1 if tail else 0)
        lo, hi, region = self._task_span(parallel, regions, n_tiles, task, ntasks)
        xzp = self._zero_points(x_zp, y_zp)
        base = b.gep(ws, [b.mul(region, const_i64(region_bytes))])
        planes = b.bitcast(base, I16.as_pointer())
        planes32 = b.bitcast(base, I32.as_pointer())
        vbuf = b.bitcast(b.gep(base, [const_i64(p_bytes)]), I32.as_pointer())
        mbuf = b.bitcast(b.gep(base, [const_i64(p_bytes + v_bytes)]), I32.as_pointer())
        w32 = b.bitcast(buf[wk.uid], I32.as_pointer())
        steps = 16 * cp
        out_el = (STORAGE_TYPES[self.chain.out.dtype] if self.chain is not None
                  else self.out_ty)
        evens = ir.Constant(V8I32, list(range(0, 2 * PANEL, 2)))
        odds = ir.Constant(V8I32, list(range(1, 2 * PANEL, 2)))
        v8 = ir.VectorType(I32, PANEL)

        def transform_band(tr0, rows):
            """V[xi * xs + (tl // 16 * cp + p) * 16 + tl % 16] (band tile tl = trl * ntp + tx)
            for the band's tile rows: per 8 tiles the pairs innermost, so that each of the 16
            streams of stores runs on (xs: one cache line more than a position's chunks, so
            that the 16 streams do not share a cache set)."""
            with for_range(b, const_i64(0), rows, "wr") as trl:
                prow0 = b.mul(b.mul(b.add(tr0, trl), const_i64(2)), const_i64(wq))
                with for_range(b, const_i64(0), const_i64(ntp // PANEL), "wv") as q:
                    # tiles tl .. tl + 8 of the band: chunk tl // 16, its lanes tl % 16
                    tl = b.add(b.mul(trl, const_i64(ntp)), b.mul(q, const_i64(PANEL)))
                    vcell0 = b.add(b.mul(b.sdiv(tl, const_i64(lanes)), const_i64(cp * lanes)),
                                   b.srem(tl, const_i64(lanes)))
                    col0 = b.add(prow0, b.mul(q, const_i64(2 * PANEL)))
                    with for_range(b, const_i64(0), const_i64(cp), "wp") as p:
                        vcell = b.add(vcell0, b.mul(p, const_i64(lanes)))
                        col = b.add(col0, b.mul(p, const_i64(psz)))
                        d = []
                        for i in range(4):
                            at = b.add(col, const_i64(i * wq))
                            ws_ = [b.load(self._ptr(planes32, b.add(at, const_i64(k)), v8),
                                          align=4) for k in (0, PANEL, 2, 2 + PANEL)]
                            d.append([b.bitcast(b.shuffle_vector(ws_[0], ws_[1], evens), V16I16),
                                      b.bitcast(b.shuffle_vector(ws_[0], ws_[1], odds), V16I16),
                                      b.bitcast(b.shuffle_vector(ws_[2], ws_[3], evens), V16I16),
                                      b.bitcast(b.shuffle_vector(ws_[2], ws_[3], odds), V16I16)])
                        t = [[b.sub(d[0][j], d[2][j]) for j in range(4)],
                             [b.add(d[1][j], d[2][j]) for j in range(4)],
                             [b.sub(d[2][j], d[1][j]) for j in range(4)],
                             [b.sub(d[1][j], d[3][j]) for j in range(4)]]
                        for a in range(4):
                            r_ = t[a]
                            vals = (b.sub(r_[0], r_[2]), b.add(r_[1], r_[2]),
                                    b.sub(r_[2], r_[1]), b.sub(r_[1], r_[3]))
                            for bb, val in enumerate(vals):
                                dst = b.add(vcell, const_i64((a * 4 + bb) * xs))
                                b.store(val, self._ptr(vbuf, dst, V16I16), align=4)

        def epilogue(vals, ocr):
            """Two <8 x i32> sums (acc + bias) of channel ``ocr`` -> the 16 stored values."""
            mv = self._splat(b.load(buf[mult.uid] if tuple(mult.shape) == ()
                                    else b.gep(buf[mult.uid], [ocr])), V8F32)
            fs = [b.fmul(b.sitofp(a, V8F32), mv) for a in vals]
            if self.float_out:
                ov = self._splat(b.load(b.gep(buf[y_zp.uid], [ocr])), V8F32)
                outs = [self._requant_float(f, ov) for f in fs]
                if self.chain is not None:
                    outs = [self.chain_vector(f, ocr) for f in outs]
            elif self.avx2:
                return self._pack([self._requant_int(f, None, True) for f in fs])
            else:
                outs = [self._requant_float(f) for f in fs]
            return b.shuffle_vector(outs[0], outs[1], ir.Constant(V16I32, list(range(16))))

        def lookup(vec, ocr):
            """A lut8 table's row of channel ``ocr`` on 16 bytes, lane by lane."""
            tb = b.gep(buf[lut.uid], [b.mul(ocr, const_i64(256)) if int(lut.shape[0]) != 1
                                      else const_i64(0)])
            for k in range(16):
                v = b.extract_element(vec, ir.Constant(I32, k))
                idx = (b.add(b.sext(v, I64), const_i64(128)) if self.dtype == "int8"
                       else b.zext(v, I64))
                vec = b.insert_element(vec, b.load(b.gep(tb, [idx])), ir.Constant(I32, k))
            return vec

        def store(vec, dst, count: int):
            """The first ``count`` of the 16 values ``vec`` at ``dst``."""
            if count == 2 * PANEL:
                b.store(vec, b.bitcast(dst, vec.type.as_pointer()), align=1)
                return
            tmp = alloca_once(b, vec.type, "wino_out")
            b.store(vec, tmp)
            src = b.bitcast(tmp, out_el.as_pointer())
            for k in range(count):
                b.store(b.load(b.gep(src, [const_i64(k)])), b.gep(dst, [const_i64(k)]))

        last_count = ow - 2 * (ntp - PANEL)    # outputs of a row's last vector of tiles

        def put(vec, dst, tx0):
            """A row's 16 values from tile tx0 on: the row's last vector only its columns."""
            if last_count == 2 * PANEL:
                store(vec, dst, 2 * PANEL)
                return
            with b.if_else(b.icmp_signed("==", tx0, const_i64(ntp - PANEL))) as (part, whole):
                with part:
                    store(vec, dst, last_count)
                with whole:
                    store(vec, dst, 2 * PANEL)

        def output(nb, ocr, r, t0, tr0, rows):
            """Row ``r`` (channel ``ocr``) of the chunk's M: the output transform and
            epilogue of its 16 tiles, 8 at a time, where they lie in the band."""
            bv = self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V8I32)
            rbase = b.mul(r, const_i64(lanes))          # row r's sums in M [16][mr][16]
            two = ir.Constant(V8I32, [2] * PANEL)
            lo_mix = ir.Constant(V8I32, [k for j in range(4) for k in (j, j + PANEL)])
            hi_mix = ir.Constant(V8I32, [k for j in range(4, 8) for k in (j, j + PANEL)])
            for v in range(nv):
                tl = b.add(t0, const_i64(v * PANEL))
                trl = b.sdiv(tl, const_i64(ntp))
                tx0 = b.srem(tl, const_i64(ntp))
                with b.if_then(b.icmp_signed("<", trl, rows)):
                    m = [[b.load(self._ptr(mbuf, b.add(rbase, const_i64((a * 4 + k) * mr * lanes
                                                                        + v * PANEL)), V8I32),
                                 align=4)
                          for k in range(4)] for a in range(4)]
                    s_ = [[b.add(b.add(m[0][j], m[1][j]), m[2][j]) for j in range(4)],
                          [b.sub(b.sub(m[1][j], m[2][j]), m[3][j]) for j in range(4)]]
                    for i in range(2):
                        y0 = b.add(b.ashr(b.add(b.add(s_[i][0], s_[i][1]), s_[i][2]), two), bv)
                        y1 = b.add(b.ashr(b.sub(b.sub(s_[i][1], s_[i][2]), s_[i][3]), two), bv)
                        vec = epilogue([b.shuffle_vector(y0, y1, lo_mix),
                                        b.shuffle_vector(y0, y1, hi_mix)], ocr)
                        if lut is not None:
                            vec = lookup(vec, ocr)
                        oy = b.add(b.mul(b.add(tr0, trl), const_i64(2)), const_i64(i))
                        at = b.add(b.mul(b.add(b.mul(b.add(b.mul(nb, const_i64(o)), ocr),
                                                     const_i64(oh)), oy), const_i64(ow)),
                                   b.mul(tx0, const_i64(2)))
                        dst = b.gep(buf[y.uid], [at])
                        if i and oh % 2:        # the last tile row's second row is past oh
                            with b.if_then(b.icmp_signed("<", oy, const_i64(oh))):
                                put(vec, dst, tx0)
                        else:
                            put(vec, dst, tx0)

        def gemm(nb, oc0, nrows, t0, tr0, rows):
            """The 16 products of ``nrows`` channels from oc0 over tiles t0 .. t0 + 16 into
            M [16][mr][16], then each row's output."""
            gbase = b.add(b.mul(b.sdiv(oc0, const_i64(CONV_ROWS)), const_i64(steps * CONV_ROWS)),
                          b.srem(oc0, const_i64(CONV_ROWS)))
            with for_range(b, const_i64(0), const_i64(16), "xi") as xi:
                xoff = b.mul(xi, const_i64(cp))
                # V's (xi, chunk) block: [cp][16] words from (xi * nch + chunk) * cp * 16
                vbase = b.add(b.mul(xi, const_i64(xs // lanes)),
                              b.mul(b.sdiv(t0, const_i64(lanes)), const_i64(cp)))

                def a_word(r, j):
                    at = b.add(b.add(gbase, const_i64(r)),
                               b.mul(b.add(xoff, j), const_i64(CONV_ROWS)))
                    return b.load(b.gep(w32, [at]))

                def b_vec(v, j):     # the chunk's steps one after another (16 tiles each)
                    at = b.add(b.mul(b.add(vbase, j), const_i64(lanes)), const_i64(v * PANEL))
                    return b.load(self._ptr(vbuf, at, V16I16), align=4)
                accs = self._tile(nrows, nv, cp, a_word, b_vec)
                for r in range(nrows):
                    for v in range(nv):
                        at = b.add(b.mul(xi, const_i64(mr * lanes)),
                                   const_i64(r * lanes + v * PANEL))
                        b.store(accs[r][v], self._ptr(mbuf, at, V8I32), align=4)
            with for_range(b, const_i64(0), const_i64(nrows), "wo") as r:   # one copy
                output(nb, b.add(oc0, r), r, t0, tr0, rows)

        with for_range(b, const_i64(0), const_i64(batch), "b") as bi:
            xb = b.gep(buf[x.uid], [b.mul(bi, const_i64(c * h * w))])
            self._fill_planes(xb, planes, [(0, 0)], c, h, w, cp, prow, wq, psz, 1, 1, pt, pl,
                              xzp, x.dtype, zero=True)
            with for_range(b, const_i64(0), const_i64(nbands), "band") as band:
                tr0 = b.mul(band, const_i64(nbr))
                left = b.sub(const_i64(ntr), tr0)
                rows = b.select(b.icmp_signed("<", left, const_i64(nbr)), left,
                                const_i64(nbr))
                transform_band(tr0, rows)
                chunks = b.sdiv(b.add(b.mul(rows, const_i64(ntp)), const_i64(lanes - 1)),
                                const_i64(lanes))
                with for_range(b, lo, hi, "ot") as t:
                    oc0 = b.mul(t, const_i64(mr))
                    with for_range(b, const_i64(0), chunks, "wc") as ch:
                        t0 = b.mul(ch, const_i64(lanes))
                        if tail:
                            with b.if_else(b.icmp_signed("<", t, const_i64(full))) as (
                                    whole, part):
                                with whole:
                                    gemm(bi, oc0, mr, t0, tr0, rows)
                                with part:
                                    gemm(bi, oc0, tail, t0, tr0, rows)
                        else:
                            gemm(bi, oc0, mr, t0, tr0, rows)
        info = self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)
        return replace(info, choice=f"integer Winograd F(2x2, 3x3), vpmaddwd on int16 "
                                    f"transforms: {mr} x {lanes} tile")

    def _transpose_block(self, src, src_stride: int, dst, dst_stride: int, m: int) -> None:
        """dst[k * dst_stride + i] = src[i * src_stride + k] for i, k < m (16 bytes or 8
        floats, the pointers' element type): m row loads, log2(m) rounds of interleaves (row
        2i of a round is the low interleave of rows i and i + m / 2 of the one before, row
        2i + 1 the high one: punpcklbw / punpckhbw on bytes), m row stores."""
        b = self.builder
        vec = ir.VectorType(src.type.pointee, m)
        half = m // 2
        lo_mask = ir.Constant(ir.VectorType(I32, m), [k for j in range(half) for k in (j, j + m)])
        hi_mask = ir.Constant(ir.VectorType(I32, m),
                              [k for j in range(half, m) for k in (j, j + m)])
        vals = [b.load(self._ptr(src, const_i64(i * src_stride), vec), align=1)
                for i in range(m)]
        for _ in range(m.bit_length() - 1):
            vals = [b.shuffle_vector(vals[i], vals[i + half], mk)
                    for i in range(half) for mk in (lo_mask, hi_mask)]
        for k, v in enumerate(vals):
            b.store(v, self._ptr(dst, const_i64(k * dst_stride), vec), align=1)

    def _fill_zero_point(self, planes, total: int, zpq) -> None:
        """The planes' ``total`` bytes set to x's zero point ``zpq`` (the padding's value;
        ``_fill_quads`` and ``_fill_pixel_quads`` then write the image's bytes over them)."""
        b = self.builder
        fill = b.trunc(zpq, I8)
        with for_range(b, const_i64(0), _i64(total), "fz") as i:
            b.store(fill, b.gep(planes, [i]))

    def _fill_pixel_quads(self, xb, planes, phases, c, h, w, cg, prow, wq, psz, sh, sw, pt,
                          pl, zpq, shift: int, zero: bool) -> None:
        """``_fill_quads``' bytes pixel-major: planes[ph, u, v, q, j] = x[4q + j, u*sh + py -
        pt, v*sw + px - pl] as uint8 (``shift``), x's zero point ``zpq`` outside the image when
        ``zero``; channels past the last meet zero weights. Per input row and channel, the
        row's bytes are read in order and stored cg * 4 bytes apart."""
        b = self.builder
        if zero:
            self._fill_zero_point(planes, len(phases) * psz * cg * 4, zpq)
        for pi, (py, px) in enumerate(phases):
            window = _inside_image(py, px, h, w, prow, wq, sh, sw, pt, pl)
            if window is None:
                continue
            u_lo, u_hi, v_lo, v_hi = window
            # 512-bit levels: blocks of 16 channels x 16 pixels transposed in registers
            # (``_fill_pixel_block``), the rest byte by byte
            nblk, blk = 0, ZMM_LANES
            while (self._zmm() and c >= blk and v_lo + (nblk + 1) * blk <= v_hi
                   and (v_lo + nblk * blk) * sw + px - pl + blk * sw <= w):
                nblk += 1
            v_mid = v_lo + nblk * blk
            with for_range(b, const_i64(u_lo), const_i64(u_hi), "pu") as u:
                iy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
                row = b.mul(b.add(const_i64(pi * prow), u), const_i64(wq * cg * 4))
                if nblk:
                    with for_range(b, const_i64(0), const_i64(c // blk), "pb") as cb:
                        with for_range(b, const_i64(0), const_i64(nblk), "pk") as k:
                            v0 = b.add(const_i64(v_lo), b.mul(k, const_i64(blk)))
                            self._fill_pixel_block(xb, planes, b.mul(cb, const_i64(blk)), iy,
                                                   row, v0, h, w, cg, sw, px - pl, shift)
                for c_lo, c_hi, vv_lo in ((0, c, v_mid), (c - c % blk if nblk else c, c, v_lo)):
                    if c_hi <= c_lo or v_hi <= vv_lo:
                        continue
                    with for_range(b, const_i64(c_lo), const_i64(c_hi), "pc") as ch:
                        src = b.gep(xb, [b.add(b.mul(ch, const_i64(h * w)),
                                               b.mul(iy, const_i64(w)))])
                        dst = b.gep(planes, [b.add(row, ch)])
                        with for_range(b, const_i64(vv_lo), const_i64(v_hi if c_lo == 0
                                                                      else v_mid), "pv") as v:
                            ix = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                            val = b.load(b.gep(src, [ix]))
                            if shift:
                                val = b.xor(val, ir.Constant(I8, 0x80))
                            b.store(val, b.gep(dst, [b.mul(v, const_i64(cg * 4))]))

    def _fill_pixel_block(self, xb, planes, ch0, iy, row, v0, h: int, w: int, cg: int,
                          sw: int, dx: int, shift: int) -> None:
        """``_fill_pixel_quads``' bytes of channels ch0 .. ch0 + 15 at plane columns v0 ..
        v0 + 15 of row ``row`` (byte index): per channel one load of 16 * sw bytes of input
        row ``iy`` from column v0 * sw + dx (every sw-th kept, xor 0x80 with ``shift``), the
        16 x 16 bytes transposed by 4 rounds of interleaves (as ``_transpose_block``), each
        pixel's 16 channel bytes one store."""
        b = self.builder
        m = ZMM_LANES
        v16i8 = ir.VectorType(I8, m)
        src_ty = ir.VectorType(I8, m * sw)
        every = ir.Constant(ir.VectorType(I32, m), [j * sw for j in range(m)])
        ix = b.add(b.mul(v0, const_i64(sw)), const_i64(dx))
        vals = []
        for j in range(m):
            src = b.add(b.mul(b.add(ch0, const_i64(j)), const_i64(h * w)),
                        b.add(b.mul(iy, const_i64(w)), ix))
            raw = b.load(self._ptr(xb, src, src_ty), align=1)
            if sw > 1:
                raw = b.shuffle_vector(raw, ir.Constant(src_ty, None), every)
            if shift:
                raw = b.xor(raw, ir.Constant(v16i8, [0x80] * m))
            vals.append(raw)
        half = m // 2
        lo_mask = ir.Constant(ir.VectorType(I32, m), [k for j in range(half) for k in (j, j + m)])
        hi_mask = ir.Constant(ir.VectorType(I32, m),
                              [k for j in range(half, m) for k in (j, j + m)])
        for _ in range(m.bit_length() - 1):
            vals = [b.shuffle_vector(vals[i], vals[i + half], mk)
                    for i in range(half) for mk in (lo_mask, hi_mask)]
        base = b.add(b.add(row, b.mul(v0, const_i64(cg * 4))), ch0)
        for k, v in enumerate(vals):
            b.store(v, self._ptr(planes, b.add(base, const_i64(k * cg * 4)), v16i8), align=1)

    def _emit_vector(self, x, wk, x_zp, bias, mult, y_zp, lut, y, batch, c: int,
                     o: int) -> KernelInfo:
        """A 1x1 convolution of a 1x1 image (a squeeze-and-excitation block's): a matrix-
        vector product, output channels as lanes. The planes' kernel would put the one pixel in
        a lane of 16 (and widen all the weights first); here each k-pair step loads the 6
        output channels' pairs of a packed weight tile directly (12 int8 or int16 values, 6 of
        8 lanes) against x's pair broadcast, and the epilogue (``_requant``) runs on the 6
        lanes, stored one by one (through the row's lut8 table when folded in)."""
        rows6 = CONV_ROWS
        cp = -(-c // 2)
        ot = int(wk.shape[0])
        wide = wk.dtype != "int8"
        workspace = align_workspace(cp * 4)
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        b = self.builder
        buf = self.buffers
        xpairs = b.bitcast(ws, I16.as_pointer())
        words = b.bitcast(ws, I32.as_pointer())
        xzp = self._zero_points(x_zp, y_zp)
        w_el = I16 if wide else I8
        v12, v12i16 = ir.VectorType(w_el, 2 * rows6), ir.VectorType(I16, 2 * rows6)
        to16 = ir.Constant(ir.VectorType(I32, 2 * PANEL),
                           list(range(2 * rows6)) + [2 * rows6] * (2 * (PANEL - rows6)))
        to8 = ir.Constant(V8I32, list(range(rows6)) + [rows6] * (PANEL - rows6))
        batch_v = const_i64(batch) if isinstance(batch, int) else self._dim_value(batch)
        with for_range(b, const_i64(0), batch_v, "b") as bi:
            xb = b.gep(buf[x.uid], [b.mul(bi, const_i64(c))])
            if c % 2:
                b.store(ir.Constant(I16, 0), b.gep(xpairs, [const_i64(c)]))
            with for_range(b, const_i64(0), const_i64(c), "xc") as ch:
                v = b.sub(self._widen(b.load(b.gep(xb, [ch])), x.dtype), xzp)
                b.store(b.trunc(v, I16), b.gep(xpairs, [ch]))
            yb = b.gep(buf[y.uid], [b.mul(bi, const_i64(o))])
            with for_range(b, const_i64(0), const_i64(ot), "og") as g:
                acc = alloca_once(b, V8I32, "vacc")
                b.store(ir.Constant(V8I32, None), acc)
                with for_range(b, const_i64(0), const_i64(cp), "kp") as j:
                    at = b.mul(b.add(b.mul(g, const_i64(cp)), j), const_i64(2 * rows6))
                    wv = b.load(self._ptr(buf[wk.uid], at, v12), align=1)
                    wv = b.sext(wv, v12i16) if not wide else wv
                    wv = b.shuffle_vector(wv, ir.Constant(v12i16, None), to16)
                    a = b.bitcast(self._splat(b.load(b.gep(words, [j])), V8I32), V16I16)
                    b.store(b.add(b.load(acc), self._madd(a, wv)), acc)
                oc0 = b.mul(g, const_i64(rows6))

                def lanes(src, ty, vty):
                    if tuple(src.shape) == ():
                        return self._splat(b.load(buf[src.uid]), vty)
                    vals = ir.Constant(ir.VectorType(ty, rows6), None)
                    for r in range(rows6):    # scalar loads: the last tile may pass o
                        oc = b.add(oc0, const_i64(r))
                        oc = b.select(b.icmp_signed("<", oc, const_i64(o)), oc, const_i64(0))
                        vals = b.insert_element(vals, b.load(b.gep(buf[src.uid], [oc])),
                                                ir.Constant(I32, r))
                    return b.shuffle_vector(vals, ir.Constant(vals.type, None), to8)

                bv = lanes(bias, I32, V8I32)
                mv = lanes(mult, F32, V8F32)
                ov = lanes(y_zp, F32, V8F32) if self.float_out else None
                q = self._requant(b.load(acc), bv, mv, ov)
                for r in range(rows6):
                    oc = b.add(oc0, const_i64(r))
                    with b.if_then(b.icmp_signed("<", oc, const_i64(o))):
                        val = b.extract_element(q, ir.Constant(I32, r))
                        if lut is not None:
                            row = (b.mul(oc, const_i64(256)) if int(lut.shape[0]) != 1
                                   else const_i64(0))
                            idx = (b.add(b.sext(val, I64), const_i64(128))
                                   if self.dtype == "int8" else b.zext(val, I64))
                            val = b.load(b.gep(buf[lut.uid], [b.add(row, idx)]))
                        b.store(val, b.gep(yb, [oc]))
        if self.symbolic:     # a run-time batch (``_open_vector``)
            b.ret_void()
            self._emit_entry(body_fn, n_ptrs, ptr_types)
            return KernelInfo(self.symbol, len(self.func.inputs), 1, 0, False, symbolic=True,
                              workspace_expr=workspace,
                              choice="integer matrix-vector product, batch read at run time")
        return self._finish(body_fn, n_ptrs, ptr_types, workspace)

    def _lut_bytes(self, src, dst, tb, n: int) -> None:
        """dst[i] = tb[src[i]] for i < n (n >= 32; int8 bytes index from tb + 128), 32 bytes
        at a time (``_lut_chunk``); the last 32 bytes overlap the previous vector when n is
        not a multiple of 32 (same values: src is the staging buffer, never dst)."""
        b = self.builder
        signed = self.dtype == "int8"
        if n // 32 > 1:
            with for_range(b, const_i64(0), const_i64(n // 32), "lx") as i:
                self._lut_chunk(src, dst, tb, b.mul(i, const_i64(32)), signed)
        else:
            self._lut_chunk(src, dst, tb, const_i64(0), signed)
        if n % 32:
            self._lut_chunk(src, dst, tb, const_i64(n - 32), signed)

    def _tile_dp(self, rows: int, nvec: int, steps: int, a_word, b_vec,
                 init: list[ir.Value] | None = None) -> list[list[ir.Value]]:
        """Like ``_tile`` with ``vpdpbusd``: acc[r][v] += dpbusd(b_vec(v, j) as uint8 quads,
        broadcast(a_word(r, j)) as int8 quads)."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        accs = [[alloca_once(b, V8I32, f"qacc{r}_{v}") for v in range(nvec)] for r in range(rows)]
        zero = ir.Constant(V8I32, None)
        for r, row in enumerate(accs):
            for v, a in enumerate(row):
                # init[r]: the row's start, one vector or one per accumulator
                start = zero if init is None else init[r]
                b.store(start[v] if isinstance(start, list) else start, a)
        with for_range(b, const_i64(0), const_i64(steps), "kq") as j:
            ws = [b.bitcast(b_vec(v, j), v32i8) for v in range(nvec)]
            for r in range(rows):
                a = b.bitcast(self._splat(a_word(r, j), V8I32), v32i8)
                for v in range(nvec):
                    acc = accs[r][v]
                    b.store(self._dpbusd(b.load(acc), ws[v], a), acc)
        return [[b.load(a) for a in row] for row in accs]

    def _zmm(self) -> bool:
        """Whether the quad kernels take 512-bit ``vpdpbusd`` (``_tile_dp16``): native VNNI
        on a level with 512-bit vectors (x86-64-v4+vnni), not its emulation, sdot, the
        7-bit or sign kernels. Zen 5 (measured, bench/int8_peak.py): 64 MAC / instruction at
        the 256-bit form's rate, 4x the 512-bit FMA's multiply-adds (the 256-bit form 2x)."""
        return (getattr(self, "vl", 8) >= ZMM_LANES and getattr(self, "vnni", False)
                and not getattr(self, "vnni_emulated", False)
                and not getattr(self, "sdot", False) and not getattr(self, "madd7", False)
                and not getattr(self, "signed_x", False))

    def _requant_zmm(self, acc: ir.Value, mult: ir.Value) -> ir.Value:
        """``_requant_int`` on a <16 x i32> accumulator (from the bias) with the multiplier
        ``mult`` (a scalar, or <16 x float> per lane), to <16 x i8>: float32(acc) * mult
        clamped to [lo - y_zp, hi - y_zp], rounded half to even by vcvtps2dq (the default
        MXCSR mode), + y_zp in int32, truncated (vpmovdb): the same bytes, one 512-bit vector
        instead of two 256-bit ones and their packs."""
        b = self.builder
        v16f = ir.VectorType(F32, ZMM_LANES)
        lo, hi = saturation_range(self.dtype)
        zp = self.builder.extract_element(self.y_zp, ir.Constant(I32, 0))
        lo_v = self._splat(b.fsub(ir.Constant(F32, float(lo)), zp), v16f)
        hi_v = self._splat(b.fsub(ir.Constant(F32, float(hi)), zp), v16f)
        if not isinstance(mult.type, ir.VectorType):
            mult = self._splat(mult, v16f)
        f = b.fmul(b.sitofp(acc, v16f), mult)
        f = b.select(b.fcmp_ordered("<", f, lo_v), lo_v, f)
        f = b.select(b.fcmp_ordered(">", f, hi_v), hi_v, f)
        cvt = intrinsic(self.module, "llvm.x86.avx512.mask.cvtps2dq.512", V16I32,
                        [v16f, V16I32, ir.IntType(16), I32])
        q = b.call(cvt, [f, ir.Constant(V16I32, None), ir.Constant(ir.IntType(16), -1),
                         ir.Constant(I32, 4)])
        q = b.add(q, self._splat(b.fptosi(zp, I32), V16I32))
        return b.trunc(q, ir.VectorType(I8, ZMM_LANES))

    def _widen_splat(self, v: ir.Value) -> ir.Value:
        """A splat <8 x i32> (a tile row's start) as <16 x i32>."""
        return self.builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, ZMM_LANES),
                                                             list(range(PANEL)) * 2))

    def _halves(self, v: ir.Value) -> list[ir.Value]:
        """A <16 x i32> as its two <8 x i32> halves, low first."""
        b = self.builder
        return [b.shuffle_vector(v, v, ir.Constant(V8I32, list(range(k, k + PANEL))))
                for k in (0, PANEL)]

    def _tile_dp16(self, rows: int, nz: int, steps: int, a_word, b_vec16,
                   init: list[ir.Value] | None = None) -> list[list[ir.Value]]:
        """``_tile_dp`` on 512-bit vectors: ``rows`` x ``nz`` <16 x i32> accumulators,
        acc[r][v] += vpdpbusd(b_vec16(v, j) as 16 pixels' uint8 quads, broadcast(a_word(r, j))
        as int8 quads), from ``init[r]`` (<16 x i32>) or zero."""
        b = self.builder
        v64i8 = ir.VectorType(I8, 64)
        f = intrinsic(self.module, "llvm.x86.avx512.vpdpbusd.512", V16I32,
                      [V16I32, v64i8, v64i8])
        accs = [[alloca_once(b, V16I32, f"zacc{r}_{v}") for v in range(nz)] for r in range(rows)]
        zero = ir.Constant(V16I32, None)
        for r, row in enumerate(accs):
            for a in row:
                b.store(zero if init is None else init[r], a)
        with for_range(b, const_i64(0), const_i64(steps), "kz") as j:
            ws = [b.bitcast(b_vec16(v, j), v64i8) for v in range(nz)]
            for r in range(rows):
                a = b.bitcast(self._splat(a_word(r, j), V16I32), v64i8)
                for v in range(nz):
                    acc = accs[r][v]
                    b.store(b.call(f, [b.load(acc), ws[v], a]), acc)
        return [[b.load(a) for a in row] for row in accs]

    def _row_dp(self, accs: list[ir.Value], lo: ir.Value, hi: ir.Value, a_word,
                b_vec) -> list[ir.Value]:
        """One row's accumulators ``accs`` [nvec] += ``_dpbusd``(b_vec(v, e), broadcast
        a_word(e)) for e in lo .. hi (run-time bounds): the split weights' residual words."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        cells = [alloca_once(b, V8I32, f"racc{v}") for v in range(len(accs))]
        for cell, val in zip(cells, accs):
            b.store(val, cell)
        with for_range(b, lo, hi, "ke") as e:
            a = b.bitcast(self._splat(a_word(e), V8I32), v32i8)
            for v, cell in enumerate(cells):
                b.store(self._dpbusd(b.load(cell), b.bitcast(b_vec(v, e), v32i8), a), cell)
        return [b.load(c) for c in cells]

    def _merge_residual(self, ws, wk, res, lo, hi, mr: int, ot: int, ksteps: int) -> ir.Value:
        """Split quads (ops/qconv_quads.py ``split_quads``: main quads [ot][ksteps][6] words,
        residual words listed per output channel row) merged back into the int8 weights at
        the start of ``ws`` for this task's 6-row tiles: the main words copied, each residual
        word added byte by byte (main + residual is the weight, within int8: no carry).
        Returns the words as an i32 pointer, laid out as the main quads."""
        b = self.builder
        rows6 = CONV_ROWS
        words = b.bitcast(ws, I32.as_pointer())
        main = b.bitcast(wk, I32.as_pointer())
        g_lo = b.sdiv(b.mul(lo, const_i64(mr)), const_i64(rows6))
        g_hi = b.sdiv(b.add(b.mul(hi, const_i64(mr)), const_i64(rows6 - 1)), const_i64(rows6))
        g_hi = b.select(b.icmp_signed("<", g_hi, const_i64(ot)), g_hi, const_i64(ot))
        per = const_i64(ksteps * rows6)
        with for_range(b, b.mul(g_lo, per), b.mul(g_hi, per), "mw") as i:
            b.store(b.load(b.gep(main, [i])), b.gep(words, [i]))
        index = self.buffers[res[0].uid]
        rwords = b.bitcast(self.buffers[res[1].uid], I32.as_pointer())
        first = const_i64(ot * rows6 + 1)     # the words' steps follow the pointers
        v4i8 = ir.VectorType(I8, 4)
        with for_range(b, b.mul(g_lo, const_i64(rows6)), b.mul(g_hi, const_i64(rows6)),
                       "mr") as r:
            base = b.add(b.mul(b.sdiv(r, const_i64(rows6)), per), b.srem(r, const_i64(rows6)))
            e_lo = b.sext(b.load(b.gep(index, [r])), I64)
            e_hi = b.sext(b.load(b.gep(index, [b.add(r, const_i64(1))])), I64)
            with for_range(b, e_lo, e_hi, "me") as e:
                j = b.sext(b.load(b.gep(index, [b.add(e, first)])), I64)
                at = b.gep(words, [b.add(base, b.mul(j, const_i64(rows6)))])
                total = b.add(b.bitcast(b.load(at), v4i8),
                              b.bitcast(b.load(b.gep(rwords, [e])), v4i8))
                b.store(b.bitcast(total, I32), at)
        return words

    def _vnni_weights(self, ws, wk, lo, hi, mr, ot, ntaps, cp, cg, steps, ksteps, wsum_at):
        """The bundle's int8 k-pair weights [ot][taps * cp][6][2] regrouped as int8 channel
        quads [ot][taps * cg][6] (int32 words: pairs 2q and 2q + 1, a zero pair past the last)
        at the start of ``ws``, and each row's sum of weights at ``wsum_at`` (int32), for
        this task's 6-row tiles. Returns (words, sums) as i32 pointers."""
        b = self.builder
        rows6 = CONV_ROWS
        words = b.bitcast(ws, I32.as_pointer())
        wsum = b.bitcast(b.gep(ws, [const_i64(wsum_at)]), I32.as_pointer())
        pairs = b.bitcast(wk, I16.as_pointer())          # one int16 = one k-pair of bytes
        g_lo = b.sdiv(b.mul(lo, const_i64(mr)), const_i64(rows6))
        g_hi = b.sdiv(b.add(b.mul(hi, const_i64(mr)), const_i64(rows6 - 1)), const_i64(rows6))
        g_hi = b.select(b.icmp_signed("<", g_hi, const_i64(ot)), g_hi, const_i64(ot))
        sums = [alloca_once(b, I32, f"wsum{r}") for r in range(rows6)]

        def quad(g, t, q, full: bool) -> None:
            for r in range(rows6):
                src = b.add(b.mul(b.add(b.add(b.mul(g, const_i64(steps)),
                                              b.mul(t, const_i64(cp))),
                                        b.mul(q, const_i64(2))), const_i64(rows6)),
                            const_i64(r))
                lo16 = b.load(b.gep(pairs, [src]))
                word = b.zext(lo16, I32)
                parts = [lo16]
                if full:
                    hi16 = b.load(b.gep(pairs, [b.add(src, const_i64(rows6))]))
                    word = b.or_(word, b.shl(b.zext(hi16, I32), ir.Constant(I32, 16)))
                    parts.append(hi16)
                dst = b.add(b.mul(b.add(b.add(b.mul(g, const_i64(ksteps)),
                                              b.mul(t, const_i64(cg))), q), const_i64(rows6)),
                            const_i64(r))
                b.store(word, b.gep(words, [dst]))
                total = b.load(sums[r])
                for part in parts:
                    for sh in (8, 0):    # the pair's high byte, then its low byte, sign-extended
                        byte = b.trunc(b.lshr(part, ir.Constant(I16, sh)), I8)
                        total = b.add(total, b.sext(byte, I32))
                b.store(total, sums[r])

        with for_range(b, g_lo, g_hi, "vg") as g:
            for r in range(rows6):
                b.store(ir.Constant(I32, 0), sums[r])
            with for_range(b, const_i64(0), const_i64(ntaps), "vt") as t:
                if cp // 2:
                    with for_range(b, const_i64(0), const_i64(cp // 2), "vq") as q:
                        quad(g, t, q, True)
                if cp % 2:
                    quad(g, t, const_i64(cp // 2), False)
            for r in range(rows6):
                b.store(b.load(sums[r]),
                        b.gep(wsum, [b.add(b.mul(g, const_i64(rows6)), const_i64(r))]))
        return words, wsum

    def _fill_quads(self, xb, planes, phases, c, h, w, cg, prow, wq, psz, sh, sw, pt, pl,
                    zpq, shift: int, zero: bool) -> None:
        """The VNNI kernel's planes: bytes planes[ph, q, u, v, j] = x[4q + j, u*sh + py - pt,
        v*sw + px - pl] as uint8 (int8 x + 128, ``shift``), x's zero point ``zpq`` (so it
        adds nothing after the correction) outside the image when ``zero``; channels past the
        last meet zero weights, so what they hold does not matter."""
        b = self.builder
        if zero:
            self._fill_zero_point(planes, len(phases) * cg * psz * 4, zpq)
        for pi, (py, px) in enumerate(phases):
            window = _inside_image(py, px, h, w, prow, wq, sh, sw, pt, pl)
            if window is None:
                continue
            u_lo, u_hi, v_lo, v_hi = window
            for q_lo, q_hi, chans in ((0, c // 4, 4), (c // 4, cg, c % 4)):
                if q_hi <= q_lo:
                    continue
                # AVX2: 8 pixels of the quad at a time (``_fill_quad_vectors``), the rest one
                # by one
                nvec = 0
                while (self.avx2 and v_lo + (nvec + 1) * PANEL <= v_hi
                       and (v_lo + nvec * PANEL) * sw + px - pl + PANEL * sw <= w):
                    nvec += 1
                with for_range(b, const_i64(q_lo), const_i64(q_hi), "fq") as q:
                    base = b.mul(b.add(const_i64(pi * cg), q), const_i64(psz * 4))
                    with for_range(b, const_i64(u_lo), const_i64(u_hi), "fu") as u:
                        iy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
                        row = b.add(base, b.mul(u, const_i64(wq * 4)))
                        if nvec:
                            self._fill_quad_vectors(xb, planes, q, chans, iy, row, v_lo, nvec,
                                                    h, w, sw, px - pl, shift)
                        with for_range(b, const_i64(v_lo + nvec * PANEL), const_i64(v_hi),
                                       "fv") as v:
                            ix = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                            dst = b.add(row, b.mul(v, const_i64(4)))
                            for j in range(chans):
                                ch = b.add(b.mul(q, const_i64(4)), const_i64(j))
                                src = b.add(b.mul(ch, const_i64(h * w)),
                                            b.add(b.mul(iy, const_i64(w)), ix))
                                val = b.load(b.gep(xb, [src]))
                                if shift:
                                    val = b.xor(val, ir.Constant(I8, 0x80))
                                b.store(val, b.gep(planes, [b.add(dst, const_i64(j))]))

    def _fill_quad_vectors(self, xb, planes, q, chans: int, iy, row, v_lo: int, nvec: int,
                           h: int, w: int, sw: int, dx: int, shift: int) -> None:
        """``_fill_quads``' inner loop, vectorized: plane columns v_lo .. v_lo + 8 nvec of
        row ``row`` (byte index) from input row ``iy`` of channels 4q .. 4q + chans - 1: per
        channel one load of 8 * sw bytes from column v * sw + dx, lanes 0, sw, .. kept (xor
        0x80 with ``shift``), the four interleaved into 8 quads (a 32-byte store); a channel
        past the last is zero (it meets zero weights)."""
        b = self.builder
        v8i8 = ir.VectorType(I8, PANEL)
        v32i8 = ir.VectorType(I8, 4 * PANEL)
        src_ty = ir.VectorType(I8, PANEL * sw)
        every = ir.Constant(ir.VectorType(I32, PANEL), [j * sw for j in range(PANEL)])
        cat = ir.Constant(ir.VectorType(I32, 2 * PANEL), list(range(2 * PANEL)))
        mix = ir.Constant(ir.VectorType(I32, 4 * PANEL),
                          [e * PANEL + j for j in range(PANEL) for e in range(4)])
        hw = const_i64(h * w) if isinstance(h, int) else b.mul(h, w)
        with for_range(b, const_i64(0), _i64(nvec), "fw") as k:
            v0 = b.add(const_i64(v_lo), b.mul(k, const_i64(PANEL)))
            ix = b.add(b.mul(v0, const_i64(sw)), const_i64(dx))
            vals = []
            for j in range(4):
                if j >= chans:
                    vals.append(ir.Constant(v8i8, None))
                    continue
                ch = b.add(b.mul(q, const_i64(4)), const_i64(j))
                src = b.add(b.mul(ch, hw), b.add(b.mul(iy, _i64(w)), ix))
                raw = b.load(self._ptr(xb, src, src_ty), align=1)
                if sw > 1:
                    raw = b.shuffle_vector(raw, ir.Constant(src_ty, None), every)
                if shift:
                    raw = b.xor(raw, ir.Constant(v8i8, [0x80] * PANEL))
                vals.append(raw)
            lo = b.shuffle_vector(vals[0], vals[1], cat)
            hi = b.shuffle_vector(vals[2], vals[3], cat)
            quads = b.shuffle_vector(lo, hi, mix)
            dst = b.add(row, b.mul(v0, const_i64(4)))
            b.store(quads, self._ptr(planes, dst, v32i8), align=1)

    def _fill_planes(self, xb, planes, phases, c, h, w, cp, prow, wq, psz, sh, sw, pt, pl,
                     xzp, dtype, zero: bool = True) -> None:
        """planes[ph, p, u, v, j] = x[2p + j, u*sh + py - pt, v*sw + px - pl] - x_zp, zero
        outside the image and past the last channel (int16): zero everything, then copy the
        rectangle of each phase that lies inside the image (its bounds are constants).
        ``zero`` False (no padding, an even channel count): the outputs kept read the image
        alone, so the cells outside it (read for the dropped columns and rows) stay as
        they are."""
        b = self.builder
        total = len(phases) * cp * psz * 2
        if zero:
            with for_range(b, const_i64(0), const_i64(total), "fz") as i:
                b.store(ir.Constant(I16, 0), b.gep(planes, [i]))
        for pi, (py, px) in enumerate(phases):
            window = _inside_image(py, px, h, w, prow, wq, sh, sw, pt, pl)
            if window is None:
                continue
            u_lo, u_hi, v_lo, v_hi = window
            for p_lo, p_hi, chans in ((0, c // 2, 2), (c // 2, cp, 1)):
                if p_hi <= p_lo:
                    continue
                # AVX2: 8 pixels of the pair at a time (one load of 8 * sw bytes per channel,
                # every sw-th lane widened, the two channels interleaved), the rest one by one
                nvec = 0
                while (self.avx2 and v_lo + (nvec + 1) * PANEL <= v_hi
                       and (v_lo + nvec * PANEL) * sw + px - pl + PANEL * sw <= w):
                    nvec += 1
                with for_range(b, const_i64(p_lo), const_i64(p_hi), "fp") as p:
                    base = b.mul(b.add(const_i64(pi * cp), p), const_i64(psz * 2))
                    with for_range(b, const_i64(u_lo), const_i64(u_hi), "fu") as u:
                        iy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
                        row = b.add(base, b.mul(u, const_i64(wq * 2)))
                        if nvec:
                            self._fill_pair_vectors(xb, planes, p, chans, iy, row, v_lo, nvec,
                                                    h, w, sw, px - pl, xzp, dtype)
                        with for_range(b, const_i64(v_lo + nvec * PANEL), const_i64(v_hi),
                                       "fv") as v:
                            ix = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                            dst = b.add(row, b.mul(v, const_i64(2)))
                            for j in range(chans):
                                ch = b.add(b.mul(p, const_i64(2)), const_i64(j))
                                src = b.add(b.mul(ch, const_i64(h * w)),
                                            b.add(b.mul(iy, const_i64(w)), ix))
                                val = b.sub(self._widen(b.load(b.gep(xb, [src])), dtype), xzp)
                                b.store(b.trunc(val, I16),
                                        b.gep(planes, [b.add(dst, const_i64(j))]))

    def _fill_pair_vectors(self, xb, planes, p, chans: int, iy, row, v_lo: int, nvec: int,
                           h: int, w: int, sw: int, dx: int, xzp, dtype) -> None:
        """``_fill_planes``' inner loop, vectorized: plane columns v_lo .. v_lo + 8 nvec of
        row ``row`` (int16 index) from input row ``iy`` of channels 2p and 2p + 1 (``chans``
        2; else the second is zero): per channel one load of 8 * sw bytes from column
        v * sw + dx, lanes 0, sw, .. widened to int16 less x's zero point, the two interleaved
        into 8 words (a 32-byte store)."""
        b = self.builder
        v8i16 = ir.VectorType(I16, PANEL)
        src_ty = ir.VectorType(I8, PANEL * sw)
        every = ir.Constant(ir.VectorType(I32, PANEL), [j * sw for j in range(PANEL)])
        mix = ir.Constant(ir.VectorType(I32, 2 * PANEL),
                          [k for j in range(PANEL) for k in (j, j + PANEL)])
        zp = self._splat(b.trunc(xzp, I16), v8i16)
        with for_range(b, const_i64(0), const_i64(nvec), "fw") as q:
            v0 = b.add(const_i64(v_lo), b.mul(q, const_i64(PANEL)))
            ix = b.add(b.mul(v0, const_i64(sw)), const_i64(dx))
            vals = []
            for j in range(chans):
                ch = b.add(b.mul(p, const_i64(2)), const_i64(j))
                src = b.add(b.mul(ch, const_i64(h * w)), b.add(b.mul(iy, const_i64(w)), ix))
                raw = b.load(self._ptr(xb, src, src_ty), align=1)
                if sw > 1:
                    raw = b.shuffle_vector(raw, ir.Constant(src_ty, None), every)
                wide = b.zext(raw, v8i16) if dtype == "uint8" else b.sext(raw, v8i16)
                vals.append(b.sub(wide, zp))
            if chans == 1:
                vals.append(ir.Constant(v8i16, None))
            pair = b.shuffle_vector(vals[0], vals[1], mix)
            dst = b.add(row, b.mul(v0, const_i64(2)))
            b.store(pair, self._ptr(planes, dst, V16I16), align=2)
