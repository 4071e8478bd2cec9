"""Symbolic dims: a dim of a shape is an ``int`` or a ``SymExpr`` over size variables.

As in the course's newer chapter (``R.Tensor((n, 784), "float32")``), a model whose batch or
sequence length is not fixed keeps those dims as variables; shape inference does arithmetic on
them, kernels read their values at run time, and ``main`` binds them from its inputs' shapes.

A ``SymExpr`` is a canonical polynomial with integer coefficients over *atoms*: a size variable
(``"n"``) or a floor division / remainder of a polynomial by a positive constant that does not
divide it exactly. Anything that folds to a constant is returned as a plain ``int``, so a static
shape never holds a ``SymExpr`` and static code paths see exactly what they saw before.

Size variables are at least 1 (a zero dim is refused at run time), which is what lets a few
comparisons be decided (``n >= 1``, ``n * 4 > 3``); an undecidable one raises
``SymbolicShapeError`` (a ``ValueError``, so converters report it as a refusal).
"""

from __future__ import annotations

import ast
import functools
from typing import Any, Iterable, Mapping, Union

Dim = Union[int, "SymExpr"]


class SymbolicShapeError(ValueError):
    """A computation needs the value of a symbolic dim (fix it with --input-shape)."""


# An atom is a variable name (str) or ("//" | "%", SymExpr, positive int).
Atom = Union[str, tuple]
Monomial = tuple  # sorted tuple of atoms (with repetition); () is the constant term


def _atom_key(a: Atom) -> tuple:
    return (0, a) if isinstance(a, str) else (1, a[0], a[1]._key(), a[2])


