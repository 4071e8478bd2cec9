"""The records a bundle header is made of (``header.py``'s ``Header`` holds them), one frozen
dataclass each, with the checks that validate them and the format's constants.

Each record's dataclass fields are its one field list (``_Record``): the map's keys in the
writer's order, ``from_msgpack`` checks a record as msgpack decodes it and raises one
``BundleError`` that names the field, ``to_msgpack`` writes it back. The format's constants
(storage kinds, VM opcodes, limits) are defined here only; ``header.py`` re-exports them and the
records, so ``runtime.header`` stays the one import path for readers and the writer.

numpy and the standard library only, like the rest of the runtime.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Mapping

from .bundle import PayloadRef, check_dtype, check_shape, payload_ref
from .errors import BundleError

# The format's constants, defined here only (the emitter, the VM and the runtime import them).
ARENA, CONST, SIZES = 0, 1, 2     # a tensor row's storage kind (docs/format.md section 5)
STORE = 3   # format 1.9: a loop's rows with no bound at export, grown by the VM (APPEND)
OP_CALL_KERNEL, OP_CALL_LIB, OP_COPY, OP_BIND_SIZE = 1, 2, 3, 4   # VM opcodes (format.md section 6)
OP_JUMP_UNLESS, OP_JUMP, OP_TRAP = 5, 6, 7   # format 1.7: an If that runs only its taken branch
OP_LOOP, OP_NEXT = 8, 9   # format 1.8: a Loop whose trip count is known only at run time
OP_APPEND = 10   # format 1.9: a row appended to a STORE row (a scan output with no bound)
MAX_PLANS = 64
MAX_DIM = 1 << 40
MAX_RECORD_DEPTH = 32


def _bad(what: str, why: str = "is malformed") -> BundleError:
    return BundleError(f"bundle header: {what} {why}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any, what: str, lo: int = 0, hi: int = 1 << 63) -> int:
    if not _is_int(v) or not lo <= v < hi:
        raise _bad(what, f"is not an integer in [{lo}, {hi}) ({v!r:.40})")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise _bad(what, "is not a string")
    return v


def _list(v: Any, what: str, nonempty: bool = False) -> list:
    if not isinstance(v, list) or (nonempty and not v):
        raise _bad(what, "must be a non-empty list" if nonempty else "must be a list")
    return v


def _map(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise _bad(what, "is not a map")
    return v


def _version(v: Any, what: str) -> tuple[int, int]:
    if not isinstance(v, list) or len(v) != 2 or not all(_is_int(x) for x in v):
        raise _bad(what, "is not a [major, minor] version")
    return (v[0], v[1])


def freeze(v: Any) -> Any:
    """A decoded msgpack value with its lists made tuples (dicts stay dicts)."""
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, dict):
        return {k: freeze(x) for k, x in v.items()}
    return v


def plain(v: Any) -> Any:
    """What msgpack packs: records as maps, tuples as lists (they pack alike)."""
    if isinstance(v, (_Record, TensorRow)):
        return v.to_msgpack()
    if isinstance(v, PayloadRef):
        return {"offset": v.offset, "size": v.size}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


# A symbolic dim record (docs/format.md section 10.1): an int, a size variable's name, or a tuple
# ("+" | "*", record...) / ("//" | "%", record, positive int).
DimRecord = int | str | tuple


def _record_names(rec: Any) -> set[str]:
    """The variable names a (validated) dim record uses."""
    if isinstance(rec, str):
        return {rec}
    if isinstance(rec, tuple):
        return set().union(*(_record_names(r) for r in rec[1:]))
    return set()


def _dim_record(rec: Any, what: str, depth: int = 0) -> DimRecord:
    """A symbolic dim record: an int, a size variable's name, or ``["+" | "*", term...]`` /
    ``["//" | "%", record, positive int]`` (``packager/ir/sym.to_record``)."""
    if _is_int(rec) and -MAX_DIM < rec < MAX_DIM or isinstance(rec, str):
        return rec
    if isinstance(rec, list) and rec and depth < MAX_RECORD_DEPTH:
        op = rec[0]
        if op in ("+", "*") and len(rec) >= 2:
            return (op, *(_dim_record(r, what, depth + 1) for r in rec[1:]))
        if op in ("//", "%") and len(rec) == 3 and _is_int(rec[2]) and 0 < rec[2] < MAX_DIM:
            return (op, _dim_record(rec[1], what, depth + 1), rec[2])
    raise _bad(what, f"has a malformed dim record {rec!r:.60}")


def _shape(v: Any, what: str, symbolic: bool) -> tuple:
    if not symbolic:
        return check_shape(v, what)
    if not isinstance(v, list) or len(v) > 16:
        raise _bad(what, "has an invalid shape")
    return tuple(_int(d, what, 0, MAX_DIM) if _is_int(d) else _dim_record(d, what) for d in v)


# A field written even when it is None (nil), by ``field(metadata=ALWAYS)``.
ALWAYS: Mapping[str, bool] = {"always": True}


class _Record:
    """A header record. Its dataclass fields are its one field list: the map's keys, in the
    writer's order (``keys()``); a field that is None is absent from the map unless declared
    with ``metadata=ALWAYS`` (then written as nil); ``extra`` holds keys this reader does not
    know, written back after the known ones."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The record's keys in the writer's order: its dataclass fields but ``extra``."""
        return _keys(cls)

    def to_msgpack(self) -> dict[str, Any]:
        out = {}
        for f in _fields(type(self)):
            value = getattr(self, f.name)
            if value is not None or f.metadata.get("always"):
                out[f.name] = plain(value)
        out.update(plain(getattr(self, "extra", {})))
        return out

    @classmethod
    def _extra(cls, obj: dict, known: tuple[str, ...] | None = None) -> dict[str, Any]:
        keys = cls.keys() if known is None else known
        return {k: freeze(v) for k, v in obj.items() if k not in keys}


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if f.name != "extra")


