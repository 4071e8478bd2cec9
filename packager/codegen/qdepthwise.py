"""The quantized depthwise convolution kernel (``qdwconv2d``, ``ops/qlinear.py``): uint8/int8
in, one input channel per output channel, any window, padding and stride, ONNX Runtime's
requantization (or a float32 result) fused into the epilogue. Integer arithmetic throughout:
int32 accumulators, wrapping like ONNX Runtime's (its quantizer writes biases near 2**31 for
channels of tiny weight scale), then ``float32(acc + bias) * multiplier`` (MLAS's
``MlasRequantizeOutput`` operand) and the requantize of ``qgemm.QEmitter``.

Taps are taken in *tuples* of G consecutive columns of a window row: G = 2 with ``vpmaddwd``
(int16 pairs, AVX2 ``llvm.x86.avx2.pmadd.wd``; other targets the same product written as
sext / mul / even+odd add), G = 4 with ``vpdpbusd`` (uint8 x int8 quads, level
x86-64-v4+vnni, where every weight w - w_zp fits int8: the ``weights_int8`` attribute). A row of
kw taps takes ceil(kw / G) instructions per 8 outputs (3x3: 6 pairs or 3 quads against 9 fp32
FMAs; 5x5: 15 or 10 against 25); a tuple's taps past the window have weight 0.

Each task takes whole (image, channel) planes. A plane is copied once into a margined buffer
of 32-bit *tuple words* (one buffer per horizontal stride phase that a tuple starts at: word
``v`` of phase ``p``, row ``u`` holds the G inputs ``x[u - pt, v * sw + p - pl + i]``, i < G),
so the inputs of tuple (ky, kx0) for 8 consecutive outputs are one contiguous 32-byte load at
row ``oy * sh + ky`` of phase ``kx0 % sw``, word ``ox + kx0 // sw``. Stride 1 and 2 need one
phase (tuples start at even kx); a stride-2 pair word is just the row's two inputs, widened.
Pairs hold ``x - x_zp`` as int16 (padding 0); quads hold x as uint8 (int8 x + 128, ``xor
0x80``) with x's zero point in the padding, and ``zp' * sum(w)`` leaves the bias once per
plane, so padding adds nothing. The copy runs 8 words at a time: one load of 16 or 32
bytes, one byte shuffle into tuple order (none for pairs at stride 2: their words are the row's
bytes in order), widened (pairs); the row's border chunks (and rows narrower than a
vector) select the padding into the lanes outside the image; in the first and last rows, whose
loads could leave the plane, each load is moved inside it by a known shift and its lanes taken
from there (word by word only in a plane smaller than one load).

Rows of two vectors or more are computed in blocks of ``WIDE_BLOCK`` (rows x vectors: the
input vectors that several rows of the block read are loaded once); narrower rows several at a
time, ``ACCUMULATORS`` vectors in all: independent chains that hide the multiply-add latency.
The weight tuples are broadcast once per plane. A row's partial last vector is stored whole,
its extra lanes landing in the next row's start, which is stored after it (rows are computed
in order, each from its end: the block's last vectors first); the plane's last row (its last
rows where a row holds 1-3 pixels and the spill would pass the plane's end) stores it in pieces
of 4, 2 and 1 lanes. The quad kernel on AVX-512 levels has 32 vector registers and takes
``WIDE_BLOCK_512`` / ``ACCUMULATORS_512`` instead. On AVX2 the 8-bit results are packed 4 or
2 vectors at a time (``vpackssdw``, ``vpackuswb``/``vpacksswb``, ``vpermd``).

Tests compile the quad kernel (``vpdpbusd`` in the assembly) and run it with the instruction
written in portable IR (``CompileOptions.vnni_emulate``), bit for bit against numpy.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from .contraction.geometry import MAX_TASK_REGIONS, PARALLEL_MIN_MACS
from .conv_oc import OPEN_IMAGE_PIXELS
from .helpers import F32, I1, I8, I16, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .lower import WORKSPACE_ALIGN, KernelInfo
from .qchain import match_chain
from .qgemm import V8F32, V8I32, QEmitter, align_workspace, match_qgemm

VL = 8
# Output vectors computed together (a row's, or several narrow rows'): 6 independent chains
# of multiply-adds cover the latency; weight tuples that do not fit the remaining registers
# are broadcast again from memory.
ACCUMULATORS = 6
# Rows of at least ACCUMULATORS vectors: rows x vectors per block; the input vectors that
# several of the block's rows read (stride 1: rows oy + r and tap ky + 1 - r) are loaded once.
WIDE_BLOCK = (3, 2)
# The quad kernel on AVX-512 levels (32 vector registers): blocks of 2 rows x 5 vectors, 10
# accumulators (the recognizer's depthwise layers alone, Zen 4: 5-10 % faster than (3, 2) / 6;
# (3, 4), (4, 3), (6, 2), (2, 6) and (1, 10) measured between the two)
WIDE_BLOCK_512, ACCUMULATORS_512 = (2, 5), 10
# A depthwise multiply-add moves its own input (no reuse across channels): threads from
# PARALLEL_MIN_MACS / 2 (as codegen/depthwise/static.py's DEPTHWISE_MAC_COST).
MAC_COST = 2


def emit_qdepthwise(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                    features: str = "", vnni_emulate: bool = False,
                    size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The kernel of a ``qdwconv2d`` prim func (None for any other); ``features``: the
    target's LLVM features (+avx512vnni: quads with vpdpbusd); ``vnni_emulate``
    (``CompileOptions.vnni_emulate``): the quad kernel with the instruction in portable IR;
    ``size_vars``: run-time image sizes (``_emit_open``)."""
    m = match_qgemm(func, ("qdwconv2d",), sized=bool(size_vars), chain=True)
    if m is None:
        return None
    avx2 = module.triple.startswith("x86_64") and vl >= 8
    emitter = _QDepthwise(module, func, symbol, m[1], avx2, size_vars)
    # an elementwise chain fused after a float32 result (codegen/qchain.py): each plane's
    # results staged, then through the chain into y
    emitter.chain = match_chain(func, m[1])
    emitter.vl = vl     # the chain's lanes (``QEmitter.chain_copy``)
    # a table and a dequantize after the 8-bit result (ops/qlinear.py): each plane's bytes
    # staged, then looked up and dequantized into y (``_table_copy``); the requantize clamps
    # to the table's columns that differ (``sat_range``)
    emitter.looked = len(m[1].operands) == 9
    if emitter.looked:
        shift = 128 if m[1].attrs["dtype"] == "int8" else 0
        emitter.cols = (int(m[1].attrs.get("col_lo", 0)), int(m[1].attrs.get("col_hi", 255)))
        emitter.sat_range = (float(emitter.cols[0] - shift), float(emitter.cols[1] - shift))
    emitter.vnni_emulated = vnni_emulate and module.triple.startswith("x86_64")
    emitter.quads = bool(m[1].attrs.get("weights_int8")) and (
        emitter.vnni_emulated or (avx2 and "+avx512vnni" in features))
    if emitter.quads and avx2 and vl >= 16:     # AVX-512: 32 vector registers
        emitter.wide_block, emitter.accumulators = WIDE_BLOCK_512, ACCUMULATORS_512
    return emitter.emit()


