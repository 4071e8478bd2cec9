"""Decision-tree ensembles (``ai.onnx.ml`` TreeEnsembleRegressor/Classifier, TreeEnsemble).

One operator, ``tree_ensemble``: every row of ``x`` walks every tree from its root to a leaf
and the leaves' weights are aggregated per target. The trees are constant arrays in one
normalized layout that the frontend builds from any of the ONNX forms:

- ``nodes`` int32 ``[M, 4]``: feature, true child, false child (indices into the same rows),
  and the node's mode (``MODES``) plus ``MISSING`` when a missing value (NaN) takes the true
  branch (16 bytes a node: a walk reads one cache line per level);
- ``thresholds`` ``[M]`` in ``x``'s dtype;
- ``leaf_begin`` int64 ``[M + 1]``: the weights of row ``i`` (a leaf) are
  ``leaf_begin[i] .. leaf_begin[i + 1]`` of ``leaf_target`` (int64) and ``leaf_weight``;
- ``roots`` int64 ``[R]``: each tree's first row, in the order the scores are summed.

Attributes ``modes`` (the modes the interior nodes use; () for any) and ``missing`` (whether
any node sends NaN down its true branch) let the kernel leave out the tests nothing needs.

The output ``[N, targets]`` holds the aggregate (sum, min or max; an average is the sum the
frontend divides) of each target's weights, 0 where no leaf reached gave that target a weight
(ONNX Runtime's ``has_score``). Base values, averaging and the post-transform are ordinary
operators after it. The kernel is hand-written (``codegen/trees.py``): a tree walk is a loop
no tensor expression states.
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from .registry import OPAQUE, register_op

# node modes, in ``nodes[:, 1]``
MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
         "BRANCH_NEQ": 5, "LEAF": 6}
LEAF = MODES["LEAF"]
MISSING = 8   # flag beside the mode: NaN goes down the true branch
AGGREGATES = ("SUM", "MIN", "MAX")


def _infer(x: TensorType, nodes: TensorType, thresholds: TensorType, leaf_begin: TensorType,
           leaf_target: TensorType, leaf_weight: TensorType, roots: TensorType,
           targets: int = 1, aggregate: str = "SUM", modes: tuple = (), missing: bool = True
           ) -> TensorType:
    if x.dtype not in ("float32", "float64") or len(x.shape) != 2:
        raise ValueError(f"tree_ensemble: x must be float32 or float64 [N, F], not {x}")
    if len(nodes.shape) != 2 or nodes.shape[1] != 4 or nodes.dtype != "int32":
        raise ValueError(f"tree_ensemble: nodes must be int32 [M, 4], not {nodes}")
    if thresholds.dtype != x.dtype or leaf_weight.dtype != x.dtype:
        raise ValueError("tree_ensemble: thresholds and weights must have x's dtype")
    if aggregate not in AGGREGATES:
        raise ValueError(f"tree_ensemble: aggregate {aggregate!r} is not one of {AGGREGATES}")
    return TensorType((x.shape[0], int(targets)), x.dtype)


def _legalize(x: te.Tensor, nodes: te.Tensor, thresholds: te.Tensor, leaf_begin: te.Tensor,
              leaf_target: te.Tensor, leaf_weight: te.Tensor, roots: te.Tensor,
              out_type: TensorType, name: str, targets: int = 1, aggregate: str = "SUM",
              modes: tuple = (), missing: bool = True) -> te.Tensor:
    """A stand-in body: the tag hands the function to the tree kernel (``codegen/trees.py``)."""
    from ..ir.patterns import tag_reduction
    k = te.reduce_axis(1, "k")
    tag_reduction(k, "tree_ensemble", (x, nodes, thresholds, leaf_begin, leaf_target,
                                       leaf_weight, roots), aggregate=aggregate,
                  modes=tuple(int(m) for m in modes), missing=bool(missing))
    return te.compute(out_type.shape, lambda *i: te.sum_of(thresholds[(k,)], k), name=name,
                      dtype=x.dtype)


def _goes_true(v: np.ndarray, mode: np.ndarray, th: np.ndarray, missing: np.ndarray
               ) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        cmp = np.select([mode == 0, mode == 1, mode == 2, mode == 3, mode == 4],
                        [v <= th, v < th, v >= th, v > th, v == th], v != th)
    return cmp | ((missing != 0) & np.isnan(v))


@register_op("tree_ensemble", OPAQUE, _infer, _legalize)
def tree_ensemble(x: np.ndarray, nodes: np.ndarray, thresholds: np.ndarray,
                  leaf_begin: np.ndarray, leaf_target: np.ndarray, leaf_weight: np.ndarray,
                  roots: np.ndarray, targets: int = 1, aggregate: str = "SUM",
                  modes: tuple = (), missing: bool = True) -> np.ndarray:
    """Every row through every tree (all rows advanced together, one level per step), the
    leaves' weights aggregated in tree order, as the kernel does."""
    n = x.shape[0]
    rows = np.arange(n)
    mode_of, missing_of = nodes[:, 3] % MISSING, nodes[:, 3] // MISSING
    acc = np.zeros((n, targets), x.dtype)
    has = np.zeros((n, targets), bool)
    for root in roots.tolist():
        at = np.full(n, root, np.int64)
        while True:
            inner = mode_of[at] != LEAF
            if not inner.any():
                break
            a = at[inner]
            v = x[rows[inner], nodes[a, 0]]
            true = _goes_true(v, mode_of[a], thresholds[a], missing_of[a])
            at[inner] = np.where(true, nodes[a, 1], nodes[a, 2])
        for r in range(n):
            for w in range(int(leaf_begin[at[r]]), int(leaf_begin[at[r] + 1])):
                t, value = int(leaf_target[w]), leaf_weight[w]
                if aggregate == "SUM":
                    acc[r, t] += value
                elif not has[r, t] or (value < acc[r, t] if aggregate == "MIN"
                                       else value > acc[r, t]):
                    acc[r, t] = value
                has[r, t] = True
    return acc
