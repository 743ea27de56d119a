"""Third-party drive-test logs (CSV) into LinkDB.

A drive-test log is one row per measurement (typically 1 Hz): time,
latitude, longitude, serving cell and signal quality, and often speed,
operator and network mode. How a log is written is a :class:`Format`: its
column names, time format, "no value" marker, speed unit and the gap that
makes a cell change a failure. :data:`FORMATS` has the presets:

- ``generic``: columns ``time, lat, lon, cell_id, rsrp`` (ISO 8601 times,
  empty = no value); every other column is named by the caller;
- ``gnettrack``: the CSV export of G-NetTrack Pro, the Android logger behind
  the public UCC 4G and 5G datasets (Raca et al., MMSys 2018 and 2020):
  ``Timestamp`` as ``2019.11.25_15.34.34`` (the phone's local time, to the
  second), ``Longitude``, ``Latitude``, ``Speed`` (km/h), ``Operatorname``,
  ``CellID``, ``NetworkMode``, ``RSRP``, ``RSRQ``, ``SNR``, ``-`` for no value.
  In those logs ``CellID`` is only the cell's number inside its base
  station (1, 2, 3, 11, 12, ...); the global cell identity is ``RAWCELLID``
  (eNodeB ID × 256 + cell for LTE), so the preset uses ``RAWCELLID`` and,
  in files without it (the 4G dataset), ``CellID`` together with the
  serving cell's position (``ServingCell_Lon``, ``ServingCell_Lat``).

Several cell columns make one identity: a stable 63-bit hash of their
values (BLAKE2b), so the same cell gets the same ID in every file.

Each row becomes a GPS fix and a signal sample of the log's pseudo-train
(``trains.source = 'drivetest'``); with an operator column, each operator is
its own carrier and path (0, 1, ... in order of appearance). Handovers are
derived per carrier from changes of the serving cell:

- a handover out of cell A starts at A's last row (its time and position,
  the earliest point the handover can have started) and ends at the first
  row on another cell B (cell not 0/empty); ``duration_ms`` is the time
  between the two rows;
- it is a **failure** when that interruption is longer than
  ``failure_gap_ms`` (rows with no service, or missing rows in between),
  else a success; the threshold must be above the log's sampling jitter
  (1500 ms for ``generic``; 2500 ms for ``gnettrack``, whose whole-second
  timestamps put 2 s between consecutive rows about one time in ten);
- A → no service → A again is an outage, not a handover.

Rows are sorted by time; a repeated time keeps the first row (per carrier
for the samples, per log for the fixes) and is counted. A row whose time,
position, cell or operator is unusable is reported with its line number and
skipped; an unusable optional measurement (RSRP, RSRQ, SINR, speed, network
mode: not a number, or outside its physical range) is reported with its
line number and stored as empty, so the row's position and cell are kept.
Rows then go through the same sink as the telemetry
(:class:`polycorn_ingest.sink.LinkDbSink`), so trips, cell directions and
map matching are derived the same way, and importing the same file twice
changes nothing.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import math
import zoneinfo
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polycorn_ingest.records import (
    I16,
    I64,
    MAX_CARRIER,
    MAX_TIME_MS,
    MIN_TIME_MS,
    InvalidRecordError,
    Rows,
    check_train_id,
)
from polycorn_ingest.sink import LinkDbSink, WriteResult

MAX_RAT = 16  # signal_samples.rat String(16)

# Physical ranges of the optional measurements (3GPP TS 36.133 / 38.133
# reporting ranges, widened a little for loggers that extrapolate); a value
# outside is a logging error and is stored as empty.
RANGES = {
    "RSRP": (-160.0, -20.0),
    "RSRQ": (-45.0, 20.0),
    "SINR": (-30.0, 60.0),
    "speed": (0.0, 200.0),  # m/s, after the unit conversion
}
SPEED_UNITS = {"m/s": 1.0, "km/h": 1 / 3.6, "mph": 0.44704}


COLUMN_FIELDS = ("time", "lat", "lon", "cell", "signal", "rsrq", "sinr", "speed", "carrier", "mode")


@dataclass(frozen=True)
class Columns:
    """Which CSV column holds what. ``None``: the log has no such column.

    ``cell`` is one column, or several that together identify a cell.
    ``carrier``: the operator of each row (else the caller names one).
    """

    time: str = "time"
    lat: str = "lat"
    lon: str = "lon"
    cell: tuple[str, ...] = ("cell_id",)
    signal: str | None = "rsrp"
    rsrq: str | None = None
    sinr: str | None = None
    speed: str | None = None
    carrier: str | None = None
    mode: str | None = None


@dataclass(frozen=True)
class Format:
    """How a drive-test log is written (see the module docs); every field
    can be overridden from the command line."""

    columns: Columns
    time_format: str = "iso"  # iso, unix-s, unix-ms, or a strptime pattern
    na: frozenset[str] = frozenset()  # besides the empty string
    speed_unit: str = "m/s"
    failure_gap_ms: int = 1500
    delimiter: str = ","
    # Columns a preset uses when the file has them, in order of preference:
    # the first whose columns are all in the header wins (None: ``cell``).
    cell_choices: tuple[tuple[str, ...], ...] = ()
    optional: frozenset[str] = frozenset()  # preset columns a file may lack


GNETTRACK_TIME = "%Y.%m.%d_%H.%M.%S"
FORMATS: dict[str, Format] = {
    "generic": Format(Columns()),
    "gnettrack": Format(
        Columns(
            time="Timestamp",
            lat="Latitude",
            lon="Longitude",
            cell=("RAWCELLID",),
            signal="RSRP",
            rsrq="RSRQ",
            sinr="SNR",
            speed="Speed",
            carrier="Operatorname",
            mode="NetworkMode",
        ),
        time_format=GNETTRACK_TIME,
        na=frozenset({"-"}),
        speed_unit="km/h",
        failure_gap_ms=2500,
        cell_choices=(
            ("RAWCELLID",),
            ("CellID", "ServingCell_Lon", "ServingCell_Lat"),
            ("CellID",),
        ),
        optional=frozenset({"RSRQ", "SNR", "Speed", "Operatorname", "NetworkMode"}),
    ),
}


def _with(cols: Columns, changes: dict[str, Any]) -> Columns:
    return Columns(**{**vars(cols), **changes})


def customise(
    fmt: Format,
    columns: dict[str, str | None],
    *,
    time_format: str | None = None,
    na: frozenset[str] | None = None,
    speed_unit: str | None = None,
    delimiter: str | None = None,
    failure_gap_ms: int | None = None,
) -> Format:
    """``fmt`` with some columns and fields replaced (``None``: keep the
    preset's). A column named ``""`` is switched off; a named column is
    required; ``cell`` may name several columns, comma-separated."""
    cols = fmt.columns
    optional = set(fmt.optional)
    choices = fmt.cell_choices
    for name, value in columns.items():
        if value is None:
            continue
        if name == "cell":
            if not value:
                raise ValueError("--cell-col cannot be empty")
            cols = replace(cols, cell=tuple(c.strip() for c in value.split(",")))
            choices = ()
        elif name in ("time", "lat", "lon") and not value:
            raise ValueError(f"--{name}-col cannot be empty")
        else:
            optional.discard(str(getattr(cols, name)))
            cols = _with(cols, {name: value or None})
    return Format(
        columns=cols,
        time_format=fmt.time_format if time_format is None else time_format,
        na=fmt.na if na is None else na,
        speed_unit=fmt.speed_unit if speed_unit is None else speed_unit,
        failure_gap_ms=fmt.failure_gap_ms if failure_gap_ms is None else failure_gap_ms,
        delimiter=fmt.delimiter if delimiter is None else delimiter,
        cell_choices=choices,
        optional=frozenset(optional),
    )


@dataclass
class Measurement:
    line: int
    t_ms: int
    lat: float
    lon: float
    cell: int  # 0: no service
    signal: float | None
    carrier: str
    rsrq: float | None = None
    sinr: float | None = None
    speed_mps: float | None = None
    mode: str | None = None


@dataclass
class ImportReport:
    rows: int = 0
    imported: int = 0
    duplicates: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)
    # (line, reason) of optional values stored as empty; the row is kept.
    ignored: list[tuple[int, str]] = field(default_factory=list)
    handovers: int = 0
    failures: int = 0
    carriers: list[str] = field(default_factory=list)
    columns: Columns | None = None  # as resolved against the header
    written: WriteResult | None = None


def parse_time(s: str, fmt: str, tz: dt.tzinfo = dt.UTC) -> int:
    """Unix ms; naive times (no offset in the text) are in ``tz``."""
    s = s.strip()
    try:
        return _parse_time(s, fmt, tz)
    except ValueError as e:
        if str(e).startswith("unknown time format"):
            raise
        raise ValueError(f"time {s!r} is not {fmt!r}: {e}") from None


def _parse_time(s: str, fmt: str, tz: dt.tzinfo) -> int:
    if fmt == "unix-ms":
        v = float(s)
    elif fmt == "unix-s":
        v = float(s) * 1000
    elif fmt == "iso" or "%" in fmt:
        t = (
            dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
            if fmt == "iso"
            else dt.datetime.strptime(s, fmt)
        )
        if t.tzinfo is None:
            t = t.replace(tzinfo=tz)
        v = t.timestamp() * 1000
    else:
        raise ValueError(
            f"unknown time format {fmt!r} (iso, unix-s, unix-ms, or a strptime pattern with %)"
        )
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


def composite_cell(values: Sequence[str]) -> int:
    """A stable non-zero 63-bit ID for a cell named by several columns."""
    digest = hashlib.blake2b("\x1f".join(values).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & I64 or 1


def time_zone(name: str) -> dt.tzinfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r} (an IANA name such as Europe/Dublin)"
        ) from None


def resolve(fmt: Format, header: Sequence[str], path: Path) -> Columns:
    """The format's columns checked against the header: a preset's optional
    columns the file lacks are dropped, its cell columns chosen; anything
    else missing is an error naming the option that maps it."""
    cols = fmt.columns
    if fmt.cell_choices:
        for choice in fmt.cell_choices:
            if all(c in header for c in choice):
                cols = replace(cols, cell=choice)
                break
    opt = {
        f: getattr(cols, f)
        for f in ("signal", "rsrq", "sinr", "speed", "carrier", "mode")
        if getattr(cols, f) is not None
    }
    cols = _with(cols, {f: None for f, c in opt.items() if c in fmt.optional and c not in header})
    wanted = {
        "--time-col": [cols.time],
        "--lat-col": [cols.lat],
        "--lon-col": [cols.lon],
        "--cell-col": list(cols.cell),
        **{f"--{f}-col": [c] for f, c in opt.items() if getattr(cols, f) is not None},
    }
    missing = [(o, c) for o, cs in wanted.items() for c in cs if c not in header]
    if missing:
        raise ValueError(
            f"{path}: no column {', '.join(repr(c) for _, c in missing)} in the header "
            f"{list(header)!r}; map them with "
            f"{'/'.join(dict.fromkeys(o for o, _ in missing))} (or choose another --format)"
        )
    return cols


def _value(row: dict[str, str | None], col: str | None, na: frozenset[str]) -> str | None:
    if col is None:
        return None
    v = (row.get(col) or "").strip()
    return None if not v or v in na else v


def _measure(
    row: dict[str, str | None],
    col: str | None,
    what: str,
    *,
    fmt: Format,
    line: int,
    report: ImportReport,
    scale: float = 1.0,
) -> float | None:
    """An optional number: empty, or reported and stored as empty when bad."""
    s = _value(row, col, fmt.na)
    if s is None:
        return None
    try:
        v = float(s) * scale
    except ValueError:
        v = math.nan
    lo, hi = RANGES[what]
    if not (math.isfinite(v) and lo <= v <= hi):
        report.ignored.append((line, f"{what} {s!r} stored as empty (outside {lo:g}..{hi:g})"))
        return None
    return v


def read(
    path: Path, fmt: Format, report: ImportReport, tz: dt.tzinfo = dt.UTC, carrier: str = ""
) -> list[Measurement]:
    """Parse the CSV; bad rows go to ``report.bad`` as (line, reason).

    ``carrier`` names the carrier of every row (the format's operator
    column is then not read); without it the format must have one.
    """
    out: list[Measurement] = []
    speed_scale = SPEED_UNITS[fmt.speed_unit]
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, delimiter=fmt.delimiter)
        header = reader.fieldnames or []
        if carrier:
            fmt = replace(fmt, columns=replace(fmt.columns, carrier=None))
        cols = resolve(fmt, header, path)
        report.columns = cols
        if not carrier and cols.carrier is None:
            raise ValueError(
                f"{path}: no operator column; name the carrier with --carrier "
                "or its column with --carrier-col"
            )
        for row in reader:
            report.rows += 1
            line = reader.line_num
            try:
                out.append(
                    _measurement(
                        row,
                        cols,
                        fmt,
                        tz=tz,
                        carrier=carrier,
                        speed_scale=speed_scale,
                        line=line,
                        report=report,
                    )
                )
            except (ValueError, TypeError) as e:
                report.bad.append((line, str(e)))
    return _first_per_carrier_and_time(out, report)


def _measurement(
    row: dict[str, str | None],
    cols: Columns,
    fmt: Format,
    *,
    tz: dt.tzinfo,
    carrier: str,
    speed_scale: float,
    line: int,
    report: ImportReport,
) -> Measurement:
    """One CSV row; a value out of range is reported and stored as empty, a row without
    a time, a position or an operator raises ValueError."""
    t = parse_time(row[cols.time] or "", fmt.time_format, tz)
    lat, lon = _position(row, cols, fmt)
    cell = _cell(row, cols, fmt)
    op = carrier or _value(row, cols.carrier, fmt.na) or ""
    if not op or len(op) > MAX_CARRIER:
        raise ValueError(f"bad operator {op!r} (1-{MAX_CARRIER} characters)")
    mode = _value(row, cols.mode, fmt.na)
    if mode is not None and len(mode) > MAX_RAT:
        report.ignored.append((line, f"network mode {mode!r} stored as empty"))
        mode = None
    return Measurement(
        line,
        t,
        lat,
        lon,
        cell,
        _measure(row, cols.signal, "RSRP", fmt=fmt, line=line, report=report),
        op,
        _measure(row, cols.rsrq, "RSRQ", fmt=fmt, line=line, report=report),
        _measure(row, cols.sinr, "SINR", fmt=fmt, line=line, report=report),
        _measure(
            row,
            cols.speed,
            "speed",
            fmt=fmt,
            line=line,
            report=report,
            scale=speed_scale,
        ),
        mode,
    )


def _position(row: dict[str, str | None], cols: Columns, fmt: Format) -> tuple[float, float]:
    """(lat, lon) in range and not (0, 0), the position of a receiver without a fix."""
    lat_s, lon_s = _value(row, cols.lat, fmt.na), _value(row, cols.lon, fmt.na)
    try:
        lat, lon = float(lat_s or "nan"), float(lon_s or "nan")
    except ValueError:
        lat = lon = math.nan
    if not (
        math.isfinite(lat) and math.isfinite(lon) and -90 <= lat <= 90 and -180 <= lon <= 180
    ) or (lat == 0 and lon == 0):
        raise ValueError(f"bad position ({lat_s!r}, {lon_s!r})")
    return lat, lon


def _cell(row: dict[str, str | None], cols: Columns, fmt: Format) -> int:
    """The serving cell from its one or several columns; 0 (no service) if any is empty."""
    parts = [_value(row, c, fmt.na) for c in cols.cell]
    if any(p is None for p in parts):
        return 0
    if len(parts) == 1:
        return parse_cell(parts[0] or "")
    return composite_cell([p or "" for p in parts])


def _first_per_carrier_and_time(ms: list[Measurement], report: ImportReport) -> list[Measurement]:
    """The measurements in time order, one per carrier and millisecond (the first row);
    the others are counted as duplicates."""
    ms.sort(key=lambda m: (m.t_ms, m.line))
    uniq: list[Measurement] = []
    last: dict[str, int] = {}
    for m in ms:
        if last.get(m.carrier) == m.t_ms:
            report.duplicates += 1
            continue
        last[m.carrier] = m.t_ms
        uniq.append(m)
    return uniq


def to_rows(
    ms: Iterable[Measurement], train: str, failure_gap_ms: int, report: ImportReport
) -> Rows:
    rows = Rows()
    paths: dict[str, int] = {}
    last_on: dict[str, Measurement] = {}  # per carrier: last row on its serving cell
    last_fix: int | None = None
    for m in ms:
        path = paths.setdefault(m.carrier, len(paths))
        if path > I16:
            raise ValueError(f"more than {I16 + 1} operators in one log")
        if last_fix != m.t_ms:  # one fix per time; several operators share it
            rows.fixes.append((train, m.t_ms, m.lat, m.lon, m.speed_mps, None, None, None))
            last_fix = m.t_ms
        rows.samples.append(
            (
                train,
                path,
                m.t_ms,
                m.carrier,
                m.cell,
                m.signal,
                "registered" if m.cell else "searching",
                None,
                m.rsrq,
                m.sinr,
                m.mode,
            )
        )
        rows.see(train, m.t_ms)
        rows.times.append(m.t_ms)
        if not m.cell:
            continue
        prev = last_on.get(m.carrier)
        if prev is not None and m.cell != prev.cell:
            gap = m.t_ms - prev.t_ms
            failed = gap > failure_gap_ms
            rows.handovers.append(
                (
                    train,
                    m.carrier,
                    path,
                    prev.cell,
                    m.cell,
                    prev.t_ms,
                    prev.lat,
                    prev.lon,
                    None,
                    prev.signal,
                    "failure" if failed else "success",
                    min(gap, 2**31 - 1),
                )
            )
            report.handovers += 1
            report.failures += failed
        last_on[m.carrier] = m
    report.imported = len(rows.samples)
    report.carriers = list(paths)
    return rows


def import_csv(
    path: Path,
    sink: LinkDbSink,
    *,
    train: str,
    carrier: str = "",
    fmt: Format | None = None,
    cols: Columns | None = None,
    timezone: str = "UTC",
) -> ImportReport:
    """Import one log; the whole file is one transaction.

    ``fmt`` defaults to the ``generic`` preset (:func:`customise` changes
    its parts); ``cols`` replaces its columns outright.
    """
    try:
        check_train_id(train, train.encode())
    except InvalidRecordError as e:
        raise ValueError(f"--train-id: {e.detail}") from None
    if len(carrier) > MAX_CARRIER:
        raise ValueError(f"--carrier must be 1-{MAX_CARRIER} characters")
    fmt = fmt or FORMATS["generic"]
    if cols is not None:
        fmt = replace(fmt, columns=cols, cell_choices=(), optional=frozenset())
    if fmt.failure_gap_ms <= 0:
        raise ValueError("--failure-gap-ms must be positive")
    if fmt.speed_unit not in SPEED_UNITS:
        raise ValueError(f"speed unit {fmt.speed_unit!r}: one of {', '.join(SPEED_UNITS)}")
    report = ImportReport()
    ms = read(path, fmt, report, time_zone(timezone), carrier)
    rows = to_rows(ms, train, fmt.failure_gap_ms, report)
    if rows:
        report.written = sink.write(rows)
    return report
