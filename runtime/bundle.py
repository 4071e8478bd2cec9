"""The bundle file format (``.mlc``) and its reader.

A bundle is one msgpack map with three keys, in this order::

    {"mlcpack": <header map>, "sha256": <32-byte bin>, "data": <bin32 payload area>}

so any msgpack reader can open it. The header says where every payload (weights, object code,
bytecode, IR text) lives as ``{"offset", "size"}`` relative to the start of the payload area, which
begins at a 64-byte-aligned file offset; every payload is 64-byte aligned too. The stored digest is
SHA-256 over the file's bytes before the ``"sha256"`` key (the head) followed by a tail, so a
flipped bit anywhere is caught:

- flat (format 1.0/1.1, and what the writer still makes for small bundles): the tail is the
  payload area itself;
- tree (format 1.2, ``min_reader`` [1, 2]; the writer's choice for payload areas of 8 MiB and
  more): the header holds ``"digest": {"alg": "sha256-tree", "chunk": C}`` (C a power of two,
  4 KiB to 1 GiB) and the tail is the SHA-256 of every C-byte slice of the payload area in order
  (the last one shorter where the size is not a multiple of C; no slices, an empty tail, for an
  empty area), each 32 bytes. The slices are hashed on up to 4 threads, which is what makes a
  large bundle's check fast; the chunk size is in the head, so the slicing is covered too.

Payload areas of 4 GiB and more (format 1.4, ``min_reader`` [1, 4]) do not fit a ``bin32``:
there ``"data"`` is empty (a ``bin32`` of length 0) and the header says where the area is,
``"payload": {"offset": <file offset>, "size": <bytes>}``; the area follows the msgpack map at
once (the offset is the end of ``"data"``, 64-byte aligned) and runs to the end of the file, so
the file is a msgpack map followed by raw bytes, as a safetensors file is a header followed by
raw bytes. Offsets and sizes are msgpack integers (64-bit) everywhere; the digest is the same
computation over the same area, and the head is still the bytes before ``"sha256"``. Every
smaller bundle keeps the one-map layout above, byte for byte.

``content_digest(head, digest_tail(parts, chunk))`` is the one computation; the reader, the
writer, signatures (``runtime/signing.py``) and the tests all use it. The reader maps the file and
hands out views; nothing large is copied.

Format versions: ``format = [major, minor]``. A runtime reads bundles of its own major and any
minor up to its own; a bundle of a newer minor loads only if its ``min_reader`` (the oldest
[major, minor] that can run it) is not newer than this runtime.
"""

from __future__ import annotations

import bisect
import hashlib
import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import msgpack
import numpy as np

from .errors import BundleError, FormatVersionError