class _QDepthwise(QEmitter):
    quads = False
    looked = False
    wide_block, accumulators = WIDE_BLOCK, ACCUMULATORS

    def emit(self) -> KernelInfo:
        if self.symbolic:
            return self._emit_open()
        x, wf, x_zp, bias, mult, y_zp = self.func.inputs[:6]
        y = self.func.outputs[0]
        batch, c, h, w = (int(d) for d in x.shape)
        kh, kw = self.tag.attrs["kernel"]
        sh, sw = self.tag.attrs["strides"]
        pt, pl = self.tag.attrs["padding"][:2]
        _, _, oh, ow = (int(d) for d in y.shape)
        g = 4 if self.quads else 2
        self.g = g
        self.elt = I8 if self.quads else I16
        self.tuple_vec = ir.VectorType(self.elt, VL * g)
        starts = list(range(0, kw, g))                 # first column of each tuple
        phases = sorted({kx % sw for kx in starts})
        nch = -(-ow // VL)
        prow = (oh - 1) * sh + kh                      # plane rows the outputs read
        span = nch * VL + (kw - 1) // sw               # words per row the outputs read
        wq = span + VL                                 # room for the copy's last chunk
        phase_words = prow * wq
        p_bytes = align_workspace(len(phases) * phase_words * 4)
        planes = batch * c
        parallel = planes * oh * ow * kh * kw * MAC_COST >= PARALLEL_MIN_MACS and planes > 1
        regions = MAX_TASK_REGIONS if parallel else 1
        # a chain (codegen/qchain.py): each plane's float32 results staged per task, then
        # through the chain into y 16 lanes a step (``chain_copy``): on the row blocks' 8-lane
        # vectors, beside their accumulators and weights, it ran 2x slower than its own pass
        s_bytes = align_workspace(oh * ow * 4) if self.chain is not None else 0
        if self.looked:     # a table: each plane's bytes staged (``_table_copy``)
            s_bytes = align_workspace(oh * ow)
        workspace = (p_bytes + s_bytes) * regions
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        lo, hi, region = self._task_span(parallel, regions, planes, task, ntasks)
        xzp, zq, pad_elt, pad_word = self._plane_pads(x.dtype, buf[x_zp.uid], buf[y_zp.uid])
        plane = b.bitcast(b.gep(ws, [b.mul(region, const_i64(p_bytes))]), I32.as_pointer())
        # the margins keep the padding: every plane writes the same rectangle
        with for_range(b, const_i64(0), const_i64(len(phases) * phase_words), "pz") as i:
            b.store(pad_word, b.gep(plane, [i]))
        geo = dict(h=h, w=w, sw=sw, pt=pt, pl=pl, prow=prow, wq=wq, span=span)
        with for_range(b, lo, hi, "pl") as pidx:
            ch = b.srem(pidx, const_i64(c))
            xb = b.gep(buf[x.uid], [b.mul(pidx, const_i64(h * w))])
            for n, p in enumerate(phases):
                self._fill(xb, plane, n * phase_words, p, x.dtype, xzp, pad_elt, geo)
            wt, start, mult_v, off_v = self._plane_constants(ch, kh, kw, starts, zq)
            yb = b.gep(buf[y.uid], [b.mul(pidx, const_i64(oh * ow))])
            if s_bytes:
                out_y = yb
                yb = b.bitcast(b.gep(ws, [b.add(const_i64(p_bytes * regions),
                                                 b.mul(region, const_i64(s_bytes)))]),
                               self.out_vec.element.as_pointer())

            def group(oy0, rows: int, q0, n: int, last_partial: bool,
                      spill: bool = False) -> None:
                """Output vectors q0 .. q0 + n of rows oy0 .. oy0 + rows (each row's last
                vector partial if so): rows * n independent accumulators."""
                accs = [[start] * n for _ in range(rows)]
                for ky in range(kh):
                    for r in range(rows):
                        iy = b.add(b.mul(b.add(oy0, const_i64(r)), const_i64(sh)),
                                   const_i64(ky))
                        row = b.mul(iy, const_i64(wq))
                        for kx0 in starts:
                            at = phases.index(kx0 % sw) * phase_words + kx0 // sw
                            base = b.add(row, const_i64(at))
                            for j in range(n):
                                col = b.mul(b.add(q0, const_i64(j)), const_i64(VL))
                                v = b.load(self._ptr(plane, b.add(base, col), V8I32), align=4)
                                accs[r][j] = self._product(accs[r][j], v, wt[ky, kx0])
                self._store_rows(accs, oy0, rows, q0, n, last_partial, spill, mult_v, off_v,
                                 yb, oh, ow)

            if nch >= self.wide_block[1]:   # rows of 2 vectors or more: a block at a time
                rows_b, chunks = min(self.wide_block[0], oh), self.wide_block[1]
                full = ow // VL
                loop_groups = full // chunks
                rest = full % chunks + (1 if ow % VL else 0)

                def row_block(oy0, rows: int) -> None:
                    # the rows' ends first: a partial last vector is stored whole, its extra
                    # lanes landing in the next row's start, which is stored after it
                    if rest:
                        group(oy0, rows, const_i64(loop_groups * chunks), rest, bool(ow % VL),
                              spill=True)
                    with for_range(b, const_i64(0), const_i64(loop_groups), "qg") as gi:
                        group(oy0, rows, b.mul(gi, const_i64(chunks)), chunks, False)

                with for_range(b, const_i64(0), const_i64(oh // rows_b), "oyb") as t:
                    row_block(b.mul(t, const_i64(rows_b)), rows_b)
                if oh % rows_b:
                    row_block(const_i64(oh - oh % rows_b), oh % rows_b)
            else:                       # narrow rows: whole rows, several at a time
                rows = max(1, min(oh, self.accumulators // nch))
                if oh // rows:
                    with for_range(b, const_i64(0), const_i64(oh // rows), "oyb") as t:
                        group(b.mul(t, const_i64(rows)), rows, const_i64(0), nch,
                              bool(ow % VL), spill=True)
                if oh % rows:
                    group(const_i64(oh - oh % rows), oh % rows, const_i64(0), nch,
                          bool(ow % VL), spill=True)
            if self.looked:
                self._table_copy(yb, out_y, const_i64(oh * ow), ch)
            elif s_bytes:
                self.chain_copy(yb, out_y, oh * ow, ch)
        return self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)

    def _plane_pads(self, dtype: str, x_zp_ptr, y_zp_ptr):
        """x's zero point (loaded), as stored in the planes (``zq``: quads shift it), the
        padding element and the padding word of four (the zero point: padding adds nothing);
        sets ``self.y_zp`` where the result is 8-bit. Both kernels (static, run-time sizes);
        ``QEmitter._zero_points`` without the padding, for the GEMM kernels."""
        b = self.builder
        xzp = b.load(x_zp_ptr)
        shift = self._quad_shift(dtype) if self.quads else 0
        zq = b.add(xzp, ir.Constant(I32, shift))       # quads: x's zero point as stored
        if self.quads:
            pad_elt = b.trunc(zq, I8)
            pad_word = b.mul(b.zext(pad_elt, I32), ir.Constant(I32, 0x01010101))
        else:
            pad_elt = ir.Constant(I16, 0)
            pad_word = ir.Constant(I32, 0)
        if not self.float_out:
            self.y_zp = self._splat(b.load(y_zp_ptr), V8F32)
        return xzp, zq, pad_elt, pad_word

    def _plane_constants(self, ch, kh: int, kw: int, starts: list[int], zq):
        """Channel ``ch``'s broadcast weight tuples {(ky, kx0): vector}, its accumulators'
        start (the bias, less zp' * sum(w) for quads), multiplier and float offset vectors."""
        b = self.builder
        buf = self.buffers
        _, wf, _, bias, mult, y_zp = self.func.inputs[:6]
        g = self.g
        wrow = b.mul(ch, const_i64(kh * kw))
        taps = [[self._widen_w(b.load(b.gep(buf[wf.uid], [b.add(wrow, const_i64(ky * kw + kx))])))
                 for kx in range(kw)] for ky in range(kh)]
        wt = {}
        for ky in range(kh):
            for kx0 in starts:
                parts = [taps[ky][kx0 + i] if kx0 + i < kw else ir.Constant(self.elt, 0)
                         for i in range(g)]
                wt[ky, kx0] = self._tuple_splat(parts)
        start = b.load(b.gep(buf[bias.uid], [ch]))
        if self.quads:      # zp' * sum(w) leaves once per plane (wrapping, as the sums)
            wsum = ir.Constant(I32, 0)
            for ky in range(kh):
                for kx in range(kw):
                    wsum = b.add(wsum, b.sext(taps[ky][kx], I32))
            start = b.sub(start, b.mul(zq, wsum))
        start = self._splat(start, V8I32)
        mult_v = self._splat(b.load(b.gep(buf[mult.uid], [ch])), V8F32)
        off_v = (self._splat(b.load(b.gep(buf[y_zp.uid], [ch])), V8F32)
                 if self.float_out else None)
        return wt, start, mult_v, off_v

    # ---- the product ---------------------------------------------------------------------------

    def _widen_w(self, wv: ir.Value) -> ir.Value:
        """A weight w - w_zp (stored float32, an integer) as the tuple's element type."""
        return self.builder.trunc(self.builder.fptosi(wv, I32), self.elt)

    def _tuple_splat(self, parts: list[ir.Value]) -> ir.Value:
        """G weights as one 32-bit word, broadcast to 8 lanes (as <8G x elt>)."""
        b = self.builder
        word = ir.Constant(ir.VectorType(self.elt, self.g), None)
        for i, part in enumerate(parts):
            word = b.insert_element(word, part, ir.Constant(I32, i))
        return b.bitcast(self._splat(b.bitcast(word, I32), V8I32), self.tuple_vec)

    def _product(self, acc: ir.Value, words: ir.Value, wt: ir.Value) -> ir.Value:
        """acc + the tuple products of 8 words of inputs with the broadcast weight tuple."""
        b = self.builder
        if self.quads:
            return self._dpbusd(acc, b.bitcast(words, self.tuple_vec), wt)
        return b.add(acc, self._madd(b.bitcast(words, self.tuple_vec), wt))

    # ---- the epilogue --------------------------------------------------------------------------

    def _store_rows(self, accs, oy0, rows, q0, n, last_partial, spill, mult_v, off_v, yb,
                    oh, ow) -> None:
        b = self.builder
        packs = self.avx2 and not self.float_out
        # the rows after a row that its whole last vector spills into (VL - ow % VL lanes): one
        # for rows of 4 pixels or more, more for rows of 1-3 (whose vector, stored whole from
        # the plane's last rows but one, passed the plane's end: into the next plane, another
        # task's, or past the tensor)
        after = -(-(VL - ow % VL) // ow) if ow % VL else 1
        for r in range(rows):
            oy = b.add(oy0, const_i64(r))
            res = [self._requant_int(b.fmul(b.sitofp(acc, V8F32), mult_v), off_v, packs)
                   for acc in accs[r]]
            whole = n - (1 if last_partial else 0)
            j = 0
            while j < n:
                dst = b.add(b.mul(oy, const_i64(ow)), b.mul(b.add(q0, const_i64(j)), const_i64(VL)))
                if packs and whole - j >= 2:    # 4 or 2 vectors with two packs
                    k = 4 if whole - j >= 4 else 2
                    b.store(self._pack(res[j:j + k]),
                            self._ptr(yb, dst, ir.VectorType(I8, VL * k)), align=1)
                    j += k
                    continue
                q = b.trunc(res[j], self.out_vec) if packs else res[j]
                if last_partial and j == n - 1 and spill:
                    # a row's partial last vector spills into the next row, which is stored
                    # after it; the plane's last rows (``after``) store lane by lane
                    inner = b.icmp_signed("<", oy, const_i64(oh - after))
                    with b.if_else(inner, likely=True) as (then, other):
                        with then:
                            b.store(q, self._ptr(yb, dst, self.out_vec), align=1)
                        with other:
                            self._store_lanes(q, yb, dst, ow % VL)
                elif last_partial and j == n - 1:
                    self._store_lanes(q, yb, dst, ow % VL)
                else:
                    b.store(q, self._ptr(yb, dst, self.out_vec), align=1)
                j += 1

    def _table_copy(self, src, dst, n, ch) -> None:
        """dst[i] = float32(table[row, src[i]] - t_zp) * t_scale for i < ``n`` (an i64): a
        plane's staged 8-bit results (already within the table's columns ``self.cols``)
        through its table row (channel ``ch``'s, or the one row) and the dequantize after it
        (ops/qlinear.py). On AVX2 32 bytes a step, looked up on the register over the columns'
        chunks (``_lookup_cols``), widened, minus the zero point in int32, converted and times
        the scale (the reference's float32 operations), stored as 4 vectors; a plane of 32
        values or more ends with a whole step over its last 32 (the same values again), a
        smaller one value by value (as the generic loop nest, and every value without AVX2)."""
        b = self.builder
        buf = self.buffers
        table, ts, tz = self.func.inputs[6:9]
        signed = self.dtype == "int8"
        tb = buf[table.uid]
        if int(table.shape[0]) != 1:
            tb = b.gep(tb, [b.mul(ch, const_i64(256))])
        zt = self._widen(b.load(buf[tz.uid]), tz.dtype)
        st = b.load(buf[ts.uid])

        def one(i) -> None:
            v = b.load(b.gep(src, [i]))
            idx = b.add(b.sext(v, I64), const_i64(128)) if signed else b.zext(v, I64)
            t = self._widen(b.load(b.gep(tb, [idx])), table.dtype)
            b.store(b.fmul(b.sitofp(b.sub(t, zt), F32), st), b.gep(dst, [i]))

        if not self.avx2:
            with for_range(b, const_i64(0), n, "tv") as i:
                one(i)
            return
        v32i8 = ir.VectorType(I8, 32)
        zt_v, st_v = self._splat(zt, V8I32), self._splat(st, V8F32)

        def chunk(at) -> None:
            looked = self._lookup_cols(b.load(self._ptr(src, at, v32i8), align=1), tb,
                                       self.cols, signed)
            for k in range(4):
                part = b.shuffle_vector(looked, looked, ir.Constant(
                    ir.VectorType(I32, VL), list(range(VL * k, VL * k + VL))))
                wide = b.zext(part, V8I32) if table.dtype == "uint8" else b.sext(part, V8I32)
                f = b.fmul(b.sitofp(b.sub(wide, zt_v), V8F32), st_v)
                b.store(f, self._ptr(dst, b.add(at, const_i64(VL * k)), V8F32), align=4)

        with b.if_else(b.icmp_signed(">=", n, const_i64(32))) as (wide, short):
            with wide:
                with for_range(b, const_i64(0), b.udiv(n, const_i64(32)), "tc") as i:
                    chunk(b.mul(i, const_i64(32)))
                with b.if_then(b.icmp_signed("!=", b.urem(n, const_i64(32)), const_i64(0))):
                    chunk(b.sub(n, const_i64(32)))
            with short:
                with for_range(b, const_i64(0), n, "tv") as i:
                    one(i)

    def _store_lanes(self, q, yb, dst, lanes: int) -> None:
        """The first ``lanes`` lanes of ``q``, in pieces of 4, 2 and 1."""
        b = self.builder
        at = 0
        for piece in (4, 2, 1):
            if lanes - at < piece:
                continue
            if piece == 1:
                part = b.extract_element(q, ir.Constant(I32, at))
            else:
                part = b.shuffle_vector(q, q, ir.Constant(ir.VectorType(I32, piece),
                                                          list(range(at, at + piece))))
            b.store(part, self._ptr(yb, b.add(dst, const_i64(at)), part.type), align=1)
            at += piece

    # ---- the copy into tuple words -------------------------------------------------------------

    def _fill(self, xb, plane, base: int, p: int, dtype: str, xzp, pad_elt, geo: dict) -> None:
        """Phase ``p``'s words inside the image's rows: word v holds the inputs of columns
        ``v * sw + p - pl + i`` (i < G), the padding where a column is outside the row. Chunks
        of 8 words; the border chunks select the padding, vector-wise in the rows where their
        loads stay inside the plane, word by word in the others."""
        b = self.builder
        h, w, sw, pt, pl, wq = (geo[k] for k in ("h", "w", "sw", "pt", "pl", "wq"))
        g = self.g
        rows = min(h, geo["prow"] - pt)
        v_lo = max(0, -(-(pl - p - (g - 1)) // sw))
        v_hi = min(geo["span"], (w - 1 + pl - p) // sw + 1)
        if rows <= 0 or v_hi <= v_lo:
            return
        chunks = [v_lo + VL * k for k in range(-(-(v_hi - v_lo) // VL))]

        def first_col(v0: int, i: int) -> int:
            return v0 * sw + p - pl + i

        # a chunk's 8 G-tuples: element j * G + i is column first_col(v0, 0) + j * sw + i,
        # all taken from one load of ``load`` bytes (one shuffle; none where sw == G)
        offsets = [j * sw + i for j in range(VL) for i in range(g)]
        load = max(16, 1 << offsets[-1].bit_length())

        def interior(v0: int) -> bool:
            return first_col(v0, 0) >= 0 and first_col(v0, 0) + load <= w

        inner = [v0 for v0 in chunks if interior(v0)]
        edges = [v0 for v0 in chunks if not interior(v0)]
        # rows where every border chunk's loads stay inside the plane's h * w bytes
        safe_lo = max([0] + [-(first_col(v0, 0) // w) for v0 in edges])
        safe_hi = min([rows] + [(h * w - first_col(v0, 0) - load) // w + 1 for v0 in edges])
        safe_hi = max(safe_lo, safe_hi)
        zp_v = self._splat(b.trunc(xzp, I16), ir.VectorType(I16, VL * g))
        pad_v = self._splat(pad_elt, ir.VectorType(self.elt, VL * g))
        elt_plane = b.bitcast(plane, self.elt.as_pointer())

        def chunk(src, dst_row, v0: int, row: int | None = None) -> None:
            """8 words from border chunk ``v0``, the padding selected into the elements
            outside the row; ``row`` (the first or last rows): the load moved inside the
            plane by a known shift, the elements taken past it."""
            c0 = first_col(v0, 0)
            offs = list(offsets)
            if row is None:
                ptr, at = src, c0
            else:
                plane_at = row * w + c0
                at = min(max(plane_at, 0), h * w - load)
                offs = [k if 0 <= k < load else 0 for k in (plane_at - at + o for o in offsets)]
                ptr = xb
            keep = [0 <= c0 + o < w for o in offsets]
            words = self._words(ptr, const_i64(at), offs, load, dtype, zp_v, keep, pad_v)
            b.store(words, self._ptr(elt_plane, b.mul(b.add(dst_row, const_i64(v0)),
                                                       const_i64(g)), words.type), align=4)

        def scalar_chunk(src, dst_row, v0: int) -> None:
            for j in range(VL):
                if v0 + j >= wq:
                    break
                for i in range(g):
                    col = first_col(v0, i) + j * sw
                    if 0 <= col < w:
                        raw = b.load(b.gep(src, [const_i64(col)]))
                        val = self._convert(raw, dtype, b.trunc(xzp, I16))
                    else:
                        val = pad_elt
                    at = b.add(b.mul(b.add(dst_row, const_i64(v0 + j)), const_i64(g)),
                               const_i64(i))
                    b.store(val, b.gep(elt_plane, [at]))

        def row_body(iy, row: int | None) -> None:
            src = b.gep(xb, [b.mul(iy, const_i64(w))])
            dst_row = b.add(const_i64(base), b.mul(b.add(iy, const_i64(pt)), const_i64(wq)))
            if inner:
                with for_range(b, const_i64(0), const_i64(len(inner)), "fq") as k:
                    v0 = b.add(const_i64(inner[0]), b.mul(k, const_i64(VL)))
                    at = b.add(b.mul(v0, const_i64(sw)), const_i64(p - pl))
                    words = self._words(src, at, offsets, load, dtype, zp_v)
                    b.store(words, self._ptr(elt_plane, b.mul(b.add(dst_row, v0), const_i64(g)),
                                             words.type), align=4)
            for v0 in edges:
                if row is None or h * w >= load:
                    chunk(src, dst_row, v0, row)
                else:       # a plane smaller than one load
                    scalar_chunk(src, dst_row, v0)

        def fill_rows(r0: int, r1: int, vector_edges: bool) -> None:
            if r1 <= r0:
                return
            if not vector_edges:    # the few rows whose loads are moved: one by one
                for row in range(r0, r1):
                    row_body(const_i64(row), row)
                return
            with for_range(b, const_i64(r0), const_i64(r1), "fy") as iy:
                row_body(iy, None)

        fill_rows(0, min(safe_lo, rows), False)
        fill_rows(safe_lo, safe_hi, True)
        fill_rows(max(safe_hi, safe_lo), rows, False)

    def _words(self, ptr, at, offs: list[int], load: int, dtype: str, zp_v, keep=None,
               pad_v=None) -> ir.Value:
        """<8G x elt> tuple elements: ``load`` bytes from ``ptr + at``, element k its byte
        ``offs[k]``, converted (``_convert``); where ``keep[k]`` is false the padding."""
        raw = self.builder.load(self._ptr(ptr, at, ir.VectorType(I8, load)), align=1)
        return self._words_of(raw, offs, dtype, zp_v, keep, pad_v)

    def _words_of(self, raw, offs: list[int], dtype: str, zp_v, keep=None, pad_v=None
                  ) -> ir.Value:
        """``_words`` of the loaded bytes ``raw``."""
        b = self.builder
        load = raw.type.count
        if offs != list(range(load)):
            raw = b.shuffle_vector(raw, ir.Constant(raw.type, None),
                                   ir.Constant(ir.VectorType(I32, len(offs)), offs))
        val = self._convert(raw, dtype, zp_v)
        if keep is not None and not all(keep):
            val = b.select(ir.Constant(ir.VectorType(I1, len(offs)), keep), val, pad_v)
        return val

    def _convert(self, raw: ir.Value, dtype: str, zp16: ir.Value) -> ir.Value:
        """Loaded input bytes as tuple elements: x - x_zp as int16 (pairs), x as uint8
        (quads: int8 x + 128)."""
        b = self.builder
        if self.quads:
            if not self._quad_shift(dtype):
                return raw
            if isinstance(raw.type, ir.VectorType):
                return b.xor(raw, ir.Constant(raw.type, [-128] * raw.type.count))
            return b.xor(raw, ir.Constant(I8, -128))
        ty = ir.VectorType(I16, raw.type.count) if isinstance(raw.type, ir.VectorType) else I16
        wide = b.zext(raw, ty) if dtype == "uint8" else b.sext(raw, ty)
        return b.sub(wide, zp16)

    # ---- run-time image sizes ------------------------------------------------------------------

    def _emit_open(self) -> KernelInfo:
        """``emit``'s kernel with run-time sizes (an ONNX file's open batch, height or width):
        the plan that depends on them (output vectors per row, plane rows and words per row,
        the workspace's regions) is computed at the kernel's entry by ``emit``'s rules; the
        workspace is a size expression that bounds it. The blocks keep ``emit``'s shapes: a
        row's last vectors (fewer than a block's) and narrow rows choose among the block's
        compiled counts at run time; the copy counts its chunks at run time
        (``_fill_open``)."""
        x, wf, x_zp, bias, mult, y_zp = self.func.inputs[:6]
        y = self.func.outputs[0]
        n_dim, c, h_dim, w_dim = x.shape
        c = int(c)
        kh, kw = self.tag.attrs["kernel"]
        sh, sw = self.tag.attrs["strides"]
        pt, pl = self.tag.attrs["padding"][:2]
        _, _, oh_dim, ow_dim = y.shape
        g = 4 if self.quads else 2
        self.g = g
        self.elt = I8 if self.quads else I16
        self.tuple_vec = ir.VectorType(self.elt, VL * g)
        starts = list(range(0, kw, g))
        phases = sorted({kx % sw for kx in starts})
        # the workspace's bound: wq <= ow + 2 VL - 1 + (kw - 1) // sw, plane rows <= oh sh + kh
        wq_e = ow_dim + (2 * VL - 1 + (kw - 1) // sw)
        region_e = (oh_dim * sh + kh) * wq_e * (len(phases) * 4) + WORKSPACE_ALIGN
        # a run-time size: one channel of 128 x 128 outputs per plane decides, as _emit_open's
        parallel = c > 1 and c * OPEN_IMAGE_PIXELS * kh * kw * MAC_COST >= PARALLEL_MIN_MACS
        regions = MAX_TASK_REGIONS if parallel else 1
        # a chain: each plane's float32 results staged per task (``emit``), after the planes
        workspace_e = region_e * regions
        if self.chain is not None:
            workspace_e = (region_e + (oh_dim * ow_dim * 4 + WORKSPACE_ALIGN)) * regions
        elif self.looked:   # a table: each plane's bytes staged (``_table_copy``)
            workspace_e = (region_e + (oh_dim * ow_dim + WORKSPACE_ALIGN)) * regions
        body_fn, ptr_types = self._begin_body(self.func.inputs + self.func.outputs, True)
        n_ptrs = len(ptr_types)
        ws = body_fn.args[len(self.func.inputs) + 1]
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        batch, h, w, oh, ow = (self._dim_value(d) for d in (n_dim, h_dim, w_dim, oh_dim, ow_dim))
        nfull = b.udiv(ow, const_i64(VL))
        part = b.zext(b.icmp_signed("!=", b.urem(ow, const_i64(VL)), const_i64(0)), I64)
        nch = b.add(nfull, part)
        prow = b.add(b.mul(b.sub(oh, const_i64(1)), const_i64(sh)), const_i64(kh))
        span = b.add(b.mul(nch, const_i64(VL)), const_i64((kw - 1) // sw))
        wq = b.add(span, const_i64(VL))
        phase_words = b.mul(prow, wq)
        p_bytes = b.mul(b.udiv(b.add(b.mul(phase_words, const_i64(len(phases) * 4)),
                                     const_i64(WORKSPACE_ALIGN - 1)), const_i64(WORKSPACE_ALIGN)),
                        const_i64(WORKSPACE_ALIGN))
        planes = b.mul(batch, const_i64(c))
        lo, hi, region = self._task_span(parallel, regions, planes, task, ntasks)
        xzp, zq, pad_elt, pad_word = self._plane_pads(x.dtype, buf[x_zp.uid], buf[y_zp.uid])
        plane = b.bitcast(b.gep(ws, [b.mul(region, p_bytes)]), I32.as_pointer())
        with for_range(b, const_i64(0), b.mul(phase_words, const_i64(len(phases))), "pz") as i:
            b.store(pad_word, b.gep(plane, [i]))
        geo = dict(h=h, w=w, sw=sw, pt=pt, pl=pl, prow=prow, wq=wq, span=span)
        hw, ohw = b.mul(h, w), b.mul(oh, ow)
        with for_range(b, lo, hi, "pl") as pidx:
            ch = b.srem(pidx, const_i64(c))
            xb = b.gep(buf[x.uid], [b.mul(pidx, hw)])
            for n, p in enumerate(phases):
                self._fill_open(xb, plane, b.mul(phase_words, const_i64(n)), p, x.dtype, xzp,
                                pad_elt, geo)
            wt, start, mult_v, off_v = self._plane_constants(ch, kh, kw, starts, zq)
            yb = b.gep(buf[y.uid], [b.mul(pidx, ohw)])
            if self.chain is not None or self.looked:
                out_y = yb
                s_bytes = b.mul(b.udiv(b.add(b.mul(ohw, const_i64(1 if self.looked else 4)),
                                             const_i64(WORKSPACE_ALIGN - 1)),
                                       const_i64(WORKSPACE_ALIGN)), const_i64(WORKSPACE_ALIGN))
                at = b.add(b.mul(p_bytes, const_i64(regions)), b.mul(region, s_bytes))
                yb = b.bitcast(b.gep(ws, [at]), self.out_vec.element.as_pointer())

            def group(oy0, rows: int, q0, n: int, ends: bool) -> None:
                """``emit``'s group: output vectors q0 .. q0 + n of rows oy0 .. oy0 + rows;
                ``ends``: the last is each row's last (partial where ow % 8)."""
                def sums(checked: bool) -> list:
                    """The rows' accumulators; ``checked``: a padding row's taps skipped."""
                    accs = [[start] * n for _ in range(rows)]
                    for ky in range(kh):
                        for r in range(rows):
                            iy = b.add(b.mul(b.add(oy0, const_i64(r)), const_i64(sh)),
                                       const_i64(ky))
                            row = b.mul(iy, wq)

                            def taps(acc: list, ky=ky, row=row) -> list:
                                acc = list(acc)
                                for kx0 in starts:
                                    at = b.add(b.mul(phase_words,
                                                     const_i64(phases.index(kx0 % sw))),
                                               const_i64(kx0 // sw))
                                    base = b.add(row, at)
                                    for j in range(n):
                                        col = b.mul(b.add(q0, const_i64(j)), const_i64(VL))
                                        v = b.load(self._ptr(plane, b.add(base, col), V8I32),
                                                   align=4)
                                        acc[j] = self._product(acc[j], v, wt[ky, kx0])
                                return acc

                            if not checked:
                                accs[r] = taps(accs[r])
                                continue
                            inside = b.and_(b.icmp_signed(">=", iy, const_i64(pt)),
                                            b.icmp_signed("<", iy, b.add(h, const_i64(pt))))
                            accs[r] = merge(accs[r], inside, lambda old=accs[r]: taps(old))
                    return accs

                def merge(old: list, cond, compute) -> list:
                    """``compute()`` where ``cond`` holds, else ``old`` (phis)."""
                    before = b.block
                    with b.if_then(cond):
                        new = compute()
                        after = b.block
                    out = []
                    for o, v in zip(old, new):
                        phi = b.phi(o.type)
                        phi.add_incoming(o, before)
                        phi.add_incoming(v, after)
                        out.append(phi)
                    return out

                # pairs: a padding row's words are 0 and add nothing, so its taps may be
                # skipped: on planes shorter than two windows (a 5x5 window on 2 rows reads 6
                # of its 10 window rows in the padding), in the rows whose windows reach the
                # padding; elsewhere no checks (a branch per window row slowed the PP-OCR
                # detector's large planes 2-10 %)
                if self.quads or kh == 1:
                    accs = sums(False)
                else:
                    top = b.mul(oy0, const_i64(sh))
                    interior = b.and_(
                        b.icmp_signed(">=", top, const_i64(pt)),
                        b.icmp_signed("<=", b.add(top, const_i64((rows - 1) * sh + kh)),
                                      b.add(h, const_i64(pt))))
                    tall = b.icmp_signed(">=", h, const_i64(2 * kh))
                    flat = []
                    with b.if_else(b.or_(interior, tall)) as (inner, border):
                        with inner:
                            fast = [v for acc in sums(False) for v in acc]
                            fast_block = b.block
                        with border:
                            slow = [v for acc in sums(True) for v in acc]
                            slow_block = b.block
                    for u, c in zip(fast, slow):
                        phi = b.phi(u.type)
                        phi.add_incoming(u, fast_block)
                        phi.add_incoming(c, slow_block)
                        flat.append(phi)
                    accs = [flat[r * n:(r + 1) * n] for r in range(rows)]
                self._store_rows_open(accs, oy0, rows, q0, n, ends, mult_v, off_v, yb, ow,
                                      ohw)

            def counted(count, choices, emit_one) -> None:
                """``emit_one(k)`` for the k of ``choices`` equal to the run-time ``count``."""
                for k in choices:
                    with b.if_then(b.icmp_signed("==", count, const_i64(k))):
                        emit_one(k)

            rows_b, chunks = self.wide_block
            wide = b.icmp_signed(">=", nch, const_i64(chunks))
            with b.if_else(wide) as (blocks, narrow):
                with blocks:       # rows of a block's vectors or more: a block at a time
                    loop_groups = b.udiv(nfull, const_i64(chunks))
                    rest = b.add(b.urem(nfull, const_i64(chunks)), part)

                    def row_block(oy0, rows: int) -> None:
                        # the rows' ends first (their partial vectors spill into the next row)
                        counted(rest, range(1, chunks + 1), lambda k: group(
                            oy0, rows, b.mul(loop_groups, const_i64(chunks)), k, True))
                        with for_range(b, const_i64(0), loop_groups, "qg") as gi:
                            group(oy0, rows, b.mul(gi, const_i64(chunks)), chunks, False)

                    nb = b.udiv(oh, const_i64(rows_b))
                    with for_range(b, const_i64(0), nb, "oyb") as t:
                        row_block(b.mul(t, const_i64(rows_b)), rows_b)
                    with for_range(b, b.mul(nb, const_i64(rows_b)), oh, "oyr") as oy:
                        row_block(oy, 1)
                with narrow:       # narrow rows: whole rows, several at a time

                    def rows_of(n: int) -> None:
                        rows = max(1, self.accumulators // n)
                        nb = b.udiv(oh, const_i64(rows))
                        with for_range(b, const_i64(0), nb, "oyb") as t:
                            group(b.mul(t, const_i64(rows)), rows, const_i64(0), n, True)
                        if rows > 1:
                            with for_range(b, b.mul(nb, const_i64(rows)), oh, "oyr") as oy:
                                group(oy, 1, const_i64(0), n, True)
                    counted(nch, range(1, chunks), rows_of)
            if self.looked:
                self._table_copy(yb, out_y, ohw, ch)
            elif self.chain is not None:
                self.chain_copy(yb, out_y, ohw, ch)
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(self.func.inputs), 1, 0, parallel, symbolic=True,
                          workspace_expr=workspace_e,
                          choice="integer depthwise, tuple words, planes sized at run time")

    def _store_rows_open(self, accs, oy0, rows, q0, n, ends, mult_v, off_v, yb, ow,
                         ohw) -> None:
        """``_store_rows`` with run-time ``ow``: the whole vectors packed as there; a row's
        last vector (``ends``) stored whole, spilling into the next rows (stored after it),
        except where it would pass the plane's end: its row's lanes one by one."""
        b = self.builder
        packs = self.avx2 and not self.float_out
        for r in range(rows):
            oy = b.add(oy0, const_i64(r))
            res = [self._requant_int(b.fmul(b.sitofp(acc, V8F32), mult_v), off_v, packs)
                   for acc in accs[r]]
            whole = n - (1 if ends else 0)
            j = 0
            while j < n:
                dst = b.add(b.mul(oy, ow), b.mul(b.add(q0, const_i64(j)), const_i64(VL)))
                if packs and whole - j >= 2:
                    k = 4 if whole - j >= 4 else 2
                    b.store(self._pack(res[j:j + k]),
                            self._ptr(yb, dst, ir.VectorType(I8, VL * k)), align=1)
                    j += k
                    continue
                q = b.trunc(res[j], self.out_vec) if packs else res[j]
                if ends and j == n - 1:
                    cut = b.icmp_signed(">", b.add(dst, const_i64(VL)), ohw)
                    with b.if_else(cut, likely=False) as (then, other):
                        with then:
                            tmp = alloca_once(b, self.out_vec, "lanes")
                            b.store(q, tmp)
                            elts = b.bitcast(tmp, self.out_vec.element.as_pointer())
                            left = b.sub(b.mul(b.add(oy, const_i64(1)), ow), dst)
                            with for_range(b, const_i64(0), left, "ln") as i:
                                b.store(b.load(b.gep(elts, [i])), b.gep(yb, [b.add(dst, i)]))
                        with other:
                            b.store(q, self._ptr(yb, dst, self.out_vec), align=1)
                else:
                    b.store(q, self._ptr(yb, dst, self.out_vec), align=1)
                j += 1

    def _fill_open(self, xb, plane, base, p: int, dtype: str, xzp, pad_elt, geo: dict) -> None:
        """``_fill`` with run-time sizes: each image row's chunks of 8 words counted at run
        time; the chunks whose load stays inside the row as there, the border chunks with the
        padding selected by a run-time mask where their load stays inside the plane, else
        element by element (a clamped load, the padding selected)."""
        b = self.builder
        h, w, sw, pt, pl, wq = (geo[k] for k in ("h", "w", "sw", "pt", "pl", "wq"))
        g = self.g
        rows = b.sub(geo["prow"], const_i64(pt))
        rows = b.select(b.icmp_signed("<", h, rows), h, rows)
        v_lo = max(0, -(-(pl - p - (g - 1)) // sw))
        v_hi = b.udiv(b.add(w, const_i64(pl - p + sw - 1)), const_i64(sw))
        v_hi = b.select(b.icmp_signed("<", geo["span"], v_hi), geo["span"], v_hi)
        width = b.sub(v_hi, const_i64(v_lo))
        width = b.select(b.icmp_signed("<", width, const_i64(0)), const_i64(0), width)
        n_chunks = b.udiv(b.add(width, const_i64(VL - 1)), const_i64(VL))
        offsets = [j * sw + i for j in range(VL) for i in range(g)]
        load = max(16, 1 << offsets[-1].bit_length())
        c0_at = v_lo * sw + p - pl                   # chunk k's first column: c0_at + 8 sw k
        k_a = 0                                      # the first chunk whose c0 >= 0
        while c0_at + VL * sw * k_a < 0:
            k_a += 1
        # the chunks past k_b load past the row's end: c0 + load > w
        num = b.sub(w, const_i64(load + c0_at))
        k_b = b.select(b.icmp_signed("<", num, const_i64(0)), const_i64(-1),
                       b.sdiv(num, const_i64(VL * sw)))
        k_b = b.add(k_b, const_i64(1))
        k_a_v = b.select(b.icmp_signed("<", n_chunks, const_i64(k_a)), n_chunks, const_i64(k_a))
        k_b = b.select(b.icmp_signed("<", n_chunks, k_b), n_chunks, k_b)
        k_b = b.select(b.icmp_signed("<", k_b, k_a_v), k_a_v, k_b)
        n_edges = b.add(k_a_v, b.sub(n_chunks, k_b))
        hw = b.mul(h, w)
        zp_v = self._splat(b.trunc(xzp, I16), ir.VectorType(I16, VL * g))
        pad_v = self._splat(pad_elt, ir.VectorType(self.elt, VL * g))
        elt_plane = b.bitcast(plane, self.elt.as_pointer())
        # element k of a chunk at column c0 is inside the row where -c0 <= offsets[k] < w - c0:
        # compares of the offsets as bytes (int16 for strides over 15) against those bounds
        # clamped to [0, top]
        top = offsets[-1] + 1
        lane_ty = I8 if top < 128 else I16
        vec_off = ir.VectorType(lane_ty, VL * g)
        offs_v = ir.Constant(vec_off, offsets)

        def clamp(v, most: int):
            v = b.select(b.icmp_signed("<", v, const_i64(0)), const_i64(0), v)
            return b.select(b.icmp_signed(">", v, const_i64(most)), const_i64(most), v)

        def bound(v):
            return self._splat(b.trunc(clamp(v, top), lane_ty), vec_off)

        def store_words(words, dst_row, v0) -> None:
            b.store(words, self._ptr(elt_plane, b.mul(b.add(dst_row, v0), const_i64(g)),
                                     words.type), align=4)

        with for_range(b, const_i64(0), rows, "fy") as iy:
            src = b.gep(xb, [b.mul(iy, w)])
            dst_row = b.add(base, b.mul(b.add(iy, const_i64(pt)), wq))
            with for_range(b, k_a_v, k_b, "fq") as k:
                v0 = b.add(const_i64(v_lo), b.mul(k, const_i64(VL)))
                at = b.add(b.mul(v0, const_i64(sw)), const_i64(p - pl))
                store_words(self._words(src, at, offsets, load, dtype, zp_v), dst_row, v0)
        # the border chunks: each one's lanes inside the row once, then its rows
        with for_range(b, const_i64(0), n_edges, "fe") as e:
            k = b.select(b.icmp_signed("<", e, k_a_v), e, b.add(k_b, b.sub(e, k_a_v)))
            v0 = b.add(const_i64(v_lo), b.mul(k, const_i64(VL)))
            c0 = b.add(b.mul(v0, const_i64(sw)), const_i64(p - pl))
            keep = b.and_(b.icmp_signed(">=", offs_v, bound(b.sub(const_i64(0), c0))),
                          b.icmp_signed("<", offs_v, bound(b.sub(w, c0))))
            with for_range(b, const_i64(0), rows, "fr") as iy:
                src = b.gep(xb, [b.mul(iy, w)])
                dst_row = b.add(base, b.mul(b.add(iy, const_i64(pt)), wq))
                plane_at = b.add(b.mul(iy, w), c0)
                inside = b.and_(b.icmp_signed(">=", plane_at, const_i64(0)),
                                b.icmp_signed("<=", b.add(plane_at, const_i64(load)), hw))
                with b.if_else(inside, likely=True) as (vec, edge):
                    with vec:
                        val = self._words(xb, plane_at, offsets, load, dtype, zp_v)
                        store_words(b.select(keep, val, pad_v), dst_row, v0)
                    with edge:      # the corner chunks, or a plane smaller than one load:
                        # the bytes inside the plane (masked lanes are not read; those
                        # outside it are outside the row too)
                        lanes = ir.Constant(ir.VectorType(I32, load), list(range(load)))
                        lo = self._splat(b.trunc(clamp(b.sub(const_i64(0), plane_at), load),
                                                 I32), lanes.type)
                        hi = self._splat(b.trunc(clamp(b.sub(hw, plane_at), load), I32),
                                         lanes.type)
                        in_plane = b.and_(b.icmp_signed(">=", lanes, lo),
                                          b.icmp_signed("<", lanes, hi))
                        raw_ty = ir.VectorType(I8, load)
                        fn = intrinsic(self.module, f"llvm.masked.load.v{load}i8.p0", raw_ty,
                                       [raw_ty.as_pointer(), I32, in_plane.type, raw_ty])
                        # (the address may lie outside x: no inbounds)
                        at_ptr = b.bitcast(b.gep(xb, [plane_at]), raw_ty.as_pointer())
                        raw = b.call(fn, [at_ptr, ir.Constant(I32, 1), in_plane,
                                          ir.Constant(raw_ty, None)])
                        val = self._words_of(raw, offsets, dtype, zp_v)
                        store_words(b.select(keep, val, pad_v), dst_row, v0)
