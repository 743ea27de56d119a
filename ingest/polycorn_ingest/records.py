"""Decode and validate telemetry records: the pure step between Kafka and LinkDB.

:func:`decode` turns one Kafka message (key, value) into one :class:`Rows`
entry or a :class:`Rejected` with a reason from :data:`REASONS` (a bounded
set: it is a metric label and the ``polycorn-error`` header's prefix). No
I/O, no clock: everything here is a function of the bytes.

The row tuples are in the column order of the sink's staging tables
(``sink.STAGING``); times stay integer Unix milliseconds until the database
turns them into ``timestamptz`` (exact, no float rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from google.protobuf.message import DecodeError

import polycorn_schema.telemetry.v1.telemetry_pb2 as pb

# Why a record went to the dead-letter topic (label values of
# polycorn_ingest_dead_letters_total{reason}).
REASONS: Final = (
    "decode_error",  # the value is not a polycorn.telemetry.v1.Record
    "no_body",  # a Record without gps/cell/handover/path
    "no_train_id",  # train_id empty
    "key_mismatch",  # Kafka key missing or different from train_id
    "bad_time",  # time outside 1990-01-01 .. 2200-01-01
    "bad_position",  # lat/lon not finite, out of range, or exactly (0, 0)
    "bad_value",  # another field out of range for its LinkDB column
    "db_rejected",  # the database refused the row for a data reason
)

# Plausible record times (Unix ms): anything else is a broken clock or a
# unit error (seconds or microseconds instead of milliseconds).
MIN_TIME_MS: Final = 631_152_000_000  # 1990-01-01
MAX_TIME_MS: Final = 7_258_118_400_000  # 2200-01-01
I16: Final = 2**15 - 1
I32: Final = 2**31 - 1
I64: Final = 2**63 - 1
MAX_TRAIN_ID: Final = 128  # trains.id String(128)
MAX_CARRIER: Final = 64  # carrier String(64)

REGISTRATION: Final = {
    pb.REGISTRATION_STATE_UNSPECIFIED: "unspecified",
    pb.REGISTRATION_STATE_REGISTERED: "registered",
    pb.REGISTRATION_STATE_SEARCHING: "searching",
    pb.REGISTRATION_STATE_DENIED: "denied",
    pb.REGISTRATION_STATE_IDLE: "idle",
}
OUTCOME: Final = {pb.HANDOVER_OUTCOME_SUCCESS: "success", pb.HANDOVER_OUTCOME_FAILURE: "failure"}

# Staging row types (see sink.STAGING for the column names).
FixRow = tuple[str, int, float, float, float | None, float | None, float | None, float | None]
# train, path, time, carrier, cell, RSRP, registration, measured time, then
# RSRQ, SINR and network mode (drive-test logs only; telemetry has RSRP alone).
SampleRow = tuple[
    str, int, int, str, int, float | None, str, int | None, float | None, float | None, str | None
]
PathRow = tuple[str, int, int, str, bool, int, int, int, int, int, int, int]
HandoverRow = tuple[
    str, str, int | None, int, int, int, float, float, float | None, float | None, str, int
]


class InvalidRecordError(Exception):
    """A record that cannot go into LinkDB; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Rows:
    """A batch's decoded rows, per LinkDB table, plus each train's time span."""

    fixes: list[FixRow] = field(default_factory=list)
    samples: list[SampleRow] = field(default_factory=list)
    paths: list[PathRow] = field(default_factory=list)
    handovers: list[HandoverRow] = field(default_factory=list)
    # train id -> [first, last] record time (Unix ms), for trains.first/last_seen.
    seen: dict[str, list[int]] = field(default_factory=dict)
    # Every record's time (Unix ms), for the end-to-end lag.
    times: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.fixes) + len(self.samples) + len(self.paths) + len(self.handovers)

    def see(self, train_id: str, t_ms: int) -> None:
        span = self.seen.get(train_id)
        if span is None:
            self.seen[train_id] = [t_ms, t_ms]
        elif t_ms < span[0]:
            span[0] = t_ms
        elif t_ms > span[1]:
            span[1] = t_ms

    def extend(self, other: Rows) -> None:
        self.fixes.extend(other.fixes)
        self.samples.extend(other.samples)
        self.paths.extend(other.paths)
        self.handovers.extend(other.handovers)
        self.times.extend(other.times)
        for train, (lo, hi) in other.seen.items():
            self.see(train, lo)
            self.see(train, hi)


def _finite(x: float, what: str) -> float:
    if not math.isfinite(x):
        raise InvalidRecordError("bad_value", f"{what} is {x}")
    return x


def _time(t_ms: int, what: str) -> int:
    if not MIN_TIME_MS <= t_ms < MAX_TIME_MS:
        raise InvalidRecordError("bad_time", f"{what} {t_ms} ms is not between 1990 and 2200")
    return t_ms


