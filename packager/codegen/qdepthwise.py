"""The quantized depthwise convolution kernel (``qdwconv2d``, ``ops/qlinear.py``): uint8/int8
in, one input channel per output channel, any window, padding and stride, ONNX Runtime's
requantization (or a float32 result) fused into the epilogue.

Exact in float32: the fusion (``passes/fuse_qdq.py``) emits ``qdwconv2d`` only where every
partial sum of ``sum (x - x_zp) * (w - w_zp)`` stays below 2**24 (a 5x5 window of 255 * 128
products is 816 000), so float32 multiply-adds in any order give the integer sum exactly; it
is converted to int32 and the bias added in int32 (wrapping as ONNX Runtime's accumulator:
its quantizer writes biases near 2**31 for channels of tiny weight scale), and
``float32(acc + bias) * multiplier`` is MLAS's ``MlasRequantizeOutput`` operand.
Float32 keeps the depthwise arithmetic at 8 multiply-adds per ``vfmadd231ps`` (two a cycle),
with no int16 saturation to mind and no widening of products.

Each task takes whole (image, channel) planes. A plane is copied once into a zero-margined
float32 buffer of the task's own (``x - x_zp``, one buffer per horizontal stride phase: column
``v`` of phase ``p`` holds input column ``v * sw + p - pad_left``), so for a tap (ky, kx) the
8 inputs of 8 consecutive outputs are one contiguous load at row ``oy * sh + ky`` of phase
``kx % sw``, column ``ox + kx // sw``. A phase row narrower than a vector (small images: 14 x 14 at
stride 2, 7 x 7) is filled as one vector per row, its bytes loaded on into the next row and
the lanes past the row zeroed (the plane's last rows, whose load would leave it, column by
column). Rows of two vectors or more are computed in blocks of
``WIDE_BLOCK`` (rows x vectors: the input vectors that several rows of the block read are
loaded once); narrower rows several at a time, ``ACCUMULATORS`` vectors in all: independent
chains that hide the multiply-add latency. The weights are broadcast once per plane. A row's
partial last vector stores its lanes one by one, except where whole rows are computed in
order (the narrow rows): there it is stored whole, its extra lanes landing in the next row,
which is stored after it (the plane's last row excepted). On AVX2 the 8-bit results are
packed 4 or 2 vectors at a time (``vpackssdw``, ``vpackuswb``/``vpacksswb``, ``vpermd``).
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from .contraction.geometry import MAX_TASK_REGIONS, PARALLEL_MIN_MACS
from .helpers import F32, I8, I32, const_i64, for_range, intrinsic
from .lower import KernelInfo
from .qgemm import V8F32, V8I32, QEmitter, align_workspace, match_qgemm

VL = 8
# Output vectors computed together (a row's, or several narrow rows'): 6 independent chains
# of multiply-adds cover the FMA latency (4 cycles, 2 a cycle); the window's broadcast weights
# that do not fit the remaining registers are reloaded from the stack.
ACCUMULATORS = 6
# Rows of at least ACCUMULATORS vectors: rows x vectors per block; the input vectors that
# several of the block's rows read (stride 1: rows oy + r and tap ky + 1 - r) are loaded once.
WIDE_BLOCK = (3, 2)
# A depthwise multiply-add moves its own input (no reuse across channels): threads from
# PARALLEL_MIN_MACS / 2 (as codegen/depthwise/static.py's DEPTHWISE_MAC_COST).
MAC_COST = 2


def emit_qdepthwise(module: ir.Module, func: PrimFunc, symbol: str, vl: int
                    ) -> KernelInfo | None:
    m = match_qgemm(func, ("qdwconv2d",))
    if m is None:
        return None
    avx = module.triple.startswith("x86_64") and vl >= 8
    return _QDepthwise(module, func, symbol, m[1], avx).emit()


class _QDepthwise(QEmitter):
    def emit(self) -> KernelInfo:
        x, wf, x_zp, bias, mult, y_zp = self.func.inputs
        y = self.func.outputs[0]
        batch, c, h, w = (int(d) for d in x.shape)
        kh, kw = self.tag.attrs["kernel"]
        sh, sw = self.tag.attrs["strides"]
        pt, pl = self.tag.attrs["padding"][:2]
        _, _, oh, ow = (int(d) for d in y.shape)
        nch = -(-ow // VL)
        prow = (oh - 1) * sh + kh                      # plane rows the outputs read
        wq = nch * VL + (kw - 1) // sw                 # columns per phase row
        phase_floats = prow * wq
        p_bytes = align_workspace(sw * phase_floats * 4)
        planes = batch * c
        parallel = planes * oh * ow * kh * kw * MAC_COST >= PARALLEL_MIN_MACS and planes > 1
        regions = MAX_TASK_REGIONS if parallel else 1
        body_fn, ptr_types, n_ptrs, ws = self._start(p_bytes * regions)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        if parallel:
            cap = const_i64(regions)
            eff = b.select(b.icmp_signed("<", ntasks, cap), ntasks, cap)
            with b.if_then(b.icmp_signed(">=", task, eff), likely=False):
                b.ret_void()
            lo = b.sdiv(b.mul(task, const_i64(planes)), eff)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(planes)), eff)
            region = task
        else:
            lo, hi, region = const_i64(0), const_i64(planes), const_i64(0)
        xzp = b.load(buf[x_zp.uid])
        if not self.float_out:
            self.y_zp = self._splat(b.load(buf[y_zp.uid]), V8F32)
        plane = b.bitcast(b.gep(ws, [b.mul(region, const_i64(p_bytes))]), F32.as_pointer())
        # the margins stay zero: every plane writes the same rectangle
        with for_range(b, const_i64(0), const_i64(sw * phase_floats), "pz") as i:
            b.store(ir.Constant(F32, 0.0), b.gep(plane, [i]))
        fma = intrinsic(self.module, "llvm.fmuladd.v8f32", V8F32, [V8F32, V8F32, V8F32])
        with for_range(b, lo, hi, "pl") as pidx:
            ch = b.srem(pidx, const_i64(c))
            self._fill(b.gep(buf[x.uid], [b.mul(pidx, const_i64(h * w))]), plane, xzp,
                       x.dtype, h, w, sw, pt, pl, prow, wq)
            wv = [self._splat(b.load(b.gep(buf[wf.uid], [b.add(b.mul(ch, const_i64(kh * kw)),
                                                                 const_i64(t))])), V8F32)
                  for t in range(kh * kw)]
            bias_i = b.load(b.gep(buf[bias.uid], [ch]))
            bias_v = self._splat(bias_i, V8I32)
            # with the bias inside the float32-exact range (the fusion checked it), the
            # accumulators start from it and no int32 round trip is needed
            start = (self._splat(b.sitofp(bias_i, F32), V8F32) if self.tag.attrs.get("bias_in_float")
                     else ir.Constant(V8F32, None))
            mult_v = self._splat(b.load(b.gep(buf[mult.uid], [ch])), V8F32)
            off_v = (self._splat(b.load(b.gep(buf[y_zp.uid], [ch])), V8F32)
                     if self.float_out else None)
            yb = b.gep(buf[y.uid], [b.mul(pidx, const_i64(oh * ow))])

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
                        for kx in range(kw):
                            base = b.add(row, const_i64((kx % sw) * phase_floats + kx // sw))
                            for j in range(n):
                                col = b.mul(b.add(q0, const_i64(j)), const_i64(VL))
                                v = b.load(self._ptr(plane, b.add(base, col), V8F32), align=4)
                                accs[r][j] = b.call(fma, [v, wv[ky * kw + kx], accs[r][j]])
                packs = self.avx2 and not self.float_out
                for r in range(rows):
                    oy = b.add(oy0, const_i64(r))
                    res = []
                    for j in range(n):
                        total = accs[r][j]
                        if not self.tag.attrs.get("bias_in_float"):
                            total = b.sitofp(b.add(b.fptosi(total, V8I32), bias_v), V8F32)
                        res.append(self._requant(b.fmul(total, mult_v), off_v, packs))
                    whole = n - (1 if last_partial else 0)
                    j = 0
                    while j < n:
                        dst = b.add(b.mul(oy, const_i64(ow)),
                                    b.mul(b.add(q0, const_i64(j)), const_i64(VL)))
                        if packs and whole - j >= 2:    # 4 or 2 vectors with two packs
                            k = 4 if whole - j >= 4 else 2
                            b.store(self._pack(res[j:j + k]),
                                    self._ptr(yb, dst, ir.VectorType(I8, VL * k)), align=1)
                            j += k
                            continue
                        q = b.trunc(res[j], self.out_vec) if packs else res[j]
                        if last_partial and j == n - 1 and spill:
                            # a row's partial last vector spills into the next row, which
                            # is stored after it; the plane's last row stores lane by lane
                            inner = b.icmp_signed("<", oy, const_i64(oh - 1))
                            with b.if_else(inner, likely=True) as (then, other):
                                with then:
                                    b.store(q, self._ptr(yb, dst, self.out_vec), align=1)
                                with other:
                                    for lane in range(ow % VL):
                                        b.store(b.extract_element(q, ir.Constant(I32, lane)),
                                                b.gep(yb, [b.add(dst, const_i64(lane))]))
                        elif last_partial and j == n - 1:
                            for lane in range(ow % VL):
                                b.store(b.extract_element(q, ir.Constant(I32, lane)),
                                        b.gep(yb, [b.add(dst, const_i64(lane))]))
                        else:
                            b.store(q, self._ptr(yb, dst, self.out_vec), align=1)
                        j += 1

            if nch >= WIDE_BLOCK[1]:    # rows of 2 vectors or more: WIDE_BLOCK at a time
                rows_b, chunks = min(WIDE_BLOCK[0], oh), WIDE_BLOCK[1]
                full = ow // VL
                loop_groups = full // chunks
                rest = full % chunks + (1 if ow % VL else 0)

                def row_block(oy0, rows: int) -> None:
                    with for_range(b, const_i64(0), const_i64(loop_groups), "qg") as g:
                        group(oy0, rows, b.mul(g, const_i64(chunks)), chunks, False)
                    if rest:
                        group(oy0, rows, const_i64(loop_groups * chunks), rest, bool(ow % VL))

                with for_range(b, const_i64(0), const_i64(oh // rows_b), "oyb") as t:
                    row_block(b.mul(t, const_i64(rows_b)), rows_b)
                if oh % rows_b:
                    row_block(const_i64(oh - oh % rows_b), oh % rows_b)
            else:                       # narrow rows: whole rows, several at a time
                rows = max(1, min(oh, ACCUMULATORS // nch))
                if oh // rows:
                    with for_range(b, const_i64(0), const_i64(oh // rows), "oyb") as t:
                        group(b.mul(t, const_i64(rows)), rows, const_i64(0), nch,
                              bool(ow % VL), spill=True)
                if oh % rows:
                    group(const_i64(oh - oh % rows), oh % rows, const_i64(0), nch,
                          bool(ow % VL), spill=True)
        return self._finish(body_fn, n_ptrs, ptr_types, p_bytes * regions, parallel)

    def _requant(self, f: ir.Value, off: ir.Value | None, wide: bool = False) -> ir.Value:
        """``_requant_int`` (qgemm.py)."""
        return self._requant_int(f, off, wide)

    def _fill(self, xb, plane, xzp, dtype, h, w, sw, pt, pl, prow, wq) -> None:
        """plane[p, u, v] = x[u - pt, v * sw + p - pl] - x_zp as float32 inside the image
        (the rest stays zero): 8 columns at a time (one load of 8 * sw bytes, every sw-th
        lane widened), the row's last columns one by one."""
        b = self.builder
        rows = min(h, prow - pt)
        src_ty = ir.VectorType(ir.IntType(8), VL * sw)
        zp_v = self._splat(xzp, V8I32)
        for p in range(sw):
            v_lo = max(0, -(-(pl - p) // sw))
            v_hi = min(wq, (w - 1 + pl - p) // sw + 1)
            if rows <= 0 or v_hi <= v_lo:
                continue
            nvec = 0      # whole vectors whose wide load stays inside the row
            while (v_lo + (nvec + 1) * VL <= v_hi
                   and (v_lo + nvec * VL) * sw + p - pl + VL * sw <= w):
                nvec += 1
            lanes = ir.Constant(ir.VectorType(I32, VL), [j * sw for j in range(VL)])
            if nvec == 0 and v_hi - v_lo <= VL and v_lo + VL <= wq:
                first = self._fill_narrow(xb, plane, zp_v, dtype, w, sw, pt, pl, p, prow,
                                          wq, v_lo, v_hi, rows, h * w, lanes)
            else:
                first = 0
            with for_range(b, const_i64(first), const_i64(rows), "fy") as iy:
                src = b.gep(xb, [b.mul(iy, const_i64(w))])
                dst = b.gep(plane, [b.add(const_i64(p * prow * wq),
                                          b.mul(b.add(iy, const_i64(pt)), const_i64(wq)))])
                if nvec:
                    with for_range(b, const_i64(0), const_i64(nvec), "fq") as q:
                        v0 = b.add(const_i64(v_lo), b.mul(q, const_i64(VL)))
                        ix = b.add(b.mul(v0, const_i64(sw)), const_i64(p - pl))
                        raw = b.load(self._ptr(src, ix, src_ty), align=1)
                        if sw > 1:
                            raw = b.shuffle_vector(raw, ir.Constant(src_ty, None), lanes)
                        wide = (b.zext(raw, V8I32) if dtype == "uint8" else b.sext(raw, V8I32))
                        val = b.sitofp(b.sub(wide, zp_v), V8F32)
                        b.store(val, self._ptr(dst, v0, V8F32), align=4)
                with for_range(b, const_i64(v_lo + nvec * VL), const_i64(v_hi), "fv") as v:
                    ix = b.add(b.mul(v, const_i64(sw)), const_i64(p - pl))
                    val = b.sub(self._widen(b.load(b.gep(src, [ix])), dtype), xzp)
                    b.store(b.sitofp(val, F32), b.gep(dst, [v]))

    def _fill_narrow(self, xb, plane, zp_v, dtype, w, sw, pt, pl, p, prow, wq, v_lo, v_hi,
                     rows, plane_bytes, lanes) -> int:
        """Phase ``p``'s rows when they are narrower than a vector (small images): each row
        as one vector, its 8 * sw bytes loaded from the row's first column on (running into
        the next row), the lanes past the row's v_hi - v_lo columns set to zero (the right
        margin, which must stay zero). Rows whose load would leave the plane are left to the
        caller's column loop: returns the first of them."""
        b = self.builder
        src_ty = ir.VectorType(ir.IntType(8), VL * sw)
        x0 = v_lo * sw + p - pl
        fit = max(0, min(rows, (plane_bytes - x0 - VL * sw) // w + 1))
        if fit == 0:
            return 0
        keep = ir.Constant(ir.VectorType(ir.IntType(1), VL),
                           [1 if j < v_hi - v_lo else 0 for j in range(VL)])
        zero = ir.Constant(V8F32, [0.0] * VL)
        with for_range(b, const_i64(0), const_i64(fit), "fn") as iy:
            raw = b.load(self._ptr(xb, b.add(b.mul(iy, const_i64(w)), const_i64(x0)), src_ty),
                         align=1)
            if sw > 1:
                raw = b.shuffle_vector(raw, ir.Constant(src_ty, None), lanes)
            wide = b.zext(raw, V8I32) if dtype == "uint8" else b.sext(raw, V8I32)
            val = b.select(keep, b.sitofp(b.sub(wide, zp_v), V8F32), zero)
            at = b.add(const_i64(p * prow * wq + v_lo),
                       b.mul(b.add(iy, const_i64(pt)), const_i64(wq)))
            b.store(val, self._ptr(plane, at, V8F32), align=4)
        return fit
