"""The export's user-facing error, in a module of its own so that frontends (which only build IR)
can raise it without importing the export driver and, through it, llvmlite and the code
generator."""

from __future__ import annotations

from ..runtime.errors import MlcpackError


class ExportError(MlcpackError):
    """The model could not be exported; the message says why and what to change."""

    exit_code = 11
