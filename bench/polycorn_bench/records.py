"""Reading a raw HSR benchmark run directory (written by ``python -m polycorn_benchrun.hsr``).

Layout::

    RUN/run.json
    RUN/<link_set>/<trip>/trip/{c<i>.down,c<i>.up,c<i>.schedule,events.jsonl,trip.json}
    RUN/<link_set>/<trip>/<scheme>/bulk.jsonl
    RUN/<link_set>/<trip>/<scheme>/backlog.jsonl   (optional)
    RUN/<link_set>/<trip>/<scheme>/backlog.carriers.json  (optional: carrier counters)
    RUN/<link_set>/<trip>/<scheme>/im-<U>.jsonl
    RUN/<link_set>/<trip>/<scheme>/logs/{relay,proxy}.metrics
    RUN/<link_set>/<trip>/<scheme>/concurrency-<N>.jsonl          (optional: one line per user)
    RUN/<link_set>/<trip>/<scheme>/concurrency-<N>.mem.json       (relay's and proxy's VmHWM)
    RUN/<link_set>/<trip>/<scheme>/logs/concurrency-<N>.{relay,proxy}.metrics
    RUN/<link_set>/<trip>/sweep/<MiB>/<scheme>/backlog.jsonl      (optional: the budget sweep)
    RUN/<link_set>/<trip>/sweep/<MiB>/<scheme>/logs/{relay,proxy}.metrics

Nothing here raises on bad data: a missing file is an absent scheme (a missing
``backlog.jsonl``: no backlog phase), a line that is not a JSON
object with the expected fields is skipped and counted in :class:`Issues`, with the first few
locations kept for the report.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polycorn_bench.metrics import Metrics, read_metrics


@dataclass
class Issues:
    """Problems met while reading (skipped lines, unreadable files), counted by kind."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    max_examples: int = 20

    def add(self, kind: str, where: str) -> None:
        self.counts[kind] += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(f"{kind}: {where}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "by_kind": dict(self.counts), "examples": self.examples}


def finite(v: object) -> float | None:
    """``v`` as a float when it is a finite JSON number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class Download:
    """One line of ``bulk.jsonl``."""

    id: int
    label: str
    size: int
    planned_ms: float | None
    start_ms: float
    end_ms: float | None
    bytes: int
    ok: bool
    timeout: bool
    error: str | None
    timeout_ms: float | None = None  # optional field; used only to censor a null end_ms
    # Optional ``progress``: cumulative body bytes at trip times, sorted; None when the record
    # has none (older polycorn-loadgen) or it is malformed (see ``progress_bad``).
    progress: tuple[tuple[float, float], ...] | None = None
    progress_bad: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Download | None:
        ident, label, size, start = d.get("id"), d.get("label"), d.get("size"), d.get("start_ms")
        ok, timeout = d.get("ok"), d.get("timeout", False)
        if not (
            isinstance(ident, int)
            and isinstance(label, str)
            and isinstance(size, int)
            and size > 0
            and finite(start) is not None
            and isinstance(ok, bool)
            and isinstance(timeout, bool)
        ):
            return None
        end = finite(d.get("end_ms"))
        if ok and end is None:
            return None
        err = d.get("error")
        nbytes = d.get("bytes")
        progress = parse_progress(d.get("progress"))
        progress_bad = "progress" in d and d["progress"] is not None and progress is None
        return cls(
            id=ident,
            label=label,
            size=size,
            planned_ms=finite(d.get("planned_ms")),
            start_ms=float(start),  # type: ignore[arg-type]
            end_ms=end,
            bytes=nbytes if isinstance(nbytes, int) else 0,
            ok=ok,
            timeout=timeout,
            error=str(err) if err is not None else None,
            timeout_ms=finite(d.get("timeout_ms")),
            progress=progress,
            progress_bad=progress_bad,
        )


def parse_progress(v: object) -> tuple[tuple[float, float], ...] | None:
    """``[[t_ms, bytes], ...]`` with non-decreasing times and bytes, else None (also for an
    empty list: no sample is no progress curve)."""
    if not isinstance(v, list) or not v:
        return None
    out: list[tuple[float, float]] = []
    for point in v:
        if not isinstance(point, list | tuple) or len(point) != 2:
            return None
        t, b = finite(point[0]), finite(point[1])
        if t is None or b is None or b < 0:
            return None
        if out and (t < out[-1][0] or b < out[-1][1]):
            return None
        out.append((t, b))
    return tuple(out)


def _nonneg_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


BACKLOG_KIND = "backlog"


def backlog_problem(d: dict[str, Any]) -> str | None:
    """Why a ``backlog.jsonl`` object is not a usable record, or None if it is."""
    kind = d.get("kind", BACKLOG_KIND)
    if kind != BACKLOG_KIND:
        return f"kind {kind!r} is not {BACKLOG_KIND!r}"
    ident = d.get("id")
    if not isinstance(ident, int) or isinstance(ident, bool):
        return "id missing or not an integer"
    if not isinstance(d.get("label"), str):
        return "label missing or not a string"
    start, end = finite(d.get("start_ms")), finite(d.get("end_ms"))
    if start is None:
        return "start_ms missing or not a number"
    if end is None:
        return "end_ms missing or not a number"
    if end <= start:
        return f"end_ms {end:g} not after start_ms {start:g}"
    if not _nonneg_int(d.get("bytes")):
        return "bytes missing or not a non-negative integer"
    size = d.get("size")
    if size is not None and not (_nonneg_int(size) and size > 0):
        return "size not a positive integer"
    for key in ("requests", "completed", "failed"):
        if d.get(key) is not None and not _nonneg_int(d.get(key)):
            return f"{key} not a non-negative integer"
    if d.get("errors") is not None and not isinstance(d.get("errors"), list):
        return "errors not a list"
    if not isinstance(d.get("late", False), bool):
        return "late not a boolean"
    return None


@dataclass(frozen=True)
class Backlog:
    """One line of ``backlog.jsonl``: an always-busy download (back-to-back requests of the
    same file) over a window of trip time, ``[start_ms, end_ms]``."""

    id: int
    label: str
    start_ms: float
    end_ms: float
    bytes: int  # body bytes over the whole window, all requests
    path: str | None = None
    size: int | None = None  # of the file each request fetches
    planned_ms: float | None = None
    requests: int | None = None
    completed: int | None = None
    failed: int | None = None
    errors: tuple[str, ...] = ()
    late: bool = False
    # Optional ``progress`` as in bulk.jsonl (cumulative over the requests); None when absent
    # or malformed (see ``progress_bad``).
    progress: tuple[tuple[float, float], ...] | None = None
    progress_bad: bool = False

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms

    @property
    def goodput_mbps(self) -> float:
        """Body bytes over the whole window / its length (the window is checked non-empty)."""
        return self.bytes * 8 / self.duration_ms / 1000

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Backlog | None:
        """The record, or None when :func:`backlog_problem` finds one."""
        if backlog_problem(d) is not None:
            return None
        progress = parse_progress(d.get("progress"))
        path, size = d.get("path"), d.get("size")
        return cls(
            id=d["id"],
            label=d["label"],
            start_ms=float(d["start_ms"]),
            end_ms=float(d["end_ms"]),
            bytes=d["bytes"],
            path=path if isinstance(path, str) else None,
            size=size if isinstance(size, int) else None,
            planned_ms=finite(d.get("planned_ms")),
            requests=_int_or_none(d.get("requests")),
            completed=_int_or_none(d.get("completed")),
            failed=_int_or_none(d.get("failed")),
            errors=tuple(str(e) for e in d.get("errors") or ()),
            late=bool(d.get("late", False)),
            progress=progress,
            progress_bad="progress" in d and d["progress"] is not None and progress is None,
        )


@dataclass(frozen=True)
class Message:
    """One line of ``im-<U>.jsonl``."""

    user: int
    msg: int
    due_ms: float | None
    delay_ms: float | None
    ok: bool
    error: str | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Message | None:
        user, msg, ok = d.get("user"), d.get("msg"), d.get("ok")
        if not (isinstance(user, int) and isinstance(msg, int) and isinstance(ok, bool)):
            return None
        delay = finite(d.get("delay_ms"))
        if ok and delay is None:
            return None
        err = d.get("error")
        return cls(
            user=user,
            msg=msg,
            due_ms=finite(d.get("due_ms")),
            delay_ms=delay,
            ok=ok,
            error=str(err) if err is not None else None,
        )


@dataclass(frozen=True)
class TableEntry:
    """One entry of a ``polycorn-failure-table/1`` file."""

    cell: int
    position_m: float
    direction: object  # "increasing" / "decreasing" as written; each reader decides the rest
    failures: int | None


def read_failure_table(path: Path) -> tuple[int | None, list[TableEntry]] | None:
    """(version, entries with an integer cell and a finite position) of a
    ``polycorn-failure-table/1`` file; None when absent or unusable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        return None
    entries = []
    for e in doc["entries"]:
        if not isinstance(e, dict):
            continue
        cell, pos, fails = e.get("cell"), finite(e.get("position_m")), e.get("failures")
        if isinstance(cell, int) and pos is not None:
            entries.append(
                TableEntry(cell, pos, e.get("direction"), fails if isinstance(fails, int) else None)
            )
    version = doc.get("version")
    return (version if isinstance(version, int) else None), entries


def read_jsonl(path: Path, issues: Issues) -> Iterator[dict[str, Any]]:
    """JSON objects of a JSON-lines file; bad lines are counted in ``issues`` and skipped."""
    for _, obj in read_jsonl_numbered(path, issues):
        yield obj


def read_jsonl_numbered(path: Path, issues: Issues) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSON-lines file, as :func:`read_jsonl`."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        issues.add("unreadable file", f"{path}: {e}")
        return
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            issues.add("malformed JSON line", f"{path}:{i}: {e.msg}")
            continue
        if not isinstance(obj, dict):
            issues.add("malformed JSON line", f"{path}:{i}: not an object")
            continue
        yield i, obj


def read_downloads(path: Path, issues: Issues) -> list[Download]:
    out: list[Download] = []
    for i, obj in enumerate(read_jsonl(path, issues), start=1):
        rec = Download.from_json(obj)
        if rec is None:
            issues.add("bad bulk record", f"{path}: record {i}")
        else:
            if rec.progress_bad:
                issues.add("bad progress field (ignored)", f"{path}: record {i}")
            out.append(rec)
    return out


def read_backlogs(path: Path, issues: Issues) -> list[Backlog]:
    """Every usable line of a ``backlog.jsonl`` (normally one). A line that is not JSON, or
    not a valid record, is skipped and counted in ``issues`` with the file, the line number
    and the reason."""
    out: list[Backlog] = []
    for line, obj in read_jsonl_numbered(path, issues):
        problem = backlog_problem(obj)
        rec = Backlog.from_json(obj) if problem is None else None
        if rec is None:
            issues.add("bad backlog record", f"{path}:{line}: {problem}")
            continue
        if rec.progress_bad:
            issues.add("bad progress field (ignored)", f"{path}:{line}")
        out.append(rec)
    return out


def read_messages(path: Path, issues: Issues) -> list[Message]:
    out: list[Message] = []
    for i, obj in enumerate(read_jsonl(path, issues), start=1):
        rec = Message.from_json(obj)
        if rec is None:
            issues.add("bad IM record", f"{path}: record {i}")
        else:
            out.append(rec)
    return out


@dataclass(frozen=True)
class CarrierSample:
    """The train's carrier interfaces' counters at one trip time (``backlog.carriers.json``,
    taken by the benchmark at the start and the end of the backlog window): per carrier, the
    bytes and packets its emulated downlink delivered (``rx``) and the train sent into its
    uplink (``tx``), cumulative since the topology came up."""

    t_ms: float
    rx_bytes: tuple[int, ...]
    rx_packets: tuple[int, ...]
    tx_bytes: tuple[int, ...]
    tx_packets: tuple[int, ...]

    @classmethod
    def from_json(cls, d: object) -> CarrierSample | None:
        if not isinstance(d, dict):
            return None
        t = finite(d.get("t_ms"))
        cols: list[tuple[int, ...]] = []
        for key in ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets"):
            v = d.get(key)
            if not isinstance(v, list) or not v or not all(_nonneg_int(x) for x in v):
                return None
            cols.append(tuple(v))
        if t is None or len({len(c) for c in cols}) != 1:
            return None
        return cls(t, *cols)


def read_carrier_samples(path: Path, issues: Issues) -> list[CarrierSample]:
    """The samples of a ``backlog.carriers.json``, by time; unusable ones are counted in
    ``issues`` and left out (a file that is not JSON: no sample)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        issues.add("unreadable carrier counters", f"{path}: {e}")
        return []
    out: list[CarrierSample] = []
    for i, raw in enumerate(_list(_dict(doc).get("samples"))):
        sample = CarrierSample.from_json(raw)
        if sample is None:
            issues.add("bad carrier counter sample", f"{path}: sample {i}")
        else:
            out.append(sample)
    return sorted(out, key=lambda x: x.t_ms)


@dataclass(frozen=True)
class ProcMem:
    """One process's memory at the end of a concurrency window (``concurrency-<N>.mem.json``):
    peak resident set since the window's start (VmHWM, reset at the start) and the resident set
    at the end, in kB as /proc reports them; None when not read."""

    vm_hwm_kb: int | None
    vm_rss_kb: int | None


@dataclass
class PhaseMem:
    """The relay's and the proxy's memory over one concurrency window: /proc figures and the
    metrics snapshots taken right after it (None: no file)."""

    relay: ProcMem | None = None
    proxy: ProcMem | None = None
    relay_metrics: Metrics | None = None
    proxy_metrics: Metrics | None = None


@dataclass
class SchemeRun:
    """What one scheme left for one trip (possibly nothing)."""

    downloads: list[Download] = field(default_factory=list)
    # backlog.jsonl's records; empty: no file (no backlog phase) or no usable line.
    backlog: list[Backlog] = field(default_factory=list)
    # The carriers' counters over the backlog window (backlog.carriers.json); empty: none.
    backlog_carriers: list[CarrierSample] = field(default_factory=list)
    im: dict[int, list[Message]] = field(default_factory=dict)  # users -> messages
    # End-of-trip metrics snapshots (logs/relay.metrics, logs/proxy.metrics); None: no file.
    relay_metrics: Metrics | None = None
    proxy_metrics: Metrics | None = None
    # Concurrency phase: users N -> one backlog record per user (concurrency-<N>.jsonl).
    concurrency: dict[int, list[Backlog]] = field(default_factory=dict)
    # The emulator's queueing time per carrier's downlink over the trip (logs/emu.log):
    # carrier -> (p50 ms, p95 ms); empty: no log, or an emulator that does not report it.
    queue_delay_ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    # users N -> memory of relay and proxy over that window.
    concurrency_mem: dict[int, PhaseMem] = field(default_factory=dict)


@dataclass(frozen=True)
class HandoverFailure:
    """A handover whose ``handover_end`` outcome is not ``success`` (e.g. ``rlf``), with its
    ``handover_start`` (same carrier, the latest start before the end)."""

    t_ms: float  # handover_start
    end_ms: float  # handover_end
    carrier: int | None
    from_cell: int | None
    to_cell: int | None
    track_m: float | None
    outcome: str
    duration_ms: float | None


@dataclass
class TripRun:
    name: str
    trip_dir: Path
    schemes: dict[str, SchemeRun]
    handover_starts: list[float] | None  # None: no events.jsonl
    handover_failures: list[HandoverFailure] | None = None  # None: no events.jsonl
    # Budget sweep: MiB -> scheme -> its backlog record(s) and end-of-run metrics snapshots.
    sweep: dict[int, dict[str, SchemeRun]] = field(default_factory=dict)
    # The trip's oracle, once loaded by flows.trip_oracle (the link files are read, and a
    # problem with them reported, once per trip however many sections need them).
    oracle_loaded: bool = field(default=False, compare=False, repr=False)
    oracle: Any = field(default=None, compare=False, repr=False)


@dataclass
class LinkSetRun:
    name: str
    description: str
    trips: list[TripRun]


@dataclass
class Run:
    root: Path
    meta: dict[str, Any]
    schemes: list[str]
    sizes: dict[str, int]
    users: list[int]
    link_sets: list[LinkSetRun]
    issues: Issues


def read_handover_starts(path: Path, issues: Issues) -> list[float]:
    """``t_ms`` of every ``handover_start`` event (any carrier), sorted."""
    return read_handovers(path, issues)[0]


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_handovers(path: Path, issues: Issues) -> tuple[list[float], list[HandoverFailure]]:
    """(``t_ms`` of every ``handover_start``, sorted; the failed handovers, sorted by start).

    A ``handover_end`` is matched with the latest unmatched ``handover_start`` of the same
    carrier at or before it; an end whose outcome is anything but ``success`` is a failure.
    A failure without a matching start is counted as a problem and left out."""
    starts: list[float] = []
    open_starts: dict[object, list[dict[str, Any]]] = {}
    ends: list[dict[str, Any]] = []
    for obj in read_jsonl(path, issues):
        event = obj.get("event")
        if event not in ("handover_start", "handover_end"):
            continue
        t = finite(obj.get("t_ms"))
        if t is None:
            issues.add("bad event", f"{path}: {event} without t_ms")
            continue
        if event == "handover_start":
            starts.append(t)
            open_starts.setdefault(obj.get("carrier"), []).append(obj)
        else:
            ends.append(obj)
    for lst in open_starts.values():
        lst.sort(key=lambda o: float(o["t_ms"]))
    failures: list[HandoverFailure] = []
    for end in sorted(ends, key=lambda o: float(o["t_ms"])):
        t_end = float(end["t_ms"])
        cands = open_starts.get(end.get("carrier"), [])
        idx = max((i for i, s in enumerate(cands) if float(s["t_ms"]) <= t_end), default=None)
        start = cands.pop(idx) if idx is not None else None
        outcome = end.get("outcome")
        if outcome == "success":
            continue
        if not isinstance(outcome, str) or not outcome:
            issues.add("handover_end without outcome", f"{path}: t_ms {t_end:g}")
            continue
        if start is None:
            issues.add("failed handover without handover_start", f"{path}: t_ms {t_end:g}")
            continue
        failures.append(
            HandoverFailure(
                t_ms=float(start["t_ms"]),
                end_ms=t_end,
                carrier=_int_or_none(end.get("carrier")),
                from_cell=_int_or_none(start.get("from_cell", end.get("from_cell"))),
                to_cell=_int_or_none(start.get("to_cell", end.get("to_cell"))),
                track_m=finite(start.get("track_m", end.get("track_m"))),
                outcome=outcome,
                duration_ms=finite(end.get("duration_ms")),
            )
        )
    return sorted(starts), sorted(failures, key=lambda f: f.t_ms)


def _read_snapshot(path: Path, issues: Issues) -> Metrics | None:
    m = read_metrics(path)
    if m is not None and m.bad_lines:
        issues.add("malformed metrics line", f"{path}: {m.bad_lines} line(s), {m.first_bad}")
    return m


def _dict(x: object) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _list(x: object) -> list[Any]:
    return x if isinstance(x, list) else []


#: Directories of a trip that are not schemes.
NOT_SCHEMES = ("trip", "sweep")


def _scheme_dirs(trip_path: Path, listed: list[str]) -> list[str]:
    """Schemes in ``run.json`` order, then any extra directory found (not ``trip`` or
    ``sweep``)."""
    found = sorted(p.name for p in trip_path.iterdir() if p.is_dir() and p.name not in NOT_SCHEMES)
    return listed + [s for s in found if s not in listed]


def _read_proc_mem(v: object) -> ProcMem | None:
    d = _dict(v)
    if not d:
        return None
    hwm, rss = d.get("vm_hwm_kb"), d.get("vm_rss_kb")
    return ProcMem(
        vm_hwm_kb=hwm if isinstance(hwm, int) and _nonneg_int(hwm) else None,
        vm_rss_kb=rss if isinstance(rss, int) and _nonneg_int(rss) else None,
    )


def read_phase_mem(sdir: Path, users: int, issues: Issues) -> PhaseMem:
    """``concurrency-<N>.mem.json`` and ``logs/concurrency-<N>.{relay,proxy}.metrics``."""
    mem = PhaseMem()
    path = sdir / f"concurrency-{users}.mem.json"
    if path.exists():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            issues.add("unreadable memory file", f"{path}: {e}")
            doc = {}
        mem.relay = _read_proc_mem(_dict(doc).get("relay"))
        mem.proxy = _read_proc_mem(_dict(doc).get("proxy"))
    logs = sdir / "logs"
    mem.relay_metrics = _read_snapshot(logs / f"concurrency-{users}.relay.metrics", issues)
    mem.proxy_metrics = _read_snapshot(logs / f"concurrency-{users}.proxy.metrics", issues)
    return mem


def read_concurrency(sdir: Path, sr: SchemeRun, issues: Issues) -> None:
    """The concurrency phase's files of one scheme directory into ``sr``."""
    for f in sorted(sdir.glob("concurrency-*.jsonl")):
        n = f.stem.removeprefix("concurrency-")
        if not n.isdigit() or int(n) <= 0:
            issues.add("unexpected file", str(f))
            continue
        sr.concurrency[int(n)] = read_backlogs(f, issues)
        sr.concurrency_mem[int(n)] = read_phase_mem(sdir, int(n), issues)


def read_sweep(trip_path: Path, issues: Issues) -> dict[int, dict[str, SchemeRun]]:
    """``sweep/<MiB>/<scheme>/``: each budget's schemes, their backlog and snapshots."""
    out: dict[int, dict[str, SchemeRun]] = {}
    root = trip_path / "sweep"
    if not root.is_dir():
        return out
    for mdir in sorted(root.iterdir()):
        if not mdir.is_dir():
            continue
        if not mdir.name.isdigit() or int(mdir.name) <= 0:
            issues.add("unexpected file", str(mdir))
            continue
        per: dict[str, SchemeRun] = {}
        for sdir in sorted(p for p in mdir.iterdir() if p.is_dir()):
            sr = SchemeRun()
            if (sdir / "backlog.jsonl").exists():
                sr.backlog = read_backlogs(sdir / "backlog.jsonl", issues)
            sr.relay_metrics = _read_snapshot(sdir / "logs" / "relay.metrics", issues)
            sr.proxy_metrics = _read_snapshot(sdir / "logs" / "proxy.metrics", issues)
            per[sdir.name] = sr
        out[int(mdir.name)] = per
    return out


_EMU_DOWN = re.compile(r"carrier (\d+) down: .* sojourn-p50 (-?\d+)ms sojourn-p95 (-?\d+)ms")


def read_queue_delay(path: Path) -> dict[int, tuple[float, float]]:
    """Each carrier's downlink queueing time (p50, p95 in ms) from the emulator's last
    stats lines (it prints them on exit); a carrier that delivered nothing (-1) is left
    out."""
    out: dict[int, tuple[float, float]] = {}
    for line in path.read_text(errors="replace").splitlines():
        m = _EMU_DOWN.search(line)
        if m and int(m[2]) >= 0:
            out[int(m[1])] = (float(m[2]), float(m[3]))
    return out


def _read_trip(
    trip_path: Path,
    name: str,
    listed: list[str],
    *,
    all_schemes: list[str],
    users: list[int],
    issues: Issues,
) -> TripRun:
    """One trip's directory: its schemes' records (adding schemes and IM users not seen
    before to ``all_schemes`` and ``users``), its handovers and its sweep."""
    schemes: dict[str, SchemeRun] = {}
    for scheme in _scheme_dirs(trip_path, listed):
        if scheme not in all_schemes:
            all_schemes.append(scheme)
        sdir = trip_path / scheme
        if not sdir.is_dir():
            issues.add("missing scheme directory", str(sdir))
            continue
        schemes[scheme] = _read_scheme(sdir, users, issues)
    events = trip_path / "trip" / "events.jsonl"
    ho, failures = read_handovers(events, issues) if events.exists() else (None, None)
    return TripRun(
        name,
        trip_path / "trip",
        schemes,
        ho,
        failures,
        sweep=read_sweep(trip_path, issues),
    )


def _read_scheme(sdir: Path, users: list[int], issues: Issues) -> SchemeRun:
    """One scheme's records on one trip; IM users not seen before are added to ``users``."""
    sr = SchemeRun()
    bulk = sdir / "bulk.jsonl"
    if bulk.exists():
        sr.downloads = read_downloads(bulk, issues)
    backlog = sdir / "backlog.jsonl"
    if backlog.exists():
        sr.backlog = read_backlogs(backlog, issues)
    counters = sdir / "backlog.carriers.json"
    if counters.exists():
        sr.backlog_carriers = read_carrier_samples(counters, issues)
    for f in sorted(sdir.glob("im-*.jsonl")):
        if f.name.endswith(".conn.jsonl"):
            # polycorn-loadgen's connection log: not analysed.
            continue
        u = f.stem.removeprefix("im-")
        if not u.isdigit():
            issues.add("unexpected file", str(f))
            continue
        sr.im[int(u)] = read_messages(f, issues)
        if int(u) not in users:
            users.append(int(u))
    sr.relay_metrics = _read_snapshot(sdir / "logs" / "relay.metrics", issues)
    sr.proxy_metrics = _read_snapshot(sdir / "logs" / "proxy.metrics", issues)
    emu = sdir / "logs" / "emu.log"
    if emu.exists():
        sr.queue_delay_ms = read_queue_delay(emu)
    read_concurrency(sdir, sr, issues)
    return sr


def read_run(root: Path) -> Run:
    """Read a run directory. Raises ``FileNotFoundError``/``ValueError`` only if ``run.json``
    itself is missing or unusable."""
    issues = Issues()
    meta_path = root / "run.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: not a JSON object")
    listed = [s for s in _list(meta.get("schemes")) if isinstance(s, str)]
    sizes = {
        k: int(v)
        for k, v in _dict(_dict(meta.get("bulk")).get("sizes")).items()
        if isinstance(v, int | float) and v > 0
    }
    users = sorted(int(u) for u in _list(_dict(meta.get("im")).get("users")) if isinstance(u, int))

    all_schemes = list(listed)
    link_sets: list[LinkSetRun] = []
    for ls_name, ls_raw in _dict(meta.get("link_sets")).items():
        ls_meta = _dict(ls_raw)
        ls_path = root / ls_name
        trips: list[TripRun] = []
        for trip in _list(ls_meta.get("trips")):
            trip_path = ls_path / str(trip)
            if not trip_path.is_dir():
                issues.add("missing trip directory", str(trip_path))
                continue
            trips.append(
                _read_trip(
                    trip_path,
                    str(trip),
                    listed,
                    all_schemes=all_schemes,
                    users=users,
                    issues=issues,
                )
            )
        link_sets.append(LinkSetRun(ls_name, str(ls_meta.get("description", "")), trips))

    for ls in link_sets:
        for tr in ls.trips:
            for sr in tr.schemes.values():
                for d in sr.downloads:
                    sizes.setdefault(d.label, d.size)
    return Run(root, meta, all_schemes, sizes, sorted(users), link_sets, issues)
