"""docs/format.md's field tables match the schema (runtime/header.py), so the spec a C reader is
written from cannot drift: one table per record of ``header.RECORDS``, headed by the record's
class name, listing every field of the record (in the writer's order) and nothing else, each
marked required (R), optional (O) or optional but always written (W) as the schema declares."""

from __future__ import annotations

import dataclasses
import re

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
