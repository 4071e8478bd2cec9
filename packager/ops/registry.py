"""The operator table: one row per high-level operator.

Each ``OpDef`` says how the operator's output type follows from its inputs (``infer``), what it
computes as numpy (``reference``: the living definition, used by constant folding and by the
kernel tests), and how it becomes a primitive function (``legalize``: tensor expressions over
placeholders). A new operator is a new row, registered with ``@register_op``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir.sym import Relation, assume, is_static

from ..ir.graph import TensorType

# Pattern kinds, from most to least fusible (as in TVM's OpPatternKind).
ELEMWISE = "elemwise"      # same shape in and out, read at the same indices (broadcast allowed)
INJECTIVE = "injective"    # each output element reads some input elements (transpose, concat, pad)
REDUCTION = "reduction"    # reduces over axes (sum, max, softmax's parts)
COMPLEX = "complex"        # matmul, conv: may take an elementwise epilogue
VIEW = "view"              # no data movement: a new shape over the same bytes (reshape, flatten)
OPAQUE = "opaque"          # one hand-written kernel (a recurrence's time loop): nothing fuses in
BIND = "bind"              # no kernel: binds a size variable from a count (the VM's BIND_SIZE)
BRANCH = "branch"          # no kernel: an If run as the VM's branch (ops/control.py)


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    # (*TensorType, **attrs) -> TensorType; one that takes ``relations`` (a list, keyword) adds
    # the relations between symbolic dims it assumes to it (``ir.sym.assume``)
    infer: Callable[..., TensorType]
    reference: Callable[..., np.ndarray]
    legalize: Callable[..., object] | None  # (*te.Tensor, out_type=..., **attrs) -> te.Tensor
    assumes: bool = False                   # infer takes ``relations``
    # made only by passes/layout.py (a constant operand packed for a kernel, ops/layout.py and
    # ops/bf16.py), never by a frontend
    layout: bool = False

    def infer_type(self, *types: TensorType, **attrs: object
                   ) -> tuple[TensorType, tuple[Relation, ...]]:
        """The output type for inputs of ``types``, and the relations between symbolic dims
        that it holds under (checked at run time; empty for static shapes)."""
        if not self.assumes:
            return self.infer(*types, **attrs), ()
        relations: list[Relation] = []
        out = self.infer(*types, relations=relations, **attrs)
        return out, tuple(relations)


OPS: dict[str, OpDef] = {}


def register_op(name: str, kind: str, infer: Callable[..., TensorType],
                legalize: Callable[..., object] | None = None, layout: bool = False) -> Callable:
    """Decorator over the numpy reference: registers the row; a name may be registered once.
    ``layout``: a layout-only operator (see ``OpDef.layout``)."""

    def wrap(reference: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        if name in OPS:
            raise ValueError(f"operator {name!r} is registered twice")
        assumes = "relations" in inspect.signature(infer).parameters
        OPS[name] = OpDef(name, kind, infer, reference, legalize, assumes, layout)
        return reference

    return wrap


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}") from None


def size_expr(d: object) -> object:
    """A dim as a tensor-expression operand: a run-time size (``SymExpr``) as an int64
    ``te.Const`` the lowering evaluates from the size variables; an int as is."""
    from ..ir import te
    from ..ir.sym import SymExpr
    return te.Const(d, "int64") if isinstance(d, SymExpr) else d


def broadcast_shape(*shapes: tuple[int, ...], relations: list) -> tuple[int, ...]:
    """numpy's broadcast of ``shapes``; with symbolic dims, the relations it assumes are added
    to ``relations``."""
    if not all(is_static(s) for s in shapes):
        return _broadcast_symbolic(shapes, relations)
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _broadcast_symbolic(shapes: tuple[tuple, ...], relations: list) -> tuple:
    """numpy broadcasting where a dim may be symbolic: a symbolic dim meets 1 or itself (a
    symbolic dim that is 1 at run time while the other is not would need a second kernel)."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        seen = [s[len(s) - rank + d] for s in shapes if len(s) - rank + d >= 0]
        dims = list(dict.fromkeys(x for x in seen if not (isinstance(x, int) and x == 1)))
        static = [x for x in dims if isinstance(x, int)]
        if len(static) > 1:
            raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        # Two different sizes where one is symbolic agree for some sizes only: assume they are
        # equal (checked when the runtime binds the sizes) and go on with the static one if any.
        keep = static[0] if static else (dims[0] if dims else 1)
        for x in dims:
            if x is not keep and x != keep:
                assume(relations, "eq", x, keep, f"shapes {' and '.join(map(str, shapes))} broadcast")
        out.append(keep)
    return tuple(out)


def same_as_first(*types: TensorType, **attrs: object) -> TensorType:
    return types[0]
