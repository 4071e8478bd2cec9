"""The ``mlcpack`` command line run inside the test process, for the many error-path checks.

A real ``mlcpack`` subprocess pays an interpreter start and, for ``export``, the compiler's
imports (about 1.6 s of CPU here) before it can refuse a missing file in one line. Tests of
*which* line and exit code a mistake gets run the same typer app in this process instead
(``packager/cli.py``'s ``app``, with ``main``'s argument spelling), with the same environment
rules as ``conftest._run_cli``, and get the same ``CompletedProcess``. What only a real process
shows (no traceback or warning on stderr at start-up, ``--debug``'s traceback, the installed
entry point) stays with the real executable: tests/cli/test_one_line_error_per_class.py runs
every error class that way, and each CLI module keeps its real-process successes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Mapping

# What conftest._run_cli removes from the environment it passes on.
_HOST_OVERRIDES = ("MLCPACK_CPU_FEATURES", "MLCPACK_CPU_ARCH", "MLCPACK_NUM_THREADS")


def run_cli_in_process(*args: str | os.PathLike, env: Mapping[str, str] | None = None,
                       cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``mlcpack ARGS`` run here: exit code, stdout and stderr as ``conftest._run_cli`` returns
    them. An exception that escapes the command line is raised (a real process would print its
    traceback: a test of a one-line error fails either way)."""
    from typer.testing import CliRunner

    from mlcpack.packager.cli import app, bare_ray

    argv = bare_ray([os.fspath(a) for a in args])
    environ: dict[str, str | None] = {key: None for key in _HOST_OVERRIDES}
    environ.update(env or {})
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        result = CliRunner().invoke(app, argv, env=environ, prog_name="mlcpack",
                                    catch_exceptions=False)
    return subprocess.CompletedProcess(["mlcpack", *argv], result.exit_code, result.stdout,
                                       result.stderr)
