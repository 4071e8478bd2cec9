"""The kernel of ``qtable`` (ops/qlookup.py: quantize a float32 tensor to 8 bits, look it up in
an 8-bit table, dequantize) with run-time extents: one pass, float32 in and out, what ORT's QDQ
files with open image sizes compute around each activation between float convolutions
(``passes/quantize_lut.py`` ``fuse_table_chains``). The float32 operations are the reference's
in its order (no fused multiply-adds), so the kernel equals the three ops bit for bit."""

from __future__ import annotations

import dataclasses

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ir.sym import product
from ..ops.quant import saturation_range
from .contraction.geometry import PARALLEL_MIN_MACS
from .helpers import F32, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .lower import KernelInfo
from .qgemm import V8F32, V8I32, QEmitter

VL = 8
# split between tasks where a lut8 kernel would (codegen/qelementwise.py: a value costs about
# as much as a multiply-add of PARALLEL_MIN_MACS's kernels)
TABLE_PARALLEL_VALUES = PARALLEL_MIN_MACS


def match_qtable(func: PrimFunc):
    """The reduction tag of ``func`` when it is exactly a ``qtable`` (ops/qlookup.py) of its
    inputs in order, with run-time extents; else None."""
    if len(func.outputs) != 1 or all(isinstance(d, int) for d in func.outputs[0].shape):
        return None
    for node in te.walk(func.outputs[0].body):
        if isinstance(node, te.Reduce):
            tag = reduction_tag(node)
            if tag is None or tag.kind != "qtable":
                return None
            if [o.uid for o in tag.operands] != [i.uid for i in func.inputs]:
                return None
            return tag
    return None


