"""The runtime never imports the compiler: statically (no such import in runtime/*.py) and
dynamically (it loads and runs a bundle, and the CLI infers/inspects, with the compiler's
modules made unimportable)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mlcpack.runtime import load

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
FORBIDDEN_TOP = {"llvmlite", "onnx", "onnxruntime", "torch", "packager", "frontends"}
FORBIDDEN_DOTTED = ("mlcpack.packager", "mlcpack.frontends")


def _forbidden(module: str) -> bool:
    top = module.split(".")[0]
    return top in FORBIDDEN_TOP or any(module == m or module.startswith(m + ".")
                                       for m in FORBIDDEN_DOTTED)


def _imports(path: Path) -> list[tuple[int, str, int]]:
    """(line, module, relative level) of every import statement in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.append((node.lineno, node.module or "", 0))
            else:
                # ``from .. import packager`` names the module in the alias.
                names = [node.module] if node.module else [a.name for a in node.names]
                out += [(node.lineno, name, node.level) for name in names]
        elif isinstance(node, ast.Call):  # __import__("x") / importlib.import_module("x")
            called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if called in ("__import__", "import_module") and node.args \
                    and isinstance(node.args[0], ast.Constant):
                out.append((node.lineno, str(node.args[0].value), 0))
    return out


RUNTIME_FILES = sorted(RUNTIME.glob("*.py"))


def test_runtime_files_found() -> None:
    names = {p.name for p in RUNTIME_FILES}
    assert {"__init__.py", "bundle.py", "model.py", "vm.py", "elf.py", "cpu.py",
            "library.py", "errors.py"} <= names


@pytest.mark.parametrize("path", RUNTIME_FILES, ids=lambda p: p.name)
def test_runtime_imports_nothing_from_the_compiler(path: Path) -> None:
    bad = []
    for line, module, level in _imports(path):
        if level == 0 and _forbidden(module):
            bad.append(f"{path.name}:{line}: import {module}")
        if level >= 2:  # from .. / from ... leaves mlcpack.runtime
            bad.append(f"{path.name}:{line}: relative import {'.' * level}{module or ''}")
        if level == 1 and module and module.split(".")[0] in FORBIDDEN_TOP:
            bad.append(f"{path.name}:{line}: from .{module}")
    assert not bad, "\n".join(bad)


def test_the_static_check_would_catch_offenders(tmp_path: Path) -> None:
    offender = tmp_path / "bad.py"
    offender.write_text(textwrap.dedent("""
        import llvmlite.binding
        from onnx import helper
        from mlcpack.packager import export
        from ..frontends import weights
        from .. import packager
        def f():
            import torch
            return __import__("onnxruntime")
    """))
    found = {(m, lvl) for _, m, lvl in _imports(offender)}
    assert {("llvmlite.binding", 0), ("onnx", 0), ("mlcpack.packager", 0), ("frontends", 2),
            ("packager", 2), ("torch", 0), ("onnxruntime", 0)} <= found
    assert all(_forbidden(m) or lvl >= 2 for m, lvl in found)


BLOCKER = """
import importlib.abc
import sys

BLOCKED = {blocked!r}
ALLOWED = {allowed!r}


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ALLOWED:
            return None
        for b in BLOCKED:
            if name == b or name.startswith(b + "."):
                raise ImportError(f"blocked by test: {{name}}")
        return None


sys.meta_path.insert(0, Blocker())
"""

ALL_COMPILER = ["llvmlite", "onnx", "onnxruntime", "torch", "mlcpack.packager",
                "mlcpack.frontends"]


def _blocker(blocked: list[str], allowed: list[str] = ()) -> str:
    return BLOCKER.format(blocked=tuple(blocked), allowed=tuple(allowed))


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MLCPACK_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def test_runtime_runs_a_bundle_with_the_compiler_unimportable(tmp_path, mlp_bundle) -> None:
    path, _ = mlp_bundle
    x = np.random.default_rng(7).random((1, 784), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    script = _blocker(ALL_COMPILER) + textwrap.dedent(f"""
        import json
        import numpy as np
        for name in {ALL_COMPILER!r}:
            try:
                __import__(name)
            except ImportError:
                pass
            else:
                raise SystemExit(f"the blocker let {{name}} through")
        from mlcpack.runtime import load
        x = np.load({str(tmp_path / "x.npy")!r})
        with load({str(path)!r}) as model:
            y = model(x)
        leaked = sorted(m for m in sys.modules
                        if m.split(".")[0] in ("llvmlite", "onnx", "onnxruntime", "torch")
                        or m.startswith(("mlcpack.packager", "mlcpack.frontends")))
        print(json.dumps({{"y": y.tobytes().hex(), "shape": y.shape, "leaked": leaked}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["leaked"] == []
    with load(path) as model:
        expected = model(x)
    got = np.frombuffer(bytes.fromhex(result["y"]), dtype=np.float32).reshape(result["shape"])
    np.testing.assert_array_equal(got, expected)


@pytest.fixture()
def blocked_pythonpath(tmp_path: Path) -> dict[str, str]:
    """An environment whose sitecustomize.py blocks the compiler, except the CLI module."""
    site = tmp_path / "site"
    site.mkdir()
    blocked = ["llvmlite", "onnx", "onnxruntime", "torch", "mlcpack.frontends",
               "mlcpack.packager.export", "mlcpack.packager.codegen", "mlcpack.packager.passes",
               "mlcpack.packager.ir", "mlcpack.packager.ops", "mlcpack.packager.bundle_writer",
               "mlcpack.packager.vm_emit"]
    (site / "sitecustomize.py").write_text(_blocker(blocked) + textwrap.dedent("""
        import atexit

        def _report():
            leaked = sorted(m for m in sys.modules
                            if m.split(".")[0] in ("llvmlite", "onnx", "onnxruntime", "torch")
                            or m.startswith("mlcpack.frontends")
                            or m.startswith("mlcpack.packager.") and m != "mlcpack.packager.cli")
            sys.stderr.write(f"LEAKED={leaked}\\n" if leaked else "")

        atexit.register(_report)
    """))
    return _clean_env(PYTHONPATH=str(site))


def test_cli_infer_and_inspect_with_the_compiler_unimportable(blocked_pythonpath, mlp_bundle,
                                                              run_cli, paths) -> None:
    path, _ = mlp_bundle
    env = blocked_pythonpath
    proc = run_cli("infer", path, paths["samples"] / "digit_7.png", env=env, module=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "digit_7.png: 7"
    assert proc.stderr == ""

    proc = run_cli("inspect", path, env=env, module=True)
    assert proc.returncode == 0, proc.stderr
    assert "x [1, 784] float32" in proc.stdout and "kernels: 2" in proc.stdout
    assert proc.stderr == ""

    proc = run_cli("inspect", "--ir", path, env=env, module=True)
    assert proc.returncode == 0, proc.stderr
    assert "call_tir" in proc.stdout

    # The blocker is really active: export needs the compiler and fails without a traceback.
    proc = run_cli("export", paths["mlp_pickle"], "-o", Path(env["PYTHONPATH"]) / "m.mlc",
                   env=env, module=True)
    assert proc.returncode != 0
    assert "blocked by test" in proc.stderr