FORMAT_MAJOR = 1
FORMAT_MINOR = 2
# Bundles with symbolic shapes (a memory plan computed at run time, runtime/symbolic.py) say
# format 1.3 with min_reader 1.3, so readers before it refuse them cleanly; every other bundle
# keeps writing 1.2. This reader reads 1.2, and 1.3 bundles that carry the symbolic record.
SYMBOLIC_MINOR = 3
# Bundles whose payload area is 4 GiB or more say format 1.4 with min_reader 1.4 (the area
# after the map, see the module doc); this reader reads them.
PAYLOAD64_MINOR = 4
PAYLOAD64_FORMAT = [1, 4]
# Bundles with a constant stored as 8-bit integers (a constant's "stored" record, expanded at
# load) say format 1.5 with min_reader 1.5; this reader reads them.
STORED_MINOR = 5
# Bundles with sizes a kernel counts at run time (the symbolic record's "dynamic" list and the
# BIND_SIZE instruction) say format 1.6 with min_reader 1.6; this reader reads them.
DYNAMIC_MINOR = 6
# Bundles whose size variables are bound from inputs' values (the symbolic record's "values": a
# Reshape's shape fed at run time) say format 1.6 with min_reader 1.6; this reader reads them.
VALUES_MINOR = 6   # the same minor as DYNAMIC_MINOR
# Bundles whose output sizes follow float scales fed at run time (the symbolic record's
# "scales": a Resize's scales as a graph input) say format 1.7 with min_reader 1.7.
SCALES_MINOR = 7
# Bundles whose bytecode branches (an If that runs only its taken branch: JUMP_UNLESS, JUMP and
# TRAP, marked by the vm record's "branches" count) say format 1.7 with min_reader 1.7; this
# reader reads them.
BRANCH_MINOR = 7
# Bundles with a counted loop (a Loop whose trip count or condition is known only at run time:
# LOOP and NEXT, marked by the vm record's "loops" count) say format 1.8 with min_reader 1.8;
# this reader reads them.
LOOP_MINOR = 8
# Bundles with a loop's rows that have no bound at export (STORE tensor rows grown by APPEND,
# marked by the vm record's "stores" count; TRAP 2, a carried value's shape that changed) say
# format 1.9 with min_reader 1.9; this reader reads them.
STORE_MINOR = 9
# Bundles with a Loop's carried value that grows between iterations (a Concat of itself and a
# piece: a STORE row the initial value's rows are appended to before the loop and a piece of
# one or more rows each iteration, marked by the vm record's "grows" list) say format 1.10 with
# min_reader 1.10; this reader reads them.
GROW_MINOR = 10
TREE_FORMAT = [1, 2]                # the oldest reader of tree-digest bundles
MAGIC = b"\x83\xa7mlcpack"          # fixmap(3) then the 7-char key "mlcpack"
DIGEST_KEY = b"\xa6sha256\xc4\x20"  # fixstr "sha256", then bin8 of 32 bytes
DATA_KEY = b"\xa4data\xc6"          # fixstr "data", then bin32 (4-byte big-endian length follows)
TRAILER_BYTES = len(DIGEST_KEY) + 32 + len(DATA_KEY) + 4
ALIGN = 64
# Dtypes numpy lacks are carried as unsigned bits of their width: a bfloat16 tensor is a uint16
# array holding the top 16 bits of each float32; float8 (ml_dtypes' names) one byte each; 4- and
# 2-bit integers one per byte in the low bits. ml_dtypes arrays of these dtypes are accepted too.
STORAGE_DTYPES = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e4m3fnuz": "uint8",
                  "float8_e5m2": "uint8", "float8_e5m2fnuz": "uint8", "int4": "uint8",
                  "uint4": "uint8", "int2": "uint8", "uint2": "uint8"}
DTYPES = frozenset({"float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8",
                    "uint16", "uint32", "uint64", "bool", *STORAGE_DTYPES})


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a bundle dtype is stored as in memory."""
    return np.dtype(STORAGE_DTYPES.get(dtype, dtype))
MAX_HEADER_BYTES = 64 << 20
DIGEST_ALG = "sha256-tree"
MIN_CHUNK, MAX_CHUNK = 1 << 12, 1 << 30
MAX_HASH_THREADS = 4
THREAD_MIN_BYTES = 2 << 20          # a hashing thread gets at least this much of the payload area


def reader_minor(header: dict) -> int:
    """The newest format minor this reader reads for ``header`` (docs/format.md section 2):
    FORMAT_MINOR, and each later minor for a bundle that carries what that minor added (1.3 the
    ``"symbolic"`` record, 1.4 the ``"payload"`` record). A bundle of a newer minor than this
    loads only if its ``min_reader`` (else its ``format``) is at most [FORMAT_MAJOR, this]."""
    reads = FORMAT_MINOR
    for key, minor in (("symbolic", SYMBOLIC_MINOR), ("payload", PAYLOAD64_MINOR)):
        if key in header:
            reads = minor
    consts = header.get("constants")
    if isinstance(consts, list) and any(isinstance(c, dict) and "stored" in c for c in consts):
        reads = STORED_MINOR
    sym = header.get("symbolic")
    if isinstance(sym, dict) and "dynamic" in sym:
        reads = DYNAMIC_MINOR
    if isinstance(sym, dict) and "values" in sym:
        reads = VALUES_MINOR
    if isinstance(sym, dict) and "scales" in sym:
        reads = SCALES_MINOR
    vm = header.get("vm")
    if isinstance(vm, dict) and "branches" in vm:
        reads = BRANCH_MINOR
    if isinstance(vm, dict) and "loops" in vm:
        reads = LOOP_MINOR
    if isinstance(vm, dict) and "stores" in vm:
        reads = STORE_MINOR
    if isinstance(vm, dict) and "grows" in vm:
        reads = GROW_MINOR
    return reads


def digest_chunk(header: dict, name: str) -> int | None:
    """The tree digest's chunk size of a header, None for a flat digest; BundleError when the
    ``"digest"`` record is malformed."""
    if "digest" not in header:
        return None
    rec = header["digest"]
    chunk = rec.get("chunk") if isinstance(rec, dict) else None
    if (not isinstance(rec, dict) or set(rec) != {"alg", "chunk"} or rec["alg"] != DIGEST_ALG
            or not isinstance(chunk, int) or isinstance(chunk, bool)
            or not MIN_CHUNK <= chunk <= MAX_CHUNK or chunk & (chunk - 1)):
        raise BundleError(f"{name}: header has an invalid digest record {rec!r:.80} (expected "
                          f"alg {DIGEST_ALG!r} and a power-of-two chunk of {MIN_CHUNK} to "
                          f"{MAX_CHUNK} bytes); export it again")
    return chunk


def hash_threads(size: int) -> int:
    """How many threads hash a payload area of ``size`` bytes: one per THREAD_MIN_BYTES, at most
    one per usable core and MAX_HASH_THREADS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_HASH_THREADS, cores, size // THREAD_MIN_BYTES))


