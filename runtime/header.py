"""The bundle header as types: one frozen dataclass per record, validated once, up front.

``Header.from_msgpack(obj, data_size)`` takes the header map as msgpack decodes it (the value of
the bundle's ``"mlcpack"`` key) and the payload area's size, checks every record (types, ranges,
every payload record's alignment and bounds, payload records pairwise disjoint, plan/batch
agreement, the symbolic record) and returns a ``Header``, or raises one ``BundleError`` that names
the field. Readers (``runtime/model.py``, ``describe.py``, ``selftest.py``) then use attributes.

``Header.to_msgpack()`` is the map the writer packs (``packager/bundle_writer.py``): known keys
in the writer's order, absent optional fields left out, unknown keys kept (after the known ones),
so ``Header.from_msgpack(h.to_msgpack(), n) == h`` and a bundle the exporter writes is byte for
byte what it wrote before these types existed (tests/format/test_typed_header.py).

A one-plan bundle is a ``Header`` with one ``Plan`` (the header's own inputs, kernels, code...).
A dynamic-batch bundle (format 1.1) has one ``Plan`` per batch size under ``"plans"`` and, at
the top level, a copy of its largest plan for readers of format 1.0; the copy must agree.

The records it holds (``Plan``, ``IORow``, ``KernelRow``...), their checks and the format's
constants are defined in ``records.py`` and imported from here as before: ``runtime.header`` is
the schema's one import path.

numpy and the standard library only, like the rest of the runtime.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .bundle import (DIGEST_ALG, MAX_CHUNK, MIN_CHUNK, PayloadRef, check_disjoint, check_dtype,
                     check_shape, nbytes_of, payload_ref, storage_dtype)
from .records import (ALWAYS, ARENA, CONST, MAX_DIM, MAX_PLANS, MAX_RECORD_DEPTH,  # noqa: F401
                      OP_BIND_SIZE, OP_CALL_KERNEL, OP_CALL_LIB, OP_COPY, OP_JUMP, OP_JUMP_UNLESS,
                      OP_APPEND, OP_LOOP, OP_NEXT, OP_TRAP, SIGNATURE_ALG, SIZES, STORE,
                      STORED_DTYPES,
                      BatchInfo, CodeVariant, ConstantRow, Digest, DimRecord, Golden, GoldenRow,
                      IORow, KernelRow, LibraryCall, MemoryPlan, PayloadArea, Plan, Signature,
                      StoredRecord, Symbolic, SymbolicBound, TensorRow, VALUE_RULES, VMRecord, _bad,
                      _int,
                      _is_int, _list, _map, _Record, _version, freeze, plain)


def _constant_bytes(c: ConstantRow) -> int:
    """A constant's size in memory: its payload's, or a stored one's expanded float32."""
    return c.data.size if c.stored is None else nbytes_of(c.shape, c.dtype)


def _check_static_plan(plan: Plan, constants: list[ConstantRow]) -> None:
    """docs/format.md section 5, in the C reader's order: every tensor row of a static plan lies
    inside its storage (its arena or its constant), then its inputs and outputs agree with their
    tensor rows (as many bytes, the same storage dtype, an input in the arena)."""
    for i, t in enumerate(plan.tensors):
        size = nbytes_of(t.shape, t.dtype)
        if not (t.kind == ARENA and t.ref + size <= plan.memory_plan.arena_bytes
                or t.kind == CONST and t.ref < len(constants)
                and _constant_bytes(constants[t.ref]) == size
                and storage_dtype(constants[t.ref].dtype) == storage_dtype(t.dtype)):
            raise _bad(f"tensor {i}", "lies outside its storage")
    at = "" if plan.batch is None else f"the batch-{plan.batch} plan: "
    for kind, rows in (("input", plan.inputs), ("output", plan.outputs)):
        for r in rows:
            t = plan.tensors[r.tensor]
            if nbytes_of(r.shape, r.dtype) != nbytes_of(t.shape, t.dtype) \
                    or storage_dtype(r.dtype) != storage_dtype(t.dtype) \
                    or (kind == "input" and t.kind != ARENA):
                raise _bad(f"{at}{kind} '{r.name}'", "does not match its tensor row")


