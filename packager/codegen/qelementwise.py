"""Vector kernels for the integer elementwise ops of ``ops/qelementwise.py``: ``qbinary``
(QLinearAdd / QLinearMul) and ``qgavgpool`` (QLinearGlobalAveragePool), 8 bytes per vector;
``lut8`` tables and a float32 input's ``quantize`` (``_QQuantize``) on AVX2 (``qtable``'s
kernel, quantize, table and dequantize in one pass, is ``codegen/qtable.py``).

``qbinary``: the output is walked as rows x inner (one row when b has a's shape or one value;
otherwise a row per value of b, the gate of a squeeze-and-excitation block broadcast once per
row). Per vector: 8 bytes of a (and of b) widened to int32, the zero points subtracted, the
product in int32 (mul) or both operands scaled in float32 (add), then the requantize epilogue
of ``codegen/qgemm.py`` (``vcvtps2dq`` rounding and saturating packs of two vectors into one
16-byte store on AVX2; the 1.5 * 2**23 rounding elsewhere). A row's last partial vector is
gathered and stored lane by lane.

``qgavgpool``: 8 planes (image, channel) at a time, each summed with <8 x i32> accumulators
(bytes widened), reduced, the lanes requantized together and stored as 8 bytes.

The float32 operations are the reference's, in its order, without contraction into fused
multiply-adds, so the kernels equal ``ops/qelementwise.py``'s numpy definitions bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.sym import product
from ..ops.qelementwise import row_broadcast
from ..ops.quant import saturation_range
from .helpers import F32, I8, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .contraction.geometry import PARALLEL_MIN_MACS
from .lower import KernelInfo
from .qgemm import V8F32, V8I8, V8I32, QEmitter, match_qgemm
from .qtable import QTableEmitter, match_qtable
from .threads import DEFAULTS, SplitThresholds

VL = 8
# A table lookup splits its rows between threads from this many bytes on (a byte costs about
# as much as a multiply-add of PARALLEL_MIN_MACS's kernels).
TABLE_PARALLEL_BYTES = PARALLEL_MIN_MACS


def emit_qelementwise(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                      options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    avx2 = module.triple.startswith("x86_64") and vl >= 8
    if avx2:
        qdtype = match_quantize(func)
        if qdtype is not None:
            # split between tasks where the generic loop nest other levels get is (lower.py):
            # a bundle's levels must agree on every kernel's signature
            return _QQuantize(module, func, symbol, _TableTag(qdtype, -1), avx2).emit(
                options.parallel_min_outputs)
    table = match_lut8(func)
    if table is not None:
        return _QTable(module, func, symbol, _TableTag(func.inputs[0].dtype, table), avx2,
                       zmm=avx2 and vl >= 16).emit()
    m = match_qgemm(func, ("qbinary", "qgavgpool"))
    if m is None:
        return None
    kind, tag = m
    cls = _QBinary if kind == "qbinary" else _QGlobalAverage
    return cls(module, func, symbol, tag, avx2).emit()


def emit_qelementwise_sized(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                            size_vars: tuple[str, ...],
                            options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """The ``lut8`` kernel with run-time extents (batch and image sizes open, the table's
    axis static: QDQ files whose image size stays open), or ``qtable``'s (``codegen/
    qtable.py``); on AVX2 also a float32 tensor's ``quantize`` (after a squeeze-and-excitation
    gate's multiply too) and an 8-bit tensor's ``dequantize`` (one scale and zero point each,
    ``_QConvertSized``); None for anything else."""
    avx2 = module.triple.startswith("x86_64") and vl >= 8
    tag = match_qtable(func)
    if tag is not None:
        return QTableEmitter(module, func, symbol, tag, avx2, size_vars).emit()
    if avx2:
        qdtype = match_quantize(func, symbolic=True)
        kind = "quantize" if qdtype is not None else None
        if kind is None:
            qdtype = match_dequantize(func)
            kind = "dequantize" if qdtype is not None else None
        if kind is not None:
            return _QConvertSized(module, func, symbol, _TableTag(qdtype, -1), avx2,
                                  size_vars).emit(kind, options.parallel_min_outputs)
        added = match_dequantized_add(func)
        if added is not None:
            return _QDequantizedAdd(module, func, symbol, _TableTag(added[0], -1), avx2,
                                    size_vars).emit_add(added[1], options.parallel_min_outputs)
        looked = match_table_dequantize(func)
        if looked is not None:
            return _QTableDequantize(module, func, symbol, _TableTag(looked[0], looked[1]),
                                     avx2, size_vars).emit_table(
                                         options.parallel_min_outputs)
        gated = match_gated_quantize(func)
        if gated is not None:
            return _QConvertSized(module, func, symbol, _TableTag(gated[0], -1), avx2,
                                  size_vars).emit_gated(gated[1:],
                                                        options.parallel_min_outputs)
    table = match_lut8(func, symbolic=True)
    if table is None:
        return None
    return _QTable(module, func, symbol, _TableTag(func.inputs[0].dtype, table), avx2,
                   size_vars, zmm=avx2 and vl >= 16).emit()


def match_lut8(func: PrimFunc, symbolic: bool = False) -> int | None:
    """The table's axis (-1: one row) when ``func`` is exactly a ``lut8`` (ops/qlinear.py) of
    its first input through its second: one stage ``table[axis index or 0, x[i] (+ 128)]``;
    of static shape, or with ``symbolic`` of run-time extents but for the table's axis."""
    if len(func.inputs) != 2 or len(func.outputs) != 1:
        return None
    x, table = func.inputs
    return _lut8_axis(x, table, func.outputs[0], symbolic)


def _lut8_axis(x: te.Tensor, table: te.Tensor, out: te.Tensor, symbolic: bool) -> int | None:
    """``match_lut8`` on the stage ``out``."""
    body = out.body
    if (x.dtype not in ("int8", "uint8") or table.dtype not in ("int8", "uint8")
            or len(table.shape) != 2 or table.shape[1] != 256 or tuple(out.shape) != tuple(x.shape)
            or symbolic == all(isinstance(d, int) for d in x.shape) or not isinstance(body, te.Read)
            or body.tensor.uid != table.uid or len(body.indices) != 2):
        return None
    row, col = body.indices
    if isinstance(col, te.Binary) and col.op == "add" and x.dtype == "int8" \
            and isinstance(col.b, te.Const) and col.b.value == 128:
        col = col.a
    elif x.dtype == "int8":
        return None
    if isinstance(col, te.Cast):
        col = col.value
    if not (isinstance(col, te.Read) and col.tensor.uid == x.uid
            and tuple(col.indices) == tuple(out.axes)):
        return None
    if isinstance(row, te.Const) and row.value == 0 and table.shape[0] == 1:
        return -1
    if row in out.axes and table.shape[0] == x.shape[list(out.axes).index(row)]:
        return list(out.axes).index(row)
    return None


