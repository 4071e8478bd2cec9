"""docs/architecture.md: its pass table is the one ``packager/passes/pipeline.py`` runs.

The table between the ``passes:begin`` and ``passes:end`` markers is generated from
``DEFAULT_PIPELINE`` (order, pass names, the module and function each one runs), and every pass
name has a description bullet below it, so the document cannot drift from the pipeline. After
changing the pipeline, regenerate the table with ``python tests/docs/test_architecture_doc.py``.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- passes:begin (generated from packager/passes/pipeline.py by " \
        "tests/docs/test_architecture_doc.py; do not edit by hand) -->"
END = "<!-- passes:end -->"


def _function(run: object) -> object:
    while isinstance(run, functools.partial):
        run = run.func
    return getattr(run, "__wrapped__", run)


def rendered() -> str:
    """The pass table, as the pipeline defines it today."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from packager.passes.pipeline import DEFAULT_PIPELINE

    rows = ["| # | pass | runs |", "|---|---|---|"]
    for i, p in enumerate(DEFAULT_PIPELINE, 1):
        fn = _function(p.run)
        module = getattr(fn, "__module__", "") or ""
        where = f"`{module.replace('.', '/')}.py` `{getattr(fn, '__name__', p.name)}`" \
            if module.startswith("packager.") else "`packager/passes/pipeline.py`"
        rows.append(f"| {i} | `{p.name}` | {where} |")
    return "\n".join(rows)


def _between(text: str) -> str:
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "the pass table's markers"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def test_pass_table_is_the_pipeline() -> None:
    assert _between(DOC.read_text()) == rendered(), \
        "docs/architecture.md's pass table differs from DEFAULT_PIPELINE: run " \
        "`python tests/docs/test_architecture_doc.py` to regenerate it"


def test_every_pass_is_described() -> None:
    from packager.passes.pipeline import DEFAULT_PIPELINE

    text = DOC.read_text()
    after = re.split(r"^#", text.split(END, 1)[1], maxsplit=1, flags=re.M)[0]  # to the next heading
    described = set(re.findall(r"^- `(\w+)`", after, re.M))
    names = {p.name for p in DEFAULT_PIPELINE}
    assert names <= described, f"passes without a description bullet: {sorted(names - described)}"
    assert described <= names, f"described but not in the pipeline: {sorted(described - names)}"


def test_the_readme_points_to_the_generated_list() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/architecture.md" in readme


if __name__ == "__main__":   # regenerate the table in place
    text = DOC.read_text()
    old = _between(text)
    DOC.write_text(text.replace(old, rendered(), 1))
    print(f"{DOC.relative_to(ROOT)}: pass table {'unchanged' if old == rendered() else 'updated'}")