@functools.cache
def _keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in _fields(cls))


@dataclass(frozen=True)
class IORow(_Record):
    """An input or output: ``shape`` is ints (dim records in a symbolic bundle); it lists its
    ``views`` (the tensor rows over its bytes; older bundles list none for outputs) and an
    input, with --max-shape, its ``max_shape``."""
    name: str
    shape: tuple
    dtype: str
    tensor: int
    max_shape: tuple[int, ...] | None = None
    views: Any = None   # advice, kept as given: tensor indices, or anything (then unused)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: Any, what: str, num_tensors: int, symbolic: bool) -> IORow:
        obj = _map(obj, what)
        shape = _shape(obj.get("shape"), what, symbolic)
        bound = obj.get("max_shape")
        if bound is not None:
            bound = check_shape(bound, f"{what} max_shape")
            if len(bound) != len(shape):
                raise _bad(f"{what} max_shape", "does not match its shape's rank")
        # Advice, kept as given: a list that is not tensor indices only turns reading the
        # caller's array in place off (Model._bindings), as it always did.
        views = freeze(obj.get("views"))
        return cls(_str(obj.get("name"), f"{what} name"), shape,
                   check_dtype(obj.get("dtype"), what),
                   _int(obj.get("tensor"), f"{what} tensor", 0, num_tensors), bound, views,
                   cls._extra(obj))


@dataclass(frozen=True)
class TensorRow:
    """One row of a plan's tensor table, ``[kind, ref, shape, dtype]``: ``ref`` is a byte offset
    in the arena (ARENA), a constant's index (CONST) or 0 (SIZES: a symbolic plan's size
    variables; STORE, format 1.9: rows the VM appends, its first dim their count)."""
    kind: int
    ref: int
    shape: tuple
    dtype: str

    @classmethod
    def parse(cls, obj: Any, what: str, num_constants: int, symbolic: bool,
              stores: bool = False) -> TensorRow:
        """``stores``: the plan's vm record says it has STORE rows (format 1.9, symbolic
        plans only)."""
        if not isinstance(obj, list) or len(obj) != 4:
            raise _bad(what)
        kind = _int(obj[0], f"{what} kind", 0, (STORE + 1 if stores else 3) if symbolic else 2)
        ref = _int(obj[1], f"{what} offset", 0, num_constants if kind == CONST else MAX_DIM)
        return cls(kind, ref, _shape(obj[2], what, symbolic), check_dtype(obj[3], what))

    def to_msgpack(self) -> list:
        return [self.kind, self.ref, plain(self.shape), self.dtype]


