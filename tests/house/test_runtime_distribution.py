"""The runtime as its own distribution (``pip install ./runtime``: ``mlcpack-runtime``, command
``mlcpack-run``): its wheel holds the runtime only and requires numpy and msgpack only, and
``mlcpack-run`` answers like ``mlcpack`` (output and exit code) on good and bad input, with the
compiler, typer and rich unimportable."""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("llvmlite", "onnx", "onnxruntime", "torch", "typer", "rich", "click",
           "mlcpack.packager", "mlcpack.frontends")

SITECUSTOMIZE = f"""
import importlib.abc, sys

class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        for b in {BLOCKED!r}:
            if name == b or name.startswith(b + "."):
                raise ImportError("blocked by test: " + name)
        return None

sys.meta_path.insert(0, _Blocker())
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel ./runtime --no-deps`` built from a copy of runtime/ (the build writes its
    build/ and egg-info beside the sources), with this venv's setuptools: no network."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "runtime"
    shutil.copytree(ROOT / "runtime", src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                           "--no-build-isolation", "--no-index", "-w", str(work / "dist")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wheels = list((work / "dist").glob("mlcpack_runtime-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_the_runtime_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if ".dist-info/" not in n]
    # mlcpack/__init__.py (runtime/mlcpack_top: mlcpack.__version__) and the runtime
    assert code and all(n.startswith("mlcpack/runtime/") for n in code
                        if n != "mlcpack/__init__.py"), code
    assert "mlcpack/__init__.py" in code
    assert not [n for n in names if re.search(r"packager|frontends|llvmlite|onnx", n)]
    # every runtime module is in it, and nothing else from the repository
    shipped = {n.removeprefix("mlcpack/runtime/") for n in code if n != "mlcpack/__init__.py"}
    assert shipped == {p.name for p in (ROOT / "runtime").glob("*.py")}
    # a subpackage would be missing from both wheels unless listed in both pyproject files
    nested = [p for p in (ROOT / "runtime").glob("*/**/*.py")
              if not {"build", "__pycache__", "mlcpack_top"}
              & set(p.relative_to(ROOT / "runtime").parts) and ".egg-info" not in str(p)]
    assert not nested, f"list {nested[0].parent} in runtime/pyproject.toml and pyproject.toml"
    for n in code:
        text = zipfile.ZipFile(wheel).read(n).decode()
        assert not re.search(r"^\s*(from|import)\s+(\.\.|mlcpack\.(packager|frontends)|llvmlite"
                             r"|onnx)\b", text, re.M), n
        # typer and rich are not runtime dependencies: at most an optional import in a function
        assert not re.search(r"^(from|import)\s+(typer|rich)\b", text, re.M), n


def test_wheel_requires_numpy_and_msgpack_only(wheel: Path) -> None:
    zf = zipfile.ZipFile(wheel)
    meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    meta = email.message_from_bytes(zf.read(meta_name))
    assert meta["Name"] == "mlcpack-runtime"
    requires = meta.get_all("Requires-Dist") or []
    plain = sorted(re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in requires
                   if "extra ==" not in r)
    assert plain == ["msgpack", "numpy"], requires
    extras = {r.split("extra ==")[1].strip().strip("'\""): r for r in requires if "extra ==" in r}
    assert extras["images"].lower().startswith("pillow"), extras
    entry = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "mlcpack-run = mlcpack.runtime.cli:main" in zf.read(entry).decode()


# ---- mlcpack-run answers like mlcpack ----------------------------------------------------------

@pytest.fixture(scope="module")
def blocked_env(tmp_path_factory) -> dict[str, str]:
    """An environment whose Python cannot import the compiler, typer or rich."""
    folder = tmp_path_factory.mktemp("blocked")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLCPACK_")}
    env["PYTHONPATH"] = str(folder)
    return env


def _run_runtime_cli(args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlcpack.runtime.cli", *map(os.fspath, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_blocker_really_blocks(blocked_env) -> None:
    for module in ("typer", "llvmlite", "mlcpack.packager.cli"):
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                              text=True, env=blocked_env, timeout=60)
        assert proc.returncode != 0 and "blocked by test" in proc.stderr, module


@pytest.fixture(scope="module")
def cases(tmp_path_factory, mlp_bundle, export_weights, mlp_weights, paths) -> dict[str, list]:
    """name -> arguments, each run by both command lines."""
    folder = tmp_path_factory.mktemp("dist_cases")
    bundle = mlp_bundle[0]
    samples = paths["samples"]
    corrupt = folder / "corrupt.mlc"
    data = bytearray(bundle.read_bytes())
    data[-100] ^= 1
    corrupt.write_bytes(data)
    wrong = folder / "wrong.npy"
    np.save(wrong, np.zeros((1, 783), np.float32))
    two = folder / "two.npy"
    np.save(two, np.concatenate([np.load(samples / "digit_7.npy").reshape(1, 784),
                                 np.load(samples / "digit_3.npy").reshape(1, 784)]))
    batched = export_weights(mlp_weights, folder / "batched.mlc", input_shape=(2, 784),
                             labels=[str(i) for i in range(10)])
    golden = folder / "golden.mlc"
    proc = subprocess.run([str(paths["mlcpack"]), "export", paths["mlp_pickle"], "-o", golden,
                           "--labels", paths["labels"]], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {
        "infer png": ["infer", bundle, samples / "digit_7.png"],
        "infer npy -k 3": ["infer", bundle, samples / "digit_3.npy", "-k", "3"],
        "infer --json": ["infer", bundle, samples / "digit_3.npy", "--json"],
        "infer a batch of 2 (fixed batch bundle)": ["infer", batched, two, "-k", "2"],
        "infer missing input": ["infer", bundle, folder / "nope.png"],
        "infer missing bundle": ["infer", folder / "missing.mlc", samples / "digit_7.png"],
        "infer corrupt bundle": ["infer", corrupt, samples / "digit_7.npy"],
        "infer wrong shape": ["infer", bundle, wrong],
        "infer -k 0": ["infer", bundle, samples / "digit_7.npy", "-k", "0"],
        "infer --threads 0": ["infer", bundle, samples / "digit_7.npy", "--threads", "0"],
        "infer -k abc": ["infer", bundle, samples / "digit_7.npy", "-k", "abc"],
        "infer no input": ["infer", bundle],
        "inspect": ["inspect", golden],
        "inspect --json": ["inspect", golden, "--json"],
        "inspect --ir --json": ["inspect", golden, "--ir", "--json"],
        "inspect missing bundle": ["inspect", folder / "missing.mlc"],
        "verify": ["verify", golden],
        "verify no golden data": ["verify", bundle],
        "verify --rtol -1": ["verify", golden, "--rtol", "-1"],
        "bench --runs 3": ["bench", bundle, "--runs", "3"],
        "bench --json": ["bench", bundle, "--runs", "3", "--json"],
        "bench --runs 0": ["bench", bundle, "--runs", "0"],
        "bench --threads 0": ["bench", bundle, "--threads", "0"],
        "bench --profile --runs 0": ["bench", bundle, "--profile", "--runs", "0"],
        "bench --profile --top -1": ["bench", bundle, "--profile", "--top", "-1"],
        "unknown option": ["inspect", golden, "--colour"],
    }


EXPECTED_CODES = {
    "infer png": 0, "infer npy -k 3": 0, "infer --json": 0,
    "infer a batch of 2 (fixed batch bundle)": 0, "infer missing input": 7,
    "infer missing bundle": 3, "infer corrupt bundle": 3, "infer wrong shape": 7, "infer -k 0": 2,
    "infer --threads 0": 2, "infer -k abc": 2, "infer no input": 2, "inspect": 0,
    "inspect --json": 0, "inspect --ir --json": 0, "inspect missing bundle": 3, "verify": 0,
    "verify no golden data": 14, "verify --rtol -1": 2, "bench --runs 3": 0, "bench --json": 0,
    "bench --runs 0": 2, "bench --threads 0": 2, "bench --profile --runs 0": 2,
    "bench --profile --top -1": 2, "unknown option": 2,
}

# Timings differ from run to run; argparse and click word their own parsing errors.
_TIMES = re.compile(r"\d+\.\d+ (ms|us)|\"(load_ms|first_ms|min_us|p\d\d_us)\": [0-9.e+-]+")


@pytest.mark.parametrize("name", list(EXPECTED_CODES))
def test_mlcpack_run_answers_like_mlcpack(name, cases, blocked_env, run_cli) -> None:
    args = cases[name]
    ours = _run_runtime_cli(args, blocked_env)
    theirs = run_cli(*args)
    code = EXPECTED_CODES[name]
    assert (ours.returncode, theirs.returncode) == (code, code), (ours.stderr, theirs.stderr)
    assert "Traceback" not in ours.stderr + theirs.stderr
    if code == 0:
        assert _TIMES.sub("T", ours.stdout) == _TIMES.sub("T", theirs.stdout)
        assert ours.stdout.strip()
    elif name not in ("infer -k abc", "infer no input", "unknown option"):
        assert ours.stderr == theirs.stderr  # one "error: ..." line, word for word
        assert len(ours.stderr.splitlines()) == 1 and ours.stderr.startswith("error: ")
    else:  # parsing errors: one line from argparse (click prints its usage box)
        assert len(ours.stderr.splitlines()) == 1 and ours.stderr.startswith("error: ")


def test_mlcpack_run_help_and_version(blocked_env) -> None:
    proc = _run_runtime_cli(["--version"], blocked_env)
    assert proc.returncode == 0 and re.match(r"mlcpack-run \(mlcpack-runtime \S+\)", proc.stdout)
    for command in ("infer", "inspect", "verify", "bench"):
        proc = _run_runtime_cli([command, "-h"], blocked_env)
        assert proc.returncode == 0, proc.stderr
        assert f"example: mlcpack-run {command} " in proc.stdout
    proc = _run_runtime_cli([], blocked_env)
    assert proc.returncode == 2 and "infer" in proc.stdout


def test_mlcpack_run_bench_profile(cases, blocked_env, tmp_path) -> None:
    """The profiler through mlcpack-run, rich unimportable: the plain-text table and a trace."""
    import json

    bundle = cases["infer png"][1]
    trace = tmp_path / "t.json"
    proc = _run_runtime_cli(["bench", bundle, "--runs", "3", "--trace", trace], blocked_env)
    assert proc.returncode == 0, proc.stderr
    assert "3 runs" in proc.stdout and "mlc_" in proc.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X"]
    assert len(kernels) == 3 * 2, kernels  # 3 runs of the MLP's 2 VM instructions


def test_runtime_only_install(wheel: Path, blocked_env, tmp_path, cases) -> None:
    """The wheel alone, the compiler unimportable: the README's runtime-only example works
    (``mlcpack.__version__``), and a missing extra is named as the runtime's own."""
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--target", str(target), str(wheel)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = dict(blocked_env, PYTHONPATH=f"{target}{os.pathsep}{blocked_env['PYTHONPATH']}")
    code = ("import mlcpack, mlcpack.runtime; "
            "print(mlcpack.__version__, mlcpack.runtime.__version__, mlcpack.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    version, runtime_version, where = proc.stdout.split()
    assert version == runtime_version and where.startswith(str(target))
    # --trusted-key without cryptography: the runtime's extra, not the compiler's
    crypto = tmp_path / "crypto"
    crypto.mkdir()
    (crypto / "sitecustomize.py").write_text(SITECUSTOMIZE.replace(
        repr(BLOCKED), repr(BLOCKED + ("cryptography",))))
    assert "'cryptography'" in (crypto / "sitecustomize.py").read_text()
    env["PYTHONPATH"] = f"{target}{os.pathsep}{crypto}"
    key = tmp_path / "k.pub"
    key.write_text("not read")
    bundle, image = cases["infer png"][1:3]
    proc = subprocess.run([sys.executable, "-m", "mlcpack.runtime.cli", "infer", str(bundle),
                           str(image), "--trusted-key", str(key)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 12, proc.stderr
    assert "pip install 'cryptography>=42' (the runtime's [sign] extra)" in proc.stderr, \
        proc.stderr
    # the hint's package is the extra's
    text = (ROOT / "runtime" / "pyproject.toml").read_text()
    assert 'sign = ["cryptography>=42"]' in text and 'ray = ["ray[data]==2.40.0"]' in text
