"""The source tree as the house tests read it (ast, never imported): every module of the three
packages, its syntax tree parsed once per test run, and what it imports, with how.

``test_layers.py`` (the layers, cycles counting ``TYPE_CHECKING``) and ``test_import_structure.py``
(cycles and the frontends' imports at run time) share this one walk: the tree is parsed once
however many of their tests run. A test that writes a tree of its own (under ``tmp_path``) gets
its files parsed as they are then.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Collection, Mapping

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"runtime": "mlcpack.runtime", "packager": "mlcpack.packager",
            "frontends": "mlcpack.frontends"}

RANK = {"top": 0, "lazy": 1, "typing": 2}


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


def syntax_tree(path: Path) -> ast.Module:
    """``path`` parsed (once for each content of the file)."""
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parse(path: Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def top_packages(path: Path) -> frozenset[str]:
    """The top-level packages the module at ``path`` imports anywhere (``llvmlite``, ``numpy``;
    a relative import as "")."""
    stat = path.stat()
    return _top_packages(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _top_packages(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    found = set()
    for n in ast.walk(_parse(path, mtime_ns, size)):
        if isinstance(n, ast.Import):
            found.update(a.name.split(".")[0] for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            found.add("" if n.level else (n.module or "").split(".")[0])
    return frozenset(found)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, modules: dict[str, Path]) -> dict[str, str]:
    """The mlcpack modules module ``name`` imports anywhere in its body, each with how:
    "top", "lazy" (inside a function) or "typing" (under ``if TYPE_CHECKING:``); a module
    imported in several ways has the strongest (top, then lazy)."""
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, str] = {}

    def add(target: str | None, how: str) -> None:   # the strongest kind of import wins
        if target and target != name and RANK[how] < RANK[found.get(target, "typing")] + \
                (target not in found):
            found[target] = how

    def visit(node: ast.AST, how: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = how
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = "typing"
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and how == "top":
                inner = "lazy"
            if isinstance(child, ast.Import):
                for a in child.names:
                    add(_known(a.name, modules), how)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base_name = ".".join(base + ([child.module] if child.module else []))
                else:
                    base_name = child.module or ""
                for alias in child.names:  # ``from . import x`` imports the module x
                    add(_known(f"{base_name}.{alias.name}", modules), how)
            visit(child, inner)

    visit(syntax_tree(path), "top")
    return found


def import_graph(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Module -> {imported module: how} for every module under ``root``, computed once for
    each state of the files (a copy: callers may change it)."""
    modules = module_files(root)
    stamps = tuple((name, path, path.stat().st_mtime_ns, path.stat().st_size)
                   for name, path in modules.items())
    return {name: dict(deps) for name, deps in _import_graph(stamps).items()}


@functools.cache
def _import_graph(stamps: tuple) -> dict[str, dict[str, str]]:
    modules = {name: path for name, path, _, _ in stamps}
    return {name: imports_of(name, modules) for name in modules}


def cycles(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Modules on a cycle, as sorted strongly connected components of ``graph`` (module ->
    the modules it imports), Kosaraju's algorithm."""
    order: list[str] = []
    seen: set[str] = set()
    for start in sorted(graph):   # Kosaraju: finish order, then the reversed graph
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            node, edges = stack[-1]
            for nxt in edges:
                if nxt not in seen and nxt in graph:
                    seen.add(nxt)
                    stack.append((nxt, iter(sorted(graph[nxt]))))
                    break
            else:
                stack.pop()
                order.append(node)
    reverse: dict[str, set[str]] = {n: set() for n in graph}
    for n, deps in graph.items():
        for d in deps:
            if d in reverse:
                reverse[d].add(n)
    found, assigned = [], set()
    for start in reversed(order):
        if start in assigned:
            continue
        component, todo = [], [start]
        assigned.add(start)
        while todo:
            n = todo.pop()
            component.append(n)
            for m in reverse[n] - assigned:
                assigned.add(m)
                todo.append(m)
        if len(component) > 1:
            found.append(sorted(component))
    return found
