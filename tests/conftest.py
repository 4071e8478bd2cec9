"""Shared fixtures: the demo MLP exported once per session, an export helper for weights, and a
runner for the real ``mlcpack`` executable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
SAMPLES = ARTIFACTS / "samples"
MLP_PICKLE = ARTIFACTS / "mlp_params.pkl"
LABELS = ARTIFACTS / "labels.txt"
BIN = Path(sys.executable).parent
MLCPACK_EXE = BIN / "mlcpack"

# Test modules live in folders by layer (tests/kernels, tests/runtime, ...), helpers at the top:
# tests/ and each folder on sys.path, so ``from helpers import ...`` and a test module imported
# by its bare name (``from test_symbolic_memory_plans import mlp_model``) work from any folder.
for _folder in [Path(__file__).resolve().parent, *sorted(
        p for p in Path(__file__).resolve().parent.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and any(p.glob("test_*.py")))]:
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))


# The tiers: ``MLCPACK_SLOW=1`` adds what the default run (CI, on 2 cores, under 30 minutes)
# leaves out: every conformance case through the command line both ways
# (test_golden_default_path), every corpus model exported without onnxruntime too
# (test_corpus), the model-zoo networks of ONNX's backend suite (this module's
# collect_ignore; each is tens of seconds, and the corpus covers real networks), and the whole
# compile sweep of every kernel family for every level (test_compile_levels).
SLOW = os.environ.get("MLCPACK_SLOW", "") not in ("", "0")
collect_ignore = [] if SLOW else ["corpus/test_onnx_model_zoo.py"]

# cpuinfo flag sets of the x86-64 levels, as MLCPACK_CPU_FEATURES spells them.
X86_V2 = "fpu,cx8,cmov,fxsr,mmx,sse,sse2,cx16,lahf_lm,popcnt,sse4_1,sse4_2,ssse3,pni"
X86_V3 = X86_V2 + ",avx,avx2,bmi1,bmi2,f16c,fma,abm,movbe,xsave"
X86_V4 = X86_V3 + ",avx512f,avx512bw,avx512cd,avx512dq,avx512vl"


def pytest_configure(config: pytest.Config) -> None:
    """One compiled-object cache (packager/codegen/cache.py) for this test run, shared by the
    xdist workers and the command lines they start: the suite exports the same small models
    many times (the conformance cases again through the command line's default path, the demo
    MLP in many tests), and LLVM is most of an export's time. The cache starts empty, so the
    first export of every module in a run really runs LLVM; it is removed at the end."""
    if hasattr(config, "workerinput") or os.environ.get("MLCPACK_CACHE_DIR"):
        return   # an xdist worker inherits the controller's; or the user chose one
    import tempfile
    directory = tempfile.mkdtemp(prefix="mlcpack-test-objects-")
    os.environ["MLCPACK_CACHE_DIR"] = directory
    config.stash[_CACHE_KEY] = directory


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_CACHE_KEY, None)
    if directory is not None:
        import shutil
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop("MLCPACK_CACHE_DIR", None)


_CACHE_KEY = pytest.StashKey[str]()


def mlp_reference(weights: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The float64 numpy reference of the MLP that keys w0, b0, ..., wN, bN describe."""
    h = np.asarray(x, dtype=np.float64)
    n = sum(1 for k in weights if k.startswith("w"))
    for i in range(n):
        h = h @ weights[f"w{i}"].astype(np.float64).T + weights[f"b{i}"].astype(np.float64)
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return h


def _export_weights(weights: Mapping[str, np.ndarray], path: str | os.PathLike, *,
                    spec: dict | None = None, input_shape: tuple[int, ...] | None = None,
                    target: str | None = "host", labels: Sequence[str] | None = None) -> Path:
    """Export ``weights`` (an inferred MLP, or ``spec``) to ``path`` the way the CLI does, for
    this host's level (``target=None``: the CLI's portable default)."""
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime.model import TensorSpec
    from mlcpack.runtime.preprocess import default_preprocess

    spec = spec if spec is not None else infer_mlp_spec(weights)
    mod = build_from_spec(spec, weights, input_shape)
    first = mod.main.params[0]
    pre = default_preprocess(TensorSpec(first.name, first.type.shape, first.type.dtype, 0))
    export_module(mod, path, ExportOptions(target=target, preprocess=pre, labels=labels,
                                           model_name=Path(path).stem))
    return Path(path)


@pytest.fixture(scope="session")
def export_weights() -> Callable[..., Path]:
    """``export_weights(weights, path, spec=None, input_shape=None, target=None, labels=None)``."""
    return _export_weights


@pytest.fixture(scope="session")
def mlp_weights() -> dict[str, np.ndarray]:
    from mlcpack.frontends.weights import load_weights

    return load_weights(MLP_PICKLE)