def match_quantize(func: PrimFunc, symbolic: bool = False) -> str | None:
    """The output dtype when ``func`` is exactly ops/quant.py's ``quantize`` of a float32
    tensor of static shape (``symbolic``: of run-time extents) to int8 / uint8 with one scale
    and one zero point: ``cast(min(max(round(x / s) + float(z), lo), hi))``, or ``round(x)``
    (``unit_scale``)."""
    if len(func.inputs) != 3 or len(func.outputs) != 1:
        return None
    x, s, z = func.inputs
    out = func.outputs[0]
    if (x.dtype != "float32" or s.dtype != "float32" or z.dtype not in ("int8", "uint8")
            or out.dtype != z.dtype or tuple(out.shape) != tuple(x.shape)
            or symbolic == all(isinstance(d, int) for d in x.shape)
            or product(s.shape) != 1 or product(z.shape) != 1):
        return None
    x_read = _quantized_read(out, s, z)
    if not (isinstance(x_read, te.Read) and x_read.tensor.uid == x.uid
            and tuple(x_read.indices) == tuple(out.axes)):
        return None
    return z.dtype


def _quantized_read(out: te.Tensor, s: te.Tensor, z: te.Tensor) -> te.Expr | None:
    """What ``out`` quantizes when its body is ops/quant.py's ``quantize`` with the scale
    ``s`` and zero point ``z`` (``cast(min(max(round(v / s) + float(z), lo), hi))``, or
    ``round(v)``): the expression v, else None."""
    lo, hi = saturation_range(z.dtype)
    e = out.body
    if not (isinstance(e, te.Cast) and e.dtype == z.dtype):
        return None
    e = e.value
    if not (isinstance(e, te.Binary) and e.op == "min" and _is_const(e.b, hi)):
        return None
    e = e.a
    if not (isinstance(e, te.Binary) and e.op == "max" and _is_const(e.b, lo)):
        return None
    e = e.a
    if not (isinstance(e, te.Binary) and e.op == "add" and isinstance(e.a, te.MathCall)
            and e.a.name == "round" and isinstance(e.b, te.Cast)
            and isinstance(e.b.value, te.Read) and e.b.value.tensor.uid == z.uid):
        return None
    q = e.a.arg
    if isinstance(q, te.Read):   # unit_scale: x itself (passes/fuse_qdq.py's float32-exact chains)
        return q
    if (isinstance(q, te.Binary) and q.op == "div" and isinstance(q.b, te.Read)
            and q.b.tensor.uid == s.uid):
        return q.a
    return None


def match_gated_quantize(func: PrimFunc) -> tuple[str, int, int, int, int, tuple] | None:
    """(the output dtype, y's and the gate's input positions, the output's scale and zero
    point positions, and the gate's scale and zero point positions or ()) when ``func`` is
    ``quantize(y * gate)`` (what ``fuse_ops`` makes of a squeeze-and-excitation multiply read
    by a quantize alone) of float32 y [N, C, H, W] with run-time extents and a gate [N, C, 1,
    1], one scale and one zero point: a float32 gate, or ``dequantize(g)`` of an 8-bit g [N,
    C, 1, 1] with its own scale and zero point (``fuse_ops`` fuses the gate's dequantize in
    where the consumer is this kernel: passes/fuse.py ``_is_gate_dequantize``)."""
    if len(func.inputs) not in (4, 6) or len(func.outputs) != 1:
        return None
    out = func.outputs[0]
    if (out.dtype not in ("int8", "uint8") or len(out.shape) != 4
            or all(isinstance(d, int) for d in out.shape)):
        return None
    ones = [t for t in func.inputs if product(t.shape) == 1]
    uids = [t.uid for t in func.inputs]
    for s in (t for t in ones if t.dtype == "float32"):
        for z in (t for t in ones if t.dtype == out.dtype):
            x_read = _quantized_read(out, s, z)
            if not (isinstance(x_read, te.Read) and x_read.tensor.body is not None
                    and tuple(x_read.indices) == tuple(out.axes)):
                continue
            got = _gated_product(x_read.tensor, out)
            if got is None:
                continue
            y, g, gparts = got
            at = [y.uid, g.uid, s.uid, z.uid] + [t.uid for t in gparts]
            if all(u in uids for u in at) and len(set(at)) == len(func.inputs):
                pos = [uids.index(u) for u in at]
                return out.dtype, pos[0], pos[1], pos[2], pos[3], tuple(pos[4:])
    return None


def _gated_product(stage: te.Tensor, out: te.Tensor):
    """(y, the gate's placeholder, () or the gate's dequantize scale and zero point) when
    ``stage`` is y * gate (either order) as ``match_gated_quantize`` takes it, else None."""
    m = stage.body
    if not (isinstance(m, te.Binary) and m.op == "mul" and isinstance(m.a, te.Read)
            and isinstance(m.b, te.Read)):
        return None
    ax = tuple(stage.axes)
    for yr, gr in ((m.a, m.b), (m.b, m.a)):
        y, g = yr.tensor, gr.tensor
        if not (y.is_placeholder and y.dtype == g.dtype == "float32"
                and tuple(y.shape) == tuple(out.shape) and tuple(yr.indices) == ax
                and len(g.shape) == 4 and tuple(g.shape[:2]) == tuple(y.shape[:2])
                and tuple(g.shape[2:]) == (1, 1) and len(gr.indices) == 4
                and tuple(gr.indices[:2]) == ax[:2]
                and all(isinstance(i, te.Const) and i.value == 0 for i in gr.indices[2:])):
            continue
        if g.is_placeholder:
            return y, g, ()
        parts = _dequantize_stage(g)
        if parts is not None:
            return y, parts[0], parts[1:]
    return None


def match_dequantize(func: PrimFunc) -> str | None:
    """The input dtype when ``func`` is exactly ops/quant.py's ``dequantize`` of an int8 /
    uint8 tensor of run-time extents to float32 with one scale and one zero point:
    ``float32(x - z) * s``, the difference exact in float32."""
    if len(func.inputs) != 3 or len(func.outputs) != 1:
        return None
    x, s, z = func.inputs
    read = _dequantized_read(func.outputs[0], s, z)
    if not (isinstance(read, te.Read) and read.tensor.uid == x.uid):
        return None
    return x.dtype


