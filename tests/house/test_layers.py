"""The layers, lowest first, read statically (ast) from the source tree:

    runtime < ir < ops < passes / codegen < emit < frontends < drivers

An import only goes down or stays in its layer, counting imports inside functions (a lazy import
that reaches up is still a dependency) and ``if TYPE_CHECKING:`` imports (a type that has to be
imported from above lives in the wrong module). Besides: a graph pass never imports a code
generator module that brings llvmlite with it (directly or through what it imports; pure-Python
geometry such as ``codegen/contraction/geometry.py`` is fine), nothing below the drivers imports
a command line module, and there is no import cycle even counting ``TYPE_CHECKING`` imports.

``ALLOWED`` lists the exceptions that cannot be removed today, each with its reason; an entry
that no longer occurs fails the test, so the list only shrinks. Where each module belongs is
``layer_of``; docs/architecture.md "The layers" says the same in prose.
"""

from __future__ import annotations

from pathlib import Path

from source_tree import PACKAGES, ROOT, cycles, import_graph, module_files, top_packages

LAYERS = ("runtime", "ir", "ops", "passes/codegen", "emit", "frontends", "drivers")
# the compiler's shared leaves: its version (packager/__init__.py) and its error class
IR_LEAVES = {"mlcpack.packager", "mlcpack.packager.errors"}
# the settings passes and codegen are compiled with (CompileOptions)
PASS_LAYER = {"mlcpack.packager.options"}
EMIT = {"mlcpack.packager.vm_emit", "mlcpack.packager.bundle_writer", "mlcpack.packager.signing"}
# what a command line is made of: nothing below the drivers may import these
COMMAND_LINES = {"mlcpack.runtime.commands", "mlcpack.runtime.cli", "mlcpack.packager.cli"}

# (importer, imported): why it stays for now.
ALLOWED = {
    ("mlcpack.packager.ir.builder", "mlcpack.packager.ops"):
        "BlockBuilder.emit_op infers each call's type with the op table, whose rows are built "
        "on the IR; a table handed to the builder would remove it",
    ("mlcpack.packager.ir.invariants", "mlcpack.packager.ops"):
        "verify_module re-infers each call's type with the op table (as emit_op)",
}


def layer_of(name: str) -> int:
    """The layer (an index into ``LAYERS``) of module ``name``."""
    parts = name.split(".")
    top, sub = parts[1], parts[2] if len(parts) > 2 else ""
    if top == "runtime":
        return 0
    if top == "frontends":
        return 5
    if name in IR_LEAVES or sub == "ir":
        return 1
    if sub == "ops":
        return 2
    if sub in ("passes", "codegen") or name in PASS_LAYER:
        return 3
    if name in EMIT:
        return 4
    return 6   # api, export, golden, calibrate, cli, precision, torch_export, timings...


def llvm_modules(graph: dict[str, dict[str, str]], root: Path = ROOT) -> set[str]:
    """The modules that import llvmlite, directly or through the mlcpack modules they import."""
    found = {name for name, path in module_files(root).items() if "llvmlite" in top_packages(path)}
    grew = True
    while grew:
        more = {name for name, deps in graph.items() if name not in found and set(deps) & found}
        found |= more
        grew = bool(more)
    return found


def violations(graph: dict[str, dict[str, str]], root: Path = ROOT
               ) -> dict[tuple[str, str], str]:
    """Every import that breaks a rule of the module docstring: (importer, imported) -> why."""
    out = {}
    llvm = llvm_modules(graph, root)
    for importer, deps in graph.items():
        low = layer_of(importer)
        for imported, how in deps.items():
            high = layer_of(imported)
            edge = (importer, imported)
            if high > low:
                out[edge] = f"{LAYERS[low]} imports {LAYERS[high]} ({how})"
            elif ".passes" in importer and ".codegen" in imported and imported in llvm:
                out[edge] = f"a graph pass imports llvmlite through the code generator ({how})"
            elif imported in COMMAND_LINES and low < 6 and importer not in COMMAND_LINES:
                out[edge] = f"{LAYERS[low]} imports a command line module ({how})"
    return out