class QTableEmitter(QEmitter):
    """``qtable`` with run-time extents, 32 values a step on AVX2: four float32 vectors
    quantized as ``_QQuantize`` does (``vdivps`` unless ``unit_scale``: a multiply by the
    reciprocal with a check for values near a rounding tie measured slower than the divisions,
    which overlap the rest), clamped to the table's columns [col_lo, col_hi] (the op's hints:
    the entries outside are the ends' own), ``vcvtps2dq``, + z, saturating packs into 32
    bytes, looked up with ``vpshufb`` over the chunks of those columns only (as the ``lut8``
    kernel, on the register), widened back (``vpmovzxbd`` / ``vpmovsxbd``), minus the out zero
    point and times the out scale in float32, stored; a table that is column + shift there
    needs no lookup. A table of one row walks the tensor flat, chunks split between tasks (the
    last takes the tail); a table per channel walks rows of the channel axis, rows split. The
    last values (fewer than 32) go through a 32-value staging buffer. Without AVX2 (x86-64-v2)
    the same walk value by value, the full table, in the legalized loop nest's order. With a
    gate (a 7th operand, [N, C, 1, 1]) rows of N * C, each value times its row's gate first."""

    def emit(self) -> KernelInfo:
        y, s, z, table, os_, oz, *gate = self.func.inputs
        out = self.func.outputs[0]
        attrs = self.tag.attrs
        axis = int(attrs["table_axis"])
        self.g = self.g_v = None
        self.unit = bool(attrs.get("unit_scale", False))
        self.signed = attrs["dtype"] == "int8"
        self.table_dtype = table.dtype
        shape = tuple(out.shape)
        static = product([d for d in shape if isinstance(d, int)])
        # split between tasks where 1024 values per static value would be (the sizes are
        # unknown here, as the lut8 kernel decides)
        parallel = static * 1024 >= TABLE_PARALLEL_VALUES
        body_fn, ptr_types, n_ptrs, _ = self._start(0)
        b = self.builder
        buf = self.buffers
        self.xb, self.yb, self.tb = buf[y.uid], buf[out.uid], buf[table.uid]
        self.s, self.os = b.load(buf[s.uid]), b.load(buf[os_.uid])
        self.zp = b.sitofp(self._widen(b.load(buf[z.uid]), z.dtype), F32)
        self.oz = b.sitofp(self._widen(b.load(buf[oz.uid]), oz.dtype), F32)
        self.s_v, self.os_v = self._splat(self.s, V8F32), self._splat(self.os, V8F32)
        self.y_zp, self.oz_v = self._splat(self.zp, V8F32), self._splat(self.oz, V8F32)
        # the columns the table can differ in (``fuse_table_chains``): quantized values
        # clamped to them read the same entries, and only their 16-byte chunks are looked up
        shift = 128 if self.signed else 0
        self.cols = (int(attrs.get("col_lo", 0)), int(attrs.get("col_hi", 255)))
        self.affine = attrs.get("affine_shift")
        self.lo_v = b.fsub(self._splat(ir.Constant(F32, float(self.cols[0] - shift)), V8F32),
                           self.y_zp)
        self.hi_v = b.fsub(self._splat(ir.Constant(F32, float(self.cols[1] - shift)), V8F32),
                           self.y_zp)
        self.zp_i = b.fptosi(self.y_zp, V8I32)
        self.stage_in = alloca_once(b, ir.ArrayType(F32, 32), "stage_in")
        self.stage_out = alloca_once(b, ir.ArrayType(F32, 32), "stage_out")
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        if gate:
            self._gated_rows(shape, axis, buf[gate[0].uid], task, ntasks, parallel)
        elif axis < 0:
            total = self._dim_value(product(shape))
            chunks = b.sdiv(total, const_i64(32))
            lo, hi, last = const_i64(0), chunks, None
            if parallel:
                lo = b.sdiv(b.mul(task, chunks), ntasks)
                hi = b.sdiv(b.mul(b.add(task, const_i64(1)), chunks), ntasks)
                last = b.icmp_signed("==", b.add(task, const_i64(1)), ntasks)
            with for_range(b, lo, hi, "qc") as i:
                at = b.mul(i, const_i64(32))
                self._chunk(self._ptr(self.xb, at, F32), self._ptr(self.yb, at, F32), self.tb)
            start = b.mul(chunks, const_i64(32))
            if last is None:
                self._tail(start, total, self.tb)
            else:
                with b.if_then(last):
                    self._tail(start, total, self.tb)
        else:
            rows_v = self._dim_value(product(shape[:axis + 1]))
            inner = self._dim_value(product(shape[axis + 1:]))
            channels = int(shape[axis])
            lo, hi = const_i64(0), rows_v
            if parallel:
                lo = b.sdiv(b.mul(task, rows_v), ntasks)
                hi = b.sdiv(b.mul(b.add(task, const_i64(1)), rows_v), ntasks)
            chunks = b.sdiv(inner, const_i64(32))
            with for_range(b, lo, hi, "row") as r:
                base = b.mul(r, inner)
                row_tb = b.gep(self.tb, [b.mul(b.srem(r, const_i64(channels)), const_i64(256))])
                with for_range(b, const_i64(0), chunks, "qc") as i:
                    at = b.add(base, b.mul(i, const_i64(32)))
                    self._chunk(self._ptr(self.xb, at, F32), self._ptr(self.yb, at, F32),
                                row_tb)
                self._tail(b.add(base, b.mul(chunks, const_i64(32))), b.add(base, inner),
                           row_tb)
        info = self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)
        return dataclasses.replace(info, symbolic=True, choice="quantize, table, dequantize")

    def _gated_rows(self, shape: tuple, axis: int, gb: ir.Value, task: ir.Value,
                    ntasks: ir.Value, parallel: bool) -> None:
        """With a gate (float32 [N, C, 1, 1], ops/qlookup.py): rows of N * C, each times its
        gate value first (``vmulps`` before the quantize, the reference's float32 product),
        the table row the channel's (or the one row), rows split between tasks."""
        b = self.builder
        rows_v = self._dim_value(product(shape[:2]))
        inner = self._dim_value(product(shape[2:]))
        channels = int(shape[1]) if axis >= 0 else None
        lo, hi = const_i64(0), rows_v
        if parallel:
            lo = b.sdiv(b.mul(task, rows_v), ntasks)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), rows_v), ntasks)
        chunks = b.sdiv(inner, const_i64(32))
        with for_range(b, lo, hi, "row") as r:
            base = b.mul(r, inner)
            row_tb = self.tb if channels is None else b.gep(
                self.tb, [b.mul(b.srem(r, const_i64(channels)), const_i64(256))])
            self.g = b.load(b.gep(gb, [r]))
            self.g_v = self._splat(self.g, V8F32)
            with for_range(b, const_i64(0), chunks, "qc") as i:
                at = b.add(base, b.mul(i, const_i64(32)))
                self._chunk(self._ptr(self.xb, at, F32), self._ptr(self.yb, at, F32), row_tb)
            self._tail(b.add(base, b.mul(chunks, const_i64(32))), b.add(base, inner), row_tb)

    def _chunk(self, src: ir.Value, dst: ir.Value, tb: ir.Value) -> None:
        """32 values from float* ``src`` to float* ``dst`` through the table row ``tb``
        (without AVX2 one by one, ``_scalar``)."""
        b = self.builder
        if not self.avx2:
            with for_range(b, const_i64(0), const_i64(32), "qe") as j:
                self._scalar(b.gep(src, [j]), b.gep(dst, [j]), tb)
            return
        cvt = intrinsic(self.module, "llvm.x86.avx.cvt.ps2dq.256", V8I32, [V8F32])
        qs = []
        for k in range(4):
            v = b.load(self._ptr(src, k * VL, V8F32), align=4)
            if self.g_v is not None:
                v = b.fmul(v, self.g_v)
            if not self.unit:
                v = b.fdiv(v, self.s_v)
            # clamp, round half to even (vcvtps2dq), + z: the quantized value (as
            # _requant_int, to the table's columns; a NaN reads column col_lo, whose entry
            # is column 0's, the legalized loop nest's choice)
            v = b.select(b.fcmp_unordered("<", v, self.lo_v), self.lo_v, v)
            v = b.select(b.fcmp_ordered(">", v, self.hi_v), self.hi_v, v)
            qs.append(b.add(b.call(cvt, [v]), self.zp_i))
        if self.affine is not None:   # table[c] = c + shift on the columns: no lookup
            off = (128 if self.signed else 0) + int(self.affine)
            ts = [b.sitofp(b.add(q, ir.Constant(V8I32, [off] * VL)), V8F32) for q in qs]
        else:
            looked = self._lookup32(self._pack(qs), tb)
            ts = []
            for k in range(4):
                lanes = ir.Constant(ir.VectorType(I32, VL), list(range(8 * k, 8 * k + 8)))
                part = b.shuffle_vector(looked, looked, lanes)
                ts.append(b.sitofp(self._widen_bytes(part), V8F32))
        for k, f in enumerate(ts):
            f = b.fmul(b.fsub(f, self.oz_v), self.os_v)
            b.store(f, self._ptr(dst, k * VL, V8F32), align=4)

    def _widen_bytes(self, v: ir.Value) -> ir.Value:
        """<8 x i8> table entries as <8 x i32> (the table's dtype)."""
        b = self.builder
        return b.zext(v, V8I32) if self.table_dtype == "uint8" else b.sext(v, V8I32)

    def _scalar(self, src: ir.Value, dst: ir.Value, tb: ir.Value) -> None:
        """One value, in the legalized loop nest's order (ops/qlookup.py): a NaN reads the
        table's column 0, as the vector path's saturating packs make it."""
        b = self.builder
        lo, hi = saturation_range(self.tag.attrs["dtype"])
        v = b.load(src)
        if self.g is not None:
            v = b.fmul(v, self.g)
        if not self.unit:
            v = b.fdiv(v, self.s)
        rnd = intrinsic(self.module, "llvm.roundeven.f32", F32, [F32])
        q = b.fadd(b.call(rnd, [v]), self.zp)
        q = b.select(b.fcmp_ordered("<", q, ir.Constant(F32, lo)), ir.Constant(F32, lo), q)
        q = b.select(b.fcmp_ordered(">", q, ir.Constant(F32, hi)), ir.Constant(F32, hi), q)
        if self.signed:
            q = b.fadd(q, ir.Constant(F32, 128.0))
        q = b.select(b.fcmp_ordered("==", q, q), q, ir.Constant(F32, 0.0))
        t = b.load(b.gep(tb, [b.fptosi(q, I64)]))
        f = b.sitofp(self._widen(t, self.table_dtype), F32)
        b.store(b.fmul(b.fsub(f, self.oz), self.os), dst)

    def _lookup32(self, v: ir.Value, tb: ir.Value) -> ir.Value:
        """<32 x i8> ``tb[v]`` (int8 values index from tb + 128): ``QEmitter._lookup_cols``
        over the chunks of the columns ``v`` can hold (``self.cols``)."""
        return self._lookup_cols(v, tb, self.cols, self.signed)

    def _tail(self, start: ir.Value, stop: ir.Value, tb: ir.Value) -> None:
        """Values ``start`` .. ``stop`` (fewer than 32) through the staging buffers: copied in
        (the rest zero), one chunk, copied out."""
        b = self.builder
        if not self.avx2:
            with for_range(b, start, stop, "te") as j:
                self._scalar(b.gep(self.xb, [j]), b.gep(self.yb, [j]), tb)
            return
        n = b.sub(stop, start)
        with b.if_then(b.icmp_signed(">", n, const_i64(0))):
            sin = b.bitcast(self.stage_in, F32.as_pointer())
            sout = b.bitcast(self.stage_out, F32.as_pointer())
            for k in range(4):
                b.store(ir.Constant(V8F32, None), self._ptr(sin, k * VL, V8F32), align=4)
            with for_range(b, const_i64(0), n, "ti") as j:
                b.store(b.load(b.gep(self.xb, [b.add(start, j)])), b.gep(sin, [j]))
            self._chunk(sin, sout, tb)
            with for_range(b, const_i64(0), n, "to") as j:
                b.store(b.load(b.gep(sout, [j])), b.gep(self.yb, [b.add(start, j)]))
