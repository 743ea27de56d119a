"""The failure-location table format (``crates/telemetry/src/failure_table.rs``).

What the proxies load, what ``failure_tables.body`` holds, and what
``POST /v1/failure-tables`` accepts. The checks are the Rust parser's:
``format`` must be ``polycorn-failure-table/1``; ``version``, ``cell``,
``failures`` and ``handovers`` are unsigned 64-bit integers (no floats, no
strings, no booleans); ``cell`` is not 0; ``position_m`` is a finite number;
``direction`` is ``increasing`` or ``decreasing``. Unknown fields are
ignored, as serde does, and dropped from the stored body.

The canonical body is the JSON of the validated table with sorted keys, no
whitespace, UTF-8, absent optional counts left out (serde's
``skip_serializing_if``). The ETag is the SHA-256 (hex) of those bytes: the
API serves exactly those bytes, so equal ETags mean equal bytes (a strong
validator). Anyone publishing straight into the database (the trainer) must
compute ``etag`` the same way: :func:`canonical` and :func:`etag_of`, which
live in ``polycorn_schema.failure_table`` with the publication lock.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from polycorn_schema.failure_table import FORMAT, canonical

U64_MAX = 2**64 - 1


class Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    cell: StrictInt = Field(le=U64_MAX, description="the data plane's cell ID, not 0")
    direction: Literal["increasing", "decreasing"]
    position_m: StrictFloat | StrictInt = Field(
        description="predicted failure location on the track's linear reference, finite"
    )
    failures: StrictInt | None = Field(default=None, ge=0, le=U64_MAX)
    handovers: StrictInt | None = Field(default=None, ge=0, le=U64_MAX)

    @field_validator("cell")
    @classmethod
    def _cell(cls, v: int) -> int:
        if v == 0:
            raise ValueError("cell 0 means unknown and cannot have a failure location")
        if v < 0:
            raise ValueError("cell must be an unsigned 64-bit integer")
        return v

    @field_validator("position_m")
    @classmethod
    def _position(cls, v: float) -> float:
        try:
            v = float(v)
        except OverflowError:
            raise ValueError("position_m must be a finite number") from None
        if not math.isfinite(v):
            raise ValueError("position_m must be a finite number")
        return v


class TableIn(BaseModel):
    """A table to publish. ``version`` may be left out: the API assigns the
    previous version + 1 (and refuses any other value with 409)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    format: StrictStr
    version: StrictInt | None = Field(default=None, ge=0, le=U64_MAX)
    source: StrictStr = ""
    entries: list[Entry] = Field(max_length=1_000_000)

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v != FORMAT:
            raise ValueError(f"format {v!r} is not {FORMAT!r}")
        return v

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("source cannot contain NUL characters")
        try:
            v.encode()
        except UnicodeEncodeError:
            raise ValueError("source is not valid Unicode (lone surrogate)") from None
        return v


class TableFile(BaseModel):
    """A published table, as served (the proxies' file)."""

    format: Literal["polycorn-failure-table/1"]
    version: int
    source: str
    entries: list[Entry]


def canonical_dict(table: TableIn, version: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": version,
        "source": table.source,
        "entries": [e.model_dump(exclude_none=True) for e in table.entries],
    }


def reserialise(body: dict[str, Any]) -> bytes:
    """The canonical bytes of a stored body (JSONB gives back numbers as it
    stored them; whole-number positions come back as ints)."""
    t = TableIn.model_validate(body)
    return canonical(canonical_dict(t, int(body["version"])))


def if_none_match(header: str | None, etag: str) -> bool:
    """RFC 9110 §13.1.2: weak comparison, a list of tags or ``*``."""
    if header is None:
        return False
    if header.strip() == "*":
        return True
    for tag in header.split(","):
        t = tag.strip()
        if t.startswith("W/"):
            t = t[2:]
        if t.strip('"') == etag:
            return True
    return False