def match_table_dequantize(func: PrimFunc) -> tuple[str, int] | None:
    """(the table's dtype, its axis) when ``func`` is ``dequantize(lut8(x, table))`` (the
    two fused, ``fuse_ops``) of run-time extents, one scale and one zero point."""
    if len(func.inputs) != 4 or len(func.outputs) != 1:
        return None
    x, table, s, z = func.inputs
    read = _dequantized_read(func.outputs[0], s, z)
    if not (isinstance(read, te.Read) and read.tensor.body is not None
            and read.tensor.dtype == z.dtype):
        return None
    axis = _lut8_axis(x, table, read.tensor, True)
    return None if axis is None else (table.dtype, axis)


def match_dequantized_add(func: PrimFunc) -> tuple[str, list[int]] | None:
    """(the output dtype, the input positions of a, its scale and zero point, b's three and the
    output's scale and zero point) when ``func`` is ``quantize(dequantize(a) + dequantize(b))``
    (a QDQ residual add, ``fuse_ops``'s four stages) of 8-bit a and b of one shape with run-time
    extents, every scale and zero point one value."""
    if len(func.inputs) != 8 or len(func.outputs) != 1:
        return None
    out = func.outputs[0]
    if out.dtype not in ("int8", "uint8") or all(isinstance(d, int) for d in out.shape):
        return None
    uids = [t.uid for t in func.inputs]
    ones = [t for t in func.inputs if product(t.shape) == 1]
    for s in (t for t in ones if t.dtype == "float32"):
        for z in (t for t in ones if t.dtype == out.dtype):
            add = _quantized_read(out, s, z)
            if (isinstance(add, te.Read) and add.tensor.body is not None
                    and tuple(add.indices) == tuple(out.axes)
                    and isinstance(add.tensor.body, te.Binary) and add.tensor.body.op == "add"):
                body = add.tensor.body
                parts = [_dequantize_parts(r, add.tensor.axes) for r in (body.a, body.b)]
                if None in parts or any(p[0].uid not in uids for p in parts):
                    continue
                at = [uids.index(t.uid) for p in parts for t in p] + [uids.index(s.uid),
                                                                         uids.index(z.uid)]
                if sorted(at) == list(range(8)):
                    return out.dtype, at
    return None


def _dequantize_parts(r: te.Expr, axes) -> tuple[te.Tensor, te.Tensor, te.Tensor] | None:
    """(x, scale, zero point) when ``r`` reads, at ``axes`` (its reader's own), a stage that
    dequantizes placeholder x (8-bit, of the stage's shape, one scale and one zero point),
    else None."""
    if not (isinstance(r, te.Read) and r.tensor.body is not None
            and tuple(r.indices) == tuple(axes)):
        return None
    return _dequantize_stage(r.tensor)


def _dequantize_stage(t: te.Tensor) -> tuple[te.Tensor, te.Tensor, te.Tensor] | None:
    """(x, scale, zero point) when stage ``t`` dequantizes placeholder x (8-bit, of the
    stage's shape, one scale and one zero point), else None."""
    if t.body is None:
        return None
    e = t.body
    if not (isinstance(e, te.Binary) and e.op == "mul" and isinstance(e.b, te.Read)):
        return None
    s = e.b.tensor
    e = e.a
    if isinstance(e, te.Cast):
        e = e.value
    if not (isinstance(e, te.Binary) and e.op == "sub" and isinstance(e.b, te.Cast)
            and isinstance(e.b.value, te.Read)):
        return None
    z = e.b.value.tensor
    got = _dequantized_read(t, s, z)
    if not (isinstance(got, te.Read) and got.tensor.is_placeholder):
        return None
    return got.tensor, s, z


def _dequantized_read(out: te.Tensor, s: te.Tensor, z: te.Tensor) -> te.Read | None:
    """The read of the 8-bit value ``out`` dequantizes (``float32(v - z) * s`` of run-time
    extents, one scale and one zero point, v read at out's own indices), else None."""
    if (z.dtype not in ("int8", "uint8") or s.dtype != "float32" or out.dtype != "float32"
            or all(isinstance(d, int) for d in out.shape)
            or product(s.shape) != 1 or product(z.shape) != 1):
        return None
    e = out.body
    if not (isinstance(e, te.Binary) and e.op == "mul" and isinstance(e.b, te.Read)
            and e.b.tensor.uid == s.uid):
        return None
    e = e.a
    if isinstance(e, te.Cast) and e.dtype == "float32":
        e = e.value
    # the difference in float32 (ops/quant.py ``_wide``) or int32: exact either way
    if not (isinstance(e, te.Binary) and e.op == "sub" and isinstance(e.a, te.Cast)
            and e.a.dtype in ("float32", "int32") and isinstance(e.b, te.Cast)
            and e.b.dtype == e.a.dtype and isinstance(e.b.value, te.Read)
            and e.b.value.tensor.uid == z.uid):
        return None
    x_read = e.a.value
    if not (isinstance(x_read, te.Read) and x_read.tensor.dtype == z.dtype
            and tuple(x_read.tensor.shape) == tuple(out.shape)
            and tuple(x_read.indices) == tuple(out.axes)):
        return None
    return x_read


def _divides(func: PrimFunc) -> bool:
    """Whether a ``match_quantize`` function divides by its scale (not ``unit_scale``)."""
    return any(isinstance(n, te.Binary) and n.op == "div" for n in te.walk(func.outputs[0].body))


def _is_const(e: te.Expr, value: float) -> bool:
    return isinstance(e, te.Const) and float(e.value) == value


@dataclass(frozen=True)
class _TableTag:
    """What ``QEmitter`` reads from a reduction tag, for the table kernel (which has none)."""
    dtype: str
    axis: int

    @property
    def attrs(self) -> dict:
        return {"dtype": self.dtype}