def tree_leaves(parts: Sequence[Any], chunk: int, threads: int | None = None) -> bytes:
    """The SHA-256 of every ``chunk``-byte slice of the concatenation of ``parts`` (buffers), in
    order, concatenated (b"" when they are empty). ``threads`` (default ``hash_threads``) split
    the slices into contiguous ranges, one per thread; the calling thread takes the first."""
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if v.nbytes]
    starts = [0]
    for v in views:
        starts.append(starts[-1] + v.nbytes)
    total = starts.pop()
    count = -(-total // chunk)
    leaves: list[bytes] = [b""] * count
    errors: list[BaseException] = []

    def work(first: int, stop: int) -> None:
        try:
            for i in range(first, stop):
                # update() releases the GIL on large buffers (the constructor does not).
                h = hashlib.sha256()
                lo, hi = i * chunk, min((i + 1) * chunk, total)
                j = bisect.bisect_right(starts, lo) - 1
                while lo < hi:
                    end = min(hi, starts[j] + views[j].nbytes)
                    h.update(views[j][lo - starts[j]:end - starts[j]])
                    lo, j = end, j + 1
                leaves[i] = h.digest()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(exc)

    n = max(1, min(threads or hash_threads(total), count))
    bounds = [count * k // n for k in range(n + 1)]
    workers = [threading.Thread(target=work, args=(bounds[k], bounds[k + 1]), daemon=True)
               for k in range(1, n)]
    try:
        for t in workers:
            t.start()
        work(bounds[0], bounds[1])
    finally:
        for t in workers:
            if t.ident is not None:
                t.join()
        for v in views:
            v.release()
    if errors:
        raise errors[0]
    return b"".join(leaves)


def digest_tail(parts: Sequence[Any], chunk: int | None, threads: int | None = None
                ) -> list[Any]:
    """What the content digest hashes after the head: the payload area itself (``chunk`` None,
    flat) or its leaf digests (tree)."""
    return list(parts) if chunk is None else [tree_leaves(parts, chunk, threads)]


def content_digest(head: Any, tail: Sequence[Any]) -> bytes:
    """The stored ``"sha256"``: SHA-256 of ``head`` (the bytes before the ``"sha256"`` key)
    followed by ``tail`` (``digest_tail``)."""
    h = hashlib.sha256()
    h.update(head)
    for part in tail:
        h.update(part)
    return h.digest()


@dataclass(frozen=True)
class PayloadRef:
    offset: int
    size: int


def payload_ref(obj: Any, what: str, data_size: int) -> PayloadRef:
    """Validate a ``{"offset", "size"}`` record against the payload area."""
    if not isinstance(obj, dict):
        raise BundleError(f"bundle header: {what} is not a payload record")
    off, size = obj.get("offset"), obj.get("size")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (off, size)) \
            or off < 0 or size < 0:
        raise BundleError(f"bundle header: {what} has an invalid offset/size")
    if off % ALIGN:
        raise BundleError(f"bundle header: {what} is not {ALIGN}-byte aligned")
    if off + size > data_size:
        raise BundleError(f"bundle header: {what} points past the end of the file "
                          f"({off}+{size} > {data_size})")
    return PayloadRef(off, size)


def check_disjoint(refs: list[tuple[str, PayloadRef]], bundle_name: str) -> None:
    """Refuse payload records that overlap in part (identical records may share a payload)."""
    spans = sorted((r.offset, r.offset + r.size, what) for what, r in refs if r.size)
    for (s0, e0, w0), (s1, e1, w1) in zip(spans, spans[1:]):
        if s1 < e0 and (s0, e0) != (s1, e1):
            raise BundleError(f"{bundle_name}: the payloads of {w0} and {w1} overlap; "
                              "the bundle is malformed: export it again")


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or len(shape) > 16:
        raise BundleError(f"bundle header: {what} has an invalid shape")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40
               for d in shape):
        raise BundleError(f"bundle header: {what} has an invalid shape {shape!r}")
    return tuple(shape)