@dataclass(frozen=True)
class KernelRow(_Record):
    """A kernel: its symbol in the object code and calling facts. ``source`` (the source-model
    nodes), ``symbolic`` (takes the size variables last), ``workspace`` (a dim record),
    ``macs`` and ``kernel`` (the kernel's design in words) are optional."""
    name: str
    symbol: str
    num_inputs: int
    num_outputs: int
    workspace_bytes: int
    parallel: bool | None = None
    source: Any = None   # [{"name", "op"}, ...], checked where it is read (runtime/profile.py)
    symbolic: bool | None = None
    workspace: DimRecord | None = None
    macs: int | None = None
    kernel: Any = None   # advice, kept as given: which kernel computes it, in words (`inspect`)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: Any, what: str) -> KernelRow:
        obj = _map(obj, what)
        flags = [obj.get(k) for k in ("parallel", "symbolic")]
        if any(f is not None and not isinstance(f, bool) for f in flags):
            raise _bad(what, "has a flag that is not a boolean")
        ws = obj.get("workspace")
        macs = obj.get("macs")
        kernel = obj.get("kernel")
        return cls(_str(obj.get("name"), f"{what} name"), _str(obj.get("symbol"),
                                                               f"{what} symbol"),
                   _int(obj.get("num_inputs"), f"{what} num_inputs", 0, 1 << 16),
                   _int(obj.get("num_outputs"), f"{what} num_outputs", 0, 1 << 16),
                   _int(obj.get("workspace_bytes"), f"{what} workspace_bytes", 0, MAX_DIM),
                   flags[0], freeze(obj.get("source")), flags[1],
                   None if ws is None else _dim_record(ws, f"{what} workspace"),
                   None if macs is None else _int(macs, f"{what} macs"),
                   freeze(kernel), cls._extra(obj))

    @property
    def operands(self) -> int:
        """How many tensors a call passes: inputs, outputs, a workspace, the size variables."""
        return (self.num_inputs + self.num_outputs
                + (1 if self.workspace_bytes or self.workspace is not None else 0)
                + (1 if self.symbolic else 0))


@dataclass(frozen=True, kw_only=True)
class CodeVariant(_Record):
    """One target's object code: the target record (``Target.to_record``), the object, the
    external symbols it may use and each kernel's code size."""
    arch: str
    level: str
    features: tuple[str, ...] | None = None
    triple: str | None = None
    cpu: str | None = None
    llvm_features: str | None = None
    object: PayloadRef
    externals: tuple[str, ...] | None = None
    code_sizes: Mapping[str, int] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: Any, what: str, data_size: int) -> CodeVariant:
        obj = _map(obj, what)
        features, externals, sizes = obj.get("features"), obj.get("externals"), \
            obj.get("code_sizes")
        if features is not None:
            features = tuple(_str(f, f"{what} features") for f in _list(features,
                                                                         f"{what} features"))
        if externals is not None:
            externals = tuple(_str(f, f"{what} externals") for f in _list(externals,
                                                                          f"{what} externals"))
        if sizes is not None:
            sizes = {_str(k, f"{what} code_sizes"): _int(v, f"{what} code_sizes")
                     for k, v in _map(sizes, f"{what} code_sizes").items()}
        text = [obj.get(k) for k in ("triple", "cpu", "llvm_features")]
        if any(t is not None and not isinstance(t, str) for t in text):
            raise _bad(what, "has a target field that is not a string")
        return cls(arch=_str(obj.get("arch"), f"{what} arch"),
                   level=_str(obj.get("level"), f"{what} level"), features=features,
                   triple=text[0], cpu=text[1], llvm_features=text[2],
                   object=payload_ref(obj.get("object"), f"{what} object", data_size),
                   externals=externals, code_sizes=sizes, extra=cls._extra(obj))

    def record(self) -> dict[str, Any]:
        """The variant as a map, as ``cpu.pick_variant`` and ``Model.code_variant`` take it."""
        return self.to_msgpack()


@dataclass(frozen=True)
class LibraryCall(_Record):
    func: str
    attrs: Mapping[str, Any] | None = None
    source: Any = None   # as KernelRow.source
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: Any, what: str) -> LibraryCall:
        obj = _map(obj, what)
        attrs = obj.get("attrs")
        if attrs is not None:
            attrs = _map(attrs, f"{what} attrs")
        return cls(_str(obj.get("func"), f"{what} func"), attrs, freeze(obj.get("source")),
                   cls._extra(obj))