class _QVector(QEmitter):
    """Shared by both kernels: widening loads and the requantized store of vectors."""

    def _task_span(self, body_fn, n_ptrs: int, count: ir.Value):
        """(task, ntasks, lo, hi): this task's share [lo, hi) of ``count`` items, split evenly
        in task order (the parallel body's last two arguments are the task and the count)."""
        b = self.builder
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        lo = b.sdiv(b.mul(task, count), ntasks)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), count), ntasks)
        return task, ntasks, lo, hi

    def _widen_vec(self, v: ir.Value, dtype: str) -> ir.Value:
        b = self.builder
        return b.zext(v, V8I32) if dtype == "uint8" else b.sext(v, V8I32)

    def _load8(self, base: ir.Value, at: ir.Value, dtype: str) -> ir.Value:
        return self._widen_vec(self.builder.load(self._ptr(base, at, V8I8), align=1), dtype)

    def _gather8(self, base: ir.Value, at: ir.Value, lanes: int, dtype: str) -> ir.Value:
        """``lanes`` (< 8) bytes from ``base[at]`` as <8 x i32>, the other lanes zero."""
        b = self.builder
        v = ir.Constant(V8I8, None)
        for j in range(lanes):
            v = b.insert_element(v, b.load(b.gep(base, [b.add(at, const_i64(j))])),
                                 ir.Constant(I32, j))
        return self._widen_vec(v, dtype)

    def _store(self, fs: list[ir.Value], dst: ir.Value, at: ir.Value, lanes: int = VL) -> None:
        """Requantize the <8 x float> values ``fs`` (1 or 2) and store them from ``dst[at]``:
        two packed into one 16-byte store on AVX2, ``lanes`` < 8 lane by lane."""
        b = self.builder
        if len(fs) == 2 and self.avx2:
            packed = self._pack([self._requant_int(f, None, wide=True) for f in fs])
            b.store(packed, self._ptr(dst, at, ir.VectorType(I8, 2 * VL)), align=1)
            return
        for k, f in enumerate(fs):
            q = self._requant_int(f, None)
            pos = b.add(at, const_i64(k * VL))
            if lanes == VL:
                b.store(q, self._ptr(dst, pos, V8I8), align=1)
            else:
                for j in range(lanes):
                    b.store(b.extract_element(q, ir.Constant(I32, j)),
                            b.gep(dst, [b.add(pos, const_i64(j))]))


