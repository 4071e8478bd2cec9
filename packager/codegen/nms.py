"""The NonMaxSuppression kernel (``ops/dynamic.py`` ``nms``): a greedy loop no tensor
expression can state, emitted directly.

Per batch and class: the boxes whose score passes the threshold, made a binary heap in
place (best first, ties by lower index; Floyd's construction, linear), then popped one at a time,
as ONNX Runtime's priority queue does, while the class has fewer than
``max_output_boxes_per_class`` boxes: each popped box is compared with every box kept so far
and kept when none overlaps it by more than the IoU threshold (ONNX Runtime's ``SuppressByIOU``,
float32, in the same operation order; whether any suppresses it does not depend on the order,
so the loop has no early exit and runs in vectors). A box's span (x and y min and max) and area
are computed once, when it is popped, and stored when it is kept. The output is a
``[1 + rows, 3]`` int64 table: row 0 the count, then the (batch, class, box) triples; the VM
binds the count as a size variable (BIND_SIZE). The workspace holds, for the box count, an
int64 list (the candidates' heap) and five float32 lists (the kept boxes' spans and areas).
Work is linear in the boxes plus log n per box popped (was a merge sort of every candidate:
4.2x ONNX Runtime's time at 4000 boxes, now level, ``bench/nonzero.py``).
Boxes, classes and batches may be
run-time sizes (a detector exported with an open batch and image size): the kernel then reads
them from the sizes array and its workspace is the same expression of them.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ir.sym import is_static
from .helpers import F32, I1, I8, I64, alloca_once, const_i64, for_range
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
        # an int64 list and five float32 ones of the box count, the count rounded up to 16
        # (16 boxes take 2 * 64 + 5 * 64 bytes): whole multiples of 64 bytes
        workspace = (dims[1] + 15) // 16 * (2 * 64 + 5 * 64)
        body_fn, ptr_types = self._begin_body(func.inputs + func.outputs, True)
        b = self.builder
        batches, n, classes = (self._dim_value(d) for d in dims)

        def times(d: object, k: int) -> ir.Value:   # folded where the size is fixed
            return const_i64(d * k) if isinstance(d, int) else b.mul(self._dim_value(d),
                                                                        const_i64(k))
        n4 = times(dims[1], 4)
        pb, ps, pk, piou, psc, out, ws = body_fn.args[:7]
        ws = b.bitcast(ws, I64.as_pointer())
        cand = ws
        fws = b.bitcast(b.gep(ws, [times(dims[1], 1)]), F32.as_pointer())
        kept_span = tuple(b.gep(fws, [times(dims[1], k)]) for k in range(5))
        limit = b.load(pk)
        threshold = b.load(piou)
        score_min = b.load(psc)
        total = alloca_once(b, I64, "total")
        count = alloca_once(b, I64, "count")
        chosen = alloca_once(b, I64, "chosen")
        any_hit = alloca_once(b, I8, "any_hit")
        self.hole = alloca_once(b, I64, "hole")
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
                    m = b.load(count)   # written always, counted when it passes: no branch
                    b.store(i, b.gep(cand, [m]))
                    b.store(b.add(m, b.zext(passes, I64)), count)
                heap, size = cand, count   # the candidates, made a heap in place
                self._heapify(row, heap, b.load(count))
                b.store(const_i64(0), chosen)
                head = b.append_basic_block("select.head")
                body = b.append_basic_block("select.body")
                done = b.append_basic_block("select.done")
                b.branch(head)
                b.position_at_end(head)   # while candidates remain and the class is not full
                b.cbranch(b.and_(b.icmp_signed(">", b.load(size), const_i64(0)),
                                 b.icmp_signed("<", b.load(chosen), limit)), body, done)
                b.position_at_end(body)
                i = self._pop_best(row, heap, size)
                nsel = b.load(chosen)
                # compare with every box kept (whether any suppresses it does not depend on the
                # order; no early exit, so the loop runs over the kept spans in vectors)
                span = self._span(pb, box_base, i)
                area = self._area(span)
                b.store(ir.Constant(I8, 0), any_hit)
                with for_range(b, const_i64(0), nsel, "kept") as q:
                    other = tuple(b.load(b.gep(lst, [q])) for lst in kept_span)
                    hit = self._suppresses(span, area, other[:4], other[4], threshold)
                    b.store(b.or_(b.load(any_hit), b.zext(hit, I8)), any_hit)
                with b.if_then(b.icmp_unsigned("==", b.load(any_hit), ir.Constant(I8, 0))):
                    for lst, v in zip(kept_span, (*span, area)):
                        b.store(v, b.gep(lst, [nsel]))
                    b.store(b.add(nsel, const_i64(1)), chosen)
                    at = b.mul(b.add(b.load(total), const_i64(1)), const_i64(3))
                    for k, v in enumerate((bi, ci, i)):
                        b.store(v, b.gep(out, [b.add(at, const_i64(k))]))
                    b.store(b.add(b.load(total), const_i64(1)), total)
                b.branch(head)
                b.position_at_end(done)
        b.store(b.load(total), out)
        b.store(const_i64(0), b.gep(out, [const_i64(1)]))
        b.store(const_i64(0), b.gep(out, [const_i64(2)]))
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        if self.symbolic:
            return KernelInfo(self.symbol, len(func.inputs), 1, 0, False, symbolic=True,
                              workspace_expr=workspace)
        return KernelInfo(self.symbol, len(func.inputs), 1, workspace, False)

    def _better(self, row: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        """Whether candidate ``x`` comes before ``y``: a higher score, or the same score and a
        lower index (ONNX Runtime's order; a total order, so any heap pops the same sequence)."""
        b = self.builder
        sx, sy = b.load(b.gep(row, [x])), b.load(b.gep(row, [y]))
        tie = b.and_(b.fcmp_ordered("==", sx, sy), b.icmp_signed("<", x, y))
        return b.or_(b.fcmp_ordered(">", sx, sy), tie)

    def _sift_down(self, row: ir.Value, heap: ir.Value, m: ir.Value, pos: ir.Value) -> None:
        """Move ``heap[pos]`` down the binary heap of ``m`` candidates (best at the root) until
        neither child comes before it."""
        b = self.builder
        hole = self.hole
        x = b.load(b.gep(heap, [pos]))
        b.store(pos, hole)
        head = b.append_basic_block("sift.head")
        pick = b.append_basic_block("sift.pick")
        move = b.append_basic_block("sift.move")
        done = b.append_basic_block("sift.done")
        b.branch(head)
        b.position_at_end(head)
        p = b.load(hole)
        c = b.add(b.mul(p, const_i64(2)), const_i64(1))
        b.cbranch(b.icmp_signed("<", c, m), pick, done)
        b.position_at_end(pick)
        c1 = b.add(c, const_i64(1))
        # the right child's read clamped inside the heap; it counts only when it exists
        hc = b.load(b.gep(heap, [c]))
        hc1 = b.load(b.gep(heap, [b.select(b.icmp_signed("<", c1, m), c1, c)]))
        right = b.and_(b.icmp_signed("<", c1, m), self._better(row, hc1, hc))
        c = b.select(right, c1, c)
        hc = b.select(right, hc1, hc)
        b.cbranch(self._better(row, hc, x), move, done)
        b.position_at_end(move)
        b.store(hc, b.gep(heap, [p]))
        b.store(c, hole)
        b.branch(head)
        b.position_at_end(done)
        b.store(x, b.gep(heap, [b.load(hole)]))

    def _heapify(self, row: ir.Value, heap: ir.Value, m: ir.Value) -> None:
        """Make the ``m`` candidates of ``heap`` a binary heap, best at the root (Floyd's
        construction, linear: only the boxes kept are then popped, as ONNX Runtime's priority
        queue does, instead of ordering every candidate)."""
        b = self.builder
        half = b.sdiv(m, const_i64(2))
        with for_range(b, const_i64(0), half, "heapify") as k:
            self._sift_down(row, heap, m, b.sub(b.sub(half, const_i64(1)), k))

    def _pop_best(self, row: ir.Value, heap: ir.Value, size: ir.Value) -> ir.Value:
        """Remove the best candidate from the heap of ``size`` (an alloca) and return it."""
        b = self.builder
        best = b.load(heap)
        m = b.sub(b.load(size), const_i64(1))
        b.store(m, size)
        b.store(b.load(b.gep(heap, [m])), heap)
        self._sift_down(row, heap, m, const_i64(0))
        return best

    def _span(self, pb: ir.Value, base: ir.Value, box: ir.Value) -> tuple:
        """Box ``box``'s (x min, x max, y min, y max) as ONNX Runtime's SuppressByIOU computes
        them (MaxMin of the corners, or the centre -/+ half the size), float32."""
        b = self.builder

        def coord(k: int) -> ir.Value:
            at = b.add(base, b.add(b.mul(box, const_i64(4)), const_i64(k)))
            return b.load(b.gep(pb, [at]))

        def lo_hi(x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:   # MaxMin
            ge = b.fcmp_ordered(">=", x, y)
            return b.select(ge, y, x), b.select(ge, x, y)

        if self.center:
            two = ir.Constant(F32, 2.0)
            cx, cy, w, h = (coord(k) for k in range(4))
            hw, hh = b.fdiv(w, two), b.fdiv(h, two)
            return b.fsub(cx, hw), b.fadd(cx, hw), b.fsub(cy, hh), b.fadd(cy, hh)
        y0, x0, y1, x1 = (coord(k) for k in range(4))
        return (*lo_hi(x0, x1), *lo_hi(y0, y1))

    def _area(self, span: tuple) -> ir.Value:
        b = self.builder
        x0, x1, y0, y1 = span
        return b.fmul(b.fsub(x1, x0), b.fsub(y1, y0))

    def _suppresses(self, span_a: tuple, area_a: ir.Value, span_b: tuple, area_b: ir.Value,
                    threshold: ir.Value) -> ir.Value:
        """ONNX Runtime's SuppressByIOU(box a, box b) as an i1 from the two boxes' spans and
        areas (computed once per box, the same float32 operations), its float32 operations in
        its order (no fast-math: the boundary cases compare exactly)."""
        b = self.builder

        def fmax(x: ir.Value, y: ir.Value) -> ir.Value:   # std::max
            return b.select(b.fcmp_ordered("<", x, y), y, x)

        def fmin(x: ir.Value, y: ir.Value) -> ir.Value:   # std::min
            return b.select(b.fcmp_ordered("<", y, x), y, x)

        (ax0, ax1, ay0, ay1), (bx0, bx1, by0, by1) = span_a, span_b
        ix0, ix1 = fmax(ax0, bx0), fmin(ax1, bx1)
        iy0, iy1 = fmax(ay0, by0), fmin(ay1, by1)
        zero = ir.Constant(F32, 0.0)
        inter = b.fmul(b.fsub(ix1, ix0), b.fsub(iy1, iy0))
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