@dataclass(frozen=True)
class VMRecord(_Record):
    bytecode: PayloadRef
    instructions: int | None = None
    # format 1.7: how many If regions (JUMP_UNLESS instructions) the bytecode has; present only
    # when it has some, so that a reader knows it must understand opcodes 5-7
    branches: int | None = None
    # format 1.8: how many counted loops (LOOP ... NEXT regions) the bytecode has; present only
    # when it has some, so that a reader knows it must understand opcodes 8-9
    loops: int | None = None
    # format 1.9: how many STORE rows (scan outputs with no bound at export, APPEND) the plan
    # has; present only when it has some, so that a reader knows it must understand them
    stores: int | None = None
    # format 1.10: the STORE rows that hold a Loop's carried value that grows (a Concat of
    # itself and a piece); present only when there are some
    grows: tuple[int, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryPlan(_Record):
    arena_bytes: int
    intermediate_bytes: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SymbolicBound(_Record):
    """An upper-bound memory plan (``--max-shape`` on every size variable): each variable's
    largest value (``sizes``), each buffer's arena offset with every buffer at its size for those
    values, and the arena's size. Optional in the symbolic record: a reader that does not know it
    plans per shape, as before (so the format stays 1.3)."""
    sizes: Mapping[str, int]
    offsets: tuple[int, ...]
    arena_bytes: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: Any, names: tuple[str, ...], num_buffers: int) -> SymbolicBound:
        what = "symbolic bound"
        obj = _map(obj, what)
        sizes = _map(obj.get("sizes"), f"{what} sizes")
        if set(sizes) != set(names):
            raise _bad(f"{what} sizes", "must bound every size variable")
        sizes = {v: _int(sizes[v], f"{what} size of {v}", 1, MAX_DIM) for v in names}
        offsets = tuple(_int(o, f"{what} offset", 0, MAX_DIM)
                        for o in _list(obj.get("offsets"), f"{what} offsets"))
        if len(offsets) != num_buffers:
            raise _bad(f"{what} offsets", "must give one offset per buffer")
        return cls(sizes, offsets, _int(obj.get("arena_bytes"), f"{what} arena_bytes", 0,
                                        MAX_DIM), cls._extra(obj))


@dataclass(frozen=True)
class Symbolic(_Record):
    """Format 1.3: the size variables, each arena buffer's ``(size record, first step, last
    step)``, and the relations between sizes the runtime checks when it binds
    (``[op, record, record, text]``); ``runtime/symbolic.py`` plans memory from them, per shape,
    or once from ``bound`` (an upper-bound plan, when the export had bounds on every size)."""
    vars: tuple[str, ...]
    buffers: tuple[tuple[DimRecord, int, int], ...]
    checks: tuple[tuple[str, DimRecord, DimRecord, str], ...] | None = None
    bound: SymbolicBound | None = None
    # format 1.6: the size variables a kernel counts at run time (BIND_SIZE), each
    # ``(name, upper bound)``, the bound a dim record over the other variables
    dynamic: tuple[tuple[str, DimRecord], ...] | None = None
    # format 1.6: how inputs' values bind size variables, ``[input, rule, vars, *args]`` rows
    # (docs/format.md section 10.8; ``runtime/values.bind_values``)
    values: tuple | None = None
    # format 1.7: sizes from float scales fed at run time, ``[input, "scales", vars, src]``
    # rows, each var ``floor(scale * src dim)`` (docs/format.md section 10.9)
    scales: tuple | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dynamic_names(self) -> frozenset[str]:
        """The variables bound at run time by BIND_SIZE rather than by the inputs."""
        return frozenset(name for name, _ in self.dynamic or ())

    @classmethod
    def parse(cls, obj: Any) -> Symbolic:
        what = "symbolic record"
        obj = _map(obj, what)
        names = tuple(_str(v, f"{what} vars") for v in _list(obj.get("vars"), f"{what} vars"))
        buffers = []
        for i, b in enumerate(_list(obj.get("buffers"), f"{what} buffers")):
            if not isinstance(b, list) or len(b) != 3:
                raise _bad(f"symbolic buffer {i}")
            buffers.append((_dim_record(b[0], f"symbolic buffer {i}"),
                            _int(b[1], f"symbolic buffer {i} start"),
                            _int(b[2], f"symbolic buffer {i} end")))
        checks = obj.get("checks")
        if checks is not None:
            rows = []
            for i, c in enumerate(_list(checks, "symbolic checks")):
                if not isinstance(c, list) or len(c) != 4 or c[0] not in ("eq", "le") \
                        or not isinstance(c[3], str):
                    raise _bad(f"symbolic check {i}")
                rows.append((c[0], _dim_record(c[1], f"symbolic check {i}"),
                             _dim_record(c[2], f"symbolic check {i}"), c[3]))
            checks = tuple(rows)
        bound = obj.get("bound")
        if bound is not None:
            bound = SymbolicBound.parse(bound, names, len(buffers))
        dynamic = obj.get("dynamic")
        if dynamic is not None:
            rows = []
            for i, d in enumerate(_list(dynamic, "symbolic dynamic")):
                if not isinstance(d, list) or len(d) != 2 or d[0] not in names \
                        or any(d[0] == r[0] for r in rows):
                    raise _bad(f"symbolic dynamic size {i}")
                rows.append((d[0], _dim_record(d[1], f"symbolic dynamic size {i}")))
            dynamic = tuple(rows)
            late = {n for _, rec in dynamic for n in _record_names(rec)} & \
                {n for n, _ in dynamic}
            if late:
                raise _bad("symbolic dynamic sizes", "bounds must name input sizes only")
        values = obj.get("values")
        if values is not None:
            values = tuple(_value_row(r, i, names) for i, r in
                           enumerate(_list(values, "symbolic values")))
        scales = obj.get("scales")
        if scales is not None:
            scales = tuple(_scale_row(r, i, names) for i, r in
                           enumerate(_list(scales, "symbolic scales")))
        return cls(names, tuple(buffers), checks, bound, dynamic, values, scales,
                   cls._extra(obj))


