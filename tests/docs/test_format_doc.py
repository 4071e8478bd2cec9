"""docs/format.md's field tables match the schema (runtime/header.py), so the spec a C reader is
written from cannot drift: one table per record of ``header.RECORDS``, headed by the record's
class name, listing every field of the record (in the writer's order) and nothing else, each
marked required (R), optional (O) or optional but always written (W) as the schema declares."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
from conftest import ROOT
from mlcpack.runtime import header

DOC = ROOT / "docs" / "format.md"
START, END = "<!-- format-tables:", "<!-- /format-tables -->"
HEADING = re.compile(r"^### `(\w+)`")
ROW = re.compile(r"^\| `(\w+)` \|[^|]*\| ([ROW]) \|")
# On the wire ``plans`` is optional (a one-plan header is its plan); the typed Header always
# holds its plans.
WIRE_OPTIONAL = {("Header", "plans")}


def doc_tables() -> dict[str, list[tuple[str, str]]]:
    """Record name -> [(field, R/O/W), ...] in the order of the doc's table."""
    text = DOC.read_text()
    assert text.count(START) == 1 and text.count(END) == 1, "format.md lost its table markers"
    body = text[text.index(START):text.index(END)]
    tables: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in body.splitlines():
        m = HEADING.match(line)
        if m:
            current = m.group(1)
            assert current not in tables, f"two tables for {current}"
            tables[current] = []
            continue
        m = ROW.match(line)
        if m:
            assert current is not None, f"a field row before any record heading: {line}"
            tables[current].append((m.group(1), m.group(2)))
        elif line.startswith("| `"):
            raise AssertionError(f"a field row the test cannot read: {line}")
    return tables


def schema_fields(cls: type) -> list[tuple[str, str]]:
    """(field, R/O/W) of a record: W written even when None, O defaulted, R required."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        if f.metadata.get("always"):
            kind = "W"
        elif (cls.__name__, f.name) in WIRE_OPTIONAL or f.default is not dataclasses.MISSING \
                or f.default_factory is not dataclasses.MISSING:
            kind = "O"
        else:
            kind = "R"
        out.append((f.name, kind))
    return out


def test_every_record_has_one_table_and_nothing_else() -> None:
    tables = doc_tables()
    names = [cls.__name__ for cls in header.RECORDS]
    assert sorted(tables) == sorted(names), (
        f"documented but not in the schema: {sorted(set(tables) - set(names))}; "
        f"in the schema but not documented: {sorted(set(names) - set(tables))}")


def test_every_field_is_documented_in_order_with_its_presence() -> None:
    tables = doc_tables()
    for cls in header.RECORDS:
        documented, declared = tables[cls.__name__], schema_fields(cls)
        missing = [f for f, _ in declared if f not in dict(documented)]
        unknown = [f for f, _ in documented if f not in dict(declared)]
        assert not missing and not unknown, (
            f"{cls.__name__}: fields not documented {missing}, documented but absent {unknown}")
        assert documented == declared, (
            f"{cls.__name__}: the doc's order or R/O/W differs from the schema:\n"
            f"doc    {documented}\nschema {declared}")


def test_the_records_cover_the_top_level_keys() -> None:
    """The Header and Plan tables together list every top-level key the writer knows."""
    tables = doc_tables()
    top = {f for f, _ in tables["Header"]} | {f for f, _ in tables["Plan"]} - {"batch"}
    assert top == set(header.TOP_KEYS)


def test_the_constants_the_doc_states() -> None:
    """Opcodes and tensor kinds as the doc's tables give them."""
    text = DOC.read_text()
    for op, name in ((header.OP_CALL_KERNEL, "CALL_KERNEL"), (header.OP_CALL_LIB, "CALL_LIB"),
                     (header.OP_COPY, "COPY")):
        assert f"| {op} | `{name}` |" in text
    assert (f"{header.ARENA} ARENA, {header.CONST} CONST, {header.SIZES} SIZES") in text


def test_a_bundle_reads_as_the_doc_says(mlp_bundle) -> None:
    """The container (section 1), the flat digest (13) and the bytecode (6) of an exported
    bundle, read with msgpack, hashlib and struct only, as a reader written from the doc would."""
    import hashlib
    import struct

    import msgpack

    path, _ = mlp_bundle
    data = path.read_bytes()
    assert data[:9] == b"\x83\xa7mlcpack"
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data[9:])
    head = unpacker.unpack()
    header_end = 9 + unpacker.tell()
    trailer = data[header_end:header_end + 51]
    assert trailer[:9] == b"\xa6sha256\xc4\x20" and trailer[41:47] == b"\xa4data\xc6"
    n = int.from_bytes(trailer[47:51], "big")
    data_start = header_end + 51
    assert data_start % 64 == 0 and data_start + n == len(data)
    area = data[data_start:]
    assert "digest" not in head   # a small bundle: the flat digest
    assert hashlib.sha256(data[:header_end] + area).digest() == trailer[9:41]
    assert head["format"] == [1, 2] and head["min_reader"] == [1, 0]
    assert list(head)[-1] == "pad" and not any(head["pad"])
    for c in head["constants"]:
        ref = c["data"]
        assert ref["offset"] % 64 == 0 and ref["offset"] + ref["size"] <= n
        assert ref["size"] == int(np.prod(c["shape"])) * np.dtype(c["dtype"]).itemsize
    ref = head["vm"]["bytecode"]
    words = struct.unpack(f"<{ref['size'] // 4}i", area[ref["offset"]:ref["offset"] + ref["size"]])
    pc, count = 0, 0
    while pc < len(words):
        op = words[pc]
        assert op in (header.OP_CALL_KERNEL, header.OP_CALL_LIB, header.OP_COPY)
        if op == header.OP_COPY:
            pc += 3
        else:
            target, nops = words[pc + 1], words[pc + 2]
            operands = words[pc + 3:pc + 3 + nops]
            if op == header.OP_CALL_KERNEL:
                k = head["kernels"][target]
                assert nops == k["num_inputs"] + k["num_outputs"] + (k["workspace_bytes"] > 0)
            for t in operands:
                kind, at, shape, dtype = head["tensors"][t]
                size = int(np.prod(shape)) * np.dtype(dtype).itemsize
                assert kind in (header.ARENA, header.CONST)
                if kind == header.ARENA:
                    assert at + size <= head["memory_plan"]["arena_bytes"]
            pc += 3 + nops
        count += 1
    assert count == head["vm"]["instructions"]
