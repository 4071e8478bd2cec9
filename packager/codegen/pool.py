"""A vectorized kernel for 2-D max pooling (NCHW float32, stride 1 or 2, any window, padding and
dilation), tagged ``max_pool2d`` by its legalizer (see ``ir.patterns``).

Each task takes whole (image, channel) planes. An output row is computed vl outputs at a time:
for every tap (ky, kx) whose input row lies inside the image, the inputs ``x[iy, ox*s + c]`` for
the vl outputs are loaded as ``s`` consecutive vectors (masked: lanes outside the row read
-inf) and, with stride 2, their even lanes picked by one shuffle; the running maximum uses
``llvm.maximum`` (NaN-propagating, as the generic reduction). The generic loop nest instead
evaluated a bounds-checked select per tap and output.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from .helpers import F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .lower import KernelEmitter, KernelInfo, _plan_stages

# Outputs per kernel below which it stays on one thread (a few microseconds of work).
PARALLEL_MIN_OUTPUTS = 1 << 14


def match_max_pool(func: PrimFunc):
    """(output, tag) if ``func`` is exactly one tagged float32 max pool this kernel handles."""
    if len(func.outputs) != 1 or func.outputs[0].dtype != "float32" or len(func.inputs) != 1:
        return None
    materialized, outputs = _plan_stages(func)
    if materialized:
        return None
    out, body = outputs[0]
    if not isinstance(body, te.Reduce):
        return None
    tag = reduction_tag(body)
    if tag is None or tag.kind != "max_pool2d":
        return None
    (x,) = tag.operands
    if x.uid != func.inputs[0].uid or x.dtype != "float32" or len(x.shape) != 4:
        return None
    if any(s not in (1, 2) for s in tag.attrs["strides"]):
        return None
    return out, tag


class MaxPoolEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, out: te.Tensor, tag,
                 vl: int) -> None:
        super().__init__(module, func, symbol)
        self.out, self.tag, self.vl = out, tag, vl
        self.vty = ir.VectorType(F32, vl)

    def emit(self) -> KernelInfo:
        x_t = self.tag.operands[0]
        body_fn, ptr_types = self._begin_body([x_t, self.out], workspace=False)
        self._emit_body(body_fn.args[0], body_fn.args[1], body_fn.args[2], body_fn.args[3])
        self.builder.ret_void()
        self._emit_entry(body_fn, 2, ptr_types)
        n, c, oh, ow = self.out.shape
        return KernelInfo(self.symbol, 1, 1, 0, n * c * oh * ow >= PARALLEL_MIN_OUTPUTS)

    def _lanes(self, ty: ir.Type, values) -> ir.Constant:
        return ir.Constant(ir.VectorType(ty, self.vl), list(values))

    def _splat_i64(self, v: ir.Value) -> ir.Value:
        b, vec = self.builder, ir.VectorType(I64, self.vl)
        v = b.insert_element(ir.Constant(vec, None), v, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(vec, None), self._lanes(I32, [0] * self.vl))

    def _row_load(self, row: ir.Value, start: ir.Value, width: int) -> ir.Value:
        """x_row[start + j] for j < vl (lanes outside 0..width read -inf)."""
        b = self.builder
        idx = b.add(self._splat_i64(start), self._lanes(I64, range(self.vl)))
        inside = b.and_(b.icmp_signed(">=", idx, self._lanes(I64, [0] * self.vl)),
                        b.icmp_signed("<", idx, self._lanes(I64, [width] * self.vl)))
        ptr = b.bitcast(b.gep(row, [start], inbounds=False), self.vty.as_pointer())
        fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}f32.p0", self.vty,
                       [self.vty.as_pointer(), I32, ir.VectorType(I1, self.vl), self.vty])
        return b.call(fn, [ptr, ir.Constant(I32, 4), inside,
                           ir.Constant(self.vty, [float("-inf")] * self.vl)])

    def _emit_body(self, x_ptr, out_ptr, task, ntasks) -> None:
        b, vl = self.builder, self.vl
        n, c, h, w = self.tag.operands[0].shape
        _, _, oh, ow = self.out.shape
        attrs = self.tag.attrs
        kh, kw = attrs["kernel"]
        sh, sw = attrs["strides"]
        pt, pl = attrs["padding"][0], attrs["padding"][1]
        dh, dw = attrs["dilation"]
        vmax = intrinsic(self.module, f"llvm.maximum.v{vl}f32", self.vty, [self.vty] * 2)
        planes = const_i64(n * c)
        lo = b.sdiv(b.mul(task, planes), ntasks)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), planes), ntasks)
        nvec = -(-ow // vl)
        store = intrinsic(self.module, f"llvm.masked.store.v{vl}f32.p0", ir.VoidType(),
                          [self.vty, self.vty.as_pointer(), I32, ir.VectorType(I1, vl)])
        acc_ptr = alloca_once(b, self.vty, name="acc")
        with for_range(b, lo, hi, "plane") as p:
            x_plane = b.gep(x_ptr, [b.mul(p, const_i64(h * w))], inbounds=True)
            o_plane = b.gep(out_ptr, [b.mul(p, const_i64(oh * ow))], inbounds=True)
            with for_range(b, const_i64(0), const_i64(oh), "oy") as oy:
                o_row = b.gep(o_plane, [b.mul(oy, const_i64(ow))], inbounds=True)
                with for_range(b, const_i64(0), const_i64(nvec), "ov") as q:
                    ox0 = b.mul(q, const_i64(vl))
                    b.store(ir.Constant(self.vty, [float("-inf")] * vl), acc_ptr)
                    for ky in range(kh):
                        iy = b.add(b.mul(oy, const_i64(sh)), const_i64(ky * dh - pt))
                        row_ok = b.and_(b.icmp_signed(">=", iy, const_i64(0)),
                                        b.icmp_signed("<", iy, const_i64(h)))
                        with b.if_then(row_ok):
                            x_row = b.gep(x_plane, [b.mul(iy, const_i64(w))], inbounds=True)
                            acc = b.load(acc_ptr)
                            for kx in range(kw):
                                start = b.add(b.mul(ox0, const_i64(sw)), const_i64(kx * dw - pl))
                                v = self._row_load(x_row, start, w)
                                if sw == 2:
                                    v2 = self._row_load(x_row, b.add(start, const_i64(vl)), w)
                                    v = b.shuffle_vector(v, v2, self._lanes(
                                        I32, range(0, 2 * vl, 2)))
                                acc = b.call(vmax, [acc, v])
                            b.store(acc, acc_ptr)
                    lanes = b.add(self._splat_i64(ox0), self._lanes(I64, range(vl)))
                    mask = b.icmp_signed("<", lanes, self._lanes(I64, [ow] * vl))
                    dst = b.bitcast(b.gep(o_row, [ox0], inbounds=True), self.vty.as_pointer())
                    b.call(store, [b.load(acc_ptr), dst, ir.Constant(I32, 4), mask])


def emit_max_pool(module: ir.Module, func: PrimFunc, symbol: str, vl: int
                  ) -> KernelInfo | None:
    match = match_max_pool(func)
    if match is None:
        return None
    return MaxPoolEmitter(module, func, symbol, *match, vl).emit()
