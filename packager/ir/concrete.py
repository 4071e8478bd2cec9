"""A symbolic-shape module seen at one concrete size: the values of its size variables, bound
from the inputs' shapes as ``main`` binds them at run time, and every dim, attribute and type
made concrete with them. The numpy reference of the IR (``golden.evaluate_ir``) uses it so
that a model exported with sizes known only at run time is still checked, at the check's
size, instead of not at all."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from .sym import SymExpr


class SizeMismatch(ValueError):
    """An input's shape does not fit the parameter's symbolic shape."""


def bind_sizes(params: Iterable[Any], feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Size variable -> value, from every parameter dim that is a bare variable (``n``); other
    symbolic dims are checked against the values once all are bound."""
    env: dict[str, int] = {}
    later = []
    for p in params:
        if p.name not in feeds:
            continue
        shape = tuple(p.type.shape)
        got = np.shape(feeds[p.name])
        if len(got) != len(shape):
            raise SizeMismatch(f"{p.name}: rank {len(got)}, expected {len(shape)}")
        for d, n in zip(shape, got):
            if isinstance(d, SymExpr):
                names = d.variables()
                if len(names) == 1 and str(d) == next(iter(names)):
                    name = next(iter(names))
                    if env.setdefault(name, int(n)) != int(n):
                        raise SizeMismatch(f"{p.name}: {name} is {n} here and {env[name]} "
                                           "elsewhere")
                    continue
                later.append((p.name, d, int(n)))
            elif int(d) != int(n):
                raise SizeMismatch(f"{p.name}: a dim is {n}, expected {d}")
    for name, d, n in later:
        if d.variables() <= env.keys() and d.evaluate(env) != n:
            raise SizeMismatch(f"{name}: {d} is {d.evaluate(env)}, the input has {n}")
    return env


def concrete(value: Any, env: Mapping[str, int]) -> Any:
    """``value`` with every ``SymExpr`` in it (inside tuples, lists and dicts) evaluated."""
    if not env:
        return value
    if isinstance(value, SymExpr):
        return value.evaluate(env)
    if isinstance(value, tuple):
        return tuple(concrete(v, env) for v in value)
    if isinstance(value, list):
        return [concrete(v, env) for v in value]
    if isinstance(value, dict):
        return {k: concrete(v, env) for k, v in value.items()}
    return value


def concrete_shape(shape: Iterable[Any], env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(d.evaluate(env) if isinstance(d, SymExpr) else int(d) for d in shape)