class SymExpr:
    """An immutable polynomial ``{monomial: coefficient}``; see the module docstring."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, int]) -> None:
        self.terms = {m: c for m, c in terms.items() if c}
        self._hash = hash(self._key())

    # ---- construction -------------------------------------------------------------------------

    @staticmethod
    def var(name: str) -> SymExpr:
        return SymExpr({(name,): 1})

    @staticmethod
    def lift(x: Any) -> SymExpr:
        if isinstance(x, SymExpr):
            return x
        if isinstance(x, bool) or not isinstance(x, int):
            try:
                x = int(x)  # numpy integers
            except (TypeError, ValueError):
                raise TypeError(f"cannot use {x!r} in a shape expression") from None
        return SymExpr({(): x})

    def _key(self) -> tuple:
        return tuple(sorted(((tuple(_atom_key(a) for a in m), c) for m, c in self.terms.items())))

    def _norm(self) -> Dim:
        if not self.terms:
            return 0
        if list(self.terms) == [()]:
            return self.terms[()]
        return self

    # ---- arithmetic ---------------------------------------------------------------------------

    def __add__(self, other: Any) -> Dim:
        o = SymExpr.lift(other)
        terms = dict(self.terms)
        for m, c in o.terms.items():
            terms[m] = terms.get(m, 0) + c
        return SymExpr(terms)._norm()

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return SymExpr({m: -c for m, c in self.terms.items()})._norm()

    def __sub__(self, other: Any) -> Dim:
        return self + (-SymExpr.lift(other))

    def __rsub__(self, other: Any) -> Dim:
        return SymExpr.lift(other) + (-self)

    def __mul__(self, other: Any) -> Dim:
        o = SymExpr.lift(other)
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in o.terms.items():
                m = tuple(sorted(m1 + m2, key=_atom_key))
                terms[m] = terms.get(m, 0) + c1 * c2
        return SymExpr(terms)._norm()

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Dim:
        if isinstance(other, SymExpr):
            q = self._exact_quotient(other)
            if q is None:
                raise SymbolicShapeError(f"cannot divide {self} by {other}")
            return q
        c = int(other)
        if c <= 0:
            raise SymbolicShapeError(f"cannot divide {self} by {c}")
        if c == 1:
            return self
        # Canonical form: (c*q + r) // c == q + r // c with every coefficient of r in [0, c),
        # so (h - 1) // 2 + 1 and (h + 1) // 2 are the same expression; and
        # (e // p + k) // c == (e + k*p) // (p*c) (a stride-2 conv after a stride-2 conv).
        q_terms: dict[Monomial, int] = {}
        r_terms: dict[Monomial, int] = {}
        for m, v in self.terms.items():
            qv, rv = divmod(v, c)
            if qv:
                q_terms[m] = qv
            if rv:
                r_terms[m] = rv
        q = SymExpr(q_terms)._norm()
        r = SymExpr(r_terms)
        if not r.terms or list(r.terms) == [()]:
            return q
        atoms = [m for m in r.terms if m]
        if len(atoms) == 1 and len(atoms[0]) == 1 and not isinstance(atoms[0][0], str) \
                and atoms[0][0][0] == "//" and r.terms[atoms[0]] == 1:
            _, inner, p = atoms[0][0]
            return q + (inner + r.terms.get((), 0) * p) // (p * c)
        return q + SymExpr({(("//", r, c),): 1})

    def __rfloordiv__(self, other: Any) -> Dim:
        q = SymExpr.lift(other)._exact_quotient(self)
        if q is None:
            raise SymbolicShapeError(f"cannot divide {other} by {self}")
        return q

    def __mod__(self, other: Any) -> Dim:
        if isinstance(other, SymExpr):
            if self._exact_quotient(other) is not None:
                return 0
            raise SymbolicShapeError(f"cannot take {self} modulo {other}")
        c = int(other)
        if c <= 0:
            raise SymbolicShapeError(f"cannot take {self} modulo {c}")
        return self - (self // c) * c    # one canonical form: no remainder atoms

    def _exact_quotient(self, d: SymExpr) -> Dim | None:
        """self / d when d is one monomial (times a constant) dividing every term exactly."""
        if len(d.terms) != 1:
            return self._norm() if self == d else None
        (dm, dc), = d.terms.items()
        out: dict[Monomial, int] = {}
        for m, c in self.terms.items():
            rest = list(m)
            for a in dm:
                if a not in rest:
                    return None
                rest.remove(a)
            if c % dc:
                return None
            out[tuple(rest)] = c // dc
        return SymExpr(out)._norm()

    # ---- comparisons (size variables are >= 1) ------------------------------------------------

    def lower_bound(self) -> int | None:
        """A lower bound of the value for every assignment of variables >= 1, or None."""
        total = 0
        for m, c in self.terms.items():
            if c < 0 and m:
                return None
            low = c
            for a in m:   # a variable is >= 1; (r // k) >= lower_bound(r) // k (r >= 0)
                low *= 1 if isinstance(a, str) else max(0, (a[1].lower_bound() or 0) // a[2])
            total += low
        return total

    def _decide(self, op: str, other: Any) -> bool:
        diff = self - other
        if isinstance(diff, int):
            return {"lt": diff < 0, "le": diff <= 0, "gt": diff > 0, "ge": diff >= 0}[op]
        lb = diff.lower_bound()
        if lb is not None:
            if op == "gt" and lb > 0 or op == "ge" and lb >= 0:
                return True
            if op == "lt" and lb >= 0 or op == "le" and lb > 0:
                return False
        raise SymbolicShapeError(f"cannot tell whether {self} {_CMP[op]} {other}: the shape "
                                 f"depends on a size known only at run time")

    def __lt__(self, other: Any) -> bool:
        return self._decide("lt", other)

    def __le__(self, other: Any) -> bool:
        return self._decide("le", other)

    def __gt__(self, other: Any) -> bool:
        return self._decide("gt", other)

    def __ge__(self, other: Any) -> bool:
        return self._decide("ge", other)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymExpr):
            return self._key() == other._key()
        return False   # an int: a SymExpr never folds to a constant

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        return True

    def __int__(self) -> int:
        raise SymbolicShapeError(f"the size {self} is known only at run time")

    __index__ = __int__

    # ---- inspection ---------------------------------------------------------------------------

    def variables(self) -> set[str]:
        out: set[str] = set()
        for m in self.terms:
            for a in m:
                if isinstance(a, str):
                    out.add(a)
                else:
                    out |= a[1].variables()
        return out

    def evaluate(self, env: Mapping[str, int]) -> int:
        return evaluate(to_record(self), env)

    def __str__(self) -> str:
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda t: (-len(t[0]), t[0] == ())):
            factors = [_atom_text(a) for a in m]
            if abs(c) != 1 or not factors:
                factors.append(str(abs(c)) if parts or c > 0 else str(c))
            elif c == -1 and not parts:
                factors[0] = "-" + factors[0]
            text = " * ".join(factors)
            if parts:
                parts.append(("- " if c < 0 else "+ ") + text)
            else:
                parts.append(text if c > 0 or c == -1 and m else text)
        return " ".join(parts)

    __repr__ = __str__


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _atom_text(a: Atom) -> str:
    if isinstance(a, str):
        return a
    inner = str(a[1])
    if " " in inner:
        inner = f"({inner})"
    return f"{inner} {a[0]} {a[2]}"


# ---- helpers over dims and shapes ----------------------------------------------------------------

def size_var(name: str) -> SymExpr:
    return SymExpr.var(name)


def is_static_dim(d: Any) -> bool:
    return not isinstance(d, SymExpr)


def is_static(shape: Iterable[Any]) -> bool:
    return not any(isinstance(d, SymExpr) for d in shape)


def product(dims: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


def shape_vars(shape: Iterable[Any]) -> set[str]:
    out: set[str] = set()
    for d in shape:
        if isinstance(d, SymExpr):
            out |= d.variables()
    return out


def dim_text(d: Dim) -> str:
    return str(d)


# ---- records: how a bundle stores a dim (the runtime evaluates them, runtime/symbolic.py) -------

def to_record(d: Dim) -> Any:
    """An int, a variable name, or ``["+", t...]`` / ``["*", f...]`` / ``["//" | "%", e, c]``."""
    if isinstance(d, int):
        return d
    terms = []
    for m, c in sorted(d.terms.items(), key=lambda t: str(t)):
        factors = [a if isinstance(a, str) else [a[0], to_record(a[1]), a[2]] for a in m]
        if c != 1 or not factors:
            factors.insert(0, c)
        terms.append(factors[0] if len(factors) == 1 else ["*", *factors])
    return terms[0] if len(terms) == 1 else ["+", *terms]


def evaluate(rec: Any, env: Mapping[str, int]) -> int:
    """The value of a dim record for variable values ``env`` (ints, or numpy arrays of them to
    evaluate a grid at once; the runtime has its own copy)."""
    if isinstance(rec, int):
        return rec
    if isinstance(rec, str):
        return env[rec]
    op = rec[0]
    if op == "+":
        return sum(evaluate(r, env) for r in rec[1:])
    if op == "*":
        out = 1
        for r in rec[1:]:
            out = out * evaluate(r, env)  # not *=: a grid of arrays broadcasts
        return out
    if op == "//":
        return evaluate(rec[1], env) // rec[2]
    if op == "%":
        return evaluate(rec[1], env) % rec[2]
    raise ValueError(f"malformed dim record {rec!r}")


def substitute(d: Dim, mapping: Mapping[str, Dim]) -> Dim:
    """``d`` with each variable named in ``mapping`` replaced by its dim (the others kept)."""
    if isinstance(d, int):
        return d
    out: Dim = 0
    for m, c in d.terms.items():
        term: Dim = c
        for a in m:
            if isinstance(a, str):
                term = term * mapping.get(a, SymExpr.var(a))
            elif a[0] == "//":
                term = term * (substitute(a[1], mapping) // a[2])
            else:
                term = term * (substitute(a[1], mapping) % a[2])
        out = out + term
    return out


def nondecreasing_in(d: Dim, names: Iterable[str]) -> bool:
    """Whether ``d`` never decreases as any variable of ``names`` grows (from 0, the others at
    least 1): every term holding one has a positive coefficient, and a floor division holding
    one divides such a sum; a remainder holding one is refused. A memory plan that allocates
    a data-dependent size at its upper bound relies on it."""
    if isinstance(d, int):
        return True
    names = set(names)
    for m, c in d.terms.items():
        held = False
        for a in m:
            if isinstance(a, str):
                held = held or a in names
            elif names & a[1].variables():
                if a[0] == "%" or not nondecreasing_in(a[1], names):
                    return False
                held = True
        if held and c < 0:
            return False
    return True


def dim(d: Any) -> Dim:
    """``d`` as a shape keeps it: a ``SymExpr`` as is, anything else as an ``int``."""
    return d if isinstance(d, SymExpr) else int(d)


# ---- relations checked at run time -----------------------------------------------------------------
#
# Some shapes hold for some sizes only: a U-Net adds a skip connection of (h + 15) // 16 rows to
# an upsampled 2 * ((h + 31) // 32), equal only when h is a multiple of 32. Shape inference then
# assumes the relation (and goes on with one of the two dims) instead of refusing: it returns
# the relations beside the type (``ops.registry.OpDef.infer_type``), the builder keeps them in
# the module (``IRModule.relations``), the bundle records them, and the runtime checks them when
# it binds the size variables: ``input 'x': h must be a multiple of 32, got 322``.

Relation = tuple  # (op "eq" | "le", a: Dim, b: Dim, where: str)


def assume(relations: list, op: str, a: Dim, b: Dim, where: str = "") -> None:
    """Add to ``relations`` (the caller's list: one inference's, or a module's) that ``a == b``
    (op "eq") or ``a <= b`` (op "le") must hold at run time; once."""
    rel = (op, a, b, where)
    if rel not in relations:
        relations.append(rel)


_TRIED = 1024   # relation_text describes a one-variable relation by its values on 1.._TRIED


def _table(v: str, group: Iterable[tuple]) -> Any:
    """A bool array: whether every relation of ``group`` holds at ``v`` = 1.._TRIED (numpy
    evaluates each record once over all the values; a detector has dozens of relations over the
    same variable, and each of them is described against all the others)."""
    rows = sorted({(o, repr(to_record(p)), repr(to_record(q))) for o, p, q in group})
    return _table_of(v, tuple(rows))


@functools.lru_cache(maxsize=256)
def _table_of(v: str, rows: tuple[tuple[str, str, str], ...]) -> Any:
    """``_table`` for (op, repr of a's record, repr of b's record) rows, memoized (a pure
    function of its arguments); the array is read-only."""
    import numpy as np

    xs = np.arange(1, _TRIED + 1, dtype=np.int64)
    ok = np.ones(_TRIED, bool)
    for o, p, q in rows:
        pv = evaluate(ast.literal_eval(p), {v: xs})
        qv = evaluate(ast.literal_eval(q), {v: xs})
        ok &= (pv == qv) if o == "eq" else (pv <= qv)
    ok.setflags(write=False)
    return ok


def relation_text(op: str, a: Dim, b: Dim, together: Iterable[tuple] = ()) -> str:
    """What a user reads when the relation fails: ``w must be a multiple of 4`` when the relation
    is over one variable and holds exactly for the multiples of something (or a bound, or a
    range), else the relation itself. ``together``: every relation of the model, as
    (op, a, b, ...); the ones over the same single variable are described as one (a U-Net's skip
    connections together need a multiple of 32)."""
    import numpy as np

    names = sorted(shape_vars([a, b]))
    if len(names) == 1:
        v = names[0]
        group = [(op, a, b)] + [(r[0], r[1], r[2]) for r in together
                                if sorted(shape_vars([r[1], r[2]])) == names]
        table = _table(v, group)
        xs = np.arange(1, _TRIED + 1, dtype=np.int64)
        ok = xs[table]
        if 0 < len(ok) < _TRIED:
            first, last = int(ok[0]), int(ok[-1])
            for m in range(2, 513):
                r = first % m
                if np.array_equal(xs % m == r, table):
                    return f"{v} must be a multiple of {m}" if r == 0 else \
                        f"{v} must be {r} more than a multiple of {m}"
            for m in range(2, 513):   # periodic: a multiple of m, or up to k less
                if np.array_equal(table[m:], table[:-m]):
                    residues = sorted({int(x) % m for x in ok[ok <= m]})
                    k = len(residues) - 1
                    if 0 < k < m - 1 and residues == [0, *range(m - k, m)]:
                        return f"{v} must be a multiple of {m} or at most {k} less"
                    break
            if len(ok) == last - first + 1:   # one run of values
                if first == 1:
                    return f"{v} must be at most {last}"
                if last == _TRIED:
                    return f"{v} must be at least {first}"
                if first == last:
                    return f"{v} must be {first}"
                return f"{v} must be between {first} and {last}"
    return f"{a} {'==' if op == 'eq' else '<='} {b} must hold"
