"""An emulated arm64 Python for tests: Debian's qemu-user-static plus a folder holding Debian
arm64 packages of python3.11 and aarch64 wheels of numpy and msgpack.

Nothing system-wide changes except installing ``qemu-user-static`` when ``qemu-aarch64-static``
is missing (no binfmt registration is needed: the qemu binary is called directly). The root is
built with apt in a private state folder (own sources list, package lists, cache and an empty
dpkg status, so the host's apt and dpkg state stay as they were), unpacked with ``dpkg-deb -x``,
and cached in ``$MLCPACK_TEST_CACHE`` (default ``~/.cache/mlcpack-test``): built once (about a
minute), reused after. A registry that cannot be reached is an ``Arm64RootError`` that says so.

    root = ensure_arm64_root()
    proc = root.run_python(["-c", "import numpy"], pythonpath=[...])
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEBIAN_MIRROR = os.environ.get("MLCPACK_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBIAN_SUITE = "bookworm"  # its python3.11 matches the wheels' cp311 tag
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# libgcc_s provides __clear_cache to the ELF loader; numpy 2 links libstdc++.
PACKAGES = ("python3.11", "libgcc-s1", "libstdc++6")
WHEEL_PLATFORMS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64")  # bookworm has glibc 2.36
ROOT_VERSION = "2"  # bump to rebuild every cached root


class Arm64RootError(RuntimeError):
    """The emulator or the arm64 root could not be set up; the message says what to do."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "mlcpack-test"
    return Path(os.environ.get("MLCPACK_TEST_CACHE", default))


def _run(cmd: list[str], what: str, timeout: float = 300, **kwargs) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Arm64RootError(f"{what} failed: {exc}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise Arm64RootError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd[:4])} ...\n"
                             f"{tail}")
    return proc.stdout


def ensure_qemu() -> str:
    """Path of ``qemu-aarch64-static``, installing Debian's qemu-user-static if it is missing."""
    found = shutil.which("qemu-aarch64-static")
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise Arm64RootError("qemu-aarch64-static is missing and cannot be installed here (needs "
                             "apt-get as root): install Debian's qemu-user-static")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "update"], "apt-get update (is the Debian mirror reachable?)", env=env)
    _run(["apt-get", "install", "-y", "--no-install-recommends", "qemu-user-static"],
         "installing qemu-user-static", env=env)
    found = shutil.which("qemu-aarch64-static")
    if not found:
        raise Arm64RootError("qemu-user-static was installed but qemu-aarch64-static is not on PATH")
    return found


@dataclass(frozen=True)
class Arm64Root:
    path: Path   # the root: usr/bin/python3.11, lib/ld-linux-aarch64.so.1, ...
    site: Path   # numpy and msgpack, unpacked from their wheels
    qemu: str

    @property
    def python(self) -> Path:
        return self.path / "usr" / "bin" / "python3.11"

    def run_python(self, args: list[str], pythonpath: list[Path] | None = None,
                   env: dict[str, str] | None = None, timeout: float = 180
                   ) -> subprocess.CompletedProcess:
        """Run the arm64 python3.11 under qemu with ``args``; ``pythonpath`` goes before the
        wheels' folder. The host's MLCPACK_* and PYTHON* variables are not passed on."""
        cmd = [self.qemu, "-L", str(self.path), str(self.python), *args]
        return subprocess.run(cmd, capture_output=True, text=True,
                              env=self.python_env(pythonpath, env), timeout=timeout)

    def python_env(self, pythonpath: list[Path] | None = None,
                   env: dict[str, str] | None = None) -> dict[str, str]:
        """The emulated python's environment: ``pythonpath`` before the wheels' folder, the
        host's MLCPACK_*, PYTHON* and QEMU_* variables left out."""
        clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("MLCPACK_", "PYTHON", "QEMU_"))}
        paths = [*(pythonpath or []), self.site]
        clean.update({"PYTHONPATH": os.pathsep.join(map(str, paths)),
                      "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8"})
        clean.update(env or {})
        return clean


