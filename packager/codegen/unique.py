"""The Unique kernel (``ops/dynamic.py`` ``unique_table``): a stable sort of the item indices and
one pass over the sorted order, which no tensor expression can state (as ranks by reductions it
was quadratic: an items x items equality table), emitted directly. O(n log n) in the items.

The items are the slices ``x[:, j, :]`` of the input viewed as [outer, n, inner], compared
lexicographically (element (o, e) in C order, as numpy and ONNX Runtime order them; floats by
value, so -0.0 equals 0.0; NaN's order is not defined). The kernel

1. sorts the indices 0..n-1 by item with a bottom-up merge sort, stable: the indices of equal
   items stay ascending, so each run of equal items starts with its first occurrence;
2. walks the sorted indices once: a run starts where the item differs from the one before;
   run r's first index and length are kept, and every item's inverse index is its run;
3. for ``sort`` False (``sorted=0``: the order of first occurrence) renumbers the runs by their
   first indices with one scan over the indices (a first index is a unique position, so no
   second sort is needed) and maps the inverse indices through it.

The output is a ``[1 + 3n]`` int64 table: element 0 the count of distinct items d, then n slots
of first indices, n of inverse indices and n of counts (slots from d on are zero). The VM binds
d (BIND_SIZE) and ``unique_select`` reads the parts. The workspace holds three int64 lists of n.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from .helpers import I32, I64, alloca_once, const_i64, for_range, load_converted
from .lower import KernelEmitter, KernelInfo, LoweringError

_UNSIGNED = ("uint8", "uint16", "uint32", "uint64", "bool", "uint4", "uint2")


def match_unique(func: PrimFunc):
    """The ``unique_table`` tag of ``func``'s output, or None."""
    if len(func.outputs) != 1 or func.outputs[0].body is None:
        return None
    body = func.outputs[0].body
    tag = reduction_tag(body) if hasattr(body, "axes") else None
    if tag is None or tag.kind != "unique_table":
        return None
    if [t.uid for t in tag.operands] != [t.uid for t in func.inputs]:
        raise LoweringError(f"{func.name}: something was fused into the Unique kernel")
    return tag


class UniqueEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, tag,
                 size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.sort = bool(tag.attrs["sort"])

    def emit(self) -> KernelInfo:
        func = self.func
        x = func.inputs[0]
        outer_d, n_d, inner_d = x.shape
        # three int64 lists of the item count, each rounded up to whole 64-byte lines
        workspace = (n_d + 7) // 8 * 192
        body_fn, ptr_types = self._begin_body(func.inputs + func.outputs, True)
        b = self.builder
        px, out, ws = body_fn.args[:3]
        outer, n, inner = (self._dim_value(d) for d in x.shape)
        self.compare = self._compare_function(x.dtype, px.type,
                                              isinstance(outer_d, int) and outer_d == 1
                                              and isinstance(inner_d, int) and inner_d == 1)
        self.args = (px, n, outer, inner)
        ws = b.bitcast(ws, I64.as_pointer())
        lists = [b.gep(ws, [b.mul(n, const_i64(k))]) for k in range(3)]
        firsts, inverse, counts = (b.gep(out, [b.add(const_i64(1), b.mul(n, const_i64(k)))])
                                   for k in range(3))
        src, tmp = self._sort(n, lists[0], lists[1])
        # runs: their first indices in tmp (the sort no longer needs it), lengths in lists[2]
        runs = self._runs(n, src, tmp, lists[2], inverse)
        if self.sort:
            with for_range(b, const_i64(0), runs, "put") as r:
                b.store(b.load(b.gep(tmp, [r])), b.gep(firsts, [r]))
                b.store(b.load(b.gep(lists[2], [r])), b.gep(counts, [r]))
        else:
            self._by_first_occurrence(n, runs, src, tmp, lists[2], firsts, inverse, counts)
        with for_range(b, runs, n, "zero") as r:
            b.store(const_i64(0), b.gep(firsts, [r]))
            b.store(const_i64(0), b.gep(counts, [r]))
        b.store(runs, out)
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        if self.symbolic:
            return KernelInfo(self.symbol, 1, 1, 0, False, symbolic=True,
                              workspace_expr=workspace)
        return KernelInfo(self.symbol, 1, 1, max(workspace, 64), False)   # n may be 0

    # ---- item order -----------------------------------------------------------------------------

    def _compare_function(self, dtype: str, ptr: ir.Type, scalar: bool) -> ir.Function:
        """``cmp(x, a, b, n, outer, inner)``: -1, 0 or 1 as item a is before, equal to or after
        item b, at the first element where they differ."""
        fn = ir.Function(self.module, ir.FunctionType(I32, [ptr, I64, I64, I64, I64, I64]),
                         name=f"{self.symbol}.cmp")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        if scalar:   # one element per item: the loops fold away
            fn.attributes.add("alwaysinline")
        px, a, bi, n, outer, inner = fn.args
        entry = fn.append_basic_block("entry")
        o_cond, o_body = fn.append_basic_block("o.cond"), fn.append_basic_block("o.body")
        e_cond, e_body = fn.append_basic_block("e.cond"), fn.append_basic_block("e.body")
        e_next, o_next = fn.append_basic_block("e.next"), fn.append_basic_block("o.next")
        differ, same = fn.append_basic_block("differ"), fn.append_basic_block("same")
        b = ir.IRBuilder(entry)
        a_at, b_at = b.mul(a, inner), b.mul(bi, inner)
        row = b.mul(n, inner)
        b.branch(o_cond)
        b.position_at_end(o_cond)
        o = b.phi(I64, "o")
        o.add_incoming(const_i64(0), entry)
        b.cbranch(b.icmp_signed("<", o, outer), o_body, same)
        b.position_at_end(o_body)
        base = b.mul(o, row)
        pa, pb = b.gep(px, [b.add(base, a_at)]), b.gep(px, [b.add(base, b_at)])
        b.branch(e_cond)
        b.position_at_end(e_cond)
        e = b.phi(I64, "e")
        e.add_incoming(const_i64(0), o_body)
        b.cbranch(b.icmp_signed("<", e, inner), e_body, o_next)
        b.position_at_end(e_body)
        va = load_converted(b, b.load(b.gep(pa, [e])), dtype)
        vb = load_converted(b, b.load(b.gep(pb, [e])), dtype)
        if isinstance(va.type, (ir.FloatType, ir.DoubleType)):
            ne, lt = b.fcmp_unordered("!=", va, vb), b.fcmp_ordered("<", va, vb)
        else:
            lt = (b.icmp_unsigned if dtype in _UNSIGNED else b.icmp_signed)("<", va, vb)
            ne = b.icmp_unsigned("!=", va, vb)
        b.cbranch(ne, differ, e_next)
        b.position_at_end(e_next)
        e.add_incoming(b.add(e, const_i64(1)), e_next)
        b.branch(e_cond)
        b.position_at_end(o_next)
        o.add_incoming(b.add(o, const_i64(1)), o_next)
        b.branch(o_cond)
        b.position_at_end(differ)
        b.ret(b.select(lt, ir.Constant(I32, -1), ir.Constant(I32, 1)))
        b.position_at_end(same)
        b.ret(ir.Constant(I32, 0))
        return fn

    def _cmp(self, a: ir.Value, c: ir.Value) -> ir.Value:
        return self.builder.call(self.compare, [self.args[0], a, c, *self.args[1:]])

    # ---- the sort -------------------------------------------------------------------------------

    def _sort(self, n: ir.Value, first: ir.Value, second: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The indices 0..n-1 sorted by item, stable (bottom-up merge sort between the two
        lists); returns (the list that holds them, the other)."""
        b = self.builder
        ptr = first.type
        src, dst = alloca_once(b, ptr, "src"), alloca_once(b, ptr, "dst")
        width = alloca_once(b, I64, "width")
        with for_range(b, const_i64(0), n, "init") as i:
            b.store(i, b.gep(first, [i]))
        b.store(first, src)
        b.store(second, dst)
        b.store(const_i64(1), width)
        head = b.append_basic_block("pass.head")
        body = b.append_basic_block("pass.body")
        done = b.append_basic_block("pass.done")
        b.branch(head)
        b.position_at_end(head)
        w = b.load(width)
        b.cbranch(b.icmp_signed("<", w, n), body, done)
        b.position_at_end(body)
        s, d = b.load(src), b.load(dst)
        pairs = b.sdiv(b.add(n, b.sub(b.mul(w, const_i64(2)), const_i64(1))),
                       b.mul(w, const_i64(2)))
        with for_range(b, const_i64(0), pairs, "pair") as p:
            lo = b.mul(p, b.mul(w, const_i64(2)))
            mid = self._min(b.add(lo, w), n)
            hi = self._min(b.add(mid, w), n)
            self._merge(s, d, lo, mid, hi)
        b.store(d, src)
        b.store(s, dst)
        b.store(b.mul(w, const_i64(2)), width)
        b.branch(head)
        b.position_at_end(done)
        return b.load(src), b.load(dst)

    def _min(self, a: ir.Value, c: ir.Value) -> ir.Value:
        return self.builder.select(self.builder.icmp_signed("<", a, c), a, c)

    def _merge(self, s: ir.Value, d: ir.Value, lo: ir.Value, mid: ir.Value, hi: ir.Value) -> None:
        """d[lo:hi] = the merge of the sorted runs s[lo:mid] and s[mid:hi], the left run's
        item first where two are equal (stable)."""
        b = self.builder
        left, right = alloca_once(b, I64, "left"), alloca_once(b, I64, "right")
        b.store(lo, left)
        b.store(mid, right)
        with for_range(b, lo, hi, "k") as k:
            i, j = b.load(left), b.load(right)
            i_ok, j_ok = b.icmp_signed("<", i, mid), b.icmp_signed("<", j, hi)
            left_done = b.not_(i_ok)
            here = b.block
            both = b.append_basic_block("merge.both")
            pick = b.append_basic_block("merge.pick")
            b.cbranch(b.and_(i_ok, j_ok), both, pick)
            b.position_at_end(both)
            si, sj = b.load(b.gep(s, [i])), b.load(b.gep(s, [j]))
            before = b.icmp_signed("<", self._cmp(sj, si), ir.Constant(I32, 0))
            b.branch(pick)
            b.position_at_end(pick)
            take_right = b.phi(ir.IntType(1), "take_right")
            take_right.add_incoming(left_done, here)
            take_right.add_incoming(before, both)
            at = b.select(take_right, j, i)
            b.store(b.load(b.gep(s, [at])), b.gep(d, [k]))
            b.store(b.add(i, b.zext(b.not_(take_right), I64)), left)
            b.store(b.add(j, b.zext(take_right, I64)), right)

    # ---- runs -----------------------------------------------------------------------------------

    def _runs(self, n: ir.Value, order: ir.Value, firsts: ir.Value, lengths: ir.Value,
              inverse: ir.Value) -> ir.Value:
        """One pass over the sorted indices: run r's first index and length, every item's run
        (its inverse index in sorted order); returns the count of runs."""
        b = self.builder
        runs = alloca_once(b, I64, "runs")
        b.store(const_i64(0), runs)
        with for_range(b, const_i64(0), n, "walk") as k:
            j = b.load(b.gep(order, [k]))
            here = b.block
            test = b.append_basic_block("walk.test")
            join = b.append_basic_block("walk.join")
            start = b.append_basic_block("walk.start")
            count = b.append_basic_block("walk.count")
            b.cbranch(b.icmp_signed(">", k, const_i64(0)), test, join)
            b.position_at_end(test)
            prev = b.load(b.gep(order, [b.sub(k, const_i64(1))]))
            differs = b.icmp_signed("!=", self._cmp(prev, j), ir.Constant(I32, 0))
            b.branch(join)
            b.position_at_end(join)
            new = b.phi(ir.IntType(1), "new")
            new.add_incoming(ir.Constant(ir.IntType(1), 1), here)
            new.add_incoming(differs, test)
            b.cbranch(new, start, count)
            b.position_at_end(start)
            r = b.load(runs)
            b.store(j, b.gep(firsts, [r]))
            b.store(const_i64(0), b.gep(lengths, [r]))
            b.store(b.add(r, const_i64(1)), runs)
            b.branch(count)
            b.position_at_end(count)
            r = b.sub(b.load(runs), const_i64(1))
            length = b.gep(lengths, [r])
            b.store(b.add(b.load(length), const_i64(1)), length)
            b.store(r, b.gep(inverse, [j]))
        return b.load(runs)

    def _by_first_occurrence(self, n: ir.Value, runs: ir.Value, scratch: ir.Value,
                             run_firsts: ir.Value, lengths: ir.Value, firsts: ir.Value,
                             inverse: ir.Value, counts: ir.Value) -> None:
        """The runs renumbered by first occurrence: ``scratch[i]`` marks the run whose first
        index is i, a scan over i gives each run its new number (kept in ``run_firsts``, read
        first), and the inverse indices are mapped through it."""
        b = self.builder
        with for_range(b, const_i64(0), n, "unmark") as i:
            b.store(const_i64(-1), b.gep(scratch, [i]))
        with for_range(b, const_i64(0), runs, "mark") as r:
            b.store(r, b.gep(scratch, [b.load(b.gep(run_firsts, [r]))]))
        seen = alloca_once(b, I64, "seen")
        b.store(const_i64(0), seen)
        with for_range(b, const_i64(0), n, "scan") as i:
            r = b.load(b.gep(scratch, [i]))
            with b.if_then(b.icmp_signed(">=", r, const_i64(0))):
                q = b.load(seen)
                b.store(i, b.gep(firsts, [q]))
                b.store(b.load(b.gep(lengths, [r])), b.gep(counts, [q]))
                b.store(q, b.gep(run_firsts, [r]))
                b.store(b.add(q, const_i64(1)), seen)
        with for_range(b, const_i64(0), n, "remap") as j:
            at = b.gep(inverse, [j])
            b.store(b.load(b.gep(run_firsts, [b.load(at)])), at)


def emit_unique(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The Unique kernel of ``func``, or None when ``func`` is not one."""
    tag = match_unique(func)
    if tag is None:
        return None
    return UniqueEmitter(module, func, symbol, tag, size_vars).emit()