def _scale_row(r: Any, i: int, names: tuple[str, ...]) -> tuple:
    """A ``scales`` row: ``[input, "scales", [var...], [src dim...]]``, one var per dim."""
    what = f"symbolic scales row {i}"
    if not isinstance(r, list) or len(r) != 4 or not isinstance(r[0], str) \
            or r[1] != "scales" or not isinstance(r[2], list) or not 1 <= len(r[2]) <= 64 \
            or any(v not in names for v in r[2]):
        raise _bad(what)
    src = _list(r[3], what)
    if len(src) != len(r[2]):
        raise _bad(what)
    return (r[0], r[1], tuple(r[2]), tuple(_dim_record(d, what) for d in src))


VALUE_RULES = {"dims": 3, "reshape": 5, "expand": 4, "axes": 5, "slice": 7, "pad": 5}


def _value_row(r: Any, i: int, names: tuple[str, ...]) -> tuple:
    """A ``values`` row: ``[input, rule, [var...], *args]``, each var one of ``vars``; a
    reshape's data dims and allowzero, an expand's data dims."""
    what = f"symbolic values row {i}"
    if not isinstance(r, list) or len(r) < 3 or not isinstance(r[0], str) \
            or VALUE_RULES.get(r[1]) != len(r) or not isinstance(r[2], list) \
            or not 1 <= len(r[2]) <= 64 or any(v not in names for v in r[2]):
        raise _bad(what)
    args: list = []
    if r[1] in ("reshape", "expand", "axes", "slice", "pad"):
        src = _list(r[3], what)
        if len(src) > 64:
            raise _bad(what)
        args.append(tuple(_dim_record(d, what) for d in src))
    if r[1] == "reshape":
        args.append(_int(r[4], what, 0, 2))
    if r[1] == "axes":   # mode: runtime/symbolic.py AXES_*
        args.append(_int(r[4], what, 0, 5))
    if r[1] == "slice":   # ends, axes, steps: input names ("" when absent)
        if not all(isinstance(n, str) for n in r[4:7]) or not r[4] \
                or len(r[2]) != 4 * len(args[0]):
            raise _bad(what)
        args.extend(r[4:7])
    if r[1] == "pad":   # axes: an input name ("" when absent)
        if not isinstance(r[4], str) or len(r[2]) != 3 * len(args[0]):
            raise _bad(what)
        args.append(r[4])
    return (r[0], r[1], tuple(r[2]), *args)


