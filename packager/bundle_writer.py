"""Writes bundles in the format the runtime's ``BundleReader`` reads (see ``runtime/bundle.py``).

Every bundle says format 1.2 unless its header says otherwise (symbolic shapes: 1.3). A payload
area of ``TREE_MIN_BYTES`` or more gets a tree digest (chunk digests the reader checks on several
threads) and ``min_reader`` [1, 2]; a smaller one keeps the flat digest of format 1.1 and the
caller's ``min_reader`` (1.0 for exports), so older runtimes keep reading small bundles. A payload
area of ``PAYLOAD64_MIN_BYTES`` (4 GiB) or more, too large for msgpack's ``bin32``, is written
after the map (format 1.4, ``min_reader`` [1, 4]: older runtimes refuse it by its version).

The file is written to a temporary name in the destination folder and renamed into place only
once complete, so a failed export never leaves a partial bundle behind.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import msgpack
import numpy as np

from ..runtime.bundle import (ALIGN, DATA_KEY, DIGEST_ALG, DIGEST_KEY, FORMAT_MAJOR,
                              FORMAT_MINOR, MAGIC, PAYLOAD64_FORMAT, TRAILER_BYTES, TREE_FORMAT,
                              content_digest, digest_chunk, digest_tail)
from ..runtime.errors import BundleError
from ..runtime.header import Digest, Header, PayloadRef, Signature
from ..runtime.signing import (ALGORITHM, SIG_FIELD, SIGNATURE_BYTES, SIGNATURE_KEY,
                               signed_message)


TREE_MIN_BYTES = 8 << 20   # payload areas this large get a tree digest
TREE_CHUNK = 1 << 20
PAYLOAD64_MIN_BYTES = 1 << 32   # payload areas this large follow the map (format 1.4)


class BundleWriteError(Exception):
    """The bundle could not be written (unwritable folder, full disk...)."""


def hashed_tail(header: dict[str, Any], parts: list[Any]) -> list[Any]:
    """``digest_tail`` of ``parts`` under the header's digest record; a malformed record (which
    the reader refuses anyway) hashes flat."""
    try:
        chunk = digest_chunk(header, "bundle")
    except BundleError:
        chunk = None
    return digest_tail(parts, chunk)


def head_bytes(header: dict[str, Any], payload_size: int | None = None) -> bytes:
    """``MAGIC`` and the packed header, padded so that the payload area starts on an ALIGN
    boundary of the file. ``payload_size`` given: the format-1.4 layout, the header's
    ``"payload"`` record pointing just past the (empty) ``"data"``, where the area follows."""
    for n in range(2 * ALIGN):
        offset = 0
        for _ in range(4):   # the record's own width moves the area: settle on a fixed point
            full = header if payload_size is None else \
                {**header, "payload": {"offset": offset, "size": payload_size}}
            packed = msgpack.packb({**full, "pad": b"\0" * n}, use_bin_type=True)
            data_start = len(MAGIC) + len(packed) + TRAILER_BYTES
            if payload_size is None or data_start == offset:
                break
            offset = data_start
        if data_start % ALIGN == 0 and (payload_size is None or data_start == offset):
            return MAGIC + packed
    raise AssertionError("no header padding aligns the payload area")


class BundleWriter:
    """Collects payloads (each 64-byte aligned) and writes header + payloads atomically.
    ``tree_min_bytes`` and ``tree_chunk`` (default ``TREE_MIN_BYTES`` and ``TREE_CHUNK``) choose
    when a bundle gets a tree digest and its chunk size; ``payload64_min_bytes`` (default
    ``PAYLOAD64_MIN_BYTES``) when its payload area follows the map (format 1.4)."""

    def __init__(self, tree_min_bytes: int | None = None, tree_chunk: int | None = None,
                 payload64_min_bytes: int | None = None) -> None:
        self._chunks: list[bytes | memoryview] = []
        self._size = 0
        self.tree_min_bytes = TREE_MIN_BYTES if tree_min_bytes is None else tree_min_bytes
        self.tree_chunk = TREE_CHUNK if tree_chunk is None else tree_chunk
        self.payload64_min_bytes = (PAYLOAD64_MIN_BYTES if payload64_min_bytes is None
                                    else payload64_min_bytes)
        digest_chunk({"digest": {"alg": DIGEST_ALG, "chunk": self.tree_chunk}}, "BundleWriter")

    def ref(self, data: bytes | memoryview | np.ndarray) -> PayloadRef:
        """Append a payload; return its header record."""
        record = self.add(data)
        return PayloadRef(record["offset"], record["size"])

    def add(self, data: bytes | memoryview | np.ndarray) -> dict[str, int]:
        """Append a payload; return its ``{"offset", "size"}`` record for the header."""
        if isinstance(data, np.ndarray):
            # Flatten to bytes through numpy: memoryview.cast refuses zero-size shapes.
            data = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        view = memoryview(data).cast("B")
        record = {"offset": self._size, "size": view.nbytes}
        self._chunks.append(view)
        self._size += view.nbytes
        pad = -self._size % ALIGN
        if pad:
            self._chunks.append(b"\0" * pad)
            self._size += pad
        return record

    def complete(self, header: Header, signer: Any = None) -> Header:
        """``header`` with what the writer decides: ``min_reader`` (the current version when the
        header has none), the tree digest for a payload area of ``tree_min_bytes`` or more (and
        ``min_reader`` at least 1.2), format 1.4 for one of ``payload64_min_bytes`` or more, and
        a zero signature of ``signer``'s key (signed once the head is packed: ``_signed``)."""
        need = header.min_reader or (FORMAT_MAJOR, FORMAT_MINOR)
        digest = header.digest
        if digest is None and self._size >= self.tree_min_bytes:
            digest = Digest(DIGEST_ALG, self.tree_chunk)
            need = max(need, tuple(TREE_FORMAT))
        fmt = header.format
        if self._size >= self.payload64_min_bytes:
            fmt = need = max(tuple(PAYLOAD64_FORMAT), tuple(fmt))
        signature = header.signature
        if signer is not None:
            signature = Signature(ALGORITHM, signer.public_key, bytes(SIGNATURE_BYTES))
        return dataclasses.replace(header, format=fmt, min_reader=need, digest=digest,
                                   signature=signature)

    def _complete_map(self, header: dict[str, Any], signer: Any, large: bool
                      ) -> dict[str, Any]:
        """``complete`` for a plain map (tests write damaged headers through it): the same
        decisions, written into a copy, whatever else the map holds."""
        header = {"format": [FORMAT_MAJOR, FORMAT_MINOR],
                  "min_reader": [FORMAT_MAJOR, FORMAT_MINOR], **header}
        if "digest" not in header and self._size >= self.tree_min_bytes:
            header["digest"] = {"alg": DIGEST_ALG, "chunk": self.tree_chunk}
            need = header["min_reader"]
            if isinstance(need, list) and all(isinstance(v, int) for v in need):
                header["min_reader"] = max(need, TREE_FORMAT)
        if large:
            header["format"] = header["min_reader"] = list(PAYLOAD64_FORMAT)
        if signer is not None:
            header[SIGNATURE_KEY] = {"alg": ALGORITHM, "key": signer.public_key,
                                     "sig": bytes(SIGNATURE_BYTES)}
        return header

    def _signed(self, head: bytes, tail: list[Any], signer: Any) -> bytes:
        # Sign the digest taken with a zero signature in place, then put the signature there
        # (same length: nothing moves). runtime/signing.py describes the check.
        placeholder = SIG_FIELD + bytes(SIGNATURE_BYTES)
        at = head.find(placeholder)
        assert at >= 0 and head.find(placeholder, at + 1) < 0, "signature placeholder not unique"
        sig = signer.sign(signed_message(content_digest(head, tail)))
        assert len(sig) == SIGNATURE_BYTES
        return head[:at + len(SIG_FIELD)] + sig + head[at + len(placeholder):]

    def write(self, path: str | os.PathLike, header: Header | dict[str, Any],
              signer: Any = None) -> int:
        """Write the bundle to ``path`` atomically; return its size in bytes. ``header`` is a
        ``runtime.header.Header`` (what exports write) or a map (tests write damaged ones).
        ``signer`` (``packager.signing.Signer``) adds an Ed25519 signature to the header. A
        ``"digest"`` record in ``header`` is written as given (tests use it); otherwise the
        payload area's size chooses the digest (see the module doc)."""
        large = self._size >= self.payload64_min_bytes   # too large for a bin32: format 1.4
        if isinstance(header, Header):
            typed = self.complete(header, signer)
            # what the runtime will refuse is never written (nothing is left behind)
            fields = typed.to_msgpack()
            try:
                Header.from_msgpack(fields, self._size, os.path.basename(os.fspath(path)))
            except BundleError as exc:
                raise BundleWriteError(f"internal error: the runtime would refuse this bundle: "
                                       f"{exc} (please report it)") from None
            tail = digest_tail(self._chunks, typed.digest.chunk if typed.digest else None)
        else:
            fields = self._complete_map(header, signer, large)
            tail = hashed_tail(fields, self._chunks)
        head = head_bytes(fields, self._size if large else None)
        if signer is not None:
            head = self._signed(head, tail, signer)
        trailer = (DIGEST_KEY + content_digest(head, tail) + DATA_KEY
                   + (0 if large else self._size).to_bytes(4, "big"))
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".mlcpack-", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "wb") as f:
                f.write(head)
                f.write(trailer)
                for chunk in self._chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise BundleWriteError(f"cannot write {path}: {reason}") from None
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
        return len(head) + len(trailer) + self._size
