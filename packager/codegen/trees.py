"""The decision-tree ensemble kernel (``ops/trees.py`` ``tree_ensemble``), emitted directly: a
walk from root to leaf is a data-dependent loop no tensor expression states.

Per row of ``x`` (rows split over tasks): the row's scores start empty; each tree, in the
order of ``roots``, is walked from its root (compare the row's feature with the node's
threshold by the node's mode, NaN taking the true branch where the node says so) to a leaf,
whose weights are aggregated into their targets (sum, min or max, in ``x``'s dtype); a target
no leaf reached gave a weight to scores 0 (ONNX Runtime's ``has_score``). The tree arrays are
the bundle's constants. The row count may be a size variable; features and targets are fixed.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ops.trees import LEAF
from .helpers import I1, I8, I64, LLVM_TYPES, alloca_once, const_i64, for_range
from .lower import KernelEmitter, KernelInfo, LoweringError

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
        has = alloca_once(b, ir.ArrayType(I8, targets), "has")
        node = alloca_once(b, I64, "node")
        lo = b.sdiv(b.mul(rows, task), ntasks)
        hi = b.sdiv(b.mul(rows, b.add(task, const_i64(1))), ntasks)
        with for_range(b, lo, hi, "n") as n:
            row = b.gep(px, [b.mul(n, const_i64(features))])
            scores = b.gep(pout, [b.mul(n, const_i64(targets))])
            with for_range(b, const_i64(0), const_i64(targets), "t") as t:
                b.store(ir.Constant(fty, 0.0), b.gep(scores, [t]))
                b.store(ir.Constant(I8, 0), b.gep(has, [const_i64(0), t]))
            with for_range(b, const_i64(0), const_i64(n_roots), "r") as r:
                b.store(b.load(b.gep(roots, [r])), node)
                self._walk(row, nodes, thresholds, node, fty)
                at = b.load(node)
                first = b.load(b.gep(leaf_begin, [at]))
                last = b.load(b.gep(leaf_begin, [b.add(at, const_i64(1))]))
                with for_range(b, first, last, "w") as w:
                    t = b.load(b.gep(leaf_target, [w]))
                    value = b.load(b.gep(leaf_weight, [w]))
                    self._aggregate(b.gep(scores, [t]), b.gep(has, [const_i64(0), t]), value)
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(func.inputs), 1, 0, True, symbolic=self.symbolic,
                          choice="tree walk")

    def _walk(self, row: ir.Value, nodes: ir.Value, thresholds: ir.Value, node: ir.Value,
              fty: ir.Type) -> None:
        """Move ``node`` (an alloca holding a row of ``nodes``) down to a leaf."""
        b = self.builder
        head = b.append_basic_block("walk.head")
        step = b.append_basic_block("walk.step")
        done = b.append_basic_block("walk.done")
        b.branch(head)
        b.position_at_end(head)
        at = b.load(node)
        base = b.mul(at, const_i64(5))

        def field(k: int) -> ir.Value:
            return b.load(b.gep(nodes, [b.add(base, const_i64(k))]))

        mode = field(1)
        b.cbranch(b.icmp_signed("==", mode, const_i64(LEAF)), done, step)
        b.position_at_end(step)
        v = b.load(b.gep(row, [field(0)]))
        th = b.load(b.gep(thresholds, [at]))
        true = ir.Constant(I1, 0)
        for code, (pred, ordered) in enumerate(_PREDICATES):
            cmp = b.fcmp_ordered(pred, v, th) if ordered else b.fcmp_unordered(pred, v, th)
            true = b.select(b.icmp_signed("==", mode, const_i64(code)), cmp, true)
        missing = b.and_(b.icmp_signed("!=", field(4), const_i64(0)),
                         b.fcmp_unordered("uno", v, v))
        true = b.or_(true, missing)
        b.store(b.select(true, field(2), field(3)), node)
        b.branch(head)
        b.position_at_end(done)

    def _aggregate(self, slot: ir.Value, has_slot: ir.Value, value: ir.Value) -> None:
        b = self.builder
        old = b.load(slot)
        if self.aggregate == "SUM":
            new = b.fadd(old, value)
        else:
            had = b.icmp_signed("!=", b.load(has_slot), ir.Constant(I8, 0))
            better = b.fcmp_ordered("<" if self.aggregate == "MIN" else ">", value, old)
            new = b.select(b.or_(b.not_(had), better), value, old)
        b.store(new, slot)
        b.store(ir.Constant(I8, 1), has_slot)


def emit_trees(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
               size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The tree-ensemble kernel of ``func``, or None when ``func`` is not one."""
    tag = match_trees(func)
    if tag is None:
        return None
    return TreeEmitter(module, func, symbol, tag, size_vars).emit()
