"""A kernel for ``resize_axis`` (ops/resize.py: one axis of a Resize, ``y[.., o, ..] = sum_t
w[o, t] * x[.., idx[o, t], ..] + fill[o]``, tagged ``resize_axis`` by its legalizer), float32,
static or run-time extents, the tables read at run time (constants of the export, or
``resize_taps``'s output). The generic loop nest took a GAN upsampler's bilinear 2x of
32x128x128 in 742 us (the innermost axis) + 231 us (the next one).

Two shapes:

- **Rows** (an axis with elements after it): each output row is a weighted sum of T input rows,
  vectors along the row, the weights broadcast.
- **Gather** (the innermost axis): per block of ``vl`` outputs, the tap indices (clamped as the
  reference does) and weights are deinterleaved from the tables once per chunk of rows; where
  the block's taps span fewer than ``vl`` inputs (any upsampling, 2x: 9 inputs per 16 outputs)
  each row loads one vector at the block's least index and picks every tap with one variable
  permute (``vpermps``); other blocks, and the last ``O % vl`` outputs, go element by element.
  x86 with AVX2 or AVX-512 only (no variable float permute below); elsewhere the generic nest.

The sum runs over the taps in order, ``w * x`` then fused multiply-adds, then ``+ fill``, as the
generic loop nest computes it.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ir.sym import product
from .helpers import F32, I32, I64, const_i64, for_range, intrinsic
from .lower import KernelEmitter, KernelInfo, _plan_stages, is_symbolic

# Outputs below which the kernel stays on one thread.
PARALLEL_MIN_OUTPUTS = 1 << 14
# Rows of the gather shape whose tap vectors are built once (a block's input lines stay in L1).
CHUNK_ROWS = 32
# Taps per output the kernel unrolls (linear 2, cubic 4; an antialiased downscale's filter can be
# far wider: the generic loop nest keeps those).
MAX_TAPS = 8
# The variable float permute per vector width (x86).
PERMUTE = {16: "llvm.x86.avx512.permvar.sf.512", 8: "llvm.x86.avx2.permps"}


def match_resize(func: PrimFunc):
    """(output, x, idx, w, fill, axis, taps) when ``func`` is exactly one float32 ``resize_axis``
    (nothing fused before or after it) with a static tap count of at most MAX_TAPS, else
    None."""
    if len(func.outputs) != 1 or len(func.inputs) != 4:
        return None
    materialized, outputs = _plan_stages(func)
    if materialized:
        return None
    out, body = outputs[0]
    if out.dtype != "float32" or not isinstance(body, te.Binary) or body.op != "add" \
            or not isinstance(body.a, te.Reduce) or not isinstance(body.b, te.Read):
        return None
    tag = reduction_tag(body.a)
    if tag is None or tag.kind != "resize_axis":
        return None
    x, idx, w, fill = tag.operands
    if [t.uid for t in func.inputs] != [x.uid, idx.uid, w.uid, fill.uid] \
            or body.b.tensor.uid != fill.uid or x.dtype != "float32":
        return None
    taps = idx.shape[1]
    if not isinstance(taps, int) or not 1 <= taps <= MAX_TAPS:
        return None
    return out, x, idx, w, fill, tag.attrs["along"], taps


class ResizeEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match, vl: int,
                 size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.out, self.x, self.idx, self.w, self.fill, self.axis, self.taps = match
        self.vl = vl
        self.vty = ir.VectorType(F32, vl)

    def emit(self) -> KernelInfo:
        body_fn, ptr_types = self._begin_body([self.x, self.idx, self.w, self.fill, self.out],
                                              workspace=False)
        x_ptr, idx_ptr, w_ptr, fill_ptr, out_ptr = body_fn.args[:5]
        task, ntasks = body_fn.args[len(ptr_types):]
        shape = self.out.shape
        static = [n for n in shape if isinstance(n, int)]
        work = product(static) if static else 1
        threshold = PARALLEL_MIN_OUTPUTS // 8 if self.symbolic else PARALLEL_MIN_OUTPUTS
        parallel = work >= threshold and any(not isinstance(n, int) or n > 1 for n in shape)
        inner_dims = shape[self.axis + 1:]
        rows_shape = all(isinstance(n, int) and n == 1 for n in inner_dims)
        ptrs = (x_ptr, idx_ptr, w_ptr, fill_ptr, out_ptr)
        if rows_shape:
            self._gather(ptrs, task, ntasks, parallel)
        else:
            self._rows(ptrs, task, ntasks, parallel)
        self.builder.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        return KernelInfo(self.symbol, 4, 1, 0, parallel, symbolic=self.symbolic,
                          choice="resize: " + ("permuted row blocks" if rows_shape
                                               else "weighted rows"))

    # ---- shared pieces ------------------------------------------------------------------------

    def _split(self, n: ir.Value, task, ntasks, parallel: bool) -> tuple[ir.Value, ir.Value]:
        b = self.builder
        if not parallel:
            return const_i64(0), n
        return (b.sdiv(b.mul(task, n), ntasks),
                b.sdiv(b.mul(b.add(task, const_i64(1)), n), ntasks))

    def _tap(self, idx_ptr, w_ptr, o: ir.Value, t: int) -> tuple[ir.Value, ir.Value]:
        """(clamped source index, weight) of output ``o``'s tap ``t``."""
        b = self.builder
        at = b.add(b.mul(o, const_i64(self.taps)), const_i64(t))
        src = b.load(b.gep(idx_ptr, [at], inbounds=True))
        src = self._clamp(src, self._dim_value(self.x.shape[self.axis]))
        return src, b.load(b.gep(w_ptr, [at], inbounds=True))

    def _clamp(self, v: ir.Value, size: ir.Value) -> ir.Value:
        b = self.builder
        zero = ir.Constant(v.type, None)
        last = b.sub(size, const_i64(1))
        if isinstance(v.type, ir.VectorType):
            last = self._splat(b.trunc(last, v.type.element), v.type.count)
        v = b.select(b.icmp_signed("<", v, zero), zero, v)
        return b.select(b.icmp_signed(">", v, last), last, v)

    def _splat(self, s: ir.Value, n: int) -> ir.Value:
        b = self.builder
        vec = b.insert_element(ir.Constant(ir.VectorType(s.type, n), ir.Undefined), s,
                               ir.Constant(I32, 0))
        return b.shuffle_vector(vec, ir.Constant(ir.VectorType(s.type, n), ir.Undefined),
                                ir.Constant(ir.VectorType(I32, n), [0] * n))

    def _fma(self, a: ir.Value, x: ir.Value, acc: ir.Value) -> ir.Value:
        ty = a.type
        name = f"llvm.fma.v{ty.count}f32" if isinstance(ty, ir.VectorType) else "llvm.fma.f32"
        return self.builder.call(intrinsic(self.module, name, ty, [ty, ty, ty]), [a, x, acc])

    def _scalar_output(self, x_row: ir.Value, idx_ptr, w_ptr, fill_ptr, out_row: ir.Value,
                       o: ir.Value) -> None:
        """One output element of the gather shape, element by element."""
        b = self.builder
        acc = None
        for t in range(self.taps):
            src, wt = self._tap(idx_ptr, w_ptr, o, t)
            v = b.load(b.gep(x_row, [src], inbounds=True))
            acc = b.fmul(wt, v) if acc is None else self._fma(wt, v, acc)
        acc = b.fadd(acc, b.load(b.gep(fill_ptr, [o], inbounds=True)))
        b.store(acc, b.gep(out_row, [o], inbounds=True))

    # ---- an axis with elements after it: weighted rows ----------------------------------------

    def _rows(self, ptrs, task, ntasks, parallel: bool) -> None:
        x_ptr, idx_ptr, w_ptr, fill_ptr, out_ptr = ptrs
        b = self.builder
        shape, a = self.out.shape, self.axis
        n_out, n_in = self._dim_value(shape[a]), self._dim_value(self.x.shape[a])
        inner = self._dim_value(product(shape[a + 1:]))
        rows = self._dim_value(product(shape[:a + 1]))
        lo, hi = self._split(rows, task, ntasks, parallel)
        vl, vptr = self.vl, self.vty.as_pointer()
        whole = b.mul(b.sdiv(inner, const_i64(vl)), const_i64(vl))
        with for_range(b, lo, hi, "row") as r:
            n = b.sdiv(r, n_out)
            o = b.srem(r, n_out)
            base = b.mul(n, n_in)
            srcs, wts = [], []
            for t in range(self.taps):
                src, wt = self._tap(idx_ptr, w_ptr, o, t)
                srcs.append(b.gep(x_ptr, [b.mul(b.add(base, src), inner)], inbounds=True))
                wts.append(wt)
            fill = b.load(b.gep(fill_ptr, [o], inbounds=True))
            out_row = b.gep(out_ptr, [b.mul(r, inner)], inbounds=True)
            wv = [self._splat(wt, vl) for wt in wts]
            fv = self._splat(fill, vl)
            with for_range(b, const_i64(0), b.sdiv(inner, const_i64(vl)), "vec") as j:
                at = b.mul(j, const_i64(vl))
                acc = None
                for src, wt in zip(srcs, wv):
                    v = b.load(b.bitcast(b.gep(src, [at], inbounds=True), vptr), align=4)
                    acc = b.fmul(wt, v) if acc is None else self._fma(wt, v, acc)
                b.store(b.fadd(acc, fv), b.bitcast(b.gep(out_row, [at], inbounds=True), vptr),
                        align=4)
            with for_range(b, whole, inner, "tail") as j:
                acc = None
                for src, wt in zip(srcs, wts):
                    v = b.load(b.gep(src, [j], inbounds=True))
                    acc = b.fmul(wt, v) if acc is None else self._fma(wt, v, acc)
                b.store(b.fadd(acc, fill), b.gep(out_row, [j], inbounds=True))

    # ---- the innermost axis: permuted blocks --------------------------------------------------

    def _gather(self, ptrs, task, ntasks, parallel: bool) -> None:
        x_ptr, idx_ptr, w_ptr, fill_ptr, out_ptr = ptrs
        b = self.builder
        shape, a = self.out.shape, self.axis
        n_out, n_in = self._dim_value(shape[a]), self._dim_value(self.x.shape[a])
        rows = self._dim_value(product(shape[:a]))
        lo, hi = self._split(rows, task, ntasks, parallel)
        vl, T = self.vl, self.taps
        blocks = b.sdiv(n_out, const_i64(vl))
        whole = b.mul(blocks, const_i64(vl))
        chunks = b.sdiv(b.add(b.sub(hi, lo), const_i64(CHUNK_ROWS - 1)), const_i64(CHUNK_ROWS))
        ity = ir.VectorType(I64, vl * T)
        i32v = ir.VectorType(I32, vl)
        permute = intrinsic(self.module, PERMUTE[vl], self.vty, [self.vty, i32v])
        vptr = self.vty.as_pointer()
        n_in32 = b.trunc(n_in, I32)
        with for_range(b, const_i64(0), chunks, "chunk") as c:
            r0 = b.add(lo, b.mul(c, const_i64(CHUNK_ROWS)))
            r1 = b.add(r0, const_i64(CHUNK_ROWS))
            r1 = b.select(b.icmp_signed("<", hi, r1), hi, r1)
            with for_range(b, const_i64(0), blocks, "block") as k:
                o0 = b.mul(k, const_i64(vl))
                at = b.mul(o0, const_i64(T))
                idx_all = b.load(b.bitcast(b.gep(idx_ptr, [at], inbounds=True),
                                           ity.as_pointer()), align=8)
                w_all = b.load(b.bitcast(b.gep(w_ptr, [at], inbounds=True),
                                         ir.VectorType(F32, vl * T).as_pointer()), align=4)
                src, wts = [], []
                for t in range(T):
                    lanes = ir.Constant(ir.VectorType(I32, vl), [j * T + t for j in range(vl)])
                    s = b.shuffle_vector(idx_all, ir.Constant(ity, ir.Undefined), lanes)
                    s = self._clamp(b.trunc(s, i32v), n_in)
                    src.append(s)
                    wts.append(b.shuffle_vector(w_all, ir.Constant(w_all.type, ir.Undefined),
                                                lanes))
                lo_i, hi_i = src[0], src[0]
                for s in src[1:]:
                    lo_i = b.select(b.icmp_signed("<", s, lo_i), s, lo_i)
                    hi_i = b.select(b.icmp_signed(">", s, hi_i), s, hi_i)
                least = self._reduce_i32(lo_i, "smin")
                most = self._reduce_i32(hi_i, "smax")
                # the vector read at the block's least index, moved left to stay in the row
                start = b.sub(n_in32, ir.Constant(I32, vl))
                start = b.select(b.icmp_signed("<", start, least), start, least)
                fits = b.and_(b.icmp_signed(">=", n_in32, ir.Constant(I32, vl)),
                              b.icmp_signed("<", b.sub(most, start), ir.Constant(I32, vl)))
                fill = b.load(b.bitcast(b.gep(fill_ptr, [o0], inbounds=True), vptr), align=4)
                with b.if_else(fits) as (then, other):
                    with then:
                        rel = [b.sub(s, self._splat(start, vl)) for s in src]
                        offset = b.sext(start, I64)
                        with for_range(b, r0, r1, "r") as r:
                            x_row = b.gep(x_ptr, [b.add(b.mul(r, n_in), offset)], inbounds=True)
                            v = b.load(b.bitcast(x_row, vptr), align=4)
                            acc = None
                            for p, wt in zip(rel, wts):
                                g = b.call(permute, [v, p])
                                acc = b.fmul(wt, g) if acc is None else self._fma(wt, g, acc)
                            o_at = b.add(b.mul(r, n_out), o0)
                            b.store(b.fadd(acc, fill),
                                    b.bitcast(b.gep(out_ptr, [o_at], inbounds=True), vptr),
                                    align=4)
                    with other:
                        with for_range(b, r0, r1, "rs") as r:
                            x_row = b.gep(x_ptr, [b.mul(r, n_in)], inbounds=True)
                            out_row = b.gep(out_ptr, [b.mul(r, n_out)], inbounds=True)
                            with for_range(b, o0, b.add(o0, const_i64(vl)), "os") as o:
                                self._scalar_output(x_row, idx_ptr, w_ptr, fill_ptr, out_row, o)
            with for_range(b, r0, r1, "rt") as r:
                x_row = b.gep(x_ptr, [b.mul(r, n_in)], inbounds=True)
                out_row = b.gep(out_ptr, [b.mul(r, n_out)], inbounds=True)
                with for_range(b, whole, n_out, "ot") as o:
                    self._scalar_output(x_row, idx_ptr, w_ptr, fill_ptr, out_row, o)

    def _reduce_i32(self, v: ir.Value, op: str) -> ir.Value:
        fn = intrinsic(self.module, f"llvm.vector.reduce.{op}.v{v.type.count}i32", I32, [v.type])
        return self.builder.call(fn, [v])


def emit_resize(module: ir.Module, func: PrimFunc, symbol: str, vl: int, arch: str,
                size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The resize_axis kernel on x86 (``arch``) with 8- or 16-float vectors (``vl``), static or
    with run-time extents (``size_vars``); None for anything else."""
    if arch != "x86_64" or vl not in PERMUTE or (is_symbolic(func) and not size_vars):
        return None
    match = match_resize(func)
    if match is None:
        return None
    return ResizeEmitter(module, func, symbol, match, vl, size_vars).emit()

