"""Optional Ed25519 signatures on bundles, checked when ``load(..., trusted_keys=[...])`` is given.

Where the signature lives: a signed bundle's header has one more key, written last (before the
writer's padding), so any msgpack reader still opens the file and an older runtime ignores it::

    "signature": {"alg": "ed25519", "key": <32-byte public key>, "sig": <64-byte signature>}

What it signs: ``b"mlcpack-bundle-signature-v1\\0" + D``, where ``D`` is the bundle's content digest
computed exactly as the ``"sha256"`` field is (``runtime/bundle.py``: SHA-256 of the bytes before
``"sha256"`` followed by the payload area, or by its chunk digests in a tree-digest bundle) but
with the 64 signature bytes set to zero. The writer packs the header with a zero signature (same
length, so nothing moves), computes ``D``, signs it, writes the signature into its place and only
then computes the stored ``"sha256"``, which so covers the signature as well. The reader finds the
signature bytes in the header by their encoding (``"sig"`` key, bin8 of 64) followed by the value
it parsed, zeroes them in a copy and recomputes ``D``: no re-packing, so the check does not depend
on how a writer encoded the rest of the header. The signature lies in the head, never in the
payload area, so a tree digest's chunk digests are computed once for both checks.

The runtime imports ``cryptography`` only here, and only when trusted keys are given.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any, Iterable

from .errors import SignatureError, install_hint

if TYPE_CHECKING:
    from .bundle import BundleReader

SIGNATURE_KEY = "signature"
ALGORITHM = "ed25519"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
SIG_FIELD = b"\xa3sig\xc4\x40"     # fixstr "sig", then bin8 of 64 bytes
DOMAIN = b"mlcpack-bundle-signature-v1\0"


def signed_message(digest: bytes) -> bytes:
    """What an Ed25519 signature of a bundle signs, given its zero-signature digest."""
    return DOMAIN + digest


def fingerprint(public_key: bytes) -> str:
    """A short, stable name for a public key: the first 8 bytes of its SHA-256, in hex."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def _crypto() -> Any:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SignatureError("checking bundle signatures needs the 'cryptography' package: "
                             f"{install_hint('sign')}") from None
    return InvalidSignature, serialization, ed25519


def public_key_bytes(key: Any) -> bytes:
    """The raw 32-byte Ed25519 public key of ``key``: an ``Ed25519PublicKey`` (or private key),
    raw bytes, PEM or OpenSSH text/bytes, or the path of a file holding one."""
    _, serialization, ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        key = key.public_key()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if isinstance(key, (bytes, bytearray)) and len(key) == PUBLIC_KEY_BYTES:
        return bytes(key)
    if isinstance(key, (str, os.PathLike)) and not str(key).lstrip().startswith(("-----", "ssh-")):
        try:
            with open(key, "rb") as f:
                key = f.read()
        except OSError as exc:
            raise SignatureError(f"trusted key {os.fspath(key)!r} cannot be read: "
                                 f"{exc.strerror or exc}") from None
    data = key.encode() if isinstance(key, str) else bytes(key)
    try:
        if data.lstrip().startswith(b"ssh-"):
            loaded = serialization.load_ssh_public_key(data.strip())
        elif b"PRIVATE KEY" in data:
            loaded = serialization.load_pem_private_key(data, password=None).public_key()
        else:
            loaded = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"a trusted key is not an Ed25519 public key ({exc})") from None
    if not isinstance(loaded, ed25519.Ed25519PublicKey):
        raise SignatureError(f"a trusted key is a {type(loaded).__name__}, not an Ed25519 key")
    return loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def signature_record(header: dict, name: str) -> tuple[bytes, bytes] | None:
    """``(public key, signature)`` of a header, None when it has no signature; a malformed record
    is a SignatureError."""
    rec = header.get(SIGNATURE_KEY)
    if rec is None:
        return None
    if (not isinstance(rec, dict) or rec.get("alg") != ALGORITHM
            or not isinstance(rec.get("key"), bytes) or len(rec["key"]) != PUBLIC_KEY_BYTES
            or not isinstance(rec.get("sig"), bytes) or len(rec["sig"]) != SIGNATURE_BYTES):
        raise SignatureError(f"{name} has a malformed signature record (expected alg "
                             f"{ALGORITHM!r}, a {PUBLIC_KEY_BYTES}-byte key and a "
                             f"{SIGNATURE_BYTES}-byte sig): export it again with --sign")
    return rec["key"], rec["sig"]


def zero_signature_digest(reader: BundleReader, sig: bytes) -> bytes:
    """The bundle's content digest with its 64 signature bytes zeroed (see the module doc)."""
    mm = reader._mmap
    assert mm is not None
    head = bytearray(mm[:reader.header_end])
    needle = SIG_FIELD + sig
    at = head.find(needle)
    if at < 0 or head.find(needle, at + 1) >= 0:
        raise SignatureError(f"{reader.name}: the signature cannot be located in the header; "
                             "the bundle is malformed: export it again with --sign")
    start = at + len(SIG_FIELD)
    head[start:start + SIGNATURE_BYTES] = bytes(SIGNATURE_BYTES)
    return reader.content_digest(bytes(head))


def check_signature(reader: BundleReader, trusted_keys: Iterable[Any]) -> str:
    """Refuse the bundle (SignatureError) unless one of ``trusted_keys`` signed it; return the
    signing key's fingerprint."""
    keys = {public_key_bytes(k) for k in trusted_keys}
    record = signature_record(reader.header, reader.name)
    if record is None:
        raise SignatureError(f"{reader.name} is not signed, and this application only runs "
                             "bundles signed by its trusted keys: export it with --sign KEY")
    key, sig = record
    if key not in keys:
        raise SignatureError(f"{reader.name} is signed by key {fingerprint(key)}, which is not "
                             "one of the trusted keys: export it with a trusted key")
    invalid, _, ed25519 = _crypto()
    digest = zero_signature_digest(reader, sig)
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(key).verify(sig, signed_message(digest))
    except invalid:
        raise SignatureError(f"{reader.name}: its signature by key {fingerprint(key)} does not "
                             "verify: the bundle was changed after signing; do not run it") from None
    return fingerprint(key)
