"""An on-disk cache of compiled objects, keyed by everything that determines them (on by default).

LLVM's optimizer and code generator are most of an export's time. Exporting the same model
again (another ``--batch-sizes``, a golden check turned back on, a test suite that exports the
same small models many times) produces the same LLVM module, and LLVM is deterministic, so
the object it writes is the same too. ``parallel.compile_for_targets`` looks the object up
before any IR is emitted, and the compile stores it after, like ccache.

Where: ``MLCPACK_CACHE_DIR`` when set (``off`` or empty: no cache), else
``$XDG_CACHE_HOME/mlcpack/objects`` (``~/.cache/mlcpack/objects`` without it); ``mlcpack export
--no-cache`` turns it off for one export. Its size is capped (``MLCPACK_CACHE_SIZE``, e.g.
``500M`` or ``2G``; default ``DEFAULT_MAX_BYTES``; the objects take ``object_limit`` of it,
the golden check's references the rest): after a store that takes them over their share,
the least recently used entries (a hit touches its entry's mtime) are deleted until it is
back under ``LOW_WATER`` of the cap.

The key (``object_key``) is the SHA-256 of what the object is a function of, taken before any
LLVM IR is emitted (``codegen/fingerprint.py``: every prim func whole, the size variables, the
code-changing ``CompileOptions`` fields), the target (name, triple, CPU, features), the
llvmlite and LLVM versions, ``PIPELINE`` (bump it whenever the optimization pipeline or the
code-generation options in build.py change) and ``compiler_fingerprint`` (the SHA-256 of
``packager/``'s sources, so an edited emitter never reuses an older entry); a module holding a
value that encoding does not know is keyed by its LLVM IR text instead (``cache_key``). An
entry also records the kernels that
needed a conservative pipeline (LLVM aborted on them; see ``codegen/parallel.py``), the kernel
facts emission found (a hit by the input key returns them without emitting), and
carries the SHA-256 of its own contents: a damaged or truncated entry is a miss (and is
rewritten), never a bundle built from it. Entries are written to a temporary file and renamed
into place, so processes that share the directory (pytest-xdist workers, parallel exports)
never read a half-written one. A cache that cannot be read or written only costs time:
nothing here fails an export.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import llvmlite
import llvmlite.binding as llvm

from .target import Target

ENV = "MLCPACK_CACHE_DIR"
SIZE_ENV = "MLCPACK_CACHE_SIZE"
DEFAULT_MAX_BYTES = 1 << 30
# Trimming goes down to this share of the cap, so that the next stores do not trim again.
LOW_WATER = 0.8
# The golden check's reference runs (``packager/golden_cache.py``) live in the same folder,
# trimmed apart: 1 / REFERENCE_SHARE of the cap is theirs, the rest the objects', so that the
# two together stay within MLCPACK_CACHE_SIZE (objects at the whole cap and references at an
# eighth on top came to 1.1 GiB under the default 1 GiB).
REFERENCE_SHARE = 8
# A temporary file older than this is a writer's leftover (the process died): trimming deletes it.
STALE_TMP_SECONDS = 3600
# The optimization pipeline and code-generation options of build.py, as a version: part of
# every key, so entries written by an older pipeline are never used.
PIPELINE = "O2+slp,pic,small,v2"
_MAGIC = b"mlcpack-object-cache-3\n"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class CacheSettingError(ValueError):
    """``MLCPACK_CACHE_SIZE`` is not a size; the message says what it takes."""


def default_dir(environ: Mapping[str, str]) -> Path | None:
    """``$XDG_CACHE_HOME/mlcpack/objects`` (an absolute XDG_CACHE_HOME only, as the XDG spec
    says), else ``~/.cache/mlcpack/objects``; None without a home directory."""
    env = environ
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "mlcpack" / "objects"
    home = env.get("HOME", "")
    if not home:
        return None
    return Path(home) / ".cache" / "mlcpack" / "objects"


def cache_dir(environ: Mapping[str, str]) -> Path | None:
    """The cache directory: ``MLCPACK_CACHE_DIR`` when set (``off`` or empty: None, no
    caching), else ``default_dir``."""
    env = environ
    value = env.get(ENV)
    if value is None:
        return default_dir(env)
    value = value.strip()
    if value in ("", "off"):
        return None
    return Path(value).expanduser()


def max_bytes(environ: Mapping[str, str]) -> int:
    """The size cap from ``MLCPACK_CACHE_SIZE`` (bytes, or a number with K, M, G or T: 1024
    based), default ``DEFAULT_MAX_BYTES``; raises ``CacheSettingError`` on anything else."""
    env = environ
    text = env.get(SIZE_ENV, "").strip().upper().removesuffix("B").removesuffix("I")
    if not text:
        return DEFAULT_MAX_BYTES
    number, unit = (text[:-1], text[-1]) if text[-1] in _UNITS else (text, "")
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise CacheSettingError(f"{SIZE_ENV}={env.get(SIZE_ENV)!r} is not a size: give bytes or "
                                "a number with K, M or G (e.g. 500M, 2G)")
    return int(value * _UNITS[unit])


def object_limit(limit: int) -> int:
    """The bytes the compiled objects may take of a cache capped at ``limit``."""
    return max(limit - limit // REFERENCE_SHARE, 1)


def reference_limit(limit: int) -> int:
    """The bytes the golden check's references may take of a cache capped at ``limit``."""
    return max(limit // REFERENCE_SHARE, 1)


def cache_key(text: str, target: Target, pipeline: str = "") -> str:
    """The key of a module known only by its LLVM IR ``text`` (the fallback of
    ``build.object_key``, for kernels holding a value it cannot encode); ``pipeline``: the
    name of a pipeline other than the default (``build.LEAN_PIPELINE``), "" for the default."""
    h = hashlib.sha256()
    for part in (PIPELINE + pipeline, llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)),
                 target.triple, target.llvm_cpu, target.llvm_features):
        h.update(part.encode() + b"\0")
    h.update(text.encode())
    return h.hexdigest()