def _apt_options(state: Path) -> list[str]:
    return ["-o", f"Dir::Etc::SourceList={state / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={state / 'sources.list.d'}",
            "-o", f"Dir::Etc::Preferences={state / 'preferences'}",
            "-o", f"Dir::Etc::PreferencesParts={state / 'preferences.d'}",
            "-o", f"Dir::State::Lists={state / 'lists'}",
            "-o", f"Dir::State::status={state / 'status'}",
            "-o", f"Dir::Cache={state / 'cache'}",
            "-o", "APT::Architecture=arm64", "-o", "APT::Architectures::=arm64",
            "-o", "Debug::NoLocking=1", "-o", "Acquire::Retries=3", "-q"]


def _download_debs(state: Path, debs: Path) -> list[Path]:
    for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").write_text("")
    (state / "preferences").write_text("")
    (state / "sources.list").write_text(
        f"deb [arch=arm64 signed-by={KEYRING}] {DEBIAN_MIRROR} {DEBIAN_SUITE} main\n")
    opts = _apt_options(state)
    _run(["apt-get", *opts, "update"],
         f"apt-get update for arm64 from {DEBIAN_MIRROR} (is the Debian mirror reachable?)")
    # Resolve the dependency closure against an empty system, as debootstrap would.
    plan = _run(["apt-get", *opts, "-s", "--no-install-recommends", "install", *PACKAGES],
                "resolving the arm64 python3.11 packages")
    names = [line.split()[1] for line in plan.splitlines() if line.startswith("Inst ")]
    if "python3.11" not in names:
        raise Arm64RootError(f"apt resolved no python3.11 for arm64 from {DEBIAN_MIRROR}")
    debs.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", *opts, "download", *names],
         f"downloading {len(names)} arm64 packages from {DEBIAN_MIRROR}", cwd=debs)
    return sorted(debs.glob("*.deb"))


def _download_wheels(wheels: Path) -> list[Path]:
    # The host's numpy and msgpack versions, so both sides run the same library code.
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in ("numpy", "msgpack")]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
           "--python-version", "3.11", "--implementation", "cp", "--no-deps", "-d", str(wheels)]
    for plat in WHEEL_PLATFORMS:
        cmd += ["--platform", plat]
    _run(cmd + pins, f"pip download of aarch64 wheels {', '.join(pins)} (is PyPI reachable?)")
    return sorted(wheels.glob("*.whl"))


def _build(dest: Path) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise Arm64RootError("building the arm64 root needs apt-get and dpkg-deb (Debian/Ubuntu)")
    root, site = dest / "root", dest / "site"
    for deb in _download_debs(dest / "apt", dest / "debs"):
        _run(["dpkg-deb", "-x", str(deb), str(root)], f"unpacking {deb.name}")
    for wheel in _download_wheels(dest / "wheels"):
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    # zipfile drops permission bits; shared objects only need to be readable, but be tidy.
    for so in site.rglob("*.so*"):
        so.chmod(0o755)
    shutil.rmtree(dest / "apt")
    shutil.rmtree(dest / "debs")
    shutil.rmtree(dest / "wheels")


def ensure_arm64_root() -> Arm64Root:
    """The cached arm64 root (built on first use) and the qemu binary that runs it."""
    qemu = ensure_qemu()
    base = cache_dir()
    final = base / f"arm64-root-v{ROOT_VERSION}"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "arm64-root.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time (parallel test runs)
        if not (final / "complete").exists():
            tmp = Path(tempfile.mkdtemp(prefix="arm64-root-build-", dir=base))
            try:
                _build(tmp)
                (tmp / "complete").write_text(ROOT_VERSION + "\n")
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    root = Arm64Root(final / "root", final / "site", qemu)
    if not root.python.exists():
        raise Arm64RootError(f"{final} has no usr/bin/python3.11: delete it to rebuild")
    return root


def arm64_root_or_fail() -> Arm64Root:
    """``ensure_arm64_root()`` for a test fixture: a setup failure fails the test with its
    one message (an unreachable registry is a failure, never a skip)."""
    import pytest

    try:
        return ensure_arm64_root()
    except Arm64RootError as exc:
        pytest.fail(f"cannot set up the emulated arm64 python: {exc}", pytrace=False)


