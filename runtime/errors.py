"""The runtime's error classes. Every refusal the runtime makes is one of these.

Each class carries an ``exit_code`` so the command line maps a class of error to a distinct
process exit status; the message is one line that names the thing and the fix.
"""

from __future__ import annotations

import os
from typing import Iterable


# The runtime's extras (runtime/pyproject.toml): what each installs.
RUNTIME_EXTRAS = {"images": "Pillow>=10", "sign": "cryptography>=42", "ray": "ray[data]==2.40.0"}


def install_hint(extra: str) -> str:
    """How to install an extra for the distribution installed here: ``pip install
    'mlcpack[extra]'`` where the compiler is importable; where only the runtime is (which must
    not get the compiler beside it, and is not on PyPI), the extra's own package."""
    from importlib.util import find_spec

    try:
        compiler = find_spec("mlcpack.packager") is not None
    except (ImportError, ValueError):
        compiler = False
    if compiler and extra != "images":   # the compiler depends on Pillow: no such extra
        return f"pip install 'mlcpack[{extra}]'"
    return f"pip install '{RUNTIME_EXTRAS[extra]}' (the runtime's [{extra}] extra)"


class MlcpackError(Exception):
    """Base of every error mlcpack raises on purpose (bad input, refused bundle...)."""

    exit_code = 1


class BundleError(MlcpackError):
    """The bundle file is missing, truncated, corrupted, or of an unsupported format."""

    exit_code = 3


class FormatVersionError(BundleError):
    """The bundle's format major (or a newer minor) is not one this runtime reads."""

    exit_code = 4


class CpuFeatureError(MlcpackError):
    """The bundle's code needs CPU features (or an architecture) this host lacks."""

    exit_code = 5


class CodeLoadError(BundleError):
    """The object code in a bundle could not be mapped (bad ELF, unknown relocation...)."""

    exit_code = 6


class InputError(MlcpackError):
    """An input given to a model has the wrong name, rank, shape or dtype, or cannot be read."""

    exit_code = 7


class LibraryFunctionError(MlcpackError):
    """A library function the bundle calls by name is not registered in this process."""

    exit_code = 8


class SignatureError(BundleError):
    """Trusted keys were given and the bundle is unsigned, signed by another key, or its
    signature does not verify."""

    exit_code = 12


class UsageError(MlcpackError):
    """A command-line option or argument has a value the command cannot use."""

    exit_code = 2


def check_files(paths: Iterable[str | os.PathLike], what: str) -> None:
    """The files a command reads exist and are files (``what``: "input file"...), reported
    before any bundle is loaded or any compile work starts (exit 7)."""
    for p in paths:
        if not os.path.exists(p):
            raise InputError(f"{os.fspath(p)}: no such file (the {what})")
        if os.path.isdir(p):
            raise InputError(f"{os.fspath(p)} is a directory, not the {what}")
