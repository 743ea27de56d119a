"""Query-parameter types and their checks: bounding boxes, time windows,
keyset cursors. Each failure is an :class:`InvalidInputError` naming the parameter."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
from dataclasses import dataclass
from typing import Annotated

from fastapi import Query

from polycorn_linkdb_api.errors import InvalidInputError, InvalidParam

BIGINT_MAX = 2**63 - 1
# Identifiers (train IDs, carriers): PostgreSQL text cannot hold NUL.
NO_NUL = r"^[^\x00]*$"

Limit = Annotated[int, Query(ge=1, le=1000, description="page size, 1..1000 (default 100)")]
CursorParam = Annotated[
    str | None,
    Query(
        max_length=200,
        description="opaque cursor from the previous page's `next_cursor` (or its `next` link)",
    ),
]
Since = Annotated[
    dt.datetime | None,
    Query(description="RFC 3339 time, inclusive; a time without zone is UTC"),
]
Until = Annotated[
    dt.datetime | None,
    Query(description="RFC 3339 time, exclusive; a time without zone is UTC"),
]
BboxParam = Annotated[
    str | None,
    Query(
        max_length=200,
        description="minlon,minlat,maxlon,maxlat (WGS 84 degrees; min < max; no antimeridian "
        "crossing)",
        examples=["116.0,39.0,117.0,40.0"],
    ),
]
TrainId = Annotated[
    str | None, Query(min_length=1, max_length=128, pattern=NO_NUL, description="train ID")
]
Carrier = Annotated[
    str | None, Query(min_length=1, max_length=64, pattern=NO_NUL, description="carrier name")
]
BigId = Annotated[int | None, Query(ge=1, le=BIGINT_MAX)]


def bad(name: str, reason: str) -> InvalidInputError:
    return InvalidInputError(f"{name}: {reason}", [InvalidParam(name=name, reason=reason)])


@dataclass(frozen=True)
class Bbox:
    min_lon: float
    min_lat: float
    max_lon: float
    max_lat: float

    def area(self) -> float:
        """In square degrees."""
        return (self.max_lon - self.min_lon) * (self.max_lat - self.min_lat)

    def binds(self) -> dict[str, float]:
        return {
            "bb_x0": self.min_lon,
            "bb_y0": self.min_lat,
            "bb_x1": self.max_lon,
            "bb_y1": self.max_lat,
        }


def parse_bbox(raw: str | None) -> Bbox | None:
    if raw is None:
        return None
    name = "query.bbox"
    parts = raw.split(",")
    if len(parts) != 4:
        raise bad(
            name,
            f"expected 4 comma-separated numbers minlon,minlat,maxlon,maxlat, got {len(parts)}",
        )
    try:
        v = [float(p) for p in parts]
    except ValueError:
        raise bad(name, f"not numbers: {raw!r}") from None
    if not all(math.isfinite(x) for x in v):
        raise bad(name, "numbers must be finite")
    x0, y0, x1, y1 = v
    if not (-180 <= x0 <= 180 and -180 <= x1 <= 180):
        raise bad(name, "longitudes must be within -180..180")
    if not (-90 <= y0 <= 90 and -90 <= y1 <= 90):
        raise bad(name, "latitudes must be within -90..90")
    if not (x0 < x1 and y0 < y1):
        raise bad(name, "minlon must be < maxlon and minlat < maxlat")
    return Bbox(x0, y0, x1, y1)


def utc(t: dt.datetime | None) -> dt.datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t


def window(
    since: dt.datetime | None, until: dt.datetime | None
) -> tuple[dt.datetime | None, dt.datetime | None]:
    s, u = utc(since), utc(until)
    if s is not None and u is not None and not s < u:
        raise bad("query.until", "until must be later than since")
    return s, u


# Keyset cursors: base64url of a JSON array [sort key..., id]. Opaque to
# clients; a cursor from one endpoint used on another fails to decode.


def encode_cursor(kind: str, *key: object) -> str:
    raw = json.dumps([kind, *key], separators=(",", ":"), default=_default)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _default(o: object) -> str:
    if isinstance(o, dt.datetime):
        return o.isoformat()
    raise TypeError(type(o).__name__)


def decode_cursor(raw: str | None, kind: str) -> list[object] | None:
    if raw is None:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad("query.cursor", "not a cursor from this API (does not decode)") from None
    if not isinstance(data, list) or not data or data[0] != kind:
        raise bad("query.cursor", f"not a cursor of {kind} (use the one this endpoint returned)")
    return data[1:]


def time_id_cursor(raw: str | None, kind: str) -> tuple[dt.datetime, int] | None:
    key = decode_cursor(raw, kind)
    if key is None:
        return None
    try:
        t_raw, id_raw = key
        t = dt.datetime.fromisoformat(str(t_raw))
        if t.tzinfo is None or not isinstance(id_raw, int) or not 0 <= id_raw <= BIGINT_MAX:
            raise ValueError
    except (ValueError, TypeError):
        raise bad("query.cursor", "cursor is damaged") from None
    return t, id_raw


def int_cursor(raw: str | None, kind: str) -> int | None:
    key = decode_cursor(raw, kind)
    if key is None:
        return None
    if len(key) != 1 or not isinstance(key[0], int) or not 0 <= key[0] <= BIGINT_MAX:
        raise bad("query.cursor", "cursor is damaged")
    return key[0]


def str_cursor(raw: str | None, kind: str) -> str | None:
    key = decode_cursor(raw, kind)
    if key is None:
        return None
    if len(key) != 1 or not isinstance(key[0], str) or "\x00" in key[0]:
        raise bad("query.cursor", "cursor is damaged")
    return key[0]
