"""API keys and scopes.

A key is a random secret the client sends as ``Authorization: Bearer <key>``
or ``X-API-Key: <key>``. The server knows only its SHA-256 (hex), from
``POLYCORN_API_KEYS`` (``name:scope:sha256hex``, comma separated) and/or the
file ``POLYCORN_API_KEYS_FILE`` (one entry a line, ``#`` comments). Make a key
and its entry with ``polycorn-linkdb-api hash-key NAME SCOPE``.

Scopes, each implying the ones before it:

- ``table``: only ``GET /v1/failure-table``, the current failure-location
  table. This is the key every relay and proxy holds
  (``--failure-table-api-key-file``): there are many of them, on trains and
  in the cloud, so their key must not read the fleet's GPS tracks,
  handovers or trips;
- ``read``: every GET (implies ``table``);
- ``admin``: publishing failure tables (implies ``read`` and ``table``).

A missing or unknown key is 401 with ``WWW-Authenticate``; a known key
without the scope is 403.

Keys are high-entropy random strings, so one unsalted SHA-256 is enough (no
password stretching needed) and a dictionary lookup by hash leaks nothing
useful through timing.
"""

from __future__ import annotations

import enum
import hashlib
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from polycorn_linkdb_api.errors import ForbiddenError, UnauthenticatedError


class Scope(enum.StrEnum):
    table = "table"
    read = "read"
    admin = "admin"


IMPLIES: dict[Scope, frozenset[Scope]] = {
    Scope.table: frozenset({Scope.table}),
    Scope.read: frozenset({Scope.table, Scope.read}),
    Scope.admin: frozenset({Scope.table, Scope.read, Scope.admin}),
}

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


@dataclass(frozen=True)
class Principal:
    name: str
    scope: Scope

    def has(self, scope: Scope) -> bool:
        return scope in IMPLIES[self.scope]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "pck_" + secrets.token_urlsafe(32)


def parse_entries(text: str, origin: str) -> dict[str, Principal]:
    """``name:scope:sha256hex`` entries separated by commas or new lines."""
    keys: dict[str, Principal] = {}
    for n, raw in enumerate(re.split(r"[,\n]", text), 1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) != 3:
            raise ValueError(f"{origin}, entry {n}: expected name:scope:sha256hex, got {entry!r}")
        name, scope, digest = (p.strip() for p in parts)
        if not _NAME.match(name):
            raise ValueError(f"{origin}, entry {n}: bad name {name!r} (letters, digits, _.@-)")
        if scope not in Scope.__members__:
            raise ValueError(
                f"{origin}, entry {n}: scope {scope!r} is not one of "
                + ", ".join(Scope.__members__)
            )
        digest = digest.lower()
        if not _HEX64.match(digest):
            raise ValueError(
                f"{origin}, entry {n}: {name}'s hash is not 64 hex digits (store the SHA-256 "
                "of the key, never the key: polycorn-linkdb-api hash-key)"
            )
        keys[digest] = Principal(name, Scope(scope))
    return keys


def load_keys(env_value: str, file: Path | None) -> dict[str, Principal]:
    keys = parse_entries(env_value, "POLYCORN_API_KEYS")
    if file is not None:
        keys.update(parse_entries(file.read_text(), str(file)))
    return keys


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="linkdb"'}


class KeyStore:
    def __init__(self, keys: dict[str, Principal]) -> None:
        self._keys = keys

    def authenticate(self, request: Request) -> Principal:
        key = request.headers.get("x-api-key")
        if key is None:
            auth = request.headers.get("authorization")
            if auth is not None:
                scheme, _, token = auth.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    raise UnauthenticatedError(
                        "the Authorization header must be 'Bearer <key>'", CHALLENGE
                    )
                key = token.strip()
        if key is None:
            raise UnauthenticatedError(
                "an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                CHALLENGE,
            )
        who = self._keys.get(hash_key(key))
        if who is None:
            raise UnauthenticatedError(
                "unknown API key",
                {"WWW-Authenticate": 'Bearer realm="linkdb", error="invalid_token"'},
            )
        return who

    def require(self, request: Request, scope: Scope) -> Principal:
        who = self.authenticate(request)
        if not who.has(scope):
            raise ForbiddenError(f"key {who.name!r} has scope {who.scope}; this needs {scope}")
        return who
