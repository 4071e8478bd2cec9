"""Signing bundles at export (``mlcpack export --sign key.pem``) and making keys
(``mlcpack keygen``). The format and what is signed are described in ``runtime/signing.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..runtime.signing import fingerprint
from .errors import ExportError


class SigningError(ExportError):
    """The signing key cannot be read or written, or is not an Ed25519 private key."""


class KeyExistsError(SigningError):
    """``keygen`` was asked to write a key file that exists (a usage error: pick another
    name)."""

    exit_code = 2


class MissingExtraError(SigningError):
    """Signing was asked for where the ``cryptography`` package (the ``sign`` extra) is not
    installed: a usage error (install the extra, or drop ``--sign``), not a failed export."""

    exit_code = 2


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise MissingExtraError("signing bundles needs the 'cryptography' package: "
                           "pip install 'mlcpack[sign]'") from None
    return serialization, ed25519


class Signer:
    """An Ed25519 private key: ``public_key`` (32 raw bytes) and ``sign(message)`` (64 bytes)."""

    def __init__(self, private_key: Any) -> None:
        serialization, _ = _crypto()
        self._key = private_key
        self.public_key = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                                serialization.PublicFormat.Raw)
        self.fingerprint = fingerprint(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


def load_signer(path: str | os.PathLike) -> Signer:
    """Read an unencrypted PEM (PKCS#8) or OpenSSH Ed25519 private key file."""
    serialization, ed25519 = _crypto()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SigningError(f"signing key {os.fspath(path)} cannot be read: "
                           f"{exc.strerror or exc}") from None
    try:
        if b"OPENSSH PRIVATE KEY" in data:
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"{os.fspath(path)} is not an unencrypted Ed25519 private key "
                           f"({exc}); make one with `mlcpack keygen KEY.pem`") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SigningError(f"{os.fspath(path)} holds a {type(key).__name__}; mlcpack signs with "
                           "Ed25519 keys: make one with `mlcpack keygen KEY.pem`")
    return Signer(key)


def generate_key(path: str | os.PathLike) -> tuple[Path, Path, str]:
    """Write a new Ed25519 private key to ``path`` (PEM, mode 0600) and its public key to
    ``path`` + ``.pub`` (PEM); refuse to overwrite. Returns (private, public, fingerprint)."""
    serialization, ed25519 = _crypto()
    private = Path(path)
    public = private.with_name(private.name + ".pub")
    for p in (private, public):
        if p.exists():
            raise KeyExistsError(f"{p} already exists; keygen never overwrites a key: give "
                                 "another file name")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        public.write_bytes(pub)
    except OSError as exc:
        raise SigningError(f"cannot write {private}: {exc.strerror or exc}") from None
    return private, public, Signer(key).fingerprint