@functools.cache
def compiler_fingerprint() -> str:
    """The compiler's version as its code: the SHA-256 of every Python file of ``packager/``
    (kernel emitters, IR, options), so that an edited emitter never reuses an entry its older
    code wrote, with or without a version bump. Read once per process (~2 ms)."""
    h = hashlib.sha256(f"mlcpack {_version()}\0".encode())
    root = Path(__file__).resolve().parent.parent
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            data = b"?"
        h.update(str(path.relative_to(root)).encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def _version() -> str:
    from .. import __version__
    return __version__


def object_key(parts: Iterable[bytes], target: Target, pipeline: str = "") -> str:
    """The key of a module known by its inputs (``build.object_key`` encodes them): taken
    before any LLVM IR is emitted, so a warm export neither emits nor prints IR; ``pipeline``
    as in ``cache_key``."""
    h = hashlib.sha256(b"inputs\0")
    for part in (PIPELINE + pipeline, llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)),
                 compiler_fingerprint(), target.name, target.triple, target.llvm_cpu,
                 target.llvm_features):
        h.update(part.encode() + b"\0")
    for part in parts:
        h.update(part)
    return h.hexdigest()


def _path(directory: Path, key: str, suffix: str = ".obj") -> Path:
    return directory / key[:2] / f"{key}{suffix}"


@dataclass(frozen=True)
class Entry:
    """A cache entry: the object, its optimized IR text, the kernels that LLVM aborted on under
    the default pipeline with the pipeline that compiled each (``fallbacks``: dicts of strings
    "kernel", "pipeline", "reason" and "serves", a list of strings; ``codegen/parallel.py``), so
    that a hit warns as the compile did, and, for an entry found by ``object_key``, the kernel
    facts emission found (``kernels``: ``build.kernels_record``; None otherwise)."""
    object_code: bytes
    llvm_ir: str
    fallbacks: list[dict]
    kernels: dict | None = None


