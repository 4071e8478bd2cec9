"""The house's import structure, read statically (ast) from the source tree, so that what was
untangled stays untangled:

- no import cycle among mlcpack's modules, counting imports inside functions too (a lazy import
  that hides a cycle is still a cycle; only ``if TYPE_CHECKING:`` blocks are left out);
- ``frontends/`` builds IR and never imports the export driver (``packager/export.py``, which
  pulls in llvmlite): shared errors live in ``packager/errors.py``.

The runtime's own rule (it imports nothing from the compiler) is ``test_runtime_isolation.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"runtime": "mlcpack.runtime", "packager": "mlcpack.packager",
            "frontends": "mlcpack.frontends"}
EXPORT_DRIVER = "mlcpack.packager.export"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the three packages under ``root``."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, modules: dict[str, Path]) -> set[str]:
    """The mlcpack modules that module ``name`` imports, anywhere in its body."""
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(filter(None, (_known(a.name, modules) for a in child.names)))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base_name = ".".join(base + ([child.module] if child.module else []))
                else:
                    base_name = child.module or ""
                for alias in child.names:  # ``from . import x`` imports the module x
                    found.update(filter(None, [_known(f"{base_name}.{alias.name}", modules)]))
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(name)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imports_of(name, modules) for name in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


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
