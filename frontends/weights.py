"""Reading pickled weights without running code from the file.

A pickle is a program: ``__reduce__`` can make ``pickle.load`` call ``os.system``. The
``RestrictedUnpickler`` resolves no global except the few numpy needs to rebuild arrays; every
other import a pickle asks for (``os.system``, ``builtins.eval``, ``builtins.getattr``,
``subprocess.Popen``, any class) is refused before anything from the file runs. What it returns
must then be a dict of float arrays (``.npz`` archives are read with ``allow_pickle=False``).
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
import zipfile
from typing import Any

import numpy as np

from ..runtime.errors import MlcpackError

try:
    from numpy._core import multiarray as _multiarray, numeric as _numeric
except ImportError:  # numpy < 2
    from numpy.core import multiarray as _multiarray, numeric as _numeric


class WeightsError(MlcpackError):
    """The weights file is unreadable, unsafe, or not a dict of float arrays."""

    exit_code = 9


def _latin1_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # Python 2-era numpy pickles store array bytes as latin-1 text; allow only that codec.
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"codec {encoding!r} is not allowed")
    return codecs.encode(text, "latin1")


# The only callables a weights pickle may name: numpy's array and dtype reconstruction.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy._core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy.core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("collections", "OrderedDict"): dict,
    ("_codecs", "encode"): _latin1_encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        fn = _ALLOWED.get((module, name))
        if fn is None:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}")
        return fn

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id (a torch checkpoint?)")


def _load_pickle(path: str) -> Any:
    with open(path, "rb") as f:
        data = f.read()
    try:
        return RestrictedUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise WeightsError(f"{path}: unsafe or invalid pickle ({exc}); nothing from it was run. "
                           "Save weights as a dict of numpy arrays (or .npz), or export to ONNX"
                           ) from None
    except Exception as exc:  # truncated data, bad opcodes, numpy rejecting its arguments...
        raise WeightsError(f"{path} is not a readable weights pickle "
                           f"({type(exc).__name__}: {exc})") from None


def _load_npz(path: str) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise WeightsError(f"{path} is not a readable .npz archive ({exc})") from None


def load_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read ``path`` (.pkl/.pickle or .npz) into a dict of float32 arrays, or raise
    ``WeightsError`` naming the problem. Float64/float16 arrays are converted to float32."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise WeightsError(f"{path}: no such file")
    if os.path.isdir(path):
        raise WeightsError(f"{path} is a directory, not a weights file")
    obj = _load_npz(path) if path.endswith(".npz") else _load_pickle(path)
    if not isinstance(obj, dict):
        raise WeightsError(f"{path} holds a {type(obj).__name__}, not a dict of named arrays "
                           "(e.g. {'w0': ..., 'b0': ...})")
    out: dict[str, np.ndarray] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise WeightsError(f"{path}: weight names must be strings, found {key!r}")
        if not isinstance(value, np.ndarray):
            raise WeightsError(f"{path}: {key!r} is a {type(value).__name__}, not a numpy array")
        if value.dtype.kind != "f":
            raise WeightsError(f"{path}: {key!r} has dtype {value.dtype}; weights must be "
                               "floating point (float32)")
        out[key] = np.ascontiguousarray(value, dtype=np.float32)
    if not out:
        raise WeightsError(f"{path} holds no arrays")
    return out
