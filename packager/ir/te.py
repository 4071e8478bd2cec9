"""Tensor-expression DSL: how primitive tensor functions are written.

A ``Tensor`` is either a ``placeholder`` (a function input) or the result of ``compute``, which
describes every element of the output as an expression of its indices, like TVM's ``te.compute``::

    A = placeholder((n, k), name="A")
    B = placeholder((m, k), name="B")
    r = reduce_axis(k, "r")
    C = compute((n, m), lambda i, j: sum_of(A[i, r] * B[j, r], axis=r), name="C")

Expressions are immutable trees; the code generator lowers them to LLVM loop nests.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .sym import SymExpr

# float16 and bfloat16 are storage formats: kernels load them into float32, compute in float32
# and round back (to nearest even) when they store; the conversions are integer IR, no libcalls.
# numpy has no bfloat16: the packager uses ml_dtypes' (an onnx dependency) for constants.
# The float8 formats (ml_dtypes' names) are stored as one byte the same way; 4- and 2-bit integers
# one per byte (the low bits, as ml_dtypes lays them out), computed as int8.
FLOAT8_DTYPES = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"})
REDUCED_FLOAT_DTYPES = frozenset({"float16", "bfloat16"}) | FLOAT8_DTYPES
FLOAT_DTYPES = frozenset({"float32", "float64"}) | REDUCED_FLOAT_DTYPES
INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
SUBBYTE_INT_DTYPES = frozenset({"int4", "uint4", "int2", "uint2"})
DTYPES = FLOAT_DTYPES | INT_DTYPES | SUBBYTE_INT_DTYPES | {"bool"}
# The dtypes numpy knows by name only once ml_dtypes is imported (np.dtype("bfloat16")). The
# import costs ~0.7 CPU-s (it registers ufunc loops for each of its dtypes), more than a warm
# export of a float32 model: it happens when the first tensor of one of these dtypes is typed.
ML_DTYPES = (REDUCED_FLOAT_DTYPES - {"float16"}) | SUBBYTE_INT_DTYPES


def use_dtype(dtype: str) -> None:
    """Make numpy know ``dtype`` by name: import ml_dtypes for the dtypes it defines."""
    if dtype in ML_DTYPES:
        import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype name)


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` as stored in memory (bool: 1, bfloat16: 2, int4: 1)."""
    if dtype in FLOAT8_DTYPES or dtype in SUBBYTE_INT_DTYPES:
        return 1
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES

_ids = itertools.count()


class Expr:
    """Base of every scalar expression; ``dtype`` is one of ``DTYPES``."""

    dtype: str

    def __add__(self, other: object) -> Expr:
        return binary("add", self, other)

    def __radd__(self, other: object) -> Expr:
        return binary("add", other, self)

    def __sub__(self, other: object) -> Expr:
        return binary("sub", self, other)

    def __rsub__(self, other: object) -> Expr:
        return binary("sub", other, self)

    def __mul__(self, other: object) -> Expr:
        return binary("mul", self, other)

    def __rmul__(self, other: object) -> Expr:
        return binary("mul", other, self)

    def __truediv__(self, other: object) -> Expr:
        return binary("div", self, other)

    def __rtruediv__(self, other: object) -> Expr:
        return binary("div", other, self)

    def __floordiv__(self, other: object) -> Expr:
        return binary("floordiv", self, other)

    def __mod__(self, other: object) -> Expr:
        return binary("mod", self, other)

    def __neg__(self) -> Expr:
        return binary("sub", const(0, self.dtype), self)

    def __lt__(self, other: object) -> Expr:
        return compare("lt", self, other)

    def __le__(self, other: object) -> Expr:
        return compare("le", self, other)

    def __gt__(self, other: object) -> Expr:
        return compare("gt", self, other)

    def __ge__(self, other: object) -> Expr:
        return compare("ge", self, other)

    # == stays identity so expressions can live in sets and dicts; use eq()/ne() instead.
    __hash__ = object.__hash__


@dataclass(eq=False)
class IndexVar(Expr):
    """A loop index over ``range(extent)``; ``reduce`` marks a reduction axis. The first axis
    of a reduction may carry a ``ReductionTag`` (set by ``patterns.tag_reduction``): the
    operator the reduction came from, which keeps its identity through fusion and rewriting."""

    name: str
    extent: int
    reduce: bool = False
    dtype: str = "int64"
    tag: ReductionTag | None = field(default=None, repr=False)


@dataclass(eq=False)
class Const(Expr):
    value: float | int | bool
    dtype: str


@dataclass(eq=False)
class Binary(Expr):
    """``op`` is one of add, sub, mul, div, floordiv, mod, max, min, and, or."""

    op: str
    a: Expr
    b: Expr
    dtype: str


@dataclass(eq=False)
class Compare(Expr):
    """``op`` is one of lt, le, gt, ge, eq, ne; the result is bool."""

    op: str
    a: Expr
    b: Expr
    dtype: str = "bool"