@pytest.fixture(scope="session")
def mlp_bundle(tmp_path_factory: pytest.TempPathFactory, mlp_weights: dict[str, np.ndarray]
               ) -> tuple[Path, dict[str, np.ndarray]]:
    """The demo MLP (artifacts/mlp_params.pkl) exported once for this machine, with labels:
    ``(bundle path, weights)``. Tests must not modify the file (copy it first)."""
    labels = [line.strip() for line in LABELS.read_text().splitlines() if line.strip()]
    path = tmp_path_factory.mktemp("mlp") / "mlp.mlc"
    _export_weights(mlp_weights, path, labels=labels)
    return path, mlp_weights


@pytest.fixture(scope="session")
def mlp_bundle_bytes(mlp_bundle: tuple[Path, dict]) -> bytes:
    return mlp_bundle[0].read_bytes()


def _run_cli(*args: str | os.PathLike, env: Mapping[str, str] | None = None,
             cwd: str | os.PathLike | None = None, timeout: float = 60,
             module: bool = False) -> subprocess.CompletedProcess:
    """Run the real ``mlcpack`` executable (or ``python -m mlcpack.packager.cli`` when
    ``module``) with ``env`` added to this process's environment."""
    full_env = dict(os.environ)
    for key in ("MLCPACK_CPU_FEATURES", "MLCPACK_CPU_ARCH", "MLCPACK_NUM_THREADS"):
        full_env.pop(key, None)
    full_env.update(env or {})
    cmd = ([sys.executable, "-m", "mlcpack.packager.cli"] if module else [str(MLCPACK_EXE)])
    return subprocess.run(cmd + [os.fspath(a) for a in args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="session")
def run_cli() -> Callable[..., subprocess.CompletedProcess]:
    """``run_cli("infer", bundle, image, env={...}, cwd=...)`` -> CompletedProcess (text)."""
    return _run_cli


def assert_one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The process failed with exactly one stderr line "error: ..." and no traceback."""
    assert proc.returncode != 0, proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


@pytest.fixture(scope="session")
def one_line_error() -> Callable[[subprocess.CompletedProcess], str]:
    return assert_one_line_error


@pytest.fixture(scope="session")
def reference_mlp() -> Callable[[Mapping[str, np.ndarray], np.ndarray], np.ndarray]:
    """``reference_mlp(weights, x)``: the float64 numpy MLP reference."""
    return mlp_reference


@pytest.fixture(scope="session")
def x86_levels() -> dict[str, str]:
    """MLCPACK_CPU_FEATURES values for x86-64-v2/v3/v4 hosts."""
    return {"x86-64-v2": X86_V2, "x86-64-v3": X86_V3, "x86-64-v4": X86_V4}


@pytest.fixture()
def register_blocked_conv(monkeypatch) -> None:
    """Exports in the test keep ``nn.conv2d`` (the register-blocked kernel, codegen/contraction/)
    where an AVX2 target would pack the weights for codegen/conv_oc.py: that kernel still serves
    AVX-512, aarch64, 1x1 and symbolic convolutions, and its tests cover its paths."""
    import mlcpack.packager.codegen.conv_oc as conv_oc   # CompileOptions.for_targets reads it
    monkeypatch.setattr(conv_oc, "packs_conv_weights", lambda targets: False)


@pytest.fixture(scope="session")
def paths() -> dict[str, Path]:
    return {"root": ROOT, "artifacts": ARTIFACTS, "samples": SAMPLES, "mlp_pickle": MLP_PICKLE,
            "labels": LABELS, "mlcpack": MLCPACK_EXE}


@pytest.fixture()
def mapped(monkeypatch) -> list:
    """Records every call of ``elf.load_object`` (still loading, so good bundles run): a test
    can then show that a refused bundle never had its code mapped."""
    from mlcpack.runtime import elf

    calls: list = []
    real = elf.load_object

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(elf, "load_object", spy)
    return calls


# The modules that take minutes (measured with --durations on 2 cores), run first: with
# ``-n 2 --dist loadscope`` a worker takes whole modules in collection order, so a long module
# collected last runs alone at the end while the other worker idles (about 4 minutes of the
# CI run). Longest first, the short ones fill the gaps. Order only; every test still runs.
LONG_MODULES = (
    "export/test_golden_check_on_the_cli_default.py",
    "docs/test_docs_examples.py",
    "corpus/test_corpus.py",
    "corpus/test_pytorch_models.py",
    "corpus/test_symbolic_models.py",
    "cli/test_cli.py",
    "kernels/test_register_blocked_kernels.py",
    "runtime/test_c_runtime.py",
    "targets/test_fat_bundles.py",
    "frontends/test_torch_frontend.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = Path(str(item.fspath)).resolve()
        try:
            rel = path.relative_to(ROOT / "tests").as_posix()
        except ValueError:
            return len(LONG_MODULES)
        return LONG_MODULES.index(rel) if rel in LONG_MODULES else len(LONG_MODULES)
    items.sort(key=rank)   # stable: the order within a module and among the rest is kept
