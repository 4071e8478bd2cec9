"""Dim records (docs/format.md §10.1) evaluated for the size variables' values: the one piece
of the symbolic plans that the value-binding rules (values.py) also need, kept apart so the two
modules do not import each other."""

from __future__ import annotations

from typing import Any, Mapping

from .errors import BundleError


def evaluate(rec: Any, env: Mapping[str, int]) -> int:
    """The value of a dim record for the size variables' values ``env``."""
    if isinstance(rec, int) and not isinstance(rec, bool):
        return rec
    if isinstance(rec, str):
        return env[rec]
    if isinstance(rec, (tuple, list)) and rec:
        op = rec[0]
        if op == "+":
            return sum(evaluate(r, env) for r in rec[1:])
        if op == "*":
            out = 1
            for r in rec[1:]:
                out *= evaluate(r, env)
            return out
        if op in ("//", "%") and len(rec) == 3 and isinstance(rec[2], int) and rec[2] > 0:
            v = evaluate(rec[1], env)
            return v // rec[2] if op == "//" else v % rec[2]
    raise BundleError(f"bundle header: malformed dim record {rec!r}")
