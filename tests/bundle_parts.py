"""Take a bundle apart and put it back together, for tests that damage or rewrite headers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgpack
from mlcpack.packager.bundle_writer import BundleWriter, hashed_tail
from mlcpack.runtime.bundle import (ALIGN, DATA_KEY, DIGEST_KEY, MAGIC, BundleReader, PayloadRef,
                                    content_digest)


def payload_records(obj: Any) -> list[dict]:
    """Every ``{"offset", "size"}`` record in a header, wherever it is nested."""
    if isinstance(obj, dict):
        if set(obj) == {"offset", "size"} and all(isinstance(v, int) for v in obj.values()):
            return [obj]
        return [r for v in obj.values() for r in payload_records(v)]
    if isinstance(obj, list):
        return [r for v in obj for r in payload_records(v)]
    return []


def payload_spans(header: dict) -> list[tuple[int, int]]:
    """The distinct (offset, size) payload spans of a header, in file order."""
    return sorted({(r["offset"], r["size"]) for r in payload_records(header)})


def read_parts(path: Path) -> tuple[dict, list[bytes]]:
    """The header (without the writer's padding) and the payloads in file order."""
    with BundleReader(path) as reader:
        header = copy.deepcopy(reader.header)
        header.pop("pad", None)
        payloads = [bytes(reader.payload(PayloadRef(o, s))) for o, s in payload_spans(header)]
    return header, payloads


def write_parts(path: Path, header: dict, payloads: list[bytes]) -> Path:
    """Write ``header`` over ``payloads`` with a valid digest (flat or tree, as the header's
    ``"digest"`` record says): the offsets the writer gives back are the ones the original header
    holds."""
    writer = BundleWriter()
    offset = 0
    for data in payloads:
        assert writer.add(data) == {"offset": offset, "size": len(data)}
        offset += len(data) + (-len(data) % ALIGN)
    writer.write(path, header)
    return path


def pack(header: dict, payloads: list[bytes]) -> bytes:
    """A bundle of ``header`` (keys in its own order, nothing added: unlike ``write_parts`` no
    format or min_reader is filled in) over ``payloads``, aligned, with a correct digest (tree when
    the header has a valid ``"digest"`` record, else flat)."""
    body = b"".join(p + b"\0" * (-len(p) % ALIGN) for p in payloads)
    for n in range(2 * ALIGN):
        packed = msgpack.packb({**header, "pad": b"\0" * n}, use_bin_type=True)
        if (len(MAGIC) + len(packed) + len(DIGEST_KEY) + 32 + len(DATA_KEY) + 4) % ALIGN == 0:
            break
    head = MAGIC + packed
    digest = content_digest(head, hashed_tail(header, [body]))
    return head + DIGEST_KEY + digest + DATA_KEY + len(body).to_bytes(4, "big") + body
