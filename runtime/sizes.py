"""The image size a bundle with open height and width takes nearest to an image's own.

A symbolic bundle records the relations its sizes must satisfy (``H must be a multiple of 32``,
``W must be at least 5``) and, with ``--max-shape``, their bounds. ``infer`` feeds an image at
its own size where the input's height or width is a size variable; when that size breaks a
relation, ``image_size_fitter`` gives the nearest size that keeps every relation (the image is
then resized to it, with a note), or says in one line that none is near.
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import InputError
from .symbolic import evaluate

# How far from the image's own size (in pixels, each way) a valid size is looked for.
SEARCH = 256

Fit = Callable[[int, int], tuple[int, int, str]]


def _record(rec: Any) -> Any:
    """A dim record as ``symbolic.evaluate`` reads it (the typed header keeps tuples)."""
    return [_record(r) for r in rec] if isinstance(rec, (list, tuple)) else rec


def _names(rec: Any) -> set[str]:
    """The size variables a dim record mentions."""
    if isinstance(rec, str):
        return {rec}
    if isinstance(rec, (list, tuple)) and rec:
        return set().union(*(_names(r) for r in rec[1:]))
    return set()


def _ok(checks: list, env: dict[str, int]) -> str | None:
    """The texts of the relations ``env`` breaks ("; " between), or None when it keeps all."""
    broken = []
    for op, a, b, text in checks:
        av, bv = evaluate(a, env), evaluate(b, env)
        if not (av == bv if op == "eq" else av <= bv):
            broken.append(str(text))
    return "; ".join(dict.fromkeys(broken)) if broken else None


def _nearest(var: str, start: int, env: dict[str, int], checks: list, top: int | None
             ) -> int | None:
    """The value of ``var`` nearest ``start`` (a tie: the larger) keeping ``checks``."""
    for step in range(SEARCH + 1):
        for value in (start + step, start - step) if step else (start,):
            if value < 1 or (top is not None and value > top):
                continue
            if _ok(checks, {**env, var: value}) is None:
                return value
    return None


def image_size_fitter(model: Any, spec: Any, layout: str) -> Fit | None:
    """For an image input whose height or width is a size variable: a function from the image's
    (H, W) to the (H, W) to prepare it at and why it changed (empty when it did not); None
    when the bundle has no size variables there (nothing to fit)."""
    sym = getattr(getattr(model, "schema", None), "symbolic", None)
    shape = tuple(spec.shape)
    if sym is None or len(shape) != 4 or layout not in ("NCHW", "NHWC"):
        return None
    axes = (2, 3) if layout == "NCHW" else (1, 2)
    names = [shape[a] if isinstance(shape[a], str) else None for a in axes]
    if names == [None, None]:
        return None
    # the input's other size variables (its batch) at 1: one image
    fixed = {d: 1 for a, d in enumerate(shape) if isinstance(d, str) and a not in axes}
    known = set(fixed) | {n for n in names if n}
    checks = [(op, _record(a), _record(b), text) for op, a, b, text in (sym.checks or ())
              if (_names(a) | _names(b)) <= known]
    bound = dict(sym.bound.sizes) if sym.bound is not None else {}

    def fit(h: int, w: int) -> tuple[int, int, str]:
        env = dict(fixed)
        for n, v in zip(names, (h, w)):
            if n:
                env[n] = v
        broken = _ok(checks, env) or next((f"{n} must be at most {bound[n]} (the bundle's "
                                           "--max-shape)" for n in names
                                           if n in bound and env[n] > bound[n]), None)
        if broken is None:
            return h, w, ""
        for n in names:
            if n:
                own = [c for c in checks if n in _names(c[1]) | _names(c[2])
                       and not (set(names) - {n, None}) & (_names(c[1]) | _names(c[2]))]
                value = _nearest(n, env[n], env, own, bound.get(n))
                if value is None:
                    break
                env[n] = value
        else:
            if _ok(checks, env) is None:
                size = [env[n] if n else v for n, v in zip(names, (h, w))]
                return size[0], size[1], broken
        raise InputError(f"no size within {SEARCH} pixels of {w}x{h} (WxH) fits the model "
                         f"({broken}); resize the image to a size it takes, or pass a .npy")

    return fit


def smallest_shapes(model: Any) -> dict[str, tuple[int, ...]] | None:
    """Each input's shape at the smallest sizes a symbolic bundle's relations allow (every size
    variable from 1 up, within ``SEARCH``), or None when there is none to find that way."""
    sym = getattr(getattr(model, "schema", None), "symbolic", None)
    if sym is None:
        return None
    checks = [(op, _record(a), _record(b), text) for op, a, b, text in (sym.checks or ())]
    bound = dict(sym.bound.sizes) if sym.bound is not None else {}
    env = {v: 1 for v in sym.vars}
    for v in sym.vars:
        own = [c for c in checks if _names(c[1]) | _names(c[2]) == {v}]
        value = _nearest(v, 1, env, own, bound.get(v))
        if value is None:
            return None
        env[v] = value
    if _ok(checks, env) is not None:
        return None
    return {s.name: tuple(evaluate(_record(d), env) for d in s.shape) for s in model.inputs}
