"""Bundle mutations and the property each must keep, shared by ``tests/format/test_fuzzed_bundles.py`` (a
short hypothesis run in CI) and ``bench/fuzz_bundle.py`` (100 000+ random mutations).

The property: a mutated bundle either loads (and, where it is safe to run, gives exactly the
original answer) or ``load`` raises an ``MlcpackError`` with a one-line message; never another
exception, a crash or a hang.

Two families of mutations:

- byte mutations of the file (bit flip, byte set, overwrite, insertion, deletion, truncation),
  loaded with the SHA-256 check (so a load means the content is intact: it is run) or without it
  (so only the structural checks stand between the bytes and the loader: never run);
- header mutations re-packed as valid msgpack with a recomputed SHA-256, so the structural
  validation is what refuses them. Kernels trust the shapes, offsets and indices of the header, so
  a bundle whose tensor table, kernels, code, plan or bytecode record was mutated is only loaded
  and closed, never run; one where only descriptive fields changed is run and checked.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.errors import MlcpackError

from bundle_parts import pack, read_parts

# Top-level header keys that no kernel depends on: a bundle mutated only there may be run.
RUN_SAFE_KEYS = frozenset({"compiler", "model", "labels", "preprocess", "ir", "pad", "format",
                           "min_reader"})
BYTE_KINDS = ("flip", "set", "overwrite", "insert", "delete", "truncate")
HEADER_OPS = ("replace", "delete", "add_key", "nudge", "swap", "duplicate", "drop")

_VALUES: list[Any] = [None, True, False, 0, 1, -1, 2, 3, 63, 64, 65, 4096, 1 << 31, (1 << 32) - 1,
                      1 << 32, 1 << 40, (1 << 63) - 1, -(1 << 63), (1 << 64) - 1, 1.5, -0.0,
                      math.nan, math.inf, "", "x", "float32", "int8", "bool", "float64",
                      "uint64", "env.linear", "env.relu", "x86_64", "aarch64", "x86-64-v2",
                      "é" * 3, "a" * 300, b"", b"\0" * 8, [], [0], [1, 784],
                      [0, 0, 0, 0], [[]], {}, {"offset": 0, "size": 0},
                      {"offset": 64, "size": 1 << 40}, {1: 2}, {"": None}]


@dataclass
class Seed:
    """The bundle every mutation starts from, and its right answer."""

    data: bytes
    header: dict                 # without the writer's "pad"
    payloads: list[bytes]        # in file order
    data_start: int
    feeds: dict                  # every input's value (random normal, or the caller's)
    expected: bytes              # the first output's bytes for ``feeds``


@dataclass
class Case:
    what: str                    # a short description, for reports
    blob: bytes
    verify: bool
    may_run: bool


def make_seed(path: str | Path, feeds: dict | None = None) -> Seed:
    """Read a real bundle, run it once on fixed inputs (``feeds``, else one random normal input
    of the bundle's shape) and keep its first output's answer."""
    header, payloads = read_parts(path)
    with BundleReader(path) as reader:
        data_start = reader.data_start
    with load(path) as model:
        if feeds is None:
            spec = model.inputs[0]
            feeds = {spec.name: np.random.default_rng(0).standard_normal(spec.shape)
                     .astype(spec.dtype)}
        expected = model.run(feeds)[model.outputs[0].name].tobytes()
    return Seed(Path(path).read_bytes(), header, payloads, data_start, dict(feeds), expected)


# ---- byte mutations ---------------------------------------------------------------------------

def mutate_bytes(data: bytes, kind: str, pos: int, arg: int, chunk: bytes = b"") -> bytes:
    """One byte-level mutation at ``pos`` (taken modulo the length)."""
    pos %= max(len(data), 1)
    out = bytearray(data)
    if kind == "flip":
        out[pos] ^= 1 << (arg % 8)
    elif kind == "set":
        out[pos] = arg % 256
    elif kind == "overwrite":
        out[pos:pos + len(chunk)] = chunk
        del out[len(data):]
    elif kind == "insert":
        out[pos:pos] = chunk or b"\0"
    elif kind == "delete":
        del out[pos:pos + max(arg % 64, 1)]
    elif kind == "truncate":
        del out[pos:]
    else:
        raise ValueError(kind)
    return bytes(out)


def random_byte_case(seed: Seed, rng: random.Random) -> Case:
    kind = rng.choice(BYTE_KINDS)
    region = rng.random()
    if region < 0.5:                  # the header: what the structural checks parse
        pos = rng.randrange(seed.data_start)
    elif region < 0.6:                # digest, data key and payload length
        pos = seed.data_start - 1 - rng.randrange(45)
    else:
        pos = rng.randrange(len(seed.data))
    chunk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 4, 8, 16))))
    if rng.random() < 0.3:            # msgpack type bytes that claim huge lengths
        chunk = rng.choice((b"\xdf\xff\xff\xff\xff", b"\xdd\x7f\xff\xff\xff", b"\xc6\xff\xff\xff\xf0",
                            b"\xdb\x7f\xff\xff\xff", b"\xcf" + b"\xff" * 8, b"\xc1", b"\xd9\xff"))
    verify = rng.random() < 0.7
    blob = mutate_bytes(seed.data, kind, pos, rng.randrange(256), chunk)
    return Case(f"{kind}@{pos % max(len(seed.data), 1)} verify={verify}", blob, verify,
                may_run=verify)


# ---- header mutations (valid msgpack, recomputed SHA-256) --------------------------------------

def header_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += header_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += header_paths(v, prefix + (i,))
    return out


def mutate_header(header: dict, path: tuple, op: str, value: Any, rng: random.Random
                  ) -> dict | None:
    """Apply ``op`` at ``path`` of a copy of ``header``; None when the op does not apply."""
    h = copy.deepcopy(header)
    parent: Any = h
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    old = parent[key]
    if op == "replace":
        parent[key] = value
    elif op == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif op == "add_key":
        if not isinstance(old, dict):
            return None
        old[rng.choice(("extra", "offset", "size", "name", "tensor", 7))] = value
    elif op == "nudge":
        if not isinstance(old, int) or isinstance(old, bool):
            return None
        parent[key] = old + rng.choice((-64, -8, -4, -1, 1, 4, 8, 64, 4096, old, -old - 1))
    elif op == "swap":
        if not isinstance(old, list) or len(old) < 2:
            return None
        i, j = rng.sample(range(len(old)), 2)
        old[i], old[j] = old[j], old[i]
    elif op == "duplicate":
        if not isinstance(old, list) or not old:
            return None
        old.append(copy.deepcopy(rng.choice(old)))
    elif op == "drop":
        if not isinstance(old, list) or not old:
            return None
        old.pop(rng.randrange(len(old)))
    else:
        raise ValueError(op)
    return h


def header_case(seed: Seed, path: tuple, op: str, value: Any, rng: random.Random
                ) -> Case | None:
    h = mutate_header(seed.header, path, op, value, rng)
    if h is None:
        return None
    try:
        blob = pack(h, seed.payloads)
    except (OverflowError, TypeError, ValueError):  # not representable in msgpack: no case
        return None
    return Case(f"{op} {'/'.join(map(str, path))} = {value!r:.40}", blob, verify=True,
                may_run=path[0] in RUN_SAFE_KEYS)


def applicable_ops(value: Any) -> list[str]:
    """The header ops that change ``value`` (every op applies to some value)."""
    ops = ["replace", "delete"]
    if isinstance(value, int) and not isinstance(value, bool):
        ops.append("nudge")
    if isinstance(value, list) and value:
        ops += ["swap", "duplicate", "drop"] if len(value) > 1 else ["duplicate", "drop"]
    if isinstance(value, dict):
        ops.append("add_key")
    return ops


def random_header_case(seed: Seed, rng: random.Random, paths: list[tuple] | None = None
                       ) -> Case | None:
    paths = paths or header_paths(seed.header)
    path = rng.choice(paths)
    op = rng.choice(applicable_ops(_lookup(seed.header, path)))
    value = rng.choice(_VALUES) if rng.random() < 0.8 else copy.deepcopy(
        _lookup(seed.header, rng.choice(paths)))  # a value from elsewhere in the header
    return header_case(seed, path, op, value, rng)


# ---- format 1.9 / 1.10 loops: their records and APPEND instructions ------------------------------

def loop_paths(header: dict) -> list[tuple]:
    """The header paths of what a Loop's row stores and grown values (formats 1.9, 1.10) are
    made of: the vm record (``stores``, ``grows``, ``loops``), the STORE tensor rows and the
    symbolic record's run-time sizes (their bounds: the stores' caps)."""
    from mlcpack.runtime.header import STORE

    stores = [i for i, t in enumerate(header.get("tensors", ())) if t[0] == STORE]
    return [p for p in header_paths(header)
            if p[0] == "vm" or (p[0] == "tensors" and len(p) > 1 and p[1] in stores)
            or p[:2] == ("symbolic", "dynamic")]


def random_append_case(seed: Seed, rng: random.Random) -> Case | None:
    """One word of an APPEND instruction (its opcode, STORE row or appended tensor), or of the
    instruction before it, set to another value in the bytecode payload, re-packed with a valid
    digest: only loaded (the verifiers must refuse what is not a valid APPEND)."""
    import struct

    from bundle_parts import payload_spans

    ref = seed.header["vm"]["bytecode"]
    k = payload_spans(seed.header).index((ref["offset"], ref["size"]))
    data = seed.payloads[k]
    words = list(struct.unpack(f"<{len(data) // 4}i", data))
    starts, pc = [], 0
    size = {3: 3, 4: 3, 5: 3, 6: 2, 7: 2, 8: 5, 9: 3, 10: 3}
    while pc < len(words):
        starts.append(pc)
        pc += 3 + words[pc + 2] if words[pc] in (1, 2) else size[words[pc]]
    appends = [p for p in starts if words[p] == 10]
    if not appends:
        return None
    at = rng.choice(appends) + rng.randrange(3)
    n = len(seed.header["tensors"])
    words[at] = rng.choice((0, 1, 3, 10, -1, n, n - 1, rng.randrange(n), words[at] + 1,
                            words[at] - 1, 1 << 30))
    payloads = list(seed.payloads)
    payloads[k] = struct.pack(f"<{len(words)}i", *words)
    return Case(f"bytecode word {at} = {words[at]}", pack(seed.header, payloads), verify=True,
                may_run=False)


def _lookup(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


# ---- the property -----------------------------------------------------------------------------

class PropertyViolation(AssertionError):
    """A mutation gave another exception than MlcpackError, a multi-line message, or a wrong
    answer."""


def check(seed: Seed, case: Case, path: Path) -> str:
    """Write ``case`` to ``path``, load it and (if allowed) run it. Returns the outcome: "ran",
    "loaded" or the MlcpackError class name; raises PropertyViolation otherwise."""
    path.write_bytes(case.blob)
    try:
        model = load(path, verify=case.verify)
    except MlcpackError as exc:
        if "\n" in str(exc) or not str(exc):
            raise PropertyViolation(f"{case.what}: message is not one line: {exc!r}") from None
        return type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - the property is that nothing else escapes
        raise PropertyViolation(f"{case.what}: {type(exc).__name__}: {exc}") from exc
    try:
        if not case.may_run:
            return "loaded"
        try:
            out = model.run(seed.feeds)
        except MlcpackError as exc:
            raise PropertyViolation(f"{case.what}: loaded but refused to run: {exc}") from None
        first = out[model.outputs[0].name]
        if first.tobytes() != seed.expected:
            raise PropertyViolation(f"{case.what}: loaded and ran with a different answer")
        return "ran"
    finally:
        model.close()


# The C runtime's exit codes for a refused bundle (README table); a sanitizer report exits
# otherwise (tests/runtime/test_c_runtime.py sets ASAN_OPTIONS / UBSAN_OPTIONS exit codes).
C_REFUSALS = frozenset({3, 4, 5, 6, 7, 8, 12})


def check_c(seed: Seed, case: Case, path: Path, mlcrun: Path, env: dict | None = None,
            timeout: float = 30) -> str:
    """The property for the C runtime (runtime/c): ``mlcrun`` refuses ``case`` with one
    ``error:`` line and a README code, or loads it (``inspect``) and, where ``check`` would run
    it (``may_run`` and the digest verified: mlcrun always verifies), runs it to the original
    answer; never another exit (a crash, a sanitizer report, a leak) or a hang. Returns the
    outcome ("ran", "loaded" or "exit N")."""
    import subprocess

    import numpy as np

    path.write_bytes(case.blob)
    run = case.may_run and case.verify
    xs = [path.with_suffix(f".x{i}.npy") for i in range(len(seed.feeds))]
    out = path.with_suffix(".out")
    if run:
        for x, value in zip(xs, seed.feeds.values()):
            np.save(x, value)
    args = ["run", path, *xs, "-o", out] if run else ["inspect", path]
    try:
        proc = subprocess.run([str(mlcrun), *map(str, args)], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PropertyViolation(f"{case.what}: mlcrun hung (over {timeout} s)") from None
    if proc.returncode in C_REFUSALS:
        lines = proc.stderr.splitlines()
        if len(lines) != 1 or not lines[0].startswith("error: "):
            raise PropertyViolation(f"{case.what}: not one error line: {proc.stderr[-500:]!r}")
        return f"exit {proc.returncode}"
    if proc.returncode != 0:
        raise PropertyViolation(f"{case.what}: mlcrun exited {proc.returncode}: "
                                f"{proc.stderr[-1500:]}")
    if not run:
        return "loaded"
    if np.load(out / "out0.npy").tobytes() != seed.expected:
        raise PropertyViolation(f"{case.what}: mlcrun ran it with a different answer")
    return "ran"
