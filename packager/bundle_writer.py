"""Writes bundles in the format the runtime's ``BundleReader`` reads (see ``runtime/bundle.py``).

The file is written to a temporary name in the destination folder and renamed into place only
once complete, so a failed export never leaves a partial bundle behind.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import msgpack
import numpy as np

from ..runtime.bundle import ALIGN, DATA_KEY, DIGEST_KEY, FORMAT_MAJOR, FORMAT_MINOR, MAGIC
from ..runtime.signing import (ALGORITHM, SIG_FIELD, SIGNATURE_BYTES, SIGNATURE_KEY,
                               signed_message)


class BundleWriteError(Exception):
    """The bundle could not be written (unwritable folder, full disk...)."""


class BundleWriter:
    """Collects payloads (each 64-byte aligned) and writes header + payloads atomically."""

    def __init__(self) -> None:
        self._chunks: list[bytes | memoryview] = []
        self._size = 0

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

    def _header_bytes(self, header: dict[str, Any]) -> bytes:
        # Pad the header so the payload area starts on an ALIGN boundary of the file.
        for n in range(2 * ALIGN):
            packed = msgpack.packb({**header, "pad": b"\0" * n}, use_bin_type=True)
            data_start = len(MAGIC) + len(packed) + len(DIGEST_KEY) + 32 + len(DATA_KEY) + 4
            if data_start % ALIGN == 0:
                return packed
        raise AssertionError("no header padding aligns the payload area")

    def _digest(self, head: bytes) -> Any:
        digest = hashlib.sha256(head)
        for chunk in self._chunks:
            digest.update(chunk)
        return digest

    def _signed(self, head: bytes, signer: Any) -> bytes:
        # Sign the digest taken with a zero signature in place, then put the signature there
        # (same length: nothing moves). runtime/signing.py describes the check.
        placeholder = SIG_FIELD + bytes(SIGNATURE_BYTES)
        at = head.find(placeholder)
        assert at >= 0 and head.find(placeholder, at + 1) < 0, "signature placeholder not unique"
        sig = signer.sign(signed_message(self._digest(head).digest()))
        assert len(sig) == SIGNATURE_BYTES
        return head[:at + len(SIG_FIELD)] + sig + head[at + len(placeholder):]

    def write(self, path: str | os.PathLike, header: dict[str, Any], signer: Any = None) -> int:
        """Write the bundle to ``path`` atomically; return its size in bytes. ``signer``
        (``packager.signing.Signer``) adds an Ed25519 signature to the header."""
        header = {"format": [FORMAT_MAJOR, FORMAT_MINOR],
                  "min_reader": [FORMAT_MAJOR, FORMAT_MINOR], **header}
        if signer is not None:
            header[SIGNATURE_KEY] = {"alg": ALGORITHM, "key": signer.public_key,
                                     "sig": bytes(SIGNATURE_BYTES)}
        head = MAGIC + self._header_bytes(header)
        if signer is not None:
            head = self._signed(head, signer)
        digest = self._digest(head)
        trailer = DIGEST_KEY + digest.digest() + DATA_KEY + self._size.to_bytes(4, "big")
        if self._size >= 1 << 32:
            raise BundleWriteError("payloads exceed 4 GiB, the format's limit")
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
