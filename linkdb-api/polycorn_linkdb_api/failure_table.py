"""The failure-location table format (``crates/telemetry/src/failure_table.rs``).

What the proxies load, what ``failure_tables.body`` holds, and what
``POST /v1/failure-tables`` accepts. The checks are the Rust parser's:
``format`` must be ``polycorn-failure-table/1``; ``version``, ``cell``,
``failures`` and ``handovers`` are unsigned 64-bit integers (no floats, no
strings, no booleans); ``cell`` is not 0; ``position_m`` is a finite number;
``direction`` is ``increasing`` or ``decreasing``; the optional map-matching
fields as the Rust parser checks them: an entry's ``route``
(1–128 characters), ``lat``/``lon``; ``routes`` with unique ids, at least
two ``[lon, lat]`` vertices in WGS 84 each with a finite, non-decreasing
measure, at most 2,000,000 vertices in all. Unknown fields are ignored, as
serde does, and dropped from the stored body.

The canonical body is the JSON of the validated table with sorted keys, no
whitespace, UTF-8, absent optional counts left out (serde's
``skip_serializing_if``). The ETag is the SHA-256 (hex) of those bytes: the
API serves exactly those bytes, so equal ETags mean equal bytes (a strong
validator). Anyone publishing straight into the database (the trainer) must
compute ``etag`` the same way: :func:`canonical` and :func:`etag_of`, which
live in ``polycorn_schema.failure_table`` with the publication lock.
"""

from __future__ import annotations

import itertools
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


def _finite(v: float, error: str = "numbers must be finite") -> float:
    try:
        f = float(v)
    except OverflowError:
        raise ValueError(error) from None
    if not math.isfinite(f):
        raise ValueError(error)
    return f


class Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    cell: StrictInt = Field(le=U64_MAX, description="the data plane's cell ID, not 0")
    direction: Literal["increasing", "decreasing"]
    position_m: StrictFloat | StrictInt = Field(
        description="predicted failure location on the track's linear reference, finite"
    )
    failures: StrictInt | None = Field(default=None, ge=0, le=U64_MAX)
    handovers: StrictInt | None = Field(default=None, ge=0, le=U64_MAX)
    route: StrictStr | None = Field(
        default=None, min_length=1, max_length=128, description="the route position_m is on"
    )
    lat: StrictFloat | StrictInt | None = Field(default=None, ge=-90, le=90)
    lon: StrictFloat | StrictInt | None = Field(default=None, ge=-180, le=180)

    @field_validator("cell")
    @classmethod
    def _cell(cls, v: int) -> int:
        if v == 0:
            raise ValueError("cell 0 means unknown and cannot have a failure location")
        if v < 0:
            raise ValueError("cell must be an unsigned 64-bit integer")
        return v

    @field_validator("lat", "lon")
    @classmethod
    def _point(cls, v: float | None) -> float | None:
        return None if v is None else _finite(v)

    @field_validator("position_m")
    @classmethod
    def _position(cls, v: float) -> float:
        return _finite(v, "position_m must be a finite number")


MAX_ROUTE_VERTICES = 2_000_000


class RouteLine(BaseModel):
    """A route's reference line: ``[lon, lat]`` vertices in the direction of
    increasing measure, each with its measure (metres)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: StrictStr = Field(min_length=1, max_length=128)
    coords: list[list[StrictFloat | StrictInt]] = Field(min_length=2)
    measures: list[StrictFloat | StrictInt] = Field(min_length=2)

    @field_validator("coords")
    @classmethod
    def _coords(cls, v: list[list[float]]) -> list[list[float]]:
        out = []
        for c in v:
            if len(c) != 2:
                raise ValueError("a vertex is [lon, lat]")
            lon, lat = _finite(c[0]), _finite(c[1])
            if abs(lon) > 180 or abs(lat) > 90:
                raise ValueError("a vertex is not in WGS 84")
            out.append([lon, lat])
        return out

    @field_validator("measures")
    @classmethod
    def _measures(cls, v: list[float]) -> list[float]:
        ms = [_finite(m) for m in v]
        if any(b < a for a, b in itertools.pairwise(ms)):
            raise ValueError("measures must be non-decreasing")
        return ms


class TableIn(BaseModel):
    """A table to publish. ``version`` may be left out: the API assigns the
    previous version + 1 (and refuses any other value with 409)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    format: StrictStr
    version: StrictInt | None = Field(default=None, ge=0, le=U64_MAX)
    source: StrictStr = ""
    entries: list[Entry] = Field(max_length=1_000_000)
    routes: list[RouteLine] = Field(default_factory=list, max_length=100_000)

    @field_validator("routes")
    @classmethod
    def _routes(cls, v: list[RouteLine]) -> list[RouteLine]:
        if len({r.id for r in v}) != len(v):
            raise ValueError("route ids must be unique")
        for r in v:
            if len(r.coords) != len(r.measures):
                raise ValueError(f"route {r.id!r}: each vertex needs one measure")
        if sum(len(r.coords) for r in v) > MAX_ROUTE_VERTICES:
            raise ValueError(f"more than {MAX_ROUTE_VERTICES} route vertices")
        return v

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
    routes: list[RouteLine] | None = Field(
        default=None, description="reference lines of the entries' routes (absent when none)"
    )


def canonical_dict(table: TableIn, version: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": FORMAT,
        "version": version,
        "source": table.source,
        "entries": [e.model_dump(exclude_none=True) for e in table.entries],
    }
    if table.routes:
        out["routes"] = [r.model_dump() for r in table.routes]
    return out


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