def _position(lat: float, lon: float) -> None:
    if not (math.isfinite(lat) and math.isfinite(lon)):
        raise InvalidRecordError("bad_position", f"lat/lon not finite ({lat}, {lon})")
    if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0):
        raise InvalidRecordError("bad_position", f"lat/lon out of range ({lat}, {lon})")
    if lat == 0.0 and lon == 0.0:
        raise InvalidRecordError("bad_position", "lat/lon (0, 0): no fix")


def _text(s: str, what: str, limit: int) -> str:
    if not s:
        raise InvalidRecordError("bad_value", f"{what} is empty")
    if len(s) > limit:
        raise InvalidRecordError("bad_value", f"{what} is longer than {limit} characters")
    if "\x00" in s:
        raise InvalidRecordError("bad_value", f"{what} contains a NUL character")
    return s


def _path(p: int) -> int:
    if p > I16:
        raise InvalidRecordError("bad_value", f"path {p} > {I16}")
    return p


def _u64(v: int, what: str, limit: int = I64) -> int:
    if v > limit:
        raise InvalidRecordError("bad_value", f"{what} {v} > {limit}")
    return v


def check_train_id(train_id: str, key: bytes | None) -> None:
    if not train_id:
        raise InvalidRecordError("no_train_id", "train_id is empty")
    _text(train_id, "train_id", MAX_TRAIN_ID)
    if key is None or key != train_id.encode():
        raise InvalidRecordError("key_mismatch", f"key {key!r} is not the train_id {train_id!r}")


def decode(key: bytes | None, value: bytes | None, rows: Rows) -> None:
    """Decode one message and append its row to ``rows``; raises :class:`InvalidRecordError`."""
    if not value:
        raise InvalidRecordError("decode_error", "empty value")
    rec = pb.Record()
    try:
        rec.ParseFromString(value)
    except DecodeError as e:
        raise InvalidRecordError("decode_error", f"not a telemetry.v1.Record: {e}") from None
    add_record(rec, key, rows)


def add_record(rec: pb.Record, key: bytes | None, rows: Rows) -> None:
    """Validate a decoded Record and append its row (used by the importer's tests too)."""
    kind = rec.WhichOneof("body")
    if kind is None:
        raise InvalidRecordError("no_body", "the Record has no gps/cell/handover/path body")
    train = rec.train_id
    check_train_id(train, key)
    t = rec_t = _time(rec.time_unix_ms, "time_unix_ms")
    if kind == "gps":
        g = rec.gps
        _position(g.lat_deg, g.lon_deg)
        rows.fixes.append(
            (
                train,
                t,
                g.lat_deg,
                g.lon_deg,
                _finite(g.speed_mps, "speed_mps"),
                _finite(g.heading_deg, "heading_deg"),
                _finite(g.accuracy_m, "accuracy_m") or None,  # 0 = unknown
                _finite(g.track_m, "track_m") if g.HasField("track_m") else None,
            )
        )
    elif kind == "cell":
        c = rec.cell
        m = c.measured_unix_ms
        rows.samples.append(
            (
                train,
                _path(c.path),
                t,
                _text(c.carrier, "carrier", MAX_CARRIER),
                _u64(c.cell_id, "cell_id"),
                _finite(c.rsrp_dbm, "rsrp_dbm") if c.HasField("rsrp_dbm") else None,
                REGISTRATION.get(c.registration, "unspecified"),
                _time(m, "measured_unix_ms") if m else None,
                None,
                None,
                None,
            )
        )
    elif kind == "handover":
        h = rec.handover
        start = _time(h.start_unix_ms, "start_unix_ms") if h.start_unix_ms else t
        _position(h.start_lat_deg, h.start_lon_deg)
        outcome = OUTCOME.get(h.outcome)
        if outcome is None:
            raise InvalidRecordError(
                "bad_value", f"handover outcome {h.outcome} is neither success nor failure"
            )
        rows.handovers.append(
            (
                train,
                _text(h.carrier, "carrier", MAX_CARRIER),
                _path(h.path),
                _u64(h.source_cell_id, "source_cell_id"),
                _u64(h.target_cell_id, "target_cell_id"),
                start,
                h.start_lat_deg,
                h.start_lon_deg,
                _finite(h.start_track_m, "start_track_m") if h.HasField("start_track_m") else None,
                _finite(h.rsrp_dbm, "rsrp_dbm") if h.HasField("rsrp_dbm") else None,
                outcome,
                _u64(h.duration_ms, "duration_ms", I32),
            )
        )
        t = start
    else:
        p = rec.path
        rows.paths.append(
            (
                train,
                _path(p.path),
                t,
                _text(p.carrier, "carrier", MAX_CARRIER),
                p.up,
                _u64(p.srtt_us, "srtt_us"),
                _u64(p.rate_bps, "rate_bps"),
                _u64(p.bytes_sent, "bytes_sent"),
                _u64(p.bytes_acked, "bytes_acked"),
                _u64(p.reinjected_bytes, "reinjected_bytes"),
                _u64(p.redundant_bytes, "redundant_bytes"),
                _u64(p.rto_count, "rto_count", I32),
            )
        )
    rows.see(train, t)
    rows.times.append(rec_t)