class _QBinary(_QVector):
    def emit(self) -> KernelInfo:
        a, bt, a_zp, b_zp, mult_a, mult_b, y_zp = self.func.inputs
        y = self.func.outputs[0]
        shape = tuple(int(d) for d in a.shape)
        total = math.prod(shape)
        b_shape = tuple(int(d) for d in bt.shape)
        k = row_broadcast(shape, b_shape) if math.prod(b_shape) != 1 else 0
        if k is None:
            return None
        mode = "scalar" if math.prod(b_shape) == 1 else ("full" if k == len(shape) else "row")
        rows = math.prod(shape[:k]) if mode == "row" else 1
        inner = total // rows
        mul = self.tag.attrs["binary"] == "mul"
        body_fn, ptr_types, n_ptrs, _ = self._start(0)
        b = self.builder
        buf = self.buffers
        azp = self._splat(b.load(buf[a_zp.uid]), V8I32)
        bzp = self._splat(b.load(buf[b_zp.uid]), V8I32)
        ma = self._splat(b.load(buf[mult_a.uid]), V8F32)
        mb = self._splat(b.load(buf[mult_b.uid]), V8F32)
        self.y_zp = self._splat(b.load(buf[y_zp.uid]), V8F32)
        ab, bb, yb = buf[a.uid], buf[bt.uid], buf[y.uid]

        def scaled(av: ir.Value, bv: ir.Value) -> ir.Value:
            da, db = b.sub(av, azp), b.sub(bv, bzp)
            if mul:
                return b.fmul(b.sitofp(b.mul(da, db), V8F32), ma)
            return b.fadd(b.fmul(b.sitofp(da, V8F32), ma), b.fmul(b.sitofp(db, V8F32), mb))

        def b_splat(at: ir.Value) -> ir.Value:
            return self._splat(self._widen(b.load(b.gep(bb, [at])), bt.dtype), V8I32)

        fixed = b_splat(const_i64(0)) if mode == "scalar" else None
        step = 2 if self.avx2 else 1          # vectors per store
        nvec = inner // VL
        with for_range(b, const_i64(0), const_i64(rows), "row") as r:
            base = b.mul(r, const_i64(inner))
            row_b = b_splat(r) if mode == "row" else fixed

            def vectors(at: ir.Value, count: int) -> list[ir.Value]:
                out = []
                for j in range(count):
                    pos = b.add(at, const_i64(j * VL))
                    bv = self._load8(bb, pos, bt.dtype) if mode == "full" else row_b
                    out.append(scaled(self._load8(ab, pos, a.dtype), bv))
                return out

            if nvec // step:
                with for_range(b, const_i64(0), const_i64(nvec // step), "vec") as v:
                    at = b.add(base, b.mul(v, const_i64(step * VL)))
                    self._store(vectors(at, step), yb, at)
            if nvec % step:
                at = b.add(base, const_i64((nvec - nvec % step) * VL))
                self._store(vectors(at, nvec % step), yb, at)
            if inner % VL:
                at = b.add(base, const_i64(nvec * VL))
                lanes = inner % VL
                bv = self._gather8(bb, at, lanes, bt.dtype) if mode == "full" else row_b
                f = scaled(self._gather8(ab, at, lanes, a.dtype), bv)
                self._store([f], yb, at, lanes)
        return self._finish(body_fn, n_ptrs, ptr_types, 0)


class _QGlobalAverage(_QVector):
    def emit(self) -> KernelInfo:
        x, x_zp, mult, y_zp = self.func.inputs
        y = self.func.outputs[0]
        planes = int(x.shape[0]) * int(x.shape[1])
        size = math.prod(int(d) for d in x.shape[2:])
        body_fn, ptr_types, n_ptrs, _ = self._start(0)
        b = self.builder
        buf = self.buffers
        xb, yb = buf[x.uid], buf[y.uid]
        zp_total = b.mul(b.load(buf[x_zp.uid]), ir.Constant(I32, size))
        mult_v = self._splat(b.load(buf[mult.uid]), V8F32)
        self.y_zp = self._splat(b.load(buf[y_zp.uid]), V8F32)
        sums = alloca_once(b, ir.ArrayType(I32, VL), "sums")
        reduce_add = intrinsic(self.module, "llvm.vector.reduce.add.v8i32", I32, [V8I32])
        nvec = size // VL

        def plane_sums(p0: ir.Value, count: int) -> ir.Value:
            """<8 x float>: sum(x - x_zp) of planes p0 .. p0 + count (other lanes 0)."""
            for j in range(VL):
                b.store(ir.Constant(I32, 0), b.gep(sums, [const_i64(0), const_i64(j)]))
            with for_range(b, const_i64(0), const_i64(count), "pl") as j:
                src = b.mul(b.add(p0, j), const_i64(size))
                acc = alloca_once(b, V8I32, "acc")
                b.store(ir.Constant(V8I32, None), acc)
                if nvec:
                    with for_range(b, const_i64(0), const_i64(nvec), "v") as v:
                        at = b.add(src, b.mul(v, const_i64(VL)))
                        b.store(b.add(b.load(acc), self._load8(xb, at, x.dtype)), acc)
                total = b.call(reduce_add, [b.load(acc)])
                for t in range(size % VL):
                    at = b.add(src, const_i64(nvec * VL + t))
                    total = b.add(total, self._widen(b.load(b.gep(xb, [at])), x.dtype))
                b.store(b.sub(total, zp_total), b.gep(sums, [const_i64(0), j]))
            vec = b.load(b.bitcast(sums, V8I32.as_pointer()))
            return b.fmul(b.sitofp(vec, V8F32), mult_v)

        if planes // VL:
            with for_range(b, const_i64(0), const_i64(planes // VL), "pg") as g:
                p0 = b.mul(g, const_i64(VL))
                self._store([plane_sums(p0, VL)], yb, p0)
        if planes % VL:
            p0 = const_i64(planes - planes % VL)
            self._store([plane_sums(p0, planes % VL)], yb, p0, planes % VL)
        return self._finish(body_fn, n_ptrs, ptr_types, 0)


class _QTable(_QVector):
    """``lut8``: rows of the table's axis (one row without one), on AVX2 looked up 32 bytes at
    a time with ``vpshufb`` (``QEmitter._lut_chunk``) and each row's last bytes one by one,
    elsewhere byte by byte; rows split between tasks when there are enough bytes. On AVX-512
    levels (``zmm``: x86-64-v4 and its feature levels, AVX512BW) 64 bytes at a time with
    masked ``vpshufb`` (``_lut_chunk64``: a compare into a mask register and one shuffle per
    16-byte piece of the row, no blend)."""

    def __init__(self, *args, zmm: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.zmm = zmm
        self.chunk = 64 if zmm else 32

    def emit(self) -> KernelInfo:
        x, table = self.func.inputs
        y = self.func.outputs[0]
        axis = self.tag.axis
        if self.symbolic:
            return self._emit_sized(x, table, y, axis)
        shape = tuple(int(d) for d in x.shape)
        rows = math.prod(shape[:axis + 1]) if axis >= 0 else 1
        inner = math.prod(shape) // rows
        channels = shape[axis] if axis >= 0 else 1
        parallel = rows > 1 and rows * inner >= TABLE_PARALLEL_BYTES
        body_fn, ptr_types, n_ptrs, _ = self._start(0)
        wide = inner // self.chunk if self.avx2 else 0
        self._rows(body_fn, n_ptrs, parallel, x, table, y, const_i64(rows), const_i64(inner),
                   channels, wide)
        return self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)

    def _emit_sized(self, x, table, y, axis: int) -> KernelInfo:
        """The same rows with run-time extents: rows and their length from the size
        variables; split between tasks where 32 x 32 bytes per channel would be (the sizes
        are unknown here, as the symbolic max pool decides)."""
        shape = tuple(x.shape)
        rows = product(shape[:axis + 1]) if axis >= 0 else 1
        inner = product(shape[axis + 1:] if axis >= 0 else shape)
        channels = int(shape[axis]) if axis >= 0 else 1
        parallel = not isinstance(rows, int) and channels * 1024 >= TABLE_PARALLEL_BYTES
        body_fn, ptr_types, n_ptrs, _ = self._start(0)
        b = self.builder
        inner_v = self._dim_value(inner)
        wide = b.sdiv(inner_v, const_i64(self.chunk)) if self.avx2 else 0
        self._rows(body_fn, n_ptrs, parallel, x, table, y, self._dim_value(rows), inner_v,
                   channels, wide)
        info = self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)
        return dataclasses.replace(info, symbolic=True)

    def _rows(self, body_fn, n_ptrs: int, parallel: bool, x, table, y, rows: ir.Value,
              inner: ir.Value, channels: int, wide: int | ir.Value) -> None:
        """Rows lo .. hi of this task (all without ``parallel``), ``wide`` chunks of
        ``self.chunk`` bytes each (AVX2 / AVX-512; a number, or computed at run time) then byte
        by byte."""
        b = self.builder
        buf = self.buffers
        xb, tb, yb = buf[x.uid], buf[table.uid], buf[y.uid]
        signed = x.dtype == "int8"
        lo, hi = const_i64(0), rows
        if parallel:
            task, ntasks, lo, hi = self._task_span(body_fn, n_ptrs, rows)
        with for_range(b, lo, hi, "row") as r:
            base = b.mul(r, inner)
            row_tb = b.gep(tb, [b.mul(b.srem(r, const_i64(channels)), const_i64(256))])
            static = isinstance(wide, int)
            if wide or not static:
                lookup = self._lut_chunk64 if self.zmm else self._lut_chunk
                with for_range(b, const_i64(0), const_i64(wide) if static else wide, "lx") as i:
                    lookup(xb, yb, row_tb, b.add(base, b.mul(i, const_i64(self.chunk))), signed)
            tail = (const_i64(wide * self.chunk) if static
                    else b.mul(wide, const_i64(self.chunk)))
            with for_range(b, tail, inner, "tx") as i:
                at = b.add(base, i)
                v = b.load(b.gep(xb, [at]))
                idx = b.add(b.sext(v, I64), const_i64(128)) if signed else b.zext(v, I64)
                b.store(b.load(b.gep(row_tb, [idx])), b.gep(yb, [at]))


    def _lut_chunk64(self, src, dst, tb, at, signed: bool) -> None:
        """dst[at + i] = tb[src[at + i]] for i < 64 (``signed``: int8 bytes index from tb +
        128) with AVX-512BW: each 16-byte piece k of the 256-byte row broadcast to the four
        128-bit lanes, looked up by the index's low nibble with ``vpshufb`` and merged under
        the mask of the bytes whose high nibble is k (``vpcmpeqb`` into a mask register, a
        merge-masked ``vpshufb``): 2 instructions per piece for 64 bytes, against the AVX2
        kernel's 6 (two shuffles, two compares, two blends) for the same bytes."""
        b = self.builder
        v64 = ir.VectorType(I8, 64)
        shuf = intrinsic(self.module, "llvm.x86.avx512.pshuf.b.512", v64, [v64, v64])
        lanes = ir.Constant(ir.VectorType(I32, 64), list(range(16)) * 4)
        v = b.load(self._ptr(src, at, v64), align=1)
        if signed:
            v = b.xor(v, ir.Constant(v64, [0x80] * 64))
        lo_n = b.and_(v, ir.Constant(v64, [0x0F] * 64))
        hi_n = b.lshr(v, ir.Constant(v64, [4] * 64))
        res = ir.Constant(v64, None)
        for k in range(16):
            t = b.load(self._ptr(tb, const_i64(16 * k), ir.VectorType(I8, 16)), align=1)
            part = b.call(shuf, [b.shuffle_vector(t, t, lanes), lo_n])
            res = b.select(b.icmp_unsigned("==", hi_n, ir.Constant(v64, [k] * 64)), part, res)
        b.store(res, self._ptr(dst, at, v64), align=1)


class _QQuantize(_QVector):
    """``quantize`` of float32 to 8 bits (a model's input) on AVX2, 32 values per step:
    x / s (``vdivps``, the reference's float32 quotient), then the requantize epilogue of
    ``_QVector._store`` (clamp to [lo - z, hi - z], ``vcvtps2dq``'s round half to even, + z,
    saturating packs into one 32-byte store); the generic loop nest does the same per value.
    (Multiplying by RN(1 / s), with a check that the product rounds to the quotient's integer
    and a division where it might not, measured slower: the kernel is not bound by the
    division.)"""

    def emit(self, parallel_min_outputs: int) -> KernelInfo:
        x, s, z = self.func.inputs
        y = self.func.outputs[0]
        total = math.prod(int(d) for d in x.shape)
        parallel = total >= parallel_min_outputs
        body_fn, ptr_types, n_ptrs, _ = self._start(0)
        b = self.builder
        buf = self.buffers
        xb, yb = buf[x.uid], buf[y.uid]
        s_v = self._splat(b.load(buf[s.uid]), V8F32)
        self.y_zp = self._splat(b.sitofp(self._widen(b.load(buf[z.uid]), z.dtype), F32), V8F32)
        divides = _divides(self.func)

        def quotient(at: ir.Value) -> ir.Value:
            v = b.load(self._ptr(xb, at, V8F32), align=4)
            return b.fdiv(v, s_v) if divides else v

        nvec = total // VL
        group = 4
        groups = nvec // group
        lo, hi, last = const_i64(0), const_i64(groups), None
        if parallel:   # groups split evenly between the tasks, the tail in the last one
            task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
            lo = b.sdiv(b.mul(task, const_i64(groups)), ntasks)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(groups)), ntasks)
            last = b.icmp_signed("==", b.add(task, const_i64(1)), ntasks)
        if groups:
            with for_range(b, lo, hi, "qv") as i:
                at = b.mul(i, const_i64(group * VL))
                packed = self._pack([self._requant_int(quotient(b.add(at, const_i64(k * VL))),
                                                       None, wide=True) for k in range(group)])
                b.store(packed, self._ptr(yb, at, packed.type), align=1)
        if last is None:
            self._tail(quotient, xb, yb, s_v, (nvec - nvec % group) * VL, total)
        else:
            with b.if_then(last):
                self._tail(quotient, xb, yb, s_v, (nvec - nvec % group) * VL, total)
        return self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)

    def _tail(self, quotient, xb: ir.Value, yb: ir.Value, s_v: ir.Value, start: int,
              total: int) -> None:
        """Values ``start`` .. ``total`` (fewer than a group's), a vector at a time."""
        b = self.builder
        for k in range(start, total, VL):
            lanes = min(VL, total - k)
            if lanes == VL:
                f = quotient(const_i64(k))
            else:
                v = ir.Constant(V8F32, [0.0] * VL)
                for j in range(lanes):
                    v = b.insert_element(v, b.load(b.gep(xb, [const_i64(k + j)])),
                                         ir.Constant(I32, j))
                f = b.fdiv(v, s_v) if _divides(self.func) else v
            self._store([f], yb, const_i64(k), lanes)


