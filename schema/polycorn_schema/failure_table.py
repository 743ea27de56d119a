"""The failure-location table's wire form, shared by every publisher.

The table format itself is ``crates/telemetry/src/failure_table.rs`` (what the
proxies and relays parse); linkdb-api validates tables posted to it with the
same rules. Every publisher (linkdb-api's ``POST /v1/failure-tables``, the
trainer) stores and sends the same bytes:

- :func:`canonical`: the JSON of the table with sorted keys, no whitespace,
  UTF-8, absent optional counts left out, positions as floats. These are the
  bytes ``GET /v1/failure-table`` serves, ``failure_tables.body`` holds, and
  the value of the table's Kafka message.
- :func:`etag_of`: the SHA-256 (hex) of those bytes, the strong ETag.
- :data:`PUBLISH_LOCK`: publishers take this transaction-level advisory lock
  before reading the highest version, so two publications never race for the
  same version.
- :data:`KAFKA_KEY`: the one key of the compacted topic
  ``polycorn.failure-tables.v1`` (compaction keeps the latest table).
- :data:`HEADER_SIGNATURE` (Kafka) and :data:`HTTP_SIGNATURE_HEADER` (the
  API): the trainer's detached Ed25519 signature of exactly those bytes,
  base64 (standard alphabet, padded), stored in ``failure_tables.signature``
  beside the bytes themselves (``failure_tables.body_bytes``). Relays and
  proxies with ``--failure-table-verify-key`` take no table without it
  (``crates/net/src/table/signature.rs``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FORMAT = "polycorn-failure-table/1"
PUBLISH_LOCK = 0x706F6C79636F726E  # "polycorn"; a bigint key
TOPIC = "polycorn.failure-tables.v1"
KAFKA_KEY = b"fleet"
HEADER_VERSION = "polycorn-version"
HEADER_ETAG = "polycorn-etag"
HEADER_SIGNATURE = "polycorn-signature"
HTTP_SIGNATURE_HEADER = "X-Polycorn-Signature"


def canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def etag_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
