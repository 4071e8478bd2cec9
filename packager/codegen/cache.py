"""An on-disk cache of compiled objects, keyed by everything that determines them (opt-in).

LLVM's optimizer and code generator are most of an export's time. Exporting the same model
again (another ``--batch-sizes``, a golden check turned back on, a test suite that exports the
same small models many times) produces the same LLVM module, and LLVM is deterministic, so
the object it writes is the same too. With ``MLCPACK_CACHE_DIR`` set, ``compile_prim_funcs``
looks the object up before running LLVM and stores it after, like ccache.

The key is the SHA-256 of the module's LLVM IR text, the target (triple, CPU, features), the
llvmlite and LLVM versions and ``PIPELINE`` (bump it whenever the optimization pipeline or
the code-generation options in build.py change). An entry also carries the SHA-256 of its own
contents: a damaged or truncated entry is a miss (and is rewritten), never a bundle built from
it. Entries are written to a temporary file and renamed into place, so processes that share
the directory (pytest-xdist workers, parallel exports) never read a half-written one. The
cache never grows by itself beyond what is exported; delete the directory to empty it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from .target import Target

ENV = "MLCPACK_CACHE_DIR"
# The optimization pipeline and code-generation options of build.py, as a version: part of
# every key, so entries written by an older pipeline are never used.
PIPELINE = "O3+slp,pic,small,v1"
_MAGIC = b"mlcpack-object-cache-1\n"


def cache_dir() -> Path | None:
    """The cache directory from ``MLCPACK_CACHE_DIR``, or None (no caching)."""
    value = os.environ.get(ENV, "").strip()
    return Path(value).expanduser() if value else None


def cache_key(text: str, target: Target) -> str:
    h = hashlib.sha256()
    for part in (PIPELINE, llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)),
                 target.triple, target.llvm_cpu, target.llvm_features):
        h.update(part.encode() + b"\0")
    h.update(text.encode())
    return h.hexdigest()


def _path(directory: Path, key: str) -> Path:
    return directory / key[:2] / f"{key}.obj"


def load(directory: Path, key: str) -> tuple[bytes, str] | None:
    """The cached (object code, optimized IR text) for ``key``, or None when absent or damaged."""
    try:
        data = _path(directory, key).read_bytes()
    except OSError:
        return None
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 32 + 16:
        return None
    body = data[len(_MAGIC) + 32:]
    if hashlib.sha256(body).digest() != data[len(_MAGIC):len(_MAGIC) + 32]:
        return None
    obj_size = int.from_bytes(body[:8], "little")
    ir_size = int.from_bytes(body[8:16], "little")
    if 16 + obj_size + ir_size != len(body):
        return None
    obj = body[16:16 + obj_size]
    try:
        ir_text = body[16 + obj_size:].decode()
    except UnicodeDecodeError:
        return None
    return obj, ir_text


def store(directory: Path, key: str, obj: bytes, ir_text: str) -> None:
    """Store an entry; a cache that cannot be written is skipped silently (it only saves time)."""
    ir_bytes = ir_text.encode()
    body = len(obj).to_bytes(8, "little") + len(ir_bytes).to_bytes(8, "little") + obj + ir_bytes
    path = _path(directory, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(body).digest() + body)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
