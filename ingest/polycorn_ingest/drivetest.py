"""Third-party drive-test logs (CSV) into LinkDB.

A drive-test log is one row per measurement: time, latitude, longitude,
serving cell ID and signal strength, in columns the user names
(:class:`Columns`). Each row becomes a GPS fix and a signal sample of the
log's pseudo-train (``trains.source = 'drivetest'``); handovers are derived
from changes of the serving cell:

- a handover out of cell A starts at A's last row (its time and position,
  the earliest point the handover can have started) and ends at the first
  row on another cell B (cell ID not 0/empty); ``duration_ms`` is the time
  between the two rows;
- it is a **failure** when that interruption is longer than
  ``failure_gap_ms`` (rows with no service, cell ID 0 or empty, or missing
  rows in between), else a success; choose the threshold above the log's
  sampling interval (default 1500 ms for 1 Hz logs);
- A → no service → A again is an outage, not a handover.

Rows are sorted by time; a repeated time keeps the first row. A row with a
bad value is reported with its line number and skipped. Rows then go through
the same sink as the telemetry (:class:`polycorn_ingest.sink.LinkDbSink`),
so trips and cell directions are derived the same way, and importing the
same file twice changes nothing.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from polycorn_ingest.records import (
    I64,
    MAX_TIME_MS,
    MIN_TIME_MS,
    InvalidRecordError,
    Rows,
    check_train_id,
)
from polycorn_ingest.sink import LinkDbSink, WriteResult


@dataclass(frozen=True)
class Columns:
    time: str = "time"
    lat: str = "lat"
    lon: str = "lon"
    cell: str = "cell_id"
    signal: str = "rsrp"


@dataclass
class Measurement:
    line: int
    t_ms: int
    lat: float
    lon: float
    cell: int  # 0: no service
    signal: float | None


@dataclass
class ImportReport:
    rows: int = 0
    imported: int = 0
    duplicates: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)
    handovers: int = 0
    failures: int = 0
    written: WriteResult | None = None


def parse_time(s: str, fmt: str) -> int:
    s = s.strip()
    if fmt == "unix-ms":
        v = float(s)
    elif fmt == "unix-s":
        v = float(s) * 1000
    elif fmt == "iso":
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)  # naive times are UTC
        v = t.timestamp() * 1000
    else:
        raise ValueError(f"unknown time format {fmt!r} (iso, unix-s, unix-ms)")
    if not math.isfinite(v) or not MIN_TIME_MS <= v < MAX_TIME_MS:
        raise ValueError(f"time {s!r} is not between 1990 and 2200")
    return round(v)


def parse_cell(s: str) -> int:
    s = s.strip()
    if not s:
        return 0
    v = int(s, 16) if s.lower().startswith("0x") else int(float(s)) if "." in s else int(s)
    if not 0 <= v <= I64:
        raise ValueError(f"cell ID {s!r} out of range")
    return v


def read(
    path: Path, cols: Columns, time_format: str, delimiter: str, report: ImportReport
) -> list[Measurement]:
    """Parse the CSV; bad rows go to ``report.bad`` as (line, reason)."""
    out: list[Measurement] = []
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        header = reader.fieldnames or []
        missing = [
            c for c in (cols.time, cols.lat, cols.lon, cols.cell, cols.signal) if c not in header
        ]
        if missing:
            raise ValueError(
                f"{path}: no column {', '.join(map(repr, missing))} in the header "
                f"{header!r}; map them with --time-col/--lat-col/--lon-col/--cell-col/--signal-col"
            )
        for row in reader:
            report.rows += 1
            line = reader.line_num
            try:
                t = parse_time(row[cols.time] or "", time_format)
                lat, lon = float(row[cols.lat] or "nan"), float(row[cols.lon] or "nan")
                if not (
                    math.isfinite(lat)
                    and math.isfinite(lon)
                    and -90 <= lat <= 90
                    and -180 <= lon <= 180
                ) or (lat == 0 and lon == 0):
                    raise ValueError(f"bad position ({row[cols.lat]!r}, {row[cols.lon]!r})")
                sig_s = (row[cols.signal] or "").strip()
                sig = float(sig_s) if sig_s else None
                if sig is not None and not math.isfinite(sig):
                    raise ValueError(f"bad signal {sig_s!r}")
                out.append(Measurement(line, t, lat, lon, parse_cell(row[cols.cell] or ""), sig))
            except (ValueError, TypeError) as e:
                report.bad.append((line, str(e)))
    out.sort(key=lambda m: (m.t_ms, m.line))
    uniq: list[Measurement] = []
    for m in out:
        if uniq and uniq[-1].t_ms == m.t_ms:
            report.duplicates += 1
            continue
        uniq.append(m)
    return uniq


def to_rows(
    ms: Iterable[Measurement], train: str, carrier: str, failure_gap_ms: int, report: ImportReport
) -> Rows:
    rows = Rows()
    last_on: Measurement | None = None  # last row on the current serving cell
    for m in ms:
        rows.fixes.append((train, m.t_ms, m.lat, m.lon, None, None, None, None))
        rows.samples.append(
            (
                train,
                0,
                m.t_ms,
                carrier,
                m.cell,
                m.signal,
                "registered" if m.cell else "searching",
                None,
            )
        )
        rows.see(train, m.t_ms)
        rows.times.append(m.t_ms)
        if not m.cell:
            continue
        if last_on is not None and m.cell != last_on.cell:
            gap = m.t_ms - last_on.t_ms
            failed = gap > failure_gap_ms
            rows.handovers.append(
                (
                    train,
                    carrier,
                    0,
                    last_on.cell,
                    m.cell,
                    last_on.t_ms,
                    last_on.lat,
                    last_on.lon,
                    None,
                    last_on.signal,
                    "failure" if failed else "success",
                    min(gap, 2**31 - 1),
                )
            )
            report.handovers += 1
            report.failures += failed
        last_on = m
    report.imported = len(rows.fixes)
    return rows


def import_csv(
    path: Path,
    sink: LinkDbSink,
    *,
    train: str,
    carrier: str,
    cols: Columns,
    time_format: str = "iso",
    delimiter: str = ",",
    failure_gap_ms: int = 1500,
) -> ImportReport:
    """Import one log; the whole file is one transaction."""
    try:
        check_train_id(train, train.encode())
    except InvalidRecordError as e:
        raise ValueError(f"--train-id: {e.detail}") from None
    if not carrier or len(carrier) > 64:
        raise ValueError("--carrier must be 1-64 characters")
    report = ImportReport()
    ms = read(path, cols, time_format, delimiter, report)
    rows = to_rows(ms, train, carrier, failure_gap_ms, report)
    if rows:
        report.written = sink.write(rows)
    return report
