"""What a compiled object is a function of, encoded before any LLVM IR exists: the compile
cache's key (``codegen/cache.py`` ``object_key``), taken from the kernels' inputs so that a
warm export neither emits nor prints IR.

An object is determined by the emitter's code (``cache.compiler_fingerprint``), LLVM and its
pipeline, the target, and what emission reads: every prim func in order, whole (names,
tensors with shapes and dtypes, index variables with extents, every expression node, reduction
tags and the functions' attributes), the module's size variables, whether the thread pool's
hand-off functions are in, and the ``CompileOptions`` fields other than those that only say
where and how to compile (``NOT_CODE``). What the emitters read besides is code (their
modules' constants, keyed with the sources) or an option (the thresholds of splitting over
threads: ``parallel_min_macs``, ``parallel_min_weight_bytes``, ``parallel_min_outputs``): a
test that patches a code generator's module at run time must compile without the cache
(``MLCPACK_CACHE_DIR=off``).
The encoding is exact (floats by ``repr``, arrays by dtype, shape and content hash); a value
it does not know makes ``encode_funcs`` return None, and the caller keys that module by its
emitted IR instead, as before.

``kernels_record`` / ``kernels_from_record``: the ``KernelInfo`` of every prim func as JSON
(a cache hit returns them without emitting).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Sequence

import numpy as np

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.sym import SymExpr
from ..options import CompileOptions
from .lower import KernelInfo

# CompileOptions fields that never change emitted code: where and how the compile runs, IR
# checks between passes, the target name (the resolved Target is keyed instead), and the
# test-only LLVM abort (it plays LLVM's part, whose version is keyed: a hit runs no LLVM, so
# it repeats what the compile that stored it met). Every other field is part of the key, also
# those that act only on the passes (their effect is in the prim funcs already): a new field
# is keyed until someone shows it cannot change code.
NOT_CODE = frozenset({"target", "parallel_compile", "cache_dir", "cache_max_bytes",
                      "verify_ir", "llvm_abort"})


class _Unkeyable(Exception):
    """A value the encoding does not know."""


class _Encoder:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.memo: dict[int, int] = {}   # id(node or tensor) -> index of its first encoding
        self.keep: list[object] = []     # keeps encoded nodes alive, so ids stay unique

    def value(self, v: Any) -> None:
        out = self.out
        if v is None or isinstance(v, (bool, int, float, str)):
            out.append(f"{type(v).__name__}:{v!r}")
        elif isinstance(v, (te.Expr, te.Tensor)):
            self.node(v)
        elif isinstance(v, (tuple, list)):
            out.append(f"{type(v).__name__}[{len(v)}")
            for x in v:
                self.value(x)
            out.append("]")
        elif isinstance(v, dict):
            out.append(f"dict[{len(v)}")
            items = []
            for k, x in v.items():
                sub = _Encoder()
                sub.value(k)
                items.append(("\x1f".join(sub.out), x))
            for k, x in sorted(items, key=lambda kv: kv[0]):
                out.append(k)
                self.value(x)
            out.append("]")
        elif isinstance(v, (frozenset, set)):
            subs = []
            for x in v:
                sub = _Encoder()
                sub.value(x)
                subs.append("\x1f".join(sub.out))
            out.append(f"set[{len(v)}:" + "\x1e".join(sorted(subs)) + "]")
        elif isinstance(v, SymExpr):
            out.append(f"sym:{v._key()!r}")
        elif isinstance(v, np.ndarray):
            out.append(f"array:{v.dtype.str}:{v.shape}:"
                       + hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest())
        elif isinstance(v, np.generic):
            out.append(f"np:{v.dtype.str}:{v.tobytes().hex()}")
        elif isinstance(v, te.ReductionTag):
            out.append("tag")
            self.value(v.kind)
            self.value(v.operands)
            self.value(v.attrs)
        else:
            raise _Unkeyable(type(v).__name__)

    def node(self, n: te.Expr | te.Tensor) -> None:
        at = self.memo.get(id(n))
        if at is not None:
            self.out.append(f"@{at}")
            return
        self.memo[id(n)] = len(self.memo)
        self.keep.append(n)
        self.out.append(f"<{type(n).__name__}")
        for f in dataclasses.fields(n):
            if f.name == "uid":    # a process-wide counter: not part of what it computes
                continue
            self.out.append(f.name + "=")
            self.value(getattr(n, f.name))
        self.out.append(">")


def encode_funcs(funcs: Sequence[PrimFunc], size_vars: Sequence[str], thread_pool: bool,
                 options: CompileOptions) -> list[bytes] | None:
    """The key's parts for compiling ``funcs`` into one module (see the module docstring), or
    None when a function holds a value the encoding does not know."""
    parts = []
    enc = _Encoder()
    try:
        enc.value(tuple(size_vars))
        enc.value(thread_pool)
        enc.value({f.name: getattr(options, f.name) for f in dataclasses.fields(options)
                   if f.name not in NOT_CODE})
        parts.append("\x1f".join(enc.out).encode())
        for func in funcs:
            enc = _Encoder()   # each function on its own: tensors are per function
            enc.value(func.name)
            enc.value(func.inputs)
            enc.value(func.outputs)
            # the stages between inputs and outputs are reached through the outputs' bodies
            enc.value(func.attrs)
            data = "\x1f".join(enc.out).encode()
            parts.append(len(data).to_bytes(8, "little") + data)
    except (_Unkeyable, RecursionError):
        return None
    return parts


def kernels_record(kernels: dict[str, KernelInfo]) -> dict | None:
    """Every prim func's ``KernelInfo`` as JSON values (None if one does not encode)."""
    try:
        return {name: {"symbol": k.symbol, "num_inputs": k.num_inputs,
                       "num_outputs": k.num_outputs, "workspace_bytes": k.workspace_bytes,
                       "parallel": k.parallel, "symbolic": k.symbolic,
                       "workspace_expr": _dim_record(k.workspace_expr), "choice": k.choice}
                for name, k in kernels.items()}
    except _Unkeyable:
        return None


def kernels_from_record(record: dict) -> dict[str, KernelInfo] | None:
    """``kernels_record``'s inverse; None for a record it did not write."""
    try:
        return {name: KernelInfo(str(r["symbol"]), int(r["num_inputs"]), int(r["num_outputs"]),
                                 int(r["workspace_bytes"]), bool(r["parallel"]),
                                 bool(r["symbolic"]), _dim(r["workspace_expr"]),
                                 r.get("choice") if isinstance(r.get("choice"), str) else None)
                for name, r in record.items()}
    except (KeyError, TypeError, ValueError):
        return None


def _dim_record(d: object) -> object:
    """A workspace size: None, an int, or a SymExpr's terms exactly ({monomial: coefficient},
    a monomial's atoms variable names or [op, expr, constant])."""
    if d is None or (isinstance(d, int) and not isinstance(d, bool)):
        return d
    if isinstance(d, SymExpr):
        return {"terms": [[[a if isinstance(a, str) else [a[0], _dim_record(a[1]), a[2]]
                            for a in m], c] for m, c in d.terms.items()]}
    raise _Unkeyable(type(d).__name__)


def _dim(r: object) -> object:
    if r is None or isinstance(r, int):
        return r
    if not isinstance(r, dict):
        raise ValueError(r)
    terms = {}
    for m, c in r["terms"]:
        terms[tuple(a if isinstance(a, str) else (a[0], _dim(a[1]), a[2]) for a in m)] = int(c)
    return SymExpr(terms)
