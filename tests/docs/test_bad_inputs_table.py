"""docs/bad-inputs.md: every row names at least one test, and every test it names exists."""

from __future__ import annotations

import re

from conftest import ROOT

DOC = ROOT / "docs" / "bad-inputs.md"


def _rows() -> list[str]:
    # The bad-input tables have five columns (#, input, behaviour, exit, test); skip the others.
    return [line for line in DOC.read_text().splitlines()
            if re.match(r"^\| \d+ \|", line) and line.count(" | ") >= 4]


def test_the_table_has_at_least_30_rows() -> None:
    numbers = [int(r.split("|")[1]) for r in _rows()]
    assert len(numbers) >= 30
    assert numbers == list(range(1, len(numbers) + 1))


def test_every_row_names_tests_that_exist() -> None:
    missing = []
    for row in _rows():
        refs = re.findall(r"(test_\w+\.py)::(test_\w+)", row.split("|")[-2])
        assert refs, row
        for file, name in refs:
            path = next((ROOT / "tests").rglob(file), ROOT / "tests" / file)   # by basename, any folder
            if not path.is_file() or not re.search(rf"^def {name}\(", path.read_text(), re.M):
                missing.append(f"{file}::{name}")
    assert not missing, missing
