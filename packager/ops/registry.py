"""The operator table: one row per high-level operator.

Each ``OpDef`` says how the operator's output type follows from its inputs (``infer``), what it
computes as numpy (``reference``: the living definition, used by constant folding and by the
kernel tests), and how it becomes a primitive function (``legalize``: tensor expressions over
placeholders). A new operator is a new row, registered with ``@register_op``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir.sym import is_static

from ..ir.graph import TensorType

# Pattern kinds, from most to least fusible (as in TVM's OpPatternKind).
ELEMWISE = "elemwise"      # same shape in and out, read at the same indices (broadcast allowed)
INJECTIVE = "injective"    # each output element reads some input elements (transpose, concat, pad)
REDUCTION = "reduction"    # reduces over axes (sum, max, softmax's parts)
COMPLEX = "complex"        # matmul, conv: may take an elementwise epilogue
VIEW = "view"              # no data movement: a new shape over the same bytes (reshape, flatten)
OPAQUE = "opaque"          # one hand-written kernel (a recurrence's time loop): nothing fuses in


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    infer: Callable[..., TensorType]
    reference: Callable[..., np.ndarray]
    legalize: Callable[..., object] | None  # (*te.Tensor, out_type=..., **attrs) -> te.Tensor


OPS: dict[str, OpDef] = {}


def register_op(name: str, kind: str, infer: Callable[..., TensorType],
                legalize: Callable[..., object] | None = None) -> Callable:
    """Decorator over the numpy reference: registers the row; a name may be registered once."""

    def wrap(reference: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        if name in OPS:
            raise ValueError(f"operator {name!r} is registered twice")
        OPS[name] = OpDef(name, kind, infer, reference, legalize)
        return reference

    return wrap


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}") from None


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    if not all(is_static(s) for s in shapes):
        return _broadcast_symbolic(shapes)
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _broadcast_symbolic(shapes: tuple[tuple, ...]) -> tuple:
    """numpy broadcasting where a dim may be symbolic: a symbolic dim meets 1 or itself (a
    symbolic dim that is 1 at run time while the other is not would need a second kernel)."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        dims = {s[len(s) - rank + d] for s in shapes if len(s) - rank + d >= 0} - {1}
        if len(dims) > 1:
            raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast (or only "
                             "for some sizes of their symbolic dims)")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def same_as_first(*types: TensorType, **attrs: object) -> TensorType:
    return types[0]