@dataclass(frozen=True, kw_only=True)
class Plan(_Record):
    """What runs one batch size: I/O, kernels, code per target, library calls, the tensor table,
    the bytecode and the memory plan (``symbolic``: planned at run time instead)."""
    batch: int | None = None
    inputs: tuple[IORow, ...]
    outputs: tuple[IORow, ...]
    kernels: tuple[KernelRow, ...]
    code: tuple[CodeVariant, ...]
    library_calls: tuple[LibraryCall, ...] | None = None
    tensors: tuple[TensorRow, ...]
    vm: VMRecord
    memory_plan: MemoryPlan
    symbolic: Symbolic | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: dict, what: str, data_size: int, num_constants: int,
              batch: int | None = None, known: tuple[str, ...] | None = None) -> Plan:
        at = f"{what}: " if what else ""
        sym = obj.get("symbolic")
        symbolic = Symbolic.parse(sym) if sym is not None else None
        is_sym = symbolic is not None
        vm = obj.get("vm")
        has_stores = isinstance(vm, dict) and "stores" in vm
        tensors = tuple(TensorRow.parse(r, f"{at}tensor {i}", num_constants, is_sym, has_stores)
                        for i, r in enumerate(_list(obj.get("tensors"), f"{at}tensors")))
        n = len(tensors)
        io = [tuple(IORow.parse(r, f"{at}{kind}[{i}]", n, is_sym)
                    for i, r in enumerate(_list(obj.get(kind), f"{at}{kind}", nonempty=True)))
              for kind in ("inputs", "outputs")]
        kernels = tuple(KernelRow.parse(k, f"{at}kernel {i}")
                        for i, k in enumerate(_list(obj.get("kernels"), f"{at}kernels")))
        code = tuple(CodeVariant.parse(v, f"{at}code variant {i}", data_size)
                     for i, v in enumerate(_list(obj.get("code"), f"{at}code", nonempty=True)))
        calls = obj.get("library_calls")
        if calls is not None:
            calls = tuple(LibraryCall.parse(c, f"{at}library call {i}")
                          for i, c in enumerate(_list(calls, f"{at}library_calls")))
        vm = _map(obj.get("vm"), f"{at}vm")
        ins = vm.get("instructions")
        branches = vm.get("branches")
        loops = vm.get("loops")
        stores = vm.get("stores")
        grows = vm.get("grows")
        if grows is not None:
            grows = tuple(_int(g, f"{at}vm grows", 0, n)
                          for g in _list(grows, f"{at}vm grows"))
        vm_rec = VMRecord(payload_ref(vm.get("bytecode"), f"{at}bytecode", data_size),
                          None if ins is None else _int(ins, f"{at}vm instructions"),
                          None if branches is None else _int(branches, f"{at}vm branches"),
                          None if loops is None else _int(loops, f"{at}vm loops"),
                          None if stores is None else _int(stores, f"{at}vm stores"),
                          grows, VMRecord._extra(vm))
        mp = obj.get("memory_plan")
        if not isinstance(mp, dict) or not _is_int(mp.get("arena_bytes")) \
                or not 0 <= mp["arena_bytes"] < MAX_DIM:
            raise _bad(f"{at}memory plan", "has no valid arena size")
        inter = mp.get("intermediate_bytes")
        plan = MemoryPlan(mp["arena_bytes"], None if inter is None
                          else _int(inter, f"{at}memory plan intermediate_bytes"),
                          MemoryPlan._extra(mp))
        return cls(batch=batch, inputs=io[0], outputs=io[1], kernels=kernels, code=code,
                   library_calls=calls, tensors=tensors, vm=vm_rec, memory_plan=plan,
                   symbolic=symbolic, extra=cls._extra(obj, known))

    def top_level(self) -> dict[str, Any]:
        """This plan's keys as the top level of a header holds them (no ``batch``)."""
        out = self.to_msgpack()
        out.pop("batch", None)
        return out


@dataclass(frozen=True)
class BatchInfo(_Record):
    """A dynamic-batch bundle: the plans' batch sizes (ascending) and the inputs and outputs
    that have the batch as their first dimension."""
    sizes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)


STORED_DTYPES = ("int8", "uint8")