class _QConvertSized(_QVector):
    """``quantize`` (float32 to 8 bits) or ``dequantize`` (8 bits to float32) of run-time
    extents on AVX2, 32 values a step: the quantize as ``_QQuantize`` (``vdivps`` unless
    ``unit_scale``, clamp, ``vcvtps2dq``, + z, saturating packs into one 32-byte store), the
    dequantize 32 bytes widened (``vpmovzxbd`` / ``vpmovsxbd``), minus z in int32, converted
    and times s in float32 (the reference's operations in its order, so both equal the
    generic loop nest bit for bit). The tensor walked flat, its 32-value steps split between
    tasks where the generic loop nest of the other levels splits (its static extents at least
    ``parallel_min_outputs / 8``: a bundle's levels agree on every kernel's signature), the last
    task taking the tail; the last values (fewer than 32) through a staging buffer."""

    g_v = None

    def emit(self, kind: str, parallel_min_outputs: int) -> KernelInfo:
        x, s, z = self.func.inputs
        y = self.func.outputs[0]
        shape = tuple(x.shape)
        parallel, body_fn, ptr_types, n_ptrs = self._sized_body(shape, parallel_min_outputs)
        b = self.builder
        buf = self.buffers
        xb, yb = buf[x.uid], buf[y.uid]
        self._constants(kind, s, z)
        in_ty = F32 if kind == "quantize" else I8
        total = self._dim_value(product(shape))
        chunks = b.sdiv(total, const_i64(32))
        lo, hi, last = const_i64(0), chunks, None
        if parallel:
            task, ntasks, lo, hi = self._task_span(body_fn, n_ptrs, chunks)
            last = b.icmp_signed("==", b.add(task, const_i64(1)), ntasks)
        with for_range(b, lo, hi, "cv") as i:
            at = b.mul(i, const_i64(32))
            self._chunk(b.gep(xb, [at]), b.gep(yb, [at]))
        start = b.mul(chunks, const_i64(32))
        if last is None:
            self._tail(xb, yb, start, total, in_ty)
        else:
            with b.if_then(last):
                self._tail(xb, yb, start, total, in_ty)
        info = self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)
        return dataclasses.replace(info, symbolic=True, choice=kind)

    def emit_gated(self, at: tuple, parallel_min_outputs: int) -> KernelInfo:
        """``quantize(y * gate)`` (``match_gated_quantize``: ``at`` its positions): rows of N *
        C, each value times its row's gate (``vmulps``, the reference's float32 product) before
        the quantize, 32 values a step, then 8 (rows of 3 x 48 = 4 x 32 + 2 x 8 on PP-OCR's
        classifier), the last through the staging buffer; rows split between tasks where the
        generic loop nest's split would be. An 8-bit gate is dequantized once per row (the
        reference's ``float32(g - z) * s``, the difference exact in int32)."""
        y_at, g_at, s_at, z_at, g_parts = at
        x, g = self.func.inputs[y_at], self.func.inputs[g_at]
        s, z = self.func.inputs[s_at], self.func.inputs[z_at]
        y = self.func.outputs[0]
        shape = tuple(y.shape)
        parallel, body_fn, ptr_types, n_ptrs = self._sized_body(shape, parallel_min_outputs)
        b = self.builder
        buf = self.buffers
        xb, yb, gb = buf[x.uid], buf[y.uid], buf[g.uid]
        self._constants("quantize", s, z)
        rows = self._dim_value(product(shape[:2]))
        inner = self._dim_value(product(shape[2:]))
        lo, hi = const_i64(0), rows
        if parallel:
            task, ntasks, lo, hi = self._task_span(body_fn, n_ptrs, rows)
        chunks = b.sdiv(inner, const_i64(32))
        with for_range(b, lo, hi, "row") as r:
            base = b.mul(r, inner)
            gv = b.load(b.gep(gb, [r]))
            if g_parts:     # the gate's dequantize, once per row
                gs, gz = (self.func.inputs[i] for i in g_parts)
                diff = b.sub(self._widen(gv, g.dtype), self._widen(b.load(buf[gz.uid]),
                                                                   gz.dtype))
                gv = b.fmul(b.sitofp(diff, F32), b.load(buf[gs.uid]))
            self.g_v = self._splat(gv, V8F32)
            with for_range(b, const_i64(0), chunks, "cv") as i:
                at = b.add(base, b.mul(i, const_i64(32)))
                self._chunk(b.gep(xb, [at]), b.gep(yb, [at]))
            # the row's last values: 8 at a time, then fewer than 8 through the staging buffer
            rest = b.add(base, b.mul(chunks, const_i64(32)))
            vecs = b.sdiv(b.sub(b.add(base, inner), rest), const_i64(VL))
            with for_range(b, const_i64(0), vecs, "cv8") as i:
                at = b.add(rest, b.mul(i, const_i64(VL)))
                v = b.fmul(b.load(self._ptr(xb, at, V8F32), align=4), self.g_v)
                if self.divides:
                    v = b.fdiv(v, self.s_v)
                b.store(self._requant_int(v, None), self._ptr(yb, at, V8I8), align=1)
            self._tail(xb, yb, b.add(rest, b.mul(vecs, const_i64(VL))), b.add(base, inner), F32)
        info = self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)
        return dataclasses.replace(info, symbolic=True, choice="gate, quantize")

    def _sized_body(self, shape: tuple, parallel_min_outputs: int):
        """(parallel, body function, its pointer types, pointer count): the kernel's body,
        split between tasks where the generic loop nest's would be (its known extents' product
        at least an eighth of ``parallel_min_outputs``)."""
        static = product([d for d in shape if isinstance(d, int)])
        body_fn, ptr_types, n_ptrs, _ = self._start(0)
        return static >= parallel_min_outputs // 8, body_fn, ptr_types, n_ptrs

    def _constants(self, kind: str, s, z) -> None:
        b = self.builder
        buf = self.buffers
        self.kind = kind
        self.s_v = self._splat(b.load(buf[s.uid]), V8F32)
        zp = self._widen(b.load(buf[z.uid]), z.dtype)
        self.zp_i = self._splat(zp, V8I32)
        self.y_zp = self._splat(b.sitofp(zp, F32), V8F32)
        self.divides = kind == "quantize" and _divides(self.func)
        in_ty, out_ty = (F32, I8) if kind == "quantize" else (I8, F32)
        self.stage_in = b.bitcast(alloca_once(b, ir.ArrayType(in_ty, 32), "stage_in"),
                                  in_ty.as_pointer())
        self.stage_out = b.bitcast(alloca_once(b, ir.ArrayType(out_ty, 32), "stage_out"),
                                   out_ty.as_pointer())

    def _chunk(self, src: ir.Value, dst: ir.Value) -> None:
        """32 values from ``src`` to ``dst``."""
        b = self.builder
        if self.kind == "quantize":
            qs = []
            for k in range(4):
                v = b.load(self._ptr(src, k * VL, V8F32), align=4)
                if self.g_v is not None:
                    v = b.fmul(v, self.g_v)
                if self.divides:
                    v = b.fdiv(v, self.s_v)
                qs.append(self._requant_int(v, None, wide=True))
            packed = self._pack(qs)
            b.store(packed, self._ptr(dst, 0, packed.type), align=1)
            return
        for k in range(4):
            v = self._widen_vec(b.load(self._ptr(src, k * VL, V8I8), align=1), self.dtype)
            f = b.fmul(b.sitofp(b.sub(v, self.zp_i), V8F32), self.s_v)
            b.store(f, self._ptr(dst, k * VL, V8F32), align=4)

    def _tail(self, xb: ir.Value, yb: ir.Value, start: ir.Value, stop: ir.Value,
              in_ty: ir.Type) -> None:
        """Values ``start`` .. ``stop`` (fewer than 32): copied into the staging buffer (the
        rest zero), one step, copied out."""
        b = self.builder
        n = b.sub(stop, start)
        with b.if_then(b.icmp_signed(">", n, const_i64(0))):
            with for_range(b, const_i64(0), const_i64(32), "tz") as j:
                b.store(ir.Constant(in_ty, 0), b.gep(self.stage_in, [j]))
            with for_range(b, const_i64(0), n, "ti") as j:
                b.store(b.load(b.gep(xb, [b.add(start, j)])), b.gep(self.stage_in, [j]))
            self._chunk(self.stage_in, self.stage_out)
            with for_range(b, const_i64(0), n, "to") as j:
                b.store(b.load(b.gep(self.stage_out, [j])), b.gep(yb, [b.add(start, j)]))


