"""Signing the failure-location tables the trainer publishes.

``--table-signing-key FILE``: an Ed25519 private key, PEM (PKCS#8
``PRIVATE KEY``, as ``polycorn-pki table-key`` writes it) or the raw
32-byte seed of RFC 8032. The signature is detached, over exactly the bytes
published (the table's canonical JSON: ``failure_tables.body_bytes``, the
Kafka message's value, the API's body), so a verifier never re-serialises
anything; it travels as base64 (standard alphabet, padded) in the Kafka
header ``polycorn-signature`` and the API's ``X-Polycorn-Signature``.
Relays and proxies check it with ``--failure-table-verify-key``
(``crates/net/src/table/signature.rs``).
"""

from __future__ import annotations

import base64
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

SEED_BYTES = 32


class SigningKeyError(ValueError):
    pass


class TableSigner:
    """Signs table bytes with one Ed25519 key."""

    def __init__(self, key: Ed25519PrivateKey, origin: str = "<memory>") -> None:
        self._key = key
        self.origin = origin

    @classmethod
    def load(cls, path: Path) -> TableSigner:
        """The key in ``path``: PEM, or exactly 32 bytes (the seed)."""
        try:
            data = path.read_bytes()
        except OSError as e:
            raise SigningKeyError(f"--table-signing-key {path}: {e.strerror or e}") from None
        if len(data) == SEED_BYTES and b"-----BEGIN" not in data:
            return cls(Ed25519PrivateKey.from_private_bytes(data), str(path))
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise SigningKeyError(
                f"--table-signing-key {path}: not an unencrypted PEM private key nor a 32-byte "
                f"Ed25519 seed ({e}); make one with `polycorn-pki table-key`"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(
                f"--table-signing-key {path}: a {type(key).__name__}, not an Ed25519 key; "
                "make one with `polycorn-pki table-key`"
            )
        return cls(key, str(path))

    def sign(self, data: bytes) -> str:
        """The signature of exactly ``data``, base64."""
        return base64.b64encode(self._key.sign(data)).decode("ascii")

    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    def public_pem(self) -> bytes:
        """The public key as relays and proxies take it (``PUBLIC KEY`` PEM)."""
        return self.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def verify(public: Ed25519PublicKey, data: bytes, signature: str | bytes) -> None:
    """Raises ``cryptography.exceptions.InvalidSignature`` unless
    ``signature`` (base64) is ``public``'s over exactly ``data``."""
    public.verify(base64.b64decode(signature, validate=True), data)
