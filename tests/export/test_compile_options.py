"""The compiler's settings are arguments: one frozen ``CompileOptions`` (packager/options.py).

- No hidden state in the compiler (packager/, frontends/): no context variable, no environment
  read outside the entries, no ``global`` statement, no attribute stored on another library's
  object, no module-level container written after import besides the op and converter tables.
- The options object is frozen and validated; ``run_pipeline`` requires it, and the options an
  export uses by default are ``CompileOptions()``.
- Two exports in one process with different options do not leak into each other, and neither do
  two imports' relations between symbolic dims.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import onnx_mlp
from mlcpack.frontends.onnx.importer import import_onnx
from mlcpack.packager.export import ExportOptions, compile_variants, export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.ir.printer import module_text
from mlcpack.packager.ir.sym import size_var
from mlcpack.packager.options import CompileOptions, OptionsError
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
COMPILER = ("packager", "frontends")

# Where the environment may be read: the command line, the export API (packager/api.py) and
# export's Python entries (into CompileOptions, once), and the golden check's test hook
# (MLCPACK_NO_ORT, read where the reference is chosen).
ENV_READERS = {"packager/cli.py", "packager/api.py", "packager/export.py",
               "frontends/reference.py"}
# No ``global`` statement (the forked compile workers of codegen/parallel.py get their job as
# arguments).
GLOBALS: set[tuple[str, str]] = set()
# Module-level containers that functions write: the tables decorators fill at import.
TABLES = {("packager/ops/registry.py", "OPS"), ("frontends/onnx/registry.py", "_TABLE"),
          ("frontends/torch/registry.py", "_TABLE")}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "add",
            "setdefault", "remove", "discard", "set", "reset"}
COMPILE_ENV = ("MLCPACK_INT8_KERNELS", "MLCPACK_INT8_FLOAT_CONVS", "MLCPACK_VNNI_EMULATE",
               "MLCPACK_SYMBOLIC_GENERIC", "MLCPACK_PARALLEL_COMPILE", "MLCPACK_CACHE_DIR",
               "MLCPACK_TEST_LLVM_ABORT")


def _sources():
    for top in COMPILER:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _module_containers(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp,
                              ast.SetComp)) or (isinstance(value, ast.Call) and ast.unparse(
                                  value.func).split(".")[-1] in ("list", "dict", "set",
                                                                 "defaultdict", "Counter")):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {ast.unparse(t) for t in targets}
    return names


def hidden_state() -> list[str]:
    """Every violation of the rules above, as ``file:line what``."""
    found = []
    for rel, tree in _sources():
        containers = _module_containers(tree)
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    "contextvars" in (a.name or "") for a in node.names) \
                    or isinstance(node, ast.ImportFrom) and node.module == "contextvars":
                found.append(f"{where} imports contextvars")
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv") \
                    and ast.unparse(node.value) == "os" and rel not in ENV_READERS:
                found.append(f"{where} reads the environment ({ast.unparse(node)})")
            if isinstance(node, ast.Global):
                found += [f"{where} global {n}" for n in node.names if (rel, n) not in GLOBALS]
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and node.attr.startswith("mlcpack"):
                found.append(f"{where} stores {ast.unparse(node)} on another library's object")
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" \
                    and node.args and ast.unparse(node.args[0]) not in ("self", "cls"):
                found.append(f"{where} setattr on {ast.unparse(node.args[0])}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    target = None
                    if isinstance(inner, ast.Subscript) and isinstance(inner.ctx,
                                                                       (ast.Store, ast.Del)):
                        target = ast.unparse(inner.value)
                    elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) \
                            and inner.func.attr in MUTATORS:
                        target = ast.unparse(inner.func.value)
                    if target in containers and (rel, target) not in TABLES:
                        found.append(f"{rel}:{inner.lineno} {node.name} writes the "
                                     f"module-level {target}")
    return found


def test_the_compiler_keeps_no_hidden_state() -> None:
    assert hidden_state() == []


def test_the_rule_finds_what_it_forbids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan above on a compiler that breaks every rule once."""
    bad = tmp_path / "packager"
    bad.mkdir()
    (tmp_path / "frontends").mkdir()
    (bad / "bad.py").write_text(
        "import contextvars\nimport os\nFLAG = contextvars.ContextVar('f')\nSEEN = []\n"
        "def f(module):\n    global FLAG\n    SEEN.append(os.environ.get('X'))\n"
        "    module.mlcpack_features = ''\n    setattr(module, 'x', 1)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = " | ".join(hidden_state())
    for what in ("imports contextvars", "reads the environment", "global FLAG",
                 "stores module.mlcpack_features", "setattr on module",
                 "writes the module-level SEEN"):
        assert what in found, found


def test_options_are_frozen_and_validated() -> None:
    options = CompileOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.winograd = False   # type: ignore[misc]
    assert options.replace(winograd=False).winograd is False and options.winograd is True
    assert CompileOptions(precision="fp32").precision == "fp32"
    assert CompileOptions(precision="bf16").precision == "bf16"
    with pytest.raises(OptionsError, match="precision 'fp16' is not supported; choose fp32 or bf16"):
        CompileOptions(precision="fp16")
    with pytest.raises(OptionsError, match="bf16_keep"):
        CompileOptions(bf16_keep={"w"})
    with pytest.raises(OptionsError, match="conv_row_widths"):
        CompileOptions(conv_row_widths=[8])   # type: ignore[arg-type]
    hash(options)   # frozen and hashable: one object shared by every pass and target


def test_environment_is_read_at_the_entries_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in COMPILE_ENV:
        monkeypatch.delenv(name, raising=False)
    # what an export uses with an empty environment is the default object, but for where the
    # compile cache lives (the user's cache directory; it never changes a bundle's bytes)
    default = ExportOptions().compile_options()
    assert default.replace(cache_dir=None) == CompileOptions()
    env = {"MLCPACK_INT8_KERNELS": "0", "MLCPACK_INT8_FLOAT_CONVS": "0",
           "MLCPACK_VNNI_EMULATE": "1",
           "MLCPACK_SYMBOLIC_GENERIC": "1", "MLCPACK_PARALLEL_COMPILE": "0",
           "MLCPACK_CACHE_DIR": "/tmp/objects", "MLCPACK_TEST_LLVM_ABORT": "softmax:always"}
    assert CompileOptions.from_environ(env) == CompileOptions(
        int8_kernels=False, int8_float_convs=False, vnni_emulate=True, symbolic_generic=True,
        parallel_compile=False, cache_dir="/tmp/objects", llvm_abort="softmax:always")
    assert CompileOptions.from_environ(env, int8_kernels=True).int8_kernels is True
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert ExportOptions(target="x86-64-v3").compile_options() == CompileOptions.from_environ(
        env, target="x86-64-v3")
    given = CompileOptions(winograd=False)   # given options: the environment is not read
    assert ExportOptions(compile=given).compile_options() == given
    given = CompileOptions(target="x86-64-v3", verify_ir=False)   # ExportOptions' own fields
    assert ExportOptions(compile=given).compile_options() == given
    assert ExportOptions(target="aarch64", compile=given).compile_options().target == "aarch64"
    assert ExportOptions(verify_ir=False).compile_options().verify_ir is False
    # --precision and the bf16 guard's kept layers are ExportOptions' own fields too
    bf16 = ExportOptions(compile=given, precision="bf16", bf16_keep=frozenset({"w1"}))
    assert bf16.compile_options() == given.replace(precision="bf16", bf16_keep=frozenset({"w1"}))
    assert ExportOptions(compile=given.replace(precision="bf16")).compile_options() == given


def _mlp_module(batch: int = 4):
    rng = np.random.default_rng(0)
    model = onnx_mlp(rng.standard_normal((32, 64)).astype(np.float32),
                     rng.standard_normal(64).astype(np.float32),
                     rng.standard_normal((16, 64)).astype(np.float32),
                     rng.standard_normal(16).astype(np.float32), batch)
    return import_onnx(model)[0]


def test_run_pipeline_needs_options_and_chooses_as_export_does() -> None:
    mod = _mlp_module()
    with pytest.raises(TypeError, match="options"):
        run_pipeline(mod, DEFAULT_PIPELINE)   # type: ignore[call-arg]
    for target in ("x86-64-v3", "x86-64-v4"):
        alone = run_pipeline(mod, options=CompileOptions(target=target))
        exported, _, _ = compile_variants(mod, target=target, options=CompileOptions())
        assert module_text(alone) == module_text(exported)
    # the layout choices left to the targets are made for them: packed panels on AVX2 only
    assert "matmul_packed" in module_text(run_pipeline(mod, options=CompileOptions(
        target="x86-64-v3")))
    assert "matmul_packed" not in module_text(run_pipeline(mod, options=CompileOptions(
        target="x86-64-v3", pack_matmul_weights=False)))


def test_two_exports_with_other_options_do_not_leak(tmp_path: Path) -> None:
    mod = _mlp_module()

    def export(name: str, options: CompileOptions) -> bytes:
        path = tmp_path / f"{name}.mlc"
        export_module(mod, path, ExportOptions(target="x86-64-v3", compile=options))
        return path.read_bytes()

    first = export("first", CompileOptions())
    other = export("other", CompileOptions(pack_matmul_weights=False, one_row_gemv=False))
    again = export("again", CompileOptions())
    assert other != first     # the options took effect...
    assert again == first     # ...and left nothing behind


def _symbolic_reshape_model():
    """x [1, W] -> reshape to [1, W // 2, 2]: holds for even W only (a relation)."""
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "halves",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, -1, 2], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_relations_are_held_by_the_module_that_needs_them() -> None:
    mod, _ = import_onnx(_symbolic_reshape_model())
    assert mod.relations and all(r[0] == "eq" and "reshape" in r[3] for r in mod.relations)
    # the next module built in this process starts with none of them
    assert _mlp_module().relations == []
    bb = BlockBuilder()
    w = size_var("W")
    x = bb.input("x", (1, w))
    with bb.function("main", [x]):
        with bb.dataflow():   # 2 (W // 2) == W: W even, assumed
            y = bb.emit_output(bb.emit_op("reshape", x, shape=(w // 2, 2)))
        bb.emit_func_output(y)
    built = bb.get()
    assert len(built.relations) == 1 and built.relations[0][0] == "eq"
    # the passes keep them, nothing is added from elsewhere
    optimized = run_pipeline(built, options=CompileOptions(target="x86-64-v3"))
    assert optimized.relations == built.relations
