"""Size variables bound from inputs' *values* (format 1.6, docs/format.md section 10.8).

A graph input whose values set shapes (a Reshape's target, a reduction's axes, a Slice's
starts, a Pad's pads fed at run time) stays an input; the symbolic record's ``values`` rows say
how its values bind size variables. ``bind_values`` applies them after the inputs' dims are
bound and before any shape is evaluated (``runtime/symbolic.py``); the C runtime's
``mlc_sym_values`` (runtime/c/src/values.c) is the same.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .dims import evaluate
from .errors import InputError


def bind_values(rows: Any, feeds: Mapping[str, np.ndarray], env: dict[str, int],
                where: dict[str, str] | None = None) -> None:
    """Bind the size variables of the symbolic record's ``values`` rows (format 1.6) from the
    fed arrays' values, into ``env`` (the variables the inputs' shapes bound are there already):
    ``dims`` binds each element as it is, ``reshape`` first gives ONNX Reshape's 0 (copy the
    data's dim, unless allowzero) and -1 (the count left) their meaning, ``expand`` gives 1 the
    data's dim where the data's is not 1 (broadcasting). Each must then be at least 1, as an
    input dim; an ``InputError`` names the input otherwise. The relations (a reshape keeps the
    element count) are checked afterwards with the others."""
    for name, rule, names, *args in rows:
        arr = np.asarray(feeds[name])
        if rule == "scales":
            _bind_scales(name, arr, names, [evaluate(d, env) for d in args[0]], env, where)
            continue
        if arr.dtype.kind not in "iu" or arr.size != len(names) and rule in ("dims", "reshape",
                                                                             "expand") \
                or arr.size > 64:
            raise InputError(f"input {name!r} holds {arr.size} {arr.dtype.name} values; the model "
                             f"reads it as {len(names) if rule != 'axes' else 'its'} integer "
                             f"{'sizes' if rule != 'axes' else 'axes'}")
        vals = [int(x) for x in arr.reshape(-1)]
        shown = vals[0] if arr.ndim == 0 else vals
        if rule == "reshape":
            src = [evaluate(d, env) for d in args[0]]
            allowzero = args[1]
            vals = [src[i] if v == 0 and not allowzero and i < len(src) else v
                    for i, v in enumerate(vals)]
            if vals.count(-1) == 1:
                known = 1
                for v in vals:
                    known *= v if v != -1 else 1
                total = 1
                for d in src:
                    total *= d
                if known <= 0 or total % known:
                    raise InputError(f"input {name!r} is {shown}: a shape that cannot hold the "
                                     f"{total} elements of the reshaped tensor")
                vals[vals.index(-1)] = total // known
        elif rule == "slice":
            vals = _slice_sizes(name, vals, [evaluate(d, env) for d in args[0]],
                                *(None if not n else _ints_of(feeds, n) for n in args[1:]))
        elif rule == "pad":
            vals = _pad_sizes(name, vals, [evaluate(d, env) for d in args[0]],
                              _ints_of(feeds, args[1]) if args[1] else None)
        elif rule == "axes":
            vals = _axes_sizes(name, shown, vals, [evaluate(d, env) for d in args[0]], args[1],
                               len(names))
        elif rule == "expand":
            src = [evaluate(d, env) for d in args[0]]
            lead = len(vals) - len(src)
            vals = [src[i - lead] if v == 1 and 0 <= i - lead and src[i - lead] != 1 else v
                    for i, v in enumerate(vals)]
        for i, (var, v) in enumerate(zip(names, vals)):
            if v < 1:
                raise InputError(f"input {name!r} is {shown}: the model reads it as sizes, "
                                 f"and {v} at index {i} is not a size (every size at least 1)")
            if v >= 1 << 40:
                raise InputError(f"input {name!r} is {shown}: a size of {v} is too large")
            env[var] = v
            if where is not None:
                where[var] = f"input {name!r} value {i}"


def _bind_scales(name: str, arr: np.ndarray, names: Any, src: list[int], env: dict[str, int],
                 where: dict[str, str] | None) -> None:
    """A ``scales`` row (format 1.7): each variable ``floor(scale * src)``, the product in
    float64 of the float scale fed (as the C runtime computes it)."""
    if arr.dtype.kind != "f" or arr.size != len(names):
        raise InputError(f"input {name!r} holds {arr.size} {arr.dtype.name} values; the model "
                         f"reads it as {len(names)} float scales")
    for i, (var, s, n) in enumerate(zip(names, arr.reshape(-1).tolist(), src)):
        size = float(s) * n
        if not size >= 1 or size >= float(1 << 40):
            raise InputError(f"input {name!r}: scale {s} at index {i} makes a size of {size} "
                             f"from {n} (every size at least 1)")
        env[var] = int(math.floor(size))
        if where is not None:
            where[var] = f"input {name!r} value {i}"


def _ints_of(feeds: Mapping[str, np.ndarray], name: str) -> list[int]:
    arr = np.asarray(feeds[name])
    if arr.dtype.kind not in "iu" or arr.size > 64:
        raise InputError(f"input {name!r} holds {arr.size} {arr.dtype.name} values; the model "
                         "reads it as integers")
    return [int(x) for x in arr.reshape(-1)]


def _slice_sizes(name: str, starts: list[int], src: list[int], ends: list[int],
                 axes: list[int] | None, steps: list[int] | None) -> list[int]:
    """A ``slice`` row's sizes (format 1.6): per axis of data of dims ``src``, the output size,
    the first index + 1, and the step as ``p, q`` with step ``= p - q`` (ONNX Slice's clamping
    of starts and ends)."""
    rank = len(src)
    k = len(starts)
    axes = list(range(k)) if axes is None else axes
    steps = [1] * k if steps is None else steps
    if len(ends) != k or len(axes) != k or len(steps) != k:
        raise InputError(f"input {name!r}: starts, ends, axes and steps must have the same length")
    out = [[d, 1, 2, 1] for d in src]   # untouched axes: all of it, from 0, step 1
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        if not -rank <= a < rank:
            raise InputError(f"input {name!r}: axis {a} is out of range for rank {rank}")
        a %= rank
        if a in seen:
            raise InputError(f"input {name!r}: an axis repeats")
        seen.add(a)
        if st == 0:
            raise InputError(f"input {name!r}: a step of 0")
        d = src[a]
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            n = max(0, (e - s + st - 1) // st)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
            n = max(0, (s - e - st - 1) // -st)
        if n < 1:
            raise InputError(f"input {name!r}: the slice of axis {a} is empty; the model takes "
                             "every size at least 1")
        out[a] = [n, s + 1, max(st, 0) + 1, max(-st, 0) + 1]
    return [v for row in out for v in row]


def _pad_sizes(name: str, pads: list[int], src: list[int], axes: list[int] | None
               ) -> list[int]:
    """A ``pad`` row's sizes (format 1.6): per axis of data of dims ``src``, the output size
    and the leading pad as ``p, q`` (lead ``= p - q``; negative pads crop)."""
    rank = len(src)
    axes = list(range(rank)) if axes is None else axes
    k = len(axes)
    if len(pads) != 2 * k:
        raise InputError(f"input {name!r} holds {len(pads)} pads for {k} axes")
    out = [[d, 1, 1] for d in src]
    seen = set()
    for j, a in enumerate(axes):
        if not -rank <= a < rank:
            raise InputError(f"input {name!r}: axis {a} is out of range for rank {rank}")
        a %= rank
        if a in seen:
            raise InputError(f"input {name!r}: an axis repeats")
        seen.add(a)
        lead, trail = pads[j], pads[j + k]
        n = src[a] + lead + trail
        if n < 1:
            raise InputError(f"input {name!r}: pads {lead}, {trail} leave axis {a} of size "
                             f"{src[a]} empty; the model takes every size at least 1")
        out[a] = [n, max(lead, 0) + 1, max(-lead, 0) + 1]
    return [v for row in out for v in row]


AXES_REDUCE_KEEP, AXES_REDUCE_DROP, AXES_UNSQUEEZE, AXES_SQUEEZE, AXES_ONE = range(5)


def _axes_sizes(name: str, shown: Any, axes: list[int], src: list[int], mode: int,
                count: int) -> list[int]:
    """The sizes an ``axes`` row binds (format 1.6) from axes values (ONNX: ``-rank <= a <
    rank``, distinct) over data of dims ``src``: a reduction's output dims with the reduced ones
    1 (``AXES_REDUCE_KEEP``), those and then the kept ones (``AXES_REDUCE_DROP``), an
    Unsqueeze's output dims, a Squeeze's, or one axis as ``axis + 1`` (``AXES_ONE``)."""
    rank = len(src) + len(axes) if mode == AXES_UNSQUEEZE else len(src)
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise InputError(f"input {name!r} is {shown}: axis {a} is out of range for rank "
                             f"{rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise InputError(f"input {name!r} is {shown}: an axis repeats")
    if mode == AXES_ONE:
        vals = [out[0] + 1]
    elif mode == AXES_UNSQUEEZE:
        rest = iter(src)
        vals = [1 if i in out else next(rest) for i in range(rank)]
    elif mode == AXES_SQUEEZE:
        wrong = [a for a in out if src[a] != 1]
        if wrong:
            raise InputError(f"input {name!r} is {shown}: axis {wrong[0]} has size "
                             f"{src[wrong[0]]}, not 1, so it cannot be squeezed")
        vals = [d for i, d in enumerate(src) if i not in out]
    else:
        vals = [1 if i in out else d for i, d in enumerate(src)]
        if mode == AXES_REDUCE_DROP:
            vals += [d for i, d in enumerate(src) if i not in out]
    if len(vals) != count:
        raise InputError(f"input {name!r} is {shown}: {len(axes)} axes; the model takes "
                         "another count")
    return vals