@dataclass(eq=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: str


@dataclass(eq=False)
class Cast(Expr):
    value: Expr
    dtype: str


@dataclass(eq=False)
class MathCall(Expr):
    """A float math function (exp, log, tanh, sigmoid, erf, sqrt, abs, floor, ...)."""

    name: str
    arg: Expr
    dtype: str


@dataclass(eq=False)
class Reduce(Expr):
    """``combiner`` over ``axes`` of ``body``: sum, max or min."""

    combiner: str
    body: Expr
    axes: tuple[IndexVar, ...]
    dtype: str


@dataclass(eq=False)
class Read(Expr):
    """One element of ``tensor`` at ``indices`` (int64 expressions)."""

    tensor: Tensor
    indices: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True)
class ReductionTag:
    """Which operator a reduction came from and its attributes, so the code generator can pick
    a specialized kernel (``codegen/rules.py`` ``KERNEL_RULES``)."""

    kind: str                        # "conv2d", "matmul", "max_pool2d", "recurrence", "softmax"
    operands: tuple[Tensor, ...]     # the placeholders it contracts: (x, w) or (a, b)
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class Tensor:
    """A tensor of a primitive function: a placeholder (``axes`` empty, ``body`` None) or a stage."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    axes: tuple[IndexVar, ...] = ()
    body: Expr | None = None
    uid: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self) -> None:
        use_dtype(self.dtype)

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices: object) -> Read:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise IndexError(f"{self.name} has rank {len(self.shape)}, indexed with {len(indices)}")
        return Read(self, tuple(as_expr(i, "int64") for i in indices), self.dtype)

    __hash__ = object.__hash__


def as_expr(value: object, dtype: str | None = None) -> Expr:
    """Wrap a Python number as a ``Const`` (of ``dtype`` when given); pass expressions through."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, int):
        return Const(value, dtype or "int64")
    if isinstance(value, SymExpr):   # a size known at run time, as an int64 value
        return Const(value, "int64") if dtype in (None, "int64") else Cast(Const(value, "int64"),
                                                                           dtype)
    if isinstance(value, float):
        return Const(value, dtype if dtype in FLOAT_DTYPES else "float32")
    raise TypeError(f"cannot use {value!r} in a tensor expression")


def const(value: float | int | bool, dtype: str) -> Const:
    return Const(value, dtype)


def _unify(a: object, b: object) -> tuple[Expr, Expr]:
    # A bare Python number takes the dtype of the expression it meets.
    if isinstance(a, Expr) and not isinstance(b, Expr):
        return a, as_expr(b, a.dtype)
    if isinstance(b, Expr) and not isinstance(a, Expr):
        return as_expr(a, b.dtype), b
    ea, eb = as_expr(a), as_expr(b)
    if ea.dtype != eb.dtype:
        raise TypeError(f"dtype mismatch in expression: {ea.dtype} vs {eb.dtype}")
    return ea, eb


def binary(op: str, a: object, b: object) -> Binary:
    ea, eb = _unify(a, b)
    return Binary(op, ea, eb, ea.dtype)


def compare(op: str, a: object, b: object) -> Compare:
    ea, eb = _unify(a, b)
    return Compare(op, ea, eb)


def maximum(a: object, b: object) -> Expr:
    return binary("max", a, b)


def minimum(a: object, b: object) -> Expr:
    return binary("min", a, b)


def logical_and(a: Expr, b: Expr) -> Expr:
    return Binary("and", a, b, "bool")


def logical_or(a: Expr, b: Expr) -> Expr:
    return Binary("or", a, b, "bool")


def eq(a: object, b: object) -> Expr:
    return compare("eq", a, b)


def ne(a: object, b: object) -> Expr:
    return compare("ne", a, b)


def if_then_else(cond: Expr, a: object, b: object) -> Expr:
    ea, eb = _unify(a, b)
    return Select(cond, ea, eb, ea.dtype)


def cast(value: object, dtype: str) -> Expr:
    use_dtype(dtype)
    e = as_expr(value)
    return e if e.dtype == dtype else Cast(e, dtype)


MATH_FUNCTIONS = frozenset({"exp", "log", "tanh", "sigmoid", "erf", "sqrt", "abs", "floor", "ceil",
                            "round"})


def math(name: str, x: object) -> MathCall:
    if name not in MATH_FUNCTIONS:
        raise ValueError(f"unknown math function {name!r}")
    e = as_expr(x, "float32")
    return MathCall(name, e, e.dtype)


def exp(x: object) -> Expr:
    return math("exp", x)


def log(x: object) -> Expr:
    return math("log", x)


def tanh(x: object) -> Expr:
    return math("tanh", x)


def sigmoid(x: object) -> Expr:
    return math("sigmoid", x)


def erf(x: object) -> Expr:
    return math("erf", x)


def sqrt(x: object) -> Expr:
    return math("sqrt", x)


def _dim(d: object) -> object:
    """A shape's dim as the IR keeps it: an int, or a symbolic dim (``sym.SymExpr``) as is."""
    return d if isinstance(d, SymExpr) else int(d)  # type: ignore[call-overload]


def reduce_axis(extent: int, name: str = "k") -> IndexVar:
    return IndexVar(name, _dim(extent), reduce=True)


