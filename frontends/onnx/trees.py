"""``ai.onnx.ml`` tree ensembles: TreeEnsembleRegressor and TreeEnsembleClassifier (opsets 1 and
3, what sklearn-onnx exports for trees, forests and gradient boosting) and TreeEnsemble
(opset 5).

Every form becomes one ``tree_ensemble`` operator (``packager/ops/trees.py``: the trees as
constant arrays, one compiled walk per row and tree), then ordinary operators for what ONNX
Runtime does after the walk: the average's division, the base values, the post-transform and,
for a classifier, the label and the binary cases' second score column (``_classify``, after
ONNX Runtime's ``TreeAggregatorClassifier``). A BRANCH_MEMBER node becomes a chain of
BRANCH_EQ nodes. Features are compared in the input's dtype (float32, float64; integers as
float32). String class labels are refused.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...packager.ir.graph import Value
from ...packager.ops.trees import LEAF, MISSING, MODES
from .registry import NodeContext, converter

_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
_AGGREGATES_V5 = ("AVERAGE", "SUM", "MIN", "MAX")
_MODES_V5 = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
             "BRANCH_MEMBER")

_NODE_ATTRS = {
    "nodes_falsenodeids": [], "nodes_featureids": [], "nodes_hitrates": [],
    "nodes_hitrates_as_tensor": None, "nodes_missing_value_tracks_true": [],
    "nodes_modes": [], "nodes_nodeids": [], "nodes_treeids": [], "nodes_truenodeids": [],
    "nodes_values": [], "nodes_values_as_tensor": None, "post_transform": "NONE",
    "base_values": [], "base_values_as_tensor": None,
}


class Trees:
    """The normalized tree arrays (``ops/trees.py``'s layout) being built."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []     # feature, mode, true, false, missing
        self.thresholds: list[float] = []
        self.weights: list[list[tuple[int, float]]] = []

    def add(self, feature: int, mode: int, threshold: float, missing: int) -> int:
        self.rows.append([feature, mode, -1, -1, missing])
        self.thresholds.append(threshold)
        self.weights.append([])
        return len(self.rows) - 1

    def arrays(self, ctx: NodeContext, dtype: str, features: int, targets: int
               ) -> list[Value]:
        rows = np.array(self.rows, np.int64).reshape(-1, 5)
        inner = rows[:, 1] != LEAF
        if inner.any() and (rows[inner, 0].min() < 0 or rows[inner, 0].max() >= features):
            raise ctx.error(f"a node reads a feature outside the input's {features}")
        if inner.any() and (rows[inner, 2:4].min() < 0 or rows[inner, 2:4].max() >= len(rows)):
            raise ctx.error("a node's child is not a node of the ensemble")
        if len(rows) >= 1 << 31:
            raise ctx.error(f"{len(rows)} nodes are too many (at most 2^31 - 1)")
        rows[~inner, 2:4] = 0
        flags = rows[:, 1] + MISSING * ((rows[:, 4] != 0) & inner)
        nodes = np.stack([rows[:, 0], rows[:, 2], rows[:, 3], flags], axis=1).astype(np.int32)
        counts = [len(w) for w in self.weights]
        begin = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat = [pair for w in self.weights for pair in w]
        target = np.array([t for t, _ in flat], np.int64)
        if len(target) and (target.min() < 0 or target.max() >= targets):
            raise ctx.error(f"a leaf weighs a target outside 0..{targets - 1}")
        weight = np.array([v for _, v in flat], dtype)
        return [ctx.constant(nodes, "tree_nodes"),
                ctx.constant(np.array(self.thresholds, dtype), "tree_thresholds"),
                ctx.constant(begin, "tree_leaf_begin"), ctx.constant(target, "tree_leaf_target"),
                ctx.constant(weight, "tree_leaf_weight")]


def _floats(ctx: NodeContext, name: str) -> list[float]:
    tensor = ctx.attrs.get(f"{name}_as_tensor")
    if tensor is not None and np.asarray(tensor).size:
        return np.asarray(tensor, np.float64).reshape(-1).tolist()
    return [float(v) for v in ctx.attrs.get(name) or []]


def _features(ctx: NodeContext) -> tuple[Value, str]:
    """The input as ``[N, F]`` in the dtype the trees compare in."""
    x = ctx.input(0)
    dtype = x.type.dtype
    if dtype in ("int32", "int64", "float16"):
        x = ctx.emit("cast", x, dtype="float32")
        dtype = "float32"
    elif dtype not in ("float32", "float64"):
        raise ctx.error(f"inputs of dtype {dtype} are not supported")
    if len(x.type.shape) != 2:
        raise ctx.error(f"the input must be [N, F], not {x.type.shape}")
    if not isinstance(x.type.shape[1], int):
        raise ctx.error("the feature count (the input's last dim) must be fixed at export")
    return x, dtype


def _legacy_trees(ctx: NodeContext, prefix: str) -> tuple[Trees, list[int]]:
    """The nodes of a TreeEnsembleRegressor/Classifier (``prefix``: ``target`` or ``class``)."""
    a = ctx.attrs
    ids = list(zip(a["nodes_treeids"], a["nodes_nodeids"]))
    n = len(ids)
    values = _floats(ctx, "nodes_values")
    missing = list(a["nodes_missing_value_tracks_true"]) or [0] * n
    lists = (a["nodes_featureids"], a["nodes_modes"], a["nodes_truenodeids"],
             a["nodes_falsenodeids"], missing)
    if any(len(v) != n for v in lists) or (values and len(values) != n):
        raise ctx.error("the nodes_* attributes have different lengths")
    at = {key: i for i, key in enumerate(ids)}
    if len(at) != n:
        raise ctx.error("two nodes have the same (tree, node) id")
    trees = Trees()
    for i in range(n):
        mode = a["nodes_modes"][i]
        if mode not in MODES:
            raise ctx.error(f"node mode {mode!r} is not supported")
        trees.add(int(a["nodes_featureids"][i]), MODES[mode], values[i] if values else 0.0,
                  int(missing[i]))
    children: set[int] = set()
    for i, (tree, _) in enumerate(ids):
        if trees.rows[i][1] == LEAF:
            continue
        for col, name in ((2, "nodes_truenodeids"), (3, "nodes_falsenodeids")):
            child = at.get((tree, int(a[name][i])))
            if child is None:
                raise ctx.error(f"node {ids[i]} points to a node its tree does not have")
            trees.rows[i][col] = child
            children.add(child)
    roots = [i for i in range(n) if i not in children]
    if len({ids[i][0] for i in roots}) != len(roots):
        raise ctx.error("a tree has more than one root")
    w_tree, w_node = a[f"{prefix}_treeids"], a[f"{prefix}_nodeids"]
    w_ids, w_values = a[f"{prefix}_ids"], _floats(ctx, f"{prefix}_weights")
    if not len(w_tree) == len(w_node) == len(w_ids) == len(w_values):
        raise ctx.error(f"the {prefix}_* attributes have different lengths")
    for tree, node, target, value in zip(w_tree, w_node, w_ids, w_values):
        i = at.get((tree, node))
        if i is None or trees.rows[i][1] != LEAF:
            raise ctx.error(f"a weight is given to ({tree}, {node}), which is not a leaf")
        trees.weights[i].append((int(target), value))
    return trees, roots


def _walk(ctx: NodeContext, x: Value, dtype: str, trees: Trees, roots: Sequence[int],
          targets: int, aggregate: str) -> Value:
    arrays = trees.arrays(ctx, dtype, x.type.shape[1], targets)
    inner = [r for r in trees.rows if r[1] != LEAF]
    return ctx.emit("tree_ensemble", x, *arrays, ctx.constant(np.array(roots, np.int64), "roots"),
                    targets=targets, aggregate="SUM" if aggregate == "AVERAGE" else aggregate,
                    modes=tuple(sorted({r[1] for r in inner})),
                    missing=any(r[4] for r in inner))


def _column(ctx: NodeContext, s: Value, k: int) -> Value:
    return ctx.emit("strided_slice", s, starts=(k,), ends=(k + 1,), axes=(1,), steps=(1,))


def _const(ctx: NodeContext, value: float, like: Value) -> Value:
    return ctx.constant(np.array([[value]], like.type.dtype), "c")


def _post_transform(ctx: NodeContext, s: Value, transform: str) -> Value:
    """ONNX Runtime's ``write_scores`` on two or more columns."""
    if transform == "NONE":
        return s
    if transform == "LOGISTIC":
        return ctx.emit("sigmoid", s)
    if transform == "SOFTMAX":
        return ctx.emit("nn.softmax", s, axis=-1)
    if transform == "PROBIT":
        return _probit(ctx, s)
    # SOFTMAX_ZERO: exp(v - max) where v is not (nearly) 0; v * exp(-max) elsewhere, left out of
    # the sum
    top = ctx.emit("max", s, axes=(1,), keepdims=True)
    big = ctx.emit("greater", ctx.emit("abs", s), _const(ctx, 1e-7, s))
    e = ctx.emit("exp", ctx.emit("subtract", s, top))
    small = ctx.emit("multiply", s, ctx.emit("exp", ctx.emit("negative", top)))
    total = ctx.emit("sum", ctx.emit("where", big, e, _const(ctx, 0.0, s)), axes=(1,),
                     keepdims=True)
    return ctx.emit("divide", ctx.emit("where", big, e, small), total)


def _probit(ctx: NodeContext, s: Value) -> Value:
    """sqrt(2) * ErfInv(2 s - 1) with ONNX Runtime's ErfInv (Winitzki's approximation)."""
    def c(v: float) -> Value:
        return _const(ctx, v, s)

    x = ctx.emit("subtract", ctx.emit("multiply", s, c(2.0)), c(1.0))
    sign = ctx.emit("where", ctx.emit("less", x, c(0.0)), c(-1.0), c(1.0))
    lg = ctx.emit("log", ctx.emit("multiply", ctx.emit("subtract", c(1.0), x),
                                  ctx.emit("add", c(1.0), x)))
    v = ctx.emit("add", c(2 / (3.14159 * 0.147)), ctx.emit("multiply", c(0.5), lg))
    v2 = ctx.emit("multiply", c(1 / 0.147), lg)
    v3 = ctx.emit("add", ctx.emit("negative", v), ctx.emit("sqrt", ctx.emit(
        "subtract", ctx.emit("multiply", v, v), v2)))
    return ctx.emit("multiply", c(1.41421356), ctx.emit("multiply", sign, ctx.emit("sqrt", v3)))


def _transform_name(ctx: NodeContext, value: object) -> str:
    name = _TRANSFORMS[value] if isinstance(value, int) and 0 <= value < 5 else value
    if name not in _TRANSFORMS:
        raise ctx.error(f"post_transform {value!r} is not one of {', '.join(_TRANSFORMS)}")
    return str(name)


def _finish_regression(ctx: NodeContext, s: Value, n_trees: int, aggregate: str,
                       base: list[float], transform: str) -> Value:
    """Average, base values, post-transform (ONNX Runtime: one target takes PROBIT only)."""
    targets = s.type.shape[1]
    if aggregate == "AVERAGE":
        s = ctx.emit("divide", s, _const(ctx, float(n_trees), s))
    if base and (len(base) == targets or targets == 1):
        s = ctx.emit("add", s, ctx.constant(np.array([base[:targets]], s.type.dtype), "base"))
    if targets > 1:
        return _post_transform(ctx, s, transform)
    return _probit(ctx, s) if transform == "PROBIT" else s


@converter("TreeEnsembleRegressor", since=1, domain="ai.onnx.ml", attrs={
    **_NODE_ATTRS, "aggregate_function": "SUM", "n_targets": 1, "target_ids": [],
    "target_nodeids": [], "target_treeids": [], "target_weights": [],
    "target_weights_as_tensor": None})
def _regressor(ctx: NodeContext) -> Value:
    x, dtype = _features(ctx)
    aggregate = ctx.attrs["aggregate_function"]
    if aggregate not in _AGGREGATES_V5:
        raise ctx.error(f"aggregate_function {aggregate!r} is not one of {_AGGREGATES_V5}")
    transform = _transform_name(ctx, ctx.attrs["post_transform"])
    trees, roots = _legacy_trees(ctx, "target")
    targets = int(ctx.attrs["n_targets"])
    s = _walk(ctx, x, dtype, trees, roots, targets, aggregate)
    s = _finish_regression(ctx, s, len(roots), aggregate, _floats(ctx, "base_values"), transform)
    return s if s.type.dtype == "float32" else ctx.emit("cast", s, dtype="float32")


@converter("TreeEnsembleClassifier", since=1, domain="ai.onnx.ml", attrs={
    **_NODE_ATTRS, "class_ids": [], "class_nodeids": [], "class_treeids": [],
    "class_weights": [], "class_weights_as_tensor": None, "classlabels_int64s": [],
    "classlabels_strings": []})
def _classifier(ctx: NodeContext) -> list[Value]:
    if ctx.attrs["classlabels_strings"]:
        raise ctx.error("string class labels (classlabels_strings) are not supported: export "
                        "the classifier with integer labels")
    labels = [int(v) for v in ctx.attrs["classlabels_int64s"]]
    if not labels:
        raise ctx.error("classlabels_int64s is empty")
    x, dtype = _features(ctx)
    transform = _transform_name(ctx, ctx.attrs["post_transform"])
    trees, roots = _legacy_trees(ctx, "class")
    s = _walk(ctx, x, dtype, trees, roots, len(labels), "SUM")
    if dtype != "float32":
        s = ctx.emit("cast", s, dtype="float32")
    ids = [int(v) for v in ctx.attrs["class_ids"]]
    weights = _floats(ctx, "class_weights")
    return _classify(ctx, s, labels, set(ids), all(w >= 0 for w in weights),
                     _floats(ctx, "base_values"), transform)


def _classify(ctx: NodeContext, s: Value, labels: list[int], weighted: set[int],
              positive: bool, base: list[float], transform: str) -> list[Value]:
    """(label [N], scores [N, C]) from the summed weights ``s`` as ONNX Runtime's
    ``TreeAggregatorClassifier`` finalizes them. Whether a class has a score is taken from the
    model (a class some leaf weighs) rather than per row."""
    n = s.type.shape[0]
    classes = len(labels)
    label_table = ctx.constant(np.array(labels, np.int64), "labels")
    if classes > 2:
        if base:
            s = ctx.emit("add", s, ctx.constant(np.array([base[:classes]], s.type.dtype), "base"))
        scored = s
        if not base and len(weighted) < classes:   # a class nothing weighs never wins
            mask = np.array([[c in weighted for c in range(classes)]])
            scored = ctx.emit("where", ctx.constant(mask, "weighted"), s,
                              _const(ctx, -np.inf, s))
        best = ctx.reshape(ctx.emit("argmax", scored, axis=1, keepdims=True), (n,))
        return [ctx.emit("take", label_table, best, axis=0), _post_transform(ctx, s, transform)]
    if classes != 2:
        raise ctx.error("a classifier needs at least two class labels")
    binary = len(weighted) == 1
    has0, has1 = 0 in weighted, 1 in weighted
    s0, s1 = _column(ctx, s, 0), _column(ctx, s, 1)
    if len(base) == 2:
        if has1:   # ONNX Runtime reads base_values[1] only, on column 0's sum
            s1 = ctx.emit("add", s0, _const(ctx, base[1], s))
            s0 = ctx.emit("negative", s1)
        else:
            s1 = ctx.emit("add", s1, _const(ctx, base[1], s))
            s0 = ctx.emit("add", s0, _const(ctx, base[0], s))
    elif len(base) == 1:
        s0 = ctx.emit("add", s0, _const(ctx, base[0], s))
    elif base:
        raise ctx.error(f"{len(base)} base values for two classes")
    two = has1 or len(base) == 2   # else ONNX Runtime drops column 1 and rebuilds it
    if not two and not binary:
        raise ctx.error("a two-class classifier whose leaves weigh no class is not supported")
    pos = s1 if has1 else (s0 if has0 else _const(ctx, 0.0, s))
    if binary:
        cut = 0.5 if positive else 0.0
        win = ctx.emit("greater", pos, _const(ctx, cut, s))
        label = ctx.emit("where", win, ctx.constant(np.array([[labels[1]]], np.int64), "l1"),
                         ctx.constant(np.array([[labels[0]]], np.int64), "l0"))
    else:
        win = ctx.emit("greater", pos, _const(ctx, 0.0, s))
        label = ctx.emit("cast", win, dtype="int64")
    label = ctx.reshape(label, (n,))
    if two:
        scores = _post_transform(ctx, ctx.emit("concat", s0, s1, axis=1), transform)
    elif transform == "PROBIT":
        scores = _probit(ctx, s0)    # one column: ONNX Runtime writes only that
        return [label, scores]
    elif binary and positive:   # ONNX Runtime's add_second_class 0 and 1
        scores = ctx.emit("concat", ctx.emit("subtract", _const(ctx, 1.0, s), s0), s0, axis=1)
    elif transform == "LOGISTIC":   # 2 and 3 under LOGISTIC
        scores = ctx.emit("concat", ctx.emit("sigmoid", ctx.emit("negative", s0)),
                          ctx.emit("sigmoid", s0), axis=1)
    else:   # 2 and 3 otherwise: [-s, s] (ONNX Runtime 1.32)
        scores = ctx.emit("concat", ctx.emit("negative", s0), s0, axis=1)
    return [label, scores]


@converter("TreeEnsemble", since=5, domain="ai.onnx.ml", attrs={
    "aggregate_function": 1, "leaf_targetids": [], "leaf_weights": None,
    "membership_values": None, "n_targets": None, "nodes_falseleafs": [],
    "nodes_falsenodeids": [], "nodes_featureids": [], "nodes_hitrates": None,
    "nodes_missing_value_tracks_true": [], "nodes_modes": None, "nodes_splits": None,
    "nodes_trueleafs": [], "nodes_truenodeids": [], "post_transform": 0, "tree_roots": []})
def _tree_ensemble(ctx: NodeContext) -> Value:
    """TreeEnsemble (opset 5): interior nodes and leaves in separate lists; output in the
    input's dtype."""
    a = ctx.attrs
    out_dtype = ctx.input(0).type.dtype
    x, dtype = _features(ctx)
    agg = a["aggregate_function"]
    if not (isinstance(agg, int) and 0 <= agg < 4):
        raise ctx.error(f"aggregate_function {agg!r} is not 0..3")
    aggregate = _AGGREGATES_V5[agg]
    transform = _transform_name(ctx, a["post_transform"])
    if a["n_targets"] is None or a["nodes_modes"] is None or a["nodes_splits"] is None \
            or a["leaf_weights"] is None:
        raise ctx.error("n_targets, nodes_modes, nodes_splits and leaf_weights are required")
    modes = np.asarray(a["nodes_modes"]).reshape(-1).astype(int).tolist()
    splits = np.asarray(a["nodes_splits"], np.float64).reshape(-1).tolist()
    n = len(modes)
    missing = list(a["nodes_missing_value_tracks_true"]) or [0] * n
    lists = (a["nodes_featureids"], a["nodes_truenodeids"], a["nodes_falsenodeids"],
             a["nodes_trueleafs"], a["nodes_falseleafs"], splits, missing)
    if any(len(v) != n for v in lists):
        raise ctx.error("the nodes_* attributes have different lengths")
    leaf_weights = np.asarray(a["leaf_weights"], np.float64).reshape(-1).tolist()
    leaf_targets = [int(t) for t in a["leaf_targetids"]]
    if len(leaf_weights) != len(leaf_targets):
        raise ctx.error("leaf_targetids and leaf_weights have different lengths")
    members = np.asarray(a["membership_values"] if a["membership_values"] is not None else [],
                         np.float64).reshape(-1)
    sets, current = [], []
    for v in members.tolist():
        if np.isnan(v):
            sets.append(current)
            current = []
        else:
            current.append(v)
    if current:
        sets.append(current)
    trees = Trees()
    for i in range(n):
        if not 0 <= modes[i] < 7:
            raise ctx.error(f"node mode {modes[i]} is not 0..6")
        trees.add(int(a["nodes_featureids"][i]), min(modes[i], 5), splits[i], int(missing[i]))
    first_leaf = len(trees.rows)
    for t, w in zip(leaf_targets, leaf_weights):
        trees.weights[trees.add(0, LEAF, 0.0, 0)].append((t, w))

    def child(i: int, kind: str) -> int:
        k = int(a[f"nodes_{kind}nodeids"][i])
        bound = len(leaf_targets) if a[f"nodes_{kind}leafs"][i] else n
        if not 0 <= k < bound:
            raise ctx.error(f"node {i}'s {kind} child {k} is out of range")
        return first_leaf + k if a[f"nodes_{kind}leafs"][i] else k

    member = 0
    for i in range(n):
        true, false = child(i, "true"), child(i, "false")
        trees.rows[i][2:4] = [true, false]
        if modes[i] != 6:
            continue
        if member >= len(sets) or not sets[member]:
            raise ctx.error("membership_values has no set for a BRANCH_MEMBER node")
        values = sets[member]
        member += 1
        trees.rows[i][1] = MODES["BRANCH_EQ"]   # a chain of equality tests, one per member
        trees.thresholds[i] = values[0]
        at = i
        for v in values[1:]:
            nxt = trees.add(trees.rows[i][0], MODES["BRANCH_EQ"], v, 0)
            trees.rows[nxt][2:4] = [true, false]
            trees.rows[at][3] = nxt
            at = nxt
    roots = [int(r) for r in a["tree_roots"]]
    if not roots or min(roots) < 0 or max(roots) >= n:
        raise ctx.error("tree_roots must name nodes")
    s = _walk(ctx, x, dtype, trees, roots, int(a["n_targets"]), aggregate)
    s = _finish_regression(ctx, s, len(roots), aggregate, [], transform)
    return s if s.type.dtype == out_dtype else ctx.emit("cast", s, dtype=out_dtype)