def test_every_module_has_a_layer() -> None:
    graph = import_graph()
    assert len(graph) > 100
    assert layer_of("mlcpack.runtime.model") == 0 and layer_of("mlcpack.packager.ir.te") == 1
    assert layer_of("mlcpack.packager.ops.nn") == 2 and layer_of("mlcpack.packager.codegen.build") == 3
    assert layer_of("mlcpack.packager.vm_emit") == 4 and layer_of("mlcpack.frontends.loader") == 5
    assert {layer_of(m) for m in ("mlcpack.packager.api", "mlcpack.packager.export",
                                  "mlcpack.packager.golden", "mlcpack.packager.calibrate",
                                  "mlcpack.packager.cli")} == {6}


def test_imports_only_go_down() -> None:
    found = violations(import_graph())
    new = {edge: why for edge, why in found.items() if edge not in ALLOWED}
    assert not new, "imports that break the layers:\n" + "\n".join(
        f"  {a} -> {b}: {why}" for (a, b), why in sorted(new.items()))


def test_every_exception_still_exists_and_says_why() -> None:
    found = violations(import_graph())
    gone = sorted(edge for edge in ALLOWED if edge not in found)
    assert not gone, f"ALLOWED lists imports that no longer break a rule; remove them: {gone}"
    assert all(len(why) > 40 for why in ALLOWED.values())


def test_no_cycle_counting_type_checking_imports() -> None:
    """No two modules reach each other, TYPE_CHECKING and lazy imports counted (frontends/onnx:
    ``symvalue.py`` reads the dtype table from the leaf ``dtypes.py``, not ``common.py``, whose
    helpers name ``registry.NodeContext``, which folds through ``symvalue``)."""
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(", ".join(c) for c in found)


def test_the_rules_find_what_they_forbid(tmp_path: Path) -> None:
    """An upward lazy import, an upward TYPE_CHECKING import, a pass importing codegen, a
    frontend importing a command line, and a TYPE_CHECKING cycle are all found."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    for sub in ("ir", "ops", "passes", "codegen"):
        (tmp_path / "packager" / sub).mkdir()
        (tmp_path / "packager" / sub / "__init__.py").write_text("")
    (tmp_path / "packager" / "ir" / "graph.py").write_text(
        "def late():\n    from ..ops import nn\n")
    (tmp_path / "packager" / "ops" / "nn.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..export import X\n")
    (tmp_path / "packager" / "passes" / "layout.py").write_text(
        "from ..codegen import gemm, geometry\n")
    (tmp_path / "packager" / "codegen" / "gemm.py").write_text("from . import build\n")
    (tmp_path / "packager" / "codegen" / "build.py").write_text("import llvmlite.ir\n")
    (tmp_path / "packager" / "codegen" / "geometry.py").write_text("from ..ir import graph\n")
    (tmp_path / "packager" / "export.py").write_text("from .ops import nn\n")
    (tmp_path / "runtime" / "commands.py").write_text("")
    (tmp_path / "frontends" / "loader.py").write_text("from ..runtime import commands\n")
    graph = import_graph(tmp_path)
    found = violations(graph, tmp_path)
    assert found[("mlcpack.packager.ir.graph", "mlcpack.packager.ops.nn")] == \
        "ir imports ops (lazy)"
    assert found[("mlcpack.packager.ops.nn", "mlcpack.packager.export")] == \
        "ops imports drivers (typing)"
    assert "llvmlite" in found[("mlcpack.packager.passes.layout",
                                "mlcpack.packager.codegen.gemm")]
    assert ("mlcpack.packager.passes.layout", "mlcpack.packager.codegen.geometry") not in found
    assert "command line" in found[("mlcpack.frontends.loader", "mlcpack.runtime.commands")]
    assert ("mlcpack.packager.export", "mlcpack.packager.ops.nn") not in found
    assert cycles(graph) == [["mlcpack.packager.export", "mlcpack.packager.ops.nn"]]