def _reduce(combiner: str, body: object, axis: IndexVar | Sequence[IndexVar]) -> Reduce:
    axes = (axis,) if isinstance(axis, IndexVar) else tuple(axis)
    if not all(a.reduce for a in axes):
        raise ValueError("reductions must run over reduce_axis() variables")
    e = as_expr(body, "float32")
    return Reduce(combiner, e, axes, e.dtype)


def sum_of(body: object, axis: IndexVar | Sequence[IndexVar]) -> Reduce:
    return _reduce("sum", body, axis)


def max_of(body: object, axis: IndexVar | Sequence[IndexVar]) -> Reduce:
    return _reduce("max", body, axis)


def min_of(body: object, axis: IndexVar | Sequence[IndexVar]) -> Reduce:
    return _reduce("min", body, axis)


def placeholder(shape: Sequence[int], dtype: str = "float32", name: str = "x") -> Tensor:
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    return Tensor(name, tuple(_dim(s) for s in shape), dtype)


def compute(shape: Sequence[int], fcompute: Callable[..., object], name: str = "T",
            dtype: str | None = None) -> Tensor:
    """A stage whose element at ``(i0, i1, ...)`` is ``fcompute(i0, i1, ...)``."""
    shape = tuple(_dim(s) for s in shape)
    axes = tuple(IndexVar(f"i{d}", n) for d, n in enumerate(shape))
    body = as_expr(fcompute(*axes), dtype or "float32")
    if dtype is not None and body.dtype != dtype:
        body = cast(body, dtype)
    return Tensor(name, shape, body.dtype, axes, body)


# ---- traversal helpers used by the passes and the code generator -------------------------------

def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Binary, Compare)):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, (Cast,)):
        return (e.value,)
    if isinstance(e, MathCall):
        return (e.arg,)
    if isinstance(e, Reduce):
        return (e.body,)
    if isinstance(e, Read):
        return e.indices
    return ()


def walk(e: Expr, skip: Expr | None = None) -> Iterator[Expr]:
    """The nodes of ``e``, depth first, leaving out the subtree ``skip`` (by identity)."""
    stack = [e]
    while stack:
        node = stack.pop()
        if node is skip:
            continue
        yield node
        stack.extend(children(node))


def reads(e: Expr) -> list[Read]:
    """Every ``Read`` in ``e``, in evaluation order."""
    out: list[Read] = []
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Read):
            out.append(node)
        stack.extend(reversed(children(node)))
    return out


def rewrite(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` returns a replacement for a node, or None to keep it."""
    memo: dict[int, Expr] = {}

    def visit(node: Expr) -> Expr:
        key = id(node)
        if key in memo:
            return memo[key]
        if isinstance(node, (Binary, Compare)):
            new: Expr = type(node)(node.op, visit(node.a), visit(node.b), node.dtype)
        elif isinstance(node, Select):
            new = Select(visit(node.cond), visit(node.a), visit(node.b), node.dtype)
        elif isinstance(node, Cast):
            new = Cast(visit(node.value), node.dtype)
        elif isinstance(node, MathCall):
            new = MathCall(node.name, visit(node.arg), node.dtype)
        elif isinstance(node, Reduce):
            new = Reduce(node.combiner, visit(node.body), node.axes, node.dtype)
        elif isinstance(node, Read):
            new = Read(node.tensor, tuple(visit(i) for i in node.indices), node.dtype)
        else:
            new = node
        replaced = fn(new)
        result = new if replaced is None else replaced
        memo[key] = result
        return result

    return visit(e)


def substitute(e: Expr, mapping: dict[IndexVar, Expr]) -> Expr:
    """Replace index variables in ``e`` by expressions."""
    return rewrite(e, lambda n: mapping.get(n) if isinstance(n, IndexVar) else None)


def stages(outputs: Sequence[Tensor]) -> list[Tensor]:
    """All tensors reachable from ``outputs``, producers before consumers."""
    order: list[Tensor] = []
    seen: set[int] = set()

    def visit(t: Tensor) -> None:
        if t.uid in seen:
            return
        seen.add(t.uid)
        if t.body is not None:
            for r in reads(t.body):
                visit(r.tensor)
        order.append(t)

    for t in outputs:
        visit(t)
    return order


def replace_tensors(outputs: Sequence[Tensor], mapping: dict[int, Tensor]) -> list[Tensor]:
    """Rebuild the stages behind ``outputs`` with reads of tensors (keyed by ``uid``) redirected
    to other tensors of the same shape; used to splice primitive functions together."""
    rebuilt: dict[int, Tensor] = dict(mapping)

    def visit(t: Tensor) -> Tensor:
        if t.uid in rebuilt:
            return rebuilt[t.uid]
        if t.body is None:
            return t
        for r in reads(t.body):
            visit(r.tensor)
        body = rewrite(t.body, lambda n: Read(rebuilt[n.tensor.uid], n.indices, n.dtype)
                       if isinstance(n, Read) and n.tensor.uid in rebuilt else None)
        new = Tensor(t.name, t.shape, t.dtype, t.axes, body)
        rebuilt[t.uid] = new
        return new

    return [visit(t) for t in outputs]
