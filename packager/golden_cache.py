"""The golden check's reference run, kept in the compile cache (``codegen/cache.py``'s folder:
``golden/``, entries of their own kind, capped at an eighth of the cache's size: the objects
take the rest, ``cache.reference_limit`` / ``cache.object_limit``).

A warm export compiles nothing, but without this it would still run the references again:
ONNX Runtime, the IR's numpy reference (whole seconds on a large convolution network) and
onnx.reference's advice. Their results are a function of the IR module (its text and its
constants' bytes), the check's inputs and tolerances, the reference's identity
(``frontends.reference.Reference.identity``: engine, version, the model's bytes and fixed
feeds) and mlcpack's own code (the sources of ``packager/``, ``frontends/`` and ``runtime/``):
the key is their SHA-256. A reference without an identity (a Python callable, eager torch)
is never cached, nor is a run whose reference could not run (it may be the machine's
doing). The entry holds the arrays (``np.save``, no pickles) and a JSON record of the rest;
what the bundle is checked against is then the same as a fresh run's, and the bundle itself
is still run and compared on every export.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .codegen import cache
from .ir.graph import Constant, Function, IRModule
from .ir.printer import module_text

_KIND = b"mlcpack-golden-1\0"
# Entries live in their own folder of the cache (``.ref`` files), trimmed apart from the
# objects to 1 / cache.REFERENCE_SHARE of the cache's cap (least recently used first, as
# objects are; the objects to the rest).
FOLDER = "golden"
SUFFIX = ".ref"


@functools.cache
def _sources() -> str:
    """SHA-256 of the Python sources every reference result depends on."""
    h = hashlib.sha256(cache.compiler_fingerprint().encode())
    root = Path(__file__).resolve().parent.parent
    for sub in ("frontends", "runtime"):
        for path in sorted((root / sub).rglob("*.py")):
            try:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
            except OSError:
                h.update(b"?")
    return h.hexdigest()


def golden_key(mod: IRModule, params: Mapping[str, np.ndarray] | None, opts: Any) -> str | None:
    """The key of ``prepare_golden(mod, params, opts)``'s result, or None when it is not
    cached (a reference without an identity)."""
    reference = opts.reference
    identity = "" if reference is None else getattr(reference, "identity", None)
    if identity is None:
        return None
    h = hashlib.sha256(_KIND + _sources().encode() + b"\0" + identity.encode() + b"\0")
    h.update(repr((opts.reference_name, getattr(reference, "refuses", True), opts.check_seed,
                   opts.check_rtol, opts.check_atol, getattr(opts, "check_advice", None))).encode())
    h.update(module_text(mod).encode())
    seen: set[int] = set()
    for fn in mod.functions.values():
        if not isinstance(fn, Function):
            continue
        for b in fn.bindings():
            for a in getattr(b.value, "args", [b.value]):
                if isinstance(a, Constant) and id(a) not in seen:
                    seen.add(id(a))
                    _array(h, a.name, a.data)
    for name in sorted(params or {}):
        _array(h, name, params[name])
    for name in sorted(opts.check_inputs or {}):
        _array(h, name, opts.check_inputs[name])
    return h.hexdigest()


def _array(h: Any, name: str, value: Any) -> None:
    value = np.ascontiguousarray(value)
    h.update(f"\0{name}\0{value.dtype}\0{value.shape}\0".encode())
    h.update(value.view(np.uint8).reshape(-1) if value.size else b"")


def load(directory: str | None, key: str | None, golden_type: Any, opts: Any) -> Any:
    """The cached ``Golden`` (``golden_type``, with ``opts``' tolerances), or None."""
    if not directory or not key:
        return None
    entry = cache.load(Path(directory) / FOLDER, key, SUFFIX)
    if entry is None:
        return None
    try:
        record = json.loads(entry.llvm_ir)
        arrays = np.load(io.BytesIO(entry.object_code), allow_pickle=False)
        inputs = {n: arrays[f"i{k}"] for k, n in enumerate(record["inputs"])}
        outputs = {n: arrays[f"o{k}"] for k, n in enumerate(record["outputs"])}
        return golden_type(inputs, outputs, record["reference"], record["seed"],
                           opts.check_rtol, opts.check_atol, magnitudes=record["magnitudes"],
                           steps=record["steps"], note=record["note"],
                           warnings=record["warnings"])
    except (ValueError, KeyError, TypeError, OSError):
        return None


def store(directory: str | None, key: str | None, golden: Any, limit: int) -> None:
    """Keep ``golden`` under ``key`` (not a skipped run, nor arrays numpy cannot save
    without pickling); a cache that cannot be written is skipped silently."""
    if not directory or not key or golden.skipped:
        return
    arrays = {f"i{k}": v for k, v in enumerate(golden.inputs.values())}
    arrays.update({f"o{k}": v for k, v in enumerate(golden.outputs.values())})
    if any(np.asarray(v).dtype.kind not in "biufc" for v in arrays.values()):
        return   # ml_dtypes' (kind V) and object arrays would need pickles
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    record = {"inputs": list(golden.inputs), "outputs": list(golden.outputs),
              "reference": golden.reference, "seed": golden.seed,
              "magnitudes": {k: float(v) for k, v in golden.magnitudes.items()},
              "steps": {k: float(v) for k, v in golden.steps.items()},
              "note": golden.note, "warnings": list(golden.warnings)}
    cache.store(Path(directory) / FOLDER, key, buf.getvalue(), json.dumps(record), [],
                cache.reference_limit(limit), suffix=SUFFIX)
