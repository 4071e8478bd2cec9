"""The inputs the golden check feeds (``packager/golden.py``): seeded random data, the sizes
every size variable takes, the values of inputs read as sizes, and the values of inputs that
steer the model.

A model may decide with an input's value which of an ``If``'s branches runs, and a branch may
run only at some sizes (silero VAD: ``sr == 16000`` picks the 16 kHz network, whose reflect pad
needs more than 64 samples and whose Squeeze needs one frame). Zeros and the check's smallest
sizes would take a branch the model refuses (ONNX Runtime cannot run it, and a user's default
export would go unchecked), so:

- an integer input compared with a constant, where the comparison decides an ``If``, a
  ``Where`` or a branch's check, takes a value that comparison accepts (``steering_values``:
  the constant itself for ``Equal``; the first such comparison in the graph wins);
- the sizes meet, besides the relations the module assumes, the checks of the branches those
  values and sizes take (``taken_branch_relations``), found by evaluating the conditions' small
  integer arithmetic with the op references, a few rounds until the sizes settle.

The check's summary names the values it chose that way (``ChosenInputs.note``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .errors import ExportError
from .ir.graph import Call, Constant, Function, IRModule, Var
from .ir.sym import evaluate as sym_evaluate, shape_vars, to_record

# ---- inputs ---------------------------------------------------------------------------------------

def random_inputs(specs: list[tuple[str, tuple[int, ...], str]], seed: int,
                  ranges: Mapping[str, tuple[float, float]] | None = None
                  ) -> dict[str, np.ndarray]:
    """Seeded inputs: standard normal floats (uniform over ``ranges[name]`` where given: the
    range a quantized model's input quantization represents), random bools, zeros for integers
    (integer inputs are usually indices, and 0 is the one index every axis has; give real ones
    with --check-input)."""
    rng = np.random.default_rng(seed)
    ranges = ranges or {}
    out = {}
    for name, shape, dtype in specs:
        dt = np.dtype(dtype)
        if dt.kind == "f" and name in ranges:
            out[name] = rng.uniform(*ranges[name], shape).astype(dt)
        elif dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            # an array even of shape () (a comparison gives a numpy scalar)
            out[name] = np.asarray(rng.random(shape) < 0.5)
        else:
            out[name] = np.zeros(shape, dt)
    return out


def given_inputs(specs: list[tuple[str, tuple[int, ...], str]],
                 given: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [s[0] for s in specs]
    unknown = sorted(set(given) - set(names))
    missing = [n for n in names if n not in given]
    if unknown or missing:
        raise ExportError(f"--check-input must give every input of the model ({names}); "
                          + (f"unknown: {unknown}" if unknown else f"missing: {missing}"))
    out = {}
    for name, shape, dtype in specs:
        value = np.asarray(given[name])
        dt = np.dtype(dtype)
        if value.dtype != dt:
            if value.dtype.kind != dt.kind or value.dtype.kind not in "fiu":
                raise ExportError(f"--check-input {name}: dtype {value.dtype}, the model takes "
                                  f"{dtype}")
            value = value.astype(dt)
        # a symbolic dim takes the given size; the first (batch) dim any size, as before
        if value.ndim != len(shape) or any(isinstance(d, (int, np.integer)) and int(d) != n
                                           for d, n in zip(shape[1:], value.shape[1:])):
            raise ExportError(f"--check-input {name}: shape {value.shape}, the model takes "
                              f"{tuple(shape)}")
        out[name] = np.asarray(value, order="C")  # ascontiguousarray makes a scalar (1,)
    return out


CHECK_SIZE = 2   # the value every size variable takes in the check of a symbolic model


def check_size(relations: list, names: set[str] | None = None) -> dict[str, int]:
    """The value each size variable takes in the check: ``CHECK_SIZE``, doubled (up to nine
    times) for the variables of the relations the model needs that it does not meet yet (a
    multiple of 32...; those of one variable first), so that a detector's H and W grow and its
    batch stays small."""
    names = set(names or ()) | shape_vars([d for r in relations for d in r[1:3]])
    # a variable the model holds at one size (``batch_size == 1``: a state input exported at
    # batch 1) takes that size, and is never doubled
    pinned = {str(a): int(b) for op, *pair in relations if op == "eq"
              for a, b in (pair[:2], pair[1::-1])
              if isinstance(b, (int, np.integer)) and not isinstance(b, bool)
              and len(shape_vars([a])) == 1 and str(a) in shape_vars([a])}
    env = {v: CHECK_SIZE for v in names} | pinned

    def holds(op, a, b) -> bool:
        a, b = sym_evaluate(to_record(a), env), sym_evaluate(to_record(b), env)
        return a == b if op == "eq" else a <= b

    for _ in range(10):
        failing = [r for r in relations if not holds(*r[:3])]
        if not failing:
            return env
        grow = [shape_vars(r[1:3]) - pinned.keys() for r in failing]
        # a relation of one variable names the one to grow (a reflect pad's length), before
        # a relation of several does (``batch * T == batch``: T's, not the batch's)
        single = [g for g in grow if len(g) == 1]
        for v in set().union(*(single or grow)):
            env[v] *= 2
    # no size up to 2**10 meets them all: every variable at the same size, as before
    for size in [CHECK_SIZE << k for k in range(10)]:
        env = {v: size for v in names} | pinned
        if all(holds(*r[:3]) for r in relations):
            return env
    return {v: CHECK_SIZE for v in names} | pinned


def check_values(rows: Any, sizes: Mapping[str, int]) -> dict[str, list[int]]:
    """What the check feeds the inputs read as sizes (``IRModule.value_vars`` rows), by input:
    values any data takes. A Reshape's target ``[1, ..., 1, -1]``, an Expand's ``[1, ...]``,
    plain sizes the check's size; axes ``0, 1, ...``; a Slice the whole of each axis; a Pad
    none (with its axes ``0, 1, ...``)."""
    out: dict[str, list[int]] = {}
    for row in rows:
        name, rule, names = row[0], row[1], row[2]
        k = len(names)
        if rule == "reshape":
            out[name] = [1] * (k - 1) + [-1]
        elif rule == "expand":
            out[name] = [1] * k
        elif rule == "dims":
            out[name] = [sizes.get(v, CHECK_SIZE) for v in names]
        elif rule == "scales":   # float scales fed at run time: the input's own sizes
            out[name] = [1.0] * k
        elif rule == "axes":
            ones = [i for i, d in enumerate(row[3]) if isinstance(d, int) and d == 1]
            out[name] = ones if row[4] == 3 else list(range(64))   # Squeeze: axes of size 1
        elif rule in ("slice", "pad"):
            out[name] = [0] * 64
            for extra, fill in zip(row[4:], ("end", "axes", "one") if rule == "slice"
                                   else ("axes",)):
                if extra:
                    out[extra] = {"end": [1 << 62] * 64, "axes": list(range(64)),
                                  "one": [1] * 64}[fill]
    return out


def sizes_unmet(mod: IRModule, inputs: Mapping[str, np.ndarray],
                 params: Mapping[str, np.ndarray] | None) -> str:
    """Why the check cannot run, when inputs read as sizes (``value_vars``) take check values
    that a relation the model needs refuses (Split's sizes must add up to a dim the check
    cannot guess); "" when they fit (or there are none)."""
    if not getattr(mod, "value_vars", None):
        return ""
    from ..runtime.errors import InputError
    from ..runtime.values import bind_values
    from .ir.concrete import SizeMismatch, bind_sizes
    from .vm_emit import value_rows

    feeds = {**(params or {}), **inputs}
    try:
        env = bind_sizes(mod.main.params, feeds)
        bind_values(value_rows(mod), feeds, env)
    except (InputError, SizeMismatch, KeyError) as exc:
        return f"the check's values for inputs read as sizes do not fit the model ({exc})"
    for op, a, b, *_ in getattr(mod, "relations", []):
        av, bv = sym_evaluate(to_record(a), env), sym_evaluate(to_record(b), env)
        if not (av == bv if op == "eq" else av <= bv):
            return (f"the check's values for inputs read as sizes do not meet a relation the "
                    f"model needs ({a} {'==' if op == 'eq' else '<='} {b}): give real ones "
                    "with --check-input")
    return ""


def check_shape(shape: tuple, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The concrete shape the check feeds: symbolic dims at the check's sizes (the bundle is
    checked at those sizes; tests cover the others)."""
    env = {v: sizes.get(v, CHECK_SIZE) for v in shape_vars(shape)}
    return tuple(d if isinstance(d, int) else d.evaluate(env) for d in shape)




# ---- inputs that steer the model ----------------------------------------------------------------

# comparison -> the value an input on its left takes for it to hold against the constant c
_HOLDS: dict[str, Callable[[int], int]] = {
    "equal": lambda c: c,
    "greater": lambda c: c + 1,
    "greater_equal": lambda c: c,
    "less": lambda c: c - 1,
    "less_equal": lambda c: c,
}
# the same comparison with its operands swapped (the input on the right)
_MIRRORED = {"equal": "equal", "greater": "less", "greater_equal": "less_equal",
             "less": "greater", "less_equal": "greater_equal"}
# ops whose result decides something through their first argument
_DECIDING = frozenset({"if", "where", "check"})
# ops that carry a comparison's result (or an input's value) to a decision unchanged in meaning
_CARRYING = frozenset({"reshape", "cast", "logical_not", "logical_and", "logical_or",
                       "logical_xor", "broadcast_to"})
# the largest tensor whose value the conditions' evaluation computes (shape arithmetic is small)
_SMALL = 4096


def steering_values(mod: IRModule) -> dict[str, int]:
    """Per integer input of ``main`` holding one value, compared with a constant whose comparison decides an
    ``If``, a ``Where`` or a branch's check (through reshapes, casts and logical ops, in
    ``main`` or the branches it captures the input into): a value that comparison accepts. The
    first comparison met (``main`` first, then the branches in order) decides."""
    fn = mod.main
    # one value (a sample rate, a mode): an integer tensor compared elementwise is data
    inputs = {id(p): p.name for p in fn.params if np.dtype(p.type.dtype).kind in "iu"
              and all(isinstance(d, int) for d in p.type.shape) and int(np.prod(p.type.shape)) == 1}
    found: dict[str, int] = {}
    _steer(mod, fn, inputs, found, set())
    return found


def _steer(mod: IRModule, fn: Function, carries: dict[int, str], found: dict[str, int],
           seen: set[str]) -> None:
    """``steering_values`` over ``fn``: ``carries`` maps a var to the input whose value it holds
    (a reshape or cast of it); a comparison's result maps to its (input, value) candidates until
    a decision takes them."""
    pending: dict[int, list[tuple[str, int]]] = {}
    branches: list[tuple[str, dict[int, str]]] = []
    for b in fn.bindings():
        v = b.value
        if isinstance(v, Var):
            if id(v) in carries:
                carries[id(b.var)] = carries[id(v)]
            if id(v) in pending:
                pending[id(b.var)] = pending[id(v)]
            continue
        if not isinstance(v, Call) or not v.args:
            continue
        if v.op in _DECIDING and id(v.args[0]) in pending:
            for name, value in pending[id(v.args[0])]:
                found.setdefault(name, value)
        if v.op == "if":
            for name in v.attrs.get("branches", ()):
                if name and name not in seen:
                    seen.add(name)
                    branch = mod.functions[name]
                    inner = {id(p): carries[id(a)] for p, a in zip(branch.params, v.args[1:])
                             if id(a) in carries}
                    branches.append((name, inner))
            continue
        if v.op in ("reshape", "cast", "broadcast_to") and id(v.args[0]) in carries:
            carries[id(b.var)] = carries[id(v.args[0])]
        if v.op in _HOLDS and len(v.args) == 2:
            for op, (x, c) in ((v.op, v.args), (_MIRRORED[v.op], v.args[::-1])):
                if id(x) in carries and isinstance(c, Constant) and c.data.size >= 1 \
                        and c.data.dtype.kind in "iub":
                    value = _HOLDS[op](int(np.asarray(c.data).reshape(-1)[0]))
                    pending.setdefault(id(b.var), []).append((carries[id(x)], value))
        if v.op in _CARRYING:
            carried = [c for a in v.args for c in pending.get(id(a), ())]
            if carried:
                pending.setdefault(id(b.var), []).extend(carried)
    for name, inner in branches:
        _steer(mod, mod.functions[name], inner, found, seen)


def taken_branch_relations(mod: IRModule, known: Mapping[str, np.ndarray],
                           sizes: Mapping[str, int]) -> list[tuple]:
    """The size relations (``(op, a, b, where)``, as ``IRModule.relations``) that the checks
    of the ``If`` branches taken at these input values and sizes need. ``known`` gives the
    values of some of ``main``'s inputs (the others are data); a condition computed from known
    values, constants and sizes is evaluated with the op references, and its taken branch
    searched in turn. Where the taken branch was left out (a refusal), the kept one's checks
    are the ones the check must meet."""
    fn = mod.main
    env = {id(p): np.asarray(known[p.name]) for p in fn.params if p.name in known}
    out: list[tuple] = []
    _taken(mod, fn, env, sizes, out, 0)
    return out


def _taken(mod: IRModule, fn: Function, env: dict[int, np.ndarray], sizes: Mapping[str, int],
           out: list[tuple], depth: int) -> None:
    from .ir.concrete import concrete, concrete_shape
    from .ops import get_op

    defs = {id(b.var): b.value for b in fn.bindings()}
    for b in fn.bindings():
        v = b.value
        if isinstance(v, Constant):
            env[id(b.var)] = np.asarray(v.data)
        elif isinstance(v, Var) and id(v) in env:
            env[id(b.var)] = env[id(v)]
        if not isinstance(v, Call):
            continue
        if v.op == "check":
            relation = _check_relation(defs, v)
            if relation is not None:
                out.append(relation)
            continue
        if v.op == "if":
            flag = env.get(id(v.args[0]))
            if flag is None or depth > 16:
                continue
            names = v.attrs["branches"]
            taken = names[0 if bool(flag.reshape(-1)[0]) else 1] or next(n for n in names if n)
            branch = mod.functions[taken]
            inner = {id(p): env[id(a)] for p, a in zip(branch.params, v.args[1:])
                     if id(a) in env}
            _taken(mod, branch, inner, sizes, out, depth + 1)
            continue
        args = [np.asarray(a.data) if isinstance(a, Constant) else env.get(id(a))
                for a in v.args]
        if any(a is None or a.size > _SMALL for a in args) or get_op(v.op).kind == "branch":
            continue
        try:
            if int(np.prod(concrete_shape(v.type.shape, sizes))) > _SMALL:
                continue   # not shape arithmetic (a constant-filled tensor, say)
            with np.errstate(all="ignore"):
                result = np.asarray(get_op(v.op).reference(*args, **concrete(v.attrs, sizes)))
        except Exception:  # noqa: BLE001  (a condition it cannot evaluate decides nothing)
            continue
        if result.size <= _SMALL:
            env[id(b.var)] = result


def _check_relation(defs: Mapping[int, Any], check: Call) -> tuple | None:
    """The relation a branch's ``check`` tests, as ``frontends/onnx/branches.py``
    (``_check_relations``) writes it: ``greater(a - b, 0)`` refuses ``a <= b`` and
    ``logical_not(equal(a - b, 0))`` refuses ``a == b``; None for another form or one
    without a size variable."""
    bad = defs.get(id(check.args[0]))
    op = None
    if isinstance(bad, Call) and bad.op == "greater":
        op, test = "le", bad
    elif isinstance(bad, Call) and bad.op == "logical_not":
        test = defs.get(id(bad.args[0]))
        if isinstance(test, Call) and test.op == "equal":
            op = "eq"
    if op is None:
        return None
    x, zero = test.args
    diff = defs.get(id(x))
    if not (isinstance(zero, Constant) and not np.any(zero.data) and isinstance(diff, Call)
            and diff.op == "sym_values" and len(diff.attrs.get("values", ())) == 1):
        return None
    value = diff.attrs["values"][0]
    if not shape_vars([value]):
        return None
    return (op, value, 0, check.attrs.get("where", ""))


# ---- the choice -----------------------------------------------------------------------------------

@dataclass
class ChosenInputs:
    inputs: dict[str, np.ndarray]
    seed: int | None
    note: str | None = None   # the values chosen for the model's sake, for the summary line


def _value_inputs(fn: Function, rows: Any, sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The values of the inputs read as sizes (``check_values``), shaped as the inputs."""
    out = {}
    for name, values in check_values(rows, sizes).items():
        p = next((q for q in fn.params if q.name == name), None)
        if p is None:
            continue
        count = int(np.prod(p.type.shape))
        top = np.finfo(p.type.dtype).max if p.type.dtype.startswith("float") \
            else np.iinfo(p.type.dtype).max
        out[name] = np.array([min(v, top) for v in values[:count]],
                             dtype=p.type.dtype).reshape(p.type.shape)
    return out


def _steering_inputs(fn: Function, steer: Mapping[str, int], sizes: Mapping[str, int]
                     ) -> dict[str, np.ndarray]:
    out = {}
    for p in fn.params:
        if p.name in steer:
            info = np.iinfo(p.type.dtype)
            value = min(max(steer[p.name], info.min), info.max)
            out[p.name] = np.full(check_shape(p.type.shape, sizes), value, p.type.dtype)
    return out


def _relations_key(relations: list[tuple]) -> list[tuple]:
    return [(r[0], str(r[1]), str(r[2])) for r in relations]


def choose_inputs(mod: IRModule, params: Mapping[str, np.ndarray] | None, opts: Any,
                  quantized_ranges: Mapping[str, tuple[float, float]] | None = None
                  ) -> ChosenInputs:
    """The check's inputs: ``opts.check_inputs`` where given, else seeded random data at the
    check's sizes, with the values of inputs read as sizes and of inputs that steer the model
    (see the module docstring)."""
    fn = mod.main
    free = [p for p in fn.params if not (params and p.name in params)]
    if opts.check_inputs:
        given = [(p.name, tuple(p.type.shape), p.type.dtype) for p in free]
        return ChosenInputs(given_inputs(given, opts.check_inputs), None)
    rows = getattr(mod, "value_vars", ())
    relations = list(getattr(mod, "relations", []))
    names = shape_vars([d for p in fn.params for d in p.type.shape]) \
        | {v for row in rows for v in row[2]}
    steer = {k: v for k, v in steering_values(mod).items() if k in {p.name for p in free}}
    has_branches = any(isinstance(b.value, Call) and b.value.op == "if" for b in fn.bindings())
    branch: list[tuple] = []
    sizes = check_size(relations, names)
    plain = sizes
    for _ in range(4 if has_branches else 0):   # until the taken branches' sizes settle
        known = {**(params or {}), **_value_inputs(fn, rows, sizes),
                 **_steering_inputs(fn, steer, sizes)}
        found = taken_branch_relations(mod, known, sizes)
        if _relations_key(found) == _relations_key(branch):
            break
        branch = found
        sizes = check_size(relations + branch, names)
    specs = [(p.name, check_shape(p.type.shape, sizes), p.type.dtype) for p in free]
    inputs = random_inputs(specs, opts.check_seed, quantized_ranges)
    for name, value in {**_value_inputs(fn, rows, sizes),
                        **_steering_inputs(fn, steer, sizes)}.items():
        if name in inputs:
            inputs[name] = value
    chosen = [f"{k} = {v}" for k, v in steer.items()]
    grown = {k for k in sizes if sizes[k] != plain.get(k)}
    shaped = [f"{p.name} {tuple(inputs[p.name].shape)}" for p in free
              if shape_vars(p.type.shape) & grown]
    parts = ([", ".join(chosen) + " (a value its condition accepts)"] if chosen else []) \
        + ([", ".join(shaped) + " (sizes the taken branch needs)"] if shaped else [])
    note = "check inputs chosen for the model's If: " + "; ".join(parts) if parts else None
    return ChosenInputs(inputs, opts.check_seed, note)
