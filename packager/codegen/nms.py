"""The NonMaxSuppression kernel (``ops/dynamic.py`` ``nms``): a greedy loop no tensor
expression can state, emitted directly.

Per batch and class: the boxes whose score passes the threshold, ordered best first (ties by
lower index) by each one's rank among them, then kept in that order unless a box kept before
overlaps it by more than the IoU threshold (ONNX Runtime's ``SuppressByIOU``, float32, in the
same operation order), at most ``max_output_boxes_per_class`` per class. The output is a
``[1 + rows, 3]`` int64 table: row 0 the count, then the (batch, class, box) triples; the VM
binds the count as a size variable (BIND_SIZE). The workspace holds three int64 lists of the
box count: the candidates, a second list the merge sort that orders them writes to, the boxes
kept. Ordering is n log n (a stable bottom-up merge sort), the selection compares each
candidate with the boxes kept so far. Boxes, classes and batches may be
run-time sizes (a detector exported with an open batch and image size): the kernel then reads
them from the sizes array and its workspace is the same expression of them.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ir.sym import is_static
from .helpers import F32, I1, I64, alloca_once, const_i64, for_range
from .lower import KernelEmitter, KernelInfo, LoweringError

WORKSPACE_ALIGN = 64


def match_nms(func: PrimFunc):
    """The ``nms`` tag of ``func``'s output, or None."""
    if len(func.outputs) != 1 or func.outputs[0].body is None:
        return None
    body = func.outputs[0].body
    tag = reduction_tag(body) if hasattr(body, "axes") else None
    if tag is None or tag.kind != "nms":
        return None
    if [t.uid for t in tag.operands] != [t.uid for t in func.inputs]:
        raise LoweringError(f"{func.name}: something was fused into the NMS kernel")
    return tag


class NmsEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, tag,
                 size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.center = int(tag.attrs["center_point_box"])
        self.has_score = bool(tag.attrs["has_score_threshold"])

    def emit(self) -> KernelInfo:
        func = self.func
        boxes, scores = func.inputs[0], func.inputs[1]
        dims = (boxes.shape[0], boxes.shape[1], scores.shape[1])
        if not is_static(dims) and not self.symbolic:
            raise LoweringError(f"{func.name}: NonMaxSuppression with run-time box, class or "
                                "batch counts needs the module's size variables")
        workspace = 3 * dims[1] * 8   # whole int64s: 64-byte aligned when rounded to 8 of them
        workspace = -(-workspace // WORKSPACE_ALIGN) * WORKSPACE_ALIGN if isinstance(
            workspace, int) else (dims[1] + 7) // 8 * (3 * 64)
        body_fn, ptr_types = self._begin_body(func.inputs + func.outputs, True)
        b = self.builder
        batches, n, classes = (self._dim_value(d) for d in dims)

        def times(d: object, k: int) -> ir.Value:   # folded where the size is fixed
            return const_i64(d * k) if isinstance(d, int) else b.mul(self._dim_value(d),
                                                                        const_i64(k))
        n4 = times(dims[1], 4)
        pb, ps, pk, piou, psc, out, ws = body_fn.args[:7]
        ws = b.bitcast(ws, I64.as_pointer())
        cand, spare, kept = (b.gep(ws, [times(dims[1], k)]) for k in range(3))
        lists = tuple(alloca_once(b, I64.as_pointer(), f"list{k}") for k in range(2))
        limit = b.load(pk)
        threshold = b.load(piou)
        score_min = b.load(psc)
        total = alloca_once(b, I64, "total")
        count = alloca_once(b, I64, "count")
        chosen = alloca_once(b, I64, "chosen")
        keep = alloca_once(b, I1, "keep")
        b.store(const_i64(0), total)
        with for_range(b, const_i64(0), batches, "b") as bi:
            box_base = b.mul(bi, n4)
            with for_range(b, const_i64(0), classes, "c") as ci:
                row = b.gep(ps, [b.mul(b.add(b.mul(bi, classes), ci), n)])
                b.store(const_i64(0), count)
                with for_range(b, const_i64(0), n, "i") as i:   # candidates
                    s = b.load(b.gep(row, [i]))
                    passes = b.fcmp_ordered(">", s, score_min) if self.has_score \
                        else ir.Constant(I1, 1)
                    with b.if_then(passes):
                        m = b.load(count)
                        b.store(i, b.gep(cand, [m]))
                        b.store(b.add(m, const_i64(1)), count)
                m = b.load(count)
                order = self._sort_best_first(row, cand, spare, m, lists)
                b.store(const_i64(0), chosen)
                with for_range(b, const_i64(0), m, "t") as t:   # greedy selection
                    i = b.load(b.gep(order, [t]))
                    nsel = b.load(chosen)
                    with b.if_then(b.icmp_signed("<", nsel, limit)):
                        b.store(ir.Constant(I1, 1), keep)
                        with for_range(b, const_i64(0), nsel, "q") as q:
                            j = b.load(b.gep(kept, [q]))
                            hit = self._suppresses(pb, box_base, i, j, threshold)
                            b.store(b.and_(b.load(keep), b.not_(hit)), keep)
                        with b.if_then(b.load(keep)):
                            b.store(i, b.gep(kept, [nsel]))
                            b.store(b.add(nsel, const_i64(1)), chosen)
                            at = b.mul(b.add(b.load(total), const_i64(1)), const_i64(3))
                            for k, v in enumerate((bi, ci, i)):
                                b.store(v, b.gep(out, [b.add(at, const_i64(k))]))
                            b.store(b.add(b.load(total), const_i64(1)), total)
        b.store(b.load(total), out)
        b.store(const_i64(0), b.gep(out, [const_i64(1)]))
        b.store(const_i64(0), b.gep(out, [const_i64(2)]))
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        if self.symbolic:
            return KernelInfo(self.symbol, len(func.inputs), 1, 0, False, symbolic=True,
                              workspace_expr=workspace)
        return KernelInfo(self.symbol, len(func.inputs), 1, workspace, False)

    def _sort_best_first(self, row: ir.Value, cand: ir.Value, spare: ir.Value, m: ir.Value,
                         lists: tuple) -> ir.Value:
        """Sort the ``m`` candidate indices of ``cand`` (in index order) by score, best first,
        ties by lower index: a bottom-up merge sort (stable, so equal scores keep index order)
        between ``cand`` and ``spare``, n log n; returns the list that holds the result."""
        b = self.builder
        src_at, dst_at = lists
        b.store(cand, src_at)
        b.store(spare, dst_at)
        width = alloca_once(b, I64, "width")
        at = tuple(alloca_once(b, I64, name) for name in ("left", "right"))
        b.store(const_i64(1), width)
        head = b.append_basic_block("sort.pass")
        body = b.append_basic_block("sort.merge")
        done = b.append_basic_block("sort.done")
        b.branch(head)
        b.position_at_end(head)
        w = b.load(width)
        b.cbranch(b.icmp_signed("<", w, m), body, done)
        b.position_at_end(body)
        src, dst = b.load(src_at), b.load(dst_at)
        w2 = b.mul(w, const_i64(2))
        last = b.sub(m, const_i64(1))

        def smaller(x: ir.Value, y: ir.Value) -> ir.Value:
            return b.select(b.icmp_signed("<", x, y), x, y)

        runs = b.sdiv(b.add(m, b.sub(w2, const_i64(1))), w2)
        with for_range(b, const_i64(0), runs, "run") as r:
            lo = b.mul(r, w2)
            mid, hi = smaller(b.add(lo, w), m), smaller(b.add(lo, w2), m)
            b.store(lo, at[0])
            b.store(mid, at[1])
            with for_range(b, lo, hi, "k") as k:
                i, j = b.load(at[0]), b.load(at[1])
                # both reads inside the list (the index clamped); a run that has ended never
                # gives its element
                vi = b.load(b.gep(src, [smaller(i, last)]))
                vj = b.load(b.gep(src, [smaller(j, last)]))
                si, sj = b.load(b.gep(row, [vi])), b.load(b.gep(row, [vj]))
                right = b.and_(b.icmp_signed("<", j, hi),
                               b.or_(b.icmp_signed(">=", i, mid), b.fcmp_ordered(">", sj, si)))
                b.store(b.select(right, vj, vi), b.gep(dst, [k]))
                b.store(b.add(i, b.zext(b.not_(right), I64)), at[0])
                b.store(b.add(j, b.zext(right, I64)), at[1])
        b.store(dst, src_at)
        b.store(src, dst_at)
        b.store(w2, width)
        b.branch(head)
        b.position_at_end(done)
        return b.load(src_at)

    def _suppresses(self, pb: ir.Value, base: ir.Value, i: ir.Value, j: ir.Value,
                    threshold: ir.Value) -> ir.Value:
        """ONNX Runtime's SuppressByIOU(box i, box j) as an i1, its float32 operations in its
        order (no fast-math: the boundary cases compare exactly)."""
        b = self.builder

        def coord(box: ir.Value, k: int) -> ir.Value:
            at = b.add(base, b.add(b.mul(box, const_i64(4)), const_i64(k)))
            return b.load(b.gep(pb, [at]))

        def lo_hi(x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:   # MaxMin
            ge = b.fcmp_ordered(">=", x, y)
            return b.select(ge, y, x), b.select(ge, x, y)

        def fmax(x: ir.Value, y: ir.Value) -> ir.Value:   # std::max
            return b.select(b.fcmp_ordered("<", x, y), y, x)

        def fmin(x: ir.Value, y: ir.Value) -> ir.Value:   # std::min
            return b.select(b.fcmp_ordered("<", y, x), y, x)

        two = ir.Constant(F32, 2.0)
        if self.center:
            spans = []
            for box in (i, j):
                cx, cy, w, h = (coord(box, k) for k in range(4))
                hw, hh = b.fdiv(w, two), b.fdiv(h, two)
                spans.append((b.fsub(cx, hw), b.fadd(cx, hw), b.fsub(cy, hh), b.fadd(cy, hh)))
        else:
            spans = []
            for box in (i, j):
                y0, x0, y1, x1 = (coord(box, k) for k in range(4))
                spans.append((*lo_hi(x0, x1), *lo_hi(y0, y1)))
        (ax0, ax1, ay0, ay1), (bx0, bx1, by0, by1) = spans
        ix0, ix1 = fmax(ax0, bx0), fmin(ax1, bx1)
        iy0, iy1 = fmax(ay0, by0), fmin(ay1, by1)
        zero = ir.Constant(F32, 0.0)
        inter = b.fmul(b.fsub(ix1, ix0), b.fsub(iy1, iy0))
        area_a = b.fmul(b.fsub(ax1, ax0), b.fsub(ay1, ay0))
        area_b = b.fmul(b.fsub(bx1, bx0), b.fsub(by1, by0))
        union = b.fsub(b.fadd(area_a, area_b), inter)
        ok = b.fcmp_ordered(">", ix1, ix0)
        ok = b.and_(ok, b.fcmp_ordered(">", iy1, iy0))
        for v in (inter, area_a, area_b, union):
            ok = b.and_(ok, b.fcmp_ordered(">", v, zero))
        return b.and_(ok, b.fcmp_ordered(">", b.fdiv(inter, union), threshold))


def emit_nms(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
             size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The NMS kernel of ``func``, or None when ``func`` is not one."""
    tag = match_nms(func)
    if tag is None:
        return None
    return NmsEmitter(module, func, symbol, tag, size_vars).emit()