@dataclass(frozen=True, kw_only=True)
class Header(_Record):
    """A bundle's header (see the module doc). ``plans`` has one ``Plan`` per batch size, or the
    header's own plan; ``plan`` is the largest (what the top level holds). The fields are the
    top-level keys but the plan's, in the writer's order; ``plans`` is written only with
    ``batch`` (a one-plan bundle's plan is its top level)."""
    format: tuple[int, int]
    min_reader: tuple[int, int] | None = None
    compiler: Mapping[str, Any] | None = field(default=None, metadata=ALWAYS)
    model: Mapping[str, Any] | None = field(default=None, metadata=ALWAYS)
    preprocess: Mapping[str, Any] | None = field(default=None, metadata=ALWAYS)
    labels: tuple | None = field(default=None, metadata=ALWAYS)
    constants: tuple[ConstantRow, ...]
    ir: PayloadRef | None = None
    batch: BatchInfo | None = None
    plans: tuple[Plan, ...]
    # A symbolic bundle exported with --batch-sizes: static plans for those batch sizes (the
    # other dims fixed), run when the inputs' shapes match one exactly; the symbolic plan runs
    # every other shape. Readers that do not know the key run the symbolic plan for all.
    specialized: tuple[Plan, ...] | None = None
    golden: Golden | None = None
    digest: Digest | None = None
    signature: Signature | None = None
    payload: PayloadArea | None = None
    pad: bytes | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def plan(self) -> Plan:
        return self.plans[-1]

    @property
    def symbolic(self) -> Symbolic | None:
        return self.plan.symbolic

    def to_msgpack(self) -> dict[str, Any]:
        """The header map the writer packs (keys in the writer's order, TOP_KEYS)."""
        top = self.plan.top_level()
        own = super().to_msgpack()
        if self.batch is None:
            own.pop("plans")
        out = {}
        for key in TOP_KEYS:
            if key in top:
                out[key] = top[key]
            elif key in own:
                out[key] = own[key]
        for key, value in top.items():   # a plan's unknown keys
            out.setdefault(key, value)
        out.update(own)   # this header's unknown keys (own's known ones are placed already)
        return out

    def payload_refs(self) -> list[tuple[str, PayloadRef]]:
        """Every payload record, named as the header's errors name it."""
        refs = [(f"constant {i}", c.data) for i, c in enumerate(self.constants)]
        refs += [(f"constant {i} {key}", getattr(c.stored, key))
                 for i, c in enumerate(self.constants) if c.stored is not None
                 for key in ("scale", "zero_point")]
        many = len(self.plans) > 1 or self.batch is not None
        for p, plan in enumerate(self.plans):
            at = f" of plan {p}" if many else ""
            refs += [(f"code object {i}{at}", v.object) for i, v in enumerate(plan.code)]
            refs.append((f"bytecode{at}", plan.vm.bytecode))
        for p, plan in enumerate(self.specialized or ()):
            at = f" of specialized plan {p}"
            refs += [(f"code object {i}{at}", v.object) for i, v in enumerate(plan.code)]
            refs.append((f"bytecode{at}", plan.vm.bytecode))
        if self.ir is not None:
            refs.append(("IR text", self.ir))
        if self.golden is not None:
            refs += [(f"golden {kind} {i}", r.data) for kind, rows in
                     (("input", self.golden.inputs), ("output", self.golden.outputs))
                     for i, r in enumerate(rows)]
        return refs

    @classmethod
    def from_msgpack(cls, obj: Any, data_size: int, name: str = "bundle") -> Header:
        """Validate a decoded header map against a payload area of ``data_size`` bytes; one
        ``BundleError`` naming the field when anything is wrong."""
        h = _map(obj, "header")
        fmt = _version(h.get("format"), "format")
        need = h.get("min_reader")
        min_reader = None if need is None else _version(need, "min_reader")
        consts = []
        for i, c in enumerate(_list(h.get("constants"), "constants")):
            what = f"constant {i}"
            c = _map(c, what)
            shape, dtype = check_shape(c.get("shape"), what), check_dtype(c.get("dtype"), what)
            data = payload_ref(c.get("data"), what, data_size)
            stored = None if c.get("stored") is None else StoredRecord.parse(
                c["stored"], what, shape, dtype, data, data_size)
            consts.append(ConstantRow(freeze(c.get("name")), shape, dtype, data, stored,
                                      extra=ConstantRow._extra(c)))
        known = tuple(k for k in TOP_KEYS if k not in PLAN_KEYS)
        top = Plan.parse(h, "", data_size, len(consts), known=known + PLAN_KEYS)
        batch, plans = cls._plans(h, top, data_size, len(consts))
        labels = h.get("labels")
        if labels is not None:
            labels = freeze(_list(labels, "labels"))
        preprocess = h.get("preprocess")
        if preprocess is not None:
            preprocess = dict(_map(preprocess, "preprocess"))   # as given: `infer` reads it
        ir = h.get("ir")
        digest = h.get("digest")
        if digest is not None:
            chunk = digest.get("chunk") if isinstance(digest, dict) else None
            if not isinstance(digest, dict) or set(digest) != {"alg", "chunk"} \
                    or digest["alg"] != DIGEST_ALG or not _is_int(chunk) \
                    or not MIN_CHUNK <= chunk <= MAX_CHUNK or chunk & (chunk - 1):
                raise _bad("digest record", f"is invalid (expected alg {DIGEST_ALG!r} and a "
                           f"power-of-two chunk of {MIN_CHUNK} to {MAX_CHUNK} bytes)")
            digest = Digest(DIGEST_ALG, chunk)
        area = h.get("payload")
        if area is not None:
            area = _map(area, "payload area")
            if set(area) != {"offset", "size"}:
                raise _bad("payload area")
            area = PayloadArea(_int(area["offset"], "payload area offset"),
                               _int(area["size"], "payload area size"))
        pad = h.get("pad")
        if pad is not None and not isinstance(pad, bytes):
            raise _bad("pad", "is not bytes")
        golden = h.get("golden")
        specialized = cls._specialized(h.get("specialized"), top, data_size, len(consts))
        for plan in (top, *plans, *(specialized or ())):   # after the plans' agreement
            if plan.symbolic is None:
                _check_static_plan(plan, consts)
        signature = Signature.parse(h.get("signature"))
        extra = {k: freeze(v) for k, v in h.items()
                 if k not in TOP_KEYS or (k == "signature" and signature is None)}
        header = cls(format=fmt, min_reader=min_reader, compiler=freeze(h.get("compiler")),
                     model=freeze(h.get("model")), preprocess=preprocess, labels=labels,
                     constants=tuple(consts),
                     ir=None if ir is None else payload_ref(ir, "IR text", data_size),
                     batch=batch, plans=plans, specialized=specialized,
                     golden=None if golden is None else Golden.parse(golden, data_size),
                     digest=digest, signature=signature, payload=area, pad=pad, extra=extra)
        check_disjoint(header.payload_refs(), name)
        return header

    @staticmethod
    def _specialized(rows: Any, top: Plan, data_size: int, num_constants: int
                     ) -> tuple[Plan, ...] | None:
        """The static plans beside a symbolic plan (``--batch-sizes``): each static, with its
        batch, and the symbolic plan's inputs and outputs (names, dtypes, ranks)."""
        if rows is None:
            return None
        if top.symbolic is None:
            raise _bad("specialized plans", "go with a symbolic plan only")
        if not isinstance(rows, list) or not rows or len(rows) > MAX_PLANS \
                or not all(isinstance(p, dict) for p in rows):
            raise _bad("specialized plans", "are malformed")
        plans = []
        for i, p in enumerate(rows):
            b = p.get("batch")
            if not _is_int(b) or not 0 < b < 1 << 31:
                raise _bad(f"specialized plan {i} batch")
            plan = Plan.parse(p, f"specialized plan {i}", data_size, num_constants, b)
            if plan.symbolic is not None:
                raise _bad(f"specialized plan {i}", "must be static")
            for kind in ("inputs", "outputs"):
                if [(r.name, r.dtype, len(r.shape)) for r in getattr(plan, kind)] != \
                        [(r.name, r.dtype, len(r.shape)) for r in getattr(top, kind)]:
                    raise _bad(f"specialized plan {i} {kind}", "differ from the symbolic plan's")
            plans.append(plan)
        return tuple(plans)

    @staticmethod
    def _plans(h: dict, top: Plan, data_size: int, num_constants: int
               ) -> tuple[BatchInfo | None, tuple[Plan, ...]]:
        if "plans" not in h and "batch" not in h:
            return None, (top,)
        if top.symbolic is not None:
            raise _bad("plans", "cannot go with symbolic shapes")
        rows, rec = h.get("plans"), h.get("batch")
        if not isinstance(rows, list) or not rows or len(rows) > MAX_PLANS \
                or not all(isinstance(p, dict) for p in rows) or not isinstance(rec, dict):
            raise _bad("plans/batch", "are malformed")
        sizes = [p.get("batch") for p in rows]
        if not all(_is_int(b) and 0 < b < 1 << 31 for b in sizes) \
                or sizes != sorted(set(sizes)) or rec.get("sizes") != sizes:
            raise _bad("plan batch sizes", f"{sizes!r:.60} are malformed")
        names = [rec.get("inputs"), rec.get("outputs")]
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in names) \
                or not names[0]:
            raise _bad("batched inputs/outputs", "are malformed")
        batch = BatchInfo(tuple(sizes), tuple(names[0]), tuple(names[1]),
                          BatchInfo._extra(rec))
        plans = tuple(Plan.parse(p, f"plan {i}", data_size, num_constants, p["batch"])
                      for i, p in enumerate(rows))
        if any(p.symbolic is not None for p in plans):
            raise _bad("plans", "cannot go with symbolic shapes")
        if dataclasses.replace(plans[-1], batch=None, extra={}) != \
                dataclasses.replace(top, extra={}):
            raise _bad("top-level plan", "differs from the largest batch plan")
        check_batch(batch, plans)
        return batch, plans