def runtime_package(dest: Path, repo_root: Path) -> Path:
    """Copy ``runtime/`` to ``dest/mlcpack/runtime`` (the way an app embeds it); return ``dest``
    for PYTHONPATH."""
    pkg = dest / "mlcpack"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    shutil.copytree(repo_root / "runtime", pkg / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return dest


# Served by one emulated python per test process (``_Server``): each request names a jobs
# file; each job loads a bundle, runs it on its inputs, saves the outputs and the code variant
# the runtime chose. One answer line (JSON) per request: the report, or the traceback.
_RUNNER = """
import json, platform, sys, traceback
import numpy as np
from mlcpack.runtime import load

def run(jobs):
    report = {"machine": platform.machine(), "chosen": {}, "pool": {}, "native_steps": {}}
    for job in jobs:
        feeds = dict(np.load(job["inputs"]))
        with load(job["bundle"], threads=job["threads"]) as model:
            outputs = model.run(feeds)
            report["chosen"][job["bundle"]] = model.code_variant["level"]
            report["pool"][job["bundle"]] = type(model._main._executor._pool).__name__
            report["native_steps"][job["bundle"]] = model._main._executor._segments is not None
        np.savez(job["outputs"], **outputs)
    return report

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    try:
        with open(json.loads(line)["jobs"]) as f:
            answer = {"report": run(json.load(f))}
    except BaseException:
        answer = {"error": traceback.format_exc()}
    print(json.dumps(answer), flush=True)
"""


class _Server:
    """The emulated python that runs ``_RUNNER``, started once per test process (starting numpy
    and the runtime under qemu costs ~5 s of CPU each time) with its own copy of the runtime,
    and stopped at exit; started again after a crash."""

    def __init__(self, root: Arm64Root, repo_root: Path) -> None:
        import atexit

        self.folder = Path(tempfile.mkdtemp(prefix="mlcpack-arm64-runner-"))
        pkg = runtime_package(self.folder / "app", repo_root)
        (self.folder / "runner.py").write_text(_RUNNER)
        self.stderr = open(self.folder / "stderr.txt", "w+")
        self.proc = subprocess.Popen(
            [root.qemu, "-L", str(root.path), str(root.python), str(self.folder / "runner.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            env=root.python_env([pkg]))
        atexit.register(self.close)
        self.key = (root, repo_root)
        ready = self.answer(300)
        if not ready.get("ready"):
            raise AssertionError(f"the emulated aarch64 python did not start: {ready}")

    def answer(self, timeout: float) -> dict:
        import json
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if ready:
                self.proc.wait(timeout=30)
            self.close()
            self.stderr.seek(0)
            why = (f"exit {self.proc.returncode}" if ready else f"no answer in {timeout:.0f} s")
            raise AssertionError(f"the emulated aarch64 run failed ({why}):\n"
                                 f"{self.stderr.read()[-4000:]}")
        return json.loads(line)

    def ask(self, jobs: Path, timeout: float = 180) -> dict:
        import json

        self.proc.stdin.write(json.dumps({"jobs": str(jobs)}) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def close(self) -> None:
        if _SERVERS.get(self.key) is self:
            del _SERVERS[self.key]
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_SERVERS: dict[tuple, _Server] = {}


def run_bundles(root: Arm64Root, work: Path, repo_root: Path,
                bundles: dict[str, tuple[Path, dict]], threads: dict[str, int] | None = None
                ) -> tuple[dict, dict[str, dict]]:
    """Run each ``name: (bundle, feeds)`` with a copy of ``repo_root``'s runtime in the test
    process's one emulated python (``_Server``: starting numpy under qemu costs seconds), on
    ``threads[name]`` threads (default 1); return (report, name -> outputs)."""
    import json

    import numpy as np

    jobs = []
    for name, (bundle, feeds) in bundles.items():
        np.savez(work / f"{name}-in.npz", **feeds)
        jobs.append({"bundle": str(bundle), "inputs": str(work / f"{name}-in.npz"),
                     "outputs": str(work / f"{name}-out.npz"),
                     "threads": (threads or {}).get(name, 1)})
    (work / "jobs.json").write_text(json.dumps(jobs))
    key = (root, Path(repo_root).resolve())
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = _Server(root, key[1])
    answer = server.ask(work / "jobs.json")
    if "error" in answer:
        raise AssertionError(f"the emulated aarch64 run failed:\n{answer['error'][-4000:]}")
    report = answer["report"]
    outputs = {}
    for name in bundles:
        with np.load(work / f"{name}-out.npz") as data:
            outputs[name] = {k: data[k] for k in data.files}
    return report, outputs
