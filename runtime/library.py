"""Library functions that bundles call by name (``call_library("env.linear", ...)``).

A library function is a Python callable in destination-passing style:
``fn(*inputs, out, **attrs)`` reads numpy arrays ``inputs`` and writes its result into ``out``.
The runtime resolves every name a bundle uses when it loads, from the built-ins below, then
from functions the application registered (``register_library_function``), then from the
``library=`` mapping given to ``load``; a missing name is refused at load, not mid-run.
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from .errors import LibraryFunctionError
from .header import LibraryCall

LibraryFunction = Callable[..., None]


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, *, out: np.ndarray
            ) -> None:
    np.matmul(x, w.T, out=out)
    if b is not None:
        out += b


def _relu(x: np.ndarray, *, out: np.ndarray) -> None:
    np.maximum(x, 0, out=out)


def _softmax(x: np.ndarray, *, out: np.ndarray, axis: int = -1) -> None:
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)


def _matmul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray) -> None:
    np.matmul(a, b, out=out)


BUILTINS: dict[str, LibraryFunction] = {
    "env.linear": _linear,
    "env.relu": _relu,
    "env.softmax": _softmax,
    "env.matmul": _matmul,
}

_registered: dict[str, LibraryFunction] = {}
_lock = threading.Lock()


def register_library_function(name: str, fn: LibraryFunction, *, override: bool = False) -> None:
    """Make ``fn`` available to bundles that call ``name`` (namespaced, e.g. ``"myapp.swish"``)."""
    if not isinstance(name, str) or "." not in name:
        raise ValueError(f"library function names are namespaced ('myapp.op'), got {name!r}")
    if not callable(fn):
        raise TypeError(f"library function {name} must be callable")
    with _lock:
        if not override and (name in BUILTINS or name in _registered):
            raise ValueError(f"library function {name} is already registered "
                             "(pass override=True to replace it)")
        _registered[name] = fn


def resolve(names: list[str], extra: Mapping[str, LibraryFunction] | None, bundle_name: str
            ) -> dict[str, LibraryFunction]:
    """Look up every name; raise ``LibraryFunctionError`` listing all that are missing."""
    found, missing = {}, []
    for name in names:
        fn = (extra or {}).get(name) or _registered.get(name) or BUILTINS.get(name)
        if fn is None:
            missing.append(name)
        else:
            found[name] = fn
    if missing:
        raise LibraryFunctionError(
            f"{bundle_name} calls library function(s) {', '.join(sorted(set(missing)))} that this "
            "process does not provide: register them with "
            "mlcpack.runtime.register_library_function(name, fn) or pass library={...} to load()")
    return found


def resolve_calls(calls: Sequence[LibraryCall], extra: Mapping[str, LibraryFunction] | None,
                  bundle_name: str) -> list[tuple[LibraryFunction, dict]]:
    """Each library call site's function (``extra``, then the registered ones) and attributes;
    a name found nowhere is refused here, at load."""
    fns = resolve([c.func for c in calls], extra, bundle_name)
    return [(fns[c.func], dict(c.attrs or {})) for c in calls]
