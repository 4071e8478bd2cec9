"""The house's import structure, read statically (ast) from the source tree, so that what was
untangled stays untangled:

- no import cycle among mlcpack's modules, counting imports inside functions too (a lazy import
  that hides a cycle is still a cycle; only ``if TYPE_CHECKING:`` blocks are left out);
- ``frontends/`` builds IR and never imports the export driver (``packager/export.py``, which
  pulls in llvmlite): shared errors live in ``packager/errors.py``.

The runtime's own rule (it imports nothing from the compiler) is ``test_runtime_isolation.py``.
"""

from __future__ import annotations

from pathlib import Path

from source_tree import PACKAGES, ROOT, cycles
from source_tree import import_graph as typed_import_graph

EXPORT_DRIVER = "mlcpack.packager.export"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the mlcpack modules it imports anywhere in its body but under
    ``if TYPE_CHECKING:`` (``source_tree``'s walk, shared with test_layers.py)."""
    return {name: {m for m, how in deps.items() if how != "typing"}
            for name, deps in typed_import_graph(root).items()}


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_the_tree_is_read() -> None:
    graph = import_graph()
    assert len(graph) > 80
    assert "mlcpack.frontends.onnx.registry" in graph["mlcpack.frontends.onnx.importer"]
    assert "mlcpack.runtime.errors" in graph["mlcpack.runtime.model"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(c, graph) for c in found)


def test_frontends_never_import_the_export_driver() -> None:
    graph = import_graph()
    offenders = sorted(m for m, deps in graph.items()
                       if m.startswith("mlcpack.frontends") and EXPORT_DRIVER in deps)
    assert not offenders, f"{offenders} import {EXPORT_DRIVER}; take ExportError from " \
                          "mlcpack.packager.errors and leave exporting to the packager"


def test_the_checks_would_catch_offenders(tmp_path: Path) -> None:
    """A lazy two-module cycle and a frontend importing the export driver are both found."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "packager" / "export.py").write_text("from .errors import ExportError\n")
    (tmp_path / "packager" / "errors.py").write_text(
        "def late():\n    from . import export\n")
    (tmp_path / "packager" / "gemm.py").write_text(
        "def pick():\n    from .depthwise import emit\n")
    (tmp_path / "packager" / "depthwise.py").write_text("from . import gemm\n")
    (tmp_path / "frontends" / "api.py").write_text(
        "def go():\n    from ..packager.export import ExportError\n")
    (tmp_path / "frontends" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..packager import export\n")
    graph = import_graph(tmp_path)
    assert sorted(cycles(graph)) == [
        ["mlcpack.packager.depthwise", "mlcpack.packager.gemm"],
        ["mlcpack.packager.errors", "mlcpack.packager.export"]]
    assert EXPORT_DRIVER in graph["mlcpack.frontends.api"]
    assert EXPORT_DRIVER not in graph["mlcpack.frontends.typed"]