PLAN_KEYS = tuple(k for k in Plan.keys() if k != "batch")   # a plan's keys at the top level
# The top level in the writer's order: the header's own fields with the plan's interleaved.
TOP_KEYS = ("format", "min_reader", "compiler", "model", "inputs", "outputs", "preprocess",
            "labels", "constants", "kernels", "code", "library_calls", "tensors", "vm",
            "memory_plan", "symbolic", "ir", "batch", "plans", "specialized", "golden", "digest",
            "signature", "payload", "pad")
assert [k for k in TOP_KEYS if k in PLAN_KEYS] == list(PLAN_KEYS) and \
    [k for k in TOP_KEYS if k not in PLAN_KEYS] == list(Header.keys()), "TOP_KEYS is stale"

# Every record of the schema: docs/format.md has one field table per record
# (tests/docs/test_format_doc.py).
RECORDS: tuple[type, ...] = (Header, Plan, IORow, TensorRow, KernelRow, CodeVariant,
                             LibraryCall, VMRecord, MemoryPlan, Symbolic, SymbolicBound,
                             BatchInfo, ConstantRow, StoredRecord, Golden, GoldenRow, Digest, PayloadArea,
                             Signature)


def check_batch(batch: BatchInfo, plans: tuple[Plan, ...]) -> None:
    """Every plan has the same inputs and outputs, every output and each batched input has the
    plan's batch first, and the other dims agree between plans."""
    ref = plans[0]
    for b, plan in zip(batch.sizes, plans):
        for mine, theirs, what, batched in ((plan.inputs, ref.inputs, "input", batch.inputs),
                                            (plan.outputs, ref.outputs, "output",
                                             batch.outputs)):
            if [(s.name, s.dtype, len(s.shape)) for s in mine] != \
                    [(s.name, s.dtype, len(s.shape)) for s in theirs]:
                raise _bad(f"the plans' {what}s", "differ")
            for s, r in zip(mine, theirs):
                if s.name in batched or what == "output":
                    if s.name not in batched or not s.shape or s.shape[0] != b \
                            or s.shape[1:] != r.shape[1:]:
                        raise _bad(f"{what} {s.name!r} of the batch-{b} plan",
                                   "does not have the batch first")
                elif s.shape != r.shape:
                    raise _bad(f"{what} {s.name!r}", "differs between plans")
    if not set(batch.inputs) <= {s.name for s in ref.inputs}:
        raise _bad("batched inputs", "name no input")