@dataclass(frozen=True)
class StoredRecord(_Record):
    """A float32 constant stored as 8-bit integers (format 1.5): the constant's ``data`` holds
    ``dtype`` values of its shape; its value is ``(float32(q) - zero_point) * scale`` in float32,
    ``scale`` and ``zero_point`` float32 arrays of ``param_shape`` (the constant's rank, each dim
    1 or the constant's) broadcast over it. Readers expand it once, at load."""
    dtype: str
    param_shape: tuple[int, ...]
    scale: PayloadRef
    zero_point: PayloadRef
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: Any, what: str, shape: tuple[int, ...], dtype: str,
              data: PayloadRef, data_size: int) -> StoredRecord:
        what = f"{what} stored"
        obj = _map(obj, what)
        kind = obj.get("dtype")
        if kind not in STORED_DTYPES or dtype != "float32":
            raise _bad(what, f"stores {kind!r} for a {dtype} constant (int8 or uint8 for "
                       "float32)")
        params = check_shape(obj.get("param_shape"), f"{what} param_shape")
        if len(params) != len(shape) or any(p not in (1, n) for p, n in zip(params, shape)):
            raise _bad(what, f"has param_shape {list(params)} for shape {list(shape)}")
        count = 1
        for n in shape:
            count *= n
        if data.size != count:
            raise _bad(what, f"has {data.size} bytes of {kind} for shape {list(shape)}")
        per = 4
        for p in params:
            per *= p
        refs = []
        for key in ("scale", "zero_point"):
            ref = payload_ref(obj.get(key), f"{what} {key}", data_size)
            if ref.size != per:
                raise _bad(f"{what} {key}", f"has {ref.size} bytes for {list(params)} float32")
            refs.append(ref)
        return cls(kind, params, refs[0], refs[1],
                   cls._extra(obj))


@dataclass(frozen=True)
class ConstantRow(_Record):
    name: str | None = field(metadata=ALWAYS)   # as given (a reader only shows it)
    shape: tuple[int, ...]
    dtype: str
    data: PayloadRef
    stored: StoredRecord | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GoldenRow(_Record):
    """One array of the golden pair; outputs may carry the exporter's ``magnitude`` and a
    quantized model's ``quant_step``."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    data: PayloadRef
    magnitude: float | None = None
    quant_step: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Golden(_Record):
    """The golden pair (``packager/golden.py``): inputs, the reference's outputs, the
    tolerance, which reference made them and the inputs' seed."""
    inputs: tuple[GoldenRow, ...]
    outputs: tuple[GoldenRow, ...]
    rtol: float
    atol: float
    reference: str | None = field(default=None, metadata=ALWAYS)
    seed: int | None = field(default=None, metadata=ALWAYS)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, obj: Any, data_size: int) -> Golden:
        obj = _map(obj, "golden record")
        rows = []
        for kind in ("inputs", "outputs"):
            out = []
            for i, r in enumerate(_list(obj.get(kind), f"golden {kind}")):
                what = f"golden {kind[:-1]} {i}"
                r = _map(r, what)
                opt = [r.get(k) for k in ("magnitude", "quant_step")]
                # Optional: a value that is not a finite non-negative number is ignored
                # (runtime/selftest.golden_magnitudes), as before these types.
                out.append(GoldenRow(_str(r.get("name"), f"{what} name"),
                                     check_shape(r.get("shape"), what),
                                     check_dtype(r.get("dtype"), what),
                                     payload_ref(r.get("data"), what, data_size),
                                     *[freeze(v) for v in opt], GoldenRow._extra(r)))
            rows.append(tuple(out))
        tol = []
        for key in ("rtol", "atol"):
            v = obj.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1e6:
                raise _bad(f"golden {key}", "is not a valid tolerance")
            tol.append(v)
        return cls(rows[0], rows[1], *tol, freeze(obj.get("reference")),
                   freeze(obj.get("seed")), cls._extra(obj))


@dataclass(frozen=True)
class Digest(_Record):
    """Format 1.2's tree digest: SHA-256 of every ``chunk``-byte slice of the payload area."""
    alg: str
    chunk: int


@dataclass(frozen=True)
class PayloadArea(_Record):
    """Format 1.4: where the payload area lies in the file (after the msgpack map, whose
    ``"data"`` is then empty), for payload areas of 4 GiB and more."""
    offset: int
    size: int


@dataclass(frozen=True)
class Signature(_Record):
    """An Ed25519 signature (``runtime/signing.py`` checks it; docs/format.md section 14)."""
    alg: str
    key: bytes
    sig: bytes

    @classmethod
    def parse(cls, obj: Any) -> Signature | None:
        """The record when well formed, else None: a malformed one is kept as given (in
        ``Header.extra``) and refused by the signature check, which alone reads it."""
        if (isinstance(obj, dict) and set(obj) == {"alg", "key", "sig"}
                and obj["alg"] == SIGNATURE_ALG and isinstance(obj["key"], bytes)
                and isinstance(obj["sig"], bytes)):
            return cls(obj["alg"], obj["key"], obj["sig"])
        return None


SIGNATURE_ALG = "ed25519"