def load(directory: Path, key: str, suffix: str = ".obj") -> Entry | None:
    """The cached entry for ``key``, or None when absent or damaged. ``suffix``: the kind of
    entry (``.obj`` objects; ``packager/golden_cache.py`` keeps ``.ref`` ones apart)."""
    try:
        data = _path(directory, key, suffix).read_bytes()
    except OSError:
        return None
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 32 + 24:
        return None
    body = data[len(_MAGIC) + 32:]
    if hashlib.sha256(body).digest() != data[len(_MAGIC):len(_MAGIC) + 32]:
        return None
    sizes = [int.from_bytes(body[i:i + 8], "little") for i in (0, 8, 16)]
    if 24 + sum(sizes) != len(body):
        return None
    obj = body[24:24 + sizes[0]]
    try:
        ir_text = body[24 + sizes[0]:24 + sizes[0] + sizes[1]].decode()
        meta = json.loads(body[24 + sizes[0] + sizes[1]:].decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    notes, kernels = meta.get("fallbacks"), meta.get("kernels")
    if not isinstance(notes, list) or not all(_is_note(n) for n in notes) \
            or not (kernels is None or isinstance(kernels, dict)):
        return None
    _touch(_path(directory, key, suffix))
    return Entry(obj, ir_text, notes, kernels)


def _is_note(note: object) -> bool:
    return isinstance(note, dict) and all(isinstance(note.get(k), str)
                                          for k in ("kernel", "pipeline", "reason")) \
        and isinstance(note.get("serves"), list) and all(isinstance(n, str)
                                                         for n in note["serves"])


def store(directory: Path, key: str, obj: bytes, ir_text: str,
          notes: list[dict] | None = None, limit: int = DEFAULT_MAX_BYTES,
          kernels: dict | None = None, suffix: str = ".obj") -> None:
    """Store an entry (``notes`` and ``kernels``: see ``Entry``), then trim the cache to
    ``limit`` bytes (``trim``); a cache that cannot be written is skipped silently (it only
    saves time)."""
    ir_bytes = ir_text.encode()
    note_bytes = json.dumps({"fallbacks": notes or [], "kernels": kernels}).encode()
    body = b"".join([len(obj).to_bytes(8, "little"), len(ir_bytes).to_bytes(8, "little"),
                     len(note_bytes).to_bytes(8, "little"), obj, ir_bytes, note_bytes])
    path = _path(directory, key, suffix)
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
        return
    trim(directory, limit, suffix)


def _touch(path: Path) -> None:
    """Mark an entry used now (its mtime: ``trim`` deletes the least recently used first)."""
    try:
        os.utime(path)
    except OSError:
        pass


def entries(directory: Path, suffix: str = ".obj") -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of every entry (of kind ``suffix``) under ``directory``, in no
    order."""
    found = []
    try:
        buckets = list(os.scandir(directory))
    except OSError:
        return []
    for bucket in buckets:
        if len(bucket.name) != 2 or not bucket.is_dir(follow_symlinks=False):
            continue
        try:
            for item in os.scandir(bucket.path):
                if item.name.endswith(suffix) and item.is_file(follow_symlinks=False):
                    st = item.stat(follow_symlinks=False)
                    found.append((st.st_mtime, st.st_size, Path(item.path)))
                elif item.name.startswith(".tmp-") and item.is_file(follow_symlinks=False):
                    st = item.stat(follow_symlinks=False)
                    if st.st_mtime < time.time() - STALE_TMP_SECONDS:
                        _remove(item.path)
        except OSError:
            continue
    return found


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def trim(directory: Path, limit: int, suffix: str = ".obj") -> int:
    """Delete the least recently used entries while the cache holds more than ``limit`` bytes,
    down to ``LOW_WATER`` of it; the newest entry stays even when it alone is larger. Returns
    the bytes deleted. Entries another process deletes meanwhile are skipped."""
    found = entries(directory, suffix)
    total = sum(size for _, size, _ in found)
    if total <= limit:
        return 0
    found.sort()
    target = limit * LOW_WATER
    deleted = 0
    for _, size, path in found[:-1]:
        if total - deleted <= target:
            break
        try:
            path.unlink()
        except OSError:
            continue
        deleted += size
    return deleted