class _QTableDequantize(_QConvertSized):
    """``dequantize(lut8(x, table))`` of run-time extents on AVX2 (the two fused): rows of the
    table's axis (the tensor flat with one row), 32 bytes a step looked up with ``vpshufb`` on
    the register (``QEmitter._lut_chunk``'s 16 chunks), widened, minus z in int32, converted
    and times s in float32, stored; each row's last bytes one by one. Split between tasks where
    the generic loop nest of the other levels splits (``_QConvertSized``)."""

    def emit_table(self, parallel_min_outputs: int) -> KernelInfo:
        x, table, s, z = self.func.inputs
        y = self.func.outputs[0]
        axis = self.tag.axis
        shape = tuple(y.shape)
        parallel, body_fn, ptr_types, n_ptrs = self._sized_body(shape, parallel_min_outputs)
        b = self.builder
        buf = self.buffers
        xb, tb, yb = buf[x.uid], buf[table.uid], buf[y.uid]
        self._constants("dequantize", s, z)
        self.signed = x.dtype == "int8"
        rows = self._dim_value(product(shape[:axis + 1])) if axis >= 0 else const_i64(1)
        inner = self._dim_value(product(shape[axis + 1:] if axis >= 0 else shape))
        channels = int(shape[axis]) if axis >= 0 else 1
        lo, hi = const_i64(0), rows
        if parallel:
            task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
            if axis >= 0:
                lo = b.sdiv(b.mul(task, rows), ntasks)
                hi = b.sdiv(b.mul(b.add(task, const_i64(1)), rows), ntasks)
        chunks = b.sdiv(inner, const_i64(32))
        with for_range(b, lo, hi, "row") as r:
            base = b.mul(r, inner)
            row_tb = b.gep(tb, [b.mul(b.srem(r, const_i64(channels)), const_i64(256))])
            c_lo, c_hi = const_i64(0), chunks
            if parallel and axis < 0:    # one row: its chunks split, the tail in the last task
                task, ntasks, c_lo, c_hi = self._task_span(body_fn, n_ptrs, chunks)
            with for_range(b, c_lo, c_hi, "lx") as i:
                at = b.add(base, b.mul(i, const_i64(32)))
                self._looked_chunk(xb, yb, row_tb, at)
            tail = b.add(base, b.mul(chunks, const_i64(32)))

            def tail_bytes() -> None:
                with for_range(b, tail, b.add(base, inner), "tx") as i:
                    v = b.load(b.gep(xb, [i]))
                    idx = b.add(b.sext(v, I64), const_i64(128)) if self.signed else b.zext(v, I64)
                    t = self._widen(b.load(b.gep(row_tb, [idx])), table.dtype)
                    f = b.fmul(b.sitofp(b.sub(t, b.extract_element(self.zp_i, ir.Constant(
                        I32, 0))), F32), b.extract_element(self.s_v, ir.Constant(I32, 0)))
                    b.store(f, b.gep(yb, [i]))

            if parallel and axis < 0:
                with b.if_then(b.icmp_signed("==", b.add(task, const_i64(1)), ntasks)):
                    tail_bytes()
            else:
                tail_bytes()
        info = self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)
        return dataclasses.replace(info, symbolic=True, choice="table, dequantize")

    def _looked_chunk(self, xb: ir.Value, yb: ir.Value, tb: ir.Value, at: ir.Value) -> None:
        """32 bytes from ``xb[at]`` through the table row ``tb``, dequantized into ``yb[at]``."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        shuf = intrinsic(self.module, "llvm.x86.avx2.pshuf.b", v32i8, [v32i8, v32i8])
        both = ir.Constant(ir.VectorType(I32, 32), list(range(16)) * 2)
        v = b.load(self._ptr(xb, at, v32i8), align=1)
        if self.signed:
            v = b.xor(v, ir.Constant(v32i8, [0x80] * 32))
        lo_n = b.and_(v, ir.Constant(v32i8, [0x0F] * 32))
        hi_n = b.lshr(v, ir.Constant(v32i8, [4] * 32))
        res = ir.Constant(v32i8, None)
        for k in range(16):
            t = b.load(self._ptr(tb, const_i64(16 * k), ir.VectorType(I8, 16)), align=1)
            part = b.call(shuf, [b.shuffle_vector(t, t, both), lo_n])
            res = b.select(b.icmp_unsigned("==", hi_n, ir.Constant(v32i8, [k] * 32)), part, res)
        for k in range(4):
            lanes = ir.Constant(ir.VectorType(I32, VL), list(range(8 * k, 8 * k + 8)))
            part = self._widen_vec(b.shuffle_vector(res, res, lanes), self.func.inputs[1].dtype)
            f = b.fmul(b.sitofp(b.sub(part, self.zp_i), V8F32), self.s_v)
            b.store(f, self._ptr(yb, b.add(at, const_i64(k * VL)), V8F32), align=4)


class _QDequantizedAdd(_QConvertSized):
    """``quantize(dequantize(a) + dequantize(b))`` of run-time extents on AVX2 (a QDQ residual
    add): 32 values a step, each operand's bytes widened, minus its zero point in int32,
    converted and times its scale, the two added, then the quantize of ``_QConvertSized``
    (``vdivps`` by the output's scale, clamp, ``vcvtps2dq``, + z, packs): the reference's
    float32 operations in its order. Walked flat and split as ``_QConvertSized``."""

    def emit_add(self, at: list[int], parallel_min_outputs: int) -> KernelInfo:
        ins = self.func.inputs
        a, sa, za, bt, sb, zb, s, z = (ins[i] for i in at)
        y = self.func.outputs[0]
        shape = tuple(y.shape)
        parallel, body_fn, ptr_types, n_ptrs = self._sized_body(shape, parallel_min_outputs)
        b = self.builder
        buf = self.buffers
        self._constants("quantize", s, z)
        self.divides = True
        self.operands = []
        for x, sx, zx in ((a, sa, za), (bt, sb, zb)):
            zp = self._splat(self._widen(b.load(buf[zx.uid]), zx.dtype), V8I32)
            self.operands.append((buf[x.uid], x.dtype, zp,
                                  self._splat(b.load(buf[sx.uid]), V8F32)))
        yb = buf[y.uid]
        total = self._dim_value(product(shape))
        chunks = b.sdiv(total, const_i64(32))
        lo, hi, last = const_i64(0), chunks, None
        if parallel:
            task, ntasks, lo, hi = self._task_span(body_fn, n_ptrs, chunks)
            last = b.icmp_signed("==", b.add(task, const_i64(1)), ntasks)
        with for_range(b, lo, hi, "av") as i:
            self._add_chunk(b.mul(i, const_i64(32)), yb)
        start = b.mul(chunks, const_i64(32))

        def tail() -> None:
            with for_range(b, start, total, "ta") as j:
                f = None
                for xb, dtype, zp, sv in self.operands:
                    v = b.sub(self._widen(b.load(b.gep(xb, [j])), dtype),
                              b.extract_element(zp, ir.Constant(I32, 0)))
                    v = b.fmul(b.sitofp(v, F32), b.extract_element(sv, ir.Constant(I32, 0)))
                    f = v if f is None else b.fadd(f, v)
                vec = b.insert_element(ir.Constant(V8F32, None), f, ir.Constant(I32, 0))
                q = self._requant_int(b.fdiv(vec, self.s_v), None)
                b.store(b.extract_element(q, ir.Constant(I32, 0)), b.gep(yb, [j]))

        if last is None:
            tail()
        else:
            with b.if_then(last):
                tail()
        info = self._finish(body_fn, n_ptrs, ptr_types, 0, parallel)
        return dataclasses.replace(info, symbolic=True, choice="dequantize, add, quantize")

    def _add_chunk(self, at: ir.Value, yb: ir.Value) -> None:
        b = self.builder
        qs = []
        for k in range(4):
            pos = b.add(at, const_i64(k * VL))
            f = None
            for xb, dtype, zp, sv in self.operands:
                v = self._widen_vec(b.load(self._ptr(xb, pos, V8I8), align=1), dtype)
                v = b.fmul(b.sitofp(b.sub(v, zp), V8F32), sv)
                f = v if f is None else b.fadd(f, v)
            qs.append(self._requant_int(b.fdiv(f, self.s_v), None, wide=True))
        packed = self._pack(qs)
        b.store(packed, self._ptr(yb, at, packed.type), align=1)