def check_dtype(dtype: Any, what: str) -> str:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise BundleError(f"bundle header: {what} has an unsupported dtype {dtype!r}")
    return dtype


def nbytes_of(shape: tuple[int, ...], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * storage_dtype(dtype).itemsize


class BundleReader:
    """An open bundle: ``header`` (dict) and zero-copy ``payload(ref)`` views of the file."""

    def __init__(self, path: str | os.PathLike, verify: bool = True) -> None:
        self.path = os.fspath(path)
        self.name = os.path.basename(self.path)
        self._mmap: mmap.mmap | None = None
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < len(MAGIC) + TRAILER_BYTES:
                    raise BundleError(f"{self.name} is too small to be an mlcpack bundle "
                                      f"({size} bytes)")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise BundleError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise BundleError(f"{self.path} is a directory, not a bundle") from None
        except PermissionError:
            raise BundleError(f"{self.path}: permission denied") from None
        except (OSError, ValueError) as exc:
            raise BundleError(f"{self.path} cannot be read: {exc}") from None
        try:
            self._parse(verify)
        except BaseException:
            self.close()
            raise

    def _parse(self, verify: bool) -> None:
        mm = self._mmap
        assert mm is not None
        size = len(mm)
        if mm[:len(MAGIC)] != MAGIC:
            raise BundleError(f"{self.name} is not an mlcpack bundle (bad magic); "
                              "export one with `mlcpack export`")
        mm.seek(len(MAGIC))
        limit = min(size, MAX_HEADER_BYTES)
        unpacker = msgpack.Unpacker(mm, read_size=min(1 << 16, limit), raw=False,
                                    strict_map_key=True,
                                    max_buffer_size=limit, max_str_len=limit, max_bin_len=limit,
                                    max_array_len=limit, max_map_len=limit, max_ext_len=0)
        try:
            header = unpacker.unpack()
        except Exception as exc:  # msgpack raises many types for malformed input
            raise BundleError(f"{self.name}: header is corrupted ({type(exc).__name__}); "
                              "the file is damaged or truncated: export it again") from None
        if not isinstance(header, dict):
            raise BundleError(f"{self.name}: header is not a map")
        header_end = len(MAGIC) + unpacker.tell()
        self._check_version(header)
        trailer = mm[header_end:header_end + TRAILER_BYTES]
        if (len(trailer) != TRAILER_BYTES or not trailer.startswith(DIGEST_KEY)
                or trailer[len(DIGEST_KEY) + 32:-4] != DATA_KEY):
            raise BundleError(f"{self.name} is truncated or damaged after its header; "
                              "export it again")
        digest = trailer[len(DIGEST_KEY):len(DIGEST_KEY) + 32]
        data_size = int.from_bytes(trailer[-4:], "big")
        data_start = header_end + TRAILER_BYTES
        if "payload" in header:   # format 1.4: the area follows the map, at the header's offset
            area = header["payload"]
            if (not isinstance(area, dict) or set(area) != {"offset", "size"}
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                               for v in area.values())
                    or data_size != 0 or area["offset"] != data_start):
                raise BundleError(f"{self.name}: header has an invalid payload area record "
                                  f"{area!r:.80}; export it again")
            data_size = area["size"]
        if data_start + data_size != size:
            raise BundleError(f"{self.name} is truncated or has trailing bytes "
                              f"(payload area says {data_size} bytes, file has "
                              f"{size - data_start}); export it again")
        if data_start % ALIGN:
            raise BundleError(f"{self.name}: payload area is not aligned")
        self.header = header
        self.header_end = header_end
        self.data_start = data_start
        self.data_size = data_size
        self._chunk = digest_chunk(header, self.name)
        self._leaves: bytes | None = None
        if verify and self.content_digest() != digest:
            raise BundleError(f"{self.name} failed its content check (SHA-256 mismatch): "
                              "the file is corrupted; copy or export it again")

    def content_digest(self, head: bytes | None = None) -> bytes:
        """The content digest of this bundle (``content_digest``), with ``head`` in place of the
        file's bytes before the ``"sha256"`` key when given. A tree digest's leaves are computed
        once and kept, so checking a signature after the content costs one small hash."""
        assert self._mmap is not None
        view = memoryview(self._mmap)
        try:
            payload = view[self.data_start:]
            if self._chunk is None:
                tail = [payload]
            else:
                if self._leaves is None:
                    self._leaves = tree_leaves([payload], self._chunk)
                tail = [self._leaves]
            return content_digest(view[:self.header_end] if head is None else head, tail)
        finally:
            view.release()

    def _check_version(self, header: dict) -> None:
        fmt = header.get("format")
        if (not isinstance(fmt, list) or len(fmt) != 2
                or not all(isinstance(v, int) for v in fmt)):
            raise BundleError(f"{self.name}: header has no valid format version")
        major, minor = fmt
        compiler = header.get("compiler", {})
        made_by = compiler.get("version", "?") if isinstance(compiler, dict) else "?"
        if major != FORMAT_MAJOR:
            newer = major > FORMAT_MAJOR
            raise FormatVersionError(
                f"{self.name} has bundle format {major}.{minor} (mlcpack {made_by}); this runtime "
                f"reads format {FORMAT_MAJOR}.x: " + ("upgrade the runtime" if newer else
                                                      "export the model again"))
        reads = reader_minor(header)
        if minor > reads:
            need = header.get("min_reader", fmt)
            if (not isinstance(need, list) or len(need) != 2
                    or not all(isinstance(v, int) for v in need)
                    or tuple(need) > (FORMAT_MAJOR, reads)):
                raise FormatVersionError(
                    f"{self.name} has bundle format {major}.{minor} and needs a runtime that reads "
                    f"{need}; this one reads {FORMAT_MAJOR}.{FORMAT_MINOR}: upgrade the runtime")

    def payload(self, ref: PayloadRef) -> memoryview:
        """A read-only view of a payload (no copy)."""
        assert self._mmap is not None
        start = self.data_start + ref.offset
        return memoryview(self._mmap)[start:start + ref.size]

    def array(self, ref: PayloadRef, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """A read-only numpy view of a payload holding a C-contiguous array."""
        if ref.size != nbytes_of(shape, dtype):
            raise BundleError(f"{self.name}: payload size {ref.size} does not match "
                              f"{shape} {dtype}")
        assert self._mmap is not None
        store = storage_dtype(dtype)
        arr = np.frombuffer(self._mmap, dtype=store, count=ref.size // store.itemsize,
                            offset=self.data_start + ref.offset)
        return arr.reshape(shape)

    def close(self) -> None:
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # numpy views still use the mapping; it is released with them
            self._mmap = None

    def __enter__(self) -> BundleReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
