"""The decision-tree ensemble kernel (``ops/trees.py`` ``tree_ensemble``), emitted directly: a
walk from root to leaf is a data-dependent loop no tensor expression states.

Rows are split over tasks, and walked in blocks of ``ROW_BLOCK``: each tree in turn (the
order of ``roots``) takes every row of the block, so its nodes stay in cache. Per row: the
scores start empty; each tree is walked from its root (compare the row's feature with the node's
threshold by the node's mode, NaN taking the true branch where the node says so) to a leaf,
whose weights are aggregated into their targets (sum, min or max, in ``x``'s dtype); a target
no leaf reached gave a weight to scores 0 (ONNX Runtime's ``has_score``). The tree arrays are
the bundle's constants. The row count may be a size variable; features and targets are fixed.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ops.trees import LEAF, MISSING
from .helpers import I1, I8, I64, LLVM_TYPES, alloca_once, const_i64, for_range
from .lower import KernelEmitter, KernelInfo, LoweringError

ROW_BLOCK = 64   # rows that walk one tree before the next tree

# mode -> (fcmp predicate) for modes 0..5 (``ops/trees.MODES``); ordered: NaN compares false
# except for NEQ, which is unordered-or-not-equal as C's ``!=``
_PREDICATES = (("<=", True), ("<", True), (">=", True), (">", True), ("==", True),
               ("!=", False))


def match_trees(func: PrimFunc):
    """The ``tree_ensemble`` tag of ``func``'s output, or None."""
    if len(func.outputs) != 1 or func.outputs[0].body is None:
        return None
    body = func.outputs[0].body
    tag = reduction_tag(body) if hasattr(body, "axes") else None
    if tag is None or tag.kind != "tree_ensemble":
        return None
    if [t.uid for t in tag.operands] != [t.uid for t in func.inputs]:
        raise LoweringError(f"{func.name}: something was fused into the tree kernel")
    return tag


class TreeEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, tag,
                 size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.aggregate = str(tag.attrs["aggregate"])
        self.modes = tuple(tag.attrs.get("modes") or range(len(_PREDICATES)))
        self.missing = bool(tag.attrs.get("missing", True))

    def emit(self) -> KernelInfo:
        func = self.func
        x, out = func.inputs[0], func.outputs[0]
        features, targets = x.shape[1], out.shape[1]
        if not isinstance(features, int) or not isinstance(targets, int):
            raise LoweringError(f"{func.name}: the feature and target counts must be fixed")
        body_fn, ptr_types = self._begin_body(func.inputs + func.outputs, False)
        b = self.builder
        px, nodes, thresholds, leaf_begin, leaf_target, leaf_weight, roots, pout = \
            body_fn.args[:8]
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        fty = LLVM_TYPES[x.dtype]
        rows = self._dim_value(x.shape[0])
        n_roots = func.inputs[6].shape[0]
        # rows in blocks, trees outermost within a block: one tree's nodes stay in cache
        # while the block's rows walk it (each row still sums its trees in order)
        block = max(1, min(ROW_BLOCK, (1 << 14) // max(targets, 1)))
        keep_has = self.aggregate != "SUM"
        has = alloca_once(b, ir.ArrayType(I8, block * targets), "has") if keep_has else None
        node = alloca_once(b, I64, "node")
        lo = b.sdiv(b.mul(rows, task), ntasks)
        hi = b.sdiv(b.mul(rows, b.add(task, const_i64(1))), ntasks)
        n_blocks = b.sdiv(b.add(b.sub(hi, lo), const_i64(block - 1)), const_i64(block))
        with for_range(b, const_i64(0), n_blocks, "blk") as blk:
            first_row = b.add(lo, b.mul(blk, const_i64(block)))
            count = b.sub(hi, first_row)
            count = b.select(b.icmp_signed("<", count, const_i64(block)), count,
                             const_i64(block))
            with for_range(b, const_i64(0), b.mul(count, const_i64(targets)), "t") as t:
                b.store(ir.Constant(fty, 0.0),
                        b.gep(pout, [b.add(b.mul(first_row, const_i64(targets)), t)]))
                if keep_has:
                    b.store(ir.Constant(I8, 0), b.gep(has, [const_i64(0), t]))
            with for_range(b, const_i64(0), const_i64(n_roots), "r") as r:
                root = b.load(b.gep(roots, [r]))
                with for_range(b, const_i64(0), count, "n") as k:
                    n = b.add(first_row, k)
                    row = b.gep(px, [b.mul(n, const_i64(features))])
                    scores = b.gep(pout, [b.mul(n, const_i64(targets))])
                    b.store(root, node)
                    self._walk(row, nodes, thresholds, node)
                    at = b.load(node)
                    w0 = b.load(b.gep(leaf_begin, [at]))
                    w1 = b.load(b.gep(leaf_begin, [b.add(at, const_i64(1))]))
                    with for_range(b, w0, w1, "w") as w:
                        t = b.load(b.gep(leaf_target, [w]))
                        value = b.load(b.gep(leaf_weight, [w]))
                        flag = b.gep(has, [const_i64(0), b.add(b.mul(k, const_i64(targets)),
                                                               t)]) if keep_has else None
                        self._aggregate(b.gep(scores, [t]), flag, value)
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(func.inputs), 1, 0, True, symbolic=self.symbolic,
                          choice="tree walk")

    def _walk(self, row: ir.Value, nodes: ir.Value, thresholds: ir.Value, node: ir.Value
              ) -> None:
        """Move ``node`` (an alloca holding a row of ``nodes``) down to a leaf; only the modes
        the ensemble uses are tested, and NaN only where a node asks for it."""
        b = self.builder
        head = b.append_basic_block("walk.head")
        step = b.append_basic_block("walk.step")
        done = b.append_basic_block("walk.done")
        b.branch(head)
        b.position_at_end(head)
        at = b.load(node)
        base = b.mul(at, const_i64(4))

        def field(k: int) -> ir.Value:
            return b.sext(b.load(b.gep(nodes, [b.add(base, const_i64(k))])), I64)

        flags = field(3)
        mode = b.and_(flags, const_i64(MISSING - 1))
        b.cbranch(b.icmp_signed("==", mode, const_i64(LEAF)), done, step)
        b.position_at_end(step)
        v = b.load(b.gep(row, [field(0)]))
        th = b.load(b.gep(thresholds, [at]))
        true = None
        for code in self.modes:
            pred, ordered = _PREDICATES[code]
            cmp = b.fcmp_ordered(pred, v, th) if ordered else b.fcmp_unordered(pred, v, th)
            true = cmp if true is None else \
                b.select(b.icmp_signed("==", mode, const_i64(code)), cmp, true)
        if true is None:
            true = ir.Constant(I1, 0)
        if self.missing:
            true = b.or_(true, b.and_(b.icmp_signed(">=", flags, const_i64(MISSING)),
                                      b.fcmp_unordered("uno", v, v)))
        b.store(b.select(true, field(1), field(2)), node)
        b.branch(head)
        b.position_at_end(done)

    def _aggregate(self, slot: ir.Value, has_slot: ir.Value | None, value: ir.Value) -> None:
        b = self.builder
        old = b.load(slot)
        if self.aggregate == "SUM":
            b.store(b.fadd(old, value), slot)
            return
        had = b.icmp_signed("!=", b.load(has_slot), ir.Constant(I8, 0))
        better = b.fcmp_ordered("<" if self.aggregate == "MIN" else ">", value, old)
        b.store(b.select(b.or_(b.not_(had), better), value, old), slot)
        b.store(ir.Constant(I8, 1), has_slot)


def emit_trees(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
               size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The tree-ensemble kernel of ``func``, or None when ``func`` is not one."""
    tag = match_trees(func)
    if tag is None:
        return None
    return TreeEmitter(module, func, symbol, tag, size_vars).emit()
